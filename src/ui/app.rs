//! The eframe glue: one frame = take in engine events, run shortcut commands, lay out panels.

use egui::{CentralPanel, Panel};

use super::commands::UiCommand;
use super::state::{AppState, ModelStatus};
use super::view_state::ViewState;
use super::{chat_view, conversation_list, first_run, input, settings_panel, status_bar};
use crate::store::Paths;

const ICON_PNG: &[u8] = include_bytes!("../../assets/icon.png");

/// The longest an engine event waits to be drawn; events within it share one frame. A
/// frame per token, with a spinner that asked for more, kept the GUI thread busy all the
/// time: under software rendering on a 2-core machine the window decoded at 30–34 tok/s
/// where the command line decodes at 100. With frames at most this often it decoded at 50.
const FRAME_INTERVAL: std::time::Duration = std::time::Duration::from_millis(100);

pub struct SmolchatApp {
    pub state: AppState,
    pub view: ViewState,
}

impl SmolchatApp {
    pub fn new(state: AppState) -> Self {
        let view = ViewState {
            model_path: state
                .settings
                .model_folder
                .as_ref()
                .map(|folder| folder.display().to_string())
                .unwrap_or_default(),
            focus_input: true,
            ..ViewState::default()
        };
        Self { state, view }
    }

    pub fn execute(&mut self, command: UiCommand) {
        let state = &mut self.state;
        match command {
            UiCommand::NewConversation => {
                state.new_conversation();
                self.view.focus_input = true;
            }
            UiCommand::StopGeneration => state.stop(),
            UiCommand::FocusInput => self.view.focus_input = true,
            UiCommand::ToggleSettings => {
                state.settings.show_settings = !state.settings.show_settings;
                state.save_settings();
            }
            UiCommand::ToggleTokenView => {
                state.settings.show_token_probabilities = !state.settings.show_token_probabilities;
                state.save_settings();
            }
            UiCommand::RegenerateLast => {
                state.regenerate();
            }
            UiCommand::ExportMarkdown => {
                state.export_current(true);
            }
            UiCommand::ExportJson => {
                state.export_current(false);
            }
        }
    }

    /// Draws one frame into `ui` (the whole window).
    pub fn show(&mut self, ui: &mut egui::Ui) {
        self.state.poll();
        let ctx = ui.ctx().clone();
        for command in UiCommand::pressed(&ctx) {
            self.execute(command);
        }
        // Woken by engine events otherwise; this only covers the periodic save.
        if let Some(wait) = self.state.next_save_in() {
            ctx.request_repaint_after(wait);
        }

        let mut commands = Vec::new();
        Panel::top("menu").show(ui, |ui| menu_bar(ui, &mut commands));
        Panel::bottom("status").show(ui, |ui| status_bar::show(ui, &mut self.state));
        Panel::left("conversations")
            .resizable(true)
            .default_size(200.0)
            .show(ui, |ui| {
                conversation_list::show(ui, &mut self.state, &mut self.view, &mut commands)
            });
        if self.state.settings.show_settings {
            Panel::right("settings")
                .resizable(true)
                .default_size(260.0)
                .show(ui, |ui| {
                    settings_panel::show(ui, &mut self.state, &mut self.view)
                });
        }
        let show_chat = matches!(
            self.state.model,
            ModelStatus::Ready(_) | ModelStatus::Loading(_)
        );
        if show_chat {
            Panel::bottom("input").show(ui, |ui| {
                input::show(ui, &mut self.state, &mut self.view, &mut commands)
            });
        }
        CentralPanel::default().show(ui, |ui| {
            errors_banner(ui, &mut self.state);
            if show_chat {
                chat_view::show(ui, &mut self.state, &mut self.view, &mut commands);
            } else {
                first_run::show(ui, &mut self.state, &mut self.view);
            }
        });
        for command in commands {
            self.execute(command);
        }
    }
}

impl eframe::App for SmolchatApp {
    fn ui(&mut self, ui: &mut egui::Ui, _frame: &mut eframe::Frame) {
        self.show(ui);
    }
}

fn menu_bar(ui: &mut egui::Ui, commands: &mut Vec<UiCommand>) {
    egui::MenuBar::new().ui(ui, |ui| {
        ui.menu_button("Chat", |ui| {
            for command in [
                UiCommand::NewConversation,
                UiCommand::RegenerateLast,
                UiCommand::StopGeneration,
                UiCommand::ExportMarkdown,
                UiCommand::ExportJson,
            ] {
                command_menu_item(ui, command, commands);
            }
        });
        ui.menu_button("View", |ui| {
            for command in [
                UiCommand::FocusInput,
                UiCommand::ToggleSettings,
                UiCommand::ToggleTokenView,
            ] {
                command_menu_item(ui, command, commands);
            }
        });
    });
}

fn command_menu_item(ui: &mut egui::Ui, command: UiCommand, commands: &mut Vec<UiCommand>) {
    let mut button = egui::Button::new(command.label());
    if let Some(shortcut) = command.shortcut() {
        button = button.shortcut_text(ui.ctx().format_shortcut(&shortcut));
    }
    if ui.add(button).clicked() {
        commands.push(command);
        ui.close();
    }
}

/// Engine and file errors, each with what to do next, until dismissed.
fn errors_banner(ui: &mut egui::Ui, state: &mut AppState) {
    let mut dismissed = None;
    for (index, error) in state.errors.iter().enumerate() {
        egui::Frame::group(ui.style())
            .fill(ui.visuals().extreme_bg_color)
            .show(ui, |ui| {
                ui.horizontal_wrapped(|ui| {
                    ui.colored_label(ui.visuals().error_fg_color, error);
                    if ui.button("Dismiss").clicked() {
                        dismissed = Some(index);
                    }
                });
            });
    }
    if let Some(index) = dismissed {
        state.errors.remove(index);
    }
}

/// Opens the window; returns when it is closed.
pub fn run(paths: Paths) -> Result<(), String> {
    let mut viewport = egui::ViewportBuilder::default()
        .with_title("smolchat")
        .with_app_id("smolchat")
        .with_inner_size([1100.0, 720.0])
        .with_min_inner_size([600.0, 400.0]);
    match eframe::icon_data::from_png_bytes(ICON_PNG) {
        Ok(icon) => viewport = viewport.with_icon(icon),
        Err(err) => eprintln!("warning: the window icon could not be decoded: {err}"),
    }
    let options = eframe::NativeOptions {
        viewport,
        renderer: eframe::Renderer::Glow,
        ..Default::default()
    };
    eframe::run_native(
        "smolchat",
        options,
        Box::new(move |cc| {
            cc.egui_ctx
                .options_mut(|options| options.theme_preference = egui::ThemePreference::System);
            let ctx = cc.egui_ctx.clone();
            let state = AppState::new(paths, move || ctx.request_repaint_after(FRAME_INTERVAL))?;
            Ok(Box::new(SmolchatApp::new(state)))
        }),
    )
    .map_err(|err| format!("cannot open the window: {err}"))
}
