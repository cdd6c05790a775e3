//! What smolchat keeps on disk: settings and conversations, always written atomically so that
//! a crash or kill never leaves a half-written file behind.

pub mod conversation;
pub mod settings;

use std::path::PathBuf;

pub use conversation::{
    Appended, Conversation, ConversationStore, GenerationRecord, MessageStats, StoredMessage,
    StoredToken, TRASH_DAYS, Trashed, Variant,
};
pub use settings::{PromptPreset, SeedMode, ServerSettings, Settings, Theme};

/// Environment variables that move the data and config folders, so that tests, screenshots
/// and portable installs never touch the user's real home.
pub const DATA_DIR_ENV: &str = "SMOLCHAT_DATA_DIR";
pub const CONFIG_DIR_ENV: &str = "SMOLCHAT_CONFIG_DIR";

/// Where conversations and settings live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Paths {
    pub data_dir: PathBuf,
    pub config_dir: PathBuf,
}

impl Paths {
    /// The platform folders (XDG on Linux), unless the environment overrides them.
    pub fn from_env() -> Option<Self> {
        let project = directories::ProjectDirs::from("org", "smolchat", "smolchat");
        let data_dir = std::env::var_os(DATA_DIR_ENV)
            .map(PathBuf::from)
            .or_else(|| project.as_ref().map(|p| p.data_dir().to_path_buf()))?;
        let config_dir = std::env::var_os(CONFIG_DIR_ENV)
            .map(PathBuf::from)
            .or_else(|| project.as_ref().map(|p| p.config_dir().to_path_buf()))?;
        Some(Self {
            data_dir,
            config_dir,
        })
    }

    /// Both folders under one root, for tests and the `dev chat` command.
    pub fn under(root: impl Into<PathBuf>) -> Self {
        let root = root.into();
        Self {
            data_dir: root.join("data"),
            config_dir: root.join("config"),
        }
    }

    pub fn conversations_dir(&self) -> PathBuf {
        self.data_dir.join("conversations")
    }

    /// Models of the user's own, which the first-run screen offers (see `model_library`).
    pub fn models_dir(&self) -> PathBuf {
        self.data_dir.join("models")
    }

    /// The downloads still to finish, resumed at the next start (see `downloads`).
    pub fn downloads_file(&self) -> PathBuf {
        self.data_dir.join("downloads.json")
    }

    pub fn settings_file(&self) -> PathBuf {
        self.config_dir.join("settings.json")
    }
}
