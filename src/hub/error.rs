use std::path::PathBuf;

use thiserror::Error;

/// Everything that can go wrong while getting a model from the hub.
///
/// Messages name the model, file, URL or folder involved so a user can act
/// on them without a debugger.
#[derive(Debug, Error)]
pub enum HubError {
    #[error("`{0}` is not a Hugging Face model id; expected `organisation/name`")]
    InvalidModelId(String),

    #[error(
        "cannot reach the model hub at {endpoint} to download `{model_id}` ({reason}). \
         Nothing complete is cached in {cache_dir}. Connect to the internet, choose a local \
         model folder instead, or set HF_ENDPOINT to a reachable mirror"
    )]
    Offline {
        model_id: String,
        endpoint: String,
        cache_dir: PathBuf,
        reason: String,
    },

    #[error("cannot find a cache folder for downloads: set HF_HOME or HF_HUB_CACHE")]
    NoCacheDir,

    #[error("network error for {url}: {reason}")]
    Network { url: String, reason: String },

    #[error(
        "{model_id} has no .gguf file for {quant}; it has {}",
        if available.is_empty() { "none".to_string() } else { available.join(", ") }
    )]
    NoSuchQuantization {
        model_id: String,
        quant: String,
        available: Vec<String>,
    },
    #[error("{model_id} has several .gguf files for {quant} ({}); split files are not supported", files.join(", "))]
    AmbiguousQuantization {
        model_id: String,
        quant: String,
        files: Vec<String>,
    },
    #[error("{url} answered HTTP {status}")]
    Http { url: String, status: u16 },

    #[error("required file `{file}` is missing from `{model_id}` on the hub ({url})")]
    MissingFile {
        model_id: String,
        file: String,
        url: String,
    },

    #[error("{url} did not send the `{header}` header the hub protocol requires")]
    MissingHeader { url: String, header: &'static str },

    #[error("too many redirects starting at {url}")]
    TooManyRedirects { url: String },

    #[error(
        "checksum mismatch for `{file}`: expected sha256 {expected}, found {found}; \
         the partial download was deleted"
    )]
    ChecksumMismatch {
        file: String,
        expected: String,
        found: String,
    },

    #[error("`{file}` is incomplete: expected {expected} bytes, received {found}")]
    SizeMismatch {
        file: String,
        expected: u64,
        found: u64,
    },

    #[error("invalid weight index {path}: {reason}")]
    InvalidIndex { path: PathBuf, reason: String },

    #[error("download of `{file}` was cancelled")]
    Cancelled { file: String },

    #[error("{action} {path}: {source}")]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl HubError {
    pub(crate) fn io(
        action: &'static str,
        path: impl Into<PathBuf>,
        source: std::io::Error,
    ) -> Self {
        HubError::Io {
            action,
            path: path.into(),
            source,
        }
    }

    /// A failure that trying again may cure: a dropped or stalled connection, or a
    /// server that is overloaded or briefly down.
    pub(crate) fn is_transient(&self) -> bool {
        match self {
            HubError::Network { .. } => true,
            HubError::Http { status, .. } => matches!(status, 408 | 429 | 500..=599),
            _ => false,
        }
    }
}
