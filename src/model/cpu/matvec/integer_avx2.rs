//! The integer decode kernel on AVX2: sixteen 16-bit products per instruction, added in
//! pairs (`vpmaddwd`).
//!
//! Each output is summed as the prompt kernel (`token_lanes`) and the AVX-512 kernel sum it
//! (see `integer_avx512`): each block's integer sum whole, then its term, the terms added
//! to the output block after block. Eight blocks' sums are added across lanes at once
//! ([`sums_of_eight`]), converted and scaled together, and a group of eight rows' terms are
//! then added to their outputs with rows in lanes ([`add_in_turn`]).
//!
//! 4-bit weights are widened two blocks to a vector without crossing its halves
//! ([`nibble_pair`]), the activations [`arranged`] to match, and their zero point is taken
//! off each block's integer sum (`zero · Σx`) rather than off every value: a block then
//! takes three widening instructions where it took seven, two of them on the one port that
//! moves bytes between lanes. 5-bit weights take the same lanes, their fifth bits set as 16
//! in the nibbles' bytes before they widen ([`five_bit_pair`]). Q6_K's 6-bit units, read
//! stepped, are made bytes as the byte kernels make them and widened in place
//! ([`half_sums_16`]); each half unit's products are summed apart, and a chunk's halves
//! take their zero point's share and their steps together ([`six_bit_chunk_terms`]), not
//! each value. Where the CPU has VNNI, 4- and 6-bit weights are multiplied as bytes
//! instead (`integer_vnni`), with this kernel's sums, scaling and order.
//!
//! A K type's factors (a base per super-block times a step per block) are multiplied out
//! chunk by chunk as they are read ([`RowFactors`]), not widened to f32 in a pass first.

use std::arch::x86_64::*;
use std::cell::RefCell;

use super::avx2::{PREFETCH_BYTES_Q8, prefetch};
use super::integer_vnni::{
    half_zero_sums, nibble_terms_avx, nibble_terms_avx512, nibble_terms_wide, six_bit_bytes,
    six_bit_terms_avx, six_bit_terms_avx512, six_bit_terms_wide, split_bytes,
};
use super::{BlockInts, Vnni, grow, nibble_block_offset, nibble_lanes, with_pair_bases};
use crate::model::cpu::math::{unpack_five_bits, unpack_nibbles, unpack_six_bits};
use crate::model::cpu::weights::{Factors, Ints, NIBBLE_BLOCK};

/// The activations as the kernel reads them besides their values in order: for 4- and
/// 5-bit weights, and 6-bit ones read stepped in blocks of 32, each whole chunk of [`GROUP`]
/// blocks arranged as [`nibble_pair`] and [`five_bit_pair`] ([`arranged`]) and
/// [`half_sums_16`] ([`in_eights`]) widen the weights, and their sums times the weights' zero
/// point (per block for 4 and 5 bits, per half unit for 6).
pub struct Activations {
    /// Empty where the weights are none of these, or are multiplied as bytes.
    arranged: Vec<i16>,
    /// For 4- and 5-bit weights, each block's values' sum times their zero point; for
    /// stepped 6-bit ones, the same per half unit ([`half_zero_sums`]); else empty.
    pub(super) zero_sums: Vec<i32>,
    /// For 4-bit and stepped 6-bit weights multiplied as bytes, the values split
    /// ([`split_bytes`]); else empty.
    pub(super) bytes: Vec<u8>,
}

impl Activations {
    /// For `x` rounded for the weight `values`, 4-bit ones multiplied with `vnni` if any.
    pub fn of(x: &BlockInts, values: Ints<'_>, vnni: Option<Vnni>) -> Self {
        let none = Self {
            arranged: Vec::new(),
            zero_sums: Vec::new(),
            bytes: Vec::new(),
        };
        match values {
            Ints::Nibbles { zero, .. } if x.block == NIBBLE_BLOCK => match vnni {
                Some(vnni) => Self {
                    zero_sums: x.zero_sums(zero),
                    bytes: split_bytes(&x.values, vnni.blocks_per_vector()),
                    ..none
                },
                None => Self {
                    arranged: arranged(&x.values),
                    zero_sums: x.zero_sums(zero),
                    ..none
                },
            },
            // Widened as 4-bit weights are, multiplied as 16-bit values even with VNNI.
            Ints::FiveBits { zero, .. } if x.block == NIBBLE_BLOCK => Self {
                arranged: arranged(&x.values),
                zero_sums: x.zero_sums(zero),
                ..none
            },
            // Read stepped: a unit of 32 values per block.
            // Multiplied as bytes in whole chunks only (as a K type's rows are).
            Ints::SixBits { zero, .. } if x.block == NIBBLE_BLOCK => {
                match vnni.filter(|_| x.scales.len().is_multiple_of(GROUP)) {
                    Some(vnni) => Self {
                        zero_sums: half_zero_sums(&x.values, zero),
                        bytes: split_bytes(&x.values, vnni.blocks_per_vector()),
                        ..none
                    },
                    None => Self {
                        arranged: in_eights(&x.values),
                        zero_sums: half_zero_sums(&x.values, zero),
                        ..none
                    },
                }
            }
            _ => none,
        }
    }
}

/// Activations for blocks of 32 4- or 5-bit weights, for each whole chunk of [`GROUP`]
/// blocks, as [`nibble_pair`] and [`five_bit_pair`] widen the weights (see
/// [`nibble_lanes`]); the blocks after the last whole chunk are read in order.
fn arranged(values: &[i16]) -> Vec<i16> {
    let whole = values.len() / (GROUP * NIBBLE_BLOCK) * (GROUP * NIBBLE_BLOCK);
    let mut out = Vec::with_capacity(whole);
    nibble_lanes(&values[..whole], 2, &mut out);
    out
}

/// Activations for 6-bit weights read stepped, for each whole chunk of [`GROUP`] units, as
/// [`half_sums_16`] widens the weights: per pair of units, four vectors, vector `k` holding
/// each unit's values `8k..8k + 8` in turn.
fn in_eights(values: &[i16]) -> Vec<i16> {
    let whole = values.len() / (GROUP * NIBBLE_BLOCK) * (GROUP * NIBBLE_BLOCK);
    let mut out = Vec::with_capacity(whole);
    for pair in values[..whole].chunks_exact(2 * NIBBLE_BLOCK) {
        let (first, second) = pair.split_at(NIBBLE_BLOCK);
        for k in (0..NIBBLE_BLOCK).step_by(8) {
            out.extend_from_slice(&first[k..k + 8]);
            out.extend_from_slice(&second[k..k + 8]);
        }
    }
    out
}

/// Blocks `b` and `b + 1` of 4-bit values from `w` (a block's 16 bytes hold its values
/// `j` and `j + 16` in byte `j`'s low and high halves), widened to 16 bits as they lie, zero
/// point not taken off: each vector's first half the first block's, its second half the
/// second's, as [`nibble_lanes`] orders the activations: each 16-bit lane holds a block's
/// bytes `2w` and `2w + 1`, and one mask or shift takes out each of their four values.
///
/// # Safety
/// `w` must hold blocks `b` and `b + 1`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn nibble_pair(w: *const u8, b: usize) -> [__m256i; 4] {
    // SAFETY: the caller's.
    let packed = unsafe { _mm256_loadu_si256(w.add(nibble_block_offset(b)).cast()) };
    let low = _mm256_set1_epi16(0x000F);
    [
        _mm256_and_si256(packed, low),
        _mm256_and_si256(_mm256_srli_epi16::<4>(packed), low),
        _mm256_and_si256(_mm256_srli_epi16::<8>(packed), low),
        _mm256_srli_epi16::<12>(packed),
    ]
}

/// [`nibble_pair`] for 5-bit values: blocks `b` and `b + 1` of `w` with their words of
/// fifth bits from `high` (see `IntegerValues::FiveBits`), in the same lanes and order,
/// zero point not taken off. Each 16-bit lane of the nibbles holds values `2w` and `2w + 1`
/// in its bytes' low halves and `2w + 16` and `2w + 17` in their high halves, whose fifth
/// bits are bit `w` of the word's bytes 0 and 2, and 1 and 3 (`fifth_bit`'s order): each
/// half's bits are set in its bytes as 16 before the bytes are widened. In the general
/// loop ([`unpack_five_bits`], the zero point off every value) a pair of blocks took about
/// 32 instructions to widen; here 19.
///
/// # Safety
/// `w` and `high` must hold blocks `b` and `b + 1`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn five_bit_pair(w: *const u8, high: *const u32, b: usize) -> [__m256i; 4] {
    // SAFETY: the caller's.
    let (packed, words) = unsafe {
        (
            _mm256_loadu_si256(w.add(nibble_block_offset(b)).cast()),
            high.add(b).cast::<i64>().read_unaligned(),
        )
    };
    let nibbles = _mm256_set1_epi8(0x0F);
    let lows = _mm256_and_si256(packed, nibbles);
    let highs = _mm256_and_si256(_mm256_srli_epi16::<4>(packed), nibbles);
    // Both blocks' words in each half; the first half reads block `b`'s (bytes 0 to 3), the
    // second block `b + 1`'s (4 to 7).
    let words = _mm256_set1_epi64x(words);
    #[rustfmt::skip]
    let (low_bytes, high_bytes) = (
        _mm256_setr_epi8(
            0, 2, 0, 2, 0, 2, 0, 2, 0, 2, 0, 2, 0, 2, 0, 2,
            4, 6, 4, 6, 4, 6, 4, 6, 4, 6, 4, 6, 4, 6, 4, 6,
        ),
        _mm256_setr_epi8(
            1, 3, 1, 3, 1, 3, 1, 3, 1, 3, 1, 3, 1, 3, 1, 3,
            5, 7, 5, 7, 5, 7, 5, 7, 5, 7, 5, 7, 5, 7, 5, 7,
        ),
    );
    // Bit `w` of both bytes of lane `w`.
    #[rustfmt::skip]
    let lane_bits = _mm256_setr_epi16(
        0x0101, 0x0202, 0x0404, 0x0808, 0x1010, 0x2020, 0x4040, 0x8080u16 as i16,
        0x0101, 0x0202, 0x0404, 0x0808, 0x1010, 0x2020, 0x4040, 0x8080u16 as i16,
    );
    let sixteen = _mm256_set1_epi8(16);
    let low_bits = _mm256_and_si256(_mm256_shuffle_epi8(words, low_bytes), lane_bits);
    let high_bits = _mm256_and_si256(_mm256_shuffle_epi8(words, high_bytes), lane_bits);
    let lows = _mm256_or_si256(
        lows,
        _mm256_and_si256(_mm256_cmpeq_epi8(low_bits, lane_bits), sixteen),
    );
    let highs = _mm256_or_si256(
        highs,
        _mm256_and_si256(_mm256_cmpeq_epi8(high_bits, lane_bits), sixteen),
    );
    let low_byte = _mm256_set1_epi16(0x00FF);
    [
        _mm256_and_si256(lows, low_byte),
        _mm256_and_si256(highs, low_byte),
        _mm256_srli_epi16::<8>(lows),
        _mm256_srli_epi16::<8>(highs),
    ]
}

/// Units `unit` and `unit + 1`'s products with `x`, each half's summed apart, for
/// [`six_bit_terms`]: the units' bytes (0 to 63, zero point on) widened in place, so that
/// vector `k` holds each unit's values `8k..8k + 8` in turn (as [`in_eights`] arranges the
/// activations), then multiplied as 16-bit values. Widening the nibbles to 16 bits first
/// and adding each vector's top bits with variable shifts took five instructions more a
/// pair. With several activation rows the widening is the same for each, and the compiler
/// does it once.
///
/// # Safety
/// `x` holds the units' activations in eights; the CPU has AVX2.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn half_sums_16(
    [first, second]: [__m256i; 2],
    x: &Activations,
    unit: usize,
) -> [__m256i; 2] {
    let zero = _mm256_setzero_si256();
    let weights = [
        _mm256_unpacklo_epi8(first, zero),
        _mm256_unpackhi_epi8(first, zero),
        _mm256_unpacklo_epi8(second, zero),
        _mm256_unpackhi_epi8(second, zero),
    ];
    // SAFETY (here and for each vector below): the caller's.
    let x = unsafe { x.arranged.as_ptr().add(unit * NIBBLE_BLOCK) }.cast::<__m256i>();
    let products =
        |k: usize| unsafe { _mm256_madd_epi16(weights[k], _mm256_loadu_si256(x.add(k))) };
    [
        _mm256_add_epi32(products(0), products(1)),
        _mm256_add_epi32(products(2), products(3)),
    ]
}

/// One row's terms of 6-bit weights read stepped in units of 32 (two blocks of 16 with a
/// step each) against each of `xs`, compiled for the CPU features `$features` with each
/// row's products of a pair of units `$half_sums`: the units made bytes, 0 to 63, zero point
/// on ([`six_bit_bytes`]), each half's products summed apart, eight units' halves added
/// across to a lane per unit, the zero point's share taken off each half and the halves
/// multiplied by their steps (at most 16 · 32 · 16383 · 128 each, see `STEPPED_LARGEST`)
/// ([`six_bit_chunk_terms`]): the integer that taking the zero point off each value and
/// multiplying it by its step gives (which took 13 of a pair of units' 34 instructions on
/// AVX2), the same bits in every kernel.
macro_rules! six_bit_terms {
    ($name:ident, $features:literal, $half_sums:ident) => {
        /// # Safety
        /// As for `row_terms` with 6-bit values read stepped, in whole chunks of [`GROUP`]
        /// units, each of `xs` with its `Activations::of` them for this kernel; the CPU has
        /// the features this compilation enables.
        #[inline]
        #[target_feature(enable = $features)]
        pub(super) unsafe fn $name<const V: usize>(
            row: &Row,
            xs: &[(&BlockInts, &Activations); V],
            blocks: usize,
            terms: [*mut f32; V],
        ) {
            for chunk in (0..blocks).step_by(GROUP) {
                let mut firsts = [[_mm256_setzero_si256(); GROUP / 2]; V];
                let mut seconds = [[_mm256_setzero_si256(); GROUP / 2]; V];
                for (p, unit) in (chunk..chunk + GROUP).step_by(2).enumerate() {
                    // SAFETY: the chunk's units lie inside the row and each of `xs`; a
                    // prefetch cannot fault.
                    unsafe {
                        if p.is_multiple_of(2) {
                            prefetch(row.values.add(nibble_block_offset(unit)), PREFETCH_BYTES_Q8);
                        }
                        // The chunk's crumbs, one line, half the nibbles' bytes ahead.
                        if p == 0 {
                            prefetch(row.high.add(unit * 8), PREFETCH_BYTES_Q8 / 2);
                        }
                        let bytes = six_bit_bytes(row.values, row.high, unit);
                        for v in 0..V {
                            [firsts[v][p], seconds[v][p]] = $half_sums(bytes, xs[v].1, unit);
                        }
                    }
                }
                // SAFETY: the chunk lies inside the row and each of `xs`.
                unsafe { six_bit_chunk_terms(row, xs, chunk, firsts, seconds, terms) };
            }
        }
    };
}
pub(super) use six_bit_terms;

six_bit_terms!(six_bit_terms_avx2, "avx2,fma,f16c", half_sums_16);

/// The AVX2 kernel's products of `weight` with each of the `V` activation rows `xs`, offsets
/// included, into `outs`, [`GROUP`] rows at a time: each row's terms block by block
/// ([`row_terms`]), then added to the group's outputs in turn ([`add_in_turn`]).
///
/// # Safety
/// As for `rows_dot_integers`, for each activation row and its output, each with its
/// [`Activations::of`]; the CPU has AVX2.
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn rows_dot<const V: usize>(
    weight: Ints<'_>,
    scales: Factors<'_>,
    offsets: Option<Factors<'_>>,
    stepped: bool,
    vnni: Option<Vnni>,
    buffer: &mut Vec<f32>,
    xs: [(&BlockInts, &Activations); V],
    outs: &mut [&mut [f32]; V],
) {
    let rows = outs[0].len();
    let (cols, blocks) = (xs[0].0.values.len(), xs[0].0.scales.len());
    // The stored factors per row: two per block read when stepped.
    let per_row = scales.len() / rows.max(1);
    let stride = blocks.next_multiple_of(GROUP);
    AVX2_BUFFERS.with_borrow_mut(|(offset_values, terms)| {
        grow(terms, V * GROUP * stride);
        for first in (0..rows).step_by(GROUP) {
            let len = GROUP.min(rows - first);
            let factors = first * per_row..(first + len) * per_row;
            let group_scales =
                RowFactors::of(scales.range(factors.clone()), stepped, blocks, buffer);
            let group_offsets = match offsets {
                Some(offsets) => {
                    RowFactors::of(offsets.range(factors), false, blocks, offset_values)
                }
                None => RowFactors::None,
            };
            for in_group in 0..len {
                let row = first + in_group;
                let terms: [*mut f32; V] =
                    std::array::from_fn(|v| terms[(v * GROUP + in_group) * stride..].as_mut_ptr());
                let none = std::ptr::null::<u8>();
                let row_of = |values: *const u8, high: *const u8, zero: u8| Row {
                    values,
                    high,
                    zero,
                    scales: group_scales.row(in_group, blocks),
                    steps: scales.steps().as_ptr().wrapping_add(row * per_row),
                    offsets: group_offsets.row(in_group, blocks),
                };
                // SAFETY (for each kernel below): the row, its factors and steps lie where
                // the pointers say, as the caller guarantees; each row's terms have `stride`
                // places; the CPU has `vnni` where it is given, and each of `xs` was
                // prepared for it.
                macro_rules! terms_of {
                    ($block:literal, $bits:literal, $stepped:literal, $values:expr, $high:expr,
                     $zero:expr) => {{
                        let row = row_of($values, $high, $zero);
                        unsafe { row_terms::<$block, $bits, $stepped, V>(row, &xs, blocks, terms) }
                    }};
                }
                match weight {
                    Ints::Bytes(values) if stepped => {
                        terms_of!(16, 8, true, values[row * cols..].as_ptr().cast(), none, 0)
                    }
                    Ints::Bytes(values) if xs[0].0.block == 16 => {
                        terms_of!(16, 8, false, values[row * cols..].as_ptr().cast(), none, 0)
                    }
                    Ints::Bytes(values) => {
                        terms_of!(32, 8, false, values[row * cols..].as_ptr().cast(), none, 0)
                    }
                    Ints::Nibbles { values, zero } => {
                        let values = values[row * cols / 2..].as_ptr();
                        let row = row_of(values, none, zero);
                        unsafe {
                            match vnni {
                                None => row_terms::<32, 4, false, V>(row, &xs, blocks, terms),
                                Some(Vnni::Avx512) => {
                                    nibble_terms_avx512::<V>(&row, &xs, blocks, terms)
                                }
                                Some(Vnni::Avx) => nibble_terms_avx::<V>(&row, &xs, blocks, terms),
                                Some(Vnni::Wide) => {
                                    nibble_terms_wide::<V>(&row, &xs, blocks, terms)
                                }
                            }
                        }
                    }
                    Ints::FiveBits {
                        nibbles,
                        high,
                        zero,
                    } => {
                        let high = high[row * blocks..].as_ptr().cast();
                        terms_of!(32, 5, false, nibbles[row * cols / 2..].as_ptr(), high, zero)
                    }
                    Ints::SixBits {
                        nibbles,
                        crumbs,
                        zero,
                    } => {
                        let (values, crumbs) = (
                            nibbles[row * cols / 2..].as_ptr(),
                            crumbs[row * cols / 4..].as_ptr(),
                        );
                        let row = row_of(values, crumbs, zero);
                        // Multiplied as bytes in whole chunks only (see `Activations::of`).
                        let vnni = vnni.filter(|_| stepped && blocks.is_multiple_of(GROUP));
                        unsafe {
                            match (stepped, vnni) {
                                (true, Some(Vnni::Avx512)) => {
                                    six_bit_terms_avx512::<V>(&row, &xs, blocks, terms)
                                }
                                (true, Some(Vnni::Avx)) => {
                                    six_bit_terms_avx::<V>(&row, &xs, blocks, terms)
                                }
                                (true, Some(Vnni::Wide)) => {
                                    six_bit_terms_wide::<V>(&row, &xs, blocks, terms)
                                }
                                (true, None) if blocks.is_multiple_of(GROUP) => {
                                    six_bit_terms_avx2::<V>(&row, &xs, blocks, terms)
                                }
                                (true, None) => {
                                    row_terms::<16, 6, true, V>(row, &xs, blocks, terms)
                                }
                                (false, _) => row_terms::<16, 6, false, V>(row, &xs, blocks, terms),
                            }
                        }
                    }
                    Ints::Interleaved { .. }
                    | Ints::SixBitsInterleaved { .. }
                    | Ints::FiveBitsInterleaved { .. }
                    | Ints::BytesInterleaved { .. } => {
                        unreachable!("interleaved weights take their own kernel")
                    }
                }
            }
            for (v, out) in outs.iter_mut().enumerate() {
                let terms = &terms[v * GROUP * stride..][..GROUP * stride];
                // SAFETY: the group's terms are `GROUP` rows of `stride`.
                unsafe { add_in_turn(terms, stride, blocks, &mut out[first..first + len]) };
            }
        }
    });
}

thread_local! {
    /// Each thread's buffers for the AVX2 kernel, which only grow: a group of rows' offsets
    /// in f32, and its rows' terms.
    static AVX2_BUFFERS: RefCell<(Vec<f32>, Vec<f32>)> = const {
        RefCell::new((Vec::new(), Vec::new()))
    };
}

/// Rows whose terms are added together, a row to a lane.
pub(super) const GROUP: usize = 8;

/// One row of integer weights as [`row_terms`] reads it.
#[derive(Clone, Copy)]
pub(super) struct Row {
    /// The values: bytes, or nibbles (4, 5 and 6 bits).
    pub(super) values: *const u8,
    /// 5 bits: a word of fifth bits per block; 6 bits: the crumbs.
    pub(super) high: *const u8,
    zero: u8,
    /// One per block read.
    scales: RowFactors,
    /// Stepped: the steps of the row's blocks of 16.
    pub(super) steps: *const i8,
    /// One per block read, or none.
    offsets: RowFactors,
}

/// A row's factors, one per block read, as the kernels read them.
#[derive(Clone, Copy)]
enum RowFactors {
    /// No offsets.
    None,
    F32(*const f32),
    F16(*const u16),
    /// A K type's, in groups of [`GROUP`] blocks (Q4_K's and Q5_K's, per super-block): an
    /// f16 base per chunk times an 8-bit step per block, multiplied here as
    /// `Factors::f32s` multiplies them. Widened in a pass of their own they took a tenth of
    /// a 1.7B Q4_K_M decode step.
    Scaled {
        bases: *const u16,
        steps: *const i8,
    },
    /// Stepped factors' pair bases (see `read_stepped`), one per chunk of [`GROUP`] blocks
    /// read (Q6_K's, per super-block).
    Bases(*const u16),
}

impl RowFactors {
    /// Of a group's `factors` for rows of `blocks` blocks read, `stepped` or not: where they
    /// lie, or widened to f32 into `buffer` where not in one of the forms above.
    fn of(factors: Factors<'_>, stepped: bool, blocks: usize, buffer: &mut Vec<f32>) -> Self {
        let whole_groups = |first: usize, per: usize| {
            per == GROUP && first.is_multiple_of(GROUP) && blocks.is_multiple_of(GROUP)
        };
        match (stepped, factors) {
            (false, Factors::F32(values)) => Self::F32(values.as_ptr()),
            (false, Factors::F16(values)) => Self::F16(values.as_ptr().cast()),
            (
                false,
                Factors::Scaled {
                    bases,
                    steps,
                    first,
                    per,
                },
            ) if whole_groups(first, per) => Self::Scaled {
                bases: bases[first / per..].as_ptr().cast(),
                steps: steps.as_ptr(),
            },
            (false, other) => Self::F32(other.f32s(0..other.len(), buffer).as_ptr()),
            (true, factors) => with_pair_bases(factors, |bases| match bases {
                Factors::Scaled {
                    bases, first, per, ..
                } if whole_groups(first, per) => Self::Bases(bases[first / per..].as_ptr().cast()),
                other => Self::F32(other.f32s(0..other.len(), buffer).as_ptr()),
            }),
        }
    }

    /// Row `r`'s of a group's rows of `blocks` blocks read.
    fn row(self, r: usize, blocks: usize) -> Self {
        let at = r * blocks;
        match self {
            Self::None => Self::None,
            Self::F32(values) => Self::F32(values.wrapping_add(at)),
            Self::F16(values) => Self::F16(values.wrapping_add(at)),
            Self::Scaled { bases, steps } => Self::Scaled {
                bases: bases.wrapping_add(at / GROUP),
                steps: steps.wrapping_add(at),
            },
            Self::Bases(bases) => Self::Bases(bases.wrapping_add(at / GROUP)),
        }
    }

    /// The factors of blocks `chunk..chunk + len` (`len` at most [`GROUP`], and less only
    /// for f32 and f16 ones: the others are of rows of whole chunks), zeros after them, or
    /// `None`.
    ///
    /// Inlined into [`chunk_terms`], as it is.
    ///
    /// # Safety
    /// The row holds blocks `chunk..chunk + len`, and `chunk` is a multiple of [`GROUP`];
    /// the CPU has AVX2 and F16C.
    #[inline(always)]
    unsafe fn chunk(self, chunk: usize, len: usize) -> Option<__m256> {
        // Factors of `per_block` bytes a block, in bytes, as far ahead as the 4-bit kernels
        // ask for the weights (two values a byte), which otherwise waited on them.
        let ahead = |per_block: usize| 2 * PREFETCH_BYTES_Q8 / NIBBLE_BLOCK * per_block;
        // A chunk's base in every lane.
        let base = |bases: *const u16| {
            // SAFETY: the chunk's base lies in the row's, and the CPU has F16C, as the
            // caller guarantees.
            unsafe {
                let bits = bases.add(chunk / GROUP).read_unaligned();
                _mm256_cvtph_ps(_mm_set1_epi16(bits as i16))
            }
        };
        // SAFETY: the chunk's factors lie in the row's, as the caller guarantees.
        unsafe {
            Some(match self {
                Self::None => return None,
                Self::F32(values) => load(values.add(chunk), len),
                Self::F16(values) if len == GROUP => {
                    // A line of scales (32 blocks) at a time: Q4_0 decode 1.05× at 1.7B,
                    // 1.16× at 135M.
                    if chunk.is_multiple_of(32) {
                        prefetch(values.wrapping_add(chunk), ahead(size_of::<u16>()));
                    }
                    _mm256_cvtph_ps(_mm_loadu_si128(values.add(chunk).cast()))
                }
                // Value by value: copied to the stack and read back as one vector, they
                // waited on the copy (store forwarding fails), a third of a 135M Q4_1
                // decode step.
                Self::F16(values) => {
                    let at = |i: usize| match i < len {
                        true => values.add(chunk + i).read_unaligned() as i16,
                        false => 0,
                    };
                    let bits = _mm_setr_epi16(at(0), at(1), at(2), at(3), at(4), at(5), at(6), 0);
                    _mm256_cvtph_ps(bits)
                }
                Self::Scaled { bases, steps } => {
                    // A line of steps (64 blocks) and of bases (256) at a time: 1.7B
                    // Q4_K_M decode 1.025× (six alternated pairs, AMD EPYC family 26).
                    if chunk.is_multiple_of(64) {
                        prefetch(steps.wrapping_add(chunk), ahead(size_of::<i8>()));
                    }
                    if chunk.is_multiple_of(256) {
                        let ahead = ahead(size_of::<u16>()) / GROUP;
                        prefetch(bases.wrapping_add(chunk / GROUP), ahead);
                    }
                    let steps = _mm_loadl_epi64(steps.add(chunk).cast());
                    let steps = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(steps));
                    _mm256_mul_ps(base(bases), steps)
                }
                Self::Bases(bases) => base(bases),
            })
        }
    }
}

/// One row's terms against each of `xs`, a block at a time, into `terms[v]`: each block's
/// integer sum whole, converted, times its weight scale times its activation scale, plus
/// its offset times the activations' block sum in one rounding, as `token_lanes` and the
/// AVX-512 kernel form them. The eight lanes of a block's partial sums are added across
/// eight blocks at once ([`sums_of_eight`]), so eight blocks take one conversion and one
/// scaling.
///
/// `BLOCK` is the stored block (16 or 32); `STEPPED` reads pairs of blocks of 16 as
/// blocks of 32, each half times its step (see `read_stepped`), and `blocks` counts the
/// blocks read.
///
/// # Safety
/// `row` must hold `blocks` blocks read of `BITS`-bit values (bytes, or in blocks of 32
/// nibbles, less `zero`, with a word of fifth bits per block for 5 bits; for 6 bits,
/// blocks of 16 in units of two and their crumbs) and their factors, each of `xs` as many
/// values, scales and sums and its [`Activations::of`] them for the weight, and each of
/// `terms` room for `blocks` rounded up to [`GROUP`].
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn row_terms<const BLOCK: usize, const BITS: u32, const STEPPED: bool, const V: usize>(
    row: Row,
    xs: &[(&BlockInts, &Activations); V],
    blocks: usize,
    terms: [*mut f32; V],
) {
    // 4- and 5-bit values keep their zero point, which comes off each block's sum.
    let zero = _mm256_set1_epi16(match BITS {
        4 | 5 => 0,
        _ => i16::from(row.zero),
    });
    // Values per block read. Offsets into nibbles halve it (and `BLOCK`) before they
    // multiply, as [`nibble_block_offset`] does.
    let read = if STEPPED { 2 * BLOCK } else { BLOCK };
    // SAFETY (for the closures and the loop below): every block asked for is one of
    // `blocks`, so it lies inside the row, its factors and each of `xs`.
    // Stored block `b`'s weights in 16 bits, sixteen per vector (the second unused for
    // 16); for 6 bits, `b` is even and both vectors are its unit's.
    let widened = |b: usize| unsafe {
        match BITS {
            8 => {
                let w = row.values.add(b * BLOCK).cast::<__m128i>();
                std::array::from_fn(|step| match step < BLOCK / 16 {
                    true => _mm256_cvtepi8_epi16(_mm_loadu_si128(w.add(step))),
                    false => _mm256_setzero_si256(),
                })
            }
            _ => {
                let packed = _mm_loadu_si128(row.values.add(b * (BLOCK / 2)).cast::<__m128i>());
                match BITS {
                    4 => unpack_nibbles(packed, zero),
                    5 => unpack_five_bits(packed, row.high.cast::<u32>().add(b).read(), zero),
                    _ => {
                        let crumbs = row.high.add(b * (BLOCK / 4)).cast::<u64>().read_unaligned();
                        unpack_six_bits(packed, crumbs, zero)
                    }
                }
            }
        }
    };
    let step = |b: usize| unsafe { _mm256_set1_epi16(i16::from(row.steps.add(b).read())) };
    // The weights of read blocks `j` and `j + 1` (its first alone where `!both`), sixteen
    // per vector.
    let pair = |j: usize, both: bool| -> [[__m256i; 2]; 2] {
        let none = _mm256_setzero_si256();
        match (STEPPED, BITS) {
            // A block read is a unit: its halves times their steps.
            (true, 6) => {
                let one = |j: usize| {
                    let [first, second] = widened(2 * j);
                    [
                        _mm256_mullo_epi16(first, step(2 * j)),
                        _mm256_mullo_epi16(second, step(2 * j + 1)),
                    ]
                };
                [one(j), if both { one(j + 1) } else { [none; 2] }]
            }
            (true, _) => {
                let one = |j: usize| {
                    let (first, second) = (widened(2 * j)[0], widened(2 * j + 1)[0]);
                    [
                        _mm256_mullo_epi16(first, step(2 * j)),
                        _mm256_mullo_epi16(second, step(2 * j + 1)),
                    ]
                };
                [one(j), if both { one(j + 1) } else { [none; 2] }]
            }
            // A unit is both blocks.
            (false, 6) => widened(j).map(|half| [half, none]),
            (false, _) => [widened(j), if both { widened(j + 1) } else { [none; 2] }],
        }
    };
    // Read block `j` of activation row `v` against its weights: 32-bit sums of pairs
    // of products, eight lanes.
    let block_sums = |weights: &[__m256i; 2], v: usize, j: usize| unsafe {
        let values = xs[v].0.values.as_ptr().add(j * read).cast::<__m256i>();
        let mut sum = _mm256_setzero_si256();
        for (k, weights) in weights.iter().take(read / 16).enumerate() {
            let products = _mm256_madd_epi16(*weights, _mm256_loadu_si256(values.add(k)));
            sum = _mm256_add_epi32(sum, products);
        }
        sum
    };
    // A whole chunk of 4- or 5-bit blocks from `chunk` read in lanes, two blocks to a
    // vector ([`nibble_pair`], [`five_bit_pair`]), against each activation row as
    // [`arranged`]: a block's four lanes in each pair's vector, added across to a lane per
    // block ([`block_lanes`]). Each row's second pair of a half chunk is added across with
    // the first as it comes ([`pairs_across`]), so a row keeps two vectors, not four: with
    // four rows, sixteen vectors of sums did not fit the registers and every product went
    // through the stack (on an AVX2 CPU, four clients of a 1.7B Q4_K_M file got 1.31 times
    // one's speed, and 1.56 times after).
    let in_lanes = |chunk: usize| -> [__m256i; V] {
        // SAFETY (for the closures below): the chunk's blocks lie inside the row and,
        // arranged, inside each of `xs`; a prefetch cannot fault.
        // Blocks `b` and `b + 1` of the row, widened.
        let weights = |b: usize| unsafe {
            if (b - chunk).is_multiple_of(4) {
                prefetch(row.values.wrapping_add(b * (read / 2)), PREFETCH_BYTES_Q8);
            }
            match BITS {
                4 => nibble_pair(row.values, b),
                _ => five_bit_pair(row.values, row.high.cast(), b),
            }
        };
        // Blocks `b` and `b + 1` against activation row `v`.
        let sums = |weights: &[__m256i; 4], v: usize, b: usize| unsafe {
            let x = xs[v].1.arranged.as_ptr().add(b * read).cast::<__m256i>();
            let mut sums = _mm256_madd_epi16(weights[0], _mm256_loadu_si256(x));
            for (k, &weights) in weights.iter().enumerate().skip(1) {
                let products = _mm256_madd_epi16(weights, _mm256_loadu_si256(x.add(k)));
                sums = _mm256_add_epi32(sums, products);
            }
            sums
        };
        // Blocks `b..b + 4` against each row, two pairs added across.
        let half = |b: usize| -> [__m256i; V] {
            let first = weights(b);
            let firsts: [__m256i; V] = std::array::from_fn(|v| sums(&first, v, b));
            let second = weights(b + 2);
            std::array::from_fn(|v| pairs_across(firsts[v], sums(&second, v, b + 2)))
        };
        let (low, high) = (half(chunk), half(chunk + 4));
        std::array::from_fn(|v| halves_in_lanes(low[v], high[v]))
    };
    // A chunk of `$in_chunk` blocks from `$chunk`: a literal for whole chunks, which
    // the compiler unrolls and keeps in registers (with the count a variable, the sums
    // went through the stack and the kernel ran 1.4 times as long).
    macro_rules! chunk {
        ($chunk:expr, $in_chunk:expr) => {{
            let (chunk, in_chunk): (usize, usize) = ($chunk, $in_chunk);
            // Blocks `chunk + k` and the next, for each activation row; zeros past the
            // row's end. Written out four times below: in a loop, the sums went through
            // the stack.
            macro_rules! pair_sums {
                ($k:literal) => {{
                    let mut sums = [[_mm256_setzero_si256(); 2]; V];
                    if $k < in_chunk {
                        let j = chunk + $k;
                        // Two blocks of 32 bytes are one 64-byte line (of 16 bytes or
                        // nibbles, half).
                        let bytes = if BITS < 8 { j * (read / 2) } else { j * read };
                        prefetch(row.values.wrapping_add(bytes), PREFETCH_BYTES_Q8);
                        let both = $k + 1 < in_chunk;
                        let weights = pair(j, both);
                        for (v, sums) in sums.iter_mut().enumerate() {
                            sums[0] = block_sums(&weights[0], v, j);
                            if both {
                                sums[1] = block_sums(&weights[1], v, j + 1);
                            }
                        }
                    }
                    sums
                }};
            }
            // Each activation row's sums of the chunk's blocks, a block to a lane.
            let totals: [__m256i; V] = match matches!(BITS, 4 | 5) && in_chunk == GROUP {
                true => in_lanes(chunk),
                false => {
                    let pairs = [pair_sums!(0), pair_sums!(2), pair_sums!(4), pair_sums!(6)];
                    std::array::from_fn(|v| {
                        sums_of_eight(&std::array::from_fn(|k| pairs[k / 2][v][k % 2]))
                    })
                }
            };
            // SAFETY: the lanes of `in_chunk` are blocks of the row; the row's terms have
            // room for a whole chunk.
            unsafe { chunk_terms::<BITS, V>(&row, xs, chunk, in_chunk, totals, terms) };
        }};
    }
    let whole = blocks / GROUP * GROUP;
    for first in (0..whole).step_by(GROUP) {
        chunk!(first, GROUP);
    }
    if whole < blocks {
        chunk!(whole, blocks - whole);
    }
}

/// One chunk's terms, from each activation row's integer sums `totals` of the row's blocks
/// `chunk..chunk + in_chunk` (a block to a lane), into `terms[v]`: each sum, less the
/// zero point's share for 4- and 5-bit values, converted, times its weight scale times its
/// activation scale, plus its offset times the activations' block sum in one rounding.
///
/// Always inlined, so compiled with its caller's features, which include AVX2, FMA and
/// F16C: as a call of its own (with features, LLVM would not inline it into the VNNI
/// kernels) it was a fifth of a 135M Q4_1 decode step.
///
/// # Safety
/// As for [`row_terms`], and the row holds blocks `chunk..chunk + in_chunk`, `in_chunk` at
/// most [`GROUP`]; the CPU has AVX2, FMA and F16C.
#[inline(always)]
pub(super) unsafe fn chunk_terms<const BITS: u32, const V: usize>(
    row: &Row,
    xs: &[(&BlockInts, &Activations); V],
    chunk: usize,
    in_chunk: usize,
    totals: [__m256i; V],
    terms: [*mut f32; V],
) {
    // SAFETY: the row's factors, each of `xs` and each of `terms` hold the chunk's blocks,
    // as the caller guarantees.
    unsafe {
        let weight_scales = row
            .scales
            .chunk(chunk, in_chunk)
            .unwrap_or(_mm256_setzero_ps());
        let offsets = row.offsets.chunk(chunk, in_chunk);
        for (v, &totals) in totals.iter().enumerate() {
            let totals = match BITS {
                4 | 5 => {
                    let zero_sums = xs[v].1.zero_sums.as_ptr().add(chunk);
                    _mm256_sub_epi32(totals, load_ints(zero_sums, in_chunk))
                }
                _ => totals,
            };
            let x_scales = load(xs[v].0.scales.as_ptr().add(chunk), in_chunk);
            let scales = _mm256_mul_ps(weight_scales, x_scales);
            let ints = _mm256_cvtepi32_ps(totals);
            let mut term = _mm256_mul_ps(ints, scales);
            if let Some(offsets) = offsets {
                let x_sums = load(xs[v].0.sums.as_ptr().add(chunk), in_chunk);
                term = _mm256_fmadd_ps(x_sums, offsets, term);
            }
            _mm256_storeu_ps(terms[v].add(chunk), term);
        }
    }
}

/// A chunk of [`GROUP`] 6-bit units' terms from the lane sums of their halves' products,
/// `firsts` and `seconds` (a pair of units to a vector): each unit's halves added across,
/// their zero point's share taken off and multiplied by their steps, for every
/// [`six_bit_terms`] kernel.
///
/// # Safety
/// The chunk's steps lie inside the row's, its half sums inside each of `xs`; the CPU has
/// AVX2.
#[inline(always)]
pub(super) unsafe fn six_bit_chunk_terms<const V: usize>(
    row: &Row,
    xs: &[(&BlockInts, &Activations); V],
    chunk: usize,
    firsts: [[__m256i; GROUP / 2]; V],
    seconds: [[__m256i; GROUP / 2]; V],
    terms: [*mut f32; V],
) {
    // SAFETY: the caller's.
    unsafe {
        // The steps of eight units, first halves' (even bytes) then second halves'.
        let halves = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
        let steps = _mm_loadu_si128(row.steps.add(2 * chunk).cast());
        let steps = _mm_shuffle_epi8(steps, halves);
        let first_steps = _mm256_cvtepi8_epi32(steps);
        let second_steps = _mm256_cvtepi8_epi32(_mm_srli_si128::<8>(steps));
        // A loop, not `array::from_fn`: a closure here is compiled without the caller's
        // features, and every intrinsic in it was a call, through memory (timed in L2, the
        // AVX2 kernel's Q6_K loop took 1.4–1.9 times as long as the loop before it).
        let mut totals = [_mm256_setzero_si256(); V];
        for (v, total) in totals.iter_mut().enumerate() {
            let zero_sums = xs[v].1.zero_sums.as_ptr().add(2 * chunk).cast();
            let first = block_lanes(firsts[v]);
            let first = _mm256_sub_epi32(first, _mm256_loadu_si256(zero_sums));
            let second = block_lanes(seconds[v]);
            let second = _mm256_sub_epi32(second, _mm256_loadu_si256(zero_sums.add(1)));
            *total = _mm256_add_epi32(
                _mm256_mullo_epi32(first, first_steps),
                _mm256_mullo_epi32(second, second_steps),
            );
        }
        chunk_terms::<6, V>(row, xs, chunk, GROUP, totals, terms);
    }
}

/// Eight blocks' sums, a block to a lane in order, from four vectors of pairs of blocks
/// holding each block's sum in four lanes, the first block of a pair in the low half: the
/// additions leave blocks 0, 2, 4, 6, 1, 3, 5, 7, which one permutation puts back.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn block_lanes([a, b, c, d]: [__m256i; GROUP / 2]) -> __m256i {
    halves_in_lanes(pairs_across(a, b), pairs_across(c, d))
}

/// Two vectors of pairs of blocks (as [`block_lanes`] takes them) added across: each block's
/// four lanes to two, in the order [`halves_in_lanes`] takes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn pairs_across(first: __m256i, second: __m256i) -> __m256i {
    _mm256_hadd_epi32(first, second)
}

/// [`block_lanes`] of the first two pairs' vectors added across ([`pairs_across`]) and the
/// last two's.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn halves_in_lanes(low: __m256i, high: __m256i) -> __m256i {
    let across = _mm256_hadd_epi32(low, high);
    _mm256_permutevar8x32_epi32(across, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
}

/// The first `len` (at most eight) values at `at`, the other lanes zero.
///
/// # Safety
/// `len` values must lie at `at`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load(at: *const f32, len: usize) -> __m256 {
    // SAFETY: the lanes of the mask are the first `len`, which the caller guarantees.
    unsafe { _mm256_maskload_ps(at, first_lanes(len)) }
}

/// The first `len` (at most eight) integers at `at`, the other lanes zero.
///
/// # Safety
/// `len` integers must lie at `at`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load_ints(at: *const i32, len: usize) -> __m256i {
    // SAFETY: the lanes of the mask are the first `len`, which the caller guarantees.
    unsafe { _mm256_maskload_epi32(at, first_lanes(len)) }
}

/// A mask of the first `len` 32-bit lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn first_lanes(len: usize) -> __m256i {
    let lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    _mm256_cmpgt_epi32(_mm256_set1_epi32(len as i32), lanes)
}

/// Lane `i` the sum of the eight lanes of `sums[i]`, exactly.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn sums_of_eight(sums: &[__m256i; GROUP]) -> __m256i {
    let [a, b, c, d, e, f, g, h] = *sums;
    let low = _mm256_hadd_epi32(_mm256_hadd_epi32(a, b), _mm256_hadd_epi32(c, d));
    let high = _mm256_hadd_epi32(_mm256_hadd_epi32(e, f), _mm256_hadd_epi32(g, h));
    _mm256_add_epi32(
        _mm256_permute2x128_si256::<0x20>(low, high),
        _mm256_permute2x128_si256::<0x31>(low, high),
    )
}

/// An eight-by-eight matrix of rows of `m` transposed in place.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn transpose(m: &mut [__m256; GROUP]) {
    let t: [__m256; 8] = std::array::from_fn(|i| {
        let (a, b) = (m[i / 2 * 2], m[i / 2 * 2 + 1]);
        match i % 2 {
            0 => _mm256_unpacklo_ps(a, b),
            _ => _mm256_unpackhi_ps(a, b),
        }
    });
    // In each 128-bit lane, `u[4h + j]` holds column `j` of rows `4h..4h + 4`.
    let mut u = [_mm256_setzero_ps(); 8];
    for h in 0..2 {
        let [a, b, c, d] = [t[4 * h], t[4 * h + 1], t[4 * h + 2], t[4 * h + 3]];
        u[4 * h] = _mm256_shuffle_ps::<0x44>(a, c);
        u[4 * h + 1] = _mm256_shuffle_ps::<0xEE>(a, c);
        u[4 * h + 2] = _mm256_shuffle_ps::<0x44>(b, d);
        u[4 * h + 3] = _mm256_shuffle_ps::<0xEE>(b, d);
    }
    for j in 0..4 {
        m[j] = _mm256_permute2f128_ps::<0x20>(u[j], u[4 + j]);
        m[4 + j] = _mm256_permute2f128_ps::<0x31>(u[j], u[4 + j]);
    }
}

/// Adds each of a group's rows' block terms to its output in the order of the blocks:
/// `terms` holds [`GROUP`] rows of `stride` terms, of which `blocks` are the row's, and
/// `out` the group's outputs (as many as it has rows).
///
/// # Safety
/// `terms` must hold `GROUP · stride` values, `stride` a multiple of 8 and at least
/// `blocks`; `out` at most [`GROUP`].
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn add_in_turn(terms: &[f32], stride: usize, blocks: usize, out: &mut [f32]) {
    // SAFETY: `out` holds its rows, and each chunk of 8 terms of each row lies in
    // `terms`, as the caller guarantees.
    unsafe {
        let mut sums = load(out.as_ptr(), out.len());
        for first in (0..blocks).step_by(GROUP) {
            let mut m: [__m256; GROUP] =
                std::array::from_fn(|r| _mm256_loadu_ps(terms.as_ptr().add(r * stride + first)));
            transpose(&mut m);
            for block in &m[..GROUP.min(blocks - first)] {
                sums = _mm256_add_ps(sums, *block);
            }
        }
        let mut lanes = [0.0f32; GROUP];
        _mm256_storeu_ps(lanes.as_mut_ptr(), sums);
        out.copy_from_slice(&lanes[..out.len()]);
    }
}
