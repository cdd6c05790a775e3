//! The helper threads that run a kernel beside the thread that calls it.
//!
//! A decode step is ~150 kernels, each 5–200 µs long, with a few µs between them, so a
//! helper must start within a µs of a kernel's start: helpers spin while they wait, as
//! llama.cpp's do. But the machine is not ours alone. When a window's renderer wakes, both
//! of our threads can land on one core, and a thread that spins there for its peer holds the
//! very core the peer needs: a pool that only spins (micropool's) made the step stall for as
//! long as the renderer ran, a frame in the window cost 30 ms of decoding, and the window
//! decoded at 0.78× the command line. So every wait here spins only briefly, then yields
//! the core to whoever shares it, and soon sleeps: an idle core lets the scheduler move the
//! thread that lost its own over, and no CPU is used between replies.
//!
//! A job is a closure that claims its own pieces of work from shared counters (see
//! [`super::threads::split_ranges`]), so it does not matter how many threads run it: a
//! helper that wakes after the work has been done finds nothing left, and the caller never
//! waits for a helper that has not started.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, TryLockError};
use std::time::{Duration, Instant};

/// The longest a waiting thread spins before it yields its core: longer than the gap
/// between two kernels, so that an uncontended step never enters the scheduler.
const SPIN: Duration = Duration::from_micros(20);

/// How long the caller waits for a helper's piece of work before it sleeps: far longer
/// than a piece takes (a sixteenth of a kernel, at most ~15 µs), so the helper has lost its
/// core. Yielding only hands the core to a thread queued on it; an idle core is what makes
/// the scheduler move the helper over.
const PATIENCE: Duration = Duration::from_micros(200);

/// How long an idle helper keeps watching for work before it sleeps: longer than the gap
/// between two tokens (sampling, ~150 µs), short enough that a caller that lost its core
/// soon gets this one, and that the core is released soon after a reply ends.
const WATCH: Duration = Duration::from_millis(1);

/// A job as the helpers see it: a pointer to the caller's `&dyn Fn()`, valid while the job
/// is open or a helper that joined it has not finished.
type JobRef<'a> = &'a (dyn Fn() + Sync + 'a);

pub struct Pool {
    shared: Arc<Shared>,
    helpers: usize,
    /// One caller at a time; a second one (tests running models side by side) runs its job
    /// alone.
    caller: Mutex<()>,
}

struct Shared {
    /// The job's number in the high 32 bits, [`CLOSED`], and in the low bits how many helpers
    /// are running it.
    state: AtomicU64,
    job: AtomicPtr<()>,
    panicked: AtomicBool,
    /// Helpers asleep for want of work.
    work: Bell,
    /// The caller asleep for want of helpers that finish.
    finished: Bell,
}

/// Where threads that have waited long enough sleep until another rings.
#[derive(Default)]
struct Bell {
    sleepers: AtomicUsize,
    lock: Mutex<()>,
    ring: Condvar,
}

/// Set once the caller has finished its own run of the job: helpers may no longer join.
const CLOSED: u64 = 1 << 31;
const RUNNING: u64 = CLOSED - 1;
const NUMBER: u64 = 1 << 32;

/// The job's number in `state`, without its flag and count.
fn job_number(state: u64) -> u64 {
    state & !(NUMBER - 1)
}

impl Pool {
    /// Starts `helpers` threads.
    pub fn new(helpers: usize) -> std::io::Result<Self> {
        let shared = Arc::new(Shared {
            state: AtomicU64::new(CLOSED),
            job: AtomicPtr::new(std::ptr::null_mut()),
            panicked: AtomicBool::new(false),
            work: Bell::default(),
            finished: Bell::default(),
        });
        for index in 0..helpers {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name(format!("smolchat-cpu-{}", index + 1))
                .spawn(move || shared.help())?;
        }
        Ok(Self {
            shared,
            helpers,
            caller: Mutex::new(()),
        })
    }

    /// The threads a job may run on: the helpers and the caller.
    pub fn threads(&self) -> usize {
        self.helpers + 1
    }

    /// Runs `job` on this thread and on every helper that comes in time, and returns once
    /// every run has returned. `job` must claim its work itself (see the module's doc).
    ///
    /// # Panics
    /// If `job` panicked on a helper.
    pub fn run(&self, job: &(dyn Fn() + Sync)) {
        let _caller = match self.caller.try_lock() {
            Ok(guard) => guard,
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(TryLockError::WouldBlock) => return job(),
        };
        let shared = &*self.shared;
        shared.panicked.store(false, Ordering::Relaxed);
        let job_ref: JobRef = job;
        shared
            .job
            .store((&raw const job_ref).cast_mut().cast(), Ordering::Relaxed);
        let number = job_number(shared.state.load(Ordering::Relaxed)).wrapping_add(NUMBER);
        shared.state.store(number, Ordering::SeqCst);
        shared.work.ring();
        // Helpers that joined read `job_ref` until they finish, so wait for them even when
        // the job panics here.
        struct Close<'a>(&'a Shared);
        impl Drop for Close<'_> {
            fn drop(&mut self) {
                let Shared {
                    state, finished, ..
                } = self.0;
                state.fetch_or(CLOSED, Ordering::SeqCst);
                wait(
                    || state.load(Ordering::SeqCst) & RUNNING == 0,
                    PATIENCE,
                    finished,
                );
            }
        }
        let close = Close(shared);
        job();
        drop(close);
        if shared.panicked.swap(false, Ordering::Relaxed) {
            panic!("a CPU kernel panicked on a helper thread");
        }
    }
}

impl Shared {
    fn help(&self) {
        let mut seen = CLOSED;
        loop {
            let state = self.state.load(Ordering::Acquire);
            if job_number(state) == job_number(seen) || state & CLOSED != 0 {
                seen = state;
                let changed = || job_number(self.state.load(Ordering::SeqCst)) != job_number(seen);
                wait(changed, WATCH, &self.work);
                continue;
            }
            if self
                .state
                .compare_exchange_weak(state, state + 1, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
            {
                // Another helper joined, or the caller closed the job: look again.
                continue;
            }
            seen = state;
            // SAFETY: `run` stored a pointer to its `JobRef` before opening this job, and
            // returns (ending the borrow) only after this helper, counted in `state`, has
            // finished with it.
            let job = unsafe { *self.job.load(Ordering::Relaxed).cast::<JobRef>() };
            if catch_unwind(AssertUnwindSafe(job)).is_err() {
                self.panicked.store(true, Ordering::Relaxed);
            }
            self.state.fetch_sub(1, Ordering::SeqCst);
            self.finished.ring();
        }
    }
}

impl Bell {
    /// Sleeps until `done()`, which must read with `SeqCst` what the ringer changed with
    /// `SeqCst` before [`Bell::ring`]: then either `done()` sees the change or the ringer
    /// sees this sleeper and wakes it.
    fn sleep_until(&self, done: impl Fn() -> bool) {
        let mut lock = self
            .lock
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        self.sleepers.fetch_add(1, Ordering::SeqCst);
        while !done() {
            lock = self
                .ring
                .wait(lock)
                .unwrap_or_else(|poisoned| poisoned.into_inner());
        }
        self.sleepers.fetch_sub(1, Ordering::SeqCst);
    }

    fn ring(&self) {
        if self.sleepers.load(Ordering::SeqCst) > 0 {
            let _lock = self
                .lock
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            self.ring.notify_all();
        }
    }
}

/// Returns once `done()`: spins for [`SPIN`], then yields the core between looks, and after
/// `patience` sleeps on `bell`.
fn wait(done: impl Fn() -> bool, patience: Duration, bell: &Bell) {
    // Most waits end at the first look: a kernel's pieces finish together.
    if done() {
        return;
    }
    let start = Instant::now();
    while !done() {
        let waited = start.elapsed();
        if waited > patience {
            return bell.sleep_until(done);
        }
        if waited > SPIN {
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::Pool;

    #[test]
    fn every_claimed_piece_runs_once_and_late_helpers_find_nothing() {
        let pool = Pool::new(3).expect("helpers start");
        for pieces in [0, 1, 7, 1000] {
            for _ in 0..50 {
                let next = AtomicUsize::new(0);
                let visits: Vec<AtomicUsize> = (0..pieces).map(|_| AtomicUsize::new(0)).collect();
                pool.run(&|| {
                    loop {
                        let piece = next.fetch_add(1, Ordering::Relaxed);
                        let Some(visit) = visits.get(piece) else {
                            break;
                        };
                        visit.fetch_add(1, Ordering::Relaxed);
                    }
                });
                assert!(
                    visits
                        .iter()
                        .all(|visit| visit.load(Ordering::Relaxed) == 1)
                );
            }
        }
    }

    /// Runs a job that returns once `threads` threads have entered it (or after 10 s), and
    /// says how many did.
    fn threads_that_join(pool: &Pool, threads: usize, on_helper: impl Fn() + Sync) -> usize {
        let entered = AtomicUsize::new(0);
        let caller = std::thread::current().id();
        pool.run(&|| {
            entered.fetch_add(1, Ordering::SeqCst);
            if std::thread::current().id() != caller {
                return on_helper();
            }
            let start = std::time::Instant::now();
            while entered.load(Ordering::SeqCst) < threads
                && start.elapsed() < std::time::Duration::from_secs(10)
            {
                std::thread::yield_now();
            }
        });
        entered.load(Ordering::SeqCst)
    }

    #[test]
    fn helpers_asleep_wake_for_the_next_job() {
        let pool = Pool::new(2).expect("helpers start");
        for _ in 0..3 {
            std::thread::sleep(super::WATCH * 3);
            assert_eq!(threads_that_join(&pool, 3, || {}), 3);
        }
    }

    #[test]
    fn a_panic_on_a_helper_reaches_the_caller_and_the_pool_goes_on() {
        let pool = Pool::new(1).expect("helper starts");
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            threads_that_join(&pool, 2, || panic!("helper fails"))
        }));
        assert!(result.is_err());
        assert_eq!(threads_that_join(&pool, 2, || {}), 2);
    }
}
