//! A prompt's attention scores with sixteen query rows in the lanes of an AVX-512 vector:
//! each key's value at each depth is broadcast once and multiplied into sixteen rows.
//!
//! Each score is summed in the order of the four-row kernel for a decode step (eight
//! partial sums over the depth, added pairwise as `horizontal_sum` adds them, then the
//! tail), so a token's scores are the same bits whichever kernel takes them. That kernel,
//! with its sums in the lanes of one row, spent more on loading rows and adding lanes than
//! on multiplying: with it, a 2,048-token prompt of SmolLM2-135M ran at 0.75× the speed gemm
//! gave (whose order depends on the number of rows).

use std::arch::x86_64::*;
use std::cell::RefCell;

use super::Matrix;
use super::avx2::{PREFETCH_AHEAD, prefetch};

/// Query rows per vector.
pub const LANES: usize = 16;

/// Partial sums per score, as the decode kernel keeps them in the lanes of one vector.
const PARTS: usize = 8;

thread_local! {
    /// Sixteen rows of queries transposed: element `d · 16 + r` is row `r`'s at depth `d`.
    static TRANSPOSED: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// `out = a · b` for `b`'s columns contiguous (the keys), `a`'s rows contiguous.
///
/// # Safety
/// The CPU must have AVX-512F; the caller has checked that the shapes fit.
#[target_feature(enable = "avx512f,avx2")]
pub unsafe fn dot_columns(a: Matrix<'_>, b: Matrix<'_>, out: &mut [f32], out_stride: usize) {
    let depth = a.cols;
    TRANSPOSED.with_borrow_mut(|transposed| {
        for first in (0..a.rows).step_by(LANES) {
            let rows = LANES.min(a.rows - first);
            transposed.clear();
            transposed.resize(depth * LANES, 0.0);
            for r in 0..rows {
                let row = &a.data[(first + r) * a.row_stride..][..depth];
                for (d, &q) in row.iter().enumerate() {
                    transposed[d * LANES + r] = q;
                }
            }
            let column = |j: usize| &b.data[j * b.col_stride..][..depth];
            let mut store = |j: usize, scores: __m512| {
                let mut lanes = [0.0f32; LANES];
                // SAFETY: `lanes` holds sixteen values.
                unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), scores) };
                for (r, &score) in lanes[..rows].iter().enumerate() {
                    out[(first + r) * out_stride + j] = score;
                }
            };
            let mut j = 0;
            while j + 2 <= b.cols {
                prefetch(b.data.get((j + PREFETCH_AHEAD) * b.col_stride..), 2 * depth);
                let [one, two] = scores::<2>(transposed, [column(j), column(j + 1)]);
                store(j, one);
                store(j + 1, two);
                j += 2;
            }
            if j < b.cols {
                let [one] = scores::<1>(transposed, [column(j)]);
                store(j, one);
            }
        }
    });
}

/// Sixteen rows' scores against each of `KEYS` keys, summed as the decode kernel sums one.
#[inline]
#[target_feature(enable = "avx512f")]
fn scores<const KEYS: usize>(transposed: &[f32], keys: [&[f32]; KEYS]) -> [__m512; KEYS] {
    let depth = transposed.len() / LANES;
    let main = depth / PARTS * PARTS;
    let rows_at = |d: usize| {
        let lanes = &transposed[d * LANES..][..LANES];
        // SAFETY: `lanes` holds sixteen values.
        unsafe { _mm512_loadu_ps(lanes.as_ptr()) }
    };
    let mut parts = [[_mm512_setzero_ps(); PARTS]; KEYS];
    for d in (0..main).step_by(PARTS) {
        for p in 0..PARTS {
            let queries = rows_at(d + p);
            for (parts, key) in parts.iter_mut().zip(keys) {
                parts[p] = _mm512_fmadd_ps(queries, _mm512_set1_ps(key[d + p]), parts[p]);
            }
        }
    }
    let mut sums = [_mm512_setzero_ps(); KEYS];
    for ((sum, parts), key) in sums.iter_mut().zip(&parts).zip(keys) {
        // `horizontal_sum`'s order: ((0 + 4) + (2 + 6)) + ((1 + 5) + (3 + 7)).
        let quad: [__m512; 4] = std::array::from_fn(|i| _mm512_add_ps(parts[i], parts[i + 4]));
        let pairs = [
            _mm512_add_ps(quad[0], quad[2]),
            _mm512_add_ps(quad[1], quad[3]),
        ];
        // The tail as `Iterator::sum` adds it, from −0.
        let mut tail = _mm512_set1_ps(-0.0);
        for (d, &k) in key.iter().enumerate().skip(main) {
            tail = _mm512_add_ps(tail, _mm512_mul_ps(rows_at(d), _mm512_set1_ps(k)));
        }
        *sum = _mm512_add_ps(_mm512_add_ps(pairs[0], pairs[1]), tail);
    }
    sums
}
