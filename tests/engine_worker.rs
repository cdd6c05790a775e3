//! The inference thread driven through its channel protocol, against the tiny checkpoint.

use crate::common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use common::tiny_model_dir;
use smolchat::engine::{
    Client, EngineError, EngineHandle, EngineOptions, Event, GenerateRequest, RequestId, Stopper,
};
use smolchat::generation::{FinishReason, GenerationStats, ModelOptions};
use smolchat::model_source::ModelSource;
use smolchat::text::{ChatMessage, ChatTemplate, OverflowPolicy, SamplingParams, TextTokenizer};

const TIMEOUT: Duration = Duration::from_secs(60);

fn greedy() -> SamplingParams {
    SamplingParams {
        temperature: 0.0,
        ..SamplingParams::default()
    }
}

fn next_event(engine: &EngineHandle) -> Event {
    engine
        .events()
        .recv_timeout(TIMEOUT)
        .expect("the engine answers within the time-out")
}

/// `num_hidden_layers` in the tiny checkpoint's config.
const TINY_LAYERS: usize = 2;

fn load_tiny(engine: &EngineHandle) {
    assert!(engine.load_model(
        ModelSource::Folder(tiny_model_dir()),
        ModelOptions::default()
    ));
    let mut announced = None;
    let mut layers_read = Vec::new();
    loop {
        match next_event(engine) {
            Event::Loading { memory, .. } => announced = memory,
            Event::LoadProgress(progress) => {
                assert_eq!(progress.layers, TINY_LAYERS);
                layers_read.push(progress.layers_read);
            }
            Event::ModelReady(info) => {
                // Each layer told once, in order, before the model is ready.
                assert_eq!(layers_read, (1..=TINY_LAYERS).collect::<Vec<_>>());
                assert_eq!(info.context_limit, 2048);
                assert!(!info.fallback_template);
                // What was said before the weights were read is what the model got.
                assert_eq!(announced, Some(info.memory));
                assert_eq!(info.memory.context, info.context_limit);
                assert!(info.memory.weights_bytes > 0);
                return;
            }
            other => panic!("unexpected event while loading: {other:?}"),
        }
    }
}

/// Everything one generation reported, in order.
#[derive(Debug, Default)]
struct Reply {
    /// A long prompt's `PromptProgress` events: done and total.
    progress: Vec<(usize, usize)>,
    /// `Waiting` events: how many ran or waited ahead, each time the queue moved.
    waiting: Vec<usize>,
    prompt_stats: Option<GenerationStats>,
    token_ids: Vec<u32>,
    text: String,
    stats_events: usize,
    finish: Option<(FinishReason, GenerationStats)>,
    errors: Vec<EngineError>,
    busy: Vec<RequestId>,
}

fn collect(engine: &EngineHandle, request: RequestId) -> Reply {
    let mut reply = Reply::default();
    loop {
        match next_event(engine) {
            Event::Waiting { request: r, ahead } if r == request => {
                assert!(reply.prompt_stats.is_none(), "waiting after the prompt");
                reply.waiting.push(ahead);
            }
            // Another request's place in the queue, announced while this one runs.
            Event::Waiting { .. } => {}
            Event::PromptProgress {
                request: r,
                done,
                total,
            } if r == request => {
                assert!(reply.prompt_stats.is_none(), "progress after the prompt");
                reply.progress.push((done, total));
            }
            Event::PromptProcessed {
                request: r, stats, ..
            } if r == request => reply.prompt_stats = Some(stats),
            Event::Token { request: r, token } if r == request => {
                assert!(reply.finish.is_none(), "token after finish");
                reply.token_ids.push(token.id);
                reply.text.push_str(&token.text);
                assert!(
                    (0.0..=1.0).contains(&token.probability),
                    "probability {}",
                    token.probability
                );
                assert!(!token.alternatives.is_empty());
            }
            Event::Stats { request: r, stats } if r == request => {
                reply.stats_events += 1;
                assert!(stats.resident_bytes.is_some_and(|bytes| bytes > 0));
                assert_eq!(stats.generation.generated_tokens, reply.token_ids.len());
            }
            Event::Finished {
                request: r,
                reason,
                text,
                stats,
            } if r == request => {
                reply.text.push_str(&text);
                reply.finish = Some((reason, stats.generation));
                return reply;
            }
            Event::Error { error, .. } => reply.errors.push(error),
            Event::Busy { refused } => {
                reply.busy.push(refused);
                return reply;
            }
            other => panic!("unexpected event: {other:?}"),
        }
    }
}

/// Starts a greedy generation of `max_new_tokens` for a single user message.
fn ask(engine: &EngineHandle, text: &str, max_new_tokens: usize) -> RequestId {
    engine.generate(
        vec![ChatMessage::user(text)],
        greedy(),
        max_new_tokens,
        OverflowPolicy::Stop,
    )
}

/// The next event must be an error answering `request`.
fn expect_error(engine: &EngineHandle, request: RequestId) -> EngineError {
    match next_event(engine) {
        Event::Error {
            request: Some(r),
            error,
        } if r == request => error,
        other => panic!("expected an error for request {request}, got {other:?}"),
    }
}

fn assert_no_more_events(engine: &EngineHandle, why: &str) {
    assert!(
        engine
            .events()
            .recv_timeout(Duration::from_millis(300))
            .is_err(),
        "{why}"
    );
}

#[test]
fn three_turn_conversation_reuses_the_cache() {
    let engine = EngineHandle::spawn(|| {}).expect("spawn");
    load_tiny(&engine);
    let tokenizer = TextTokenizer::load(&tiny_model_dir()).expect("tokenizer");
    let template = ChatTemplate::from_dir(&tiny_model_dir()).expect("template");
    let mut messages = vec![ChatMessage::system("You are terse.")];
    let mut cached: Vec<u32> = Vec::new();
    for turn in 0..3 {
        messages.push(ChatMessage::user(format!("Question number {turn}?")));
        let prompt = tokenizer
            .encode(&template.render(&messages, true).expect("render"), false)
            .expect("encode");
        let request = engine.generate(
            messages.clone(),
            greedy(),
            6,
            OverflowPolicy::DropOldestTurns,
        );
        let reply = collect(&engine, request);
        assert!(reply.errors.is_empty(), "{:?}", reply.errors);
        let (reason, stats) = reply.finish.expect("finished");
        assert_eq!(reason, FinishReason::MaxTokens);
        assert_eq!(reply.token_ids.len(), 6);
        assert!(
            (1..=6).contains(&reply.stats_events),
            "live stats after the first token, then at most every 100 ms: {}",
            reply.stats_events
        );
        let prompt_stats = reply.prompt_stats.expect("prompt processed");
        assert_eq!(prompt_stats.prompt_tokens, prompt.len());

        // Only the tokens after what the cache already holds are run again.
        let reusable = cached
            .iter()
            .zip(&prompt)
            .take_while(|(a, b)| a == b)
            .count();
        assert_eq!(prompt_stats.reused_tokens, reusable, "turn {turn}");
        assert_eq!(
            prompt_stats.prefilled_tokens,
            prompt.len() - reusable,
            "turn {turn}"
        );
        if turn > 0 {
            assert!(
                reusable > prompt.len() / 2,
                "turn {turn} reused only {reusable} of {}",
                prompt.len()
            );
        }
        assert_eq!(stats.context_used, prompt.len() + 6);
        assert!(stats.time_to_first_token > Duration::ZERO);
        assert!(stats.decode_tokens_per_second().is_some());

        cached = prompt.iter().chain(&reply.token_ids).copied().collect();
        messages.push(ChatMessage::assistant(reply.text));
    }
}

#[test]
fn stop_ends_generation_before_the_next_token() {
    let stopper: Arc<OnceLock<Stopper>> = Arc::new(OnceLock::new());
    let tokens_seen = Arc::new(AtomicUsize::new(0));
    let (notify_stopper, notify_tokens) = (Arc::clone(&stopper), Arc::clone(&tokens_seen));
    // The notify hook runs on the engine thread right after each event is sent: pressing Stop
    // there after the third event of the generation pins exactly where Stop lands.
    let engine = EngineHandle::spawn(move || {
        if notify_tokens.fetch_add(1, Ordering::SeqCst) == 2
            && let Some(stopper) = notify_stopper.get()
        {
            stopper.stop();
        }
    })
    .expect("spawn");
    load_tiny(&engine);
    tokens_seen.store(0, Ordering::SeqCst);
    stopper.set(engine.stopper()).expect("set once");
    let request = ask(&engine, "Tell me a long story", 1000);
    let reply = collect(&engine, request);
    let (reason, stats) = reply.finish.expect("finished");
    assert_eq!(reason, FinishReason::Stopped);
    // Events 1-3: PromptProcessed, Token, Stats. Stop was set after the first token's stats.
    assert_eq!(reply.token_ids.len(), 1, "no token after Stop");
    assert_eq!(stats.generated_tokens, 1);
    assert_no_more_events(&engine, "nothing after Finished");
}

/// A prompt of about 600 tokens: three passes of `PROMPT_CHUNK`.
fn long_prompt() -> String {
    "The quick brown fox jumps over the lazy dog. ".repeat(60)
}

/// A long prompt is read in passes, each announced; Stop between passes ends it there, and
/// the same prompt sent again reads on from the passes kept and answers exactly as a run that
/// was never stopped.
#[test]
fn a_long_prompt_reports_its_passes_and_stops_between_them() {
    let stop_at: Arc<AtomicUsize> = Arc::new(AtomicUsize::new(usize::MAX));
    let stopper: Arc<OnceLock<Stopper>> = Arc::new(OnceLock::new());
    let events = Arc::new(AtomicUsize::new(0));
    let (hook_stop_at, hook_stopper, hook_events) = (
        Arc::clone(&stop_at),
        Arc::clone(&stopper),
        Arc::clone(&events),
    );
    // Runs on the engine thread right after each event: Stop lands exactly after event
    // number `stop_at` of a generation.
    let engine = EngineHandle::spawn(move || {
        if hook_events.fetch_add(1, Ordering::SeqCst) == hook_stop_at.load(Ordering::SeqCst)
            && let Some(stopper) = hook_stopper.get()
        {
            stopper.stop();
        }
    })
    .expect("spawn");
    load_tiny(&engine);
    stopper.set(engine.stopper()).expect("set once");
    let chunk = smolchat::generation::PROMPT_CHUNK;

    let whole = collect(&engine, ask(&engine, &long_prompt(), 8));
    let total = whole
        .prompt_stats
        .as_ref()
        .expect("prompt read")
        .prompt_tokens;
    assert!(2 * chunk < total && total < 3 * chunk, "{total} tokens");
    // The template's system prompt, the history before the message, is a pass of its own.
    let history = whole.progress[1].0;
    assert!((smolchat::generation::SHARED_HISTORY..chunk).contains(&history));
    let passes_from = |done: usize| -> Vec<(usize, usize)> {
        (done..total)
            .step_by(chunk)
            .map(|done| (done, total))
            .collect()
    };
    let mut expected = vec![(0, total)];
    expected.extend(passes_from(history));
    assert_eq!(whole.progress, expected);
    assert_eq!(whole.token_ids.len(), 8);

    // A new conversation, so nothing is reused; Stop after the second progress event.
    assert!(engine.reset_conversation());
    events.store(0, Ordering::SeqCst);
    stop_at.store(1, Ordering::SeqCst);
    let stopped = collect(&engine, ask(&engine, &long_prompt(), 8));
    stop_at.store(usize::MAX, Ordering::SeqCst);
    assert_eq!(stopped.progress, vec![(0, total), (history, total)]);
    let (reason, stats) = stopped.finish.expect("finished");
    assert_eq!(reason, FinishReason::Stopped);
    assert!(stopped.token_ids.is_empty());
    assert_eq!(stats.prefilled_tokens, history, "one pass read before Stop");

    let again = collect(&engine, ask(&engine, &long_prompt(), 8));
    assert_eq!(again.progress, passes_from(history));
    assert_eq!(
        again.prompt_stats.expect("prompt read").reused_tokens,
        history
    );
    assert_eq!(again.token_ids, whole.token_ids);
}

/// Like [`collect`], for a client rather than the handle.
fn collect_client(client: &Client, request: RequestId) -> Reply {
    let mut reply = Reply::default();
    loop {
        match client
            .events()
            .recv_timeout(TIMEOUT)
            .expect("an event in time")
        {
            Event::Token { request: r, token } if r == request => {
                reply.token_ids.push(token.id);
                reply.text.push_str(&token.text);
            }
            Event::Finished {
                request: r,
                reason,
                text,
                stats,
            } if r == request => {
                reply.text.push_str(&text);
                reply.finish = Some((reason, stats.generation));
                return reply;
            }
            Event::Busy { refused } if refused == request => {
                reply.busy.push(refused);
                return reply;
            }
            Event::Error { error, .. } => reply.errors.push(error),
            Event::PromptProcessed { request: r, .. }
            | Event::Waiting { request: r, .. }
            | Event::Stats { request: r, .. }
            | Event::Token { request: r, .. }
                if r == request => {}
            other => panic!("an event of another request reached this client: {other:?}"),
        }
    }
}

/// An engine that runs one generation at a time, so that the next ones wait.
fn one_at_a_time() -> EngineHandle {
    let options = EngineOptions {
        parallel: 1,
        ..EngineOptions::default()
    };
    EngineHandle::spawn_with(options, || {}).expect("spawn")
}

#[test]
fn a_second_generate_while_one_runs_is_queued_and_served_after_it() {
    let engine = one_at_a_time();
    load_tiny(&engine);
    let first = engine.generate(
        vec![ChatMessage::user("one")],
        greedy(),
        40,
        OverflowPolicy::Stop,
    );
    let second = engine.generate(
        vec![ChatMessage::user("two")],
        greedy(),
        5,
        OverflowPolicy::Stop,
    );
    let reply = collect(&engine, first);
    assert!(reply.busy.is_empty());
    assert_eq!(reply.token_ids.len(), 40, "the running generation went on");
    assert_eq!(collect(&engine, second).token_ids.len(), 5);
    assert_no_more_events(&engine, "one final event per request");
}

/// Requests that wait are told how many are ahead of them, when they join and as the queue
/// moves up.
#[test]
fn waiting_requests_are_told_their_place_as_the_queue_moves() {
    let engine = one_at_a_time();
    load_tiny(&engine);
    let ask_for = |text: &str, tokens| {
        engine.generate(
            vec![ChatMessage::user(text)],
            greedy(),
            tokens,
            OverflowPolicy::Stop,
        )
    };
    let first = ask_for("one", 40);
    let second = ask_for("two", 5);
    let third = ask_for("three", 5);
    let mut places: [Vec<usize>; 3] = Default::default();
    let mut finished = 0;
    while finished < 3 {
        match next_event(&engine) {
            Event::Waiting { request, ahead } => {
                let index = [first, second, third]
                    .iter()
                    .position(|&r| r == request)
                    .expect("one of ours");
                // A place said again (each arrival announces them all) is no move.
                if places[index].last() != Some(&ahead) {
                    places[index].push(ahead);
                }
            }
            Event::Finished { .. } => finished += 1,
            _ => {}
        }
    }
    assert_eq!(places, [vec![], vec![1], vec![2, 1]]);
}

/// Replies of a greedy conversation of `turns` turns, run alone on a fresh engine.
fn conversation_alone(opening: &str, turns: usize) -> Vec<Vec<u32>> {
    let engine = EngineHandle::spawn(|| {}).expect("spawn");
    load_tiny(&engine);
    let mut messages = Vec::new();
    (0..turns)
        .map(|turn| {
            messages.push(ChatMessage::user(format!("{opening} {turn}")));
            let request = engine.generate(messages.clone(), greedy(), 6, OverflowPolicy::Stop);
            let reply = collect(&engine, request);
            messages.push(ChatMessage::assistant(reply.text));
            reply.token_ids
        })
        .collect()
}

#[test]
fn interleaved_conversations_of_two_clients_each_get_their_own_correct_replies() {
    let turns = 3;
    let alone_a = conversation_alone("Tell me about apples, question", turns);
    let alone_b = conversation_alone("Quick maths, question", turns);

    let engine = EngineHandle::spawn(|| {}).expect("spawn");
    load_tiny(&engine);
    let (a, b) = (engine.clone_client(), engine.clone_client());
    let (mut messages_a, mut messages_b) = (Vec::new(), Vec::new());
    for turn in 0..turns {
        messages_a.push(ChatMessage::user(format!(
            "Tell me about apples, question {turn}"
        )));
        messages_b.push(ChatMessage::user(format!("Quick maths, question {turn}")));
        // Both queued at once: B's turn runs between A's turns, so the cache switches
        // conversations every time.
        let request_a = a.generate(messages_a.clone(), greedy(), 6, OverflowPolicy::Stop);
        let request_b = b.generate(messages_b.clone(), greedy(), 6, OverflowPolicy::Stop);
        let reply_b = collect_client(&b, request_b);
        let reply_a = collect_client(&a, request_a);
        assert_eq!(reply_a.token_ids, alone_a[turn], "A, turn {turn}");
        assert_eq!(reply_b.token_ids, alone_b[turn], "B, turn {turn}");
        messages_a.push(ChatMessage::assistant(reply_a.text));
        messages_b.push(ChatMessage::assistant(reply_b.text));
    }
    assert_no_more_events(&engine, "nothing reaches the client that asked for nothing");
}

#[test]
fn a_full_queue_refuses_with_busy_and_stop_is_per_request() {
    let options = EngineOptions {
        queue_limit: 1,
        parallel: 1,
        ..EngineOptions::default()
    };
    let engine = EngineHandle::spawn_with(options, || {}).expect("spawn");
    load_tiny(&engine);
    let (long, queued, refused) = (
        engine.clone_client(),
        engine.clone_client(),
        engine.clone_client(),
    );
    let running = long.generate(
        vec![ChatMessage::user("long")],
        greedy(),
        2000,
        OverflowPolicy::Stop,
    );
    // Wait until it runs, so the next one waits in the queue.
    loop {
        if let Event::Token { .. } = long.events().recv_timeout(TIMEOUT).expect("token") {
            break;
        }
    }
    let waiting = queued.generate(
        vec![ChatMessage::user("short")],
        greedy(),
        3,
        OverflowPolicy::Stop,
    );
    let third = refused.generate(
        vec![ChatMessage::user("more")],
        greedy(),
        3,
        OverflowPolicy::Stop,
    );
    assert_eq!(collect_client(&refused, third).busy, vec![third]);

    long.stop();
    let (reason, stats) = collect_client(&long, running).finish.expect("finished");
    assert_eq!(reason, FinishReason::Stopped);
    assert!(stats.generated_tokens < 2000);
    let reply = collect_client(&queued, waiting);
    assert_eq!(
        reply.finish.expect("finished").0,
        FinishReason::MaxTokens,
        "only its own request stopped"
    );
    assert_eq!(reply.token_ids.len(), 3);
}

#[test]
fn a_dropped_client_stops_its_generation_within_one_token() {
    let engine = EngineHandle::spawn(|| {}).expect("spawn");
    load_tiny(&engine);
    let client = engine.clone_client();
    client.generate(
        vec![ChatMessage::user("go on")],
        greedy(),
        2000,
        OverflowPolicy::Stop,
    );
    loop {
        if let Event::Token { .. } = client.events().recv_timeout(TIMEOUT).expect("token") {
            break;
        }
    }
    drop(client);
    let before = engine.generated_tokens();
    let next = engine.generate(
        vec![ChatMessage::user("next")],
        greedy(),
        2,
        OverflowPolicy::Stop,
    );
    let started = Instant::now();
    assert_eq!(collect(&engine, next).token_ids.len(), 2);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    // The token being computed when the client went may still be counted; no other.
    assert!(
        engine.generated_tokens() <= before + 1 + 2,
        "{} tokens after the drop",
        engine.generated_tokens() - before
    );
}

#[test]
fn logprobs_are_computed_only_when_asked() {
    let engine = EngineHandle::spawn(|| {}).expect("spawn");
    load_tiny(&engine);
    for asked in [None, Some(4)] {
        let request = GenerateRequest {
            logprobs: asked,
            ..GenerateRequest::chat(
                vec![ChatMessage::user("hi")],
                greedy(),
                3,
                OverflowPolicy::Stop,
            )
        };
        let id = engine.submit(request).expect("engine running");
        let mut seen = 0;
        loop {
            match next_event(&engine) {
                Event::Token { request, token } if request == id => {
                    seen += 1;
                    match (asked, token.logprobs) {
                        (None, None) => {}
                        (Some(top), Some(scores)) => {
                            assert_eq!(scores.top.len(), top);
                            // Greedy: the token drawn is the likeliest.
                            assert_eq!(scores.top[0].0, token.id);
                            assert_eq!(scores.top[0].2, scores.logprob);
                            assert!(scores.top.windows(2).all(|pair| pair[0].2 >= pair[1].2));
                            assert!(scores.logprob <= 0.0);
                        }
                        (asked, got) => panic!("asked {asked:?}, got {got:?}"),
                    }
                }
                Event::Finished { request, .. } if request == id => break,
                Event::Error { error, .. } => panic!("{error}"),
                _ => {}
            }
        }
        assert_eq!(seen, 3);
    }
}

#[test]
fn missing_model_folder_is_an_error_and_the_next_load_works() {
    let engine = EngineHandle::spawn(|| {}).expect("spawn");
    let request = ask(&engine, "hi", 4);
    assert_eq!(expect_error(&engine, request), EngineError::NoModel);
    let missing = tiny_model_dir().join("does-not-exist");
    engine.load_model(
        ModelSource::Folder(missing.clone()),
        ModelOptions::default(),
    );
    loop {
        match next_event(&engine) {
            Event::Loading { .. } => {}
            Event::Error { error, .. } => {
                assert_eq!(error, EngineError::ModelNotFound { path: missing });
                assert!(error.to_string().contains("does-not-exist"), "{error}");
                break;
            }
            other => panic!("expected an error, got {other:?}"),
        }
    }
    load_tiny(&engine);
    let request = ask(&engine, "hi", 4);
    assert_eq!(collect(&engine, request).token_ids.len(), 4);
}

#[test]
fn dropping_the_handle_mid_generation_joins_promptly() {
    let engine = EngineHandle::spawn(|| {}).expect("spawn");
    load_tiny(&engine);
    ask(&engine, "go on forever", 2000);
    loop {
        if let Event::Token { .. } = next_event(&engine) {
            break;
        }
    }
    let started = Instant::now();
    drop(engine);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "drop took {:?}",
        started.elapsed()
    );
}

#[test]
fn an_overflowing_conversation_drops_old_turns_visibly_or_stops_with_a_message() {
    let dir = common::tiny_model_copy();
    let config_path = dir.path().join("config.json");
    let mut config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&config_path).expect("read")).expect("json");
    config["max_position_embeddings"] = 160.into();
    std::fs::write(&config_path, config.to_string()).expect("write");

    let engine = EngineHandle::spawn(|| {}).expect("spawn");
    engine.load_model(
        ModelSource::Folder(dir.path().to_path_buf()),
        ModelOptions::default(),
    );
    while !matches!(next_event(&engine), Event::ModelReady(_)) {}

    let mut messages = vec![ChatMessage::system("Keep this system prompt.")];
    for turn in 0..6 {
        messages.push(ChatMessage::user(format!(
            "This is an earlier question, number {turn}, with some words."
        )));
        messages.push(ChatMessage::assistant(
            "And this is an earlier answer with a few more words in it.",
        ));
    }
    messages.push(ChatMessage::user("The newest question?"));

    let request = engine.generate(
        messages.clone(),
        greedy(),
        8,
        OverflowPolicy::DropOldestTurns,
    );
    let mut dropped = None;
    loop {
        match next_event(&engine) {
            Event::PromptProcessed {
                dropped_messages,
                stats,
                ..
            } => {
                assert!(stats.prompt_tokens + 8 <= 160, "{stats:?}");
                dropped = Some(dropped_messages);
            }
            Event::Finished { request: r, .. } if r == request => break,
            Event::Error { error, .. } => panic!("{error}"),
            _ => {}
        }
    }
    let dropped = dropped.expect("prompt processed");
    assert!(
        dropped >= 2 && dropped % 2 == 0,
        "whole turns dropped: {dropped}"
    );

    let request = engine.generate(messages, greedy(), 8, OverflowPolicy::Stop);
    match expect_error(&engine, request) {
        EngineError::ContextFull { limit, .. } => assert_eq!(limit, 160),
        other => panic!("expected a full context, got {other:?}"),
    }
}

/// What one request gave: each token and the bits of its log-probability.
#[derive(Debug, Default, PartialEq)]
struct Answer {
    tokens: Vec<(u32, u32)>,
    finished: bool,
}

/// A request and the client it came from, as its events arrive.
struct Stream {
    client: Client,
    id: RequestId,
    answer: Answer,
    /// The prompt's tokens and how many of them came from the cache, once it is read.
    prompt: Option<(usize, usize)>,
}

impl Stream {
    fn send(engine: &EngineHandle, request: &GenerateRequest) -> Self {
        let client = engine.clone_client();
        let id = client.submit(request.clone()).expect("the engine runs");
        Self {
            client,
            id,
            answer: Answer::default(),
            prompt: None,
        }
    }

    /// Takes one event in.
    fn pump(&mut self) {
        match self
            .client
            .events()
            .recv_timeout(TIMEOUT)
            .expect("an event in time")
        {
            Event::Token { request, token } if request == self.id => {
                let logprob = token.logprobs.expect("asked for").logprob;
                self.answer.tokens.push((token.id, logprob.to_bits()));
            }
            Event::PromptProcessed { request, stats, .. } if request == self.id => {
                self.prompt = Some((stats.prompt_tokens, stats.reused_tokens));
            }
            Event::Finished { request, .. } if request == self.id => self.answer.finished = true,
            Event::Error { error, .. } => panic!("{error}"),
            Event::Busy { .. } => panic!("refused"),
            _ => {}
        }
    }

    fn finish(self) -> Answer {
        self.finish_with_prompt().0
    }

    /// The answer, and the prompt's tokens and how many of them came from the cache.
    fn finish_with_prompt(mut self) -> (Answer, (usize, usize)) {
        while !self.answer.finished {
            self.pump();
        }
        (self.answer, self.prompt.expect("the prompt was read"))
    }
}

/// Eight greedy and eight seeded sampled requests of different lengths, with
/// log-probabilities.
fn mixed_requests(tokens: usize) -> Vec<GenerateRequest> {
    let texts = [
        "Hi",
        "What is the capital of France?",
        "Write a haiku about the sea.",
        "Explain how a rainbow forms, step by step, for a child of seven.",
        "2+2=",
        "List three fruits.",
        "Tell me a story about a brave little toaster that wanted to see the world.",
        "Why?",
    ];
    let sampled = |seed: u64| SamplingParams {
        temperature: 0.9,
        top_p: 0.95,
        seed,
        ..SamplingParams::default()
    };
    (0..16)
        .map(|i| {
            let sampling = match i < 8 {
                true => greedy(),
                false => sampled(i as u64),
            };
            let mut request = GenerateRequest::chat(
                vec![ChatMessage::user(texts[i % 8])],
                sampling,
                tokens - i % 3,
                OverflowPolicy::Stop,
            );
            request.logprobs = Some(2);
            request
        })
        .collect()
}

/// Each request alone (one at a time), then with 1, 3 and 7 others running beside it, which
/// join one or two tokens apart: the same tokens, with bit-identical log-probabilities.
fn together_as_alone(source: ModelSource, tokens: usize) {
    let requests = mixed_requests(tokens);
    let load = |engine: &EngineHandle| {
        assert!(engine.load_model(source.clone(), ModelOptions::default()));
        loop {
            match next_event(engine) {
                Event::ModelReady(_) => break,
                Event::Error { error, .. } => panic!("{error}"),
                _ => {}
            }
        }
    };
    let engine = one_at_a_time();
    load(&engine);
    let alone: Vec<Answer> = requests
        .iter()
        .map(|request| Stream::send(&engine, request).finish())
        .collect();
    drop(engine);

    let options = EngineOptions {
        parallel: 8,
        ..EngineOptions::default()
    };
    let engine = EngineHandle::spawn_with(options, || {}).expect("spawn");
    load(&engine);
    for group in [2, 4, 8] {
        let indices: Vec<usize> = (0..requests.len()).collect();
        for members in indices.chunks(group) {
            let mut streams: Vec<Stream> = Vec::new();
            for (k, &i) in members.iter().enumerate() {
                if let Some(previous) = streams.last_mut() {
                    while !previous.answer.finished && previous.answer.tokens.len() < 1 + k % 2 {
                        previous.pump();
                    }
                }
                streams.push(Stream::send(&engine, &requests[i]));
            }
            for (stream, &i) in streams.into_iter().zip(members) {
                let answer = stream.finish();
                assert!(!answer.tokens.is_empty());
                assert!(
                    answer == alone[i],
                    "request {i} beside {} others: {:?}\nalone: {:?}",
                    group - 1,
                    answer.tokens,
                    alone[i].tokens
                );
            }
        }
    }
}

#[test]
fn requests_run_together_answer_bit_for_bit_as_alone() {
    together_as_alone(ModelSource::Folder(tiny_model_dir()), 12);
}

/// The same on the genuine SmolLM2 file, whose integer weights take the integer kernels.
#[test]
fn requests_run_together_answer_bit_for_bit_as_alone_on_the_genuine_file() {
    let file = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/models/SmolLM2-135M-Instruct.Q4_1.gguf");
    together_as_alone(ModelSource::GgufFile(file), 6);
}

/// The same request sent again (an API client's retry, Regenerate) is answered from the
/// cache that read it, greedy and seeded: nothing of its prompt is read again, and the reply
/// has the same tokens with bit-identical log-probabilities.
#[test]
fn the_same_request_sent_again_reads_nothing_and_answers_bit_for_bit() {
    let engine = EngineHandle::spawn(|| {}).expect("spawn");
    load_tiny(&engine);
    let requests = mixed_requests(8);
    for request in [&requests[2], &requests[11]] {
        let (first, (tokens, reused)) = Stream::send(&engine, request).finish_with_prompt();
        assert!(reused < tokens);
        let (again, (_, reused)) = Stream::send(&engine, request).finish_with_prompt();
        assert_eq!(reused, tokens, "read again");
        assert!(!first.tokens.is_empty());
        assert!(
            again == first,
            "again: {:?}\nfirst: {:?}",
            again.tokens,
            first.tokens
        );
    }
}

/// A new question after the same system prompt reads only the question: the system
/// prompt's own pass is reused from the first request's cache, and the answer is bit for bit
/// the one the question gets on an engine that never saw the first. The same while the
/// first still runs.
#[test]
fn a_new_question_after_the_same_system_prompt_reads_only_the_question() {
    let system =
        ChatMessage::system("You are a careful assistant. Answer in full sentences, briefly.");
    let request = |question: &str| {
        let messages = vec![system.clone(), ChatMessage::user(question)];
        let mut request = GenerateRequest::chat(messages, greedy(), 6, OverflowPolicy::Stop);
        request.logprobs = Some(2);
        request
    };
    let (first, second) = (
        request("What is the capital of France?"),
        request("List three fruits."),
    );
    let engine = EngineHandle::spawn(|| {}).expect("spawn");
    load_tiny(&engine);
    let (alone, (_, reused)) = Stream::send(&engine, &second).finish_with_prompt();
    assert_eq!(reused, 0);

    let engine = EngineHandle::spawn(|| {}).expect("spawn");
    load_tiny(&engine);
    Stream::send(&engine, &first).finish();
    let (after, (tokens, reused)) = Stream::send(&engine, &second).finish_with_prompt();
    assert!(
        (smolchat::generation::SHARED_HISTORY..tokens - 3).contains(&reused),
        "{reused} of {tokens} reused"
    );
    assert!(
        after == alone,
        "after: {:?}\nalone: {:?}",
        after.tokens,
        alone.tokens
    );
    // The second took a copy of the system prompt's positions and left the first's cache
    // whole: the first, asked again, reads nothing.
    let (_, (tokens, reused)) = Stream::send(&engine, &first).finish_with_prompt();
    assert_eq!(reused, tokens);

    // While a generation after the same system prompt runs, a question copies the start of
    // its cache.
    let engine = EngineHandle::spawn(|| {}).expect("spawn");
    load_tiny(&engine);
    let messages = vec![system.clone(), ChatMessage::user("Tell me a long story.")];
    let mut long = GenerateRequest::chat(messages, greedy(), 2000, OverflowPolicy::Stop);
    long.logprobs = Some(0);
    let mut running = Stream::send(&engine, &long);
    while running.answer.tokens.is_empty() {
        running.pump();
    }
    let (during, (tokens, reused)) = Stream::send(&engine, &second).finish_with_prompt();
    assert!(!running.answer.finished, "the long one still runs");
    assert!(
        (smolchat::generation::SHARED_HISTORY..tokens - 3).contains(&reused),
        "{reused} of {tokens} reused"
    );
    assert!(during == alone);
    running.client.stop();
}

/// With three long generations streaming (API clients), a fourth (the window's message)
/// takes the free slot at once: its whole reply comes while they still run.
#[test]
fn a_request_beside_three_running_ones_is_answered_before_they_end() {
    let engine = EngineHandle::spawn(|| {}).expect("spawn");
    load_tiny(&engine);
    let long: Vec<(Client, RequestId)> = (0..3)
        .map(|i| {
            let client = engine.clone_client();
            let request = client.generate(
                vec![ChatMessage::user(format!("story {i}"))],
                greedy(),
                2000,
                OverflowPolicy::Stop,
            );
            (client, request)
        })
        .collect();
    for (client, _) in &long {
        while !matches!(
            client.events().recv_timeout(TIMEOUT).expect("streams"),
            Event::Token { .. }
        ) {}
    }
    let window = engine.clone_client();
    let request = window.generate(
        vec![ChatMessage::user("hello")],
        greedy(),
        3,
        OverflowPolicy::Stop,
    );
    let reply = collect_client(&window, request);
    assert_eq!(reply.token_ids.len(), 3);
    for (client, running) in &long {
        let ended = client
            .events()
            .try_iter()
            .any(|event| matches!(event, Event::Finished { request, .. } if request == *running));
        assert!(
            !ended,
            "a long generation ended before the short one was answered"
        );
        client.stop();
        let (reason, _) = collect_client(client, *running).finish.expect("finished");
        assert_eq!(reason, FinishReason::Stopped);
    }
}

/// The caches share a budget of positions: while a running generation holds it all, a new
/// one waits its turn (and is told so), then runs once the first ends. The budget is set
/// when the engine starts (`serve --kv-budget`), or later, before or after a model loads
/// (the window's setting).
#[test]
fn a_request_waits_while_running_ones_hold_the_whole_cache_budget() {
    let options = EngineOptions {
        kv_budget: Some(48),
        ..EngineOptions::default()
    };
    let engine = EngineHandle::spawn_with(options, || {}).expect("spawn");
    load_tiny(&engine);
    waits_while_another_holds_48_positions(&engine);

    let engine = EngineHandle::spawn(|| {}).expect("spawn");
    assert!(engine.set_kv_budget(Some(48)));
    load_tiny(&engine);
    waits_while_another_holds_48_positions(&engine);

    let engine = EngineHandle::spawn(|| {}).expect("spawn");
    load_tiny(&engine);
    assert!(engine.set_kv_budget(Some(48)));
    waits_while_another_holds_48_positions(&engine);
}

fn waits_while_another_holds_48_positions(engine: &EngineHandle) {
    let (first, second) = (engine.clone_client(), engine.clone_client());
    let running = first.generate(
        vec![ChatMessage::user("a long story")],
        greedy(),
        2000,
        OverflowPolicy::Stop,
    );
    // Until the first holds the budget.
    loop {
        if let Event::Stats { stats, .. } = first.events().recv_timeout(TIMEOUT).expect("runs")
            && stats.generation.context_used >= 48
        {
            break;
        }
    }
    let waiting = second.generate(
        vec![ChatMessage::user("hi")],
        greedy(),
        3,
        OverflowPolicy::Stop,
    );
    match second.events().recv_timeout(TIMEOUT).expect("told") {
        Event::Waiting { request, ahead } => assert_eq!((request, ahead), (waiting, 1)),
        other => panic!("expected to wait, got {other:?}"),
    }
    first.stop();
    let (reason, _) = collect_client(&first, running).finish.expect("finished");
    assert_eq!(reason, FinishReason::Stopped);
    assert_eq!(collect_client(&second, waiting).token_ids.len(), 3);
}

/// Reply of turn two of a conversation after a long request of another client ran between
/// its turns, on an engine whose caches may hold `budget` positions together: how many of
/// turn two's prompt tokens came from the cache.
fn reused_after_another_request(budget: usize) -> usize {
    let options = EngineOptions {
        kv_budget: Some(budget),
        ..EngineOptions::default()
    };
    let engine = EngineHandle::spawn_with(options, || {}).expect("spawn");
    load_tiny(&engine);
    // A system prompt of its own: the other request's history (the template's) is no help.
    let mut messages = vec![
        ChatMessage::system("Be kind."),
        ChatMessage::user("Hello there"),
    ];
    let first = collect(
        &engine,
        engine.generate(messages.clone(), greedy(), 5, OverflowPolicy::Stop),
    );
    messages.push(ChatMessage::assistant(first.text));
    let other = collect(&engine, ask(&engine, &"many words ".repeat(20), 5));
    assert_eq!(other.token_ids.len(), 5);
    messages.push(ChatMessage::user("And then?"));
    let second = collect(
        &engine,
        engine.generate(messages, greedy(), 5, OverflowPolicy::Stop),
    );
    second.prompt_stats.expect("prompt read").reused_tokens
}

/// An idle conversation keeps its cache while there is room, and gives it up, before a
/// running request would wait, when a new prompt needs the room.
#[test]
fn an_idle_conversations_cache_is_given_up_when_a_new_prompt_needs_the_room() {
    assert!(
        reused_after_another_request(2048) > 0,
        "kept while there is room"
    );
    assert_eq!(
        reused_after_another_request(64),
        0,
        "given up for the longer prompt"
    );
}
