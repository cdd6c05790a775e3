//! Conversations and settings on disk: a whole snapshot, or what a streaming reply gained
//! since its last save.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::AppState;
use crate::store::{Appended, Conversation, StoredMessage};

impl AppState {
    /// How long until the next periodic save, so the window can ask to be woken for it.
    pub fn next_save_in(&self) -> Option<Duration> {
        self.generation.as_ref().map(|active| {
            self.save_interval
                .saturating_sub(active.last_save.elapsed())
        })
    }

    /// Appends what the streaming reply gained since its last save to its file.
    pub(super) fn save_streaming(&mut self) {
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
    pub(super) fn conversation(&self, id: &str) -> Option<&Conversation> {
        self.conversations.iter().find(|c| c.id == id)
    }

    /// The reply being written, as it stands.
    pub(super) fn active_reply(&self) -> Option<&StoredMessage> {
        let active = self.generation.as_ref()?;
        self.conversation(&active.conversation_id)?
            .messages
            .get(active.message_index)
    }

    /// Saves conversation `id` whole (a snapshot).
    pub(super) fn save_by_id(&mut self, id: &str) -> bool {
        match self.conversation(id).cloned() {
            Some(conversation) => self.save(&conversation),
            None => false,
        }
    }

    pub(super) fn save_current(&mut self) -> bool {
        let conversation = self.current().clone();
        self.save(&conversation)
    }

    pub(super) fn save(&mut self, conversation: &Conversation) -> bool {
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

    pub(super) fn save_settings(&mut self) -> bool {
        let result = self.settings.save(&self.paths.settings_file());
        if let Err(err) = &result {
            self.errors.push(format!(
                "cannot save settings to {}: {err}. Check that the folder is writable.",
                self.paths.settings_file().display()
            ));
        }
        result.is_ok()
    }
}
