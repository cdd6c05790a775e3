use crate::gguf::GgufError;
use crate::model::ModelError;
use crate::text::{SamplingError, TextError};

#[derive(Debug, thiserror::Error)]
pub enum GenerationError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Text(#[from] TextError),
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error(transparent)]
    Sampling(#[from] SamplingError),
    #[error("the prompt is empty: there is nothing to continue")]
    EmptyPrompt,
    #[error(
        "the prompt has {prompt} tokens but the model's context holds {limit}, leaving no room for a reply; shorten it or start a new chat"
    )]
    PromptTooLong { prompt: usize, limit: usize },
}
