//! The state against a scripted engine: the commands it sends and what it makes of the events
//! played back, without a model.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use tempfile::TempDir;

use super::hub_search::tests::unreachable_hub;
use super::{AppState, ModelStatus};
use crate::backend::BackendKind;
use crate::downloads::DownloadState;
use crate::engine::{Command, EngineError, Event, ModelInfo, RequestId};
use crate::generation::{FinishReason, PromptProgress};
use crate::model::LoadProgress;
use crate::model_source::ModelSource;
use crate::store::{ConversationStore, Paths, SeedMode, Settings, StoredMessage};
use crate::text::{ChatMessage, Role, SamplingParams};
use crate::ui::commands::{Action, DialogFor, UiCommand};
use crate::ui::local_server::ServerStatus;
use crate::ui::scripted_engine::{Requested, ScriptedEngine, model_info, stats, token};

struct Fixture {
    state: AppState,
    engine: ScriptedEngine,
    dir: TempDir,
}

impl Fixture {
    /// A fresh data folder and no model yet.
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let (handle, engine) = ScriptedEngine::new();
        let state = AppState::new(Paths::under(dir.path()), handle);
        Self { state, engine, dir }
    }

    fn ready() -> Self {
        let mut fixture = Self::new();
        let info = model_info(&fixture.model_dir());
        fixture.load(info);
        fixture
    }

    /// Chooses the model folder and answers the load with `info`.
    fn load(&mut self, info: ModelInfo) {
        let folder = self.model_dir();
        std::fs::create_dir_all(&folder).unwrap();
        std::fs::write(folder.join("config.json"), "{}").unwrap();
        std::fs::write(folder.join("model.safetensors"), "").unwrap();
        assert!(self.state.apply(Action::UseModelFolder(folder)));
        self.play([Event::ModelReady(info)]);
        assert!(matches!(
            self.engine.commands().as_slice(),
            [Command::LoadModel { .. }]
        ));
    }

    fn model_dir(&self) -> PathBuf {
        self.dir.path().join("model")
    }

    fn play(&mut self, events: impl IntoIterator<Item = Event>) {
        for event in events {
            self.engine.send(event);
        }
        self.state.poll();
    }

    /// Sends `text` and returns the request the engine received.
    fn send(&mut self, text: &str) -> Requested {
        assert!(self.state.apply(Action::Send(text.into())));
        self.engine.generate_request()
    }

    /// Streams `tokens` into request `id` and finishes it.
    fn reply(&mut self, id: RequestId, tokens: &[&str], reason: FinishReason) {
        let mut events: Vec<Event> = tokens
            .iter()
            .map(|text| Event::Token {
                request: id,
                token: token(text),
            })
            .collect();
        events.push(Event::Finished {
            request: id,
            reason,
            text: String::new(),
            stats: stats(tokens.len()),
        });
        self.play(events);
    }

    fn last_message(&self) -> &StoredMessage {
        self.state.current().messages.last().unwrap()
    }

    /// The current conversation as its file holds it.
    fn saved(&self) -> crate::store::Conversation {
        let path = self.state.conversation_path(&self.state.current().id);
        ConversationStore::load_file(&path).unwrap().0
    }
}

#[test]
fn a_sent_message_streams_into_the_reply_which_is_saved_when_finished() {
    let mut f = Fixture::ready();
    let mut settings = f.state.settings().clone();
    settings.system_prompt = "Be brief.".into();
    settings.max_new_tokens = 7;
    settings.show_token_probabilities = true;
    assert!(f.state.apply(Action::UpdateSettings(settings)));

    let request = f.send("  Hello  ");
    assert_eq!(
        request.messages,
        [ChatMessage::system("Be brief."), ChatMessage::user("Hello")]
    );
    assert_eq!(request.max_new_tokens, Some(7));
    assert!(f.state.is_generating());
    assert_eq!(f.state.streaming_message(), Some(1));
    assert_eq!(f.state.current().title, "Hello");

    f.play([
        Event::PromptProcessed {
            request: request.id,
            stats: stats(0).generation,
            dropped_messages: 0,
        },
        Event::Token {
            request: request.id,
            token: token("Hi"),
        },
        Event::Token {
            request: request.id,
            token: token(" there"),
        },
        Event::Stats {
            request: request.id,
            stats: stats(2),
        },
    ]);
    assert_eq!(f.last_message().content, "Hi there");
    assert_eq!(f.state.history().len(), 1);
    f.play([Event::Finished {
        request: request.id,
        reason: FinishReason::StopToken,
        text: "!".into(),
        stats: stats(3),
    }]);

    assert!(!f.state.is_generating());
    let reply = f.last_message();
    assert_eq!(reply.role, Role::Assistant);
    assert_eq!(reply.content, "Hi there!");
    let record = reply.generation.as_ref().unwrap();
    assert_eq!(record.finish_reason, Some(FinishReason::StopToken));
    assert_eq!(record.sampling, request.sampling);
    let texts: Vec<&str> = record.tokens.iter().map(|t| t.text.as_str()).collect();
    assert_eq!(texts, ["Hi", " there", "!"]);
    assert_eq!(record.stats.as_ref().unwrap().generated_tokens, 3);
    assert_eq!(&f.saved(), f.state.current());
}

#[test]
fn token_alternatives_are_saved_only_for_the_token_view() {
    let mut f = Fixture::ready();
    // A reply as a small model writes one: about 4 characters a token.
    let words = "To keep a starter alive over a long weekend, feed it, let it rise for an hour, \
                 then put it in the fridge. ";
    let reply: Vec<&str> = words.split_inclusive(' ').cycle().take(150).collect();
    for _ in 0..3 {
        let request = f.send("How do I keep a sourdough starter alive over a long weekend?");
        f.reply(request.id, &reply, FinishReason::StopToken);
    }
    let record = f.last_message().generation.clone().unwrap();
    assert!(record.tokens.is_empty(), "the token view is off by default");
    let text: usize = f
        .state
        .current()
        .messages
        .iter()
        .map(|message| message.content.len())
        .sum();
    let path = f.state.conversation_path(&f.state.current().id);
    let saved = std::fs::metadata(&path).unwrap().len() as usize;
    assert!(saved <= 3 * text, "{saved} bytes saved for {text} of text");

    // Turned on mid-reply, the view waits for the next reply: the tokens it keeps spell all
    // of the reply they belong to.
    let request = f.send("And for a week?");
    f.play([Event::Token {
        request: request.id,
        token: token("Feed"),
    }]);
    assert!(f.state.apply(UiCommand::ToggleTokenView));
    f.reply(request.id, &[" it", " twice."], FinishReason::StopToken);
    assert!(
        f.last_message()
            .generation
            .as_ref()
            .unwrap()
            .tokens
            .is_empty()
    );
    let request = f.send("Thanks!");
    f.reply(
        request.id,
        &["You", "'re", " welcome."],
        FinishReason::StopToken,
    );
    let texts: Vec<String> = f
        .saved()
        .messages
        .last()
        .unwrap()
        .generation
        .as_ref()
        .unwrap()
        .tokens
        .iter()
        .map(|token| token.text.clone())
        .collect();
    assert_eq!(texts, ["You", "'re", " welcome."]);

    // A reply whose first token is a character's first byte, held back until it is whole.
    let request = f.send("And in Japanese?");
    f.reply(request.id, &["", "日本", "語"], FinishReason::StopToken);
    let record = f.last_message().generation.as_ref().unwrap();
    let texts: Vec<&str> = record.tokens.iter().map(|t| t.text.as_str()).collect();
    assert_eq!(texts, ["", "日本", "語"]);
}

#[test]
fn a_reasoning_reply_counts_its_thinking_without_the_token_view() {
    let mut f = Fixture::ready();
    let request = f.send("Is 7 prime?");
    let reply = [
        "<think>", "\n", "No", " divisor", ".", "\n", "</think>", "\n\n", "Yes.",
    ];
    f.reply(request.id, &reply, FinishReason::StopToken);
    let record = f
        .saved()
        .messages
        .last()
        .unwrap()
        .generation
        .clone()
        .unwrap();
    assert!(record.tokens.is_empty(), "the token view is off");
    assert_eq!(record.thinking_tokens, 7, "saved with the chat");
}

#[test]
fn stop_sets_the_stopper_and_a_stopped_reply_keeps_its_text() {
    let mut f = Fixture::ready();
    let request = f.send("Tell me a story");
    f.play([Event::Token {
        request: request.id,
        token: token("Once"),
    }]);
    assert!(!f.engine.is_cancelled(request.id));

    assert!(!f.state.stopping());
    assert!(f.state.apply(UiCommand::StopGeneration));
    assert!(f.engine.is_cancelled(request.id));
    assert!(f.state.is_generating(), "until the engine says it stopped");
    assert!(
        f.state.stopping(),
        "the window says Stop was heard meanwhile"
    );
    f.play([Event::Finished {
        request: request.id,
        reason: FinishReason::Stopped,
        text: String::new(),
        stats: stats(1),
    }]);

    assert!(!f.state.is_generating());
    assert!(!f.state.stopping());
    let reply = f.last_message();
    assert_eq!(reply.content, "Once");
    let record = reply.generation.as_ref().unwrap();
    assert_eq!(record.finish_reason, Some(FinishReason::Stopped));
    assert_eq!(&f.saved(), f.state.current());
}

#[test]
fn regenerate_replays_the_conversation_without_the_last_reply() {
    let mut f = Fixture::ready();
    let first = f.send("Hello");
    f.reply(first.id, &["Hi"], FinishReason::StopToken);
    let second = f.send("And again?");
    f.reply(second.id, &["Sure"], FinishReason::StopToken);

    assert!(f.state.apply(UiCommand::RegenerateLast));
    let request = f.engine.generate_request();
    assert_eq!(
        request.messages,
        [
            ChatMessage::user("Hello"),
            ChatMessage::assistant("Hi"),
            ChatMessage::user("And again?")
        ]
    );
    assert_ne!(request.id, second.id);
    assert_eq!(f.state.current().messages.len(), 4);
    assert_eq!(f.last_message().content, "");
    assert_eq!(f.state.streaming_message(), Some(3));
}

#[test]
fn edit_and_resend_keeps_the_old_branch_as_a_version_of_the_message() {
    let mut f = Fixture::ready();
    let first = f.send("Hello");
    f.reply(first.id, &["Hi"], FinishReason::StopToken);
    let second = f.send("Tell me more");
    f.reply(second.id, &["More"], FinishReason::StopToken);

    assert!(
        !f.state
            .apply(Action::EditAndResend(1, "not a user message".into()))
    );
    assert!(
        f.state
            .apply(Action::EditAndResend(0, "Good morning".into()))
    );
    let request = f.engine.generate_request();
    assert_eq!(request.messages, [ChatMessage::user("Good morning")]);
    assert_eq!(f.state.current().messages.len(), 2);
    assert!(
        !f.state.apply(Action::ShowVariant(0, 0)),
        "not while the reply is written"
    );
    f.reply(request.id, &["Morning!"], FinishReason::StopToken);

    // The first version comes back with everything that followed it, and goes again.
    let shown = |f: &Fixture| -> Vec<String> {
        let messages = &f.state.current().messages;
        messages.iter().map(|m| m.content.clone()).collect()
    };
    assert_eq!(f.state.current().messages[0].variant_count(), 2);
    assert!(f.state.apply(Action::ShowVariant(0, 0)));
    assert_eq!(shown(&f), ["Hello", "Hi", "Tell me more", "More"]);
    assert_eq!(&f.saved(), f.state.current());
    assert!(f.state.apply(Action::ShowVariant(0, 1)));
    assert_eq!(shown(&f), ["Good morning", "Morning!"]);
    assert!(
        !f.state.apply(Action::ShowVariant(0, 2)),
        "there is no third"
    );

    // A reply regenerated in mid-chat keeps the turns after it the same way.
    assert!(f.state.apply(Action::ShowVariant(0, 0)));
    assert!(
        f.state
            .apply(Action::EditAndResend(2, "Tell me less".into()))
    );
    let third = f.engine.generate_request();
    f.reply(third.id, &["Less"], FinishReason::StopToken);
    assert_eq!(shown(&f), ["Hello", "Hi", "Tell me less", "Less"]);
    assert!(f.state.apply(Action::ShowVariant(0, 1)));
    assert!(f.state.apply(Action::ShowVariant(0, 0)));
    assert_eq!(shown(&f), ["Hello", "Hi", "Tell me less", "Less"]);
    assert!(f.state.apply(Action::ShowVariant(2, 0)));
    assert_eq!(shown(&f), ["Hello", "Hi", "Tell me more", "More"]);
}

#[test]
fn a_fork_is_a_new_chat_with_the_conversation_up_to_a_message() {
    let mut f = Fixture::ready();
    assert!(f.state.apply(Action::SetSystemPrompt("Be brief.".into())));
    let first = f.send("Hello");
    f.reply(first.id, &["Hi"], FinishReason::StopToken);
    let second = f.send("Tell me more");
    f.reply(second.id, &["More"], FinishReason::StopToken);
    let source = f.state.current().clone();

    assert!(!f.state.apply(Action::Fork(4)), "there is no fifth message");
    assert!(f.state.apply(Action::Fork(1)));
    let fork = f.state.current().clone();
    assert_ne!(fork.id, source.id);
    assert_eq!(fork.title, "Hello (fork)");
    assert_eq!(fork.messages, source.messages[..2]);
    assert_eq!(fork.system_prompt.as_deref(), Some("Be brief."));
    assert_eq!(f.saved(), fork);
    // The chat it came from is as it was.
    assert_eq!(f.state.conversations().len(), 2);
    assert!(f.state.conversations().contains(&source));

    let third = f.send("Something else");
    assert_eq!(
        third.messages,
        [
            ChatMessage::system("Be brief."),
            ChatMessage::user("Hello"),
            ChatMessage::assistant("Hi"),
            ChatMessage::user("Something else")
        ]
    );
}

#[test]
fn a_message_sent_while_a_reply_is_written_is_refused_with_a_notice() {
    let mut f = Fixture::ready();
    f.send("Hello");
    assert!(!f.state.apply(Action::Send("Are you there?".into())));
    assert!(f.engine.commands().is_empty());
    assert_eq!(f.state.current().messages.len(), 2);
    assert_eq!(
        f.state.notices(),
        ["A reply is still being written; stop it first (Esc)."]
    );
}

#[test]
fn without_a_model_nothing_is_sent() {
    let mut f = Fixture::new();
    assert!(!f.state.apply(Action::Send("Hello".into())));
    assert!(f.engine.commands().is_empty());
    assert!(f.state.current().messages.is_empty());
    assert_eq!(f.state.notices(), ["No model is loaded yet."]);
}

#[test]
fn a_busy_engine_removes_the_placeholder_and_asks_to_send_again() {
    let mut f = Fixture::ready();
    let request = f.send("Hello");
    f.play([Event::Busy {
        refused: request.id,
    }]);
    assert!(!f.state.is_generating());
    assert_eq!(
        f.state.current().messages,
        [StoredMessage::new(Role::User, "Hello")]
    );
    assert_eq!(f.state.notices(), ["The engine was busy; send again."]);
    assert_eq!(&f.saved(), f.state.current());
}

/// What the user is shown about problems: the banner, and the first-run screen's reason.
fn shown_problems(state: &AppState) -> Vec<String> {
    let mut shown = state.errors().to_vec();
    if let ModelStatus::Failed(reason) = state.model() {
        shown.push(reason.clone());
    }
    shown
}

/// Fails a download of the default model with `error`; returns what is shown.
fn failed_load(error: EngineError) -> Vec<String> {
    let mut f = Fixture::new();
    assert!(f.state.apply(Action::DownloadDefaultModel));
    assert!(matches!(
        f.engine.commands().as_slice(),
        [Command::LoadModel {
            source: ModelSource::Hub(_),
            ..
        }]
    ));
    f.play([Event::Error {
        request: None,
        error,
    }]);
    assert!(matches!(f.state.model(), ModelStatus::Failed(_)));
    shown_problems(&f.state)
}

/// Fails a generation with `error`; returns what is shown.
fn failed_generation(error: EngineError) -> Vec<String> {
    let mut f = Fixture::ready();
    let request = f.send("Hello");
    f.play([Event::Error {
        request: Some(request.id),
        error,
    }]);
    assert!(!f.state.is_generating());
    assert_eq!(
        f.state.current().messages.len(),
        1,
        "the empty reply is removed"
    );
    assert!(f.state.model_ready());
    shown_problems(&f.state)
}

fn assert_advises(shown: &[String], advice: &str) {
    assert!(
        shown.iter().any(|problem| problem.contains(advice)),
        "{advice:?} not in {shown:?}"
    );
}

#[test]
fn a_missing_or_broken_model_folder_advises_another_folder() {
    let path = PathBuf::from("/models/smol");
    let advice = "Choose another model folder in the settings, or download the default model.";
    assert_advises(
        &failed_load(EngineError::ModelNotFound { path: path.clone() }),
        advice,
    );
    let broken = failed_load(EngineError::ModelLoad {
        path,
        reason: "bad header".into(),
    });
    assert_advises(&broken, "bad header");
    assert_advises(&broken, advice);
}

/// Offline, the first-run screen said it in six lines: the hub's message for the command
/// line (cache folder, HF_ENDPOINT, "(os error 111)"), then the window's advice again.
#[test]
fn a_failed_download_advises_checking_the_network() {
    let hub = crate::hub::HubError::Offline {
        model_id: "HuggingFaceTB/SmolLM2-135M-Instruct".into(),
        endpoint: "https://huggingface.co".into(),
        cache_dir: "/home/someone/.cache/huggingface/hub".into(),
        reason: "io: Connection refused (os error 111)".into(),
    };
    let error = EngineError::from_hub("HuggingFaceTB/SmolLM2-135M-Instruct", hub);
    let shown = failed_load(error);
    assert_advises(&shown, "Connection refused");
    assert_advises(&shown, "Check the network connection");
    let text = shown.join("\n");
    for noise in ["os error", "HF_ENDPOINT", ".cache"] {
        assert!(!text.contains(noise), "{text}");
    }
    assert_eq!(text.matches("network").count(), 1, "{text}");
    assert!(text.len() < 200, "{} characters: {text}", text.len());
}

#[test]
fn a_stopped_download_advises_starting_it_again() {
    let shown = failed_load(EngineError::DownloadStopped {
        model: "HuggingFaceTB/SmolLM2-135M-Instruct".into(),
    });
    assert_advises(&shown, "Start the download again when you are ready.");
}

#[test]
fn generating_without_a_model_advises_getting_one() {
    let shown = failed_generation(EngineError::NoModel);
    assert_advises(
        &shown,
        "Download the default model or choose a model folder first.",
    );
}

/// The notice that old turns were left out belongs to its chat: a new chat does not show it,
/// going back does, and it leaves on its own after its time (it used to stay for good).
#[test]
fn a_notice_about_a_chat_shows_with_that_chat_and_leaves_after_its_time() {
    let mut f = Fixture::ready();
    let request = f.send("Hello");
    f.play([Event::PromptProcessed {
        request: request.id,
        stats: stats(0).generation,
        dropped_messages: 2,
    }]);
    f.reply(request.id, &["Hi"], FinishReason::StopToken);
    let left_out = "2 oldest messages did not fit the context and were left out of the prompt.";
    assert_eq!(f.state.notices(), [left_out]);
    // Kept with the reply, for the conversation's marker where the model's view began.
    let saved = f.saved();
    assert_eq!(saved.messages[1].generation.as_ref().unwrap().left_out, 2);
    assert!(f.state.apply(UiCommand::NewConversation));
    assert!(f.state.notices().is_empty(), "{:?}", f.state.notices());
    assert!(f.state.apply(Action::Select(1)));
    assert_eq!(f.state.notices(), [left_out]);
    assert!(f.state.next_notice_change().is_some());

    let mut f = Fixture::ready();
    f.state = f.state.with_notice_lifetime(std::time::Duration::ZERO);
    assert!(f.state.apply(Action::Command(UiCommand::ExportMarkdown)));
    assert!(f.state.notices().is_empty(), "{:?}", f.state.notices());
    assert_eq!(f.state.next_notice_change(), None);
}

#[test]
fn a_full_context_advises_a_new_chat_or_dropping_old_turns() {
    let advice = "Start a new chat, or set the overflow policy to drop old turns.";
    assert_advises(
        &failed_generation(EngineError::ContextFull {
            needed: 3000,
            limit: 2048,
        }),
        advice,
    );
    assert_advises(
        &failed_generation(EngineError::PromptTooLong {
            prompt: 2048,
            limit: 2048,
        }),
        advice,
    );
}

#[test]
fn invalid_sampling_advises_fixing_the_settings() {
    let shown = failed_generation(EngineError::InvalidSampling {
        reason: "top-p must be in (0, 1]".into(),
    });
    assert_advises(&shown, "top-p must be in (0, 1]");
    assert_advises(&shown, "Fix it in the settings panel and send again.");
}

#[test]
fn a_failed_generation_advises_trying_again() {
    let advice = "Try again; if it keeps happening, restart smolchat.";
    for error in [
        EngineError::Prompt {
            reason: "template".into(),
        },
        EngineError::Generation {
            reason: "NaN logits".into(),
        },
        EngineError::Internal,
    ] {
        assert_advises(&failed_generation(error), advice);
    }
}

#[test]
fn an_error_after_some_tokens_keeps_the_partial_reply() {
    let mut f = Fixture::ready();
    let request = f.send("Hello");
    f.play([
        Event::Token {
            request: request.id,
            token: token("Hal"),
        },
        Event::Error {
            request: Some(request.id),
            error: EngineError::Internal,
        },
    ]);
    assert!(!f.state.is_generating());
    assert_eq!(f.last_message().content, "Hal");
    assert_eq!(&f.saved(), f.state.current());
}

#[test]
fn delete_removes_the_file_and_undo_brings_it_back() {
    let mut f = Fixture::ready();
    let first = f.send("First");
    f.reply(first.id, &["One"], FinishReason::StopToken);
    assert!(f.state.apply(UiCommand::NewConversation));
    let second = f.send("Second");
    f.reply(second.id, &["Two"], FinishReason::StopToken);
    let deleted = f.state.conversations()[1].clone();
    let file = f.state.conversation_path(&deleted.id);
    assert!(file.is_file());

    assert!(f.state.apply(Action::Delete(1)));
    assert!(!file.exists());
    assert_eq!(f.state.conversations().len(), 1);
    assert_eq!(f.state.current().title, "Second");
    assert_eq!(f.state.notices(), ["Deleted \u{201c}First\u{201d}."]);
    assert!(f.state.can_undo_delete());

    assert!(f.state.apply(Action::UndoDelete));
    assert!(file.is_file());
    assert_eq!(f.state.conversations()[1], deleted);
    assert_eq!(f.state.current().title, "Second");
    assert!(f.state.notices().is_empty());
    assert!(!f.state.can_undo_delete());
    assert!(f.state.trash().is_empty());
}

/// Deleted chats wait in the trash across a restart, each restored to its place or deleted
/// for good; the trash takes the chat's place and the library's.
#[test]
fn deleted_chats_wait_in_the_trash_across_a_restart() {
    let mut f = Fixture::ready();
    let first = f.send("First");
    f.reply(first.id, &["One"], FinishReason::StopToken);
    for text in ["Second", "Third"] {
        assert!(f.state.apply(UiCommand::NewConversation));
        let request = f.send(text);
        f.reply(request.id, &["Two"], FinishReason::StopToken);
    }
    let first = f.state.conversations()[2].clone();
    assert!(f.state.apply(Action::Delete(2)));
    assert!(f.state.apply(Action::Delete(1)));
    let titles = |trash: &[crate::store::Trashed]| {
        trash
            .iter()
            .map(|t| t.conversation.title.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(titles(f.state.trash()), ["Second", "First"]);

    let (handle, _engine) = ScriptedEngine::new();
    let mut state = AppState::new(Paths::under(f.dir.path()), handle);
    assert_eq!(state.conversations().len(), 1);
    assert_eq!(titles(state.trash()), ["Second", "First"]);
    assert!(
        !state.can_undo_delete(),
        "undo is for this run's last deletion"
    );
    assert!(state.apply(UiCommand::ToggleLibrary));
    assert!(state.apply(UiCommand::ToggleTrash));
    assert!(state.trash_open() && !state.library_open());

    assert!(state.apply(Action::Restore(first.id.clone())));
    assert_eq!(state.conversations()[1], first, "back in its place");
    assert!(state.trash_open(), "one is left in it");
    assert_eq!(state.current().title, "Third");
    assert!(state.apply(Action::DeleteForever(
        state.trash()[0].conversation.id.clone()
    )));
    assert!(state.trash().is_empty());
    assert!(!state.trash_open(), "an empty trash closes");
    assert!(!state.apply(Action::EmptyTrash), "nothing left to empty");

    let (handle, _engine) = ScriptedEngine::new();
    let state = AppState::new(Paths::under(f.dir.path()), handle);
    let titles: Vec<&str> = state
        .conversations()
        .iter()
        .map(|c| c.title.as_str())
        .collect();
    assert_eq!(titles, ["Third", "First"]);
    assert!(state.trash().is_empty());
}

#[test]
fn the_conversation_being_written_cannot_be_deleted() {
    let mut f = Fixture::ready();
    f.send("Hello");
    let file = f.state.conversation_path(&f.state.current().id);
    assert!(!f.state.apply(Action::Delete(0)));
    assert!(file.is_file());
    assert_eq!(f.state.conversations().len(), 1);
    assert!(!f.state.can_undo_delete());
    assert_eq!(
        f.state.notices(),
        ["Stop the reply before deleting its conversation."]
    );
}

#[test]
fn a_gpu_fallback_and_a_missing_chat_template_are_both_noticed() {
    let mut f = Fixture::new();
    let info = ModelInfo {
        name: "model".into(),
        fallback_template: true,
        thinking_switch: false,
        backend_fallback: Some("no GPU adapter found".into()),
        ..model_info(&f.model_dir())
    };
    f.load(info);
    assert_eq!(
        f.state.notices(),
        [
            "This model folder has no chat template; the ChatML template is used.",
            "GPU: no GPU adapter found."
        ]
    );
    assert!(f.state.apply(Action::DismissNotice(0)));
    assert_eq!(f.state.notices(), ["GPU: no GPU adapter found."]);
}

#[test]
fn another_backend_reloads_the_model_and_is_saved() {
    let mut f = Fixture::ready();
    let mut settings = f.state.settings().clone();
    settings.backend = BackendKind::Ndarray;
    assert!(f.state.apply(Action::UpdateSettings(settings.clone())));
    match f.engine.commands().as_slice() {
        [
            Command::LoadModel {
                source: ModelSource::Folder(folder),
                options,
                ..
            },
        ] => {
            assert_eq!(folder, &f.model_dir());
            assert_eq!(options.backend, BackendKind::Ndarray);
        }
        other => panic!("expected one LoadModel, got {other:?}"),
    }
    assert!(matches!(f.state.model(), ModelStatus::Loading { .. }));
    let saved = crate::store::Settings::load(&Paths::under(f.dir.path()).settings_file());
    assert_eq!(saved, (settings, None));
}

#[test]
fn loading_shows_how_many_layers_are_read_until_the_model_is_ready() {
    let mut f = Fixture::ready();
    let folder = f.model_dir();
    let progress = |layers_read| LoadProgress {
        layers_read,
        layers: 28,
    };
    // A late report of the last load does not turn a ready model back into a loading one.
    f.play([Event::LoadProgress(progress(28))]);
    assert!(f.state.model_ready());
    assert!(f.state.apply(Action::UseModelFolder(folder.clone())));
    f.play([
        Event::Loading {
            dir: folder.clone(),
            memory: None,
        },
        Event::LoadProgress(progress(1)),
        Event::LoadProgress(progress(12)),
    ]);
    assert_eq!(
        f.state.model(),
        &ModelStatus::Loading {
            dir: folder.clone(),
            memory: None,
            progress: Some(progress(12)),
        }
    );
    f.play([Event::ModelReady(model_info(&folder))]);
    assert!(f.state.model_ready());
}

#[test]
fn a_mistyped_folder_is_named_and_the_loaded_model_stays() {
    let mut f = Fixture::ready();
    let typo = f.dir.path().join("modle");
    assert!(!f.state.apply(Action::UseModelFolder(typo.clone())));
    assert!(f.engine.commands().is_empty(), "the engine was not asked");
    assert!(f.state.model_ready());
    assert_eq!(f.state.settings().model_folder, Some(f.model_dir()));
    assert_advises(
        f.state.errors(),
        &format!("{} does not exist", typo.display()),
    );
    let empty = f.dir.path().join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    assert!(!f.state.apply(Action::UseModelFolder(empty.clone())));
    assert_advises(
        &f.state.errors()[1..],
        &format!(
            "{} is neither a .gguf file nor a folder with config.json",
            empty.display()
        ),
    );
    // A download that stopped after the config is told apart from a wrong folder.
    std::fs::write(empty.join("config.json"), "{}").unwrap();
    assert!(!f.state.apply(Action::UseModelFolder(empty.clone())));
    assert_advises(
        &f.state.errors()[2..],
        &format!("{} has config.json but no weights", empty.display()),
    );
    assert!(f.engine.commands().is_empty(), "the engine was not asked");
}

#[test]
fn a_download_error_is_shown_once_and_gone_when_a_model_loads() {
    let mut f = Fixture::new();
    assert!(f.state.apply(Action::DownloadDefaultModel));
    f.play([Event::Error {
        request: None,
        error: EngineError::Download {
            model: "HuggingFaceTB/SmolLM2-135M-Instruct".into(),
            reason: "connection refused".into(),
            unreachable: Some("Connection refused".into()),
        },
    }]);
    let shown = shown_problems(&f.state);
    assert_eq!(shown.len(), 1, "{shown:?}");
    assert_advises(&shown, "Check the network connection");

    let info = model_info(&f.model_dir());
    f.play([Event::ModelReady(info)]);
    assert!(f.state.model_ready());
    assert_eq!(shown_problems(&f.state), Vec::<String>::new());
}

/// What `GET path` on `address` answers first: its status line.
fn status_line(address: std::net::SocketAddr, path: &str) -> std::io::Result<String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(address)?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n"
    )?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    Ok(response.lines().next().unwrap_or_default().to_string())
}

fn with_server(state: &AppState, change: impl FnOnce(&mut crate::store::ServerSettings)) -> Action {
    let mut settings = state.settings().clone();
    change(&mut settings.server);
    Action::UpdateSettings(settings)
}

#[test]
fn the_server_switch_serves_the_loaded_model_and_stops() {
    let mut f = Fixture::new();
    let on = with_server(&f.state, |server| {
        server.enabled = true;
        server.port = 0;
    });
    assert!(f.state.apply(on));
    assert_eq!(*f.state.server(), ServerStatus::WaitingForModel);

    let info = model_info(&f.model_dir());
    f.load(info);
    let ServerStatus::Serving(address) = *f.state.server() else {
        panic!("not serving: {:?}", f.state.server());
    };
    assert!(address.ip().is_loopback());
    assert_eq!(
        status_line(address, "/v1/models").unwrap(),
        "HTTP/1.1 200 OK"
    );
    let saved = crate::store::Settings::load(&Paths::under(f.dir.path()).settings_file()).0;
    assert!(saved.server.enabled, "the switch is remembered");

    assert!(f.state.apply(UiCommand::ToggleServer));
    assert_eq!(*f.state.server(), ServerStatus::Off);
    assert!(
        status_line(address, "/v1/models").is_err(),
        "still listening"
    );
}

#[test]
fn a_server_address_that_cannot_serve_says_why() {
    let mut f = Fixture::ready();
    let typo = with_server(&f.state, |server| {
        server.enabled = true;
        server.host = "127.0.0.1.5".into();
    });
    f.state.apply(typo);
    let ServerStatus::Failed(reason) = f.state.server() else {
        panic!("{:?}", f.state.server());
    };
    assert!(
        reason.contains("\u{201c}127.0.0.1.5\u{201d} is not an IP address"),
        "{reason}"
    );

    let open = with_server(&f.state, |server| server.host = "0.0.0.0".into());
    f.state.apply(open);
    let ServerStatus::Failed(reason) = f.state.server() else {
        panic!("{:?}", f.state.server());
    };
    assert!(reason.contains("set an API key"), "{reason}");
}

#[test]
fn figures_of_another_conversation_or_model_are_not_shown() {
    let mut f = Fixture::ready();
    let request = f.send("Hello");
    f.reply(request.id, &["Hi"], FinishReason::StopToken);
    assert!(f.state.live().is_some());
    assert!(f.state.apply(UiCommand::NewConversation));
    assert!(
        f.state.live().is_none(),
        "the last reply's figures followed to a new chat"
    );

    assert!(f.state.apply(Action::Select(1)));
    let request = f.send("Again");
    f.play([Event::Stats {
        request: request.id,
        stats: stats(2),
    }]);
    f.reply(request.id, &["Hi", "!"], FinishReason::StopToken);
    assert!(f.state.live().is_some());
    assert!(!f.state.history().is_empty());
    let info = model_info(&f.model_dir());
    f.play([Event::ModelReady(info)]);
    assert!(
        f.state.live().is_none(),
        "figures of the previous model stayed"
    );
    assert!(f.state.history().is_empty());
}

#[test]
fn the_draft_and_window_size_are_remembered() {
    let mut f = Fixture::new();
    assert!(f.state.apply(Action::RememberWindow {
        size: Some([900.0, 640.0]),
        draft: "unsent".into(),
    }));
    let (handle, _engine) = ScriptedEngine::new();
    let again = AppState::new(Paths::under(f.dir.path()), handle);
    assert_eq!(again.current().draft, "unsent");
    assert_eq!(again.settings().window_size, Some([900.0, 640.0]));
}

/// A draft stays with the chat it was typed in: switching chats and restarting bring it back
/// there, not into whichever chat is open (a restart used to put it in the newest).
#[test]
fn an_unsent_message_stays_with_its_chat() {
    let mut f = Fixture::ready();
    let request = f.send("First chat");
    f.reply(request.id, &["Hi"], FinishReason::StopToken);
    let first = f.state.current().id.clone();
    assert!(f.state.apply(UiCommand::NewConversation));
    assert!(f.state.apply(Action::KeepDraft {
        conversation: first.clone(),
        draft: "half a thought".into(),
    }));
    assert_eq!(f.state.current().draft, "");
    assert!(f.state.apply(Action::Select(1)));
    assert_eq!(f.state.current().id, first);
    assert_eq!(f.state.current().draft, "half a thought");
    assert!(f.state.apply(Action::RememberWindow {
        size: None,
        draft: "half a thought, longer".into(),
    }));
    let (handle, _engine) = ScriptedEngine::new();
    let again = AppState::new(Paths::under(f.dir.path()), handle);
    let kept = again
        .conversations()
        .iter()
        .find(|c| c.id == first)
        .unwrap();
    assert_eq!(kept.draft, "half a thought, longer");
    assert_eq!(again.settings().draft, "", "no longer the app's");
    // Sending it clears it.
    let request = f.send("half a thought, longer");
    assert_eq!(f.state.current().draft, "");
    f.reply(request.id, &["Ok"], FinishReason::StopToken);
    assert_eq!(f.saved().draft, "");
}

#[test]
fn regenerate_keeps_the_earlier_reply_as_a_variant() {
    let mut f = Fixture::ready();
    let first = f.send("Name a fruit");
    f.reply(first.id, &["Apple"], FinishReason::StopToken);
    assert!(f.state.apply(UiCommand::RegenerateLast));
    let second = f.engine.generate_request();
    assert_eq!(second.messages, [ChatMessage::user("Name a fruit")]);
    f.reply(second.id, &["Pear"], FinishReason::StopToken);
    let reply = f.last_message().clone();
    assert_eq!(
        (reply.content.as_str(), reply.variant, reply.variant_count()),
        ("Pear", 1, 2)
    );

    assert!(f.state.apply(UiCommand::PreviousReply));
    assert_eq!(f.last_message().content, "Apple");
    assert!(
        !f.state.apply(UiCommand::PreviousReply),
        "Apple is the first"
    );
    assert!(f.state.apply(UiCommand::NextReply));
    assert_eq!(f.last_message().content, "Pear");
    assert!(!f.state.apply(UiCommand::NextReply), "there is no third");
    assert!(f.state.apply(UiCommand::PreviousReply));
    let saved = f.saved();
    assert_eq!(saved.messages[1].content, "Apple");
    assert_eq!(saved.messages[1].other_variants[0].content, "Pear");

    // The next message is a reply to the variant shown.
    let next = f.send("Another");
    assert_eq!(next.messages[1], ChatMessage::assistant("Apple"));
}

#[test]
fn continue_extends_a_stopped_reply() {
    let mut f = Fixture::ready();
    assert!(f.state.apply(UiCommand::ToggleTokenView));
    let first = f.send("Tell a story");
    assert!(
        !f.state.apply(UiCommand::ContinueLast),
        "nothing to continue while it runs"
    );
    f.reply(first.id, &["Once", " upon"], FinishReason::Stopped);
    assert!(f.state.apply(UiCommand::ContinueLast));
    let more = f.engine.generate_request();
    assert_eq!(
        more.messages,
        [
            ChatMessage::user("Tell a story"),
            ChatMessage::assistant("Once upon")
        ]
    );
    f.reply(more.id, &[" a", " time"], FinishReason::StopToken);
    let reply = f.last_message();
    assert_eq!(reply.content, "Once upon a time");
    let record = reply.generation.as_ref().unwrap();
    assert_eq!(record.finish_reason, Some(FinishReason::StopToken));
    assert_eq!(record.tokens.len(), 4);
    assert_eq!(f.state.current().messages.len(), 2);

    assert!(
        !f.state.apply(UiCommand::ContinueLast),
        "a finished reply does not continue"
    );
}

#[test]
fn each_chat_has_its_own_system_prompt_over_the_default() {
    let mut f = Fixture::ready();
    let mut settings = f.state.settings().clone();
    settings.system_prompt = "Be brief.".into();
    assert!(f.state.apply(Action::UpdateSettings(settings)));
    assert_eq!(f.state.system_prompt(), "Be brief.");
    assert!(
        f.state
            .apply(Action::SetSystemPrompt("Answer in French.".into()))
    );
    let request = f.send("Hello");
    assert_eq!(
        request.messages[0],
        ChatMessage::system("Answer in French.")
    );
    f.reply(request.id, &["Bonjour"], FinishReason::StopToken);
    assert_eq!(
        f.saved().system_prompt.as_deref(),
        Some("Answer in French.")
    );

    assert!(f.state.apply(UiCommand::NewConversation));
    assert_eq!(
        f.state.system_prompt(),
        "Be brief.",
        "a new chat starts from the default"
    );
}

/// A reasoning model's thinking is a per-chat switch that reaches the template; a reply's
/// thinking goes back to the template apart from its answer.
#[test]
fn each_chat_can_turn_a_reasoning_models_thinking_off() {
    let mut f = Fixture::ready();
    let request = f.send("Hello");
    assert!(
        request.template_variables.is_empty(),
        "the template's default"
    );
    f.reply(
        request.id,
        &["<think>", "\nA greeting.\n", "</think>", "\n\nHi!"],
        FinishReason::StopToken,
    );
    assert!(f.state.apply(Action::SetThinking(false)));
    assert_eq!(f.saved().thinking, Some(false));
    let request = f.send("Again");
    assert_eq!(
        request.template_variables["enable_thinking"],
        serde_json::json!(false)
    );
    let reply = request
        .messages
        .iter()
        .find(|message| message.role == Role::Assistant);
    assert_eq!(
        reply,
        Some(&ChatMessage {
            reasoning: Some("A greeting.".into()),
            ..ChatMessage::assistant("Hi!")
        })
    );
    f.reply(request.id, &["Hi again."], FinishReason::StopToken);
    assert!(f.state.apply(UiCommand::NewConversation));
    let request = f.send("New");
    assert!(request.template_variables.is_empty(), "per chat");
}

#[test]
fn a_software_gpu_is_named_and_its_first_reply_says_it_is_compiling() {
    let mut f = Fixture::new();
    let mut info = model_info(&f.model_dir());
    info.options.backend = BackendKind::Gpu;
    info.software_gpu = true;
    f.load(info);
    assert!(
        f.state.notices()[0].contains("software renderer"),
        "{:?}",
        f.state.notices()
    );
    let first = f.send("Hello");
    assert!(f.state.preparing_gpu());
    f.play([Event::Token {
        request: first.id,
        token: token("Hi"),
    }]);
    assert!(!f.state.preparing_gpu(), "the first token came");
    f.reply(first.id, &[], FinishReason::StopToken);
    f.send("Again");
    assert!(
        !f.state.preparing_gpu(),
        "kernels compile in the first reply only"
    );
}

#[test]
fn the_models_recommended_sampling_is_used_until_the_user_sets_their_own() {
    let mut f = Fixture::new();
    let mut info = model_info(&f.model_dir());
    info.sampling_defaults = crate::text::SamplingDefaults {
        temperature: Some(0.3),
        ..Default::default()
    };
    f.load(info.clone());
    assert_eq!(f.state.settings().sampling.temperature, 0.3);
    assert!(
        f.state.notices()[0]
            .starts_with("Sampling set to what this model recommends: temperature 0.3")
    );

    let mut settings = f.state.settings().clone();
    settings.sampling.temperature = 1.1;
    assert!(f.state.apply(Action::UpdateSettings(settings)));
    f.play([Event::ModelReady(info)]);
    assert_eq!(
        f.state.settings().sampling.temperature,
        1.1,
        "the user's choice stays"
    );
    assert!(
        f.state
            .notices()
            .iter()
            .any(|n| n.contains("your own sampling settings are kept"))
    );
}

#[test]
fn a_conversation_file_removed_while_a_reply_streams_is_written_again() {
    let mut f = Fixture::ready();
    let request = f.send("Hello");
    let path = f.state.conversation_path(&f.state.current().id);
    std::fs::remove_file(&path).unwrap();
    f.state = f.state.with_save_interval(std::time::Duration::ZERO);
    f.play([Event::Token {
        request: request.id,
        token: token("Hi"),
    }]);
    assert!(f.state.errors().is_empty(), "{:?}", f.state.errors());
    assert_eq!(f.saved().messages[1].content, "Hi");
}

/// A disk that refuses every write while a reply streams: the error is said once, appends
/// wait for a whole snapshot (the file may end in a half line an append would continue),
/// and once the disk takes writes again the file holds the whole reply, nothing twice.
#[test]
fn a_reply_streamed_while_saves_fail_is_saved_whole_once_they_work_again() {
    let mut f = Fixture::ready();
    let request = f.send("Hello");
    let path = f.state.conversation_path(&f.state.current().id);
    std::fs::remove_file(&path).unwrap();
    // Neither an append nor a snapshot (a rename over it) can write where a folder is.
    std::fs::create_dir(&path).unwrap();
    f.state = f.state.with_save_interval(std::time::Duration::ZERO);
    let stream = |f: &mut Fixture, text: &str| {
        f.play([Event::Token {
            request: request.id,
            token: token(text),
        }])
    };
    for text in ["Hi", " there", ","] {
        stream(&mut f, text);
    }
    assert_eq!(f.state.errors().len(), 1, "{:?}", f.state.errors());
    assert!(f.state.errors()[0].contains("cannot save"));
    std::fs::remove_dir(&path).unwrap();
    stream(&mut f, " friend");
    assert_eq!(f.saved().messages[1].content, "Hi there, friend");
    stream(&mut f, "!");
    f.reply(request.id, &[], FinishReason::StopToken);
    assert_eq!(f.saved().messages[1].content, "Hi there, friend!");
}

/// A model in smolchat's own folder is offered at first run, found off the window's thread,
/// and opens as a model typed by hand does.
#[test]
fn models_on_this_computer_are_found_and_open() {
    let dir = tempfile::tempdir().unwrap();
    let paths = Paths::under(dir.path());
    let file = paths.models_dir().join("tiny.Q8_0.gguf");
    std::fs::create_dir_all(paths.models_dir()).unwrap();
    std::fs::write(&file, b"GGUF\x03\0\0\0").unwrap();
    let (handle, engine) = ScriptedEngine::new();
    let mut state = AppState::new(paths, handle);
    let started = std::time::Instant::now();
    while state.scanning_models() && started.elapsed() < std::time::Duration::from_secs(30) {
        std::thread::sleep(std::time::Duration::from_millis(10));
        state.poll();
    }
    let found = state.local_models();
    assert!(
        found
            .iter()
            .any(|found| found.model.path == file && found.model.name == "tiny.Q8_0"),
        "{found:?}"
    );
    assert!(state.apply(Action::UseModelFolder(file.clone())));
    assert!(matches!(
        engine.commands().as_slice(),
        [Command::LoadModel { .. }]
    ));
    assert_eq!(state.settings().model_folder.as_ref(), Some(&file));
}

/// The library looks again each time it opens, so a model added since shows, and says what
/// a file is not; opening a model from it goes back to the chat.
#[test]
fn the_library_looks_again_when_opened_and_closes_on_open() {
    let dir = tempfile::tempdir().unwrap();
    let paths = Paths::under(dir.path());
    std::fs::create_dir_all(paths.models_dir()).unwrap();
    let (handle, _engine) = ScriptedEngine::new();
    let mut state = AppState::new(paths.clone(), handle);
    let settle = |state: &mut AppState| {
        let started = std::time::Instant::now();
        while state.scanning_models() && started.elapsed() < std::time::Duration::from_secs(30) {
            std::thread::sleep(std::time::Duration::from_millis(10));
            state.poll();
        }
    };
    // Other stores on this machine (its home folder's) may add theirs.
    let ours = |state: &AppState| -> Vec<_> {
        state
            .local_models()
            .iter()
            .filter(|found| found.model.path.starts_with(dir.path()))
            .cloned()
            .collect()
    };
    settle(&mut state);
    assert!(ours(&state).is_empty());

    let added = paths.models_dir().join("added.gguf");
    std::fs::write(&added, b"GGUF\x03\0\0\0").unwrap();
    assert!(state.apply(UiCommand::ToggleLibrary));
    assert!(state.library_open());
    settle(&mut state);
    let [found] = &ours(&state)[..] else {
        panic!("{:?}", state.local_models());
    };
    assert_eq!(found.model.path, added);
    // Four bytes of header and nothing else: listed, with the reason it cannot run.
    assert!(found.facts.is_err());

    let tiny = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-smollm");
    assert!(state.apply(Action::UseModelFolder(tiny)));
    assert!(!state.library_open());
}

#[test]
fn a_conversation_saves_where_the_user_chose() {
    let mut f = Fixture::ready();
    let request = f.send("Hello");
    f.reply(request.id, &["Hi"], FinishReason::StopToken);
    let chosen = f.dir.path().join("elsewhere").join("chat.md");
    assert!(f.state.apply(Action::ExportTo(
        crate::ui::ExportFormat::Markdown,
        chosen.clone()
    )));
    let text = std::fs::read_to_string(&chosen).unwrap();
    assert!(text.contains("## You\n\nHello"), "{text}");
    // The chat's system prompt heads the export (it was left out).
    assert!(f.state.apply(Action::SetSystemPrompt("Be brief.".into())));
    assert!(f.state.apply(Action::ExportTo(
        crate::ui::ExportFormat::Markdown,
        chosen.clone()
    )));
    let text = std::fs::read_to_string(&chosen).unwrap();
    assert!(text.contains("## System\n\nBe brief.\n\n## You"), "{text}");
    assert_eq!(
        f.state.notices().last().unwrap(),
        &format!("Exported to {}", chosen.display())
    );
}

#[test]
fn a_desktop_without_a_file_dialog_gets_told_what_to_do_instead() {
    let mut f = Fixture::ready();
    for asked_for in [
        DialogFor::OpeningModel,
        DialogFor::Export,
        DialogFor::ImportingChat,
    ] {
        assert!(f.state.apply(Action::NoFileDialog(asked_for)));
    }
    let notices = f.state.notices();
    assert_eq!(notices.len(), 3, "{notices:?}");
    assert!(notices[0].contains("Current model") && notices[0].contains("drop"));
    assert!(notices[1].contains("exports folder"));
    let conversations = f.dir.path().join("data").join("conversations");
    assert!(
        notices[2].contains(&conversations.display().to_string()),
        "{}",
        notices[2]
    );
}

/// A chat exported as JSON comes back as a chat of its own, opened, beside the one it was
/// exported from; a file that is not one is refused, naming it.
#[test]
fn an_exported_chat_is_imported_beside_its_original() {
    let mut f = Fixture::ready();
    let request = f.send("Hello");
    f.reply(request.id, &["Hi"], FinishReason::StopToken);
    let original = f.state.current().clone();
    let exported = f.dir.path().join("exported.json");
    assert!(f.state.apply(Action::ExportTo(
        crate::ui::ExportFormat::Json,
        exported.clone()
    )));
    assert!(f.state.apply(UiCommand::NewConversation));

    assert!(f.state.apply(Action::ImportFrom(exported)));
    let imported = f.state.current().clone();
    assert_eq!(imported.messages, original.messages);
    assert_eq!(imported.title, original.title);
    assert_ne!(imported.id, original.id, "the original keeps its file");
    assert!(f.state.conversation_path(&imported.id).is_file());
    assert_eq!(f.state.conversations().len(), 3);
    assert_eq!(
        f.state.notices().last().unwrap(),
        &format!("Imported \u{201c}{}\u{201d}.", original.title)
    );

    let not_a_chat = f.dir.path().join("settings.json");
    std::fs::write(&not_a_chat, "{\"theme\": \"dark\"}").unwrap();
    assert!(!f.state.apply(Action::ImportFrom(not_a_chat.clone())));
    let error = f.state.errors().last().unwrap();
    assert!(error.contains(&not_a_chat.display().to_string()), "{error}");
    assert_eq!(f.state.conversations().len(), 3);
}

/// A long prompt's passes show on the reply being written, in its own chat only, until the
/// reply begins.
#[test]
fn a_long_prompt_shows_how_far_it_has_been_read() {
    let mut f = Fixture::ready();
    let request = f.send("Summarise our chat");
    assert_eq!(f.state.reading_prompt(), None);
    f.play([Event::PromptProgress {
        request: request.id,
        done: 2304,
        total: 8112,
    }]);
    let read = PromptProgress {
        done: 2304,
        total: 8112,
    };
    assert_eq!(f.state.reading_prompt(), Some(read));
    assert!(f.state.apply(UiCommand::NewConversation));
    assert_eq!(f.state.reading_prompt(), None, "another chat");
    assert!(f.state.apply(Action::Select(1)));
    assert_eq!(f.state.reading_prompt(), Some(read));
    f.play([Event::PromptProcessed {
        request: request.id,
        stats: stats(0).generation,
        dropped_messages: 0,
    }]);
    assert_eq!(f.state.reading_prompt(), None);
}

/// A file picked on the hub goes to the download queue, the library staying open and the
/// model in use staying loaded; a download that fails says why and can be tried again or
/// cancelled, and what was queued is there again at the next start.
#[test]
fn a_file_picked_on_the_hub_is_queued_and_its_failure_explained() {
    let dir = tempfile::tempdir().unwrap();
    let (handle, engine) = ScriptedEngine::new();
    // Nothing listens on port 9 of loopback: the download fails at once.
    let hub = unreachable_hub(&dir.path().join("hub"));
    let paths = Paths::under(dir.path());
    let mut state = AppState::with_hub(paths.clone(), handle, Some(hub.clone()));
    assert!(state.apply(UiCommand::ToggleLibrary));
    let spec = "org/model-GGUF:Q4_K_M";
    assert!(state.apply(Action::QueueDownload(spec.into())));
    assert!(state.library_open());
    assert!(
        engine.commands().is_empty(),
        "the engine is not asked to load"
    );
    let started = Instant::now();
    let failed = loop {
        state.poll();
        let download = &state.downloads().list()[0];
        if let DownloadState::Failed(reason) = &download.state {
            break reason.clone();
        }
        assert!(started.elapsed() < Duration::from_secs(30), "{download:?}");
        std::thread::sleep(Duration::from_millis(5));
    };
    assert!(failed.contains("127.0.0.1:9"), "{failed}");
    let id = state.downloads().list()[0].id;
    drop(state);

    let (handle, _engine) = ScriptedEngine::new();
    let mut state = AppState::with_hub(paths, handle, Some(hub));
    let [again] = state.downloads().list() else {
        panic!("{:?}", state.downloads().list());
    };
    assert_eq!(again.spec, spec, "kept for the next start");
    let id_again = again.id;
    assert!(state.apply(Action::CancelDownload(id_again)));
    assert!(state.downloads().list().is_empty());
    assert!(!state.apply(Action::ResumeDownload(id)), "gone");
}

/// A message that waits behind other requests (API clients') says how many, until its prompt
/// is read.
#[test]
fn a_waiting_reply_says_how_many_are_ahead() {
    let mut f = Fixture::ready();
    let request = f.send("Hello");
    f.play([Event::Waiting {
        request: request.id,
        ahead: 2,
    }]);
    assert_eq!(f.state.waiting_behind(), Some(2));
    f.play([Event::Waiting {
        request: request.id,
        ahead: 1,
    }]);
    assert_eq!(f.state.waiting_behind(), Some(1));
    f.play([Event::PromptProcessed {
        request: request.id,
        stats: stats(0).generation,
        dropped_messages: 0,
    }]);
    assert_eq!(f.state.waiting_behind(), None);
}

#[test]
fn a_system_prompt_saved_as_a_preset_can_be_picked_for_any_chat() {
    let mut f = Fixture::ready();
    assert!(
        !f.state.apply(Action::SavePreset("Terse".into())),
        "no prompt yet"
    );
    assert!(
        f.state
            .apply(Action::SetSystemPrompt("Answer in one line.".into()))
    );
    assert!(!f.state.apply(Action::SavePreset("  ".into())), "no name");
    assert!(f.state.apply(Action::SavePreset(" Terse ".into())));
    assert!(
        f.state
            .apply(Action::SetSystemPrompt("Answer as a pirate.".into()))
    );
    assert!(f.state.apply(Action::SavePreset("Pirate".into())));
    assert!(
        f.state
            .apply(Action::SetSystemPrompt("Answer in two lines.".into()))
    );
    assert!(
        f.state.apply(Action::SavePreset("Terse".into())),
        "same name: replaced"
    );
    let presets = |f: &Fixture| -> Vec<(String, String)> {
        let presets = &f.state.settings().prompt_presets;
        presets
            .iter()
            .map(|p| (p.name.clone(), p.text.clone()))
            .collect()
    };
    let expected = [
        ("Terse".to_string(), "Answer in two lines.".to_string()),
        ("Pirate".to_string(), "Answer as a pirate.".to_string()),
    ];
    assert_eq!(presets(&f), expected);
    // Kept across a restart, in the settings file.
    let (saved, problem) = Settings::load(&Paths::under(f.dir.path()).settings_file());
    assert_eq!(problem, None);
    assert_eq!(saved.prompt_presets, f.state.settings().prompt_presets);

    assert!(f.state.apply(UiCommand::NewConversation));
    assert!(f.state.apply(Action::DeletePreset(0)));
    assert!(!f.state.apply(Action::DeletePreset(1)));
    assert_eq!(presets(&f), expected[1..]);
}

#[test]
fn a_chat_with_its_own_sampling_replies_with_it_and_others_keep_the_defaults() {
    let mut f = Fixture::ready();
    let mut settings = f.state.settings().clone();
    settings.seed_mode = SeedMode::Fixed;
    settings.sampling.temperature = 0.7;
    assert!(f.state.apply(Action::UpdateSettings(settings.clone())));
    let own = SamplingParams {
        temperature: 0.1,
        top_k: 5,
        ..settings.sampling.clone()
    };
    assert!(f.state.apply(Action::SetChatSampling(Some(own.clone()))));
    let first = f.send("Hello");
    assert_eq!(first.sampling, own);
    f.reply(first.id, &["Hi"], FinishReason::StopToken);
    assert_eq!(f.saved().sampling, Some(own.clone()));

    assert!(f.state.apply(UiCommand::NewConversation));
    let other = f.send("Hello");
    assert_eq!(other.sampling, settings.sampling);
    f.reply(other.id, &["Hi"], FinishReason::StopToken);

    // Back to the defaults.
    assert!(f.state.apply(Action::Select(1)));
    assert!(f.state.apply(Action::SetChatSampling(None)));
    let again = f.send("Again");
    assert_eq!(again.sampling, settings.sampling);
}

#[test]
fn chats_in_folders_come_first_and_keys_follow_the_list() {
    let mut f = Fixture::ready();
    for text in ["Oldest", "Middle", "Newest"] {
        assert!(f.state.apply(UiCommand::NewConversation));
        let request = f.send(text);
        f.reply(request.id, &["ok"], FinishReason::StopToken);
    }
    let titles = |f: &Fixture| -> Vec<String> {
        let order = f.state.chat_order();
        order
            .iter()
            .map(|&i| f.state.conversations()[i].title.clone())
            .collect()
    };
    assert_eq!(titles(&f), ["Newest", "Middle", "Oldest"]);
    let at = |f: &Fixture, title: &str| {
        f.state
            .conversations()
            .iter()
            .position(|c| c.title == title)
            .unwrap()
    };

    assert!(f.state.apply(Action::MoveToFolder(
        at(&f, "Oldest"),
        Some(" Work ".into())
    )));
    assert!(
        f.state
            .apply(Action::MoveToFolder(at(&f, "Middle"), Some("Home".into())))
    );
    assert!(!f.state.apply(Action::MoveToFolder(9, Some("Home".into()))));
    assert_eq!(f.state.folders(), ["Home", "Work"]);
    assert_eq!(titles(&f), ["Middle", "Oldest", "Newest"]);
    // Kept in the chat's file.
    let path = f
        .state
        .conversation_path(&f.state.conversations()[at(&f, "Oldest")].id);
    let (saved, _) = ConversationStore::load_file(&path).unwrap();
    assert_eq!(saved.folder.as_deref(), Some("Work"));

    // Ctrl+Tab walks the list as shown.
    assert!(f.state.apply(Action::Select(at(&f, "Middle"))));
    assert!(f.state.apply(UiCommand::NextChat));
    assert_eq!(f.state.current().title, "Oldest");
    assert!(f.state.apply(UiCommand::NextChat));
    assert_eq!(f.state.current().title, "Newest");
    assert!(f.state.apply(UiCommand::NextChat));
    assert_eq!(f.state.current().title, "Middle");
    assert!(f.state.apply(UiCommand::PreviousChat));
    assert_eq!(f.state.current().title, "Newest");

    // A blank name is no folder; removing a folder keeps its chats.
    assert!(
        f.state
            .apply(Action::MoveToFolder(at(&f, "Newest"), Some("  ".into())))
    );
    assert!(
        f.state
            .apply(Action::MoveToFolder(at(&f, "Newest"), Some("Work".into())))
    );
    assert!(f.state.apply(Action::RemoveFolder("Work".into())));
    assert!(
        !f.state.apply(Action::RemoveFolder("Work".into())),
        "no such folder now"
    );
    assert_eq!(f.state.folders(), ["Home"]);
    assert_eq!(titles(&f), ["Middle", "Newest", "Oldest"]);
}

/// The memory for conversations goes to the engine when it changes and when the app starts
/// again, and the app leaves the engine's own default alone until it is set.
#[test]
fn the_memory_for_conversations_reaches_the_engine_and_is_remembered() {
    let mut f = Fixture::ready();
    let budget = |commands: Vec<Command>| -> Vec<Option<usize>> {
        commands
            .into_iter()
            .filter_map(|command| match command {
                Command::SetKvBudget(budget) => Some(budget),
                _ => None,
            })
            .collect()
    };
    let mut settings = f.state.settings().clone();
    settings.kv_budget = Some(4096);
    assert!(f.state.apply(Action::UpdateSettings(settings.clone())));
    assert_eq!(budget(f.engine.commands()), [Some(4096)]);
    assert!(f.state.apply(Action::UpdateSettings(settings.clone())));
    assert_eq!(budget(f.engine.commands()), [], "unchanged, not sent again");

    let (handle, engine) = ScriptedEngine::new();
    let again = AppState::new(Paths::under(f.dir.path()), handle);
    assert_eq!(again.settings().kv_budget, Some(4096));
    assert_eq!(budget(engine.commands()), [Some(4096)]);

    settings.kv_budget = None;
    assert!(f.state.apply(Action::UpdateSettings(settings)));
    assert_eq!(budget(f.engine.commands()), [None]);
    let (handle, engine) = ScriptedEngine::new();
    let _again = AppState::new(Paths::under(f.dir.path()), handle);
    assert_eq!(budget(engine.commands()), []);
}
