//! Causal grouped-query self-attention of new tokens against the KV cache on the host: the
//! rotary embedding of queries and keys and the cache write ([`rope_append`]), then
//! `softmax(q·kᵀ / √d)·v` for every query head ([`sdpa`]).
//!
//! Burn's composition of these steps is about twenty operations per layer, and in bf16 its
//! matrix products widen the whole cache to f32 on every call; in a decode step that cost
//! more than the layer's projections.

use burn::tensor::Tensor;

use super::host::{HostFloat, HostTensor, with_host_float};
use crate::model::kv_cache::CachedRows;
use rope_append::{RopeTables, rotate_and_cache};
use sdpa::attend;

mod rope_append;
mod sdpa;

/// How query heads share key/value heads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeadLayout {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
}

impl HeadLayout {
    /// Query heads per KV head: the heads that read the same keys and values.
    pub fn group(&self) -> usize {
        self.heads / self.kv_heads
    }

    /// Values per position of the cached keys (and of the values).
    pub fn kv_width(&self) -> usize {
        self.kv_heads * self.head_dim
    }
}

/// `qkv`: `[tokens, (heads + 2·kv_heads)·head_dim]`, each row the fused projection of one new
/// token (queries, then keys, then values) at positions `start..`. Rotates queries and keys
/// with the rotary embedding's tables for those positions (`[tokens, head_dim]`, the sine's
/// first half negated), writes the keys and values at positions `start..` of `cache`, and
/// returns the attention context `[tokens, heads·head_dim]`, or `None` off the CPU backends.
/// With a `window`, each token attends to the last `window` positions up to its own.
pub fn self_attention(
    qkv: &Tensor<2>,
    cos: &Tensor<2>,
    signed_sin: &Tensor<2>,
    cache: &mut CachedRows,
    start: usize,
    layout: HeadLayout,
    window: Option<usize>,
) -> Option<Tensor<2>> {
    let [tokens, _] = qkv.dims();
    let qkv = HostTensor::of(qkv)?;
    with_host_float!(qkv.dtype(), E => {
        let tables = (cos, signed_sin);
        let context = rotate_cache_attend(qkv.slice::<E>()?, tables, cache, start, layout, window)?;
        Some(qkv.tensor_like(E::narrowed(context), [tokens, layout.heads * layout.head_dim]))
    })
}

/// The work of [`self_attention`] on its rows as slices: rotates, caches, attends; the
/// context in f32, or `None` when a table is not a host tensor of type `E`.
fn rotate_cache_attend<E: HostFloat>(
    qkv: &[E],
    (cos, signed_sin): (&Tensor<2>, &Tensor<2>),
    cache: &mut CachedRows,
    start: usize,
    layout: HeadLayout,
    window: Option<usize>,
) -> Option<Vec<f32>> {
    let (cos, signed_sin) = (HostTensor::of(cos)?, HostTensor::of(signed_sin)?);
    let tables = RopeTables {
        cos: cos.slice::<E>()?,
        signed_sin: signed_sin.slice::<E>()?,
    };
    let queries = rotate_and_cache(qkv, tables, cache, start, layout);
    Some(attend(&queries, cache, start, layout, window))
}

/// One sequence's part of [`self_attention_each`]: its rotation at its next position, its
/// layer of the cache, and that position.
pub struct NextToken<'a> {
    pub cos: &'a Tensor<2>,
    pub signed_sin: &'a Tensor<2>,
    pub cache: &'a mut CachedRows,
    pub start: usize,
}

/// [`self_attention`] for one new token of each of several sequences: row `i` of `qkv`
/// (`[sequences.len(), width]`) is `sequences[i]`'s, attended over its own cache. Each row
/// goes through exactly what [`self_attention`] does for it alone.
pub fn self_attention_each(
    qkv: &Tensor<2>,
    sequences: &mut [NextToken<'_>],
    layout: HeadLayout,
    window: Option<usize>,
) -> Option<Tensor<2>> {
    let [rows, width] = qkv.dims();
    if rows != sequences.len() {
        return None;
    }
    let qkv = HostTensor::of(qkv)?;
    with_host_float!(qkv.dtype(), E => {
        let mut context = Vec::with_capacity(rows * layout.heads * layout.head_dim);
        for (row, next) in qkv.slice::<E>()?.chunks_exact(width).zip(sequences.iter_mut()) {
            let tables = (next.cos, next.signed_sin);
            let row = rotate_cache_attend(row, tables, next.cache, next.start, layout, window)?;
            context.extend(row);
        }
        Some(qkv.tensor_like(E::narrowed(context), [rows, layout.heads * layout.head_dim]))
    })
}

#[cfg(test)]
mod tests {
    use super::{HeadLayout, RopeTables, attend, rotate_and_cache};
    use crate::model::cpu::test_values as values;
    use crate::model::kv_cache::CachedRows;

    /// The textbook computation in f64, one query head at a time: rotate, score every visible
    /// key of the head's group, softmax, weigh the values.
    fn reference(
        qkv: &[f32],
        cos: &[f32],
        sin: &[f32],
        layout: HeadLayout,
        tokens: usize,
        window: Option<usize>,
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
        let keys: Vec<Vec<Vec<f64>>> = (0..tokens)
            .map(|p| (0..kv_heads).map(|g| rotated(p, heads + g)).collect())
            .collect();
        let mut out = Vec::new();
        for t in 0..tokens {
            for h in 0..heads {
                let g = h / (heads / kv_heads);
                let q = rotated(t, h);
                let first = window.map_or(0, |w| (t + 1).saturating_sub(w));
                let scores: Vec<f64> = keys[first..=t]
                    .iter()
                    .map(|k| {
                        q.iter().zip(&k[g]).map(|(a, b)| a * b).sum::<f64>() / (d as f64).sqrt()
                    })
                    .collect();
                let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let total: f64 = weights.iter().sum();
                for i in 0..d {
                    out.push(
                        (first..=t)
                            .map(|p| {
                                let v = qkv[p * width + (heads + kv_heads + g) * d + i];
                                weights[p - first] / total * f64::from(v)
                            })
                            .sum(),
                    );
                }
            }
        }
        out
    }

    /// Angles that differ per position and dimension, laid out as `RopeRows` holds them.
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

    /// Prompts in one pass and split over several calls (the last ones decode-like) must
    /// equal the reference, for GQA, MHA, a head size with a tail after the 8-lane blocks,
    /// and a context long enough that the work is split over key positions and merged.
    #[test]
    fn prefill_and_incremental_calls_equal_the_reference() {
        let gqa = HeadLayout {
            heads: 6,
            kv_heads: 2,
            head_dim: 16,
        };
        let mha = HeadLayout {
            heads: 2,
            kv_heads: 2,
            head_dim: 12,
        };
        // Windows shorter than the context, for prompts whole and in parts, and one that the
        // work split over key positions crosses.
        let cases: [(HeadLayout, &[usize], Option<usize>); 8] = [
            (gqa, &[0, 9], None),
            (gqa, &[0, 5, 9], None),
            (mha, &[0, 9], None),
            (mha, &[0, 5, 9], None),
            (gqa, &[0, 650, 699, 700], None),
            (gqa, &[0, 9], Some(4)),
            (mha, &[0, 5, 6, 9], Some(3)),
            (gqa, &[0, 650, 699, 700], Some(300)),
        ];
        for (layout, calls, window) in cases {
            let tokens = calls[calls.len() - 1];
            let width = (layout.heads + 2 * layout.kv_heads) * layout.head_dim;
            let per_token = layout.heads * layout.head_dim;
            let qkv = values(tokens * width, 7);
            let (cos, sin) = tables(tokens, layout.head_dim);
            let expected = reference(&qkv, &cos, &sin, layout, tokens, window);
            let got = read_in_calls(layout, calls, window, (&qkv, &cos, &sin));
            assert_eq!(got.len(), expected.len());
            for (i, (g, e)) in got.iter().zip(&expected).enumerate() {
                assert!(
                    (f64::from(*g) - e).abs() < 1e-5,
                    "{layout:?}, window {window:?}, calls {calls:?}, token {}: {g} vs {e}",
                    i / per_token
                );
            }
        }
    }

    /// The context of each token when the prompt is attended over the calls that `calls`
    /// bounds.
    fn read_in_calls(
        layout: HeadLayout,
        calls: &[usize],
        window: Option<usize>,
        (qkv, cos, sin): (&[f32], &[f32], &[f32]),
    ) -> Vec<f32> {
        let width = (layout.heads + 2 * layout.kv_heads) * layout.head_dim;
        let d = layout.head_dim;
        let mut cache = CachedRows::default();
        let mut contexts = Vec::new();
        for call in calls.windows(2) {
            let (start, end) = (call[0], call[1]);
            let table = RopeTables {
                cos: &cos[start * d..end * d],
                signed_sin: &sin[start * d..end * d],
            };
            let queries = rotate_and_cache(
                &qkv[start * width..end * width],
                table,
                &mut cache,
                start,
                layout,
            );
            contexts.extend(attend(&queries, &cache, start, layout, window));
        }
        contexts
    }

    /// Every token's context is the same to the bit whether its prompt is read whole, as
    /// cache and remainder split anywhere (inside a block of tokens, at and around a range
    /// of keys' edge), or a token at a time: the ranges of keys are fixed, and each score
    /// and each weighted sum of values is summed in one order whatever the rows beside it.
    /// Head sizes of 16 and 64 take the two kernels for values; the window the other start
    /// of the ranges. (Where the CPU lacks AVX2, gemm takes the products, in an order of
    /// its choosing.)
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn a_tokens_context_does_not_depend_on_how_its_prompt_was_split() {
        assert!(
            crate::model::cpu::features::cpu().avx2,
            "this test needs AVX2"
        );
        let tokens = 600;
        for (head_dim, window) in [(16, None), (64, None), (64, Some(300))] {
            let layout = HeadLayout {
                heads: 6,
                kv_heads: 2,
                head_dim,
            };
            let width = (layout.heads + 2 * layout.kv_heads) * head_dim;
            let qkv = values(tokens * width, 3);
            let (cos, sin) = tables(tokens, head_dim);
            let inputs = (&qkv[..], &cos[..], &sin[..]);
            let bits = |calls: &[usize]| -> Vec<u32> {
                let contexts = read_in_calls(layout, calls, window, inputs);
                contexts.iter().map(|c| c.to_bits()).collect()
            };
            let whole = bits(&[0, tokens]);
            let mut splits: Vec<Vec<usize>> = [1, 5, 31, 32, 33, 255, 256, 257, 599]
                .iter()
                .map(|&k| vec![0, k, tokens])
                .collect();
            splits.push(vec![0, 290, 291, 292, 293, 520, 600]);
            splits.push((0..=tokens).step_by(7).chain([tokens]).collect());
            for calls in splits {
                assert!(
                    bits(&calls) == whole,
                    "head size {head_dim}, window {window:?}: read in calls {calls:?} differs \
                     from whole"
                );
            }
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
        let table = |positions: std::ops::Range<usize>| RopeTables {
            cos: &cos[positions.start * 4..positions.end * 4],
            signed_sin: &sin[positions.start * 4..positions.end * 4],
        };
        let mut cache = CachedRows::default();
        rotate_and_cache(&values(3 * width, 1), table(0..3), &mut cache, 0, layout);
        rotate_and_cache(&values(width, 2), table(1..2), &mut cache, 1, layout);
        assert_eq!(cache.keys.len(), 2 * 4);
        assert_eq!(cache.values.len(), 2 * 4);
        assert_eq!(cache.values[4..], values(width, 2)[12..]);
    }
}
