//! The model library: every model on this computer, what each is and whether it runs and
//! fits here, each opened with one click (or Tab, then Enter). It takes the chat's place
//! until a model is opened or it is closed (Ctrl+M).

use egui::{RichText, ScrollArea};

use super::chat_view::{centered_column, grouped};
use super::commands::{Action, UiCommand};
use super::state::{AppState, ModelStatus};
use super::view_state::ViewState;
use crate::model_library::facts::{Described, ModelFacts};

pub fn show(ui: &mut egui::Ui, state: &AppState, view: &mut ViewState, actions: &mut Vec<Action>) {
    ScrollArea::vertical().show(ui, |ui| {
        centered_column(ui, |ui| {
            ui.add_space(12.0);
            ui.horizontal(|ui| {
                ui.heading("Models on this computer");
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
            let models = state.local_models();
            if state.scanning_models() && models.is_empty() {
                ui.label("Looking for models\u{2026}");
            } else if models.is_empty() {
                ui.label(
                    "No models found. Open a .gguf file or a model folder (Ctrl+O), or \
                     download one with `smolchat models pull`.",
                );
            }
            let in_use = match state.model() {
                ModelStatus::Ready(info) => Some(info.dir.as_path()),
                ModelStatus::Loading(dir, _) => Some(dir.as_path()),
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
    egui::Frame::group(ui.style())
        .corner_radius(6.0)
        .show(ui, |ui| {
            ui.set_width(ui.available_width());
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
        .inner
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

pub fn size_text(bytes: u64) -> String {
    if bytes >= 1 << 30 {
        format!("{:.1} GB", bytes as f64 / 1e9)
    } else {
        format!("{:.0} MB", bytes as f64 / 1e6)
    }
}
