//! The models already on this machine, read in place and never copied: smolchat's own models
//! folder, the Hugging Face cache, and the stores other local-model apps keep (Ollama, LM
//! Studio, llama.cpp, GPT4All, Jan). The first-run screen offers them and `smolchat models
//! list` prints them, so that someone who has a model (or a machine without the hub) is not
//! sent to a download first.
//!
//! A scan never follows a folder link (the caches link files, never folders), never reads
//! more than a file's first bytes (or an Ollama manifest), and stops at a fixed depth and
//! count: a damaged or huge store costs a bounded time. What looks like a model but is not
//! one (a torn download, a manifest whose blob is gone) is skipped with the reason.

pub mod facts;
pub mod removal;

use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};

use crate::hub::HubCache;
use crate::model_files::{
    self, WALK_BUDGET, has_gguf_extension, model_name, ollama, starts_as_gguf, walk, weight_bytes,
};
use crate::store::Paths;

/// Folder levels below a location a scan looks at: the cache's
/// `models--org--name/snapshots/<commit>/file.gguf` is four, as is Ollama's
/// `manifests/<registry>/<namespace>/<model>/<tag>`.
const MAX_DEPTH: usize = 4;

/// Whose folder a model was found in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Store {
    Smolchat,
    HuggingFace,
    Ollama,
    LmStudio,
    LlamaCpp,
    Gpt4All,
    Jan,
}

impl Store {
    pub fn label(self) -> &'static str {
        match self {
            Store::Smolchat => "smolchat",
            Store::HuggingFace => "Hugging Face cache",
            Store::Ollama => "Ollama",
            Store::LmStudio => "LM Studio",
            Store::LlamaCpp => "llama.cpp",
            Store::Gpt4All => "GPT4All",
            Store::Jan => "Jan",
        }
    }
}

/// A folder a store keeps models in.
#[derive(Debug, Clone, PartialEq)]
pub struct Location {
    pub store: Store,
    pub path: PathBuf,
}

/// A model found on disk.
#[derive(Debug, Clone, PartialEq)]
pub struct LocalModel {
    /// A GGUF file (an Ollama blob has no `.gguf` name), or a folder with `config.json` and
    /// weights.
    pub path: PathBuf,
    /// What people call it: the hub id for the cache's snapshots, Ollama's `name:tag`, else
    /// the file's name.
    pub name: String,
    /// The weights' size in bytes.
    pub bytes: u64,
    pub store: Store,
}

/// What a scan found, and what it passed over and why.
#[derive(Debug, Default)]
pub struct Library {
    pub models: Vec<LocalModel>,
    pub skipped: Vec<String>,
}

/// A model file's size as the library, the first screen and `models list` show it: "98 MB",
/// "1.1 GB", "300 KB".
pub fn size_text(bytes: u64) -> String {
    if bytes < 1_000_000 {
        format!("{:.0} KB", bytes as f64 / 1e3)
    } else if bytes < 1_000_000_000 {
        format!("{:.0} MB", bytes as f64 / 1e6)
    } else {
        format!("{:.1} GB", bytes as f64 / 1e9)
    }
}

/// Where models are looked for, in this order: smolchat's own models folder, the Hugging
/// Face cache (`HF_HUB_CACHE`, `HF_HOME`, or `~/.cache/huggingface/hub`), then other apps'
/// stores (see [`other_apps`]).
pub fn locations(paths: &Paths) -> Vec<Location> {
    let mut locations = vec![Location {
        store: Store::Smolchat,
        path: paths.models_dir(),
    }];
    locations.extend(HubCache::from_env().map(|cache| Location {
        store: Store::HuggingFace,
        path: cache.root().to_path_buf(),
    }));
    let home = std::env::var_os("HOME").map(PathBuf::from);
    locations.extend(other_apps(home.as_deref(), &|name| std::env::var_os(name)));
    locations
}

/// The folders other apps keep models in on Linux, each app's own variable first:
/// - Ollama: `OLLAMA_MODELS`, else `~/.ollama/models` and, for the system service,
///   `/usr/share/ollama/.ollama/models` (manifests name the blobs that hold the weights);
/// - LM Studio: `~/.lmstudio/models` and, before 0.3, `~/.cache/lm-studio/models`;
/// - llama.cpp's downloads (`-hf`): `LLAMA_CACHE`, else `$XDG_CACHE_HOME/llama.cpp` or
///   `~/.cache/llama.cpp`;
/// - GPT4All: `$XDG_DATA_HOME/nomic.ai/GPT4All` or `~/.local/share/nomic.ai/GPT4All`;
/// - Jan: `$XDG_DATA_HOME/Jan/data` or `~/.local/share/Jan/data` and, before 0.6, `~/jan/models`.
pub fn other_apps(home: Option<&Path>, var: &dyn Fn(&str) -> Option<OsString>) -> Vec<Location> {
    let under_home = |relative: &str| home.map(|home| home.join(relative));
    let xdg = |name: &str, fallback: &str| {
        var(name)
            .map(PathBuf::from)
            .filter(|dir| dir.is_absolute())
            .or_else(|| under_home(fallback))
    };
    let cache = xdg("XDG_CACHE_HOME", ".cache");
    let data = xdg("XDG_DATA_HOME", ".local/share");
    let at = |store: Store, path: Option<PathBuf>| path.map(|path| Location { store, path });

    let ollama = match var("OLLAMA_MODELS") {
        Some(dir) => vec![Some(PathBuf::from(dir))],
        None => vec![
            under_home(".ollama/models"),
            Some(PathBuf::from("/usr/share/ollama/.ollama/models")),
        ],
    };
    let llama_cpp = var("LLAMA_CACHE")
        .map(PathBuf::from)
        .or_else(|| cache.as_ref().map(|cache| cache.join("llama.cpp")));
    ollama
        .into_iter()
        .map(|path| at(Store::Ollama, path))
        .chain([
            at(Store::LmStudio, under_home(".lmstudio/models")),
            at(
                Store::LmStudio,
                cache.as_ref().map(|cache| cache.join("lm-studio/models")),
            ),
            at(Store::LlamaCpp, llama_cpp),
            at(
                Store::Gpt4All,
                data.as_ref().map(|data| data.join("nomic.ai/GPT4All")),
            ),
            at(Store::Jan, data.as_ref().map(|data| data.join("Jan/data"))),
            at(Store::Jan, under_home("jan/models")),
        ])
        .flatten()
        .collect()
}

/// Every model under `locations`, each once, sorted by name.
pub fn scan(locations: &[Location]) -> Library {
    let mut library = Library::default();
    let mut budget = WALK_BUDGET;
    for location in locations {
        match location.store {
            Store::Ollama => ollama(&location.path, &mut budget, &mut library),
            store => visit(store, &location.path, &mut budget, &mut library),
        }
    }
    if budget == 0 {
        library.skipped.push(format!(
            "stopped looking after {WALK_BUDGET} files and folders; open other models by path"
        ));
    }
    // Once per file (Ollama's tags can share a blob), under its first name.
    let models = &mut library.models;
    models.sort_by(|a, b| a.path.cmp(&b.path).then(a.name.cmp(&b.name)));
    models.dedup_by(|a, b| a.path == b.path);
    models.sort_by(|a, b| a.name.cmp(&b.name));
    library
}

/// The models under `root` of a store that keeps them as folders and `.gguf` files.
fn visit(store: Store, root: &Path, budget: &mut usize, library: &mut Library) {
    let mut files = Vec::new();
    let mut enter = |dir: &Path| match model_folder(store, dir) {
        Some(model) => {
            library.models.push(model);
            false
        }
        None => true,
    };
    walk(root, MAX_DEPTH, budget, &mut enter, &mut files);
    for path in files.into_iter().filter(|path| has_gguf_extension(path)) {
        match gguf_file(&path) {
            Some(bytes) => library.models.push(LocalModel {
                name: model_name(&path),
                path,
                bytes,
                store,
            }),
            // A link whose target is gone is a removed model, not a damaged one.
            None if path.exists() => library.skipped.push(format!(
                "{}: not a GGUF file (a download that did not finish?)",
                path.display()
            )),
            None => {}
        }
    }
}

/// A folder that holds a whole model: its config and its weights (one file or shards).
fn model_folder(store: Store, dir: &Path) -> Option<LocalModel> {
    model_files::check(dir).ok()?;
    Some(LocalModel {
        path: dir.to_path_buf(),
        name: model_name(dir),
        bytes: weight_bytes(dir),
        store,
    })
}

/// The size of a file that starts as a GGUF file: a half-written download or a dangling link
/// does not.
fn gguf_file(path: &Path) -> Option<u64> {
    let metadata = fs::metadata(path).ok()?;
    (metadata.is_file() && starts_as_gguf(path)).then_some(metadata.len())
}

/// Ollama's models, each under the name its manifest gives it.
fn ollama(root: &Path, budget: &mut usize, library: &mut Library) {
    for manifest in ollama::manifests(root, budget) {
        let name = ollama::name_of(root, &manifest);
        match ollama::weights(root, &manifest) {
            Ok(path) => match gguf_file(&path) {
                Some(bytes) => library.models.push(LocalModel {
                    path,
                    name,
                    bytes,
                    store: Store::Ollama,
                }),
                None => library.skipped.push(format!(
                    "Ollama's {name}: its weights ({}) are missing or not a GGUF file",
                    path.display()
                )),
            },
            Err(reason) => library.skipped.push(format!("Ollama's {name}: {reason}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(path: &Path, bytes: &[u8]) {
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, bytes).unwrap();
    }

    const GGUF: &[u8] = b"GGUF\x03\0\0\0rest";

    fn at(store: Store, path: PathBuf) -> Location {
        Location { store, path }
    }

    /// Laid out as smolchat's own folder and the Hugging Face cache lay models out, beside
    /// what is not a model: a torn download, a file named `.gguf` that is not one, a folder
    /// without weights, a dangling link and a link loop.
    #[test]
    fn finds_every_model_and_only_models() {
        let root = tempfile::tempdir().unwrap();
        let own = root.path().join("models");
        let cache = root.path().join("hub");
        write(&own.join("SmolLM2-135M-Instruct.Q4_1.gguf"), GGUF);
        write(&own.join("notes.gguf"), b"not a model");
        write(&own.join("half.gguf.incomplete"), b"GGUF");
        let snapshot = cache.join("models--Qwen--Qwen3-0.6B/snapshots/0123abcd");
        fs::create_dir_all(&snapshot).unwrap();
        fs::write(snapshot.join("config.json"), "{}").unwrap();
        fs::write(snapshot.join("model.safetensors"), [0u8; 100]).unwrap();
        let gguf_repo = cache.join("models--unsloth--gemma-3-1b-it-GGUF/snapshots/4567");
        write(
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

        let library = scan(&[
            at(Store::Smolchat, own.clone()),
            at(Store::HuggingFace, cache.clone()),
            at(Store::LmStudio, root.path().join("missing")),
        ]);
        let names: Vec<&str> = library.models.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "Qwen/Qwen3-0.6B",
                "SmolLM2-135M-Instruct.Q4_1",
                "unsloth/gemma-3-1b-it-GGUF"
            ]
        );
        assert_eq!(library.models[0].path, snapshot);
        assert_eq!(library.models[0].bytes, 100);
        assert_eq!(library.models[0].store, Store::HuggingFace);
        assert_eq!(library.models[1].bytes, 12);
        assert_eq!(library.skipped.len(), 1, "{:?}", library.skipped);
        assert!(
            library.skipped[0].contains("notes.gguf"),
            "{:?}",
            library.skipped
        );
    }

    /// Each app's store as it lays models out, with tiny GGUF files standing in: Ollama's
    /// manifests and hash-named blobs (one tag of the library, one of a user, one from the hub,
    /// two tags of one blob, a manifest whose blob is gone and one that is not JSON), LM
    /// Studio's `publisher/repo/file`, llama.cpp's flat cache, GPT4All's folder and Jan's
    /// `models/<id>/model.gguf`.
    #[test]
    fn reads_other_apps_stores_in_place() {
        let root = tempfile::tempdir().unwrap();
        let ollama = root.path().join("ollama");
        let blob =
            |hex: &str, bytes: &[u8]| write(&ollama.join(format!("blobs/sha256-{hex}")), bytes);
        let manifest = |relative: &str, hex: &str| {
            let json = format!(
                r#"{{"schemaVersion":2,"config":{{"mediaType":"application/vnd.docker.container.image.v1+json","digest":"sha256:00"}},"layers":[{{"mediaType":"application/vnd.ollama.image.template","digest":"sha256:11"}},{{"mediaType":"application/vnd.ollama.image.model","digest":"sha256:{hex}","size":12}}]}}"#
            );
            write(&ollama.join("manifests").join(relative), json.as_bytes());
        };
        blob("aa", GGUF);
        blob("bb", GGUF);
        blob("cc", GGUF);
        blob("11", b"{{ .Prompt }}");
        manifest("registry.ollama.ai/library/qwen3/1.7b", "aa");
        manifest("registry.ollama.ai/library/qwen3/latest", "aa");
        manifest("registry.ollama.ai/someone/tuned/q4", "bb");
        manifest("hf.co/unsloth/gemma-3-1b-it-GGUF/Q4_K_M", "cc");
        manifest("registry.ollama.ai/library/gone/latest", "dd");
        write(
            &ollama.join("manifests/registry.ollama.ai/library/broken/latest"),
            b"{",
        );
        let lm_studio = root.path().join("lmstudio");
        write(
            &lm_studio.join("lmstudio-community/Qwen3-1.7B-GGUF/Qwen3-1.7B-Q4_K_M.gguf"),
            GGUF,
        );
        let llama_cpp = root.path().join("llama.cpp");
        write(
            &llama_cpp.join("ggml-org_SmolLM3-3B-GGUF_SmolLM3-Q4_K_M.gguf"),
            GGUF,
        );
        let gpt4all = root.path().join("GPT4All");
        write(&gpt4all.join("Phi-3-mini-4k-instruct.Q4_0.gguf"), GGUF);
        let jan = root.path().join("Jan/data");
        write(&jan.join("llamacpp/models/gemma-3-1b-it/model.gguf"), GGUF);

        let library = scan(&[
            at(Store::Ollama, ollama.clone()),
            at(Store::LmStudio, lm_studio),
            at(Store::LlamaCpp, llama_cpp),
            at(Store::Gpt4All, gpt4all),
            at(Store::Jan, jan),
        ]);
        let found: Vec<(&str, Store)> = library
            .models
            .iter()
            .map(|model| (model.name.as_str(), model.store))
            .collect();
        assert_eq!(
            found,
            [
                ("Phi-3-mini-4k-instruct.Q4_0", Store::Gpt4All),
                ("Qwen3-1.7B-Q4_K_M", Store::LmStudio),
                ("gemma-3-1b-it", Store::Jan),
                ("ggml-org_SmolLM3-3B-GGUF_SmolLM3-Q4_K_M", Store::LlamaCpp),
                ("hf.co/unsloth/gemma-3-1b-it-GGUF:Q4_K_M", Store::Ollama),
                ("qwen3:1.7b", Store::Ollama),
                ("someone/tuned:q4", Store::Ollama),
            ]
        );
        let qwen = &library.models[5];
        assert_eq!(qwen.path, ollama.join("blobs/sha256-aa"));
        // Opened by its path, the blob takes the first of its tags' names.
        assert_eq!(model_name(&qwen.path), "qwen3:1.7b");
        assert_eq!(qwen.bytes, GGUF.len() as u64);
        let mut skipped = library.skipped.clone();
        skipped.sort();
        assert_eq!(skipped.len(), 2, "{skipped:?}");
        assert!(skipped[0].starts_with("Ollama's broken:latest: its manifest is not one"));
        assert!(skipped[1].starts_with("Ollama's gone:latest: its weights"));
    }

    #[test]
    fn other_apps_folders_follow_their_variables() {
        let home = Path::new("/home/someone");
        let none = |_: &str| None;
        let paths = |locations: Vec<Location>| -> Vec<(Store, PathBuf)> {
            locations.into_iter().map(|l| (l.store, l.path)).collect()
        };
        assert_eq!(
            paths(other_apps(Some(home), &none)),
            [
                (Store::Ollama, home.join(".ollama/models")),
                (
                    Store::Ollama,
                    PathBuf::from("/usr/share/ollama/.ollama/models")
                ),
                (Store::LmStudio, home.join(".lmstudio/models")),
                (Store::LmStudio, home.join(".cache/lm-studio/models")),
                (Store::LlamaCpp, home.join(".cache/llama.cpp")),
                (Store::Gpt4All, home.join(".local/share/nomic.ai/GPT4All")),
                (Store::Jan, home.join(".local/share/Jan/data")),
                (Store::Jan, home.join("jan/models")),
            ]
        );
        let set = |name: &str| match name {
            "OLLAMA_MODELS" => Some("/srv/ollama".into()),
            "LLAMA_CACHE" => Some("/srv/llama".into()),
            "XDG_DATA_HOME" => Some("/data".into()),
            // Relative: ignored, as the XDG specification says.
            "XDG_CACHE_HOME" => Some("cache".into()),
            _ => None,
        };
        let found = paths(other_apps(Some(home), &set));
        assert_eq!(found[0], (Store::Ollama, PathBuf::from("/srv/ollama")));
        assert_eq!(
            found[2],
            (Store::LmStudio, home.join(".cache/lm-studio/models"))
        );
        assert_eq!(found[3], (Store::LlamaCpp, PathBuf::from("/srv/llama")));
        assert_eq!(
            found[4],
            (Store::Gpt4All, PathBuf::from("/data/nomic.ai/GPT4All"))
        );
    }
}
