//! The Hugging Face cache layout, shared with Python `huggingface_hub`, so a
//! model fetched by either tool is reused by the other.

use std::fs;
use std::path::{Path, PathBuf};

use super::blob::INCOMPLETE;
use super::error::HubError;
use crate::atomic_file::write_atomic;

/// Endpoint used when `HF_ENDPOINT` is not set.
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

/// Picks the hub cache folder from the values of `HF_HUB_CACHE`, `HF_HOME`
/// and the home directory, with the same precedence as `huggingface_hub`.
///
/// Takes the values instead of reading the environment so the rules can be
/// tested without mutating process-wide state.
pub fn resolve_cache_dir(
    hf_hub_cache: Option<&str>,
    hf_home: Option<&str>,
    home: Option<&Path>,
) -> Option<PathBuf> {
    if let Some(dir) = non_empty(hf_hub_cache) {
        return Some(PathBuf::from(dir));
    }
    if let Some(dir) = non_empty(hf_home) {
        return Some(Path::new(dir).join("hub"));
    }
    home.map(|home| home.join(".cache").join("huggingface").join("hub"))
}

/// Picks the hub endpoint from the value of `HF_ENDPOINT`.
pub fn resolve_endpoint(hf_endpoint: Option<&str>) -> String {
    non_empty(hf_endpoint)
        .unwrap_or(DEFAULT_ENDPOINT)
        .trim_end_matches('/')
        .to_string()
}

/// Reads `HF_ENDPOINT` from the process environment.
pub fn endpoint_from_env() -> String {
    resolve_endpoint(std::env::var("HF_ENDPOINT").ok().as_deref())
}

fn non_empty(value: Option<&str>) -> Option<&str> {
    value.map(str::trim).filter(|v| !v.is_empty())
}

/// Root of a Hugging Face hub cache (the folder holding `models--*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubCache {
    root: PathBuf,
}

impl HubCache {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        HubCache { root: root.into() }
    }

    /// The cache other Hugging Face tools use on this machine, or `None`
    /// when neither the variables nor a home directory are known.
    pub fn from_env() -> Option<Self> {
        let var = |name| std::env::var(name).ok();
        let home = std::env::var_os("HOME")
            .or_else(|| std::env::var_os("USERPROFILE"))
            .map(PathBuf::from);
        resolve_cache_dir(
            var("HF_HUB_CACHE").as_deref(),
            var("HF_HOME").as_deref(),
            home.as_deref(),
        )
        .map(HubCache::new)
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `models--{org}--{name}`, the folder of one model repository.
    pub fn repo_dir(&self, model_id: &str) -> PathBuf {
        self.root
            .join(format!("models--{}", model_id.replace('/', "--")))
    }

    pub fn blob_path(&self, model_id: &str, etag: &str) -> PathBuf {
        self.repo_dir(model_id).join("blobs").join(etag)
    }

    pub fn snapshot_dir(&self, model_id: &str, commit: &str) -> PathBuf {
        self.repo_dir(model_id).join("snapshots").join(commit)
    }

    /// Marker `huggingface_hub` writes for a file the hub answered 404 for,
    /// so a cached snapshot can be known complete without asking again.
    fn no_exist_path(&self, model_id: &str, commit: &str, file: &str) -> PathBuf {
        self.repo_dir(model_id)
            .join(".no_exist")
            .join(commit)
            .join(file)
    }

    /// Commit a revision points to: the revision itself when it is already a
    /// commit hash, else the content of `refs/{revision}`.
    pub fn resolve_revision(&self, model_id: &str, revision: &str) -> Option<String> {
        if is_commit_hash(revision) {
            return Some(revision.to_string());
        }
        let path = self.repo_dir(model_id).join("refs").join(revision);
        let commit = fs::read_to_string(path).ok()?.trim().to_string();
        is_commit_hash(&commit).then_some(commit)
    }

    pub(crate) fn write_ref(
        &self,
        model_id: &str,
        revision: &str,
        commit: &str,
    ) -> Result<(), HubError> {
        if revision == commit {
            return Ok(());
        }
        let path = self.repo_dir(model_id).join("refs").join(revision);
        write_atomically(&path, commit.as_bytes())
    }

    pub(crate) fn mark_missing(
        &self,
        model_id: &str,
        commit: &str,
        file: &str,
    ) -> Result<(), HubError> {
        write_atomically(&self.no_exist_path(model_id, commit, file), b"")
    }

    pub fn is_marked_missing(&self, model_id: &str, commit: &str, file: &str) -> bool {
        self.no_exist_path(model_id, commit, file).is_file()
    }

    /// Deletes what unfinished downloads of `model_id` left in its blobs (`*.incomplete`, as
    /// both this app and `huggingface_hub` name them), so that a cancelled download does not
    /// keep its part of the file. Returns how many files went.
    pub fn remove_partial_downloads(&self, model_id: &str) -> Result<usize, HubError> {
        let blobs = self.repo_dir(model_id).join("blobs");
        let entries = match fs::read_dir(&blobs) {
            Ok(entries) => entries,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(0),
            Err(err) => return Err(HubError::io("cannot read", &blobs, err)),
        };
        let mut removed = 0;
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension().is_some_and(|ext| ext == INCOMPLETE) {
                fs::remove_file(&path).map_err(|e| HubError::io("cannot remove", &path, e))?;
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// Makes `snapshots/{commit}/{file}` point at the blob: a relative
    /// symlink like `huggingface_hub` makes, or a copy where the file system
    /// refuses symlinks (e.g. Windows without developer mode).
    pub(crate) fn link_snapshot_file(
        &self,
        model_id: &str,
        commit: &str,
        file: &str,
        etag: &str,
    ) -> Result<PathBuf, HubError> {
        let link = self.snapshot_dir(model_id, commit).join(file);
        let blob = self.blob_path(model_id, etag);
        let parent = link.parent().unwrap_or(&self.root);
        fs::create_dir_all(parent).map_err(|e| HubError::io("cannot create", parent, e))?;
        if fs::symlink_metadata(&link).is_ok() {
            fs::remove_file(&link).map_err(|e| HubError::io("cannot replace", &link, e))?;
        }
        // Nested files (`a/b.json`) need one extra `..` per folder level.
        let depth = file.matches('/').count();
        let mut target = PathBuf::from("../".repeat(depth + 2));
        target.push("blobs");
        target.push(etag);
        if symlink(&target, &link).is_err() {
            fs::copy(&blob, &link).map_err(|e| HubError::io("cannot copy into", &link, e))?;
        }
        Ok(link)
    }
}

#[cfg(unix)]
fn symlink(target: &Path, link: &Path) -> std::io::Result<()> {
    std::os::unix::fs::symlink(target, link)
}

#[cfg(windows)]
fn symlink(target: &Path, link: &Path) -> std::io::Result<()> {
    std::os::windows::fs::symlink_file(target, link)
}

#[cfg(not(any(unix, windows)))]
fn symlink(_target: &Path, _link: &Path) -> std::io::Result<()> {
    Err(std::io::Error::from(std::io::ErrorKind::Unsupported))
}

pub(crate) fn is_commit_hash(s: &str) -> bool {
    s.len() == 40 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// A crash never leaves a half-written ref that would point at the wrong snapshot.
fn write_atomically(path: &Path, content: &[u8]) -> Result<(), HubError> {
    write_atomic(path, content).map_err(|e| HubError::io("cannot write", path, e))
}
