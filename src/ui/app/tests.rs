//! The whole window against a scripted engine, driven by keys and clicks as a user would.

use egui::accesskit::Role as A11y;
use egui::{Key, Modifiers};
use egui_kittest::Harness;
use egui_kittest::kittest::Queryable;
use tempfile::TempDir;

use super::SmolchatApp;
use crate::engine::{Command, Event};
use crate::model_source::ModelSource;
use crate::store::{Conversation, ConversationStore, Paths, StoredMessage};
use crate::text::{ChatMessage, Role};
use crate::ui::commands::Action;
use crate::ui::scripted_engine::{ScriptedEngine, model_info};
use crate::ui::theme::MAX_CHAT_WIDTH;
use crate::ui::{AppState, UiCommand, labels};

/// The window with a model loaded, the script that serves it, and its data folder.
fn window() -> (Harness<'static, SmolchatApp>, ScriptedEngine, TempDir) {
    window_of_size([1100.0, 720.0])
}

/// A heading only the settings panel shows.
const SETTINGS_SECTION: &str = "Sampling";

/// A button only the conversation list shows.
const LIST_BUTTON: &str = "Delete conversation";

fn window_of_size(size: [f32; 2]) -> (Harness<'static, SmolchatApp>, ScriptedEngine, TempDir) {
    window_in(tempfile::tempdir().unwrap(), size)
}

/// The window on data folder `dir`, which may hold chats already.
fn window_in(
    dir: TempDir,
    size: [f32; 2],
) -> (Harness<'static, SmolchatApp>, ScriptedEngine, TempDir) {
    let (handle, engine) = ScriptedEngine::new();
    let mut state = AppState::new(Paths::under(dir.path()), handle);
    let folder = dir.path().join("model");
    std::fs::create_dir_all(&folder).unwrap();
    std::fs::write(folder.join("config.json"), "{}").unwrap();
    std::fs::write(folder.join("model.safetensors"), "").unwrap();
    assert!(state.apply(Action::UseModelFolder(folder.clone())));
    engine.send(Event::ModelReady(model_info(&folder)));
    engine.commands();
    let mut harness = Harness::builder().with_size(size).build_ui_state(
        |ui, app: &mut SmolchatApp| app.show(ui),
        SmolchatApp::new(state),
    );
    harness.step();
    assert!(harness.state().state().model_ready());
    (harness, engine, dir)
}

#[test]
fn a_shortcut_runs_its_command_in_the_window() {
    let (mut harness, _engine, _dir) = window();
    assert!(
        !harness.state().state().settings().show_settings,
        "the chat has the window at first"
    );
    assert!(harness.query_by_label(SETTINGS_SECTION).is_none());
    harness.key_press_modifiers(Modifiers::COMMAND, Key::Comma);
    harness.step();
    harness.step();
    assert!(harness.state().state().settings().show_settings);
    assert!(harness.query_by_label(SETTINGS_SECTION).is_some());
}

fn type_message(harness: &mut Harness<'static, SmolchatApp>, text: &str) {
    harness
        .get_by_role_and_label(A11y::MultilineTextInput, labels::MESSAGE_INPUT)
        .type_text(text);
    harness.step();
}

/// Types `text` into the message box, which takes the keyboard first, and sends it with Enter.
fn send_from_the_box(harness: &mut Harness<'static, SmolchatApp>, text: &str) {
    harness
        .get_by_role_and_label(A11y::MultilineTextInput, labels::MESSAGE_INPUT)
        .focus();
    harness.step();
    type_message(harness, text);
    harness.key_press(Key::Enter);
    harness.step();
}

/// Finishes the reply the engine was last asked for with `text`, and draws a frame.
fn answer(harness: &mut Harness<'static, SmolchatApp>, engine: &ScriptedEngine, text: &str) {
    let request = engine.generate_request();
    engine.send(Event::Finished {
        request: request.id,
        reason: crate::generation::FinishReason::StopToken,
        text: text.into(),
        stats: crate::ui::scripted_engine::stats(1),
    });
    harness.step();
}

#[test]
fn shift_enter_adds_a_line_and_enter_sends() {
    let (mut harness, engine, _dir) = window();
    harness
        .get_by_role_and_label(A11y::MultilineTextInput, labels::MESSAGE_INPUT)
        .focus();
    harness.step();
    type_message(&mut harness, "first line");
    harness.key_press_modifiers(Modifiers::SHIFT, Key::Enter);
    harness.step();
    type_message(&mut harness, "second line");
    assert!(engine.commands().is_empty(), "Shift+Enter sent the message");
    assert_eq!(harness.state().view().input, "first line\nsecond line");

    harness.key_press(Key::Enter);
    harness.step();
    let request = engine.generate_request();
    assert_eq!(
        request.messages,
        [ChatMessage::user("first line\nsecond line")]
    );
    assert_eq!(harness.state().view().input, "");
}

/// Esc stopped the reply and took the keyboard from the message box, so that what was typed
/// next was lost.
#[test]
fn esc_stops_the_reply_and_the_message_box_keeps_the_keyboard() {
    let (mut harness, engine, _dir) = window();
    send_from_the_box(&mut harness, "Tell me a story");
    let request = engine.generate_request();
    harness.key_press(Key::Escape);
    harness.step();
    harness.step();
    assert!(engine.is_cancelled(request.id), "Esc stops the reply");
    harness
        .get_by_role_and_label(A11y::MultilineTextInput, labels::MESSAGE_INPUT)
        .type_text("next");
    harness.step();
    assert_eq!(harness.state().view().input, "next");
}

/// Editing a message took the mouse (its Edit button): Up in the empty message box opens the
/// last message sent, with the keyboard in it, and Ctrl+Enter sends the edit.
#[test]
fn up_in_the_empty_message_box_edits_the_last_message() {
    let (mut harness, engine, _dir) = window();
    send_from_the_box(&mut harness, "Name a colour.");
    answer(&mut harness, &engine, "Blue.");
    harness.key_press(Key::ArrowUp);
    harness.step();
    harness.step();
    assert_eq!(
        harness.state().view().editing,
        Some((0, "Name a colour.".to_string()))
    );
    harness.key_press_modifiers(Modifiers::COMMAND, Key::A);
    harness.step();
    harness
        .get_by_role_and_label(A11y::MultilineTextInput, "Edit message")
        .type_text("Name a bird.");
    harness.step();
    harness.key_press_modifiers(Modifiers::COMMAND, Key::Enter);
    harness.step();
    let resent = engine.generate_request();
    assert_eq!(resent.messages, [ChatMessage::user("Name a bird.")]);
    assert_eq!(
        harness.state().view().input,
        "",
        "the message box stays empty"
    );
}

#[test]
fn a_narrow_window_gives_the_chat_room_and_chats_swaps_the_panels() {
    let (mut harness, _engine, _dir) = window_of_size([800.0, 600.0]);
    assert!(
        harness.query_by_label(LIST_BUTTON).is_some(),
        "the list has room"
    );
    harness.key_press_modifiers(Modifiers::COMMAND, Key::Comma);
    harness.step();
    harness.step();
    assert!(harness.query_by_label(SETTINGS_SECTION).is_some());
    assert!(
        harness.query_by_label(LIST_BUTTON).is_none(),
        "the conversation list squeezes the chat beside the settings"
    );
    let message = harness.get_by_role_and_label(A11y::MultilineTextInput, labels::MESSAGE_INPUT);
    assert!(message.rect().width() > 300.0, "{:?}", message.rect());

    harness.get_by_role_and_label(A11y::Button, "Chats").click();
    harness.step();
    harness.step();
    assert!(harness.query_by_label(LIST_BUTTON).is_some());
    assert!(!harness.state().state().settings().show_settings);
}

#[test]
fn on_a_wide_screen_the_chat_column_keeps_a_readable_width() {
    let (harness, _engine, _dir) = window_of_size([1920.0, 1080.0]);
    let message = harness.get_by_role_and_label(A11y::MultilineTextInput, labels::MESSAGE_INPUT);
    assert!(
        message.rect().width() <= MAX_CHAT_WIDTH,
        "{:?}",
        message.rect()
    );
    assert!(harness.query_by_label(LIST_BUTTON).is_some());
}

#[test]
fn quit_closes_the_window_and_the_draft_and_size_come_back() {
    let (mut harness, _engine, dir) = window();
    harness
        .get_by_role_and_label(A11y::MultilineTextInput, labels::MESSAGE_INPUT)
        .focus();
    harness.step();
    type_message(&mut harness, "half a thought");
    // One frame with the key press: kittest's `key_press` would run a frame per event, and
    // the close request is in the output of the first.
    let ctrl = Modifiers::COMMAND | Modifiers::CTRL;
    harness.input_mut().events.push(egui::Event::Key {
        key: Key::Q,
        physical_key: None,
        pressed: true,
        repeat: false,
        modifiers: ctrl,
    });
    harness.step();
    let closed = harness
        .output()
        .viewport_output
        .values()
        .any(|viewport| viewport.commands.contains(&egui::ViewportCommand::Close));
    assert!(closed, "Ctrl+Q did not close the window");
    harness.state_mut().remember_window();

    let saved = crate::store::Settings::load(&Paths::under(dir.path()).settings_file()).0;
    assert_eq!(saved.window_size, Some([1100.0, 720.0]));
    let (handle, _engine) = ScriptedEngine::new();
    let again = SmolchatApp::new(AppState::new(Paths::under(dir.path()), handle));
    assert_eq!(again.view().input, "half a thought");
}

#[test]
fn the_theme_follows_the_choice_and_is_remembered() {
    let (mut harness, _engine, dir) = window();
    for (command, theme) in [
        (UiCommand::ThemeLight, egui::Theme::Light),
        (UiCommand::ThemeDark, egui::Theme::Dark),
    ] {
        harness.state_mut().execute(command);
        harness.step();
        assert_eq!(harness.ctx.theme(), theme);
    }
    let saved = crate::store::Settings::load(&Paths::under(dir.path()).settings_file()).0;
    assert_eq!(saved.theme, crate::store::Theme::Dark);
}

/// A file dropped on the window, as the platform reports it.
#[derive(Debug)]
struct Dropped(std::path::PathBuf);

impl egui::DroppedFile for Dropped {
    fn path(&self) -> &std::path::Path {
        &self.0
    }

    fn bytes(&self) -> Result<Vec<u8>, String> {
        std::fs::read(&self.0).map_err(|err| err.to_string())
    }
}

/// The model sources the window asked the engine to load since the last call.
fn loads(engine: &ScriptedEngine) -> Vec<ModelSource> {
    engine
        .commands()
        .into_iter()
        .filter_map(|command| match command {
            Command::LoadModel { source, .. } => Some(source),
            _ => None,
        })
        .collect()
}

#[test]
fn a_model_file_dropped_on_the_window_opens() {
    let (mut harness, engine, dir) = window();
    let file = dir.path().join("SmolLM2-135M-Instruct.Q4_1.gguf");
    std::fs::write(&file, b"GGUF").unwrap();
    harness
        .input_mut()
        .dropped_files
        .push(std::sync::Arc::new(Dropped(file.clone())));
    harness.step();
    assert_eq!(loads(&engine), [ModelSource::GgufFile(file.clone())]);
    assert_eq!(
        harness.state().view().model_path,
        file.display().to_string()
    );
}

#[test]
fn enter_in_the_model_path_field_loads_it() {
    let (mut harness, engine, dir) = window();
    let file = dir.path().join("other.gguf");
    std::fs::write(&file, b"GGUF").unwrap();
    // The field is in the settings, closed at first.
    harness.key_press_modifiers(Modifiers::COMMAND, Key::Comma);
    harness.step();
    harness.step();
    let field = harness.get_by_role_and_label(A11y::TextInput, labels::CURRENT_MODEL);
    field.focus();
    field.set_text_value_accesskit(&file.display().to_string());
    harness.step();
    assert_eq!(
        harness.state().view().model_path,
        file.display().to_string()
    );
    assert!(loads(&engine).is_empty(), "typing alone loads nothing");
    harness.key_press(Key::Enter);
    harness.step();
    assert_eq!(loads(&engine), [ModelSource::GgufFile(file)]);
}

/// Emoji this model writes often, egui_commonmark's copy and copied icons of code blocks,
/// and the conversation list's rename icon.
#[test]
fn emoji_and_the_code_block_icons_have_glyphs() {
    let ctx = egui::Context::default();
    let mut output = ctx.run_ui(Default::default(), |_| {});
    output.textures_delta.clear();
    let font = egui::FontId::proportional(14.0);
    let missing: Vec<char> = "😊😀👍❤🚀✨🌍💡🐉🍞🗐✔✏"
        .chars()
        .filter(|&c| !ctx.fonts_mut(|fonts| fonts.has_glyph(&font, c)))
        .collect();
    assert!(missing.is_empty(), "drawn as boxes: {missing:?}");
}

#[test]
fn a_download_that_lost_its_connection_says_it_is_reconnecting() {
    let dir = tempfile::tempdir().unwrap();
    let (handle, engine) = ScriptedEngine::new();
    let mut state = AppState::new(Paths::under(dir.path()), handle);
    assert!(state.apply(Action::DownloadDefaultModel));
    engine.send(Event::DownloadProgress(crate::hub::DownloadProgress {
        file: "model.safetensors".into(),
        file_index: 3,
        file_count: 6,
        bytes_done: 100 << 20,
        bytes_total: Some(270 << 20),
        bytes_per_sec: 0.0,
        eta: None,
        reconnecting: Some(crate::hub::Reconnecting {
            attempt: 2,
            attempts: 5,
            after: std::time::Duration::from_secs(1),
            reason: "connection reset by peer".into(),
        }),
    }));
    let mut harness = Harness::builder()
        .with_size([1100.0, 720.0])
        .build_ui_state(
            |ui, app: &mut SmolchatApp| app.show(ui),
            SmolchatApp::new(state),
        );
    harness.step();
    assert!(
        harness
            .query_by_label_contains("Reconnecting in 1 s, attempt 2 of 5")
            .is_some()
    );
}

#[test]
fn a_long_title_or_a_folder_does_not_widen_the_list_and_rename_is_a_button() {
    let (mut harness, engine, _dir) = window();
    harness.state_mut().execute(Action::Send("Hello".into()));
    answer(&mut harness, &engine, "Hi");
    harness
        .state_mut()
        .execute(Action::Rename(0, "word ".repeat(60)));
    harness.step();
    harness.step();
    let delete = harness.get_by_label("Delete conversation");
    assert!(delete.rect().right() < 280.0, "{:?}", delete.rect());
    // Nor does a folder's indent.
    let unfiled = delete.rect().right();
    harness
        .state_mut()
        .execute(Action::MoveToFolder(0, Some("Work".into())));
    harness.step();
    harness.step();
    let filed = harness.get_by_label("Delete conversation").rect().right();
    assert!(filed <= unfiled + 0.5, "widened from {unfiled} to {filed}");

    harness.get_by_label("Rename conversation").click();
    harness.step();
    harness.step();
    assert!(harness.query_by_label("Conversation title").is_some());
}

#[test]
fn save_as_asks_the_desktop_where_starting_from_the_exports_folder() {
    let (mut harness, _engine, _dir) = window();
    harness.state_mut().execute(UiCommand::ExportJsonAs);
    let suggested = harness
        .state()
        .state()
        .export_path(crate::ui::ExportFormat::Json);
    assert_eq!(
        harness.state().view().dialog_requested,
        Some(crate::ui::file_dialog::Pick::Export {
            format: crate::ui::ExportFormat::Json,
            suggested,
        })
    );
}

/// Mesa's software rasterizers by the names they give, and hardware drivers not.
#[test]
fn software_opengl_is_told_by_the_renderer_name() {
    for software in [
        "llvmpipe (LLVM 19.1.7, 256 bits)",
        "softpipe",
        "Software Rasterizer (swrast)",
    ] {
        assert!(super::is_software_renderer(software), "{software}");
    }
    for hardware in [
        "NVIDIA GeForce RTX 4070/PCIe/SSE2",
        "AMD Radeon Graphics (radeonsi, gfx1103)",
        "Mesa Intel(R) UHD Graphics 620",
    ] {
        assert!(!super::is_software_renderer(hardware), "{hardware}");
    }
}

/// A focused text field asks for frames to blink its cursor, except where frames are drawn
/// sparingly (software OpenGL).
#[test]
fn drawn_sparingly_a_focused_text_field_asks_for_no_frames() {
    let next_frame_after = |sparing: bool| {
        let ctx = egui::Context::default();
        if sparing {
            super::draw_sparingly(&ctx);
        }
        let mut text = String::from("draft");
        let mut delay = std::time::Duration::ZERO;
        for _ in 0..3 {
            let mut output = ctx.run_ui(egui::RawInput::default(), |ui| {
                ui.text_edit_singleline(&mut text).request_focus();
            });
            output.textures_delta.clear();
            delay = output.viewport_output[&egui::ViewportId::ROOT].repaint_delay;
        }
        delay
    };
    assert!(next_frame_after(false) < std::time::Duration::from_secs(1));
    assert_eq!(next_frame_after(true), std::time::Duration::MAX);
}

/// Under a user's message, laid out right to left, the switcher read "› 2/2 ‹".
#[test]
fn an_edited_messages_switcher_reads_left_to_right() {
    let (mut harness, engine, _dir) = window();
    harness
        .state_mut()
        .execute(Action::Send("Name a colour.".into()));
    answer(&mut harness, &engine, "Blue.");
    harness
        .state_mut()
        .execute(Action::EditAndResend(0, "Name a bird.".into()));
    answer(&mut harness, &engine, "A robin.");
    harness.step();
    let previous = harness.get_by_label("\u{2039}").rect();
    let count = harness.get_by_label("2/2").rect();
    let next = harness.get_by_label("\u{203a}").rect();
    assert!(
        previous.right() <= count.left() && count.right() <= next.left(),
        "{previous:?} {count:?} {next:?}"
    );
}

/// In a narrow window the status bar broke its figures apart ("decode" at the end of a row,
/// "1.2 tok/s" on the next): each figure is now a label of one line.
#[test]
fn the_status_bars_figures_each_stay_on_one_line() {
    let (mut harness, engine, _dir) = window_of_size([560.0, 600.0]);
    harness.state_mut().execute(Action::Send("Hello".into()));
    answer(&mut harness, &engine, "Hi");
    harness.step();
    let live = crate::ui::scripted_engine::stats(1);
    let stats = crate::store::MessageStats::from_generation(&live.generation, live.resident_bytes);
    let one_line = harness.get_by_label("Charts").rect().height() * 1.5;
    for (index, figure) in crate::ui::chat_view::stats_figures(&stats)
        .iter()
        .enumerate()
    {
        let label = match index {
            0 => figure.clone(),
            _ => format!("\u{b7} {figure}"),
        };
        let rect = harness.get_by_label(&label).rect();
        assert!(rect.height() < one_line, "{label}: {rect:?}");
    }
}

/// A chat's Presets list named no preset after one was picked: it now shows the one the
/// chat's system prompt is.
#[test]
fn the_presets_list_shows_the_preset_a_chat_uses() {
    let (mut harness, _engine, _dir) = window();
    let brief = "Answer in one short sentence.";
    harness
        .state_mut()
        .execute(Action::SetSystemPrompt(brief.into()));
    harness
        .state_mut()
        .execute(Action::SavePreset("Brief".into()));
    harness
        .state_mut()
        .execute(Action::SetSystemPrompt("Answer as a pirate.".into()));
    harness.step();
    harness.get_by_label_contains("System prompt:").click();
    harness.run();
    let shown =
        |harness: &Harness<'static, SmolchatApp>| harness.get_by_role(A11y::ComboBox).value();
    assert_eq!(shown(&harness).as_deref(), Some("choose\u{2026}"));
    harness
        .state_mut()
        .execute(Action::SetSystemPrompt(brief.into()));
    harness.run();
    assert_eq!(
        shown(&harness).as_deref(),
        Some("Brief"),
        "the list names the preset"
    );
}

/// The shortcuts sheet ran past the bottom of an 800x600 window, its last rows out of reach.
#[test]
fn the_shortcuts_sheet_fits_a_small_window() {
    let (mut harness, _engine, _dir) = window_of_size([800.0, 600.0]);
    harness.key_press(Key::F1);
    harness.step();
    harness.step();
    for (_, what) in crate::ui::commands::WIDGET_KEYS {
        let row = harness.get_by_label(what).rect();
        assert!(
            row.bottom() <= 600.0 && row.right() <= 800.0,
            "{what}: {row:?}"
        );
    }
    let first = harness
        .get_by_label(UiCommand::RegenerateLast.label())
        .rect();
    assert!(first.top() >= 0.0, "{first:?}");
}

/// Under software rendering a wheel's notch scrolls in the frame it arrives; egui's easing
/// spread it over about 7 frames of a long chat.
#[test]
fn in_software_a_wheel_notch_scrolls_in_one_frame() {
    let first_frame_scroll = |software: bool| {
        let ctx = egui::Context::default();
        let mut input = egui::RawInput::default();
        input.events.push(egui::Event::MouseWheel {
            unit: egui::MouseWheelUnit::Line,
            delta: egui::vec2(0.0, -1.0),
            phase: egui::TouchPhase::Move,
            source: egui::MouseWheelSource::Wheel,
            modifiers: Modifiers::NONE,
        });
        if software {
            super::wheel_without_easing(&mut input);
        }
        let mut scrolled = 0.0;
        let mut output = ctx.run_ui(input, |ui| scrolled = ui.input(|i| i.smooth_scroll_delta.y));
        output.textures_delta.clear();
        scrolled
    };
    let notch = egui::InputOptions::default().line_scroll_speed;
    assert!(
        first_frame_scroll(false) > -notch * 0.9,
        "egui eases a notch"
    );
    assert_eq!(first_frame_scroll(true), -notch);
}

/// Ctrl+K gives the keyboard to the list's search box; what is typed there lists the chats
/// that hold it, with the words around it, and a click opens one and ends the search.
#[test]
fn ctrl_k_finds_a_chat_by_its_words_and_a_click_opens_it() {
    let (mut harness, engine, _dir) = window();
    two_chats(&mut harness, &engine);
    assert_eq!(harness.state().state().current().title, "A haiku");

    harness.key_press_modifiers(Modifiers::COMMAND, Key::K);
    harness.step();
    harness.step();
    let search = harness.get_by_role_and_label(A11y::TextInput, "Search chats");
    assert!(
        search.is_focused(),
        "Ctrl+K gives the search box the keyboard"
    );
    search.type_text("PARIS");
    harness.step();
    harness.step();
    assert_eq!(
        harness.query_all_by_label(LIST_BUTTON).count(),
        0,
        "the hits replace the list"
    );
    let hit = harness.get_by_label_contains("Paris is the capital.");
    hit.click();
    harness.step();
    harness.step();
    assert_eq!(
        harness.state().state().current().title,
        "Capital of France?"
    );
    // Esc in the box ends a search too.
    harness.key_press_modifiers(Modifiers::COMMAND, Key::K);
    harness.step();
    harness
        .get_by_role_and_label(A11y::TextInput, "Search chats")
        .type_text("rain");
    harness.step();
    assert_eq!(harness.query_all_by_label(LIST_BUTTON).count(), 0);
    harness.key_press(Key::Escape);
    harness.step();
    harness.step();
    assert_eq!(
        harness.query_all_by_label(LIST_BUTTON).count(),
        2,
        "the search ended: both chats listed"
    );
}

/// Two answered chats, "Capital of France?" and "A haiku", the second the current one.
fn two_chats(harness: &mut Harness<'static, SmolchatApp>, engine: &ScriptedEngine) {
    for (asked, answered) in [
        ("Capital of France?", "Paris is the capital."),
        ("A haiku", "Rain falls"),
    ] {
        harness.state_mut().execute(UiCommand::NewConversation);
        harness.state_mut().execute(Action::Send(asked.into()));
        answer(harness, engine, answered);
    }
}

/// Presses at `from`, moves to `to` over a few frames (past egui's drag threshold) and lets go.
fn drag(harness: &mut Harness<'static, SmolchatApp>, from: egui::Pos2, to: egui::Pos2) {
    harness.hover_at(from);
    harness.step();
    harness.drag_at(from);
    harness.step();
    for step in 1..=4 {
        harness.hover_at(from + (to - from) * (step as f32 / 4.0));
        harness.step();
    }
    harness.drop_at(to);
    harness.step();
    harness.step();
}

#[test]
fn chats_are_filed_in_folders_by_dragging_or_from_their_menu() {
    let (mut harness, engine, _dir) = window();
    two_chats(&mut harness, &engine);
    let index_of = |harness: &Harness<'static, SmolchatApp>, title: &str| {
        let conversations = harness.state().state().conversations();
        conversations
            .iter()
            .position(|conversation| conversation.title == title)
            .unwrap()
    };
    let haiku = index_of(&harness, "A haiku");
    harness
        .state_mut()
        .execute(Action::MoveToFolder(haiku, Some("Work".into())));
    harness.step();
    let title = |harness: &Harness<'static, SmolchatApp>, title: &str| {
        harness
            .get_by_role_and_label(A11y::Button, title)
            .rect()
            .center()
    };
    let from = title(&harness, "Capital of France?");
    let folder = harness.get_by_label_contains("Work").rect().center();
    drag(&mut harness, from, folder);
    let capital = index_of(&harness, "Capital of France?");
    assert_eq!(
        harness.state().state().conversations()[capital]
            .folder
            .as_deref(),
        Some("Work"),
        "dropped on the folder"
    );

    // Below the folder's chats, where the chats in no folder go.
    let lowest = harness
        .get_by_role_and_label(A11y::Button, "Capital of France?")
        .rect()
        .bottom()
        .max(
            harness
                .get_by_role_and_label(A11y::Button, "A haiku")
                .rect()
                .bottom(),
        );
    let from = title(&harness, "Capital of France?");
    drag(&mut harness, from, egui::pos2(from.x, lowest + 20.0));
    let capital = index_of(&harness, "Capital of France?");
    let conversations = harness.state().state().conversations();
    assert_eq!(
        conversations[capital].folder, None,
        "dropped below the folder"
    );
    let haiku = index_of(&harness, "A haiku");
    assert_eq!(conversations[haiku].folder.as_deref(), Some("Work"));

    // A title that can be dragged still opens on a click and shows its menu on a right-click.
    harness
        .get_by_role_and_label(A11y::Button, "Capital of France?")
        .click();
    harness.step();
    harness.step();
    assert_eq!(
        harness.state().state().current().title,
        "Capital of France?"
    );
    harness
        .get_by_role_and_label(A11y::Button, "Capital of France?")
        .click_secondary();
    harness.step();
    harness.step();
    // Its menu files it in a new folder named there: the field takes a click and Enter.
    harness.get_by_label("Move to folder").hover();
    harness.step();
    harness.step();
    harness
        .get_by_role_and_label(A11y::TextInput, "New folder")
        .click();
    harness.step();
    harness
        .get_by_role_and_label(A11y::TextInput, "New folder")
        .type_text("Geography");
    harness.step();
    harness.key_press(Key::Enter);
    harness.step();
    harness.step();
    let capital = index_of(&harness, "Capital of France?");
    assert_eq!(
        harness.state().state().conversations()[capital]
            .folder
            .as_deref(),
        Some("Geography"),
        "filed in the folder named in its menu"
    );
    assert!(
        harness.query_by_label("Move to folder").is_none(),
        "the menu closed"
    );
}

/// A long chat draws only the messages on screen (a 500-message chat took tens of
/// milliseconds a frame): the others keep their room, and scrolling to them draws them.
#[test]
fn a_long_chat_draws_only_the_messages_on_screen() {
    let dir = tempfile::tempdir().unwrap();
    let mut chat = Conversation::new();
    for i in 0..100 {
        chat.messages.push(StoredMessage::new(
            Role::User,
            format!("Question number {i}"),
        ));
        chat.messages.push(StoredMessage::new(
            Role::Assistant,
            format!("Answer number {i}:\n\n- a list\n- of **points**\n\n```\ncode {i}\n```"),
        ));
    }
    ConversationStore::new(Paths::under(dir.path()).conversations_dir())
        .save(&chat)
        .unwrap();
    let (mut harness, _engine, _dir) = window_in(dir, [1100.0, 720.0]);
    assert_eq!(harness.state().state().current().messages.len(), 200);
    harness.step();
    harness.step();
    assert!(
        harness.query_by_label("Question number 99").is_some(),
        "the chat opens at its end"
    );
    assert!(
        harness.query_by_label("Question number 0").is_none(),
        "the first message is far off screen, not drawn"
    );
    let drawn = (0..100)
        .filter(|i| {
            harness
                .query_by_label(&format!("Question number {i}"))
                .is_some()
        })
        .count();
    assert!(drawn < 10, "{drawn} of 100 questions drawn");
    let bottom = harness.get_by_label("Question number 99").rect().center();
    harness.hover_at(bottom);
    harness.event(egui::Event::MouseWheel {
        unit: egui::MouseWheelUnit::Page,
        delta: egui::vec2(0.0, 1000.0),
        phase: egui::TouchPhase::Move,
        source: egui::MouseWheelSource::Unknown,
        modifiers: Modifiers::NONE,
    });
    for _ in 0..60 {
        harness.step();
    }
    assert!(
        harness.query_by_label("Question number 0").is_some(),
        "scrolled to the top, the first message is drawn"
    );
}

#[test]
fn the_api_address_stays_on_one_row_and_a_click_copies_it() {
    let (mut harness, _engine, _dir) = window_of_size([1000.0, 700.0]);
    let mut settings = harness.state().state().settings().clone();
    settings.server.enabled = true;
    settings.server.port = 0;
    harness
        .state_mut()
        .execute(Action::UpdateSettings(settings));
    harness.step();
    let crate::ui::local_server::ServerStatus::Serving(address) = *harness.state().state().server()
    else {
        panic!("not serving: {:?}", harness.state().state().server());
    };
    let label = format!("API :{}", address.port());
    let row = harness.get_by_label("Charts").rect().height();
    let height = harness.get_by_label(&label).rect().height();
    assert!(
        height < 1.5 * row,
        "{label} takes {height} points, a row {row}"
    );
    harness.get_by_label(&label).click();
    harness.step();
    let copied = harness
        .output()
        .platform_output
        .commands
        .iter()
        .any(|command| *command == egui::OutputCommand::CopyText(format!("http://{address}/v1")));
    assert!(copied, "clicking {label} copies the address");
}

#[test]
fn the_memory_for_conversations_is_a_whole_context_until_the_user_sets_tokens() {
    let (mut harness, engine, _dir) = window();
    harness.key_press_modifiers(Modifiers::COMMAND, Key::Comma);
    harness.step();
    harness.step();
    assert!(
        harness.query_by_label_contains("up to").is_some(),
        "what it takes"
    );
    assert_eq!(
        harness
            .query_all_by_label(labels::CONVERSATION_MEMORY)
            .count(),
        1
    );
    harness.get_by_label("One full context").click();
    harness.step();
    // The scripted model's context, now a number of tokens the slider changes.
    assert_eq!(harness.state().state().settings().kv_budget, Some(2048));
    assert!(
        engine
            .commands()
            .iter()
            .any(|command| matches!(command, Command::SetKvBudget(Some(2048))))
    );
    // The heading and, now, the slider it names.
    assert_eq!(
        harness
            .query_all_by_label(labels::CONVERSATION_MEMORY)
            .count(),
        2
    );
}
