//! `X Wᵀ` for f32 activations against f32, f16 or bf16 weights on CPUs with AVX-512: tiles of
//! 6 weight rows × 4 tokens whose 24 sums stay in registers while 16 columns at a time pass,
//! each weight widened to f32 in the register it is loaded into. f32 arithmetic throughout,
//! as on the gemm path, without gemm's packing: through gemm, SmolLM2-135M's f32 prompts ran
//! at ~320 tok/s on our 2-core machine, llama.cpp's (tiles like these) at ~800.

use half::{bf16, f16};

use super::{Shape, for_each_row_tile};
use crate::model::cpu::threads::SharedOutput;
use crate::model::cpu::weights::WeightRows;

/// Tokens of one tile.
const TILE_TOKENS: usize = 4;

/// Weight rows of one tile. The tile's 24 sums, its tokens' four vectors and one weight
/// vector take 29 of the 32 vector registers.
const TILE_ROWS: usize = 6;

/// f32 values per vector: the columns must be a multiple of it.
const LANES: usize = 16;

/// Fewest tiles of weight rows a thread takes at once.
const MIN_TILES_PER_RANGE: usize = 4;

/// `out = X Wᵀ` (or `out += X Wᵀ` when `accumulate`) for `x`: `[tokens, cols]`, a float
/// `weight`: `[rows, cols]` and `out`: `[tokens, rows]`, all row-major, when the CPU has
/// AVX-512 and `cols` is a multiple of 16; returns whether it did.
///
/// # Panics
/// When the lengths do not fit those shapes: the callers take them from tensor shapes.
pub fn product(
    weight: WeightRows<'_>,
    x: &[f32],
    tokens: usize,
    out: &mut [f32],
    accumulate: bool,
) -> bool {
    match weight {
        WeightRows::F32(weight) => multiply(weight, x, tokens, out, accumulate),
        WeightRows::F16(weight) => multiply(weight, x, tokens, out, accumulate),
        WeightRows::Bf16(weight) => multiply(weight, x, tokens, out, accumulate),
        WeightRows::Integers { .. } => false,
    }
}

fn multiply<E: Widen>(
    weight: &[E],
    x: &[f32],
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
        std::arch::is_x86_feature_detected!("avx512f")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// A weight element type the tiles widen to f32, sixteen at a time.
pub trait Widen: Copy + Sync {
    /// Sixteen values from `at`, widened exactly.
    ///
    /// # Safety
    /// The CPU must have AVX512F; sixteen values must lie at `at`.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load16(at: *const Self) -> std::arch::x86_64::__m512;
}

#[cfg(target_arch = "x86_64")]
impl Widen for f32 {
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn load16(at: *const Self) -> std::arch::x86_64::__m512 {
        // SAFETY: as the caller guarantees.
        unsafe { std::arch::x86_64::_mm512_loadu_ps(at) }
    }
}

#[cfg(target_arch = "x86_64")]
impl Widen for f16 {
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn load16(at: *const Self) -> std::arch::x86_64::__m512 {
        use std::arch::x86_64::*;
        // SAFETY: as the caller guarantees.
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(at.cast())) }
    }
}

#[cfg(target_arch = "x86_64")]
impl Widen for bf16 {
    /// A bf16 value is the high half of its f32.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn load16(at: *const Self) -> std::arch::x86_64::__m512 {
        use std::arch::x86_64::*;
        // SAFETY: as the caller guarantees.
        unsafe {
            let halves = _mm512_cvtepu16_epi32(_mm256_loadu_si256(at.cast()));
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(halves))
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
impl Widen for f32 {}
#[cfg(not(target_arch = "x86_64"))]
impl Widen for f16 {}
#[cfg(not(target_arch = "x86_64"))]
impl Widen for bf16 {}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use super::{LANES, Shape, TILE_ROWS, TILE_TOKENS, Widen};
    use crate::model::cpu::threads::SharedOutput;

    /// The `TILE_TOKENS × TILE_ROWS` outputs from `first_token` and `first_row`. At the
    /// edges of `x` and `weight` the missing tokens and rows repeat the last one, and their
    /// sums are dropped.
    ///
    /// # Safety
    /// The CPU must have AVX512F; `x`, `weight` and `out` must fit `shape` with `cols` a
    /// multiple of [`LANES`], and no other thread may touch the tile's elements of `out`.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn tile<E: Widen>(
        weight: &[E],
        x: &[f32],
        shape: Shape,
        first_token: usize,
        first_row: usize,
        out: &SharedOutput<f32>,
        accumulate: bool,
    ) {
        let Shape { tokens, rows, cols } = shape;
        let tokens_in: [*const f32; TILE_TOKENS] =
            std::array::from_fn(|i| x[(first_token + i).min(tokens - 1) * cols..].as_ptr());
        let rows_in: [*const E; TILE_ROWS] =
            std::array::from_fn(|j| weight[(first_row + j).min(rows - 1) * cols..].as_ptr());
        let mut sums = [[_mm512_setzero_ps(); TILE_ROWS]; TILE_TOKENS];
        let mut c = 0;
        while c < cols {
            // SAFETY: c + 16 <= cols, and each pointer starts a row of `cols` values.
            unsafe {
                let values = tokens_in.map(|token| _mm512_loadu_ps(token.add(c)));
                for (j, row) in rows_in.iter().enumerate() {
                    let w = E::load16(row.add(c));
                    for (sums, &v) in sums.iter_mut().zip(&values) {
                        sums[j] = _mm512_fmadd_ps(v, w, sums[j]);
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
}

#[cfg(test)]
mod tests {
    use half::{bf16, f16};

    use super::{LANES, product, supported};
    use crate::model::cpu::test_values as values;
    use crate::model::cpu::weights::WeightRows;

    /// Each weight type, shapes whose tokens and rows leave partial tiles, and columns of one
    /// and of many vectors, with and without accumulating, against an f64 reference of the
    /// values as stored.
    #[test]
    fn products_equal_a_float64_reference_for_every_float_weight() {
        for (tokens, rows, cols) in [(1, 1, 16), (5, 7, 64), (4, 6, 576), (13, 100, 96)] {
            let weight = values(rows * cols, 1);
            let halves: Vec<f16> = weight.iter().map(|&w| f16::from_f32(w)).collect();
            let brains: Vec<bf16> = weight.iter().map(|&w| bf16::from_f32(w)).collect();
            let stored: [(WeightRows<'_>, Vec<f32>); 3] = [
                (WeightRows::F32(&weight), weight.clone()),
                (
                    WeightRows::F16(&halves),
                    halves.iter().map(|w| w.to_f32()).collect(),
                ),
                (
                    WeightRows::Bf16(&brains),
                    brains.iter().map(|w| w.to_f32()).collect(),
                ),
            ];
            let x: Vec<f32> = values(tokens * cols, 2).iter().map(|v| v * 4.0).collect();
            let base = values(tokens * rows, 3);
            for (rows_of, widened) in stored {
                for accumulate in [false, true] {
                    let mut out = if accumulate {
                        base.clone()
                    } else {
                        vec![f32::NAN; tokens * rows]
                    };
                    let ran = product(rows_of, &x, tokens, &mut out, accumulate);
                    assert_eq!(ran, supported(), "runs wherever the CPU has AVX-512");
                    if !ran {
                        continue;
                    }
                    for t in 0..tokens {
                        for r in 0..rows {
                            let dot: f64 = (0..cols)
                                .map(|c| {
                                    f64::from(x[t * cols + c]) * f64::from(widened[r * cols + c])
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
    }

    #[test]
    fn columns_that_are_not_whole_vectors_are_declined() {
        let (tokens, rows, cols) = (2, 3, LANES + 8);
        let weight = vec![1.0; rows * cols];
        let x = vec![1.0; tokens * cols];
        let mut out = vec![0.0; tokens * rows];
        assert!(!product(
            WeightRows::F32(&weight),
            &x,
            tokens,
            &mut out,
            false
        ));
        assert_eq!(out, vec![0.0; tokens * rows]);
    }
}
