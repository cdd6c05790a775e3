//! A reply being streamed and saved is killed with SIGKILL: the conversation file must still
//! load, holding the reply up to its last periodic save.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use smolchat::store::{Conversation, ConversationStore};
use smolchat::text::Role;

#[test]
fn kill_9_mid_reply_leaves_a_loadable_conversation() {
    let dir = tempfile::tempdir().unwrap();
    let model = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-smollm");
    let mut child = Command::new(env!("CARGO_BIN_EXE_smolchat"))
        .args(["dev", "chat", "--data-dir"])
        .arg(dir.path())
        .arg("--model")
        .arg(&model)
        .args(["--message", "Write a very long essay"])
        .args(["--max-new-tokens", "2000", "--save-interval-ms", "10"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let file = Path::new(line.trim()).to_path_buf();

    let deadline = Instant::now() + Duration::from_secs(60);
    let partial = |conversation: &Conversation| {
        conversation.messages.last().is_some_and(|m| {
            m.role == Role::Assistant
                && !m.content.is_empty()
                && m.generation.as_ref().unwrap().finish_reason.is_none()
        })
    };
    loop {
        assert!(Instant::now() < deadline, "no partial reply was saved");
        assert!(
            child.try_wait().unwrap().is_none(),
            "the reply finished before it could be interrupted"
        );
        if file.exists() {
            // Every read must parse: an atomic save is never seen half-written.
            let (conversation, left_out) = ConversationStore::load_file(&file).unwrap();
            assert_eq!(left_out, None);
            if partial(&conversation) {
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    child.kill().unwrap();
    child.wait().unwrap();

    let (conversation, left_out) = ConversationStore::load_file(&file).unwrap();
    assert_eq!(left_out, None);
    assert!(partial(&conversation));
    assert_eq!(conversation.messages[0].content, "Write a very long essay");
    let (all, problems) = ConversationStore::new(file.parent().unwrap()).load_all();
    assert_eq!(all.len(), 1);
    assert!(problems.is_empty(), "{problems:?}");
}
