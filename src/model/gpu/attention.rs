//! One decode step's attention for one layer in one launch: RoPE on the new query and key,
//! the new key and value written into the cache in place, and softmax-weighted values over
//! every cached position.
//!
//! Burn's composition of these is about a dozen launches (rotations, two slice assignments,
//! two batched matmuls, the softmax's reductions, reshapes). Here each workgroup is one query
//! head and each of its threads one channel of the head. It walks the positions in chunks,
//! keeping a running maximum and sum (the online softmax of flash attention), so the scores
//! of any context length fit in a small shared buffer.
//!
//! The first workgroup of each group of query heads writes the group's new key and value.
//! Every workgroup uses its own copy of them for the newest position instead of reading the
//! cache there, so no workgroup reads what another is writing.

use cubecl::prelude::*;

/// Positions scored at a time, in shared memory.
pub const CHUNK: usize = 256;

/// `qkv`: one token's `[q heads | k kv_heads | v kv_heads] · head_dim`; `cos`, `signed_sin`:
/// its position's `[head_dim]` (a `RopeRows` of one position); `keys`, `values`:
/// `[kv_heads, capacity, head_dim]`, filled below `position`; `output`: `[heads · head_dim]`.
/// Launched with one workgroup per query head and `head_dim` threads.
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
    #[define(F)] _dtype: ElemType,
) {
    let head = CUBE_POS_X as usize;
    let channel = UNIT_POS as usize;
    let group = comptime!(heads / kv_heads);
    let kv_head = head / group;
    let half = comptime!(head_dim / 2);

    // Rotate-half RoPE: channel c pairs with c ± half.
    let partner = if channel < half {
        channel + half
    } else {
        channel - half
    };
    let (c, s) = (cos[channel], signed_sin[channel]);
    let q = head * head_dim;
    let k = (heads + kv_head) * head_dim;

    let mut query = Shared::<[F]>::new_slice(head_dim);
    let mut new_key = Shared::<[F]>::new_slice(head_dim);
    query[channel] = (qkv[q + channel] * c + qkv[q + partner] * s) * F::cast_from(scale);
    let key = qkv[k + channel] * c + qkv[k + partner] * s;
    let value = qkv[(heads + kv_heads + kv_head) * head_dim + channel];
    new_key[channel] = key;
    let row = kv_head * capacity;
    if head == kv_head * group {
        keys[(row + position) * head_dim + channel] = key;
        values[(row + position) * head_dim + channel] = value;
    }
    sync_cube();

    let mut scores = Shared::<[F]>::new_slice(CHUNK);
    // Set by the first chunk: no constant is below every score in every float type.
    let mut max = F::new(0.0);
    let mut sum = F::new(0.0);
    let mut weighted = F::new(0.0);
    let length = position + 1;
    let mut chunk_start = 0usize.runtime();
    while chunk_start < length {
        let remaining = length - chunk_start;
        let chunk_len = if remaining < CHUNK { remaining } else { CHUNK };

        let mut j = channel;
        while j < chunk_len {
            let p = chunk_start + j;
            let mut score = F::new(0.0);
            if p == position {
                for e in 0..head_dim {
                    score += query[e] * new_key[e];
                }
            } else {
                let base = (row + p) * head_dim;
                for e in 0..head_dim {
                    score += query[e] * keys[base + e];
                }
            }
            scores[j] = score;
            j += head_dim;
        }
        sync_cube();

        let mut chunk_max = scores[0];
        for j in 1..chunk_len {
            chunk_max = chunk_max.max(scores[j]);
        }
        if chunk_start > 0 {
            chunk_max = chunk_max.max(max);
        }
        // Every thread has the maximum before the scores become weights, each by its owner.
        sync_cube();
        let mut j = channel;
        while j < chunk_len {
            scores[j] = (scores[j] - chunk_max).exp();
            j += head_dim;
        }
        sync_cube();

        // Rescales what the earlier chunks summed (nothing, in the first).
        if chunk_start > 0 {
            let correction = (max - chunk_max).exp();
            sum *= correction;
            weighted *= correction;
        }
        for j in 0..chunk_len {
            let p = chunk_start + j;
            let weight = scores[j];
            let v = if p == position {
                value
            } else {
                values[(row + p) * head_dim + channel]
            };
            sum += weight;
            weighted += weight * v;
        }
        max = chunk_max;
        // Every thread has read this chunk's scores before the next chunk overwrites them.
        sync_cube();
        chunk_start += CHUNK;
    }
    output[head * head_dim + channel] = weighted / sum;
}
