//! What a model is on disk, decided in this one place: the files a model folder holds, what
//! makes a file GGUF, and the name a person knows a model by. The loader, the model library,
//! the hub's downloads, the window's check before loading and its file dialog all ask here, so
//! a path one of them takes is a path the others take. It depends on nothing else in the crate.

pub mod ollama;

use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};

/// The architecture and its sizes, in a Hugging Face folder.
pub const CONFIG_FILE: &str = "config.json";
pub const TOKENIZER_FILE: &str = "tokenizer.json";
/// The special tokens and the chat template.
pub const TOKENIZER_CONFIG_FILE: &str = "tokenizer_config.json";
/// The chat template on its own, as newer transformers versions save it; it wins over the
/// copy in the tokenizer config, matching transformers' loading order.
pub const CHAT_TEMPLATE_FILE: &str = "chat_template.jinja";
/// The chat template as a processor's config saves it, for models whose processor has one.
pub const CHAT_TEMPLATE_JSON_FILE: &str = "chat_template.json";
/// End-of-turn ids and sampling defaults, which some repositories lack.
pub const GENERATION_CONFIG_FILE: &str = "generation_config.json";
/// Older repositories' special tokens, which some lack.
pub const SPECIAL_TOKENS_MAP_FILE: &str = "special_tokens_map.json";
/// The weights of a folder that holds them in one file.
pub const SINGLE_WEIGHTS_FILE: &str = "model.safetensors";
/// The list of shard files, in a folder whose weights are split over several.
pub const SHARD_INDEX_FILE: &str = "model.safetensors.index.json";
/// A GGUF file's extension as file dialogs filter by it (they match case).
pub const GGUF_EXTENSIONS: [&str; 2] = ["gguf", "GGUF"];

/// Files without which a folder's model cannot be loaded, beside its weights.
pub const REQUIRED_FILES: [&str; 3] = [CONFIG_FILE, TOKENIZER_FILE, TOKENIZER_CONFIG_FILE];
/// Files some repositories lack; defaults stand in for them.
pub const OPTIONAL_FILES: [&str; 2] = [GENERATION_CONFIG_FILE, SPECIAL_TOKENS_MAP_FILE];

/// Whether `path` names a GGUF file: by its extension, as every app that opens them does, or
/// by its first bytes, for stores that name files by their hash (Ollama's blobs).
pub fn is_gguf(path: &Path) -> bool {
    has_gguf_extension(path) || starts_as_gguf(path)
}

/// Whether `path` is named as a GGUF file (`.gguf`, in any case).
pub fn has_gguf_extension(path: &Path) -> bool {
    path.extension()
        .is_some_and(|extension| extension.eq_ignore_ascii_case("gguf"))
}

/// Whether `path` is a file that starts with GGUF's magic bytes.
pub fn starts_as_gguf(path: &Path) -> bool {
    let mut magic = [0u8; 4];
    std::fs::File::open(path)
        .and_then(|mut file| file.read_exact(&mut magic))
        .is_ok_and(|()| &magic == b"GGUF")
}

/// Whether a file of a folder model (on disk or in a hub repository's listing) holds weights.
pub fn is_weights_file(name: &str) -> bool {
    name.ends_with(".safetensors")
}

/// Whether a repository whose files are `names` is a folder model: its config and weights.
pub fn names_a_folder_model<'a>(names: impl IntoIterator<Item = &'a str> + Clone) -> bool {
    names.clone().into_iter().any(|name| name == CONFIG_FILE)
        && names.into_iter().any(is_weights_file)
}

/// Why a path is not a model smolchat can open, before any of it is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotAModel {
    Missing(PathBuf),
    /// Neither a GGUF file nor a folder with a config.
    Unknown(PathBuf),
    /// A folder with a config but neither a weights file nor a shard index.
    NoWeights(PathBuf),
}

impl fmt::Display for NotAModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let advice = "Choose a GGUF model file, or the folder that holds the model's config.json, model.safetensors and tokenizer.json.";
        match self {
            NotAModel::Missing(path) => write!(f, "{} does not exist. {advice}", path.display()),
            NotAModel::Unknown(path) => write!(
                f,
                "{} is neither a .gguf file nor a folder with config.json. {advice}",
                path.display()
            ),
            NotAModel::NoWeights(path) => write!(
                f,
                "{} has config.json but no weights ({SINGLE_WEIGHTS_FILE} or {SHARD_INDEX_FILE}): a download that did not finish?",
                path.display()
            ),
        }
    }
}

/// Whether `path` is a GGUF file or a model folder, by what it holds (not yet whether its
/// contents are sound: loading finds that).
pub fn check(path: &Path) -> Result<(), NotAModel> {
    if path.is_file() && is_gguf(path) {
        Ok(())
    } else if !path.is_dir() {
        let path = path.to_path_buf();
        Err(if path.exists() {
            NotAModel::Unknown(path)
        } else {
            NotAModel::Missing(path)
        })
    } else if !path.join(CONFIG_FILE).is_file() {
        Err(NotAModel::Unknown(path.to_path_buf()))
    } else if path.join(SINGLE_WEIGHTS_FILE).is_file() || path.join(SHARD_INDEX_FILE).is_file() {
        Ok(())
    } else {
        Err(NotAModel::NoWeights(path.to_path_buf()))
    }
}

/// The bytes of a model's weights: a GGUF file's size, or the sum of a folder's weight files.
pub fn weight_bytes(path: &Path) -> u64 {
    let size = |path: &Path| std::fs::metadata(path).map_or(0, |meta| meta.len());
    if is_gguf(path) {
        return size(path);
    }
    std::fs::read_dir(path).map_or(0, |entries| {
        entries
            .flatten()
            .filter(|entry| is_weights_file(&entry.file_name().to_string_lossy()))
            .map(|entry| size(&entry.path()))
            .sum()
    })
}

/// The entries a look through models folders reads at most: the library's scan, over all its
/// locations, and the search of Ollama's manifests for a blob's name.
pub const WALK_BUDGET: usize = 20_000;

/// Walks `dir` to `max_depth` folder levels while `budget` (entries read) lasts: `enter` says
/// of each folder (`dir` first) whether to look inside, and every other entry goes to
/// `files`, links included. A linked folder is never entered (`file_type` does not follow
/// links), so a link loop costs nothing; the library's scan and Ollama's manifests share it.
pub fn walk(
    dir: &Path,
    max_depth: usize,
    budget: &mut usize,
    enter: &mut dyn FnMut(&Path) -> bool,
    files: &mut Vec<PathBuf>,
) {
    if !enter(dir) {
        return;
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        if *budget == 0 {
            return;
        }
        *budget -= 1;
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        if !kind.is_dir() {
            files.push(entry.path());
        } else if max_depth > 0 {
            walk(&entry.path(), max_depth - 1, budget, enter, files);
        }
    }
}

/// The name a person knows a model by, from its folder or file: the repository id for a
/// snapshot in the Hugging Face cache (whose folder is named by a commit hash), Ollama's
/// `name:tag` for one of its blobs, the file name without `.gguf`, or the folder's name.
/// The window and the local server show it.
pub fn model_name(path: &Path) -> String {
    if let Some(name) = ollama::name(path) {
        return name;
    }
    let hub_repo = path.ancestors().find_map(|ancestor| {
        let folder = ancestor.file_name()?.to_str()?;
        let repo = folder.strip_prefix("models--")?;
        Some(repo.replacen("--", "/", 1))
    });
    let own_name = || {
        let stem = path.file_stem().filter(|_| is_gguf(path));
        // Jan keeps each model as `<name>/model.gguf`.
        let generic = stem.is_some_and(|stem| stem.eq_ignore_ascii_case("model"));
        let name = if generic {
            path.parent().and_then(Path::file_name)
        } else {
            stem.or_else(|| path.file_name())
        };
        name.map_or_else(
            || path.display().to_string(),
            |name| name.to_string_lossy().into_owned(),
        )
    };
    hub_repo.unwrap_or_else(own_name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn models_are_named_as_people_know_them() {
        let snapshot = Path::new(
            "/home/me/.cache/huggingface/hub/models--HuggingFaceTB--SmolLM2-135M-Instruct/snapshots/12fd25f77366fa6b3b4b768ec3050bf629380bac",
        );
        assert_eq!(model_name(snapshot), "HuggingFaceTB/SmolLM2-135M-Instruct");
        assert_eq!(
            model_name(Path::new("/models/SmolLM2-135M-Instruct.Q4_1.gguf")),
            "SmolLM2-135M-Instruct.Q4_1"
        );
        assert_eq!(
            model_name(Path::new("/jan/qwen3-1.7b/model.gguf")),
            "qwen3-1.7b"
        );
        assert_eq!(model_name(Path::new("/models/deq-bf16")), "deq-bf16");
    }

    #[test]
    fn a_path_is_checked_by_what_it_holds() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("typo");
        assert_eq!(check(&missing), Err(NotAModel::Missing(missing)));

        let text = dir.path().join("notes.txt");
        std::fs::write(&text, "hello").unwrap();
        assert_eq!(check(&text), Err(NotAModel::Unknown(text)));
        // Ollama's blobs have no extension: their first bytes say what they are.
        let blob = dir.path().join("sha256-0123");
        std::fs::write(&blob, b"GGUF\x03\0\0\0").unwrap();
        assert_eq!(check(&blob), Ok(()));

        let folder = dir.path().join("model");
        std::fs::create_dir(&folder).unwrap();
        assert_eq!(check(&folder), Err(NotAModel::Unknown(folder.clone())));
        std::fs::write(folder.join(CONFIG_FILE), "{}").unwrap();
        assert_eq!(check(&folder), Err(NotAModel::NoWeights(folder.clone())));
        std::fs::write(folder.join(SHARD_INDEX_FILE), "{}").unwrap();
        assert_eq!(check(&folder), Ok(()));
    }

    #[test]
    fn a_repository_listing_is_a_folder_model_with_config_and_weights() {
        let listing = [
            "config.json",
            "tokenizer.json",
            "model-00001-of-00002.safetensors",
        ];
        assert!(names_a_folder_model(listing));
        assert!(!names_a_folder_model(["config.json", "tokenizer.json"]));
        assert!(!names_a_folder_model(["model.Q4_K_M.gguf", "README.md"]));
    }
}
