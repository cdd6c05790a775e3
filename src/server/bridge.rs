//! From the engine's events for one request to what the HTTP side sends: a plain thread per
//! request (tokio's blocking pool) waits on the engine's channel and feeds a tokio channel,
//! applying the stop strings on the way. When the HTTP side goes away (the client hung up),
//! the next send fails, the engine client is dropped, and that stops the generation before
//! its next token.

use std::time::Duration;

use crossbeam_channel::RecvTimeoutError;
use tokio::sync::mpsc::UnboundedSender;

use super::error::ApiError;
use crate::engine::{Client, Event, RequestId};
use crate::generation::{FinishReason, TokenEvent};
use crate::text::{Released, StopStrings};

/// How often a request that waits in the queue checks whether its client is still there.
const POLL: Duration = Duration::from_millis(50);

/// What the HTTP side hears about one generation, in order: `Waiting` while it is queued,
/// `Reading` while a long prompt is read, `Started` or `Failed`, then text, then `Finished`
/// or `Failed`.
#[derive(Debug)]
pub enum Output {
    /// The request waits its turn behind `ahead` generations.
    Waiting {
        ahead: usize,
    },
    /// A long prompt is being read: `done` of its `total` tokens so far.
    Reading {
        done: usize,
        total: usize,
    },
    /// The prompt is in; the reply begins.
    Started {
        prompt_tokens: usize,
    },
    /// Text the client may see, with the tokens that brought it.
    Text {
        text: String,
        tokens: Vec<TokenEvent>,
    },
    Finished {
        reason: &'static str,
        completion_tokens: usize,
    },
    Failed(ApiError),
}

/// OpenAI's finish reasons: `stop` when the model or a stop string ended the reply, `length`
/// when the token budget or the context ran out.
fn finish_reason(reason: FinishReason) -> &'static str {
    match reason {
        FinishReason::StopToken | FinishReason::Stopped => "stop",
        FinishReason::MaxTokens | FinishReason::ContextFull => "length",
    }
}

/// Relays request `id` of `client` to `out` until it ends or `out` is closed. Runs on a
/// blocking thread; returning drops `client`, which stops whatever of the request remains.
pub fn relay(
    client: Client,
    id: RequestId,
    stops: Vec<String>,
    prompt_field: &str,
    out: UnboundedSender<Output>,
) {
    let mut stops = StopStrings::new(stops);
    let mut completion_tokens = 0;
    let send_text = |released: Released<TokenEvent>| {
        (released.text.is_empty() && released.items.is_empty())
            || out
                .send(Output::Text {
                    text: released.text,
                    tokens: released.items,
                })
                .is_ok()
    };
    loop {
        let event = match client.events().recv_timeout(POLL) {
            Ok(event) => event,
            Err(RecvTimeoutError::Timeout) if out.is_closed() => return,
            Err(RecvTimeoutError::Timeout) if client.engine_running() => continue,
            Err(_) => {
                let _ = out.send(Output::Failed(ApiError::engine_gone()));
                return;
            }
        };
        match event {
            Event::Waiting { request, ahead }
                if request == id && out.send(Output::Waiting { ahead }).is_err() =>
            {
                return;
            }
            Event::PromptProgress {
                request,
                done,
                total,
            } if request == id && out.send(Output::Reading { done, total }).is_err() => {
                return;
            }
            Event::PromptProcessed { request, stats, .. } if request == id => {
                let started = Output::Started {
                    prompt_tokens: stats.prompt_tokens,
                };
                if out.send(started).is_err() {
                    return;
                }
            }
            Event::Token { request, token } if request == id => {
                completion_tokens += 1;
                let text = token.text.clone();
                let released = stops.push(&text, token);
                let stopped = released.stopped;
                if !send_text(released) {
                    return;
                }
                if stopped {
                    let _ = out.send(Output::Finished {
                        reason: "stop",
                        completion_tokens,
                    });
                    return;
                }
            }
            Event::Finished {
                request,
                reason,
                text,
                ..
            } if request == id => {
                let released = stops.finish(&text);
                let reason = if released.stopped {
                    "stop"
                } else {
                    finish_reason(reason)
                };
                if send_text(released) {
                    let _ = out.send(Output::Finished {
                        reason,
                        completion_tokens,
                    });
                }
                return;
            }
            Event::Busy { refused } if refused == id => {
                let _ = out.send(Output::Failed(ApiError::busy()));
                return;
            }
            Event::Error {
                request: Some(request),
                error,
            } if request == id => {
                let _ = out.send(Output::Failed(ApiError::from_engine(&error, prompt_field)));
                return;
            }
            _ => {}
        }
    }
}
