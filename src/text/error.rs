//! One error type for everything that reads model files or turns text into prompts,
//! so the UI can show a single, readable message whichever step failed.

use std::path::PathBuf;

use thiserror::Error;

/// Boxed error as returned by the `tokenizers` crate.
pub type BoxedError = Box<dyn std::error::Error + Send + Sync>;

#[derive(Debug, Error)]
pub enum TextError {
    #[error("could not read {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("{} is not valid JSON: {source}", path.display())]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },

    #[error("{} has an unexpected `{field}`: {reason}", path.display())]
    InvalidConfig {
        path: PathBuf,
        field: &'static str,
        reason: String,
    },

    #[error("could not load the tokenizer from {}: {source}", path.display())]
    TokenizerLoad {
        path: PathBuf,
        #[source]
        source: BoxedError,
    },

    #[error("could not tokenize {text:?}: {source}")]
    Encode {
        /// The start of the text, enough to recognise it in a log.
        text: String,
        #[source]
        source: BoxedError,
    },

    #[error("could not turn token ids {ids:?} back into text: {source}")]
    Decode {
        /// The first few ids, enough to recognise them in a log.
        ids: Vec<u32>,
        #[source]
        source: BoxedError,
    },

    #[error("the chat template from {origin} does not compile: {source}")]
    TemplateSyntax {
        origin: String,
        #[source]
        source: minijinja::Error,
    },

    #[error("the chat template from {origin} failed: {source}")]
    TemplateRender {
        origin: String,
        #[source]
        source: minijinja::Error,
    },

    #[error(
        "the conversation does not fit: it needs {needed} tokens (prompt plus the reply reserve) \
         but the context window holds {limit}"
    )]
    ContextFull { needed: usize, limit: usize },
}

pub type Result<T, E = TextError> = std::result::Result<T, E>;

/// Shortens user text for error messages so a huge prompt does not flood the log.
pub(crate) fn preview(text: &str) -> String {
    const MAX_CHARS: usize = 80;
    match text.char_indices().nth(MAX_CHARS) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_owned(),
    }
}

/// Keeps only the first ids of a sequence for error messages.
pub(crate) fn preview_ids(ids: &[u32]) -> Vec<u32> {
    const MAX_IDS: usize = 16;
    ids.iter().take(MAX_IDS).copied().collect()
}
