use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender, unbounded};

use super::protocol::{Command, Event, GenerateRequest, RequestId};
use super::worker::Worker;
use crate::generation::ModelOptions;
use crate::model_source::ModelSource;
use crate::text::{ChatMessage, OverflowPolicy, SamplingParams};

/// Stops the running generation (or download) before its next token, from any thread: a
/// flag, not a queued command, so it never waits behind the work it is meant to stop.
#[derive(Debug, Clone)]
pub struct Stopper(Arc<AtomicBool>);

impl Stopper {
    pub fn stop(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    /// Whether Stop was pressed since the last generation or load began.
    pub fn is_stopped(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// The caller's side of the engine: commands in, events out, and the Stop flag.
///
/// Whatever serves the other ends of the channels is the engine: the inference thread that
/// [`EngineHandle::spawn`] starts, or anything else [`EngineHandle::connect`] is given, such
/// as a script that plays back events so the window's logic is tested without a model.
/// Dropping the handle stops any generation, shuts the engine down and joins its thread.
pub struct EngineHandle {
    commands: Sender<Command>,
    events: Receiver<Event>,
    stop: Arc<AtomicBool>,
    next_request: RequestId,
    thread: Option<JoinHandle<()>>,
}

impl EngineHandle {
    /// Starts the inference thread. `notify` runs after every event, on the engine thread;
    /// the GUI passes `egui::Context::request_repaint` so it redraws only when there is news.
    pub fn spawn(notify: impl Fn() + Send + 'static) -> std::io::Result<Self> {
        let (command_tx, command_rx) = unbounded();
        let (event_tx, event_rx) = unbounded();
        let stop = Arc::new(AtomicBool::new(false));
        let worker = Worker::new(command_rx, event_tx, Box::new(notify), Arc::clone(&stop));
        let thread = std::thread::Builder::new()
            .name("smolchat-inference".into())
            .spawn(move || worker.run())?;
        Ok(Self {
            commands: command_tx,
            events: event_rx,
            stop,
            next_request: 1,
            thread: Some(thread),
        })
    }

    /// A handle on an engine served elsewhere: it receives `commands`, answers on `events`,
    /// and is expected to honour the returned handle's [`Stopper`].
    pub fn connect(commands: Sender<Command>, events: Receiver<Event>) -> Self {
        Self {
            commands,
            events,
            stop: Arc::new(AtomicBool::new(false)),
            next_request: 1,
            thread: None,
        }
    }

    pub fn events(&self) -> &Receiver<Event> {
        &self.events
    }

    /// Sends a command; false when the engine thread is gone.
    pub fn send(&self, command: Command) -> bool {
        self.commands.send(command).is_ok()
    }

    pub fn load_model(&self, source: ModelSource, options: ModelOptions) -> bool {
        self.send(Command::LoadModel { source, options })
    }

    /// Starts a generation for `messages`, ending with the user's turn. Returns its id.
    pub fn generate(
        &mut self,
        messages: Vec<ChatMessage>,
        sampling: SamplingParams,
        max_new_tokens: usize,
        overflow: OverflowPolicy,
    ) -> RequestId {
        let id = self.next_request;
        self.next_request += 1;
        self.stop.store(false, Ordering::SeqCst);
        self.send(Command::Generate(GenerateRequest {
            id,
            messages,
            sampling,
            max_new_tokens,
            overflow,
        }));
        id
    }

    /// See [`Stopper`].
    pub fn stop(&self) {
        self.stopper().stop();
    }

    pub fn stopper(&self) -> Stopper {
        Stopper(Arc::clone(&self.stop))
    }

    pub fn reset_conversation(&self) -> bool {
        self.send(Command::ResetConversation)
    }
}

impl Drop for EngineHandle {
    fn drop(&mut self) {
        self.stop();
        self.send(Command::Shutdown);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
