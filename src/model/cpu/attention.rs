//! Causal grouped-query self-attention of new tokens against the KV cache, in one pass over
//! host memory: the rotary embedding of queries and keys, the cache write, and
//! `softmax(q·kᵀ / √d)·v` for every query head.
//!
//! Burn's composition of these steps is about twenty operations per layer, and in bf16 its
//! matrix products widen the whole cache to f32 on every call; in a decode step that cost
//! more than the layer's projections.

use burn::tensor::Tensor;

use super::host::{HostFloat, HostTensor, with_host_float};
use super::math::exp_in_place;
use super::threads::split_rows;

/// How query heads share key/value heads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeadLayout {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
}

impl HeadLayout {
    /// Values per position of the cached keys (and of the values).
    pub fn kv_width(&self) -> usize {
        self.kv_heads * self.head_dim
    }
}

/// One layer's cached keys and values in host memory, row `p` holding position `p`'s
/// `kv_heads · head_dim` values, so that new positions are appended and a shorter prefix is
/// a truncation. Kept in f32 whatever the model's dtype: the attention arithmetic is f32, and
/// widening bf16 keys on every read would cost more than the memory saved.
#[derive(Debug, Default)]
pub struct CachedRows {
    pub keys: Vec<f32>,
    pub values: Vec<f32>,
}

/// Attention work smaller than this many multiply-adds in total runs on the calling thread.
const MIN_WORK_PER_PART: usize = 16 * 1024;

/// `qkv`: `[tokens, (heads + 2·kv_heads)·head_dim]`, each row the fused projection of one new
/// token (queries, then keys, then values) at positions `start..`. Rotates queries and keys
/// with the rows of the rotary embedding's tables (`[max_positions, head_dim]`, the sine's
/// first half negated), writes the keys and values at positions `start..` of `cache`, and
/// returns the attention context `[tokens, heads·head_dim]`, or `None` off the CPU backends.
pub fn self_attention(
    qkv: &Tensor<2>,
    cos: &Tensor<2>,
    signed_sin: &Tensor<2>,
    cache: &mut CachedRows,
    start: usize,
    layout: HeadLayout,
) -> Option<Tensor<2>> {
    let [tokens, _] = qkv.dims();
    let qkv = HostTensor::of(qkv)?;
    let (cos, signed_sin) = (HostTensor::of(cos)?, HostTensor::of(signed_sin)?);
    with_host_float!(qkv.dtype(), E => {
        let tables = RopeTables {
            cos: cos.slice::<E>()?,
            signed_sin: signed_sin.slice::<E>()?,
        };
        let queries = rotate_and_cache(qkv.slice::<E>()?, tables, cache, start, layout);
        let context = attend(&queries, cache, start, layout);
        Some(qkv.tensor_like(E::narrowed(context), [tokens, layout.heads * layout.head_dim]))
    })
}

/// `[max_positions, head_dim]` tables of the rotary embedding, the sine's first half negated.
#[derive(Clone, Copy)]
struct RopeTables<'a, E> {
    cos: &'a [E],
    signed_sin: &'a [E],
}

/// Rotates each new token's queries (returned, `[tokens, heads, head_dim]`) and keys, and
/// appends its keys and values to the cache after its first `start` positions.
fn rotate_and_cache<E: HostFloat>(
    qkv: &[E],
    tables: RopeTables<'_, E>,
    cache: &mut CachedRows,
    start: usize,
    layout: HeadLayout,
) -> Vec<f32> {
    let HeadLayout {
        heads,
        kv_heads,
        head_dim,
    } = layout;
    let width = (heads + 2 * kv_heads) * head_dim;
    let kv_width = layout.kv_width();
    let tokens = qkv.len() / width;
    cache.keys.truncate(start * kv_width);
    cache.values.truncate(start * kv_width);
    cache.keys.resize((start + tokens) * kv_width, 0.0);
    let mut queries = vec![0.0; tokens * heads * head_dim];
    let new_keys = &mut cache.keys[start * kv_width..];
    for (t, row) in qkv.chunks_exact(width).enumerate() {
        let position = start + t;
        let table = position * head_dim..(position + 1) * head_dim;
        let (cos, sin) = (&tables.cos[table.clone()], &tables.signed_sin[table]);
        let (heads_in, values) = row.split_at((heads + kv_heads) * head_dim);
        let (queries_in, keys_in) = heads_in.split_at(heads * head_dim);
        let rotated_queries = &mut queries[t * heads * head_dim..(t + 1) * heads * head_dim];
        let rotated_keys = &mut new_keys[t * kv_width..(t + 1) * kv_width];
        for (input, output) in [(queries_in, rotated_queries), (keys_in, rotated_keys)] {
            for (head, out) in input
                .chunks_exact(head_dim)
                .zip(output.chunks_exact_mut(head_dim))
            {
                rotate(head, cos, sin, out);
            }
        }
        cache.values.extend(values.iter().map(|v| v.to_f32()));
    }
    queries
}

/// `x·cos + swap_halves(x)·signed_sin`: Hugging Face's `rotate_half` layout.
fn rotate<E: HostFloat>(x: &[E], cos: &[E], signed_sin: &[E], out: &mut [f32]) {
    let half = x.len() / 2;
    for (i, out) in out.iter_mut().enumerate() {
        let partner = if i < half { i + half } else { i - half };
        *out = x[i].to_f32() * cos[i].to_f32() + x[partner].to_f32() * signed_sin[i].to_f32();
    }
}

/// The context `[tokens, heads, head_dim]` of the queries of the tokens at `start..`, each
/// attending to the cached positions up to its own.
fn attend(queries: &[f32], cache: &CachedRows, start: usize, layout: HeadLayout) -> Vec<f32> {
    let head_dim = layout.head_dim;
    let positions = cache.keys.len() / layout.kv_width();
    let mut context = vec![0.0; queries.len()];
    let min_rows = MIN_WORK_PER_PART.div_ceil(positions * head_dim).max(1);
    split_rows(
        &mut context,
        head_dim,
        min_rows,
        &|first, out: &mut [f32]| {
            attend_rows(queries, cache, start, layout, first, out);
        },
    );
    context
}

/// The context rows `first..` (one per token and query head) into `out`.
#[multiversion::multiversion(targets("x86_64+avx2+fma"))]
fn attend_rows(
    queries: &[f32],
    cache: &CachedRows,
    start: usize,
    layout: HeadLayout,
    first: usize,
    out: &mut [f32],
) {
    let HeadLayout {
        heads,
        kv_heads,
        head_dim,
    } = layout;
    let group = heads / kv_heads;
    let kv_width = layout.kv_width();
    let scale = 1.0 / (head_dim as f32).sqrt();
    let mut scores = vec![0.0; cache.keys.len() / kv_width];
    for (i, context) in out.chunks_exact_mut(head_dim).enumerate() {
        let row = first + i;
        let (token, head) = (row / heads, row % heads);
        let column = head / group * head_dim;
        let query = &queries[row * head_dim..(row + 1) * head_dim];
        let scores = &mut scores[..start + token + 1];
        for (position, score) in scores.iter_mut().enumerate() {
            let key = &cache.keys[position * kv_width + column..][..head_dim];
            *score = dot(query, key) * scale;
        }
        softmax_in_place(scores);
        context.fill(0.0);
        for (position, &weight) in scores.iter().enumerate() {
            let value = &cache.values[position * kv_width + column..][..head_dim];
            for (c, v) in context.iter_mut().zip(value) {
                *c += weight * v;
            }
        }
    }
}

/// Eight independent partial sums, so that the compiler keeps them in one vector register.
#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let (a_blocks, a_tail) = a.as_chunks::<8>();
    let (b_blocks, b_tail) = b.as_chunks::<8>();
    let mut sums = [0.0f32; 8];
    for (a, b) in a_blocks.iter().zip(b_blocks) {
        for lane in 0..8 {
            sums[lane] += a[lane] * b[lane];
        }
    }
    let tail: f32 = a_tail.iter().zip(b_tail).map(|(a, b)| a * b).sum();
    sums.iter().sum::<f32>() + tail
}

#[inline(always)]
fn softmax_in_place(scores: &mut [f32]) {
    let max = scores.iter().fold(f32::NEG_INFINITY, |m, &s| m.max(s));
    for score in scores.iter_mut() {
        *score -= max;
    }
    exp_in_place(scores);
    let total: f32 = scores.iter().sum();
    for score in scores.iter_mut() {
        *score /= total;
    }
}

#[cfg(test)]
mod tests {
    use super::{CachedRows, HeadLayout, RopeTables, attend, rotate_and_cache};
    use crate::model::cpu::test_values as values;

    /// The textbook computation in f64, one query head at a time: rotate, score every visible
    /// key of the head's group, softmax, weigh the values.
    fn reference(
        qkv: &[f32],
        cos: &[f32],
        sin: &[f32],
        layout: HeadLayout,
        tokens: usize,
    ) -> Vec<f64> {
        let HeadLayout {
            heads,
            kv_heads,
            head_dim: d,
        } = layout;
        let width = (heads + 2 * kv_heads) * d;
        let half = d / 2;
        let rotated = |t: usize, head: usize| -> Vec<f64> {
            let x = &qkv[t * width + head * d..][..d];
            (0..d)
                .map(|i| {
                    let rotated_half = if i < half { -x[i + half] } else { x[i - half] };
                    let c = cos[t * d + i];
                    let s = if i < half {
                        -sin[t * d + i]
                    } else {
                        sin[t * d + i]
                    };
                    f64::from(x[i]) * f64::from(c) + f64::from(rotated_half) * f64::from(s)
                })
                .collect()
        };
        let mut out = Vec::new();
        for t in 0..tokens {
            for h in 0..heads {
                let g = h / (heads / kv_heads);
                let q = rotated(t, h);
                let scores: Vec<f64> = (0..=t)
                    .map(|p| {
                        let k = rotated(p, heads + g);
                        q.iter().zip(&k).map(|(a, b)| a * b).sum::<f64>() / (d as f64).sqrt()
                    })
                    .collect();
                let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let total: f64 = weights.iter().sum();
                for i in 0..d {
                    out.push(
                        (0..=t)
                            .map(|p| {
                                let v = qkv[p * width + (heads + kv_heads + g) * d + i];
                                weights[p] / total * f64::from(v)
                            })
                            .sum(),
                    );
                }
            }
        }
        out
    }

    /// Angles that differ per position and dimension, laid out as `RotaryEmbedding` stores them.
    fn tables(positions: usize, d: usize) -> (Vec<f32>, Vec<f32>) {
        let half = d / 2;
        let mut cos = Vec::new();
        let mut sin = Vec::new();
        for p in 0..positions {
            for i in 0..d {
                let angle = p as f32 * (1.0 + (i % half) as f32) * 0.3;
                cos.push(angle.cos());
                sin.push(if i < half { -angle.sin() } else { angle.sin() });
            }
        }
        (cos, sin)
    }

    /// A prompt in one pass, then the same prompt split in two (a decode-like second call)
    /// must both equal the reference, for GQA, MHA and a head size with a tail after the
    /// 8-lane blocks.
    #[test]
    fn prefill_and_incremental_calls_equal_the_reference() {
        for layout in [
            HeadLayout {
                heads: 6,
                kv_heads: 2,
                head_dim: 16,
            },
            HeadLayout {
                heads: 2,
                kv_heads: 2,
                head_dim: 12,
            },
        ] {
            let tokens = 9;
            let width = (layout.heads + 2 * layout.kv_heads) * layout.head_dim;
            let qkv = values(tokens * width, 7);
            let (cos, sin) = tables(tokens, layout.head_dim);
            let expected = reference(&qkv, &cos, &sin, layout, tokens);
            let table = RopeTables {
                cos: &cos[..],
                signed_sin: &sin[..],
            };
            let close = |got: &[f32], expected: &[f64]| {
                assert_eq!(got.len(), expected.len());
                for (g, e) in got.iter().zip(expected) {
                    assert!((f64::from(*g) - e).abs() < 1e-5, "{layout:?}: {g} vs {e}");
                }
            };

            let mut cache = CachedRows::default();
            let queries = rotate_and_cache(&qkv, table, &mut cache, 0, layout);
            close(&attend(&queries, &cache, 0, layout), &expected);

            let mut cache = CachedRows::default();
            let split = 5 * width;
            let queries = rotate_and_cache(&qkv[..split], table, &mut cache, 0, layout);
            attend(&queries, &cache, 0, layout);
            let queries = rotate_and_cache(&qkv[split..], table, &mut cache, 5, layout);
            let per_token = layout.heads * layout.head_dim;
            close(
                &attend(&queries, &cache, 5, layout),
                &expected[5 * per_token..],
            );
        }
    }

    #[test]
    fn writing_at_an_earlier_position_replaces_what_followed() {
        let layout = HeadLayout {
            heads: 2,
            kv_heads: 1,
            head_dim: 4,
        };
        let width = 4 * 4;
        let (cos, sin) = tables(4, 4);
        let table = RopeTables {
            cos: &cos[..],
            signed_sin: &sin[..],
        };
        let mut cache = CachedRows::default();
        rotate_and_cache(&values(3 * width, 1), table, &mut cache, 0, layout);
        rotate_and_cache(&values(width, 2), table, &mut cache, 1, layout);
        assert_eq!(cache.keys.len(), 2 * 4);
        assert_eq!(cache.values.len(), 2 * 4);
        assert_eq!(cache.values[4..], values(width, 2)[12..]);
    }
}
