//! The user's choices, kept across restarts in `settings.json`.

use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::atomic_file::write_atomic;
use crate::backend::BackendKind;
use crate::model::Precision;
use crate::text::{OverflowPolicy, SamplingParams};

/// Light or dark, or whatever the system uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Theme {
    #[default]
    System,
    Light,
    Dark,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SeedMode {
    /// A fresh seed per reply; the one used is still stored with the reply to replay it.
    #[default]
    Random,
    Fixed,
}

/// Unknown or missing fields fall back to defaults, so that old settings files keep loading
/// after new options are added.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Settings {
    pub sampling: SamplingParams,
    pub seed_mode: SeedMode,
    pub max_new_tokens: usize,
    /// What a new chat's system prompt starts as.
    pub system_prompt: String,
    pub overflow: OverflowPolicy,
    pub backend: BackendKind,
    pub precision: Precision,
    /// None until the user picks a folder or downloads a model: the first-run screen shows.
    pub model_folder: Option<PathBuf>,
    pub show_token_probabilities: bool,
    pub show_settings: bool,
    pub show_conversations: bool,
    pub theme: Theme,
    pub server: ServerSettings,
    /// The window's inner size when it was last closed, in points.
    pub window_size: Option<[f32; 2]>,
    /// The unsent message when the window was last closed.
    pub draft: String,
}

/// The window's "Serve on localhost" switch and where it serves; the address and key are
/// edited while the switch is off, so a half-typed port never restarts the server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ServerSettings {
    pub enabled: bool,
    /// Kept as typed, so a mistyped address is shown back with the reason it is refused.
    pub host: String,
    /// 0 lets the system pick a free port, shown once serving.
    pub port: u16,
    /// Empty for none; a non-loopback host needs one.
    pub api_key: String,
}

impl Default for ServerSettings {
    fn default() -> Self {
        Self {
            enabled: false,
            host: "127.0.0.1".into(),
            port: 8080,
            api_key: String::new(),
        }
    }
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            sampling: SamplingParams::default(),
            seed_mode: SeedMode::Random,
            max_new_tokens: 512,
            system_prompt: String::new(),
            overflow: OverflowPolicy::default(),
            backend: BackendKind::default(),
            precision: Precision::default(),
            model_folder: None,
            show_token_probabilities: false,
            show_settings: true,
            show_conversations: true,
            theme: Theme::System,
            server: ServerSettings::default(),
            window_size: None,
            draft: String::new(),
        }
    }
}

impl Settings {
    /// A missing file means first run; a damaged one is reported so the caller can say so
    /// instead of silently discarding the user's choices.
    pub fn load(path: &Path) -> Result<Self, String> {
        match std::fs::read(path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map_err(|err| format!("settings file {} is damaged: {err}", path.display())),
            Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(Self::default()),
            Err(err) => Err(format!("cannot read {}: {err}", path.display())),
        }
    }

    pub fn save(&self, path: &Path) -> io::Result<()> {
        let json = serde_json::to_vec_pretty(self).map_err(io::Error::other)?;
        write_atomic(path, &json)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_tolerates_missing_fields() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("settings.json");
        assert_eq!(Settings::load(&path).unwrap(), Settings::default());
        let settings = Settings {
            sampling: SamplingParams {
                temperature: 0.2,
                ..SamplingParams::default()
            },
            model_folder: Some("/models/x".into()),
            ..Settings::default()
        };
        settings.save(&path).unwrap();
        assert_eq!(Settings::load(&path).unwrap(), settings);
        std::fs::write(&path, r#"{"max_new_tokens": 7}"#).unwrap();
        assert_eq!(Settings::load(&path).unwrap().max_new_tokens, 7);
    }
}
