//! The decode kernel of 4-bit and stepped 6-bit weights held interleaved, sixteen rows to a
//! line (`IntegerValues::Interleaved`, `IntegerValues::SixBitsInterleaved`), on CPUs with
//! AVX-512 VNNI.
//!
//! The other kernels read a row at a time, a block's products spread over the lanes of a
//! vector, and spend as much on adding the lanes across, scaling each block and adding the
//! rows' terms in turn as on the products themselves: on a 1.7B Q4_0 file (AMD EPYC, family
//! 26) leaving out the scaling alone made a decode step 1.16× as fast. Here each 32-bit lane
//! holds a row: one 64-byte line is four bytes of a block of each of sixteen rows, its
//! nibbles times four activations broadcast are sixteen rows' sums in one `vpdpbusd`, and a
//! block's sums, scaled, are added to the sixteen outputs as they stand, with no sum across
//! lanes and no transposition. It decoded a 1.7B Q4_0 file 1.31× as fast as the row kernel
//! (with VNNI, in 512-bit vectors) and the 135M one 1.24×, Q4_K_M 1.06×. 6-bit values add
//! their top bits from two lines of crumbs per unit, and each half unit's sum is multiplied
//! by its step (gathered, two units' at a time, from the factors as stored).
//!
//! The activations stay 16-bit (see `BlockInts`), split into bytes as `integer_vnni` splits
//! them, `x = 256·high + low`: the weights (0 to 63 as stored) are the unsigned operand beside
//! the high bytes and the signed one beside the low. Each block's integer sum, its term and
//! the order the terms are added in are every other kernel's, so the bits are too.

use std::arch::x86_64::*;
use std::ops::Range;

use super::avx2::prefetch;
use half::f16;

use super::integer_avx512::{products, transpose};
use super::{BlockInts, grow};
use crate::model::cpu::weights::{
    Factors, INTERLEAVED_BLOCK_BYTES, INTERLEAVED_CRUMB_BYTES, INTERLEAVED_LINE_BYTES,
    INTERLEAVED_ROWS as ROWS, NIBBLE_BLOCK,
};

/// How far ahead of the line being read the kernel asks for weights: four times the other
/// integer kernels' distance, as this one reads them about as much faster. Against 2 KB,
/// 8 KB decoded a 1.7B Q4_0 file 1.05–1.2× as fast (five alternated pairs) and Q4_K_M
/// 0.98–1.09× (three); 16 and 32 KB were no better.
pub(super) const PREFETCH_BYTES: usize = 8192;

/// Rows a 256-bit half of a line holds, for the kernel that reads half a line at a time.
pub(super) const HALF: usize = ROWS / 2;

/// The activations as the kernel reads them besides their values.
pub struct Activations {
    /// Per block of 32, its values' high bytes (signed), then their low bytes (unsigned).
    pub(super) bytes: Vec<u8>,
    /// For the kernel without VNNI, the values in the pairs it multiplies them in
    /// (`integer_interleaved_avx2::pairs`).
    pub(super) pairs: Vec<i32>,
    /// Per block of the weights' zero points (a block of 32, or for 6-bit weights each half
    /// of one), the zero point times the sum of its values, which comes off the block's sum
    /// of products with the weights as stored.
    pub(super) zero_sums: Vec<i32>,
}

impl Activations {
    /// For weights whose values are stored plus `zero`, in blocks of `zeroed` that a zero
    /// sum each takes off: 32 for 4-bit weights, 16 for 6-bit ones. The values split into
    /// bytes for the VNNI kernels (`as_bytes`), else in pairs for the AVX2 one.
    pub fn of(x: &BlockInts, zero: u8, zeroed: usize, as_bytes: bool) -> Self {
        let zero_sum = |values: &[i16]| values.iter().map(|&v| i32::from(v)).sum::<i32>();
        let zero_sums = (x.values.chunks_exact(zeroed))
            .map(|values| i32::from(zero) * zero_sum(values))
            .collect();
        if !as_bytes {
            return Self {
                bytes: Vec::new(),
                pairs: super::integer_interleaved_avx2::pairs(&x.values),
                zero_sums,
            };
        }
        let mut bytes = vec![0; 2 * x.values.len()];
        let blocks = x.values.chunks_exact(NIBBLE_BLOCK);
        for (block, out) in blocks.zip(bytes.chunks_exact_mut(2 * NIBBLE_BLOCK)) {
            let (high, low) = out.split_at_mut(NIBBLE_BLOCK);
            for ((&v, high), low) in block.iter().zip(high).zip(low) {
                (*high, *low) = ((v >> 8) as u8, v as u8);
            }
        }
        Self {
            bytes,
            pairs: Vec::new(),
            zero_sums,
        }
    }
}

/// Interleaved weights as the kernel reads them.
#[derive(Clone, Copy)]
pub enum Lines<'a> {
    /// 4-bit values.
    Nibbles(&'a [u8]),
    /// Stepped 6-bit values: their nibbles and crumbs, each half unit's step as stored (a
    /// row's in turn), and the factors those steps are part of, which the kernel asks the
    /// cache for ahead.
    SixBits {
        nibbles: &'a [u8],
        crumbs: &'a [u8],
        steps: &'a [i8],
        factors: Factors<'a>,
    },
    /// 5-bit values, which the AVX2 kernel alone reads (`Features::interleaves`): their
    /// nibbles as 4-bit values lie, and their words of fifth bits a line per block.
    FiveBits { nibbles: &'a [u8], high: &'a [u32] },
    /// Bytes in blocks of 32, which the AVX2 kernel alone reads, eight lines a block.
    Bytes(&'a [i8]),
}

/// Adds each row's product with each of the `V` activation rows to that row's output,
/// offsets included, every output summed as `token_lanes` sums it: each block's integer sum
/// whole, less the zero point's share (for 6-bit values, each half's, times its step),
/// scaled (`cvt(sum) · (w_scale · x_scale)`, then `+ offset · Σx` in one rounding), and the
/// blocks' terms added to the output in turn. Each line of weights is loaded and widened
/// once for all `V` activation rows.
///
/// # Safety
/// The CPU must have AVX-512 F, BW, VL and VNNI, FMA and F16C; `lines` must hold
/// `outs[v].len()` rows (whole groups of [`ROWS`]) of `x.values.len()` values interleaved
/// (for 6-bit ones, in whole pairs of units, with two steps per unit), `scales` and, for
/// 4-bit ones, `offsets` one factor per block of 32 of those rows (for 4-bit ones laid out
/// by block as the loader lays them out, or in any form; 6-bit ones have no offsets); each
/// `prepared` is [`Activations::of`] its `x` with the weights' zero point and blocks of it.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub unsafe fn rows_dot<'a, const V: usize>(
    lines: Lines<'a>,
    scales: Factors<'a>,
    offsets: Option<Factors<'a>>,
    xs: [(&BlockInts, &Activations); V],
    buffer: &mut Vec<f32>,
    outs: &mut [&mut [f32]; V],
) {
    assert!(
        offsets.is_none() || matches!(lines, Lines::Nibbles(_)),
        "interleaved 6-bit values have no offsets"
    );
    let blocks = xs[0].0.scales.len();
    let group = ROWS * blocks;
    // 4-bit weights' factors lie by block (see `OfGroup`) and are scaled in the loop, a
    // block's once for each activation row: four activation rows' products with a weight
    // in L2 ran 1.2–1.3× as fast as with each row's scaled factors formed for the group
    // first (8192 columns too, where those took 64 KB a group, more than L1). 6-bit ones'
    // lie in rows, and each activation row's factors times its scales are formed a group
    // at a time: for one activation row as they lie, a row's blocks together, each block's
    // sixteen gathered from there (a decode step 1.03–1.07× as fast as with the transposes
    // below); for several, transposed once to a block's sixteen rows together, which as
    // many gathers per block made 0.7× as fast. A group's factors as they are formed, for
    // the transposes; for 4-bit weights whose factors are not laid out by block, the
    // group's scales and offsets formed so.
    let gathered = V == 1;
    let needed = (2 * V + 1) * group;
    grow(buffer, needed);
    let (scaled, rest) = buffer[..needed].split_at_mut(V * group);
    let (by_row, repeated) = rest.split_at_mut(group);
    // 6-bit values' factors are formed as they lie, row by row: each activation row's
    // scales repeated for each row of a group, which they multiply element by element.
    if let Lines::SixBits { .. } = lines {
        for ((x, _), repeated) in xs.iter().zip(repeated.chunks_exact_mut(group)) {
            for row in repeated.chunks_exact_mut(blocks) {
                row.copy_from_slice(&x.scales);
            }
        }
    }
    let factors = Scaling {
        gathered,
        // Where a block's factor of each of a group's sixteen rows lies, as they are formed.
        rows_apart: _mm512_mullo_epi32(
            _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
            _mm512_set1_epi32(blocks as i32),
        ),
        group,
    };
    let rows = outs[0].len();
    let ahead = FactorsAhead::new(lines, scales, offsets, blocks, rows);
    for (g, first) in (0..rows).step_by(ROWS).enumerate() {
        let factors_of_group = first * blocks..(first + ROWS) * blocks;
        let ahead = ahead.of_next(&factors_of_group);
        // 6-bit values' factors, formed a group at a time. SAFETY: the buffers hold a
        // group's factors, and `repeated` each activation row's scales for each row.
        if let Lines::SixBits { .. } = lines {
            for (v, repeated) in repeated.chunks_exact(group).enumerate() {
                let scaled = &mut scaled[v * group..][..group];
                let scales = scales.range(factors_of_group.clone());
                unsafe {
                    match gathered {
                        true => products(scales, repeated, scaled),
                        false => {
                            products(scales, repeated, by_row);
                            by_block(by_row, blocks, scaled);
                        }
                    }
                }
            }
        }
        // SAFETY: the group's outputs, its lines of weights (and steps) and each activation
        // row's blocks lie where read, as the caller guarantees; a prefetch cannot fault.
        unsafe {
            let mut sums: [__m512; V] =
                std::array::from_fn(|v| _mm512_loadu_ps(outs[v].as_ptr().add(first)));
            match lines {
                Lines::Nibbles(values) => {
                    let lines = values.as_ptr().add(g * blocks * INTERLEAVED_BLOCK_BYTES);
                    let of_group = |factors: Factors<'a>, room| {
                        OfGroup::of(factors.range(factors_of_group.clone()), blocks, room)
                    };
                    // Where 6-bit values' factors are formed in rows.
                    let scales = of_group(scales, &mut *by_row);
                    let offsets = offsets.map(|offsets| of_group(offsets, &mut repeated[..group]));
                    for b in 0..blocks {
                        ahead.prefetch(b);
                        let at = lines.add(b * INTERLEAVED_BLOCK_BYTES);
                        let totals = nibble_totals(at, b, &xs);
                        let offsets = offsets.map(|offsets| offsets.block(b));
                        add_terms_of_block(&mut sums, totals, scales.block(b), offsets, b, &xs);
                    }
                }
                Lines::SixBits {
                    nibbles,
                    crumbs,
                    steps,
                    ..
                } => {
                    let lines = nibbles.as_ptr().add(g * blocks * INTERLEAVED_BLOCK_BYTES);
                    let crumbs = crumbs.as_ptr().add(g * blocks * INTERLEAVED_CRUMB_BYTES);
                    // Where each row's steps begin, in bytes from the group's.
                    let steps = steps.as_ptr().add(2 * first * blocks);
                    let steps_apart = _mm512_slli_epi32::<1>(factors.rows_apart);
                    for pair in (0..blocks).step_by(2) {
                        // Both units' steps of each row: the first's two, then the second's.
                        let four =
                            _mm512_i32gather_epi32::<1>(steps_apart, steps.add(2 * pair).cast());
                        for (half, b) in [pair, pair + 1].into_iter().enumerate() {
                            ahead.prefetch(b);
                            let at = lines.add(b * INTERLEAVED_BLOCK_BYTES);
                            let crumbs = crumbs.add(b * INTERLEAVED_CRUMB_BYTES);
                            let two = match half {
                                0 => four,
                                _ => _mm512_srli_epi32::<16>(four),
                            };
                            let totals = six_bit_totals(at, crumbs, two, b, &xs);
                            factors.add_terms(&mut sums, totals, b, scaled);
                        }
                    }
                }
                Lines::FiveBits { .. } | Lines::Bytes(_) => {
                    unreachable!("5- and 8-bit values are interleaved for the AVX2 kernel alone")
                }
            }
            for (v, sums) in sums.iter().enumerate() {
                _mm512_storeu_ps(outs[v].as_mut_ptr().add(first), *sums);
            }
        }
    }
}

/// The factors a kernel asks the cache for while it reads a group's weights: the next
/// group's, a line per block, which read cold when the group began were a quarter of a
/// step. For 6-bit values, their steps with their bases.
#[derive(Clone, Copy)]
pub(super) struct FactorsAhead<'a> {
    factors: Factors<'a>,
    /// Factors stored per block of values.
    per_block: usize,
    offsets: Option<Factors<'a>>,
    blocks: usize,
    rows: usize,
}

impl<'a> FactorsAhead<'a> {
    /// For `lines` of `rows` rows of `blocks` blocks scaled by `scales`, with `offsets`.
    pub(super) fn new(
        lines: Lines<'a>,
        scales: Factors<'a>,
        offsets: Option<Factors<'a>>,
        blocks: usize,
        rows: usize,
    ) -> Self {
        let (factors, per_block) = match lines {
            Lines::SixBits { factors, .. } => (factors, 2),
            Lines::Nibbles(_) | Lines::FiveBits { .. } | Lines::Bytes(_) => (scales, 1),
        };
        Self {
            factors,
            per_block,
            offsets,
            blocks,
            rows,
        }
    }

    /// The stored factors of the group after the one whose factors are `of_group`.
    pub(super) fn of_next(&self, of_group: &Range<usize>) -> Ahead<'a> {
        let group = ROWS * self.blocks;
        let next = of_group.end..(of_group.end + group).min(self.rows * self.blocks);
        let per_block = self.per_block;
        let next_stored = (self.factors).range(per_block * next.start..per_block * next.end);
        let [scales, steps] = next_stored.stored();
        let [offsets, their_steps] =
            (self.offsets).map_or([&[][..]; 2], |offsets| offsets.range(next.clone()).stored());
        Ahead([scales, steps, offsets, their_steps])
    }
}

/// A group's factors' stored bytes, asked for a line of each per block.
pub(super) struct Ahead<'a>([&'a [u8]; 4]);

impl Ahead<'_> {
    /// Asks for the lines that go with block `b`.
    #[inline(always)]
    pub(super) fn prefetch(&self, b: usize) {
        for bytes in &self.0 {
            if let Some(line) = bytes.get(64 * b..) {
                prefetch(line.as_ptr(), 0);
            }
        }
    }
}

/// How a group of 6-bit rows' blocks' sums are scaled (they have no offsets): where their
/// factors lie and in what order.
#[derive(Clone, Copy)]
struct Scaling {
    /// Each block's factors gathered from the rows' (one activation row), or read a block's
    /// sixteen together (several).
    gathered: bool,
    /// Where a block's factor of each of a group's rows lies, from the first's, as formed.
    rows_apart: __m512i,
    /// Factors per activation row of a group.
    group: usize,
}

impl Scaling {
    /// Block `b`'s terms from each activation row's integer sums `totals` (sixteen rows'),
    /// added to `sums`: converted, times the scales of `scaled` (each activation row's
    /// group).
    ///
    /// # Safety
    /// As for [`rows_dot`]; the buffers hold a group's factors, in the order `gathered` says.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    #[inline]
    unsafe fn add_terms<const V: usize>(
        self,
        sums: &mut [__m512; V],
        totals: [__m512i; V],
        b: usize,
        scaled: &[f32],
    ) {
        // SAFETY: the caller's.
        unsafe {
            // Block `b`'s factors of the group's rows.
            let of_block = |factors: *const f32| match self.gathered {
                true => _mm512_i32gather_ps::<4>(self.rows_apart, factors.add(b).cast()),
                false => _mm512_loadu_ps(factors.add(b * ROWS)),
            };
            for (v, sums) in sums.iter_mut().enumerate() {
                let scale = of_block(scaled.as_ptr().add(v * self.group));
                let term = _mm512_mul_ps(_mm512_cvtepi32_ps(totals[v]), scale);
                *sums = _mm512_add_ps(*sums, term);
            }
        }
    }
}

/// A group's factors of one kind laid out by block (`BlockFactors::F16ByBlock`,
/// `ScaledByBlock`), as 4-bit weights interleaved keep theirs: a block's sixteen rows' lie
/// together, and are read as they lie. Gathered from factors formed row by row, each
/// block's scales and offsets were a tenth of a 1.7B Q4_K_M decode step, and forming them
/// another 8%.
#[derive(Clone, Copy)]
pub(super) enum OfGroup<'a> {
    /// Block `b`'s at `[16 b..16 b + 16]`.
    F16(&'a [f16]),
    /// Steps as f16 factors lie, times the bases, a super-block's sixteen together.
    Scaled {
        bases: &'a [f16],
        steps: &'a [i8],
        /// Blocks per base, as a shift.
        per_shift: u32,
    },
    /// Factors in another form, formed by block for the group as f32 (the loader lays 4-bit
    /// weights' factors out by block wherever it interleaves them; tests give them others
    /// too). Read one at a time in the loop, a call per factor, they took registers from
    /// every other form: one activation row's product with a weight in L2 took 1.2–1.8×
    /// the time, four rows' 1.05–1.3×.
    Formed(&'a [f32]),
}

impl<'a> OfGroup<'a> {
    /// Of a group's `factors`, in rows of `blocks` blocks; `room` holds the group's factors
    /// where they are in another form than by block.
    pub(super) fn of(factors: Factors<'a>, blocks: usize, room: &'a mut [f32]) -> Self {
        match factors {
            Factors::F16ByBlock {
                values, first, len, ..
            } => Self::F16(&values[first..first + len]),
            Factors::ScaledByBlock {
                bases,
                steps,
                per,
                first,
                len,
                ..
            } if per.is_power_of_two() => Self::Scaled {
                bases: &bases[first / per..(first + len) / per],
                steps: &steps[first..first + len],
                per_shift: per.trailing_zeros(),
            },
            factors => {
                let room = &mut room[..ROWS * blocks];
                for (b, block) in room.chunks_exact_mut(ROWS).enumerate() {
                    for (r, factor) in block.iter_mut().enumerate() {
                        *factor = factors.get(r * blocks + b);
                    }
                }
                Self::Formed(room)
            }
        }
    }

    /// Block `b`'s factors of the group's sixteen rows, each as `Factors::get` forms it.
    ///
    /// # Safety
    /// The CPU has AVX-512 F and F16C; the group holds block `b`.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    #[inline]
    unsafe fn block(self, b: usize) -> __m512 {
        let sixteen_f16 = |values: &[f16], at: usize| {
            debug_assert!(at + ROWS <= values.len());
            // SAFETY: sixteen f16 lie there, as the caller guarantees.
            unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(values.as_ptr().add(at).cast())) }
        };
        match self {
            Self::F16(values) => sixteen_f16(values, b * ROWS),
            Self::Scaled {
                bases,
                steps,
                per_shift,
            } => {
                let base = sixteen_f16(bases, (b >> per_shift) * ROWS);
                debug_assert!((b + 1) * ROWS <= steps.len());
                // SAFETY: sixteen steps lie there, as the caller guarantees.
                let steps = unsafe { _mm_loadu_si128(steps.as_ptr().add(b * ROWS).cast()) };
                _mm512_mul_ps(base, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(steps)))
            }
            Self::Formed(values) => {
                debug_assert!((b + 1) * ROWS <= values.len());
                // SAFETY: sixteen values lie there, as the caller guarantees.
                unsafe { _mm512_loadu_ps(values.as_ptr().add(b * ROWS)) }
            }
        }
    }

    /// Block `b`'s factors of half `h` of the group's rows (eight), for the 256-bit kernel:
    /// the same values as [`OfGroup::block`]'s lanes.
    ///
    /// # Safety
    /// The CPU has AVX2 and F16C; the group holds block `b`.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub(super) unsafe fn eight(self, b: usize, h: usize) -> __m256 {
        let eight_f16 = |values: &[f16], at: usize| {
            debug_assert!(at + HALF <= values.len());
            // SAFETY: eight f16 lie there, as the caller guarantees.
            unsafe { _mm256_cvtph_ps(_mm_loadu_si128(values.as_ptr().add(at).cast())) }
        };
        let at = b * ROWS + h * HALF;
        match self {
            Self::F16(values) => eight_f16(values, at),
            Self::Scaled {
                bases,
                steps,
                per_shift,
            } => {
                let base = eight_f16(bases, (b >> per_shift) * ROWS + h * HALF);
                debug_assert!(at + HALF <= steps.len());
                // SAFETY: eight steps lie there, as the caller guarantees.
                let steps = unsafe { _mm_loadl_epi64(steps.as_ptr().add(at).cast()) };
                _mm256_mul_ps(base, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(steps)))
            }
            Self::Formed(values) => {
                debug_assert!(at + HALF <= values.len());
                // SAFETY: eight values lie there, as the caller guarantees.
                unsafe { _mm256_loadu_ps(values.as_ptr().add(at)) }
            }
        }
    }
}

/// Block `b`'s terms from each activation row's integer sums `totals` (sixteen rows'),
/// added to `sums`: converted, times the rows' `scales` times the row's activation scale,
/// plus the rows' `offsets` times the block's activation sum.
///
/// # Safety
/// As for [`rows_dot`].
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn add_terms_of_block<const V: usize>(
    sums: &mut [__m512; V],
    totals: [__m512i; V],
    scales: __m512,
    offsets: Option<__m512>,
    b: usize,
    xs: &[(&BlockInts, &Activations); V],
) {
    for (v, sums) in sums.iter_mut().enumerate() {
        let scale = _mm512_mul_ps(scales, _mm512_set1_ps(xs[v].0.scales[b]));
        let mut term = _mm512_mul_ps(_mm512_cvtepi32_ps(totals[v]), scale);
        if let Some(offsets) = offsets {
            let x_sum = _mm512_set1_ps(xs[v].0.sums[b]);
            term = _mm512_fmadd_ps(x_sum, offsets, term);
        }
        *sums = _mm512_add_ps(*sums, term);
    }
}

/// Bytes `i..i + 4` of block `b`'s split activations of `x`, in every lane.
///
/// # Safety
/// The block lies inside `x`'s activations.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn four(x: &Activations, b: usize, i: usize) -> __m512i {
    // SAFETY: the caller's.
    unsafe {
        let at = x.bytes.as_ptr().add(b * 2 * NIBBLE_BLOCK + i);
        _mm512_set1_epi32(at.cast::<i32>().read_unaligned())
    }
}

/// Block `b`'s integer sums of sixteen 4-bit rows, whose four lines lie at `at`, with each
/// activation row, less the zero point's share.
///
/// # Safety
/// As for [`rows_dot`], for the block; asks for weights ahead.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn nibble_totals<const V: usize>(
    at: *const u8,
    b: usize,
    xs: &[(&BlockInts, &Activations); V],
) -> [__m512i; V] {
    // SAFETY: the caller's; a prefetch cannot fault.
    unsafe {
        let low_bits = _mm512_set1_epi8(0x0F);
        // Line `k`: each row's bytes `4k..4k + 4`, values `4k..4k + 4` in their low halves
        // and `16 + 4k..` in their high ones.
        let line: [__m512i; 4] = std::array::from_fn(|k| {
            let at = at.add(k * INTERLEAVED_LINE_BYTES);
            prefetch(at, PREFETCH_BYTES);
            _mm512_loadu_si512(at.cast())
        });
        let lows = line.map(|line| _mm512_and_si512(line, low_bits));
        let highs = line.map(|line| _mm512_and_si512(_mm512_srli_epi16::<4>(line), low_bits));
        let mut totals = [_mm512_setzero_si512(); V];
        for (total, (_, x)) in totals.iter_mut().zip(xs) {
            let [high, high_2, low, low_2] = half_sums(lows, highs, x, b);
            let high = _mm512_slli_epi32::<8>(_mm512_add_epi32(high, high_2));
            let sum = _mm512_add_epi32(high, _mm512_add_epi32(low, low_2));
            *total = _mm512_sub_epi32(sum, _mm512_set1_epi32(x.zero_sums[b]));
        }
        totals
    }
}

/// Unit `b`'s integer sums of sixteen stepped 6-bit rows, whose four lines of nibbles lie at
/// `at` and two of crumbs at `crumbs`, with each activation row: each half's sum less the
/// zero point's share, times its step (each row's two in the low two bytes of `steps`'
/// lanes), added.
///
/// # Safety
/// As for [`rows_dot`], for the unit; asks for weights ahead.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn six_bit_totals<const V: usize>(
    at: *const u8,
    crumbs: *const u8,
    steps: __m512i,
    b: usize,
    xs: &[(&BlockInts, &Activations); V],
) -> [__m512i; V] {
    // SAFETY: the caller's; a prefetch cannot fault.
    unsafe {
        let (low_bits, top_bits) = (_mm512_set1_epi8(0x0F), _mm512_set1_epi8(0x30));
        let line: [__m512i; 4] = std::array::from_fn(|k| {
            let at = at.add(k * INTERLEAVED_LINE_BYTES);
            prefetch(at, PREFETCH_BYTES);
            _mm512_loadu_si512(at.cast())
        });
        let [c0, c1] = [0, 1].map(|d| {
            let at = crumbs.add(d * INTERLEAVED_LINE_BYTES);
            prefetch(at, PREFETCH_BYTES / 2);
            _mm512_loadu_si512(at.cast())
        });
        // Line `k`'s values `4k + i` find their top bits at bit `2(k / 2)` of each row's
        // crumb byte `4(k % 2) + i`, and values `16 + 4k + i` at bit `4 + 2(k / 2)`:
        // shifted to bits 4 and 5.
        let first_tops = [
            _mm512_slli_epi16::<4>(c0),
            _mm512_slli_epi16::<4>(c1),
            _mm512_slli_epi16::<2>(c0),
            _mm512_slli_epi16::<2>(c1),
        ];
        let second_tops = [
            c0,
            c1,
            _mm512_srli_epi16::<2>(c0),
            _mm512_srli_epi16::<2>(c1),
        ];
        // (nibbles & low_bits) | (tops & top_bits)
        let value = |nibbles: __m512i, tops: __m512i| {
            let tops = _mm512_and_si512(tops, top_bits);
            _mm512_ternarylogic_epi32::<0xEA>(nibbles, low_bits, tops)
        };
        let firsts: [__m512i; 4] = std::array::from_fn(|k| value(line[k], first_tops[k]));
        let seconds: [__m512i; 4] =
            std::array::from_fn(|k| value(_mm512_srli_epi16::<4>(line[k]), second_tops[k]));
        let first_steps = _mm512_srai_epi32::<24>(_mm512_slli_epi32::<24>(steps));
        let second_steps = _mm512_srai_epi32::<24>(_mm512_slli_epi32::<16>(steps));
        let mut totals = [_mm512_setzero_si512(); V];
        for (total, (_, x)) in totals.iter_mut().zip(xs) {
            let [high, high_2, low, low_2] = half_sums(firsts, seconds, x, b);
            let first = _mm512_add_epi32(_mm512_slli_epi32::<8>(high), low);
            let second = _mm512_add_epi32(_mm512_slli_epi32::<8>(high_2), low_2);
            let zero_sums = x.zero_sums.as_ptr().add(2 * b);
            let first = _mm512_sub_epi32(first, _mm512_set1_epi32(*zero_sums));
            let second = _mm512_sub_epi32(second, _mm512_set1_epi32(*zero_sums.add(1)));
            *total = _mm512_add_epi32(
                _mm512_mullo_epi32(first, first_steps),
                _mm512_mullo_epi32(second, second_steps),
            );
        }
        totals
    }
}

/// The sums of block `b`'s values `0..16` (`firsts`, four to a lane per line) and `16..32`
/// (`seconds`) of sixteen rows with activation row `x`'s high bytes, then with its low
/// bytes: each half's sum is `256 · high + low`.
///
/// # Safety
/// The block lies inside `x`'s activations; the CPU has AVX-512 VNNI.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn half_sums(
    firsts: [__m512i; 4],
    seconds: [__m512i; 4],
    x: &Activations,
    b: usize,
) -> [__m512i; 4] {
    // SAFETY: the caller's.
    unsafe {
        let zero = _mm512_setzero_si512();
        let (mut high, mut high_2, mut low, mut low_2) = (zero, zero, zero, zero);
        for k in 0..4 {
            high = _mm512_dpbusd_epi32(high, firsts[k], four(x, b, 4 * k));
            high_2 = _mm512_dpbusd_epi32(high_2, seconds[k], four(x, b, 16 + 4 * k));
            low = _mm512_dpbusd_epi32(low, four(x, b, 32 + 4 * k), firsts[k]);
            low_2 = _mm512_dpbusd_epi32(low_2, four(x, b, 48 + 4 * k), seconds[k]);
        }
        [high, high_2, low, low_2]
    }
}

/// A group's factors `by_row` ([`ROWS`] rows of `blocks`) into `out` by block: each block's
/// sixteen rows together, as the kernel scales a block's sums.
///
/// # Safety
/// The CPU must have AVX-512 F; both hold `ROWS · blocks` factors.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
unsafe fn by_block(by_row: &[f32], blocks: usize, out: &mut [f32]) {
    let whole = blocks / ROWS * ROWS;
    for first in (0..whole).step_by(ROWS) {
        // SAFETY: sixteen blocks of each row from `first`, and their sixteen rows each, lie
        // inside both.
        unsafe {
            let mut m: [__m512; ROWS] =
                std::array::from_fn(|r| _mm512_loadu_ps(by_row.as_ptr().add(r * blocks + first)));
            transpose(&mut m);
            for (i, block) in m.iter().enumerate() {
                _mm512_storeu_ps(out.as_mut_ptr().add((first + i) * ROWS), *block);
            }
        }
    }
    for b in whole..blocks {
        for r in 0..ROWS {
            out[b * ROWS + r] = by_row[r * blocks + b];
        }
    }
}
