//! Passing words about what just happened, and the errors that stay until dismissed.

use std::time::{Duration, Instant};

use super::AppState;

impl AppState {
    pub fn errors(&self) -> &[String] {
        &self.errors
    }

    /// Dismisses error `index`; false when there is none.
    pub(super) fn dismiss_error(&mut self, index: usize) -> bool {
        let exists = index < self.errors.len();
        if exists {
            self.errors.remove(index);
        }
        exists
    }

    /// Dismisses the notice shown at `index` (of [`Self::notices`]); false when there is none.
    pub(super) fn dismiss_notice(&mut self, index: usize) -> bool {
        let Some(text) = self.notices().get(index).map(|text| text.to_string()) else {
            return false;
        };
        self.withdraw_notice(&text);
        true
    }

    /// Takes back the notice that says `text`, which is no longer true.
    pub(super) fn withdraw_notice(&mut self, text: &str) {
        self.notices.retain(|notice| notice.text != text);
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

    /// Shows a notice, once: the same news twice only keeps it up longer.
    pub(super) fn notify(&mut self, notice: impl Into<String>) {
        self.post_notice(notice.into(), None);
    }

    /// A notice about conversation `id`, shown while it is open.
    pub(super) fn notify_about(&mut self, id: String, notice: impl Into<String>) {
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
}

/// A passing word about what just happened. It leaves after [`NOTICE_LIFETIME`] or when
/// dismissed (errors, which say what to do, stay until dismissed); one about a conversation
/// shows only while that conversation is open.
#[derive(Debug)]
pub(super) struct Notice {
    text: String,
    /// The conversation it concerns, by id.
    conversation: Option<String>,
    until: Instant,
}

/// How long a notice stays by default: long enough to read two lines.
pub const NOTICE_LIFETIME: Duration = Duration::from_secs(8);
