//! The model library: every model on this computer, what each is and whether it runs and
//! fits here, each opened with one click (or Tab, then Enter). It takes the chat's place
//! until a model is opened or it is closed (Ctrl+M).

use egui::{RichText, ScrollArea};

use super::chat_view::{card, centered_column, grouped};
use super::commands::{Action, UiCommand};
use super::state::{AppState, ModelStatus};
use super::view_state::ViewState;
use crate::generation::MemoryPlan;
use crate::hub::RepositoryFile;
use crate::model_files::{is_weights_file, names_a_folder_model};
use crate::model_library::facts::{Described, ModelFacts};
use crate::model_library::size_text;

pub fn show(ui: &mut egui::Ui, state: &AppState, view: &mut ViewState, actions: &mut Vec<Action>) {
    ScrollArea::vertical().show(ui, |ui| {
        centered_column(ui, |ui| {
            ui.add_space(12.0);
            ui.horizontal(|ui| {
                ui.heading("Models");
                if ui
                    .button("Back to the chat")
                    .on_hover_text(UiCommand::ToggleLibrary.description(ui.ctx()))
                    .clicked()
                {
                    actions.push(UiCommand::ToggleLibrary.into());
                }
            });
            ui.label(
                RichText::new(
                    "Read where they are, never copied: smolchat's models folder, the Hugging \
                     Face cache, and the folders of Ollama, LM Studio, llama.cpp, GPT4All and Jan.",
                )
                .weak(),
            );
            ui.add_space(8.0);
            hub_search(ui, state, view, actions);
            ui.add_space(12.0);
            super::downloads::show(ui, state, actions);
            ui.add_space(12.0);
            ui.label(RichText::new("On this computer").strong());
            let models = state.local_models();
            if state.scanning_models() && models.is_empty() {
                ui.label("Looking for models\u{2026}");
            } else if models.is_empty() {
                ui.label(
                    "No models found. Open a .gguf file or a model folder (Ctrl+O), or \
                     download one: search the hub above, or `smolchat models pull`.",
                );
            }
            let in_use = match state.model() {
                ModelStatus::Ready(info) => Some(info.dir.as_path()),
                ModelStatus::Loading { dir, .. } => Some(dir.as_path()),
                _ => None,
            };
            for entry in models {
                let in_use = in_use == Some(entry.model.path.as_path());
                let open = entry_card(ui, entry, in_use, actions);
                if open.enabled() && std::mem::take(&mut view.focus_library) {
                    open.request_focus();
                }
                ui.add_space(6.0);
            }
        });
    });
}

/// Draws one model; returns its Open button.
fn entry_card(
    ui: &mut egui::Ui,
    entry: &Described,
    in_use: bool,
    actions: &mut Vec<Action>,
) -> egui::Response {
    let model = &entry.model;
    card(ui, |ui| {
        ui.horizontal(|ui| {
            ui.label(RichText::new(&model.name).strong().size(15.0));
            if in_use {
                ui.label(RichText::new("in use").weak());
            }
        });
        match &entry.facts {
            Ok(facts) => {
                ui.label(summary(facts, model.bytes, model.store.label()));
                fit_line(ui, facts);
            }
            Err(reason) => {
                ui.label(format!(
                    "{}  \u{b7}  {}",
                    size_text(model.bytes),
                    model.store.label()
                ));
                ui.colored_label(
                    ui.visuals().error_fg_color,
                    format!("This build cannot run it: {reason}"),
                );
            }
        }
        let open = ui
            .add_enabled(entry.facts.is_ok() && !in_use, egui::Button::new("Open"))
            .on_hover_text(model.path.display().to_string());
        if open.clicked() {
            actions.push(Action::UseModelFolder(model.path.clone()));
        }
        open
    })
}

/// A search box for the hub, the repositories it found, and one repository's files, each
/// GGUF file with its quantization, size, whether it fits here, and Download.
fn hub_search(
    ui: &mut egui::Ui,
    state: &AppState,
    view: &mut ViewState,
    actions: &mut Vec<Action>,
) {
    let hub = state.hub();
    ui.horizontal(|ui| {
        let field = ui.add(
            egui::TextEdit::singleline(&mut view.hub_query)
                .hint_text("Find a model on the Hugging Face hub, e.g. qwen3 gguf")
                .desired_width(ui.available_width() - 80.0),
        );
        let entered = field.lost_focus() && ui.input(|input| input.key_pressed(egui::Key::Enter));
        let query = view.hub_query.trim();
        if (ui.button("Search").clicked() || entered) && !query.is_empty() {
            actions.push(Action::SearchHub(query.to_string()));
        }
    });
    if hub.searching() {
        ui.label(RichText::new("Searching the hub\u{2026}").weak());
        return;
    }
    let Some((query, found)) = hub.found() else {
        return;
    };
    let found = match found {
        Ok(found) if found.is_empty() => {
            ui.label(format!(
                "Nothing on the hub matches \u{201c}{query}\u{201d}."
            ));
            return;
        }
        Ok(found) => found,
        Err(reason) => {
            ui.colored_label(
                ui.visuals().error_fg_color,
                format!("The hub did not answer: {reason}"),
            );
            return;
        }
    };
    for model in found {
        ui.horizontal_wrapped(|ui| {
            ui.label(RichText::new(&model.id).strong());
            ui.label(
                RichText::new(format!(
                    "{} downloads  \u{b7}  {}",
                    grouped(model.downloads as usize),
                    if model.formats.is_empty() {
                        "format not said".to_string()
                    } else {
                        model.formats.join(", ")
                    }
                ))
                .weak(),
            );
            if ui.small_button("Files").clicked() {
                actions.push(Action::ListHubFiles(model.id.clone()));
            }
        });
        if let Some((id, files)) = hub.files()
            && *id == model.id
        {
            repository_files(ui, id, files, hub.free_memory(), actions);
        }
    }
}

/// One repository's files: GGUF files each with Download; a folder model as a whole.
fn repository_files(
    ui: &mut egui::Ui,
    id: &str,
    files: &Result<Vec<RepositoryFile>, String>,
    available: Option<u64>,
    actions: &mut Vec<Action>,
) {
    let files = match files {
        Ok(files) => files,
        Err(reason) => {
            ui.colored_label(ui.visuals().error_fg_color, reason);
            return;
        }
    };
    let ggufs: Vec<&RepositoryFile> = files.iter().filter(|file| file.quant.is_some()).collect();
    ui.indent(id, |ui| {
        egui::Grid::new(("hub files", id)).show(ui, |ui| {
            for file in &ggufs {
                let (quant, bytes) = (file.quant.as_deref().unwrap_or(""), file.size.unwrap_or(0));
                ui.label(RichText::new(quant).monospace());
                ui.label(size_text(bytes));
                if ui
                    .small_button("Download")
                    .on_hover_text(&file.name)
                    .clicked()
                {
                    actions.push(Action::QueueDownload(format!("{id}:{quant}")));
                }
                match available {
                    Some(free) if !MemoryPlan::weights_may_fit(bytes, free) => {
                        ui.colored_label(
                            ui.visuals().warn_fg_color,
                            "more than the memory free now",
                        );
                    }
                    _ => {
                        ui.label("");
                    }
                }
                ui.end_row();
            }
        });
        let folder_model = names_a_folder_model(files.iter().map(|file| file.name.as_str()));
        if folder_model {
            let bytes: u64 = files
                .iter()
                .filter(|file| is_weights_file(&file.name))
                .filter_map(|file| file.size)
                .sum();
            ui.horizontal(|ui| {
                ui.label(format!(
                    "the whole model (safetensors, {})",
                    size_text(bytes)
                ));
                if ui.small_button("Download").clicked() {
                    actions.push(Action::QueueDownload(id.to_string()));
                }
            });
        }
        if ggufs.is_empty() && !folder_model {
            ui.label("No GGUF file or safetensors model here that smolchat reads.");
        }
    });
}

/// "Llama · 135M · Q4_1 · 98 MB · 8,192 tokens of context · Hugging Face cache".
fn summary(facts: &ModelFacts, bytes: u64, store: &str) -> String {
    let mut parts = vec![facts.family_name().to_string()];
    parts.extend(facts.size_name());
    parts.extend(facts.main_type().map(str::to_string));
    parts.push(size_text(bytes));
    parts.push(format!(
        "{} tokens of context",
        grouped(facts.plan.model_context)
    ));
    parts.push(store.to_string());
    parts.join("  \u{b7}  ")
}

/// What it takes here, and whether that fits in the memory free now.
fn fit_line(ui: &mut egui::Ui, facts: &ModelFacts) {
    let needs = facts.plan.describe();
    match facts.fits {
        Some(false) => {
            ui.colored_label(
                ui.visuals().warn_fg_color,
                format!("Needs more memory than is free now: {needs}"),
            );
        }
        _ => {
            ui.label(RichText::new(needs).weak());
        }
    }
}
