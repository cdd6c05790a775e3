//! The integer decode kernel on AVX-512: thirty-two 16-bit products per instruction, twice
//! the AVX2 kernel's sixteen, and with VNNI their pairs added to the sums in the same one.
//!
//! With 16-bit activations (kept for their accuracy, see [`BlockInts`]) a decode step at
//! 1–2B parameters is bound by instructions, not memory: the AVX2 kernel read a 1.7B Q4_K_M
//! file's weights at a fifth of the memory bandwidth. Here one vector of products holds two
//! blocks' halves, so each pair of blocks costs one conversion and one scaling where the AVX2
//! kernel spends one per block, and the weight and activation scales are multiplied once per
//! group of rows, ahead of their loops.
//!
//! The integer sums are the AVX2 kernel's exactly; only the order in which the scaled block
//! sums are added differs.

use std::arch::x86_64::*;

use super::BlockInts;
use super::avx2::{PREFETCH_BYTES_Q8, prefetch};
use crate::model::cpu::math::nibbles_in_order;
use crate::model::cpu::weights::{Factors, Ints};

/// Rows whose factors are formed in one pass. A row's factors follow the row before's in
/// memory, so one pass serves a group of rows: a pass per row, each with its own setup, took
/// a fifth of a Qwen3-1.7B Q4_K_M decode step (perf), and grouped the step ran 3% faster.
/// Sixteen rows' factors are at most 12 KiB (blocks of 32 of 6,144 values), which stay in the
/// first-level cache.
const ROWS_AT_ONCE: usize = 16;

/// Activation rows [`rows_dot_together`] takes at once: each keeps two totals in registers.
pub const TOGETHER: usize = 4;

/// The activations as the kernel reads them besides their values: for blocks of 32, the
/// values [`paired`]; and their block scales and sums repeated for [`ROWS_AT_ONCE`] rows,
/// which a group's factors multiply element by element.
pub struct Activations {
    /// Empty for blocks of 16, which the kernel reads as they are.
    paired: Vec<i16>,
    scales: Vec<f32>,
    sums: Vec<f32>,
}

impl Activations {
    pub fn of(x: &BlockInts) -> Self {
        Self {
            paired: match x.block {
                32 => paired(x),
                _ => Vec::new(),
            },
            scales: x.scales.repeat(ROWS_AT_ONCE),
            sums: x.sums.repeat(ROWS_AT_ONCE),
        }
    }
}

/// Activations for blocks of 32, reordered so that one vector of 32 lanes holds the same
/// half of two blocks: per pair of blocks, the first halves of both, then the second halves
/// of both. A last, odd block stays in order.
fn paired(x: &BlockInts) -> Vec<i16> {
    let mut out = Vec::with_capacity(x.values.len());
    let mut pairs = x.values.chunks_exact(64);
    for pair in &mut pairs {
        for half in [&pair[..16], &pair[32..48], &pair[16..32], &pair[48..]] {
            out.extend_from_slice(half);
        }
    }
    out.extend_from_slice(pairs.remainder());
    out
}

/// Blocks `b` and `b + 1` of a row of bytes from `w`, widened to 16 bits: each vector holds
/// the same half of both, as [`paired`] orders the activations. Asks for the bytes ahead.
#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vl")]
#[inline]
unsafe fn byte_pair(w: *const i8, b: usize) -> [__m512i; 2] {
    // SAFETY: the caller asks for two blocks the row holds.
    unsafe {
        let at = w.add(b * 32);
        prefetch(at, PREFETCH_BYTES_Q8);
        let halves = |h: usize| {
            let first = _mm_loadu_si128(at.add(16 * h).cast());
            let second = _mm_loadu_si128(at.add(32 + 16 * h).cast());
            _mm512_cvtepi8_epi16(_mm256_inserti128_si256::<1>(
                _mm256_castsi128_si256(first),
                second,
            ))
        };
        [halves(0), halves(1)]
    }
}

/// Block `b` of a row of bytes alone, widened in order.
#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vl")]
#[inline]
unsafe fn byte_block(w: *const i8, b: usize) -> __m512i {
    // SAFETY: the caller asks for a block the row holds.
    unsafe { _mm512_cvtepi8_epi16(_mm256_loadu_si256(w.add(b * 32).cast())) }
}

/// 4-bit values as the kernels widen them, their zero point taken off.
struct NibbleWidening {
    low_bits: __m256i,
    zero: __m256i,
}

impl NibbleWidening {
    #[target_feature(enable = "avx2,avx512f,avx512bw,avx512vl")]
    #[inline]
    fn new(zero: u8) -> Self {
        Self {
            low_bits: _mm256_set1_epi8(0x0F),
            zero: _mm256_set1_epi8(zero as i8),
        }
    }

    /// Blocks `b` and `b + 1` from `w`: a block's 16 bytes hold its first 16 values in their
    /// low halves and its last 16 in their high ones, so the low halves of two blocks are the
    /// first halves of both, as [`paired`] orders the activations. Asks for the bytes ahead.
    #[target_feature(enable = "avx2,avx512f,avx512bw,avx512vl")]
    #[inline]
    unsafe fn pair(&self, w: *const u8, b: usize) -> [__m512i; 2] {
        // SAFETY: the caller asks for two blocks the row holds.
        unsafe {
            prefetch(w.add(b * 16), PREFETCH_BYTES_Q8);
            let packed = _mm256_loadu_si256(w.add(b * 16).cast());
            let low = _mm256_and_si256(packed, self.low_bits);
            let high = _mm256_and_si256(_mm256_srli_epi16::<4>(packed), self.low_bits);
            [low, high].map(|half| _mm512_cvtepi8_epi16(_mm256_sub_epi8(half, self.zero)))
        }
    }

    /// Block `b` alone: its low halves, then its high ones, which are its values in order.
    #[target_feature(enable = "avx2,avx512f,avx512bw,avx512vl")]
    #[inline]
    unsafe fn block(&self, w: *const u8, b: usize) -> __m512i {
        // SAFETY: the caller asks for a block the row holds.
        let both = nibbles_in_order(unsafe { _mm_loadu_si128(w.add(b * 16).cast()) });
        _mm512_cvtepi8_epi16(_mm256_sub_epi8(
            _mm256_and_si256(both, self.low_bits),
            self.zero,
        ))
    }
}

/// 5-bit values as the kernels widen them: a block's nibbles as [`NibbleWidening`] reads
/// them, and its fifth bits from one word per block (see `fifth_bit`), their zero point
/// taken off.
struct FiveBitWidening {
    low_bits: __m256i,
    zero: __m512i,
    bottoms: __m512i,
    /// The bit of its block's word that lane pair `d` of a first half takes: bits `d` and
    /// `16 + d`, the first half's word in the low lanes, the second's in the high ones.
    firsts: __m512i,
    /// The same for the second halves: bits `8 + d` and `24 + d`.
    seconds: __m512i,
}

impl FiveBitWidening {
    #[target_feature(enable = "avx2,avx512f,avx512bw,avx512vl")]
    #[inline]
    fn new(zero: u8) -> Self {
        let firsts = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7);
        Self {
            low_bits: _mm256_set1_epi8(0x0F),
            zero: _mm512_set1_epi16(i16::from(zero)),
            bottoms: _mm512_set1_epi32(0x0001_0001),
            firsts,
            seconds: _mm512_add_epi32(firsts, _mm512_set1_epi32(8)),
        }
    }

    /// Sixteen where a value's fifth bit is set: lane pair `d` of each half takes bits
    /// `shift` and `16 + shift` of its block's word.
    #[target_feature(enable = "avx2,avx512f,avx512bw,avx512vl")]
    #[inline]
    fn sixteens(&self, words: __m512i, shifts: __m512i) -> __m512i {
        let bits = _mm512_and_si512(_mm512_srlv_epi32(words, shifts), self.bottoms);
        _mm512_slli_epi16::<4>(bits)
    }

    #[target_feature(enable = "avx2,avx512f,avx512bw,avx512vl")]
    #[inline]
    fn widen(&self, bytes: __m256i, high: __m512i) -> __m512i {
        let values = _mm512_cvtepu8_epi16(_mm256_and_si256(bytes, self.low_bits));
        _mm512_sub_epi16(_mm512_or_si512(values, high), self.zero)
    }

    /// Blocks `b` and `b + 1` of nibbles `w` and words `h`, ordered as
    /// [`NibbleWidening::pair`] orders them. Asks for the nibbles ahead.
    #[target_feature(enable = "avx2,avx512f,avx512bw,avx512vl")]
    #[inline]
    unsafe fn pair(&self, w: *const u8, h: *const u32, b: usize) -> [__m512i; 2] {
        // SAFETY: the caller asks for two blocks the row holds.
        let (packed, words) = unsafe {
            prefetch(w.add(b * 16), PREFETCH_BYTES_Q8);
            (
                _mm256_loadu_si256(w.add(b * 16).cast()),
                _mm512_inserti64x4::<1>(
                    _mm512_set1_epi32(h.add(b).read() as i32),
                    _mm256_set1_epi32(h.add(b + 1).read() as i32),
                ),
            )
        };
        [
            self.widen(packed, self.sixteens(words, self.firsts)),
            self.widen(
                _mm256_srli_epi16::<4>(packed),
                self.sixteens(words, self.seconds),
            ),
        ]
    }

    /// Block `b` alone: its low halves, then its high ones, which are its values in order;
    /// its word's bits for both.
    #[target_feature(enable = "avx2,avx512f,avx512bw,avx512vl")]
    #[inline]
    unsafe fn block(&self, w: *const u8, h: *const u32, b: usize) -> __m512i {
        // SAFETY: the caller asks for a block the row holds.
        let (nibbles, word) = unsafe { (_mm_loadu_si128(w.add(b * 16).cast()), h.add(b).read()) };
        let shifts = _mm512_inserti64x4::<1>(self.firsts, _mm512_castsi512_si256(self.seconds));
        let word = _mm512_set1_epi32(word as i32);
        self.widen(nibbles_in_order(nibbles), self.sixteens(word, shifts))
    }
}

/// 6-bit values as the kernels widen them: a unit of 32 values is two blocks of 16, 16
/// bytes of nibbles and 8 of crumbs.
struct SixBitWidening {
    low_bits: __m512i,
    top_bits: __m512i,
    zero: __m512i,
    /// Each unit's 16 bytes twice, the second copy's high nibbles shifted down: its low
    /// nibbles, then its high ones.
    twice: __m512i,
    nibble_shifts: __m512i,
    /// Each unit's crumbs in the four words of its values; word `q` finds element `8q + j`'s
    /// top bits at bit `2q` of byte `j` (see `crumb_at`) and rotates them to bits 4 and 5.
    crumb_words: __m512i,
    rotations: __m512i,
}

impl SixBitWidening {
    #[target_feature(enable = "avx2,avx512f,avx512bw,avx512vl")]
    #[inline]
    fn new(zero: u8) -> Self {
        let four = 0x0004_0004_0004_0004;
        Self {
            low_bits: _mm512_set1_epi8(0x0F),
            top_bits: _mm512_set1_epi8(0x30),
            zero: _mm512_set1_epi16(i16::from(zero)),
            twice: _mm512_setr_epi64(0, 1, 0, 1, 2, 3, 2, 3),
            nibble_shifts: _mm512_setr_epi64(0, 0, four, four, 0, 0, four, four),
            crumb_words: _mm512_setr_epi64(0, 0, 0, 0, 1, 1, 1, 1),
            rotations: _mm512_setr_epi64(4, 2, 0, 62, 4, 2, 0, 62),
        }
    }

    /// The two units from block `b` (of 16) of nibbles `w` and crumbs `c`, as 64 bytes in
    /// order. Asks for the nibbles ahead.
    #[target_feature(enable = "avx2,avx512f,avx512bw,avx512vl")]
    #[inline]
    unsafe fn units(&self, w: *const u8, c: *const u8, b: usize) -> [__m512i; 2] {
        // SAFETY: the caller asks for two units the row holds.
        let (packed, crumbs) = unsafe {
            prefetch(w.add(b * 8), PREFETCH_BYTES_Q8);
            (
                _mm256_loadu_si256(w.add(b * 8).cast()),
                _mm_loadu_si128(c.add(b * 4).cast()),
            )
        };
        let packed = _mm512_permutexvar_epi64(self.twice, _mm512_castsi256_si512(packed));
        let lows = _mm512_srlv_epi16(packed, self.nibble_shifts);
        let crumbs = _mm512_permutexvar_epi64(self.crumb_words, _mm512_castsi128_si512(crumbs));
        let tops = _mm512_and_si512(_mm512_rolv_epi64(crumbs, self.rotations), self.top_bits);
        // (lows & low_bits) | tops
        let bytes = _mm512_ternarylogic_epi32::<0xEA>(lows, self.low_bits, tops);
        [
            _mm512_castsi512_si256(bytes),
            _mm512_extracti64x4_epi64::<1>(bytes),
        ]
        .map(|half| _mm512_sub_epi16(_mm512_cvtepu8_epi16(half), self.zero))
    }

    /// The unit from block `b` alone: its low halves, then its high ones.
    #[target_feature(enable = "avx2,avx512f,avx512bw,avx512vl")]
    #[inline]
    unsafe fn unit(&self, w: *const u8, c: *const u8, b: usize) -> __m512i {
        // SAFETY: the caller asks for a unit the row holds.
        let (nibbles, crumbs) = unsafe {
            (
                _mm_loadu_si128(w.add(b * 8).cast()),
                c.add(b * 4).cast::<i64>().read_unaligned(),
            )
        };
        let lows = nibbles_in_order(nibbles);
        let tops = _mm256_and_si256(
            _mm256_rolv_epi64(
                _mm256_set1_epi64x(crumbs),
                _mm512_castsi512_si256(self.rotations),
            ),
            _mm512_castsi512_si256(self.top_bits),
        );
        let bytes =
            _mm256_ternarylogic_epi32::<0xEA>(lows, _mm512_castsi512_si256(self.low_bits), tops);
        _mm512_sub_epi16(_mm512_cvtepu8_epi16(bytes), self.zero)
    }
}

/// Adds blocks' integer sums, scaled, to `$totals`: `$pairs` gives the sums of `$step` blocks
/// from block `$b`, a vector per pair (lanes 0–7 its first block's, 8–15 its second's), and
/// `$rest` those of the `$rest_blocks` blocks a row may end with (1: every lane block `$b`'s;
/// 2: a pair). `$combined` holds each block's weight scale times its activation scale.
macro_rules! add_blocks {
    (
        $totals:ident, $blocks:expr, $combined:expr,
        |$b:ident| $step:literal: $pairs:expr, $rest_blocks:literal: $rest:expr
    ) => {{
        let blocks: usize = $blocks;
        let c: *const f32 = $combined;
        // Lanes 0–7 of a pair's sums are its first block's, 8–15 its second's.
        let pair_lanes = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
        // The factors of blocks `b` and `b + 1` in the lanes of their sums.
        let two = |b: usize| {
            let both = _mm_castpd_ps(_mm_load_sd(c.add(b).cast()));
            _mm512_permutexvar_ps(pair_lanes, _mm512_castps128_ps512(both))
        };
        // Pair `p` adds to total `p % 2`, two chains of multiply-adds in flight. The totals
        // are swapped after each pair rather than indexed by `p`: an index the compiler
        // cannot resolve kept them on the stack, and every pair waited on a store and a
        // load of its total (28% of a 1.7B decode step on Zen 4).
        let [mut next, mut other] = $totals;
        let mut $b = 0;
        while $b + $step <= blocks {
            let sums: [__m512i; $step / 2] = $pairs;
            for (i, sums) in sums.into_iter().enumerate() {
                next = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums), two($b + 2 * i), next);
                std::mem::swap(&mut next, &mut other);
            }
            $b += $step;
        }
        // After an odd number of pairs, `next` holds total 1.
        if ($b / 2) % 2 == 1 {
            std::mem::swap(&mut next, &mut other);
        }
        $totals = [next, other];
        if $b < blocks {
            let sums: __m512i = $rest;
            let scale = match $rest_blocks {
                1 => _mm512_set1_ps(*c.add($b)),
                _ => two($b),
            };
            $totals[0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums), scale, $totals[0]);
        }
    }};
}

macro_rules! kernel {
    ($name:ident, $features:literal, $dot:expr) => {
        /// Adds each row's product with `x` to `out`, offsets included. `prepared` is
        /// [`Activations::of`]`(x)`; `buffer` is scratch space.
        ///
        /// # Safety
        /// The CPU must have the features named; `weight` must hold `out.len()` rows of
        /// `x.values.len()` values in blocks of `x.block` (bytes in blocks of 16 or 32,
        /// 4- and 5-bit values in blocks of 32), and `scales` and `offsets` one factor per
        /// block.
        #[target_feature(enable = $features)]
        pub unsafe fn $name(
            weight: Ints<'_>,
            scales: Factors<'_>,
            offsets: Option<Factors<'_>>,
            x: &BlockInts,
            prepared: &Activations,
            buffer: &mut Vec<f32>,
            out: &mut [f32],
        ) {
            let cols = x.values.len();
            let blocks = cols / x.block;
            let group = ROWS_AT_ONCE * blocks;
            if buffer.len() < 2 * group {
                buffer.resize(2 * group, 0.0);
            }
            // Each block's weight scale times its activation scale, and its offset times
            // its activation sum.
            let (combined, offset_terms) = buffer[..2 * group].split_at_mut(group);
            // Sixteen pairs of 16-bit products, added to `sums`.
            let dot = $dot;
            // The sums of a pair of blocks of 32 from their first halves and their second
            // halves (as `paired` orders the activations), the activations' from `at`.
            let pair = |first: __m512i, second: __m512i, at: *const i16| {
                // SAFETY: the callers ask for a pair of blocks the row holds, and `at` is its
                // activations'.
                unsafe {
                    let sums = dot(_mm512_setzero_si512(), first, _mm512_loadu_si512(at.cast()));
                    dot(sums, second, _mm512_loadu_si512(at.add(32).cast()))
                }
            };
            for (part, out) in out.chunks_mut(ROWS_AT_ONCE).enumerate() {
                let first = part * ROWS_AT_ONCE;
                let factors = first * blocks..(first + out.len()) * blocks;
                // SAFETY: `prepared` repeats the activations' scales and sums for as many
                // rows as a group has.
                unsafe {
                    products(scales.range(factors.clone()), &prepared.scales, combined);
                    if let Some(offsets) = offsets {
                        products(offsets.range(factors), &prepared.sums, offset_terms);
                    }
                }
                for (in_part, y) in out.iter_mut().enumerate() {
                    let row = first + in_part;
                    let row_factors = in_part * blocks..(in_part + 1) * blocks;
                    let mut totals = [_mm512_setzero_ps(); 2];
                    if offsets.is_some() {
                        totals[1] = lanes_sum(&offset_terms[row_factors.clone()]);
                    }
                    let combined = combined[row_factors].as_ptr();
                    // SAFETY: every read below lies inside the row's weights and `x`: `add_blocks`
                    // asks for the blocks from `b` that the row holds.
                    unsafe {
                        match weight {
                            Ints::Bytes(values) if x.block == 16 => {
                                let w = values.as_ptr().add(row * cols);
                                let v = x.values.as_ptr();
                                add_blocks!(
                                    totals,
                                    blocks,
                                    combined,
                                    |b| 2: [{
                                        prefetch(w.add(b * 16), PREFETCH_BYTES_Q8);
                                        let ws = _mm512_cvtepi8_epi16(_mm256_loadu_si256(
                                            w.add(b * 16).cast(),
                                        ));
                                        dot(
                                            _mm512_setzero_si512(),
                                            ws,
                                            _mm512_loadu_si512(v.add(b * 16).cast()),
                                        )
                                    }],
                                    1: {
                                        let ws = _mm256_cvtepi8_epi16(_mm_loadu_si128(
                                            w.add(b * 16).cast(),
                                        ));
                                        let xs = _mm256_loadu_si256(v.add(b * 16).cast());
                                        dot(
                                            _mm512_setzero_si512(),
                                            _mm512_zextsi256_si512(ws),
                                            _mm512_zextsi256_si512(xs),
                                        )
                                    }
                                );
                            }
                            Ints::Bytes(values) => {
                                let w = values.as_ptr().add(row * cols);
                                let v = prepared.paired.as_ptr();
                                add_blocks!(
                                    totals,
                                    blocks,
                                    combined,
                                    |b| 2: [{
                                        let [first, second] = byte_pair(w, b);
                                        pair(first, second, v.add(b * 32))
                                    }],
                                    1: {
                                        let xs = _mm512_loadu_si512(v.add(b * 32).cast());
                                        dot(_mm512_setzero_si512(), byte_block(w, b), xs)
                                    }
                                );
                            }
                            Ints::Nibbles { values, zero } => {
                                let w = values.as_ptr().add(row * cols / 2);
                                let v = prepared.paired.as_ptr();
                                let widen = NibbleWidening::new(zero);
                                add_blocks!(
                                    totals,
                                    blocks,
                                    combined,
                                    |b| 2: [{
                                        let [first, second] = widen.pair(w, b);
                                        pair(first, second, v.add(b * 32))
                                    }],
                                    1: {
                                        let xs = _mm512_loadu_si512(v.add(b * 32).cast());
                                        dot(_mm512_setzero_si512(), widen.block(w, b), xs)
                                    }
                                );
                            }
                            Ints::FiveBits {
                                nibbles,
                                high,
                                zero,
                            } => {
                                let w = nibbles.as_ptr().add(row * cols / 2);
                                let h = high.as_ptr().add(row * blocks);
                                let v = prepared.paired.as_ptr();
                                let widen = FiveBitWidening::new(zero);
                                add_blocks!(
                                    totals,
                                    blocks,
                                    combined,
                                    |b| 2: [{
                                        let [first, second] = widen.pair(w, h, b);
                                        pair(first, second, v.add(b * 32))
                                    }],
                                    1: {
                                        let xs = _mm512_loadu_si512(v.add(b * 32).cast());
                                        dot(_mm512_setzero_si512(), widen.block(w, h, b), xs)
                                    }
                                );
                            }
                            Ints::SixBits {
                                nibbles,
                                crumbs,
                                zero,
                            } => {
                                let w = nibbles.as_ptr().add(row * cols / 2);
                                let c = crumbs.as_ptr().add(row * cols / 4);
                                let v = x.values.as_ptr();
                                let widen = SixBitWidening::new(zero);
                                add_blocks!(
                                    totals,
                                    blocks,
                                    combined,
                                    |b| 4: {
                                        let [first, second] = widen.units(w, c, b);
                                        let xs = |at: usize| _mm512_loadu_si512(v.add(at).cast());
                                        [
                                            dot(_mm512_setzero_si512(), first, xs(b * 16)),
                                            dot(_mm512_setzero_si512(), second, xs(b * 16 + 32)),
                                        ]
                                    },
                                    2: {
                                        let xs = _mm512_loadu_si512(v.add(b * 16).cast());
                                        dot(_mm512_setzero_si512(), widen.unit(w, c, b), xs)
                                    }
                                );
                            }
                        }
                    }
                    *y += _mm512_reduce_add_ps(_mm512_add_ps(totals[0], totals[1]));
                }
            }
        }
    };
}

macro_rules! kernel_together {
    ($name:ident, $features:literal, $dot:expr) => {
        /// [`rows_dot`]'s work for `V` activation rows at once, on 4- and 5-bit weights or
        /// bytes in blocks of 32, or 6-bit weights in blocks of 16: each step's weights are loaded and
        /// widened once for all the rows, then dotted with each row's activations. Each
        /// row's integer sums, scalings and additions are the single-row kernel's, in its
        /// order, so every output is bit for bit what it is alone.
        ///
        /// # Safety
        /// As for [`rows_dot`], for each activation row with its output; `weight` holds
        /// 4- or 5-bit values or bytes in blocks of 32, or 6-bit values in blocks of 16.
        #[target_feature(enable = $features)]
        pub unsafe fn $name<const V: usize>(
            weight: Ints<'_>,
            scales: Factors<'_>,
            offsets: Option<Factors<'_>>,
            xs: [(&BlockInts, &Activations); V],
            buffer: &mut Vec<f32>,
            outs: &mut [&mut [f32]; V],
        ) {
            let cols = xs[0].0.values.len();
            let blocks = cols / xs[0].0.block;
            let group = ROWS_AT_ONCE * blocks;
            if buffer.len() < 2 * V * group {
                buffer.resize(2 * V * group, 0.0);
            }
            let dot = $dot;
            let pair = |first: __m512i, second: __m512i, at: *const i16| {
                // SAFETY: as in the single-row kernel.
                unsafe {
                    let sums = dot(_mm512_setzero_si512(), first, _mm512_loadu_si512(at.cast()));
                    dot(sums, second, _mm512_loadu_si512(at.add(32).cast()))
                }
            };
            let pair_lanes = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
            let rows = outs[0].len();
            for first in (0..rows).step_by(ROWS_AT_ONCE) {
                let in_group = ROWS_AT_ONCE.min(rows - first);
                let factors = first * blocks..(first + in_group) * blocks;
                // Row `v`'s weight scales times its activation scales from `v · group`,
                // and its offsets times its activation sums from `(V + v) · group`.
                let (combined, offset_terms) = buffer[..2 * V * group].split_at_mut(V * group);
                for (v, (_, prepared)) in xs.iter().enumerate() {
                    let part = v * group..(v + 1) * group;
                    // SAFETY: as in the single-row kernel.
                    unsafe {
                        products(
                            scales.range(factors.clone()),
                            &prepared.scales,
                            &mut combined[part.clone()],
                        );
                        if let Some(offsets) = offsets {
                            products(
                                offsets.range(factors.clone()),
                                &prepared.sums,
                                &mut offset_terms[part],
                            );
                        }
                    }
                }
                for in_part in 0..in_group {
                    let row = first + in_part;
                    let mut totals = [[_mm512_setzero_ps(); 2]; V];
                    let mut c = [std::ptr::null::<f32>(); V];
                    for v in 0..V {
                        let row_factors =
                            v * group + in_part * blocks..v * group + (in_part + 1) * blocks;
                        if offsets.is_some() {
                            totals[v][1] = lanes_sum(&offset_terms[row_factors.clone()]);
                        }
                        c[v] = combined[row_factors].as_ptr();
                    }
                    // The pairs of blocks as `pair_weights(b)` widens them, then a last odd
                    // block as `last_weights(b)` does, as the single-row kernel adds them.
                    macro_rules! add_blocks_of_each {
                        (|$b:ident| $pair_weights:expr, $last_weights:expr) => {{
                            let two = |c: *const f32, b: usize| {
                                let both = _mm_castpd_ps(_mm_load_sd(c.add(b).cast()));
                                _mm512_permutexvar_ps(pair_lanes, _mm512_castps128_ps512(both))
                            };
                            let mut $b = 0;
                            while $b + 2 <= blocks {
                                let [first, second] = $pair_weights;
                                for v in 0..V {
                                    let x = xs[v].1.paired.as_ptr().add($b * 32);
                                    let sums = pair(first, second, x);
                                    let [next, other] = &mut totals[v];
                                    let scale = two(c[v], $b);
                                    *next = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums), scale, *next);
                                    std::mem::swap(next, other);
                                }
                                $b += 2;
                            }
                            // After an odd number of pairs, total 1 is first (see `add_blocks`).
                            if ($b / 2) % 2 == 1 {
                                for [next, other] in &mut totals {
                                    std::mem::swap(next, other);
                                }
                            }
                            if $b < blocks {
                                let ordered = $last_weights;
                                for v in 0..V {
                                    let x = xs[v].1.paired.as_ptr().add($b * 32);
                                    let sums = dot(
                                        _mm512_setzero_si512(),
                                        ordered,
                                        _mm512_loadu_si512(x.cast()),
                                    );
                                    let scale = _mm512_set1_ps(*c[v].add($b));
                                    totals[v][0] = _mm512_fmadd_ps(
                                        _mm512_cvtepi32_ps(sums),
                                        scale,
                                        totals[v][0],
                                    );
                                }
                            }
                        }};
                    }
                    // SAFETY: every read lies inside the row's weights, each row's
                    // activations and its factors, as in the single-row kernel.
                    unsafe {
                        match weight {
                            Ints::Nibbles { values, zero } => {
                                let w = values.as_ptr().add(row * cols / 2);
                                let widen = NibbleWidening::new(zero);
                                add_blocks_of_each!(|b| widen.pair(w, b), widen.block(w, b));
                            }
                            Ints::Bytes(values) => {
                                let w = values.as_ptr().add(row * cols);
                                add_blocks_of_each!(|b| byte_pair(w, b), byte_block(w, b));
                            }
                            Ints::SixBits {
                                nibbles,
                                crumbs,
                                zero,
                            } => {
                                // As the single-row kernel: two units of 32 (four blocks of
                                // 16) a step, a last unit alone; the activations in order.
                                let w = nibbles.as_ptr().add(row * cols / 2);
                                let crumbs = crumbs.as_ptr().add(row * cols / 4);
                                let widen = SixBitWidening::new(zero);
                                let two = |c: *const f32, b: usize| {
                                    let both = _mm_castpd_ps(_mm_load_sd(c.add(b).cast()));
                                    _mm512_permutexvar_ps(pair_lanes, _mm512_castps128_ps512(both))
                                };
                                let mut b = 0;
                                while b + 4 <= blocks {
                                    let units = widen.units(w, crumbs, b);
                                    for v in 0..V {
                                        let x = xs[v].0.values.as_ptr().add(b * 16);
                                        for (i, unit) in units.into_iter().enumerate() {
                                            let xs = _mm512_loadu_si512(x.add(32 * i).cast());
                                            let sums = dot(_mm512_setzero_si512(), unit, xs);
                                            let [next, other] = &mut totals[v];
                                            let scale = two(c[v], b + 2 * i);
                                            *next = _mm512_fmadd_ps(
                                                _mm512_cvtepi32_ps(sums),
                                                scale,
                                                *next,
                                            );
                                            std::mem::swap(next, other);
                                        }
                                    }
                                    b += 4;
                                }
                                if (b / 2) % 2 == 1 {
                                    for [next, other] in &mut totals {
                                        std::mem::swap(next, other);
                                    }
                                }
                                if b < blocks {
                                    let unit = widen.unit(w, crumbs, b);
                                    for v in 0..V {
                                        let x = xs[v].0.values.as_ptr().add(b * 16);
                                        let sums = dot(
                                            _mm512_setzero_si512(),
                                            unit,
                                            _mm512_loadu_si512(x.cast()),
                                        );
                                        totals[v][0] = _mm512_fmadd_ps(
                                            _mm512_cvtepi32_ps(sums),
                                            two(c[v], b),
                                            totals[v][0],
                                        );
                                    }
                                }
                            }
                            Ints::FiveBits {
                                nibbles,
                                high,
                                zero,
                            } => {
                                let w = nibbles.as_ptr().add(row * cols / 2);
                                let h = high.as_ptr().add(row * blocks);
                                let widen = FiveBitWidening::new(zero);
                                add_blocks_of_each!(|b| widen.pair(w, h, b), widen.block(w, h, b));
                            }
                        }
                    }
                    for (out, [first, second]) in outs.iter_mut().zip(totals) {
                        out[row] += _mm512_reduce_add_ps(_mm512_add_ps(first, second));
                    }
                }
            }
        }
    };
}

kernel_together!(
    rows_dot_together,
    "avx2,fma,f16c,avx512f,avx512bw,avx512vl",
    |sums, a, b| { _mm512_add_epi32(sums, _mm512_madd_epi16(a, b)) }
);
kernel_together!(
    rows_dot_together_vnni,
    "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni",
    |sums, a, b| _mm512_dpwssd_epi32(sums, a, b)
);

kernel!(
    rows_dot,
    "avx2,fma,f16c,avx512f,avx512bw,avx512vl",
    |sums, a, b| { _mm512_add_epi32(sums, _mm512_madd_epi16(a, b)) }
);
kernel!(
    rows_dot_vnni,
    "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni",
    |sums, a, b| _mm512_dpwssd_epi32(sums, a, b)
);

/// Runs `$body` for each sixteen factors from the first, as f32 in `$vector`, `$at` their
/// first index and `$mask` the lanes that hold one, the kind of factors told apart once;
/// returns how many it ran for (the rest are the caller's). f16 and f32 factors are read to
/// the end, the last few under a mask: rows of 576 values (SmolLM2-135M) have 18 blocks. A K
/// type's (a base per group of 8 or 16 times a small integer each) are widened in registers,
/// sixteen at a time: converted one at a time, they took as long as the product itself.
macro_rules! each_sixteen {
    ($factors:expr, |$at:ident, $mask:ident, $vector:ident| $body:block) => {{
        let factors: Factors<'_> = $factors;
        let len = factors.len();
        let main = len / 16 * 16;
        let lanes_from = |at: usize| -> __mmask16 {
            match len - at {
                16.. => 0xFFFF,
                left => (1 << left) - 1,
            }
        };
        // SAFETY (all reads): the lanes of `$mask` from `at` hold factors, and with a K type's
        // their groups' bases; masked-off lanes are not read.
        match factors {
            Factors::F16(values) => {
                for $at in (0..len).step_by(16) {
                    let $mask = lanes_from($at);
                    let $vector = unsafe {
                        let at = values.as_ptr().add($at).cast();
                        _mm512_cvtph_ps(_mm256_maskz_loadu_epi16($mask, at))
                    };
                    $body
                }
                len
            }
            Factors::F32(values) => {
                for $at in (0..len).step_by(16) {
                    let $mask = lanes_from($at);
                    let $vector = unsafe { _mm512_maskz_loadu_ps($mask, values.as_ptr().add($at)) };
                    $body
                }
                len
            }
            Factors::Scaled {
                bases,
                steps,
                first,
                per,
            } if first.is_multiple_of(per) && (per == 8 || per == 16) => {
                let lanes = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
                // A shift: a division by `per` here cost 8% of a Qwen3-1.7B Q4_K_M decode step.
                let per_shift = per.trailing_zeros();
                for $at in (0..main).step_by(16) {
                    // Every lane: `main` is whole vectors.
                    let $mask: __mmask16 = 0xFFFF;
                    let $vector = unsafe {
                        let steps = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(
                            steps.as_ptr().add($at).cast(),
                        )));
                        let group = (first + $at) >> per_shift;
                        let two_bases = bases.as_ptr().add(group).cast::<u16>();
                        let bases = match per {
                            16 => _mm512_set1_ps(_mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(
                                i32::from(two_bases.read_unaligned()),
                            )))),
                            _ => {
                                let bits = two_bases.cast::<i32>().read_unaligned();
                                let two = _mm_cvtph_ps(_mm_cvtsi32_si128(bits));
                                _mm512_permutexvar_ps(lanes, _mm512_castps128_ps512(two))
                            }
                        };
                        _mm512_mul_ps(bases, steps)
                    };
                    $body
                }
                main
            }
            Factors::Scaled { .. } => {
                for $at in (0..main).step_by(16) {
                    let $mask = lanes_from($at);
                    let mut each = [0.0f32; 16];
                    for (lane, value) in each.iter_mut().enumerate() {
                        *value = factors.get($at + lane);
                    }
                    let $vector = unsafe { _mm512_loadu_ps(each.as_ptr()) };
                    $body
                }
                main
            }
        }
    }};
}

/// `out[i] = factors[i] · values[i]`: a group of rows' scales times the activations'
/// scales, or their offsets times the activations' block sums.
///
/// # Safety
/// The CPU must have AVX-512 F, BW and VL and F16C; `values` and `out` must hold
/// `factors.len()` values.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
unsafe fn products(factors: Factors<'_>, values: &[f32], out: &mut [f32]) {
    let len = factors.len();
    let (values, out) = (&values[..len], &mut out[..len]);
    let done = each_sixteen!(factors, |at, lanes, factors| {
        // SAFETY: the lanes hold elements of both, which have `len`.
        unsafe {
            let x = _mm512_maskz_loadu_ps(lanes, values.as_ptr().add(at));
            let product = _mm512_mul_ps(factors, x);
            _mm512_mask_storeu_ps(out.as_mut_ptr().add(at), lanes, product);
        }
    });
    for i in done..len {
        out[i] = factors.get(i) * values[i];
    }
}

/// `values` added in sixteen lanes.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
fn lanes_sum(values: &[f32]) -> __m512 {
    let mut total = _mm512_setzero_ps();
    let mut chunks = values.chunks_exact(16);
    for chunk in &mut chunks {
        // SAFETY: the chunk holds 16 values.
        total = _mm512_add_ps(total, unsafe { _mm512_loadu_ps(chunk.as_ptr()) });
    }
    let rest = chunks.remainder();
    let lanes = (1u16 << rest.len()).wrapping_sub(1);
    // SAFETY: the lanes of `lanes` hold `rest`'s values; the others are not read.
    _mm512_add_ps(total, unsafe {
        _mm512_maskz_loadu_ps(lanes, rest.as_ptr())
    })
}
