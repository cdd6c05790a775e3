//! `X Wᵀ` for a prompt against integer weights (a GGUF file's, and `--precision q8`) in
//! blocks of 32: the activations are rounded to 16-bit integers per block, as for a decode
//! step, and each tile of weight rows and tokens multiplies integers, sixteen pairs and their
//! sums per instruction, taking both blocks' scales once per block.
//!
//! The f32 path widens every weight and runs f32 gemm, which on our 2-core machine peaks
//! near 330 prompt tokens/s for SmolLM2-135M whatever the weights; llama.cpp multiplies
//! integers and runs its prompts about twice as fast.
//!
//! The offsets some types have (`offset · Σ x` per block) are one small f32 product of the
//! tokens' block sums by the offsets, a thirty-second of the main product's work.

use std::ops::Range;

use super::Shape;
use crate::model::cpu::matvec::BlockInts;
use crate::model::cpu::threads::{SharedOutput, split_ranges};
use crate::model::cpu::weights::{Ints, NIBBLE_BLOCK, WeightRows};

/// The block the tiles read: the blocks of 32 of every GGUF integer type but Q6_K.
const BLOCK: usize = 32;

/// Fewest weight rows a thread takes at once.
const MIN_ROWS_PER_RANGE: usize = 48;

/// `out = X Wᵀ` (or `out += X Wᵀ` when `accumulate`) for `x`: `[tokens, cols]`, integer
/// weights `[rows, cols]` in blocks of 32 and `out`: `[tokens, rows]`, when the CPU has AVX2;
/// returns whether it did.
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
    #[cfg(target_arch = "x86_64")]
    if let WeightRows::Integers {
        values,
        scales,
        offsets,
        block: BLOCK,
    } = weight
        && supported()
    {
        let weight = Weights {
            values,
            scales,
            offsets,
        };
        return multiply(Kernel::for_this_cpu(), weight, x, tokens, out, accumulate);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (weight, x, tokens, out, accumulate);
    false
}

/// Integer weights in blocks of [`BLOCK`].
#[derive(Clone, Copy)]
struct Weights<'a> {
    values: Ints<'a>,
    scales: &'a [f32],
    offsets: Option<&'a [f32]>,
}

/// [`product`] with `kernel`, which the CPU must have.
#[cfg(target_arch = "x86_64")]
fn multiply(
    kernel: Kernel,
    weight: Weights<'_>,
    x: &[f32],
    tokens: usize,
    out: &mut [f32],
    accumulate: bool,
) -> bool {
    let cols = x.len() / tokens.max(1);
    if tokens == 0 || !cols.is_multiple_of(BLOCK) {
        return false;
    }
    let rows = weight.values.len() / cols;
    let blocks = cols / BLOCK;
    assert!(
        tokens * cols == x.len()
            && rows * cols == weight.values.len()
            && out.len() == tokens * rows
            && weight.scales.len() == rows * blocks
            && weight
                .offsets
                .is_none_or(|offsets| offsets.len() == rows * blocks),
        "integer matmul: x, weight, scales and out do not fit [tokens, cols], [rows, cols], \
         [rows, cols / 32], [tokens, rows]"
    );
    let rounded = BlockInts::of(x, BLOCK);
    let shape = Shape { tokens, rows, cols };
    let shared = SharedOutput::new(out);
    let (tile_rows, tile_tokens) = kernel.tile();
    split_ranges(
        rows.div_ceil(tile_rows),
        MIN_ROWS_PER_RANGE / tile_rows,
        &|tiles: Range<usize>| {
            let rows_of_range = tiles.start * tile_rows..(tiles.end * tile_rows).min(rows);
            for first_row in rows_of_range.step_by(tile_rows) {
                // The tile's weight rows stay in the L1 cache while every token passes.
                for first_token in (0..tokens).step_by(tile_tokens) {
                    let at = Tile {
                        first_token,
                        first_row,
                    };
                    // SAFETY: the CPU has the kernel's features (the caller's promise) and the
                    // sizes are checked above. The tile reads rows of `x` and `weight` below
                    // `tokens` and `rows`, and writes elements of `out` in the columns of this
                    // range's rows, which no other range touches.
                    unsafe { kernel.tile_at(weight, &rounded, shape, at, &shared, accumulate) };
                }
            }
        },
    );
    if let Some(offsets) = weight.offsets {
        add_offsets(offsets, x, tokens, rows, out);
    }
    true
}

/// `out += S Oᵀ` for the tokens' block sums `S`: `[tokens, blocks]` and the offsets `O`:
/// `[rows, blocks]`.
fn add_offsets(offsets: &[f32], x: &[f32], tokens: usize, rows: usize, out: &mut [f32]) {
    let sums: Vec<f32> = x.chunks_exact(BLOCK).map(|x| x.iter().sum()).collect();
    let blocks = sums.len() / tokens;
    // SAFETY: `out` is `[tokens, rows]`, `sums` `[tokens, blocks]` and `offsets`
    // `[rows, blocks]`, all whole.
    unsafe {
        super::times_transposed(
            [tokens, rows, blocks],
            out.as_mut_ptr(),
            rows,
            true,
            &sums,
            offsets,
        )
    };
}

/// Where a tile starts.
#[derive(Clone, Copy)]
struct Tile {
    first_token: usize,
    first_row: usize,
}

#[cfg(target_arch = "x86_64")]
fn supported() -> bool {
    use std::arch::is_x86_feature_detected;
    is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")
}

/// The tile kernels, compiled once for AVX2 and once more where AVX-512 lends them 32
/// vector registers: a tile of 3 rows × 6 tokens ran prompts 11% faster there than 3 × 4 did
/// in AVX2's 16 registers (2 × 4 and 3 × 4 ran alike).
#[cfg(target_arch = "x86_64")]
macro_rules! tile_kernels {
    ($module:ident, $features:literal, $rows:literal, $tokens:literal) => {
        pub mod $module {
            /// Weight rows of one tile.
            pub const TILE_ROWS: usize = $rows;
            /// Tokens of one tile.
            pub const TILE_TOKENS: usize = $tokens;

            use std::arch::x86_64::*;

            use super::super::{BLOCK, BlockInts, NIBBLE_BLOCK, Shape, Tile};
            use crate::model::cpu::math::{horizontal_sum, unpack_nibbles};
            use crate::model::cpu::threads::SharedOutput;

            /// The `TILE_TOKENS × TILE_ROWS` outputs from the tile's first token and row. At the
            /// edges the missing tokens and rows repeat the last one and their sums are dropped.
            ///
            /// # Safety
            /// The CPU must have the module's features; `weight` must point to `rows` rows of `cols` values
            /// (bytes, or nibbles in blocks of 32 when `NIBBLES`), `scales` hold one per block,
            /// `x` be `[tokens, cols]` rounded in blocks of 32, and no other thread may touch the
            /// tile's elements of `out`.
            #[target_feature(enable = $features)]
            pub unsafe fn tile<const NIBBLES: bool>(
                weight: *const u8,
                scales: &[f32],
                x: &BlockInts,
                shape: Shape,
                at: Tile,
                out: &SharedOutput<f32>,
                accumulate: bool,
            ) {
                let Shape { tokens, rows, cols } = shape;
                let blocks = cols / BLOCK;
                let row_bytes = if NIBBLES { cols / 2 } else { cols };
                let row_of = |j: usize| (at.first_row + j).min(rows - 1);
                let token_of = |i: usize| (at.first_token + i).min(tokens - 1);
                // SAFETY: every row and token index is clamped inside the shape.
                let (rows_in, row_scales, tokens_in, token_scales) = unsafe {
                    (
                        std::array::from_fn::<_, TILE_ROWS, _>(|j| {
                            weight.add(row_of(j) * row_bytes)
                        }),
                        std::array::from_fn::<_, TILE_ROWS, _>(|j| {
                            scales.as_ptr().add(row_of(j) * blocks)
                        }),
                        std::array::from_fn::<_, TILE_TOKENS, _>(|i| {
                            x.values.as_ptr().add(token_of(i) * cols).cast::<__m256i>()
                        }),
                        std::array::from_fn::<_, TILE_TOKENS, _>(|i| {
                            x.scales.as_ptr().add(token_of(i) * blocks)
                        }),
                    )
                };
                let mut sums = [[_mm256_setzero_ps(); TILE_ROWS]; TILE_TOKENS];
                for b in 0..blocks {
                    for (j, (&row, &row_scale)) in rows_in.iter().zip(&row_scales).enumerate() {
                        // SAFETY: b < blocks, so the block lies inside each row, scale row and token.
                        unsafe {
                            let w = widened::<NIBBLES>(row, b);
                            let weight_scale = *row_scale.add(b);
                            for (sums, (&token, &token_scale)) in
                                sums.iter_mut().zip(tokens_in.iter().zip(&token_scales))
                            {
                                let v = token.add(2 * b);
                                let products = _mm256_add_epi32(
                                    _mm256_madd_epi16(w[0], _mm256_loadu_si256(v)),
                                    _mm256_madd_epi16(w[1], _mm256_loadu_si256(v.add(1))),
                                );
                                let scale = _mm256_set1_ps(weight_scale * *token_scale.add(b));
                                sums[j] =
                                    _mm256_fmadd_ps(_mm256_cvtepi32_ps(products), scale, sums[j]);
                            }
                        }
                    }
                }
                for (i, sums) in sums.iter().enumerate() {
                    let token = at.first_token + i;
                    if token >= tokens {
                        break;
                    }
                    for (j, &sum) in sums.iter().enumerate() {
                        let row = at.first_row + j;
                        if row >= rows {
                            break;
                        }
                        // SAFETY: (token, row) lies inside `out`, and the caller gives this tile's
                        // elements to this thread alone.
                        unsafe {
                            let y = out.at(token * rows + row);
                            let sum = horizontal_sum(sum);
                            *y = if accumulate { *y + sum } else { sum };
                        }
                    }
                }
            }

            /// Block `b` of a row as two vectors of sixteen 16-bit values.
            ///
            /// # Safety
            /// Block `b` must lie inside the row at `row`.
            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn widened<const NIBBLES: bool>(row: *const u8, b: usize) -> [__m256i; 2] {
                // SAFETY: as the caller guarantees.
                unsafe {
                    if NIBBLES {
                        unpack_nibbles(_mm_loadu_si128(row.add(b * NIBBLE_BLOCK / 2).cast()))
                    } else {
                        let bytes = row.add(b * BLOCK).cast::<__m128i>();
                        [
                            _mm256_cvtepi8_epi16(_mm_loadu_si128(bytes)),
                            _mm256_cvtepi8_epi16(_mm_loadu_si128(bytes.add(1))),
                        ]
                    }
                }
            }
        }
    };
}

#[cfg(target_arch = "x86_64")]
mod kernels {
    tile_kernels!(avx2, "avx2,fma", 2, 4);
    tile_kernels!(avx512, "avx2,fma,avx512f,avx512vl,avx512bw", 3, 6);
}

/// Which compilation of the tile kernel runs.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
enum Kernel {
    Avx2,
    Avx512,
}

#[cfg(target_arch = "x86_64")]
impl Kernel {
    fn for_this_cpu() -> Self {
        use std::arch::is_x86_feature_detected;
        if is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512vl")
            && is_x86_feature_detected!("avx512bw")
        {
            Self::Avx512
        } else {
            Self::Avx2
        }
    }

    /// Rows and tokens of one tile.
    fn tile(self) -> (usize, usize) {
        match self {
            Self::Avx2 => (kernels::avx2::TILE_ROWS, kernels::avx2::TILE_TOKENS),
            Self::Avx512 => (kernels::avx512::TILE_ROWS, kernels::avx512::TILE_TOKENS),
        }
    }

    /// # Safety
    /// As the kernels' `tile`, with the CPU features of this kernel.
    unsafe fn tile_at(
        self,
        weight: Weights<'_>,
        x: &BlockInts,
        shape: Shape,
        at: Tile,
        out: &SharedOutput<f32>,
        accumulate: bool,
    ) {
        use kernels::{avx2, avx512};
        // SAFETY: as the caller guarantees.
        unsafe {
            let scales = weight.scales;
            match (self, weight.values) {
                (Self::Avx2, Ints::Bytes(w)) => {
                    avx2::tile::<false>(w.as_ptr().cast(), scales, x, shape, at, out, accumulate)
                }
                (Self::Avx2, Ints::Nibbles(w)) => {
                    avx2::tile::<true>(w.as_ptr(), scales, x, shape, at, out, accumulate)
                }
                (Self::Avx512, Ints::Bytes(w)) => {
                    avx512::tile::<false>(w.as_ptr().cast(), scales, x, shape, at, out, accumulate)
                }
                (Self::Avx512, Ints::Nibbles(w)) => {
                    avx512::tile::<true>(w.as_ptr(), scales, x, shape, at, out, accumulate)
                }
            }
        }
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::{BLOCK, BlockInts, Kernel, Weights, multiply};
    use crate::model::cpu::test_values as values;
    use crate::model::cpu::weights::Ints;

    /// Every compilation the CPU runs, on bytes and nibbles, with and without offsets and
    /// accumulating, for shapes that leave partial tiles, against an f64 product of the
    /// values the kernel reads: the weights as stored and the activations as rounded.
    #[test]
    fn tiles_equal_a_float64_product_of_what_they_read() {
        use std::arch::is_x86_feature_detected;
        let mut kernels = vec![];
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
            kernels.push(Kernel::Avx2);
        }
        if matches!(Kernel::for_this_cpu(), Kernel::Avx512) {
            kernels.push(Kernel::Avx512);
        }
        for (tokens, rows, cols) in [(1, 1, 32), (5, 7, 64), (7, 10, 576), (13, 100, 96)] {
            let blocks = rows * cols / BLOCK;
            let bytes: Vec<i8> = values(rows * cols, 1)
                .iter()
                .map(|v| (v * 127.0) as i8)
                .collect();
            let fours: Vec<i8> = values(rows * cols, 2)
                .iter()
                .map(|v| (v.abs() * 15.0) as i8)
                .collect();
            let nibbles: Vec<u8> = fours
                .chunks_exact(32)
                .flat_map(|b| (0..16).map(move |j| b[j] as u8 | (b[j + 16] as u8) << 4))
                .collect();
            let scales: Vec<f32> = values(blocks, 3)
                .iter()
                .map(|v| 0.01 + v.abs() * 0.02)
                .collect();
            let offsets = values(blocks, 4);
            let mut x = values(tokens * cols, 5);
            x[cols / 2] = 30.0;
            let rounded = BlockInts::of(&x, BLOCK);
            let base = values(tokens * rows, 6);
            for kernel in kernels.iter().copied() {
                for (ints, stored) in [
                    (Ints::Bytes(&bytes), &bytes),
                    (Ints::Nibbles(&nibbles), &fours),
                ] {
                    for (with_offsets, accumulate) in [(false, false), (true, false), (true, true)]
                    {
                        let weight = Weights {
                            values: ints,
                            scales: &scales,
                            offsets: with_offsets.then_some(&offsets[..]),
                        };
                        let mut out = if accumulate {
                            base.clone()
                        } else {
                            vec![f32::NAN; tokens * rows]
                        };
                        assert!(multiply(kernel, weight, &x, tokens, &mut out, accumulate));
                        for t in 0..tokens {
                            for r in 0..rows {
                                let mut want = if accumulate {
                                    f64::from(base[t * rows + r])
                                } else {
                                    0.0
                                };
                                for c in 0..cols {
                                    let (w, xi) = (r * cols + c, t * cols + c);
                                    let x_rounded = f64::from(rounded.values[xi])
                                        * f64::from(rounded.scales[xi / 32]);
                                    want += f64::from(stored[w])
                                        * f64::from(scales[w / 32])
                                        * x_rounded;
                                    if with_offsets {
                                        want += f64::from(offsets[w / 32]) * f64::from(x[xi]);
                                    }
                                }
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
    }
}
