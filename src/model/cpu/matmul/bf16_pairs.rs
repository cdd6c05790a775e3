//! `X Wᵀ` for a prompt whose activations and weights are both bf16 (`--precision bf16`), on
//! CPUs with AVX512-BF16. One instruction there multiplies 32 pairs of bf16 values and adds
//! them, two by two, into 16 f32 sums: twice the multiply-adds of an f32 instruction, and
//! neither operand is widened or packed first. The f32 path widens both to f32 and packs
//! them for gemm; on such a CPU llama.cpp's bf16 prompts ran 1.3–1.6× as fast as ours did
//! that way.
//!
//! A product of two bf16 values is exact in f32, so the sums differ from the f32 path's only
//! in the order of the additions, and in that the instruction reads subnormal inputs
//! (below 1e-38) as zero.

use half::bf16;

use super::{Shape, for_each_row_tile};
use crate::model::cpu::threads::SharedOutput;

/// Tokens of one tile.
const TILE_TOKENS: usize = 4;

/// Weight rows of one tile. The tile's 24 sums, its tokens' four vectors and one weight
/// vector take 29 of the 32 vector registers.
const TILE_ROWS: usize = 6;

/// bf16 values per vector: the columns must be a multiple of it.
const LANES: usize = 32;

/// Fewest tiles of weight rows a thread takes at once.
const MIN_TILES_PER_RANGE: usize = 4;

/// `out = X Wᵀ` (or `out += X Wᵀ` when `accumulate`) for `x`: `[tokens, cols]`, `weight`:
/// `[rows, cols]` and `out`: `[tokens, rows]`, all row-major, when the CPU has AVX512-BF16
/// and `cols` is a multiple of 32; returns whether it did.
///
/// # Panics
/// When the lengths do not fit those shapes: the callers take them from tensor shapes.
pub fn product(
    weight: &[bf16],
    x: &[bf16],
    tokens: usize,
    out: &mut [f32],
    accumulate: bool,
) -> bool {
    let Some(shape) = Shape::of(tokens, x.len(), weight.len(), out.len(), LANES) else {
        return false;
    };
    if !supported() {
        return false;
    }
    #[cfg(target_arch = "x86_64")]
    {
        let out = SharedOutput::new(out);
        for_each_row_tile(shape.rows, TILE_ROWS, MIN_TILES_PER_RANGE, &|first_row| {
            // The tile's weight rows stay in the L1 cache while every token passes.
            for first_token in (0..tokens).step_by(TILE_TOKENS) {
                // SAFETY: `supported()` checked the CPU's features. The tile reads rows of
                // `x` and `weight` below `tokens` and `rows` (checked to fit), and writes
                // elements of `out` in the columns of this thread's rows.
                unsafe { avx512::tile(weight, x, shape, first_token, first_row, &out, accumulate) };
            }
        });
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (weight, out, accumulate);
    true
}

fn supported() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected;
        is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bf16")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use half::bf16;

    use super::{LANES, Shape, TILE_ROWS, TILE_TOKENS};
    use crate::model::cpu::threads::SharedOutput;

    /// The `TILE_TOKENS × TILE_ROWS` outputs from `first_token` and `first_row`. At the
    /// edges of `x` and `weight` the missing tokens and rows repeat the last one, and their
    /// sums are dropped: one kernel for every tile, at the cost of some wasted work at the
    /// edges.
    ///
    /// # Safety
    /// The CPU must have AVX512F and AVX512-BF16; `x`, `weight` and `out` must fit `shape`
    /// with `cols` a multiple of [`LANES`], and no other thread may touch the tile's
    /// elements of `out`.
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub unsafe fn tile(
        weight: &[bf16],
        x: &[bf16],
        shape: Shape,
        first_token: usize,
        first_row: usize,
        out: &SharedOutput<f32>,
        accumulate: bool,
    ) {
        let Shape { tokens, rows, cols } = shape;
        let tokens_in: [*const bf16; TILE_TOKENS] =
            std::array::from_fn(|i| x[(first_token + i).min(tokens - 1) * cols..].as_ptr());
        let rows_in: [*const bf16; TILE_ROWS] =
            std::array::from_fn(|j| weight[(first_row + j).min(rows - 1) * cols..].as_ptr());
        let mut sums = [[_mm512_setzero_ps(); TILE_ROWS]; TILE_TOKENS];
        let mut c = 0;
        while c < cols {
            // SAFETY: c + 32 <= cols, and each pointer starts a row of `cols` values.
            unsafe {
                let values = tokens_in.map(|token| load(token.add(c)));
                for (j, row) in rows_in.iter().enumerate() {
                    let w = load(row.add(c));
                    for (sums, &v) in sums.iter_mut().zip(&values) {
                        sums[j] = _mm512_dpbf16_ps(sums[j], v, w);
                    }
                }
            }
            c += LANES;
        }
        for (i, sums) in sums.iter().enumerate() {
            let token = first_token + i;
            if token >= tokens {
                break;
            }
            for (j, &sum) in sums.iter().enumerate() {
                let row = first_row + j;
                if row >= rows {
                    break;
                }
                // SAFETY: (token, row) lies inside `out`, and the caller gives this tile's
                // elements to this thread alone.
                unsafe {
                    let y = out.at(token * rows + row);
                    let sum = _mm512_reduce_add_ps(sum);
                    *y = if accumulate { *y + sum } else { sum };
                }
            }
        }
    }

    /// 32 bf16 values from `at`, as the instruction's operand type.
    ///
    /// # Safety
    /// `at` must point to 32 readable values.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bf16")]
    unsafe fn load(at: *const bf16) -> __m512bh {
        // SAFETY: as the caller guarantees; both types are 64-byte vectors.
        unsafe { std::mem::transmute(_mm512_loadu_si512(at.cast())) }
    }
}

#[cfg(test)]
mod tests {
    use half::bf16;

    use super::{LANES, product, supported};
    use crate::model::cpu::test_values as values;

    /// Shapes whose tokens and rows leave partial tiles, and columns of one and of many
    /// vectors, with and without accumulating, against an f64 reference of the bf16 values.
    #[test]
    fn products_equal_a_float64_reference_of_the_bf16_values() {
        for (tokens, rows, cols) in [(1, 1, 32), (5, 7, 64), (4, 6, 576), (13, 100, 96)] {
            let weight: Vec<bf16> = values(rows * cols, 1)
                .iter()
                .map(|&w| bf16::from_f32(w))
                .collect();
            let x: Vec<bf16> = values(tokens * cols, 2)
                .iter()
                .map(|&v| bf16::from_f32(v * 4.0))
                .collect();
            let base = values(tokens * rows, 3);
            for accumulate in [false, true] {
                let mut out = if accumulate {
                    base.clone()
                } else {
                    vec![f32::NAN; tokens * rows]
                };
                let ran = product(&weight, &x, tokens, &mut out, accumulate);
                assert_eq!(ran, supported(), "runs wherever the CPU has AVX512-BF16");
                if !ran {
                    continue;
                }
                for t in 0..tokens {
                    for r in 0..rows {
                        let dot: f64 = (0..cols)
                            .map(|c| {
                                f64::from(x[t * cols + c].to_f32())
                                    * f64::from(weight[r * cols + c].to_f32())
                            })
                            .sum();
                        let want = dot
                            + if accumulate {
                                f64::from(base[t * rows + r])
                            } else {
                                0.0
                            };
                        let got = f64::from(out[t * rows + r]);
                        assert!(
                            (got - want).abs() < 1e-4 * (1.0 + want.abs()),
                            "{tokens}x{rows}x{cols} ({t}, {r}): {got} vs {want}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn columns_that_are_not_whole_vectors_are_declined() {
        let (tokens, rows, cols) = (2, 3, LANES + 8);
        let weight = vec![bf16::ONE; rows * cols];
        let x = vec![bf16::ONE; tokens * cols];
        let mut out = vec![0.0; tokens * rows];
        assert!(!product(&weight, &x, tokens, &mut out, false));
        assert_eq!(out, vec![0.0; tokens * rows]);
    }
}
