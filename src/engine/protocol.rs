use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crossbeam_channel::Sender;

use super::error::EngineError;
use crate::generation::{FinishReason, GenerationStats, MemoryPlan, ModelOptions, TokenEvent};
use crate::hub::DownloadProgress;
use crate::model::LoadProgress;
use crate::model_source::ModelSource;
use crate::text::{
    ChatMessage, OverflowPolicy, SamplingDefaults, SamplingParams, TemplateVariables,
};

/// Identifies one generation, so that late events of an old request cannot be mistaken for
/// the current one. Unique across all the clients of an engine.
pub type RequestId = u64;

/// What the engine is asked to do. Stop is not here: it must not wait behind a running
/// generation, so it is a flag that travels with the command (see [`Reply`]).
#[derive(Debug, Clone)]
pub enum Command {
    /// Replaces the model. Its events go to `reply`; `reply`'s flag stops a download.
    LoadModel {
        source: ModelSource,
        options: ModelOptions,
        reply: Reply,
    },
    /// Queued behind the generations already waiting (first come, first served across
    /// clients); each runs to completion, or until its own flag in `reply` is set.
    Generate {
        id: RequestId,
        request: GenerateRequest,
        reply: Reply,
    },
    /// Forget the cached conversation, e.g. to measure a prompt from an empty cache.
    ResetConversation,
    /// Positions the KV caches may hold together from now on, for this model and the next
    /// (see [`super::EngineOptions::kv_budget`]); generations running hold what they hold, and
    /// idle caches over it are given up at the next admission.
    SetKvBudget(Option<usize>),
    Shutdown,
    /// Panics inside the worker, to prove that a bug in a command is reported and survived.
    #[cfg(test)]
    InjectPanic(Reply),
}

pub use crate::generation::Prompt;

#[derive(Debug, Clone, PartialEq)]
pub struct GenerateRequest {
    pub prompt: Prompt,
    pub sampling: SamplingParams,
    /// `None`: until the model ends its reply or the context is full.
    pub max_new_tokens: Option<usize>,
    /// What to do when a chat does not fit; a raw prompt that does not fit is always refused.
    pub overflow: OverflowPolicy,
    /// Report each token's log-probability and this many alternatives' (see
    /// [`crate::generation::TokenLogprobs`]); `None` computes nothing.
    pub logprobs: Option<usize>,
    /// More variables for a chat's template (`enable_thinking`, say); see
    /// [`crate::text::ChatTemplate::render_with`].
    pub template_variables: TemplateVariables,
}

impl GenerateRequest {
    /// A chat reply with the window's settings and no log-probabilities.
    pub fn chat(
        messages: Vec<ChatMessage>,
        sampling: SamplingParams,
        max_new_tokens: usize,
        overflow: OverflowPolicy,
    ) -> Self {
        Self {
            prompt: Prompt::Chat(messages),
            sampling,
            max_new_tokens: Some(max_new_tokens),
            overflow,
            logprobs: None,
            template_variables: TemplateVariables::new(),
        }
    }
}

/// Where the events of one command go, and the flag that stops it. Every command that
/// produces events carries one, so the worker answers the client that asked, whichever
/// thread it lives on, and Stop reaches exactly that client's work.
#[derive(Clone)]
pub struct Reply {
    pub(super) events: Sender<Event>,
    pub(super) cancel: Arc<AtomicBool>,
    /// Run the engine's notify hook after each event (the window's client only).
    pub(super) notify: bool,
}

impl Reply {
    /// Whether the client stopped this work, or went away.
    pub fn is_cancelled(&self) -> bool {
        self.cancel.load(Ordering::SeqCst)
    }

    /// Sends an event to the client; false when it no longer listens. For engines served
    /// elsewhere (see [`crate::engine::EngineHandle::connect`]); the worker also notifies.
    pub fn send(&self, event: Event) -> bool {
        self.events.send(event).is_ok()
    }
}

impl fmt::Debug for Reply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reply")
            .field("cancelled", &self.is_cancelled())
            .field("notify", &self.notify)
            .finish_non_exhaustive()
    }
}

/// What the GUI shows about the loaded model.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelInfo {
    pub dir: PathBuf,
    /// See [`crate::model_files::model_name`]; the local server's model id.
    pub name: String,
    pub description: String,
    pub context_limit: usize,
    /// The weights' and the KV cache's memory (the context above is its `context`).
    pub memory: MemoryPlan,
    pub options: ModelOptions,
    pub load_time: Duration,
    /// The folder has no chat template of its own; ChatML is used.
    pub fallback_template: bool,
    /// The template lets thinking be turned off (`enable_thinking`, Qwen3's and SmolLM3's).
    pub thinking_switch: bool,
    /// Why the model runs on another backend than the one asked for (no usable GPU).
    pub backend_fallback: Option<String>,
    /// The GPU backend runs on a software rasterizer (see
    /// [`crate::backend::ComputeDevice::is_software_renderer`]).
    pub software_gpu: bool,
    /// What the model's own files recommend for sampling.
    pub sampling_defaults: SamplingDefaults,
    /// The integer types a GGUF file's weights are stored in (`Q8_0+Q4_1`), which the CPU
    /// multiplies as stored whatever the precision.
    pub integer_weights: Option<String>,
}

/// Figures sent while generating: the generation's own and the process's memory.
#[derive(Debug, Clone, PartialEq)]
pub struct LiveStats {
    pub generation: GenerationStats,
    pub resident_bytes: Option<u64>,
    /// What the GPU's allocator holds, when the model runs on one.
    pub device_bytes: Option<u64>,
}

/// What the engine reports back to a client, in order: a request's events go only to the client
/// that sent it, a load's to the client that asked for the load.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    DownloadProgress(DownloadProgress),
    /// The model is being read; `memory` says what it will take, when its config says.
    Loading {
        dir: PathBuf,
        memory: Option<MemoryPlan>,
    },
    /// After each layer of the model's weights is read.
    LoadProgress(LoadProgress),
    ModelReady(ModelInfo),
    /// The request waits its turn: `ahead` generations run or wait before it. Sent when it
    /// joins the queue and each time the queue moves up.
    Waiting {
        request: RequestId,
        ahead: usize,
    },
    /// A long prompt is being read: `done` of its `total` tokens so far. Sent before each
    /// pass of [`crate::generation::PROMPT_CHUNK`] tokens, only for prompts that take several.
    PromptProgress {
        request: RequestId,
        done: usize,
        total: usize,
    },
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
    /// The queue of waiting generations was full: this request was refused, not queued. The
    /// server answers 503 with Retry-After.
    Busy {
        refused: RequestId,
    },
    /// `request` is the generation that failed; `None` for loading and downloading.
    Error {
        request: Option<RequestId>,
        error: EngineError,
    },
}
