//! Deleting a model, which only ever touches smolchat's own models folder and the Hugging
//! Face cache: another app's store belongs to that app (deleting an Ollama blob behind its
//! back breaks Ollama), so its models are refused with the app's own way to remove them.
//!
//! A removal is planned before it is done, so that the caller can show what goes and how
//! much it frees and ask first.

use std::fs;
use std::path::{Path, PathBuf};

use super::{Library, LocalModel, Location, Store};

/// What deleting one model takes away.
#[derive(Debug, Clone, PartialEq)]
pub struct Removal {
    /// Files and folders, deleted in this order.
    pub paths: Vec<PathBuf>,
    /// What it frees.
    pub bytes: u64,
}

/// The files that go with `model`, a model `library` found under `locations`; or, for a
/// model smolchat must not delete, why not and what to do instead.
pub fn plan(
    model: &LocalModel,
    library: &Library,
    locations: &[Location],
) -> Result<Removal, String> {
    let root = locations
        .iter()
        .filter(|location| location.store == model.store)
        .find(|location| model.path.starts_with(&location.path))
        .map(|location| location.path.as_path());
    match (model.store, root) {
        (Store::Smolchat, Some(_)) => Ok(Removal {
            paths: vec![model.path.clone()],
            bytes: model.bytes,
        }),
        (Store::HuggingFace, Some(root)) => hub_cache(model, library, root),
        (Store::Smolchat | Store::HuggingFace, None) => Err(format!(
            "{} is not inside the {} folder; delete it yourself if you mean to",
            model.path.display(),
            model.store.label()
        )),
        (store, _) => Err(format!(
            "{} belongs to {}, which keeps its own list of models: remove it there{}",
            model.name,
            store.label(),
            match store {
                Store::Ollama => format!(" (`ollama rm {}`)", model.name),
                _ => String::new(),
            }
        )),
    }
}

/// In the cache a model is one repository (`models--org--name`), or one GGUF file of a
/// repository that holds several (one per quantization): then only that file's link and the
/// blob it points to go, unless another snapshot links the same blob.
fn hub_cache(model: &LocalModel, library: &Library, root: &Path) -> Result<Removal, String> {
    let repository = model
        .path
        .strip_prefix(root)
        .ok()
        .and_then(|relative| relative.components().next())
        .map(|first| root.join(first))
        .filter(|dir| {
            dir.file_name()
                .is_some_and(|name| name.to_string_lossy().starts_with("models--"))
        })
        .ok_or_else(|| {
            format!(
                "{} is not in a model repository of the Hugging Face cache",
                model.path.display()
            )
        })?;
    let others_in_repository = library
        .models
        .iter()
        .filter(|other| other.path != model.path && other.path.starts_with(&repository))
        .count();
    if others_in_repository == 0 || model.path.is_dir() {
        return Ok(Removal {
            bytes: folder_bytes(&repository),
            paths: vec![repository],
        });
    }
    let mut paths = vec![model.path.clone()];
    // Compared as the links resolve: the cache's own path may pass through a link.
    let blobs = fs::canonicalize(repository.join("blobs")).ok();
    let blob = fs::canonicalize(&model.path).ok();
    if let (Some(blob), Some(blobs)) = (blob, blobs)
        && blob.starts_with(blobs)
        && !linked_elsewhere(&repository, &blob, &model.path)
    {
        paths.push(blob);
    }
    Ok(Removal {
        paths,
        bytes: model.bytes,
    })
}

/// Whether a link in another of the repository's snapshots points at `blob`.
fn linked_elsewhere(repository: &Path, blob: &Path, except: &Path) -> bool {
    let Ok(snapshots) = fs::read_dir(repository.join("snapshots")) else {
        return false;
    };
    snapshots.flatten().any(|snapshot| {
        fs::read_dir(snapshot.path()).is_ok_and(|files| {
            files.flatten().any(|file| {
                file.path() != except
                    && fs::canonicalize(file.path()).is_ok_and(|target| target == blob)
            })
        })
    })
}

/// The bytes of the files under `dir`, links not followed (the cache's snapshots link its
/// blobs, which are counted once, as themselves).
fn folder_bytes(dir: &Path) -> u64 {
    let Ok(entries) = fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|entry| match entry.file_type() {
            Ok(kind) if kind.is_dir() => folder_bytes(&entry.path()),
            Ok(kind) if kind.is_file() => entry.metadata().map_or(0, |meta| meta.len()),
            _ => 0,
        })
        .sum()
}

impl Removal {
    /// Deletes the planned files and folders; a path already gone counts as deleted.
    pub fn apply(&self) -> Result<(), String> {
        for path in &self.paths {
            let removed = match fs::symlink_metadata(path) {
                Ok(meta) if meta.is_dir() => fs::remove_dir_all(path),
                Ok(_) => fs::remove_file(path),
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(()),
                Err(err) => Err(err),
            };
            removed.map_err(|err| format!("cannot delete {}: {err}", path.display()))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model_library::scan;

    const GGUF: &[u8] = b"GGUF\x03\0\0\0 and the rest of a model";

    fn write(path: &Path, bytes: &[u8]) {
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, bytes).unwrap();
    }

    /// A cache repository as the hub client writes it: blobs named by hash, and a snapshot
    /// of links to them.
    fn cached_gguf(root: &Path, repository: &str, commit: &str, file: &str, blob: &str) -> PathBuf {
        let repo = root.join(format!("models--{}", repository.replace('/', "--")));
        write(&repo.join("blobs").join(blob), GGUF);
        let link = repo.join("snapshots").join(commit).join(file);
        fs::create_dir_all(link.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(format!("../../blobs/{blob}"), &link).unwrap();
        link
    }

    fn locations(dir: &Path) -> Vec<Location> {
        vec![
            Location {
                store: Store::Smolchat,
                path: dir.join("smolchat"),
            },
            Location {
                store: Store::HuggingFace,
                path: dir.join("hub"),
            },
            Location {
                store: Store::Ollama,
                path: dir.join("ollama"),
            },
            Location {
                store: Store::LmStudio,
                path: dir.join("lmstudio"),
            },
        ]
    }

    fn found<'a>(library: &'a Library, path: &Path) -> &'a LocalModel {
        library
            .models
            .iter()
            .find(|model| model.path == path)
            .unwrap_or_else(|| panic!("{} not found in {:?}", path.display(), library.models))
    }

    /// The removal planned for the model at `path`, as a scan of `dir`'s stores finds it.
    fn planned(dir: &Path, path: &Path) -> Result<Removal, String> {
        let locations = locations(dir);
        let library = scan(&locations);
        plan(found(&library, path), &library, &locations)
    }

    #[test]
    fn a_file_in_our_folder_goes_alone() {
        let dir = tempfile::tempdir().unwrap();
        let kept = dir.path().join("smolchat/kept.gguf");
        let gone = dir.path().join("smolchat/gone.gguf");
        write(&kept, GGUF);
        write(&gone, GGUF);
        let removal = planned(dir.path(), &gone).unwrap();
        assert_eq!(removal.paths, vec![gone.clone()]);
        assert_eq!(removal.bytes, GGUF.len() as u64);
        removal.apply().unwrap();
        assert!(!gone.exists() && kept.exists());
    }

    #[test]
    fn the_only_model_of_a_cache_repository_takes_the_repository() {
        let dir = tempfile::tempdir().unwrap();
        let hub = dir.path().join("hub");
        let link = cached_gguf(&hub, "org/one", "c0ffee", "one.Q4_0.gguf", "aaaa");
        let kept = cached_gguf(&hub, "org/two", "c0ffee", "two.Q4_0.gguf", "bbbb");
        let removal = planned(dir.path(), &link).unwrap();
        assert_eq!(removal.paths, vec![hub.join("models--org--one")]);
        assert_eq!(removal.bytes, GGUF.len() as u64);
        removal.apply().unwrap();
        assert!(!hub.join("models--org--one").exists());
        assert!(kept.is_file());
    }

    #[test]
    fn one_quantization_of_several_takes_its_link_and_blob() {
        let dir = tempfile::tempdir().unwrap();
        let hub = dir.path().join("hub");
        let q4 = cached_gguf(&hub, "org/m", "c0ffee", "m.Q4_0.gguf", "aaaa");
        let q8 = cached_gguf(&hub, "org/m", "c0ffee", "m.Q8_0.gguf", "bbbb");
        let removal = planned(dir.path(), &q4).unwrap();
        let blob = fs::canonicalize(&q4).unwrap();
        assert_eq!(removal.paths, vec![q4.clone(), blob.clone()]);
        removal.apply().unwrap();
        assert!(!q4.exists() && !blob.exists());
        assert!(q8.is_file(), "the other quantization stays");
    }

    #[test]
    fn a_blob_another_snapshot_links_stays() {
        let dir = tempfile::tempdir().unwrap();
        let hub = dir.path().join("hub");
        let old = cached_gguf(&hub, "org/m", "0ld", "m.Q4_0.gguf", "aaaa");
        let new = cached_gguf(&hub, "org/m", "new", "m.Q4_0.gguf", "aaaa");
        let removal = planned(dir.path(), &old).unwrap();
        assert_eq!(removal.paths, vec![old.clone()]);
        removal.apply().unwrap();
        assert!(new.is_file());
    }

    #[test]
    fn other_apps_models_are_refused_with_their_own_way() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("lmstudio/org/repo/m.gguf");
        write(&file, GGUF);
        let locations = locations(dir.path());
        let library = scan(&locations);
        let refused = plan(found(&library, &file), &library, &locations).unwrap_err();
        assert!(refused.contains("belongs to LM Studio"), "{refused}");
        assert!(file.is_file());

        let ollama = LocalModel {
            path: dir.path().join("ollama/blobs/sha256-0123"),
            name: "smollm2:135m".into(),
            bytes: 1,
            store: Store::Ollama,
        };
        let refused = plan(&ollama, &library, &locations).unwrap_err();
        assert!(refused.contains("`ollama rm smollm2:135m`"), "{refused}");
    }

    #[test]
    fn a_path_outside_its_store_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let stray = LocalModel {
            path: dir.path().join("elsewhere/m.gguf"),
            name: "m".into(),
            bytes: 1,
            store: Store::Smolchat,
        };
        let refused = plan(&stray, &Library::default(), &locations(dir.path())).unwrap_err();
        assert!(
            refused.contains("not inside the smolchat folder"),
            "{refused}"
        );
    }
}
