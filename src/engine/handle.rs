use std::ops::Deref;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender, unbounded};

use super::protocol::{Command, Event, GenerateRequest, ModelInfo, Reply, RequestId};
use super::shared::Shared;
use super::worker::Worker;
use crate::generation::ModelOptions;
use crate::model_source::ModelSource;
use crate::text::{ChatMessage, OverflowPolicy, SamplingParams};

/// Generations that may wait for a slot before the engine refuses more with
/// [`Event::Busy`]: enough for a few API clients and the window, few enough that a refused
/// client hears so at once instead of waiting minutes.
pub const DEFAULT_QUEUE_LIMIT: usize = 32;

/// Generations that run at once, each with its own KV cache: the window's conversation and
/// a few API clients, decoded together. A decode step reads every weight once however many
/// sequences it serves, so each one more costs the arithmetic, not the memory traffic.
pub const DEFAULT_PARALLEL: usize = 4;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineOptions {
    /// See [`DEFAULT_QUEUE_LIMIT`].
    pub queue_limit: usize,
    /// See [`DEFAULT_PARALLEL`].
    pub parallel: usize,
    /// Positions the generations' KV caches may hold together: a new generation waits
    /// while the running ones hold them all, and idle conversations' caches are given up to
    /// make room. `None`: what one full context of the model holds, the memory announced
    /// when it loaded.
    pub kv_budget: Option<usize>,
}

impl Default for EngineOptions {
    fn default() -> Self {
        Self {
            queue_limit: DEFAULT_QUEUE_LIMIT,
            parallel: DEFAULT_PARALLEL,
            kv_budget: None,
        }
    }
}

/// The stop flag of one piece of a client's work: a generation, or a load (no request id).
type Flag = (Option<RequestId>, Arc<AtomicBool>);

/// Stops one client's generations (and its download) before their next token, from any
/// thread: flags, not queued commands, so Stop never waits behind the work it is meant to
/// stop, and it never touches another client's work.
#[derive(Debug, Clone, Default)]
pub struct Stopper {
    /// The flag of each piece of this client's work the worker may still be holding.
    work: Arc<Mutex<Vec<Flag>>>,
}

impl Stopper {
    /// Stops every generation and download this client started.
    pub fn stop(&self) {
        for (_, flag) in self.lock().iter() {
            flag.store(true, Ordering::SeqCst);
        }
    }

    /// Stops one generation, queued or running.
    pub fn stop_request(&self, request: RequestId) {
        for (_, flag) in self.lock().iter().filter(|(id, _)| *id == Some(request)) {
            flag.store(true, Ordering::SeqCst);
        }
    }

    /// A fresh flag for new work. Flags the worker no longer holds (the work is over) are
    /// forgotten here, so the list stays as short as the client's work in flight.
    fn track(&self, request: Option<RequestId>) -> Arc<AtomicBool> {
        let flag = Arc::new(AtomicBool::new(false));
        let mut work = self.lock();
        work.retain(|(_, held)| Arc::strong_count(held) > 1);
        work.push((request, Arc::clone(&flag)));
        flag
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Flag>> {
        self.work.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// One user of the engine, with its own event channel and its own Stop: the window is one,
/// each request of the local server another. All clients share the one inference thread
/// and its queue; events reach only the client whose command caused them.
///
/// Dropping a client stops its work, queued or running (a disconnected API client).
#[derive(Debug)]
pub struct Client {
    commands: Sender<Command>,
    events: Receiver<Event>,
    reply_to: Sender<Event>,
    /// Whether the engine's notify hook runs after this client's events.
    notify: bool,
    stopper: Stopper,
    shared: Arc<Shared>,
}

impl Client {
    fn new(commands: Sender<Command>, shared: Arc<Shared>, notify: bool) -> Self {
        let (reply_to, events) = unbounded();
        Self {
            commands,
            events,
            reply_to,
            notify,
            stopper: Stopper::default(),
            shared,
        }
    }

    /// Another client of the same engine, with its own events and Stop. The engine's notify
    /// hook does not run for it: that hook belongs to whoever spawned the engine.
    pub fn clone_client(&self) -> Client {
        Client::new(self.commands.clone(), Arc::clone(&self.shared), false)
    }

    pub fn events(&self) -> &Receiver<Event> {
        &self.events
    }

    /// Sends a command; false when the engine thread is gone.
    pub fn send(&self, command: Command) -> bool {
        self.commands.send(command).is_ok()
    }

    pub(super) fn reply(&self, request: Option<RequestId>) -> Reply {
        Reply {
            events: self.reply_to.clone(),
            cancel: self.stopper.track(request),
            notify: self.notify,
        }
    }

    pub fn load_model(&self, source: ModelSource, options: ModelOptions) -> bool {
        self.send(Command::LoadModel {
            source,
            options,
            reply: self.reply(None),
        })
    }

    /// Queues a chat reply for `messages`, ending with the user's turn. Returns its id.
    pub fn generate(
        &self,
        messages: Vec<ChatMessage>,
        sampling: SamplingParams,
        max_new_tokens: usize,
        overflow: OverflowPolicy,
    ) -> RequestId {
        let request = GenerateRequest::chat(messages, sampling, max_new_tokens, overflow);
        self.submit(request).unwrap_or(0)
    }

    /// Queues a generation. Its events (ending with exactly one of `Finished`, `Error` or
    /// `Busy`) come to this client. `None` when the engine thread is gone.
    pub fn submit(&self, request: GenerateRequest) -> Option<RequestId> {
        let id = self.shared.next_request.fetch_add(1, Ordering::SeqCst);
        let reply = self.reply(Some(id));
        self.send(Command::Generate { id, request, reply })
            .then_some(id)
    }

    /// Stops this client's generations and download. See [`Stopper`].
    pub fn stop(&self) {
        self.stopper.stop();
    }

    pub fn stopper(&self) -> Stopper {
        self.stopper.clone()
    }

    pub fn reset_conversation(&self) -> bool {
        self.send(Command::ResetConversation)
    }

    /// See [`Command::SetKvBudget`].
    pub fn set_kv_budget(&self, budget: Option<usize>) -> bool {
        self.send(Command::SetKvBudget(budget))
    }

    /// The loaded model, whichever client loaded it; `None` while none is ready.
    pub fn model(&self) -> Option<ModelInfo> {
        self.shared
            .model
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Generations waiting for a slot, from every client.
    pub fn queued(&self) -> usize {
        self.shared.queued.load(Ordering::SeqCst)
    }

    /// Tokens generated since the engine started, for every client together.
    pub fn generated_tokens(&self) -> u64 {
        self.shared.generated_tokens.load(Ordering::SeqCst)
    }

    /// False once the engine thread has ended; nothing more will arrive on [`Self::events`].
    pub fn engine_running(&self) -> bool {
        self.shared.running.load(Ordering::SeqCst)
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The engine's owner: the first [`Client`] (commands in, events out, Stop) plus the
/// inference thread, which dropping the handle shuts down and joins.
///
/// Whatever serves the other end of the command channel is the engine: the inference
/// thread that [`EngineHandle::spawn`] starts, or anything else [`EngineHandle::connect`] is
/// given, such as a script that plays back events so the window's logic is tested without a
/// model.
#[derive(Debug)]
pub struct EngineHandle {
    client: Client,
    thread: Option<JoinHandle<()>>,
}

impl EngineHandle {
    /// Starts the inference thread. `notify` runs after every event for this handle's own
    /// client, on the engine thread; the GUI passes `egui::Context::request_repaint` so it
    /// redraws only when there is news.
    pub fn spawn(notify: impl Fn() + Send + 'static) -> std::io::Result<Self> {
        Self::spawn_with(EngineOptions::default(), notify)
    }

    pub fn spawn_with(
        options: EngineOptions,
        notify: impl Fn() + Send + 'static,
    ) -> std::io::Result<Self> {
        let (command_tx, command_rx) = unbounded();
        let shared = Arc::new(Shared::new());
        let worker = Worker::new(
            command_rx,
            Box::new(notify),
            Arc::clone(&shared),
            options.queue_limit,
            options.parallel,
            options.kv_budget,
        );
        let thread = std::thread::Builder::new()
            .name("smolchat-inference".into())
            .spawn(move || worker.run())?;
        Ok(Self {
            client: Client::new(command_tx, shared, true),
            thread: Some(thread),
        })
    }

    /// A handle on an engine served elsewhere: it receives `commands` and answers each
    /// through the command's [`Reply`].
    pub fn connect(commands: Sender<Command>) -> Self {
        Self {
            client: Client::new(commands, Arc::new(Shared::new()), true),
            thread: None,
        }
    }
}

impl Deref for EngineHandle {
    type Target = Client;

    fn deref(&self) -> &Client {
        &self.client
    }
}

impl Drop for EngineHandle {
    fn drop(&mut self) {
        self.client.stop();
        self.client.send(Command::Shutdown);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
