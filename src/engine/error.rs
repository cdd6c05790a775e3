use std::path::PathBuf;

use crate::generation::GenerationError;
use crate::hub::HubError;
use crate::text::TextError;

/// What went wrong in the engine, as a value its clients can act on: the window picks its
/// advice, the command line its exit message and the server its HTTP status by matching on
/// the variant, never on the wording. Each variant carries the file or value involved.
///
/// Causes from lower layers travel as their messages (`reason`): the events that carry this
/// type are cloned and compared, which `std::io::Error` inside `HubError` would not allow.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum EngineError {
    #[error(
        "{} does not exist: give a model folder (config.json, weights, tokenizer), a .gguf file, or a hub id such as HuggingFaceTB/SmolLM2-135M-Instruct",
        path.display()
    )]
    ModelNotFound { path: PathBuf },

    #[error("could not get {model} from the hub: {reason}")]
    Download {
        model: String,
        reason: String,
        /// Why the hub could not be reached at all (rather than refusing or sending bad
        /// data), in a few words: "Connection refused".
        unreachable: Option<String>,
    },

    #[error("the download of {model} was stopped")]
    DownloadStopped { model: String },

    #[error("could not load the model from {}: {reason}", path.display())]
    ModelLoad { path: PathBuf, reason: String },

    #[error("no model is loaded yet")]
    NoModel,

    #[error(
        "the conversation needs {needed} tokens (prompt plus the reply reserve) but the model's context holds {limit}"
    )]
    ContextFull { needed: usize, limit: usize },

    #[error(
        "the prompt has {prompt} tokens but the model's context holds {limit}, leaving no room for a reply"
    )]
    PromptTooLong { prompt: usize, limit: usize },

    #[error("invalid sampling settings: {reason}")]
    InvalidSampling { reason: String },

    #[error("the prompt could not be prepared: {reason}")]
    Prompt { reason: String },

    #[error("generation failed: {reason}")]
    Generation { reason: String },

    #[error(
        "the inference engine hit an internal error and recovered; the conversation cache was reset"
    )]
    Internal,
}

impl EngineError {
    pub(crate) fn from_hub(model: &str, error: HubError) -> Self {
        match error {
            HubError::Cancelled { .. } => EngineError::DownloadStopped {
                model: model.to_string(),
            },
            other => EngineError::Download {
                model: model.to_string(),
                unreachable: match &other {
                    HubError::Offline { reason, .. } => Some(short_cause(reason)),
                    _ => None,
                },
                reason: other.to_string(),
            },
        }
    }

    pub(crate) fn from_text(error: TextError) -> Self {
        match error {
            TextError::ContextFull { needed, limit } => EngineError::ContextFull { needed, limit },
            other => EngineError::Prompt {
                reason: other.to_string(),
            },
        }
    }

    pub(crate) fn from_generation(error: GenerationError) -> Self {
        match error {
            GenerationError::Sampling(err) => EngineError::InvalidSampling {
                reason: err.to_string(),
            },
            GenerationError::PromptTooLong { prompt, limit } => {
                EngineError::PromptTooLong { prompt, limit }
            }
            GenerationError::Text(err) => EngineError::from_text(err),
            err @ GenerationError::EmptyPrompt => EngineError::Prompt {
                reason: err.to_string(),
            },
            other => EngineError::Generation {
                reason: other.to_string(),
            },
        }
    }
}

/// A network error as a person reads it: without the I/O layer's prefix and the system's
/// error number ("io: Connection refused (os error 111)" is "Connection refused").
fn short_cause(reason: &str) -> String {
    let reason = reason.strip_prefix("io: ").unwrap_or(reason);
    let reason = match reason.rfind(" (os error ") {
        Some(at) if reason.ends_with(')') => &reason[..at],
        _ => reason,
    };
    reason.trim().to_string()
}

#[cfg(test)]
mod tests {
    use super::short_cause;

    #[test]
    fn a_network_cause_loses_its_prefix_and_error_number() {
        assert_eq!(
            short_cause("io: Connection refused (os error 111)"),
            "Connection refused"
        );
        assert_eq!(short_cause("dns failed"), "dns failed");
    }
}
