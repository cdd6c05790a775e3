//! Turning a prompt into a stream of tokens: the one generation loop that the GUI worker, the
//! command line and the benchmarks all run.

mod error;
mod loaded_model;
mod memory_plan;
mod prompt;
mod session;
mod stats;

pub use error::GenerationError;
pub use loaded_model::{LoadedModel, ModelOptions};
pub use memory_plan::{MemoryPlan, available_memory, gguf_model_config, model_config};
pub use prompt::{Prompt, PromptFit};
pub use session::{
    CheckedPrompt, FinishReason, GenerationSession, PROMPT_CHUNK, PromptProgress, SHARED_HISTORY,
    Step, TokenEvent, TokenLogprobs, predict_together,
};
pub use stats::GenerationStats;
