//! Attention's products on AVX registers instead of gemm, each output summed in one order
//! whatever the rows beside it: four rows of `a` at a time (a decode step's query heads of
//! one group, or four of a prompt's), and a prompt's scores sixteen rows at a time where the
//! CPU has AVX-512 ([`row_lanes`]).
//!
//! For a decode step's few rows gemm's packing of `b` into panels cost more than the
//! product (at 2000 cached positions, gemm and its packing took half of a bf16 decode step;
//! with these kernels that step is about a quarter faster). gemm picks its tiles, and so its
//! sums' order, by the number of rows: with a prompt's products on gemm, a token's context
//! depended on how its prompt was split between the cache and new tokens.

use super::Matrix;
use crate::model::cpu::features;

#[cfg(target_arch = "x86_64")]
mod row_lanes;

/// Rows of `a` a kernel takes at once: their accumulators fill the AVX registers.
const MAX_ROWS: usize = 4;

/// `out = a · b` when `a`'s rows are contiguous, `b` has contiguous rows or columns and the
/// CPU has AVX2 and FMA; returns whether it did. The caller has checked that the shapes fit.
pub fn product(a: Matrix<'_>, b: Matrix<'_>, out: &mut [f32], out_stride: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        if a.col_stride == 1 && features::cpu().avx2 && (b.row_stride == 1 || b.col_stride == 1) {
            if b.row_stride == 1 && a.rows >= row_lanes::LANES / 2 && features::cpu().avx512 {
                // SAFETY: the CPU has AVX-512, checked just above.
                unsafe { row_lanes::dot_columns(a, b, out, out_stride) };
                return true;
            }
            for first in (0..a.rows).step_by(MAX_ROWS) {
                let a = Matrix {
                    data: &a.data[first * a.row_stride..],
                    rows: MAX_ROWS.min(a.rows - first),
                    ..a
                };
                let out = &mut out[first * out_stride..];
                if b.row_stride == 1 {
                    // SAFETY: the CPU has the kernel's features, checked just above.
                    unsafe { avx2::dot_columns(a, b, out, out_stride) };
                } else if !avx512::weigh_rows(a, b, out, out_stride) {
                    // SAFETY: as above.
                    unsafe { avx2::weigh_rows(a, b, out, out_stride) };
                }
            }
            return true;
        }
    }
    let _ = (a, b, out, out_stride);
    false
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::{MAX_ROWS, Matrix};
    use crate::model::cpu::math::horizontal_sum;

    /// Cached rows ahead of the one in use whose cache lines are requested: one KV
    /// head's keys or values are a 256-byte piece of every 768-byte cached row, a stride
    /// the hardware prefetcher followed poorly.
    pub(super) const PREFETCH_AHEAD: usize = 8;

    /// For `b`'s columns contiguous (the keys, for scores): each column is loaded once,
    /// in one sequential piece, and multiplied into every row of `a` at once.
    #[target_feature(enable = "avx2,fma")]
    pub fn dot_columns(a: Matrix<'_>, b: Matrix<'_>, out: &mut [f32], out_stride: usize) {
        match a.rows {
            0 => {}
            1 => dot_columns_of::<1>(a, b, out, out_stride),
            2 => dot_columns_of::<2>(a, b, out, out_stride),
            3 => dot_columns_of::<3>(a, b, out, out_stride),
            _ => dot_columns_of::<MAX_ROWS>(a, b, out, out_stride),
        }
    }

    /// [`dot_columns`] for `ROWS` rows in `a`: a count known when compiling keeps each
    /// row's sum in a register of its own.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn dot_columns_of<const ROWS: usize>(
        a: Matrix<'_>,
        b: Matrix<'_>,
        out: &mut [f32],
        out_stride: usize,
    ) {
        let depth = a.cols;
        let main = depth / 8 * 8;
        let rows: [&[f32]; ROWS] = std::array::from_fn(|r| &a.data[r * a.row_stride..][..depth]);
        for j in 0..b.cols {
            let column = &b.data[j * b.col_stride..][..depth];
            prefetch(b.data.get((j + PREFETCH_AHEAD) * b.col_stride..), depth);
            let mut sums = [_mm256_setzero_ps(); ROWS];
            let mut d = 0;
            while d < main {
                // SAFETY: d + 8 <= depth, the length of `column` and of every row.
                unsafe {
                    let key = _mm256_loadu_ps(column.as_ptr().add(d));
                    for (sum, row) in sums.iter_mut().zip(rows) {
                        *sum = _mm256_fmadd_ps(_mm256_loadu_ps(row.as_ptr().add(d)), key, *sum);
                    }
                }
                d += 8;
            }
            for (r, (sum, row)) in sums.into_iter().zip(rows).enumerate() {
                let tail: f32 = row[main..]
                    .iter()
                    .zip(&column[main..])
                    .map(|(x, y)| x * y)
                    .sum();
                out[r * out_stride + j] = horizontal_sum(sum) + tail;
            }
        }
    }

    /// For `b`'s rows contiguous (the values, for the context): each row of `b` is
    /// read once, in one sequential piece, and added into every output row with its
    /// weight; the output rows stay in the L1 cache. Walking the rows once per block of
    /// columns instead made four strided passes over the values, which took half as
    /// long again as the scores.
    #[target_feature(enable = "avx2,fma")]
    pub fn weigh_rows(a: Matrix<'_>, b: Matrix<'_>, out: &mut [f32], out_stride: usize) {
        let cols = b.cols;
        let main = cols / 8 * 8;
        for r in 0..a.rows {
            out[r * out_stride..][..cols].fill(0.0);
        }
        for k in 0..a.cols {
            let b_row = &b.data[k * b.row_stride..][..cols];
            prefetch(b.data.get((k + PREFETCH_AHEAD) * b.row_stride..), cols);
            for r in 0..a.rows {
                let weight = a.data[r * a.row_stride + k];
                let out = &mut out[r * out_stride..][..cols];
                let mut c = 0;
                while c < main {
                    // SAFETY: c + 8 <= cols, the length of `b_row` and `out`.
                    unsafe {
                        let sum = _mm256_fmadd_ps(
                            _mm256_set1_ps(weight),
                            _mm256_loadu_ps(b_row.as_ptr().add(c)),
                            _mm256_loadu_ps(out.as_ptr().add(c)),
                        );
                        _mm256_storeu_ps(out.as_mut_ptr().add(c), sum);
                    }
                    c += 8;
                }
                for (y, v) in out[main..].iter_mut().zip(&b_row[main..]) {
                    *y += weight * v;
                }
            }
        }
    }

    /// Asks for the cache lines of the first `len` elements of `ahead`, where it exists.
    #[inline]
    #[target_feature(enable = "avx2")]
    pub(super) fn prefetch(ahead: Option<&[f32]>, len: usize) {
        if let Some(ahead) = ahead {
            for line in ahead[..len.min(ahead.len())].iter().step_by(16) {
                _mm_prefetch::<_MM_HINT_T0>((line as *const f32).cast());
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use super::avx2::{PREFETCH_AHEAD, prefetch};
    use super::{MAX_ROWS, Matrix};

    /// f32 values per vector.
    const LANES: usize = 16;

    /// Most vectors per output row: four rows of four take 16 of the 32 registers.
    const MAX_VECTORS: usize = 4;

    /// [`super::avx2::weigh_rows`] with the output rows held in registers for the whole
    /// pass, when each is a multiple of 16 values and at most 64 (a head of 64 values fits):
    /// each cached row then costs one load and one multiply-add per vector and output row,
    /// where the AVX2 kernel also loads and stores the output, whose sixteen registers
    /// cannot hold it. At 2000 cached positions that kernel was a fifth of a bf16 decode
    /// step. Returns whether it ran: not without AVX-512 or for other shapes.
    pub fn weigh_rows(a: Matrix<'_>, b: Matrix<'_>, out: &mut [f32], out_stride: usize) -> bool {
        let vectors = b.cols / LANES;
        let fits = b.cols.is_multiple_of(LANES)
            && (1..=MAX_VECTORS).contains(&vectors)
            && (1..=MAX_ROWS).contains(&a.rows);
        if !fits || !super::features::cpu().avx512 {
            return false;
        }
        // SAFETY: the CPU has AVX-512, checked just above, and `vectors` is b.cols / 16.
        unsafe {
            match vectors {
                1 => by_rows::<1>(a, b, out, out_stride),
                2 => by_rows::<2>(a, b, out, out_stride),
                3 => by_rows::<3>(a, b, out, out_stride),
                _ => by_rows::<MAX_VECTORS>(a, b, out, out_stride),
            }
        }
        true
    }

    /// # Safety
    /// The CPU must have AVX-512, and `b.cols` must be `VECTORS · 16`.
    #[target_feature(enable = "avx512f,avx2")]
    unsafe fn by_rows<const VECTORS: usize>(
        a: Matrix<'_>,
        b: Matrix<'_>,
        out: &mut [f32],
        out_stride: usize,
    ) {
        match a.rows {
            1 => weigh::<1, VECTORS>(a, b, out, out_stride),
            2 => weigh::<2, VECTORS>(a, b, out, out_stride),
            3 => weigh::<3, VECTORS>(a, b, out, out_stride),
            _ => weigh::<MAX_ROWS, VECTORS>(a, b, out, out_stride),
        }
    }

    /// `ROWS` output rows of `VECTORS` vectors each, known when compiling so that every sum
    /// has a register of its own. `b.cols` must be `VECTORS · 16`.
    #[inline]
    #[target_feature(enable = "avx512f,avx2")]
    fn weigh<const ROWS: usize, const VECTORS: usize>(
        a: Matrix<'_>,
        b: Matrix<'_>,
        out: &mut [f32],
        out_stride: usize,
    ) {
        let mut sums = [[_mm512_setzero_ps(); VECTORS]; ROWS];
        for k in 0..a.cols {
            let b_row = &b.data[k * b.row_stride..][..VECTORS * LANES];
            prefetch(b.data.get((k + PREFETCH_AHEAD) * b.row_stride..), b.cols);
            // A plain loop, not `std::array::from_fn`: in a sibling kernel tried for the
            // scores, the profile showed `from_fn` and its closure as calls, not inlined.
            let mut values = [_mm512_setzero_ps(); VECTORS];
            for (v, value) in values.iter_mut().enumerate() {
                *value = load(b_row, v);
            }
            for (r, sums) in sums.iter_mut().enumerate() {
                let weight = _mm512_set1_ps(a.data[r * a.row_stride + k]);
                for (sum, &value) in sums.iter_mut().zip(&values) {
                    *sum = _mm512_fmadd_ps(weight, value, *sum);
                }
            }
        }
        for (r, sums) in sums.iter().enumerate() {
            let out = &mut out[r * out_stride..][..VECTORS * LANES];
            for (v, &sum) in sums.iter().enumerate() {
                // SAFETY: v · 16 + 16 <= VECTORS · 16, the length of `out`.
                unsafe { _mm512_storeu_ps(out.as_mut_ptr().add(v * LANES), sum) };
            }
        }
    }

    /// The 16 values of `slice` from vector `v`.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn load(slice: &[f32], v: usize) -> __m512 {
        let part = &slice[v * LANES..][..LANES];
        // SAFETY: `part` holds 16 values.
        unsafe { _mm512_loadu_ps(part.as_ptr()) }
    }
}
