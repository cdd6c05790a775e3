//! The user's choices, kept across restarts in `settings.json`.

use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;

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
    /// System prompts saved by name, for any chat to pick, in the order saved.
    pub prompt_presets: Vec<PromptPreset>,
    pub overflow: OverflowPolicy,
    /// Tokens the conversations' caches may hold together, the window's and API clients';
    /// `None`: one full context of the loaded model (see `EngineOptions::kv_budget`).
    pub kv_budget: Option<usize>,
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

/// A system prompt saved under a name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PromptPreset {
    pub name: String,
    pub text: String,
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
            prompt_presets: Vec::new(),
            overflow: OverflowPolicy::default(),
            kv_budget: None,
            backend: BackendKind::default(),
            precision: Precision::default(),
            model_folder: None,
            show_token_probabilities: false,
            // Closed at first: open, it took 37% of an 800-pixel window from the chat.
            show_settings: false,
            show_conversations: true,
            theme: Theme::System,
            server: ServerSettings::default(),
            window_size: None,
            draft: String::new(),
        }
    }
}

impl Settings {
    /// The settings in `path`, and what was wrong with the file, if anything, for the caller
    /// to say. A missing file means first run. A value that is not valid (a wrong type, a
    /// port out of range, an unknown theme) takes its default alone and every other value is
    /// kept; the file as it was is copied beside it as `settings.json.damaged` first, since
    /// the next save rewrites it. One bad value used to reset them all, the custom system
    /// prompt included, and the next save made that final.
    pub fn load(path: &Path) -> (Self, Option<String>) {
        let bytes = match std::fs::read(path) {
            Ok(bytes) => bytes,
            Err(err) if err.kind() == io::ErrorKind::NotFound => return (Self::default(), None),
            Err(err) => {
                let problem = format!(
                    "cannot read {}: {err}; default settings are used",
                    path.display()
                );
                return (Self::default(), Some(problem));
            }
        };
        let (settings, problem) = match serde_json::from_slice::<Value>(&bytes) {
            Err(err) => (
                Self::default(),
                format!("is not valid JSON ({err}); default settings are used"),
            ),
            Ok(file) => {
                let (settings, rejected) = salvage(&file);
                if rejected.is_empty() {
                    return (settings, None);
                }
                (
                    settings,
                    format!(
                        "has values that are not valid, which take their defaults: {}",
                        rejected.join(", ")
                    ),
                )
            }
        };
        let kept = crate::atomic_file::keep_damaged_copy(path);
        (
            settings,
            Some(format!("{} {problem}; {kept}", path.display())),
        )
    }

    pub fn save(&self, path: &Path) -> io::Result<()> {
        let json = serde_json::to_vec_pretty(self).map_err(io::Error::other)?;
        write_atomic(path, &json)
    }
}

/// The settings `file` holds, each value checked on its own (an object's fields one by one
/// when the object as a whole does not fit), and the dotted names of those refused.
fn salvage(file: &Value) -> (Settings, Vec<String>) {
    let mut merged = serde_json::to_value(Settings::default()).unwrap_or_default();
    let mut rejected = Vec::new();
    match file.as_object() {
        Some(fields) => {
            for (key, value) in fields {
                apply(&mut merged, &[key.as_str()], value, &mut rejected);
            }
        }
        None => rejected.push("the whole file (not an object)".to_owned()),
    }
    let settings = serde_json::from_value(merged).unwrap_or_default();
    (settings, rejected)
}

/// Sets `value` at `path` in `merged` if the settings still read with it; for an object that
/// does not, tries its fields one by one.
fn apply(merged: &mut Value, path: &[&str], value: &Value, rejected: &mut Vec<String>) {
    let mut candidate = merged.clone();
    *slot(&mut candidate, path) = value.clone();
    if serde_json::from_value::<Settings>(candidate.clone()).is_ok() {
        *merged = candidate;
        return;
    }
    match (value.as_object(), slot(merged, path).is_object()) {
        (Some(fields), true) => {
            for (key, field) in fields {
                let inner: Vec<&str> = path.iter().copied().chain([key.as_str()]).collect();
                apply(merged, &inner, field, rejected);
            }
        }
        _ => rejected.push(path.join(".")),
    }
}

/// The value at `path`, made where missing; every step but the last is an object, as
/// [`apply`] only descends into objects.
fn slot<'a>(value: &'a mut Value, path: &[&str]) -> &'a mut Value {
    path.iter().fold(value, |value, key| &mut value[*key])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_tolerates_missing_fields() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("settings.json");
        assert_eq!(Settings::load(&path), (Settings::default(), None));
        let settings = Settings {
            sampling: SamplingParams {
                temperature: 0.2,
                ..SamplingParams::default()
            },
            model_folder: Some("/models/x".into()),
            ..Settings::default()
        };
        settings.save(&path).unwrap();
        assert_eq!(Settings::load(&path), (settings, None));
        std::fs::write(&path, r#"{"max_new_tokens": 7}"#).unwrap();
        assert_eq!(Settings::load(&path).0.max_new_tokens, 7);
    }

    /// One wrong value took every other one with it: the custom system prompt was lost.
    #[test]
    fn a_wrong_value_takes_its_default_alone_and_the_file_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("settings.json");
        let written = r#"{"max_new_tokens": "512", "system_prompt": "Answer in French.",
            "theme": "blue", "server": {"host": "0.0.0.0", "port": 99999},
            "sampling": {"temperature": 0.3, "top_p": "high"}}"#;
        std::fs::write(&path, written).unwrap();
        let (settings, problem) = Settings::load(&path);
        assert_eq!(settings.system_prompt, "Answer in French.");
        assert_eq!(settings.server.host, "0.0.0.0");
        assert_eq!(settings.sampling.temperature, 0.3);
        assert_eq!(settings.max_new_tokens, Settings::default().max_new_tokens);
        assert_eq!(settings.server.port, ServerSettings::default().port);
        assert_eq!(settings.theme, Theme::System);
        let problem = problem.expect("the damage is reported");
        for name in ["max_new_tokens", "theme", "server.port", "sampling.top_p"] {
            assert!(problem.contains(name), "{problem}");
        }
        assert!(problem.contains("settings.json.damaged"), "{problem}");
        let kept = dir.path().join("settings.json.damaged");
        assert_eq!(std::fs::read_to_string(kept).unwrap(), written);

        std::fs::write(&path, "{ not json").unwrap();
        let (settings, problem) = Settings::load(&path);
        assert_eq!(settings, Settings::default());
        assert!(problem.unwrap().contains("not valid JSON"));
    }
}
