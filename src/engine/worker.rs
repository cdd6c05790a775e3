use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crossbeam_channel::{Receiver, Sender};

use super::error::EngineError;
use super::protocol::{Command, Event, GenerateRequest, LiveStats, ModelInfo};
use crate::generation::{FinishReason, GenerationSession, LoadedModel, ModelOptions, Step};
use crate::model::KvCache;
use crate::model_source::ModelSource;
use crate::stats::memory;
use crate::text::ContextWindow;

/// The inference thread's state: the model and the cache of the conversation it last served.
pub(super) struct Worker {
    commands: Receiver<Command>,
    events: Sender<Event>,
    notify: Box<dyn Fn() + Send>,
    stop: Arc<AtomicBool>,
    model: Option<(LoadedModel, KvCache)>,
    /// Commands that arrived during a generation and wait for it to end.
    deferred: VecDeque<Command>,
    shutting_down: bool,
}

impl Worker {
    pub(super) fn new(
        commands: Receiver<Command>,
        events: Sender<Event>,
        notify: Box<dyn Fn() + Send>,
        stop: Arc<AtomicBool>,
    ) -> Self {
        Self {
            commands,
            events,
            notify,
            stop,
            model: None,
            deferred: VecDeque::new(),
            shutting_down: false,
        }
    }

    /// Serves commands until `Shutdown` or until the handle is dropped.
    ///
    /// Each command runs under `catch_unwind`: a panic anywhere below (a bug, a backend
    /// assertion) becomes an error event and the worker carries on with a cleared cache.
    pub(super) fn run(mut self) {
        while !self.shutting_down {
            let command = match self.deferred.pop_front() {
                Some(command) => command,
                None => match self.commands.recv() {
                    Ok(command) => command,
                    Err(_) => break,
                },
            };
            let request = match &command {
                Command::Generate(request) => Some(request.id),
                _ => None,
            };
            if catch_unwind(AssertUnwindSafe(|| self.handle(command))).is_err() {
                if let Some((_, cache)) = &mut self.model {
                    cache.clear();
                }
                self.send(Event::Error {
                    request,
                    error: EngineError::Internal,
                });
            }
        }
    }

    fn send(&self, event: Event) {
        // The handle may already be gone while we wind down; nobody is left to tell.
        let _ = self.events.send(event);
        (self.notify)();
    }

    fn handle(&mut self, command: Command) {
        match command {
            Command::LoadModel { source, options } => self.load(source, options),
            Command::Generate(request) => self.generate(request),
            Command::ResetConversation => {
                if let Some((_, cache)) = &mut self.model {
                    cache.clear();
                }
            }
            Command::Shutdown => self.shutting_down = true,
            #[cfg(test)]
            Command::InjectPanic => panic!("panic injected by Command::InjectPanic"),
        }
    }

    fn load(&mut self, source: ModelSource, options: ModelOptions) {
        self.stop.store(false, Ordering::SeqCst);
        let mut progress = |progress| self.send(Event::DownloadProgress(progress));
        let dir = match source.resolve(&mut progress, &self.stop) {
            Ok(dir) => dir,
            Err(error) => {
                return self.send(Event::Error {
                    request: None,
                    error,
                });
            }
        };
        self.send(Event::Loading { dir: dir.clone() });
        // Free the old model first: two models at once could double peak memory.
        self.model = None;
        match LoadedModel::load(&dir, options) {
            Ok(loaded) => {
                let info = ModelInfo {
                    dir,
                    description: loaded.describe(),
                    context_limit: loaded.model.config().max_position_embeddings,
                    options: loaded.options,
                    load_time: loaded.load_time,
                    fallback_template: loaded.template.is_fallback(),
                    backend_fallback: loaded.device.fallback.clone(),
                };
                let cache = loaded.model.new_cache();
                self.model = Some((loaded, cache));
                self.send(Event::ModelReady(info));
            }
            Err(err) => self.send(Event::Error {
                request: None,
                error: EngineError::ModelLoad {
                    path: dir,
                    reason: err.to_string(),
                },
            }),
        }
    }

    fn generate(&mut self, request: GenerateRequest) {
        let fail = |error: EngineError| Event::Error {
            request: Some(request.id),
            error,
        };
        let Some((loaded, cache)) = &mut self.model else {
            return self.send(fail(EngineError::NoModel));
        };
        let window = ContextWindow {
            limit: cache.max_len(),
            reserve_for_reply: request.max_new_tokens.clamp(1, cache.max_len() / 2),
            policy: request.overflow,
        };
        let fitted = match window.fit(&request.messages, &loaded.template, &loaded.tokenizer) {
            Ok(fitted) => fitted,
            Err(err) => return self.send(fail(EngineError::from_text(err))),
        };
        let device = loaded.device.clone();
        let session = GenerationSession::start(
            loaded,
            cache,
            &fitted.ids,
            &request.sampling,
            request.max_new_tokens,
        );
        let mut session = match session {
            Ok(session) => session,
            Err(err) => {
                let event = fail(EngineError::from_generation(err));
                return self.send(event);
            }
        };
        let events = &self.events;
        let notify = &self.notify;
        let send = |event| {
            let _ = events.send(event);
            notify();
        };
        send(Event::PromptProcessed {
            request: request.id,
            stats: session.stats().clone(),
            dropped_messages: fitted.dropped_messages,
        });
        loop {
            self.deferred
                .extend(self.commands.try_iter().filter(|command| match command {
                    Command::Generate(other) => {
                        send(Event::Busy { refused: other.id });
                        false
                    }
                    _ => true,
                }));
            let stop_requested = self.stop.load(Ordering::SeqCst)
                || self
                    .deferred
                    .iter()
                    .any(|command| matches!(command, Command::Shutdown));
            let step = if stop_requested {
                Ok(session.stop())
            } else {
                session.step()
            };
            let live = |session: &GenerationSession| LiveStats {
                generation: session.stats().clone(),
                resident_bytes: memory::resident_bytes(),
                device_bytes: device.device_memory_bytes(),
            };
            match step {
                Ok(Step::Token(token)) => {
                    send(Event::Token {
                        request: request.id,
                        token,
                    });
                    send(Event::Stats {
                        request: request.id,
                        stats: live(&session),
                    });
                }
                Ok(Step::Finished { reason, text }) => {
                    return send(Event::Finished {
                        request: request.id,
                        reason,
                        text,
                        stats: live(&session),
                    });
                }
                Err(err) => {
                    let stats = live(&session);
                    send(Event::Error {
                        request: Some(request.id),
                        error: EngineError::from_generation(err),
                    });
                    return send(Event::Finished {
                        request: request.id,
                        reason: FinishReason::Stopped,
                        text: String::new(),
                        stats,
                    });
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::time::Duration;

    use super::*;
    use crate::engine::EngineHandle;
    use crate::text::{ChatMessage, OverflowPolicy, SamplingParams};

    fn next_event(engine: &EngineHandle) -> Event {
        engine
            .events()
            .recv_timeout(Duration::from_secs(60))
            .expect("the engine answers within the time-out")
    }

    #[test]
    fn a_panic_in_the_worker_is_reported_and_survived() {
        let mut engine = EngineHandle::spawn(|| {}).expect("spawn");
        let tiny = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-smollm");
        engine.load_model(ModelSource::Folder(tiny), ModelOptions::default());
        while !matches!(next_event(&engine), Event::ModelReady(_)) {}

        assert!(engine.send(Command::InjectPanic));
        assert_eq!(
            next_event(&engine),
            Event::Error {
                request: None,
                error: EngineError::Internal
            }
        );
        let greedy = SamplingParams {
            temperature: 0.0,
            ..SamplingParams::default()
        };
        let request = engine.generate(
            vec![ChatMessage::user("still there?")],
            greedy,
            3,
            OverflowPolicy::Stop,
        );
        let mut tokens = 0;
        loop {
            match next_event(&engine) {
                Event::Token { .. } => tokens += 1,
                Event::Finished { request: r, .. } if r == request => break,
                Event::Error { error, .. } => panic!("{error}"),
                _ => {}
            }
        }
        assert_eq!(tokens, 3);
    }
}
