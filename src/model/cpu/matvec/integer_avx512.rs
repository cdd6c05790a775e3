//! The integer decode kernel on AVX-512: thirty-two 16-bit products per instruction, twice
//! the AVX2 kernel's sixteen, and with VNNI their pairs added to the sums in the same one.
//! (One activation row of 4-bit and stepped 6-bit weights takes the AVX2 kernel all the
//! same, which widens them faster: see `kernel_for_rows`.)
//!
//! With 16-bit activations (kept for their accuracy, see [`BlockInts`]) a decode step at
//! 1–2B parameters is bound by instructions, not memory: the AVX2 kernel read a 1.7B Q4_K_M
//! file's weights at a fifth of the memory bandwidth. Here one vector of products holds two
//! blocks' halves (four blocks' quarters for 4-bit values), and the weight and activation
//! scales are multiplied once per group of rows, ahead of their loops.
//!
//! Each output is summed as the prompt kernel (`token_lanes`) sums it, so that a token's
//! outputs are the same bits whether it is decoded alone, beside other sequences, or read
//! in a prompt of any length: each block's integer sum whole, then its term (the sum
//! converted, times the weight's and the activation's scales multiplied, plus the offset
//! times the activations' block sum in one rounding), the terms added to the output block
//! after block. The vector of products holds a block's sum in eight lanes (four for the
//! quads), so sixteen blocks' vectors are added across to a lane per block ([`halve`]) and
//! take one conversion and one scaling; a group of rows' terms are then added to their
//! outputs with rows in lanes ([`add_in_turn`]). On a 1.7B Q4_K_M file this costs about a
//! tenth more kernel time per decoded token than the order it replaced (pairs of blocks
//! scaled in sixteen lanes, the lanes added at the end), which depended on how many
//! tokens were read at once.

use std::arch::x86_64::*;

use super::avx2::{PREFETCH_BYTES_Q8, prefetch};
use super::{BlockInts, grow, with_pair_bases};
use crate::model::cpu::math::nibbles_in_order;
use crate::model::cpu::weights::{Factors, Ints};

/// Rows whose factors are formed in one pass. A row's factors follow the row before's in
/// memory, so one pass serves a group of rows: a pass per row, each with its own setup, took
/// a fifth of a Qwen3-1.7B Q4_K_M decode step (perf), and grouped the step ran 3% faster.
/// Sixteen rows' factors are at most 12 KiB (blocks of 32 of 6,144 values), which stay in the
/// first-level cache.
const ROWS_AT_ONCE: usize = 16;

/// Activation rows the kernel takes at once, for each of which it keeps a chunk's partial
/// sums in registers.
pub const TOGETHER: usize = 4;

/// The activations as the kernel reads them besides their values: for blocks of 32 read in
/// pairs or quads, the values [`arranged`] so; and their block scales repeated for
/// [`ROWS_AT_ONCE`] rows, which a group's factors multiply element by element.
pub struct Activations {
    /// Empty where the kernel reads the values as they are.
    arranged: Vec<i16>,
    scales: Vec<f32>,
}

/// How the kernel reads a weight's blocks of 32, and the activations with them.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Reading {
    /// In order (blocks of 16, and the stepped weights' blocks of 32).
    InOrder,
    /// A pair of blocks at a time ([`paired`]).
    Pairs,
    /// 4-bit values: four blocks at a time ([`quads`]), then the last pairs.
    Quads,
}

impl Activations {
    pub fn of(x: &BlockInts, reading: Reading) -> Self {
        Self {
            arranged: match (reading, x.block) {
                (Reading::Pairs, 32) => paired(&x.values),
                (Reading::Quads, 32) => quads(&x.values),
                _ => Vec::new(),
            },
            scales: x.scales.repeat(ROWS_AT_ONCE),
        }
    }
}

/// Activations for blocks of 32, reordered so that one vector of 32 lanes holds the same
/// half of two blocks: per pair of blocks, the first halves of both, then the second halves
/// of both. A last, odd block stays in order.
fn paired(values: &[i16]) -> Vec<i16> {
    let mut out = Vec::with_capacity(values.len());
    let mut pairs = values.chunks_exact(64);
    for pair in &mut pairs {
        for half in [&pair[..16], &pair[32..48], &pair[16..32], &pair[48..]] {
            out.extend_from_slice(half);
        }
    }
    out.extend_from_slice(pairs.remainder());
    out
}

/// Activations for blocks of 32 as [`NibbleWidening::quad`] widens four blocks: each vector of
/// 32 lanes holds the same quarter of four blocks. The blocks after the last four are
/// [`paired`].
fn quads(values: &[i16]) -> Vec<i16> {
    let mut out = Vec::with_capacity(values.len());
    let mut quads = values.chunks_exact(128);
    for quad in &mut quads {
        for quarter in 0..4 {
            for block in quad.chunks_exact(32) {
                out.extend_from_slice(&block[8 * quarter..][..8]);
            }
        }
    }
    out.extend(paired(quads.remainder()));
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

    /// Blocks `b` to `b + 3`, a quarter of each in each vector, as [`quads`] orders the
    /// activations: a block's bytes 0–7 hold its values 0–7 and 16–23, bytes 8–15 its values
    /// 8–15 and 24–31. One vector's products then hold four lanes of each of four blocks, half
    /// the lanes a pair's take, and a quarter of the additions across lanes are saved.
    #[target_feature(enable = "avx2,avx512f,avx512bw,avx512vl")]
    #[inline]
    unsafe fn quad(&self, w: *const u8, b: usize) -> [__m512i; 4] {
        // SAFETY: the caller asks for four blocks the row holds.
        let packed = unsafe {
            prefetch(w.add(b * 16), PREFETCH_BYTES_Q8);
            _mm512_loadu_si512(w.add(b * 16).cast())
        };
        // Bytes 0–7 of each block, then bytes 8–15 of each.
        let halves = _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7), packed);
        let low_bits = _mm512_castsi256_si512(self.low_bits);
        let low_bits = _mm512_inserti64x4::<1>(low_bits, self.low_bits);
        let lows = _mm512_and_si512(halves, low_bits);
        let highs = _mm512_and_si512(_mm512_srli_epi16::<4>(halves), low_bits);
        [
            _mm512_castsi512_si256(lows),
            _mm512_extracti64x4_epi64::<1>(lows),
            _mm512_castsi512_si256(highs),
            _mm512_extracti64x4_epi64::<1>(highs),
        ]
        .map(|bytes| _mm512_cvtepi8_epi16(_mm256_sub_epi8(bytes, self.zero)))
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

/// Lanes `2i` and `2i + 1` of `a` added into lane `i`, then those of `b` into lane `8 + i`.
/// A vector of a pair of blocks' partial sums (eight lanes each) becomes four lanes each,
/// and three rounds of it turn eight such vectors into one lane per block, exactly: integer
/// sums in any order are the same.
#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vl")]
#[inline]
fn halve(a: __m512i, b: __m512i) -> __m512i {
    let even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    let odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    _mm512_add_epi32(
        _mm512_permutex2var_epi32(a, even, b),
        _mm512_permutex2var_epi32(a, odd, b),
    )
}

/// A sixteen-by-sixteen matrix of rows of `m` transposed in place: each row's terms, a
/// block to a lane, become each block's terms, a row to a lane.
#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vl")]
#[inline]
pub(super) fn transpose(m: &mut [__m512; 16]) {
    let mut t = [_mm512_setzero_ps(); 16];
    for i in 0..8 {
        t[2 * i] = _mm512_unpacklo_ps(m[2 * i], m[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(m[2 * i], m[2 * i + 1]);
    }
    for i in 0..4 {
        let [a, b, c, d] = [t[4 * i], t[4 * i + 1], t[4 * i + 2], t[4 * i + 3]];
        m[4 * i] = _mm512_shuffle_ps::<0x44>(a, c);
        m[4 * i + 1] = _mm512_shuffle_ps::<0xEE>(a, c);
        m[4 * i + 2] = _mm512_shuffle_ps::<0x44>(b, d);
        m[4 * i + 3] = _mm512_shuffle_ps::<0xEE>(b, d);
    }
    // Within each 128-bit lane `l`, `m[4i + j]` now holds column `4l + j` of rows
    // `4i..4i + 4`; then the 128-bit lanes are transposed, four by four.
    let u = *m;
    for j in 0..4 {
        let low = _mm512_shuffle_f32x4::<0x44>(u[j], u[4 + j]);
        let high = _mm512_shuffle_f32x4::<0xEE>(u[j], u[4 + j]);
        let low_2 = _mm512_shuffle_f32x4::<0x44>(u[8 + j], u[12 + j]);
        let high_2 = _mm512_shuffle_f32x4::<0xEE>(u[8 + j], u[12 + j]);
        m[j] = _mm512_shuffle_f32x4::<0x88>(low, low_2);
        m[4 + j] = _mm512_shuffle_f32x4::<0xDD>(low, low_2);
        m[8 + j] = _mm512_shuffle_f32x4::<0x88>(high, high_2);
        m[12 + j] = _mm512_shuffle_f32x4::<0xDD>(high, high_2);
    }
}

/// Adds each of a group's rows' block terms to its output in the order of the blocks:
/// `terms` holds [`ROWS_AT_ONCE`] rows of `stride` terms, of which `blocks` are the row's,
/// and `out` the group's outputs (as many as it has rows).
///
/// # Safety
/// `terms` must hold `ROWS_AT_ONCE · stride` values, `stride` a multiple of 16 and at least
/// `blocks`.
#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vl")]
unsafe fn add_in_turn(terms: &[f32], stride: usize, blocks: usize, out: &mut [f32]) {
    let rows: __mmask16 = (1u32 << out.len()).wrapping_sub(1) as u16;
    // SAFETY: the lanes of `rows` are `out`'s; each chunk of 16 terms of each row lies in
    // `terms`, as the caller guarantees.
    unsafe {
        let mut sums = _mm512_maskz_loadu_ps(rows, out.as_ptr());
        let whole = blocks / 16 * 16;
        for first in (0..whole).step_by(16) {
            let mut m: [__m512; 16] =
                std::array::from_fn(|r| _mm512_loadu_ps(terms.as_ptr().add(r * stride + first)));
            transpose(&mut m);
            for block in m {
                sums = _mm512_add_ps(sums, block);
            }
        }
        // The few blocks past the last sixteen (two of SmolLM2-135M's eighteen) are gathered
        // a block at a time rather than transposed as a whole sixteen.
        let rows_apart = _mm512_mullo_epi32(
            _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
            _mm512_set1_epi32(stride as i32),
        );
        for block in whole..blocks {
            let column = _mm512_i32gather_ps::<4>(rows_apart, terms.as_ptr().add(block).cast());
            sums = _mm512_add_ps(sums, column);
        }
        _mm512_mask_storeu_ps(out.as_mut_ptr(), rows, sums);
    }
}

macro_rules! kernel {
    ($name:ident, $features:literal, $dot:expr) => {
        /// Adds each row's product with each of the `V` activation rows to that row's output,
        /// offsets included, every output summed as `token_lanes` sums it: each block's
        /// integer sum whole, scaled (`cvt(sum) · (w_scale · x_scale)`, then
        /// `+ offset · Σx` in one rounding), and the blocks' terms added to the output in
        /// turn. A row's blocks are taken sixteen at a time, their pairs' partial sums
        /// [`halve`]d to a lane per block; the terms of a group of rows are then added
        /// together, rows in lanes ([`add_in_turn`]). The weights of each step are loaded
        /// and widened once for all `V` activation rows.
        ///
        /// `stepped`: 6-bit values or bytes in blocks of 16 whose pairs share a base, taken
        /// as `token_lanes` takes them: multiplied by their steps and read in blocks of 32
        /// with the base as scale, the activations rounded in blocks of 32 (to
        /// [`STEPPED_LARGEST`](super::STEPPED_LARGEST)).
        ///
        /// # Safety
        /// The CPU must have the features named; `weight` must hold `outs[v].len()` rows of
        /// `x.values.len()` values in blocks of `x.block` (bytes in blocks of 16 or 32,
        /// 4- and 5-bit values in blocks of 32, 6-bit in blocks of 16, and for `stepped`
        /// blocks of 16 paired as one of 32), and `scales` and `offsets` one factor per block
        /// of the weight; each `prepared` is [`Activations::of`] its `x`.
        #[target_feature(enable = $features)]
        pub unsafe fn $name<const V: usize>(
            weight: Ints<'_>,
            scales: Factors<'_>,
            offsets: Option<Factors<'_>>,
            stepped: bool,
            xs: [(&BlockInts, &Activations); V],
            buffer: &mut Vec<f32>,
            outs: &mut [&mut [f32]; V],
        ) {
            let cols = xs[0].0.values.len();
            let blocks = cols / xs[0].0.block;
            // Blocks of the weight's factors per row: two per block when stepped.
            let factors_per_row = scales.len() / outs[0].len().max(1);
            let stride = blocks.next_multiple_of(16);
            let group = ROWS_AT_ONCE * blocks;
            // Each activation row's scaled factors, the offsets in f32, each row's terms.
            let needed = V * group + group + V * ROWS_AT_ONCE * stride;
            grow(buffer, needed);
            let (combined, rest) = buffer[..needed].split_at_mut(V * group);
            let (offset_values, terms) = rest.split_at_mut(group);
            let dot = $dot;
            let zero = _mm512_setzero_si512();
            let with_offsets = offsets.is_some();
            // The integer sums of a pair of blocks of 32 from their first halves and their
            // second halves (as `paired` orders the activations), the activations' at `at`.
            let pair = |first: __m512i, second: __m512i, at: *const i16| {
                // SAFETY: the callers ask for a pair of blocks the row holds, and `at` is its
                // activations'.
                unsafe {
                    let sums = dot(zero, first, _mm512_loadu_si512(at.cast()));
                    dot(sums, second, _mm512_loadu_si512(at.add(32).cast()))
                }
            };
            // 32 values in order times the activations in order at `at`: a whole block's
            // partial sums, sixteen lanes of it.
            let whole = |values: __m512i, at: *const i16| {
                // SAFETY: as for `pair`.
                dot(zero, values, unsafe { _mm512_loadu_si512(at.cast()) })
            };
            let activations: [*const i16; V] =
                std::array::from_fn(|v| match xs[v].1.arranged.is_empty() {
                    true => xs[v].0.values.as_ptr(),
                    false => xs[v].1.arranged.as_ptr(),
                });
            let rows = outs[0].len();
            for first in (0..rows).step_by(ROWS_AT_ONCE) {
                let in_group = ROWS_AT_ONCE.min(rows - first);
                let factors = first * factors_per_row..(first + in_group) * factors_per_row;
                for (v, (_, prepared)) in xs.iter().enumerate() {
                    let part = &mut combined[v * group..(v + 1) * group];
                    // SAFETY: `prepared` repeats the activations' scales for as many rows
                    // as a group has.
                    unsafe {
                        match stepped {
                            true => with_pair_bases(scales.range(factors.clone()), |bases| {
                                products(bases, &prepared.scales, part)
                            }),
                            false => {
                                products(scales.range(factors.clone()), &prepared.scales, part)
                            }
                        }
                    };
                }
                // The group's offsets where they lie in f16 or f32, others widened to f32.
                let (group_offsets, f16_offsets): (*const u8, bool) =
                    match offsets.map(|offsets| offsets.range(factors.clone())) {
                        None => (std::ptr::null(), false),
                        Some(Factors::F16(values)) => (values.as_ptr().cast(), true),
                        Some(Factors::F32(values)) => (values.as_ptr().cast(), false),
                        Some(scaled) => {
                            // SAFETY: the buffer holds a group's factors.
                            unsafe { widened(scaled, offset_values) };
                            (offset_values.as_ptr().cast(), false)
                        }
                    };
                for in_part in 0..in_group {
                    let row = first + in_part;
                    // Scales each chunk's sums into its terms.
                    macro_rules! terms_of {
                        ($chunk:expr, $sums:expr) => {{
                            let (chunk, sums): (usize, [__m512i; V]) = ($chunk, $sums);
                            let lanes: __mmask16 = match blocks - chunk {
                                16.. => 0xFFFF,
                                left => (1 << left) - 1,
                            };
                            let at = in_part * blocks + chunk;
                            for (v, sums) in sums.into_iter().enumerate() {
                                // (Expanded inside the kernel's `unsafe` block.) The lanes of
                                // `lanes` are blocks of the row, whose factors and sums lie at
                                // `at` and `chunk`; the row's terms have `stride` places.
                                let scale = _mm512_maskz_loadu_ps(
                                    lanes,
                                    combined.as_ptr().add(v * group + at),
                                );
                                let mut term = _mm512_mul_ps(_mm512_cvtepi32_ps(sums), scale);
                                if with_offsets {
                                    let offset = match f16_offsets {
                                        true => _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(
                                            lanes,
                                            group_offsets.cast::<u16>().add(at).cast(),
                                        )),
                                        false => _mm512_maskz_loadu_ps(
                                            lanes,
                                            group_offsets.cast::<f32>().add(at),
                                        ),
                                    };
                                    let sum = _mm512_maskz_loadu_ps(
                                        lanes,
                                        xs[v].0.sums.as_ptr().add(chunk),
                                    );
                                    term = _mm512_fmadd_ps(sum, offset, term);
                                }
                                let to = (v * ROWS_AT_ONCE + in_part) * stride + chunk;
                                _mm512_storeu_ps(terms.as_mut_ptr().add(to), term);
                            }
                        }};
                    }
                    // Each chunk of sixteen blocks: `$pair` gives the partial sums of blocks
                    // `$b` and `$b + 1` (of one, the rest zero, at a row's odd end) for each
                    // activation row, eight lanes each. Written out where it is used: as
                    // closures, they were not inlined, and the step ran at half the speed.
                    macro_rules! each_chunk {
                        (|$b:ident| $pair:expr) => {
                            each_chunk!(|$b| $pair, |_q| None)
                        };
                        (|$b:ident| $pair:expr, |$q:ident| $four:expr) => {{
                            for chunk in (0..blocks).step_by(16) {
                                // Blocks `first..first + 4`, four lanes each.
                                let mut fours = [[zero; V]; 4];
                                for (i, four) in fours.iter_mut().enumerate() {
                                    let first = chunk + 4 * i;
                                    if first >= blocks {
                                        break;
                                    }
                                    if first + 4 <= blocks {
                                        let $q = first;
                                        let sums: Option<[__m512i; V]> = $four;
                                        if let Some(sums) = sums {
                                            *four = sums;
                                            continue;
                                        }
                                    }
                                    let p: [__m512i; V] = match first < blocks {
                                        true => {
                                            let $b = first;
                                            $pair
                                        }
                                        false => [zero; V],
                                    };
                                    let q: [__m512i; V] = match first + 2 < blocks {
                                        true => {
                                            let $b = first + 2;
                                            $pair
                                        }
                                        false => [zero; V],
                                    };
                                    *four = std::array::from_fn(|v| halve(p[v], q[v]));
                                }
                                let [a, b, c, d] = fours;
                                terms_of!(
                                    chunk,
                                    std::array::from_fn::<_, V, _>(|v| {
                                        halve(halve(a[v], b[v]), halve(c[v], d[v]))
                                    })
                                );
                            }
                        }};
                    }
                    let at = |b: usize, values_per_block: usize| {
                        activations.map(|x| x.wrapping_add(b * values_per_block))
                    };
                    // SAFETY: every read below lies inside the row's weights and each
                    // activation row: `each_chunk` asks for blocks the row holds.
                    unsafe {
                        match weight {
                            Ints::Bytes(values) if stepped => {
                                let w = values.as_ptr().add(row * cols);
                                let s = scales.steps().as_ptr().add(row * factors_per_row);
                                // Block `b` of 32 times its two steps.
                                let block = |b: usize| {
                                    let steps = steps_of(s, b);
                                    _mm512_mullo_epi16(byte_block(w, b), steps)
                                };
                                each_chunk!(|b| {
                                    let first = block(b);
                                    let x = at(b, 32);
                                    match b + 1 < blocks {
                                        true => {
                                            let second = block(b + 1);
                                            std::array::from_fn(|v| {
                                                halve(
                                                    whole(first, x[v]),
                                                    whole(second, x[v].add(32)),
                                                )
                                            })
                                        }
                                        false => {
                                            std::array::from_fn(|v| halve(whole(first, x[v]), zero))
                                        }
                                    }
                                });
                            }
                            Ints::Bytes(values) if xs[0].0.block == 16 => {
                                let w = values.as_ptr().add(row * cols);
                                each_chunk!(|b| {
                                    let x = at(b, 16);
                                    match b + 1 < blocks {
                                        true => {
                                            prefetch(w.add(b * 16), PREFETCH_BYTES_Q8);
                                            let ws = _mm512_cvtepi8_epi16(_mm256_loadu_si256(
                                                w.add(b * 16).cast(),
                                            ));
                                            std::array::from_fn(|v| whole(ws, x[v]))
                                        }
                                        false => {
                                            let ws = _mm256_cvtepi8_epi16(_mm_loadu_si128(
                                                w.add(b * 16).cast(),
                                            ));
                                            std::array::from_fn(|v| {
                                                let xs = _mm256_loadu_si256(x[v].cast());
                                                dot(
                                                    zero,
                                                    _mm512_zextsi256_si512(ws),
                                                    _mm512_zextsi256_si512(xs),
                                                )
                                            })
                                        }
                                    }
                                });
                            }
                            Ints::Bytes(values) => {
                                let w = values.as_ptr().add(row * cols);
                                each_chunk!(|b| {
                                    let x = at(b, 32);
                                    match b + 1 < blocks {
                                        true => {
                                            let [first, second] = byte_pair(w, b);
                                            std::array::from_fn(|v| pair(first, second, x[v]))
                                        }
                                        false => {
                                            let ws = byte_block(w, b);
                                            std::array::from_fn(|v| halve(whole(ws, x[v]), zero))
                                        }
                                    }
                                });
                            }
                            Ints::Nibbles { values, zero: z } => {
                                let w = values.as_ptr().add(row * cols / 2);
                                let widen = NibbleWidening::new(z);
                                // Four blocks at a time while they last, as `quads` orders
                                // the activations.
                                let quads = blocks / 4 * 4;
                                each_chunk!(
                                    |b| {
                                        let x = at(b, 32);
                                        match b + 1 < blocks {
                                            true => {
                                                let [first, second] = widen.pair(w, b);
                                                std::array::from_fn(|v| pair(first, second, x[v]))
                                            }
                                            false => {
                                                let ws = widen.block(w, b);
                                                std::array::from_fn(|v| {
                                                    halve(whole(ws, x[v]), zero)
                                                })
                                            }
                                        }
                                    },
                                    |q| (q < quads).then(|| {
                                        let ws = widen.quad(w, q);
                                        let x = at(q, 32);
                                        std::array::from_fn(|v| {
                                            let sums = ws.iter().enumerate().fold(
                                                zero,
                                                |sums, (k, &w)| {
                                                    dot(
                                                        sums,
                                                        w,
                                                        _mm512_loadu_si512(x[v].add(32 * k).cast()),
                                                    )
                                                },
                                            );
                                            sums
                                        })
                                    })
                                );
                            }
                            Ints::FiveBits {
                                nibbles,
                                high,
                                zero: z,
                            } => {
                                let w = nibbles.as_ptr().add(row * cols / 2);
                                let h = high.as_ptr().add(row * blocks);
                                let widen = FiveBitWidening::new(z);
                                each_chunk!(|b| {
                                    let x = at(b, 32);
                                    match b + 1 < blocks {
                                        true => {
                                            let [first, second] = widen.pair(w, h, b);
                                            std::array::from_fn(|v| pair(first, second, x[v]))
                                        }
                                        false => {
                                            let ws = widen.block(w, h, b);
                                            std::array::from_fn(|v| halve(whole(ws, x[v]), zero))
                                        }
                                    }
                                });
                            }
                            Ints::SixBits {
                                nibbles,
                                crumbs,
                                zero: z,
                            } if stepped => {
                                // Blocks of 32 here: a unit, both its blocks of 16 times
                                // their steps.
                                let w = nibbles.as_ptr().add(row * cols / 2);
                                let c = crumbs.as_ptr().add(row * cols / 4);
                                let s = scales.steps().as_ptr().add(row * factors_per_row);
                                let widen = SixBitWidening::new(z);
                                each_chunk!(|b| {
                                    let x = at(b, 32);
                                    match b + 1 < blocks {
                                        true => {
                                            let [first, second] = widen.units(w, c, 2 * b);
                                            let first = _mm512_mullo_epi16(first, steps_of(s, b));
                                            let second =
                                                _mm512_mullo_epi16(second, steps_of(s, b + 1));
                                            std::array::from_fn(|v| {
                                                halve(
                                                    whole(first, x[v]),
                                                    whole(second, x[v].add(32)),
                                                )
                                            })
                                        }
                                        false => {
                                            let unit = widen.unit(w, c, 2 * b);
                                            let unit = _mm512_mullo_epi16(unit, steps_of(s, b));
                                            std::array::from_fn(|v| halve(whole(unit, x[v]), zero))
                                        }
                                    }
                                });
                            }
                            Ints::SixBits {
                                nibbles,
                                crumbs,
                                zero: z,
                            } => {
                                // A unit is a pair of blocks of 16; rows hold whole units.
                                let w = nibbles.as_ptr().add(row * cols / 2);
                                let c = crumbs.as_ptr().add(row * cols / 4);
                                let widen = SixBitWidening::new(z);
                                each_chunk!(|b| {
                                    let unit = widen.unit(w, c, b);
                                    let x = at(b, 16);
                                    std::array::from_fn(|v| whole(unit, x[v]))
                                });
                            }
                            Ints::Interleaved { .. }
                            | Ints::SixBitsInterleaved { .. }
                            | Ints::FiveBitsInterleaved { .. }
                            | Ints::BytesInterleaved { .. } => {
                                unreachable!("interleaved weights take their own kernel")
                            }
                        }
                    }
                }
                for (v, out) in outs.iter_mut().enumerate() {
                    let terms = &terms[v * ROWS_AT_ONCE * stride..][..ROWS_AT_ONCE * stride];
                    // SAFETY: the group's terms are `ROWS_AT_ONCE` rows of `stride`.
                    unsafe {
                        add_in_turn(terms, stride, blocks, &mut out[first..first + in_group])
                    };
                }
            }
        }
    };
}

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

/// The steps of block `b` of 32's two blocks of 16 from a row's steps `s`, each in its half
/// of a vector of 16-bit lanes.
///
/// # Safety
/// `s` must hold the row's steps, two per block of 32.
#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vl")]
#[inline]
unsafe fn steps_of(s: *const i8, b: usize) -> __m512i {
    // SAFETY: as the caller guarantees.
    let [first, second] = unsafe { [s.add(2 * b).read(), s.add(2 * b + 1).read()] };
    _mm512_inserti64x4::<1>(
        _mm512_set1_epi16(i16::from(first)),
        _mm256_set1_epi16(i16::from(second)),
    )
}

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
            // Other scaled factors, and factors laid out by block (which only interleaved
            // weights have, whose kernel reads them as they lie).
            _ => {
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
pub(super) unsafe fn products(factors: Factors<'_>, values: &[f32], out: &mut [f32]) {
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

/// `out[i] = factors[i]`, in f32: a group of rows' offsets, which the kernel reads sixteen
/// blocks at a time.
///
/// # Safety
/// The CPU must have AVX-512 F, BW and VL and F16C; `out` must hold `factors.len()` values.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
pub(super) unsafe fn widened(factors: Factors<'_>, out: &mut [f32]) {
    let len = factors.len();
    let out = &mut out[..len];
    let done = each_sixteen!(factors, |at, lanes, factors| {
        // SAFETY: the lanes hold elements of `out`, which has `len`.
        unsafe { _mm512_mask_storeu_ps(out.as_mut_ptr().add(at), lanes, factors) };
    });
    for (i, out) in out.iter_mut().enumerate().skip(done) {
        *out = factors.get(i);
    }
}
