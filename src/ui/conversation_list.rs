//! The conversation list: pick, start, rename (its button, a double-click or right-click),
//! file in folders (dragged onto one, or right-click) and delete (with undo, and to the trash)
//! conversations.

use super::chat_search;
use super::commands::{Action, UiCommand};
use super::state::AppState;
use super::view_state::ViewState;
use crate::store::TRASH_DAYS;

pub fn show(ui: &mut egui::Ui, state: &AppState, view: &mut ViewState, actions: &mut Vec<Action>) {
    ui.add_space(4.0);
    if ui
        .button(UiCommand::NewConversation.label())
        .on_hover_text(UiCommand::NewConversation.description(ui.ctx()))
        .clicked()
    {
        actions.push(UiCommand::NewConversation.into());
    }
    let search = ui.add(
        egui::TextEdit::singleline(&mut view.chat_query)
            .hint_text(UiCommand::SearchChats.description(ui.ctx()))
            .desired_width(f32::INFINITY),
    );
    search.widget_info(|| egui::WidgetInfo::labeled(egui::Role::TextInput, true, "Search chats"));
    if std::mem::take(&mut view.focus_chat_search) {
        search.request_focus();
    }
    view.chat_search_focused = search.has_focus();
    if !view.chat_query.trim().is_empty() {
        ui.separator();
        found(ui, state, view, actions);
        return;
    }
    if state.can_undo_delete() && ui.button("Undo delete").clicked() {
        actions.push(Action::UndoDelete);
    }
    let trashed = state.trash().len();
    if trashed > 0
        && ui
            .selectable_label(state.trash_open(), format!("Trash ({trashed})"))
            .on_hover_text(format!("Deleted chats, restorable for {TRASH_DAYS} days"))
            .clicked()
    {
        actions.push(UiCommand::ToggleTrash.into());
    }
    ui.separator();
    let mut renamed = false;
    egui::ScrollArea::vertical()
        .id_salt("conversations")
        .show(ui, |ui| {
            let order = state.chat_order();
            let conversations = state.conversations();
            let in_folder = |index: &usize| conversations[*index].folder.is_some();
            let filed = order.iter().take_while(|index| in_folder(index)).count();
            for folder in state.folders() {
                let header = egui::CollapsingHeader::new(format!("\u{1f5c0} {folder}"))
                    .id_salt(("folder", folder))
                    .default_open(true)
                    .show(ui, |ui| {
                        let chats = order[..filed].iter().filter(|&&index| {
                            conversations[index].folder.as_deref() == Some(folder)
                        });
                        for &index in chats {
                            renamed |= row(ui, state, view, actions, index);
                        }
                    });
                let zone = match &header.body_response {
                    Some(body) => header.header_response.union(body.clone()),
                    None => header.header_response.clone(),
                };
                if let Some(index) = dropped_chat(ui, &zone) {
                    actions.push(Action::MoveToFolder(index, Some(folder.to_string())));
                }
                header.header_response.context_menu(|ui| {
                    if ui
                        .button("Remove the folder")
                        .on_hover_text("Its chats stay, in no folder")
                        .clicked()
                    {
                        actions.push(Action::RemoveFolder(folder.to_string()));
                    }
                });
            }
            // The chats in no folder, and room below them: a chat dropped there leaves its
            // folder.
            let unfiled = ui.scope(|ui| {
                for &index in &order[filed..] {
                    renamed |= row(ui, state, view, actions, index);
                }
                if !state.folders().is_empty() {
                    ui.allocate_space(egui::vec2(ui.available_width(), UNFILED_DROP_ROOM));
                }
            });
            if let Some(index) = dropped_chat(ui, &unfiled.response)
                && conversations[index].folder.is_some()
            {
                actions.push(Action::MoveToFolder(index, None));
            }
        });
    if renamed {
        view.renaming = None;
    }
}

/// One chat of the list, or the field renaming it; true once the rename is done.
fn row(
    ui: &mut egui::Ui,
    state: &AppState,
    view: &mut ViewState,
    actions: &mut Vec<Action>,
    index: usize,
) -> bool {
    let conversation = &state.conversations()[index];
    if let Some((renaming, draft)) = &mut view.renaming
        && *renaming == index
    {
        let response = ui.add(egui::TextEdit::singleline(draft).hint_text("Conversation title"));
        response.widget_info(|| {
            egui::WidgetInfo::labeled(egui::Role::TextInput, true, "Conversation title")
        });
        let done = response.lost_focus();
        if !response.has_focus() && !done {
            response.request_focus();
        }
        if done {
            actions.push(Action::Rename(index, draft.clone()));
        }
        return done;
    }
    ui.horizontal(|ui| {
        let selected = index == state.current_index();
        let title_chars = match conversation.folder {
            Some(_) => TITLE_CHARS - FOLDER_INDENT_CHARS,
            None => TITLE_CHARS,
        };
        // A long title is cut (whole on hover) instead of widening the panel. It can be dragged
        // onto a folder: the title itself senses the drag (a drag source laid over it took the
        // clicks that open the chat and its menu).
        let title = ui
            .add(
                egui::Button::selectable(selected, cut_title(&conversation.title, title_chars))
                    .sense(egui::Sense::click_and_drag()),
            )
            .on_hover_text(&conversation.title);
        title.dnd_set_drag_payload(DraggedChat(index));
        if title.dragged() {
            carried_title(ui, &conversation.title);
        }
        if title.clicked() {
            actions.push(Action::Select(index));
        }
        // From the keyboard: Tab to a chat, Space opens it, Delete deletes it
        // ("Undo delete" above brings it back).
        if title.has_focus()
            && ui.input_mut(|input| input.consume_key(egui::Modifiers::NONE, egui::Key::Delete))
        {
            actions.push(Action::Delete(index));
        }
        if title.double_clicked() {
            view.renaming = Some((index, conversation.title.clone()));
        }
        title.context_menu(|ui| {
            if ui.button("Rename").clicked() {
                view.renaming = Some((index, conversation.title.clone()));
            }
            // Its field for a new folder must take a click without closing the menu; what
            // is picked there closes it (`folder_menu`).
            let keep_open = egui::containers::menu::MenuConfig::new()
                .close_behavior(egui::PopupCloseBehavior::CloseOnClickOutside);
            egui::containers::menu::SubMenuButton::new("Move to folder")
                .config(keep_open)
                .ui(ui, |ui| folder_menu(ui, state, view, actions, index));
            if ui.button("Delete").clicked() {
                actions.push(Action::Delete(index));
            }
        });
        if icon_button(ui, "\u{270f}", "Rename conversation").clicked() {
            view.renaming = Some((index, conversation.title.clone()));
        }
        if icon_button(ui, "\u{d7}", "Delete conversation").clicked() {
            actions.push(Action::Delete(index));
        }
    });
    false
}

/// What a chat's title carries while it is dragged: the chat's index.
struct DraggedChat(usize);

/// A chat's title drawn beside the pointer while it is carried to a folder.
fn carried_title(ui: &egui::Ui, title: &str) {
    let Some(pointer) = ui.ctx().pointer_interact_pos() else {
        return;
    };
    egui::Area::new(ui.scope_id().with("carried chat"))
        .order(egui::Order::Tooltip)
        .fixed_pos(pointer + egui::vec2(12.0, 4.0))
        .interactable(false)
        .show(ui.ctx(), |ui| {
            egui::Frame::popup(ui.style()).show(ui, |ui| ui.label(short_title(title)));
        });
}

/// The height of the empty space below the chats in no folder, where a chat dropped leaves
/// its folder.
const UNFILED_DROP_ROOM: f32 = 32.0;

/// The chat dropped on `zone` this frame, if any; while one is held over it, the zone is
/// outlined as a place it can go.
fn dropped_chat(ui: &egui::Ui, zone: &egui::Response) -> Option<usize> {
    if zone.dnd_hover_payload::<DraggedChat>().is_some() {
        let stroke = ui.visuals().selection.stroke;
        ui.painter()
            .rect_stroke(zone.rect, 4.0, stroke, egui::StrokeKind::Inside);
    }
    zone.dnd_release_payload::<DraggedChat>()
        .map(|dragged| dragged.0)
}

/// The folders chat `index` can go to, out of its own, and a field that names a new one.
fn folder_menu(
    ui: &mut egui::Ui,
    state: &AppState,
    view: &mut ViewState,
    actions: &mut Vec<Action>,
    index: usize,
) {
    let current = state.conversations()[index].folder.as_deref();
    for folder in state.folders() {
        if ui
            .add_enabled(current != Some(folder), egui::Button::new(folder))
            .clicked()
        {
            actions.push(Action::MoveToFolder(index, Some(folder.to_string())));
            ui.close();
        }
    }
    if current.is_some() && ui.button("Out of its folder").clicked() {
        actions.push(Action::MoveToFolder(index, None));
        ui.close();
    }
    ui.separator();
    let field = ui.add(
        egui::TextEdit::singleline(&mut view.new_folder)
            .hint_text("New folder (Enter)")
            .desired_width(140.0),
    );
    field.widget_info(|| egui::WidgetInfo::labeled(egui::Role::TextInput, true, "New folder"));
    let entered = field.lost_focus() && ui.input(|input| input.key_pressed(egui::Key::Enter));
    if entered && !view.new_folder.trim().is_empty() {
        actions.push(Action::MoveToFolder(
            index,
            Some(std::mem::take(&mut view.new_folder)),
        ));
        ui.close();
    }
}

/// The chats that hold the search's words, each with the words around them; one click opens
/// it and ends the search.
fn found(ui: &mut egui::Ui, state: &AppState, view: &mut ViewState, actions: &mut Vec<Action>) {
    let hits = chat_search::search(state.conversations(), &view.chat_query);
    if hits.is_empty() {
        ui.label(egui::RichText::new("No chat holds these words.").weak());
        return;
    }
    egui::ScrollArea::vertical()
        .id_salt("chat search")
        .show(ui, |ui| {
            for hit in hits {
                let conversation = &state.conversations()[hit.index];
                let mut text = egui::text::LayoutJob::default();
                let style = ui.style();
                egui::RichText::new(short_title(&conversation.title)).append_to(
                    &mut text,
                    style,
                    egui::FontSelection::Default,
                    egui::Align::LEFT,
                );
                if let Some(snippet) = &hit.snippet {
                    // The words found marked as a highlighter would, in the words around them.
                    let marker = style.visuals.selection.bg_fill;
                    for part in [
                        egui::RichText::new(format!("\n{}", snippet.before)).weak(),
                        egui::RichText::new(&snippet.found)
                            .strong()
                            .background_color(marker),
                        egui::RichText::new(&snippet.after).weak(),
                    ] {
                        part.append_to(
                            &mut text,
                            style,
                            egui::FontSelection::Default,
                            egui::Align::LEFT,
                        );
                    }
                }
                let selected = hit.index == state.current_index();
                if ui
                    .add(egui::Button::selectable(selected, text).wrap())
                    .on_hover_text(&conversation.title)
                    .clicked()
                {
                    actions.push(Action::Select(hit.index));
                    view.chat_query.clear();
                }
            }
        });
}

/// Titles longer than this many characters end in an ellipsis in the list.
const TITLE_CHARS: usize = 24;

fn short_title(title: &str) -> String {
    cut_title(title, TITLE_CHARS)
}

/// Characters a title in a folder gives up to the folder's indent, which would otherwise
/// widen the list when a chat goes into a folder.
const FOLDER_INDENT_CHARS: usize = 3;

fn cut_title(title: &str, chars: usize) -> String {
    if title.chars().count() <= chars {
        return title.to_string();
    }
    let mut short: String = title.chars().take(chars - 1).collect();
    short.truncate(short.trim_end().len());
    short.push('\u{2026}');
    short
}

/// A small button showing only a symbol, with a tooltip and an accessible name for screen
/// readers (the symbol alone says nothing to them).
pub fn icon_button(ui: &mut egui::Ui, icon: &str, name: &str) -> egui::Response {
    let response = ui.small_button(icon);
    response.widget_info(|| egui::WidgetInfo::labeled(egui::Role::Button, true, name));
    response.on_hover_text(name)
}
