//! The JSON OpenAI's clients expect back: whole responses, streamed chunks, token counts and
//! log-probabilities, for chat and for plain completions.

use serde_json::{Value, json};

use super::request::Endpoint;
use crate::generation::TokenEvent;
use crate::text::reasoning::{ReplyPart, ThinkingSplitter, split_reply};

/// JSON has no infinity; OpenAI reports a token the model rules out with this.
const IMPOSSIBLE_LOGPROB: f32 = -9999.0;

fn logprob_value(logprob: f32) -> f32 {
    if logprob.is_finite() {
        logprob
    } else {
        IMPOSSIBLE_LOGPROB
    }
}

/// A chat delta of `pieces`: `reasoning_content` for thinking, `content` for the answer, or
/// `empty` when they hold no text.
fn delta(pieces: Vec<(ReplyPart, String)>, empty: Value) -> Value {
    let mut delta = serde_json::Map::new();
    for (part, text) in pieces {
        let field = match part {
            ReplyPart::Thinking => "reasoning_content",
            ReplyPart::Answer => "content",
        };
        let joined = match delta.remove(field) {
            Some(Value::String(before)) => before + &text,
            _ => text,
        };
        delta.insert(field.to_owned(), Value::String(joined));
    }
    if delta.is_empty() {
        empty
    } else {
        Value::Object(delta)
    }
}

/// Builds the responses of one request; for completions it keeps the text offset of each
/// token across chunks.
#[derive(Debug)]
pub struct Responder {
    pub endpoint: Endpoint,
    pub id: String,
    pub created: u64,
    pub model: String,
    /// Whether log-probabilities were asked for.
    pub logprobs: bool,
    pub prompt_tokens: usize,
    text_offset: usize,
    /// A chat reply's thinking goes out as `reasoning_content` beside `content`, as
    /// llama-server sends it.
    thinking: ThinkingSplitter,
}

impl Responder {
    pub fn new(
        endpoint: Endpoint,
        request: u64,
        created: u64,
        model: String,
        logprobs: bool,
        prompt_tokens: usize,
    ) -> Self {
        let prefix = match endpoint {
            Endpoint::Chat => "chatcmpl",
            Endpoint::Completions => "cmpl",
        };
        Self {
            endpoint,
            id: format!("{prefix}-{request}"),
            created,
            model,
            logprobs,
            prompt_tokens,
            text_offset: 0,
            thinking: ThinkingSplitter::new(false),
        }
    }

    pub fn usage(&self, completion_tokens: usize) -> Value {
        json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": self.prompt_tokens + completion_tokens,
        })
    }

    /// The whole answer of a request that did not stream.
    pub fn complete(
        &mut self,
        text: String,
        tokens: &[TokenEvent],
        reason: &str,
        completion_tokens: usize,
    ) -> Value {
        let logprobs = self.logprobs_of(tokens);
        let choice = match self.endpoint {
            Endpoint::Chat => {
                let (thinking, answer) = split_reply(&text);
                let mut message = json!({"role": "assistant", "content": answer});
                if let Some(thinking) = thinking {
                    message["reasoning_content"] = thinking.into();
                }
                json!({
                    "index": 0,
                    "message": message,
                    "logprobs": logprobs,
                    "finish_reason": reason,
                })
            }
            Endpoint::Completions => json!({
                "index": 0,
                "text": text,
                "logprobs": logprobs,
                "finish_reason": reason,
            }),
        };
        self.envelope(false, vec![choice], Some(self.usage(completion_tokens)))
    }

    /// The chunk that opens a chat stream: the assistant's role.
    pub fn opening_chunk(&self) -> Option<Value> {
        (self.endpoint == Endpoint::Chat).then(|| {
            self.chunk(
                json!({"role": "assistant", "content": ""}),
                Value::Null,
                None,
            )
        })
    }

    pub fn text_chunk(&mut self, text: String, tokens: &[TokenEvent]) -> Value {
        let logprobs = self.logprobs_of(tokens);
        match self.endpoint {
            Endpoint::Chat => {
                let pieces = self.thinking.push(&text);
                self.chunk(delta(pieces, json!({"content": ""})), logprobs, None)
            }
            Endpoint::Completions => self.chunk(Value::String(text), logprobs, None),
        }
    }

    /// The last chunk, with whatever text the thinking splitter still held.
    pub fn final_chunk(&mut self, reason: &str) -> Value {
        let rest = match self.endpoint {
            Endpoint::Chat => delta(self.thinking.finish(), json!({})),
            Endpoint::Completions => json!(""),
        };
        self.chunk(rest, Value::Null, Some(reason))
    }

    /// `stream_options.include_usage`: no choices, the counts.
    pub fn usage_chunk(&self, completion_tokens: usize) -> Value {
        self.envelope(true, Vec::new(), Some(self.usage(completion_tokens)))
    }

    fn object(&self, chunk: bool) -> &'static str {
        match (self.endpoint, chunk) {
            (Endpoint::Chat, false) => "chat.completion",
            (Endpoint::Chat, true) => "chat.completion.chunk",
            (Endpoint::Completions, _) => "text_completion",
        }
    }

    fn chunk(&self, content: Value, logprobs: Value, reason: Option<&str>) -> Value {
        let choice = match self.endpoint {
            Endpoint::Chat => json!({
                "index": 0,
                "delta": content,
                "logprobs": logprobs,
                "finish_reason": reason,
            }),
            Endpoint::Completions => json!({
                "index": 0,
                "text": content,
                "logprobs": logprobs,
                "finish_reason": reason,
            }),
        };
        self.envelope(true, vec![choice], None)
    }

    /// The fields every response and chunk share; `usage` only where it is sent.
    fn envelope(&self, chunk: bool, choices: Vec<Value>, usage: Option<Value>) -> Value {
        let mut body = json!({
            "id": self.id,
            "object": self.object(chunk),
            "created": self.created,
            "model": self.model,
            "system_fingerprint": null,
            "choices": choices,
        });
        if let Some(usage) = usage {
            body["usage"] = usage;
        }
        body
    }

    /// Chat: `{"content": [{token, logprob, bytes, top_logprobs}]}`; completions: parallel
    /// lists of tokens, their log-probabilities, the alternatives and text offsets.
    fn logprobs_of(&mut self, tokens: &[TokenEvent]) -> Value {
        if !self.logprobs {
            return Value::Null;
        }
        let scored = tokens.iter().filter_map(|token| token.logprobs.as_ref());
        match self.endpoint {
            Endpoint::Chat => {
                let entry = |text: &str, logprob: f32| {
                    json!({
                        "token": text,
                        "logprob": logprob_value(logprob),
                        "bytes": text.as_bytes(),
                    })
                };
                let content: Vec<Value> = scored
                    .map(|scores| {
                        let mut value = entry(&scores.text, scores.logprob);
                        value["top_logprobs"] = scores
                            .top
                            .iter()
                            .map(|(_, text, logprob)| entry(text, *logprob))
                            .collect();
                        value
                    })
                    .collect();
                json!({ "content": content })
            }
            Endpoint::Completions => {
                let (mut texts, mut logprobs, mut tops, mut offsets) =
                    (Vec::new(), Vec::new(), Vec::new(), Vec::new());
                for scores in scored {
                    texts.push(scores.text.clone());
                    logprobs.push(logprob_value(scores.logprob));
                    let top: serde_json::Map<String, Value> = scores
                        .top
                        .iter()
                        .map(|(_, text, logprob)| (text.clone(), json!(logprob_value(*logprob))))
                        .collect();
                    tops.push(top);
                    offsets.push(self.text_offset);
                    self.text_offset += scores.text.len();
                }
                json!({
                    "tokens": texts,
                    "token_logprobs": logprobs,
                    "top_logprobs": tops,
                    "text_offset": offsets,
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::Responder;
    use crate::server::request::Endpoint;

    fn chat() -> Responder {
        Responder::new(Endpoint::Chat, 1, 0, "m".into(), false, 3)
    }

    /// A reasoning model's thinking streams as `reasoning_content` deltas, its answer as
    /// `content`, whatever the pieces the text arrives in.
    #[test]
    fn thinking_streams_as_reasoning_content() {
        let mut responder = chat();
        let deltas: Vec<_> = ["<think>\nTwo", " and two.</th", "ink>\n\nFour", "."]
            .into_iter()
            .map(|text| responder.text_chunk(text.into(), &[])["choices"][0]["delta"].clone())
            .collect();
        assert_eq!(
            deltas,
            [
                json!({"reasoning_content": "Two"}),
                json!({"reasoning_content": " and two."}),
                json!({"content": "Four"}),
                json!({"content": "."}),
            ]
        );
        let last = responder.final_chunk("stop");
        assert_eq!(last["choices"][0]["delta"], json!({}));
        assert_eq!(last["choices"][0]["finish_reason"], "stop");
    }

    #[test]
    fn text_held_back_as_a_possible_marker_comes_out_at_the_end() {
        let mut responder = chat();
        let first = responder.text_chunk("<thi".into(), &[]);
        assert_eq!(first["choices"][0]["delta"], json!({"content": ""}));
        let last = responder.final_chunk("length");
        assert_eq!(last["choices"][0]["delta"], json!({"content": "<thi"}));
    }

    #[test]
    fn a_whole_reply_carries_its_thinking_apart() {
        let body = chat().complete("<think>\nHm.\n</think>\n\nYes.".into(), &[], "stop", 9);
        let message = &body["choices"][0]["message"];
        assert_eq!(message["content"], "Yes.");
        assert_eq!(message["reasoning_content"], "Hm.");
        let plain = chat().complete("Yes.".into(), &[], "stop", 2);
        assert!(
            plain["choices"][0]["message"]
                .get("reasoning_content")
                .is_none()
        );
    }

    /// Plain completions are text as written: nothing is taken apart.
    #[test]
    fn completions_keep_think_tags_as_text() {
        let mut responder = Responder::new(Endpoint::Completions, 1, 0, "m".into(), false, 3);
        let chunk = responder.text_chunk("<think>x</think>y".into(), &[]);
        assert_eq!(chunk["choices"][0]["text"], "<think>x</think>y");
    }
}
