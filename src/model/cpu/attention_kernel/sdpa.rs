//! `softmax(q·kᵀ / √d)·v` of new tokens' queries against the cached keys and values, in
//! blocks that are small matrix products.
//!
//! The query heads of one GQA group read the same keys and values, so a work item takes a
//! group's heads for a block of tokens together, and a range of key positions: its scores
//! are one `[rows, keys]` product and its context one `[rows, head_dim]` product, each
//! cached key and value read once for all of them. Splitting the key positions over items
//! (flash-decoding) keeps every core busy when there are fewer groups than cores, as in a
//! decode step, and keeps each item's scores in cache for long contexts. The items'
//! partial softmaxes are then merged exactly, by their maxima.
//!
//! Scoring one head and one position at a time cost about 100 cycles per pair:
//! at 2000 cached positions a decode step spent more time in attention than in its weights,
//! and a 2000-token prompt took 9.6 s.

use std::cell::RefCell;
use std::ops::Range;

use super::HeadLayout;
use crate::model::cpu::math::exp_in_place;
use crate::model::cpu::threads::{filled, split_rows};
use crate::model::kv_cache::CachedRows;

mod products;

/// Tokens of a prompt per work item.
const TOKENS_PER_BLOCK: usize = 32;

/// Key positions per work item, in ranges that start at multiples of it: a token's keys fall
/// into the same ranges, merged in the same order, however its prompt was split and
/// whatever the number of threads, so its context comes out the same to the bit. The item's
/// `[rows, keys]` scores stay in the core's cache, and a decode step at 2,000 positions still
/// has eight items per KV head to share between the cores.
const KEYS_PER_ITEM: usize = 256;

/// One work item: the query heads of KV head `group` for `tokens` (indices into the new
/// tokens), against the cached positions `keys`.
#[derive(Debug)]
struct Item {
    group: usize,
    tokens: Range<usize>,
    keys: Range<usize>,
}

/// The context `[tokens, heads, head_dim]` of `queries` (`[tokens, heads, head_dim]`, already
/// rotated), the new tokens being at positions `start..` and each attending to the cached
/// positions up to its own.
///
/// With a `window`, each token sees only the last `window` positions up to its own (Gemma 3's
/// sliding layers).
pub fn attend(
    queries: &[f32],
    cache: &CachedRows,
    start: usize,
    layout: HeadLayout,
    window: Option<usize>,
) -> Vec<f32> {
    let head_dim = layout.head_dim;
    let tokens = queries.len() / (layout.heads * head_dim);
    if tokens == 0 {
        return Vec::new();
    }
    let items = items(tokens, start, layout, window);
    let item_len = TOKENS_PER_BLOCK.min(tokens) * layout.group() * partial_row_len(layout);
    let mut partials = filled(items.len() * item_len, 0.0);
    split_rows(&mut partials, item_len, 1, &|first, out: &mut [f32]| {
        for (item, out) in items[first..].iter().zip(out.chunks_exact_mut(item_len)) {
            attend_item(queries, cache, start, layout, window, item, out);
        }
    });
    merge(&items, &partials, item_len, tokens, layout)
}

/// Values per query row of an item's partial result: the scores' maximum, the sum of their
/// exponentials, and the unnormalized context.
fn partial_row_len(layout: HeadLayout) -> usize {
    layout.head_dim + 2
}

/// Token blocks × groups × key ranges, ordered so that one block's ranges are adjacent. With a
/// `window`, a block's ranges begin where its first token's window does: no item covers only
/// keys that none of its tokens sees.
fn items(tokens: usize, start: usize, layout: HeadLayout, window: Option<usize>) -> Vec<Item> {
    let mut items = Vec::new();
    for block in (0..tokens).step_by(TOKENS_PER_BLOCK) {
        let tokens = block..(block + TOKENS_PER_BLOCK).min(tokens);
        // The block's last token sees the most: positions up to its own; its first token's
        // window starts earliest.
        let visible = start + tokens.end;
        let lowest = window.map_or(0, |window| {
            (start + tokens.start + 1).saturating_sub(window)
        });
        let first_range = lowest / KEYS_PER_ITEM * KEYS_PER_ITEM;
        for group in 0..layout.kv_heads {
            for range in (first_range..visible).step_by(KEYS_PER_ITEM) {
                items.push(Item {
                    group,
                    tokens: tokens.clone(),
                    keys: range.max(lowest)..(range + KEYS_PER_ITEM).min(visible),
                });
            }
        }
    }
    items
}

/// One item's partial rows into `out`, row `(t - tokens.start) · group + j` for token `t`
/// and the group's `j`-th head: `[max, sum, context…]`, the max −∞ where the token sees none
/// of the item's keys.
fn attend_item<'c>(
    queries: &[f32],
    cache: &'c CachedRows,
    start: usize,
    layout: HeadLayout,
    window: Option<usize>,
    item: &Item,
    out: &mut [f32],
) {
    let HeadLayout {
        heads, head_dim, ..
    } = layout;
    let (group, kv_width, row_len) = (layout.group(), layout.kv_width(), partial_row_len(layout));
    let rows = item.tokens.len() * group;
    let keys = item.keys.len();
    let scale = 1.0 / (head_dim as f32).sqrt();
    BUFFERS.with_borrow_mut(|Buffers { scaled, scores }| {
        scaled.clear();
        for t in item.tokens.clone() {
            let heads = &queries[(t * heads + item.group * group) * head_dim..][..group * head_dim];
            scaled.extend(heads.iter().map(|q| q * scale));
        }
        scores.resize(rows * keys, 0.0);
        let column = item.group * head_dim;
        let first = (item.keys.start - cache.first) * kv_width + column;
        // The group's columns of the cached rows `item.keys`, as a [keys, head_dim] matrix.
        let cached = |data: &'c [f32]| Matrix {
            data: &data[first..],
            rows: keys,
            cols: head_dim,
            row_stride: kv_width,
            col_stride: 1,
        };
        let queries = Matrix {
            data: scaled,
            rows,
            cols: head_dim,
            row_stride: head_dim,
            col_stride: 1,
        };
        product(queries, cached(&cache.keys).transposed(), scores, keys);
        for (r, (scores, out)) in scores
            .chunks_exact_mut(keys)
            .zip(out.chunks_exact_mut(row_len))
            .enumerate()
        {
            let token = item.tokens.start + r / group;
            let end = start + token + 1;
            let seen = end.saturating_sub(item.keys.start).min(keys);
            // Keys before the window: its first position, in the item's keys.
            let first = window.map_or(0, |window| {
                end.saturating_sub(window)
                    .saturating_sub(item.keys.start)
                    .min(seen)
            });
            let (max, sum) = exp_normalized(scores, first, seen);
            out[0] = max;
            out[1] = sum;
        }
        let weights = Matrix {
            data: scores,
            rows,
            cols: keys,
            row_stride: keys,
            col_stride: 1,
        };
        product(weights, cached(&cache.values), &mut out[2..], row_len);
    });
}

/// A strided view of a matrix: element `(i, j)` is `data[i · row_stride + j · col_stride]`.
#[derive(Clone, Copy)]
struct Matrix<'a> {
    data: &'a [f32],
    rows: usize,
    cols: usize,
    row_stride: usize,
    col_stride: usize,
}

impl Matrix<'_> {
    fn transposed(self) -> Self {
        Self {
            rows: self.cols,
            cols: self.rows,
            row_stride: self.col_stride,
            col_stride: self.row_stride,
            ..self
        }
    }

    /// Whether every element lies inside `data`.
    fn fits(&self) -> bool {
        self.rows == 0
            || self.cols == 0
            || (self.rows - 1) * self.row_stride + (self.cols - 1) * self.col_stride
                < self.data.len()
    }
}

/// `out = a · b`, `out` row-major with `out_stride` elements from one row to the next.
///
/// # Panics
/// When the shapes do not fit: the callers build them from lengths they checked.
fn product(a: Matrix<'_>, b: Matrix<'_>, out: &mut [f32], out_stride: usize) {
    let (rows, cols) = (a.rows, b.cols);
    assert!(
        a.cols == b.rows
            && a.fits()
            && b.fits()
            && (rows == 0 || cols == 0 || (rows - 1) * out_stride + cols <= out.len()),
        "attention: product of matrices that do not fit"
    );
    if products::product(a, b, out, out_stride) {
        return;
    }
    // Without AVX2. gemm's order of sums depends on the number of rows, so here a token's
    // context can differ in its last bits with how its prompt was split.
    // SAFETY: both operands and the output are read and written inside their slices,
    // checked just above.
    unsafe {
        gemm::gemm(
            rows,
            cols,
            a.cols,
            out.as_mut_ptr(),
            1,
            out_stride as isize,
            false,
            a.data.as_ptr(),
            a.col_stride as isize,
            a.row_stride as isize,
            b.data.as_ptr(),
            b.col_stride as isize,
            b.row_stride as isize,
            0.0,
            1.0,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
}

/// Replaces the scores `first..seen` by their exponentials less the largest, and the rest
/// (keys before the token's window, and after the token) by 0; returns that maximum (−∞ when
/// none is visible) and the sum.
#[multiversion::multiversion(targets("x86_64+avx2+fma"))]
fn exp_normalized(scores: &mut [f32], first: usize, seen: usize) -> (f32, f32) {
    let (before, rest) = scores.split_at_mut(first);
    before.fill(0.0);
    let (visible, hidden) = rest.split_at_mut(seen - first);
    let seen = visible.len();
    hidden.fill(0.0);
    let max = visible.iter().fold(f32::NEG_INFINITY, |m, &s| m.max(s));
    if seen == 0 {
        return (max, 0.0);
    }
    for score in visible.iter_mut() {
        *score -= max;
    }
    exp_in_place(visible);
    (max, visible.iter().sum())
}

/// The context of every token and head from the items' partial rows: each item's sum and
/// context rescaled by `e^(its max − overall max)`, added up, and divided by the total sum.
fn merge(
    items: &[Item],
    partials: &[f32],
    item_len: usize,
    tokens: usize,
    layout: HeadLayout,
) -> Vec<f32> {
    let HeadLayout {
        heads, head_dim, ..
    } = layout;
    let (group, row_len) = (layout.group(), partial_row_len(layout));
    let mut context = vec![0.0; tokens * heads * head_dim];
    let mut totals = vec![(f32::NEG_INFINITY, 0.0f32); tokens * heads];
    for (item, partial) in items.iter().zip(partials.chunks_exact(item_len)) {
        let rows = item
            .tokens
            .clone()
            .flat_map(|t| (0..group).map(move |j| t * heads + item.group * group + j));
        for (row, partial) in rows.zip(partial.chunks_exact(row_len)) {
            let (max, sum) = (partial[0], partial[1]);
            if sum == 0.0 {
                continue;
            }
            let (total_max, total_sum) = &mut totals[row];
            let new_max = total_max.max(max);
            let (old_weight, weight) = ((*total_max - new_max).exp(), (max - new_max).exp());
            *total_max = new_max;
            *total_sum = *total_sum * old_weight + sum * weight;
            let context = &mut context[row * head_dim..(row + 1) * head_dim];
            for (c, p) in context.iter_mut().zip(&partial[2..]) {
                *c = *c * old_weight + p * weight;
            }
        }
    }
    for (context, (_, sum)) in context.chunks_exact_mut(head_dim).zip(&totals) {
        for c in context {
            *c /= sum;
        }
    }
    context
}

/// Each thread's buffers for an item: its queries times `1/√d`, and its scores.
#[derive(Default)]
struct Buffers {
    scaled: Vec<f32>,
    scores: Vec<f32>,
}

thread_local! {
    static BUFFERS: RefCell<Buffers> = RefCell::new(Buffers::default());
}

#[cfg(test)]
mod tests {
    use super::{Matrix, product, products};
    use crate::model::cpu::test_values as values;

    fn reference(a: Matrix<'_>, b: Matrix<'_>) -> Vec<f64> {
        let at = |m: &Matrix<'_>, i: usize, j: usize| {
            f64::from(m.data[i * m.row_stride + j * m.col_stride])
        };
        (0..a.rows)
            .flat_map(|i| (0..b.cols).map(move |j| (i, j)))
            .map(|(i, j)| (0..a.cols).map(|k| at(&a, i, k) * at(&b, k, j)).sum())
            .collect()
    }

    /// Products of 1 to 35 rows (a kernel of sixteen rows takes from eight) with `b`'s
    /// columns contiguous (scores against keys) and with its rows contiguous (weights times
    /// values), strided as the cache is, with lengths that leave tails after the vector
    /// blocks. Each row's outputs are also the bits it gets alone.
    #[test]
    fn products_equal_a_float64_reference_and_each_row_alone() {
        #[cfg(target_arch = "x86_64")]
        let direct = crate::model::cpu::features::cpu().avx2;
        #[cfg(not(target_arch = "x86_64"))]
        let direct = false;
        for rows in [1, 2, 3, 4, 5, 9, 16, 21, 35] {
            // Output rows of 64 and 16 values take the AVX-512 kernel where there is one.
            for (depth, cols) in [(64, 40), (12, 20), (70, 33), (96, 64), (5, 16)] {
                let a_data = values(rows * depth, 1);
                let a = Matrix {
                    data: &a_data,
                    rows,
                    cols: depth,
                    row_stride: depth,
                    col_stride: 1,
                };
                let stride = depth.max(cols) + 5;
                let b_data = values(stride * stride, 2);
                let columns = Matrix {
                    data: &b_data,
                    rows: depth,
                    cols,
                    row_stride: 1,
                    col_stride: stride,
                };
                let rows_of_b = Matrix {
                    row_stride: stride,
                    col_stride: 1,
                    ..columns
                };
                for b in [columns, rows_of_b] {
                    let out_stride = cols + 2;
                    let mut out = vec![0.0; rows * out_stride];
                    assert_eq!(products::product(a, b, &mut out, out_stride), direct);
                    product(a, b, &mut out, out_stride);
                    let expected = reference(a, b);
                    for (i, e) in expected.iter().enumerate() {
                        let got = out[i / cols * out_stride + i % cols];
                        assert!(
                            (f64::from(got) - e).abs() < 1e-4,
                            "{rows}x{depth}·{depth}x{cols}: {got} vs {e}"
                        );
                    }
                    for r in (0..rows).filter(|_| direct) {
                        let row = Matrix {
                            data: &a_data[r * depth..],
                            rows: 1,
                            ..a
                        };
                        let mut alone = vec![0.0; cols];
                        product(row, b, &mut alone, cols);
                        let together = &out[r * out_stride..][..cols];
                        assert!(
                            together
                                .iter()
                                .zip(&alone)
                                .all(|(t, a)| t.to_bits() == a.to_bits()),
                            "{rows}x{depth}·{depth}x{cols}: row {r} differs from alone"
                        );
                    }
                }
            }
        }
    }
}
