use std::path::PathBuf;
use std::time::Duration;

use super::error::EngineError;
use crate::generation::{FinishReason, GenerationStats, ModelOptions, TokenEvent};
use crate::hub::DownloadProgress;
use crate::model_source::ModelSource;
use crate::text::{ChatMessage, OverflowPolicy, SamplingParams};

/// Identifies one generation, so that late events of an old request cannot be mistaken for
/// the current one.
pub type RequestId = u64;

/// What the engine is asked to do. Stop is not here: it must not wait behind a running
/// generation, so it is a flag on the handle.
#[derive(Debug, Clone)]
pub enum Command {
    LoadModel {
        source: ModelSource,
        options: ModelOptions,
    },
    Generate(GenerateRequest),
    /// Forget the cached conversation, e.g. to measure a prompt from an empty cache.
    ResetConversation,
    Shutdown,
    /// Panics inside the worker, to prove that a bug in a command is reported and survived.
    #[cfg(test)]
    InjectPanic,
}

#[derive(Debug, Clone, PartialEq)]
pub struct GenerateRequest {
    pub id: RequestId,
    /// The whole conversation so far, ending with the user's message.
    pub messages: Vec<ChatMessage>,
    pub sampling: SamplingParams,
    pub max_new_tokens: usize,
    pub overflow: OverflowPolicy,
}

/// What the GUI shows about the loaded model.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelInfo {
    pub dir: PathBuf,
    pub description: String,
    pub context_limit: usize,
    pub options: ModelOptions,
    pub load_time: Duration,
    /// The folder has no chat template of its own; ChatML is used.
    pub fallback_template: bool,
    /// Why the model runs on another backend than the one asked for (no usable GPU).
    pub backend_fallback: Option<String>,
}

/// Figures sent while generating: the generation's own and the process's memory.
#[derive(Debug, Clone, PartialEq)]
pub struct LiveStats {
    pub generation: GenerationStats,
    pub resident_bytes: Option<u64>,
    /// What the GPU's allocator holds, when the model runs on one.
    pub device_bytes: Option<u64>,
}

/// What the engine reports back, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    DownloadProgress(DownloadProgress),
    Loading {
        dir: PathBuf,
    },
    ModelReady(ModelInfo),
    /// The prompt is prefilled; `dropped_messages` oldest messages did not fit the context.
    PromptProcessed {
        request: RequestId,
        stats: GenerationStats,
        dropped_messages: usize,
    },
    Token {
        request: RequestId,
        token: TokenEvent,
    },
    Stats {
        request: RequestId,
        stats: LiveStats,
    },
    Finished {
        request: RequestId,
        reason: FinishReason,
        /// Text the detokenizer held back until the end.
        text: String,
        stats: LiveStats,
    },
    /// A generate command arrived while another generation was running; it was not queued.
    Busy {
        refused: RequestId,
    },
    /// `request` is the generation that failed; `None` for loading and downloading.
    Error {
        request: Option<RequestId>,
        error: EngineError,
    },
}
