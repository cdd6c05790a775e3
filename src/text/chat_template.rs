//! Turning a conversation into the exact prompt text the model was fine-tuned on,
//! using the Jinja chat template shipped with the model (as transformers does).

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use minijinja::{Environment, Value};
use serde::{Deserialize, Serialize};
use serde_json::Value as Json;

use super::error::{Result, TextError};
use super::json_files::{read_optional_json, special_token};
use super::reasoning::{THINK_CLOSE, THINK_OPEN, split_reply};
use super::template_env::python_like_environment;
use crate::model_files::{CHAT_TEMPLATE_FILE, CHAT_TEMPLATE_JSON_FILE, TOKENIZER_CONFIG_FILE};

/// The ChatML layout SmolLM2 and many other instruct models use; the best guess
/// when a model folder has no template of its own.
const CHATML_TEMPLATE: &str = "{% for message in messages %}\
{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}\
{% endfor %}\
{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

const TEMPLATE_NAME: &str = "chat_template";

/// Variables a template reads beside the conversation, by name.
pub type TemplateVariables = serde_json::Map<String, Json>;

/// A rendered prompt in pieces: what the template wrote (its markers among it), and what
/// people wrote, which is tokenized as text (see [`crate::text::TextTokenizer::encode_as_text`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PromptPiece {
    Template(String),
    Written(String),
}

/// Unicode noncharacters, reserved for a program's internal use: they bracket what people
/// wrote while the template runs, so that it can be found in what the template wrote.
const WRITTEN_START: char = '\u{FDD0}';
const WRITTEN_END: char = '\u{FDD1}';

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    System,
    User,
    Assistant,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: Role,
    pub content: String,
    /// A reasoning model's thinking before this reply, apart from it, under the name the
    /// templates of Qwen3 and its peers read (each decides whether earlier turns show it).
    #[serde(
        rename = "reasoning_content",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub reasoning: Option<String>,
}

impl ChatMessage {
    pub fn new(role: Role, content: impl Into<String>) -> Self {
        Self {
            role,
            content: content.into(),
            reasoning: None,
        }
    }

    /// A reply as the model wrote it: its thinking, if any, back inside `<think>…</think>`
    /// before the answer, as Qwen3 and SmolLM3 write them. What continuing a reply appends.
    pub fn written(&self) -> String {
        match &self.reasoning {
            Some(thinking) => format!(
                "{THINK_OPEN}\n{thinking}\n{THINK_CLOSE}\n\n{}",
                self.content
            ),
            None => self.content.clone(),
        }
    }

    /// A reply as the model wrote it, its closed thinking apart from the answer (what the
    /// templates of reasoning models expect); an unclosed thinking stays in `content`, so
    /// that continuing it goes on where it stopped.
    pub fn reply(content: &str) -> Self {
        match split_reply(content) {
            (Some(thinking), answer) if content.contains(THINK_CLOSE) => Self {
                reasoning: Some(thinking),
                ..Self::assistant(answer)
            },
            _ => Self::assistant(content),
        }
    }

    pub fn system(content: impl Into<String>) -> Self {
        Self::new(Role::System, content)
    }

    pub fn user(content: impl Into<String>) -> Self {
        Self::new(Role::User, content)
    }

    pub fn assistant(content: impl Into<String>) -> Self {
        Self::new(Role::Assistant, content)
    }
}

/// Where the template came from, so the UI/CLI can warn when it is only a guess.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TemplateSource {
    File(PathBuf),
    /// Given as text, e.g. a user override from the settings.
    Inline,
    FallbackChatMl,
}

impl fmt::Display for TemplateSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::File(path) => write!(f, "{}", path.display()),
            Self::Inline => f.write_str("the custom template"),
            Self::FallbackChatMl => f.write_str("the built-in ChatML fallback"),
        }
    }
}

#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    source: TemplateSource,
    /// `bos_token`, `eos_token`, ... as transformers passes them to the template.
    special_tokens: BTreeMap<&'static str, String>,
}

/// `bos_token` and `eos_token` as the template sees them, where known.
fn named_special_tokens(
    bos_token: Option<&str>,
    eos_token: Option<&str>,
) -> BTreeMap<&'static str, String> {
    [("bos_token", bos_token), ("eos_token", eos_token)]
        .into_iter()
        .filter_map(|(name, token)| Some((name, token?.to_owned())))
        .collect()
}

impl ChatTemplate {
    /// Loads the template and special tokens from a model folder, falling back to
    /// ChatML when none of the usual files carries a template.
    pub fn from_dir(dir: &Path) -> Result<Self> {
        let config_path = dir.join(TOKENIZER_CONFIG_FILE);
        let config = read_optional_json(&config_path)?;

        let mut special_tokens = BTreeMap::new();
        if let Some(config) = &config {
            for field in ["bos_token", "eos_token", "unk_token", "pad_token"] {
                if let Some(token) = special_token(config, field, &config_path)? {
                    special_tokens.insert(field, token);
                }
            }
        }

        let (template, source) = match find_template(dir, config.as_ref(), &config_path)? {
            Some((template, path)) => (template, TemplateSource::File(path)),
            None => (CHATML_TEMPLATE.to_owned(), TemplateSource::FallbackChatMl),
        };
        Self::from_source(template, source, special_tokens)
    }

    /// The template a model file carries inside it (a GGUF file's `tokenizer.chat_template`),
    /// or ChatML when it carries none.
    pub fn embedded(
        path: &Path,
        template: Option<&str>,
        bos_token: Option<&str>,
        eos_token: Option<&str>,
    ) -> Result<Self> {
        let (template, source) = match template {
            Some(template) => (
                template.to_owned(),
                TemplateSource::File(path.to_path_buf()),
            ),
            None => (CHATML_TEMPLATE.to_owned(), TemplateSource::FallbackChatMl),
        };
        Self::from_source(template, source, named_special_tokens(bos_token, eos_token))
    }

    /// Builds a template from text, e.g. a user override from the settings.
    pub fn from_template_text(
        template: &str,
        bos_token: Option<&str>,
        eos_token: Option<&str>,
    ) -> Result<Self> {
        Self::from_source(
            template.to_owned(),
            TemplateSource::Inline,
            named_special_tokens(bos_token, eos_token),
        )
    }

    fn from_source(
        template: String,
        source: TemplateSource,
        special_tokens: BTreeMap<&'static str, String>,
    ) -> Result<Self> {
        let mut env = python_like_environment();
        env.add_template_owned(TEMPLATE_NAME, template)
            .map_err(|err| TextError::TemplateSyntax {
                origin: source.to_string(),
                source: err,
            })?;
        Ok(Self {
            env,
            source,
            special_tokens,
        })
    }

    pub fn source(&self) -> &TemplateSource {
        &self.source
    }

    /// Whether the template reads the variable `name` (a plain search of its source, which
    /// is what a template's optional switches need: they are read, or they do nothing).
    pub fn reads(&self, name: &str) -> bool {
        self.env
            .get_template(TEMPLATE_NAME)
            .is_ok_and(|template| template.source().contains(name))
    }

    /// True when the model folder had no template and ChatML is being assumed.
    pub fn is_fallback(&self) -> bool {
        self.source == TemplateSource::FallbackChatMl
    }

    pub fn bos_token(&self) -> Option<&str> {
        self.special_tokens.get("bos_token").map(String::as_str)
    }

    pub fn eos_token(&self) -> Option<&str> {
        self.special_tokens.get("eos_token").map(String::as_str)
    }

    /// Renders the prompt text. With `add_generation_prompt` the text ends with the
    /// assistant header, so the model's next tokens are the reply.
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        self.render_with(messages, add_generation_prompt, &TemplateVariables::new())
    }

    /// [`ChatTemplate::render_with`] in pieces, the system and user messages' text apart
    /// from what the template wrote around it. A template that copies, cuts or reorders a
    /// message's text beyond recognition gets its rendering back as one template piece.
    pub fn render_pieces(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        variables: &TemplateVariables,
    ) -> Result<Vec<PromptPiece>> {
        let bracketed: Vec<ChatMessage> = messages
            .iter()
            .map(|message| match message.role {
                Role::Assistant => message.clone(),
                Role::System | Role::User => {
                    let text: String = message
                        .content
                        .chars()
                        .filter(|&c| c != WRITTEN_START && c != WRITTEN_END)
                        .collect();
                    ChatMessage {
                        content: format!("{WRITTEN_START}{text}{WRITTEN_END}"),
                        ..message.clone()
                    }
                }
            })
            .collect();
        let rendered = self.render_with(&bracketed, add_generation_prompt, variables)?;
        Ok(split_written(&rendered).unwrap_or_else(|| {
            let plain = rendered.replace([WRITTEN_START, WRITTEN_END], "");
            vec![PromptPiece::Template(plain)]
        }))
    }

    /// [`ChatTemplate::render`] with more variables for the template, as transformers'
    /// `apply_chat_template` passes its keyword arguments: `enable_thinking` for Qwen3's and
    /// SmolLM3's templates, for example.
    pub fn render_with(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        variables: &TemplateVariables,
    ) -> Result<String> {
        let mut context: BTreeMap<&str, Value> = self
            .special_tokens
            .iter()
            .map(|(name, token)| (*name, Value::from(token.as_str())))
            .collect();
        context.extend(
            variables
                .iter()
                .map(|(name, value)| (name.as_str(), Value::from_serialize(value))),
        );
        context.insert("messages", Value::from_serialize(messages));
        context.insert("add_generation_prompt", Value::from(add_generation_prompt));

        let render_error = |err| TextError::TemplateRender {
            origin: self.source.to_string(),
            source: err,
        };
        let mut out = BoundedOutput::default();
        self.env
            .get_template(TEMPLATE_NAME)
            .and_then(|template| template.render_captured_to(&context, &mut out).map(drop))
            .map_err(render_error)?;
        String::from_utf8(out.bytes).map_err(|err| {
            render_error(minijinja::Error::new(
                minijinja::ErrorKind::InvalidOperation,
                format!("the template wrote invalid UTF-8: {err}"),
            ))
        })
    }
}

/// `rendered` cut at the brackets around what people wrote; `None` when they do not pair up.
fn split_written(rendered: &str) -> Option<Vec<PromptPiece>> {
    let mut pieces = Vec::new();
    let mut rest = rendered;
    while let Some(start) = rest.find(WRITTEN_START) {
        let (before, after) = rest.split_at(start);
        let after = &after[WRITTEN_START.len_utf8()..];
        let end = after.find(WRITTEN_END)?;
        if after[..end].contains(WRITTEN_START) {
            return None;
        }
        pieces.push(PromptPiece::Template(before.to_owned()));
        pieces.push(PromptPiece::Written(after[..end].to_owned()));
        rest = &after[end + WRITTEN_END.len_utf8()..];
    }
    if rest.contains(WRITTEN_END) {
        return None;
    }
    pieces.push(PromptPiece::Template(rest.to_owned()));
    pieces.retain(|piece| !matches!(piece, PromptPiece::Template(text) if text.is_empty()));
    Some(pieces)
}

/// The longest prompt text a template may write: far beyond any context these models have
/// (a token is a few bytes), and small enough that a template written to fill memory stops
/// long before it does.
const MAX_RENDERED_BYTES: usize = 16 << 20;

/// Where a rendering is written: it fails once the text passes [`MAX_RENDERED_BYTES`].
#[derive(Default)]
struct BoundedOutput {
    bytes: Vec<u8>,
}

impl std::io::Write for BoundedOutput {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        if self.bytes.len() + data.len() > MAX_RENDERED_BYTES {
            return Err(std::io::Error::other(format!(
                "the prompt would be longer than {} MiB",
                MAX_RENDERED_BYTES >> 20
            )));
        }
        self.bytes.extend_from_slice(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Looks for a template in transformers' order of precedence.
fn find_template(
    dir: &Path,
    config: Option<&Json>,
    config_path: &Path,
) -> Result<Option<(String, PathBuf)>> {
    let jinja_path = dir.join(CHAT_TEMPLATE_FILE);
    match std::fs::read_to_string(&jinja_path) {
        Ok(template) => return Ok(Some((template, jinja_path))),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
        Err(source) => {
            return Err(TextError::Io {
                path: jinja_path,
                source,
            });
        }
    }

    let json_path = dir.join(CHAT_TEMPLATE_JSON_FILE);
    if let Some(json) = read_optional_json(&json_path)?
        && let Some(template) = template_field(&json, &json_path)?
    {
        return Ok(Some((template, json_path)));
    }

    match config {
        Some(config) => {
            Ok(template_field(config, config_path)?
                .map(|template| (template, config_path.to_owned())))
        }
        None => Ok(None),
    }
}

/// `chat_template` is either one template or a list of named ones (`default`,
/// `tool_use`, ...); a chat app wants the default.
fn template_field(config: &Json, path: &Path) -> Result<Option<String>> {
    let invalid = |reason: String| TextError::InvalidConfig {
        path: path.to_owned(),
        field: "chat_template",
        reason,
    };
    match config.get("chat_template") {
        None | Some(Json::Null) => Ok(None),
        Some(Json::String(template)) => Ok(Some(template.clone())),
        Some(Json::Array(named)) => {
            let default = named
                .iter()
                .find(|entry| entry.get("name").and_then(Json::as_str) == Some("default"))
                .ok_or_else(|| {
                    invalid("a list of templates without one named \"default\"".into())
                })?;
            match default.get("template") {
                Some(Json::String(template)) => Ok(Some(template.clone())),
                _ => Err(invalid(
                    "the \"default\" entry has no string `template`".into(),
                )),
            }
        }
        Some(other) => Err(invalid(format!(
            "expected a string or a list of named templates, found {other}"
        ))),
    }
}
