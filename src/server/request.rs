//! Reading an OpenAI request body into a generation: every field we honour is checked and a
//! wrong one is refused naming it; fields we do not know are ignored, as OpenAI's own
//! clients send many; values we cannot honour are refused rather than silently dropped.

use serde_json::{Map, Value};

use super::error::ApiError;
use crate::engine::{GenerateRequest, Prompt};
use crate::text::{
    ChatMessage, OverflowPolicy, Role, SamplingError, SamplingParams, TemplateVariables,
};

/// The most alternatives per token OpenAI's chat API allows; completions allow 5, and we
/// accept up to this many there too.
pub const MAX_TOP_LOGPROBS: u64 = 20;
/// OpenAI's limit on stop strings.
const MAX_STOPS: usize = 4;
/// Bytes per stop string: matching costs grow with its square, and no reply needs more.
const MAX_STOP_BYTES: usize = 1024;
/// OpenAI's default for `/v1/completions` when `max_tokens` is absent.
const COMPLETIONS_DEFAULT_MAX_TOKENS: usize = 16;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Completions,
}

impl Endpoint {
    /// The field holding the prompt, for errors about its length.
    pub fn prompt_field(self) -> &'static str {
        match self {
            Endpoint::Chat => "messages",
            Endpoint::Completions => "prompt",
        }
    }
}

/// A request, checked: what to generate and how to answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    pub generate: GenerateRequest,
    pub stream: bool,
    /// `stream_options.include_usage`: a last chunk with the token counts.
    pub include_usage: bool,
    pub stop: Vec<String>,
    /// Report log-probabilities with this many alternatives.
    pub logprobs: Option<usize>,
}

/// Reads `body` for `endpoint`; `served` are the names the loaded model answers to.
pub fn parse(endpoint: Endpoint, body: &[u8], served: &[String]) -> Result<Job, ApiError> {
    let value: Value = serde_json::from_slice(body).map_err(ApiError::bad_json)?;
    let Value::Object(map) = value else {
        return Err(ApiError::bad_json("expected a JSON object"));
    };
    let fields = Fields(&map);

    if let Some(model) = fields.string("model")?
        && !served.iter().any(|name| name == model)
    {
        return Err(ApiError::unknown_model(model, &served[0]));
    }
    refuse_unsupported(&fields, endpoint)?;

    let prompt = match endpoint {
        Endpoint::Chat => Prompt::Chat(messages(&fields)?),
        Endpoint::Completions => Prompt::Raw(raw_prompt(&fields)?),
    };
    let max_new_tokens = match endpoint {
        Endpoint::Chat => match fields.count("max_completion_tokens")? {
            Some(tokens) => Some(at_least_one("max_completion_tokens", tokens)?),
            None => fields
                .count("max_tokens")?
                .map(|tokens| at_least_one("max_tokens", tokens))
                .transpose()?,
        },
        Endpoint::Completions => Some(
            fields
                .count("max_tokens")?
                .map(|tokens| at_least_one("max_tokens", tokens))
                .transpose()?
                .unwrap_or(COMPLETIONS_DEFAULT_MAX_TOKENS),
        ),
    };
    let logprobs = match endpoint {
        Endpoint::Chat => {
            let top = fields.count("top_logprobs")?;
            if let Some(top) = top {
                if top > MAX_TOP_LOGPROBS {
                    return Err(ApiError::invalid(
                        "top_logprobs",
                        format!("at most {MAX_TOP_LOGPROBS}, got {top}"),
                    ));
                }
                if fields.bool("logprobs")? != Some(true) {
                    return Err(ApiError::invalid(
                        "top_logprobs",
                        "needs `logprobs` set to true",
                    ));
                }
            }
            (fields.bool("logprobs")? == Some(true)).then_some(top.unwrap_or(0) as usize)
        }
        Endpoint::Completions => match fields.count("logprobs")? {
            Some(top) if top > MAX_TOP_LOGPROBS => {
                return Err(ApiError::invalid(
                    "logprobs",
                    format!("at most {MAX_TOP_LOGPROBS}, got {top}"),
                ));
            }
            top => top.map(|top| top as usize),
        },
    };
    let stream = fields.bool("stream")?.unwrap_or(false);
    let include_usage = match fields.get("stream_options") {
        None => false,
        Some(Value::Object(options)) => Fields(options)
            .bool("include_usage")
            .map_err(|_| {
                ApiError::invalid("stream_options.include_usage", "must be true or false")
            })?
            .unwrap_or(false),
        Some(_) => return Err(ApiError::invalid("stream_options", "must be an object")),
    };
    Ok(Job {
        generate: GenerateRequest {
            prompt,
            sampling: sampling(&fields)?,
            max_new_tokens,
            overflow: OverflowPolicy::Stop,
            logprobs,
            template_variables: template_variables(&fields, endpoint)?,
        },
        stream,
        include_usage,
        stop: stop_strings(&fields)?,
        logprobs,
    })
}

/// `chat_template_kwargs`, as llama-server and vLLM take it: variables for the chat template,
/// `{"enable_thinking": false}` for a reasoning model that should answer at once.
fn template_variables(fields: &Fields, endpoint: Endpoint) -> Result<TemplateVariables, ApiError> {
    match (fields.get("chat_template_kwargs"), endpoint) {
        (None | Some(Value::Null), _) => Ok(TemplateVariables::new()),
        (Some(Value::Object(variables)), Endpoint::Chat) => Ok(variables.clone()),
        (Some(_), Endpoint::Chat) => Err(ApiError::invalid(
            "chat_template_kwargs",
            "must be an object of template variables",
        )),
        (Some(_), Endpoint::Completions) => Err(ApiError::invalid(
            "chat_template_kwargs",
            "applies to /v1/chat/completions only",
        )),
    }
}

/// Options we cannot honour: refused when set to anything but their neutral value.
fn refuse_unsupported(fields: &Fields, endpoint: Endpoint) -> Result<(), ApiError> {
    if let Some(n) = fields.count("n")?
        && n != 1
    {
        return Err(ApiError::invalid(
            "n",
            format!("only 1 choice is supported, got {n}"),
        ));
    }
    for penalty in ["frequency_penalty", "presence_penalty"] {
        if let Some(value) = fields.number(penalty)?
            && value != 0.0
        {
            return Err(ApiError::invalid(
                penalty,
                format!("is not supported (only 0); use repetition_penalty instead, got {value}"),
            ));
        }
    }
    if let Some(bias) = fields.get("logit_bias")
        && bias.as_object().is_none_or(|bias| !bias.is_empty())
    {
        return Err(ApiError::invalid("logit_bias", "is not supported"));
    }
    for tools in ["tools", "functions"] {
        if let Some(list) = fields.get(tools)
            && list.as_array().is_none_or(|list| !list.is_empty())
        {
            return Err(ApiError::invalid(
                tools,
                "function calling is not supported",
            ));
        }
    }
    if let Some(format) = fields.get("response_format")
        && format.get("type").and_then(Value::as_str) != Some("text")
    {
        return Err(ApiError::invalid(
            "response_format",
            "only {\"type\": \"text\"} is supported",
        ));
    }
    if endpoint == Endpoint::Completions {
        if fields.bool("echo")? == Some(true) {
            return Err(ApiError::invalid("echo", "is not supported"));
        }
        if fields
            .string("suffix")?
            .is_some_and(|suffix| !suffix.is_empty())
        {
            return Err(ApiError::invalid("suffix", "is not supported"));
        }
        if let Some(best_of) = fields.count("best_of")?
            && best_of != 1
        {
            return Err(ApiError::invalid(
                "best_of",
                format!("only 1 is supported, got {best_of}"),
            ));
        }
    }
    Ok(())
}

fn at_least_one(field: &str, tokens: u64) -> Result<usize, ApiError> {
    match usize::try_from(tokens) {
        Ok(0) => Err(ApiError::invalid(field, "must be at least 1")),
        Ok(tokens) => Ok(tokens),
        Err(_) => Err(ApiError::invalid(field, format!("{tokens} is too large"))),
    }
}

fn messages(fields: &Fields) -> Result<Vec<ChatMessage>, ApiError> {
    let Some(list) = fields.get("messages") else {
        return Err(ApiError::invalid("messages", "is required"));
    };
    let Some(list) = list.as_array().filter(|list| !list.is_empty()) else {
        return Err(ApiError::invalid("messages", "must be a non-empty array"));
    };
    list.iter()
        .enumerate()
        .map(|(index, message)| {
            let field = |name: &str| format!("messages[{index}].{name}");
            let Some(message) = message.as_object() else {
                return Err(ApiError::invalid(
                    &format!("messages[{index}]"),
                    "must be an object",
                ));
            };
            let role = match message.get("role") {
                // OpenAI's newer name for the system role.
                Some(Value::String(role)) if role == "system" || role == "developer" => {
                    Role::System
                }
                Some(Value::String(role)) if role == "user" => Role::User,
                Some(Value::String(role)) if role == "assistant" => Role::Assistant,
                Some(Value::String(other)) => {
                    return Err(ApiError::invalid(
                        &field("role"),
                        format!("{other:?} is not supported; use system, user or assistant"),
                    ));
                }
                None | Some(Value::Null) => {
                    return Err(ApiError::invalid(&field("role"), "is required"));
                }
                Some(other) => {
                    return Err(ApiError::invalid(
                        &field("role"),
                        format!("must be a string (system, user or assistant), not {other}"),
                    ));
                }
            };
            let content = match message.get("content") {
                Some(Value::String(text)) => text.clone(),
                // Content parts: only text ones, joined.
                Some(Value::Array(parts)) => parts
                    .iter()
                    .map(|part| match (part.get("type").and_then(Value::as_str), part.get("text")) {
                        (Some("text"), Some(Value::String(text))) => Ok(text.as_str()),
                        _ => Err(ApiError::invalid(
                            &field("content"),
                            "only text parts ({\"type\": \"text\", \"text\": ...}) are supported",
                        )),
                    })
                    .collect::<Result<Vec<_>, _>>()?
                    .concat(),
                _ => return Err(ApiError::invalid(&field("content"), "must be a string")),
            };
            if role != Role::Assistant {
                return Ok(ChatMessage::new(role, content));
            }
            // An earlier reply's thinking, sent back apart (as this server returns it) or
            // inside its text; each template decides whether the model sees it again.
            let mut reply = ChatMessage::reply(&content);
            match message.get("reasoning_content") {
                None | Some(Value::Null) => {}
                Some(Value::String(thinking)) => reply.reasoning = Some(thinking.clone()),
                Some(_) => {
                    return Err(ApiError::invalid(
                        &field("reasoning_content"),
                        "must be a string",
                    ));
                }
            }
            Ok(reply)
        })
        .collect()
}

fn raw_prompt(fields: &Fields) -> Result<String, ApiError> {
    match fields.get("prompt") {
        Some(Value::String(text)) => Ok(text.clone()),
        Some(Value::Array(list)) => match list.as_slice() {
            [Value::String(text)] => Ok(text.clone()),
            _ => Err(ApiError::invalid(
                "prompt",
                "only one prompt, as a string, is supported (no batches or token ids)",
            )),
        },
        Some(_) => Err(ApiError::invalid("prompt", "must be a string")),
        None => Err(ApiError::invalid("prompt", "is required")),
    }
}

fn stop_strings(fields: &Fields) -> Result<Vec<String>, ApiError> {
    let stops = match fields.get("stop") {
        None => Vec::new(),
        Some(Value::String(stop)) => vec![stop.clone()],
        Some(Value::Array(list)) => list
            .iter()
            .map(|stop| {
                stop.as_str().map(str::to_string).ok_or_else(|| {
                    ApiError::invalid("stop", "must be a string or a list of strings")
                })
            })
            .collect::<Result<_, _>>()?,
        Some(_) => {
            return Err(ApiError::invalid(
                "stop",
                "must be a string or a list of strings",
            ));
        }
    };
    if stops.len() > MAX_STOPS {
        return Err(ApiError::invalid(
            "stop",
            format!("at most {MAX_STOPS} strings, got {}", stops.len()),
        ));
    }
    if stops.iter().any(String::is_empty) {
        return Err(ApiError::invalid(
            "stop",
            "an empty string cannot end a reply",
        ));
    }
    if stops.iter().any(|stop| stop.len() > MAX_STOP_BYTES) {
        return Err(ApiError::invalid(
            "stop",
            format!("each string may have at most {MAX_STOP_BYTES} bytes"),
        ));
    }
    Ok(stops)
}

/// Our sampling defaults (those of the window) for what the request leaves out; a random
/// seed unless it gives one.
fn sampling(fields: &Fields) -> Result<SamplingParams, ApiError> {
    let defaults = SamplingParams::default();
    let params = SamplingParams {
        temperature: fields.f32("temperature")?.unwrap_or(defaults.temperature),
        top_p: fields.f32("top_p")?.unwrap_or(defaults.top_p),
        top_k: match fields.count("top_k")? {
            Some(top_k) => {
                usize::try_from(top_k).map_err(|_| ApiError::invalid("top_k", "is too large"))?
            }
            None => defaults.top_k,
        },
        min_p: fields.f32("min_p")?.unwrap_or(defaults.min_p),
        repetition_penalty: fields
            .f32("repetition_penalty")?
            .unwrap_or(defaults.repetition_penalty),
        seed: match fields.get("seed") {
            None => rand::random(),
            // OpenAI's seed is a signed 64-bit integer; ours takes its bits.
            Some(seed) => seed
                .as_u64()
                .or_else(|| seed.as_i64().map(|seed| seed as u64))
                .ok_or_else(|| ApiError::invalid("seed", "must be an integer"))?,
        },
    };
    params.validate().map_err(|error| {
        let field = match error {
            SamplingError::Temperature(_) => "temperature",
            SamplingError::TopP(_) => "top_p",
            SamplingError::MinP(_) => "min_p",
            SamplingError::RepetitionPenalty(_) => "repetition_penalty",
            _ => "sampling",
        };
        ApiError::invalid(field, error.to_string())
    })?;
    Ok(params)
}

/// A request's fields, each read as one type with an error naming it; `null` counts as
/// absent, as in OpenAI's API.
struct Fields<'a>(&'a Map<String, Value>);

impl Fields<'_> {
    fn get(&self, name: &str) -> Option<&Value> {
        self.0.get(name).filter(|value| !value.is_null())
    }

    fn number(&self, name: &str) -> Result<Option<f64>, ApiError> {
        self.get(name)
            .map(|value| {
                value.as_f64().ok_or_else(|| {
                    ApiError::invalid(name, format!("must be a number, got {value}"))
                })
            })
            .transpose()
    }

    fn f32(&self, name: &str) -> Result<Option<f32>, ApiError> {
        Ok(self.number(name)?.map(|value| value as f32))
    }

    /// A non-negative integer.
    fn count(&self, name: &str) -> Result<Option<u64>, ApiError> {
        self.get(name)
            .map(|value| {
                value.as_u64().ok_or_else(|| {
                    ApiError::invalid(name, format!("must be a non-negative integer, got {value}"))
                })
            })
            .transpose()
    }

    fn bool(&self, name: &str) -> Result<Option<bool>, ApiError> {
        self.get(name)
            .map(|value| {
                value.as_bool().ok_or_else(|| {
                    ApiError::invalid(name, format!("must be true or false, got {value}"))
                })
            })
            .transpose()
    }

    fn string(&self, name: &str) -> Result<Option<&str>, ApiError> {
        self.get(name)
            .map(|value| {
                value.as_str().ok_or_else(|| {
                    ApiError::invalid(name, format!("must be a string, got {value}"))
                })
            })
            .transpose()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::{Endpoint, Job, parse};
    use crate::engine::Prompt;
    use crate::server::error::ApiError;
    use crate::text::ChatMessage;

    fn parsed(endpoint: Endpoint, body: serde_json::Value) -> Result<Job, ApiError> {
        parse(endpoint, body.to_string().as_bytes(), &["m".to_owned()])
    }

    #[test]
    fn chat_template_kwargs_reach_the_template() {
        let body = json!({
            "messages": [{"role": "user", "content": "Hi"}],
            "chat_template_kwargs": {"enable_thinking": false},
        });
        let job = parsed(Endpoint::Chat, body).expect("valid");
        assert_eq!(
            job.generate.template_variables["enable_thinking"],
            json!(false)
        );
        let wrong = json!({
            "messages": [{"role": "user", "content": "Hi"}],
            "chat_template_kwargs": "no",
        });
        let err = parsed(Endpoint::Chat, wrong).expect_err("refused");
        assert_eq!(err.param.as_deref(), Some("chat_template_kwargs"));
        let raw = json!({"prompt": "Hi", "chat_template_kwargs": {}});
        let err = parsed(Endpoint::Completions, raw).expect_err("refused");
        assert_eq!(err.param.as_deref(), Some("chat_template_kwargs"));
    }

    /// An earlier reply's thinking, sent back apart or inside its text, stays apart from its
    /// answer, for the template to show or leave out.
    #[test]
    fn an_earlier_reply_keeps_its_thinking_apart() {
        let body = json!({"messages": [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello.", "reasoning_content": "A greeting."},
            {"role": "user", "content": "And?"},
            {"role": "assistant", "content": "<think>\nMore.\n</think>\n\nMore."},
            {"role": "user", "content": "Bye"},
        ]});
        let job = parsed(Endpoint::Chat, body).expect("valid");
        let Prompt::Chat(messages) = job.generate.prompt else {
            panic!("a chat prompt");
        };
        let expected = |answer: &str, thinking: &str| ChatMessage {
            reasoning: Some(thinking.to_owned()),
            ..ChatMessage::assistant(answer)
        };
        assert_eq!(messages[1], expected("Hello.", "A greeting."));
        assert_eq!(messages[3], expected("More.", "More."));
        let role = json!({"messages": [{"role": 1, "content": "x"}]});
        let err = parsed(Endpoint::Chat, role).expect_err("refused");
        assert!(err.message.contains("must be a string"), "{}", err.message);
        let bad =
            json!({"messages": [{"role": "assistant", "content": "x", "reasoning_content": 1}]});
        let err = parsed(Endpoint::Chat, bad).expect_err("refused");
        assert_eq!(err.param.as_deref(), Some("messages[0].reasoning_content"));
    }
}
