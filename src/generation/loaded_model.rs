use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use burn::tensor::DType;

use super::error::GenerationError;
use crate::backend::BackendKind;
use crate::model::Llama;
use crate::text::{ChatTemplate, StopTokens, TextTokenizer};

/// How to load a model: where it runs and in which precision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelOptions {
    pub backend: BackendKind,
    pub dtype: DType,
}

impl Default for ModelOptions {
    fn default() -> Self {
        Self {
            backend: BackendKind::default(),
            dtype: DType::F32,
        }
    }
}

/// Everything generation needs from a model folder: the network, its tokenizer, its chat
/// template and the tokens that end a reply.
#[derive(Debug)]
pub struct LoadedModel {
    pub model: Llama,
    pub tokenizer: TextTokenizer,
    pub template: ChatTemplate,
    pub stop_tokens: StopTokens,
    pub dir: PathBuf,
    pub options: ModelOptions,
    pub load_time: Duration,
}

impl LoadedModel {
    pub fn load(dir: &Path, options: ModelOptions) -> Result<Self, GenerationError> {
        let started = Instant::now();
        let tokenizer = TextTokenizer::load(dir)?;
        let template = ChatTemplate::from_dir(dir)?;
        let model = Llama::load(dir, &options.backend.device(), options.dtype)?;
        let stop_tokens = StopTokens::from_dir(dir, &tokenizer)?;
        Ok(Self {
            model,
            tokenizer,
            template,
            stop_tokens,
            dir: dir.to_path_buf(),
            options,
            load_time: started.elapsed(),
        })
    }

    /// A one-line description for the status bar and logs.
    pub fn describe(&self) -> String {
        let config = self.model.config();
        let name = self
            .dir
            .file_name()
            .map(|name| name.to_string_lossy().into_owned())
            .unwrap_or_else(|| self.dir.display().to_string());
        format!(
            "{name} · {} layers · {} context · {:?} on {}",
            config.num_hidden_layers,
            config.max_position_embeddings,
            self.options.dtype,
            self.options.backend
        )
    }
}
