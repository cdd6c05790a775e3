//! The eframe glue: one frame = take in engine events, run shortcut commands, lay out panels,
//! run what the panels asked for.

use egui::{CentralPanel, Panel};
use strum::IntoEnumIterator;

use std::path::PathBuf;

use super::commands::{Action, DialogFor, ExportFormat, Menu, UiCommand, WIDGET_KEYS};
use super::file_dialog::{Answer, Dialog, Pick};
use super::state::{AppState, ModelStatus};
use super::view_state::ViewState;
use super::{
    chat_view, conversation_list, first_run, input, library, settings_panel, status_bar, trash,
};
use crate::engine::EngineHandle;
use crate::store::{Paths, Settings, Theme};

const ICON_PNG: &[u8] = include_bytes!("../../assets/icon.png");

/// The longest an engine event waits to be drawn; events within it share one frame. A
/// frame per token, with a spinner that asked for more, kept the GUI thread busy all the
/// time: under software rendering on a 2-core machine the window decoded at 30–34 tok/s
/// where the command line decodes at 100. With frames at most this often it decoded at 50.
const FRAME_INTERVAL: std::time::Duration = std::time::Duration::from_millis(100);

/// [`FRAME_INTERVAL`] when OpenGL draws on the CPU (llvmpipe: a virtual machine, a remote
/// desktop, no GPU driver), where every frame takes CPU time from the model. On our 2-core
/// machine under Xvfb, the window decoded at 0.68× the command line's speed with frames every
/// 100 ms and at 0.80× with frames every 250 ms; the text then arrives four times a second.
const SOFTWARE_FRAME_INTERVAL: std::time::Duration = std::time::Duration::from_millis(250);

/// Whether OpenGL renders on the CPU.
fn renders_in_software(gl: Option<&eframe::glow::Context>) -> bool {
    use eframe::glow::HasContext;
    gl.is_some_and(|gl| {
        // SAFETY: a plain query of a string the context always has, on the thread that owns
        // the context (eframe's creation callback).
        is_software_renderer(&unsafe { gl.get_parameter_string(eframe::glow::RENDERER) })
    })
}

/// Under software OpenGL, where every frame takes CPU time from the model: the text cursor
/// stays lit instead of blinking. A blink is two frames a second for as long as the message
/// field has the keyboard, which on llvmpipe kept an idle window at 4% of a core.
fn draw_sparingly(ctx: &egui::Context) {
    ctx.all_styles_mut(|style| style.visuals.text_cursor.blink = false);
}

/// Under software OpenGL, a mouse wheel's notch scrolls at once instead of over the next
/// frames. egui eases a notch (40 points) until it is within a point of its end, which takes
/// as many frames as fit in about 0.1 s: the cheaper a frame, the more of them, so on llvmpipe
/// a 500-message chat took more CPU per notch once its frames got cheaper. A trackpad's gesture
/// is not eased, so each notch is given as the start of one; egui ends it by its timer, as it
/// does for platforms that send no end.
fn wheel_without_easing(raw_input: &mut egui::RawInput) {
    let events = std::mem::take(&mut raw_input.events);
    for event in events {
        if let egui::Event::MouseWheel {
            unit: unit @ (egui::MouseWheelUnit::Line | egui::MouseWheelUnit::Page),
            phase: egui::TouchPhase::Move,
            source,
            modifiers,
            ..
        } = event
        {
            raw_input.events.push(egui::Event::MouseWheel {
                unit,
                delta: egui::Vec2::ZERO,
                phase: egui::TouchPhase::Start,
                source,
                modifiers,
            });
        }
        raw_input.events.push(event);
    }
}

/// Whether an OpenGL renderer's name is one of Mesa's software rasterizers.
fn is_software_renderer(renderer: &str) -> bool {
    let renderer = renderer.to_lowercase();
    ["llvmpipe", "softpipe", "swrast"]
        .iter()
        .any(|name| renderer.contains(name))
}

/// Below this width the chat would be squeezed between the two side panels, so the
/// conversation list gives way while the settings are open.
const NARROW_WIDTH: f32 = 1000.0;

pub struct SmolchatApp {
    state: AppState,
    view: ViewState,
    /// Whether OpenGL draws on the CPU, where each frame is worth saving.
    software_rendering: bool,
}

impl SmolchatApp {
    pub fn new(state: AppState) -> Self {
        let view = ViewState {
            model_path: state
                .settings()
                .model_folder
                .as_ref()
                .map(|folder| folder.display().to_string())
                .unwrap_or_default(),
            input: state.current().draft.clone(),
            focus_input: true,
            ..ViewState::default()
        };
        Self {
            state,
            view,
            software_rendering: false,
        }
    }

    /// The window as it runs where OpenGL draws on the CPU: fewer frames.
    fn drawn_in_software(self, ctx: &egui::Context) -> Self {
        draw_sparingly(ctx);
        Self {
            software_rendering: true,
            ..self
        }
    }

    pub fn state(&self) -> &AppState {
        &self.state
    }

    pub fn view(&self) -> &ViewState {
        &self.view
    }

    /// Runs one action from a shortcut, a menu or a view: the state changes in
    /// [`AppState::apply`], and what the window shows follows here.
    pub fn execute(&mut self, action: impl Into<Action>) {
        let action = action.into();
        let chat_before = self.state.current().id.clone();
        let done = self.state.apply(action.clone());
        // The unsent message stays with its chat; the next chat's comes into the box.
        if self.state.current().id != chat_before {
            let draft = std::mem::take(&mut self.view.input);
            self.state.apply(Action::KeepDraft {
                conversation: chat_before,
                draft,
            });
            self.view.input = self.state.current().draft.clone();
        }
        let view = &mut self.view;
        match action {
            Action::Command(UiCommand::FocusInput | UiCommand::NewConversation) => {
                view.focus_input = true;
            }
            // Esc stops the reply; the message box keeps the keyboard for what comes next.
            Action::Command(UiCommand::StopGeneration) if view.input_focused => {
                view.focus_input = true;
            }
            // The keyboard goes to the library's first model, so Enter opens it and Tab
            // walks the list; closed, back to the message box.
            Action::Command(UiCommand::ToggleLibrary) => {
                view.focus_library = self.state.library_open();
                view.focus_input = !self.state.library_open();
            }
            Action::Command(UiCommand::SearchChats) => view.focus_chat_search = true,
            Action::Command(UiCommand::Quit) => view.close_requested = true,
            Action::Command(UiCommand::ShowShortcuts) => view.shortcuts_open = true,
            Action::Command(UiCommand::RenameChat) => {
                let current = self.state.current_index();
                view.renaming = Some((current, self.state.current().title.clone()));
            }
            Action::Command(UiCommand::OpenModelFile) => {
                view.dialog_requested = Some(Pick::GgufFile);
            }
            Action::Command(UiCommand::OpenModelFolder) => {
                view.dialog_requested = Some(Pick::ModelFolder);
            }
            Action::Command(UiCommand::ImportChat) => {
                view.dialog_requested = Some(Pick::ChatExport);
            }
            Action::Command(command @ (UiCommand::ExportMarkdownAs | UiCommand::ExportJsonAs)) => {
                let format = match command {
                    UiCommand::ExportMarkdownAs => ExportFormat::Markdown,
                    _ => ExportFormat::Json,
                };
                let suggested = self.state.export_path(format);
                view.dialog_requested = Some(Pick::Export { format, suggested });
            }
            Action::UseModelFolder(path) if done => {
                view.model_path = path.display().to_string();
            }
            Action::Send(_) if done => {
                view.input.clear();
                view.focus_input = true;
            }
            Action::EditAndResend(..) if done => view.editing = None,
            // The message indices of the draft may now point elsewhere.
            Action::Delete(_) => view.editing = None,
            _ => {}
        }
    }

    /// Draws one frame into `ui` (the whole window).
    pub fn show(&mut self, ui: &mut egui::Ui) {
        self.state.poll();
        let ctx = ui.ctx().clone();
        // Esc closes the shortcuts sheet before it stops anything.
        if self.view.shortcuts_open
            && ctx.input_mut(|input| input.consume_key(egui::Modifiers::NONE, egui::Key::Escape))
        {
            self.view.shortcuts_open = false;
        }
        // Esc in the chat search ends the search, and stops no reply. (The list sets the
        // flag again as it draws; hidden, it has no search box with the keyboard.)
        if std::mem::take(&mut self.view.chat_search_focused)
            && ctx.input_mut(|input| input.consume_key(egui::Modifiers::NONE, egui::Key::Escape))
        {
            self.view.chat_query.clear();
        }
        for command in UiCommand::pressed(&ctx) {
            self.execute(command);
        }
        if let Some(place) = UiCommand::chat_number_pressed(&ctx)
            && let Some(&index) = self.state.chat_order().get(place)
        {
            self.execute(Action::Select(index));
        }
        // Woken by engine events otherwise; this only covers the periodic save.
        if let Some(wait) = self.state.next_save_in() {
            ctx.request_repaint_after(wait);
        }
        if let Some(wait) = self.state.next_notice_change() {
            ctx.request_repaint_after(wait);
        }
        if self.state.scanning_models() || self.state.hub().busy() || self.state.downloads().busy()
        {
            ctx.request_repaint_after(std::time::Duration::from_millis(100));
        }

        let size = ctx.viewport_rect().size();
        self.view.window_size = Some([size.x, size.y]);

        let mut actions = files_given(&ctx, &mut self.view);
        let (state, view) = (&self.state, &mut self.view);
        let settings = state.settings();
        let theme = match settings.theme {
            Theme::System => egui::ThemePreference::System,
            Theme::Light => egui::ThemePreference::Light,
            Theme::Dark => egui::ThemePreference::Dark,
        };
        if ctx.options(|options| options.theme_preference) != theme {
            ctx.set_theme(theme);
        }
        let narrow = ui.available_width() < NARROW_WIDTH;
        let show_list = settings.show_conversations && !(narrow && settings.show_settings);
        Panel::top("menu").show(ui, |ui| menu_bar(ui, state, show_list, &mut actions));
        Panel::bottom("status").show(ui, |ui| status_bar::show(ui, state, &mut actions));
        if show_list {
            Panel::left("conversations")
                .resizable(true)
                .default_size(190.0)
                .max_size(320.0)
                .show(ui, |ui| {
                    conversation_list::show(ui, state, view, &mut actions)
                });
        }
        if settings.show_settings {
            Panel::right("settings")
                .resizable(true)
                .default_size(250.0)
                .max_size(420.0)
                .show(ui, |ui| settings_panel::show(ui, state, view, &mut actions));
        }
        let show_chat = matches!(
            state.model(),
            ModelStatus::Ready(_) | ModelStatus::Loading { .. }
        );
        if show_chat && !state.library_open() && !state.trash_open() {
            Panel::bottom("input").show(ui, |ui| input::show(ui, state, view, &mut actions));
        }
        CentralPanel::default().show(ui, |ui| {
            errors_banner(ui, state, &mut actions);
            if state.library_open() {
                library::show(ui, state, view, &mut actions);
            } else if state.trash_open() {
                trash::show(ui, state, &mut actions);
            } else if show_chat {
                chat_view::show(ui, state, view, &mut actions);
            } else {
                first_run::show(ui, state, view, &mut actions);
            }
        });
        for action in actions {
            self.execute(action);
        }
        if std::mem::take(&mut self.view.close_requested) {
            ctx.send_viewport_cmd(egui::ViewportCommand::Close);
        }
        if let Some(pick) = self.view.dialog_requested.take()
            && self.view.dialog.is_none()
        {
            self.view.dialog = Dialog::open(pick, ctx.clone());
        }
        if !ctx.input(|input| input.raw.hovered_files.is_empty()) {
            drop_hint(&ctx);
        }
        shortcuts_sheet(&ctx, &mut self.view.shortcuts_open);
    }

    /// Keeps what the next start restores: the window's size and the unsent message.
    pub fn remember_window(&mut self) {
        let size = self.view.window_size;
        let draft = self.view.input.clone();
        self.execute(Action::RememberWindow { size, draft });
    }
}

impl eframe::App for SmolchatApp {
    fn ui(&mut self, ui: &mut egui::Ui, _frame: &mut eframe::Frame) {
        self.show(ui);
    }

    fn raw_input_hook(&mut self, _ctx: &egui::Context, raw_input: &mut egui::RawInput) {
        if self.software_rendering {
            wheel_without_easing(raw_input);
        }
    }

    fn on_exit(&mut self, _gl: Option<&eframe::glow::Context>) {
        self.remember_window();
    }
}

/// Files given to the window this frame: models dropped on it, or a path chosen in a dialog.
fn files_given(ctx: &egui::Context, view: &mut ViewState) -> Vec<Action> {
    let dropped: Vec<PathBuf> = ctx.input(|input| {
        input
            .raw
            .dropped_files
            .iter()
            .map(|file| file.path().to_path_buf())
            .filter(|path| !path.as_os_str().is_empty())
            .collect()
    });
    // One model at a time: of several dropped, the first.
    let mut actions: Vec<Action> = dropped
        .into_iter()
        .take(1)
        .map(Action::UseModelFolder)
        .collect();
    if let Some(answer) = view.dialog.as_ref().and_then(Dialog::answer)
        && let Some(pick) = view.dialog.take().map(|dialog| dialog.pick().clone())
    {
        let asked_for = match pick {
            Pick::GgufFile | Pick::ModelFolder => DialogFor::OpeningModel,
            Pick::Export { .. } => DialogFor::Export,
            Pick::ChatExport => DialogFor::ImportingChat,
        };
        match (answer, pick) {
            (Answer::Chosen(path), Pick::GgufFile | Pick::ModelFolder) => {
                actions.push(Action::UseModelFolder(path));
            }
            (Answer::Chosen(path), Pick::Export { format, .. }) => {
                actions.push(Action::ExportTo(format, path));
            }
            (Answer::Chosen(path), Pick::ChatExport) => actions.push(Action::ImportFrom(path)),
            (Answer::NotShown, _) => actions.push(Action::NoFileDialog(asked_for)),
            (Answer::Cancelled, _) => {}
        }
    }
    actions
}

/// Says what a drop will do while files are dragged over the window.
fn drop_hint(ctx: &egui::Context) {
    let screen = ctx.content_rect();
    let painter = ctx.layer_painter(egui::LayerId::new(
        egui::Order::Foreground,
        egui::Id::unique("drop hint"),
    ));
    painter.rect_filled(screen, 0.0, egui::Color32::from_black_alpha(160));
    painter.text(
        screen.center(),
        egui::Align2::CENTER_CENTER,
        "Drop a .gguf file or a model folder to open it",
        egui::FontId::proportional(22.0),
        egui::Color32::WHITE,
    );
}

/// `list_shown`: whether the conversation list is on screen (a narrow window hides it while
/// the settings are open; its switch then closes the settings to make room).
fn menu_bar(ui: &mut egui::Ui, state: &AppState, list_shown: bool, actions: &mut Vec<Action>) {
    egui::MenuBar::new().ui(ui, |ui| {
        for menu in Menu::iter() {
            ui.menu_button(menu.label(), |ui| {
                for command in UiCommand::iter().filter(|command| command.menu() == menu) {
                    command_menu_item(ui, command, checked(command, state, list_shown), actions);
                }
            });
        }
        ui.separator();
        // The side panels' switches, where a user looks for them.
        let settings = state.settings();
        let list_command = if settings.show_conversations && !list_shown {
            UiCommand::ToggleSettings
        } else {
            UiCommand::ToggleConversations
        };
        for (command, label, shown) in [
            (list_command, "Chats", list_shown),
            (
                UiCommand::ToggleSettings,
                "Settings",
                settings.show_settings,
            ),
            (UiCommand::ToggleLibrary, "Models", state.library_open()),
        ] {
            if ui
                .selectable_label(shown, label)
                .on_hover_text(command.description(ui.ctx()))
                .clicked()
            {
                actions.push(command.into());
            }
        }
    });
}

/// Whether a menu's switch is on, for the commands that are switches (`None` otherwise).
fn checked(command: UiCommand, state: &AppState, list_shown: bool) -> Option<bool> {
    let settings = state.settings();
    match command {
        UiCommand::ToggleConversations => Some(list_shown),
        UiCommand::ToggleSettings => Some(settings.show_settings),
        UiCommand::ToggleLibrary => Some(state.library_open()),
        UiCommand::ToggleTrash => Some(state.trash_open()),
        UiCommand::ToggleTokenView => Some(settings.show_token_probabilities),
        UiCommand::ToggleServer => Some(settings.server.enabled),
        UiCommand::ThemeSystem => Some(settings.theme == Theme::System),
        UiCommand::ThemeLight => Some(settings.theme == Theme::Light),
        UiCommand::ThemeDark => Some(settings.theme == Theme::Dark),
        _ => None,
    }
}

/// A menu entry with its shortcut, and a check mark for a switch that is on (a blank of the
/// same width when off, so that the labels line up).
fn command_menu_item(
    ui: &mut egui::Ui,
    command: UiCommand,
    checked: Option<bool>,
    actions: &mut Vec<Action>,
) {
    let label = match checked {
        Some(true) => format!("\u{2714} {}", command.label()),
        Some(false) => format!("\u{2003} {}", command.label()),
        None => command.label().to_string(),
    };
    let mut button = egui::Button::new(label);
    if let Some(shortcut) = command.shortcut() {
        button = button.shortcut_text(ui.ctx().format_shortcut(&shortcut));
    }
    let response = ui.add(button);
    if let Some(on) = checked {
        response.widget_info(|| {
            egui::WidgetInfo::selected(egui::Role::MenuItemCheckBox, true, on, command.label())
        });
    }
    if response.clicked() {
        actions.push(command.into());
        ui.close();
    }
}

/// Every shortcut on one sheet (F1): the commands' own, then the keys that belong to a
/// widget.
fn shortcuts_sheet(ctx: &egui::Context, open: &mut bool) {
    let mut rows: Vec<(String, &str)> = UiCommand::iter()
        .filter_map(|command| {
            let shortcut = command.shortcut()?;
            Some((ctx.format_shortcut(&shortcut), command.label()))
        })
        .collect();
    rows.extend(
        WIDGET_KEYS
            .iter()
            .map(|&(keys, what)| (keys.to_string(), what)),
    );
    // Two columns, so that the whole sheet fits a window of 800x600.
    let (left, right) = rows.split_at(rows.len().div_ceil(2));
    egui::Window::new(UiCommand::ShowShortcuts.label())
        .open(open)
        .collapsible(false)
        .resizable(false)
        .show(ctx, |ui| {
            ui.horizontal_top(|ui| {
                for (half, rows) in [left, right].into_iter().enumerate() {
                    egui::Grid::new(("shortcuts", half))
                        .num_columns(2)
                        .striped(true)
                        .show(ui, |ui| {
                            for (keys, what) in rows {
                                ui.monospace(keys);
                                ui.label(*what);
                                ui.end_row();
                            }
                        });
                }
            });
        });
}

/// Engine and file errors, each with what to do next, until dismissed.
fn errors_banner(ui: &mut egui::Ui, state: &AppState, actions: &mut Vec<Action>) {
    for (index, error) in state.errors().iter().enumerate() {
        egui::Frame::group(ui.style())
            .fill(ui.visuals().extreme_bg_color)
            .show(ui, |ui| {
                ui.horizontal_wrapped(|ui| {
                    ui.colored_label(ui.visuals().error_fg_color, error);
                    if ui.button("Dismiss").clicked() {
                        actions.push(Action::DismissError(index));
                    }
                });
            });
    }
}

/// Opens the window; returns when it is closed.
pub fn run(paths: Paths) -> Result<(), String> {
    let size = Settings::load(&paths.settings_file())
        .0
        .window_size
        .filter(|[width, height]| *width >= 600.0 && *height >= 400.0)
        .unwrap_or([1100.0, 720.0]);
    let mut viewport = egui::ViewportBuilder::default()
        .with_title("smolchat")
        .with_app_id("smolchat")
        .with_inner_size(size)
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
            cc.egui_ctx.set_fonts(super::fonts::with_system_fallbacks());
            super::theme::apply(&cc.egui_ctx);
            let ctx = cc.egui_ctx.clone();
            let software = renders_in_software(cc.gl.as_deref());
            let interval = match software {
                true => SOFTWARE_FRAME_INTERVAL,
                false => FRAME_INTERVAL,
            };
            let engine = EngineHandle::spawn(move || ctx.request_repaint_after(interval))
                .map_err(|err| format!("cannot start the inference thread: {err}"))?;
            let app = SmolchatApp::new(AppState::new(paths, engine));
            Ok(Box::new(match software {
                true => app.drawn_in_software(&cc.egui_ctx),
                false => app,
            }))
        }),
    )
    .map_err(|err| format!("cannot open the window: {err}"))
}

#[cfg(test)]
mod tests;
