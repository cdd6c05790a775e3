//! Reading the small JSON files that sit next to a model. Hugging Face repos are
//! inconsistent about which files exist and how special tokens are spelled, so
//! these helpers treat a missing file as "no information" but never hide a broken one.

use std::path::Path;

use serde_json::Value;

use super::error::{Result, TextError};

/// Parses `path` as JSON; `Ok(None)` when the file does not exist, because most of
/// these files are optional in real model folders.
pub(crate) fn read_optional_json(path: &Path) -> Result<Option<Value>> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(TextError::Io {
                path: path.to_owned(),
                source,
            });
        }
    };
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|source| TextError::Json {
            path: path.to_owned(),
            source,
        })
}

/// Reads a special token such as `eos_token`, which transformers writes either as a
/// plain string or as an `AddedToken` object with a `content` field.
pub(crate) fn special_token(
    config: &Value,
    field: &'static str,
    path: &Path,
) -> Result<Option<String>> {
    match config.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(token)) => Ok(Some(token.clone())),
        Some(Value::Object(object)) => match object.get("content") {
            Some(Value::String(token)) => Ok(Some(token.clone())),
            _ => Err(TextError::InvalidConfig {
                path: path.to_owned(),
                field,
                reason: "an object without a string `content`".to_owned(),
            }),
        },
        Some(other) => Err(TextError::InvalidConfig {
            path: path.to_owned(),
            field,
            reason: format!("expected a string or an object with `content`, found {other}"),
        }),
    }
}
