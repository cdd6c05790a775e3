//! The decode kernel of interleaved 4-bit weights (see `integer_interleaved`) on CPUs with
//! AVX2 but neither VNNI nor AVX-512: each 64-byte line read as two 256-bit halves, eight
//! rows to a half, as `integer_interleaved_avx_vnni` reads them, but multiplied as 16-bit
//! values (`vpmaddwd`), as the row kernel (`integer_avx2`) multiplies them. The row kernel
//! spends as much again on adding each block's lanes across, scaling each block and adding
//! a group's terms in turn; here each lane is a row's.
//!
//! Each 32-bit lane holds four bytes of one row's block: two 16-bit words of four nibbles.
//! A nibble is multiplied where it lies rather than shifted down first: masked in place, the
//! word's second nibble is 16 times its value and its third 256 times, so the products of
//! each are summed apart and those sums shifted down, exactly, once a block. A half line
//! then takes four instructions to widen where shifting each nibble down took six. The
//! activations are laid out in pairs as the words take them ([`pairs`]), and a pair
//! broadcast meets eight rows' words in one instruction.
//!
//! Each block's integer sum, its term and the order the terms are added in are the other
//! kernels', and so are the bits.

use std::arch::x86_64::*;

use super::avx2::prefetch;
use super::integer_interleaved::{
    Activations, Ahead, FactorsAhead, HALF, Lines, OfGroup, PREFETCH_BYTES,
};
use super::integer_interleaved_avx_vnni::add_terms;
use super::{BlockInts, grow};
use crate::model::cpu::weights::{
    Factors, INTERLEAVED_BLOCK_BYTES, INTERLEAVED_LINE_BYTES, INTERLEAVED_ROWS, NIBBLE_BLOCK,
};

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
/// The CPU must have AVX2, FMA and F16C; `lines` holds 4-bit values; otherwise as for
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
            match lines {
                Lines::Nibbles(values) => {
                    // Factors in another form than by block are formed by block here.
                    let group = INTERLEAVED_ROWS * blocks;
                    grow(buffer, 2 * group);
                    let (room, offsets_room) = buffer[..2 * group].split_at_mut(group);
                    let of_group = |factors: Factors<'a>, room| {
                        OfGroup::of(factors.range(factors_of_group.clone()), blocks, room)
                    };
                    nibble_group(
                        values.as_ptr().add(g * blocks * INTERLEAVED_BLOCK_BYTES),
                        of_group(scales, room),
                        offsets.map(|offsets| of_group(offsets, offsets_room)),
                        &ahead,
                        &xs,
                        &mut halves,
                    );
                }
                Lines::SixBits { .. } => {
                    unreachable!("6-bit values are interleaved only where there is VNNI")
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

/// A group of 4-bit rows, whose lines begin at `lines`, with factors `scales` and
/// `offsets`: each row's terms added to its sums, the first eight rows' and the last
/// eight's.
///
/// # Safety
/// As for [`rows_dot`], for the group.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn nibble_group<const V: usize>(
    lines: *const u8,
    scales: OfGroup<'_>,
    offsets: Option<OfGroup<'_>>,
    ahead: &Ahead<'_>,
    xs: &[(&BlockInts, &Activations); V],
    halves: &mut [[__m256; V]; 2],
) {
    let blocks = xs[0].0.scales.len();
    // SAFETY: the caller's; a prefetch cannot fault.
    unsafe {
        for b in 0..blocks {
            ahead.prefetch(b);
            let at = lines.add(b * INTERLEAVED_BLOCK_BYTES);
            for k in 0..4 {
                prefetch(at.add(k * INTERLEAVED_LINE_BYTES), PREFETCH_BYTES);
            }
            let totals = nibble_totals(at, b, xs);
            for (h, sums) in halves.iter_mut().enumerate() {
                let offsets = offsets.map(|offsets| offsets.eight(b, h));
                add_terms(sums, totals[h], scales.eight(b, h), offsets, b, xs);
            }
        }
    }
}

/// Block `b`'s integer sums of the group's sixteen 4-bit rows, whose four lines lie at
/// `at`, with each activation row, less the zero point's share: the first eight rows' and
/// the last eight's. Both halves of a line are read together, so that each pair of
/// activations is broadcast once for sixteen rows.
///
/// # Safety
/// As for [`rows_dot`], for the block.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn nibble_totals<const V: usize>(
    at: *const u8,
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
