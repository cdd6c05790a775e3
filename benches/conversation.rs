//! Time to first token of turn 1 against turn 5 of a growing conversation, through the real
//! engine thread, on the full-size random checkpoint. With the KV cache reused across turns,
//! turn 5 prefills only its new message, so its TTFT must not grow with the conversation;
//! the same turn with the cache reset shows what reuse saves.
//!
//! `cargo bench --bench conversation` prints medians over several conversations.

mod common;

use std::time::Duration;

use smolchat::engine::{EngineHandle, Event};
use smolchat::generation::{GenerationStats, ModelOptions};
use smolchat::model_source::ModelSource;
use smolchat::stats::summary::Summary;
use smolchat::text::{ChatMessage, OverflowPolicy, SamplingParams};

const TURNS: usize = 5;
const CONVERSATIONS: usize = 5;
const REPLY_TOKENS: usize = 48;

fn question(turn: usize) -> String {
    format!(
        "Turn {turn}: could you explain, in a few sentences, how a small language model running on a laptop \
         turns my message into a reply, and what limits how fast it can answer?"
    )
}

/// Runs one generation and returns its statistics and reply text.
fn ask(engine: &mut EngineHandle, messages: &[ChatMessage]) -> (GenerationStats, String) {
    let greedy = SamplingParams {
        temperature: 0.0,
        ..SamplingParams::default()
    };
    let request = engine.generate(
        messages.to_vec(),
        greedy,
        REPLY_TOKENS,
        OverflowPolicy::Stop,
    );
    let mut text = String::new();
    loop {
        match engine.events().recv_timeout(Duration::from_secs(600)) {
            Ok(Event::Token { request: r, token }) if r == request => text.push_str(&token.text),
            Ok(Event::Finished {
                request: r,
                text: tail,
                stats,
                ..
            }) if r == request => {
                text.push_str(&tail);
                return (stats.generation, text);
            }
            Ok(Event::Error { error, .. }) => panic!("engine error: {error}"),
            Ok(_) => {}
            Err(err) => panic!("engine did not answer: {err}"),
        }
    }
}

fn main() {
    let dir = common::full_size_checkpoint();
    let mut engine = EngineHandle::spawn(|| {}).expect("spawn engine");
    engine.load_model(ModelSource::Folder(dir), ModelOptions::default());
    loop {
        match engine.events().recv_timeout(Duration::from_secs(600)) {
            Ok(Event::ModelReady(info)) => {
                println!("{}", info.description);
                break;
            }
            Ok(Event::Error { error, .. }) => panic!("{error}"),
            Ok(_) => {}
            Err(err) => panic!("load timed out: {err}"),
        }
    }

    let mut ttft_ms = vec![Vec::new(); TURNS];
    let mut prompt_tokens = [0; TURNS];
    let mut prefilled = [0; TURNS];
    let mut turn5_without_reuse_ms = Vec::new();
    for _ in 0..CONVERSATIONS {
        engine.reset_conversation();
        let mut messages = vec![ChatMessage::system("You are a helpful assistant.")];
        for turn in 0..TURNS {
            messages.push(ChatMessage::user(question(turn + 1)));
            let (stats, reply) = ask(&mut engine, &messages);
            ttft_ms[turn].push(stats.time_to_first_token.as_secs_f64() * 1000.0);
            prompt_tokens[turn] = stats.prompt_tokens;
            prefilled[turn] = stats.prefilled_tokens;
            if turn + 1 == TURNS {
                engine.reset_conversation();
                let (cold, _) = ask(&mut engine, &messages);
                turn5_without_reuse_ms.push(cold.time_to_first_token.as_secs_f64() * 1000.0);
            }
            messages.push(ChatMessage::assistant(reply));
        }
    }

    println!(
        "turn  prompt tokens  prefilled  TTFT ms median (min-max) over {CONVERSATIONS} conversations"
    );
    for turn in 0..TURNS {
        let summary = Summary::of(&ttft_ms[turn]).expect("measured");
        println!(
            "{:>4}  {:>13}  {:>9}  {:>8.1} ({:.1}-{:.1})",
            turn + 1,
            prompt_tokens[turn],
            prefilled[turn],
            summary.median,
            summary.min,
            summary.max
        );
    }
    let cold = Summary::of(&turn5_without_reuse_ms).expect("measured");
    println!(
        "turn {TURNS} with the cache reset: {} tokens prefilled, TTFT {:.1} ms median ({:.1}-{:.1})",
        prompt_tokens[TURNS - 1],
        cold.median,
        cold.min,
        cold.max
    );
}
