//! What the engine reports, taken into the state: the model's progress, the reply's tokens,
//! figures and errors.

use super::reply::ActiveGeneration;
use super::{AppState, HISTORY_WINDOW, ModelStatus, StatsSample, model};
use crate::engine::{EngineError, Event, LiveStats, RequestId};
use crate::generation::{FinishReason, PromptProgress};
use crate::store::{MessageStats, StoredMessage, StoredToken};
use crate::text::reasoning::is_thinking_token;

impl AppState {
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
            self.scanning = model::scan_local_models(&self.paths);
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
            Event::Loading { dir, memory } => {
                self.model = ModelStatus::Loading {
                    dir,
                    memory,
                    progress: None,
                };
            }
            Event::LoadProgress(read) => {
                if let ModelStatus::Loading { progress, .. } = &mut self.model {
                    *progress = Some(read);
                }
            }
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
                    // size of its text. A token's text may be empty (a character's first
                    // bytes, held back until it is whole), so the texts are measured.
                    let spelled = message.generation.as_ref().is_some_and(|record| {
                        let kept: usize = record.tokens.iter().map(|t| t.text.len()).sum();
                        kept == message.content.len()
                    });
                    let before = message.content.len();
                    message.content.push_str(&token.text);
                    let thinking = is_thinking_token(&message.content[..before], &message.content);
                    if let Some(record) = &mut message.generation {
                        record.thinking_tokens += usize::from(thinking);
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
    pub(super) fn abandon_generation(&mut self) {
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
