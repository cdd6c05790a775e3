//! Which token ids end a reply. Models disagree about where they record this
//! (`generation_config.json`, `config.json`, or only the tokenizer's `eos_token`,
//! sometimes several ids), and missing one makes the model ramble past its turn,
//! so every source is merged.

use std::path::Path;

use serde_json::Value;

use super::error::{Result, TextError};
use super::json_files::{read_optional_json, special_token};
use super::tokenizer::TextTokenizer;
use crate::model_files::{CONFIG_FILE, GENERATION_CONFIG_FILE, TOKENIZER_CONFIG_FILE};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StopTokens {
    /// Sorted and without duplicates.
    ids: Vec<u32>,
}

impl StopTokens {
    /// Gathers `eos_token_id` from `generation_config.json` and `config.json` and the
    /// id of `eos_token` from `tokenizer_config.json`. Missing files are skipped;
    /// malformed ones are errors naming the file.
    pub fn from_dir(dir: &Path, tokenizer: &TextTokenizer) -> Result<Self> {
        let mut ids = Vec::new();
        for file in [GENERATION_CONFIG_FILE, CONFIG_FILE] {
            let path = dir.join(file);
            if let Some(config) = read_optional_json(&path)? {
                collect_eos_ids(&config, &path, &mut ids)?;
            }
        }

        let config_path = dir.join(TOKENIZER_CONFIG_FILE);
        if let Some(config) = read_optional_json(&config_path)?
            && let Some(token) = special_token(&config, "eos_token", &config_path)?
        {
            let id = tokenizer
                .token_id(&token)
                .ok_or_else(|| TextError::InvalidConfig {
                    path: config_path.clone(),
                    field: "eos_token",
                    reason: format!("{token:?} is not in {}", tokenizer.path().display()),
                })?;
            ids.push(id);
        }
        Ok(Self::from_ids(ids))
    }

    pub fn from_ids(mut ids: Vec<u32>) -> Self {
        ids.sort_unstable();
        ids.dedup();
        Self { ids }
    }

    pub fn ids(&self) -> &[u32] {
        &self.ids
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    pub fn contains(&self, id: u32) -> bool {
        self.ids.binary_search(&id).is_ok()
    }
}

/// `eos_token_id` may be a single id, a list of ids, or null.
fn collect_eos_ids(config: &Value, path: &Path, ids: &mut Vec<u32>) -> Result<()> {
    let invalid = |found: &Value| TextError::InvalidConfig {
        path: path.to_owned(),
        field: "eos_token_id",
        reason: format!("expected a token id or a list of token ids, found {found}"),
    };
    let as_id = |value: &Value| {
        value
            .as_u64()
            .and_then(|id| u32::try_from(id).ok())
            .ok_or_else(|| invalid(value))
    };
    match config.get("eos_token_id") {
        None | Some(Value::Null) => {}
        Some(Value::Array(list)) => {
            for value in list {
                ids.push(as_id(value)?);
            }
        }
        Some(value) => ids.push(as_id(value)?),
    }
    Ok(())
}
