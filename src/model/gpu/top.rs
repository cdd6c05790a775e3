//! The likeliest entries of one row of logits, so that a step reads back a few dozen values
//! instead of the vocabulary (Burn 0.22.1's `topk_with_indices` returned wrong entries on
//! lavapipe).
//!
//! Two launches: each of `LISTS` threads keeps the best `count` of its strided share of the
//! row in a sorted list of its own, then one thread merges those lists. A new value is
//! compared with a list's worst first, so nearly every value costs one comparison.

use cubecl::prelude::*;

/// Threads in the first launch, each with its own list.
pub const LISTS: usize = 64;

/// Writes the best `count` of `row[thread], row[thread + LISTS], …` to `values` and `ids`
/// (as f32, exact below 2²⁴) at `thread · count`, best first (ties: the lower id), padded
/// with `-f32::MAX` and id 0.
#[cube(launch_unchecked)]
pub fn partial_top_kernel(
    row: &[f32],
    values: &mut [f32],
    ids: &mut [f32],
    len: usize,
    #[comptime] count: usize,
) {
    let thread = UNIT_POS as usize;
    let base = thread * count;
    for slot in 0..count {
        values[base + slot] = -f32::MAX;
        ids[base + slot] = 0.0;
    }
    let mut i = thread;
    while i < len {
        insert(values, ids, base, count, row[i], f32::cast_from(i as u32));
        i += LISTS;
    }
}

/// Merges the `LISTS` lists of [`partial_top_kernel`] into the first `count` entries.
#[cube(launch_unchecked)]
pub fn merge_top_kernel(values: &mut [f32], ids: &mut [f32], #[comptime] count: usize) {
    let first = 0usize.runtime();
    for entry in count..LISTS * count {
        let (value, id) = (values[entry], ids[entry]);
        insert(values, ids, first, count, value, id);
    }
}

/// Puts `(value, id)` into the sorted list at `base` if it beats the list's worst.
#[cube]
fn insert(
    values: &mut [f32],
    ids: &mut [f32],
    base: usize,
    #[comptime] count: usize,
    value: f32,
    id: f32,
) {
    let last = base + count - 1;
    if beats(value, id, values[last], ids[last]) {
        let mut at = last;
        while at > base {
            if beats(value, id, values[at - 1], ids[at - 1]) {
                values[at] = values[at - 1];
                ids[at] = ids[at - 1];
                at -= 1;
            } else {
                break;
            }
        }
        values[at] = value;
        ids[at] = id;
    }
}

/// Whether `(value, id)` ranks before `(other, other_id)`: the higher value, then the lower id.
#[cube]
fn beats(value: f32, id: f32, other: f32, other_id: f32) -> bool {
    value > other || (value == other && id < other_id)
}
