//! The generations that run together: each holds one of the model's KV caches (a slot) from
//! the time it is admitted until it ends, and every step of the loop reads passes of
//! waiting prompts, up to one pass's worth of tokens, then decodes one token of every
//! sequence whose prompt is read.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::error::EngineError;
use super::protocol::{Event, LiveStats, Reply, RequestId};
use super::queue::{Admitted, Queue, deliver};
use crate::generation::{
    CheckedPrompt, FinishReason, GenerationError, GenerationSession, LoadedModel, PROMPT_CHUNK,
    PromptFit, Step, predict_together,
};
use crate::model::KvCache;
use crate::stats::memory;

/// How often a generation reports its live figures: as often as the window redraws for them.
/// Per token, the extra event, memory reading and wake-up of the client's thread took time
/// from the model's threads: on two cores the server decoded at 0.90× `generate`, and at
/// 0.98× with this and one HTTP thread.
const STATS_INTERVAL: Duration = Duration::from_millis(100);

/// The loaded model and its slots' caches.
pub(super) struct Slots {
    loaded: LoadedModel,
    /// One per slot. A cache outlives its generation: the conversation's next turn, or the
    /// same request sent again, reuses what it holds.
    caches: Vec<KvCache>,
    /// When each cache last served a generation (a count of admissions): of the caches that
    /// hold nothing a prompt can reuse, the one unused longest is the one given up.
    last_used: Vec<u64>,
    admissions: u64,
    /// Positions all caches may hold together. A new generation waits while the running
    /// ones hold them all, and idle caches are given up, the one unused longest first, to
    /// make room for it.
    budget: usize,
}

impl Slots {
    /// `budget`: see [`Slots::budget`]; `None` holds what one full context holds, the
    /// memory announced for the model.
    pub fn new(loaded: LoadedModel, parallel: usize, budget: Option<usize>) -> Self {
        let count = parallel.max(1);
        let mut slots = Self {
            caches: (0..count).map(|_| loaded.new_cache()).collect(),
            last_used: vec![0; count],
            admissions: 0,
            budget: 0,
            loaded,
        };
        slots.set_budget(budget);
        slots
    }

    /// See [`Slots::new`].
    pub fn set_budget(&mut self, budget: Option<usize>) {
        self.budget = budget.unwrap_or(self.loaded.memory.context);
    }

    /// Forgets every cached conversation.
    pub fn clear(&mut self) {
        for cache in &mut self.caches {
            cache.clear();
        }
    }
}

/// One running generation.
struct Running<'a> {
    id: RequestId,
    reply: Reply,
    session: GenerationSession<'a>,
    slot: usize,
    dropped_messages: usize,
    /// False once the client no longer listens (a disconnected API client): it is stopped
    /// like one that pressed Stop.
    listening: bool,
    last_stats: Option<Instant>,
    /// The token sampled and sent but not yet run through the model: a sequence samples its
    /// first token, and its client sees it, as soon as its prompt is read, not after the
    /// passes of other prompts that the same turn reads and a decode step.
    pending: Option<u32>,
}

impl Running<'_> {
    fn ended(&self) -> bool {
        self.session.is_finished()
    }

    /// Tells the client the generation is over.
    fn finished(
        &self,
        loaded: &LoadedModel,
        reason: FinishReason,
        text: String,
        notify: &dyn Fn(),
    ) {
        let stats = live(loaded, &self.session);
        let id = self.id;
        deliver(
            &self.reply,
            notify,
            Event::Finished {
                request: id,
                reason,
                text,
                stats,
            },
        );
    }
}

/// The state of the loop that [`run`] drives, apart from the model it borrows.
pub(super) struct Context<'q> {
    pub queue: &'q mut Queue,
    pub notify: &'q dyn Fn(),
    /// Each generation admitted and not yet ended, so that a panic is reported to each.
    pub running: &'q mut Vec<(RequestId, Reply)>,
    pub shutting_down: &'q mut bool,
}

/// Runs generations from the front of the queue, as many at once as there are slots, until
/// none runs and none can start (the queue is empty, or another command is at its front).
pub(super) fn run(slots: &mut Slots, cx: Context<'_>) {
    let Slots {
        loaded,
        caches,
        last_used,
        admissions,
        budget,
    } = slots;
    let loaded = &*loaded;
    let mut free: Vec<(usize, &mut KvCache)> = caches.iter_mut().enumerate().collect();
    let mut active: Vec<Running<'_>> = Vec::new();
    // Which reading prompt reads first, so that several long prompts take turns.
    let mut turn = 0;
    loop {
        *cx.shutting_down |= cx.queue.receive(cx.notify);
        loop {
            let held: usize = active.iter().map(|r| r.session.positions()).sum();
            let room = budget.saturating_sub(held);
            let full = room == 0 && !active.is_empty();
            if *cx.shutting_down || free.is_empty() || full {
                break;
            }
            let Some(admitted) = cx.queue.admit() else {
                break;
            };
            *admissions += 1;
            // Known as running before it starts: a panic while it starts reaches it too.
            cx.running.push((admitted.id, admitted.reply.clone()));
            let id = admitted.id;
            let running: Vec<&KvCache> = active.iter().map(|r| r.session.cache()).collect();
            let caches = Caches {
                free: &mut free,
                running: &running,
                last_used,
            };
            match start(loaded, caches, room, admitted, cx.notify) {
                Some(running) => {
                    last_used[running.slot] = *admissions;
                    active.push(running);
                }
                None => cx.running.retain(|(running, _)| *running != id),
            }
        }
        cx.queue.announce(cx.notify);
        if active.is_empty() {
            return;
        }
        for running in &mut active {
            let unwanted = !running.listening || running.reply.is_cancelled();
            if (unwanted || *cx.shutting_down) && !running.ended() {
                let step = running.session.stop();
                if let Step::Finished { reason, text } = step {
                    running.finished(loaded, reason, text, cx.notify);
                }
            }
        }
        // Passes of waiting prompts, taking turns, up to one full pass's worth of tokens:
        // several short prompts start together, a long one reads a pass per step. A prompt
        // the cache holds whole costs nothing to read and goes first.
        let mut readers: Vec<usize> = (0..active.len())
            .filter(|&i| active[i].session.is_reading())
            .collect();
        if !readers.is_empty() {
            let first = turn % readers.len();
            readers.rotate_left(first);
        }
        readers.sort_by_key(|&i| active[i].session.unread() > 0);
        let mut read = 0;
        for i in readers {
            if read >= PROMPT_CHUNK {
                break;
            }
            let running = &mut active[i];
            read += read_pass(running, cx.notify);
            if !running.session.is_reading() && !running.ended() {
                let step = running.session.choose();
                running.pending = tell(loaded, running, step, cx.queue, cx.notify);
            }
        }
        turn += 1;
        decode_step(loaded, &mut active, cx.queue, cx.notify);
        let (ended, still): (Vec<_>, Vec<_>) =
            active.into_iter().partition(|running| running.ended());
        active = still;
        for running in ended {
            cx.running.retain(|(id, _)| *id != running.id);
            free.push((running.slot, running.session.into_cache()));
        }
    }
}

/// The caches a new generation chooses from.
struct Caches<'c, 'a> {
    /// The free slots' caches.
    free: &'c mut Vec<(usize, &'a mut KvCache)>,
    /// The running generations' caches, which a prompt can copy the start of.
    running: &'c [&'c KvCache],
    last_used: &'c [u64],
}

/// Fits an admitted request's prompt to the context and begins its session in the free
/// slot whose cache it can reuse most of (else the one unused longest), giving up other
/// idle caches, the one unused longest first, until the prompt fits in the `room` the
/// running generations leave; `None`, with the client told why, when it cannot start.
fn start<'a>(
    loaded: &'a LoadedModel,
    caches: Caches<'_, 'a>,
    room: usize,
    admitted: Admitted,
    notify: &dyn Fn(),
) -> Option<Running<'a>> {
    let Caches {
        free,
        running,
        last_used,
    } = caches;
    let Admitted { id, request, reply } = admitted;
    let fail = |error| report(&reply, notify, id, error);
    if reply.is_cancelled() {
        deliver(&reply, notify, super::queue::stopped_before_start(id));
        return None;
    }
    let limit = free.first().map(|(_, cache)| cache.max_len())?;
    let fit = PromptFit {
        limit,
        max_new_tokens: request.max_new_tokens,
        overflow: request.overflow,
        variables: &request.template_variables,
    };
    let checked = fit.ids(loaded, &request.prompt).and_then(|fitted| {
        let checked = CheckedPrompt::new(fitted.ids, limit, &request.sampling)?;
        Ok((
            checked.with_history(fitted.history),
            fitted.dropped_messages,
        ))
    });
    let (checked, dropped_messages) = match checked {
        Ok(checked) => checked,
        Err(error) => {
            fail(error);
            return None;
        }
    };
    let prompt = checked.tokens();
    let (best, reusable) = (0..free.len())
        .map(|i| (i, free[i].1.reusable_prefix(prompt)))
        .max_by_key(|&(i, reusable)| (reusable, std::cmp::Reverse(last_used[free[i].0])))?;
    let (mut slot, mut cache) = free.swap_remove(best);
    free.sort_by_key(|(slot, _)| last_used[*slot]);
    // A running generation's cache can hold more of the prompt (the same system prompt,
    // read for a request that came just before): its start is copied. Reusing the start of
    // a free cache that goes on differently would cut it short, and the request it answered,
    // asked again, would be read again: the start is copied into the cache unused longest.
    let ahead = running
        .iter()
        .map(|source| (source.reusable_prefix(prompt), *source))
        .filter(|(reuse, _)| *reuse > reusable)
        .max_by_key(|(reuse, _)| *reuse);
    let parts = 0 < reusable && reusable < prompt.len().min(cache.len());
    if let Some((reuse, source)) = ahead {
        cache.copy_prefix(source, reuse);
    } else if parts
        && let Some((_, unused)) = free.first_mut()
        && unused.copy_prefix(cache, reusable)
    {
        (slot, cache) = std::mem::replace(&mut free[0], (slot, cache));
        free.sort_by_key(|(slot, _)| last_used[*slot]);
    }
    let mut idle_held: usize = free.iter().map(|(_, cache)| cache.len()).sum();
    for (_, idle) in free.iter_mut() {
        if idle_held + prompt.len() <= room {
            break;
        }
        idle_held -= idle.len();
        idle.clear();
    }
    let max_new_tokens = request.max_new_tokens.unwrap_or(usize::MAX);
    let session = GenerationSession::begin_checked(loaded, cache, checked, max_new_tokens)
        .with_logprobs(request.logprobs);
    Some(Running {
        id,
        reply,
        session,
        slot,
        dropped_messages,
        listening: true,
        last_stats: None,
        pending: None,
    })
}

/// Reads one pass of a running generation's prompt, telling its client how far it has
/// come before a long prompt's passes and that the prompt is read after the last; returns
/// how many tokens it read.
fn read_pass(running: &mut Running<'_>, notify: &dyn Fn()) -> usize {
    let send = |event| deliver(&running.reply, notify, event);
    let id = running.id;
    if let Some(at) = running.session.reported_progress() {
        running.listening &= send(Event::PromptProgress {
            request: id,
            done: at.done,
            total: at.total,
        });
        // Stop pressed as the client heard of this pass ends the prompt before it.
        if !running.listening || running.reply.is_cancelled() {
            return 0;
        }
    }
    let read = match running.session.read_pass() {
        Ok(read) => read,
        Err(error) => {
            // An error ends a generation whose prompt was not read: nothing was generated.
            report(&running.reply, notify, id, error);
            running.session.stop();
            return 0;
        }
    };
    if !running.session.is_reading() {
        running.listening &= send(Event::PromptProcessed {
            request: id,
            stats: running.session.stats().clone(),
            dropped_messages: running.dropped_messages,
        });
    }
    read
}

/// One token of every running generation whose prompt is read, through the model together;
/// each generation's events go to its client once the step has run, where the model's
/// threads no longer need the cores (a first token went out already, see
/// [`Running::pending`]).
fn decode_step(loaded: &LoadedModel, active: &mut [Running<'_>], queue: &Queue, notify: &dyn Fn()) {
    let mut decoding: Vec<&mut Running<'_>> = active
        .iter_mut()
        .filter(|running| !running.session.is_reading() && !running.ended())
        .collect();
    if decoding.is_empty() {
        return;
    }
    let steps: Vec<Option<Result<Step, GenerationError>>> = decoding
        .iter_mut()
        .map(|running| match running.pending {
            Some(_) => None,
            None => Some(running.session.choose()),
        })
        .collect();
    let chosen: Vec<Option<u32>> = decoding
        .iter_mut()
        .zip(&steps)
        .map(|(running, step)| match step {
            Some(Ok(Step::Token(token))) => Some(token.id),
            _ => running.pending.take(),
        })
        .collect();
    let predicted = predict_together(loaded, &mut sessions(&mut decoding), &chosen);
    for ((running, step), result) in decoding.into_iter().zip(steps).zip(predicted) {
        if let Some(step) = step {
            tell(loaded, running, step, queue, notify);
        }
        if let Err(error) = result {
            tell(loaded, running, Err(error), queue, notify);
        }
    }
}

/// Tells a generation's client what its step gave: a token (counted, with the live figures
/// now and then), or the end of the generation; returns the token.
fn tell(
    loaded: &LoadedModel,
    running: &mut Running<'_>,
    step: Result<Step, GenerationError>,
    queue: &Queue,
    notify: &dyn Fn(),
) -> Option<u32> {
    let id = running.id;
    match step {
        Ok(Step::Token(token)) => {
            queue.shared.generated_tokens.fetch_add(1, Ordering::SeqCst);
            let chosen = token.id;
            running.listening &=
                deliver(&running.reply, notify, Event::Token { request: id, token });
            if running
                .last_stats
                .is_none_or(|sent| sent.elapsed() >= STATS_INTERVAL)
            {
                running.last_stats = Some(Instant::now());
                let stats = live(loaded, &running.session);
                running.listening &=
                    deliver(&running.reply, notify, Event::Stats { request: id, stats });
            }
            Some(chosen)
        }
        Ok(Step::Finished { reason, text }) => {
            running.finished(loaded, reason, text, notify);
            None
        }
        Err(error) => {
            report(&running.reply, notify, id, error);
            running.session.stop();
            running.finished(loaded, FinishReason::Stopped, String::new(), notify);
            None
        }
    }
}

/// The sessions of `decoding`, as the generation functions take them.
fn sessions<'r, 'a>(decoding: &'r mut [&mut Running<'a>]) -> Vec<&'r mut GenerationSession<'a>> {
    decoding
        .iter_mut()
        .map(|running| &mut running.session)
        .collect()
}

/// Tells the client of `request` what went wrong with it.
fn report(reply: &Reply, notify: &dyn Fn(), request: RequestId, error: GenerationError) {
    let error = EngineError::from_generation(error);
    let request = Some(request);
    deliver(reply, notify, Event::Error { request, error });
}

fn live(loaded: &LoadedModel, session: &GenerationSession<'_>) -> LiveStats {
    LiveStats {
        generation: session.stats().clone(),
        resident_bytes: memory::resident_bytes(),
        device_bytes: loaded.device.device_memory_bytes(),
    }
}
