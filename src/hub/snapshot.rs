//! Making a complete model snapshot available in the cache.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};

use ureq::Agent;

use super::blob::{BlobRequest, download_blob};
use super::cache::{HubCache, endpoint_from_env};
use super::completeness::{is_complete, shards_in_index};
use super::error::HubError;
use super::gguf_choice;
use super::http::{self, FileMetadata, Lookup, Retries, Timeouts};
use super::model_id::validate_model_id;
use super::progress::{DownloadProgress, ProgressTracker};
use crate::model_files::{OPTIONAL_FILES, REQUIRED_FILES, SHARD_INDEX_FILE, SINGLE_WEIGHTS_FILE};

#[derive(Debug, Clone)]
pub struct HubOptions {
    /// Hub or mirror base URL, without a trailing slash.
    pub endpoint: String,
    pub cache: HubCache,
    /// Branch, tag or commit hash.
    pub revision: String,
    pub timeouts: Timeouts,
    pub retries: Retries,
}

impl HubOptions {
    /// Options from `HF_ENDPOINT`, `HF_HUB_CACHE` and `HF_HOME`, like other
    /// Hugging Face tools; `None` when no cache folder can be determined.
    pub fn from_env() -> Option<Self> {
        Some(HubOptions {
            endpoint: endpoint_from_env(),
            cache: HubCache::from_env()?,
            revision: "main".to_string(),
            timeouts: Timeouts::default(),
            retries: Retries::default(),
        })
    }
}

pub struct ModelDownloader {
    options: HubOptions,
    agent: Agent,
}

/// A file of the snapshot and what the hub says about it.
struct Planned {
    file: String,
    meta: FileMetadata,
}

impl ModelDownloader {
    /// A downloader configured as other Hugging Face tools are (`HF_*` variables).
    pub fn from_env() -> Result<Self, HubError> {
        HubOptions::from_env()
            .map(Self::new)
            .ok_or(HubError::NoCacheDir)
    }

    pub fn new(options: HubOptions) -> Self {
        let agent = http::agent(options.timeouts);
        ModelDownloader { options, agent }
    }

    pub fn options(&self) -> &HubOptions {
        &self.options
    }

    pub(crate) fn agent(&self) -> &Agent {
        &self.agent
    }

    /// The snapshot folder if everything needed is already cached; never
    /// touches the network, so the app starts offline and instantly.
    pub fn cached_model_dir(&self, model_id: &str) -> Option<PathBuf> {
        let cache = &self.options.cache;
        let commit = cache.resolve_revision(model_id, &self.options.revision)?;
        let dir = cache.snapshot_dir(model_id, &commit);
        is_complete(&dir, |file| {
            cache.is_marked_missing(model_id, &commit, file)
        })
        .then_some(dir)
    }

    /// Returns a model folder for `model_id`, downloading what the cache
    /// lacks.
    ///
    /// A complete cached snapshot is used without asking the hub, so an
    /// update to the revision is only picked up once the cache is cleared;
    /// that is the price of working offline without a timeout at startup.
    pub fn ensure_model(
        &self,
        model_id: &str,
        progress: &mut dyn FnMut(DownloadProgress),
        cancel: &AtomicBool,
    ) -> Result<PathBuf, HubError> {
        validate_model_id(model_id)?;
        if let Some(dir) = self.cached_model_dir(model_id) {
            return Ok(dir);
        }
        let cache = &self.options.cache;
        let first = self
            .lookup(model_id, &self.options.revision, REQUIRED_FILES[0])
            .map_err(|e| self.offline(model_id, e))?
            .ok_or_else(|| self.missing(model_id, &self.options.revision, REQUIRED_FILES[0]))?;
        let commit = first.commit.clone();
        let mut plan = vec![Planned {
            file: REQUIRED_FILES[0].to_string(),
            meta: first,
        }];
        for file in &REQUIRED_FILES[1..] {
            plan.push(self.require(model_id, &commit, file)?);
        }
        for file in OPTIONAL_FILES {
            match self.lookup(model_id, &commit, file)? {
                Some(meta) => plan.push(Planned {
                    file: file.to_string(),
                    meta,
                }),
                None => cache.mark_missing(model_id, &commit, file)?,
            }
        }
        match self.lookup(model_id, &commit, SINGLE_WEIGHTS_FILE)? {
            Some(meta) => plan.push(Planned {
                file: SINGLE_WEIGHTS_FILE.to_string(),
                meta,
            }),
            None => {
                // The shard list is inside the index, so it is fetched now.
                let index = self.require(model_id, &commit, SHARD_INDEX_FILE)?;
                let index_path = self.fetch(model_id, &index, 1, 1, &mut |_| {}, cancel)?;
                for shard in shards_in_index(&index_path)? {
                    plan.push(self.require(model_id, &commit, &shard)?);
                }
            }
        }
        self.fetch_all(model_id, &plan, progress, cancel)?;
        cache.write_ref(model_id, &self.options.revision, &commit)?;
        Ok(cache.snapshot_dir(model_id, &commit))
    }

    /// The `.gguf` file of `model_id` whose name carries the quantization `quant` (the
    /// `owner/repo:Q4_K_M` form), downloading that file alone, with the same resume, retries
    /// and checks. A copy already in the cache is used without asking the hub.
    pub fn ensure_gguf(
        &self,
        model_id: &str,
        quant: &str,
        progress: &mut dyn FnMut(DownloadProgress),
        cancel: &AtomicBool,
    ) -> Result<PathBuf, HubError> {
        validate_model_id(model_id)?;
        let cache = &self.options.cache;
        if let Some(commit) = cache.resolve_revision(model_id, &self.options.revision) {
            let dir = cache.snapshot_dir(model_id, &commit);
            let cached: Vec<String> = std::fs::read_dir(&dir)
                .map(|entries| {
                    entries
                        .flatten()
                        .map(|entry| entry.file_name().to_string_lossy().into_owned())
                        .collect()
                })
                .unwrap_or_default();
            if let Ok(file) = gguf_choice::choose(model_id, quant, &cached) {
                return Ok(dir.join(file));
            }
        }
        let files = self
            .list_files(model_id)
            .map_err(|e| self.offline(model_id, e))?;
        let file = gguf_choice::choose(model_id, quant, &files)?;
        let meta = self
            .lookup(model_id, &self.options.revision, &file)?
            .ok_or_else(|| self.missing(model_id, &self.options.revision, &file))?;
        let planned = Planned { file, meta };
        let path = self.fetch(model_id, &planned, 1, 1, progress, cancel)?;
        cache.write_ref(model_id, &self.options.revision, &planned.meta.commit)?;
        Ok(path)
    }

    /// The repository's file names at the configured revision, from the hub's API.
    fn list_files(&self, model_id: &str) -> Result<Vec<String>, HubError> {
        Ok(self
            .repository_files(model_id)?
            .into_iter()
            .map(|file| file.name)
            .collect())
    }

    fn fetch_all(
        &self,
        model_id: &str,
        plan: &[Planned],
        progress: &mut dyn FnMut(DownloadProgress),
        cancel: &AtomicBool,
    ) -> Result<(), HubError> {
        let cache = &self.options.cache;
        let missing: Vec<&Planned> = plan
            .iter()
            .filter(|p| {
                !cache
                    .snapshot_dir(model_id, &p.meta.commit)
                    .join(&p.file)
                    .is_file()
            })
            .collect();
        for (i, planned) in missing.iter().enumerate() {
            self.fetch(model_id, planned, i + 1, missing.len(), progress, cancel)?;
        }
        Ok(())
    }

    /// Puts one file into the snapshot, downloading its blob unless another
    /// revision or tool already stored the same content.
    fn fetch(
        &self,
        model_id: &str,
        planned: &Planned,
        file_index: usize,
        file_count: usize,
        progress: &mut dyn FnMut(DownloadProgress),
        cancel: &AtomicBool,
    ) -> Result<PathBuf, HubError> {
        let cache = &self.options.cache;
        let meta = &planned.meta;
        let snapshot_file = cache
            .snapshot_dir(model_id, &meta.commit)
            .join(&planned.file);
        if snapshot_file.is_file() {
            return Ok(snapshot_file);
        }
        if cancel.load(Ordering::Relaxed) {
            return Err(HubError::Cancelled {
                file: planned.file.clone(),
            });
        }
        let blob = cache.blob_path(model_id, &meta.etag);
        if !blob.is_file() {
            let mut tracker =
                ProgressTracker::new(&planned.file, file_index, file_count, 0, meta.size);
            let request = BlobRequest {
                file: &planned.file,
                meta,
                blob: &blob,
            };
            let retries = self.options.retries;
            download_blob(
                &self.agent,
                &request,
                retries,
                &mut tracker,
                progress,
                cancel,
            )?;
        }
        cache.link_snapshot_file(model_id, &meta.commit, &planned.file, &meta.etag)
    }

    fn lookup(
        &self,
        model_id: &str,
        revision: &str,
        file: &str,
    ) -> Result<Option<FileMetadata>, HubError> {
        match http::head_file(&self.agent, &self.resolve_url(model_id, revision, file))? {
            Lookup::Found(meta) => Ok(Some(meta)),
            Lookup::NotFound => Ok(None),
        }
    }

    fn require(&self, model_id: &str, commit: &str, file: &str) -> Result<Planned, HubError> {
        let meta = self
            .lookup(model_id, commit, file)?
            .ok_or_else(|| self.missing(model_id, commit, file))?;
        Ok(Planned {
            file: file.to_string(),
            meta,
        })
    }

    fn resolve_url(&self, model_id: &str, revision: &str, file: &str) -> String {
        format!(
            "{}/{model_id}/resolve/{revision}/{file}",
            self.options.endpoint
        )
    }

    fn missing(&self, model_id: &str, revision: &str, file: &str) -> HubError {
        HubError::MissingFile {
            model_id: model_id.to_string(),
            file: file.to_string(),
            url: self.resolve_url(model_id, revision, file),
        }
    }

    /// The first request decides whether the hub is reachable at all; its
    /// network failure is explained with the ways out for the user.
    fn offline(&self, model_id: &str, error: HubError) -> HubError {
        match error {
            HubError::Network { reason, .. } => HubError::Offline {
                model_id: model_id.to_string(),
                endpoint: self.options.endpoint.clone(),
                cache_dir: self.options.cache.repo_dir(model_id),
                reason,
            },
            other => other,
        }
    }
}
