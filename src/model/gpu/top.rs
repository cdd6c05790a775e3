//! The likeliest entries of one row of logits, so that a step reads back a few dozen values
//! instead of the vocabulary (Burn 0.22.1's `topk_with_indices` returned wrong entries on
//! lavapipe).
//!
//! Two launches of one kernel: workgroups each keep the best of a span of the row, then one
//! workgroup keeps the best of theirs. A workgroup sorts [`CHUNK`] entries at a time in
//! shared memory with a bitonic network (every thread busy at every stage), the best `count`
//! of what it has seen first and new entries after them. An earlier version had threads keep
//! lists of their own and one thread merge them: on an H200 that serial merge alone took
//! milliseconds a token, because one GPU thread waits out every memory access by itself.

use cubecl::prelude::*;

/// Entries a workgroup sorts at once: 8 KB of values and ids, within the 16 KB of shared
/// memory every Vulkan and WebGPU device has.
pub const CHUNK: usize = 1024;
/// Threads per workgroup; each compares two pairs per stage of the network.
pub const THREADS: usize = CHUNK / 4;

/// Writes, for workgroup `g`, the best `count` of `values[g · span .. (g + 1) · span]` (ids
/// the positions when `indexed`, else `ids`; as f32, exact below 2²⁴) to `out_values` and
/// `out_ids` at `g · count`, best first (ties: the lower id), padded with `-f32::MAX` and id
/// `f32::MAX` when the span holds fewer. `count` is at most [`THREADS`].
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub fn top_kernel(
    values: &[f32],
    ids: &[f32],
    out_values: &mut [f32],
    out_ids: &mut [f32],
    len: usize,
    span: usize,
    #[comptime] indexed: bool,
    #[comptime] count: usize,
) {
    let unit = UNIT_POS as usize;
    let mut keys = Shared::<[f32]>::new_slice(CHUNK);
    let mut names = Shared::<[f32]>::new_slice(CHUNK);
    if unit < count {
        keys[unit] = -f32::MAX;
        names[unit] = f32::MAX;
    }
    let start = CUBE_POS_X as usize * span;
    let end = select(start + span < len, start + span, len);
    let fresh = CHUNK - count;
    let mut next = start;
    while next < end {
        // The best so far stay in the first `count` places; the rest take the next entries.
        let mut slot = count + unit;
        while slot < CHUNK {
            let i = next + slot - count;
            if i < end {
                keys[slot] = values[i];
                if comptime!(indexed) {
                    names[slot] = f32::cast_from(i as u32);
                } else {
                    names[slot] = ids[i];
                }
            } else {
                keys[slot] = -f32::MAX;
                names[slot] = f32::MAX;
            }
            slot += THREADS;
        }
        sync_cube();
        sort_descending(&mut keys, &mut names, unit);
        next += fresh;
    }
    if unit < count {
        let out = CUBE_POS_X as usize * count + unit;
        out_values[out] = keys[unit];
        out_ids[out] = names[unit];
    }
}

/// Bitonic sort of the workgroup's [`CHUNK`] entries, best first; ends with a barrier.
#[cube]
fn sort_descending(keys: &mut Shared<[f32]>, names: &mut Shared<[f32]>, unit: usize) {
    // Doubled and halved at run time: a constant cannot be changed in place.
    let mut size = 2usize.runtime();
    while size <= CHUNK {
        let mut stride = size / 2;
        while stride > 0 {
            let mut pair = unit;
            while pair < CHUNK / 2 {
                let low = (pair / stride) * stride * 2 + pair % stride;
                let high = low + stride;
                let (a, a_id, b, b_id) = (keys[low], names[low], keys[high], names[high]);
                // Runs whose `size` bit is clear end best first, the others best last, so
                // that each pair of runs merges as one bitonic sequence.
                let best_first = (low & size) == 0;
                if beats(b, b_id, a, a_id) == best_first {
                    keys[low] = b;
                    names[low] = b_id;
                    keys[high] = a;
                    names[high] = a_id;
                }
                pair += THREADS;
            }
            sync_cube();
            stride /= 2;
        }
        size *= 2;
    }
}

/// Whether `(value, id)` ranks before `(other, other_id)`: the higher value, then the lower id.
#[cube]
fn beats(value: f32, id: f32, other: f32, other_id: f32) -> bool {
    value > other || (value == other && id < other_id)
}
