//! Hub model ids: what the hub accepts as `organisation/name`.

use super::error::HubError;

/// The model the app downloads when the user has not chosen one.
pub const DEFAULT_MODEL_ID: &str = "HuggingFaceTB/SmolLM2-135M-Instruct";

/// `organisation/name` with the characters the hub allows in repo names.
pub fn is_hub_model_id(spec: &str) -> bool {
    let valid_part = |part: &str| {
        !part.is_empty()
            && part.len() <= 96
            && !part.starts_with(['.', '-'])
            && !part.ends_with('.')
            && !part.contains("..")
            && part
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    };
    match spec.split_once('/') {
        Some((org, name)) => valid_part(org) && valid_part(name),
        None => false,
    }
}

pub(crate) fn validate_model_id(model_id: &str) -> Result<(), HubError> {
    if is_hub_model_id(model_id) {
        Ok(())
    } else {
        Err(HubError::InvalidModelId(model_id.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recognises_hub_ids() {
        assert!(is_hub_model_id(DEFAULT_MODEL_ID));
        assert!(is_hub_model_id("org/model.v2_x"));
        for bad in [
            "model",
            "a/b/c",
            "/abs/path",
            "./x",
            "../x/y",
            "org/",
            "org/na me",
            "C:\\m",
        ] {
            assert!(!is_hub_model_id(bad), "{bad}");
        }
    }
}
