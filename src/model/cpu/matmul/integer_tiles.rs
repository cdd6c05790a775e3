//! `X Wᵀ` for a prompt against integer weights (a GGUF file's, and `--precision q8`) in
//! blocks of 32 or 16: the activations are rounded to 16-bit integers per block, as for a
//! decode step, and [`token_lanes`] multiplies integers, sixteen tokens in the lanes of a
//! vector (eight on AVX2), summing pairs of products in one instruction.
//!
//! The f32 path widens every weight and runs f32 gemm, which on our 2-core machine peaks
//! near 330 prompt tokens/s for SmolLM2-135M whatever the weights; llama.cpp multiplies
//! integers and runs its prompts about twice as fast.
//!
//! Every prompt past a decode step's rows takes the token lanes, however few its tokens:
//! their sums are the decode kernels' (`matvec`), so a token's outputs do not depend on how
//! many tokens it was read with. Tiles of a few rows by a few tokens ran prompts of 9 to 15
//! tokens faster (AVX-512, Q4_0, 8 tokens: 428 against 321–334 tok/s), in another order.

use std::cell::RefCell;

#[cfg(target_arch = "x86_64")]
mod token_lanes;

#[cfg(target_arch = "x86_64")]
use token_lanes::Lanes;

use super::Shape;
use crate::model::cpu::cache_lines::CacheLines;
use crate::model::cpu::features;
use crate::model::cpu::matvec::BlockInts;
use crate::model::cpu::weights::{Factors, Ints, WeightRows};

/// The values a tile multiplies per step: the blocks of 32 of every GGUF integer type but
/// Q6_K, or two of Q6_K's blocks of 16 (bytes only), each with its own scale.
const BLOCK: usize = 32;

/// Q6_K's block, half a step.
const HALF_BLOCK: usize = BLOCK / 2;

/// `out = X Wᵀ` (or `out += X Wᵀ` when `accumulate`) for `x`: `[tokens, cols]`, integer
/// weights `[rows, cols]` in blocks of 32 (or of 16, as bytes) and `out`: `[tokens, rows]`,
/// when the CPU has AVX2; returns whether it did.
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
        block,
    } = weight
        && supported()
        && (block == BLOCK || block == HALF_BLOCK)
        && values.read_in(block)
    {
        let weight = Weights {
            values,
            scales,
            offsets,
            halves: block == HALF_BLOCK,
        };
        return multiply(Lanes::for_this_cpu(), weight, x, tokens, out, accumulate);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (weight, x, tokens, out, accumulate);
    false
}

/// Integer weights in blocks of [`BLOCK`], or of [`HALF_BLOCK`] when `halves`.
#[derive(Clone, Copy)]
struct Weights<'a> {
    values: Ints<'a>,
    scales: Factors<'a>,
    offsets: Option<Factors<'a>>,
    halves: bool,
}

/// A thread's buffers for [`token_lanes`], which only grow.
struct Scratch {
    /// [`token_lanes`]' tile of rows of a chunk, widened to 16 bits.
    words: Vec<i16>,
    /// The tile's scales and offsets in f32, where they are stored otherwise.
    scales: Vec<f32>,
    offsets: Vec<f32>,
    /// [`token_lanes`]' running sums of a band of tiles.
    sums: CacheLines<f32>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = const {
        RefCell::new(Scratch {
            words: Vec::new(),
            scales: Vec::new(),
            offsets: Vec::new(),
            sums: CacheLines::new(),
        })
    };
}

/// [`product`] on `lanes`, which the CPU must have.
#[cfg(target_arch = "x86_64")]
fn multiply(
    lanes: Lanes,
    weight: Weights<'_>,
    x: &[f32],
    tokens: usize,
    out: &mut [f32],
    accumulate: bool,
) -> bool {
    let Some(shape) = Shape::of(tokens, x.len(), weight.values.len(), out.len(), BLOCK) else {
        return false;
    };
    let Shape { rows, cols, .. } = shape;
    let blocks = cols / if weight.halves { HALF_BLOCK } else { BLOCK };
    assert!(
        weight.scales.len() == rows * blocks
            && weight
                .offsets
                .is_none_or(|offsets| offsets.len() == rows * blocks),
        "integer matmul: scales and offsets do not fit [rows, cols / block]"
    );
    // SAFETY: the CPU has the features of `lanes` (the caller's promise), and the shapes are
    // checked above.
    unsafe { token_lanes::multiply(lanes, weight, x, shape, out, accumulate) };
    true
}

/// Zeros past the last token in each block of [`TokenBlocks`]: the lanes of one f32 vector of
/// AVX-512, the most any tile reads at once.
const SCALE_PADDING: usize = 16;

/// The tokens' scales (and block sums, for offsets) block by block, so that a tile finds its
/// tokens' side by side; each block is padded with [`SCALE_PADDING`] zeros past the last
/// token, and begins on a cache line.
struct TokenBlocks {
    scales: CacheLines<f32>,
    /// Empty without offsets.
    sums: CacheLines<f32>,
    stride: usize,
}

impl TokenBlocks {
    fn of(x: &BlockInts, tokens: usize, with_sums: bool) -> Self {
        let blocks = x.scales.len() / tokens;
        let stride = (tokens + SCALE_PADDING).next_multiple_of(SCALE_PADDING);
        let by_block = |per_token: &[f32]| {
            let mut by_block = CacheLines::zeroed(blocks * stride);
            for (t, token) in per_token.chunks_exact(blocks).enumerate() {
                for (b, &value) in token.iter().enumerate() {
                    by_block[b * stride + t] = value;
                }
            }
            by_block
        };
        Self {
            scales: by_block(&x.scales),
            sums: if with_sums {
                by_block(&x.sums)
            } else {
                CacheLines::new()
            },
            stride,
        }
    }

    /// The scales of block `b` from `first_token` on, up to [`SCALE_PADDING`] of them.
    ///
    /// # Safety
    /// `b` must be a block and `first_token` a token of the prompt.
    unsafe fn scales(&self, b: usize, first_token: usize) -> *const f32 {
        // SAFETY: as the caller guarantees; the padding holds the lanes past the last token.
        unsafe { self.scales.as_ptr().add(b * self.stride + first_token) }
    }

    /// The sums of block `b` from `first_token` on, as [`Self::scales`].
    ///
    /// # Safety
    /// As [`Self::scales`], and the blocks must have been taken with their sums.
    #[cfg(target_arch = "x86_64")]
    unsafe fn sums(&self, b: usize, first_token: usize) -> *const f32 {
        // SAFETY: as the caller guarantees.
        unsafe { self.sums.as_ptr().add(b * self.stride + first_token) }
    }
}

#[cfg(target_arch = "x86_64")]
fn supported() -> bool {
    features::cpu().avx2
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use half::f16;

    use super::{BLOCK, BlockInts, HALF_BLOCK, Lanes, Weights, multiply};
    use crate::model::cpu::test_values as values;
    use crate::model::cpu::weights::{BlockFactors, IntegerValues, Ints};

    /// `multiply` into NaNs, or onto `base` (`[tokens, rows]`) when `accumulate`.
    fn product(
        lanes: Lanes,
        weight: Weights<'_>,
        x: &[f32],
        tokens: usize,
        base: &[f32],
        accumulate: bool,
    ) -> Vec<f32> {
        let mut out = match accumulate {
            true => base.to_vec(),
            false => vec![f32::NAN; base.len()],
        };
        assert!(multiply(lanes, weight, x, tokens, &mut out, accumulate));
        out
    }

    /// Every compilation the CPU runs, on bytes, 4- and 5-bit values, with and without offsets and
    /// accumulating, for shapes that leave partial tiles, against an f64 product of the
    /// values the kernel reads: the weights as stored and the activations as rounded.
    #[test]
    fn tiles_equal_a_float64_product_of_what_they_read() {
        let kernels = Lanes::all_for_this_cpu();
        for (tokens, rows, cols) in [
            (1, 1, 32),
            (5, 7, 64),
            (7, 10, 576),
            (13, 100, 96),
            (37, 20, 64),
            // Three chunks of columns for `token_lanes`, the last one short.
            (19, 9, 4160),
            // Bands of tiles, the last one short, over two chunks.
            (21, 110, 2112),
        ] {
            // Per block of 16, for Q6_K's; blocks of 32 take every other.
            let blocks = rows * cols / HALF_BLOCK;
            let bytes: Vec<i8> = values(rows * cols, 1)
                .iter()
                .map(|v| (v * 127.0) as i8)
                .collect();
            let fours: Vec<i8> = values(rows * cols, 2)
                .iter()
                .map(|v| (v.abs() * 15.0) as i8)
                .collect();
            // Q4_0's -8 to 7, stored as 0 to 15 with a zero of 8.
            let centred: Vec<i8> = fours.iter().map(|&q| q - 8).collect();
            let fives: Vec<i8> = values(rows * cols, 7)
                .iter()
                .map(|v| (v.abs() * 31.0) as i8)
                .collect();
            // Q5_0's -16 to 15, stored as 0 to 31 with a zero of 16.
            let centred_fives: Vec<i8> = fives.iter().map(|&q| q - 16).collect();
            // Q6_K's -32 to 31 in blocks of 16, stored as 0 to 63 with a zero of 32.
            let sixes: Vec<i8> = values(rows * cols, 8)
                .iter()
                .map(|v| (v * 31.0) as i8)
                .collect();
            let packings = [&fours, &centred, &fives, &centred_fives]
                .map(|values| IntegerValues::packing(values, BLOCK));
            let six_bits = IntegerValues::packing(&sixes, HALF_BLOCK);
            assert!(matches!(
                (&packings, &six_bits),
                (
                    [
                        IntegerValues::Nibbles { .. },
                        IntegerValues::Nibbles { .. },
                        IntegerValues::FiveBits { .. },
                        IntegerValues::FiveBits { .. },
                    ],
                    IntegerValues::SixBits { .. }
                )
            ));
            // f16 values, which nibbles below take as f16, as a GGUF file's are.
            let as_f16 = |v: f32| f16::from_f32(v).to_f32();
            let scales: Vec<f32> = values(blocks, 3)
                .iter()
                .map(|v| as_f16(0.01 + v.abs() * 0.02))
                .collect();
            let offsets: Vec<f32> = values(blocks, 4).into_iter().map(as_f16).collect();
            let mut x = values(tokens * cols, 5);
            x[cols / 2] = 30.0;
            let base = values(tokens * rows, 6);
            for kernel in kernels.iter().copied() {
                let [fours_in, centred_in, fives_in, centred_fives_in] =
                    packings.each_ref().map(IntegerValues::borrowed);
                for (ints, stored, block) in [
                    (Ints::Bytes(&bytes), &bytes, BLOCK),
                    (Ints::Bytes(&bytes), &bytes, HALF_BLOCK),
                    (fours_in, &fours, BLOCK),
                    (centred_in, &centred, BLOCK),
                    (fives_in, &fives, BLOCK),
                    (centred_fives_in, &centred_fives, BLOCK),
                    (six_bits.borrowed(), &sixes, HALF_BLOCK),
                ] {
                    let rounded = BlockInts::of(&x, block);
                    let blocks = rows * cols / block;
                    let (scales, offsets) = (&scales[..blocks], &offsets[..blocks]);
                    let factors = |values: &[f32]| match ints {
                        Ints::Bytes(_) => BlockFactors::F32(values.to_vec()),
                        _ => BlockFactors::F16(values.iter().map(|&v| f16::from_f32(v)).collect()),
                    };
                    let (scale_factors, offset_factors) = (factors(scales), factors(offsets));
                    for (with_offsets, accumulate) in [(false, false), (true, false), (true, true)]
                    {
                        let weight = Weights {
                            values: ints,
                            scales: scale_factors.borrowed(),
                            offsets: with_offsets.then(|| offset_factors.borrowed()),
                            halves: block == HALF_BLOCK,
                        };
                        let out = product(kernel, weight, &x, tokens, &base, accumulate);
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
                                        * f64::from(rounded.scales[xi / block]);
                                    want += f64::from(stored[w])
                                        * f64::from(scales[w / block])
                                        * x_rounded;
                                    if with_offsets {
                                        want += f64::from(offsets[w / block]) * f64::from(x[xi]);
                                    }
                                }
                                let got = f64::from(out[t * rows + r]);
                                assert!(
                                    (got - want).abs() < 1e-4 * (1.0 + want.abs()),
                                    "{tokens}x{rows}x{cols}, block {block} ({t}, {r}): {got} vs {want}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    /// Every compilation of [`super::token_lanes`] against its arithmetic written out: each
    /// block's products summed in 32-bit integers, converted, times the token's and the
    /// row's scales multiplied, plus the block's offset term in one rounding; the blocks'
    /// terms added to the output in turn over every chunk of columns. So the 256-bit tiles
    /// give the AVX-512 tile's bits, and a prompt reads alike on either kind of CPU; the
    /// decode kernels sum so too (`projection`'s tests).
    #[test]
    fn token_lanes_sum_in_one_order_on_every_vector_width() {
        let kernels = Lanes::all_for_this_cpu();
        let (tokens, rows, cols) = (37, 13, 4160);
        let bytes: Vec<i8> = values(rows * cols, 21)
            .iter()
            .map(|v| (v * 127.0) as i8)
            .collect();
        let fours: Vec<i8> = values(rows * cols, 22)
            .iter()
            .map(|v| (v.abs() * 15.0) as i8 - 8)
            .collect();
        let nibbles = IntegerValues::packing(&fours, BLOCK);
        let mut x = values(tokens * cols, 23);
        x[5 * cols + 99] = -40.0;
        let base = values(tokens * rows, 24);
        for (ints, stored, block) in [
            (Ints::Bytes(&bytes), &bytes, BLOCK),
            (Ints::Bytes(&bytes), &bytes, HALF_BLOCK),
            (nibbles.borrowed(), &fours, BLOCK),
        ] {
            let blocks = cols / block;
            let scales: Vec<f32> = values(rows * blocks, 25)
                .iter()
                .map(|v| f16::from_f32(0.01 + v.abs() * 0.02).to_f32())
                .collect();
            let offsets: Vec<f32> = values(rows * blocks, 26)
                .iter()
                .map(|&v| f16::from_f32(v).to_f32())
                .collect();
            let (scale_factors, offset_factors) = (
                BlockFactors::F32(scales.clone()),
                BlockFactors::F32(offsets.clone()),
            );
            let rounded = BlockInts::of(&x, block);
            for (with_offsets, accumulate) in [(false, false), (true, false), (true, true)] {
                let mut want = vec![0.0f32; tokens * rows];
                for t in 0..tokens {
                    for r in 0..rows {
                        let mut sum = if accumulate { base[t * rows + r] } else { 0.0 };
                        for b in 0..blocks {
                            let int: i32 = (0..block)
                                .map(|k| {
                                    let c = b * block + k;
                                    i32::from(stored[r * cols + c])
                                        * i32::from(rounded.values[t * cols + c])
                                })
                                .sum();
                            let scale = rounded.scales[t * blocks + b] * scales[r * blocks + b];
                            let mut term = int as f32 * scale;
                            if with_offsets {
                                let token_sum = rounded.sums[t * blocks + b];
                                term = token_sum.mul_add(offsets[r * blocks + b], term);
                            }
                            sum += term;
                        }
                        want[t * rows + r] = sum;
                    }
                }
                for &kernel in &kernels {
                    let weight = Weights {
                        values: ints,
                        scales: scale_factors.borrowed(),
                        offsets: with_offsets.then(|| offset_factors.borrowed()),
                        halves: block == HALF_BLOCK,
                    };
                    let got = product(kernel, weight, &x, tokens, &base, accumulate);
                    let lanes = kernel;
                    for (i, (got, want)) in got.iter().zip(&want).enumerate() {
                        assert_eq!(
                            got.to_bits(),
                            want.to_bits(),
                            "{lanes:?}, block {block}, offsets {with_offsets}, accumulate \
                             {accumulate}, token {}, row {}: {got} against {want}",
                            i / rows,
                            i % rows
                        );
                    }
                }
            }
        }
    }

    /// Q6_K's blocks of 16, whose scales are integer steps of a base per super-block as a
    /// GGUF file's are, through every compilation the CPU runs (`token_lanes` multiplies
    /// the values by their steps and rounds the activations to 15 bits per 32), within the
    /// rounding of the activations of the true product, over several chunks of columns.
    #[test]
    fn stepped_blocks_of_16_equal_a_float64_product_within_the_rounding() {
        let (tokens, rows, cols) = (21, 8, 2304);
        let weights: Vec<i8> = values(rows * cols, 11)
            .iter()
            .map(|v| ((v * 32.0) as i8).clamp(-32, 31))
            .collect();
        let blocks = rows * cols / HALF_BLOCK;
        let bases = values(blocks / 16, 12);
        let steps = values(blocks, 13);
        let scales: Vec<f32> = (0..blocks)
            .map(|b| {
                let base = f16::from_f32(0.001 + bases[b / 16].abs() * 0.01).to_f32();
                base * ((steps[b] * 128.0) as i8) as f32
            })
            .collect();
        let factors = BlockFactors::F32(scales.clone()).compacted(HALF_BLOCK);
        assert!(matches!(factors, BlockFactors::Scaled { per: 16, .. }));
        let mut x = values(tokens * cols, 14);
        x[3 * cols + 40] = -25.0;
        let base = values(tokens * rows, 15);
        for kernel in Lanes::all_for_this_cpu() {
            for accumulate in [false, true] {
                let weight = Weights {
                    values: Ints::Bytes(&weights),
                    scales: factors.borrowed(),
                    offsets: None,
                    halves: true,
                };
                let out = product(kernel, weight, &x, tokens, &base, accumulate);
                for t in 0..tokens {
                    let x = &x[t * cols..][..cols];
                    for r in 0..rows {
                        let (mut want, mut bound) = (0.0f64, 0.0f64);
                        if accumulate {
                            want = f64::from(base[t * rows + r]);
                        }
                        for c in 0..cols {
                            let w = f64::from(weights[r * cols + c])
                                * f64::from(scales[(r * cols + c) / HALF_BLOCK]);
                            want += w * f64::from(x[c]);
                            let block = &x[c / BLOCK * BLOCK..][..BLOCK];
                            let largest = block.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                            bound += w.abs() * f64::from(largest) / 16383.0;
                        }
                        let got = f64::from(out[t * rows + r]);
                        assert!(
                            (got - want).abs() <= bound + 1e-5 * (1.0 + want.abs()),
                            "({t}, {r}): {got} vs {want}, bound {bound}"
                        );
                    }
                }
            }
        }
    }
}
