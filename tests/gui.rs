//! The window driven through its accessible widgets, with the real engine and the tiny
//! random-weight checkpoint (gibberish replies, real tokens).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use egui::{Key, accesskit::Role as A11y};
use egui_kittest::Harness;
use egui_kittest::kittest::{NodeT, Queryable};
use smolchat::backend::BackendKind;
use smolchat::engine::EngineHandle;
use smolchat::generation::FinishReason;
use smolchat::store::{Paths, Settings, Theme};
use smolchat::text::Role;
use smolchat::ui::{
    Action, AppState, ExportFormat, ModelStatus, ServerStatus, SmolchatApp, UiCommand, labels,
};

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-smollm")
}

fn configure(paths: &Paths, max_new_tokens: usize) {
    // The settings panel open, for the tests that move its sliders, and the token view on, so
    // that each reply keeps its tokens for the tests to count.
    let settings = Settings {
        model_folder: Some(fixture()),
        max_new_tokens,
        show_settings: true,
        show_token_probabilities: true,
        ..Settings::default()
    };
    settings.save(&paths.settings_file()).unwrap();
}

fn harness(paths: &Paths) -> Harness<'static, SmolchatApp> {
    let engine = EngineHandle::spawn(|| {}).unwrap();
    let app = SmolchatApp::new(AppState::new(paths.clone(), engine));
    // Replies may hold any token: CJK, emoji, a replacement character for a cut-off byte.
    // The app draws a box for a glyph its fonts lack (egui's default), so the tests do too
    // instead of kittest's panic.
    Harness::builder()
        .with_size([1100.0, 720.0])
        .allow_missing_glyphs()
        .build_ui_state(|ui, app: &mut SmolchatApp| app.show(ui), app)
}

/// Steps the UI until `done` holds, failing after two minutes: the first reply on the GPU
/// backend under a software Vulkan driver waits ~40 s for its kernels to compile.
fn wait_until(
    harness: &mut Harness<'_, SmolchatApp>,
    what: &str,
    done: impl Fn(&SmolchatApp) -> bool,
) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        harness.step();
        if done(harness.state()) {
            return;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn send(harness: &mut Harness<'_, SmolchatApp>, text: &str) {
    wait_until(harness, "the model", |app| app.state().model_ready());
    harness
        .get_by_role_and_label(A11y::MultilineTextInput, labels::MESSAGE_INPUT)
        .focus();
    harness.step();
    harness
        .get_by_role_and_label(A11y::MultilineTextInput, labels::MESSAGE_INPUT)
        .type_text(text);
    harness.step();
    harness.key_press(Key::Enter);
    harness.step();
}

fn last_reply(app: &SmolchatApp) -> &smolchat::store::StoredMessage {
    let message = app.state().current().messages.last().unwrap();
    assert_eq!(message.role, Role::Assistant);
    message
}

#[test]
fn enter_sends_and_the_reply_streams_in_with_stats() {
    let dir = tempfile::tempdir().unwrap();
    let paths = Paths::under(dir.path());
    configure(&paths, 24);
    // A fixed seed, so that the reply's tokens are the same each run: a random one can end
    // on a character's first bytes, which the token view then shows as one more token.
    let (mut settings, _) = Settings::load(&paths.settings_file());
    settings.seed_mode = smolchat::store::SeedMode::Fixed;
    settings.save(&paths.settings_file()).unwrap();
    let mut harness = harness(&paths);
    send(&mut harness, "Hello there");
    assert!(harness.state().state().is_generating());
    assert_eq!(harness.state().view().input, "", "the input box is cleared");
    wait_until(&mut harness, "the reply", |app| {
        !app.state().is_generating()
    });
    let app = harness.state();
    assert_eq!(app.state().current().messages[0].content, "Hello there");
    let reply = last_reply(app);
    let record = reply.generation.as_ref().unwrap();
    assert!(!reply.content.is_empty());
    assert_eq!(record.finish_reason, Some(FinishReason::MaxTokens));
    assert_eq!(record.tokens.len(), 24);
    let stats = record.stats.as_ref().unwrap();
    assert_eq!(stats.generated_tokens, 24);
    assert!(stats.decode_tokens_per_second.is_some());
    harness.step();
    assert!(harness.query_all_by_label_contains("TTFT").count() > 0);
}

#[test]
fn stop_ends_the_reply_and_no_more_tokens_arrive() {
    let dir = tempfile::tempdir().unwrap();
    let paths = Paths::under(dir.path());
    configure(&paths, 2000);
    let mut harness = harness(&paths);
    send(&mut harness, "Tell me a long story");
    wait_until(&mut harness, "the first tokens", |app| {
        !last_reply(app).content.is_empty()
    });
    harness.get_by_label(labels::STOP).click();
    wait_until(&mut harness, "the stop", |app| !app.state().is_generating());
    let tokens = last_reply(harness.state())
        .generation
        .as_ref()
        .unwrap()
        .tokens
        .len();
    let record = last_reply(harness.state()).generation.clone().unwrap();
    assert_eq!(record.finish_reason, Some(FinishReason::Stopped));
    assert!(tokens < 2000);
    for _ in 0..10 {
        harness.step();
        std::thread::sleep(Duration::from_millis(10));
    }
    let after = &last_reply(harness.state())
        .generation
        .as_ref()
        .unwrap()
        .tokens;
    assert_eq!(after.len(), tokens);
}

#[test]
fn sliders_change_what_the_next_reply_uses() {
    let dir = tempfile::tempdir().unwrap();
    let paths = Paths::under(dir.path());
    configure(&paths, 4);
    let mut harness = harness(&paths);
    harness
        .get_by_role_and_label(A11y::Slider, labels::TEMPERATURE)
        .set_value_accesskit(0.0);
    harness.step();
    harness
        .get_by_role_and_label(A11y::Slider, labels::TOP_P)
        .set_value_accesskit(0.5);
    harness.step();
    send(&mut harness, "Hi");
    wait_until(&mut harness, "the reply", |app| {
        !app.state().is_generating()
    });
    let record = last_reply(harness.state()).generation.clone().unwrap();
    assert_eq!(record.sampling.temperature, 0.0);
    assert_eq!(record.sampling.top_p, 0.5);
    let saved = Settings::load(&paths.settings_file()).0;
    assert_eq!(saved.sampling.temperature, 0.0);
    assert_eq!(saved.sampling.top_p, 0.5);
}

#[test]
fn on_the_gpu_backend_the_status_bar_names_the_adapter_and_its_memory() {
    let dir = tempfile::tempdir().unwrap();
    let paths = Paths::under(dir.path());
    let settings = Settings {
        model_folder: Some(fixture()),
        max_new_tokens: 4,
        backend: BackendKind::Gpu,
        show_token_probabilities: true,
        ..Settings::default()
    };
    settings.save(&paths.settings_file()).unwrap();
    let mut harness = harness(&paths);
    send(&mut harness, "Hi");
    wait_until(&mut harness, "the reply", |app| {
        !app.state().is_generating()
    });
    let ModelStatus::Ready(info) = harness.state().state().model() else {
        panic!("the model is not ready");
    };
    assert_eq!(info.options.backend, BackendKind::Gpu);
    assert_eq!(info.backend_fallback, None);
    assert!(info.description.ends_with("(gpu)"), "{}", info.description);
    let description = info.description.clone();
    let reply = last_reply(harness.state());
    assert_eq!(reply.generation.as_ref().unwrap().tokens.len(), 4);
    harness.step();
    assert_eq!(harness.query_all_by_label(&description).count(), 1);
    assert!(harness.query_all_by_label_contains("GPU memory").count() > 0);
}

#[test]
fn a_saved_conversation_reloads_after_restart() {
    let dir = tempfile::tempdir().unwrap();
    let paths = Paths::under(dir.path());
    configure(&paths, 8);
    let before = {
        let mut harness = harness(&paths);
        send(&mut harness, "Remember me");
        wait_until(&mut harness, "the reply", |app| {
            !app.state().is_generating()
        });
        harness.state().state().current().clone()
    };
    let mut harness = harness(&paths);
    harness.step();
    assert_eq!(harness.state().state().current(), &before);
    // Both the conversation's title and the message itself.
    assert_eq!(harness.query_all_by_label("Remember me").count(), 2);
}

#[test]
fn without_a_model_the_first_run_screen_offers_download_and_folder() {
    let dir = tempfile::tempdir().unwrap();
    let paths = Paths::under(dir.path());
    let mut harness = harness(&paths);
    harness.step();
    harness.get_by_label(labels::NO_MODEL_HEADING);
    harness.get_by_label(labels::DOWNLOAD_DEFAULT);
    harness
        .get_by_role_and_label(A11y::TextInput, labels::MODEL_FOLDER)
        .focus();
    harness.step();
    harness
        .get_by_label(labels::MODEL_FOLDER)
        .type_text(&fixture().display().to_string());
    harness.step();
    harness.get_by_label(labels::USE_FOLDER).click();
    wait_until(&mut harness, "the model", |app| app.state().model_ready());
    let saved = Settings::load(&paths.settings_file()).0;
    assert_eq!(saved.model_folder, Some(fixture()));
}

#[test]
fn regenerate_edit_and_resend_export_and_undo_delete() {
    let dir = tempfile::tempdir().unwrap();
    let paths = Paths::under(dir.path());
    configure(&paths, 8);
    let mut harness = harness(&paths);
    send(&mut harness, "First question");
    wait_until(&mut harness, "the first reply", |app| {
        !app.state().is_generating()
    });
    let first_seed = last_reply(harness.state())
        .generation
        .as_ref()
        .unwrap()
        .sampling
        .seed;

    harness.get_by_label("Regenerate").click();
    harness.step();
    wait_until(&mut harness, "the regenerated reply", |app| {
        !app.state().is_generating() && app.state().current().messages.len() == 2
    });
    let regenerated = last_reply(harness.state()).generation.as_ref().unwrap();
    assert_eq!(regenerated.finish_reason, Some(FinishReason::MaxTokens));
    assert_ne!(
        regenerated.sampling.seed, first_seed,
        "a random seed is drawn per reply"
    );

    harness.get_by_label("Edit").click();
    harness.step();
    harness.step();
    let draft = harness.get_by_role_and_label(A11y::MultilineTextInput, "Edit message");
    draft.focus();
    draft.type_text(" (edited)");
    harness.step();
    harness.get_by_label("Resend").click();
    harness.step();
    wait_until(&mut harness, "the reply to the edit", |app| {
        !app.state().is_generating() && app.state().current().messages.len() == 2
    });
    assert_eq!(
        harness.state().state().current().messages[0].content,
        "First question (edited)"
    );
    assert!(!last_reply(harness.state()).content.is_empty());

    harness.state_mut().execute(UiCommand::ExportMarkdown);
    let markdown = harness.state().state().export_path(ExportFormat::Markdown);
    let text = std::fs::read_to_string(&markdown).unwrap();
    assert!(text.contains("First question (edited)"), "{text}");
    harness.state_mut().execute(UiCommand::ExportJson);
    let json = harness.state().state().export_path(ExportFormat::Json);
    let exported: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(exported["messages"].as_array().map(Vec::len), Some(2));

    let id = harness.state().state().current().id.clone();
    let file = harness.state().state().conversation_path(&id);
    let index = harness.state().state().current_index();
    harness.state_mut().execute(Action::Delete(index));
    harness.step();
    let listed = |app: &SmolchatApp| app.state().conversations().iter().any(|c| c.id == id);
    assert!(!listed(harness.state()));
    assert!(!file.exists(), "a delete removes the file");
    harness.state_mut().execute(Action::UndoDelete);
    harness.step();
    assert!(listed(harness.state()), "undo brings the conversation back");
    assert!(file.is_file(), "undo saves it again");
}

/// Presses `key` with Ctrl (as Linux reports it: both `ctrl` and `command`) and more.
fn press_with_ctrl(harness: &mut Harness<'_, SmolchatApp>, key: Key, shift: bool) {
    let modifiers = egui::Modifiers {
        ctrl: true,
        command: true,
        shift,
        ..Default::default()
    };
    harness.key_press_modifiers(modifiers, key);
    harness.step();
}

/// No mouse: Edit's box has the keyboard at once and Ctrl+Enter resends it; Ctrl+Tab,
/// Ctrl+Shift+Tab and Ctrl+1…9 move between chats; F2 opens the title; F1 the sheet of
/// shortcuts; the View menu's switches show whether they are on.
#[test]
fn chats_are_edited_switched_and_renamed_from_the_keyboard() {
    let dir = tempfile::tempdir().unwrap();
    let paths = Paths::under(dir.path());
    configure(&paths, 4);
    let mut harness = harness(&paths);
    send(&mut harness, "Question");
    wait_until(&mut harness, "the reply", |app| {
        !app.state().is_generating()
    });

    harness.get_by_label("Edit").click();
    harness.step();
    harness.step();
    let draft = harness.get_by_role_and_label(A11y::MultilineTextInput, "Edit message");
    assert!(draft.is_focused(), "Edit gives its box the keyboard");
    draft.type_text(" again");
    harness.step();
    press_with_ctrl(&mut harness, Key::Enter, false);
    wait_until(&mut harness, "the reply to the edit", |app| {
        !app.state().is_generating() && app.state().current().messages.len() == 2
    });
    assert_eq!(
        harness.state().state().current().messages[0].content,
        "Question again",
        "Ctrl+Enter resent the edit without a new line"
    );

    // An empty chat is reused by New chat: the second gets a message first.
    harness.state_mut().execute(UiCommand::NewConversation);
    send(&mut harness, "Second");
    wait_until(&mut harness, "the second reply", |app| {
        !app.state().is_generating()
    });
    harness.state_mut().execute(UiCommand::NewConversation);
    harness.step();
    assert_eq!(harness.state().state().conversations().len(), 3);
    assert_eq!(harness.state().state().current_index(), 0);
    press_with_ctrl(&mut harness, Key::Tab, false);
    assert_eq!(harness.state().state().current_index(), 1);
    press_with_ctrl(&mut harness, Key::Tab, true);
    press_with_ctrl(&mut harness, Key::Tab, true);
    assert_eq!(harness.state().state().current_index(), 2, "wraps around");
    press_with_ctrl(&mut harness, Key::Num2, false);
    assert_eq!(harness.state().state().current_index(), 1);

    // What is typed and not sent stays with its chat.
    let message_box = |harness: &Harness<'_, SmolchatApp>| {
        harness
            .get_by_role_and_label(A11y::MultilineTextInput, labels::MESSAGE_INPUT)
            .focus();
    };
    message_box(&harness);
    harness.step();
    harness
        .get_by_role_and_label(A11y::MultilineTextInput, labels::MESSAGE_INPUT)
        .type_text("not sent yet");
    harness.step();
    press_with_ctrl(&mut harness, Key::Tab, false);
    assert_eq!(harness.state().view().input, "");
    press_with_ctrl(&mut harness, Key::Tab, true);
    assert_eq!(harness.state().view().input, "not sent yet");

    harness.key_press(Key::F2);
    harness.step();
    harness.step();
    let title = harness.get_by_role_and_label(A11y::TextInput, "Conversation title");
    assert!(title.is_focused(), "F2 gives the title field the keyboard");
    title.type_text(" renamed");
    harness.step();
    harness.key_press(Key::Enter);
    harness.step();
    assert!(
        harness
            .state()
            .state()
            .current()
            .title
            .ends_with(" renamed"),
        "{}",
        harness.state().state().current().title
    );

    // Delete on a focused chat in the list deletes it; "Undo delete" brings it back.
    let before = harness.state().state().conversations().len();
    harness.get_by_label("Question").focus();
    harness.step();
    harness.key_press(Key::Delete);
    harness.step();
    assert_eq!(harness.state().state().conversations().len(), before - 1);
    harness.get_by_label("Undo delete").click();
    harness.step();
    assert_eq!(harness.state().state().conversations().len(), before);

    harness.get_by_label("View").click();
    harness.run_steps(3);
    let toggled = |command: UiCommand| {
        let node = harness.get_by_role_and_label(A11y::MenuItemCheckBox, command.label());
        format!("{:?}", node.accesskit_node().toggled())
    };
    let theme = harness.state().state().settings().theme;
    for (command, on) in [
        (UiCommand::ThemeSystem, theme == Theme::System),
        (UiCommand::ThemeLight, theme == Theme::Light),
        (UiCommand::ThemeDark, theme == Theme::Dark),
        (UiCommand::ToggleSettings, true),
    ] {
        let expected = if on { "Some(True)" } else { "Some(False)" };
        assert_eq!(toggled(command), expected, "{command:?}");
    }
    harness.key_press(Key::Escape);
    harness.step();
    harness.key_press(Key::F1);
    harness.step();
    // Only on the sheet: a widget's own key beside the commands'.
    harness.get_by_label("Resend an edited message");
    harness.key_press(Key::Escape);
    harness.step();
    assert!(
        harness.query_by_label("Resend an edited message").is_none(),
        "Esc closes the sheet"
    );
}

/// `POST /v1/completions` with `body`, over a plain socket; the whole response.
fn post_completion(address: std::net::SocketAddr, body: &serde_json::Value) -> String {
    use std::io::{Read, Write};
    let body = body.to_string();
    let mut stream = std::net::TcpStream::connect(address).unwrap();
    write!(
        stream,
        "POST /v1/completions HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    response
}

/// The replies of a two-turn chat with a fixed seed, and with `serve` the switch on and an
/// API completion asked for while the first reply streams, then again once all is quiet.
fn two_turns_in_the_window(serve: bool) -> (Vec<String>, Option<(String, String)>) {
    let dir = tempfile::tempdir().unwrap();
    let paths = Paths::under(dir.path());
    let mut settings = Settings {
        model_folder: Some(fixture()),
        max_new_tokens: 48,
        seed_mode: smolchat::store::SeedMode::Fixed,
        show_settings: true,
        ..Settings::default()
    };
    settings.sampling.seed = 7;
    settings.server.port = 0;
    settings.save(&paths.settings_file()).unwrap();
    let mut harness = harness(&paths);
    wait_until(&mut harness, "the model", |app| app.state().model_ready());
    let mut address = None;
    if serve {
        harness
            .get_by_role_and_label(A11y::CheckBox, labels::SERVE_ON_LOCALHOST)
            .click();
        harness.step();
        let ServerStatus::Serving(serving) = *harness.state().state().server() else {
            panic!("not serving: {:?}", harness.state().state().server());
        };
        address = Some(serving);
    }
    let request = serde_json::json!({
        "model": "tiny-smollm", "prompt": "Once upon a time", "max_tokens": 16, "temperature": 0
    });
    send(&mut harness, "Hello there");
    wait_until(&mut harness, "the first tokens", |app| {
        !last_reply(app).content.is_empty()
    });
    let during = address.map(|address| {
        let request = request.clone();
        std::thread::spawn(move || post_completion(address, &request))
    });
    assert!(
        harness.state().state().is_generating(),
        "the API request is made while the window's reply streams"
    );
    wait_until(&mut harness, "the first reply", |app| {
        !app.state().is_generating()
    });
    let first = last_reply(harness.state()).content.clone();
    send(&mut harness, "Tell me more");
    wait_until(&mut harness, "the second reply", |app| {
        !app.state().is_generating()
    });
    let second = last_reply(harness.state()).content.clone();
    let api = during.zip(address).map(|(during, address)| {
        let during = during.join().unwrap();
        (during, post_completion(address, &request))
    });
    (vec![first, second], api)
}

#[test]
fn serving_on_localhost_answers_while_the_window_streams_and_changes_neither_reply() {
    let (alone, none) = two_turns_in_the_window(false);
    assert!(none.is_none());
    let (served, api) = two_turns_in_the_window(true);
    assert_eq!(
        served, alone,
        "the window's replies are those it gives without the server"
    );
    let (during, quiet) = api.unwrap();
    assert!(during.starts_with("HTTP/1.1 200"), "{during}");
    let text = |response: &str| {
        let body = response.split("\r\n\r\n").nth(1).unwrap_or_default();
        let json: serde_json::Value = serde_json::from_str(body).unwrap();
        json["choices"][0]["text"].as_str().unwrap().to_string()
    };
    assert!(!text(&during).is_empty());
    assert_eq!(
        text(&during),
        text(&quiet),
        "the API's answer does not depend on the chat"
    );
}
