//! The model's tokenizer, loaded from `tokenizer.json` with the Hugging Face
//! `tokenizers` crate so ids match what the model was trained on byte for byte.

use std::fmt;
use std::path::{Path, PathBuf};

use tokenizers::Tokenizer;

use super::error::{Result, TextError, preview, preview_ids};
use crate::model_files::TOKENIZER_FILE;

pub struct TextTokenizer {
    inner: Tokenizer,
    path: PathBuf,
    /// The special tokens' spellings, looked for in every message of every prompt.
    special_tokens: Vec<String>,
}

/// Shows where the tokenizer came from rather than dumping its whole vocabulary.
impl fmt::Debug for TextTokenizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TextTokenizer")
            .field("path", &self.path)
            .field("vocab_size", &self.vocab_size())
            .finish()
    }
}

impl TextTokenizer {
    /// Loads `tokenizer.json` from a model folder.
    pub fn load(dir: &Path) -> Result<Self> {
        let path = dir.join(TOKENIZER_FILE);
        // Read the bytes ourselves so a missing file reports as an I/O error naming
        // the path, rather than as an opaque tokenizer error.
        let bytes = std::fs::read(&path).map_err(|source| TextError::Io {
            path: path.clone(),
            source,
        })?;
        let inner = Tokenizer::from_bytes(&bytes).map_err(|source| TextError::TokenizerLoad {
            path: path.clone(),
            source,
        })?;
        Ok(Self::from_parts(inner, path))
    }

    /// A tokenizer built elsewhere, e.g. from the vocabulary inside a GGUF file at `path`.
    pub fn from_parts(inner: Tokenizer, path: PathBuf) -> Self {
        let special_tokens = inner
            .get_added_tokens_decoder()
            .into_values()
            .filter(|token| token.special && !token.content.is_empty())
            .map(|token| token.content)
            .collect();
        Self {
            inner,
            path,
            special_tokens,
        }
    }

    /// Where the tokenizer was loaded from, for messages shown to the user.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Prompts are built by the chat template, which already writes the special
    /// tokens, so callers normally pass `add_special_tokens = false`. Special tokens
    /// spelled out in `text` (such as `<|im_start|>`) still map to their single ids,
    /// exactly as transformers does.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        ids_of(&self.inner, text, add_special_tokens)
    }

    /// `text` as plain text: special tokens spelled in it (`<|im_start|>`) are taken apart
    /// like any other characters instead of mapping to their ids. For what a person wrote,
    /// which must not be able to forge the template's markers. A copy of the tokenizer
    /// does it, as `tokenizers` sets this per tokenizer; only text that spells a special
    /// token needs it.
    pub fn encode_as_text(&self, text: &str) -> Result<Vec<u32>> {
        if !self.spells_special_token(text) {
            return self.encode(text, false);
        }
        let mut literal = self.inner.clone();
        literal.set_encode_special_tokens(true);
        ids_of(&literal, text, false)
    }

    /// Whether `text` contains the spelling of one of the special tokens.
    pub fn spells_special_token(&self, text: &str) -> bool {
        self.special_tokens
            .iter()
            .any(|token| text.contains(token.as_str()))
    }

    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        self.inner
            .decode(ids, skip_special_tokens)
            .map_err(|source| TextError::Decode {
                ids: preview_ids(ids),
                source,
            })
    }

    /// The id of a token spelled exactly as in the vocabulary, e.g. `<|im_end|>`.
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// Number of ids the tokenizer can produce, added tokens included, so it can be
    /// checked against the model's embedding size.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }
}

fn ids_of(tokenizer: &Tokenizer, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
    let encoding = tokenizer
        .encode(text, add_special_tokens)
        .map_err(|source| TextError::Encode {
            text: preview(text),
            source,
        })?;
    Ok(encoding.get_ids().to_vec())
}
