//! The commands waiting their turn, from every client: first come, first served.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use crossbeam_channel::Receiver;

use super::protocol::{Command, Event, GenerateRequest, LiveStats, Reply, RequestId};
use super::shared::Shared;
use crate::generation::{FinishReason, GenerationStats};

/// Commands in arrival order, whichever client sent them. Generations start as slots free
/// up; any other command waits until every generation before it has ended.
pub(super) struct Queue {
    commands: Receiver<Command>,
    /// Commands that arrived while generations ran, waiting their turn.
    pub(super) pending: VecDeque<Command>,
    /// How many generations `pending` may hold.
    limit: usize,
    /// Generations joined or left `pending` since the waiting ones were last told their
    /// place.
    moved: bool,
    pub(super) shared: Arc<Shared>,
}

/// A generation taken from the queue to run.
pub(super) struct Admitted {
    pub id: RequestId,
    pub request: GenerateRequest,
    pub reply: Reply,
}

impl Queue {
    pub(super) fn new(commands: Receiver<Command>, limit: usize, shared: Arc<Shared>) -> Self {
        Self {
            commands,
            pending: VecDeque::new(),
            limit,
            moved: false,
            shared,
        }
    }

    /// The next command to run, waiting for one; `None` when every client is gone. A
    /// generation goes back to the front for [`admit`](Self::admit), which tells the others
    /// their places once as many as can start have started.
    pub(super) fn next(&mut self) -> Option<Command> {
        match self.pending.pop_front() {
            Some(command) => Some(command),
            None => self.commands.recv().ok(),
        }
    }

    /// The generation at the front, when a generation is at the front: one behind another
    /// command waits for it.
    pub(super) fn admit(&mut self) -> Option<Admitted> {
        if !matches!(self.pending.front(), Some(Command::Generate { .. })) {
            return None;
        }
        let Some(Command::Generate { id, request, reply }) = self.pending.pop_front() else {
            return None;
        };
        self.moved = true;
        Some(Admitted { id, request, reply })
    }

    /// Tells each waiting generation how many run or wait before it, when the queue has
    /// moved since it was last told.
    pub(super) fn announce(&mut self, notify: &dyn Fn()) {
        if std::mem::take(&mut self.moved) {
            let waiting = self.pending.iter().filter_map(|command| match command {
                Command::Generate { id, reply, .. } => Some((*id, reply)),
                _ => None,
            });
            for (before, (request, reply)) in waiting.enumerate() {
                let ahead = before + 1;
                deliver(reply, notify, Event::Waiting { request, ahead });
            }
        }
        self.shared.queued.store(self.waiting(), Ordering::SeqCst);
    }

    /// Takes in the commands that arrived meanwhile, without waiting: generations join the
    /// queue while it has room and are refused with `Busy` when it has none; the rest waits
    /// its turn, except `Shutdown`, which is answered at once: returns true when it came. The
    /// caller admits what it can, then [`announce`](Self::announce)s.
    pub(super) fn receive(&mut self, notify: &dyn Fn()) -> bool {
        let mut shutdown = false;
        for command in self.commands.try_iter().collect::<Vec<_>>() {
            match command {
                Command::Shutdown => shutdown = true,
                Command::Generate { id, reply, .. } if self.is_full(notify) => {
                    deliver(&reply, notify, Event::Busy { refused: id });
                }
                other => {
                    self.moved |= matches!(other, Command::Generate { .. });
                    self.pending.push_back(other);
                }
            }
        }
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
                self.moved = true;
                deliver(&reply, notify, stopped_before_start(id));
            }
        }
        self.waiting() >= self.limit
    }

    /// Every command not yet run, those still in the channel included: at shutdown.
    pub(super) fn drain(&mut self) -> Vec<Command> {
        std::mem::take(&mut self.pending)
            .into_iter()
            .chain(self.commands.try_iter())
            .collect()
    }
}

/// Sends to one client and runs the notify hook if it asked for it; false when the client
/// no longer listens.
pub(super) fn deliver(reply: &Reply, notify: &dyn Fn(), event: Event) -> bool {
    let delivered = reply.send(event);
    if reply.notify {
        notify();
    }
    delivered
}

/// The final event of a generation stopped before it started: nothing was generated.
pub(super) fn stopped_before_start(request: RequestId) -> Event {
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
