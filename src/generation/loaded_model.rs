use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::error::GenerationError;
use crate::backend::{BackendKind, ComputeDevice};
use crate::model::{Llama, Precision};
use crate::text::{ChatTemplate, StopTokens, TextTokenizer};

/// How to load a model: where it runs and in which precision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ModelOptions {
    pub backend: BackendKind,
    pub precision: Precision,
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
    /// What the model runs on, which is not what was asked for when the GPU is unusable.
    pub device: ComputeDevice,
    /// The options in effect: the backend is the one that runs the model.
    pub options: ModelOptions,
    pub load_time: Duration,
}

impl LoadedModel {
    pub fn load(dir: &Path, options: ModelOptions) -> Result<Self, GenerationError> {
        let started = Instant::now();
        let tokenizer = TextTokenizer::load(dir)?;
        let template = ChatTemplate::from_dir(dir)?;
        let device = ComputeDevice::open(options.backend);
        let model = Llama::load_in(dir, &device.device, options.precision)?;
        let stop_tokens = StopTokens::from_dir(dir, &tokenizer)?;
        Ok(Self {
            model,
            tokenizer,
            template,
            stop_tokens,
            dir: dir.to_path_buf(),
            options: ModelOptions {
                backend: device.backend,
                ..options
            },
            device,
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
            "{name} · {} layers · {} context · {} on {}",
            config.num_hidden_layers,
            config.max_position_embeddings,
            self.options.precision,
            self.device.name()
        )
    }
}
