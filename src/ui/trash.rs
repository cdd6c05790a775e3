//! The trash: deleted chats, each restored with one click or deleted for good, kept for
//! [`TRASH_DAYS`] days across restarts (peers delete at once, and lost chats are what their
//! users complain of most). It takes the chat's place until closed.

use std::time::{Duration, SystemTime};

use egui::{RichText, ScrollArea};

use super::chat_view::{card, centered_column};
use super::commands::{Action, UiCommand};
use super::state::AppState;
use crate::store::{TRASH_DAYS, Trashed};

pub fn show(ui: &mut egui::Ui, state: &AppState, actions: &mut Vec<Action>) {
    ScrollArea::vertical().show(ui, |ui| {
        centered_column(ui, |ui| {
            ui.add_space(12.0);
            ui.horizontal(|ui| {
                ui.heading("Trash");
                if ui.button("Back to the chat").clicked() {
                    actions.push(UiCommand::ToggleTrash.into());
                }
                if !state.trash().is_empty() && ui.button("Empty the trash").clicked() {
                    actions.push(Action::EmptyTrash);
                }
            });
            ui.label(
                RichText::new(format!(
                    "Deleted chats stay here for {TRASH_DAYS} days, then go for good."
                ))
                .weak(),
            );
            ui.add_space(8.0);
            if state.trash().is_empty() {
                ui.label("The trash is empty.");
            }
            let now = SystemTime::now();
            for trashed in state.trash() {
                trashed_card(ui, trashed, now, actions);
                ui.add_space(6.0);
            }
        });
    });
}

fn trashed_card(ui: &mut egui::Ui, trashed: &Trashed, now: SystemTime, actions: &mut Vec<Action>) {
    let conversation = &trashed.conversation;
    card(ui, |ui| {
        ui.horizontal(|ui| {
            ui.label(RichText::new(&conversation.title).strong());
            ui.with_layout(egui::Layout::right_to_left(egui::Align::Center), |ui| {
                if ui.small_button("Delete for good").clicked() {
                    actions.push(Action::DeleteForever(conversation.id.clone()));
                }
                if ui.small_button("Restore").clicked() {
                    actions.push(Action::Restore(conversation.id.clone()));
                }
            });
        });
        let waited = now.duration_since(trashed.deleted).unwrap_or_default();
        let messages = conversation.messages.len();
        ui.label(
            RichText::new(format!(
                "{} message{}  \u{b7}  deleted {}  \u{b7}  {}",
                messages,
                if messages == 1 { "" } else { "s" },
                ago(waited),
                goes_in(waited)
            ))
            .weak(),
        );
    });
}

const DAY: u64 = 24 * 3600;

/// "today", "yesterday", "3 days ago".
fn ago(waited: Duration) -> String {
    match waited.as_secs() / DAY {
        0 => "today".into(),
        1 => "yesterday".into(),
        days => format!("{days} days ago"),
    }
}

/// "goes for good in 29 days", "goes for good today".
fn goes_in(waited: Duration) -> String {
    let left = TRASH_DAYS.saturating_sub(waited.as_secs() / DAY);
    match left {
        0 => "goes for good today".into(),
        1 => "goes for good tomorrow".into(),
        days => format!("goes for good in {days} days"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn days_read_as_a_person_would_say_them() {
        let days = |n: u64| Duration::from_secs(n * DAY + 60);
        assert_eq!(ago(Duration::from_secs(5)), "today");
        assert_eq!(ago(days(1)), "yesterday");
        assert_eq!(ago(days(3)), "3 days ago");
        assert_eq!(goes_in(Duration::from_secs(5)), "goes for good in 30 days");
        assert_eq!(goes_in(days(29)), "goes for good tomorrow");
        assert_eq!(goes_in(days(31)), "goes for good today");
    }
}
