//! The sampling values a model's authors recommend: `generation_config.json` in a Hugging
//! Face folder, the `general.sampling.*` keys in a GGUF file. The window starts from them
//! until the user sets their own.

use std::path::Path;

use serde::Deserialize;

use super::sampler::SamplingParams;
use crate::gguf::metadata::Metadata;
use crate::model_files::GENERATION_CONFIG_FILE;

/// Each value the model names; `None` leaves the app's own.
#[derive(Debug, Clone, Copy, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct SamplingDefaults {
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<usize>,
    pub min_p: Option<f32>,
    pub repetition_penalty: Option<f32>,
    /// `false` in generation_config.json means greedy decoding.
    pub do_sample: Option<bool>,
}

impl SamplingDefaults {
    /// From the folder's `generation_config.json`; none when it is absent or unreadable (it
    /// only ever suggests).
    pub fn from_dir(dir: &Path) -> Self {
        std::fs::read(dir.join(GENERATION_CONFIG_FILE))
            .ok()
            .and_then(|bytes| serde_json::from_slice(&bytes).ok())
            .unwrap_or_default()
    }

    /// From a GGUF file's `general.sampling.*` keys.
    pub fn from_gguf(metadata: &Metadata) -> Self {
        let float = |key: &str| metadata.typed::<f32>(key).ok().flatten();
        Self {
            temperature: float("general.sampling.temp"),
            top_p: float("general.sampling.top_p"),
            top_k: metadata
                .typed::<u32>("general.sampling.top_k")
                .ok()
                .flatten()
                .map(|k| k as usize),
            min_p: float("general.sampling.min_p"),
            repetition_penalty: float("general.sampling.penalty_repeat"),
            do_sample: None,
        }
    }

    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// `params` with the model's values in place of the ones it names.
    pub fn apply_to(&self, params: &SamplingParams) -> SamplingParams {
        let greedy = self.do_sample == Some(false);
        SamplingParams {
            temperature: if greedy {
                0.0
            } else {
                self.temperature.unwrap_or(params.temperature)
            },
            top_p: self.top_p.unwrap_or(params.top_p),
            top_k: self.top_k.unwrap_or(params.top_k),
            min_p: self.min_p.unwrap_or(params.min_p),
            repetition_penalty: self.repetition_penalty.unwrap_or(params.repetition_penalty),
            seed: params.seed,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generation_config_values_replace_only_what_they_name() {
        let dir = tempfile::tempdir().unwrap();
        assert!(SamplingDefaults::from_dir(dir.path()).is_empty());
        std::fs::write(
            dir.path().join(GENERATION_CONFIG_FILE),
            r#"{"do_sample": true, "temperature": 0.6, "top_p": 0.95, "eos_token_id": 2}"#,
        )
        .unwrap();
        let defaults = SamplingDefaults::from_dir(dir.path());
        let applied = defaults.apply_to(&SamplingParams::default());
        assert_eq!((applied.temperature, applied.top_p), (0.6, 0.95));
        assert_eq!(applied.min_p, SamplingParams::default().min_p);

        std::fs::write(
            dir.path().join(GENERATION_CONFIG_FILE),
            r#"{"do_sample": false, "temperature": 0.6}"#,
        )
        .unwrap();
        let greedy = SamplingDefaults::from_dir(dir.path()).apply_to(&SamplingParams::default());
        assert_eq!(greedy.temperature, 0.0);
    }
}
