//! Everything the window shows, and every action it can take, without any drawing: the
//! widgets read this and push [`Action`]s, which [`AppState::apply`] runs; tests and
//! `smolchat dev chat` drive it the same way. The engine is passed in, so tests can script it.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use self::reply::ActiveGeneration;
use super::commands::{Action, DialogFor, UiCommand};
use super::local_server::{LocalServer, ServerStatus};
use crate::backend::BackendKind;
use crate::downloads::Downloads;
use crate::engine::{EngineError, EngineHandle, Event, LiveStats, ModelInfo, RequestId};
use crate::generation::{FinishReason, MemoryPlan, ModelOptions, PromptProgress};
use crate::hub::{DEFAULT_MODEL_ID, DownloadProgress, HubOptions};
use crate::model_files;
use crate::model_library::{self, facts::Described};
use crate::model_source::ModelSource;
use crate::store::{
    Appended, Conversation, ConversationStore, MessageStats, Paths, PromptPreset, Settings,
    StoredMessage, StoredToken, TRASH_DAYS, Theme, Trashed,
};
use crate::text::{SamplingDefaults, SamplingParams};

/// How long the live plot looks back.
pub const HISTORY_WINDOW: Duration = Duration::from_secs(60);

/// How often a streaming reply is written to disk: a crash loses at most this much.
pub const DEFAULT_SAVE_INTERVAL: Duration = Duration::from_secs(1);

#[derive(Debug, Clone, PartialEq)]
pub enum ModelStatus {
    /// No folder chosen yet: the first-run screen offers a download or a folder.
    NotConfigured,
    Downloading(Option<DownloadProgress>),
    /// Reading the model; what it will take in memory, once its config is read.
    Loading(PathBuf, Option<MemoryPlan>),
    Ready(ModelInfo),
    /// Loading or downloading failed; the message says why and what to do, and the first-run
    /// screen shows it with the ways out again.
    Failed(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExportFormat {
    Markdown,
    Json,
}

/// One point of the live plot.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StatsSample {
    pub seconds: f64,
    pub tokens_per_second: f64,
    pub resident_mib: f64,
}

/// A passing word about what just happened. It leaves after [`NOTICE_LIFETIME`] or when
/// dismissed (errors, which say what to do, stay until dismissed); one about a conversation
/// shows only while that conversation is open.
#[derive(Debug)]
struct Notice {
    text: String,
    /// The conversation it concerns, by id.
    conversation: Option<String>,
    until: Instant,
}

/// How long a notice stays by default: long enough to read two lines.
pub const NOTICE_LIFETIME: Duration = Duration::from_secs(8);

pub struct AppState {
    paths: Paths,
    settings: Settings,
    store: ConversationStore,
    /// Newest first; never empty, so there is always a conversation to type into.
    conversations: Vec<Conversation>,
    current: usize,
    /// Declared before the engine, so it stops before the engine it serves.
    server: LocalServer,
    engine: EngineHandle,
    model: ModelStatus,
    generation: Option<ActiveGeneration>,
    /// Figures of the running generation, or of the last one.
    live: Option<LiveStats>,
    history: VecDeque<StatsSample>,
    /// Problems the user should see, with what to do about them; dismissed one by one.
    errors: Vec<String>,
    /// Short, passing messages (export done, messages dropped from the context, ...), each
    /// dismissed on its own: one event can have two things to say (a GPU fallback and a
    /// missing chat template on the same model).
    notices: Vec<Notice>,
    /// The id of the last deleted conversation, which Undo brings back from the trash, until
    /// the next deletion.
    deleted: Option<String>,
    /// Deleted conversations, most recently deleted first, restorable for [`TRASH_DAYS`] days.
    trash: Vec<Trashed>,
    save_interval: Duration,
    notice_lifetime: Duration,
    started: Instant,
    /// Replies finished since the model loaded: the GPU compiles its kernels in the first.
    replies_on_model: usize,
    /// The models on this machine, once the scan started with the window has finished.
    local_models: Vec<Described>,
    /// The scan under way, off this thread: a large store must not hold up the window.
    scanning: Option<crossbeam_channel::Receiver<Vec<Described>>>,
    /// The model library is shown in place of the chat.
    library_open: bool,
    /// The trash is shown in place of the chat.
    trash_open: bool,
    /// The library's search of the hub.
    hub: HubSearch,
    downloads: Downloads,
}

impl AppState {
    /// Loads settings and conversations from `paths`, and the configured model into `engine`
    /// (the window passes [`EngineHandle::spawn`], tests a scripted engine).
    pub fn new(paths: Paths, engine: EngineHandle) -> Self {
        Self::with_hub(paths, engine, HubOptions::from_env())
    }

    /// As [`AppState::new`], with the hub and cache `hub` names (`None`: no cache folder).
    pub fn with_hub(paths: Paths, engine: EngineHandle, hub: Option<HubOptions>) -> Self {
        let mut errors = Vec::new();
        let (settings, problem) = Settings::load(&paths.settings_file());
        errors.extend(problem.map(|problem| format!("Settings: {problem}.")));
        let store = ConversationStore::new(paths.conversations_dir());
        let (mut conversations, problems) = store.load_all();
        errors.extend(problems);
        if conversations.is_empty() {
            conversations.push(Conversation::new());
        }
        let kept = Duration::from_secs(TRASH_DAYS * 24 * 3600);
        if let Err(err) = store.empty_trash_older_than(kept) {
            errors.push(format!(
                "cannot empty the trash of chats deleted over {TRASH_DAYS} days ago: {err}."
            ));
        }
        let (trash, problems) = store.trashed();
        errors.extend(problems);
        // A draft the app kept before drafts belonged to chats goes to the newest chat.
        if !settings.draft.is_empty() && conversations[0].draft.is_empty() {
            conversations[0].draft = settings.draft.clone();
        }
        // Downloads left unfinished by the last run go on at once.
        let downloads = Downloads::start(hub.clone(), Some(paths.downloads_file()));
        let mut state = Self {
            paths,
            settings,
            store,
            conversations,
            current: 0,
            server: LocalServer::new(),
            engine,
            model: ModelStatus::NotConfigured,
            generation: None,
            live: None,
            history: VecDeque::new(),
            errors,
            notices: Vec::new(),
            deleted: None,
            trash,
            save_interval: DEFAULT_SAVE_INTERVAL,
            notice_lifetime: NOTICE_LIFETIME,
            started: Instant::now(),
            replies_on_model: 0,
            local_models: Vec::new(),
            scanning: None,
            library_open: false,
            trash_open: false,
            hub: HubSearch::new(hub),
            downloads,
        };
        state.scanning = scan_local_models(&state.paths);
        if let Some(folder) = state.settings.model_folder.clone() {
            state.load_model_folder(folder);
        }
        state.sync_server();
        state
    }

    /// How often a streaming reply is written to disk (default [`DEFAULT_SAVE_INTERVAL`]).
    pub fn with_save_interval(mut self, interval: Duration) -> Self {
        self.save_interval = interval;
        self
    }

    /// How long a notice stays (default [`NOTICE_LIFETIME`]).
    pub fn with_notice_lifetime(mut self, lifetime: Duration) -> Self {
        self.notice_lifetime = lifetime;
        self
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// Newest first, never empty.
    pub fn conversations(&self) -> &[Conversation] {
        &self.conversations
    }

    pub fn current_index(&self) -> usize {
        self.current
    }

    pub fn current(&self) -> &Conversation {
        &self.conversations[self.current]
    }

    pub fn model(&self) -> &ModelStatus {
        &self.model
    }

    /// Figures of the running generation, or of the last one.
    pub fn live(&self) -> Option<&LiveStats> {
        self.live.as_ref()
    }

    /// Decode speed and memory over the last [`HISTORY_WINDOW`], oldest first.
    pub fn history(&self) -> &VecDeque<StatsSample> {
        &self.history
    }

    pub fn errors(&self) -> &[String] {
        &self.errors
    }

    /// The notices for what is on screen now, oldest first.
    pub fn notices(&self) -> Vec<&str> {
        self.shown_notices()
            .map(|notice| notice.text.as_str())
            .collect()
    }

    fn shown_notices(&self) -> impl Iterator<Item = &Notice> {
        let now = Instant::now();
        let current = &self.current().id;
        self.notices.iter().filter(move |notice| {
            notice.until > now && notice.conversation.as_ref().is_none_or(|id| id == current)
        })
    }

    /// How long until the next notice leaves, so the window can ask to be woken for it.
    pub fn next_notice_change(&self) -> Option<Duration> {
        let now = Instant::now();
        self.shown_notices()
            .map(|notice| notice.until.saturating_duration_since(now))
            .min()
    }

    pub fn can_undo_delete(&self) -> bool {
        self.deleted.is_some()
    }

    /// Deleted conversations, most recently deleted first.
    pub fn trash(&self) -> &[Trashed] {
        &self.trash
    }

    /// The trash is shown in place of the chat.
    pub fn trash_open(&self) -> bool {
        self.trash_open
    }

    pub fn is_generating(&self) -> bool {
        self.generation.is_some()
    }

    /// The generation under way, when it is the current conversation's.
    fn current_generation(&self) -> Option<&ActiveGeneration> {
        self.generation
            .as_ref()
            .filter(|active| active.conversation_id == self.current().id)
    }

    /// Index of the message being streamed into, in the current conversation.
    pub fn streaming_message(&self) -> Option<usize> {
        self.current_generation().map(|active| active.message_index)
    }

    /// The "Serve on localhost" server's state.
    pub fn server(&self) -> &ServerStatus {
        self.server.status()
    }

    /// Stop was pressed and the reply has not ended yet: the engine checks between tokens,
    /// and a step can take seconds (the GPU's first, which compiles its kernels).
    pub fn stopping(&self) -> bool {
        self.generation
            .as_ref()
            .is_some_and(|generation| generation.stop_pressed)
    }

    /// How far the active reply's long prompt has been read, while it is.
    pub fn reading_prompt(&self) -> Option<PromptProgress> {
        self.current_generation().and_then(|active| active.reading)
    }

    /// How many generations the active reply waits behind, while it waits.
    pub fn waiting_behind(&self) -> Option<usize> {
        self.current_generation().and_then(|active| active.waiting)
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

    /// The current chat's system prompt: its own, or the default for chats that have none.
    pub fn system_prompt(&self) -> &str {
        self.current()
            .system_prompt
            .as_deref()
            .unwrap_or(&self.settings.system_prompt)
    }

    pub fn model_ready(&self) -> bool {
        matches!(self.model, ModelStatus::Ready(_))
    }

    fn model_options(&self) -> ModelOptions {
        ModelOptions {
            backend: self.settings.backend,
            precision: self.settings.precision,
        }
    }

    /// Runs one user action. False when it was refused or failed; the notices or errors say
    /// why.
    pub fn apply(&mut self, action: impl Into<Action>) -> bool {
        match action.into() {
            Action::Command(command) => self.run(command),
            Action::Send(text) => self.send(&text),
            Action::Select(index) => self.select(index),
            Action::Rename(index, title) => self.rename(index, &title),
            Action::Delete(index) => self.delete(index),
            Action::UndoDelete => self.undo_delete(),
            Action::Restore(id) => self.restore(&id),
            Action::DeleteForever(id) => self.delete_forever(Some(&id)),
            Action::EmptyTrash => self.delete_forever(None),
            Action::EditAndResend(index, text) => self.edit_and_resend(index, &text),
            Action::ShowVariant(index, variant) => self.show_variant(index, variant),
            Action::Fork(index) => self.fork(index),
            Action::MoveToFolder(index, folder) => self.move_to_folder(index, folder.as_deref()),
            Action::RemoveFolder(folder) => self.remove_folder(&folder),
            Action::SetSystemPrompt(prompt) => {
                self.conversations[self.current].system_prompt = Some(prompt);
                self.save_current()
            }
            Action::SetThinking(thinking) => {
                self.conversations[self.current].thinking = Some(thinking);
                self.save_current()
            }
            Action::SetChatSampling(sampling) => {
                self.conversations[self.current].sampling = sampling;
                self.save_current()
            }
            Action::SavePreset(name) => self.save_preset(&name),
            Action::DeletePreset(index) => {
                let exists = index < self.settings.prompt_presets.len();
                exists && self.change_settings(|s| drop(s.prompt_presets.remove(index)))
            }
            Action::UseModelFolder(folder) => self.use_model_folder(folder),
            Action::DownloadDefaultModel => self.download_default_model(),
            Action::SearchHub(query) => {
                self.hub.search(query);
                true
            }
            Action::ListHubFiles(model_id) => {
                self.hub.list_files(model_id);
                true
            }
            Action::QueueDownload(spec) => {
                self.downloads.add(&spec);
                true
            }
            Action::PauseDownload(id) => self.downloads.pause(id),
            Action::ResumeDownload(id) => self.downloads.resume(id),
            Action::CancelDownload(id) => self.downloads.cancel(id),
            Action::UpdateSettings(settings) => self.update_settings(settings),
            Action::DismissError(index) => remove(&mut self.errors, index),
            Action::DismissNotice(index) => {
                let Some(text) = self.notices().get(index).map(|text| text.to_string()) else {
                    return false;
                };
                self.notices.retain(|notice| notice.text != text);
                true
            }
            Action::ExportTo(format, path) => self.export_to(format, path),
            Action::ImportFrom(path) => self.import_from(&path),
            Action::NoFileDialog(asked_for) => {
                let advice = no_file_dialog_advice(asked_for, &self.paths);
                self.notify(advice);
                true
            }
            Action::RememberWindow { size, draft } => {
                let id = self.current().id.clone();
                self.keep_draft(&id, draft);
                let conversation = self.current().clone();
                let saved = conversation.messages.is_empty() && conversation.draft.is_empty()
                    || self.save(&conversation);
                // Drafts belonged to the app before they belonged to a chat.
                saved
                    && self.change_settings(|settings| {
                        settings.window_size = size.or(settings.window_size);
                        settings.draft.clear();
                    })
            }
            Action::KeepDraft {
                conversation,
                draft,
            } => self.keep_draft(&conversation, draft),
        }
    }

    fn run(&mut self, command: UiCommand) -> bool {
        match command {
            UiCommand::NewConversation => self.new_conversation(),
            UiCommand::RegenerateLast => self.regenerate(),
            UiCommand::ContinueLast => self.continue_reply(),
            UiCommand::PreviousReply | UiCommand::NextReply => {
                let Some(shown) = self.last_reply().map(|reply| reply.variant) else {
                    return false;
                };
                let wanted = match command {
                    UiCommand::PreviousReply => shown.checked_sub(1),
                    _ => Some(shown + 1),
                };
                let last = self.current().messages.len() - 1;
                wanted.is_some_and(|variant| self.show_variant(last, variant))
            }
            UiCommand::StopGeneration => {
                self.engine.stop();
                if let Some(generation) = &mut self.generation {
                    generation.stop_pressed = true;
                }
                true
            }
            UiCommand::ExportMarkdown => self.export_current(ExportFormat::Markdown),
            UiCommand::ExportJson => self.export_current(ExportFormat::Json),
            // Only the window's focus moves; `SmolchatApp::execute` does that.
            UiCommand::FocusInput => true,
            // The search box is in the conversation list, which is shown for it.
            UiCommand::SearchChats => {
                self.settings.show_conversations
                    || self.change_settings(|s| s.show_conversations = true)
            }
            UiCommand::ToggleConversations => {
                self.change_settings(|s| s.show_conversations = !s.show_conversations)
            }
            // The window closes, and dialogs open, in `SmolchatApp::execute`.
            UiCommand::Quit
            | UiCommand::ImportChat
            | UiCommand::OpenModelFile
            | UiCommand::OpenModelFolder
            | UiCommand::ExportMarkdownAs
            | UiCommand::ExportJsonAs => true,
            UiCommand::ToggleSettings => {
                self.change_settings(|s| s.show_settings = !s.show_settings)
            }
            UiCommand::ToggleTrash => {
                self.trash_open = !self.trash_open;
                self.library_open &= !self.trash_open;
                true
            }
            // Opened, it looks again: a model downloaded or copied since shows up.
            UiCommand::ToggleLibrary => {
                self.library_open = !self.library_open;
                self.trash_open &= !self.library_open;
                if self.library_open && self.scanning.is_none() {
                    self.scanning = scan_local_models(&self.paths);
                }
                true
            }
            UiCommand::ToggleTokenView => {
                self.change_settings(|s| s.show_token_probabilities = !s.show_token_probabilities)
            }
            UiCommand::ThemeSystem => self.change_settings(|s| s.theme = Theme::System),
            UiCommand::ThemeLight => self.change_settings(|s| s.theme = Theme::Light),
            UiCommand::ThemeDark => self.change_settings(|s| s.theme = Theme::Dark),
            UiCommand::ToggleServer => {
                self.change_settings(|s| s.server.enabled = !s.server.enabled)
            }
            UiCommand::PreviousChat | UiCommand::NextChat => {
                let order = self.chat_order();
                let count = order.len();
                let step = if command == UiCommand::NextChat {
                    1
                } else {
                    count - 1
                };
                let place = order.iter().position(|&index| index == self.current);
                let next = order[(place.unwrap_or(0) + step) % count];
                self.select(next)
            }
            // The title is edited in the list, which is shown for it; the window opens the field.
            UiCommand::RenameChat => {
                self.settings.show_conversations
                    || self.change_settings(|s| s.show_conversations = true)
            }
            // A sheet of the window's own.
            UiCommand::ShowShortcuts => true,
        }
    }

    /// Starts from the model's recommended sampling unless the user has chosen their own
    /// (anything but the app's defaults), which is kept, with a word about the difference.
    fn follow_model_sampling(&mut self, defaults: &SamplingDefaults) {
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

    /// Applies one change to the settings, through [`Self::update_settings`].
    fn change_settings(&mut self, change: impl FnOnce(&mut Settings)) -> bool {
        let mut settings = self.settings.clone();
        change(&mut settings);
        self.update_settings(settings)
    }

    fn update_settings(&mut self, mut settings: Settings) -> bool {
        // A folder is checked before it is used, so it changes only by `UseModelFolder`.
        settings.model_folder = self.settings.model_folder.clone();
        let reload = settings.backend != self.settings.backend
            || settings.precision != self.settings.precision;
        self.settings = settings;
        let saved = self.save_settings();
        if reload {
            self.reload_model();
        }
        self.sync_server();
        saved
    }

    fn sync_server(&mut self) {
        let model = match &self.model {
            ModelStatus::Ready(info) => Some(info.name.as_str()),
            _ => None,
        };
        self.server.sync(&self.settings.server, model, &self.engine);
    }

    fn save_settings(&mut self) -> bool {
        let result = self.settings.save(&self.paths.settings_file());
        if let Err(err) = &result {
            self.errors.push(format!(
                "cannot save settings to {}: {err}. Check that the folder is writable.",
                self.paths.settings_file().display()
            ));
        }
        result.is_ok()
    }

    /// Checks the folder before handing it to the engine, so that a typo gets an immediate
    /// answer and does not unload the model in use.
    fn use_model_folder(&mut self, folder: PathBuf) -> bool {
        if let Err(problem) = model_files::check(&folder) {
            let problem = problem.to_string();
            match self.model {
                // The first-run screen shows the reason beside the ways out.
                ModelStatus::NotConfigured | ModelStatus::Failed(_) => {
                    self.model = ModelStatus::Failed(problem);
                }
                ModelStatus::Downloading(_) | ModelStatus::Loading(..) | ModelStatus::Ready(_) => {
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

    fn load_model_folder(&mut self, folder: PathBuf) {
        self.model = ModelStatus::Loading(folder.clone(), None);
        self.engine
            .load_model(ModelSource::local(folder), self.model_options());
    }

    /// Reloads the configured model, e.g. after the backend changed.
    fn reload_model(&mut self) {
        if let Some(folder) = self.settings.model_folder.clone() {
            self.load_model_folder(folder);
        }
    }

    fn download_default_model(&mut self) -> bool {
        self.download(ModelSource::Hub(DEFAULT_MODEL_ID.to_string()))
    }

    /// Downloads a model from the hub and opens it; its progress shows where the chat was.
    fn download(&mut self, source: ModelSource) -> bool {
        self.model = ModelStatus::Downloading(None);
        self.library_open = false;
        self.engine.load_model(source, self.model_options())
    }

    /// The unsent message of conversation `id`, kept in memory (saved with the conversation).
    fn keep_draft(&mut self, id: &str, draft: String) -> bool {
        match self.conversations.iter_mut().find(|c| c.id == id) {
            Some(conversation) => {
                conversation.draft = draft;
                true
            }
            None => false,
        }
    }

    /// Saves the current chat's system prompt under `name`, replacing a preset of that name.
    fn save_preset(&mut self, name: &str) -> bool {
        let name = name.trim();
        let text = self.system_prompt().trim().to_string();
        if name.is_empty() || text.is_empty() {
            self.notify("Give the preset a name, and the chat a system prompt to save.");
            return false;
        }
        let preset = PromptPreset {
            name: name.to_string(),
            text,
        };
        self.change_settings(|s| {
            match s.prompt_presets.iter_mut().find(|p| p.name == preset.name) {
                Some(same_name) => *same_name = preset,
                None => s.prompt_presets.push(preset),
            }
        })
    }

    /// Shows a notice, once: the same news twice only keeps it up longer.
    fn notify(&mut self, notice: impl Into<String>) {
        self.post_notice(notice.into(), None);
    }

    /// A notice about conversation `id`, shown while it is open.
    fn notify_about(&mut self, id: String, notice: impl Into<String>) {
        self.post_notice(notice.into(), Some(id));
    }

    fn post_notice(&mut self, text: String, conversation: Option<String>) {
        let now = Instant::now();
        self.notices
            .retain(|notice| notice.until > now && notice.text != text);
        self.notices.push(Notice {
            text,
            conversation,
            until: now + self.notice_lifetime,
        });
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

    /// Takes in everything the engine reported since the last call. Never blocks.
    pub fn poll(&mut self) {
        self.hub.poll();
        let completed = self.downloads.poll();
        for download in &completed {
            self.notify(format!(
                "{} is downloaded: open it from the library (Ctrl+M).",
                download.spec
            ));
        }
        if !completed.is_empty() && self.scanning.is_none() {
            self.scanning = scan_local_models(&self.paths);
        }
        self.errors.extend(self.downloads.take_problem());
        if let Some(scanning) = &self.scanning {
            match scanning.try_recv() {
                Ok(found) => {
                    self.local_models = found;
                    self.scanning = None;
                }
                Err(crossbeam_channel::TryRecvError::Disconnected) => self.scanning = None,
                Err(crossbeam_channel::TryRecvError::Empty) => {}
            }
        }
        let events: Vec<Event> = self.engine.events().try_iter().collect();
        for event in events {
            self.handle(event);
        }
        let due = self
            .generation
            .as_ref()
            .is_some_and(|active| active.last_save.elapsed() >= self.save_interval);
        if due {
            self.save_streaming();
        }
    }

    /// How long until the next periodic save, so the window can ask to be woken for it.
    pub fn next_save_in(&self) -> Option<Duration> {
        self.generation.as_ref().map(|active| {
            self.save_interval
                .saturating_sub(active.last_save.elapsed())
        })
    }

    /// The generation under way, if it is `request`'s.
    fn active_generation(&mut self, request: RequestId) -> Option<&mut ActiveGeneration> {
        self.generation
            .as_mut()
            .filter(|active| active.request == request)
    }

    fn handle(&mut self, event: Event) {
        match event {
            Event::DownloadProgress(progress) => {
                self.model = ModelStatus::Downloading(Some(progress));
            }
            Event::Loading { dir, memory } => self.model = ModelStatus::Loading(dir, memory),
            Event::ModelReady(info) => {
                if self.settings.model_folder.as_deref() != Some(info.dir.as_path()) {
                    self.settings.model_folder = Some(info.dir.clone());
                    self.save_settings();
                }
                if info.fallback_template {
                    self.notify(
                        "This model folder has no chat template; the ChatML template is used.",
                    );
                }
                if let Some(reason) = &info.backend_fallback {
                    self.notify(format!("GPU: {reason}."));
                }
                if info.software_gpu {
                    self.notify(
                        "The GPU here is a software renderer: replies run slower than on the CPU backends, and the first one waits about a minute while its kernels compile.",
                    );
                }
                self.replies_on_model = 0;
                self.follow_model_sampling(&info.sampling_defaults);
                self.model = ModelStatus::Ready(info);
                // Figures of another model or backend would be compared with this one's.
                self.live = None;
                self.history.clear();
                self.sync_server();
            }
            Event::Waiting { request, ahead } => {
                if let Some(active) = self.active_generation(request) {
                    active.waiting = Some(ahead);
                }
            }
            Event::PromptProgress {
                request,
                done,
                total,
            } => {
                if let Some(active) = self.active_generation(request) {
                    active.reading = Some(PromptProgress { done, total });
                    active.waiting = None;
                }
            }
            Event::PromptProcessed {
                request,
                stats,
                dropped_messages,
            } => {
                if let Some(active) = self.active_generation(request) {
                    active.reading = None;
                    active.waiting = None;
                }
                if self.is_active(request) {
                    self.live = Some(LiveStats {
                        generation: stats,
                        resident_bytes: None,
                        device_bytes: None,
                    });
                    if dropped_messages > 0
                        && let Some(active) = &self.generation
                    {
                        let id = active.conversation_id.clone();
                        if let Some(record) = self
                            .active_message(request)
                            .and_then(|message| message.generation.as_mut())
                        {
                            record.left_out = dropped_messages;
                        }
                        self.notify_about(id, format!(
                            "{dropped_messages} oldest messages did not fit the context and were left out of the prompt."
                        ));
                    }
                }
            }
            Event::Token { request, token } => {
                let keep_tokens = self.settings.show_token_probabilities;
                if let Some(message) = self.active_message(request) {
                    // Each token's alternatives are kept only for the token view, and only
                    // while they spell the whole reply: they made a saved chat 28 times the
                    // size of its text.
                    let spelled = message.generation.as_ref().is_some_and(|record| {
                        record.tokens.is_empty() == message.content.is_empty()
                    });
                    message.content.push_str(&token.text);
                    if let Some(record) = &mut message.generation {
                        if keep_tokens && spelled {
                            record.tokens.push(StoredToken {
                                text: token.text,
                                probability: token.probability,
                                alternatives: token
                                    .alternatives
                                    .into_iter()
                                    .map(|(_, text, probability)| (text, probability))
                                    .collect(),
                            });
                        } else {
                            record.tokens.clear();
                        }
                    }
                }
            }
            Event::Stats { request, stats } => {
                if self.is_active(request) {
                    self.record_sample(&stats);
                    self.live = Some(stats);
                }
            }
            Event::Finished {
                request,
                reason,
                text,
                stats,
            } => {
                if let Some(message) = self.active_message(request) {
                    message.content.push_str(&text);
                    if let Some(record) = &mut message.generation {
                        record.finish_reason = Some(reason);
                        record.stats = Some(MessageStats::from_generation(
                            &stats.generation,
                            stats.resident_bytes,
                        ));
                        if !text.is_empty() && !record.tokens.is_empty() {
                            record.tokens.push(StoredToken {
                                text,
                                probability: 1.0,
                                alternatives: Vec::new(),
                            });
                        }
                    }
                    if reason == FinishReason::ContextFull
                        && let Some(active) = &self.generation
                    {
                        let id = active.conversation_id.clone();
                        self.notify_about(
                            id,
                            "The context window is full. Start a new chat, or set the overflow policy to drop old turns.",
                        );
                    }
                    self.live = Some(stats);
                    // The finished reply replaces the appended lines with one snapshot.
                    if let Some(active) = self.generation.take() {
                        self.save_by_id(&active.conversation_id);
                    }
                    self.replies_on_model += 1;
                }
            }
            Event::Busy { refused } => {
                if self.is_active(refused) {
                    self.abandon_generation();
                    self.notify("The engine was busy; send again.");
                }
            }
            Event::Error { request, error } => {
                let advice = error_advice(&error);
                match request {
                    // Without a model the first-run screen shows why, once, and the next
                    // model replaces it: a banner would repeat it and outlive the problem.
                    None if !self.model_ready() => self.model = ModelStatus::Failed(advice),
                    Some(request) if self.is_active(request) => {
                        self.abandon_generation();
                        self.errors.push(advice);
                    }
                    _ => self.errors.push(advice),
                }
            }
        }
    }

    fn is_active(&self, request: RequestId) -> bool {
        self.generation
            .as_ref()
            .is_some_and(|active| active.request == request)
    }

    fn active_message(&mut self, request: RequestId) -> Option<&mut StoredMessage> {
        let active = self.generation.as_ref().filter(|a| a.request == request)?;
        let index = active.message_index;
        self.conversations
            .iter_mut()
            .find(|c| c.id == active.conversation_id)?
            .messages
            .get_mut(index)
    }

    /// Ends the current generation after an error: an empty placeholder reply is removed,
    /// a partial one is kept (and saved) as it is.
    fn abandon_generation(&mut self) {
        let Some(active) = self.generation.take() else {
            return;
        };
        if let Some(conversation) = self
            .conversations
            .iter_mut()
            .find(|c| c.id == active.conversation_id)
        {
            let empty = conversation
                .messages
                .get(active.message_index)
                .is_some_and(|m| m.content.is_empty());
            if empty && active.message_index + 1 == conversation.messages.len() {
                conversation.messages.pop();
            }
        }
        self.save_by_id(&active.conversation_id);
    }

    fn record_sample(&mut self, stats: &LiveStats) {
        let Some(tokens_per_second) = stats.generation.decode_tokens_per_second() else {
            return;
        };
        let seconds = self.started.elapsed().as_secs_f64();
        self.history.push_back(StatsSample {
            seconds,
            tokens_per_second,
            resident_mib: stats.resident_bytes.unwrap_or(0) as f64 / (1024.0 * 1024.0),
        });
        while self
            .history
            .front()
            .is_some_and(|s| seconds - s.seconds > HISTORY_WINDOW.as_secs_f64())
        {
            self.history.pop_front();
        }
    }

    /// Seconds since start, the x axis of the live plot.
    pub fn now_seconds(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    /// Appends what the streaming reply gained since its last save to its file.
    fn save_streaming(&mut self) {
        let Some(active) = &mut self.generation else {
            return;
        };
        active.last_save = Instant::now();
        let (id, message_index) = (active.conversation_id.clone(), active.message_index);
        if active.snapshot_owed {
            if self.save_by_id(&id)
                && let Some(active) = &mut self.generation
            {
                active.snapshot_owed = false;
            }
            return;
        }
        let (saved_text, saved_tokens) = (active.saved_text, active.saved_tokens);
        let Some(message) = self.active_reply() else {
            return;
        };
        let appended = Appended {
            message: message_index,
            text: message
                .content
                .get(saved_text..)
                .unwrap_or_default()
                .to_string(),
            tokens: message
                .tokens()
                .get(saved_tokens..)
                .unwrap_or_default()
                .to_vec(),
        };
        if appended.text.is_empty() && appended.tokens.is_empty() {
            return;
        }
        let now_saved = (message.content.len(), message.tokens().len());
        match self.store.append(&id, &appended) {
            Ok(_) => {
                if let Some(active) = &mut self.generation {
                    (active.saved_text, active.saved_tokens) = now_saved;
                }
            }
            // The file went away or could not grow: a whole snapshot puts it back (and says
            // why if that fails too); appending waits until one has succeeded.
            Err(_) => {
                let saved = self.save_by_id(&id);
                if let Some(active) = &mut self.generation {
                    active.snapshot_owed = !saved;
                }
            }
        }
    }

    /// The conversation with `id`, wherever it is in the list.
    fn conversation(&self, id: &str) -> Option<&Conversation> {
        self.conversations.iter().find(|c| c.id == id)
    }

    /// The reply being written, as it stands.
    fn active_reply(&self) -> Option<&StoredMessage> {
        let active = self.generation.as_ref()?;
        self.conversation(&active.conversation_id)?
            .messages
            .get(active.message_index)
    }

    /// Saves conversation `id` whole (a snapshot).
    fn save_by_id(&mut self, id: &str) -> bool {
        match self.conversation(id).cloned() {
            Some(conversation) => self.save(&conversation),
            None => false,
        }
    }

    fn save_current(&mut self) -> bool {
        let conversation = self.current().clone();
        self.save(&conversation)
    }

    fn save(&mut self, conversation: &Conversation) -> bool {
        let result = self.store.save(conversation);
        // A snapshot holds all of a streaming reply so far: later appends start from it.
        if result.is_ok()
            && let Some(active) = &mut self.generation
            && active.conversation_id == conversation.id
            && let Some(message) = conversation.messages.get(active.message_index)
        {
            active.saved_text = message.content.len();
            active.saved_tokens = message.tokens().len();
        }
        if let Err(err) = &result {
            let error = format!(
                "cannot save the conversation to {}: {err}. Free some disk space or check the folder's permissions.",
                self.store.path(&conversation.id).display()
            );
            // Retried at every save while the disk is full: said once.
            if !self.errors.contains(&error) {
                self.errors.push(error);
            }
        }
        result.is_ok()
    }

    pub fn conversation_path(&self, id: &str) -> PathBuf {
        self.store.path(id)
    }
}

/// Starts looking for the models on this machine, and reading what each is, on a thread of
/// its own; `None` if the thread cannot start (the first-run screen then offers the download
/// and the path field).
fn scan_local_models(paths: &Paths) -> Option<crossbeam_channel::Receiver<Vec<Described>>> {
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

/// Dismisses entry `index` of a list of messages; false when there is none.
fn remove(list: &mut Vec<String>, index: usize) -> bool {
    let exists = index < list.len();
    if exists {
        list.remove(index);
    }
    exists
}

/// The first words of the first message, as a conversation title.
fn title_from(text: &str) -> String {
    let line = text.lines().next().unwrap_or_default();
    let mut title: String = line.chars().take(40).collect();
    if line.chars().count() > 40 {
        title.push('\u{2026}');
    }
    title
}

/// Engine errors say what went wrong; this adds what the user can do about it.
fn error_advice(error: &EngineError) -> String {
    // The hub's own message says where the cache is and which variable to set: the
    // command line's advice. The window says it in its own words, once.
    if let EngineError::Download {
        model,
        unreachable: Some(cause),
        ..
    } = error
    {
        return format!(
            "Cannot reach the model hub to download {model} ({cause}). Check the network \
             connection and try again, or open a model you already have."
        );
    }
    let hint = match error {
        EngineError::ModelNotFound { .. } | EngineError::ModelLoad { .. } => {
            "Choose another model folder in the settings, or download the default model."
        }
        EngineError::Download { .. } => {
            "Check the network connection and try the download again, or choose a local folder."
        }
        EngineError::DownloadStopped { .. } => "Start the download again when you are ready.",
        EngineError::NoModel => "Download the default model or choose a model folder first.",
        EngineError::ContextFull { .. } | EngineError::PromptTooLong { .. } => {
            "Start a new chat, or set the overflow policy to drop old turns."
        }
        EngineError::InvalidSampling { .. } => "Fix it in the settings panel and send again.",
        EngineError::Prompt { .. } | EngineError::Generation { .. } | EngineError::Internal => {
            "Try again; if it keeps happening, restart smolchat."
        }
    };
    format!("{error}. {hint}")
}

/// What to do when the desktop shows no file dialog.
fn no_file_dialog_advice(asked_for: DialogFor, paths: &Paths) -> String {
    match asked_for {
        DialogFor::Export => "No save dialog appeared: this desktop has no XDG desktop portal. \
             Chat \u{203a} Export as Markdown (or JSON) saves into smolchat's exports folder \
             instead."
            .into(),
        DialogFor::OpeningModel => "No file dialog appeared: this desktop has no XDG desktop \
             portal. Type the model's path into Settings \u{203a} Model \u{203a} Current model \
             and press Load, or drop the file or folder on the window."
            .into(),
        DialogFor::ImportingChat => format!(
            "No file dialog appeared: this desktop has no XDG desktop portal. Copy the chat's \
             .json file into {} and start smolchat again: it is then in the list.",
            paths.conversations_dir().display()
        ),
    }
}

mod chat_list;
mod hub_search;
mod reply;
#[cfg(test)]
mod tests;

pub use hub_search::HubSearch;
