//! The decode kernel of interleaved 4-bit and stepped 6-bit weights (see
//! `integer_interleaved`) on CPUs with AVX-VNNI but not AVX-512 (Intel's laptops since Alder
//! Lake): each 64-byte line read as two 256-bit halves, eight rows to a half, each half's
//! bytes multiplied as the 512-bit kernel multiplies a line's. The sums, terms and order of
//! addition are that kernel's, and so are the bits. On 1.7B files (AMD EPYC family 26,
//! capped with `SMOLCHAT_MAX_CPU=avxvnni`) it decoded Q4_K_M 1.25–1.31× as fast as the row
//! kernel's bytes with AVX-VNNI, Q4_0 1.26–1.42× and Q6_K 2.2–2.7×.

use std::arch::x86_64::*;

use super::avx2::prefetch;
use super::integer_interleaved::{
    Activations, Ahead, FactorsAhead, HALF, Lines, OfGroup, PREFETCH_BYTES,
};
use super::{BlockInts, grow};
use crate::model::cpu::weights::{
    Factors, INTERLEAVED_BLOCK_BYTES, INTERLEAVED_CRUMB_BYTES, INTERLEAVED_LINE_BYTES,
    INTERLEAVED_ROWS, NIBBLE_BLOCK,
};

/// Sums of products of unsigned bytes by signed ones, four to a 32-bit lane.
///
/// # Safety
/// The CPU must have AVX2 and AVX-VNNI; `N` is even.
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
#[inline]
unsafe fn sum<const N: usize>(pairs: [(__m256i, __m256i); N]) -> __m256i {
    // Two sums taken in turn: each product waits on the one two before it, not the last.
    let (mut even, mut odd) = (_mm256_setzero_si256(), _mm256_setzero_si256());
    for k in (0..N).step_by(2) {
        even = _mm256_dpbusd_avx_epi32(even, pairs[k].0, pairs[k].1);
        odd = _mm256_dpbusd_avx_epi32(odd, pairs[k + 1].0, pairs[k + 1].1);
    }
    _mm256_add_epi32(even, odd)
}

/// Adds each row's product with each of the `V` activation rows to that row's
/// output, as `integer_interleaved::rows_dot` does, a 256-bit half of each line at
/// a time.
///
/// # Safety
/// The CPU must have AVX2, FMA, F16C and AVX-VNNI; otherwise as for
/// `integer_interleaved::rows_dot`.
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
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
        // The sums of the group's first eight rows and of its last eight.
        let sums_at = |h: usize| {
            // SAFETY: the group's outputs lie there, as the caller guarantees.
            std::array::from_fn(|v| unsafe {
                _mm256_loadu_ps(outs[v].as_ptr().add(first + h * HALF))
            })
        };
        let (mut firsts, mut lasts): ([__m256; V], [__m256; V]) = (sums_at(0), sums_at(1));
        // SAFETY: the group's lines of weights (and steps) and each activation
        // row's blocks lie where read, as the caller guarantees; a prefetch
        // cannot fault.
        unsafe {
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
                        [&mut firsts, &mut lasts],
                    );
                }
                Lines::SixBits {
                    nibbles,
                    crumbs,
                    steps,
                    ..
                } => six_bit_group(
                    nibbles.as_ptr().add(g * blocks * INTERLEAVED_BLOCK_BYTES),
                    crumbs.as_ptr().add(g * blocks * INTERLEAVED_CRUMB_BYTES),
                    steps.as_ptr().add(2 * first * blocks),
                    scales.f32s(factors_of_group.clone(), buffer),
                    &ahead,
                    &xs,
                    [&mut firsts, &mut lasts],
                ),
                Lines::FiveBits { .. } | Lines::Bytes(_) => {
                    unreachable!("5- and 8-bit values are interleaved for the AVX2 kernel alone")
                }
            }
            for (h, sums) in [firsts, lasts].iter().enumerate() {
                for (v, sums) in sums.iter().enumerate() {
                    let at = outs[v].as_mut_ptr().add(first + h * HALF);
                    _mm256_storeu_ps(at, *sums);
                }
            }
        }
    }
}

/// A group of 4-bit rows, whose lines begin at `lines`, with factors `scales` and
/// `offsets`: each row's terms added to its sums, the first eight rows' and the
/// last eight's.
///
/// # Safety
/// As for [`rows_dot`], for the group.
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
#[inline]
unsafe fn nibble_group<const V: usize>(
    lines: *const u8,
    scales: OfGroup<'_>,
    offsets: Option<OfGroup<'_>>,
    ahead: &Ahead<'_>,
    xs: &[(&BlockInts, &Activations); V],
    [firsts, lasts]: [&mut [__m256; V]; 2],
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
            let offsets_of = |h| offsets.map(|offsets| offsets.eight(b, h));
            add_terms(firsts, totals, scales.eight(b, 0), offsets_of(0), b, xs);
            let totals = nibble_totals(at.add(32), b, xs);
            add_terms(lasts, totals, scales.eight(b, 1), offsets_of(1), b, xs);
        }
    }
}

/// A group of stepped 6-bit rows, whose lines of nibbles begin at `lines` and of
/// crumbs at `crumbs`, each row's steps `2 · blocks` bytes apart from `steps`,
/// with factors `formed` row by row: each row's terms added to its sums, the
/// first eight rows' and the last eight's.
///
/// # Safety
/// As for [`rows_dot`], for the group.
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
#[inline]
unsafe fn six_bit_group<const V: usize>(
    lines: *const u8,
    crumbs: *const u8,
    steps: *const i8,
    formed: &[f32],
    ahead: &Ahead<'_>,
    xs: &[(&BlockInts, &Activations); V],
    [firsts, lasts]: [&mut [__m256; V]; 2],
) {
    let blocks = xs[0].0.scales.len();
    // Where a block's factor of each of a half's eight rows lies, and its steps.
    let rows_apart = _mm256_mullo_epi32(
        _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
        _mm256_set1_epi32(blocks as i32),
    );
    let steps_apart = _mm256_slli_epi32::<1>(rows_apart);
    // SAFETY: the caller's; a prefetch cannot fault.
    unsafe {
        let last_steps = steps.add(2 * HALF * blocks);
        let last_formed = formed.as_ptr().add(HALF * blocks);
        for pair in (0..blocks).step_by(2) {
            // Both units' steps of each row of each half: the first's two, then
            // the second's.
            let fours = [steps, last_steps]
                .map(|steps| _mm256_i32gather_epi32::<1>(steps.add(2 * pair).cast(), steps_apart));
            for b in [pair, pair + 1] {
                ahead.prefetch(b);
                let at = lines.add(b * INTERLEAVED_BLOCK_BYTES);
                let crumbs = crumbs.add(b * INTERLEAVED_CRUMB_BYTES);
                for k in 0..4 {
                    prefetch(at.add(k * INTERLEAVED_LINE_BYTES), PREFETCH_BYTES);
                }
                for d in 0..2 {
                    let at = crumbs.add(d * INTERLEAVED_LINE_BYTES);
                    prefetch(at, PREFETCH_BYTES / 2);
                }
                let [first, last] = match b == pair {
                    true => fours,
                    false => fours.map(|four| _mm256_srli_epi32::<16>(four)),
                };
                let factors_at =
                    |formed: *const f32| _mm256_i32gather_ps::<4>(formed.add(b), rows_apart);
                let totals = six_bit_totals(at, crumbs, first, b, xs);
                let factors = factors_at(formed.as_ptr());
                add_terms(firsts, totals, factors, None, b, xs);
                let totals = six_bit_totals(at.add(32), crumbs.add(32), last, b, xs);
                add_terms(lasts, totals, factors_at(last_formed), None, b, xs);
            }
        }
    }
}

/// Block `b`'s terms from each activation row's integer sums `totals` (a half's
/// eight rows'), added to `sums`: converted, times the rows' `scales` times the
/// row's activation scale, plus the rows' `offsets` times the block's activation
/// sum.
///
/// Only AVX2's, FMA's and F16C's features, so that the AVX2 kernel's half lines take it too
/// (`integer_interleaved_avx2`).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn add_terms<const V: usize>(
    sums: &mut [__m256; V],
    totals: [__m256i; V],
    scales: __m256,
    offsets: Option<__m256>,
    b: usize,
    xs: &[(&BlockInts, &Activations); V],
) {
    for v in 0..V {
        let scale = _mm256_mul_ps(scales, _mm256_set1_ps(xs[v].0.scales[b]));
        let mut term = _mm256_mul_ps(_mm256_cvtepi32_ps(totals[v]), scale);
        if let Some(offsets) = offsets {
            let x_sum = _mm256_set1_ps(xs[v].0.sums[b]);
            term = _mm256_fmadd_ps(x_sum, offsets, term);
        }
        sums[v] = _mm256_add_ps(sums[v], term);
    }
}

/// Block `b`'s integer sums of a half's eight 4-bit rows, whose four half lines
/// lie at `at`, a line apart, with each activation row, less the zero point's
/// share.
///
/// # Safety
/// As for [`rows_dot`], for the block.
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
#[inline]
unsafe fn nibble_totals<const V: usize>(
    at: *const u8,
    b: usize,
    xs: &[(&BlockInts, &Activations); V],
) -> [__m256i; V] {
    // SAFETY: the caller's.
    unsafe {
        let low_bits = _mm256_set1_epi8(0x0F);
        let [l0, l1, l2, l3] =
            [0, 1, 2, 3].map(|k| _mm256_loadu_si256(at.add(k * INTERLEAVED_LINE_BYTES).cast()));
        // Line `k`'s values `4k..4k + 4` of each row, and `16 + 4k..`.
        let [f0, f1, f2, f3] = [l0, l1, l2, l3].map(|l| _mm256_and_si256(l, low_bits));
        let [s0, s1, s2, s3] =
            [l0, l1, l2, l3].map(|l| _mm256_and_si256(_mm256_srli_epi16::<4>(l), low_bits));
        let mut totals = [_mm256_setzero_si256(); V];
        for v in 0..V {
            let x = xs[v].1;
            let four = |i| four(x, b, i);
            let high = sum::<8>([
                (f0, four(0)),
                (f1, four(4)),
                (f2, four(8)),
                (f3, four(12)),
                (s0, four(16)),
                (s1, four(20)),
                (s2, four(24)),
                (s3, four(28)),
            ]);
            let low = sum::<8>([
                (four(32), f0),
                (four(36), f1),
                (four(40), f2),
                (four(44), f3),
                (four(48), s0),
                (four(52), s1),
                (four(56), s2),
                (four(60), s3),
            ]);
            let sum = _mm256_add_epi32(_mm256_slli_epi32::<8>(high), low);
            totals[v] = _mm256_sub_epi32(sum, _mm256_set1_epi32(x.zero_sums[b]));
        }
        totals
    }
}

/// Unit `b`'s integer sums of a half's eight stepped 6-bit rows, whose four half
/// lines of nibbles lie at `at` and two of crumbs at `crumbs`, with each
/// activation row: each half unit's sum less the zero point's share, times its
/// step (each row's two in the low two bytes of `steps`' lanes), added.
///
/// # Safety
/// As for [`rows_dot`], for the unit.
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
#[inline]
unsafe fn six_bit_totals<const V: usize>(
    at: *const u8,
    crumbs: *const u8,
    steps: __m256i,
    b: usize,
    xs: &[(&BlockInts, &Activations); V],
) -> [__m256i; V] {
    // SAFETY: the caller's.
    unsafe {
        let crumbs =
            [0, 1].map(|d| _mm256_loadu_si256(crumbs.add(d * INTERLEAVED_LINE_BYTES).cast()));
        let [l0, l1, l2, l3] =
            [0, 1, 2, 3].map(|k| _mm256_loadu_si256(at.add(k * INTERLEAVED_LINE_BYTES).cast()));
        let [f0, s0] = six_bit_bytes(l0, crumbs, 0);
        let [f1, s1] = six_bit_bytes(l1, crumbs, 1);
        let [f2, s2] = six_bit_bytes(l2, crumbs, 2);
        let [f3, s3] = six_bit_bytes(l3, crumbs, 3);
        let first_steps = _mm256_srai_epi32::<24>(_mm256_slli_epi32::<24>(steps));
        let second_steps = _mm256_srai_epi32::<24>(_mm256_slli_epi32::<16>(steps));
        let mut totals = [_mm256_setzero_si256(); V];
        for v in 0..V {
            let x = xs[v].1;
            let four = |i| four(x, b, i);
            let first = six_bit_half(
                sum::<4>([(f0, four(0)), (f1, four(4)), (f2, four(8)), (f3, four(12))]),
                sum::<4>([
                    (four(32), f0),
                    (four(36), f1),
                    (four(40), f2),
                    (four(44), f3),
                ]),
                x.zero_sums[2 * b],
            );
            let second = six_bit_half(
                sum::<4>([
                    (s0, four(16)),
                    (s1, four(20)),
                    (s2, four(24)),
                    (s3, four(28)),
                ]),
                sum::<4>([
                    (four(48), s0),
                    (four(52), s1),
                    (four(56), s2),
                    (four(60), s3),
                ]),
                x.zero_sums[2 * b + 1],
            );
            totals[v] = _mm256_add_epi32(
                _mm256_mullo_epi32(first, first_steps),
                _mm256_mullo_epi32(second, second_steps),
            );
        }
        totals
    }
}

/// Half line `k` of a unit's 6-bit values as bytes, its first values (`4k + i`) and its
/// second (`16 + 4k + i`), from its nibbles and the unit's two half lines of crumbs. As the
/// 512-bit kernel finds them: values `4k + i` at bit `2(k / 2)` of each row's crumb byte
/// `4(k % 2) + i`, values `16 + 4k + i` at bit `4 + 2(k / 2)`, shifted to bits 4 and 5.
#[target_feature(enable = "avx2")]
#[inline]
pub(super) fn six_bit_bytes(line: __m256i, crumbs: [__m256i; 2], k: usize) -> [__m256i; 2] {
    let (low_bits, top_bits) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(0x30));
    let value = |nibbles: __m256i, tops: __m256i| {
        _mm256_or_si256(
            _mm256_and_si256(nibbles, low_bits),
            _mm256_and_si256(tops, top_bits),
        )
    };
    let crumbs = crumbs[k % 2];
    let (first_tops, second_tops) = match k / 2 {
        0 => (_mm256_slli_epi16::<4>(crumbs), crumbs),
        _ => (
            _mm256_slli_epi16::<2>(crumbs),
            _mm256_srli_epi16::<2>(crumbs),
        ),
    };
    [
        value(line, first_tops),
        value(_mm256_srli_epi16::<4>(line), second_tops),
    ]
}

/// A half unit's sum from its sums with the high and the low bytes, less the zero
/// point's share.
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
#[inline]
fn six_bit_half(high: __m256i, low: __m256i, zero_sum: i32) -> __m256i {
    let sum = _mm256_add_epi32(_mm256_slli_epi32::<8>(high), low);
    _mm256_sub_epi32(sum, _mm256_set1_epi32(zero_sum))
}

/// Bytes `i..i + 4` of block `b`'s split activations of `x`, in every lane.
///
/// # Safety
/// The block lies inside `x`'s activations.
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
#[inline]
unsafe fn four(x: &Activations, b: usize, i: usize) -> __m256i {
    // SAFETY: the caller's.
    unsafe {
        let at = x.bytes.as_ptr().add(b * 2 * NIBBLE_BLOCK + i);
        _mm256_set1_epi32(at.cast::<i32>().read_unaligned())
    }
}
