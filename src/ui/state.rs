//! Everything the window shows, and every action it can take, without any drawing: the
//! widgets read this and call its methods, and tests and `smolchat dev chat` drive it directly.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::engine::{EngineError, EngineHandle, Event, LiveStats, ModelInfo, RequestId};
use crate::generation::{FinishReason, ModelOptions};
use crate::hub::{DEFAULT_MODEL_ID, DownloadProgress};
use crate::model_source::ModelSource;
use crate::store::{
    Conversation, ConversationStore, GenerationRecord, MessageStats, Paths, SeedMode, Settings,
    StoredMessage, StoredToken,
};
use crate::text::{ChatMessage, Role};

/// How long the live plot looks back.
pub const HISTORY_WINDOW: Duration = Duration::from_secs(60);

/// How often a streaming reply is written to disk: a crash loses at most this much.
pub const DEFAULT_SAVE_INTERVAL: Duration = Duration::from_secs(1);

#[derive(Debug, Clone, PartialEq)]
pub enum ModelStatus {
    /// No folder chosen yet: the first-run screen offers a download or a folder.
    NotConfigured,
    Downloading(Option<DownloadProgress>),
    Loading(PathBuf),
    Ready(ModelInfo),
    /// Loading or downloading failed; the message says why and the first-run screen offers
    /// the ways out again.
    Failed(String),
}

/// One point of the live plot.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StatsSample {
    pub seconds: f64,
    pub tokens_per_second: f64,
    pub resident_mib: f64,
}

#[derive(Debug)]
struct ActiveGeneration {
    request: RequestId,
    conversation_id: String,
    message_index: usize,
    last_save: Instant,
}

pub struct AppState {
    pub paths: Paths,
    pub settings: Settings,
    store: ConversationStore,
    /// Newest first; never empty, so there is always a conversation to type into.
    pub conversations: Vec<Conversation>,
    pub current: usize,
    engine: EngineHandle,
    pub model: ModelStatus,
    generation: Option<ActiveGeneration>,
    /// Figures of the running generation, or of the last one.
    pub live: Option<LiveStats>,
    pub history: VecDeque<StatsSample>,
    /// Problems the user should see, with what to do about them; dismissed one by one.
    pub errors: Vec<String>,
    /// A short, passing message (export done, messages dropped from the context, ...).
    pub notice: Option<String>,
    /// The last deleted conversation, until undone or replaced by the next deletion.
    pub deleted: Option<Conversation>,
    pub save_interval: Duration,
    started: Instant,
}

impl AppState {
    /// Loads settings and conversations from `paths` and starts the engine; `notify` runs on
    /// the engine thread after each event (the window passes its repaint request).
    pub fn new(paths: Paths, notify: impl Fn() + Send + 'static) -> Result<Self, String> {
        let mut errors = Vec::new();
        let settings = Settings::load(&paths.settings_file()).unwrap_or_else(|problem| {
            errors.push(format!(
                "{problem}. Default settings are used; changing any setting rewrites the file."
            ));
            Settings::default()
        });
        let store = ConversationStore::new(paths.conversations_dir());
        let (mut conversations, problems) = store.load_all();
        errors.extend(problems.into_iter().map(|problem| {
            format!("{problem}. That conversation is not shown; the file is left untouched.")
        }));
        if conversations.is_empty() {
            conversations.push(Conversation::new());
        }
        let engine = EngineHandle::spawn(notify)
            .map_err(|err| format!("cannot start the inference thread: {err}"))?;
        let mut state = Self {
            paths,
            settings,
            store,
            conversations,
            current: 0,
            engine,
            model: ModelStatus::NotConfigured,
            generation: None,
            live: None,
            history: VecDeque::new(),
            errors,
            notice: None,
            deleted: None,
            save_interval: DEFAULT_SAVE_INTERVAL,
            started: Instant::now(),
        };
        if let Some(folder) = state.settings.model_folder.clone() {
            state.load_model_folder(folder);
        }
        Ok(state)
    }

    pub fn current(&self) -> &Conversation {
        &self.conversations[self.current]
    }

    pub fn is_generating(&self) -> bool {
        self.generation.is_some()
    }

    /// Index of the message being streamed into, in the current conversation.
    pub fn streaming_message(&self) -> Option<usize> {
        self.generation
            .as_ref()
            .filter(|active| active.conversation_id == self.current().id)
            .map(|active| active.message_index)
    }

    pub fn model_ready(&self) -> bool {
        matches!(self.model, ModelStatus::Ready(_))
    }

    pub fn model_options(&self) -> ModelOptions {
        ModelOptions {
            backend: self.settings.backend,
            precision: self.settings.precision,
        }
    }

    pub fn save_settings(&mut self) {
        if let Err(err) = self.settings.save(&self.paths.settings_file()) {
            self.errors.push(format!(
                "cannot save settings to {}: {err}. Check that the folder is writable.",
                self.paths.settings_file().display()
            ));
        }
    }

    pub fn load_model_folder(&mut self, folder: PathBuf) {
        self.model = ModelStatus::Loading(folder.clone());
        self.engine
            .load_model(ModelSource::Folder(folder), self.model_options());
    }

    /// Reloads the configured model, e.g. after the backend changed.
    pub fn reload_model(&mut self) {
        if let Some(folder) = self.settings.model_folder.clone() {
            self.load_model_folder(folder);
        }
    }

    pub fn download_default_model(&mut self) {
        self.model = ModelStatus::Downloading(None);
        self.engine.load_model(
            ModelSource::Hub(DEFAULT_MODEL_ID.to_string()),
            self.model_options(),
        );
    }

    /// Stops the running generation or download.
    pub fn stop(&mut self) {
        self.engine.stop();
    }

    /// Sends the user's message and starts the reply. Returns false (and says why) when it
    /// cannot be sent now.
    pub fn send(&mut self, text: &str) -> bool {
        let text = text.trim();
        if text.is_empty() || !self.can_generate() {
            return false;
        }
        let conversation = &mut self.conversations[self.current];
        if conversation.messages.is_empty() {
            conversation.title = title_from(text);
        }
        conversation
            .messages
            .push(StoredMessage::new(Role::User, text));
        self.start_generation();
        true
    }

    /// Replaces the last reply with a new one.
    pub fn regenerate(&mut self) -> bool {
        let conversation = &self.conversations[self.current];
        let last_is_reply = conversation
            .messages
            .last()
            .is_some_and(|message| message.role == Role::Assistant);
        if !last_is_reply || !self.can_generate() {
            return false;
        }
        self.conversations[self.current].messages.pop();
        self.start_generation();
        true
    }

    /// Replaces user message `index` with `text`, forgets everything after it and replies anew.
    pub fn edit_and_resend(&mut self, index: usize, text: &str) -> bool {
        let text = text.trim();
        let conversation = &self.conversations[self.current];
        let is_user = conversation
            .messages
            .get(index)
            .is_some_and(|message| message.role == Role::User);
        if !is_user || text.is_empty() || !self.can_generate() {
            return false;
        }
        let messages = &mut self.conversations[self.current].messages;
        messages.truncate(index);
        messages.push(StoredMessage::new(Role::User, text));
        self.start_generation();
        true
    }

    fn can_generate(&mut self) -> bool {
        if self.is_generating() {
            self.notice = Some("A reply is still being written; stop it first (Esc).".into());
            return false;
        }
        if !self.model_ready() {
            self.notice = Some("No model is loaded yet.".into());
            return false;
        }
        true
    }

    fn start_generation(&mut self) {
        let ModelStatus::Ready(info) = &self.model else {
            return;
        };
        let mut sampling = self.settings.sampling.clone();
        if self.settings.seed_mode == SeedMode::Random {
            sampling.seed = rand::random();
        }
        if let Err(err) = sampling.validate() {
            self.errors.push(format!(
                "{err}. Fix it in the settings panel and send again."
            ));
            return;
        }
        let system = self.settings.system_prompt.trim();
        let mut messages: Vec<ChatMessage> = Vec::new();
        if !system.is_empty() {
            messages.push(ChatMessage::system(system));
        }
        let conversation = &mut self.conversations[self.current];
        messages.extend(
            conversation
                .messages
                .iter()
                .map(StoredMessage::to_chat_message),
        );
        let record = GenerationRecord {
            model: info.description.clone(),
            model_dir: info.dir.clone(),
            backend: info.options.backend,
            sampling: sampling.clone(),
            max_new_tokens: self.settings.max_new_tokens,
            overflow: self.settings.overflow,
            finish_reason: None,
            stats: None,
            tokens: Vec::new(),
        };
        conversation.messages.push(StoredMessage {
            role: Role::Assistant,
            content: String::new(),
            generation: Some(record),
        });
        let message_index = conversation.messages.len() - 1;
        let conversation_id = conversation.id.clone();
        let request = self.engine.generate(
            messages,
            sampling,
            self.settings.max_new_tokens,
            self.settings.overflow,
        );
        self.generation = Some(ActiveGeneration {
            request,
            conversation_id,
            message_index,
            last_save: Instant::now(),
        });
        self.live = None;
        self.save_current();
    }

    pub fn new_conversation(&mut self) {
        if self.current().messages.is_empty() {
            return;
        }
        if let Some(index) = self
            .conversations
            .iter()
            .position(|c| c.messages.is_empty())
        {
            self.current = index;
            return;
        }
        self.conversations.insert(0, Conversation::new());
        self.select(0);
    }

    pub fn select(&mut self, index: usize) {
        if index < self.conversations.len() {
            self.current = index;
        }
    }

    pub fn rename(&mut self, index: usize, title: &str) {
        let title = title.trim();
        if let Some(conversation) = self.conversations.get_mut(index)
            && !title.is_empty()
        {
            conversation.title = title.to_string();
            let conversation = conversation.clone();
            self.save(&conversation);
        }
    }

    /// Deletes a conversation; it can be brought back with [`Self::undo_delete`] until the
    /// next deletion.
    pub fn delete(&mut self, index: usize) {
        let Some(conversation) = self.conversations.get(index) else {
            return;
        };
        let streaming_here = self
            .generation
            .as_ref()
            .is_some_and(|active| active.conversation_id == conversation.id);
        if streaming_here {
            self.notice = Some("Stop the reply before deleting its conversation.".into());
            return;
        }
        if let Err(err) = self.store.delete(&conversation.id) {
            self.errors.push(format!(
                "cannot delete the conversation file: {err}. Check the permissions of {}.",
                self.paths.conversations_dir().display()
            ));
            return;
        }
        let active_id = self.current().id.clone();
        let removed = self.conversations.remove(index);
        if self.conversations.is_empty() {
            self.conversations.push(Conversation::new());
        }
        self.current = self
            .conversations
            .iter()
            .position(|c| c.id == active_id)
            .unwrap_or(0);
        self.notice = Some(format!("Deleted \u{201c}{}\u{201d}.", removed.title));
        self.deleted = Some(removed);
    }

    pub fn undo_delete(&mut self) {
        let Some(conversation) = self.deleted.take() else {
            return;
        };
        self.save(&conversation);
        let position = self
            .conversations
            .iter()
            .position(|c| c.created_unix_ms < conversation.created_unix_ms)
            .unwrap_or(self.conversations.len());
        let active_id = self.current().id.clone();
        self.conversations.insert(position, conversation);
        self.current = self
            .conversations
            .iter()
            .position(|c| c.id == active_id)
            .unwrap_or(0);
        self.notice = None;
    }

    /// Writes the current conversation as Markdown or JSON into the exports folder and
    /// returns where.
    pub fn export_current(&mut self, markdown: bool) -> Option<PathBuf> {
        let conversation = self.current();
        let dir = self.paths.data_dir.join("exports");
        let stem: String = conversation
            .title
            .chars()
            .map(|c| if c.is_alphanumeric() { c } else { '-' })
            .collect();
        let (extension, bytes) = if markdown {
            ("md", Ok(conversation.to_markdown().into_bytes()))
        } else {
            ("json", conversation.to_json())
        };
        let path = dir.join(format!("{stem}-{}.{extension}", conversation.id));
        match bytes.and_then(|bytes| crate::atomic_file::write_atomic(&path, &bytes)) {
            Ok(()) => {
                self.notice = Some(format!("Exported to {}", path.display()));
                Some(path)
            }
            Err(err) => {
                self.errors.push(format!(
                    "cannot export to {}: {err}. Check that the folder is writable.",
                    path.display()
                ));
                None
            }
        }
    }

    /// Takes in everything the engine reported since the last call. Never blocks.
    pub fn poll(&mut self) {
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

    fn handle(&mut self, event: Event) {
        match event {
            Event::DownloadProgress(progress) => {
                self.model = ModelStatus::Downloading(Some(progress));
            }
            Event::Loading { dir } => self.model = ModelStatus::Loading(dir),
            Event::ModelReady(info) => {
                if self.settings.model_folder.as_deref() != Some(info.dir.as_path()) {
                    self.settings.model_folder = Some(info.dir.clone());
                    self.save_settings();
                }
                if info.fallback_template {
                    self.notice = Some(
                        "This model folder has no chat template; the ChatML template is used."
                            .into(),
                    );
                }
                if let Some(reason) = &info.backend_fallback {
                    self.notice = Some(format!("GPU: {reason}."));
                }
                self.model = ModelStatus::Ready(info);
            }
            Event::PromptProcessed {
                request,
                stats,
                dropped_messages,
            } => {
                if self.is_active(request) {
                    self.live = Some(LiveStats {
                        generation: stats,
                        resident_bytes: None,
                        device_bytes: None,
                    });
                    if dropped_messages > 0 {
                        self.notice = Some(format!(
                            "{dropped_messages} oldest messages did not fit the context and were left out of the prompt."
                        ));
                    }
                }
            }
            Event::Token { request, token } => {
                if let Some(message) = self.active_message(request) {
                    message.content.push_str(&token.text);
                    if let Some(record) = &mut message.generation {
                        record.tokens.push(StoredToken {
                            text: token.text,
                            probability: token.probability,
                            alternatives: token
                                .alternatives
                                .into_iter()
                                .map(|(_, text, probability)| (text, probability))
                                .collect(),
                        });
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
                        if !text.is_empty() {
                            record.tokens.push(StoredToken {
                                text,
                                probability: 1.0,
                                alternatives: Vec::new(),
                            });
                        }
                    }
                    if reason == FinishReason::ContextFull {
                        self.notice = Some(
                            "The context window is full. Start a new chat, or set the overflow policy to drop old turns.".into(),
                        );
                    }
                    self.live = Some(stats);
                    self.save_streaming();
                    self.generation = None;
                }
            }
            Event::Busy { refused } => {
                if self.is_active(refused) {
                    self.abandon_generation();
                    self.notice = Some("The engine was busy; send again.".into());
                }
            }
            Event::Error { request, error } => {
                match request {
                    Some(request) if self.is_active(request) => self.abandon_generation(),
                    Some(_) => {}
                    None => {
                        if !self.model_ready() {
                            self.model = ModelStatus::Failed(error.to_string());
                        }
                    }
                }
                self.errors.push(error_advice(&error));
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
            let conversation = conversation.clone();
            self.save(&conversation);
        }
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

    fn save_streaming(&mut self) {
        let Some(active) = &mut self.generation else {
            return;
        };
        active.last_save = Instant::now();
        let id = active.conversation_id.clone();
        if let Some(conversation) = self.conversations.iter().find(|c| c.id == id).cloned() {
            self.save(&conversation);
        }
    }

    fn save_current(&mut self) {
        let conversation = self.current().clone();
        self.save(&conversation);
    }

    fn save(&mut self, conversation: &Conversation) {
        if let Err(err) = self.store.save(conversation) {
            self.errors.push(format!(
                "cannot save the conversation to {}: {err}. Free some disk space or check the folder's permissions.",
                self.store.path(&conversation.id).display()
            ));
        }
    }

    pub fn conversation_path(&self, id: &str) -> PathBuf {
        self.store.path(id)
    }

    pub fn model_folder_exists(folder: &Path) -> bool {
        folder.join("config.json").is_file()
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

/// Engine errors say what went wrong; this adds what the user can do about it.
fn error_advice(error: &EngineError) -> String {
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
