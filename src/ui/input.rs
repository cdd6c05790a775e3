//! The message box: Enter sends, Shift+Enter starts a new line, Up in an empty box edits the
//! last message sent (as in Slack and Discord); Send turns into Stop while a reply is being
//! written.

use egui::{Key, Modifiers};

use super::commands::{Action, UiCommand};
use super::labels;
use super::state::AppState;
use super::view_state::ViewState;
use crate::text::Role;

pub fn show(ui: &mut egui::Ui, state: &AppState, view: &mut ViewState, actions: &mut Vec<Action>) {
    let id = egui::Id::unique("message_input");
    // Enter must be taken before the text box sees it, or it would insert a newline.
    let had_focus = ui.memory(|memory| memory.has_focus(id));
    let enter_pressed = had_focus && ui.input_mut(take_plain_enter);
    // Taken before the box sees it, which would move its cursor.
    if had_focus
        && view.input.is_empty()
        && !state.is_generating()
        && ui.input_mut(|input| input.consume_key(Modifiers::NONE, Key::ArrowUp))
    {
        edit_last_message(state, view);
    }
    super::chat_view::centered_column(ui, |ui| {
        ui.horizontal(|ui| show_row(ui, id, enter_pressed, state, view, actions))
    });
    view.input_focused = ui.memory(|memory| memory.has_focus(id));
}

/// The message box and the Send (or Stop) button beside it.
fn show_row(
    ui: &mut egui::Ui,
    id: egui::Id,
    enter_pressed: bool,
    state: &AppState,
    view: &mut ViewState,
    actions: &mut Vec<Action>,
) {
    let label = ui.label(labels::MESSAGE_INPUT);
    let button_width = 80.0;
    let edit = egui::TextEdit::multiline(&mut view.input)
        .id(id)
        .hint_text("Enter sends \u{b7} Shift+Enter: new line")
        .desired_rows(2)
        .desired_width(ui.available_width() - button_width);
    let response = ui.add(edit).labelled_by(label.id);
    if view.focus_input {
        response.request_focus();
        view.focus_input = false;
    }
    if state.is_generating() {
        let stop = ui
            .button(labels::STOP)
            .on_hover_text(UiCommand::StopGeneration.description(ui.ctx()));
        if stop.clicked() {
            actions.push(UiCommand::StopGeneration.into());
        }
    } else {
        let send = ui
            .add_enabled(state.model_ready(), egui::Button::new(labels::SEND))
            .on_hover_text("Send (Enter)");
        if send.clicked() || enter_pressed {
            actions.push(Action::Send(view.input.clone()));
        }
    }
}

/// Opens the conversation's last user message in its edit box, with the keyboard there.
fn edit_last_message(state: &AppState, view: &mut ViewState) {
    let messages = &state.current().messages;
    if let Some(index) = messages.iter().rposition(|m| m.role == Role::User) {
        view.start_editing(index, &messages[index].content);
    }
}

/// Takes the presses of Enter without modifiers. `consume_key(Modifiers::NONE, Enter)` would
/// take Shift+Enter too (egui ignores an extra Shift), and Shift+Enter must reach the text box
/// as a new line.
fn take_plain_enter(input: &mut egui::InputState) -> bool {
    let before = input.events.len();
    input.events.retain(|event| {
        !matches!(
            event,
            egui::Event::Key {
                key: Key::Enter,
                pressed: true,
                modifiers,
                ..
            } if modifiers.is_none()
        )
    });
    input.events.len() < before
}
