use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use crossbeam_channel::Receiver;

use super::error::EngineError;
use super::protocol::{Command, Event, ModelInfo, Reply, RequestId};
use super::queue::{Queue, deliver, stopped_before_start};
use super::shared::Shared;
use super::slots::{self, Slots};
use crate::generation::{LoadedModel, MemoryPlan, ModelOptions};
use crate::model_files::model_name;
use crate::model_source::ModelSource;
use crate::text::reasoning::THINKING_VARIABLE;

/// The inference thread's state: the model with its slots' KV caches, and the commands
/// waiting their turn.
pub(super) struct Worker {
    queue: Queue,
    notify: Box<dyn Fn() + Send>,
    model: Option<Slots>,
    /// How many generations run at once.
    parallel: usize,
    /// Positions their caches may hold together; `None`: one full context.
    kv_budget: Option<usize>,
    /// The generations running now, so that a panic among them is reported to each.
    running: Vec<(RequestId, Reply)>,
    shutting_down: bool,
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
        parallel: usize,
        kv_budget: Option<usize>,
    ) -> Self {
        Self {
            queue: Queue::new(commands, queue_limit, shared),
            notify,
            model: None,
            parallel,
            kv_budget,
            running: Vec::new(),
            shutting_down: false,
        }
    }

    /// Serves commands until `Shutdown` or until every client is gone.
    ///
    /// Each command, and each run of generations, goes under `catch_unwind`: a panic anywhere
    /// below (a bug, a backend assertion) becomes an error event for whoever was waiting on
    /// it, and the worker carries on with cleared caches.
    pub(super) fn run(mut self) {
        let _running = RunningFlag(Arc::clone(&self.queue.shared));
        while !self.shutting_down {
            let Some(command) = self.queue.next() else {
                break;
            };
            let reply = match &command {
                Command::LoadModel { reply, .. } => Some(reply.clone()),
                #[cfg(test)]
                Command::InjectPanic(reply) => Some(reply.clone()),
                _ => None,
            };
            let generations = matches!(command, Command::Generate { .. });
            let outcome = catch_unwind(AssertUnwindSafe(|| match command {
                // Back at the front, where the slots take it and those behind it.
                Command::Generate { .. } => {
                    self.queue.pending.push_front(command);
                    self.generations();
                }
                other => self.handle(other),
            }));
            if outcome.is_err() {
                if let Some(slots) = &mut self.model {
                    slots.clear();
                }
                let error = EngineError::Internal;
                if let (false, Some(reply)) = (generations, reply) {
                    self.send(
                        &reply,
                        Event::Error {
                            request: None,
                            error,
                        },
                    );
                }
                for (request, reply) in std::mem::take(&mut self.running) {
                    let request = Some(request);
                    self.send(
                        &reply,
                        Event::Error {
                            request,
                            error: EngineError::Internal,
                        },
                    );
                }
            }
        }
        // Every generation sent ends with one final event, even at shutdown.
        for command in self.queue.drain() {
            if let Command::Generate { id, reply, .. } = command {
                self.send(&reply, stopped_before_start(id));
            }
        }
    }

    fn send(&self, reply: &Reply, event: Event) -> bool {
        deliver(reply, &*self.notify, event)
    }

    /// Runs the generations at the front of the queue and those that join while they run.
    fn generations(&mut self) {
        let notify = &*self.notify;
        let Some(slots) = &mut self.model else {
            while let Some(admitted) = self.queue.admit() {
                let (request, error) = (Some(admitted.id), EngineError::NoModel);
                deliver(&admitted.reply, notify, Event::Error { request, error });
            }
            self.queue.announce(notify);
            return;
        };
        let cx = slots::Context {
            queue: &mut self.queue,
            notify,
            running: &mut self.running,
            shutting_down: &mut self.shutting_down,
        };
        slots::run(slots, cx);
    }

    fn handle(&mut self, command: Command) {
        match command {
            Command::LoadModel {
                source,
                options,
                reply,
            } => self.load(source, options, &reply),
            // Only through `generations`, which `run` calls for it.
            Command::Generate { .. } => {}
            Command::ResetConversation => {
                if let Some(slots) = &mut self.model {
                    slots.clear();
                }
            }
            Command::SetKvBudget(budget) => {
                self.kv_budget = budget;
                if let Some(slots) = &mut self.model {
                    slots.set_budget(budget);
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
                self.model = Some(Slots::new(loaded, self.parallel, self.kv_budget));
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
