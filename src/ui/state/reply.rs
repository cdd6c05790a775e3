//! The reply in flight: what Send, Regenerate, Continue and Edit start, and the one generation
//! of this window's that the engine is writing.

use std::time::Instant;

use super::{AppState, ModelStatus, title_from};
use crate::engine::{GenerateRequest, RequestId};
use crate::generation::PromptProgress;
use crate::store::{GenerationRecord, SeedMode, StoredMessage, Variant};
use crate::text::reasoning::THINKING_VARIABLE;
use crate::text::{ChatMessage, Role};

/// Where a generation's text goes.
pub(super) enum Reply {
    /// A new reply to the last turn, after the earlier replies to it (regenerate).
    New(Vec<Variant>),
    /// The end of the last reply (Continue).
    Continue,
}

#[derive(Debug)]
pub(super) struct ActiveGeneration {
    pub(super) request: RequestId,
    pub(super) conversation_id: String,
    pub(super) message_index: usize,
    pub(super) last_save: Instant,
    /// How much of the reply's text (bytes) and tokens its file holds.
    pub(super) saved_text: usize,
    pub(super) saved_tokens: usize,
    /// An append failed: until a whole snapshot is saved, the file may end in a half line
    /// that an append would continue, hiding the conversation, so only snapshots are tried.
    pub(super) snapshot_owed: bool,
    /// Stop was pressed; the engine stops once the step under way returns.
    pub(super) stop_pressed: bool,
    /// A long prompt being read: how many of its tokens are, of how many.
    pub(super) reading: Option<PromptProgress>,
    /// Waiting its turn behind this many generations (API clients', say).
    pub(super) waiting: Option<usize>,
}

impl AppState {
    /// Sends the user's message and starts the reply.
    pub(super) fn send(&mut self, text: &str) -> bool {
        let text = text.trim();
        if text.is_empty() || !self.can_generate() {
            return false;
        }
        let conversation = &mut self.conversations[self.current];
        conversation.draft.clear();
        if conversation.messages.is_empty() {
            conversation.title = title_from(text);
        }
        conversation
            .messages
            .push(StoredMessage::new(Role::User, text));
        self.start_generation(Reply::New(Vec::new()));
        true
    }

    /// The last message of the current conversation, when it is a reply.
    pub(super) fn last_reply(&self) -> Option<&StoredMessage> {
        self.current()
            .messages
            .last()
            .filter(|message| message.role == Role::Assistant)
    }

    /// Writes a new reply to the last turn, keeping the earlier ones as variants.
    pub(super) fn regenerate(&mut self) -> bool {
        if self.last_reply().is_none() || !self.can_generate() {
            return false;
        }
        let conversation = &mut self.conversations[self.current];
        let earlier = conversation.branch_off(conversation.messages.len() - 1);
        self.start_generation(Reply::New(earlier));
        true
    }

    /// Extends a reply that was stopped or cut short by the token limit.
    pub(super) fn continue_reply(&mut self) -> bool {
        if !self.last_reply().is_some_and(StoredMessage::can_continue) {
            self.notify("Only a reply that was stopped or reached the token limit can continue.");
            return false;
        }
        if !self.can_generate() {
            return false;
        }
        self.start_generation(Reply::Continue);
        true
    }

    /// Shows another version of message `index`, with the conversation that followed it.
    pub(super) fn show_variant(&mut self, index: usize, variant: usize) -> bool {
        if self.is_generating() {
            self.notify("A reply is still being written; stop it first (Esc).");
            return false;
        }
        self.conversations[self.current].show_variant(index, variant) && self.save_current()
    }

    /// Replaces user message `index` with `text` and replies anew; the message as it was, and
    /// everything after it, stay as its earlier version.
    pub(super) fn edit_and_resend(&mut self, index: usize, text: &str) -> bool {
        let text = text.trim();
        let conversation = &self.conversations[self.current];
        let is_user = conversation
            .messages
            .get(index)
            .is_some_and(|message| message.role == Role::User);
        if !is_user || text.is_empty() || !self.can_generate() {
            return false;
        }
        let conversation = &mut self.conversations[self.current];
        let earlier = conversation.branch_off(index);
        conversation.messages.push(StoredMessage {
            variant: earlier.len(),
            other_variants: earlier,
            ..StoredMessage::new(Role::User, text)
        });
        self.start_generation(Reply::New(Vec::new()));
        true
    }

    pub(super) fn can_generate(&mut self) -> bool {
        if self.is_generating() {
            self.notify("A reply is still being written; stop it first (Esc).");
            return false;
        }
        if !self.model_ready() {
            self.notify("No model is loaded yet.");
            return false;
        }
        true
    }

    pub(super) fn start_generation(&mut self, reply: Reply) {
        let ModelStatus::Ready(info) = &self.model else {
            return;
        };
        // The chat's own sampling, else the defaults.
        let mut sampling = (self.current().sampling.as_ref())
            .unwrap_or(&self.settings.sampling)
            .clone();
        if self.settings.seed_mode == SeedMode::Random {
            sampling.seed = rand::random();
        }
        if let Err(err) = sampling.validate() {
            self.errors.push(format!(
                "{err}. Fix it in the settings panel and send again."
            ));
            return;
        }
        let system = self.system_prompt().trim();
        let mut messages: Vec<ChatMessage> = Vec::new();
        if !system.is_empty() {
            messages.push(ChatMessage::system(system));
        }
        let conversation = &mut self.conversations[self.current];
        // A conversation that ends with a reply asks the engine to continue that reply.
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
            thinking_tokens: 0,
            left_out: 0,
        };
        match reply {
            Reply::New(earlier) => conversation.messages.push(StoredMessage {
                variant: earlier.len(),
                other_variants: earlier,
                generation: Some(record),
                ..StoredMessage::new(Role::Assistant, "")
            }),
            Reply::Continue => {
                if let Some(previous) = conversation
                    .messages
                    .last_mut()
                    .and_then(|message| message.generation.as_mut())
                {
                    // The reply keeps its tokens and now ends as this generation does.
                    previous.finish_reason = None;
                    previous.sampling = record.sampling;
                }
            }
        }
        let message_index = conversation.messages.len() - 1;
        let conversation_id = conversation.id.clone();
        let mut request = GenerateRequest::chat(
            messages,
            sampling,
            self.settings.max_new_tokens,
            self.settings.overflow,
        );
        if let Some(thinking) = conversation.thinking {
            request
                .template_variables
                .insert(THINKING_VARIABLE.into(), thinking.into());
        }
        let request = self.engine.submit(request).unwrap_or(0);
        self.generation = Some(ActiveGeneration {
            request,
            conversation_id,
            message_index,
            last_save: Instant::now(),
            saved_text: 0,
            saved_tokens: 0,
            snapshot_owed: false,
            stop_pressed: false,
            reading: None,
            waiting: None,
        });
        self.live = None;
        self.save_current();
    }
}
