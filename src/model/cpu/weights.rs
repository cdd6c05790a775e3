//! A projection weight `[rows, cols]` as the CPU kernels read it, whatever its storage.

use std::ops::Range;
use std::sync::Arc;

use burn::backend::flex::FlexQTensor;
use burn::backend::{BackendTensor, DispatchTensorKind, TensorMetadata};
use burn::tensor::quantization::{QuantMode, QuantScheme, QuantStore, QuantValue};
use burn::tensor::{DType, Device, Tensor, TensorData};
use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};
use rayon::prelude::*;

use super::features::Features;
use super::host::{HostFloat, HostTensor};
use super::matvec::{PAIRED_COLUMNS, paired_column, read_stepped};

/// The backend's own weight tensor, held so that [`Weight::rows`] can borrow from it.
///
/// A projection extracts it once, when the weight is made: Burn hands out a backend's
/// tensor only by value, and cloning burn-flex's 8-bit tensor to get one copies its scales
/// (13 MB per token in all, 4% of a q8 decode step, on the calling thread alone).
#[derive(Clone, Debug)]
pub enum Weight {
    Float(HostTensor),
    /// burn-flex's 8-bit weights (`--precision q8`).
    Quantized(FlexQTensor),
    /// A GGUF file's integer weights, kept as stored (see [`IntegerWeights`]).
    Integers(Arc<IntegerWeights>),
    /// Float weights laid out by lane (see [`by_lane_at`]) for the AVX2 kernels, in the
    /// backend's tensor the loader made of them: no Burn operation may read it as a matrix.
    ByLane(HostTensor),
    /// The parts of one projection stacked row-wise, each held as it is stored. A Q4_K_M
    /// file keeps v in Q6_K beside q and k in Q4_K: held as one, all three took the finer
    /// type's blocks of 16 bytes, 2.2 times q and k's own bytes.
    Stacked(Vec<Weight>),
}

/// Weights stored as small integers with a scale, and in some types an offset, per block of
/// a row: `W[r, c] = scales[b] · values[r · cols + c] + offsets[b]` for `b = (r · cols + c) /
/// block`. Every GGUF integer type (Q4_0 … Q8_0, Q4_K … Q6_K) is exactly this, so the integer
/// kernels multiply them without rounding anything.
#[derive(Debug)]
pub struct IntegerWeights {
    pub dims: [usize; 2],
    pub block: usize,
    pub values: IntegerValues,
    pub scales: BlockFactors,
    /// `None` where every offset is zero (the types without a minimum).
    pub offsets: Option<BlockFactors>,
}

/// The scales or offsets of [`IntegerWeights`], one per block: in f16 where every one is an
/// f16 exactly, as a GGUF file's own are for Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 (half the bytes:
/// 8 MiB of a SmolLM2-135M file's 4-bit weights); as a base per group of blocks times a small
/// integer per block where they are exactly that, as the K types' are (a super-block's f16
/// scale times 6- or 8-bit block scales: a quarter of the bytes of f32, 4 MiB of a Q4_K_M
/// file); in f32 otherwise.
#[derive(Debug)]
pub enum BlockFactors {
    F16(Vec<f16>),
    F32(Vec<f32>),
    /// Factor `b` is `bases[b / per] · steps[b]`, exactly, in f32.
    Scaled {
        bases: Vec<f16>,
        steps: Vec<i8>,
        per: usize,
    },
    /// [`BlockFactors::F16`] of rows of `blocks` blocks laid out by block a group of
    /// [`INTERLEAVED_ROWS`] rows at a time (see [`by_block_at`]), as the kernel that reads
    /// interleaved weights takes a block's factors of a group's rows.
    F16ByBlock {
        values: Vec<f16>,
        blocks: usize,
    },
    /// [`BlockFactors::Scaled`] laid out so: the steps as [`BlockFactors::F16ByBlock`], the
    /// bases as rows of `blocks / per`.
    ScaledByBlock {
        bases: Vec<f16>,
        steps: Vec<i8>,
        per: usize,
        blocks: usize,
    },
}

/// Where factors laid out by block (see [`BlockFactors::F16ByBlock`]) keep the factor of
/// block `b` of row `row`, in rows of `blocks`: a block's factors of a group's rows together.
pub const fn by_block_at(blocks: usize, row: usize, b: usize) -> usize {
    let group = row / INTERLEAVED_ROWS * INTERLEAVED_ROWS;
    group * blocks + b * INTERLEAVED_ROWS + row % INTERLEAVED_ROWS
}

/// `values`, whole groups of [`INTERLEAVED_ROWS`] rows of `row_len` elements in blocks of
/// `WIDTH`, rearranged in place, a group at a time on every core: element `j` of block `b`
/// of a group's row `row` goes to `at(row, b, j)` in the group. Interleaving values and
/// laying factors out by block are this. Block by block, the widths known: an element's
/// place computed from its index in the row loaded a 1.7B Q6_K file in 1.3 s, not 0.9.
fn rearrange_groups<T: Copy + Default + Send + Sync, const WIDTH: usize>(
    values: &mut [T],
    row_len: usize,
    at: impl Fn(usize, usize, usize) -> usize + Sync,
) {
    let group = INTERLEAVED_ROWS * row_len;
    values.par_chunks_exact_mut(group).for_each_init(
        || vec![T::default(); group],
        |plain, values| {
            plain.copy_from_slice(values);
            for (row, elements) in plain.chunks_exact(row_len).enumerate() {
                for (b, block) in elements.chunks_exact(WIDTH).enumerate() {
                    for (j, &element) in block.iter().enumerate() {
                        values[at(row, b, j)] = element;
                    }
                }
            }
        },
    );
}

/// `values`, whole groups of [`INTERLEAVED_ROWS`] rows of `blocks`, laid out by block (see
/// [`by_block_at`]) in place.
fn lay_out_by_block<T: Copy + Default + Send + Sync>(values: &mut [T], blocks: usize) {
    rearrange_groups::<T, 1>(values, blocks, |row, b, _| by_block_at(blocks, row, b));
}

/// The blocks of 32 a K type's super-block holds (of 16, twice as many).
const SUPER_BLOCK: usize = 256;

impl BlockFactors {
    /// The same factors in the smallest of the forms that holds them exactly; blocks of
    /// `block` values.
    pub fn compacted(self, block: usize) -> Self {
        let Self::F32(values) = self else {
            return self;
        };
        // On every core: a 1.7B model's factors are 50 million values, and these passes
        // took a third of its loading on one.
        if values.par_iter().all(|&v| f16::from_f32(v).to_f32() == v) {
            return Self::F16(values.par_iter().map(|&v| f16::from_f32(v)).collect());
        }
        let per = SUPER_BLOCK / block;
        if per > 1 && values.len().is_multiple_of(per) {
            let mut steps = vec![0i8; values.len()];
            let Some(bases) = steps
                .par_chunks_exact_mut(per)
                .zip(values.par_chunks_exact(per))
                .map(|(steps, group)| common_base(group, steps))
                .collect::<Option<Vec<f32>>>()
            else {
                return Self::F32(values);
            };
            let bases = bases.into_iter().map(f16::from_f32).collect();
            return Self::Scaled { bases, steps, per };
        }
        Self::F32(values)
    }

    pub fn borrowed(&self) -> Factors<'_> {
        match self {
            Self::F16(values) => Factors::F16(values),
            Self::F32(values) => Factors::F32(values),
            &Self::Scaled {
                ref bases,
                ref steps,
                per,
            } => Factors::Scaled {
                bases,
                steps,
                first: 0,
                per,
            },
            &Self::F16ByBlock { ref values, blocks } => Factors::F16ByBlock {
                values,
                blocks,
                first: 0,
                len: values.len(),
            },
            &Self::ScaledByBlock {
                ref bases,
                ref steps,
                per,
                blocks,
            } => Factors::ScaledByBlock {
                bases,
                steps,
                per,
                blocks,
                first: 0,
                len: steps.len(),
            },
        }
    }

    /// Whether factors of rows of `blocks` blocks can be laid out by block
    /// ([`BlockFactors::by_block`]): f16 ones, and scaled ones whose rows hold whole groups
    /// (K types').
    fn can_lay_out_by_block(&self, blocks: usize) -> bool {
        match self {
            Self::F16(_) => true,
            Self::Scaled { per, .. } => blocks.is_multiple_of(*per),
            _ => false,
        }
    }

    /// The same factors, of whole groups of rows of `blocks` blocks, laid out by block (see
    /// [`BlockFactors::F16ByBlock`]) in place where they can be
    /// ([`BlockFactors::can_lay_out_by_block`]); as they are otherwise.
    fn by_block(self, blocks: usize) -> Self {
        match self {
            Self::F16(mut values) => {
                lay_out_by_block(&mut values, blocks);
                Self::F16ByBlock { values, blocks }
            }
            Self::Scaled {
                mut bases,
                mut steps,
                per,
            } if blocks.is_multiple_of(per) => {
                lay_out_by_block(&mut steps, blocks);
                lay_out_by_block(&mut bases, blocks / per);
                Self::ScaledByBlock {
                    bases,
                    steps,
                    per,
                    blocks,
                }
            }
            other => other,
        }
    }
}

/// An f16 that every one of `group` is an integer multiple of, from -128 to 127 times, exactly
/// in f32. A K type's factors are its super-block's f16 scale times 6-bit (Q4_K, Q5_K) or
/// 8-bit (Q6_K) block scales, and llama.cpp's quantizer gives the largest block scale 63 or
/// -128 exactly, so the largest magnitude divided by those is tried first; then the smallest
/// magnitude divided by 1, 2, …, which finds other files' bases too but took a tenth of a
/// 1.7B model's loading. The multiples go to `steps` as the base is checked: a second pass
/// that divided again cost 4% of loading a 1.7B Q4_K_M file.
fn common_base(group: &[f32], steps: &mut [i8]) -> Option<f32> {
    // One pass with plain comparisons: two passes of `total_cmp` were a fifth of loading a
    // 1.7B Q4_K_M file. The first smallest magnitude and the last largest, as `min_by` and
    // `max_by` take them; a NaN is neither, and fails `holds` below whichever base is tried.
    let (mut smallest, mut largest) = (None::<f32>, None::<f32>);
    for &v in group.iter().filter(|&&v| v != 0.0) {
        if smallest.is_none_or(|s| v.abs() < s.abs()) {
            smallest = Some(v);
        }
        if largest.is_none_or(|l| v.abs() >= l.abs()) {
            largest = Some(v);
        }
    }
    let (Some(smallest), Some(largest)) = (smallest, largest) else {
        steps.fill(0);
        return Some(0.0);
    };
    // A quotient that is an integer in range and gives `v` back; truncated, not rounded (a
    // library call on baseline x86-64): a multiple's quotient is exact.
    let mut holds = |base: f32| {
        f16::from_f32(base).to_f32() == base
            && group.iter().zip(steps.iter_mut()).all(|(&v, step)| {
                let quotient = (v / base).clamp(-129.0, 128.0) as i32;
                *step = quotient as i8;
                (-128..=127).contains(&quotient) && quotient as f32 * base == v
            })
    };
    [largest / 63.0, largest / -128.0]
        .into_iter()
        .chain((1..=128u8).map(|k| smallest / f32::from(k)))
        .find(|&base| holds(base))
}

/// [`BlockFactors`], borrowed.
#[derive(Clone, Copy, Debug)]
pub enum Factors<'a> {
    F16(&'a [f16]),
    F32(&'a [f32]),
    /// Factor `i` is `bases[(first + i) / per] · steps[i]`.
    Scaled {
        bases: &'a [f16],
        steps: &'a [i8],
        first: usize,
        per: usize,
    },
    /// See [`BlockFactors::F16ByBlock`]: factors `first..first + len` in the rows' order.
    F16ByBlock {
        values: &'a [f16],
        blocks: usize,
        first: usize,
        len: usize,
    },
    /// See [`BlockFactors::ScaledByBlock`]: factors `first..first + len` in the rows' order.
    ScaledByBlock {
        bases: &'a [f16],
        steps: &'a [i8],
        per: usize,
        blocks: usize,
        first: usize,
        len: usize,
    },
}

impl<'a> Factors<'a> {
    pub fn len(self) -> usize {
        match self {
            Self::F16(values) => values.len(),
            Self::F32(values) => values.len(),
            Self::Scaled { steps, .. } => steps.len(),
            Self::F16ByBlock { len, .. } | Self::ScaledByBlock { len, .. } => len,
        }
    }

    /// The bytes the factors lie in (for scaled factors, their steps and the bases they
    /// use): what a kernel asks the cache for ahead of reading them.
    pub fn stored(self) -> [&'a [u8]; 2] {
        match self {
            Self::F16(values) => [bytemuck::cast_slice(values), &[]],
            Self::F32(values) => [bytemuck::cast_slice(values), &[]],
            Self::Scaled {
                bases,
                steps,
                first,
                per,
            } => {
                let used = first / per..(first + steps.len()).div_ceil(per).min(bases.len());
                [
                    bytemuck::cast_slice(steps),
                    bytemuck::cast_slice(&bases[used]),
                ]
            }
            // Whole groups of rows lie together as they do in order.
            Self::F16ByBlock {
                values, first, len, ..
            } => [bytemuck::cast_slice(&values[first..first + len]), &[]],
            Self::ScaledByBlock {
                bases,
                steps,
                per,
                first,
                len,
                ..
            } => [
                bytemuck::cast_slice(&steps[first..first + len]),
                bytemuck::cast_slice(&bases[first / per..(first + len).div_ceil(per)]),
            ],
        }
    }

    /// The steps of scaled factors; none for the others.
    pub fn steps(self) -> &'a [i8] {
        match self {
            Self::Scaled { steps, .. } => steps,
            _ => &[],
        }
    }

    /// Whether each pair of factors shares a base: scaled factors whose groups, and the
    /// first, start at even factors. Blocks of 16 with such factors can be read as blocks
    /// of 32 with the base as scale and the steps applied to the values.
    pub fn pairs_share_bases(self) -> bool {
        matches!(self, Self::Scaled { first, per, .. } if per.is_multiple_of(2) && first.is_multiple_of(2))
    }

    pub fn get(self, index: usize) -> f32 {
        match self {
            Self::F16(values) => values[index].to_f32(),
            Self::F32(values) => values[index],
            Self::Scaled {
                bases,
                steps,
                first,
                per,
            } => bases[(first + index) / per].to_f32() * f32::from(steps[index]),
            Self::F16ByBlock {
                values,
                blocks,
                first,
                ..
            } => {
                let at = first + index;
                values[by_block_at(blocks, at / blocks, at % blocks)].to_f32()
            }
            Self::ScaledByBlock {
                bases,
                steps,
                per,
                blocks,
                first,
                ..
            } => {
                let (row, b) = ((first + index) / blocks, (first + index) % blocks);
                let base = bases[by_block_at(blocks / per, row, b / per)];
                base.to_f32() * f32::from(steps[by_block_at(blocks, row, b)])
            }
        }
    }

    pub fn range(self, range: Range<usize>) -> Self {
        match self {
            Self::F16(values) => Self::F16(&values[range]),
            Self::F32(values) => Self::F32(&values[range]),
            Self::Scaled {
                bases,
                steps,
                first,
                per,
            } => Self::Scaled {
                bases,
                first: first + range.start,
                steps: &steps[range],
                per,
            },
            Self::F16ByBlock {
                values,
                blocks,
                first,
                len,
            } => {
                assert!(range.end <= len, "factors {range:?} of {len}");
                Self::F16ByBlock {
                    values,
                    blocks,
                    first: first + range.start,
                    len: range.len(),
                }
            }
            Self::ScaledByBlock {
                bases,
                steps,
                per,
                blocks,
                first,
                len,
            } => {
                assert!(range.end <= len, "factors {range:?} of {len}");
                Self::ScaledByBlock {
                    bases,
                    steps,
                    per,
                    blocks,
                    first: first + range.start,
                    len: range.len(),
                }
            }
        }
    }

    /// The factors `range` as f32: where they lie when stored so, else converted into
    /// `buffer`, which only grows. The kernels take them so, a row or a tile of rows at a time.
    pub fn f32s<'b>(self, range: Range<usize>, buffer: &'b mut Vec<f32>) -> &'b [f32]
    where
        'a: 'b,
    {
        if let Self::F32(values) = self {
            return &values[range];
        }
        // Factors laid out by block widen a group of rows at a time into the buffer's end.
        let scratch = match self {
            Self::F16ByBlock { blocks, .. } | Self::ScaledByBlock { blocks, .. } => {
                INTERLEAVED_ROWS * blocks
            }
            _ => 0,
        };
        if buffer.len() < range.len() + scratch {
            buffer.resize(range.len() + scratch, 0.0);
        }
        let (out, group) = buffer.split_at_mut(range.len());
        match self.range(range) {
            Self::F32(values) => out.copy_from_slice(values),
            Self::F16(values) => values.convert_to_f32_slice(out),
            Self::Scaled {
                bases,
                steps,
                first,
                per,
            } => {
                // The group `first` falls in from there, then whole groups of a length the
                // compiler knows, which it vectorizes: a division per group, then groups of
                // unknown length, took 3% and 2.5% of a Qwen3-1.7B Q4_K_M prompt.
                let head = ((per - first % per) % per).min(steps.len());
                let group = first / per;
                let (head_out, out) = out.split_at_mut(head);
                for (out, &step) in head_out.iter_mut().zip(&steps[..head]) {
                    *out = bases[group].to_f32() * f32::from(step);
                }
                let (bases, steps) = (&bases[group + usize::from(head > 0)..], &steps[head..]);
                match per {
                    8 => scale_groups::<8>(bases, steps, out),
                    16 => scale_groups::<16>(bases, steps, out),
                    _ => {
                        for (i, (out, &step)) in out.iter_mut().zip(steps).enumerate() {
                            *out = bases[i / per].to_f32() * f32::from(step);
                        }
                    }
                }
            }
            by_block => by_block_in_rows(by_block, &mut group[..scratch], out),
        }
        out
    }
}

/// Factors laid out by block ([`Factors::F16ByBlock`], [`Factors::ScaledByBlock`]) into
/// `out` in the rows' order: each group of rows they touch widened whole into `group`, as
/// it lies (in vectors), then each row's picked out of it. Picked one at a time from where they lie,
/// a 1.7B Q4_K_M file's prompts ran at 0.72× the speed.
fn by_block_in_rows(factors: Factors<'_>, group: &mut [f32], out: &mut [f32]) {
    let (blocks, first) = match factors {
        Factors::F16ByBlock { blocks, first, .. }
        | Factors::ScaledByBlock { blocks, first, .. } => (blocks, first),
        _ => unreachable!("factors laid out by block"),
    };
    debug_assert_eq!(group.len(), INTERLEAVED_ROWS * blocks);
    let mut widened = None;
    let mut done = 0;
    while done < out.len() {
        let (row, b) = ((first + done) / blocks, (first + done) % blocks);
        let at = row / INTERLEAVED_ROWS * INTERLEAVED_ROWS * blocks;
        if widened != Some(at) {
            let range = at..at + group.len();
            match factors {
                Factors::F16ByBlock { values, .. } => {
                    values[range].convert_to_f32_slice(group);
                }
                Factors::ScaledByBlock {
                    bases, steps, per, ..
                } => {
                    let bases = &bases[at / per..(at + group.len()) / per];
                    scale_by_block(bases, &steps[range], per, group);
                }
                _ => unreachable!("factors laid out by block"),
            }
            widened = Some(at);
        }
        let len = (blocks - b).min(out.len() - done);
        let in_group = group[b * INTERLEAVED_ROWS + row % INTERLEAVED_ROWS..]
            .iter()
            .step_by(INTERLEAVED_ROWS);
        for (out, &factor) in out[done..done + len].iter_mut().zip(in_group) {
            *out = factor;
        }
        done += len;
    }
}

/// `out[16 b + r] = bases[16 (b / per) + r] · steps[16 b + r]`: a group's scaled factors laid
/// out by block, each block's sixteen rows times their bases, in vectors.
#[multiversion::multiversion(targets("x86_64+avx512f", "x86_64+avx2+fma"))]
fn scale_by_block(bases: &[f16], steps: &[i8], per: usize, out: &mut [f32]) {
    let (step_rows, _) = steps.as_chunks::<INTERLEAVED_ROWS>();
    let (out_rows, _) = out.as_chunks_mut::<INTERLEAVED_ROWS>();
    let (base_rows, _) = bases.as_chunks::<INTERLEAVED_ROWS>();
    for (s, bases) in base_rows.iter().enumerate() {
        let bases = bases.map(f16::to_f32);
        let blocks = s * per..(s + 1) * per;
        for (out, steps) in out_rows[blocks.clone()].iter_mut().zip(&step_rows[blocks]) {
            for ((out, &base), &step) in out.iter_mut().zip(&bases).zip(steps) {
                *out = base * f32::from(step);
            }
        }
    }
}

/// `out[i] = bases[i / N] · steps[i]`, from the start of a group. Compiled for AVX2 and
/// AVX-512 too: x86-64's baseline has no widening of bytes to f32 in vectors, and the scalar
/// loop was 17% of a 1.7B Q6_K decode step on the AVX2 path.
#[multiversion::multiversion(targets("x86_64+avx512f", "x86_64+avx2+fma"))]
fn scale_groups<const N: usize>(bases: &[f16], steps: &[i8], out: &mut [f32]) {
    let (step_groups, step_rest) = steps.as_chunks::<N>();
    let (out_groups, out_rest) = out.as_chunks_mut::<N>();
    for ((out, steps), base) in out_groups.iter_mut().zip(step_groups).zip(bases) {
        let base = base.to_f32();
        for (out, &step) in out.iter_mut().zip(steps) {
            *out = base * f32::from(step);
        }
    }
    if let Some(base) = bases.get(step_groups.len()) {
        for (out, &step) in out_rest.iter_mut().zip(step_rest) {
            *out = base.to_f32() * f32::from(step);
        }
    }
}

/// How [`IntegerWeights`] hold their values.
#[derive(Debug)]
pub enum IntegerValues {
    Bytes(Vec<i8>),
    /// 4-bit values in blocks of 32, as ggml's Q4 types lay them out: byte `j` of a block
    /// holds element `j` in its low half and `j + 16` in its high, each the value plus
    /// `zero` (8 for Q4_0's -8 to 7, 0 for the types with offsets). Half the bytes of
    /// [`IntegerValues::Bytes`] for the 4-bit types, which decode streams.
    Nibbles {
        values: Vec<u8>,
        zero: u8,
    },
    /// 5-bit values in blocks of 32: their low four bits as [`IntegerValues::Nibbles`] holds
    /// them and each block's fifth bits in one word, in the order `fifth_bit` gives; each
    /// the value plus `zero` (16 for Q5_0's -16 to 15, 0 for the types with offsets). Five
    /// eighths of the bytes of [`IntegerValues::Bytes`]: most of a Q4_K_M file's weights are
    /// Q5_0.
    FiveBits {
        nibbles: Vec<u8>,
        high: Vec<u32>,
        zero: u8,
    },
    /// 6-bit values (Q6_K's, in blocks of 16) in units of 32: their low four bits as
    /// [`IntegerValues::Nibbles`] holds them and their top two in 8 bytes per unit, byte `j`
    /// holding element `j + 8q`'s in bits `2q` and `2q + 1`; each the value plus `zero` (32
    /// for Q6_K's -32 to 31). Three quarters of the bytes of [`IntegerValues::Bytes`]: a
    /// Q4_K_M file's output matrix, a quarter of a 1.7B model's bytes, is Q6_K.
    SixBits {
        nibbles: Vec<u8>,
        crumbs: Vec<u8>,
        zero: u8,
    },
    /// 4-bit values as [`IntegerValues::Nibbles`] holds them, each [`INTERLEAVED_ROWS`] rows
    /// interleaved as the decode kernels that read rows in lanes read them
    /// (`Features::interleaves`): per group of rows, per block, four 64-byte lines, line `k`
    /// holding bytes `4k..4k + 4` of each row's block in turn (see [`interleaved_at`]). One
    /// line times four activations broadcast then gives sixteen rows' sums in their own
    /// lanes, with nothing to add across lanes.
    Interleaved {
        values: Vec<u8>,
        zero: u8,
        cols: usize,
    },
    /// 6-bit values as [`IntegerValues::SixBits`] holds them, read stepped (Q6_K's), each
    /// [`INTERLEAVED_ROWS`] rows interleaved for the same kernel: the nibbles as
    /// [`IntegerValues::Interleaved`] lays out 4-bit values, the crumbs in two lines per unit,
    /// line `k` holding bytes `4k..4k + 4` of each row's eight (see [`interleaved_crumb_at`]),
    /// which are the top bits of the values that nibble lines `k` and `k + 2` hold.
    SixBitsInterleaved {
        nibbles: Vec<u8>,
        crumbs: Vec<u8>,
        zero: u8,
        cols: usize,
    },
    /// 5-bit values as [`IntegerValues::FiveBits`] holds them, each [`INTERLEAVED_ROWS`]
    /// rows interleaved for the AVX2 kernel without VNNI (`Features::interleaves`): the
    /// nibbles as [`IntegerValues::Interleaved`] lays out 4-bit values, and the words of
    /// fifth bits laid out by block as factors are ([`by_block_at`]), one line of sixteen
    /// rows' words per block, each word in [`interleaved_fifth_bit`]'s order.
    FiveBitsInterleaved {
        nibbles: Vec<u8>,
        high: Vec<u32>,
        zero: u8,
        cols: usize,
    },
    /// Bytes in blocks of 32 (Q8_0's), each [`INTERLEAVED_ROWS`] rows interleaved for the
    /// AVX2 kernel without VNNI (`Features::interleaves`): per group of rows, per block,
    /// eight 64-byte lines, line `k` holding bytes `4k..4k + 4` of each row's block in turn
    /// (see [`interleaved_byte_at`]).
    BytesInterleaved {
        values: Vec<i8>,
        cols: usize,
    },
}

/// Rows whose 4-bit values [`IntegerValues::Interleaved`] interleaves: one 32-bit lane each
/// of a 512-bit line.
pub const INTERLEAVED_ROWS: usize = 16;

/// Bytes of a line of [`IntegerValues::Interleaved`] values: four of each row's.
pub const INTERLEAVED_LINE_BYTES: usize = 4 * INTERLEAVED_ROWS;

/// Bytes of one block of each of [`INTERLEAVED_ROWS`] rows: four lines.
pub const INTERLEAVED_BLOCK_BYTES: usize = INTERLEAVED_ROWS * NIBBLE_BLOCK / 2;

/// Bytes of the crumbs of one unit of each of [`INTERLEAVED_ROWS`] rows: two lines.
pub const INTERLEAVED_CRUMB_BYTES: usize = INTERLEAVED_ROWS * CRUMB_BYTES;

/// Bytes of one block of each of [`INTERLEAVED_ROWS`] rows of bytes: eight lines.
pub const INTERLEAVED_BYTE_BLOCK_BYTES: usize = INTERLEAVED_ROWS * NIBBLE_BLOCK;

/// Where interleaved bytes of rows of `cols` values, `width` bytes per block of 32, keep byte
/// `j` of block `b` of row `row`: per group of rows, per block, `width / 4` lines, line `k`
/// holding bytes `4k..4k + 4` of each row's block in turn.
const fn interleaved_in(width: usize, cols: usize, row: usize, b: usize, j: usize) -> usize {
    let group = row / INTERLEAVED_ROWS * INTERLEAVED_ROWS * cols / NIBBLE_BLOCK * width;
    let line = b * INTERLEAVED_ROWS * width + j / 4 * INTERLEAVED_LINE_BYTES;
    group + line + row % INTERLEAVED_ROWS * 4 + j % 4
}

/// Where [`IntegerValues::Interleaved`] keeps byte `j` of block `b` of row `row`, in rows of
/// `cols` values (and [`IntegerValues::SixBitsInterleaved`] its nibbles).
pub const fn interleaved_at(cols: usize, row: usize, b: usize, j: usize) -> usize {
    interleaved_in(NIBBLE_BLOCK / 2, cols, row, b, j)
}

/// Where [`IntegerValues::BytesInterleaved`] keeps value `j` of block `b` of row `row`, in
/// rows of `cols` values.
pub const fn interleaved_byte_at(cols: usize, row: usize, b: usize, j: usize) -> usize {
    interleaved_in(NIBBLE_BLOCK, cols, row, b, j)
}

/// Where [`IntegerValues::SixBitsInterleaved`] keeps crumb byte `j` of unit `b` of row `row`,
/// in rows of `cols` values.
pub const fn interleaved_crumb_at(cols: usize, row: usize, b: usize, j: usize) -> usize {
    interleaved_in(CRUMB_BYTES, cols, row, b, j)
}

/// Columns of a float weight's sums: each output sums its columns in sixteen lanes, column
/// `c` in lane `c % 16`, then adds the lanes (`math::sum_of_sixteen`), on every CPU.
pub const FLOAT_LANES: usize = 16;

/// Where float weights laid out by lane keep column `col` of row `row`, in rows of `cols`
/// values: per group of [`INTERLEAVED_ROWS`] rows, lane by lane, each lane's columns in
/// order, each column's value of the group's rows side by side. A register of eight of them
/// then holds one lane of eight rows, and the AVX2 kernels sum a lane of several rows and
/// tokens at once, each weight vector widened once for every token of a tile and each
/// token's value broadcast (`matmul/lane_tiles.rs`), where rows as they lie took two
/// registers an output, and each half of the lanes read half of every line.
///
/// A bf16 weight's columns are first put in pairs (`matvec::paired_column`), the order its
/// products take: lane `l` then sums columns `2l` and `2l + 1` of each block of 32 in turn,
/// as the kernels of bf16 rows as they lie do.
pub const fn by_lane_at<E: HostFloat>(cols: usize, row: usize, col: usize) -> usize {
    let col = match E::PAIRED {
        true => paired_column(cols, col),
        false => col,
    };
    let group = row / INTERLEAVED_ROWS * INTERLEAVED_ROWS * cols;
    let column = col % FLOAT_LANES * (cols / FLOAT_LANES) + col / FLOAT_LANES;
    group + column * INTERLEAVED_ROWS + row % INTERLEAVED_ROWS
}

/// Whether float weights of `rows` rows of `cols` values are laid out by lane: where the
/// AVX2 kernels that read them run (`Features::lays_out_floats_by_lane`), for rows in whole
/// groups and columns in whole sixteens.
fn lays_out_by_lane(cpu: Features, rows: usize, cols: usize) -> bool {
    cpu.lays_out_floats_by_lane()
        && rows > 0
        && rows.is_multiple_of(INTERLEAVED_ROWS)
        && cols > 0
        && cols.is_multiple_of(FLOAT_LANES)
}

/// `values`, rows of `cols` values in whole groups, laid out by lane ([`by_lane_at`]) in
/// place, a group of rows at a time on every core: each sixteen columns of a group's rows, a
/// square, go out transposed. A 1.7B F16 file, laid out as it fills the arena, loads in
/// 1.0 s from the page cache where in rows it took 0.7; each element placed by
/// [`rearrange_groups`] instead, it loaded in 4.0–6.4 s against 1.3–3.1 in five alternated
/// runs.
pub fn lay_out_by_lane<T: HostFloat>(values: &mut [T], cols: usize) {
    let per_lane = cols / FLOAT_LANES;
    let group = INTERLEAVED_ROWS * cols;
    values.par_chunks_exact_mut(group).for_each_init(
        || vec![T::zeroed(); group],
        |plain, values| {
            plain.copy_from_slice(values);
            for step in 0..per_lane {
                square_by_lane(plain, values, step);
            }
        },
    );
}

/// Where step `step` of each lane finds its sixteen columns in a row of `cols` values of
/// `T`: from the first, every `spacing`-th. A bf16 weight's whole blocks of 32 columns are
/// in pairs (`matvec::paired_column`): lane `l` of step `2b + e` takes column `32b + 2l + e`.
fn step_columns<T: HostFloat>(cols: usize, step: usize) -> (usize, usize) {
    match T::PAIRED && step < cols / PAIRED_COLUMNS * 2 {
        true => (step / 2 * PAIRED_COLUMNS + step % 2, 2),
        false => (step * FLOAT_LANES, 1),
    }
}

/// The square of a group's sixteen rows at step `step` ([`step_columns`]) of `plain`,
/// transposed into `group`: lane `l`'s sixteen values at step `step` of its run. In registers
/// where the CPU has AVX2: an element at a time, with bf16's pairs taken in a pass before,
/// the squares and the pairs took 2.4 s of CPU of a 1.7B BF16 file's load.
fn square_by_lane<T: HostFloat>(plain: &[T], group: &mut [T], step: usize) {
    let cols = plain.len() / INTERLEAVED_ROWS;
    let per_lane = cols / FLOAT_LANES;
    assert!(
        group.len() == plain.len() && cols.is_multiple_of(FLOAT_LANES) && step < per_lane,
        "a square of a group laid out by lane"
    );
    #[cfg(target_arch = "x86_64")]
    if super::features::cpu().avx2 {
        let (first, spacing) = step_columns::<T>(cols, step);
        let to = group.as_mut_ptr().wrapping_add(step * INTERLEAVED_ROWS);
        let to_stride = per_lane * INTERLEAVED_ROWS;
        // SAFETY: the CPU has AVX2. Row `r`'s columns of the step lie from `r · cols + first`,
        // within the row's whole block of 32 when spaced (from `first - first % 2`), and lane
        // `l`'s sixteen values from `to` at `l · to_stride` on, below
        // `16 · per_lane · 16 = 16 · cols` (checked above).
        unsafe {
            match (size_of::<T>(), spacing) {
                (2, 1) => {
                    let from = plain[first..].as_ptr().cast();
                    return square_of_halves(from, cols, None, to.cast(), to_stride);
                }
                (2, _) => {
                    let from = plain[first - first % 2..].as_ptr().cast();
                    let pick = Some(first % 2);
                    return square_of_halves(from, cols, pick, to.cast(), to_stride);
                }
                (4, 1) => {
                    let from = plain[first..].as_ptr().cast();
                    return square_of_words(from, cols, to.cast(), to_stride);
                }
                _ => {}
            }
        }
    }
    square_one_by_one(plain, group, step);
}

/// [`square_by_lane`] an element at a time.
fn square_one_by_one<T: HostFloat>(plain: &[T], group: &mut [T], step: usize) {
    let cols = plain.len() / INTERLEAVED_ROWS;
    let per_lane = cols / FLOAT_LANES;
    let (first, spacing) = step_columns::<T>(cols, step);
    for lane in 0..FLOAT_LANES {
        let at = (lane * per_lane + step) * INTERLEAVED_ROWS;
        let column = plain[first + spacing * lane..].iter().step_by(cols);
        for (out, &value) in group[at..at + INTERLEAVED_ROWS].iter_mut().zip(column) {
            *out = value;
        }
    }
}

/// [`square_by_lane`] for 16-bit values: sixteen from `from` in each row, or with `pick`, the
/// even (`Some(0)`) or odd (`Some(1)`) ones of 32; each pair of rows interleaved, so that a
/// 32-bit word holds a column's values of both, then the words of the eight pairs transposed.
///
/// # Safety
/// The CPU must have AVX2; `from` must start sixteen readable values (32 with `pick`) in each
/// of sixteen rows `stride` apart, and `to` sixteen writable ones in each of sixteen runs
/// `to_stride` apart.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn square_of_halves(
    from: *const u16,
    stride: usize,
    pick: Option<usize>,
    to: *mut u16,
    to_stride: usize,
) {
    use std::arch::x86_64::*;

    use super::math::transpose_8x8;
    // The words of `_mm256_unpacklo_epi16` hold columns 0–3 and 8–11; of `unpackhi`, the rest.
    const LOW: [usize; 8] = [0, 1, 2, 3, 8, 9, 10, 11];
    const HIGH: [usize; 8] = [4, 5, 6, 7, 12, 13, 14, 15];
    let row = |r: usize| {
        let at = from.wrapping_add(r * stride).cast::<__m256i>();
        // SAFETY: sixteen values of the row, or 32 with `pick` (the caller's).
        let Some(odd) = pick else {
            return unsafe { _mm256_loadu_si256(at) };
        };
        let [first, second] = [0, 1].map(|half| unsafe { _mm256_loadu_si256(at.add(half)) });
        // Each 32-bit word holds an even column's value, then an odd one's.
        let [first, second] = match odd {
            0 => {
                let low = _mm256_set1_epi32(0xFFFF);
                [_mm256_and_si256(first, low), _mm256_and_si256(second, low)]
            }
            _ => [
                _mm256_srli_epi32::<16>(first),
                _mm256_srli_epi32::<16>(second),
            ],
        };
        // Packed within each 128-bit half, then the quarters put in order.
        _mm256_permute4x64_epi64::<0xD8>(_mm256_packus_epi32(first, second))
    };
    let (mut low, mut high) = ([_mm256_setzero_ps(); 8], [_mm256_setzero_ps(); 8]);
    for k in 0..8 {
        let (a, b) = (row(2 * k), row(2 * k + 1));
        low[k] = _mm256_castsi256_ps(_mm256_unpacklo_epi16(a, b));
        high[k] = _mm256_castsi256_ps(_mm256_unpackhi_epi16(a, b));
    }
    let (low, high) = (transpose_8x8(low), transpose_8x8(high));
    for ((low, high), (l, h)) in low.into_iter().zip(high).zip(LOW.into_iter().zip(HIGH)) {
        // SAFETY: sixteen values of each of sixteen runs (the caller's).
        unsafe {
            _mm256_storeu_ps(to.add(l * to_stride).cast(), low);
            _mm256_storeu_ps(to.add(h * to_stride).cast(), high);
        }
    }
}

/// [`square_by_lane`] for 32-bit values: its four squares of eight, each transposed.
///
/// # Safety
/// As for [`square_of_halves`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn square_of_words(from: *const u32, stride: usize, to: *mut u32, to_stride: usize) {
    use std::arch::x86_64::*;

    use super::math::transpose_8x8;
    for (first_row, first_col) in [(0, 0), (0, 8), (8, 0), (8, 8)] {
        // SAFETY: sixteen rows of sixteen values, and sixteen runs of sixteen (the caller's).
        unsafe {
            let rows = std::array::from_fn(|r| {
                _mm256_loadu_ps(from.add((first_row + r) * stride + first_col).cast())
            });
            for (c, column) in transpose_8x8(rows).into_iter().enumerate() {
                _mm256_storeu_ps(
                    to.add((first_col + c) * to_stride + first_row).cast(),
                    column,
                );
            }
        }
    }
}

/// How a float matrix's rows are held: as stored, or laid out by lane ([`by_lane_at`]) for
/// the kernels that read them so. The checkpoint lays them out as it decodes them into the
/// weights' arena: laid out afterwards, each matrix was copied out of the arena's read-only
/// views, and a 1.7B F16 file peaked at twice its size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RowOrder {
    AsStored,
    ByLane,
}

impl RowOrder {
    /// The order for `dims` held as `dtype` on `device`: by lane where this CPU's kernels
    /// read that layout, for float rows in whole groups and columns in whole sixteens.
    pub fn for_matrix(dims: [usize; 2], dtype: DType, device: &Device) -> Self {
        let [rows, cols] = dims;
        match dtype {
            DType::F32 | DType::F16 | DType::BF16
                if super::is_host(device)
                    && lays_out_by_lane(super::features::cpu(), rows, cols) =>
            {
                Self::ByLane
            }
            _ => Self::AsStored,
        }
    }

    /// `values`, rows of `cols`, put in this order in place.
    pub fn arrange<T: HostFloat>(self, values: &mut [T], cols: usize) {
        if self == Self::ByLane {
            lay_out_by_lane(values, cols);
        }
    }
}

/// Whether weights of `rows` rows of `cols` values of `bits` are held interleaved, for a
/// kernel that reads rows in blocks of `unit` values: where that kernel runs on `cpu`
/// (`Features::interleaves`), for rows in whole groups.
fn interleaves(cpu: Features, rows: usize, cols: usize, bits: u32, unit: usize) -> bool {
    cpu.interleaves(bits)
        && rows > 0
        && rows.is_multiple_of(INTERLEAVED_ROWS)
        && cols.is_multiple_of(unit)
}

/// `values`, whole groups of [`INTERLEAVED_ROWS`] rows of `cols` values, `FOURS` groups of
/// four bytes per block of 32, interleaved in place (see [`interleaved_in`]), four bytes at
/// a time: a byte at a time, a 1B Q8_0 file took a second longer to load.
fn interleave<const FOURS: usize>(values: &mut [u8], cols: usize) {
    let width = 4 * FOURS;
    let row_len = cols / NIBBLE_BLOCK * FOURS;
    let fours: &mut [[u8; 4]] = bytemuck::cast_slice_mut(values);
    rearrange_groups::<[u8; 4], FOURS>(fours, row_len, |row, b, k| {
        interleaved_in(width, cols, row, b, 4 * k) / 4
    });
}

/// Row `row`'s bytes of blocks `first..` of interleaved values (see [`interleaved_in`]) into
/// `out`, in order, four at a time (a byte at a time, when the prompt tile read its rows
/// through it, a 1.7B Q4_0 file's prompts ran at half the speed).
fn gather_interleaved<const WIDTH: usize>(
    values: &[u8],
    cols: usize,
    row: usize,
    first: usize,
    out: &mut [u8],
) {
    let blocks = out.len() / WIDTH;
    // From the row's first byte to its last block's last byte.
    let from = interleaved_in(WIDTH, cols, row, first, 0);
    let to = interleaved_in(WIDTH, cols, row, first + blocks - 1, WIDTH - 1);
    let lines = &values[from..=to];
    for (b, block) in out.chunks_exact_mut(WIDTH).enumerate() {
        let lines = &lines[b * INTERLEAVED_ROWS * WIDTH..];
        for (k, four) in block.chunks_exact_mut(4).enumerate() {
            let line = k * INTERLEAVED_LINE_BYTES;
            four.copy_from_slice(&lines[line..line + 4]);
        }
    }
}

/// The block of packed 4- and 5-bit values, and the unit 6-bit values are packed in.
pub const NIBBLE_BLOCK: usize = 32;

/// The block of Q6_K's scales, half a unit of packed 6-bit values.
pub const SIX_BIT_BLOCK: usize = 16;

/// The bytes of top bits per unit of 6-bit values.
pub const CRUMB_BYTES: usize = NIBBLE_BLOCK / 4;

/// Where [`IntegerValues::SixBits`] keeps element `j`'s top two bits: the byte of its unit's
/// crumbs, and the bit they start at. Each 64-bit word of eight consecutive elements then
/// finds its bits in one position of every byte, so that one rotation per word and one mask
/// put them in place (see the decode kernels).
pub const fn crumb_at(j: usize) -> (usize, usize) {
    (j % CRUMB_BYTES, 2 * (j / CRUMB_BYTES))
}

/// The bit of its block's word that holds element `j`'s fifth bit (see
/// [`IntegerValues::FiveBits`]). Not ggml's order (bit `j`): the decode kernel widens sixteen
/// elements to 16-bit lanes, and with this order one variable shift of the word per 32-bit
/// lane and one mask put every lane's bit in place (lane pair `d` of the first sixteen takes
/// bits `d` and `16 + d`, of the second `8 + d` and `24 + d`).
pub const fn fifth_bit(j: usize) -> usize {
    let (half, lane) = (j / 16, j % 16);
    8 * half + lane / 2 + 16 * (lane % 2)
}

/// A block's fifth bits as ggml stores them (bit `j` for element `j`) in [`fifth_bit`]'s
/// order: the even bits to the low half, the odd to the high, each in turn, which is that
/// order. Four exchanges of bit groups, where moving the 32 bits one by one took a loop.
pub const fn fifth_bits_in_order(word: u32) -> u32 {
    let mut x = word;
    let mut t = (x ^ (x >> 1)) & 0x2222_2222;
    x ^= t ^ (t << 1);
    t = (x ^ (x >> 2)) & 0x0C0C_0C0C;
    x ^= t ^ (t << 2);
    t = (x ^ (x >> 4)) & 0x00F0_00F0;
    x ^= t ^ (t << 4);
    t = (x ^ (x >> 8)) & 0x0000_FF00;
    x ^ t ^ (t << 8)
}

/// The bit of its block's word that holds element `j`'s fifth bit where
/// [`IntegerValues::FiveBitsInterleaved`] holds it. Nibble line `k` holds bytes `4k..4k + 4`
/// of each row's block, two 16-bit words, and the AVX2 kernel masks each word's four
/// nibbles in place (elements `4k + 2w`, `16 + 4k + 2w`, `4k + 2w + 1`, then
/// `17 + 4k + 2w`, for word `w`): in each half of the word, the first three nibbles' fifth
/// bits lie `k` below the bit above each nibble, where one shift by `k` puts them, and the
/// fourth's at bit `13 + k` (bit 0 for the last line), where one shift puts it above the
/// fourth nibble shifted down.
pub const fn interleaved_fifth_bit(j: usize) -> usize {
    let (upper, k, i) = (j / 16, j % 16 / 4, j % 4);
    let word = 16 * (i / 2);
    match (upper, i % 2) {
        (0, 0) => word + 4 - k,
        (0, _) => word + 12 - k,
        (_, 0) => word + 8 - k,
        _ => word + (13 + k) % 16,
    }
}

/// A block's word of fifth bits moved from one order to another by `moves` (see
/// [`fifth_bit_moves`]), a byte at a time: bit by bit, a 1B Q4_K_M file's 5-bit tensors took
/// half a second of its loading.
fn fifth_bits_moved(word: u32, moves: &[[u32; 256]; 4]) -> u32 {
    let bytes = word.to_le_bytes();
    (bytes.iter().zip(moves)).fold(0, |out, (&byte, moves)| out | moves[usize::from(byte)])
}

/// For each byte of a word of fifth bits in [`fifth_bit`]'s order (or, not
/// `to_interleaved`, in [`interleaved_fifth_bit`]'s) and each value it takes, those bits
/// where the other order keeps them.
const fn fifth_bit_moves(to_interleaved: bool) -> [[u32; 256]; 4] {
    let mut moves = [[0; 256]; 4];
    let mut j = 0;
    while j < NIBBLE_BLOCK {
        let (from, to) = match to_interleaved {
            true => (fifth_bit(j), interleaved_fifth_bit(j)),
            false => (interleaved_fifth_bit(j), fifth_bit(j)),
        };
        let mut value = 0;
        while value < 256 {
            moves[from / 8][value] |= (value as u32 >> (from % 8) & 1) << to;
            value += 1;
        }
        j += 1;
    }
    moves
}

/// See [`fifth_bit_moves`].
const TO_INTERLEAVED: [[u32; 256]; 4] = fifth_bit_moves(true);

/// See [`fifth_bit_moves`].
const FROM_INTERLEAVED: [[u32; 256]; 4] = fifth_bit_moves(false);

/// The values of integer weights, borrowed.
#[derive(Clone, Copy)]
pub enum Ints<'a> {
    Bytes(&'a [i8]),
    /// See [`IntegerValues::Nibbles`].
    Nibbles {
        values: &'a [u8],
        zero: u8,
    },
    /// See [`IntegerValues::FiveBits`].
    FiveBits {
        nibbles: &'a [u8],
        high: &'a [u32],
        zero: u8,
    },
    /// See [`IntegerValues::SixBits`].
    SixBits {
        nibbles: &'a [u8],
        crumbs: &'a [u8],
        zero: u8,
    },
    /// See [`IntegerValues::Interleaved`]: whole groups of rows.
    Interleaved {
        values: &'a [u8],
        zero: u8,
        cols: usize,
    },
    /// See [`IntegerValues::SixBitsInterleaved`]: whole groups of rows.
    SixBitsInterleaved {
        nibbles: &'a [u8],
        crumbs: &'a [u8],
        zero: u8,
        cols: usize,
    },
    /// See [`IntegerValues::FiveBitsInterleaved`]: whole groups of rows.
    FiveBitsInterleaved {
        nibbles: &'a [u8],
        high: &'a [u32],
        zero: u8,
        cols: usize,
    },
    /// See [`IntegerValues::BytesInterleaved`]: whole groups of rows.
    BytesInterleaved {
        values: &'a [i8],
        cols: usize,
    },
}

/// The elements of a weight, borrowed where they lie.
#[derive(Clone, Copy)]
pub enum WeightRows<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
    Bf16(&'a [bf16]),
    /// [`Weight::ByLane`]'s values, in rows of `cols`.
    F32ByLane {
        values: &'a [f32],
        cols: usize,
    },
    F16ByLane {
        values: &'a [f16],
        cols: usize,
    },
    Bf16ByLane {
        values: &'a [bf16],
        cols: usize,
    },
    /// Integers with one scale, and maybe an offset, per `block` consecutive weights of a
    /// row: `W[r, c] = scales[b] · values[r · cols + c] (+ offsets[b])` for
    /// `b = (r · cols + c) / block`.
    Integers {
        values: Ints<'a>,
        scales: Factors<'a>,
        offsets: Option<Factors<'a>>,
        block: usize,
    },
}

impl Weight {
    /// The weight behind `tensor`, or `None` off the CPU backends and for quantization
    /// schemes the kernels do not read.
    pub fn of(tensor: &Tensor<2>) -> Option<Self> {
        if let DispatchTensorKind::Flex(BackendTensor::Quantized(weight)) =
            tensor.clone().into_dispatch().kind
        {
            return Some(Self::Quantized(weight));
        }
        HostTensor::of(tensor).map(Self::Float)
    }

    /// A tensor whose rows the checkpoint laid out by lane ([`RowOrder::ByLane`]), held for
    /// the kernels; `None` off the CPU backends and for types other than floats.
    pub fn by_lane(tensor: &Tensor<2>) -> Option<Self> {
        matches!(tensor.dtype(), DType::F32 | DType::F16 | DType::BF16)
            .then(|| HostTensor::of(tensor).map(Self::ByLane))
            .flatten()
    }

    /// `[rows, cols]`
    pub fn dims(&self) -> [usize; 2] {
        match self {
            Self::Float(tensor) | Self::ByLane(tensor) => tensor.shape().dims(),
            Self::Quantized(weight) => weight.shape().dims(),
            Self::Integers(weight) => weight.dims,
            Self::Stacked(parts) => {
                let rows = parts.iter().map(|part| part.dims()[0]).sum();
                [rows, parts.first().map_or(0, |part| part.dims()[1])]
            }
        }
    }

    pub fn rows(&self) -> Option<WeightRows<'_>> {
        match self {
            Self::Float(tensor) => match tensor.dtype() {
                DType::F32 => tensor.slice().map(WeightRows::F32),
                DType::F16 => tensor.slice().map(WeightRows::F16),
                DType::BF16 => tensor.slice().map(WeightRows::Bf16),
                _ => None,
            },
            Self::Quantized(weight) => {
                let DType::QFloat(scheme) = weight.dtype() else {
                    return None;
                };
                let block = row_block(&scheme, weight.shape()[1])?;
                let values = weight.tensor().as_slice::<i8>()?;
                let scales = weight.scales();
                (scales.len() * block == values.len()).then_some(WeightRows::Integers {
                    values: Ints::Bytes(values),
                    scales: Factors::F32(scales),
                    offsets: None,
                    block,
                })
            }
            Self::Integers(weight) => Some(weight.rows()),
            Self::ByLane(tensor) => {
                let cols = tensor.shape()[1];
                match tensor.dtype() {
                    DType::F32 => {
                        (tensor.slice()).map(|values| WeightRows::F32ByLane { values, cols })
                    }
                    DType::F16 => {
                        (tensor.slice()).map(|values| WeightRows::F16ByLane { values, cols })
                    }
                    DType::BF16 => {
                        (tensor.slice()).map(|values| WeightRows::Bf16ByLane { values, cols })
                    }
                    _ => None,
                }
            }
            // Each part's rows are its own; `project` multiplies them one by one.
            Self::Stacked(_) => None,
        }
    }

    /// The weight as a plain f32 tensor on `device`, for Burn's matmul where the kernels
    /// decline.
    pub fn dense(&self, device: &Device) -> Option<Tensor<2>> {
        if let Self::Stacked(parts) = self {
            let parts = parts.iter().map(|part| part.dense(device));
            return Some(Tensor::cat(parts.collect::<Option<Vec<_>>>()?, 0));
        }
        let rows = self.rows()?;
        let mut values = vec![0.0; rows.len()];
        rows.widen(0, &mut values);
        Some(Tensor::from_data(
            TensorData::new(values, self.dims()),
            device,
        ))
    }
}

impl IntegerWeights {
    /// The same weights with row `i` taken from row `source[i]`, in a form a checkpoint
    /// gives them (bytes, nibbles or six bits, with any factors; rows of whole groups of a K
    /// type's); `None` for five bits, which are packed after. A rotation over part of each
    /// head reorders the query and key rows so.
    pub fn with_rows_from(self, source: &[usize]) -> Option<Self> {
        fn rows_from<T: Copy>(values: &[T], source: &[usize]) -> Vec<T> {
            let width = values.len() / source.len().max(1);
            source
                .iter()
                .flat_map(|&from| &values[from * width..(from + 1) * width])
                .copied()
                .collect()
        }
        // Rows of whole groups, as the loader splits them.
        let factors = |factors: BlockFactors| match factors {
            BlockFactors::F32(values) => Some(BlockFactors::F32(rows_from(&values, source))),
            BlockFactors::Scaled { bases, steps, per } => Some(BlockFactors::Scaled {
                bases: rows_from(&bases, source),
                steps: rows_from(&steps, source),
                per,
            }),
            BlockFactors::F16(values) => Some(BlockFactors::F16(rows_from(&values, source))),
            BlockFactors::F16ByBlock { .. } | BlockFactors::ScaledByBlock { .. } => None,
        };
        let values = match &self.values {
            IntegerValues::Bytes(values) => IntegerValues::Bytes(rows_from(values, source)),
            &IntegerValues::Nibbles { ref values, zero } => IntegerValues::Nibbles {
                values: rows_from(values, source),
                zero,
            },
            &IntegerValues::FiveBits {
                ref nibbles,
                ref high,
                zero,
            } => IntegerValues::FiveBits {
                nibbles: rows_from(nibbles, source),
                high: rows_from(high, source),
                zero,
            },
            // Rows of whole units, as the loader splits them.
            &IntegerValues::SixBits {
                ref nibbles,
                ref crumbs,
                zero,
            } => IntegerValues::SixBits {
                nibbles: rows_from(nibbles, source),
                crumbs: rows_from(crumbs, source),
                zero,
            },
            _ => return None,
        };
        Some(Self {
            values,
            scales: factors(self.scales)?,
            offsets: match self.offsets {
                Some(offsets) => Some(factors(offsets)?),
                None => None,
            },
            ..self
        })
    }

    /// The same weights with their scales and offsets in the smallest form that holds them
    /// exactly (see `BlockFactors`).
    pub fn compacted(self) -> Self {
        let block = self.block;
        Self {
            scales: self.scales.compacted(block),
            offsets: self.offsets.map(|offsets| offsets.compacted(block)),
            ..self
        }
    }

    /// The same weights with 4-, 5- and 8-bit values [`IntegerValues::Interleaved`],
    /// [`IntegerValues::FiveBitsInterleaved`] and [`IntegerValues::BytesInterleaved`] (in
    /// blocks of 32), their factors laid out by block, and stepped 6-bit ones
    /// [`IntegerValues::SixBitsInterleaved`] where this CPU's decode kernel reads them so
    /// (see [`IntegerWeights::interleaved_for`]); as they are otherwise.
    pub fn interleaved(self) -> Self {
        self.interleaved_for(super::features::cpu())
    }

    /// [`IntegerWeights::interleaved`] for the kernels of a CPU with `cpu`'s features
    /// ([`interleaves`]; 4-, 5- and 8-bit rows whose factors can be laid out by block, 6-bit
    /// rows of whole super-blocks, whose steps and bases the AVX2 kernel reads a super-block
    /// at a time), in place, a group of rows at a time on every core. Tests lay weights out
    /// for the AVX2 kernel on every CPU that runs it.
    pub fn interleaved_for(self, cpu: Features) -> Self {
        let [rows, cols] = self.dims;
        let stepped = || {
            let offsets = self.offsets.as_ref().map(BlockFactors::borrowed);
            read_stepped(self.block, self.scales.borrowed(), offsets)
        };
        let blocks = cols / self.block.max(1);
        let by_block = self.scales.can_lay_out_by_block(blocks)
            && (self.offsets.as_ref()).is_none_or(|offsets| offsets.can_lay_out_by_block(blocks));
        let bits = match self.values {
            IntegerValues::Bytes(_) => 8,
            IntegerValues::FiveBits { .. } => 5,
            _ => 4,
        };
        let in_blocks_of_32 = self.block == NIBBLE_BLOCK;
        let values = match self.values {
            values @ (IntegerValues::Nibbles { .. }
            | IntegerValues::FiveBits { .. }
            | IntegerValues::Bytes(_))
                if in_blocks_of_32
                    && by_block
                    && interleaves(cpu, rows, cols, bits, NIBBLE_BLOCK) =>
            {
                return Self {
                    values: values.interleaving(cols),
                    scales: self.scales.by_block(blocks),
                    offsets: self.offsets.map(|offsets| offsets.by_block(blocks)),
                    ..self
                };
            }
            values @ IntegerValues::SixBits { .. }
                if stepped() && interleaves(cpu, rows, cols, 6, SUPER_BLOCK) =>
            {
                values.interleaving(cols)
            }
            values => values,
        };
        Self { values, ..self }
    }

    pub fn rows(&self) -> WeightRows<'_> {
        WeightRows::Integers {
            values: self.values.borrowed(),
            scales: self.scales.borrowed(),
            offsets: self.offsets.as_ref().map(BlockFactors::borrowed),
            block: self.block,
        }
    }

    /// The same weights in four or five bits per value, where every block's values fit
    /// (the Q4 and Q5 types): signed values (-8 to 7, -16 to 15) are shifted up by half the
    /// range, which the kernels take off again (Q4_0, Q5_0). Where only some blocks need the
    /// shift (a stack of Q5_0 and Q5_1 parts) their offsets take `shift · scale` off instead,
    /// exactly (a power-of-two multiple of the scale).
    pub fn packed(self) -> Self {
        let IntegerValues::Bytes(values) = &self.values else {
            return self;
        };
        if self.block != NIBBLE_BLOCK {
            return self;
        }
        // Separate folds of whole blocks, which the compiler vectorizes: a fold of pairs one
        // value at a time, and the packing below written as `extend`, were half of loading a
        // 1.7B Q4_K_M file.
        let ranges: Vec<(i8, i8)> = values
            .par_chunks_exact(NIBBLE_BLOCK)
            .map(|block| {
                let low = block.iter().fold(i8::MAX, |l, &q| l.min(q));
                (low, block.iter().fold(i8::MIN, |h, &q| h.max(q)))
            })
            .collect();
        let Some((bits, shifts)) = [4, 5]
            .into_iter()
            .find_map(|bits| Some((bits, block_shifts(&ranges, bits)?)))
        else {
            return self;
        };
        let half = 1 << (bits - 1);
        let mut nibbles = vec![0u8; values.len() / 2];
        let mut high = vec![0u32; if bits == 5 { ranges.len() } else { 0 }];
        let blocks = values.par_chunks_exact(NIBBLE_BLOCK).zip(&shifts);
        blocks
            .zip(nibbles.par_chunks_exact_mut(NIBBLE_BLOCK / 2))
            .for_each(|((block, &shift), packed)| pack_nibbles(block, shift, packed));
        if bits == 5 {
            high.par_iter_mut()
                .zip(values.par_chunks_exact(NIBBLE_BLOCK).zip(&shifts))
                .for_each(|(word, (block, &shift))| {
                    let stored = |j: usize| (block[j] as u8).wrapping_add(shift);
                    *word = (0..NIBBLE_BLOCK).fold(0, |word, j| {
                        word | u32::from(stored(j) >> 4) << fifth_bit(j)
                    });
                });
        }
        let all_shifted = shifts.iter().all(|&shift| shift == half);
        let zero = if all_shifted { half } else { 0 };
        let values = match bits {
            4 => IntegerValues::Nibbles {
                values: nibbles,
                zero,
            },
            _ => IntegerValues::FiveBits {
                nibbles,
                high,
                zero,
            },
        };
        let offsets = match !all_shifted && shifts.iter().any(|&shift| shift != 0) {
            true => {
                let (scales, offsets) = (
                    self.scales.borrowed(),
                    self.offsets.as_ref().map(BlockFactors::borrowed),
                );
                Some(BlockFactors::F32(
                    shifts
                        .iter()
                        .enumerate()
                        .map(|(b, &shift)| {
                            let offset = offsets.map_or(0.0, |offsets| offsets.get(b));
                            offset - f32::from(shift) * scales.get(b)
                        })
                        .collect(),
                ))
            }
            false => self.offsets,
        };
        Self {
            values,
            offsets,
            ..self
        }
    }
}

/// What [`IntegerValues::SixBits`] adds to Q6_K's values (-32 to 31).
pub const SIX_BIT_ZERO: u8 = 32;

/// Packs whole units of 6-bit values (-32 to 31) as [`IntegerValues::SixBits`] holds them,
/// with a zero of [`SIX_BIT_ZERO`]: half a byte per value into `nibbles`, a quarter into
/// `crumbs`. The loader packs each row of a Q6_K tensor so as it splits it, the type telling
/// it the values fit.
pub fn pack_six_bits(values: &[i8], nibbles: &mut [u8], crumbs: &mut [u8]) {
    let units = values.chunks_exact(NIBBLE_BLOCK);
    let nibbles = nibbles.chunks_exact_mut(NIBBLE_BLOCK / 2);
    for ((unit, nibbles), crumbs) in units.zip(nibbles).zip(crumbs.chunks_exact_mut(CRUMB_BYTES)) {
        // Whole arrays, which the compiler vectorizes: value at a time, packing took a
        // second of loading a 1.7B Q4_K_M file.
        let stored: [u8; NIBBLE_BLOCK] =
            std::array::from_fn(|j| unit[j].wrapping_add(SIX_BIT_ZERO as i8) as u8);
        let (low, high) = stored.split_at(NIBBLE_BLOCK / 2);
        for ((packed, &low), &high) in nibbles.iter_mut().zip(low).zip(high) {
            *packed = low & 0x0F | high << 4;
        }
        let tops = stored.map(|v| v >> 4);
        for (byte, crumb) in crumbs.iter_mut().enumerate() {
            *crumb = (0..4).fold(0, |crumb, q| {
                let j = byte + CRUMB_BYTES * q;
                debug_assert_eq!(crumb_at(j), (byte, 2 * q));
                crumb | (tops[j] & 3) << (2 * q)
            });
        }
    }
}

/// Packs whole blocks of 4-bit values as [`IntegerValues::Nibbles`] holds them, each plus
/// `shift`: a block's first 16 values in the low halves of its 16 bytes, its last 16 in the
/// high ones.
fn pack_nibbles(values: &[i8], shift: u8, nibbles: &mut [u8]) {
    let blocks = values.chunks_exact(NIBBLE_BLOCK);
    for (block, packed) in blocks.zip(nibbles.chunks_exact_mut(NIBBLE_BLOCK / 2)) {
        let (first, second) = block.split_at(NIBBLE_BLOCK / 2);
        for ((packed, &low), &high) in packed.iter_mut().zip(first).zip(second) {
            let (low, high) = (
                (low as u8).wrapping_add(shift),
                (high as u8).wrapping_add(shift),
            );
            *packed = low & 0x0F | high << 4;
        }
    }
}

/// What each block's values are shifted by to be stored in `bits` unsigned bits: 0 where they
/// already fit, half the range where they are signed; `None` where some block fits neither.
fn block_shifts(ranges: &[(i8, i8)], bits: u32) -> Option<Vec<u8>> {
    let (top, half) = ((1i16 << bits) - 1, 1i16 << (bits - 1));
    ranges
        .iter()
        .map(|&(low, high)| {
            let (low, high) = (i16::from(low), i16::from(high));
            if low >= 0 && high <= top {
                Some(0)
            } else if low >= -half && high < half {
                Some(half as u8)
            } else {
                None
            }
        })
        .collect()
}

impl IntegerValues {
    pub fn borrowed(&self) -> Ints<'_> {
        match self {
            Self::Bytes(values) => Ints::Bytes(values),
            &Self::Nibbles { ref values, zero } => Ints::Nibbles { values, zero },
            &Self::FiveBits {
                ref nibbles,
                ref high,
                zero,
            } => Ints::FiveBits {
                nibbles,
                high,
                zero,
            },
            &Self::SixBits {
                ref nibbles,
                ref crumbs,
                zero,
            } => Ints::SixBits {
                nibbles,
                crumbs,
                zero,
            },
            &Self::Interleaved {
                ref values,
                zero,
                cols,
            } => Ints::Interleaved { values, zero, cols },
            &Self::SixBitsInterleaved {
                ref nibbles,
                ref crumbs,
                zero,
                cols,
            } => Ints::SixBitsInterleaved {
                nibbles,
                crumbs,
                zero,
                cols,
            },
            &Self::FiveBitsInterleaved {
                ref nibbles,
                ref high,
                zero,
                cols,
            } => Ints::FiveBitsInterleaved {
                nibbles,
                high,
                zero,
                cols,
            },
            &Self::BytesInterleaved { ref values, cols } => Ints::BytesInterleaved { values, cols },
        }
    }

    /// 4-, 5-, 6- and 8-bit values as [`IntegerValues::Interleaved`],
    /// [`IntegerValues::FiveBitsInterleaved`], [`IntegerValues::SixBitsInterleaved`] and
    /// [`IntegerValues::BytesInterleaved`] lay them out, in whole groups of rows of `cols`
    /// values (bytes in blocks of 32); others as they are. Where the kernels read them so is
    /// [`IntegerWeights::interleaved`]'s to say.
    fn interleaving(self, cols: usize) -> Self {
        match self {
            Self::Nibbles { mut values, zero } => {
                interleave::<{ NIBBLE_BLOCK / 8 }>(&mut values, cols);
                Self::Interleaved { values, zero, cols }
            }
            Self::SixBits {
                mut nibbles,
                mut crumbs,
                zero,
            } => {
                interleave::<{ NIBBLE_BLOCK / 8 }>(&mut nibbles, cols);
                interleave::<{ CRUMB_BYTES / 4 }>(&mut crumbs, cols);
                Self::SixBitsInterleaved {
                    nibbles,
                    crumbs,
                    zero,
                    cols,
                }
            }
            Self::FiveBits {
                mut nibbles,
                mut high,
                zero,
            } => {
                interleave::<{ NIBBLE_BLOCK / 8 }>(&mut nibbles, cols);
                high.par_iter_mut()
                    .for_each(|word| *word = fifth_bits_moved(*word, &TO_INTERLEAVED));
                lay_out_by_block(&mut high, cols / NIBBLE_BLOCK);
                Self::FiveBitsInterleaved {
                    nibbles,
                    high,
                    zero,
                    cols,
                }
            }
            Self::Bytes(mut values) => {
                interleave::<{ NIBBLE_BLOCK / 4 }>(bytemuck::cast_slice_mut(&mut values), cols);
                Self::BytesInterleaved { values, cols }
            }
            values => values,
        }
    }

    /// `values` in blocks of `block` as the loader holds them, with unit scales: in six bits
    /// for blocks of 16 (Q6_K's, packed as they are split), else as
    /// [`IntegerWeights::packed`] stores them.
    #[cfg(test)]
    pub fn packing(values: &[i8], block: usize) -> Self {
        if block == SIX_BIT_BLOCK {
            let mut nibbles = vec![0; values.len() / 2];
            let mut crumbs = vec![0; values.len() / 4];
            pack_six_bits(values, &mut nibbles, &mut crumbs);
            return Self::SixBits {
                nibbles,
                crumbs,
                zero: SIX_BIT_ZERO,
            };
        }
        IntegerWeights {
            dims: [1, values.len()],
            block,
            values: Self::Bytes(values.to_vec()),
            scales: BlockFactors::F32(vec![1.0; values.len() / block]),
            offsets: None,
        }
        .packed()
        .values
    }
}

impl Ints<'_> {
    pub fn len(&self) -> usize {
        match self {
            Self::Bytes(values) | Self::BytesInterleaved { values, .. } => values.len(),
            Self::Nibbles { values, .. } | Self::Interleaved { values, .. } => values.len() * 2,
            Self::FiveBits { nibbles, .. }
            | Self::SixBits { nibbles, .. }
            | Self::SixBitsInterleaved { nibbles, .. }
            | Self::FiveBitsInterleaved { nibbles, .. } => nibbles.len() * 2,
        }
    }

    /// Whether the values are stored in blocks that `block` long blocks of scales can read:
    /// bytes in any, 4- and 5-bit values in blocks of 32, 6-bit ones in blocks of 16.
    pub fn read_in(&self, block: usize) -> bool {
        match self {
            Self::Bytes(_) => true,
            Self::Nibbles { .. }
            | Self::FiveBits { .. }
            | Self::Interleaved { .. }
            | Self::FiveBitsInterleaved { .. }
            | Self::BytesInterleaved { .. } => block == NIBBLE_BLOCK,
            Self::SixBits { .. } | Self::SixBitsInterleaved { .. } => block == SIX_BIT_BLOCK,
        }
    }

    /// The bytes that hold the values `range` (whole blocks of packed values), in each of
    /// the arrays they are packed in (the second empty for bytes and 4-bit values): what a
    /// kernel asks the cache for before it unpacks them.
    pub fn stored(&self, range: Range<usize>) -> [&[u8]; 2] {
        match *self {
            Self::Bytes(values) => [bytemuck::cast_slice(&values[range]), &[]],
            Self::Nibbles { values, .. } => [&values[range.start / 2..range.end / 2], &[]],
            Self::FiveBits { nibbles, high, .. } => [
                &nibbles[range.start / 2..range.end / 2],
                bytemuck::cast_slice(&high[range.start / NIBBLE_BLOCK..range.end / NIBBLE_BLOCK]),
            ],
            Self::SixBits {
                nibbles, crumbs, ..
            } => [
                &nibbles[range.start / 2..range.end / 2],
                &crumbs[range.start / 4..range.end / 4],
            ],
            // The lines of the range's blocks hold every row of the group's: each row asks
            // for a sixteenth of them, so that a group's rows, read in turn, ask for a later
            // group's a piece at a time. With the group's first row asking for all of them,
            // the prompt tile waited on those requests: a piece at a time, a 1.7B Q6_K file's
            // prompts ran 1.04–1.05× as fast.
            Self::Interleaved { values, cols, .. } => {
                let (row, first_row, b, blocks) = interleaved_range(&range, cols);
                let first = interleaved_at(cols, first_row, b, 0);
                [
                    row_share(values, first, blocks * INTERLEAVED_BLOCK_BYTES, row),
                    &[],
                ]
            }
            Self::SixBitsInterleaved {
                nibbles,
                crumbs,
                cols,
                ..
            } => {
                let (row, first_row, b, units) = interleaved_range(&range, cols);
                let first = interleaved_at(cols, first_row, b, 0);
                let first_crumb = interleaved_crumb_at(cols, first_row, b, 0);
                [
                    row_share(nibbles, first, units * INTERLEAVED_BLOCK_BYTES, row),
                    row_share(crumbs, first_crumb, units * INTERLEAVED_CRUMB_BYTES, row),
                ]
            }
            Self::FiveBitsInterleaved {
                nibbles,
                high,
                cols,
                ..
            } => {
                let (row, first_row, b, blocks) = interleaved_range(&range, cols);
                let first = interleaved_at(cols, first_row, b, 0);
                let first_high = 4 * by_block_at(cols / NIBBLE_BLOCK, first_row, b);
                [
                    row_share(nibbles, first, blocks * INTERLEAVED_BLOCK_BYTES, row),
                    row_share(
                        bytemuck::cast_slice(high),
                        first_high,
                        blocks * INTERLEAVED_LINE_BYTES,
                        row,
                    ),
                ]
            }
            Self::BytesInterleaved { values, cols } => {
                let (row, first_row, b, blocks) = interleaved_range(&range, cols);
                let first = interleaved_byte_at(cols, first_row, b, 0);
                let len = blocks * INTERLEAVED_BYTE_BLOCK_BYTES;
                [
                    row_share(bytemuck::cast_slice(values), first, len, row),
                    &[],
                ]
            }
        }
    }

    /// The values of the `block`-long block `b`, as bytes; `unpacked` holds packed values'
    /// (the unit of 32 the block lies in).
    pub fn block<'a>(
        &'a self,
        b: usize,
        block: usize,
        unpacked: &'a mut [i8; NIBBLE_BLOCK],
    ) -> &'a [i8] {
        let start = b * block;
        match self {
            Self::Bytes(values) => &values[start..start + block],
            _ => {
                let unit = start / NIBBLE_BLOCK * NIBBLE_BLOCK;
                self.unpack(unit, unpacked);
                &unpacked[start - unit..][..block]
            }
        }
    }

    /// The values from `start` (whole blocks of packed values, see [`IntegerValues`]) as one
    /// byte each, `zero` taken off, written so that the compiler vectorizes it.
    pub fn unpack(&self, start: usize, bytes: &mut [i8]) {
        let range = start..start + bytes.len();
        match *self {
            Self::Bytes(values) => bytes.copy_from_slice(&values[range]),
            Self::Nibbles { values, zero } => {
                let nibbles = &values[range.start / 2..range.end / 2];
                assert_eq!(nibbles.len() * 2, bytes.len(), "whole blocks");
                #[cfg(target_arch = "x86_64")]
                if super::features::cpu().avx2 {
                    // SAFETY: the CPU has AVX2; the lengths are whole blocks, checked above.
                    return unsafe { super::math::nibbles_as_bytes(nibbles, zero, bytes) };
                }
                nibbles_as_bytes(nibbles, zero, bytes);
            }
            Self::FiveBits {
                nibbles,
                high,
                zero,
            } => {
                let nibbles = &nibbles[range.start / 2..range.end / 2];
                let high = &high[range.start / NIBBLE_BLOCK..range.end / NIBBLE_BLOCK];
                assert_eq!(high.len() * NIBBLE_BLOCK, bytes.len(), "whole blocks");
                #[cfg(target_arch = "x86_64")]
                if super::features::cpu().avx2 {
                    // SAFETY: the CPU has AVX2; the lengths are whole blocks, checked above.
                    return unsafe { super::math::five_bits_as_bytes(nibbles, high, zero, bytes) };
                }
                let nibbles = nibbles.chunks_exact(NIBBLE_BLOCK / 2);
                let blocks = bytes.chunks_exact_mut(NIBBLE_BLOCK);
                for ((packed, &high), block) in nibbles.zip(high).zip(blocks) {
                    unpack_block(packed, high, zero, block);
                }
            }
            Self::SixBits {
                nibbles,
                crumbs,
                zero,
            } => {
                let nibbles = &nibbles[range.start / 2..range.end / 2];
                let crumbs = &crumbs[range.start / 4..range.end / 4];
                assert_eq!(crumbs.len() * 4, bytes.len(), "whole units");
                #[cfg(target_arch = "x86_64")]
                if super::features::cpu().avx2 {
                    // SAFETY: the CPU has AVX2; the lengths are whole units, checked above.
                    return unsafe { super::math::six_bits_as_bytes(nibbles, crumbs, zero, bytes) };
                }
                six_bits_as_bytes(nibbles, crumbs, zero, bytes);
            }
            // The row's blocks gathered back in order, a piece at a time, and unpacked as
            // plain nibbles.
            Self::Interleaved { values, zero, cols } => {
                let mut plain = [0u8; UNPACKED_PIECE / 2];
                for (p, bytes) in bytes.chunks_mut(UNPACKED_PIECE).enumerate() {
                    let at = start + p * UNPACKED_PIECE;
                    let (row, first) = (at / cols, at % cols / NIBBLE_BLOCK);
                    let nibbles = &mut plain[..bytes.len() / 2];
                    gather_interleaved::<{ NIBBLE_BLOCK / 2 }>(values, cols, row, first, nibbles);
                    Ints::Nibbles {
                        values: nibbles,
                        zero,
                    }
                    .unpack(0, bytes);
                }
            }
            Self::SixBitsInterleaved {
                nibbles,
                crumbs,
                zero,
                cols,
            } => {
                let mut plain = [0u8; UNPACKED_PIECE / 2];
                let mut plain_crumbs = [0u8; UNPACKED_PIECE / 4];
                for (p, bytes) in bytes.chunks_mut(UNPACKED_PIECE).enumerate() {
                    let at = start + p * UNPACKED_PIECE;
                    let (row, first) = (at / cols, at % cols / NIBBLE_BLOCK);
                    let plain = &mut plain[..bytes.len() / 2];
                    let plain_crumbs = &mut plain_crumbs[..bytes.len() / 4];
                    gather_interleaved::<{ NIBBLE_BLOCK / 2 }>(nibbles, cols, row, first, plain);
                    gather_interleaved::<CRUMB_BYTES>(crumbs, cols, row, first, plain_crumbs);
                    Ints::SixBits {
                        nibbles: plain,
                        crumbs: plain_crumbs,
                        zero,
                    }
                    .unpack(0, bytes);
                }
            }
            Self::FiveBitsInterleaved {
                nibbles,
                high,
                zero,
                cols,
            } => {
                let mut plain = [0u8; UNPACKED_PIECE / 2];
                let mut plain_high = [0u32; UNPACKED_PIECE / NIBBLE_BLOCK];
                for (p, bytes) in bytes.chunks_mut(UNPACKED_PIECE).enumerate() {
                    let at = start + p * UNPACKED_PIECE;
                    let (row, first) = (at / cols, at % cols / NIBBLE_BLOCK);
                    let plain = &mut plain[..bytes.len() / 2];
                    let plain_high = &mut plain_high[..bytes.len() / NIBBLE_BLOCK];
                    gather_interleaved::<{ NIBBLE_BLOCK / 2 }>(nibbles, cols, row, first, plain);
                    for (b, word) in plain_high.iter_mut().enumerate() {
                        let stored = high[by_block_at(cols / NIBBLE_BLOCK, row, first + b)];
                        *word = fifth_bits_moved(stored, &FROM_INTERLEAVED);
                    }
                    Ints::FiveBits {
                        nibbles: plain,
                        high: plain_high,
                        zero,
                    }
                    .unpack(0, bytes);
                }
            }
            Self::BytesInterleaved { values, cols } => {
                let values = bytemuck::cast_slice(values);
                for (b, block) in bytes.chunks_exact_mut(NIBBLE_BLOCK).enumerate() {
                    let at = start + b * NIBBLE_BLOCK;
                    let (row, first) = (at / cols, at % cols / NIBBLE_BLOCK);
                    let block = bytemuck::cast_slice_mut(block);
                    gather_interleaved::<NIBBLE_BLOCK>(values, cols, row, first, block);
                }
            }
        }
    }

    /// The values from `start` (whole blocks of 32 of one row) as 16-bit words, `zero`
    /// taken off, each times its block of 16's step where `steps` holds one per 16 values:
    /// a prompt tile's rows, widened in one pass from where they are stored. Gathered from
    /// interleaved rows, unpacked to bytes and then widened, in three passes, a 1.7B Q6_K
    /// file's rows took a sixth of its prompts' time.
    ///
    /// # Safety
    /// The CPU must have AVX2.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    pub unsafe fn widen(&self, start: usize, steps: Option<&[i8]>, words: &mut [i16]) {
        use super::math::{
            unpack_five_bits, unpack_five_bits_interleaved, unpack_nibbles, unpack_six_bits,
        };
        use std::arch::x86_64::*;
        let (len, blocks) = (words.len(), words.len() / NIBBLE_BLOCK);
        assert!(
            start.is_multiple_of(NIBBLE_BLOCK) && len.is_multiple_of(NIBBLE_BLOCK),
            "whole blocks"
        );
        if let Some(steps) = steps {
            assert_eq!(steps.len() * SIX_BIT_BLOCK, len, "a step per 16 values");
        }
        let zero = |zero: u8| _mm256_set1_epi16(i16::from(zero));
        let out = words.as_mut_ptr();
        // SAFETY (every `put`): block `b` of `words` is in range, as is its pair of steps.
        match *self {
            Self::Bytes(values) => {
                let values = &values[start..start + len];
                for b in 0..blocks {
                    // SAFETY: block `b` lies inside `values`.
                    let halves = [0, 16].map(|h| unsafe {
                        let at = values.as_ptr().add(NIBBLE_BLOCK * b + h);
                        _mm256_cvtepi8_epi16(_mm_loadu_si128(at.cast()))
                    });
                    unsafe { put_words(halves, steps, b, out) };
                }
            }
            Self::Nibbles { values, zero: z } => {
                let nibbles = &values[start / 2..(start + len) / 2];
                for b in 0..blocks {
                    // SAFETY: block `b`'s 16 bytes lie inside `nibbles`.
                    let packed = unsafe { _mm_loadu_si128(nibbles.as_ptr().add(16 * b).cast()) };
                    unsafe { put_words(unpack_nibbles(packed, zero(z)), steps, b, out) };
                }
            }
            Self::FiveBits {
                nibbles,
                high,
                zero: z,
            } => {
                let nibbles = &nibbles[start / 2..(start + len) / 2];
                let high = &high[start / NIBBLE_BLOCK..][..blocks];
                for (b, &high) in high.iter().enumerate() {
                    // SAFETY: block `b`'s 16 bytes lie inside `nibbles`.
                    let packed = unsafe { _mm_loadu_si128(nibbles.as_ptr().add(16 * b).cast()) };
                    let halves = unpack_five_bits(packed, high, zero(z));
                    unsafe { put_words(halves, steps, b, out) };
                }
            }
            Self::SixBits {
                nibbles,
                crumbs,
                zero: z,
            } => {
                let nibbles = &nibbles[start / 2..(start + len) / 2];
                let crumbs = &crumbs[start / 4..(start + len) / 4];
                for b in 0..blocks {
                    // SAFETY: unit `b`'s 16 bytes of nibbles and 8 of crumbs lie inside them.
                    let (packed, crumbs) = unsafe {
                        let crumbs = crumbs.as_ptr().add(CRUMB_BYTES * b);
                        (
                            _mm_loadu_si128(nibbles.as_ptr().add(16 * b).cast()),
                            crumbs.cast::<u64>().read_unaligned(),
                        )
                    };
                    let halves = unpack_six_bits(packed, crumbs, zero(z));
                    unsafe { put_words(halves, steps, b, out) };
                }
            }
            Self::Interleaved {
                values,
                zero: z,
                cols,
            } => {
                let (row, first) = interleaved_span(start, len, cols);
                let last = interleaved_at(cols, row, first + blocks - 1, NIBBLE_BLOCK / 2 - 1);
                assert!(last < values.len(), "the row's blocks");
                for b in 0..blocks {
                    let at = interleaved_at(cols, row, first + b, 0);
                    // SAFETY: the block's four lines lie before the last block's last byte.
                    let packed = unsafe { interleaved_lines::<4>(values, at) };
                    unsafe { put_words(unpack_nibbles(packed, zero(z)), steps, b, out) };
                }
            }
            Self::SixBitsInterleaved {
                nibbles,
                crumbs,
                zero: z,
                cols,
            } => {
                let (row, first) = interleaved_span(start, len, cols);
                let last = interleaved_at(cols, row, first + blocks - 1, NIBBLE_BLOCK / 2 - 1);
                let last_crumb =
                    interleaved_crumb_at(cols, row, first + blocks - 1, CRUMB_BYTES - 1);
                assert!(
                    last < nibbles.len() && last_crumb < crumbs.len(),
                    "the row's units"
                );
                for b in 0..blocks {
                    let at = interleaved_at(cols, row, first + b, 0);
                    let crumbs_at = interleaved_crumb_at(cols, row, first + b, 0);
                    // SAFETY: the unit's lines lie before its last unit's last bytes.
                    let (packed, crumbs) = unsafe {
                        let crumbs = interleaved_lines::<2>(crumbs, crumbs_at);
                        (
                            interleaved_lines::<4>(nibbles, at),
                            _mm_cvtsi128_si64(crumbs) as u64,
                        )
                    };
                    let halves = unpack_six_bits(packed, crumbs, zero(z));
                    unsafe { put_words(halves, steps, b, out) };
                }
            }
            Self::FiveBitsInterleaved {
                nibbles,
                high,
                zero: z,
                cols,
            } => {
                let (row, first) = interleaved_span(start, len, cols);
                let last = interleaved_at(cols, row, first + blocks - 1, NIBBLE_BLOCK / 2 - 1);
                assert!(last < nibbles.len(), "the row's blocks");
                for b in 0..blocks {
                    let at = interleaved_at(cols, row, first + b, 0);
                    // SAFETY: the block's four lines lie before the last block's last byte.
                    let packed = unsafe { interleaved_lines::<4>(nibbles, at) };
                    let high = high[by_block_at(cols / NIBBLE_BLOCK, row, first + b)];
                    let halves = unpack_five_bits_interleaved(packed, high, zero(z));
                    unsafe { put_words(halves, steps, b, out) };
                }
            }
            Self::BytesInterleaved { values, cols } => {
                let (row, first) = interleaved_span(start, len, cols);
                let last = interleaved_byte_at(cols, row, first + blocks - 1, NIBBLE_BLOCK - 1);
                assert!(last < values.len(), "the row's blocks");
                let values = bytemuck::cast_slice(values);
                for b in 0..blocks {
                    let at = interleaved_byte_at(cols, row, first + b, 0);
                    // SAFETY: the block's eight lines lie before the last block's last byte.
                    let halves = unsafe {
                        [0, 4].map(|k| {
                            let sixteen =
                                interleaved_lines::<4>(values, at + k * INTERLEAVED_LINE_BYTES);
                            _mm256_cvtepi8_epi16(sixteen)
                        })
                    };
                    unsafe { put_words(halves, steps, b, out) };
                }
            }
        }
    }
}

/// The row of values `start..start + len` of interleaved rows of `cols` values, and its first
/// block, checked to lie in one row.
fn interleaved_span(start: usize, len: usize, cols: usize) -> (usize, usize) {
    assert!(start % cols + len <= cols, "values of one row");
    (start / cols, start % cols / NIBBLE_BLOCK)
}

/// A row's `LINES` groups of four bytes from interleaved lines starting at `at` (see
/// [`interleaved_in`]), in order, in the low lanes of a vector.
///
/// # Safety
/// The CPU must have AVX2; the lines' bytes must lie inside `values`.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn interleaved_lines<const LINES: usize>(
    values: &[u8],
    at: usize,
) -> std::arch::x86_64::__m128i {
    use std::arch::x86_64::*;
    // SAFETY: the caller's.
    let four = |k: usize| unsafe {
        (values.as_ptr().add(at + k * INTERLEAVED_LINE_BYTES))
            .cast::<i32>()
            .read_unaligned()
    };
    match LINES {
        2 => _mm_setr_epi32(four(0), four(1), 0, 0),
        _ => _mm_setr_epi32(four(0), four(1), four(2), four(3)),
    }
}

/// Block `b`'s two halves of 16-bit words into `words`, each times its step where `steps`
/// holds one per 16 values.
///
/// # Safety
/// The CPU must have AVX2; `words` must hold block `b`, and `steps` its two steps.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn put_words(
    halves: [std::arch::x86_64::__m256i; 2],
    steps: Option<&[i8]>,
    b: usize,
    words: *mut i16,
) {
    use std::arch::x86_64::*;
    for (h, half) in halves.into_iter().enumerate() {
        let half = match steps {
            Some(steps) => _mm256_mullo_epi16(half, _mm256_set1_epi16(i16::from(steps[2 * b + h]))),
            None => half,
        };
        // SAFETY: the caller's.
        unsafe { _mm256_storeu_si256(words.add(NIBBLE_BLOCK * b + 16 * h).cast(), half) };
    }
}

/// Where the values `range` of interleaved rows of `cols` values lie: their row, the first
/// row of its group, their first block and their count of blocks.
fn interleaved_range(range: &Range<usize>, cols: usize) -> (usize, usize, usize, usize) {
    let row = range.start / cols;
    let first_row = row / INTERLEAVED_ROWS * INTERLEAVED_ROWS;
    (
        row,
        first_row,
        range.start % cols / NIBBLE_BLOCK,
        range.len() / NIBBLE_BLOCK,
    )
}

/// Row `row`'s sixteenth of the `len` bytes of its group of interleaved rows from `first`.
fn row_share(values: &[u8], first: usize, len: usize, row: usize) -> &[u8] {
    let share = len / INTERLEAVED_ROWS;
    let start = (first + row % INTERLEAVED_ROWS * share).min(values.len());
    &values[start..(start + share).min(values.len())]
}

/// The values [`Ints::unpack`] gathers from interleaved rows at a time, on the stack.
const UNPACKED_PIECE: usize = 64 * NIBBLE_BLOCK;

/// Blocks of 4-bit values (see [`IntegerValues::Nibbles`]) as one byte per value, `zero`
/// taken off, on any CPU.
fn nibbles_as_bytes(nibbles: &[u8], zero: u8, bytes: &mut [i8]) {
    let nibbles = nibbles.chunks_exact(NIBBLE_BLOCK / 2);
    for (packed, block) in nibbles.zip(bytes.chunks_exact_mut(NIBBLE_BLOCK)) {
        unpack_block(packed, 0, zero, block);
    }
}

/// Units of 6-bit values (see [`IntegerValues::SixBits`]) as one byte per value, `zero` taken
/// off, on any CPU.
fn six_bits_as_bytes(nibbles: &[u8], crumbs: &[u8], zero: u8, bytes: &mut [i8]) {
    let nibbles = nibbles.chunks_exact(NIBBLE_BLOCK / 2);
    let crumbs = crumbs.chunks_exact(CRUMB_BYTES);
    let units = bytes.chunks_exact_mut(NIBBLE_BLOCK);
    for ((packed, crumbs), unit) in nibbles.zip(crumbs).zip(units) {
        unpack_block(packed, 0, 0, unit);
        for (j, value) in unit.iter_mut().enumerate() {
            let (byte, bit) = crumb_at(j);
            let top = (crumbs[byte] >> bit & 3) << 4;
            *value = (*value as u8 | top) as i8 - zero as i8;
        }
    }
}

/// One block of packed values: the low four bits from `nibbles`, the fifth from `high` (see
/// [`fifth_bit`]; zeros for 4-bit values), less `zero`.
#[inline(always)]
fn unpack_block(nibbles: &[u8], high: u32, zero: u8, block: &mut [i8]) {
    let zero = zero as i8;
    let (low, upper) = block.split_at_mut(NIBBLE_BLOCK / 2);
    for (j, ((&byte, low), upper)) in nibbles.iter().zip(low).zip(upper).enumerate() {
        let fifth = |j: usize| ((high >> fifth_bit(j)) as u8 & 1) << 4;
        *low = ((byte & 0x0F) | fifth(j)) as i8 - zero;
        *upper = ((byte >> 4) | fifth(j + 16)) as i8 - zero;
    }
}

impl WeightRows<'_> {
    pub fn len(&self) -> usize {
        match self {
            Self::F32(values) => values.len(),
            Self::F16(values) => values.len(),
            Self::Bf16(values) => values.len(),
            Self::F32ByLane { values, .. } => values.len(),
            Self::F16ByLane { values, .. } => values.len(),
            Self::Bf16ByLane { values, .. } => values.len(),
            Self::Integers { values, .. } => values.len(),
        }
    }

    /// The f32 elements from `start`, when they are stored as f32 and need no copy.
    pub fn as_f32(&self, start: usize, len: usize) -> Option<&[f32]> {
        match self {
            Self::F32(values) => values.get(start..start + len),
            _ => None,
        }
    }

    /// Writes the elements `start..start + out.len()` (row-major) into `out` as f32; both
    /// bounds fall on row boundaries.
    pub fn widen(&self, start: usize, out: &mut [f32]) {
        let range = start..start + out.len();
        match self {
            Self::F32(values) => out.copy_from_slice(&values[range]),
            Self::F16(values) => values[range].convert_to_f32_slice(out),
            Self::Bf16(values) => values[range].convert_to_f32_slice(out),
            &Self::F32ByLane { values, cols } => by_lane_back(values, cols, start, out),
            &Self::F16ByLane { values, cols } => by_lane_back(values, cols, start, out),
            &Self::Bf16ByLane { values, cols } => by_lane_back(values, cols, start, out),
            Self::Integers {
                values,
                scales,
                offsets,
                block,
            } => {
                // Rows hold whole blocks, so `start` is where a block begins.
                let first = start / block;
                let mut unpacked = [0; NIBBLE_BLOCK];
                for (b, out) in out.chunks_exact_mut(*block).enumerate() {
                    let b = first + b;
                    let (scale, offset) =
                        (scales.get(b), offsets.map_or(0.0, |offsets| offsets.get(b)));
                    for (out, &value) in out.iter_mut().zip(values.block(b, *block, &mut unpacked))
                    {
                        *out = scale * f32::from(value) + offset;
                    }
                }
            }
        }
    }
}

/// Elements `start..start + out.len()` of rows laid out by lane ([`by_lane_at`]), in rows
/// again: the rows of `out` and of `values` have as many columns.
fn by_lane_back<E: HostFloat>(values: &[E], cols: usize, start: usize, out: &mut [f32]) {
    let first = start / cols.max(1);
    for (row, out) in (first..).zip(out.chunks_exact_mut(cols)) {
        for (col, out) in out.iter_mut().enumerate() {
            *out = values[by_lane_at::<E>(cols, row, col)].to_f32();
        }
    }
}

/// The block length when `scheme` is symmetric 8-bit with blocks along rows only and no
/// second, per-tensor scale: the scheme `--precision q8` uses on the CPU.
pub fn row_block(scheme: &QuantScheme, cols: usize) -> Option<usize> {
    let eight_bit = matches!(scheme.value, QuantValue::Q8S | QuantValue::Q8F);
    let plain = scheme.mode == QuantMode::Symmetric
        && scheme.store == QuantStore::Native
        && scheme.tensor_scale().is_none();
    let block = scheme.block_size()?.to_dim_vec(2);
    let block = match block.as_slice() {
        [1, block] if *block > 0 => usize::from(*block),
        _ => return None,
    };
    (eight_bit && plain && cols.is_multiple_of(block)).then_some(block)
}

#[cfg(test)]
mod tests {
    use half::{bf16, f16};

    use super::{
        BlockFactors, FROM_INTERLEAVED, HostFloat, IntegerValues, IntegerWeights, TO_INTERLEAVED,
        WeightRows, by_lane_at, fifth_bit, fifth_bits_in_order, fifth_bits_moved,
        interleaved_fifth_bit, lay_out_by_lane, square_by_lane, square_one_by_one,
    };

    fn widened(weights: &IntegerWeights) -> Vec<f32> {
        let mut out = vec![f32::NAN; weights.dims[0] * weights.dims[1]];
        weights.rows().widen(0, &mut out);
        out
    }

    fn weights(values: Vec<i8>, offsets: Option<Vec<f32>>) -> IntegerWeights {
        let blocks = values.len() / 32;
        IntegerWeights {
            dims: [2, values.len() / 2],
            block: 32,
            scales: BlockFactors::F32((0..blocks).map(|b| 0.5 + b as f32 * 0.25).collect()),
            offsets: offsets.map(BlockFactors::F32),
            values: IntegerValues::Bytes(values),
        }
    }

    /// Every element lands where `by_lane_at` says, a group's elements stay in their group,
    /// and rows widened from any row on are the rows as they were. bf16 rows (of 80 columns:
    /// two blocks of pairs, then sixteen alone) keep each element too.
    #[test]
    fn floats_laid_out_by_lane_widen_back_to_their_rows() {
        let (rows, cols) = (48, 80);
        let plain: Vec<f32> = (0..rows * cols).map(|i| i as f32).collect();
        let mut laid_out = plain.clone();
        lay_out_by_lane(&mut laid_out, cols);
        // Every bit pattern up to 3840 is a finite bf16 of its own.
        let brains: Vec<bf16> = (0..rows * cols)
            .map(|i| bf16::from_bits(i as u16))
            .collect();
        let mut brains_laid_out = brains.clone();
        lay_out_by_lane(&mut brains_laid_out, cols);
        for row in 0..rows {
            for col in 0..cols {
                let at = by_lane_at::<f32>(cols, row, col);
                assert_eq!(laid_out[at], plain[row * cols + col], "({row}, {col})");
                assert_eq!(at / (16 * cols), row / 16);
                let at = by_lane_at::<bf16>(cols, row, col);
                assert_eq!(
                    brains_laid_out[at],
                    brains[row * cols + col],
                    "bf16 ({row}, {col})"
                );
                assert_eq!(at / (16 * cols), row / 16);
            }
        }
        // Lane 1 of a bf16 group takes columns 2 and 3, then 34 and 35, then 65.
        let lane_one: Vec<usize> = (0..5)
            .map(|step| by_lane_at::<f32>(cols, 0, step * 16 + 1))
            .collect();
        let columns = [2, 3, 34, 35, 65].map(|col| by_lane_at::<bf16>(cols, 0, col));
        assert_eq!(columns.to_vec(), lane_one);
        let halves: Vec<f16> = laid_out.iter().map(|&v| f16::from_f32(v)).collect();
        for (first, count) in [(0, rows), (17, 3), (47, 1)] {
            let start = first * cols;
            let mut out = vec![f32::NAN; count * cols];
            let want = &plain[start..start + count * cols];
            WeightRows::F32ByLane {
                values: &laid_out,
                cols,
            }
            .widen(start, &mut out);
            assert_eq!(out, want);
            WeightRows::F16ByLane {
                values: &halves,
                cols,
            }
            .widen(start, &mut out);
            let want: Vec<f32> = want.iter().map(|&v| f16::from_f32(v).to_f32()).collect();
            assert_eq!(out, want);
            WeightRows::Bf16ByLane {
                values: &brains_laid_out,
                cols,
            }
            .widen(start, &mut out);
            let want: Vec<f32> = brains[start..start + count * cols]
                .iter()
                .map(|v| v.to_f32())
                .collect();
            assert_eq!(out, want);
        }
    }

    /// The squares transposed in registers are those transposed an element at a time, for
    /// 16- and 32-bit values, at every step of a group.
    #[test]
    fn squares_by_lane_in_registers_match_one_by_one() {
        fn check<T: HostFloat>(cols: usize) {
            let plain: Vec<T> = crate::model::cpu::test_values(16 * cols, 7)
                .into_iter()
                .map(T::from_f32)
                .collect();
            let (mut fast, mut slow) = (
                vec![T::zeroed(); plain.len()],
                vec![T::zeroed(); plain.len()],
            );
            for step in 0..cols / 16 {
                square_by_lane(&plain, &mut fast, step);
                square_one_by_one(&plain, &mut slow, step);
            }
            let bits = |v: &[T]| bytemuck::cast_slice::<T, u8>(v).to_vec();
            assert_eq!(bits(&fast), bits(&slow), "{cols} columns");
        }
        for cols in [16, 48, 576] {
            check::<f32>(cols);
            check::<f16>(cols);
            check::<bf16>(cols);
        }
    }

    #[test]
    fn fifth_bits_in_order_moves_each_bit_where_fifth_bit_says() {
        for j in 0..32 {
            assert_eq!(
                fifth_bits_in_order(1 << j),
                1 << fifth_bit(j),
                "element {j}"
            );
        }
        let word = 0x9E37_79B9;
        let one_by_one = (0..32).fold(0, |out, j| out | ((word >> j) & 1) << fifth_bit(j));
        assert_eq!(fifth_bits_in_order(word), one_by_one);
    }

    /// The interleaved order of fifth bits gives each element a bit of its own, a word moves
    /// into it as it would bit by bit, and back to the word it was.
    #[test]
    fn the_interleaved_order_of_fifth_bits_is_a_permutation() {
        let mut bits: Vec<usize> = (0..32).map(interleaved_fifth_bit).collect();
        bits.sort_unstable();
        assert_eq!(bits, (0..32).collect::<Vec<_>>());
        for word in [0x9E37_79B9, 1, 0x8000_0000, u32::MAX] {
            let one_by_one = (0..32).fold(0, |out, j| {
                out | (word >> fifth_bit(j) & 1) << interleaved_fifth_bit(j)
            });
            let moved = fifth_bits_moved(word, &TO_INTERLEAVED);
            assert_eq!(moved, one_by_one);
            assert_eq!(fifth_bits_moved(moved, &FROM_INTERLEAVED), word);
        }
    }

    /// Q4_0's values (-8 to 7, no offsets) and Q4_1's (0 to 15, offsets) pack into nibbles,
    /// Q5_0's and Q5_1's (-16 to 15, 0 to 31) into five bits, that widen to the very same
    /// weights; wider ones stay bytes.
    #[test]
    fn four_and_five_bit_blocks_pack_exactly_and_wider_ones_stay_bytes() {
        let quarter = || Some(vec![-1.5, 0.25, 3.0, -0.125]);
        for bits in [4, 5] {
            let (range, half) = (1i32 << bits, 1i8 << (bits - 1));
            let signed: Vec<i8> = (0..128).map(|i| (i * 5 % range) as i8 - half).collect();
            let unsigned: Vec<i8> = (0..128).map(|i| (i * 7 % range) as i8).collect();
            let mixed: Vec<i8> = signed[..64]
                .iter()
                .chain(&unsigned[64..])
                .copied()
                .collect();
            // The zero each packing takes, and whether it has offsets.
            let cases = [
                (signed, None, half as u8, false),
                (unsigned, quarter(), 0, true),
                (mixed, None, 0, true),
            ];
            for (values, offsets, zero, with_offsets) in cases {
                let bytes = weights(values.clone(), offsets.clone());
                let packed = weights(values, offsets).packed();
                match (bits, &packed.values) {
                    (
                        4,
                        &IntegerValues::Nibbles {
                            ref values,
                            zero: z,
                        },
                    ) => {
                        assert_eq!((values.len(), z), (64, zero));
                    }
                    (
                        5,
                        &IntegerValues::FiveBits {
                            ref nibbles,
                            ref high,
                            zero: z,
                        },
                    ) => assert_eq!((nibbles.len(), high.len(), z), (64, 4, zero)),
                    (_, other) => panic!("{bits} bits packed as {other:?}"),
                }
                assert_eq!(packed.offsets.is_some(), with_offsets);
                assert_eq!(widened(&packed), widened(&bytes));
                // Reordered rows (a partial rotation's query and key rows) stay packed.
                let reordered = packed.with_rows_from(&[1, 0]).expect("packed rows reorder");
                let want = bytes.with_rows_from(&[1, 0]).expect("bytes reorder");
                assert!(!matches!(reordered.values, IntegerValues::Bytes(_)));
                assert_eq!(widened(&reordered), widened(&want));
            }
        }
        let six_bit: Vec<i8> = (0..128).map(|i| (i % 64) as i8 - 32).collect();
        let packed = weights(six_bit, None).packed();
        assert!(matches!(packed.values, IntegerValues::Bytes(_)));
    }

    /// 4-bit values unpack to the very values packed, on the vectorized path and the
    /// portable one, for even and odd counts of blocks.
    #[test]
    fn nibbles_unpack_to_the_values_packed() {
        for blocks in [1, 2, 3, 6] {
            let centred: Vec<i8> = (0..32 * blocks)
                .map(|i| ((i * 11) % 16) as i8 - 8)
                .collect();
            let packed = IntegerValues::packing(&centred, 32);
            let IntegerValues::Nibbles { values, zero } = &packed else {
                panic!("packed as {packed:?}");
            };
            let mut portable = vec![0; centred.len()];
            super::nibbles_as_bytes(values, *zero, &mut portable);
            let mut fastest = vec![0; centred.len()];
            packed.borrowed().unpack(0, &mut fastest);
            assert_eq!(
                (&portable, &fastest),
                (&centred, &centred),
                "{blocks} blocks"
            );
        }
    }

    /// Q6_K's values (-32 to 31 in blocks of 16) pack into six bits that widen to the very
    /// same weights.
    #[test]
    fn six_bit_blocks_of_sixteen_pack_exactly() {
        let in_blocks_of_16 = |values: IntegerValues, cols: usize| {
            let len = values.borrowed().len();
            IntegerWeights {
                dims: [len / cols, cols],
                block: 16,
                scales: BlockFactors::F32((0..len / 16).map(|b| 0.5 - b as f32).collect()),
                offsets: None,
                values,
            }
        };
        let six_bit: Vec<i8> = (0..192).map(|i| ((i * 29) % 64) as i8 - 32).collect();
        let bytes = in_blocks_of_16(IntegerValues::Bytes(six_bit.clone()), 64);
        let packed = in_blocks_of_16(IntegerValues::packing(&six_bit, 16), 64);
        match &packed.values {
            IntegerValues::SixBits {
                nibbles,
                crumbs,
                zero: 32,
            } => assert_eq!((nibbles.len(), crumbs.len()), (96, 48)),
            other => panic!("packed as {other:?}"),
        }
        assert_eq!(widened(&packed), widened(&bytes));
        let values = packed.values.borrowed();
        let mut unpacked = vec![0; 64];
        values.unpack(64, &mut unpacked);
        assert_eq!(unpacked, six_bit[64..128]);
        let mut unit = [0; 32];
        assert_eq!(values.block(5, 16, &mut unit), &six_bit[80..96]);
        // The portable unpacking, which this CPU may not take.
        if let IntegerValues::SixBits {
            nibbles,
            crumbs,
            zero,
        } = &packed.values
        {
            let mut all = vec![0; six_bit.len()];
            super::six_bits_as_bytes(nibbles, crumbs, *zero, &mut all);
            assert_eq!(all, six_bit);
        }

        // Reordered rows (a partial rotation's query and key rows) stay six bits.
        let reordered = packed
            .with_rows_from(&[2, 0, 1])
            .expect("six bits reorder by rows");
        let want = bytes
            .with_rows_from(&[2, 0, 1])
            .expect("bytes reorder by rows");
        assert!(matches!(reordered.values, IntegerValues::SixBits { .. }));
        assert_eq!(widened(&reordered), widened(&want));
    }

    /// A K type's factors (an f16 per super-block times small integers, signed for Q6_K's
    /// scales, -128 among them, and Q4_K's negated minimums) compact to bases and steps that
    /// give every one back exactly, over any range; f16 values compact to f16 and others stay
    /// f32.
    #[test]
    fn factors_compact_to_the_smallest_exact_form() {
        let bases = [0.000_732_4, -0.013_3, 0.0, 2.5e-5].map(|b| f16::from_f32(b).to_f32());
        let unsigned = bases
            .iter()
            .enumerate()
            .flat_map(|(g, &base)| (0..8).map(move |j| base * ((g * 7 + j * 13) % 64) as f32));
        let signed_base = f16::from_f32(0.004_1).to_f32();
        let signed = (0..8).map(|j| signed_base * ((j - 4) * 29) as f32);
        // Q6_K's: the largest block scale is -128 (the super-block's scale is negative).
        let q6_base = f16::from_f32(-0.000_93).to_f32();
        let q6 = [-128, 5, 127, -3, 64, 0, -77, 1].map(|step| q6_base * step as f32);
        let k_type: Vec<f32> = unsigned.chain(signed).chain(q6).collect();
        let halves = [0.5, -0.25, 3.0, 1e-3]
            .map(|v| f16::from_f32(v).to_f32())
            .to_vec();
        let arbitrary = vec![0.1f32, 1.0 / 3.0, 7.1, -2.2, 0.3, 0.01, 0.7, 9.9];
        for (values, block) in [(k_type, 32), (halves, 32), (arbitrary, 32)] {
            let compacted = BlockFactors::F32(values.clone()).compacted(block);
            let factors = compacted.borrowed();
            match (&compacted, values.len()) {
                (BlockFactors::Scaled { .. }, 48) | (BlockFactors::F16(_), 4) => {}
                (BlockFactors::F32(_), 8) => {}
                (other, _) => panic!("{values:?} compacted to {other:?}"),
            }
            let all: Vec<f32> = (0..values.len()).map(|i| factors.get(i)).collect();
            assert_eq!(all, values);
            let mut buffer = Vec::new();
            // Every range, so that each may start and end part-way through a group.
            for start in 0..values.len() {
                for end in start..=values.len() {
                    let range = start..end;
                    assert_eq!(
                        factors.f32s(range.clone(), &mut buffer),
                        &values[range.clone()]
                    );
                    let ranged = factors.range(range.clone());
                    assert_eq!(ranged.f32s(0..ranged.len(), &mut buffer), &values[range]);
                }
            }
        }
    }

    /// A prompt tile's rows widen to the values stored, times their steps where given, and
    /// unpack to them, from every layout: bytes, 4-, 5- and 6-bit values, and each
    /// interleaved (built here whatever this CPU's kernels read), in a row of a later group
    /// of rows and from a block inside it.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn rows_widen_to_the_values_stored_from_every_layout() {
        assert!(
            super::super::features::cpu().avx2,
            "the prompt tiles need AVX2"
        );
        let (rows, cols) = (32, 512);
        let len = rows * cols;
        let of = |bits: u32, seed: usize| -> Vec<i8> {
            let half = 1i32 << (bits - 1);
            (0..len)
                .map(|i| ((i * 37 + seed * 11 + i / 7) as i32 % (2 * half) - half) as i8)
                .collect()
        };
        let (bytes, fours, fives, sixes) = (of(8, 1), of(4, 2), of(5, 3), of(6, 4));
        let nibbles = IntegerValues::packing(&fours, 32);
        let interleaved = IntegerValues::packing(&fours, 32).interleaving(cols);
        let six_bits_interleaved = IntegerValues::packing(&sixes, 16).interleaving(cols);
        let five_bits_interleaved = IntegerValues::packing(&fives, 32).interleaving(cols);
        let bytes_interleaved = IntegerValues::Bytes(bytes.clone()).interleaving(cols);
        assert!(matches!(
            (
                &interleaved,
                &six_bits_interleaved,
                &five_bits_interleaved,
                &bytes_interleaved
            ),
            (
                IntegerValues::Interleaved { .. },
                IntegerValues::SixBitsInterleaved { .. },
                IntegerValues::FiveBitsInterleaved { .. },
                IntegerValues::BytesInterleaved { .. }
            )
        ));
        let layouts = [
            ("bytes", IntegerValues::Bytes(bytes.clone()), &bytes),
            ("4 bits", nibbles, &fours),
            ("5 bits", IntegerValues::packing(&fives, 32), &fives),
            ("6 bits", IntegerValues::packing(&sixes, 16), &sixes),
            ("4 bits interleaved", interleaved, &fours),
            ("6 bits interleaved", six_bits_interleaved, &sixes),
            ("5 bits interleaved", five_bits_interleaved, &fives),
            ("bytes interleaved", bytes_interleaved, &bytes),
        ];
        let steps: Vec<i8> = (0..len / 16).map(|b| (b * 53 % 255) as i8).collect();
        for (layout, values, stored) in &layouts {
            for (start, count) in [(0, cols), (17 * cols + 96, 320), (31 * cols + 480, 32)] {
                for steps in [None, Some(&steps[start / 16..][..count / 16])] {
                    let mut words = vec![i16::MIN; count];
                    // SAFETY: the CPU has AVX2, asserted above.
                    unsafe { values.borrowed().widen(start, steps, &mut words) };
                    let want: Vec<i16> = (0..count)
                        .map(|i| {
                            let step = steps.map_or(1, |steps| i16::from(steps[i / 16]));
                            i16::from(stored[start + i]) * step
                        })
                        .collect();
                    let stepped = steps.is_some();
                    assert_eq!(
                        words, want,
                        "{layout}, {start}..+{count}, stepped {stepped}"
                    );
                }
                let mut bytes = vec![i8::MIN; count];
                values.borrowed().unpack(start, &mut bytes);
                assert_eq!(bytes, stored[start..start + count], "{layout}: unpacked");
            }
        }
    }

    /// The rows of a group of interleaved rows each name a share of the group's lines for a
    /// range of columns, and together all of them, once each: what the prompt tile asks the
    /// cache for ahead of widening them.
    #[test]
    fn a_group_of_interleaved_rows_asks_for_its_lines_in_shares() {
        use super::{
            INTERLEAVED_BLOCK_BYTES, INTERLEAVED_CRUMB_BYTES, INTERLEAVED_LINE_BYTES,
            INTERLEAVED_ROWS, by_block_at, interleaved_at, interleaved_crumb_at,
        };
        let (rows, cols) = (32, 512);
        let sixes: Vec<i8> = (0..rows * cols).map(|i| (i % 64) as i8 - 32).collect();
        let fives: Vec<i8> = (0..rows * cols).map(|i| (i % 32) as i8 - 16).collect();
        let six_bits = IntegerValues::packing(&sixes, 16).interleaving(cols);
        let five_bits = IntegerValues::packing(&fives, 32).interleaving(cols);
        let (first_col, len) = (256, 192);
        let b = first_col / 32;
        for group in 0..rows / INTERLEAVED_ROWS {
            let first_row = group * INTERLEAVED_ROWS;
            let nibbles_from = (
                interleaved_at(cols, first_row, b, 0),
                INTERLEAVED_BLOCK_BYTES,
            );
            // Each layout's two arrays, and where the range's lines begin in each and their
            // bytes per block.
            type Layout<'a> = (&'a IntegerValues, [&'a [u8]; 2], [(usize, usize); 2]);
            let layouts: [Layout; 2] = [
                match &six_bits {
                    IntegerValues::SixBitsInterleaved {
                        nibbles, crumbs, ..
                    } => (
                        &six_bits,
                        [nibbles, crumbs],
                        [
                            nibbles_from,
                            (
                                interleaved_crumb_at(cols, first_row, b, 0),
                                INTERLEAVED_CRUMB_BYTES,
                            ),
                        ],
                    ),
                    other => panic!("6 bits interleaved as {other:?}"),
                },
                match &five_bits {
                    IntegerValues::FiveBitsInterleaved { nibbles, high, .. } => (
                        &five_bits,
                        [nibbles, bytemuck::cast_slice(high)],
                        [
                            nibbles_from,
                            (
                                4 * by_block_at(cols / 32, first_row, b),
                                INTERLEAVED_LINE_BYTES,
                            ),
                        ],
                    ),
                    other => panic!("5 bits interleaved as {other:?}"),
                },
            ];
            for (values, arrays, wants) in layouts {
                let ints = values.borrowed();
                for (k, (array, (first, per_block))) in arrays.iter().zip(wants).enumerate() {
                    let mut next = first;
                    for row in first_row..first_row + INTERLEAVED_ROWS {
                        let start = row * cols + first_col;
                        let share = ints.stored(start..start + len)[k];
                        let at = share.as_ptr() as usize - array.as_ptr() as usize;
                        assert_eq!(
                            (at, share.len()),
                            (next, len / 32 * per_block / 16),
                            "row {row}, array {k}"
                        );
                        next += share.len();
                    }
                    assert_eq!(next, first + len / 32 * per_block, "group {group}");
                }
            }
        }
    }
}
