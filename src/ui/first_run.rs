//! Shown until a model is loaded: download the default model or point at a local folder,
//! with progress, cancel, and the reason when something failed.

use std::path::PathBuf;

use egui::RichText;

use super::commands::{Action, UiCommand};
use super::labels;
use super::state::{AppState, ModelStatus};
use super::view_state::ViewState;

pub fn show(ui: &mut egui::Ui, state: &AppState, view: &mut ViewState, actions: &mut Vec<Action>) {
    ui.vertical_centered(|ui| {
        ui.add_space(40.0);
        ui.heading(labels::NO_MODEL_HEADING);
        ui.add_space(8.0);
        ui.label(
            "smolchat runs a small language model entirely on this computer. \
             Download SmolLM2-135M-Instruct (about 270 MB, once) or use a model folder you already have.",
        );
        ui.add_space(16.0);
        if let ModelStatus::Failed(message) = state.model() {
            ui.colored_label(ui.visuals().error_fg_color, message);
            ui.add_space(8.0);
        }
        match state.model() {
            ModelStatus::Downloading(progress) => {
                let (fraction, text) = match progress {
                    Some(p) => (
                        p.fraction().unwrap_or(0.0) as f32,
                        format!(
                            "{} ({}/{}) \u{b7} {:.1} of {:.1} MB",
                            p.file,
                            p.file_index + 1,
                            p.file_count,
                            p.bytes_done as f64 / 1e6,
                            p.bytes_total.unwrap_or(0) as f64 / 1e6
                        ),
                    ),
                    None => (0.0, "Starting the download\u{2026}".to_string()),
                };
                ui.add(
                    egui::ProgressBar::new(fraction)
                        .show_percentage()
                        .desired_width(400.0),
                );
                ui.label(text);
                if ui.button("Cancel download").clicked() {
                    actions.push(UiCommand::StopGeneration.into());
                }
            }
            _ => {
                if ui.button(labels::DOWNLOAD_DEFAULT).clicked() {
                    actions.push(Action::DownloadDefaultModel);
                }
            }
        }
        ui.add_space(24.0);
        ui.label(RichText::new("Or use a local model folder (config.json, model.safetensors, tokenizer.json):").weak());
        ui.horizontal(|ui| {
            let label = ui.label(labels::MODEL_FOLDER);
            ui.add(egui::TextEdit::singleline(&mut view.model_path).desired_width(320.0))
                .labelled_by(label.id);
            if ui.button(labels::USE_FOLDER).clicked() {
                actions.push(use_folder(&view.model_path));
            }
        });
    });
}

/// The folder typed into a model folder field, as the action that loads it.
pub fn use_folder(text: &str) -> Action {
    Action::UseModelFolder(PathBuf::from(text.trim()))
}
