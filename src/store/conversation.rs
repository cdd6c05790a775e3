//! Conversations on disk: one JSON file each, so that a damaged or deleted file costs one
//! conversation, not the history.

use std::io;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::atomic_file::write_atomic;
use crate::backend::BackendKind;
use crate::generation::{FinishReason, GenerationStats};
use crate::text::{ChatMessage, OverflowPolicy, Role, SamplingParams};

/// Bumped whenever a change would make older builds misread a file.
pub const FORMAT_VERSION: u32 = 1;

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
    pub messages: Vec<StoredMessage>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredMessage {
    pub role: Role,
    pub content: String,
    /// How an assistant reply was produced, so it can be understood and replayed later.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<GenerationRecord>,
    /// The other replies to the same turn (regenerate keeps the earlier ones), in the order
    /// they were written, without the one shown; see [`StoredMessage::show_variant`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub other_variants: Vec<ReplyVariant>,
    /// Where the shown reply stands among all of them (0 = the first written).
    #[serde(default)]
    pub variant: usize,
}

/// One reply to a turn, as kept beside the one shown.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReplyVariant {
    pub content: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<GenerationRecord>,
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
        ChatMessage::new(self.role, self.content.clone())
    }

    /// How many replies this turn has, the shown one included.
    pub fn variant_count(&self) -> usize {
        self.other_variants.len() + 1
    }

    /// Every reply to this turn in the order written, the shown one in its place.
    pub fn into_variants(self) -> Vec<ReplyVariant> {
        let mut all = self.other_variants;
        let shown = ReplyVariant {
            content: self.content,
            generation: self.generation,
        };
        all.insert(self.variant.min(all.len()), shown);
        all
    }

    /// Shows reply `index` (in the order written) instead of the current one; false when
    /// there is no such reply.
    pub fn show_variant(&mut self, index: usize) -> bool {
        if index >= self.variant_count() {
            return false;
        }
        let mut all = std::mem::replace(self, StoredMessage::new(self.role, "")).into_variants();
        let shown = all.remove(index);
        self.content = shown.content;
        self.generation = shown.generation;
        self.other_variants = all;
        self.variant = index;
        true
    }
}

impl Conversation {
    pub fn new() -> Self {
        let now = unix_ms();
        Self {
            format_version: FORMAT_VERSION,
            id: format!("{now}-{:04x}", rand::random::<u16>()),
            title: "New chat".into(),
            created_unix_ms: now,
            system_prompt: None,
            messages: Vec::new(),
        }
    }

    pub fn to_markdown(&self) -> String {
        let mut out = format!("# {}\n\n", self.title);
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

    pub fn save(&self, conversation: &Conversation) -> io::Result<()> {
        write_atomic(&self.path(&conversation.id), &conversation.to_json()?)
    }

    pub fn load_file(path: &Path) -> Result<Conversation, String> {
        let bytes =
            std::fs::read(path).map_err(|err| format!("cannot read {}: {err}", path.display()))?;
        let conversation: Conversation = serde_json::from_slice(&bytes)
            .map_err(|err| format!("{} is damaged: {err}", path.display()))?;
        if conversation.format_version > FORMAT_VERSION {
            return Err(format!(
                "{} was written by a newer smolchat (format {})",
                path.display(),
                conversation.format_version
            ));
        }
        Ok(conversation)
    }

    /// Every readable conversation, newest first, plus a message per file that could not be
    /// read (shown to the user, never fatal).
    pub fn load_all(&self) -> (Vec<Conversation>, Vec<String>) {
        let mut conversations = Vec::new();
        let mut problems = Vec::new();
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(entries) => entries,
            Err(err) if err.kind() == io::ErrorKind::NotFound => return (conversations, problems),
            Err(err) => {
                problems.push(format!("cannot list {}: {err}", self.dir.display()));
                return (conversations, problems);
            }
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let is_json = path.extension().is_some_and(|ext| ext == "json");
            let is_temp = path
                .file_name()
                .is_some_and(|name| name.to_string_lossy().starts_with('.'));
            if is_json && !is_temp {
                match Self::load_file(&path) {
                    Ok(conversation) => conversations.push(conversation),
                    Err(problem) => problems.push(problem),
                }
            }
        }
        conversations.sort_by_key(|c| std::cmp::Reverse(c.created_unix_ms));
        (conversations, problems)
    }

    pub fn delete(&self, id: &str) -> io::Result<()> {
        match std::fs::remove_file(self.path(id)) {
            Err(err) if err.kind() != io::ErrorKind::NotFound => Err(err),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert!(conversation.to_markdown().contains("## You\n\nhello"));
        store.delete(&conversation.id).unwrap();
        assert!(!store.path(&conversation.id).exists());
    }
}
