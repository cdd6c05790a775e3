//! Conversations on disk: one file each, so that a damaged or deleted file costs one
//! conversation, not the history.
//!
//! A file is a snapshot of the conversation on its first line (JSON), then, while a reply
//! streams, one line per periodic save with only what the reply gained since the last
//! ([`Appended`]). Streaming thus writes each token once instead of the whole conversation
//! every second; the next snapshot (when the reply ends) replaces the file atomically. A
//! line cut short by a crash is the last one and is ignored. Files of format 1 (one pretty
//! JSON document) load as they are and are rewritten in this format at their next save.

use std::cmp::Reverse;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::atomic_file::write_atomic;
use crate::backend::BackendKind;
use crate::generation::{FinishReason, GenerationStats};
use crate::text::{ChatMessage, OverflowPolicy, Role, SamplingParams};

/// Bumped whenever a change would make older builds misread a file: 2 added appended lines,
/// 3 the messages that followed an earlier variant (which an older build would drop).
pub const FORMAT_VERSION: u32 = 3;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Conversation {
    pub format_version: u32,
    pub id: String,
    pub title: String,
    pub created_unix_ms: u64,
    /// This chat's own system prompt, shown at its top; `None` until the chat is given one
    /// (and in files written before chats had one): the default in the settings applies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_prompt: Option<String>,
    /// Whether a reasoning model thinks before it answers in this chat; `None`: as its
    /// template does by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thinking: Option<bool>,
    /// The folder the chat list shows it in; `None`: in none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub folder: Option<String>,
    /// This chat's own sampling, which overrides the settings' defaults; `None`: the defaults.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sampling: Option<SamplingParams>,
    pub messages: Vec<StoredMessage>,
    /// The message typed here and not sent yet: it stays with its chat.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub draft: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredMessage {
    pub role: Role,
    pub content: String,
    /// How an assistant reply was produced, so it can be understood and replayed later.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<GenerationRecord>,
    /// The other versions of this message (a reply regenerated, a message edited and sent
    /// again), in the order they were written, without the one shown; see
    /// [`Conversation::show_variant`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub other_variants: Vec<Variant>,
    /// Where the shown version stands among all of them (0 = the first written).
    #[serde(default)]
    pub variant: usize,
}

/// One version of a message, as kept beside the one shown: with the conversation that went on
/// from it, so that editing a message in mid-chat loses nothing.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Variant {
    pub content: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<GenerationRecord>,
    /// The messages that followed this version.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub following: Vec<StoredMessage>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GenerationRecord {
    pub model: String,
    pub model_dir: PathBuf,
    pub backend: BackendKind,
    /// Includes the seed actually used, even when the settings asked for a random one.
    pub sampling: SamplingParams,
    pub max_new_tokens: usize,
    pub overflow: OverflowPolicy,
    /// None while the reply is streaming, or when the app died before it finished.
    pub finish_reason: Option<FinishReason>,
    pub stats: Option<MessageStats>,
    #[serde(default)]
    pub tokens: Vec<StoredToken>,
    /// How many of the reply's tokens were its thinking, counted as they came (see
    /// [`crate::text::reasoning::is_thinking_token`]): `tokens` is kept only for the token
    /// view, and the Thinking header counts them.
    #[serde(default)]
    pub thinking_tokens: usize,
    /// The oldest messages of the conversation this reply's prompt left out to fit the
    /// context (the system prompt never is): the model did not see them.
    #[serde(default)]
    pub left_out: usize,
}

/// The figures the status bar shows, kept with the reply after generation ends.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MessageStats {
    pub time_to_first_token_ms: f64,
    pub prefill_tokens_per_second: Option<f64>,
    pub decode_tokens_per_second: Option<f64>,
    pub prompt_tokens: usize,
    pub reused_tokens: usize,
    pub generated_tokens: usize,
    pub context_used: usize,
    pub context_limit: usize,
    pub resident_bytes: Option<u64>,
}

impl MessageStats {
    pub fn from_generation(stats: &GenerationStats, resident_bytes: Option<u64>) -> Self {
        Self {
            time_to_first_token_ms: stats.time_to_first_token.as_secs_f64() * 1000.0,
            prefill_tokens_per_second: stats.prefill_tokens_per_second(),
            decode_tokens_per_second: stats.decode_tokens_per_second(),
            prompt_tokens: stats.prompt_tokens,
            reused_tokens: stats.reused_tokens,
            generated_tokens: stats.generated_tokens,
            context_used: stats.context_used,
            context_limit: stats.context_limit,
            resident_bytes,
        }
    }
}

/// One sampled token with the model's top alternatives, for the probability view.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredToken {
    pub text: String,
    pub probability: f32,
    pub alternatives: Vec<(String, f32)>,
}

impl StoredMessage {
    pub fn new(role: Role, content: impl Into<String>) -> Self {
        Self {
            role,
            content: content.into(),
            generation: None,
            other_variants: Vec::new(),
            variant: 0,
        }
    }

    pub fn to_chat_message(&self) -> ChatMessage {
        match self.role {
            Role::Assistant => ChatMessage::reply(&self.content),
            role => ChatMessage::new(role, self.content.clone()),
        }
    }

    /// The tokens of a generated reply, with their probabilities; none for other messages.
    pub fn tokens(&self) -> &[StoredToken] {
        self.generation
            .as_ref()
            .map_or(&[], |record| &record.tokens)
    }

    /// Whether Continue can extend this reply: it has text and was stopped, cut by the
    /// token limit, or cut short by the app closing mid-reply.
    pub fn can_continue(&self) -> bool {
        self.role == Role::Assistant
            && !self.content.is_empty()
            && self.generation.as_ref().is_some_and(|record| {
                matches!(
                    record.finish_reason,
                    Some(FinishReason::Stopped | FinishReason::MaxTokens) | None
                )
            })
    }

    /// How many versions this message has, the shown one included.
    pub fn variant_count(&self) -> usize {
        self.other_variants.len() + 1
    }

    /// Every version of this message in the order written, the shown one in its place with
    /// `following`, the messages after it.
    fn into_variants(self, following: Vec<StoredMessage>) -> Vec<Variant> {
        let mut all = self.other_variants;
        let shown = Variant {
            content: self.content,
            generation: self.generation,
            following,
        };
        all.insert(self.variant.min(all.len()), shown);
        all
    }
}

impl Conversation {
    /// Takes message `index` and everything after it out of the conversation, as the versions
    /// of that message (the shown one holding what followed it): what a new version, written
    /// next, keeps beside it. Empty when there is no such message.
    pub fn branch_off(&mut self, index: usize) -> Vec<Variant> {
        if index >= self.messages.len() {
            return Vec::new();
        }
        let following = self.messages.split_off(index + 1);
        self.messages
            .pop()
            .map_or_else(Vec::new, |message| message.into_variants(following))
    }

    /// Shows version `variant` (in the order written) of message `index`, with the messages
    /// that followed it; false when there is no such version.
    pub fn show_variant(&mut self, index: usize, variant: usize) -> bool {
        let exists = self
            .messages
            .get(index)
            .is_some_and(|message| variant < message.variant_count());
        if !exists {
            return false;
        }
        let role = self.messages[index].role;
        let mut all = self.branch_off(index);
        let shown = all.remove(variant);
        self.messages.push(StoredMessage {
            role,
            content: shown.content,
            generation: shown.generation,
            other_variants: all,
            variant,
        });
        self.messages.extend(shown.following);
        true
    }

    pub fn new() -> Self {
        let now = unix_ms();
        Self {
            format_version: FORMAT_VERSION,
            id: format!("{now}-{:04x}", rand::random::<u16>()),
            title: "New chat".into(),
            created_unix_ms: now,
            system_prompt: None,
            thinking: None,
            folder: None,
            sampling: None,
            messages: Vec::new(),
            draft: String::new(),
        }
    }

    /// The chat as Markdown, headed by `system_prompt`, the one its replies were written
    /// under (its own, or the app's default), when there is one.
    pub fn to_markdown(&self, system_prompt: &str) -> String {
        let mut out = format!("# {}\n\n", self.title);
        if !system_prompt.trim().is_empty() {
            out.push_str(&format!("## System\n\n{}\n\n", system_prompt.trim_end()));
        }
        for message in &self.messages {
            let who = match message.role {
                Role::System => "System",
                Role::User => "You",
                Role::Assistant => "Assistant",
            };
            out.push_str(&format!("## {who}\n\n{}\n\n", message.content.trim_end()));
            if let Some(generation) = &message.generation {
                out.push_str(&format!(
                    "_{} on {}, temperature {}, top-p {}, seed {}_\n\n",
                    generation.model,
                    generation.backend,
                    generation.sampling.temperature,
                    generation.sampling.top_p,
                    generation.sampling.seed
                ));
            }
        }
        out
    }

    pub fn to_json(&self) -> io::Result<Vec<u8>> {
        serde_json::to_vec_pretty(self).map_err(io::Error::other)
    }
}

impl Default for Conversation {
    fn default() -> Self {
        Self::new()
    }
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_millis() as u64)
}

/// What a streaming reply gained since the file's last line: text and tokens of message
/// `message`, to append to it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Appended {
    pub message: usize,
    pub text: String,
    pub tokens: Vec<StoredToken>,
}

/// A line after a file's snapshot.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Record {
    Append(Appended),
}

impl Conversation {
    fn apply(&mut self, record: Record) -> Result<(), String> {
        match record {
            Record::Append(appended) => {
                let message = self.messages.get_mut(appended.message).ok_or_else(|| {
                    format!(
                        "it appends to message {}, which it does not have",
                        appended.message
                    )
                })?;
                message.content.push_str(&appended.text);
                if let Some(generation) = &mut message.generation {
                    generation.tokens.extend(appended.tokens);
                }
                Ok(())
            }
        }
    }
}

/// The folder of conversation files.
#[derive(Debug, Clone)]
pub struct ConversationStore {
    dir: PathBuf,
}

impl ConversationStore {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }

    pub fn path(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.json"))
    }

    /// Replaces the file with a snapshot of `conversation`, atomically.
    pub fn save(&self, conversation: &Conversation) -> io::Result<()> {
        let mut snapshot = conversation.clone();
        snapshot.format_version = FORMAT_VERSION;
        let mut line = serde_json::to_vec(&snapshot).map_err(io::Error::other)?;
        line.push(b'\n');
        write_atomic(&self.path(&conversation.id), &line)
    }

    /// Appends what a streaming reply gained to conversation `id`'s file, on disk before it
    /// returns; the bytes written.
    ///
    /// An append that fails (a full disk can take half a line) is cut off again, so that the
    /// file ends where it did: a half line that later appends continued would no longer be
    /// the last one, and would hide the whole conversation.
    pub fn append(&self, id: &str, appended: &Appended) -> io::Result<usize> {
        let mut line =
            serde_json::to_vec(&Record::Append(appended.clone())).map_err(io::Error::other)?;
        line.push(b'\n');
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(self.path(id))?;
        let before = file.metadata()?.len();
        let written = file.write_all(&line).and_then(|()| file.sync_data());
        if let Err(err) = written {
            // If even this fails, the half line is the last one, which loading ignores.
            let _ = file.set_len(before).and_then(|()| file.sync_data());
            return Err(err);
        }
        Ok(line.len())
    }

    /// The conversation in `path`, and what of it could not be read, if anything: a damaged
    /// line keeps everything before it, and only what came after it is left out.
    pub fn load_file(path: &Path) -> Result<(Conversation, Option<String>), String> {
        let bytes =
            std::fs::read(path).map_err(|err| format!("cannot read {}: {err}", path.display()))?;
        let damaged = |reason: String| format!("{} is damaged: {reason}", path.display());
        let mut left_out = None;
        // Format 1, or a snapshot alone.
        let mut conversation: Conversation = match serde_json::from_slice(&bytes) {
            Ok(conversation) => conversation,
            Err(whole) => {
                let mut lines = bytes.split(|&byte| byte == b'\n');
                let first = lines.next().unwrap_or_default();
                let mut conversation: Conversation =
                    serde_json::from_slice(first).map_err(|_| damaged(whole.to_string()))?;
                let rest: Vec<&[u8]> = lines.filter(|line| !line.is_empty()).collect();
                for (index, line) in rest.iter().enumerate() {
                    let applied = serde_json::from_slice::<Record>(line)
                        .map_err(|err| err.to_string())
                        .and_then(|record| conversation.apply(record));
                    match applied {
                        Ok(()) => {}
                        // Cut short by a crash while being written: what came before stands.
                        Err(_) if index + 1 == rest.len() => {}
                        Err(err) => {
                            left_out = Some(format!(
                                "{}: line {} is damaged ({err}); the conversation is shown as it was before it, without what {} later line{} added",
                                path.display(),
                                index + 2,
                                rest.len() - index,
                                if rest.len() - index == 1 { "" } else { "s" }
                            ));
                            break;
                        }
                    }
                }
                conversation
            }
        };
        if conversation.format_version > FORMAT_VERSION {
            return Err(format!(
                "{} was written by a newer smolchat (format {})",
                path.display(),
                conversation.format_version
            ));
        }
        conversation.format_version = FORMAT_VERSION;
        Ok((conversation, left_out))
    }

    /// Every readable conversation, newest first, plus a message per file that could not be
    /// read whole (shown to the user as it is, never fatal).
    pub fn load_all(&self) -> (Vec<Conversation>, Vec<String>) {
        let (mut conversations, problems) = load_folder(&self.dir);
        conversations.sort_by_key(|(conversation, _)| Reverse(conversation.created_unix_ms));
        let conversations = conversations.into_iter().map(|(c, _)| c).collect();
        (conversations, problems)
    }

    /// The folder deleted conversations wait in, [`TRASH_DAYS`] days, to be restored.
    fn trash_dir(&self) -> PathBuf {
        self.dir.join("trash")
    }

    fn trash_path(&self, id: &str) -> PathBuf {
        self.trash_dir().join(format!("{id}.json"))
    }

    /// Moves conversation `id` to the trash. The file's time is set to now first: the trash
    /// counts its days from it.
    pub fn delete(&self, id: &str) -> io::Result<()> {
        let path = self.path(id);
        match std::fs::File::options().append(true).open(&path) {
            Ok(file) => file.set_modified(SystemTime::now())?,
            Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(err) => return Err(err),
        }
        std::fs::create_dir_all(self.trash_dir())?;
        std::fs::rename(path, self.trash_path(id))
    }

    /// The conversations in the trash, the most recently deleted first, and what could not be
    /// read there.
    pub fn trashed(&self) -> (Vec<Trashed>, Vec<String>) {
        let (mut found, problems) = load_folder(&self.trash_dir());
        found.sort_by_key(|(_, deleted)| Reverse(*deleted));
        let trashed = found
            .into_iter()
            .map(|(conversation, deleted)| Trashed {
                conversation,
                deleted,
            })
            .collect();
        (trashed, problems)
    }

    /// Brings conversation `id` back from the trash.
    pub fn restore(&self, id: &str) -> io::Result<()> {
        std::fs::rename(self.trash_path(id), self.path(id))
    }

    /// Deletes conversation `id` from the trash for good.
    pub fn delete_forever(&self, id: &str) -> io::Result<()> {
        std::fs::remove_file(self.trash_path(id))
    }

    /// Deletes for good what has been in the trash longer than `age`; returns how many went.
    pub fn empty_trash_older_than(&self, age: Duration) -> io::Result<usize> {
        let entries = match std::fs::read_dir(self.trash_dir()) {
            Ok(entries) => entries,
            Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(0),
            Err(err) => return Err(err),
        };
        let mut removed = 0;
        for entry in entries.flatten() {
            let path = entry.path();
            let deleted = std::fs::metadata(&path).and_then(|meta| meta.modified());
            let expired = deleted.is_ok_and(|deleted| {
                SystemTime::now()
                    .duration_since(deleted)
                    .is_ok_and(|waited| waited > age)
            });
            if is_conversation_file(&path) && expired {
                std::fs::remove_file(&path)?;
                removed += 1;
            }
        }
        Ok(removed)
    }
}

/// How long a deleted conversation can be restored.
pub const TRASH_DAYS: u64 = 30;

/// A conversation in the trash, and when it was deleted.
#[derive(Debug, Clone)]
pub struct Trashed {
    pub conversation: Conversation,
    pub deleted: SystemTime,
}

/// The conversation files of `dir` with their times, and a message per file that could not
/// be read whole.
fn load_folder(dir: &Path) -> (Vec<(Conversation, SystemTime)>, Vec<String>) {
    let mut conversations = Vec::new();
    let mut problems = Vec::new();
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return (conversations, problems),
        Err(err) => {
            problems.push(format!("cannot list {}: {err}.", dir.display()));
            return (conversations, problems);
        }
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if !is_conversation_file(&path) {
            continue;
        }
        let modified = std::fs::metadata(&path)
            .and_then(|meta| meta.modified())
            .unwrap_or(UNIX_EPOCH);
        match ConversationStore::load_file(&path) {
            Ok((conversation, left_out)) => {
                conversations.push((conversation, modified));
                problems.extend(left_out.map(|left_out| format!("{left_out}.")));
            }
            Err(problem) => problems.push(format!(
                "{problem}. That conversation is not shown; the file is left untouched."
            )),
        }
    }
    (conversations, problems)
}

/// A `.json` file that is not a temporary one. Reading a named pipe would wait for a writer
/// for ever: only plain files (or links to them) are conversations.
fn is_conversation_file(path: &Path) -> bool {
    let is_json = path.extension().is_some_and(|ext| ext == "json");
    let is_temp = path
        .file_name()
        .is_some_and(|name| name.to_string_lossy().starts_with('.'));
    is_json && !is_temp && std::fs::metadata(path).is_ok_and(|meta| meta.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn texts(conversation: &Conversation) -> Vec<&str> {
        conversation
            .messages
            .iter()
            .map(|message| message.content.as_str())
            .collect()
    }

    #[test]
    fn an_earlier_version_of_a_message_keeps_the_conversation_that_followed_it() {
        let mut conversation = Conversation::new();
        for (role, text) in [
            (Role::User, "Name a fruit"),
            (Role::Assistant, "Apple"),
            (Role::User, "Another"),
            (Role::Assistant, "Pear"),
        ] {
            conversation.messages.push(StoredMessage::new(role, text));
        }
        // The first question edited: the old one and all after it become its first version.
        let earlier = conversation.branch_off(0);
        assert!(conversation.messages.is_empty());
        conversation.messages.push(StoredMessage {
            variant: earlier.len(),
            other_variants: earlier,
            ..StoredMessage::new(Role::User, "Name a vegetable")
        });
        conversation
            .messages
            .push(StoredMessage::new(Role::Assistant, "Leek"));
        assert_eq!(conversation.messages[0].variant_count(), 2);

        assert!(conversation.show_variant(0, 0));
        assert_eq!(
            texts(&conversation),
            ["Name a fruit", "Apple", "Another", "Pear"]
        );
        assert!(!conversation.show_variant(0, 2), "there is no third");
        assert!(!conversation.show_variant(9, 0), "there is no such message");
        // A reply regenerated in mid-chat branches there too.
        let earlier = conversation.branch_off(1);
        conversation.messages.push(StoredMessage {
            variant: earlier.len(),
            other_variants: earlier,
            ..StoredMessage::new(Role::Assistant, "Plum")
        });
        assert_eq!(texts(&conversation), ["Name a fruit", "Plum"]);
        assert!(conversation.show_variant(1, 0));
        assert_eq!(
            texts(&conversation),
            ["Name a fruit", "Apple", "Another", "Pear"]
        );
        assert!(conversation.show_variant(0, 1));
        assert_eq!(texts(&conversation), ["Name a vegetable", "Leek"]);

        // Every branch survives a save and a load.
        let dir = tempfile::tempdir().unwrap();
        let store = ConversationStore::new(dir.path());
        store.save(&conversation).unwrap();
        let (mut loaded, _) = ConversationStore::load_file(&store.path(&conversation.id)).unwrap();
        assert_eq!(loaded, conversation);
        assert!(loaded.show_variant(0, 0) && loaded.show_variant(1, 1));
        assert_eq!(texts(&loaded), ["Name a fruit", "Plum"]);
    }

    #[test]
    fn saves_loads_and_deletes() {
        let dir = tempfile::tempdir().unwrap();
        let store = ConversationStore::new(dir.path());
        let mut conversation = Conversation::new();
        conversation
            .messages
            .push(StoredMessage::new(Role::User, "hello"));
        store.save(&conversation).unwrap();
        std::fs::write(dir.path().join("broken.json"), "{").unwrap();
        let (all, problems) = store.load_all();
        assert_eq!(all, vec![conversation.clone()]);
        assert_eq!(problems.len(), 1);
        let markdown = conversation.to_markdown("");
        assert!(markdown.contains("## You\n\nhello"), "{markdown}");
        assert!(!markdown.contains("## System"), "{markdown}");
        let markdown = conversation.to_markdown("Be brief.");
        assert!(
            markdown.contains("## System\n\nBe brief.\n\n## You"),
            "{markdown}"
        );
        store.delete(&conversation.id).unwrap();
        assert!(!store.path(&conversation.id).exists());
    }

    /// A deleted conversation waits in the trash, not among the others, dated when it was
    /// deleted; it comes back whole, or goes for good by hand or once it is too old.
    #[test]
    fn the_trash_keeps_deleted_conversations_until_restored_or_expired() {
        let dir = tempfile::tempdir().unwrap();
        let store = ConversationStore::new(dir.path());
        let mut old = Conversation::new();
        old.messages.push(StoredMessage::new(Role::User, "old"));
        store.save(&old).unwrap();
        let month_ago = SystemTime::now() - Duration::from_secs(31 * 24 * 3600);
        std::fs::File::options()
            .append(true)
            .open(store.path(&old.id))
            .unwrap()
            .set_modified(month_ago)
            .unwrap();
        store.delete(&old.id).unwrap();
        let (trashed, problems) = store.trashed();
        assert!(problems.is_empty(), "{problems:?}");
        let [only] = trashed.as_slice() else {
            panic!("{trashed:?}")
        };
        assert_eq!(only.conversation, old);
        let age = SystemTime::now().duration_since(only.deleted).unwrap();
        assert!(age < Duration::from_secs(60), "dated when deleted: {age:?}");
        assert!(store.load_all().0.is_empty(), "not among the others");

        store.restore(&old.id).unwrap();
        assert_eq!(store.load_all().0, vec![old.clone()]);
        assert!(store.trashed().0.is_empty());

        store.delete(&old.id).unwrap();
        let mut other = Conversation::new();
        other.messages.push(StoredMessage::new(Role::User, "other"));
        store.save(&other).unwrap();
        store.delete(&other.id).unwrap();
        store.delete_forever(&other.id).unwrap();
        assert_eq!(store.trashed().0.len(), 1);
        let kept = Duration::from_secs(30 * 24 * 3600);
        assert_eq!(store.empty_trash_older_than(kept).unwrap(), 0);
        std::fs::File::options()
            .append(true)
            .open(dir.path().join("trash").join(format!("{}.json", old.id)))
            .unwrap()
            .set_modified(month_ago)
            .unwrap();
        assert_eq!(store.empty_trash_older_than(kept).unwrap(), 1);
        assert!(store.trashed().0.is_empty());
    }

    fn token(text: &str) -> StoredToken {
        StoredToken {
            text: text.to_string(),
            probability: 0.4321,
            alternatives: (0..5).map(|i| (format!(" alt{i}"), 0.1234)).collect(),
        }
    }

    fn streaming_conversation() -> Conversation {
        let mut conversation = Conversation::new();
        conversation
            .messages
            .push(StoredMessage::new(Role::User, "Tell me a story"));
        conversation.messages.push(StoredMessage {
            generation: Some(GenerationRecord {
                left_out: 0,
                model: "SmolLM2-135M-Instruct".into(),
                model_dir: "/models/smollm2".into(),
                backend: BackendKind::Flex,
                sampling: SamplingParams::default(),
                max_new_tokens: 512,
                overflow: OverflowPolicy::default(),
                finish_reason: None,
                stats: None,
                tokens: Vec::new(),
                thinking_tokens: 0,
            }),
            ..StoredMessage::new(Role::Assistant, "")
        });
        conversation
    }

    #[test]
    fn appended_lines_load_and_a_torn_last_line_is_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let store = ConversationStore::new(dir.path());
        let conversation = streaming_conversation();
        store.save(&conversation).unwrap();
        for words in [[" Once", " upon"], [" a", " time"]] {
            let appended = Appended {
                message: 1,
                text: words.concat(),
                tokens: words.iter().map(|w| token(w)).collect(),
            };
            store.append(&conversation.id, &appended).unwrap();
        }
        let path = store.path(&conversation.id);
        let mut bytes = std::fs::read(&path).unwrap();
        bytes.extend_from_slice(br#"{"append":{"message":1,"text":" the"#);
        std::fs::write(&path, &bytes).unwrap();
        let (loaded, left_out) = ConversationStore::load_file(&path).unwrap();
        assert_eq!(left_out, None, "a torn last line is a crash, not damage");
        let reply = &loaded.messages[1];
        assert_eq!(reply.content, " Once upon a time");
        assert_eq!(reply.generation.as_ref().unwrap().tokens.len(), 4);
    }

    /// A full disk could leave a half line that later appends continued; the conversation
    /// was then hidden whole. What came before the damaged line is kept, and the loss named.
    #[test]
    fn a_damaged_line_keeps_everything_before_it() {
        let dir = tempfile::tempdir().unwrap();
        let store = ConversationStore::new(dir.path());
        let conversation = streaming_conversation();
        store.save(&conversation).unwrap();
        let path = store.path(&conversation.id);
        let append = |text: &str| {
            let appended = Appended {
                message: 1,
                text: text.into(),
                tokens: vec![token(text)],
            };
            store.append(&conversation.id, &appended).unwrap();
        };
        append(" Once");
        let mut bytes = std::fs::read(&path).unwrap();
        bytes.extend_from_slice(br#"{"append":{"message":1,"te"#);
        std::fs::write(&path, &bytes).unwrap();
        append(" upon");
        append(" a time");
        let (loaded, left_out) = ConversationStore::load_file(&path).unwrap();
        assert_eq!(loaded.messages[1].content, " Once");
        let left_out = left_out.expect("the loss is named");
        assert!(left_out.contains("line 3 is damaged"), "{left_out}");
        assert!(left_out.contains("2 later lines"), "{left_out}");
        let (all, problems) = store.load_all();
        assert_eq!(all.len(), 1, "the conversation is listed");
        assert_eq!(problems, [format!("{left_out}.")]);
    }

    /// A named pipe called `x.json` made start-up wait for a writer for ever.
    #[cfg(unix)]
    #[test]
    fn a_named_pipe_in_the_folder_is_not_read() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("x.json");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .expect("mkfifo runs");
        assert!(made.success());
        let store = ConversationStore::new(dir.path());
        let (all, problems) = store.load_all();
        assert!(all.is_empty() && problems.is_empty());
    }

    #[test]
    fn a_format_1_file_loads_and_is_rewritten_in_the_current_format() {
        let dir = tempfile::tempdir().unwrap();
        let store = ConversationStore::new(dir.path());
        let mut old = streaming_conversation();
        old.format_version = 1;
        let path = store.path(&old.id);
        std::fs::write(&path, serde_json::to_vec_pretty(&old).unwrap()).unwrap();
        let (loaded, _) = ConversationStore::load_file(&path).unwrap();
        assert_eq!(loaded.messages, old.messages);
        assert_eq!(loaded.format_version, FORMAT_VERSION);
        store.save(&loaded).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), 1);
        assert!(text.contains(&format!("\"format_version\":{FORMAT_VERSION}")));
    }

    /// A 512-token reply streamed at 50 tokens a second, saved every second: format 1
    /// rewrote the whole conversation each time, format 2 appends each token once (and
    /// both write the whole conversation once more at the end).
    #[test]
    fn streaming_writes_each_token_once() {
        const TOKENS: usize = 512;
        const PER_SAVE: usize = 50;
        let dir = tempfile::tempdir().unwrap();
        let store = ConversationStore::new(dir.path());
        let mut conversation = streaming_conversation();
        store.save(&conversation).unwrap();
        let (mut rewritten, mut appended) = (0, 0);
        for start in (0..TOKENS).step_by(PER_SAVE) {
            let tokens: Vec<StoredToken> = (start..(start + PER_SAVE).min(TOKENS))
                .map(|i| token(&format!(" word{i}")))
                .collect();
            let reply = &mut conversation.messages[1];
            let text: String = tokens.iter().map(|t| t.text.as_str()).collect();
            reply.content.push_str(&text);
            reply
                .generation
                .as_mut()
                .unwrap()
                .tokens
                .extend(tokens.clone());
            rewritten += conversation.to_json().unwrap().len();
            appended += store
                .append(
                    &conversation.id,
                    &Appended {
                        message: 1,
                        text,
                        tokens,
                    },
                )
                .unwrap();
        }
        // Both end with the whole conversation written once more when the reply finishes.
        let (loaded, _) = ConversationStore::load_file(&store.path(&conversation.id)).unwrap();
        assert_eq!(loaded.messages, conversation.messages);
        store.save(&conversation).unwrap();
        rewritten += conversation.to_json().unwrap().len();
        appended += std::fs::metadata(store.path(&conversation.id))
            .unwrap()
            .len() as usize;
        let per_token = |bytes: usize| bytes as f64 / TOKENS as f64;
        eprintln!(
            "bytes written per streamed token: format 1 {:.0}, format 2 {:.0}",
            per_token(rewritten),
            per_token(appended)
        );
        assert!(appended * 4 < rewritten, "{appended} vs {rewritten}");
    }
}
