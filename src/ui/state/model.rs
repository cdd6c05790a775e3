//! The model: which one is open or opening, the folder checked before it is used, the
//! download that brings one, and the models found on this machine.

use std::path::PathBuf;

use super::AppState;
use super::HubSearch;
use crate::backend::BackendKind;
use crate::downloads::Downloads;
use crate::engine::ModelInfo;
use crate::generation::{MemoryPlan, ModelOptions};
use crate::hub::{DEFAULT_MODEL_ID, DownloadProgress};
use crate::model::LoadProgress;
use crate::model_files;
use crate::model_library::{self, facts::Described};
use crate::model_source::ModelSource;
use crate::store::Paths;
use crate::text::{SamplingDefaults, SamplingParams};

#[derive(Debug, Clone, PartialEq)]
pub enum ModelStatus {
    /// No folder chosen yet: the first-run screen offers a download or a folder.
    NotConfigured,
    Downloading(Option<DownloadProgress>),
    /// Reading the model: what it will take in memory, once its config is read, and how
    /// much of it has been read.
    Loading {
        dir: PathBuf,
        memory: Option<MemoryPlan>,
        progress: Option<LoadProgress>,
    },
    Ready(ModelInfo),
    /// Loading or downloading failed; the message says why and what to do, and the first-run
    /// screen shows it with the ways out again.
    Failed(String),
}

impl AppState {
    pub fn model(&self) -> &ModelStatus {
        &self.model
    }

    pub fn model_ready(&self) -> bool {
        matches!(self.model, ModelStatus::Ready(_))
    }

    pub(super) fn model_options(&self) -> ModelOptions {
        ModelOptions {
            backend: self.settings.backend,
            precision: self.settings.precision,
        }
    }

    /// The first reply on the GPU backend has no token yet: its kernels are compiling, which
    /// takes tens of seconds on a software renderer. The window says so instead of "writing".
    pub fn preparing_gpu(&self) -> bool {
        let on_gpu = matches!(&self.model, ModelStatus::Ready(info) if info.options.backend == BackendKind::Gpu);
        let no_token_yet = self
            .active_reply()
            .is_some_and(|message| message.content.is_empty());
        on_gpu && self.replies_on_model == 0 && no_token_yet
    }

    /// Starts from the model's recommended sampling unless the user has chosen their own
    /// (anything but the app's defaults), which is kept, with a word about the difference.
    pub(super) fn follow_model_sampling(&mut self, defaults: &SamplingDefaults) {
        let mine = self.settings.sampling.clone();
        let suggested = defaults.apply_to(&mine);
        if suggested == mine {
            return;
        }
        let describe = |p: &SamplingParams| {
            format!(
                "temperature {}, top-p {}, top-k {}, min-p {}, repetition penalty {}",
                p.temperature, p.top_p, p.top_k, p.min_p, p.repetition_penalty
            )
        };
        let untouched = SamplingParams {
            seed: mine.seed,
            ..SamplingParams::default()
        } == mine;
        if untouched {
            let sampling = suggested.clone();
            self.change_settings(|s| s.sampling = sampling);
            self.notify(format!(
                "Sampling set to what this model recommends: {}.",
                describe(&suggested)
            ));
        } else {
            self.notify(format!(
                "This model recommends {}; your own sampling settings are kept.",
                describe(&suggested)
            ));
        }
    }

    /// Checks the folder before handing it to the engine, so that a typo gets an immediate
    /// answer and does not unload the model in use.
    pub(super) fn use_model_folder(&mut self, folder: PathBuf) -> bool {
        if let Err(problem) = model_files::check(&folder) {
            let problem = problem.to_string();
            match self.model {
                // The first-run screen shows the reason beside the ways out.
                ModelStatus::NotConfigured | ModelStatus::Failed(_) => {
                    self.model = ModelStatus::Failed(problem);
                }
                ModelStatus::Downloading(_)
                | ModelStatus::Loading { .. }
                | ModelStatus::Ready(_) => {
                    self.errors.push(problem);
                }
            }
            return false;
        }
        self.settings.model_folder = Some(folder.clone());
        self.save_settings();
        self.load_model_folder(folder);
        // Back to the chat, where the model's loading shows.
        self.library_open = false;
        true
    }

    pub(super) fn load_model_folder(&mut self, folder: PathBuf) {
        self.model = ModelStatus::Loading {
            dir: folder.clone(),
            memory: None,
            progress: None,
        };
        self.engine
            .load_model(ModelSource::local(folder), self.model_options());
    }

    /// Reloads the configured model, e.g. after the backend changed.
    pub(super) fn reload_model(&mut self) {
        if let Some(folder) = self.settings.model_folder.clone() {
            self.load_model_folder(folder);
        }
    }

    pub(super) fn download_default_model(&mut self) -> bool {
        self.download(ModelSource::Hub(DEFAULT_MODEL_ID.to_string()))
    }

    /// Downloads a model from the hub and opens it; its progress shows where the chat was.
    pub(super) fn download(&mut self, source: ModelSource) -> bool {
        self.model = ModelStatus::Downloading(None);
        self.library_open = false;
        self.engine.load_model(source, self.model_options())
    }

    /// The models found on this machine, each with what its files say (empty until the scan
    /// has finished).
    pub fn local_models(&self) -> &[Described] {
        &self.local_models
    }

    /// Whether the model library is shown in place of the chat.
    pub fn library_open(&self) -> bool {
        self.library_open
    }

    /// The library's downloads from the hub.
    pub fn downloads(&self) -> &Downloads {
        &self.downloads
    }

    /// The library's search of the hub and its answers.
    pub fn hub(&self) -> &HubSearch {
        &self.hub
    }

    /// Whether the scan for local models is still under way: nothing wakes the window when
    /// it ends, so the window looks again shortly.
    pub fn scanning_models(&self) -> bool {
        self.scanning.is_some()
    }

    pub(super) fn sync_server(&mut self) {
        let model = match &self.model {
            ModelStatus::Ready(info) => Some(info.name.as_str()),
            _ => None,
        };
        self.server.sync(&self.settings.server, model, &self.engine);
    }
}

/// Starts looking for the models on this machine, and reading what each is, on a thread of
/// its own; `None` if the thread cannot start (the first-run screen then offers the download
/// and the path field).
pub(super) fn scan_local_models(
    paths: &Paths,
) -> Option<crossbeam_channel::Receiver<Vec<Described>>> {
    let locations = model_library::locations(paths);
    let (found, scanning) = crossbeam_channel::bounded(1);
    std::thread::Builder::new()
        .name("smolchat-model-scan".into())
        .spawn(move || {
            let models = model_library::scan(&locations).models;
            let _ = found.send(model_library::facts::describe_all(models));
        })
        .ok()?;
    Some(scanning)
}
