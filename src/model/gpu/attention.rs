//! One decode step's attention for one layer: RoPE on the new query and key, the new key and
//! value written into the cache in place, and softmax-weighted values over every cached
//! position.
//!
//! Burn's composition of these is about a dozen launches (rotations, two slice assignments,
//! two batched matmuls, the softmax's reductions, reshapes). Here one launch does it all for
//! a context of up to one chunk of positions (256 on a GPU, 64 on a software renderer, where
//! a workgroup's threads share one core). Each workgroup
//! takes one query head and one chunk: each thread scores one position, the chunk's maximum
//! is reduced by halves, and the threads, in lanes of `head_dim` (one thread per channel),
//! share out the chunk's positions to sum the weighted values. A longer context takes one
//! workgroup per chunk side by side (flash-decoding), each leaving its maximum, its sum of
//! weights and its weighted values, and a second launch combines them per head. An earlier
//! kernel had one workgroup per head whose threads walked every position one after another:
//! after a 2000-token prompt a step took six times as long as after 8 tokens on an H200, with
//! most of the GPU idle.
//!
//! The first chunk's workgroup of each group of query heads writes the group's new key and
//! value. Every workgroup uses its own copy of them for the newest position instead of
//! reading the cache there, so no workgroup reads what another is writing.

use cubecl::prelude::*;

/// Threads per workgroup on a GPU, at most: `THREADS / head_dim` lanes, and as many
/// positions in a chunk. 256 is the size every WebGPU device allows.
pub const THREADS: usize = 256;

/// `qkv`: one token's `[q heads | k kv_heads | v kv_heads] · head_dim`; `cos`, `signed_sin`:
/// its position's `[head_dim]` (a `RopeRows` of one position); `keys`, `values`:
/// `[kv_heads, capacity, head_dim]`, filled below `position`. Launched with workgroups
/// `(heads, chunks)` of `lanes · head_dim` threads, a chunk being that many positions;
/// `halving` is the largest power of two below the thread count. With one chunk the result
/// goes to `output` (`[heads · head_dim]`). With several, `output` holds more after that:
/// each chunk's weighted values (`[heads, chunks, head_dim]`), then its maximum and sum of
/// weights (`[heads, chunks, 2]`), for [`combine_chunks_kernel`].
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub fn decode_attention_kernel<F: Float>(
    qkv: &[F],
    cos: &[F],
    signed_sin: &[F],
    keys: &mut [F],
    values: &mut [F],
    output: &mut [F],
    position: usize,
    capacity: usize,
    scale: f32,
    #[comptime] heads: usize,
    #[comptime] kv_heads: usize,
    #[comptime] head_dim: usize,
    #[comptime] lanes: usize,
    #[comptime] halving: usize,
    #[define(F)] _dtype: ElemType,
) {
    let head = CUBE_POS_X as usize;
    let chunk_index = CUBE_POS_Y as usize;
    let chunks = CUBE_COUNT_Y as usize;
    let thread = UNIT_POS as usize;
    let chunk = comptime!(lanes * head_dim);
    let group = comptime!(heads / kv_heads);
    let kv_head = head / group;
    let half = comptime!(head_dim / 2);
    let row = kv_head * capacity;

    let mut query = Shared::<[F]>::new_slice(head_dim);
    let mut new_key = Shared::<[F]>::new_slice(head_dim);
    let mut new_value = Shared::<[F]>::new_slice(head_dim);
    if thread < head_dim {
        // Rotate-half RoPE: channel c pairs with c ± half.
        let channel = thread;
        let partner = if channel < half {
            channel + half
        } else {
            channel - half
        };
        let (c, s) = (cos[channel], signed_sin[channel]);
        let q = head * head_dim;
        let k = (heads + kv_head) * head_dim;
        query[channel] = (qkv[q + channel] * c + qkv[q + partner] * s) * F::cast_from(scale);
        let key = qkv[k + channel] * c + qkv[k + partner] * s;
        let value = qkv[(heads + kv_heads + kv_head) * head_dim + channel];
        new_key[channel] = key;
        new_value[channel] = value;
        if head == kv_head * group && chunk_index == 0 {
            keys[(row + position) * head_dim + channel] = key;
            values[(row + position) * head_dim + channel] = value;
        }
    }
    sync_cube();

    let mut scores = Shared::<[F]>::new_slice(chunk);
    let mut reduced = Shared::<[F]>::new_slice(chunk);
    let start = chunk_index * chunk;
    let remaining = position + 1 - start;
    let chunk_len = if remaining < chunk { remaining } else { chunk };

    if thread < chunk_len {
        let p = start + thread;
        let mut score = F::new(0.0);
        if p == position {
            #[unroll]
            for e in 0..head_dim {
                score += query[e] * new_key[e];
            }
        } else {
            let base = (row + p) * head_dim;
            #[unroll]
            for e in 0..head_dim {
                score += query[e] * keys[base + e];
            }
        }
        scores[thread] = score;
        reduced[thread] = score;
    }
    sync_cube();

    // The chunk's maximum: each step folds the entries from `stride` on into those below,
    // and never reads past the chunk.
    let mut stride = halving.runtime();
    while stride > 0 {
        if thread < stride && thread + stride < chunk_len {
            reduced[thread] = reduced[thread].max(reduced[thread + stride]);
        }
        sync_cube();
        stride /= 2;
    }
    let max = reduced[0];
    if thread < chunk_len {
        scores[thread] = (scores[thread] - max).exp();
    }
    sync_cube();

    // Each lane sums every `lanes`-th position, its loads unrolled so that they are in
    // flight together.
    let lane = thread / head_dim;
    let channel = thread % head_dim;
    let mut sum = F::new(0.0);
    let mut weighted = F::new(0.0);
    #[unroll]
    for i in 0..head_dim {
        let j = lane + i * lanes;
        if j < chunk_len {
            let p = start + j;
            let weight = scores[j];
            let v = if p == position {
                new_value[channel]
            } else {
                values[(row + p) * head_dim + channel]
            };
            sum += weight;
            weighted += weight * v;
        }
    }
    // Every thread has read the weights before they are overwritten.
    sync_cube();
    scores[thread] = sum;
    reduced[thread] = weighted;
    sync_cube();
    if lane == 0 {
        let mut total = F::new(0.0);
        let mut total_weighted = F::new(0.0);
        #[unroll]
        for l in 0..lanes {
            total += scores[l * head_dim + channel];
            total_weighted += reduced[l * head_dim + channel];
        }
        if chunks == 1 {
            output[head * head_dim + channel] = total_weighted / total;
        } else {
            let partial = comptime!(heads * head_dim);
            let stats = partial + heads * chunks * head_dim;
            let at = head * chunks + chunk_index;
            output[partial + at * head_dim + channel] = total_weighted;
            if channel == 0 {
                output[stats + 2 * at] = max;
                output[stats + 2 * at + 1] = total;
            }
        }
    }
}

/// Each head's attention from its chunks' maxima, sums and weighted values, which
/// [`decode_attention_kernel`] left in `output` after the place of the result: one
/// workgroup per head, one thread per channel.
#[cube(launch_unchecked)]
pub fn combine_chunks_kernel<F: Float>(
    output: &mut [F],
    chunks: usize,
    #[comptime] heads: usize,
    #[comptime] head_dim: usize,
    #[define(F)] _dtype: ElemType,
) {
    let head = CUBE_POS_X as usize;
    let channel = UNIT_POS as usize;
    let partial = comptime!(heads * head_dim);
    let stats = partial + heads * chunks * head_dim;
    let first = head * chunks;
    let mut max = output[stats + 2 * first];
    for c in 1..chunks {
        max = max.max(output[stats + 2 * (first + c)]);
    }
    let mut total = F::new(0.0);
    let mut total_weighted = F::new(0.0);
    for c in 0..chunks {
        let at = first + c;
        let correction = (output[stats + 2 * at] - max).exp();
        total += correction * output[stats + 2 * at + 1];
        total_weighted += correction * output[partial + at * head_dim + channel];
    }
    output[head * head_dim + channel] = total_weighted / total;
}
