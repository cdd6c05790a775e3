//! The download manager: models fetched from the hub one after another, each of which can be
//! paused, resumed or cancelled while the window goes on, and which carry on where they
//! stopped after the app is closed and opened again.
//!
//! One download runs at a time, on a thread of its own: the hub's bandwidth is shared by
//! whatever runs, so two at once finish no sooner, and the first would be ready later. A
//! paused download keeps its part of the file in the Hugging Face cache (`.incomplete`,
//! as `huggingface_hub` keeps it), and resuming asks the hub for the rest only; a dropped
//! connection is resumed by the hub code itself, as for every download.

mod saved;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crossbeam_channel::{Receiver, TryRecvError};

use crate::hub::{DownloadProgress, HubError, HubOptions, ModelDownloader};
use saved::Saved;

/// One model in the list: `spec` is `org/name` (a whole safetensors model) or
/// `org/name:QUANT` (one GGUF file), as `--model` takes them.
#[derive(Debug, Clone, PartialEq)]
pub struct Download {
    pub id: u64,
    pub spec: String,
    pub state: DownloadState,
}

#[derive(Debug, Clone, PartialEq)]
pub enum DownloadState {
    /// Waiting for the one before it.
    Queued,
    /// Receiving; the progress once the first bytes came.
    Running(Option<DownloadProgress>),
    /// Stopped by the user, with how far it had come.
    Paused(Option<DownloadProgress>),
    Failed(String),
    /// Complete: the model folder or `.gguf` file in the cache.
    Done(PathBuf),
}

impl DownloadState {
    /// Still to be fetched, so kept across a restart.
    fn unfinished(&self) -> bool {
        matches!(
            self,
            Self::Queued | Self::Running(_) | Self::Paused(_) | Self::Failed(_)
        )
    }
}

/// What a stop of the running download is for.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Stop {
    Pause,
    Cancel,
}

/// The download under way, on its thread.
struct Running {
    id: u64,
    /// Kept here as a cancelled download leaves the list at once, before its thread ends.
    spec: String,
    stop: Arc<AtomicBool>,
    asked: Option<Stop>,
    reports: Receiver<Report>,
}

enum Report {
    Progress(DownloadProgress),
    Finished(Result<PathBuf, HubError>),
}

pub struct Downloads {
    /// `None` where no Hugging Face cache folder can be found: each download fails, saying so.
    options: Option<HubOptions>,
    /// Where the unfinished downloads are kept; `None` keeps them in memory only.
    file: Option<PathBuf>,
    list: Vec<Download>,
    next_id: u64,
    running: Option<Running>,
    /// Why the list could not be read or kept, until taken.
    problem: Option<String>,
}

impl Downloads {
    /// The manager, with the downloads `file` kept from the last run: those that were
    /// running or queued start again, the paused stay paused.
    pub fn start(options: Option<HubOptions>, file: Option<PathBuf>) -> Self {
        let (saved, problem) = match &file {
            Some(file) => saved::load(file),
            None => (Vec::new(), None),
        };
        let mut downloads = Self {
            options,
            file,
            list: Vec::new(),
            next_id: 1,
            running: None,
            problem,
        };
        for Saved { spec, paused } in saved {
            let state = match paused {
                true => DownloadState::Paused(None),
                false => DownloadState::Queued,
            };
            downloads.push(spec, state);
        }
        downloads.start_next();
        downloads
    }

    /// Newest last.
    pub fn list(&self) -> &[Download] {
        &self.list
    }

    /// Whether one is running: the window then looks again shortly.
    pub fn busy(&self) -> bool {
        self.running.is_some()
    }

    /// Why the list of downloads could not be read or kept, once.
    pub fn take_problem(&mut self) -> Option<String> {
        self.problem.take()
    }

    /// Puts `spec` at the end of the queue, unless it is in the list unfinished already (then
    /// it is resumed). Returns its id.
    pub fn add(&mut self, spec: &str) -> u64 {
        let spec = spec.trim();
        let existing = self
            .list
            .iter()
            .find(|download| download.spec == spec && download.state.unfinished())
            .map(|download| download.id);
        let id = match existing {
            Some(id) => {
                self.resume(id);
                id
            }
            None => {
                self.list.retain(|download| download.spec != spec);
                let id = self.push(spec.to_string(), DownloadState::Queued);
                self.save();
                id
            }
        };
        self.start_next();
        id
    }

    /// Stops download `id`, keeping what it received; false when it is not running or queued.
    pub fn pause(&mut self, id: u64) -> bool {
        if let Some(running) = self.running.as_mut().filter(|running| running.id == id) {
            running.asked.get_or_insert(Stop::Pause);
            running.stop.store(true, Ordering::SeqCst);
            return true;
        }
        let Some(download) = self.get_mut(id) else {
            return false;
        };
        if download.state != DownloadState::Queued {
            return false;
        }
        download.state = DownloadState::Paused(None);
        self.save();
        true
    }

    /// Queues a paused or failed download again; it goes on from the bytes it has.
    pub fn resume(&mut self, id: u64) -> bool {
        let Some(download) = self.get_mut(id) else {
            return false;
        };
        if !matches!(
            download.state,
            DownloadState::Paused(_) | DownloadState::Failed(_)
        ) {
            return false;
        }
        download.state = DownloadState::Queued;
        self.save();
        self.start_next();
        true
    }

    /// Stops download `id` and deletes what it received, or takes a finished one off the
    /// list (the model stays on disk).
    pub fn cancel(&mut self, id: u64) -> bool {
        let Some(index) = self.list.iter().position(|download| download.id == id) else {
            return false;
        };
        let download = self.list.remove(index);
        match self.running.as_mut().filter(|running| running.id == id) {
            // Its part goes once its thread has stopped writing it.
            Some(running) => {
                running.asked = Some(Stop::Cancel);
                running.stop.store(true, Ordering::SeqCst);
            }
            None if download.state.unfinished() => self.discard(&download.spec),
            None => {}
        }
        self.save();
        true
    }

    /// Takes in what the running download reported, and starts the next one when it ends.
    /// Returns the downloads that completed since the last call. Never blocks.
    pub fn poll(&mut self) -> Vec<Download> {
        let mut completed = Vec::new();
        while let Some(running) = &self.running {
            let report = match running.reports.try_recv() {
                Ok(report) => report,
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => Report::Finished(Err(HubError::Network {
                    url: String::new(),
                    reason: "the download's thread ended without an answer".into(),
                })),
            };
            let id = running.id;
            match report {
                Report::Progress(progress) => {
                    if let Some(download) = self.get_mut(id) {
                        download.state = DownloadState::Running(Some(progress));
                    }
                }
                Report::Finished(result) => {
                    let Some(Running { asked, spec, .. }) = self.running.take() else {
                        break;
                    };
                    if asked == Some(Stop::Cancel) {
                        // Complete before the stop took, the model stays; else its part goes.
                        if result.is_err() {
                            self.discard(&spec);
                        }
                    } else {
                        completed.extend(self.finish(id, result));
                    }
                    self.save();
                    self.start_next();
                }
            }
        }
        completed
    }

    /// Records how download `id` ended; returns it when it completed.
    fn finish(&mut self, id: u64, result: Result<PathBuf, HubError>) -> Option<Download> {
        let index = self.list.iter().position(|download| download.id == id)?;
        let last = match &self.list[index].state {
            DownloadState::Running(progress) => progress.clone(),
            _ => None,
        };
        let state = match result {
            Ok(path) => DownloadState::Done(path),
            Err(HubError::Cancelled { .. }) => DownloadState::Paused(last),
            Err(err) => DownloadState::Failed(err.to_string()),
        };
        let done = matches!(state, DownloadState::Done(_));
        self.list[index].state = state;
        done.then(|| self.list[index].clone())
    }

    /// Starts the first queued download when none runs.
    fn start_next(&mut self) {
        if self.running.is_some() {
            return;
        }
        let Some(download) = self
            .list
            .iter_mut()
            .find(|download| download.state == DownloadState::Queued)
        else {
            return;
        };
        download.state = DownloadState::Running(None);
        let (id, spec) = (download.id, download.spec.clone());
        let (report, reports) = crossbeam_channel::unbounded();
        let stop = Arc::new(AtomicBool::new(false));
        let (options, stopped, asked) = (self.options.clone(), stop.clone(), spec.clone());
        let progress_report = report.clone();
        let started = std::thread::Builder::new()
            .name("smolchat-download".into())
            .spawn(move || {
                let result = match options {
                    Some(options) => fetch(
                        &ModelDownloader::new(options),
                        &asked,
                        &mut |progress| {
                            let _ = progress_report.send(Report::Progress(progress));
                        },
                        &stopped,
                    ),
                    None => Err(HubError::NoCacheDir),
                };
                let _ = report.send(Report::Finished(result));
            });
        self.running = Some(Running {
            id,
            spec,
            stop,
            asked: None,
            reports,
        });
        if let Err(err) = started {
            self.running = None;
            if let Some(download) = self.get_mut(id) {
                download.state = DownloadState::Failed(format!("cannot start a thread: {err}"));
            }
        }
    }

    fn push(&mut self, spec: String, state: DownloadState) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.list.push(Download { id, spec, state });
        id
    }

    fn get_mut(&mut self, id: u64) -> Option<&mut Download> {
        self.list.iter_mut().find(|download| download.id == id)
    }

    /// Deletes the partial files of `spec`'s repository, unless another unfinished download
    /// of the same repository would lose its own with them.
    fn discard(&mut self, spec: &str) {
        let Some(options) = &self.options else { return };
        let repository = repository_of(spec);
        let shared = self.list.iter().any(|download| {
            repository_of(&download.spec) == repository && download.state.unfinished()
        });
        if shared {
            return;
        }
        if let Err(err) = options.cache.remove_partial_downloads(repository) {
            self.problem = Some(format!("The cancelled download's part stays: {err}"));
        }
    }

    /// Keeps the unfinished downloads in the file, for the next start.
    fn save(&mut self) {
        let Some(file) = &self.file else { return };
        let kept: Vec<Saved> = self
            .list
            .iter()
            .filter(|download| download.state.unfinished())
            .map(|download| Saved {
                spec: download.spec.clone(),
                paused: matches!(download.state, DownloadState::Paused(_)),
            })
            .collect();
        if let Err(err) = saved::save(file, &kept) {
            self.problem = Some(err);
        }
    }
}

impl Drop for Downloads {
    /// Stops the running download, keeping its part; the list already says it is to go on.
    fn drop(&mut self) {
        if let Some(running) = &self.running {
            running.stop.store(true, Ordering::SeqCst);
        }
    }
}

/// `org/name` of `org/name` or `org/name:QUANT`.
fn repository_of(spec: &str) -> &str {
    spec.split_once(':')
        .map_or(spec, |(repository, _)| repository)
}

/// Fetches `spec` into the cache: the one GGUF file of its quantization, or the whole model.
fn fetch(
    downloader: &ModelDownloader,
    spec: &str,
    progress: &mut dyn FnMut(DownloadProgress),
    stop: &AtomicBool,
) -> Result<PathBuf, HubError> {
    match spec.split_once(':') {
        Some((model_id, quant)) => downloader.ensure_gguf(model_id, quant, progress, stop),
        None => downloader.ensure_model(spec, progress, stop),
    }
}
