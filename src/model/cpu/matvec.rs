//! `y = W x` for one activation row, or a few: the products every decode step is made of.
//!
//! The row kernels add their products to the output, so that a projection can land on the
//! residual stream it feeds without another pass.
//!
//! A decode step reads every weight once and does two flops per weight, so it is bound by
//! memory bandwidth, not by arithmetic. The general matmul kernels of the CPU backends are
//! tuned for the opposite case: burn-flex runs a product this small on one thread (its
//! parallel threshold is 192³ multiply-adds), and burn-ndarray rejects the one-row layout
//! for BLAS. Splitting the weight's rows over every core and streaming each row once
//! through a wide dot product is what reaches the memory bandwidth.

use std::cell::RefCell;
use std::ops::Range;

use half::bf16;

use super::cache_lines::CacheLines;
use super::features::Features;
use super::host::HostFloat;
use super::math::dot;
use super::matmul::by_lane_matmul;
use super::threads::{SharedOutput, split_ranges, split_rows};
use super::weights::{Factors, INTERLEAVED_ROWS, Ints, NIBBLE_BLOCK, SIX_BIT_BLOCK, WeightRows};
use super::{features, grow};

/// Products smaller than this many rows run on the calling thread alone: splitting them
/// costs more than it saves.
const MIN_ROWS_PER_PART: usize = 16;

/// Weight rows multiplied by every activation row in turn, when there are several: few
/// enough that the later rows find them in the second-level cache (32 rows of 8,192 4-bit
/// weights are 128 KB, of 2,048 bf16 ones 128 KB), and a multiple of the kernels' groups of
/// 16 rows, so that each row falls at the same place in its group as it does alone.
const ROWS_PER_CHUNK: usize = 32;

/// Adds `W xᵥ` to `outᵥ` for `vectors` activation rows: `xs` is `[vectors, cols]`, `out`
/// `[vectors, rows]` (for one row, `W x`, one value per row of `W`). Each weight is read from
/// memory once for all of them, and each output is summed exactly as it is for that row
/// alone: a sequence decoded beside others gets, bit for bit, the logits it gets alone.
///
/// # Panics
/// When the lengths do not fit those shapes: the callers take them from tensor shapes.
pub fn matvecs(weight: WeightRows<'_>, xs: &[f32], vectors: usize, out: &mut [f32]) {
    let cols = xs.len() / vectors.max(1);
    assert!(
        vectors > 0 && cols * vectors == xs.len() && weight.len() * vectors == out.len() * cols,
        "matvec: weight is not [out.len() / vectors, xs.len() / vectors]"
    );
    let flat = xs;
    let xs: Vec<&[f32]> = xs.chunks_exact(cols.max(1)).collect();
    match weight {
        WeightRows::F32(weight) => dense(weight, &xs, out),
        WeightRows::F16(weight) => dense(weight, &xs, out),
        WeightRows::Bf16(weight) => dense_bf16(weight, &xs, out),
        WeightRows::Integers {
            values,
            scales,
            offsets,
            block,
        } => quantized(values, scales, offsets, block, &xs, out),
        WeightRows::F32ByLane { values, .. } => by_lane(values, weight, (flat, &xs), out),
        WeightRows::F16ByLane { values, .. } => by_lane(values, weight, (flat, &xs), out),
        WeightRows::Bf16ByLane { values, .. } => by_lane(values, weight, (flat, &xs), out),
    }
}

/// [`matvecs`] for weights laid out by lane (`values`, of `weight`): the tiles that read that
/// layout take a few rows as they take a prompt, each output summed as it is alone. They run
/// on every CPU that lays weights out so; anywhere else, the rows are widened back.
fn by_lane<E: HostFloat>(
    values: &[E],
    weight: WeightRows<'_>,
    (flat, xs): (&[f32], &[&[f32]]),
    out: &mut [f32],
) {
    if !by_lane_matmul(values, flat, xs.len(), out, true) {
        let mut rows = vec![0.0; weight.len()];
        weight.widen(0, &mut rows);
        dense(&rows, xs, out);
    }
}

/// Splits the weight's rows between the threads, in runs of `together` (which divides their
/// count), then runs `chunk(first, outs)` on runs of rows of each part: the whole part for
/// one activation row, [`ROWS_PER_CHUNK`] for several. `outs[v]` is that run's outputs for
/// activation row `v`.
fn for_each_chunk(
    vectors: usize,
    together: usize,
    out: &mut [f32],
    chunk: &(impl Fn(usize, &mut [&mut [f32]]) + Sync),
) {
    let rows = out.len() / vectors;
    let shared = SharedOutput::new(out);
    let min_part = MIN_ROWS_PER_PART.div_ceil(together);
    split_ranges(rows / together, min_part, &|part: Range<usize>| {
        let part = part.start * together..part.end * together;
        let step = if vectors == 1 {
            part.len()
        } else {
            ROWS_PER_CHUNK
        };
        for first in part.clone().step_by(step.max(1)) {
            let len = step.min(part.end - first);
            let mut outs: Vec<&mut [f32]> = (0..vectors)
                .map(|v| {
                    // SAFETY: `split_ranges` hands out disjoint ranges of `0..rows`, so this
                    // slice (rows `first..first + len` of activation row `v`'s `rows`
                    // outputs) is no other's, and `out` stays mutably borrowed until every
                    // part returns.
                    unsafe { std::slice::from_raw_parts_mut(shared.at(v * rows + first), len) }
                })
                .collect();
            chunk(first, &mut outs);
        }
    });
}

fn dense<W: HostFloat>(weight: &[W], xs: &[&[f32]], out: &mut [f32]) {
    dense_by(weight, xs, out, rows_dot_for_this_cpu::<W>())
}

/// [`dense`] for bf16 weights, whose AVX2 kernel takes the columns in pairs
/// ([`paired_columns`]).
fn dense_bf16(weight: &[bf16], xs: &[&[f32]], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if features::cpu().avx2 {
        let cols = xs.first().map_or(0, |x| x.len());
        let paired: Vec<CacheLines<f32>> = xs.iter().map(|x| paired_columns(x, cols)).collect();
        let paired: Vec<&[f32]> = paired.iter().map(|x| &**x).collect();
        // SAFETY: the CPU has AVX2, checked above; each `x` is paired from `cols` columns.
        let rows_dot = |weight: &[bf16], x: &[f32], out: &mut [f32]| unsafe {
            avx2::rows_dot_bf16(weight, x, out)
        };
        return dense_by(weight, &paired, out, rows_dot);
    }
    dense(weight, xs, out)
}

/// `W xᵥ` added to `outᵥ` for each of `xs`, by `rows_dot` on the rows of each thread's part.
fn dense_by<W: Sync>(
    weight: &[W],
    xs: &[&[f32]],
    out: &mut [f32],
    rows_dot: impl Fn(&[W], &[f32], &mut [f32]) + Sync,
) {
    let cols = xs.first().map_or(0, |x| x.len());
    for_each_chunk(xs.len(), 1, out, &|first, outs| {
        for (x, out) in xs.iter().zip(outs.iter_mut()) {
            let weight = &weight[first * cols..(first + out.len()) * cols];
            rows_dot(weight, x, out);
        }
    });
}

/// Columns a bf16 product takes as pairs: [`paired_columns`].
pub const PAIRED_COLUMNS: usize = 32;

/// `x` (rows of `cols`) with each whole block of [`PAIRED_COLUMNS`] columns laid out as its
/// even columns, then its odd ones; the columns past the last whole block as they are.
///
/// The order a bf16 weight's product takes on x86-64, the decode kernel's and the prompt
/// tiles' alike: lane `l` of sixteen adds columns `2l`, then `2l + 1`, of each block. A
/// bf16 value is the top half of its f32, so a vector of 32 of them read as sixteen 32-bit
/// words is the odd columns' f32 values once the low halves are masked off, and the even
/// ones' once shifted up: two instructions for 32 weights, where widening sixteen to f32
/// takes two (a 1.7B BF16 file's prompts spent a third of their tile's instructions on it).
/// The activations, read once per product, are put in the weights' order instead.
pub fn paired_columns(x: &[f32], cols: usize) -> CacheLines<f32> {
    let mut paired = CacheLines::copy_of(x);
    for (row, out) in x
        .chunks_exact(cols.max(1))
        .zip(paired.chunks_exact_mut(cols.max(1)))
    {
        pair_columns(row, out);
    }
    paired
}

/// One row of [`paired_columns`]: `row`'s values written to `out` in that order.
pub fn pair_columns<T: Copy>(row: &[T], out: &mut [T]) {
    let (blocks, tail) = row.as_chunks::<PAIRED_COLUMNS>();
    let (outs, out_tail) = out.as_chunks_mut::<PAIRED_COLUMNS>();
    for (block, out) in blocks.iter().zip(outs) {
        let (even, odd) = out.split_at_mut(PAIRED_COLUMNS / 2);
        for ((pair, even), odd) in block.as_chunks::<2>().0.iter().zip(even).zip(odd) {
            (*even, *odd) = (pair[0], pair[1]);
        }
    }
    out_tail.copy_from_slice(tail);
}

/// Where [`paired_columns`] puts column `col` of a row of `cols`.
pub const fn paired_column(cols: usize, col: usize) -> usize {
    if col >= cols / PAIRED_COLUMNS * PAIRED_COLUMNS {
        return col;
    }
    let within = col % PAIRED_COLUMNS;
    col - within + within % 2 * (PAIRED_COLUMNS / 2) + within / 2
}

/// Rows of 8-bit integers with one f32 scale, and maybe an offset, per `block` consecutive
/// weights of a row (the symmetric per-block scheme of `--precision q8`, and the integer
/// types of GGUF files).
///
/// Burn 0.22 multiplies a quantized weight by dequantizing all of it first, on every call;
/// reading the integers directly moves a quarter of the f32 bytes instead. The offsets add
/// `offset · Σ x` per block, from the activations' block sums formed once.
fn quantized(
    weight: Ints<'_>,
    scales: Factors<'_>,
    offsets: Option<Factors<'_>>,
    block: usize,
    xs: &[&[f32]],
    out: &mut [f32],
) {
    let cols = xs.first().map_or(0, |x| x.len());
    assert!(
        block > 0
            && cols.is_multiple_of(block)
            && scales.len() * block == weight.len()
            && offsets.is_none_or(|offsets| offsets.len() == scales.len())
            && weight.read_in(block),
        "matvec: 8-bit weights, scales, offsets and block do not fit [rows, x.len()]"
    );
    let blocks_per_row = cols / block;
    let block_range =
        |first: usize, len: usize| first * blocks_per_row..(first + len) * blocks_per_row;
    let stepped = read_stepped(block, scales, offsets);
    let kernel = integer_kernel(weight, block)
        .map(|kernel| kernel_for_rows(kernel, weight, stepped, xs.len()));
    let integer: Vec<IntegerActivations> = match kernel {
        Some(kernel) => xs
            .iter()
            .map(|x| IntegerActivations::of(x, weight, block, kernel, stepped))
            .collect(),
        None => Vec::new(),
    };
    // The rounding forms the block sums too; the portable kernel reads `x` as it is.
    let sums: Vec<Vec<f32>> = match (offsets, kernel) {
        (Some(_), None) => xs
            .iter()
            .map(|x| x.chunks_exact(block).map(|x| x.iter().sum()).collect())
            .collect(),
        _ => Vec::new(),
    };
    for_each_chunk(xs.len(), weight.rows_together(), out, &|first, outs| {
        FACTORS.with_borrow_mut(|buffer| {
            let len = outs.first().map_or(0, |out| out.len());
            let weight = weight.rows(first, len, cols);
            let blocks = block_range(first, len);
            let scales = scales.range(blocks.clone());
            let offsets = offsets.map(|offsets| offsets.range(blocks));
            match kernel {
                // SAFETY: the kernel runs on this CPU, checked above; the sizes are checked
                // at the top.
                Some(kernel) => unsafe {
                    rows_dot_integers(
                        kernel, weight, scales, offsets, stepped, buffer, &integer, outs,
                    )
                },
                None => {
                    for (v, out) in outs.iter_mut().enumerate() {
                        let scales = scales.f32s(0..scales.len(), buffer);
                        rows_dot_integer_portable(weight, scales, block, xs[v], out);
                        if let (Some(offsets), Some(sums)) = (offsets, sums.get(v)) {
                            add_offset_terms(offsets, sums, buffer, out);
                        }
                    }
                }
            }
        });
    });
}

thread_local! {
    /// Each thread's f32 copy of the factors of the rows it multiplies where the kernel does
    /// not read them as stored: offsets not in f32, scales in neither f16 nor f32 (and for the
    /// portable kernel, scales not in f32); for the AVX-512 kernel, a group of rows' factors
    /// times the activations' scales and sums.
    static FACTORS: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

impl<'a> Ints<'a> {
    /// Rows `first..first + len` of `cols` values each.
    fn rows(self, first: usize, len: usize, cols: usize) -> Ints<'a> {
        let together = self.rows_together();
        debug_assert!(
            first.is_multiple_of(together) && len.is_multiple_of(together),
            "whole groups of interleaved rows"
        );
        match self {
            Self::Bytes(values) => Self::Bytes(&values[first * cols..(first + len) * cols]),
            Self::Nibbles { values, zero } => Self::Nibbles {
                values: &values[first * cols / 2..(first + len) * cols / 2],
                zero,
            },
            Self::FiveBits {
                nibbles,
                high,
                zero,
            } => Self::FiveBits {
                nibbles: &nibbles[first * cols / 2..(first + len) * cols / 2],
                high: &high[first * cols / NIBBLE_BLOCK..(first + len) * cols / NIBBLE_BLOCK],
                zero,
            },
            Self::SixBits {
                nibbles,
                crumbs,
                zero,
            } => Self::SixBits {
                nibbles: &nibbles[first * cols / 2..(first + len) * cols / 2],
                crumbs: &crumbs[first * cols / 4..(first + len) * cols / 4],
                zero,
            },
            Self::Interleaved { values, zero, .. } => Self::Interleaved {
                values: &values[first * cols / 2..(first + len) * cols / 2],
                zero,
                cols,
            },
            Self::SixBitsInterleaved {
                nibbles,
                crumbs,
                zero,
                ..
            } => Self::SixBitsInterleaved {
                nibbles: &nibbles[first * cols / 2..(first + len) * cols / 2],
                crumbs: &crumbs[first * cols / 4..(first + len) * cols / 4],
                zero,
                cols,
            },
            Self::FiveBitsInterleaved {
                nibbles,
                high,
                zero,
                ..
            } => Self::FiveBitsInterleaved {
                nibbles: &nibbles[first * cols / 2..(first + len) * cols / 2],
                high: &high[first * cols / NIBBLE_BLOCK..(first + len) * cols / NIBBLE_BLOCK],
                zero,
                cols,
            },
            Self::BytesInterleaved { values, .. } => Self::BytesInterleaved {
                values: &values[first * cols..(first + len) * cols],
                cols,
            },
        }
    }

    /// Rows that lie together and are split between threads together.
    fn rows_together(self) -> usize {
        match self {
            Self::Interleaved { .. }
            | Self::SixBitsInterleaved { .. }
            | Self::FiveBitsInterleaved { .. }
            | Self::BytesInterleaved { .. } => INTERLEAVED_ROWS,
            _ => 1,
        }
    }
}

/// The activations of an 8-bit product as 16-bit integers, with one f32 scale per `block`
/// (the weights' blocks): `x[c] ≈ scales[c / block] · values[c]`.
///
/// Integer products let the CPU multiply sixteen weights by sixteen activations and add
/// them in pairs in one instruction, where widening each weight to f32 first took three: in
/// a C replica on two cores the widening kernel read 20 GB/s where a plain read of the same
/// bytes ran at 26. Each activation is off by at most half a step, 1/65534 of its block's
/// largest magnitude: two orders of magnitude below the weights' own 8-bit rounding.
pub struct BlockInts {
    pub values: Vec<i16>,
    pub scales: Vec<f32>,
    /// Each block's sum of the activations as given, for the weights' offsets.
    pub sums: Vec<f32>,
    block: usize,
}

/// Blocks rounded per task at least: a decode step's activations (18 to 48 blocks) are
/// rounded on the calling thread, a prompt's (thousands) on every thread, where rounding on
/// one thread alone was 4% of a prompt's time.
const MIN_BLOCKS_PER_PART: usize = 64;

impl BlockInts {
    pub fn of(x: &[f32], block: usize) -> Self {
        Self::within(x, block, i16::MAX)
    }

    /// `x` rounded per block to integers from `-largest` to `largest`.
    pub fn within(x: &[f32], block: usize, largest: i16) -> Self {
        let mut values = vec![0; x.len()];
        let mut scales = vec![0.0; x.len() / block];
        let mut sums = vec![0.0; x.len() / block];
        let (shared_scales, shared_sums) =
            (SharedOutput::new(&mut scales), SharedOutput::new(&mut sums));
        split_rows(
            &mut values,
            block,
            MIN_BLOCKS_PER_PART,
            &|first, values: &mut [i16]| {
                let x = &x[first * block..first * block + values.len()];
                let blocks = x.chunks_exact(block).zip(values.chunks_exact_mut(block));
                for (b, (x, values)) in blocks.enumerate() {
                    let Rounded { scale, sum } = round_block(x, values, largest);
                    // SAFETY: block `first + b` lies inside `scales` and `sums` (one per block
                    // of `x`), and `split_rows` gives each block to one task alone.
                    unsafe {
                        *shared_scales.at(first + b) = scale;
                        *shared_sums.at(first + b) = sum;
                    }
                }
            },
        );
        Self {
            values,
            scales,
            sums,
            block,
        }
    }

    /// Each block's values' sum times `zero`: what a block of weights stored with that zero
    /// point (4-bit ones, widened as they are stored) adds to the block's integer sum.
    pub fn zero_sums(&self, zero: u8) -> Vec<i32> {
        (self.values.chunks_exact(self.block))
            .map(|block| i32::from(zero) * block.iter().map(|&v| i32::from(v)).sum::<i32>())
            .collect()
    }
}

/// Where block `b` of a row of 4-bit values (or 6-bit values' nibbles) starts, in bytes.
/// `b * NIBBLE_BLOCK / 2` may wrap before it halves, so the compiler kept a shift and a mask
/// for every load of the AVX2 4-bit loop (8% of its instructions, counted by callgrind).
const fn nibble_block_offset(b: usize) -> usize {
    b * (NIBBLE_BLOCK / 2)
}

/// Where the decode kernels' vector `k` of a block's widened 4-bit values finds the value for
/// its 16-bit lane `2w` or `2w + 1`: value `2w` plus this. A lane of the stored nibbles holds
/// bytes `2w` and `2w + 1`, that is values `2w`, `2w + 16`, `2w + 1` and `2w + 17`, which one
/// mask or shift each takes out.
const NIBBLE_POSITIONS: [usize; 4] = [0, 16, 1, 17];

/// Activations for blocks of 32 4-bit weights as the decode kernels widen `together` blocks
/// of weights to a vector, appended to `out`: per `together` blocks, four vectors, vector
/// `k` holding for each block in turn its values `2w + NIBBLE_POSITIONS[k]`, `w` in `0..8`.
/// `values` holds whole groups of `together` blocks.
fn nibble_lanes(values: &[i16], together: usize, out: &mut Vec<i16>) {
    for group in values.chunks_exact(together * NIBBLE_BLOCK) {
        for position in NIBBLE_POSITIONS {
            for block in group.chunks_exact(NIBBLE_BLOCK) {
                out.extend((0..8).map(|w| block[2 * w + position]));
            }
        }
    }
}

/// One block's scale and sum.
struct Rounded {
    scale: f32,
    sum: f32,
}

/// Rounds one block to integers, to nearest with ties to even. Written out for AVX2 for
/// blocks of 16 and 32, where the compiled loop took a scalar maximum and a saturating
/// conversion per element: 4% of a prompt's time.
fn round_block(x: &[f32], values: &mut [i16], limit: i16) -> Rounded {
    #[cfg(target_arch = "x86_64")]
    {
        if x.len().is_multiple_of(16) && features::cpu().avx2 {
            // SAFETY: the CPU has AVX2 and FMA, and the block is whole vectors of 16.
            return unsafe { round_block_avx2(x, values, limit) };
        }
    }
    let largest = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let scale = largest / f32::from(limit);
    let inverse = if scale > 0.0 { 1.0 / scale } else { 0.0 };
    for (q, v) in values.iter_mut().zip(x) {
        *q = (v * inverse).round_ties_even() as i16;
    }
    Rounded {
        scale,
        sum: x.iter().sum(),
    }
}

/// # Safety
/// The CPU must have AVX2 and FMA; `x` and `values` must hold the same multiple of 16.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn round_block_avx2(x: &[f32], values: &mut [i16], limit: i16) -> Rounded {
    use std::arch::x86_64::*;

    use crate::model::cpu::math::horizontal_sum;
    let magnitude = _mm256_set1_ps(f32::from_bits(0x7FFF_FFFF));
    let (mut largest, mut sum) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    for eight in x.chunks_exact(8) {
        // SAFETY: eight values lie at `eight`.
        let v = unsafe { _mm256_loadu_ps(eight.as_ptr()) };
        largest = _mm256_max_ps(largest, _mm256_and_ps(v, magnitude));
        sum = _mm256_add_ps(sum, v);
    }
    let quad = _mm_max_ps(
        _mm256_castps256_ps128(largest),
        _mm256_extractf128_ps::<1>(largest),
    );
    let pair = _mm_max_ps(quad, _mm_movehl_ps(quad, quad));
    let largest = _mm_cvtss_f32(_mm_max_ss(pair, _mm_movehdup_ps(pair)));
    let scale = largest / f32::from(limit);
    let inverse = _mm256_set1_ps(if scale > 0.0 { 1.0 / scale } else { 0.0 });
    for (x, values) in x.chunks_exact(16).zip(values.chunks_exact_mut(16)) {
        // SAFETY: sixteen values lie at `x` and at `values`.
        unsafe {
            let low = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x.as_ptr()), inverse));
            let high =
                _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x.as_ptr().add(8)), inverse));
            // Packing works within 128-bit lanes; the permutation puts the halves in order.
            let packed = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packs_epi32(low, high));
            _mm256_storeu_si256(values.as_mut_ptr().cast(), packed);
        }
    }
    Rounded {
        scale,
        sum: horizontal_sum(sum),
    }
}

/// The integer kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum IntegerKernel {
    /// 4-bit and stepped 6-bit weights multiplied as bytes with `vnni` where there is one
    /// (see `integer_vnni`).
    Avx2 { vnni: Option<Vnni> },
    /// See [`integer_avx512`].
    Avx512 { vnni: bool },
    /// 4-bit and stepped 6-bit weights held interleaved, and on AVX2 alone 5- and 8-bit ones.
    Interleaved(Interleaving),
}

/// The vectors the kernel of interleaved weights reads a line in, and how it multiplies
/// bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Interleaving {
    /// A line at once, sixteen rows, with AVX-512 VNNI (see [`integer_interleaved`]).
    Avx512Vnni,
    /// Half a line at a time, eight rows, with AVX-VNNI (see
    /// [`integer_interleaved_avx_vnni`]).
    AvxVnni,
    /// Half a line at a time, eight rows, as 16-bit values, where there is no VNNI (see
    /// [`integer_interleaved_avx2`]).
    Avx2,
}

impl Interleaving {
    /// The widest this CPU has, if any.
    fn of(cpu: Features) -> Option<Self> {
        match cpu {
            Features {
                avx512_vnni: true, ..
            } => Some(Self::Avx512Vnni),
            Features { avx_vnni: true, .. } => Some(Self::AvxVnni),
            Features {
                avx2: true,
                avx512: false,
                ..
            } => Some(Self::Avx2),
            _ => None,
        }
    }
}

/// VNNI's products of bytes: 256-bit in AVX-512's encoding (with VL) or AVX-VNNI's, which
/// Intel's laptops since Alder Lake have without AVX-512, or 512-bit (`Wide`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Vnni {
    Avx512,
    Avx,
    Wide,
}

impl Vnni {
    /// The blocks of weights one vector holds, which the activations are split by.
    fn blocks_per_vector(self) -> usize {
        match self {
            Vnni::Avx512 | Vnni::Avx => 2,
            Vnni::Wide => 4,
        }
    }
}

/// The fastest integer kernel this CPU has for `values` in blocks of `block`: bytes in
/// blocks of 32 (`--precision q8` and most GGUF types) or 16 (GGUF's Q6_K), 4- and 5-bit
/// values in blocks of 32, 6-bit ones in blocks of 16; interleaved values, the kernel they
/// were laid out for. Other blocks take the portable kernel.
fn integer_kernel(values: Ints<'_>, block: usize) -> Option<IntegerKernel> {
    let cpu = features::cpu();
    if values.rows_together() > 1 {
        // 5- and 8-bit values are laid out for the AVX2 kernel alone.
        let avx2_alone = matches!(
            values,
            Ints::FiveBitsInterleaved { .. } | Ints::BytesInterleaved { .. }
        );
        let interleaving = Interleaving::of(cpu).filter(|&interleaving| {
            values.read_in(block) && (!avx2_alone || interleaving == Interleaving::Avx2)
        });
        return interleaving.map(IntegerKernel::Interleaved);
    }
    let fits = match values {
        Ints::Bytes(_) => matches!(block, 16 | 32),
        packed => packed.read_in(block),
    };
    if !cpu.avx2 || !fits {
        return None;
    }
    match cpu.avx512 {
        true => Some(IntegerKernel::Avx512 {
            vnni: cpu.avx512_vnni,
        }),
        false => Some(IntegerKernel::Avx2 { vnni: None }),
    }
}

/// The VNNI the AVX2 kernel multiplies `values` with, `stepped` or not: 4-bit weights' and
/// stepped 6-bit ones' on a CPU that has one, in 512-bit vectors where they cost no more
/// than 256-bit ones (`Features::wide`): there they decoded a 1.7B Q4_0 file 1.10× as fast,
/// Q4_K_M 1.05× and Q6_K level, bound by memory on two cores (AMD EPYC, family 26).
fn avx2_vnni(values: Ints<'_>, stepped: bool) -> Option<Vnni> {
    let cpu = features::cpu();
    let as_bytes = match values {
        Ints::Nibbles { .. } => true,
        Ints::SixBits { .. } => stepped,
        _ => false,
    };
    match as_bytes {
        true if cpu.avx512_vnni && cpu.wide => Some(Vnni::Wide),
        true if cpu.avx512_vnni => Some(Vnni::Avx512),
        true if cpu.avx_vnni => Some(Vnni::Avx),
        _ => None,
    }
}

/// The kernel for `rows` activation rows of `weight`: [`integer_kernel`]'s, except that one
/// row of 4-bit or stepped 6-bit weights takes the AVX2 kernel on AVX-512 CPUs too, and
/// the AVX2 kernel multiplies those as bytes wherever the CPU has VNNI ([`avx2_vnni`]).
/// Without VNNI it widens them within 128-bit lanes in 256-bit instructions, which three
/// ports run where 512-bit ones have two, and decoded a 1.7B Q4_K_M file 1.1× as fast as
/// the AVX-512 kernel, Q6_K and Q4_0 1.2× (Intel Xeon family 6 model 207); as bytes, a
/// further 1.2–1.26× for Q4_K_M and Q6_K. One row of bytes (Q8_0's, `--precision q8`'s)
/// takes the AVX2 kernel on AMD's cores (`Features::wide`), where it decoded a 1.7B Q8_0
/// file 1.29× as fast as the AVX-512 kernel and the 135M one 1.04× (AMD EPYC, family 26).
/// Several rows keep the AVX-512 kernel, whose 16-bit products take two instructions per
/// 64 weights and further row where bytes take five. Every kernel gives the same bits.
fn kernel_for_rows(
    kernel: IntegerKernel,
    weight: Ints<'_>,
    stepped: bool,
    rows: usize,
) -> IntegerKernel {
    let one_row_on_avx2 = match weight {
        Ints::Nibbles { .. } => true,
        Ints::SixBits { .. } => stepped,
        Ints::Bytes(_) => features::cpu().wide,
        _ => false,
    };
    match kernel {
        IntegerKernel::Interleaved(_) => kernel,
        IntegerKernel::Avx512 { .. } if rows > 1 || !one_row_on_avx2 => kernel,
        _ => IntegerKernel::Avx2 {
            vnni: avx2_vnni(weight, stepped),
        },
    }
}

/// The activations rounded for an integer kernel, and as it reads them.
struct IntegerActivations {
    ints: BlockInts,
    /// For the AVX2 kernel.
    #[cfg(target_arch = "x86_64")]
    avx2: Option<integer_avx2::Activations>,
    /// For the AVX-512 kernel.
    #[cfg(target_arch = "x86_64")]
    avx512: Option<integer_avx512::Activations>,
    /// For the kernel of interleaved weights.
    #[cfg(target_arch = "x86_64")]
    interleaved: Option<integer_interleaved::Activations>,
}

impl IntegerActivations {
    /// For `values` in blocks of `block`, `stepped` (see [`read_stepped`]) or not.
    fn of(x: &[f32], values: Ints<'_>, block: usize, kernel: IntegerKernel, stepped: bool) -> Self {
        let ints = match stepped {
            true => BlockInts::within(x, 2 * block, STEPPED_LARGEST),
            false => BlockInts::of(x, block),
        };
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (values, kernel);
        Self {
            #[cfg(target_arch = "x86_64")]
            avx2: match kernel {
                IntegerKernel::Avx2 { vnni } => {
                    Some(integer_avx2::Activations::of(&ints, values, vnni))
                }
                IntegerKernel::Avx512 { .. } | IntegerKernel::Interleaved(_) => None,
            },
            #[cfg(target_arch = "x86_64")]
            interleaved: match (kernel, values) {
                (
                    IntegerKernel::Interleaved(interleaving),
                    Ints::Interleaved { .. }
                    | Ints::SixBitsInterleaved { .. }
                    | Ints::FiveBitsInterleaved { .. }
                    | Ints::BytesInterleaved { .. },
                ) => {
                    // The zero point, and the values each zero sum takes (bytes have none).
                    let (zero, zeroed) = match values {
                        Ints::SixBitsInterleaved { zero, .. } => (zero, SIX_BIT_BLOCK),
                        Ints::Interleaved { zero, .. } | Ints::FiveBitsInterleaved { zero, .. } => {
                            (zero, NIBBLE_BLOCK)
                        }
                        _ => (0, NIBBLE_BLOCK),
                    };
                    let as_bytes = interleaving != Interleaving::Avx2;
                    let prepared =
                        integer_interleaved::Activations::of(&ints, zero, zeroed, as_bytes);
                    Some(prepared)
                }
                _ => None,
            },
            #[cfg(target_arch = "x86_64")]
            avx512: matches!(kernel, IntegerKernel::Avx512 { .. }).then(|| {
                use integer_avx512::{Activations, Reading};
                let reading = match (stepped, values) {
                    (true, _) => Reading::InOrder,
                    (false, Ints::Nibbles { .. }) => Reading::Quads,
                    (false, _) => Reading::Pairs,
                };
                Activations::of(&ints, reading)
            }),
            ints,
        }
    }
}

/// Whether integer weights in blocks of `block` with these factors are read as blocks of
/// twice the size: blocks of 16 without offsets whose pairs of factors share a base (Q6_K's),
/// multiplied by their steps (as they are widened, or per half's sum) so that a pair takes one
/// scale, the base.
/// One conversion and scaling per 32 values, not per 16, with the activations rounded to
/// [`STEPPED_LARGEST`] per 32 instead of 16 bits per 16.
pub fn read_stepped(block: usize, scales: Factors<'_>, offsets: Option<Factors<'_>>) -> bool {
    block == 16 && offsets.is_none() && scales.pairs_share_bases()
}

/// The activations' bound where the weights are read stepped: a block of 32 then sums
/// products of at most 16383 · 32 · 128 (a 6-bit value times an 8-bit step), and 32 of them
/// stay below 2³¹.
pub const STEPPED_LARGEST: i16 = 16383;

/// Adds `W x` to `out` for each activation row `x` of `xs` and its `out` of `outs` with the
/// integer `kernel`, offsets included (`offset · Σ x` per block, from the activations' block
/// sums), up to [`integer_avx512::TOGETHER`] rows at once: the weights are widened once for
/// all of them, which costs the later rows only their products, and each row's sums are the
/// ones it gets alone.
///
/// # Safety
/// `kernel` must be one that [`integer_kernel`] gives for `weight` and the activations'
/// block (or a slower one this CPU runs), each `x` hold `cols` values rounded in blocks (as
/// [`IntegerActivations::of`] rounds them for `stepped`), `weight` `out.len()` rows of
/// `cols` values and `scales` and `offsets` one per block. The AVX2 kernels read f16 and f32
/// scales in the loop, others widened into `buffer` first; the AVX-512 kernel multiplies a
/// group of rows' scales by the activations' scales into `buffer` first.
#[allow(clippy::too_many_arguments)]
unsafe fn rows_dot_integers(
    kernel: IntegerKernel,
    weight: Ints<'_>,
    scales: Factors<'_>,
    offsets: Option<Factors<'_>>,
    stepped: bool,
    buffer: &mut Vec<f32>,
    xs: &[IntegerActivations],
    outs: &mut [&mut [f32]],
) {
    let at_once = integer_avx512::TOGETHER;
    for (xs, outs) in xs.chunks(at_once).zip(outs.chunks_mut(at_once)) {
        let kernel = (kernel, weight, scales, offsets, stepped);
        // SAFETY: the caller's guarantees are the kernel's.
        unsafe {
            match xs.len() {
                1 => rows_dot_together::<1>(kernel, xs, buffer, outs),
                2 => rows_dot_together::<2>(kernel, xs, buffer, outs),
                3 => rows_dot_together::<3>(kernel, xs, buffer, outs),
                _ => rows_dot_together::<4>(kernel, xs, buffer, outs),
            }
        }
    }
}

/// A kernel and the weight it multiplies, with its factors and whether it is read stepped.
type KernelOn<'a> = (
    IntegerKernel,
    Ints<'a>,
    Factors<'a>,
    Option<Factors<'a>>,
    bool,
);

/// [`rows_dot_integers`]' work for a group of `V` activation rows.
///
/// # Safety
/// As for [`rows_dot_integers`]; `xs` and `outs` hold `V` rows each.
unsafe fn rows_dot_together<const V: usize>(
    (kernel, weight, scales, offsets, stepped): KernelOn<'_>,
    xs: &[IntegerActivations],
    buffer: &mut Vec<f32>,
    outs: &mut [&mut [f32]],
) {
    let (Ok(xs), Ok(outs)) = (<&[_; V]>::try_from(xs), <&mut [_; V]>::try_from(outs)) else {
        unreachable!("the caller passes V activation rows and V outputs");
    };
    #[cfg(target_arch = "x86_64")]
    {
        if let IntegerKernel::Interleaved(interleaving) = kernel {
            use integer_interleaved::Lines;
            let xs = xs.each_ref().map(|x| match &x.interleaved {
                Some(prepared) => (&x.ints, prepared),
                None => unreachable!("the interleaved kernel's activations are prepared for it"),
            });
            let rows_dot = match interleaving {
                Interleaving::Avx512Vnni => integer_interleaved::rows_dot::<V>,
                Interleaving::AvxVnni => integer_interleaved_avx_vnni::rows_dot::<V>,
                Interleaving::Avx2 => integer_interleaved_avx2::rows_dot::<V>,
            };
            // SAFETY: the caller's guarantees are the kernel's.
            return unsafe {
                match (weight, scales) {
                    (Ints::Interleaved { values, .. }, _) => {
                        rows_dot(Lines::Nibbles(values), scales, offsets, xs, buffer, outs)
                    }
                    (Ints::FiveBitsInterleaved { nibbles, high, .. }, _) => {
                        let lines = Lines::FiveBits { nibbles, high };
                        rows_dot(lines, scales, offsets, xs, buffer, outs)
                    }
                    (Ints::BytesInterleaved { values, .. }, _) => {
                        rows_dot(Lines::Bytes(values), scales, offsets, xs, buffer, outs)
                    }
                    (
                        Ints::SixBitsInterleaved {
                            nibbles, crumbs, ..
                        },
                        Factors::Scaled { steps, .. },
                    ) if stepped => {
                        let lines = Lines::SixBits {
                            nibbles,
                            crumbs,
                            steps,
                            factors: scales,
                        };
                        with_pair_bases(scales, |bases| {
                            rows_dot(lines, bases, None, xs, buffer, outs)
                        })
                    }
                    _ => unreachable!("the interleaved kernel reads what was laid out for it"),
                }
            };
        }
        let prepared: Option<Vec<(&BlockInts, &integer_avx512::Activations)>> = xs
            .iter()
            .map(|x| Some((&x.ints, x.avx512.as_ref()?)))
            .collect();
        // SAFETY: the caller's guarantees are the kernels'.
        unsafe {
            match (kernel, prepared.map(<[_; V]>::try_from)) {
                (IntegerKernel::Avx512 { vnni: true }, Some(Ok(xs))) => {
                    integer_avx512::rows_dot_vnni::<V>(
                        weight, scales, offsets, stepped, xs, buffer, outs,
                    )
                }
                (IntegerKernel::Avx512 { vnni: false }, Some(Ok(xs))) => {
                    integer_avx512::rows_dot::<V>(
                        weight, scales, offsets, stepped, xs, buffer, outs,
                    )
                }
                (kernel, _) => {
                    let vnni = match kernel {
                        IntegerKernel::Avx2 { vnni } => vnni,
                        IntegerKernel::Avx512 { .. } | IntegerKernel::Interleaved(_) => None,
                    };
                    let xs = xs.each_ref().map(|x| match &x.avx2 {
                        Some(prepared) => (&x.ints, prepared),
                        None => unreachable!("the AVX2 kernel's activations are prepared for it"),
                    });
                    integer_avx2::rows_dot::<V>(
                        weight, scales, offsets, stepped, vnni, buffer, xs, outs,
                    )
                }
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (kernel, weight, scales, offsets, stepped, xs, buffer, outs);
        unreachable!("integer_kernel is None off x86-64");
    }
}

/// Stepped factors (see [`read_stepped`]) as one factor per pair of blocks, the pair's base,
/// as the kernels scale a pair read as one block: `with` gets them.
fn with_pair_bases<R>(scales: Factors<'_>, with: impl FnOnce(Factors<'_>) -> R) -> R {
    thread_local! {
        /// Steps of one for the pairs' factors; it only grows.
        static ONES: RefCell<Vec<i8>> = const { RefCell::new(Vec::new()) };
    }
    ONES.with_borrow_mut(|ones| {
        let pairs = scales.len() / 2;
        if ones.len() < pairs {
            ones.resize(pairs, 1);
        }
        match scales {
            Factors::Scaled {
                bases, first, per, ..
            } => with(Factors::Scaled {
                bases,
                steps: &ones[..pairs],
                first: first / 2,
                per: per / 2,
            }),
            other => with(other),
        }
    })
}

/// Adds `Σ_b offsets[r, b] · sums[b]` to each row `r` of `out`: the weights' offsets times the
/// activations' block sums. The offsets are widened into `buffer` where not in f32.
fn add_offset_terms(offsets: Factors<'_>, sums: &[f32], buffer: &mut Vec<f32>, out: &mut [f32]) {
    let offsets = offsets.f32s(0..offsets.len(), buffer);
    for (y, offsets) in out.iter_mut().zip(offsets.chunks_exact(sums.len())) {
        *y += dot(offsets, sums);
    }
}

fn rows_dot_integer_portable(
    weight: Ints<'_>,
    scales: &[f32],
    block: usize,
    x: &[f32],
    out: &mut [f32],
) {
    let blocks_per_row = x.len() / block;
    let mut unpacked = [0; NIBBLE_BLOCK];
    for (row, y) in out.iter_mut().enumerate() {
        *y += x
            .chunks_exact(block)
            .enumerate()
            .map(|(b, x)| {
                let b = row * blocks_per_row + b;
                let q = weight.block(b, block, &mut unpacked);
                scales[b] * q.iter().zip(x).map(|(&q, x)| f32::from(q) * x).sum::<f32>()
            })
            .sum::<f32>();
    }
}

type RowsDot<W> = fn(&[W], &[f32], &mut [f32]);

fn rows_dot_for_this_cpu<W: HostFloat>() -> RowsDot<W> {
    rows_dot_vectorized().unwrap_or(rows_dot_portable)
}

/// The hand-vectorized kernel, where the CPU has what it needs.
fn rows_dot_vectorized<W: HostFloat>() -> Option<RowsDot<W>> {
    #[cfg(target_arch = "x86_64")]
    {
        if features::cpu().avx2 {
            // SAFETY: the CPU supports the kernel's features, checked just above.
            return Some(|weight, x, out| unsafe { avx2::rows_dot(weight, x, out) });
        }
    }
    None
}

/// Any CPU: plain loops with independent partial sums, which compilers vectorize.
fn rows_dot_portable<W: HostFloat>(weight: &[W], x: &[f32], out: &mut [f32]) {
    const LANES: usize = 16;
    for (row, y) in weight.chunks_exact(x.len()).zip(out) {
        let (row_blocks, row_tail) = row.as_chunks::<LANES>();
        let (x_blocks, x_tail) = x.as_chunks::<LANES>();
        let mut acc = [0.0f32; LANES];
        for (w, x) in row_blocks.iter().zip(x_blocks) {
            for lane in 0..LANES {
                acc[lane] += w[lane].to_f32() * x[lane];
            }
        }
        let tail: f32 = row_tail
            .iter()
            .zip(x_tail)
            .map(|(&w, x)| w.to_f32() * x)
            .sum();
        *y += acc.iter().sum::<f32>() + tail;
    }
}

#[cfg(target_arch = "x86_64")]
mod integer_avx2;
#[cfg(target_arch = "x86_64")]
mod integer_avx512;
#[cfg(target_arch = "x86_64")]
mod integer_interleaved;
#[cfg(target_arch = "x86_64")]
mod integer_interleaved_avx2;
#[cfg(target_arch = "x86_64")]
mod integer_interleaved_avx_vnni;
#[cfg(target_arch = "x86_64")]
mod integer_vnni;

#[cfg(target_arch = "x86_64")]
pub(super) mod avx2 {
    use std::arch::x86_64::*;

    use half::bf16;

    use super::HostFloat;
    use crate::model::cpu::math::sum_of_sixteen;

    /// How far ahead of the weights being read the kernels ask for the next ones, in bytes.
    /// The hardware prefetcher restarts on every range of every matrix, and a decode step is
    /// ~600 ranges of 10–200 KB; asking ahead hides that ramp. In a C replica of a decode
    /// step's products on two cores, alternated within one run, it cut the time by 10%
    /// (bf16, 1 KB ahead) and 13% (8-bit, 2 KB ahead). The lane tiles (`matmul/lane_tiles.rs`)
    /// ask as far ahead in a decode step.
    pub(in crate::model::cpu) const PREFETCH_BYTES: usize = 1024;
    pub(super) const PREFETCH_BYTES_Q8: usize = 2048;

    /// Asks for the cache line at `bytes` past `at`, which may lie past the end of the
    /// weights: a prefetch never faults, and `wrapping_add` forms the address without
    /// claiming it is inside the allocation.
    #[inline(always)]
    pub(in crate::model::cpu) fn prefetch<T>(at: *const T, bytes: usize) {
        // SAFETY: a prefetch reads nothing the program can observe and cannot fault.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(at.cast::<i8>().wrapping_add(bytes)) };
    }

    /// Rows read together: four rows' sums in flight hide the latency of the fused
    /// multiply-adds, which one row's sixteen lanes, each added in column order, would wait on.
    const FLOAT_ROWS: usize = 4;

    /// Each row's product with `x`, added to its `out`, in the order every f32 and f16
    /// weight's product takes (the prompt tiles' too): sixteen lanes, lane `l` adding the
    /// products of the columns `c ≡ l (mod 16)` in column order, each fused onto its sum; a
    /// last partial step reads zeros past the columns; then [`sum_of_sixteen`]. A token's
    /// outputs then do not depend on whether it was decoded or read in a prompt.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub fn rows_dot<W: HostFloat>(weight: &[W], x: &[f32], out: &mut [f32]) {
        let cols = x.len();
        let zeros = [_mm256_setzero_ps(); 2];
        for_row_groups(
            weight,
            cols,
            out,
            // SAFETY: `for_row_groups` hands out rows of `cols` values, as many as asked.
            |first| unsafe { row_sums(first, cols, x, 0, [zeros; FLOAT_ROWS]) },
            |first| unsafe { row_sums(first, cols, x, 0, [zeros]) },
        );
    }

    /// [`rows_dot`] for bf16 weights and `x` in pairs ([`super::paired_columns`]): in each
    /// whole block of 32 columns lane `l` adds its columns `2l`, then `2l + 1`; the columns
    /// past the last block are added as `rows_dot` adds them.
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn rows_dot_bf16(weight: &[bf16], x: &[f32], out: &mut [f32]) {
        let cols = x.len();
        for_row_groups(
            weight,
            cols,
            out,
            // SAFETY: `for_row_groups` hands out rows of `cols` values, as many as asked.
            |first| unsafe {
                let (paired, sums) = paired_row_sums::<FLOAT_ROWS>(first, cols, x);
                row_sums(first, cols, x, paired, sums)
            },
            |first| unsafe {
                let (paired, sums) = paired_row_sums::<1>(first, cols, x);
                row_sums(first, cols, x, paired, sums)
            },
        );
    }

    /// Adds to `out` the sums of the rows of `weight` (of `cols` values each) from `group`,
    /// [`FLOAT_ROWS`] rows at a time, and from `one` for the rows left over.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn for_row_groups<W>(
        weight: &[W],
        cols: usize,
        out: &mut [f32],
        group: impl Fn(*const W) -> [f32; FLOAT_ROWS],
        one: impl Fn(*const W) -> [f32; 1],
    ) {
        let groups = weight.chunks_exact(cols.max(1) * FLOAT_ROWS);
        for (group_rows, out) in groups.zip(out.chunks_exact_mut(FLOAT_ROWS)) {
            for (y, sum) in out.iter_mut().zip(group(group_rows.as_ptr())) {
                *y += sum;
            }
        }
        let done = out.len() / FLOAT_ROWS * FLOAT_ROWS;
        let rows = weight.chunks_exact(cols.max(1)).skip(done);
        for (row, y) in rows.zip(&mut out[done..]) {
            let [sum] = one(row.as_ptr());
            *y += sum;
        }
    }

    /// Asks for a line ahead in each of the `R` rows of `cols` values from `first`, when
    /// column `c` starts a 64-byte line of its row.
    #[inline(always)]
    fn prefetch_rows<W, const R: usize>(first: *const W, cols: usize, c: usize) {
        let row_bytes = cols * size_of::<W>();
        // One 64-byte line per 32 bf16 or f16 weights, per 16 f32 ones.
        if (c * size_of::<W>()).is_multiple_of(64) {
            // Past its row's end a row's stream goes on in the row `R` on: the next
            // row is another stream's, already read. Asked there, bf16 decode ran
            // 1.16× as fast at 135M (rows of 1152 bytes) and 1.13× at 1.7B.
            let ahead = match c * size_of::<W>() + PREFETCH_BYTES < row_bytes {
                true => PREFETCH_BYTES,
                false => PREFETCH_BYTES + (R - 1) * row_bytes,
            };
            for r in 0..R {
                prefetch(first.wrapping_add(r * cols + c), ahead);
            }
        }
    }

    /// The running sums (each row's low and high eight lanes) of the `R` bf16 rows of `cols`
    /// values from `first` with the paired `x`, over the whole blocks of 32 columns, and the
    /// columns they cover.
    ///
    /// # Safety
    /// `first` must start `R` consecutive rows of `cols` values, and `x` hold `cols`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn paired_row_sums<const R: usize>(
        first: *const bf16,
        cols: usize,
        x: &[f32],
    ) -> (usize, [[__m256; 2]; R]) {
        let mut sums = [[_mm256_setzero_ps(); 2]; R];
        let paired = cols / super::PAIRED_COLUMNS * super::PAIRED_COLUMNS;
        let high_halves = _mm256_set1_epi32(0xFFFF_0000_u32 as i32);
        let mut c = 0;
        while c < paired {
            prefetch_rows::<bf16, R>(first, cols, c);
            // Lanes 0–7 take the pairs of the block's first sixteen columns, 8–15 the rest's.
            for (half, at) in [c, c + 16].into_iter().enumerate() {
                // SAFETY: `c + 32 <= paired <= cols`, in each row and in `x`.
                unsafe {
                    let x_even = _mm256_loadu_ps(x.as_ptr().add(c + 8 * half));
                    let x_odd = _mm256_loadu_ps(x.as_ptr().add(c + 16 + 8 * half));
                    for (r, sums) in sums.iter_mut().enumerate() {
                        let pairs = _mm256_loadu_si256(first.add(r * cols + at).cast());
                        let even = _mm256_castsi256_ps(_mm256_slli_epi32::<16>(pairs));
                        let odd = _mm256_castsi256_ps(_mm256_and_si256(pairs, high_halves));
                        sums[half] = _mm256_fmadd_ps(even, x_even, sums[half]);
                        sums[half] = _mm256_fmadd_ps(odd, x_odd, sums[half]);
                    }
                }
            }
            c += super::PAIRED_COLUMNS;
        }
        (paired, sums)
    }

    /// The sums of the `R` rows of `cols` values from `first` with `x`, in `rows_dot`'s order,
    /// going on from `sums` at column `from` (a multiple of 16).
    ///
    /// # Safety
    /// `first` must start `R` consecutive rows of `cols` values, and `x` hold `cols`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn row_sums<W: HostFloat, const R: usize>(
        first: *const W,
        cols: usize,
        x: &[f32],
        from: usize,
        sums: [[__m256; 2]; R],
    ) -> [f32; R] {
        let mut low = sums.map(|[low, _]| low);
        let mut high = sums.map(|[_, high]| high);
        let main = cols / 16 * 16;
        // SAFETY (for the block): reads stay below `c + 16 <= main <= cols` in each row and in
        // `x`; the padded tail is read from local copies.
        unsafe {
            let mut c = from;
            while c < main {
                prefetch_rows::<W, R>(first, cols, c);
                let x_low = _mm256_loadu_ps(x.as_ptr().add(c));
                let x_high = _mm256_loadu_ps(x.as_ptr().add(c + 8));
                for r in 0..R {
                    let w = first.add(r * cols + c);
                    low[r] = _mm256_fmadd_ps(W::load8(w), x_low, low[r]);
                    high[r] = _mm256_fmadd_ps(W::load8(w.add(8)), x_high, high[r]);
                }
                c += 16;
            }
            if main < cols {
                let mut x_tail = [0.0f32; 16];
                x_tail[..cols - main].copy_from_slice(&x[main..]);
                let x_low = _mm256_loadu_ps(x_tail.as_ptr());
                let x_high = _mm256_loadu_ps(x_tail.as_ptr().add(8));
                for r in 0..R {
                    let row = std::slice::from_raw_parts(first.add(r * cols + main), cols - main);
                    let mut w_tail = [0.0f32; 16];
                    for (w, &stored) in w_tail.iter_mut().zip(row) {
                        *w = stored.to_f32();
                    }
                    low[r] = _mm256_fmadd_ps(_mm256_loadu_ps(w_tail.as_ptr()), x_low, low[r]);
                    high[r] =
                        _mm256_fmadd_ps(_mm256_loadu_ps(w_tail.as_ptr().add(8)), x_high, high[r]);
                }
            }
        }
        std::array::from_fn(|r| sum_of_sixteen(low[r], high[r]))
    }
}

#[cfg(test)]
mod tests {
    use half::{bf16, f16};

    use super::*;
    use crate::model::cpu::test_values as values;
    use crate::model::cpu::weights::{BlockFactors, IntegerValues, IntegerWeights};

    fn naive(weight: &[f32], x: &[f32]) -> Vec<f32> {
        weight
            .chunks_exact(x.len())
            .map(|row| {
                row.iter()
                    .zip(x)
                    .map(|(&w, &x)| f64::from(w) * f64::from(x))
                    .sum::<f64>() as f32
            })
            .collect()
    }

    /// Every kernel this CPU can run, so that the portable one is tested on x86 too.
    fn kernels<W: HostFloat>() -> Vec<RowsDot<W>> {
        let mut kernels: Vec<RowsDot<W>> = vec![rows_dot_portable];
        kernels.extend(rows_dot_vectorized());
        kernels
    }

    /// The kernels add to what `out` holds: start from ones and take them off again.
    fn run<W: HostFloat>(kernel: RowsDot<W>, weight: &[W], x: &[f32]) -> Vec<f32> {
        let mut out = vec![1.0; weight.len() / x.len()];
        kernel(weight, x, &mut out);
        out.iter().map(|y| y - 1.0).collect()
    }

    /// The product for one activation row, checked to be bit for bit what the same row
    /// gets beside others: second of three, and second and fifth of six (kernels that take
    /// a few rows at once take them four at a time).
    fn product(weight: WeightRows<'_>, x: &[f32]) -> Vec<f32> {
        let rows = weight.len() / x.len();
        let mut out = vec![1.0; rows];
        matvecs(weight, x, 1, &mut out);
        let other = |k: f32| -> Vec<f32> { x.iter().rev().map(|v| v * k - 0.5).collect() };
        for (xs, at) in [
            (vec![other(3.0), x.to_vec(), other(-1.0)], &[1][..]),
            (
                vec![
                    other(3.0),
                    x.to_vec(),
                    other(-1.0),
                    other(0.5),
                    x.to_vec(),
                    other(2.0),
                ],
                &[1, 4][..],
            ),
        ] {
            let vectors = xs.len();
            let mut together = vec![1.0; vectors * rows];
            matvecs(weight, &xs.concat(), vectors, &mut together);
            for &v in at {
                let beside = &together[v * rows..(v + 1) * rows];
                assert!(
                    out.iter()
                        .zip(beside)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{rows} rows: row {v} of {vectors} differs from the row alone"
                );
            }
        }
        out.iter().map(|y| y - 1.0).collect()
    }

    /// `matvec` and every kernel for `W` against the f64 product of the weights as stored.
    fn check<W: HostFloat>(weight: &[W], rows: WeightRows<'_>, x: &[f32], what: &str) {
        let stored: Vec<f32> = weight.iter().map(|w| w.to_f32()).collect();
        let expected = naive(&stored, x);
        let close = |got: &[f32], what: &str| {
            assert_eq!(got.len(), expected.len());
            for (g, e) in got.iter().zip(&expected) {
                assert!(
                    (g - e).abs() <= 1e-4 * (1.0 + e.abs()),
                    "{what}: {g} vs {e}"
                );
            }
        };
        close(&product(rows, x), &format!("matvec {what}"));
        for kernel in kernels::<W>() {
            close(&run(kernel, weight, x), what);
        }
    }

    /// Shapes with tails on both axes: columns not a multiple of the vector width (nor, for
    /// bf16, of its pairs' blocks), rows not a multiple of the task size.
    #[test]
    fn every_kernel_equals_a_float64_reference_for_every_element_type() {
        for (rows, cols) in [(1, 1), (7, 5), (67, 100), (9, 628), (1000, 576), (49, 1536)] {
            let weight = values(rows * cols, 1);
            let x = values(cols, 2);
            let halves: Vec<f16> = weight.iter().map(|&w| f16::from_f32(w)).collect();
            let brains: Vec<bf16> = weight.iter().map(|&w| bf16::from_f32(w)).collect();
            let shape = format!("{rows}x{cols}");
            check(
                &weight,
                WeightRows::F32(&weight),
                &x,
                &format!("f32 {shape}"),
            );
            check(
                &halves,
                WeightRows::F16(&halves),
                &x,
                &format!("f16 {shape}"),
            );
            check(
                &brains,
                WeightRows::Bf16(&brains),
                &x,
                &format!("bf16 {shape}"),
            );
        }
    }

    /// Each whole block of 32 columns of each row becomes its even columns, then its odd
    /// ones; the columns after the last block stay in place.
    #[test]
    fn columns_pair_within_whole_blocks_of_each_row() {
        let cols = 70;
        let x: Vec<f32> = (0..2 * cols).map(|i| (i % cols) as f32).collect();
        let block = |first: usize| (0..16).map(move |i| (first + 2 * i) as f32);
        let row: Vec<f32> = (block(0).chain(block(1)))
            .chain(block(32).chain(block(33)))
            .chain((64..70).map(|c| c as f32))
            .collect();
        assert_eq!(
            *paired_columns(&x, cols),
            [row.clone(), row.clone()].concat()
        );
        for (at, &col) in row.iter().enumerate() {
            assert_eq!(paired_column(cols, col as usize), at, "column {col}");
        }
    }

    /// Every integer kernel this CPU runs for `values`: the AVX2 one with each VNNI
    /// encoding it has for them and without, and the AVX-512 ones up to `fastest`.
    fn integer_kernels_up_to(
        fastest: IntegerKernel,
        values: Ints<'_>,
        stepped: bool,
    ) -> Vec<IntegerKernel> {
        let cpu = features::cpu();
        let as_bytes = avx2_vnni(values, stepped).is_some();
        let encodings = [
            (Vnni::Avx512, cpu.avx512_vnni),
            (Vnni::Avx, cpu.avx_vnni),
            (Vnni::Wide, cpu.avx512_vnni),
        ];
        let mut kernels = vec![IntegerKernel::Avx2 { vnni: None }];
        kernels.extend(
            (encodings.into_iter())
                .filter(|&(_, has)| has && as_bytes)
                .map(|(vnni, _)| IntegerKernel::Avx2 { vnni: Some(vnni) }),
        );
        if let IntegerKernel::Avx512 { vnni } = fastest {
            kernels.push(IntegerKernel::Avx512 { vnni: false });
            if vnni {
                kernels.push(IntegerKernel::Avx512 { vnni: true });
            }
        }
        kernels
    }

    #[test]
    fn one_row_takes_the_avx2_kernel_where_it_decodes_faster() {
        let nibbles = Ints::Nibbles {
            values: &[],
            zero: 8,
        };
        let six_bits = Ints::SixBits {
            nibbles: &[],
            crumbs: &[],
            zero: 32,
        };
        let cpu = features::cpu();
        let widest = IntegerKernel::Avx512 { vnni: true };
        let avx2 = |vnni| IntegerKernel::Avx2 { vnni };
        let vnni = avx2_vnni(nibbles, false);
        assert_eq!(vnni.is_some(), cpu.vnni());
        assert_eq!(vnni == Some(Vnni::Wide), cpu.avx512_vnni && cpu.wide);
        // One row of bytes takes the AVX2 kernel on AMD's cores too.
        let bytes = if cpu.wide { avx2(None) } else { widest };
        for (weight, stepped, rows, kernel) in [
            (nibbles, false, 1, avx2(vnni)),
            (six_bits, true, 1, avx2(vnni)),
            (nibbles, false, 4, widest),
            (six_bits, false, 1, widest),
            (Ints::Bytes(&[]), false, 1, bytes),
            (Ints::Bytes(&[]), false, 4, widest),
        ] {
            assert_eq!(kernel_for_rows(widest, weight, stepped, rows), kernel);
        }
        // Without AVX-512, 4-bit and stepped 6-bit weights are multiplied as bytes
        // wherever there is a VNNI, for any number of rows.
        for (weight, stepped, as_bytes) in [
            (nibbles, false, true),
            (six_bits, true, true),
            (six_bits, false, false),
            (Ints::Bytes(&[]), false, false),
        ] {
            for rows in [1, 4] {
                let kernel = kernel_for_rows(avx2(None), weight, stepped, rows);
                assert_eq!(kernel, avx2(vnni.filter(|_| as_bytes)));
            }
        }
    }

    /// Each integer path against the f64 product of the values it reads: the weights as
    /// stored, and the activations as given (portable) or as rounded to 16 bits (integer);
    /// bytes, nibbles and five bits (Q4_0's and Q5_0's centred ones without offsets, others
    /// with) and six bits (Q6_K's, centred), with and without offsets, for the blocks of
    /// `--precision q8` and GGUF files and others.
    #[test]
    fn every_integer_path_equals_the_product_of_what_it_reads() {
        #[cfg(target_arch = "x86_64")]
        for (values, block) in [
            (Ints::Bytes(&[]), 16),
            (Ints::Bytes(&[]), 32),
            (
                Ints::Nibbles {
                    values: &[],
                    zero: 0,
                },
                32,
            ),
            (
                Ints::FiveBits {
                    nibbles: &[],
                    high: &[],
                    zero: 0,
                },
                32,
            ),
            (
                Ints::SixBits {
                    nibbles: &[],
                    crumbs: &[],
                    zero: 0,
                },
                16,
            ),
        ] {
            assert_eq!(
                integer_kernel(values, block).is_some(),
                features::cpu().avx2,
                "an integer kernel reads blocks of {block} wherever the CPU has AVX2"
            );
        }
        let cases = [
            (1, 32, 32),
            (7, 96, 32),
            (67, 576, 32),
            (16, 1536, 32),
            (48, 576, 32),
            (3, 2560, 32),
            (33, 576, 16),
            (33, 768, 16),
            (48, 768, 16),
            (5, 48, 16),
            (5, 96, 16),
            (9, 1536, 64),
            (5, 96, 48),
            (9, 40, 20),
        ];
        let variants = cases
            .into_iter()
            .flat_map(|(rows, cols, block): (usize, usize, usize)| {
                let packings = match block {
                    32 => &[4, 5][..],
                    16 => &[6][..],
                    _ => &[][..],
                };
                [8, 4, 5, 6]
                    .into_iter()
                    .filter(move |bits| *bits == 8 || packings.contains(bits))
                    .filter(move |&bits| bits != 6 || cols.is_multiple_of(NIBBLE_BLOCK))
                    .flat_map(move |bits| {
                        [false, true].map(|with_offsets| (rows, cols, block, bits, with_offsets))
                    })
            });
        for (rows, cols, block, bits, with_offsets) in variants {
            let packed = bits < 8;
            // Unsigned values with offsets, signed ones without (Q4_1, Q4_0).
            let largest = ((1 << (bits - 1)) - 1) as f32;
            let weight: Vec<i8> = values(rows * cols, 3)
                .iter()
                .map(|v| match with_offsets && packed && bits < 6 {
                    true => v.abs() * (2.0 * largest + 1.0),
                    false => v * largest,
                } as i8)
                .collect();
            let packed_weight = IntegerValues::packing(&weight, block);
            assert!(matches!(
                (bits, &packed_weight),
                (8, _)
                    | (4, IntegerValues::Nibbles { .. })
                    | (5, IntegerValues::FiveBits { .. })
                    | (6, IntegerValues::SixBits { .. })
            ));
            let ints = match packed {
                true => packed_weight.borrowed(),
                false => Ints::Bytes(&weight),
            };
            // f16 values, which the packed weights hold so, as a GGUF file's are.
            let as_f16 = |v: f32| f16::from_f32(v).to_f32();
            let scales: Vec<f32> = values(rows * cols / block, 4)
                .iter()
                .map(|v| as_f16(0.01 + v.abs() * 0.02))
                .collect();
            let offsets = with_offsets.then(|| {
                values(rows * cols / block, 7)
                    .into_iter()
                    .map(as_f16)
                    .collect::<Vec<_>>()
            });
            // Rows of whole super-blocks hold their factors as a K type's are: an f16 base per
            // 256 values times a small integer per block.
            let k_type = cols.is_multiple_of(256);
            let k_factors = |factors: Vec<f32>, unit: f32| match k_type {
                true => factors
                    .chunks(256 / block)
                    .enumerate()
                    .flat_map(|(g, group)| {
                        let base = as_f16(unit * (1 + g % 5) as f32);
                        group
                            .iter()
                            .map(move |v| base * (v / unit / 2.0).round().clamp(-63.0, 63.0))
                    })
                    .collect(),
                false => factors,
            };
            let scales = k_factors(scales, 0.001);
            let offsets = offsets.map(|offsets| k_factors(offsets, 0.0007));
            let factors = |values: &[f32]| match (k_type, packed) {
                (true, _) => BlockFactors::F32(values.to_vec()).compacted(block),
                (false, true) => {
                    BlockFactors::F16(values.iter().map(|&v| f16::from_f32(v)).collect())
                }
                (false, false) => BlockFactors::F32(values.to_vec()),
            };
            let (scale_factors, offset_factors) =
                (factors(&scales), offsets.as_deref().map(factors));
            for factors in [Some(&scale_factors), offset_factors.as_ref()]
                .into_iter()
                .flatten()
            {
                assert_eq!(
                    k_type,
                    matches!(factors, BlockFactors::Scaled { .. }),
                    "{rows}x{cols}/{block}: K-type factors"
                );
            }
            let mut x = values(cols, 5);
            x[cols / 3] = 40.0;
            // The kernels multiply the integers by the activations (rounded, in the integer
            // kernel) and the offsets by the activations' own block sums.
            let scaled: Vec<f32> = weight
                .iter()
                .enumerate()
                .map(|(i, &q)| f32::from(q) * scales[i / block])
                .collect();
            let offset_part: Vec<f32> = match &offsets {
                Some(offsets) => naive(
                    &(0..rows * cols)
                        .map(|i| offsets[i / block])
                        .collect::<Vec<_>>(),
                    &x,
                ),
                None => vec![0.0; rows],
            };
            let what = format!("{rows}x{cols}/{block}, {bits} bits, offsets {with_offsets}");
            let close = |got: &[f32], x: &[f32], offset_part: &[f32], path: &str| {
                let expected = naive(&scaled, x);
                for ((g, e), o) in got.iter().zip(expected).zip(offset_part) {
                    let e = e + o;
                    assert!(
                        (g - e).abs() <= 1e-4 * (1.0 + e.abs()),
                        "{path} {what}: {g} vs {e}"
                    );
                }
            };
            let from_ones = |out: Vec<f32>| out.iter().map(|y| y - 1.0).collect::<Vec<_>>();
            let no_offsets = vec![0.0; rows];

            let mut out = vec![1.0; rows];
            rows_dot_integer_portable(ints, &scales, block, &x, &mut out);
            close(&from_ones(out), &x, &no_offsets, "portable");

            let rows_of = WeightRows::Integers {
                values: ints,
                scales: scale_factors.borrowed(),
                offsets: offset_factors.as_ref().map(BlockFactors::borrowed),
                block,
            };
            // Q6_K's factors (blocks of 16, K-type, no offsets) are read stepped.
            let stepped = read_stepped(
                block,
                scale_factors.borrowed(),
                offset_factors.as_ref().map(BlockFactors::borrowed),
            );
            assert_eq!(stepped, k_type && block == 16 && !with_offsets);
            // The activations as `kernel` rounds them.
            let rounded = |kernel: IntegerKernel| {
                let ints = IntegerActivations::of(&x, ints, block, kernel, stepped).ints;
                let block = ints.block;
                (ints.values.iter().enumerate())
                    .map(|(c, &q)| f32::from(q) * ints.scales[c / block])
                    .collect::<Vec<f32>>()
            };
            // 4- and 5-bit values, stepped 6-bit ones and bytes in blocks of 32 with factors
            // that can be laid out by block (here K-type ones), in whole groups of rows
            // (6-bit ones of whole super-blocks), interleaved where a CPU with `cpu` has the
            // kernel that reads them so.
            let interleaved_for = |cpu: Features| {
                IntegerWeights {
                    dims: [rows, cols],
                    block,
                    values: match packed {
                        true => IntegerValues::packing(&weight, block),
                        false => IntegerValues::Bytes(weight.clone()),
                    },
                    scales: factors(&scales),
                    offsets: offsets.as_deref().map(factors),
                }
                .interleaved_for(cpu)
            };
            let interleaves = |cpu: Features| {
                (bits == 4
                    || bits == 5
                    || bits == 6 && stepped && cols.is_multiple_of(256)
                    || bits == 8 && block == 32 && k_type)
                    && rows.is_multiple_of(INTERLEAVED_ROWS)
                    && cpu.interleaves(bits)
            };
            let is_interleaved = |values: &IntegerValues| {
                matches!(
                    values,
                    IntegerValues::Interleaved { .. }
                        | IntegerValues::SixBitsInterleaved { .. }
                        | IntegerValues::FiveBitsInterleaved { .. }
                        | IntegerValues::BytesInterleaved { .. }
                )
            };
            let cpu = features::cpu();
            assert_eq!(
                is_interleaved(&interleaved_for(cpu).values),
                interleaves(cpu),
                "{rows}x{cols}, {bits} bits: interleaved as loaded"
            );
            // As the loader lays them out for the AVX2 kernel, which every CPU with AVX2
            // runs, so that every CI machine checks it, and 5- and 8-bit values, which no other
            // kernel reads.
            let avx2_alone = Features {
                avx2: cpu.avx2,
                ..Features::default()
            };
            let interleaved = interleaved_for(avx2_alone);
            let loaded_so = interleaves(cpu);
            let interleaves = interleaves(avx2_alone);
            assert_eq!(
                is_interleaved(&interleaved.values),
                interleaves,
                "{rows}x{cols}, {bits} bits: interleaved"
            );
            // 4-, 5- and 8-bit weights' factors laid out by block with them, 6-bit ones' as
            // they were.
            let (tile_scales, tile_offsets) = (
                interleaved.scales.borrowed(),
                interleaved.offsets.as_ref().map(BlockFactors::borrowed),
            );
            for factors in [Some(tile_scales), tile_offsets].into_iter().flatten() {
                assert_eq!(
                    matches!(
                        factors,
                        Factors::F16ByBlock { .. } | Factors::ScaledByBlock { .. }
                    ),
                    interleaves && bits != 6,
                    "{rows}x{cols}, {bits} bits: factors by block"
                );
            }
            let row_major = (
                scale_factors.borrowed(),
                offset_factors.as_ref().map(BlockFactors::borrowed),
            );
            let tiles = interleaves.then(|| interleaved.values.borrowed());
            if let Some(tiles) = tiles.filter(|_| loaded_so) {
                let interleaving = match bits {
                    5 | 8 => Some(Interleaving::Avx2),
                    _ => Interleaving::of(cpu),
                };
                assert_eq!(
                    integer_kernel(tiles, block),
                    interleaving.map(IntegerKernel::Interleaved)
                );
            }
            if let Some(tiles) = tiles {
                let widen = |values, scales, offsets| {
                    let rows = WeightRows::Integers {
                        values,
                        scales,
                        offsets,
                        block,
                    };
                    let mut out = vec![0.0; rows.len()];
                    rows.widen(0, &mut out);
                    out
                };
                assert_eq!(
                    widen(tiles, tile_scales, tile_offsets),
                    widen(ints, row_major.0, row_major.1),
                    "{rows}x{cols}: interleaved values"
                );
            }
            if let Some(fastest) = integer_kernel(ints, block) {
                // Every kernel sums each output in one order, so all give the same bits.
                let mut first: Option<(IntegerKernel, Vec<f32>)> = None;
                // Each interleaved kernel this CPU runs that reads the values, with the factors
                // laid out as the loader lays them out, and with them in rows: the AVX2 one
                // too where the loader would pick another.
                let interleavings = [
                    (Interleaving::Avx2, cpu.avx2),
                    (
                        Interleaving::AvxVnni,
                        cpu.avx_vnni && !matches!(bits, 5 | 8),
                    ),
                    (
                        Interleaving::Avx512Vnni,
                        cpu.avx512_vnni && !matches!(bits, 5 | 8),
                    ),
                ];
                let runs = integer_kernels_up_to(fastest, ints, stepped)
                    .into_iter()
                    .map(|kernel| (kernel, ints, row_major))
                    .chain(tiles.into_iter().flat_map(|tiles| {
                        (interleavings.into_iter())
                            .filter(|&(_, runs)| runs)
                            .flat_map(move |(interleaving, _)| {
                                [(tile_scales, tile_offsets), row_major].map(move |factors| {
                                    (IntegerKernel::Interleaved(interleaving), tiles, factors)
                                })
                            })
                    }));
                for (kernel, ints, (kernel_scales, kernel_offsets)) in runs {
                    let rounded = rounded(kernel);
                    let x = IntegerActivations::of(&x, ints, block, kernel, stepped);
                    let mut out = vec![1.0; rows];
                    // SAFETY: the kernel runs on this CPU, and the sizes are the ones it reads.
                    unsafe {
                        rows_dot_integers(
                            kernel,
                            ints,
                            kernel_scales,
                            kernel_offsets,
                            stepped,
                            &mut Vec::new(),
                            std::slice::from_ref(&x),
                            &mut [&mut out],
                        )
                    };
                    match &first {
                        None => first = Some((kernel, out.clone())),
                        Some((other, theirs)) => assert!(
                            out.iter()
                                .zip(theirs)
                                .all(|(a, b)| a.to_bits() == b.to_bits()),
                            "{kernel:?} and {other:?} {what}: other bits"
                        ),
                    }
                    close(
                        &from_ones(out),
                        &rounded,
                        &offset_part,
                        &format!("{kernel:?}"),
                    );
                    // Five activation rows at once (four together, then one): each gets the
                    // bits it gets alone. Seeds apart in high bits: seeds under the block's
                    // length give every row the same values in another order within each
                    // block, and so the same activation scales.
                    let xs: Vec<IntegerActivations> = (0..5)
                        .map(|k| {
                            let x = values(cols, (20 + k) << 16);
                            IntegerActivations::of(&x, ints, block, kernel, stepped)
                        })
                        .collect();
                    let run = |xs: &[IntegerActivations]| {
                        let mut outs = vec![vec![1.0f32; rows]; xs.len()];
                        let mut slices: Vec<&mut [f32]> =
                            outs.iter_mut().map(Vec::as_mut_slice).collect();
                        // SAFETY: as above, for each activation row.
                        unsafe {
                            rows_dot_integers(
                                kernel,
                                ints,
                                kernel_scales,
                                kernel_offsets,
                                stepped,
                                &mut Vec::new(),
                                xs,
                                &mut slices,
                            )
                        };
                        outs
                    };
                    let together = run(&xs);
                    for (k, together) in together.iter().enumerate() {
                        let alone = &run(&xs[k..k + 1])[0];
                        assert!(
                            together
                                .iter()
                                .zip(alone)
                                .all(|(t, a)| t.to_bits() == a.to_bits()),
                            "{kernel:?} {what}: row {k} together differs from alone"
                        );
                    }
                }
                close(
                    &product(rows_of, &x),
                    &rounded(fastest),
                    &offset_part,
                    "matvec",
                );
                if let Some(tiles) = tiles {
                    let rows_of_tiles = WeightRows::Integers {
                        values: tiles,
                        scales: tile_scales,
                        offsets: tile_offsets,
                        block,
                    };
                    let bits = |out: Vec<f32>| out.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                    assert_eq!(
                        bits(product(rows_of_tiles, &x)),
                        bits(product(rows_of, &x)),
                        "matvec {what}: interleaved"
                    );
                }
            } else {
                close(&product(rows_of, &x), &x, &offset_part, "matvec");
            }
        }
    }

    #[test]
    fn activations_round_to_within_half_a_step_of_their_block_and_keep_its_sum() {
        // A decode step's few blocks, and a prompt's many, which are rounded on every thread.
        for len in [96, 128 * 576] {
            let mut x = values(len, 6);
            x[5] = -300.0;
            x[32..64].fill(0.0);
            x[len - 7] = 1e4;
            let ints = BlockInts::of(&x, 32);
            assert_eq!(ints.scales.len(), len / 32);
            assert_eq!(ints.values[5], -i16::MAX);
            assert_eq!(ints.values[len - 7], i16::MAX);
            assert_eq!(ints.scales[1], 0.0);
            for (b, (block, &sum)) in x.chunks_exact(32).zip(&ints.sums).enumerate() {
                let want: f32 = block.iter().sum();
                assert!(
                    (sum - want).abs() <= 1e-5 * (1.0 + want.abs()),
                    "block {b}: {sum}"
                );
            }
            for (c, (&v, &q)) in x.iter().zip(&ints.values).enumerate() {
                let scale = ints.scales[c / 32];
                let largest = x[c / 32 * 32..][..32]
                    .iter()
                    .fold(0.0f32, |m, v| m.max(v.abs()));
                assert_eq!(scale, largest / f32::from(i16::MAX), "block {}", c / 32);
                // Half a step, and f32's own rounding of values near the largest.
                assert!(
                    (v - scale * f32::from(q)).abs() <= scale * 0.5 + largest * 4.0 * f32::EPSILON,
                    "element {c}: {v} vs {q} · {scale}"
                );
            }
        }
    }

    #[test]
    #[should_panic(expected = "matvec: weight is not [out.len() / vectors, xs.len() / vectors]")]
    fn a_weight_of_the_wrong_size_is_a_programming_error() {
        matvecs(WeightRows::F32(&[0.0; 10]), &[0.0; 3], 1, &mut [0.0; 3]);
    }
}
