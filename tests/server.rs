//! The local OpenAI-compatible server against the tiny checkpoint, over real sockets on
//! 127.0.0.1: every endpoint, streamed and not, and every error a client can cause.

use crate::common;

use std::net::SocketAddr;
use std::thread;
use std::time::{Duration, Instant};

use common::http::{self, HttpResponse, RawStream, get, post};
use common::tiny_model_dir;
use serde_json::{Value, json};
use smolchat::engine::{EngineHandle, EngineOptions, Event};
use smolchat::generation::{
    CheckedPrompt, FinishReason, GenerationSession, LoadedModel, ModelOptions, Step,
};
use smolchat::model::{Logits, logits_to_vec};
use smolchat::model_source::ModelSource;
use smolchat::server::{RunningServer, Server, ServerConfig, ServerLimits};
use smolchat::text::{ChatMessage, ContextWindow, OverflowPolicy, SamplingParams};

const MODEL: &str = "tiny-smollm";
/// Small, so that a too-large body fits the socket's buffers and the 413 can be read back.
const MAX_BODY: usize = 64 * 1024;

/// Fields drop in order: the server before the engine it uses.
struct Fixture {
    server: RunningServer,
    _engine: EngineHandle,
}

impl Fixture {
    fn start(queue_limit: usize, api_key: Option<&str>) -> Self {
        Self::start_configured(queue_limit, api_key, |_| {})
    }

    fn start_configured(
        queue_limit: usize,
        api_key: Option<&str>,
        configure: impl FnOnce(&mut ServerConfig),
    ) -> Self {
        // One request at a time, so that a second one waits in the queue.
        let options = EngineOptions {
            queue_limit,
            parallel: 1,
            ..EngineOptions::default()
        };
        let engine = EngineHandle::spawn_with(options, || {}).expect("spawn");
        engine.load_model(
            ModelSource::Folder(tiny_model_dir()),
            ModelOptions::default(),
        );
        loop {
            match engine.events().recv_timeout(http::TIMEOUT).expect("loads") {
                Event::ModelReady(_) => break,
                Event::Error { error, .. } => panic!("{error}"),
                _ => {}
            }
        }
        let mut config = loopback_config(api_key);
        configure(&mut config);
        let server = Server::bind(config, engine.clone_client())
            .expect("bind")
            .spawn()
            .expect("serve");
        Self {
            server,
            _engine: engine,
        }
    }

    fn address(&self) -> SocketAddr {
        self.server.address()
    }
}

fn loopback_config(api_key: Option<&str>) -> ServerConfig {
    ServerConfig {
        host: [127, 0, 0, 1].into(),
        port: 0,
        api_key: api_key.map(str::to_string),
        cors: Vec::new(),
        allowed_hosts: Vec::new(),
        model_names: vec![MODEL.to_string()],
        limits: ServerLimits {
            max_body_bytes: MAX_BODY,
            ..ServerLimits::default()
        },
    }
}

/// The text of a reply generated directly with [`GenerationSession`]: what the server must
/// reproduce for the same prompt and settings. `messages: None` continues `raw` as it is.
fn reference(
    messages: Option<&[ChatMessage]>,
    raw: &str,
    params: &SamplingParams,
    max_tokens: usize,
) -> (String, usize, FinishReason, usize) {
    let loaded = LoadedModel::load(&tiny_model_dir(), ModelOptions::default()).expect("load");
    let (prompt, history) = match messages {
        Some(messages) => {
            let window = ContextWindow {
                limit: 2048,
                reserve_for_reply: max_tokens,
                policy: OverflowPolicy::Stop,
            };
            let fitted = window
                .fit(
                    messages,
                    &loaded.template,
                    &Default::default(),
                    &loaded.tokenizer,
                )
                .expect("fits");
            (fitted.ids, fitted.history)
        }
        None => (loaded.tokenizer.encode(raw, false).expect("encode"), 0),
    };
    let prompt_len = prompt.len();
    let mut cache = loaded.model.new_cache();
    let checked = CheckedPrompt::new(prompt, cache.max_len(), params)
        .expect("a valid prompt")
        .with_history(history);
    let mut read_on = |_| std::ops::ControlFlow::Continue(());
    let mut session =
        GenerationSession::start_reading(&loaded, &mut cache, checked, max_tokens, &mut read_on)
            .expect("start");
    let (mut text, mut tokens) = (String::new(), 0);
    let reason = loop {
        match session.step().expect("step") {
            Step::Token(token) => {
                tokens += 1;
                text.push_str(&token.text);
            }
            Step::Finished { reason, text: rest } => {
                text.push_str(&rest);
                break reason;
            }
        }
    };
    (text, tokens, reason, prompt_len)
}

fn openai_reason(reason: FinishReason) -> &'static str {
    match reason {
        FinishReason::StopToken | FinishReason::Stopped => "stop",
        FinishReason::MaxTokens | FinishReason::ContextFull => "length",
    }
}

fn params(temperature: f32, seed: u64) -> SamplingParams {
    SamplingParams {
        temperature,
        seed,
        ..SamplingParams::default()
    }
}

fn chat_body(content: &str, temperature: f32, seed: u64, max_tokens: usize) -> Value {
    json!({
        "model": MODEL,
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": content},
        ],
        "temperature": temperature,
        "seed": seed,
        "max_tokens": max_tokens,
        "some_future_field": {"ignored": true},
    })
}

fn chat_messages(content: &str) -> Vec<ChatMessage> {
    vec![
        ChatMessage::system("You are terse."),
        ChatMessage::user(content),
    ]
}

/// Content, finish reason and usage of a streamed chat reply, checking the stream's shape.
fn read_chat_stream(response: &HttpResponse) -> (String, String, Option<Value>) {
    assert_eq!(response.status, 200, "{}", response.body);
    assert_eq!(response.header("content-type"), Some("text/event-stream"));
    let events = response.events();
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|event| serde_json::from_str(event).expect("chunk JSON"))
        .collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let (mut text, mut reason, mut usage) = (String::new(), None, None);
    for chunk in &chunks {
        assert_eq!(chunk["object"], "chat.completion.chunk");
        assert_eq!(chunk["model"], MODEL);
        if let Some(choice) = chunk["choices"].get(0) {
            assert!(reason.is_none(), "content after the finish reason");
            text.push_str(choice["delta"]["content"].as_str().unwrap_or_default());
            if let Some(finish) = choice["finish_reason"].as_str() {
                reason = Some(finish.to_string());
            }
        } else {
            usage = Some(chunk["usage"].clone());
        }
    }
    (text, reason.expect("a finish reason"), usage)
}

#[test]
fn models_and_health() {
    let fixture = Fixture::start(4, None);
    let models = get(fixture.address(), "/v1/models");
    assert_eq!(models.status, 200);
    assert_eq!(models.json()["data"][0]["id"], MODEL);
    assert_eq!(models.json()["object"], "list");
    assert_eq!(
        get(fixture.address(), &format!("/v1/models/{MODEL}")).status,
        200
    );
    let missing = get(fixture.address(), "/v1/models/gpt-4");
    assert_eq!(missing.status, 404);
    assert_eq!(missing.json()["error"]["code"], "model_not_found");
    let health = get(fixture.address(), "/health");
    assert_eq!(health.status, 200);
    assert_eq!(health.json()["status"], "ok");
}

#[test]
fn chat_completion_is_what_the_generation_loop_gives_for_the_same_seed() {
    let fixture = Fixture::start(4, None);
    let body = chat_body("Name a colour.", 0.8, 42, 12);
    let first = post(fixture.address(), "/v1/chat/completions", &body);
    assert_eq!(first.status, 200, "{}", first.body);
    let first = first.json();
    assert_eq!(first["object"], "chat.completion");
    assert_eq!(first["model"], MODEL);
    assert!(first["choices"][0]["logprobs"].is_null());
    let (text, tokens, reason, prompt_tokens) = reference(
        Some(&chat_messages("Name a colour.")[..]),
        "",
        &params(0.8, 42),
        12,
    );
    let choice = &first["choices"][0];
    assert_eq!(choice["message"]["role"], "assistant");
    assert_eq!(choice["message"]["content"], text.as_str());
    assert_eq!(choice["finish_reason"], openai_reason(reason));
    assert_eq!(first["usage"]["completion_tokens"], tokens);
    assert_eq!(first["usage"]["prompt_tokens"], prompt_tokens);
    assert_eq!(first["usage"]["total_tokens"], tokens + prompt_tokens);

    // The same seed again: the same text, though the cache now holds the first reply.
    let again = post(fixture.address(), "/v1/chat/completions", &body).json();
    assert_eq!(again["choices"][0]["message"]["content"], text.as_str());

    // Streamed, with usage: the same text in pieces.
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let response = post(fixture.address(), "/v1/chat/completions", &streamed);
    let (streamed_text, streamed_reason, usage) = read_chat_stream(&response);
    assert_eq!(streamed_text, text);
    assert_eq!(streamed_reason, openai_reason(reason));
    assert_eq!(usage.expect("usage chunk"), first["usage"]);
}

/// A long prompt streamed: a comment line before each pass, which clients skip, the first
/// beginning the response; the reply and its usage are what the generation loop gives.
#[test]
fn a_long_streamed_prompt_says_how_far_it_has_been_read() {
    let fixture = Fixture::start(4, None);
    let long = "The quick brown fox jumps over the lazy dog. ".repeat(60);
    let mut body = chat_body(&long, 0.0, 0, 4);
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let response = post(fixture.address(), "/v1/chat/completions", &body);
    let (text, _, usage) = read_chat_stream(&response);
    let (expected, _, _, prompt_tokens) =
        reference(Some(&chat_messages(&long)[..]), "", &params(0.0, 0), 4);
    assert_eq!(text, expected);
    assert_eq!(usage.expect("usage")["prompt_tokens"], prompt_tokens);
    let chunk = smolchat::generation::PROMPT_CHUNK;
    let comments: Vec<&str> = response
        .body
        .lines()
        .filter(|line| line.starts_with(':'))
        .collect();
    let expected: Vec<String> = (0..3)
        .map(|pass| {
            format!(
                ": reading the prompt: {} / {prompt_tokens} tokens",
                pass * chunk
            )
        })
        .collect();
    assert_eq!(comments, expected);
}

#[test]
fn completion_continues_the_raw_prompt_streamed_or_not() {
    let fixture = Fixture::start(4, None);
    let prompt = "The capital of France is";
    let body = json!({"model": MODEL, "prompt": prompt, "temperature": 0, "max_tokens": 10});
    let response = post(fixture.address(), "/v1/completions", &body);
    assert_eq!(response.status, 200, "{}", response.body);
    let response = response.json();
    assert_eq!(response["object"], "text_completion");
    let (text, tokens, reason, prompt_tokens) = reference(None, prompt, &params(0.0, 0), 10);
    assert_eq!(response["choices"][0]["text"], text.as_str());
    assert_eq!(
        response["choices"][0]["finish_reason"],
        openai_reason(reason)
    );
    assert_eq!(response["usage"]["completion_tokens"], tokens);
    assert_eq!(response["usage"]["prompt_tokens"], prompt_tokens);

    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let events = post(fixture.address(), "/v1/completions", &streamed).events();
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|event| serde_json::from_str(event).expect("chunk"))
        .collect();
    let joined: String = chunks
        .iter()
        .map(|chunk| {
            chunk["choices"][0]["text"]
                .as_str()
                .expect("text")
                .to_string()
        })
        .collect();
    assert_eq!(joined, text);
    assert_eq!(
        chunks.last().expect("chunks")["choices"][0]["finish_reason"],
        openai_reason(reason)
    );

    // Without max_tokens, OpenAI's default of 16 for completions.
    let default = post(
        fixture.address(),
        "/v1/completions",
        &json!({"prompt": prompt}),
    );
    assert!(
        default.json()["usage"]["completion_tokens"]
            .as_u64()
            .expect("count")
            <= 16
    );
}

#[test]
fn a_stop_string_ends_the_reply_and_is_not_returned() {
    let fixture = Fixture::start(4, None);
    let mut body = chat_body("Say something long.", 0.0, 1, 24);
    let full = post(fixture.address(), "/v1/chat/completions", &body).json();
    let full = full["choices"][0]["message"]["content"]
        .as_str()
        .expect("content")
        .to_string();
    // A stop string from the middle of the reply: two characters after its first half.
    let chars: Vec<char> = full.chars().collect();
    assert!(chars.len() >= 8, "reply too short to cut: {full:?}");
    let stop: String = chars[chars.len() / 2..chars.len() / 2 + 2].iter().collect();
    let expected = &full[..full.find(&stop).expect("in the reply")];

    body["stop"] = json!(["never appears \u{1F600}", stop]);
    let cut = post(fixture.address(), "/v1/chat/completions", &body).json();
    assert_eq!(cut["choices"][0]["message"]["content"], expected);
    assert_eq!(cut["choices"][0]["finish_reason"], "stop");
    assert!(cut["usage"]["completion_tokens"].as_u64().expect("count") < 24);

    body["stop"] = json!(stop);
    body["stream"] = json!(true);
    let response = post(fixture.address(), "/v1/chat/completions", &body);
    let (text, reason, usage) = read_chat_stream(&response);
    assert_eq!(text, expected);
    assert_eq!(reason, "stop");
    assert!(usage.is_none(), "usage only when asked");
}

/// log-softmax of the raw logits after the prompt, in f64.
fn first_token_logprobs(prompt: &[u32]) -> Vec<f64> {
    let loaded = LoadedModel::load(&tiny_model_dir(), ModelOptions::default()).expect("load");
    let mut cache = loaded.model.new_cache();
    let logits = logits_to_vec(
        loaded
            .model
            .forward(prompt, &mut cache, Logits::Last)
            .expect("forward"),
    )
    .expect("read");
    let log_total = common::logsumexp(&logits);
    logits
        .iter()
        .map(|&logit| f64::from(logit) - log_total)
        .collect()
}

#[test]
fn logprobs_are_the_log_softmax_of_the_raw_logits() {
    let fixture = Fixture::start(4, None);
    let prompt = "Once upon a time";
    // Sampled at a high temperature: the reported logprobs must still be temperature 1's.
    let body =
        json!({"prompt": prompt, "max_tokens": 5, "temperature": 1.5, "seed": 3, "logprobs": 3});
    let response = post(fixture.address(), "/v1/completions", &body).json();
    let logprobs = &response["choices"][0]["logprobs"];
    let tokens = logprobs["tokens"].as_array().expect("tokens");
    assert_eq!(
        tokens.len(),
        response["usage"]["completion_tokens"].as_u64().unwrap() as usize
    );
    let offsets: Vec<u64> = logprobs["text_offset"]
        .as_array()
        .expect("offsets")
        .iter()
        .map(|offset| offset.as_u64().expect("offset"))
        .collect();
    assert_eq!(offsets[0], 0);
    assert!(offsets.windows(2).all(|pair| pair[0] <= pair[1]));
    for (index, top) in logprobs["top_logprobs"]
        .as_array()
        .expect("top")
        .iter()
        .enumerate()
    {
        let top = top.as_object().expect("a map of token to logprob");
        assert!(!top.is_empty() && top.len() <= 3, "{top:?}");
        let best = top
            .values()
            .map(|v| v.as_f64().unwrap())
            .fold(f64::MIN, f64::max);
        let chosen = logprobs["token_logprobs"][index].as_f64().expect("logprob");
        assert!(
            best >= chosen - 1e-6,
            "top-1 {best} below the chosen {chosen}"
        );
    }

    // The first token's figures against an independent log-softmax of the model's logits.
    let loaded = LoadedModel::load(&tiny_model_dir(), ModelOptions::default()).expect("load");
    let prompt_ids = loaded.tokenizer.encode(prompt, false).expect("encode");
    let expected = first_token_logprobs(&prompt_ids);
    let chat = json!({
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 3, "temperature": 0, "logprobs": true, "top_logprobs": 4,
    });
    let chat = post(fixture.address(), "/v1/chat/completions", &chat).json();
    let content = chat["choices"][0]["logprobs"]["content"]
        .as_array()
        .expect("content");
    assert_eq!(
        content.len(),
        chat["usage"]["completion_tokens"].as_u64().unwrap() as usize
    );
    for entry in content {
        let top = entry["top_logprobs"].as_array().expect("top");
        assert_eq!(top.len(), 4);
        let values: Vec<f64> = top.iter().map(|t| t["logprob"].as_f64().unwrap()).collect();
        assert!(
            values.windows(2).all(|pair| pair[0] >= pair[1]),
            "{values:?}"
        );
        // Greedy: the chosen token is the likeliest.
        assert_eq!(entry["logprob"].as_f64(), Some(values[0]));
        assert!(entry["bytes"].is_array());
    }

    // Completion's first token, against the independent computation.
    let first = logprobs["token_logprobs"][0].as_f64().expect("first");
    let best_expected = expected.iter().copied().fold(f64::MIN, f64::max);
    let top = logprobs["top_logprobs"][0].as_object().expect("top");
    let best = top
        .values()
        .map(|v| v.as_f64().unwrap())
        .fold(f64::MIN, f64::max);
    assert!(
        (best - best_expected).abs() < 1e-4,
        "{best} vs {best_expected}"
    );
    assert!(
        expected.iter().any(|&value| (value - first).abs() < 1e-4),
        "{first} is no token's log-softmax"
    );
}

fn assert_error(response: &HttpResponse, status: u16, param: Option<&str>) -> Value {
    assert_eq!(response.status, status, "{}", response.body);
    let error = response.json()["error"].clone();
    assert!(
        error["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{error}"
    );
    assert!(error["type"].is_string(), "{error}");
    if let Some(param) = param {
        assert_eq!(error["param"], param, "{error}");
        assert!(
            error["message"].as_str().unwrap().contains(param),
            "{error}"
        );
    }
    error
}

#[test]
fn bad_requests_are_refused_with_openai_errors() {
    let fixture = Fixture::start(4, None);
    let address = fixture.address();
    let chat = "/v1/chat/completions";
    let bad_json = http::request("POST", address, chat, Some("{not json"), None);
    assert_eq!(assert_error(&bad_json, 400, None)["code"], "invalid_json");
    assert_error(&post(address, chat, &json!([1, 2])), 400, None);
    assert_error(&post(address, chat, &json!({})), 400, Some("messages"));
    let hi = json!([{"role": "user", "content": "hi"}]);
    let cases = [
        (json!({"messages": hi, "temperature": -1}), "temperature"),
        (json!({"messages": hi, "temperature": "hot"}), "temperature"),
        (json!({"messages": hi, "top_p": 0}), "top_p"),
        (json!({"messages": hi, "n": 2}), "n"),
        (
            json!({"messages": hi, "frequency_penalty": 0.5}),
            "frequency_penalty",
        ),
        (
            json!({"messages": hi, "presence_penalty": -1}),
            "presence_penalty",
        ),
        (json!({"messages": hi, "max_tokens": 0}), "max_tokens"),
        (json!({"messages": hi, "max_tokens": -3}), "max_tokens"),
        (json!({"messages": hi, "stop": 5}), "stop"),
        (json!({"messages": hi, "top_logprobs": 3}), "top_logprobs"),
        (
            json!({"messages": hi, "logprobs": true, "top_logprobs": 21}),
            "top_logprobs",
        ),
        (
            json!({"messages": hi, "tools": [{"type": "function"}]}),
            "tools",
        ),
        (
            json!({"messages": [{"role": "tool", "content": "x"}]}),
            "messages[0].role",
        ),
        (
            json!({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}),
            "messages[0].content",
        ),
    ];
    for (body, param) in cases {
        assert_error(&post(address, chat, &body), 400, Some(param));
    }
    let completions = "/v1/completions";
    assert_error(
        &post(address, completions, &json!({"prompt": ["a", "b"]})),
        400,
        Some("prompt"),
    );
    assert_error(
        &post(
            address,
            completions,
            &json!({"prompt": "a", "logprobs": true}),
        ),
        400,
        Some("logprobs"),
    );
    assert_error(
        &post(address, completions, &json!({"prompt": "a", "echo": true})),
        400,
        Some("echo"),
    );

    // Neutral values of options we do not honour are accepted.
    let neutral = json!({"messages": hi, "n": 1, "frequency_penalty": 0, "presence_penalty": 0.0, "max_tokens": 1});
    assert_eq!(post(address, chat, &neutral).status, 200);

    let unknown = post(address, chat, &json!({"model": "gpt-4o", "messages": hi}));
    assert_eq!(
        assert_error(&unknown, 404, Some("model"))["code"],
        "model_not_found"
    );
    let path = post(address, "/v1/embeddings", &json!({}));
    assert_eq!(assert_error(&path, 404, None)["code"], "unknown_url");
    assert_error(&get(address, chat), 405, None);

    let huge = "x".repeat(MAX_BODY + 1);
    let too_large = post(
        address,
        chat,
        &json!({"messages": [{"role": "user", "content": huge}]}),
    );
    assert_eq!(
        assert_error(&too_large, 413, None)["code"],
        "request_too_large"
    );
}

#[test]
fn a_prompt_longer_than_the_context_is_refused_with_the_numbers() {
    let fixture = Fixture::start(4, None);
    // About 3000 tokens, for a context of 2048.
    let long = "word ".repeat(3000);
    for stream in [false, true] {
        let body = json!({"messages": [{"role": "user", "content": long}], "max_tokens": 10, "stream": stream});
        let response = post(fixture.address(), "/v1/chat/completions", &body);
        let error = assert_error(&response, 400, Some("messages"));
        assert_eq!(error["code"], "context_length_exceeded");
        let message = error["message"].as_str().unwrap();
        assert!(
            message.contains("2048") && message.contains("tokens too many"),
            "{message}"
        );
    }
    let body = json!({"prompt": long, "max_tokens": 10});
    let error = assert_error(
        &post(fixture.address(), "/v1/completions", &body),
        400,
        Some("prompt"),
    );
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("tokens too many")
    );
}

#[test]
fn the_api_key_is_required_when_set() {
    let fixture = Fixture::start(4, Some("sesame"));
    let address = fixture.address();
    let body = r#"{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}"#;
    let chat = "/v1/chat/completions";
    for key in [None, Some("wrong"), Some("sesam")] {
        let response = http::request("POST", address, chat, Some(body), key);
        assert_eq!(
            assert_error(&response, 401, None)["code"],
            "invalid_api_key"
        );
        assert_eq!(
            http::request("GET", address, "/v1/models", None, key).status,
            401
        );
    }
    assert_eq!(
        http::request("POST", address, chat, Some(body), Some("sesame")).status,
        200
    );
    assert_eq!(
        http::request("GET", address, "/v1/models", None, Some("sesame")).status,
        200
    );
    assert_eq!(
        get(address, "/health").status,
        200,
        "health stays open for probes"
    );
}

fn long_stream(max_tokens: usize) -> Value {
    json!({
        "messages": [{"role": "user", "content": "Tell me a long story."}],
        "max_tokens": max_tokens, "temperature": 1.0, "min_p": 0, "seed": 5, "stream": true,
    })
}

#[test]
fn a_full_queue_answers_503_with_retry_after() {
    let fixture = Fixture::start(1, None);
    let address = fixture.address();
    let mut running = RawStream::open(address, "/v1/chat/completions", &long_stream(2000));
    assert_eq!(running.status, 200);
    running.next_event().expect("the first chunk");
    // The second waits in the queue (of one) behind the first.
    let queued = thread::spawn(move || {
        post(
            address,
            "/v1/completions",
            &json!({"prompt": "a", "max_tokens": 2, "temperature": 0}),
        )
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    while get(address, "/health").json()["queued"] != 1 {
        assert!(Instant::now() < deadline, "the second request never queued");
        thread::sleep(Duration::from_millis(20));
    }
    let refused = post(
        address,
        "/v1/completions",
        &json!({"prompt": "b", "max_tokens": 2}),
    );
    assert_eq!(assert_error(&refused, 503, None)["code"], "queue_full");
    assert_eq!(refused.header("retry-after"), Some("1"));
    let streamed_refusal = RawStream::open(address, "/v1/chat/completions", &long_stream(5));
    assert_eq!(
        streamed_refusal.status, 503,
        "refused before the stream begins"
    );

    drop(running);
    let queued = queued.join().expect("the queued request");
    assert_eq!(queued.status, 200, "{}", queued.body);
    assert_eq!(queued.json()["usage"]["completion_tokens"], 2);
}

/// A streamed request that waits behind another begins at once, saying in a comment line
/// (which clients skip) how many are ahead; its turn come, it answers in full, with the
/// prompt's tokens in its usage.
#[test]
fn a_queued_stream_says_how_many_requests_are_ahead() {
    let fixture = Fixture::start(4, None);
    let address = fixture.address();
    let mut running = RawStream::open(address, "/v1/chat/completions", &long_stream(2000));
    running.next_event().expect("the first chunk");
    let body = json!({
        "prompt": "a", "max_tokens": 2, "temperature": 0, "stream": true,
        "stream_options": {"include_usage": true},
    });
    let mut queued = RawStream::open(address, "/v1/completions", &body);
    assert_eq!(queued.status, 200, "the stream begins while it waits");
    assert_eq!(
        queued.next_comment().as_deref(),
        Some(": waiting: 1 request ahead")
    );
    drop(running);
    let mut usage = None;
    while let Some(event) = queued.next_event() {
        if event == "[DONE]" {
            break;
        }
        let chunk: Value = serde_json::from_str(&event).expect("json");
        if !chunk["usage"].is_null() {
            usage = Some(chunk["usage"].clone());
        }
    }
    let usage = usage.expect("a usage chunk");
    assert_eq!(usage["completion_tokens"], 2);
    assert!(usage["prompt_tokens"].as_u64() > Some(0), "{usage}");
}

/// Tokens the engine may make after a client hangs up, before the server's thread is scheduled
/// and sees the closed socket. The fixture makes one in about a millisecond; on a loaded
/// two-core machine a thread can wait several for its turn (CI once saw one token more than
/// the ones in flight). A server that noticed only at the relay's 50 ms poll would let about 50
/// through; one that never noticed, the 2000 asked.
const SCHEDULING_SLACK: u64 = 16;

/// Tokens the engine has generated since it started, as `/health` reports them.
fn generated_tokens(address: SocketAddr) -> u64 {
    get(address, "/health").json()["generated_tokens"]
        .as_u64()
        .unwrap()
}

/// A two-token completion, which the engine takes up once the one before it has stopped.
fn short_completion(address: SocketAddr) -> HttpResponse {
    post(
        address,
        "/v1/completions",
        &json!({"prompt": "a", "max_tokens": 2, "temperature": 0}),
    )
}

#[test]
fn a_client_that_hangs_up_mid_stream_stops_its_generation_at_once() {
    let fixture = Fixture::start(4, None);
    let address = fixture.address();
    let generated = || generated_tokens(address);
    let before = generated();
    let mut stream = RawStream::open(address, "/v1/chat/completions", &long_stream(2000));
    assert_eq!(stream.status, 200);
    let mut received = 0;
    while received < 3 {
        let event = stream.next_event().expect("chunk");
        let chunk: Value = serde_json::from_str(&event).expect("json");
        let delta = &chunk["choices"][0]["delta"];
        if delta["role"].is_null() && delta["content"].is_string() {
            received += 1;
        }
    }
    drop(stream);
    let started = Instant::now();
    let next = short_completion(address);
    assert_eq!(next.status, 200, "{}", next.body);
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    // Tokens received, plus the ones in flight when the socket closed (the one being sent
    // and the one being computed), plus the next request's two.
    let spent = generated() - before;
    assert!(
        spent <= received + 2 + 2 + 2 + SCHEDULING_SLACK,
        "{spent} tokens for {received} received"
    );
}

#[test]
fn a_client_that_hangs_up_before_a_whole_reply_stops_its_generation_at_once() {
    use std::io::Write;
    let fixture = Fixture::start(4, None);
    let address = fixture.address();
    let generated = || generated_tokens(address);
    let before = generated();
    let mut body = long_stream(2000);
    body["stream"] = json!(false);
    let body = body.to_string();
    let mut socket = std::net::TcpStream::connect(address).expect("connect");
    write!(
        socket,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .expect("send");
    let deadline = Instant::now() + Duration::from_secs(60);
    while generated() - before < 3 {
        assert!(Instant::now() < deadline, "the reply never started");
        thread::sleep(Duration::from_millis(5));
    }
    let at_hang_up = generated() - before;
    drop(socket);
    let next = short_completion(address);
    assert_eq!(next.status, 200, "{}", next.body);
    // The ones counted when the socket closed, the one being computed then and the one the
    // relay fails to send, and the next request's two.
    let spent = generated() - before;
    assert!(
        spent <= at_hang_up + 2 + 2 + SCHEDULING_SLACK,
        "{spent} tokens; {at_hang_up} when the client hung up"
    );
}

/// One request written by hand (its head's lines, then `body`), on a connection that closes
/// after it: the status and the whole response.
fn raw_request(address: SocketAddr, head: &[&str], body: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(address).expect("connect");
    stream
        .set_read_timeout(Some(http::TIMEOUT))
        .expect("timeout");
    let mut request = head.join("\r\n");
    request.push_str(&format!(
        "\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    ));
    stream.write_all(request.as_bytes()).expect("send");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("response");
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("no status in {response:?}"));
    (status, response)
}

/// A page whose name an attacker points at 127.0.0.1 (DNS rebinding) sends its own Host; a
/// page on another origin sends its Origin; a form post sends text/plain. None reaches the
/// model unless the server was told to allow it.
#[test]
fn requests_from_web_pages_and_foreign_hosts_are_refused() {
    let f = Fixture::start_configured(4, None, |config| {
        config.cors = vec!["http://localhost:3000".into()];
        config.allowed_hosts = vec!["chat.example.org".into()];
    });
    let address = f.address();
    let chat = chat_body("Hi", 0.0, 1, 2).to_string();
    let post = |host: &str, extra: &[&str], body: &str| {
        let host = format!("Host: {host}");
        let mut head = vec!["POST /v1/chat/completions HTTP/1.1", host.as_str()];
        head.extend(extra);
        raw_request(address, &head, body)
    };
    let json = "Content-Type: application/json";
    let port = address.port();
    for host in [
        format!("127.0.0.1:{port}"),
        format!("localhost:{port}"),
        "LOCALHOST".into(),
        format!("[::1]:{port}"),
        "chat.example.org:443".into(),
    ] {
        assert_eq!(post(&host, &[json], &chat).0, 200, "Host {host}");
    }
    let (status, response) = post("attacker.example", &[json], &chat);
    assert_eq!(status, 403, "{response}");
    assert!(response.contains("attacker.example"), "{response}");
    assert_eq!(
        post(&format!("attacker.example:{port}"), &[json], &chat).0,
        403
    );

    let (status, response) = post("localhost", &["Content-Type: text/plain"], &chat);
    assert_eq!(status, 415, "{response}");
    assert!(response.contains("application/json"), "{response}");
    assert_eq!(post("localhost", &[], &chat).0, 415);
    let charset = "Content-Type: application/json; charset=utf-8";
    assert_eq!(post("localhost", &[charset], &chat).0, 200);

    let (status, response) = post("localhost", &[json, "Origin: http://evil.example"], &chat);
    assert_eq!(status, 403, "{response}");
    let (status, response) = post("localhost", &[json, "Origin: http://localhost:3000"], &chat);
    assert_eq!(status, 200, "{response}");
    assert!(
        response.contains("access-control-allow-origin: http://localhost:3000"),
        "{response}"
    );
    let preflight = [
        "OPTIONS /v1/chat/completions HTTP/1.1",
        "Host: localhost",
        "Origin: http://localhost:3000",
        "Access-Control-Request-Method: POST",
    ];
    let (status, response) = raw_request(address, &preflight, "");
    assert_eq!(status, 204, "{response}");
    assert!(
        response.contains("access-control-allow-methods"),
        "{response}"
    );
}

/// A connection that has sent `sent` and nothing more: how long the server keeps it, up to
/// `patience`, and what it wrote before closing it.
fn held_open(address: SocketAddr, sent: &str, patience: Duration) -> (Duration, String) {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(address).expect("connect");
    stream.set_read_timeout(Some(patience)).expect("timeout");
    stream.write_all(sent.as_bytes()).expect("send");
    let started = Instant::now();
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    (
        started.elapsed(),
        String::from_utf8_lossy(&answer).into_owned(),
    )
}

fn read_timeout(seconds: u64) -> impl FnOnce(&mut ServerConfig) {
    move |config| config.limits.read_timeout = Duration::from_secs(seconds)
}

/// Headers that never finish held their connection for good, and 20,000 of them exhausted
/// the file descriptors; a body that never finishes did the same after the headers.
#[test]
fn a_request_that_is_never_finished_is_closed_after_the_read_timeout() {
    let f = Fixture::start_configured(4, None, read_timeout(1));
    let patience = Duration::from_secs(20);
    let (held, _) = held_open(f.address(), "GET /health HTTP/1.1\r\nHost: loc", patience);
    assert!(
        held >= Duration::from_millis(900) && held < Duration::from_secs(5),
        "a half-sent head was kept {held:?}"
    );
    let head = "POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n\
                Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"messages\"";
    let (held, answer) = held_open(f.address(), head, patience);
    assert!(
        held < Duration::from_secs(5),
        "a half-sent body was kept {held:?}"
    );
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("request_timeout"), "{answer}");
    // An idle kept-alive connection is closed after the same time.
    let (held, answer) = held_open(
        f.address(),
        "GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n",
        patience,
    );
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(
        held < Duration::from_secs(5),
        "an idle connection was kept {held:?}"
    );
}

/// More half-sent requests than the server has places push out only each other: a real
/// request still gets in at once, and the oldest idle connections are the ones closed.
#[test]
fn a_flood_of_idle_connections_cannot_lock_out_a_real_request() {
    let f = Fixture::start_configured(4, None, |config| {
        config.limits.max_connections = 8;
    });
    let address = f.address();
    let mut flood: Vec<std::net::TcpStream> = (0..40)
        .map(|_| {
            let mut stream = std::net::TcpStream::connect(address).expect("connect");
            std::io::Write::write_all(&mut stream, b"GET /health HTTP/1.1\r\nHo").expect("send");
            stream
        })
        .collect();
    let started = Instant::now();
    let health = get(address, "/health");
    assert_eq!(health.status, 200);
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "/health took {:?} behind the flood",
        started.elapsed()
    );
    // The first connections were closed to make room, the newest are still open.
    assert!(
        is_closed(&mut flood[0]),
        "the oldest idle connection is still open"
    );
    let newest = flood.last_mut().expect("a connection");
    assert!(!is_closed(newest), "the newest connection was closed");
}

/// A burst of connections far past the standard library's listen backlog (128) waits in the
/// kernel's queue until the server takes it, as a busy machine's accept loop falls behind:
/// none has its first packet dropped (then a connection waits a second for the retry), and
/// each is served once the server runs.
#[test]
fn a_burst_of_connections_waits_for_the_server_to_take_it() {
    let engine = EngineHandle::spawn_with(EngineOptions::default(), || {}).expect("spawn");
    let server = Server::bind(loopback_config(None), engine.clone_client()).expect("bind");
    let address = server.local_addr();
    // Nothing accepts yet: every connection stays in the listen queue. (No model is loaded,
    // so the one that asks asks for the list of models, which answers 200 without one.)
    let mut burst: Vec<std::net::TcpStream> = (0..600)
        .map(|n| {
            std::net::TcpStream::connect_timeout(&address, Duration::from_millis(500))
                .unwrap_or_else(|err| panic!("connection {n} of the burst: {err}"))
        })
        .collect();
    let _server = server.spawn().expect("serve");
    let last = burst.last_mut().expect("a connection");
    std::io::Write::write_all(last, b"GET /v1/models HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .expect("send");
    last.set_read_timeout(Some(http::TIMEOUT)).expect("timeout");
    let mut head = [0u8; 12];
    std::io::Read::read_exact(last, &mut head).expect("the last of the burst is answered");
    assert_eq!(&head, b"HTTP/1.1 200");
}

/// Whether the server has closed `stream`: a read ends (or fails) rather than waiting.
fn is_closed(stream: &mut std::net::TcpStream) -> bool {
    use std::io::{ErrorKind, Read};
    stream
        .set_read_timeout(Some(Duration::from_millis(300)))
        .expect("timeout");
    match stream.read(&mut [0u8; 64]) {
        Ok(0) => true,
        Ok(n) => panic!("the server answered a half-sent request with {n} bytes"),
        Err(err) => !matches!(err.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut),
    }
}

/// Only when every place is running a request is a newcomer turned away, with a 503 it can
/// read and retry after.
#[test]
fn a_server_whose_every_connection_is_busy_answers_503() {
    use std::io::Write;
    let f = Fixture::start_configured(4, None, |config| {
        config.limits.max_connections = 2;
    });
    let address = f.address();
    let uploading: Vec<std::net::TcpStream> = (0..2)
        .map(|_| {
            let mut stream = std::net::TcpStream::connect(address).expect("connect");
            stream
                .write_all(
                    b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n\
                      Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{",
                )
                .expect("send");
            stream
        })
        .collect();
    thread::sleep(Duration::from_millis(300));
    let (_, answer) = held_open(
        address,
        "GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n",
        http::TIMEOUT,
    );
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(answer.contains("Retry-After: 1"), "{answer}");
    drop(uploading);
    thread::sleep(Duration::from_millis(300));
    assert_eq!(get(address, "/health").status, 200);
}
