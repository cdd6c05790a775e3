//! The decode kernel of interleaved 4-, 5- and 8-bit and stepped 6-bit weights (see
//! `integer_interleaved`) on CPUs with AVX2 but neither VNNI nor AVX-512: each 64-byte
//! line read as two 256-bit halves, eight rows to a half, as `integer_interleaved_avx_vnni`
//! reads them, but multiplied as 16-bit values (`vpmaddwd`), as the row kernel
//! (`integer_avx2`) multiplies them. The row kernel spends as much again on adding each
//! block's lanes across, scaling each block and adding a group's terms in turn; here each
//! lane is a row's.
//!
//! Each 32-bit lane holds four bytes of one row's block: two 16-bit words of four nibbles.
//! A nibble is multiplied where it lies rather than shifted down first: masked in place, the
//! word's second nibble is 16 times its value and its third 256 times, so the products of
//! each are summed apart and those sums shifted down, exactly, once a block. A half line
//! then takes four instructions to widen where shifting each nibble down took six. The
//! activations are laid out in pairs as the words take them ([`pairs`]), and a pair
//! broadcast meets eight rows' words in one instruction. 5-bit values add their fifth bits
//! to the nibbles so masked, from a line of each row's word per block laid out for it
//! (`interleaved_fifth_bit`: two shifts, four masks and four ORs a half line). Their blocks
//! took the row kernel before, where a Gemma-3-1B Q4_K_M file, a third of it Q5_0, decoded
//! at 0.95× llama.cpp's on Zen 3; so it decodes at 1.19× (a 135M Q5_0 file 1.4× as fast as
//! before).
//! 6-bit values are made bytes as the VNNI kernels make them, and each word's two bytes
//! multiplied apart; bytes (Q8_0's) are sign-extended in place, each word's two apart, and
//! took a 1.7B Q8_0 file's decode from 1.01× llama.cpp's to 1.18× on Zen 3.
//!
//! Each block's integer sum, its term and the order the terms are added in are the other
//! kernels', and so are the bits.

use std::arch::x86_64::*;
use std::ops::Range;

use super::avx2::prefetch;
use super::integer_interleaved::{
    Activations, Ahead, FactorsAhead, HALF, Lines, OfGroup, PREFETCH_BYTES,
};
use super::integer_interleaved_avx_vnni::{add_terms, six_bit_bytes};
use super::{BlockInts, grow};
use crate::model::cpu::weights::{
    Factors, INTERLEAVED_BLOCK_BYTES, INTERLEAVED_BYTE_BLOCK_BYTES, INTERLEAVED_CRUMB_BYTES,
    INTERLEAVED_LINE_BYTES, INTERLEAVED_ROWS, NIBBLE_BLOCK,
};
use half::f16;

/// A block's activations in the pairs the kernel multiplies them in, each a 32-bit word of
/// two 16-bit values: for line `k`, the pairs of values `(4k, 4k + 2)`, `(16 + 4k, 18 + 4k)`,
/// `(4k + 1, 4k + 3)` and `(17 + 4k, 19 + 4k)`, which a lane's words hold in their first,
/// second, third and fourth nibbles.
pub(super) fn pairs(values: &[i16]) -> Vec<i32> {
    let pair = |a: i16, b: i16| i32::from(a as u16) | (i32::from(b as u16) << 16);
    let mut out = Vec::with_capacity(values.len() / 2);
    for block in values.chunks_exact(NIBBLE_BLOCK) {
        for k in (0..16).step_by(4) {
            out.extend([
                pair(block[k], block[k + 2]),
                pair(block[16 + k], block[18 + k]),
                pair(block[k + 1], block[k + 3]),
                pair(block[17 + k], block[19 + k]),
            ]);
        }
    }
    out
}

/// Adds each row's product with each of the `V` activation rows to that row's output, as
/// `integer_interleaved::rows_dot` does, a 256-bit half of each line at a time.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C; 6-bit `lines` hold whole super-blocks, with their
/// factors in steps and bases (`Factors::Scaled`, a base per 16 steps); otherwise as for
/// `integer_interleaved::rows_dot`, each of `xs` with [`pairs`] of its values.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn rows_dot<'a, const V: usize>(
    lines: Lines<'a>,
    scales: Factors<'a>,
    offsets: Option<Factors<'a>>,
    xs: [(&BlockInts, &Activations); V],
    buffer: &mut Vec<f32>,
    outs: &mut [&mut [f32]; V],
) {
    let blocks = xs[0].0.scales.len();
    let rows = outs[0].len();
    let ahead = FactorsAhead::new(lines, scales, offsets, blocks, rows);
    for (g, first) in (0..rows).step_by(INTERLEAVED_ROWS).enumerate() {
        let factors_of_group = first * blocks..(first + INTERLEAVED_ROWS) * blocks;
        let ahead = ahead.of_next(&factors_of_group);
        // SAFETY: the group's outputs, its lines of weights (and steps) and each activation
        // row's blocks lie where read, as the caller guarantees; a prefetch cannot fault.
        unsafe {
            // The sums of the group's first eight rows and of its last eight.
            let mut halves = [[_mm256_setzero_ps(); V]; 2];
            for (h, sums) in halves.iter_mut().enumerate() {
                for (v, sums) in sums.iter_mut().enumerate() {
                    *sums = _mm256_loadu_ps(outs[v].as_ptr().add(first + h * HALF));
                }
            }
            // 4-, 5- and 8-bit values' lines of a group, and their factors.
            let factors = GroupFactors {
                scales,
                offsets,
                of_group: factors_of_group,
            };
            let group_of =
                |values: *const u8, block_bytes: usize| values.add(g * blocks * block_bytes);
            let none = std::ptr::null();
            match lines {
                Lines::Nibbles(values) => {
                    let lines = group_of(values.as_ptr(), INTERLEAVED_BLOCK_BYTES);
                    row_group::<V, 4>(lines, none, factors, buffer, &ahead, &xs, &mut halves)
                }
                Lines::FiveBits { nibbles, high } => {
                    let lines = group_of(nibbles.as_ptr(), INTERLEAVED_BLOCK_BYTES);
                    let fifths = high.as_ptr().add(g * blocks * INTERLEAVED_ROWS);
                    row_group::<V, 5>(lines, fifths, factors, buffer, &ahead, &xs, &mut halves)
                }
                Lines::Bytes(values) => {
                    let lines = group_of(values.as_ptr().cast(), INTERLEAVED_BYTE_BLOCK_BYTES);
                    row_group::<V, 8>(lines, none, factors, buffer, &ahead, &xs, &mut halves)
                }
                Lines::SixBits {
                    nibbles,
                    crumbs,
                    steps,
                    factors,
                } => {
                    let Factors::Scaled {
                        bases,
                        first: first_factor,
                        per: SIX_BIT_PER_BASE,
                        ..
                    } = factors
                    else {
                        unreachable!("interleaved 6-bit values have a base per super-block")
                    };
                    // The group's rows' bases, a row's super-blocks in turn.
                    let at = (first_factor + 2 * first * blocks) / SIX_BIT_PER_BASE;
                    let supers = blocks / UNITS_PER_BASE;
                    six_bit_group(
                        nibbles.as_ptr().add(g * blocks * INTERLEAVED_BLOCK_BYTES),
                        crumbs.as_ptr().add(g * blocks * INTERLEAVED_CRUMB_BYTES),
                        steps.as_ptr().add(2 * first * blocks),
                        &bases[at..at + INTERLEAVED_ROWS * supers],
                        &ahead,
                        &xs,
                        &mut halves,
                    );
                }
            }
            for (h, sums) in halves.iter().enumerate() {
                for (v, sums) in sums.iter().enumerate() {
                    _mm256_storeu_ps(outs[v].as_mut_ptr().add(first + h * HALF), *sums);
                }
            }
        }
    }
}

/// A group's factors of 4-, 5- and 8-bit rows: where they lie in `scales` and `offsets`.
struct GroupFactors<'a> {
    scales: Factors<'a>,
    offsets: Option<Factors<'a>>,
    of_group: Range<usize>,
}

/// A group of rows of `BITS` (4, 5 or 8), whose lines begin at `lines` and, for 5-bit ones,
/// their words of fifth bits at `fifths` (else not read): each row's terms added to its
/// sums, the first eight rows' and the last eight's. Each kind is a copy of the loop of its
/// own, so that 4-bit rows' carries nothing of the others'.
///
/// # Safety
/// As for [`rows_dot`], for the group.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn row_group<const V: usize, const BITS: u32>(
    lines: *const u8,
    fifths: *const u32,
    factors: GroupFactors<'_>,
    buffer: &mut Vec<f32>,
    ahead: &Ahead<'_>,
    xs: &[(&BlockInts, &Activations); V],
    halves: &mut [[__m256; V]; 2],
) {
    let blocks = xs[0].0.scales.len();
    // Factors in another form than by block are formed by block here.
    let group = INTERLEAVED_ROWS * blocks;
    grow(buffer, 2 * group);
    let (room, offsets_room) = buffer[..2 * group].split_at_mut(group);
    let GroupFactors {
        scales,
        offsets,
        of_group: range,
    } = factors;
    let scales = OfGroup::of(scales.range(range.clone()), blocks, room);
    let offsets = offsets.map(|offsets| OfGroup::of(offsets.range(range), blocks, offsets_room));
    let block_bytes = match BITS {
        8 => INTERLEAVED_BYTE_BLOCK_BYTES,
        _ => INTERLEAVED_BLOCK_BYTES,
    };
    // SAFETY: the caller's; a prefetch cannot fault.
    unsafe {
        for b in 0..blocks {
            ahead.prefetch(b);
            let at = lines.add(b * block_bytes);
            for k in 0..block_bytes / INTERLEAVED_LINE_BYTES {
                prefetch(at.add(k * INTERLEAVED_LINE_BYTES), PREFETCH_BYTES);
            }
            let totals = match BITS {
                8 => byte_totals(at, b, xs),
                5 => {
                    let line = fifths.add(b * INTERLEAVED_ROWS);
                    prefetch(line.cast::<u8>(), PREFETCH_BYTES / 4);
                    let fifths = [0, HALF].map(|h| _mm256_loadu_si256(line.add(h).cast()));
                    nibble_totals(at, Some(fifths), b, xs)
                }
                _ => nibble_totals(at, None, b, xs),
            };
            for (h, sums) in halves.iter_mut().enumerate() {
                let offsets = offsets.map(|offsets| offsets.eight(b, h));
                add_terms(sums, totals[h], scales.eight(b, h), offsets, b, xs);
            }
        }
    }
}

/// Block `b`'s integer sums of the group's sixteen rows of bytes, whose eight lines lie at
/// `at`, with each activation row: the first eight rows' and the last eight's. Line `k`
/// holds values `4k..4k + 4` of each row, two 16-bit words a lane: their first bytes
/// sign-extended in place (shifted up and back) and their second ones (shifted down) meet
/// the pairs of [`pairs`] that nibble line `k % 4` takes for its low halves (`k < 4`) or
/// its high ones. The weights have no zero point.
///
/// # Safety
/// As for [`rows_dot`], for the block.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn byte_totals<const V: usize>(
    at: *const u8,
    b: usize,
    xs: &[(&BlockInts, &Activations); V],
) -> [[__m256i; V]; 2] {
    let mut totals = [[_mm256_setzero_si256(); V]; 2];
    for k in 0..8 {
        let words: [[__m256i; 2]; 2] = std::array::from_fn(|h| {
            // SAFETY: the caller's.
            let line =
                unsafe { _mm256_loadu_si256(at.add(k * INTERLEAVED_LINE_BYTES + h * 32).cast()) };
            [
                _mm256_srai_epi16::<8>(_mm256_slli_epi16::<8>(line)),
                _mm256_srai_epi16::<8>(line),
            ]
        });
        // The pairs `(4k, 4k + 2)` and, two on, `(4k + 1, 4k + 3)`.
        let first = 4 * (k % 4) + k / 4;
        for v in 0..V {
            // SAFETY: the block's pairs lie inside the activations, as the caller guarantees.
            let pairs = unsafe { xs[v].1.pairs.as_ptr().add(b * NIBBLE_BLOCK / 2 + first) };
            // SAFETY: as above.
            let (even, odd) = unsafe {
                (
                    _mm256_set1_epi32(pairs.read()),
                    _mm256_set1_epi32(pairs.add(2).read()),
                )
            };
            for h in 0..2 {
                let [evens, odds] = words[h];
                let sum =
                    _mm256_add_epi32(_mm256_madd_epi16(evens, even), _mm256_madd_epi16(odds, odd));
                totals[h][v] = _mm256_add_epi32(totals[h][v], sum);
            }
        }
    }
    totals
}

/// Block `b`'s integer sums of the group's sixteen 4-bit rows, whose four lines lie at
/// `at`, or 5-bit ones, whose halves' words of fifth bits are `fifths`, with each activation
/// row, less the zero point's share: the first eight rows' and the last eight's. Both
/// halves of a line are read together, so that each pair of activations is broadcast once
/// for sixteen rows.
///
/// # Safety
/// As for [`rows_dot`], for the block.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn nibble_totals<const V: usize>(
    at: *const u8,
    fifths: Option<[__m256i; 2]>,
    b: usize,
    xs: &[(&BlockInts, &Activations); V],
) -> [[__m256i; V]; 2] {
    let (first_mask, second_mask, third_mask) = (
        _mm256_set1_epi16(0x000F),
        _mm256_set1_epi16(0x00F0),
        _mm256_set1_epi16(0x0F00),
    );
    // Per half and activation row: the sums of the first and fourth nibbles' products, of
    // the second's (16 times theirs) and of the third's (256 times). With several activation
    // rows, whose three sums each would not fit the registers, the second's and third's are
    // shifted down into the first's as they come, and their own stay zero.
    let mut sums = [[[_mm256_setzero_si256(); 3]; V]; 2];
    for k in 0..4 {
        let mut nibbles = [[_mm256_setzero_si256(); 4]; 2];
        for (h, nibbles) in nibbles.iter_mut().enumerate() {
            // SAFETY: the caller's.
            let line =
                unsafe { _mm256_loadu_si256(at.add(k * INTERLEAVED_LINE_BYTES + h * 32).cast()) };
            *nibbles = [
                _mm256_and_si256(line, first_mask),
                _mm256_and_si256(line, second_mask),
                _mm256_and_si256(line, third_mask),
                _mm256_srli_epi16::<12>(line),
            ];
            if let Some(fifths) = fifths {
                *nibbles = with_fifth_bits(*nibbles, fifths[h], k);
            }
        }
        for v in 0..V {
            // SAFETY: the block's pairs lie inside the activations, as the caller guarantees.
            let pairs = unsafe { xs[v].1.pairs.as_ptr().add(b * NIBBLE_BLOCK / 2 + 4 * k) };
            // SAFETY: as above.
            let pair = |i: usize| _mm256_set1_epi32(unsafe { pairs.add(i).read() });
            let (p0, p1, p2, p3) = (pair(0), pair(1), pair(2), pair(3));
            for h in 0..2 {
                let [first, second, third, fourth] = nibbles[h];
                let [ones, sixteens, two_fifty_sixes] = &mut sums[h][v];
                let outer =
                    _mm256_add_epi32(_mm256_madd_epi16(first, p0), _mm256_madd_epi16(fourth, p3));
                if V > 1 {
                    let inner = _mm256_add_epi32(
                        _mm256_srai_epi32::<4>(_mm256_madd_epi16(second, p1)),
                        _mm256_srai_epi32::<8>(_mm256_madd_epi16(third, p2)),
                    );
                    *ones = _mm256_add_epi32(*ones, _mm256_add_epi32(outer, inner));
                    continue;
                }
                *ones = _mm256_add_epi32(*ones, outer);
                *sixteens = _mm256_add_epi32(*sixteens, _mm256_madd_epi16(second, p1));
                *two_fifty_sixes = _mm256_add_epi32(*two_fifty_sixes, _mm256_madd_epi16(third, p2));
            }
        }
    }
    let mut totals = [[_mm256_setzero_si256(); V]; 2];
    for h in 0..2 {
        for v in 0..V {
            let [ones, sixteens, two_fifty_sixes] = sums[h][v];
            let sum = _mm256_add_epi32(
                _mm256_add_epi32(ones, _mm256_srai_epi32::<4>(sixteens)),
                _mm256_srai_epi32::<8>(two_fifty_sixes),
            );
            totals[h][v] = _mm256_sub_epi32(sum, _mm256_set1_epi32(xs[v].1.zero_sums[b]));
        }
    }
    totals
}

/// Line `k`'s four nibbles of each word, as [`nibble_totals`] masks them in place, with
/// their fifth bits (16 times their place) from the half's words of fifth bits `fifths`, in
/// `interleaved_fifth_bit`'s order: there the first three nibbles' bits lie `k` below the
/// bit above each nibble, and the fourth's at bit `13 + k` of the word (bit 0 for the last
/// line).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn with_fifth_bits(nibbles: [__m256i; 4], fifths: __m256i, k: usize) -> [__m256i; 4] {
    let [first, second, third, fourth] = nibbles;
    let (placed, fourths) = match k {
        0 => (fifths, _mm256_srli_epi16::<9>(fifths)),
        1 => (
            _mm256_slli_epi16::<1>(fifths),
            _mm256_srli_epi16::<10>(fifths),
        ),
        2 => (
            _mm256_slli_epi16::<2>(fifths),
            _mm256_srli_epi16::<11>(fifths),
        ),
        _ => (
            _mm256_slli_epi16::<3>(fifths),
            _mm256_slli_epi16::<4>(fifths),
        ),
    };
    let with = |nibble: __m256i, bits: __m256i, bit: i16| {
        _mm256_or_si256(nibble, _mm256_and_si256(bits, _mm256_set1_epi16(bit)))
    };
    [
        with(first, placed, 0x0010),
        with(second, placed, 0x0100),
        with(third, placed, 0x1000),
        with(fourth, fourths, 0x0010),
    ]
}

/// Blocks of 16 per base of stepped 6-bit values: a super-block's (Q6_K's).
const SIX_BIT_PER_BASE: usize = 16;

/// Units of 32 per base, which the kernel reads their steps and bases by.
const UNITS_PER_BASE: usize = SIX_BIT_PER_BASE / 2;

/// A group of stepped 6-bit rows, whose lines of nibbles begin at `lines` and of crumbs at
/// `crumbs`, each row's steps `2 · blocks` bytes apart from `steps` and its bases one per
/// super-block in `bases`: each row's terms added to its sums, the first eight rows' and
/// the last eight's. The steps and bases lie in rows; gathered for each unit's eight rows,
/// as the VNNI kernels take them, they made Q6_K decode 0.88× as fast as the row kernel on
/// Zen 1, whose gathers are slow. A super-block's steps of all sixteen rows are loaded
/// together instead and turned into each unit's in registers, and its bases read once.
///
/// # Safety
/// As for [`rows_dot`], for the group; its rows hold whole super-blocks.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn six_bit_group<const V: usize>(
    lines: *const u8,
    crumbs: *const u8,
    steps: *const i8,
    bases: &[f16],
    ahead: &Ahead<'_>,
    xs: &[(&BlockInts, &Activations); V],
    halves: &mut [[__m256; V]; 2],
) {
    let blocks = xs[0].0.scales.len();
    let supers = blocks / UNITS_PER_BASE;
    debug_assert_eq!(supers * UNITS_PER_BASE, blocks);
    debug_assert_eq!(bases.len(), INTERLEAVED_ROWS * supers);
    for s in 0..supers {
        // Each half's eight rows' bases.
        let of_half = |h: usize| {
            let half: [u16; HALF] =
                std::array::from_fn(|r| bases[(h * HALF + r) * supers + s].to_bits());
            // SAFETY: eight f16 lie there.
            _mm256_cvtph_ps(unsafe { _mm_loadu_si128(half.as_ptr().cast()) })
        };
        let factors = [of_half(0), of_half(1)];
        // SAFETY: the super-block's steps of the group's rows lie there, as the caller
        // guarantees.
        let unit_steps = unsafe { super_block_steps(steps.add(2 * UNITS_PER_BASE * s), blocks) };
        for (u, unit_steps) in unit_steps.into_iter().enumerate() {
            let b = UNITS_PER_BASE * s + u;
            ahead.prefetch(b);
            // SAFETY: the unit's lines lie inside the group's, as the caller guarantees; a
            // prefetch cannot fault.
            unsafe {
                let at = lines.add(b * INTERLEAVED_BLOCK_BYTES);
                let crumbs = crumbs.add(b * INTERLEAVED_CRUMB_BYTES);
                for k in 0..4 {
                    prefetch(at.add(k * INTERLEAVED_LINE_BYTES), PREFETCH_BYTES);
                }
                for d in 0..2 {
                    prefetch(crumbs.add(d * INTERLEAVED_LINE_BYTES), PREFETCH_BYTES / 2);
                }
                let halves_steps = [
                    _mm256_castsi256_si128(unit_steps),
                    _mm256_extracti128_si256::<1>(unit_steps),
                ];
                for (h, sums) in halves.iter_mut().enumerate() {
                    let steps = _mm256_cvtepi16_epi32(halves_steps[h]);
                    let totals = six_bit_totals(at.add(32 * h), crumbs.add(32 * h), steps, b, xs);
                    add_terms(sums, totals, factors[h], None, b, xs);
                }
            }
        }
    }
}

/// The steps of a super-block's eight units of sixteen rows, each row's `2 · blocks` bytes
/// apart from `steps`: for each unit, each row's two as a 16-bit word (the first step in
/// its low byte), the first eight rows' in the low 128 bits and the last eight's in the
/// high. Two transpositions of eight rows by eight words, one in each 128-bit lane.
///
/// # Safety
/// The CPU has AVX2; sixteen bytes lie at `steps` and at each further row's.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn super_block_steps(steps: *const i8, blocks: usize) -> [__m256i; UNITS_PER_BASE] {
    // Row `r`'s sixteen bytes in the low lane, row `r + 8`'s in the high.
    let rows: [__m256i; HALF] = std::array::from_fn(|r| {
        // SAFETY: the caller's.
        unsafe {
            let row = |r: usize| steps.add(2 * blocks * r).cast::<__m128i>();
            _mm256_loadu2_m128i(row(r + HALF), row(r))
        }
    });
    let words: [__m256i; HALF] = std::array::from_fn(|i| {
        let (a, b) = (rows[i / 2 * 2], rows[i / 2 * 2 + 1]);
        match i % 2 {
            0 => _mm256_unpacklo_epi16(a, b),
            _ => _mm256_unpackhi_epi16(a, b),
        }
    });
    // Rows 0-3's units 0, 1 | 2, 3 | 4, 5 | 6, 7, then rows 4-7's.
    let [w0, w1, w2, w3, w4, w5, w6, w7] = words;
    let quads = [
        _mm256_unpacklo_epi32(w0, w2),
        _mm256_unpackhi_epi32(w0, w2),
        _mm256_unpacklo_epi32(w1, w3),
        _mm256_unpackhi_epi32(w1, w3),
        _mm256_unpacklo_epi32(w4, w6),
        _mm256_unpackhi_epi32(w4, w6),
        _mm256_unpacklo_epi32(w5, w7),
        _mm256_unpackhi_epi32(w5, w7),
    ];
    std::array::from_fn(|u| {
        let (a, b) = (quads[u / 2], quads[4 + u / 2]);
        match u % 2 {
            0 => _mm256_unpacklo_epi64(a, b),
            _ => _mm256_unpackhi_epi64(a, b),
        }
    })
}

/// Unit `b`'s integer sums of a half's eight stepped 6-bit rows, whose four half lines of
/// nibbles lie at `at` and two of crumbs at `crumbs`, with each activation row: each half
/// unit's sum less the zero point's share, times its step (each row's two in `steps`'
/// lanes, as [`super_block_steps`] gives them, sign-extended), added. The values are made
/// bytes as the AVX-VNNI kernel makes them ([`six_bit_bytes`]), and each 16-bit word's two
/// are multiplied in the pairs of [`pairs`].
///
/// # Safety
/// As for [`rows_dot`], for the unit.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn six_bit_totals<const V: usize>(
    at: *const u8,
    crumbs: *const u8,
    steps: __m256i,
    b: usize,
    xs: &[(&BlockInts, &Activations); V],
) -> [__m256i; V] {
    let low_byte = _mm256_set1_epi16(0x00FF);
    // SAFETY: the caller's.
    let crumbs = [0, 1]
        .map(|d| unsafe { _mm256_loadu_si256(crumbs.add(d * INTERLEAVED_LINE_BYTES).cast()) });
    // Per activation row, each half unit's sum.
    let mut sums = [[_mm256_setzero_si256(); 2]; V];
    for k in 0..4 {
        // SAFETY: the caller's.
        let line = unsafe { _mm256_loadu_si256(at.add(k * INTERLEAVED_LINE_BYTES).cast()) };
        let [first, second] = six_bit_bytes(line, crumbs, k);
        // Each word's first byte, values `4k` and `4k + 2` of the line's (or `16 + ..`),
        // and its second, `4k + 1` and `4k + 3`.
        let words = [
            _mm256_and_si256(first, low_byte),
            _mm256_srli_epi16::<8>(first),
            _mm256_and_si256(second, low_byte),
            _mm256_srli_epi16::<8>(second),
        ];
        for v in 0..V {
            // SAFETY: the unit's pairs lie inside the activations, as the caller guarantees.
            let pairs = unsafe { xs[v].1.pairs.as_ptr().add(b * NIBBLE_BLOCK / 2 + 4 * k) };
            // SAFETY: as above.
            let pair = |i: usize| _mm256_set1_epi32(unsafe { pairs.add(i).read() });
            let [first_sum, second_sum] = &mut sums[v];
            let first = _mm256_add_epi32(
                _mm256_madd_epi16(words[0], pair(0)),
                _mm256_madd_epi16(words[1], pair(2)),
            );
            let second = _mm256_add_epi32(
                _mm256_madd_epi16(words[2], pair(1)),
                _mm256_madd_epi16(words[3], pair(3)),
            );
            *first_sum = _mm256_add_epi32(*first_sum, first);
            *second_sum = _mm256_add_epi32(*second_sum, second);
        }
    }
    let first_steps = _mm256_srai_epi32::<24>(_mm256_slli_epi32::<24>(steps));
    let second_steps = _mm256_srai_epi32::<8>(steps);
    let mut totals = [_mm256_setzero_si256(); V];
    for v in 0..V {
        let zero_sums = &xs[v].1.zero_sums[2 * b..2 * b + 2];
        let [first, second] = sums[v];
        let first = _mm256_sub_epi32(first, _mm256_set1_epi32(zero_sums[0]));
        let second = _mm256_sub_epi32(second, _mm256_set1_epi32(zero_sums[1]));
        totals[v] = _mm256_add_epi32(
            _mm256_mullo_epi32(first, first_steps),
            _mm256_mullo_epi32(second, second_steps),
        );
    }
    totals
}
