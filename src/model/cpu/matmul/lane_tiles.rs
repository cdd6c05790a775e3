//! `X Wᵀ` against float weights laid out by lane (`weights::by_lane_at`), on CPUs with
//! AVX2: the prompts' products and the decode steps' alike.
//!
//! A tile is a group of sixteen weight rows and up to six tokens. For each lane (a column's
//! place in its sixteen) in turn, it sums that lane's columns for all of them: two registers
//! of eight rows a token, each weight vector widened once for every token of the tile, each
//! token's value broadcast. Then it adds each output's sixteen lanes in `sum_of_sixteen`'s
//! order, eight rows a register. Each lane takes its columns in order, as the decode kernel
//! of rows as they lie does (`matvec`; bf16's columns in pairs, as its own kernels take
//! them), so every output has the bits every other kernel of its type gives it, whatever
//! tokens are read with it.
//!
//! On Zen 3 (AVX2, no AVX-512), against the AVX2 tiles of `float_tiles` on rows as stored,
//! 1.7B F16 prompts ran 1.18× as fast and decode 1.03× (two alternated rounds on two cores),
//! 135M F16 prompts 1.04–1.22× (docs/performance.md); against the paired bf16 tiles, 1.7B
//! BF16 prompts 1.32× and 135M 1.15×.

use std::cell::RefCell;
use std::mem::MaybeUninit;

use super::{Shape, for_each_row_tile, token_blocks};
use crate::model::cpu::cache_lines::CacheLines;
use crate::model::cpu::features;
use crate::model::cpu::host::HostFloat;
#[cfg(target_arch = "x86_64")]
use crate::model::cpu::math::transpose_8x8;
#[cfg(target_arch = "x86_64")]
use crate::model::cpu::matvec::pair_columns;
use crate::model::cpu::threads::{SharedOutput, split_rows};
use crate::model::cpu::weights::{FLOAT_LANES, INTERLEAVED_ROWS};

/// Tokens of a tile: twelve sums, two weight vectors and a broadcast value take fifteen of
/// the sixteen registers.
const TILE_TOKENS: usize = 6;

/// Fewest tiles of weight rows a thread takes at once.
const MIN_TILES_PER_RANGE: usize = 4;

/// `out = X Wᵀ` (or `out += X Wᵀ` when `accumulate`) for `x`: `[tokens, cols]`, `weight`:
/// `[rows, cols]` laid out by lane, and `out`: `[tokens, rows]`, all row-major, when the CPU
/// has AVX2, the rows are whole groups and the columns whole sixteens; returns whether it did.
///
/// # Panics
/// When the lengths do not fit those shapes: the callers take them from tensor shapes.
pub fn product<E: HostFloat, A: HostFloat>(
    weight: &[E],
    x: &[A],
    tokens: usize,
    out: &mut [f32],
    accumulate: bool,
) -> bool {
    let Some(shape) = Shape::of(tokens, x.len(), weight.len(), out.len(), FLOAT_LANES) else {
        return false;
    };
    if !features::cpu().avx2 || !shape.rows.is_multiple_of(INTERLEAVED_ROWS) {
        return false;
    }
    #[cfg(target_arch = "x86_64")]
    BY_LANE.with_borrow_mut(|laid_out| {
        let laid_out = laid_out.first(x.len());
        tokens_by_lane::<E, A>(x, shape.cols, laid_out);
        let laid_out = &*laid_out;
        let out = SharedOutput::new(out);
        let row_bytes = shape.cols * size_of::<f32>();
        for block in token_blocks(tokens, row_bytes, TILE_TOKENS) {
            for_each_row_tile(
                shape.rows,
                INTERLEAVED_ROWS,
                (block.len(), MIN_TILES_PER_RANGE),
                &|first_row| {
                    // The group's rows stay in the second-level cache while the block passes.
                    for first_token in block.clone().step_by(TILE_TOKENS) {
                        let at = (first_token, first_row);
                        let (x, out) = (laid_out, &out);
                        // SAFETY: the CPU has AVX2 (checked above). The tile reads rows of
                        // `x` and `weight` below `tokens` and `rows` (checked to fit), and
                        // writes elements of `out` in the columns of this thread's rows,
                        // for tokens of this block.
                        unsafe {
                            match block.end - first_token {
                                1 => tile::<E, 1>(weight, x, shape, at, out, accumulate),
                                2 => tile::<E, 2>(weight, x, shape, at, out, accumulate),
                                3 => tile::<E, 3>(weight, x, shape, at, out, accumulate),
                                4 => tile::<E, 4>(weight, x, shape, at, out, accumulate),
                                5 => tile::<E, 5>(weight, x, shape, at, out, accumulate),
                                _ => tile::<E, 6>(weight, x, shape, at, out, accumulate),
                            }
                        }
                    }
                },
            );
        }
    });
    true
}

thread_local! {
    /// The tokens laid out by [`tokens_by_lane`], on the thread that starts the product.
    static BY_LANE: RefCell<CacheLines<f32>> = const { RefCell::new(CacheLines::new()) };
}

/// `x`: `[tokens, cols]` into `out` in f32 with each token's columns by lane, as the
/// weights `E` are: a lane's columns in order, then the next lane's (for bf16 weights, the
/// columns in pairs first: `matvec::pair_columns`). Each lane's values are then one run.
/// Split over the threads: on the calling thread alone it took 4.5% of a 135M F16 prompt on
/// two cores, while the other waited.
#[cfg(target_arch = "x86_64")]
fn tokens_by_lane<E: HostFloat, A: HostFloat>(x: &[A], cols: usize, out: &mut [f32]) {
    split_rows(out, cols, MIN_TOKENS_PER_RANGE, &|first, out| {
        let x = &x[first * cols..][..out.len()];
        let mut paired = match E::PAIRED {
            true => vec![A::zeroed(); cols],
            false => Vec::new(),
        };
        for (row, out) in x.chunks_exact(cols).zip(out.chunks_exact_mut(cols)) {
            let row = match E::PAIRED {
                true => {
                    pair_columns(row, &mut paired);
                    &paired[..]
                }
                false => row,
            };
            // SAFETY: `product` lays tokens out only where the CPU has AVX2 (with F16C).
            unsafe { token_by_lane(row, out) }
        }
    });
}

/// One token's columns by lane: eight columns of eight lanes at a time, transposed in
/// registers, and the columns short of a whole eight one by one. One by one, with a read
/// sixteen values apart each, they took twice as long.
///
/// # Safety
/// The CPU must have AVX2 and F16C; `row` and `out` must be as long, a multiple of sixteen.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn token_by_lane<A: HostFloat>(row: &[A], out: &mut [f32]) {
    use std::arch::x86_64::*;
    assert_eq!(row.len(), out.len(), "a token laid out by lane");
    let per_lane = row.len() / FLOAT_LANES;
    let whole = per_lane / 8 * 8;
    for step in (0..whole).step_by(8) {
        for first_lane in (0..FLOAT_LANES).step_by(8) {
            let mut columns = [_mm256_setzero_ps(); 8];
            for (k, column) in columns.iter_mut().enumerate() {
                let at = (step + k) * FLOAT_LANES + first_lane;
                // SAFETY: eight values of the row, and the CPU's features (the caller's).
                *column = unsafe { A::load8(row[at..at + 8].as_ptr()) };
            }
            for (lane, values) in transpose_8x8(columns).into_iter().enumerate() {
                let at = (first_lane + lane) * per_lane + step;
                // SAFETY: lane `first_lane + lane` has `per_lane` values from `at - step`.
                unsafe { _mm256_storeu_ps(out[at..at + 8].as_mut_ptr(), values) };
            }
        }
    }
    for step in whole..per_lane {
        for lane in 0..FLOAT_LANES {
            out[lane * per_lane + step] = row[step * FLOAT_LANES + lane].to_f32();
        }
    }
}

/// Fewest tokens a thread lays out at once: one token is about half a microsecond's work.
const MIN_TOKENS_PER_RANGE: usize = 16;

/// The sums of `L` lanes of a tile from `first_lane`: for each token, its products with the
/// group's low eight rows and with its high eight, over each lane's `per_lane` columns in
/// order. A tile of one token takes four lanes at once and one of two tokens two, so that
/// eight sums are in flight while a multiply-add's latency passes, and a decode step reads
/// four runs of weights at once, as `matvec`'s row kernels read four rows.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C; `group` must start a group of rows laid out by lane
/// and each of `tokens` a token laid out by lane, both of `16 · per_lane` columns.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn lane_sums<E: HostFloat, const T: usize, const L: usize>(
    group: *const E,
    tokens: [*const f32; T],
    first_lane: usize,
    per_lane: usize,
) -> [[[std::arch::x86_64::__m256; 2]; T]; L] {
    use std::arch::x86_64::*;

    use crate::model::cpu::matvec::avx2::{PREFETCH_BYTES, prefetch};
    let mut sums = [[[_mm256_setzero_ps(); 2]; T]; L];
    let lane_values = per_lane * INTERLEAVED_ROWS;
    // SAFETY: lanes `first_lane..first_lane + L` of the group hold `per_lane` steps of sixteen
    // values each, and of each token `per_lane` values (the caller's).
    unsafe {
        let weights = group.add(first_lane * lane_values);
        let values = tokens.map(|token| token.add(first_lane * per_lane));
        let lanes: [*const E; L] = std::array::from_fn(|l| weights.add(l * lane_values));
        let lane_bytes = lane_values * size_of::<E>();
        for step in 0..per_lane {
            let at = step * INTERLEAVED_ROWS;
            // Past its lane's end a stream goes on in the lane `L` on: the next lane is
            // another stream's, already read.
            let ahead = match at * size_of::<E>() + PREFETCH_BYTES < lane_bytes {
                true => PREFETCH_BYTES,
                false => PREFETCH_BYTES + (L - 1) * lane_bytes,
            };
            for l in 0..L {
                // Every step, not once a line: asked once a line (every other step of f16
                // weights), 1.7B F16 decode ran about 0.8× as fast as from rows as stored.
                if L > 1 {
                    prefetch(lanes[l].add(at), ahead);
                }
                let low = E::load8(lanes[l].add(at));
                let high = E::load8(lanes[l].add(at + 8));
                for t in 0..T {
                    let value = _mm256_broadcast_ss(&*values[t].add(l * per_lane + step));
                    sums[l][t][0] = _mm256_fmadd_ps(value, low, sums[l][t][0]);
                    sums[l][t][1] = _mm256_fmadd_ps(value, high, sums[l][t][1]);
                }
            }
        }
    }
    sums
}

/// Every lane's sums of a tile ([`lane_sums`]), `L` lanes at a time, into `lanes`. By loops,
/// not `array::from_fn`: its closures were not always inlined, and then every lane's sums
/// went through `memcpy`. Into `lanes` uninitialized, not zeroed: `memset` took 6% of a
/// prompt to zero them.
///
/// # Safety
/// As for [`lane_sums`]; `L` must divide sixteen.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn every_lane<E: HostFloat, const T: usize, const L: usize>(
    group: *const E,
    tokens: [*const f32; T],
    per_lane: usize,
    lanes: &mut [MaybeUninit<[[std::arch::x86_64::__m256; 2]; T]>; FLOAT_LANES],
) {
    for first in (0..FLOAT_LANES).step_by(L) {
        // SAFETY: the caller's.
        let sums = unsafe { lane_sums::<E, T, L>(group, tokens, first, per_lane) };
        for (lane, sums) in lanes[first..].iter_mut().zip(sums) {
            lane.write(sums);
        }
    }
}

/// The tile of `T` tokens from `first_token` (laid out by [`tokens_by_lane`]) and the group
/// of rows from `first_row`: each output written to `out`, or added to it when `accumulate`.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C; the tile must lie inside `shape`, with `first_row`
/// the start of a group, and no other thread may touch its elements of `out`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile<E: HostFloat, const T: usize>(
    weight: &[E],
    x: &[f32],
    shape: Shape,
    (first_token, first_row): (usize, usize),
    out: &SharedOutput<f32>,
    accumulate: bool,
) {
    use std::arch::x86_64::*;
    let Shape { rows, cols, .. } = shape;
    let per_lane = cols / FLOAT_LANES;
    let group = weight[first_row * cols..(first_row + INTERLEAVED_ROWS) * cols].as_ptr();
    let tokens: [*const f32; T] =
        std::array::from_fn(|t| x[(first_token + t) * cols..][..cols].as_ptr());
    // A tile of one token takes four lanes at once, of two tokens two (see `lane_sums`).
    let mut lanes = [const { MaybeUninit::uninit() }; FLOAT_LANES];
    // SAFETY (for the lanes' sums): the caller's.
    unsafe {
        match T {
            1 => every_lane::<E, T, 4>(group, tokens, per_lane, &mut lanes),
            2 => every_lane::<E, T, 2>(group, tokens, per_lane, &mut lanes),
            _ => every_lane::<E, T, 1>(group, tokens, per_lane, &mut lanes),
        }
    }
    // Each token's low eight rows, then its high eight.
    for eight in 0..2 * T {
        let (t, half) = (eight / 2, eight % 2);
        // SAFETY: every lane was written above.
        let lane = |l: usize| unsafe { lanes[l].assume_init_ref()[t][half] };
        // `sum_of_sixteen`: lanes l and l + 8, then `horizontal_sum`'s order.
        let eights: [__m256; 8] = std::array::from_fn(|l| _mm256_add_ps(lane(l), lane(l + 8)));
        let fours: [__m256; 4] = std::array::from_fn(|l| _mm256_add_ps(eights[l], eights[l + 4]));
        let total = _mm256_add_ps(
            _mm256_add_ps(fours[0], fours[2]),
            _mm256_add_ps(fours[1], fours[3]),
        );
        // SAFETY: eight rows of one token inside `out`, this thread's (the caller's).
        unsafe {
            let y = out.at((first_token + t) * rows + first_row + 8 * half);
            let total = match accumulate {
                true => _mm256_add_ps(_mm256_loadu_ps(y), total),
                false => total,
            };
            _mm256_storeu_ps(y, total);
        }
    }
}

#[cfg(test)]
mod tests {
    use half::{bf16, f16};

    use super::product;
    use crate::model::cpu::host::HostFloat;
    use crate::model::cpu::matvec::matvecs;
    use crate::model::cpu::test_values as values;
    use crate::model::cpu::weights::{WeightRows, lay_out_by_lane};

    /// Against each token decoded alone from the rows as they lie (`matvecs`, whose order
    /// every float kernel keeps): the same bits for every token, however many are read
    /// together (every tile width, and blocks of several tiles), with and without
    /// accumulating; columns of one sixteen, of many, and wider than a block's share (for
    /// bf16, none in pairs, blocks of pairs, and blocks of pairs then sixteen alone).
    #[test]
    fn every_output_has_the_bits_of_rows_as_they_lie() {
        fn check<E: HostFloat>(
            rows_as_they_lie: WeightRows<'_>,
            by_lane: &[E],
            x: &[f32],
            base: &[f32],
            tokens: usize,
        ) {
            let cols = x.len() / tokens;
            let rows = by_lane.len() / cols;
            for accumulate in [false, true] {
                let mut got = match accumulate {
                    true => base.to_vec(),
                    false => vec![f32::NAN; tokens * rows],
                };
                assert!(product(by_lane, x, tokens, &mut got, accumulate));
                for t in 0..tokens {
                    let mut want = match accumulate {
                        true => base[t * rows..(t + 1) * rows].to_vec(),
                        false => vec![0.0; rows],
                    };
                    matvecs(rows_as_they_lie, &x[t * cols..(t + 1) * cols], 1, &mut want);
                    let got = &got[t * rows..(t + 1) * rows];
                    let (got, want): (Vec<u32>, Vec<u32>) = (
                        got.iter().map(|v| v.to_bits()).collect(),
                        want.iter().map(|v| v.to_bits()).collect(),
                    );
                    assert_eq!(got, want, "{tokens}x{rows}x{cols}, token {t}");
                }
            }
        }
        for (rows, cols) in [(16, 16), (48, 576), (32, 2064)] {
            let weight = values(rows * cols, 1);
            let halves: Vec<f16> = weight.iter().map(|&w| f16::from_f32(w)).collect();
            let brains: Vec<bf16> = weight.iter().map(|&w| bf16::from_f32(w)).collect();
            let (mut weight_by_lane, mut halves_by_lane) = (weight.clone(), halves.clone());
            let mut brains_by_lane = brains.clone();
            lay_out_by_lane(&mut weight_by_lane, cols);
            lay_out_by_lane(&mut halves_by_lane, cols);
            lay_out_by_lane(&mut brains_by_lane, cols);
            for tokens in [1, 2, 3, 4, 5, 6, 7, 13, 130] {
                let x: Vec<f32> = values(tokens * cols, 2).iter().map(|v| v * 4.0).collect();
                let base = values(tokens * rows, 3);
                let (f32s, f16s) = (WeightRows::F32(&weight), WeightRows::F16(&halves));
                check(f32s, &weight_by_lane, &x, &base, tokens);
                check(f16s, &halves_by_lane, &x, &base, tokens);
                check(
                    WeightRows::Bf16(&brains),
                    &brains_by_lane,
                    &x,
                    &base,
                    tokens,
                );
            }
        }
    }

    /// f16 and bf16 activations are widened as they are laid out: the bits of the same values
    /// given in f32, for columns in whole eights of steps and past them, against f16 weights
    /// and bf16 ones (whose tokens are paired first).
    #[test]
    fn narrow_activations_give_the_bits_of_their_f32_values() {
        fn check<E: HostFloat, A: HostFloat>(rows: usize, cols: usize, tokens: usize) {
            let mut weight: Vec<E> = values(rows * cols, 1)
                .into_iter()
                .map(E::from_f32)
                .collect();
            lay_out_by_lane(&mut weight, cols);
            let narrow: Vec<A> = values(tokens * cols, 2)
                .into_iter()
                .map(A::from_f32)
                .collect();
            let wide: Vec<f32> = narrow.iter().map(|&v| v.to_f32()).collect();
            let (mut from_narrow, mut from_wide) =
                (vec![f32::NAN; tokens * rows], vec![0.0; tokens * rows]);
            assert!(product(&weight, &narrow, tokens, &mut from_narrow, false));
            assert!(product(&weight, &wide, tokens, &mut from_wide, false));
            let bits = |v: &[f32]| v.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&from_narrow),
                bits(&from_wide),
                "{tokens}x{rows}x{cols}"
            );
        }
        for (rows, cols, tokens) in [(16, 576, 130), (32, 2064, 9)] {
            check::<f16, f16>(rows, cols, tokens);
            check::<bf16, bf16>(rows, cols, tokens);
            check::<bf16, f16>(rows, cols, tokens);
        }
    }

    #[test]
    fn rows_in_part_groups_and_columns_in_part_sixteens_are_declined() {
        let (weight, x) = (vec![0.0f32; 8 * 32], vec![0.0; 32]);
        assert!(!product(&weight, &x, 1, &mut [0.0; 8], false));
        let (weight, x) = (vec![0.0f32; 16 * 24], vec![0.0; 24]);
        assert!(!product(&weight, &x, 1, &mut [0.0; 16], false));
    }
}
