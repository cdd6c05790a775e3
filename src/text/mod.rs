//! Everything between the user's words and the model's token ids: tokenizing,
//! chat templates, stop tokens, sampling, streaming detokenization and fitting
//! the conversation into the context window. No model code lives here.

mod json_files;
mod template_env;

pub mod chat_template;
pub mod context_window;
pub mod detokenizer;
pub mod error;
pub mod reasoning;
pub mod sampler;
pub mod sampling_defaults;
pub mod stop;
pub mod stop_strings;
pub mod tokenizer;

pub use chat_template::{
    ChatMessage, ChatTemplate, PromptPiece, Role, TemplateSource, TemplateVariables,
};
pub use context_window::{ContextWindow, FittedPrompt, OverflowPolicy};
pub use detokenizer::StreamDecoder;
pub use error::TextError;
pub use sampler::{
    SampledToken, Sampler, SamplingError, SamplingParams, TopLogits, log_softmax_top,
};
pub use sampling_defaults::SamplingDefaults;
pub use stop::StopTokens;
pub use stop_strings::{Released, StopStrings};
pub use tokenizer::TextTokenizer;
