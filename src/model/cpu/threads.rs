//! Splitting a kernel's output rows over the CPU's cores.
//!
//! The rows are split over our own [`Pool`], not rayon's. A decode step is ~150 kernels,
//! each 5–200 µs long, with a few µs between them; rayon's idle workers go to sleep within a
//! few µs and each kernel then waits for one to wake. The pool's helpers keep watching for a
//! millisecond after their last job, and the calling thread works on its share instead of
//! waiting. In a bf16 decode step on two cores a pool that waits this way (micropool, before
//! ours) cut the time spent in matrix-vector products from 11.6 to 9.3 ms (23 to 29 GB/s).

use std::mem::MaybeUninit;
use std::ops::Range;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use super::pool::Pool;

/// The helper threads, one fewer than the threads the CPU backends use (rayon's count, so
/// `RAYON_NUM_THREADS` sets both), since the calling thread does a share of each kernel.
/// `None` for a single thread, or where the system would not start another.
fn pool() -> Option<&'static Pool> {
    static POOL: OnceLock<Option<Pool>> = OnceLock::new();
    POOL.get_or_init(|| {
        let helpers = rayon::current_num_threads().saturating_sub(1);
        (helpers > 0).then(|| Pool::new(helpers).ok()).flatten()
    })
    .as_ref()
}

/// The threads that run each kernel: the pool's helpers and the calling thread.
pub fn thread_count() -> usize {
    pool().map_or(1, Pool::threads)
}

/// Runs `part(first_row, rows)` over contiguous ranges of the rows of `out` (`row_len`
/// elements each) that together cover it, on every thread of the pool. Ranges hold at least
/// `min_rows` rows: smaller pieces cost more to hand over than they save.
pub fn split_rows<T: Send>(
    out: &mut [T],
    row_len: usize,
    min_rows: usize,
    part: &(impl Fn(usize, &mut [T]) + Sync),
) {
    let row_len = row_len.max(1);
    let rows = out.len() / row_len;
    let out = SharedOutput::new(out);
    split_ranges(rows, min_rows, &|range: Range<usize>| {
        // SAFETY: `split_ranges` hands out disjoint ranges of `0..rows`, so these slices of
        // `out`, which stays mutably borrowed until every part has returned, never overlap.
        let rows = unsafe {
            std::slice::from_raw_parts_mut(out.at(range.start * row_len), range.len() * row_len)
        };
        part(range.start, rows);
    });
}

/// `len` copies of `value`, each thread writing a share of them: a prompt's outputs run to
/// megabytes, and filled on the calling thread alone (`vec!`) they took 3% of a 135M F16
/// prompt on two cores while the other threads waited.
pub fn filled<T: Copy + Send + Sync>(len: usize, value: T) -> Vec<T> {
    let mut values = Vec::with_capacity(len);
    split_rows(
        &mut values.spare_capacity_mut()[..len],
        1,
        MIN_FILL_LEN,
        &|_, part: &mut [MaybeUninit<T>]| part.fill(MaybeUninit::new(value)),
    );
    // SAFETY: the first `len` elements were all written above.
    unsafe { values.set_len(len) };
    values
}

/// The fewest elements a thread fills: 64 Ki take a few microseconds, about what handing them
/// over costs.
const MIN_FILL_LEN: usize = 64 * 1024;

/// A mutable output shared by threads that each write their own elements of it.
pub struct SharedOutput<T>(*mut T);

// SAFETY: its users write disjoint elements from each thread (see `at`); `T: Send` lets
// them.
unsafe impl<T: Send> Sync for SharedOutput<T> {}

impl<T> SharedOutput<T> {
    pub fn new(out: &mut [T]) -> Self {
        Self(out.as_mut_ptr())
    }

    /// # Safety
    /// `offset` must lie inside the output, and no other thread may access the elements
    /// written through the pointer while they are written.
    pub unsafe fn at(&self, offset: usize) -> *mut T {
        // SAFETY: as the caller guarantees.
        unsafe { self.0.add(offset) }
    }
}

/// Runs `part` over disjoint ranges that together cover `0..len`, on every thread of the
/// pool. Ranges hold at least `min_len` indices: smaller pieces cost more to hand over than
/// they save.
///
/// Each thread owns a contiguous share of `0..len` and walks it from the front, so that it
/// reads the rows of a weight as one sequential stream, which the hardware prefetcher
/// follows best. A thread that is done takes the ranges others have not yet reached from the
/// back of their shares, so that one that started late or runs slower (two threads share the
/// memory bus unevenly) does not leave the others waiting at the end. Handing out ranges
/// from one shared counter instead interleaved the threads' streams: a C replica of a decode
/// step's matrix-vector products on two cores then read 45 GB/s instead of 57.
pub fn split_ranges(len: usize, min_len: usize, part: &(impl Fn(Range<usize>) + Sync)) {
    let range_len = len
        .div_ceil(thread_count() * RANGES_PER_THREAD)
        .max(min_len);
    split_ranges_of(len, range_len, part);
}

/// [`split_ranges`] by ranges of `range_len`, for pieces long enough that claiming each alone
/// costs nothing next to it: a prompt's tiles, tens of microseconds each. An eighth of a
/// thread's share made the threads that finished first wait out another's last range, up
/// to a third of a millisecond.
pub fn split_ranges_of(len: usize, range_len: usize, part: &(impl Fn(Range<usize>) + Sync)) {
    let threads = thread_count();
    let range_len = range_len.max(1);
    let (Some(pool), true) = (pool(), len > range_len) else {
        return part(0..len);
    };
    let shares: Vec<Share> = (0..threads)
        .map(|index| {
            Share::new(
                len * index / threads..len * (index + 1) / threads,
                range_len,
            )
        })
        .collect();
    let next_share = AtomicUsize::new(0);
    let work = || {
        let own = next_share.fetch_add(1, Ordering::Relaxed) % threads;
        while let Some(range) = shares[own].take(End::Front) {
            part(range);
        }
        for other in (1..threads).map(|offset| (own + offset) % threads) {
            while let Some(range) = shares[other].take(End::Back) {
                part(range);
            }
        }
    };
    pool.run(&work);
}

/// Ranges per thread: enough for the last one to be short, few enough that claiming them
/// costs nothing next to the work.
const RANGES_PER_THREAD: usize = 8;

enum End {
    Front,
    Back,
}

/// One thread's share of a split: `indices` cut into `count` ranges of `range_len` (the last
/// one shorter), taken from the front by its owner and from the back by the others.
/// Aligned to its own cache lines: shares next to each other in one line made every claim
/// wait for the line to cross between cores.
#[repr(align(128))]
struct Share {
    indices: Range<usize>,
    range_len: usize,
    /// At most the share's length, far from filling a half of `taken` (`u32::MAX`).
    count: u64,
    /// Ranges taken from the front in the low 32 bits, from the back in the high 32.
    taken: AtomicU64,
}

impl Share {
    fn new(indices: Range<usize>, range_len: usize) -> Self {
        let count = indices.len().div_ceil(range_len) as u64;
        Self {
            indices,
            range_len,
            count,
            taken: AtomicU64::new(0),
        }
    }

    /// The next range from `end` that nobody has taken yet.
    fn take(&self, end: End) -> Option<Range<usize>> {
        let one = match end {
            End::Front => 1,
            End::Back => 1 << 32,
        };
        let taken = self.taken.fetch_add(one, Ordering::Relaxed);
        let (front, back) = (taken & u64::from(u32::MAX), taken >> 32);
        if front + back >= self.count {
            return None;
        }
        let index = match end {
            End::Front => front,
            End::Back => self.count - 1 - back,
        } as usize;
        let start = self.indices.start + index * self.range_len;
        Some(start..(start + self.range_len).min(self.indices.end))
    }
}

#[cfg(test)]
mod tests {
    use super::{filled, split_rows};

    #[test]
    fn filled_holds_the_value_everywhere() {
        for len in [0, 1, 4095, 4096 * 16 + 3, 4096 * 40] {
            assert_eq!(filled(len, 7u32), vec![7u32; len], "{len}");
        }
    }

    #[test]
    fn every_row_is_visited_once_with_its_index() {
        for (rows, row_len, min_rows) in [
            (0, 3, 1),
            (1, 3, 1),
            (7, 3, 1),
            (100, 1, 16),
            (5, 4, 8),
            (1001, 2, 1),
        ] {
            let mut out = vec![usize::MAX; rows * row_len];
            split_rows(&mut out, row_len, min_rows, &|first, part: &mut [usize]| {
                for (offset, value) in part.iter_mut().enumerate() {
                    *value = first * row_len + offset;
                }
            });
            assert_eq!(out, (0..rows * row_len).collect::<Vec<_>>());
        }
    }
}
