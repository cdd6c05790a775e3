use std::path::PathBuf;

/// Everything that can go wrong between a model folder on disk and logits.
///
/// Each variant names the file, tensor or value at fault, because the person reading it usually
/// has to fix a download or pick another folder, and "invalid data" tells them nothing.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not valid JSON for a model config: {source}")]
    ConfigJson {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("unsupported model config: {field} = {value} ({reason})")]
    UnsupportedConfig {
        field: &'static str,
        value: String,
        reason: &'static str,
    },
    #[error("architecture {name} is not supported (smolchat runs {supported})")]
    UnsupportedArchitecture { name: String, supported: String },
    #[error("{path} is not a valid safetensors file: {reason}")]
    CorruptWeights { path: PathBuf, reason: String },
    #[error("tensor `{name}` is missing from {location}")]
    MissingTensor { name: String, location: PathBuf },
    #[error("tensor `{name}` has shape {found:?}, but config.json implies {expected:?}")]
    WrongShape {
        name: String,
        expected: Vec<usize>,
        found: Vec<usize>,
    },
    #[error("tensor `{name}` is stored as {dtype}; only F32, F16 and BF16 weights are supported")]
    UnsupportedDtype { name: String, dtype: String },
    #[error("this backend cannot compute in {dtype}; choose another precision or backend")]
    UnsupportedComputeDtype { dtype: String },
    #[error("the prompt needs {needed} positions but the model's context holds {limit}")]
    ContextOverflow { needed: usize, limit: usize },
    #[error("token id {id} is outside the vocabulary of {vocab_size} tokens")]
    TokenOutOfRange { id: u32, vocab_size: usize },
    #[error("nothing to run: the token list is empty")]
    EmptyInput,
    #[error("cannot write {path}: {reason}")]
    WriteFailed { path: PathBuf, reason: String },
    #[error("the tensor backend failed: {0}")]
    Backend(String),
}

pub type Result<T, E = ModelError> = std::result::Result<T, E>;
