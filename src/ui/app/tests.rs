//! The whole window against a scripted engine, driven by keys and clicks as a user would.

use egui::accesskit::Role as A11y;
use egui::{Key, Modifiers};
use egui_kittest::Harness;
use egui_kittest::kittest::Queryable;
use tempfile::TempDir;

use super::SmolchatApp;
use crate::engine::Event;
use crate::store::Paths;
use crate::text::ChatMessage;
use crate::ui::commands::Action;
use crate::ui::scripted_engine::{ScriptedEngine, model_info};
use crate::ui::{AppState, labels};

/// The window with a model loaded, the script that serves it, and its data folder.
fn window() -> (Harness<'static, SmolchatApp>, ScriptedEngine, TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let (handle, engine) = ScriptedEngine::new();
    let mut state = AppState::new(Paths::under(dir.path()), handle);
    let folder = dir.path().join("model");
    std::fs::create_dir_all(&folder).unwrap();
    std::fs::write(folder.join("config.json"), "{}").unwrap();
    assert!(state.apply(Action::UseModelFolder(folder.clone())));
    engine.send(Event::ModelReady(model_info(&folder)));
    engine.commands();
    let mut harness = Harness::builder()
        .with_size([1100.0, 720.0])
        .build_ui_state(
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
    assert!(harness.state().state().settings().show_settings);
    assert!(harness.query_by_label("Settings").is_some());
    harness.key_press_modifiers(Modifiers::COMMAND, Key::Comma);
    harness.step();
    harness.step();
    assert!(!harness.state().state().settings().show_settings);
    assert!(harness.query_by_label("Settings").is_none());
}

fn type_message(harness: &mut Harness<'static, SmolchatApp>, text: &str) {
    harness
        .get_by_role_and_label(A11y::MultilineTextInput, labels::MESSAGE_INPUT)
        .type_text(text);
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
