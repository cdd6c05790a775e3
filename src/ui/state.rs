//! Everything the window shows, and every action it can take, without any drawing: the
//! widgets read this and push [`Action`]s, which [`AppState::apply`] runs; tests and
//! `smolchat dev chat` drive it the same way. The engine is passed in, so tests can script it.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use self::reply::ActiveGeneration;
use super::commands::{Action, DialogFor, ExportFormat, UiCommand};
use super::local_server::{LocalServer, ServerStatus};
use crate::downloads::Downloads;
use crate::engine::{EngineHandle, LiveStats};
use crate::generation::PromptProgress;
use crate::hub::HubOptions;
use crate::model_library::facts::Described;
use crate::store::{
    Conversation, ConversationStore, Paths, PromptPreset, Settings, TRASH_DAYS, Theme, Trashed,
};
use notices::Notice;

/// How long the live plot looks back.
pub const HISTORY_WINDOW: Duration = Duration::from_secs(60);

/// How often a streaming reply is written to disk: a crash loses at most this much.
pub const DEFAULT_SAVE_INTERVAL: Duration = Duration::from_secs(1);

/// One point of the live plot.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StatsSample {
    pub seconds: f64,
    pub tokens_per_second: f64,
    pub resident_mib: f64,
}

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
        state.scanning = model::scan_local_models(&state.paths);
        if let Some(folder) = state.settings.model_folder.clone() {
            state.load_model_folder(folder);
        }
        state.sync_server();
        if state.settings.kv_budget.is_some() {
            state.engine.set_kv_budget(state.settings.kv_budget);
        }
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

    /// Figures of the running generation, or of the last one.
    pub fn live(&self) -> Option<&LiveStats> {
        self.live.as_ref()
    }

    /// Decode speed and memory over the last [`HISTORY_WINDOW`], oldest first.
    pub fn history(&self) -> &VecDeque<StatsSample> {
        &self.history
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

    /// The current chat's system prompt: its own, or the default for chats that have none.
    pub fn system_prompt(&self) -> &str {
        self.current()
            .system_prompt
            .as_deref()
            .unwrap_or(&self.settings.system_prompt)
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
            Action::DismissError(index) => self.dismiss_error(index),
            Action::DismissNotice(index) => self.dismiss_notice(index),
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
                    self.scanning = model::scan_local_models(&self.paths);
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
        if settings.kv_budget != self.settings.kv_budget {
            self.engine.set_kv_budget(settings.kv_budget);
        }
        self.settings = settings;
        let saved = self.save_settings();
        if reload {
            self.reload_model();
        }
        self.sync_server();
        saved
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

    /// Seconds since start, the x axis of the live plot.
    pub fn now_seconds(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }
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
mod events;
mod exports;
mod hub_search;
mod model;
mod notices;
mod reply;
mod saving;
#[cfg(test)]
mod tests;

pub use hub_search::HubSearch;
pub use model::ModelStatus;
pub use notices::NOTICE_LIFETIME;
