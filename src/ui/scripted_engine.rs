//! A stand-in for the inference thread in tests: the test holds the engine's ends of the
//! channels, reads the commands the window's state sends and answers with events, so the
//! state's logic runs without a model, in milliseconds.

use std::path::Path;
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender, unbounded};

use crate::engine::{Command, EngineHandle, Event, GenerateRequest, LiveStats, ModelInfo, Stopper};
use crate::generation::{GenerationStats, ModelOptions, TokenEvent};

pub struct ScriptedEngine {
    commands: Receiver<Command>,
    events: Sender<Event>,
    pub stopper: Stopper,
}

impl ScriptedEngine {
    /// The handle to give `AppState::new`, and the script that serves it.
    pub fn new() -> (EngineHandle, Self) {
        let (command_tx, command_rx) = unbounded();
        let (event_tx, event_rx) = unbounded();
        let handle = EngineHandle::connect(command_tx, event_rx);
        let script = Self {
            commands: command_rx,
            events: event_tx,
            stopper: handle.stopper(),
        };
        (handle, script)
    }

    /// Queues an event; the state takes it in at its next `poll`.
    pub fn send(&self, event: Event) {
        self.events
            .send(event)
            .expect("the state holds the events receiver");
    }

    /// The commands sent since the last call.
    pub fn commands(&self) -> Vec<Command> {
        self.commands.try_iter().collect()
    }

    /// The one generation requested since the last call.
    pub fn generate_request(&self) -> GenerateRequest {
        match self.commands().as_slice() {
            [Command::Generate(request)] => request.clone(),
            other => panic!("expected one Generate command, got {other:?}"),
        }
    }
}

pub fn model_info(dir: &Path) -> ModelInfo {
    ModelInfo {
        dir: dir.to_path_buf(),
        description: "SmolLM2-135M-Instruct, f32 on CPU (flex)".into(),
        context_limit: 2048,
        options: ModelOptions::default(),
        load_time: Duration::from_millis(5),
        fallback_template: false,
        backend_fallback: None,
    }
}

pub fn token(text: &str) -> TokenEvent {
    TokenEvent {
        id: 1,
        text: text.into(),
        probability: 0.5,
        alternatives: vec![(2, "x".into(), 0.25)],
    }
}

pub fn stats(generated_tokens: usize) -> LiveStats {
    LiveStats {
        generation: GenerationStats {
            prompt_tokens: 10,
            prefilled_tokens: 10,
            prefill_time: Duration::from_millis(10),
            time_to_first_token: Duration::from_millis(20),
            generated_tokens,
            decode_time: Duration::from_millis(10 * generated_tokens as u64),
            context_used: 10 + generated_tokens,
            context_limit: 2048,
            ..GenerationStats::default()
        },
        resident_bytes: Some(300 << 20),
        device_bytes: None,
    }
}
