use std::collections::VecDeque;
use std::ops::ControlFlow;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;

use super::error::EngineError;
use super::protocol::{Command, Event, GenerateRequest, LiveStats, ModelInfo, Reply, RequestId};
use super::shared::Shared;
use crate::generation::{
    FinishReason, GenerationSession, GenerationStats, LoadedModel, MemoryPlan, ModelOptions,
    PromptFit, PromptProgress, Step,
};
use crate::model::KvCache;
use crate::model_files::model_name;
use crate::model_source::ModelSource;
use crate::stats::memory;
use crate::text::reasoning::THINKING_VARIABLE;

/// How often a generation reports its live figures: as often as the window redraws for them.
/// Per token, the extra event, memory reading and wake-up of the client's thread took time
/// from the model's threads: on two cores the server decoded at 0.90× `generate`, and at
/// 0.98× with this and one HTTP thread.
const STATS_INTERVAL: Duration = Duration::from_millis(100);

/// The inference thread's state: the model, the cache of the conversation it last served
/// and the commands waiting their turn.
pub(super) struct Worker {
    queue: Queue,
    notify: Box<dyn Fn() + Send>,
    model: Option<(LoadedModel, KvCache)>,
    shutting_down: bool,
}

/// Commands in arrival order, whichever client sent them: first come, first served. A
/// generation runs to its end before the next command starts, and the KV cache is reused by
/// common prefix, so interleaved conversations stay correct (each prefills what differs).
struct Queue {
    commands: Receiver<Command>,
    /// Commands that arrived during a generation and wait for it to end.
    pending: VecDeque<Command>,
    /// How many generations `pending` may hold.
    limit: usize,
    shared: Arc<Shared>,
}

impl Queue {
    /// The next command to run, waiting for one; `None` when every client is gone.
    fn next(&mut self, notify: &dyn Fn()) -> Option<Command> {
        let command = match self.pending.pop_front() {
            Some(command) => {
                if matches!(command, Command::Generate { .. }) {
                    self.announce(notify);
                }
                command
            }
            None => self.commands.recv().ok()?,
        };
        self.publish();
        Some(command)
    }

    /// Tells each waiting generation how many run or wait before it: when one joins, and
    /// when the queue moves up.
    fn announce(&self, notify: &dyn Fn()) {
        let waiting = self.pending.iter().filter_map(|command| match command {
            Command::Generate { id, reply, .. } => Some((*id, reply)),
            _ => None,
        });
        for (before, (request, reply)) in waiting.enumerate() {
            let ahead = before + 1;
            deliver(reply, notify, Event::Waiting { request, ahead });
        }
    }

    /// Takes in the commands that arrived during a generation: generations join the queue
    /// while it has room and are refused with `Busy` when it has none; the rest waits its
    /// turn, except `Shutdown`, which is answered at once: returns true when it came.
    fn take_new(&mut self, notify: &dyn Fn()) -> bool {
        let mut shutdown = false;
        let mut joined = false;
        for command in self.commands.try_iter().collect::<Vec<_>>() {
            match command {
                Command::Shutdown => shutdown = true,
                Command::Generate { id, reply, .. } if self.is_full(notify) => {
                    deliver(&reply, notify, Event::Busy { refused: id });
                }
                other => {
                    joined |= matches!(other, Command::Generate { .. });
                    self.pending.push_back(other);
                }
            }
        }
        if joined {
            self.announce(notify);
        }
        self.publish();
        shutdown
    }

    fn waiting(&self) -> usize {
        self.pending
            .iter()
            .filter(|command| matches!(command, Command::Generate { .. }))
            .count()
    }

    /// Whether no generation can join, after dropping the waiting ones whose clients stopped
    /// them or went away.
    fn is_full(&mut self, notify: &dyn Fn()) -> bool {
        if self.waiting() < self.limit {
            return false;
        }
        let (cancelled, kept): (Vec<Command>, Vec<Command>) = std::mem::take(&mut self.pending)
            .into_iter()
            .partition(
                |command| matches!(command, Command::Generate { reply, .. } if reply.is_cancelled()),
            );
        self.pending = kept.into();
        for command in cancelled {
            if let Command::Generate { id, reply, .. } = command {
                deliver(&reply, notify, stopped_before_start(id));
            }
        }
        self.waiting() >= self.limit
    }

    fn publish(&self) {
        self.shared.queued.store(self.waiting(), Ordering::SeqCst);
    }
}

/// Sends to one client and runs the notify hook if it asked for it; false when the client
/// no longer listens.
fn deliver(reply: &Reply, notify: &dyn Fn(), event: Event) -> bool {
    let delivered = reply.send(event);
    if reply.notify {
        notify();
    }
    delivered
}

/// The final event of a generation stopped while it waited: nothing was generated.
fn stopped_before_start(request: RequestId) -> Event {
    Event::Finished {
        request,
        reason: FinishReason::Stopped,
        text: String::new(),
        stats: LiveStats {
            generation: GenerationStats::default(),
            resident_bytes: None,
            device_bytes: None,
        },
    }
}

/// Marks the engine as gone however the thread ends, so that clients stop waiting.
struct RunningFlag(Arc<Shared>);

impl Drop for RunningFlag {
    fn drop(&mut self) {
        self.0.running.store(false, Ordering::SeqCst);
    }
}

impl Worker {
    pub(super) fn new(
        commands: Receiver<Command>,
        notify: Box<dyn Fn() + Send>,
        shared: Arc<Shared>,
        queue_limit: usize,
    ) -> Self {
        Self {
            queue: Queue {
                commands,
                pending: VecDeque::new(),
                limit: queue_limit,
                shared,
            },
            notify,
            model: None,
            shutting_down: false,
        }
    }

    /// Serves commands until `Shutdown` or until every client is gone.
    ///
    /// Each command runs under `catch_unwind`: a panic anywhere below (a bug, a backend
    /// assertion) becomes an error event and the worker carries on with a cleared cache.
    pub(super) fn run(mut self) {
        let _running = RunningFlag(Arc::clone(&self.queue.shared));
        while !self.shutting_down {
            let Some(command) = self.queue.next(&*self.notify) else {
                break;
            };
            let (request, reply) = match &command {
                Command::Generate { id, reply, .. } => (Some(*id), Some(reply.clone())),
                Command::LoadModel { reply, .. } => (None, Some(reply.clone())),
                #[cfg(test)]
                Command::InjectPanic(reply) => (None, Some(reply.clone())),
                _ => (None, None),
            };
            if catch_unwind(AssertUnwindSafe(|| self.handle(command))).is_err() {
                if let Some((_, cache)) = &mut self.model {
                    cache.clear();
                }
                if let Some(reply) = reply {
                    let error = EngineError::Internal;
                    self.send(&reply, Event::Error { request, error });
                }
            }
        }
        // Every generation sent ends with one final event, even at shutdown.
        let unserved: Vec<Command> = std::mem::take(&mut self.queue.pending)
            .into_iter()
            .chain(self.queue.commands.try_iter())
            .collect();
        for command in unserved {
            if let Command::Generate { id, reply, .. } = command {
                self.send(&reply, stopped_before_start(id));
            }
        }
    }

    fn send(&self, reply: &Reply, event: Event) -> bool {
        deliver(reply, &*self.notify, event)
    }

    fn handle(&mut self, command: Command) {
        match command {
            Command::LoadModel {
                source,
                options,
                reply,
            } => self.load(source, options, &reply),
            Command::Generate { id, request, reply } => self.generate(id, request, &reply),
            Command::ResetConversation => {
                if let Some((_, cache)) = &mut self.model {
                    cache.clear();
                }
            }
            Command::Shutdown => self.shutting_down = true,
            #[cfg(test)]
            Command::InjectPanic(_) => panic!("panic injected by Command::InjectPanic"),
        }
    }

    fn load(&mut self, source: ModelSource, options: ModelOptions, reply: &Reply) {
        let mut progress = |progress| {
            self.send(reply, Event::DownloadProgress(progress));
        };
        let dir = match super::resolve_source(&source, &mut progress, &reply.cancel) {
            Ok(dir) => dir,
            Err(error) => {
                let request = None;
                self.send(reply, Event::Error { request, error });
                return;
            }
        };
        // Free the old model first: two models at once could double peak memory (and the
        // plan below would count its memory as taken).
        self.model = None;
        self.queue.shared.set_model(None);
        // What the model will take, before its weights are read (a file it cannot read is
        // reported by the load itself).
        let memory = MemoryPlan::of(&dir).ok();
        self.send(
            reply,
            Event::Loading {
                dir: dir.clone(),
                memory,
            },
        );
        let mut progress = |progress| {
            self.send(reply, Event::LoadProgress(progress));
        };
        match LoadedModel::load_with_progress(&dir, options, &mut progress) {
            Ok(loaded) => {
                let info = ModelInfo {
                    name: model_name(&dir),
                    dir,
                    description: loaded.describe(),
                    context_limit: loaded.memory.context,
                    memory: loaded.memory,
                    options: loaded.options,
                    load_time: loaded.load_time,
                    fallback_template: loaded.template.is_fallback(),
                    thinking_switch: loaded.template.reads(THINKING_VARIABLE),
                    backend_fallback: loaded.device.fallback.clone(),
                    software_gpu: loaded.device.is_software_renderer(),
                    sampling_defaults: loaded.sampling_defaults,
                    integer_weights: loaded.integer_types.clone(),
                };
                let cache = loaded.new_cache();
                self.model = Some((loaded, cache));
                self.queue.shared.set_model(Some(info.clone()));
                self.send(reply, Event::ModelReady(info));
            }
            Err(err) => {
                let error = EngineError::ModelLoad {
                    path: dir,
                    reason: err.to_string(),
                };
                self.send(
                    reply,
                    Event::Error {
                        request: None,
                        error,
                    },
                );
            }
        }
    }

    fn generate(&mut self, id: RequestId, request: GenerateRequest, reply: &Reply) {
        let fail = |error: EngineError| Event::Error {
            request: Some(id),
            error,
        };
        if reply.is_cancelled() {
            self.send(reply, stopped_before_start(id));
            return;
        }
        // The session borrows the model, so the rest of the loop uses the other fields.
        let notify = &*self.notify;
        let send = |event| deliver(reply, notify, event);
        let Some((loaded, cache)) = &mut self.model else {
            send(fail(EngineError::NoModel));
            return;
        };
        let fit = PromptFit {
            limit: cache.max_len(),
            max_new_tokens: request.max_new_tokens,
            overflow: request.overflow,
            variables: &request.template_variables,
        };
        let (prompt, dropped_messages) = match fit.ids(loaded, &request.prompt) {
            Ok(prompt) => prompt,
            Err(error) => {
                send(fail(EngineError::from_generation(error)));
                return;
            }
        };
        let device = loaded.device.clone();
        // Stop, a client gone or the app closing ends a long prompt between its passes.
        let queue = &mut self.queue;
        let shutting_down = &mut self.shutting_down;
        let mut reading = |progress: PromptProgress| {
            *shutting_down |= queue.take_new(notify);
            let listening = send(Event::PromptProgress {
                request: id,
                done: progress.done,
                total: progress.total,
            });
            if listening && !reply.is_cancelled() && !*shutting_down {
                ControlFlow::Continue(())
            } else {
                ControlFlow::Break(())
            }
        };
        let session = GenerationSession::start_reading(
            loaded,
            cache,
            &prompt,
            &request.sampling,
            request.max_new_tokens.unwrap_or(usize::MAX),
            &mut reading,
        );
        let mut session = match session {
            Ok(session) => session.with_logprobs(request.logprobs),
            Err(err) => {
                send(fail(EngineError::from_generation(err)));
                return;
            }
        };
        // A client that no longer listens (a disconnected API client) is stopped like one
        // that pressed Stop: before the next token.
        let mut listening = send(Event::PromptProcessed {
            request: id,
            stats: session.stats().clone(),
            dropped_messages,
        });
        let mut last_stats: Option<Instant> = None;
        loop {
            if self.queue.take_new(notify) {
                self.shutting_down = true;
            }
            let step = if !listening || reply.is_cancelled() || self.shutting_down {
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
                    let shared = &self.queue.shared;
                    shared.generated_tokens.fetch_add(1, Ordering::SeqCst);
                    listening = send(Event::Token { request: id, token });
                    if last_stats.is_none_or(|sent| sent.elapsed() >= STATS_INTERVAL) {
                        last_stats = Some(Instant::now());
                        listening &= send(Event::Stats {
                            request: id,
                            stats: live(&session),
                        });
                    }
                }
                Ok(Step::Finished { reason, text }) => {
                    send(Event::Finished {
                        request: id,
                        reason,
                        text,
                        stats: live(&session),
                    });
                    return;
                }
                Err(err) => {
                    let stats = live(&session);
                    send(Event::Error {
                        request: Some(id),
                        error: EngineError::from_generation(err),
                    });
                    send(Event::Finished {
                        request: id,
                        reason: FinishReason::Stopped,
                        text: String::new(),
                        stats,
                    });
                    return;
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
        let engine = EngineHandle::spawn(|| {}).expect("spawn");
        let tiny = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-smollm");
        engine.load_model(ModelSource::Folder(tiny), ModelOptions::default());
        while !matches!(next_event(&engine), Event::ModelReady(_)) {}

        assert!(engine.send(Command::InjectPanic(engine.reply(None))));
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
