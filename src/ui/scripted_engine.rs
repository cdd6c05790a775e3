//! A stand-in for the inference thread in tests: the test holds the engine's ends of the
//! channels, reads the commands the window's state sends and answers with events, so the
//! state's logic runs without a model, in milliseconds.

use std::cell::RefCell;
use std::path::Path;
use std::time::Duration;

use crossbeam_channel::{Receiver, unbounded};

use crate::engine::{
    Command, EngineHandle, Event, GenerateRequest, LiveStats, ModelInfo, Prompt, Reply, RequestId,
};
use crate::generation::{GenerationStats, MemoryPlan, ModelOptions, TokenEvent};
use crate::text::{ChatMessage, SamplingParams, TemplateVariables};

pub struct ScriptedEngine {
    commands: Receiver<Command>,
    /// Commands taken off the channel that the test has not looked at yet.
    unread: RefCell<Vec<Command>>,
    /// Where the last load's events go.
    load: RefCell<Option<Reply>>,
    /// Where each generation's events go.
    generations: RefCell<Vec<(RequestId, Reply)>>,
}

/// A generation as the state asked for it.
#[derive(Debug, Clone)]
pub struct Requested {
    pub id: RequestId,
    pub messages: Vec<ChatMessage>,
    pub sampling: SamplingParams,
    pub max_new_tokens: Option<usize>,
    pub template_variables: TemplateVariables,
}

impl ScriptedEngine {
    /// The handle to give `AppState::new`, and the script that serves it.
    pub fn new() -> (EngineHandle, Self) {
        let (command_tx, command_rx) = unbounded();
        let handle = EngineHandle::connect(command_tx);
        let script = Self {
            commands: command_rx,
            unread: RefCell::new(Vec::new()),
            load: RefCell::new(None),
            generations: RefCell::new(Vec::new()),
        };
        (handle, script)
    }

    fn take_in(&self) {
        for command in self.commands.try_iter() {
            match &command {
                Command::LoadModel { reply, .. } => *self.load.borrow_mut() = Some(reply.clone()),
                Command::Generate { id, reply, .. } => {
                    self.generations.borrow_mut().push((*id, reply.clone()))
                }
                _ => {}
            }
            self.unread.borrow_mut().push(command);
        }
    }

    fn reply_for(&self, event: &Event) -> Reply {
        self.take_in();
        let request = match event {
            Event::PromptProcessed { request, .. }
            | Event::Token { request, .. }
            | Event::Stats { request, .. }
            | Event::Finished { request, .. }
            | Event::Busy { refused: request }
            | Event::Error {
                request: Some(request),
                ..
            } => Some(*request),
            _ => None,
        };
        match request {
            Some(request) => self
                .generations
                .borrow()
                .iter()
                .find(|(id, _)| *id == request)
                .map(|(_, reply)| reply.clone())
                .unwrap_or_else(|| panic!("no generation {request} was asked for")),
            None => self
                .load
                .borrow()
                .clone()
                .expect("a load was asked for before its events"),
        }
    }

    /// Sends an event to whoever asked for the work it belongs to; the state takes it in at
    /// its next `poll`.
    pub fn send(&self, event: Event) {
        let reply = self.reply_for(&event);
        assert!(reply.send(event), "the state listens");
    }

    /// Whether the state stopped generation `request`.
    pub fn is_cancelled(&self, request: RequestId) -> bool {
        self.take_in();
        self.generations
            .borrow()
            .iter()
            .any(|(id, reply)| *id == request && reply.is_cancelled())
    }

    /// The commands sent since the last call.
    pub fn commands(&self) -> Vec<Command> {
        self.take_in();
        self.unread.borrow_mut().drain(..).collect()
    }

    /// The one generation requested since the last call.
    pub fn generate_request(&self) -> Requested {
        match self.commands().as_slice() {
            [
                Command::Generate {
                    id,
                    request:
                        GenerateRequest {
                            prompt: Prompt::Chat(messages),
                            sampling,
                            max_new_tokens,
                            template_variables,
                            ..
                        },
                    ..
                },
            ] => Requested {
                id: *id,
                messages: messages.clone(),
                sampling: sampling.clone(),
                max_new_tokens: *max_new_tokens,
                template_variables: template_variables.clone(),
            },
            other => panic!("expected one Generate command, got {other:?}"),
        }
    }
}

pub fn model_info(dir: &Path) -> ModelInfo {
    ModelInfo {
        name: crate::model_files::model_name(dir),
        dir: dir.to_path_buf(),
        description: "SmolLM2-135M-Instruct, f32 on CPU (flex)".into(),
        context_limit: 2048,
        memory: MemoryPlan {
            weights_bytes: 270_000_000,
            kv_bytes_per_token: 46_080,
            kv_window_bytes: 0,
            model_context: 8192,
            context: 2048,
        },
        options: ModelOptions::default(),
        load_time: Duration::from_millis(5),
        fallback_template: false,
        thinking_switch: false,
        backend_fallback: None,
        software_gpu: false,
        sampling_defaults: Default::default(),
        integer_weights: None,
    }
}

pub fn token(text: &str) -> TokenEvent {
    TokenEvent {
        id: 1,
        text: text.into(),
        probability: 0.5,
        alternatives: vec![(2, "x".into(), 0.25)],
        logprobs: None,
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
