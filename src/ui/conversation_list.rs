//! The conversation list: pick, start, rename (double-click or right-click) and delete (with
//! undo) conversations.

use super::commands::UiCommand;
use super::state::AppState;
use super::view_state::ViewState;

pub fn show(
    ui: &mut egui::Ui,
    state: &mut AppState,
    view: &mut ViewState,
    commands: &mut Vec<UiCommand>,
) {
    ui.add_space(4.0);
    if ui
        .button(UiCommand::NewConversation.label())
        .on_hover_text(UiCommand::NewConversation.description(ui.ctx()))
        .clicked()
    {
        commands.push(UiCommand::NewConversation);
    }
    if state.deleted.is_some() && ui.button("Undo delete").clicked() {
        state.undo_delete();
    }
    ui.separator();
    let mut select = None;
    let mut delete = None;
    let mut rename = None;
    egui::ScrollArea::vertical()
        .id_salt("conversations")
        .show(ui, |ui| {
            for (index, conversation) in state.conversations.iter().enumerate() {
                if let Some((renaming, draft)) = &mut view.renaming
                    && *renaming == index
                {
                    let response =
                        ui.add(egui::TextEdit::singleline(draft).hint_text("Conversation title"));
                    response.widget_info(|| {
                        egui::WidgetInfo::labeled(egui::Role::TextInput, true, "Conversation title")
                    });
                    let done = response.lost_focus();
                    if !response.has_focus() && !done {
                        response.request_focus();
                    }
                    if done {
                        rename = Some((index, draft.clone()));
                    }
                    continue;
                }
                ui.horizontal(|ui| {
                    let selected = index == state.current;
                    let title = ui.selectable_label(selected, &conversation.title);
                    if title.clicked() {
                        select = Some(index);
                    }
                    if title.double_clicked() {
                        view.renaming = Some((index, conversation.title.clone()));
                    }
                    title.context_menu(|ui| {
                        if ui.button("Rename").clicked() {
                            view.renaming = Some((index, conversation.title.clone()));
                        }
                        if ui.button("Delete").clicked() {
                            delete = Some(index);
                        }
                    });
                    if icon_button(ui, "\u{d7}", "Delete conversation").clicked() {
                        delete = Some(index);
                    }
                });
            }
        });
    if let Some(index) = select {
        state.select(index);
    }
    if let Some((index, title)) = rename {
        state.rename(index, &title);
        view.renaming = None;
    }
    if let Some(index) = delete {
        state.delete(index);
        view.editing = None;
    }
}

/// A small button showing only a symbol, with a tooltip and an accessible name for screen
/// readers (the symbol alone says nothing to them).
pub fn icon_button(ui: &mut egui::Ui, icon: &str, name: &str) -> egui::Response {
    let response = ui.small_button(icon);
    response.widget_info(|| egui::WidgetInfo::labeled(egui::Role::Button, true, name));
    response.on_hover_text(name)
}
