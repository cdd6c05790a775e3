//! Where a model comes from, from the command line or the window to the inference thread: one
//! type (`engine::resolve_source` turns it into a folder or file on disk, downloading a hub
//! model first).

use std::fmt;
use std::path::{Path, PathBuf};

use crate::hub::is_hub_model_id;
use crate::model_files::is_gguf;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelSource {
    /// A folder with config.json, weights and tokenizer.
    Folder(PathBuf),
    /// A `.gguf` file, which holds the config, tokenizer, chat template and weights in one.
    GgufFile(PathBuf),
    /// `organisation/name` on the hub, fetched into the shared Hugging Face cache when the
    /// cache does not hold it complete.
    Hub(String),
    /// `organisation/name:QUANT`: the one `.gguf` file of a hub repository whose name carries
    /// that quantization (as llama.cpp and Ollama name them), fetched alone.
    HubGguf { model_id: String, quant: String },
}

impl ModelSource {
    /// What the user typed for `--model` or in the model field. A name ending in `.gguf` is
    /// a file, and an existing path always wins, so a local folder that happens to look like
    /// `org/name` never goes to the network.
    pub fn parse(spec: &str) -> Self {
        let path = Path::new(spec);
        let hub_file = spec
            .split_once(':')
            .filter(|(model_id, quant)| is_hub_model_id(model_id) && !quant.is_empty());
        if is_gguf(path) {
            ModelSource::GgufFile(path.to_path_buf())
        } else if let Some((model_id, quant)) = hub_file.filter(|_| !path.exists()) {
            ModelSource::HubGguf {
                model_id: model_id.to_string(),
                quant: quant.to_string(),
            }
        } else if !path.exists() && is_hub_model_id(spec) {
            ModelSource::Hub(spec.to_string())
        } else {
            ModelSource::Folder(path.to_path_buf())
        }
    }

    /// The source a local path names: a `.gguf` file or a model folder (what a file dialog
    /// or a drop on the window gives).
    pub fn local(path: PathBuf) -> Self {
        if is_gguf(&path) {
            ModelSource::GgufFile(path)
        } else {
            ModelSource::Folder(path)
        }
    }
}

impl fmt::Display for ModelSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ModelSource::Folder(path) | ModelSource::GgufFile(path) => {
                write!(f, "{}", path.display())
            }
            ModelSource::Hub(model_id) => f.write_str(model_id),
            ModelSource::HubGguf { model_id, quant } => write!(f, "{model_id}:{quant}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hub::DEFAULT_MODEL_ID;

    #[test]
    fn existing_paths_are_folders() {
        let dir = env!("CARGO_MANIFEST_DIR");
        assert_eq!(
            ModelSource::parse(dir),
            ModelSource::Folder(PathBuf::from(dir))
        );
        assert_eq!(
            ModelSource::parse("src/hub"),
            ModelSource::Folder(PathBuf::from("src/hub"))
        );
        assert_eq!(
            ModelSource::parse(DEFAULT_MODEL_ID),
            ModelSource::Hub(DEFAULT_MODEL_ID.to_string())
        );
        assert_eq!(
            ModelSource::parse("bartowski/SmolLM2-135M-Instruct-GGUF:Q4_K_M"),
            ModelSource::HubGguf {
                model_id: "bartowski/SmolLM2-135M-Instruct-GGUF".into(),
                quant: "Q4_K_M".into()
            }
        );
        assert_eq!(
            ModelSource::parse("models/SmolLM2.Q4_1.GGUF"),
            ModelSource::GgufFile(PathBuf::from("models/SmolLM2.Q4_1.GGUF"))
        );
    }
}
