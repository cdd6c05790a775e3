//! Whether a downloaded snapshot holds every file of its model folder.

use std::collections::BTreeSet;
use std::fs;
use std::path::Path;

use super::error::HubError;
use crate::model_files::{OPTIONAL_FILES, REQUIRED_FILES, SHARD_INDEX_FILE, SINGLE_WEIGHTS_FILE};

/// Shard file names listed in a `model.safetensors.index.json`, each once.
pub(crate) fn shards_in_index(path: &Path) -> Result<Vec<String>, HubError> {
    let invalid = |reason: String| HubError::InvalidIndex {
        path: path.to_path_buf(),
        reason,
    };
    let text = fs::read_to_string(path).map_err(|e| HubError::io("cannot read", path, e))?;
    let json: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| invalid(e.to_string()))?;
    let map = json
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| invalid("no `weight_map` object".into()))?;
    let mut shards = BTreeSet::new();
    for value in map.values() {
        let shard = value
            .as_str()
            .ok_or_else(|| invalid("a `weight_map` value is not a string".into()))?;
        if !is_safe_relative_name(shard) {
            return Err(invalid(format!("unsafe shard name `{shard}`")));
        }
        shards.insert(shard.to_string());
    }
    if shards.is_empty() {
        return Err(invalid("`weight_map` lists no shards".into()));
    }
    Ok(shards.into_iter().collect())
}

/// A name from a downloaded index must not escape the snapshot folder.
fn is_safe_relative_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with('/')
        && !name.contains('\\')
        && name
            .split('/')
            .all(|part| !part.is_empty() && part != "." && part != "..")
}

/// Whether `dir` holds everything needed to load the model: the required
/// files, single or sharded weights, and each optional file unless
/// `known_missing` says the hub does not have it.
pub(crate) fn is_complete(dir: &Path, known_missing: impl Fn(&str) -> bool) -> bool {
    let present = |file: &str| dir.join(file).is_file();
    let files_ok = REQUIRED_FILES.iter().all(|f| present(f))
        && OPTIONAL_FILES
            .iter()
            .all(|f| present(f) || known_missing(f));
    let weights_ok = present(SINGLE_WEIGHTS_FILE)
        || (present(SHARD_INDEX_FILE)
            && shards_in_index(&dir.join(SHARD_INDEX_FILE))
                .is_ok_and(|shards| shards.iter().all(|s| present(s))));
    files_ok && weights_ok
}
