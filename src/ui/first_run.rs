//! Shown until a model is loaded: download the default model or point at a local folder,
//! with progress, cancel, and the reason when something failed.

use std::path::PathBuf;

use egui::RichText;

use super::commands::{Action, UiCommand};
use super::labels;
use super::state::{AppState, ModelStatus};
use super::view_state::ViewState;
use crate::model_library::{Store, size_text};

pub fn show(ui: &mut egui::Ui, state: &AppState, view: &mut ViewState, actions: &mut Vec<Action>) {
    ui.vertical_centered(|ui| {
        ui.add_space(40.0);
        ui.heading(labels::NO_MODEL_HEADING);
        ui.add_space(8.0);
        ui.label(if state.local_models().is_empty() {
            "smolchat runs a small language model entirely on this computer. \
             Download SmolLM2-135M-Instruct (about 270 MB, once) or use a model folder you already have."
        } else {
            "smolchat runs a small language model entirely on this computer. \
             Open one you already have, or download SmolLM2-135M-Instruct (about 270 MB, once)."
        });
        ui.add_space(16.0);
        if let ModelStatus::Failed(message) = state.model() {
            ui.colored_label(ui.visuals().error_fg_color, message);
            ui.add_space(8.0);
        }
        local_models(ui, state, actions);
        match state.model() {
            ModelStatus::Downloading(progress) => {
                let (fraction, text) = match progress {
                    Some(p) => (
                        p.fraction().unwrap_or(0.0) as f32,
                        super::downloads::progress_text(p),
                    ),
                    None => (0.0, "Starting the download\u{2026}".to_string()),
                };
                ui.add(
                    egui::ProgressBar::new(fraction)
                        .show_percentage()
                        .desired_width(400.0),
                );
                ui.label(text);
                if let Some(retry) = progress.as_ref().and_then(|p| p.reconnecting.as_ref()) {
                    ui.colored_label(
                        ui.visuals().warn_fg_color,
                        format!(
                            "Connection lost ({}). Reconnecting in {:.0} s, attempt {} of {}; the bytes already here are kept.",
                            retry.reason,
                            retry.after.as_secs_f64().ceil(),
                            retry.attempt,
                            retry.attempts
                        ),
                    );
                }
                if ui.button("Cancel download").clicked() {
                    actions.push(UiCommand::StopGeneration.into());
                }
            }
            _ => {
                if ui.button(labels::DOWNLOAD_DEFAULT).clicked() {
                    actions.push(Action::DownloadDefaultModel);
                }
                if ui
                    .button("Find another model on the hub\u{2026}")
                    .on_hover_text(UiCommand::ToggleLibrary.description(ui.ctx()))
                    .clicked()
                {
                    actions.push(UiCommand::ToggleLibrary.into());
                }
            }
        }
        ui.add_space(24.0);
        ui.label(
            RichText::new(
                "Or open a model you have: a .gguf file, or a folder with config.json, \
                 model.safetensors and tokenizer.json. Dropping one on the window opens it too.",
            )
            .weak(),
        );
        let label = ui.label(labels::MODEL_FOLDER);
        model_path_field(ui, label.id, labels::USE_FOLDER, view, actions, 360.0);
    });
}

/// The models already on this computer, each opened with one click: someone who has one
/// (or has no hub to download from) starts with it.
fn local_models(ui: &mut egui::Ui, state: &AppState, actions: &mut Vec<Action>) {
    let models = state.local_models();
    if models.is_empty() {
        return;
    }
    ui.label(RichText::new(labels::ON_THIS_COMPUTER).strong());
    ui.add_space(4.0);
    for entry in models.iter().take(MAX_LISTED) {
        let model = &entry.model;
        let mut text = format!("{} {}", labels::OPEN_LOCAL_MODEL, model.name);
        if let Ok(facts) = &entry.facts {
            text.push_str(&format!("  \u{b7}  {}", facts.family_name()));
            if let Some(size) = facts.size_name() {
                text.push_str(&format!(" {size}"));
            }
        }
        text.push_str(&format!("  \u{b7}  {}", size_text(model.bytes)));
        // Whose store it is, when it is another app's.
        if model.store != Store::Smolchat {
            text.push_str(&format!("  \u{b7}  {}", model.store.label()));
        }
        let button = ui.add_enabled(entry.facts.is_ok(), egui::Button::new(text));
        let button = match &entry.facts {
            Ok(_) => button.on_hover_text(model.path.display().to_string()),
            Err(reason) => {
                button.on_disabled_hover_text(format!("This build cannot run it: {reason}"))
            }
        };
        if button.clicked() {
            actions.push(Action::UseModelFolder(model.path.clone()));
        }
    }
    if models.len() > MAX_LISTED {
        ui.label(
            RichText::new(format!(
                "and {} more in the model library ({})",
                models.len() - MAX_LISTED,
                UiCommand::ToggleLibrary.description(ui.ctx())
            ))
            .weak(),
        );
    }
    ui.add_space(16.0);
}

/// Models listed at most; the library lists them all.
const MAX_LISTED: usize = 12;

/// The model path box (Enter loads what it names), with buttons for the desktop's dialogs.
pub fn model_path_field(
    ui: &mut egui::Ui,
    label: egui::Id,
    load: &str,
    view: &mut ViewState,
    actions: &mut Vec<Action>,
    width: f32,
) {
    let field = ui
        .add(
            egui::TextEdit::singleline(&mut view.model_path)
                .hint_text("/path/to/model.gguf")
                .desired_width(width),
        )
        .labelled_by(label);
    let entered = field.lost_focus() && ui.input(|input| input.key_pressed(egui::Key::Enter));
    ui.horizontal_wrapped(|ui| {
        if ui.button(load).clicked() || entered {
            actions.push(use_folder(&view.model_path));
        }
        for command in [UiCommand::OpenModelFile, UiCommand::OpenModelFolder] {
            if ui
                .button(command.label())
                .on_hover_text(command.description(ui.ctx()))
                .clicked()
            {
                actions.push(command.into());
            }
        }
    });
}

/// The folder typed into a model folder field, as the action that loads it.
pub fn use_folder(text: &str) -> Action {
    Action::UseModelFolder(PathBuf::from(text.trim()))
}
