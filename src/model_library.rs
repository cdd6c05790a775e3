//! The models already on this machine: smolchat's own models folder and the Hugging Face
//! cache, read in place. The first-run screen offers them, so that someone who has a model
//! (or a machine without the hub) is not sent to a download first.
//!
//! A scan never follows a folder link (the cache links files, never folders), never reads
//! more than a file's first bytes, and stops at a fixed depth and count: a damaged or huge
//! store costs a bounded time and is skipped where unreadable.

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};

use crate::hub::HubCache;
use crate::model_source::{is_gguf, model_name};
use crate::store::Paths;

/// Folder levels below a location a scan looks at: the cache's
/// `models--org--name/snapshots/<commit>/file.gguf` is four.
const MAX_DEPTH: usize = 4;
/// Entries a scan reads at most, over all locations.
const MAX_ENTRIES: usize = 20_000;

/// A model found on disk.
#[derive(Debug, Clone, PartialEq)]
pub struct LocalModel {
    /// A `.gguf` file, or a folder with `config.json` and weights.
    pub path: PathBuf,
    /// What people call it: the hub id for the cache's snapshots, else the file's name.
    pub name: String,
    /// The weights' size in bytes.
    pub bytes: u64,
}

/// Where models are looked for, in this order: smolchat's own models folder, then the
/// Hugging Face cache (`HF_HUB_CACHE`, `HF_HOME`, or `~/.cache/huggingface/hub`).
pub fn locations(paths: &Paths) -> Vec<PathBuf> {
    let mut locations = vec![paths.models_dir()];
    locations.extend(HubCache::from_env().map(|cache| cache.root().to_path_buf()));
    locations
}

/// Every model under `locations`, each once, in the order found.
pub fn scan(locations: &[PathBuf]) -> Vec<LocalModel> {
    let mut found = Vec::new();
    let mut budget = MAX_ENTRIES;
    for location in locations {
        visit(location, 0, &mut budget, &mut found);
    }
    found.sort_by(|a: &LocalModel, b| a.name.cmp(&b.name).then(a.path.cmp(&b.path)));
    found.dedup_by(|a, b| a.path == b.path);
    found
}

fn visit(dir: &Path, depth: usize, budget: &mut usize, found: &mut Vec<LocalModel>) {
    if let Some(model) = model_folder(dir) {
        found.push(model);
        return;
    }
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        if *budget == 0 {
            return;
        }
        *budget -= 1;
        let path = entry.path();
        // `file_type` does not follow links: a linked folder is never entered.
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        if kind.is_dir() && depth < MAX_DEPTH {
            visit(&path, depth + 1, budget, found);
        } else if !kind.is_dir() && is_gguf(&path) {
            found.extend(gguf_file(&path));
        }
    }
}

/// A folder that holds a whole model: its config and its weights (one file or shards).
fn model_folder(dir: &Path) -> Option<LocalModel> {
    if !dir.join("config.json").is_file() {
        return None;
    }
    let single = dir.join("model.safetensors");
    let bytes = if single.is_file() {
        fs::metadata(&single).ok()?.len()
    } else if dir.join("model.safetensors.index.json").is_file() {
        fs::read_dir(dir)
            .ok()?
            .flatten()
            .filter(|entry| {
                entry
                    .file_name()
                    .to_string_lossy()
                    .ends_with(".safetensors")
            })
            .filter_map(|entry| fs::metadata(entry.path()).ok())
            .map(|metadata| metadata.len())
            .sum()
    } else {
        return None;
    };
    Some(LocalModel {
        path: dir.to_path_buf(),
        name: model_name(dir),
        bytes,
    })
}

/// A `.gguf` file that starts as one: a half-written download or a dangling link is not.
fn gguf_file(path: &Path) -> Option<LocalModel> {
    let metadata = fs::metadata(path).ok()?;
    let mut magic = [0u8; 4];
    fs::File::open(path).ok()?.read_exact(&mut magic).ok()?;
    (metadata.is_file() && &magic == b"GGUF").then(|| LocalModel {
        path: path.to_path_buf(),
        name: model_name(path),
        bytes: metadata.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gguf(path: &Path, bytes: &[u8]) {
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, bytes).unwrap();
    }

    /// Laid out as smolchat's own folder and the Hugging Face cache lay models out, beside
    /// what is not a model: a torn download, a file named `.gguf` that is not one, a folder
    /// without weights, a dangling link and a link loop.
    #[test]
    fn finds_every_model_and_only_models() {
        let root = tempfile::tempdir().unwrap();
        let own = root.path().join("models");
        let cache = root.path().join("hub");
        gguf(
            &own.join("SmolLM2-135M-Instruct.Q4_1.gguf"),
            b"GGUF\x03\0\0\0rest",
        );
        gguf(&own.join("notes.gguf"), b"not a model");
        gguf(&own.join("half.gguf.incomplete"), b"GGUF");
        let snapshot = cache.join("models--Qwen--Qwen3-0.6B/snapshots/0123abcd");
        fs::create_dir_all(&snapshot).unwrap();
        fs::write(snapshot.join("config.json"), "{}").unwrap();
        fs::write(snapshot.join("model.safetensors"), [0u8; 100]).unwrap();
        let gguf_repo = cache.join("models--unsloth--gemma-3-1b-it-GGUF/snapshots/4567");
        gguf(
            &gguf_repo.join("gemma-3-1b-it-Q4_K_M.gguf"),
            b"GGUF\x03\0\0\0",
        );
        let no_weights = cache.join("models--someone--tokenizer-only/snapshots/89");
        fs::create_dir_all(&no_weights).unwrap();
        fs::write(no_weights.join("config.json"), "{}").unwrap();
        #[cfg(unix)]
        {
            std::os::unix::fs::symlink(root.path().join("gone.gguf"), own.join("dangling.gguf"))
                .unwrap();
            std::os::unix::fs::symlink(&own, own.join("loop")).unwrap();
        }

        let found = scan(&[own.clone(), cache.clone(), root.path().join("missing")]);
        let names: Vec<&str> = found.iter().map(|model| model.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "Qwen/Qwen3-0.6B",
                "SmolLM2-135M-Instruct.Q4_1",
                "unsloth/gemma-3-1b-it-GGUF"
            ]
        );
        assert_eq!(found[0].path, snapshot);
        assert_eq!(found[0].bytes, 100);
        assert_eq!(found[1].bytes, 12);
    }
}
