//! `X Wᵀ` for several activation rows at once (a prompt): matrix-matrix products on the
//! `gemm` crate, each thread taking blocks of weight rows.
//!
//! Burn's CPU matmul serves these poorly for our weights: burn-flex widens a bf16 weight to a
//! transposed f32 copy on one thread for every product, and Burn 0.22 dequantizes a whole
//! 8-bit weight for every product. Here each block of weight rows is widened to f32 by the
//! thread that multiplies it (f32 weights are read where they lie), so every weight format
//! runs at the speed of f32 arithmetic.
//!
//! Where the CPU has the instructions, the register tiles of `float_tiles` (AVX-512 or AVX2),
//! `lane_tiles` (AVX2, float weights laid out by lane) and `integer_tiles` (AVX2) take the
//! prompt, without packing, summing each output in the decode kernels' order; gemm serves the
//! rest.

use std::cell::RefCell;
use std::ops::Range;

use super::projection::MATVEC_ROWS;
use super::threads::{SharedOutput, split_ranges, split_ranges_of};
use super::weights::WeightRows;

mod float_tiles;
mod integer_tiles;
mod lane_tiles;

pub use float_tiles::{bf16_product as bf16_matmul, product as float_matmul};
pub use integer_tiles::product as integer_matmul;
pub use lane_tiles::product as by_lane_matmul;

/// Weight rows per block. Each block packs the whole prompt again, so narrow blocks spend
/// their time packing: a 128-token f32 prompt ran at ~450 tok/s with 32-row blocks and
/// ~530 with 96 to 256.
const MIN_ROWS_PER_BLOCK: usize = 128;

/// `out = X Wᵀ` (or `out += X Wᵀ` when `accumulate`) for `x`: `[tokens, cols]`, `weight`:
/// `[rows, cols]` and `out`: `[tokens, rows]`, all row-major.
///
/// # Panics
/// When the lengths do not fit those shapes: the callers take them from tensor shapes.
pub fn matmul(weight: WeightRows<'_>, x: &[f32], tokens: usize, out: &mut [f32], accumulate: bool) {
    let cols = x.len() / tokens.max(1);
    let rows = weight.len() / cols.max(1);
    assert!(
        tokens * cols == x.len() && rows * cols == weight.len() && out.len() == tokens * rows,
        "matmul: x, weight and out do not fit [tokens, cols], [rows, cols], [tokens, rows]"
    );
    let out = SharedOutput::new(out);
    // `out[:, block] (+)= X · panelᵀ` for the weight rows `block`, given in f32 as `panel`.
    let multiply = |panel: &[f32], block: Range<usize>| {
        // SAFETY: `dst` addresses columns `block` of `out`, which no other block touches and
        // which lie inside it: element (t, j) is `t · rows + block.start + j` with t < tokens
        // and j < block.len(). `x` and `panel` are read inside their lengths, checked above.
        unsafe {
            gemm::gemm(
                tokens,
                block.len(),
                cols,
                out.at(block.start),
                1,
                rows as isize,
                accumulate,
                x.as_ptr(),
                1,
                cols as isize,
                panel.as_ptr(),
                cols as isize,
                1,
                1.0,
                1.0,
                false,
                false,
                false,
                gemm::Parallelism::None,
            );
        }
    };
    split_ranges(rows, MIN_ROWS_PER_BLOCK, &|block| {
        let start = block.start * cols;
        let len = block.len() * cols;
        match weight.as_f32(start, len) {
            Some(panel) => multiply(panel, block),
            None => WIDENED.with_borrow_mut(|panel| {
                // The buffer only grows, so it is zeroed once per thread, not per block:
                // zeroing every block's copy wrote as many bytes as the widening itself.
                if panel.len() < len {
                    panel.resize(len, 0.0);
                }
                let panel = &mut panel[..len];
                weight.widen(start, panel);
                multiply(panel, block);
            }),
        }
    });
}

/// The bytes of activations a block of tokens holds, about (a whole tile more at most): the
/// block stays in the second-level cache (1–2 MB a core) while a thread's weight rows pass
/// it once.
const BLOCK_BYTES: usize = 512 * 1024;

/// The prompt's tokens in blocks of whole tiles (so that no tile reaches into the next
/// block), as few as hold about [`BLOCK_BYTES`] of activations each, and as even as tiles
/// allow: each block costs a pass over the weights, and a short last block (the 2 tokens
/// left of 128 by blocks of 63) would pay a whole pass for one tile.
fn token_blocks(
    tokens: usize,
    row_bytes: usize,
    tile_tokens: usize,
) -> impl Iterator<Item = std::ops::Range<usize>> {
    let tiles = tokens.div_ceil(tile_tokens);
    let count = (tokens * row_bytes)
        .div_ceil(BLOCK_BYTES)
        .clamp(1, tiles.max(1));
    (0..count).map(move |i| {
        let first = tiles * i / count * tile_tokens;
        first..(tiles * (i + 1) / count * tile_tokens).min(tokens)
    })
}

/// The sizes of a product: `x` is `[tokens, cols]`, the weight `[rows, cols]`.
#[derive(Clone, Copy)]
struct Shape {
    tokens: usize,
    rows: usize,
    cols: usize,
}

impl Shape {
    /// The shape of `X Wᵀ` from the lengths of `x`, the weight's values and `out`
    /// (`[tokens, rows]`); `None` for an empty product or when `cols` is not a multiple of
    /// `lanes`, which the tile kernels need.
    ///
    /// # Panics
    /// When the lengths do not fit those shapes: the callers take them from tensor shapes.
    fn of(tokens: usize, x: usize, weight: usize, out: usize, lanes: usize) -> Option<Self> {
        let cols = x / tokens.max(1);
        if tokens == 0 || cols == 0 || !cols.is_multiple_of(lanes) {
            return None;
        }
        let rows = weight / cols;
        assert!(
            tokens * cols == x && rows * cols == weight && out == tokens * rows,
            "matmul: x, weight and out do not fit [tokens, cols], [rows, cols], [tokens, rows]"
        );
        Some(Self { tokens, rows, cols })
    }
}

/// Runs `tile_row(first_row)` for each tile of `tile_rows` weight rows, every thread taking
/// whole ranges of them: the thread owns those rows' outputs for every token. For a prompt's
/// block of `tokens` a range is one tile, each tens of microseconds; for a decode step's few
/// tokens (each tile a fraction of a microsecond) ranges hold at least `min_tiles`.
fn for_each_row_tile(
    rows: usize,
    tile_rows: usize,
    (tokens, min_tiles): (usize, usize),
    tile_row: &(impl Fn(usize) + Sync),
) {
    let tiles = rows.div_ceil(tile_rows);
    let range = |tiles: Range<usize>| {
        let rows_of_range = tiles.start * tile_rows..(tiles.end * tile_rows).min(rows);
        for first_row in rows_of_range.step_by(tile_rows) {
            tile_row(first_row);
        }
    };
    match tokens > MATVEC_ROWS {
        true => split_ranges_of(tiles, 1, &range),
        false => split_ranges(tiles, min_tiles, &range),
    }
}

thread_local! {
    /// Each thread's f32 copy of the weight block it multiplies, when weights are stored
    /// in another type.
    static WIDENED: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

#[cfg(test)]
mod tests {
    use half::{bf16, f16};

    use super::{matmul, token_blocks};
    use crate::model::cpu::test_values as values;
    use crate::model::cpu::weights::{Factors, Ints, WeightRows};

    fn reference(weight: &[f32], x: &[f32], tokens: usize, base: &[f32]) -> Vec<f64> {
        let cols = x.len() / tokens;
        let rows = weight.len() / cols;
        let mut out = Vec::new();
        for t in 0..tokens {
            for r in 0..rows {
                let dot: f64 = (0..cols)
                    .map(|c| f64::from(x[t * cols + c]) * f64::from(weight[r * cols + c]))
                    .sum();
                out.push(dot + f64::from(base[t * rows + r]));
            }
        }
        out
    }

    /// Every weight format, with and without accumulating into the output, for shapes whose
    /// rows split into uneven blocks.
    #[test]
    fn every_weight_format_equals_a_float64_reference() {
        for (tokens, rows, cols) in [(2, 7, 32), (5, 100, 64), (17, 333, 96)] {
            let weight = values(rows * cols, 1);
            let x = values(tokens * cols, 2);
            let halves: Vec<f16> = weight.iter().map(|&w| f16::from_f32(w)).collect();
            let brains: Vec<bf16> = weight.iter().map(|&w| bf16::from_f32(w)).collect();
            let quantized: Vec<i8> = weight.iter().map(|&w| (w * 127.0) as i8).collect();
            let scales = vec![1.0 / 127.0; rows * cols / 32];
            let offsets = values(rows * cols / 32, 4);
            let nibbles: Vec<u8> = values(rows * cols / 2, 5)
                .iter()
                .map(|v| (v.abs() * 255.0) as u8)
                .collect();
            let cases = [
                (WeightRows::F32(&weight), weight.clone()),
                (
                    WeightRows::F16(&halves),
                    halves.iter().map(|w| w.to_f32()).collect(),
                ),
                (
                    WeightRows::Bf16(&brains),
                    brains.iter().map(|w| w.to_f32()).collect(),
                ),
                (
                    WeightRows::Integers {
                        values: Ints::Bytes(&quantized),
                        scales: Factors::F32(&scales),
                        offsets: None,
                        block: 32,
                    },
                    quantized.iter().map(|&q| f32::from(q) / 127.0).collect(),
                ),
                (
                    WeightRows::Integers {
                        values: Ints::Bytes(&quantized),
                        scales: Factors::F32(&scales),
                        offsets: Some(Factors::F32(&offsets)),
                        block: 32,
                    },
                    quantized
                        .iter()
                        .enumerate()
                        .map(|(i, &q)| f32::from(q) / 127.0 + offsets[i / 32])
                        .collect(),
                ),
                (
                    WeightRows::Integers {
                        values: Ints::Nibbles {
                            values: &nibbles,
                            zero: 0,
                        },
                        scales: Factors::F32(&scales),
                        offsets: Some(Factors::F32(&offsets)),
                        block: 32,
                    },
                    (0..rows * cols)
                        .map(|i| {
                            let byte = nibbles[i / 32 * 16 + i % 16];
                            let q = if i % 32 < 16 { byte & 0x0F } else { byte >> 4 };
                            f32::from(q) / 127.0 + offsets[i / 32]
                        })
                        .collect(),
                ),
            ];
            for (rows_of, dense) in cases {
                for accumulate in [false, true] {
                    let base = values(tokens * rows, 3);
                    let mut out = if accumulate {
                        base.clone()
                    } else {
                        vec![f32::NAN; tokens * rows]
                    };
                    matmul(rows_of, &x, tokens, &mut out, accumulate);
                    let zero = vec![0.0; tokens * rows];
                    let expected =
                        reference(&dense, &x, tokens, if accumulate { &base } else { &zero });
                    for (got, want) in out.iter().zip(&expected) {
                        assert!(
                            (f64::from(*got) - want).abs() < 1e-4 * (1.0 + want.abs()),
                            "{tokens}x{rows}x{cols}: {got} vs {want}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn token_blocks_are_whole_tiles_as_even_as_they_allow() {
        let blocks = |tokens, row_bytes| token_blocks(tokens, row_bytes, 3).collect::<Vec<_>>();
        // 128 tokens of 8 KiB: two blocks, not 63 + 63 + 2.
        assert_eq!(blocks(128, 8192), [0..63, 63..128]);
        // 128 tokens of 32 KiB: eight blocks of five or six tiles, not a ninth of 8 tokens.
        let long = blocks(128, 32768);
        assert_eq!(long.len(), 8);
        assert!(
            long.iter()
                .all(|b| b.start % 3 == 0 && (14..=18).contains(&b.len()))
        );
        assert_eq!((long[0].start, long[7].end), (0, 128));
        assert!(long.windows(2).all(|pair| pair[0].end == pair[1].start));
        // A short prompt, and one of a single token however wide: one block.
        assert_eq!(
            (blocks(2, 8192).len(), blocks(2, 8192)[0].clone()),
            (1, 0..2)
        );
        assert_eq!(
            (blocks(1, 1 << 30).len(), blocks(1, 1 << 30)[0].clone()),
            (1, 0..1)
        );
    }
}
