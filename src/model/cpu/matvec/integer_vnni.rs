//! The AVX2 kernel's decode of 4-bit weights and of Q6_K's stepped 6-bit ones on CPUs with
//! VNNI: products of bytes, four to a 32-bit lane in one instruction (`vpdpbusd`), where
//! 16-bit products take a widening of the weights to 16 bits and half as many per
//! instruction. On a 1.7B file (Intel Xeon family 6 model 207) decode ran 1.26× as fast
//! for Q6_K, 1.19× for Q4_K_M and 1.03× for Q4_0 (memory-bound already), and the 135M
//! Q4_1 file 1.15×.
//!
//! The activations stay 16-bit (kept for their accuracy, see `BlockInts`): each is split
//! into its high byte, signed, and its low byte, unsigned, `x = 256·high + low`, and a
//! block's sum is `256·Σ w·high + Σ w·low`, exactly the integer the 16-bit products give.
//! `vpdpbusd` multiplies unsigned bytes by signed ones, and the weights, 0 to 15 (or 63) as
//! stored, are either: unsigned beside the high bytes, signed beside the low ones. Two
//! blocks' nibbles are one load and take two instructions to become bytes in order, their
//! low halves the blocks' first sixteen values and their high halves the last; then four
//! products and a shift per activation row give both blocks' sums, four lanes each, which
//! the AVX2 kernel's reduction, scaling and order of addition take as they are, so every
//! kernel gives the same bits.

use std::arch::x86_64::*;

use super::avx2::{PREFETCH_BYTES_Q8, prefetch};
use super::integer_avx2::{
    Activations, GROUP, Row, block_lanes, chunk_terms, six_bit_chunk_terms, six_bit_terms,
};
use super::{BlockInts, nibble_block_offset};
use crate::model::cpu::weights::NIBBLE_BLOCK;

/// Bytes of activations per block: its 32 values' high and low bytes.
const BLOCK_BYTES: usize = 2 * NIBBLE_BLOCK;

/// Activations in blocks of 32 split into bytes as the kernels read them beside weights
/// `together` blocks to a vector (two in 256 bits, four in 512): per run of `together`
/// blocks, four vectors, each holding the same half of every block's values, in order, the
/// first block's lowest: the high bytes of the first halves, of the second halves, the low
/// bytes of the first halves, of the second halves. Zeros fill the last chunk of [`GROUP`]
/// blocks.
pub fn split_bytes(values: &[i16], together: usize) -> Vec<u8> {
    let chunk = GROUP * NIBBLE_BLOCK;
    let padded = values.len().next_multiple_of(chunk);
    let mut out = Vec::with_capacity(2 * padded);
    let value = |i: usize| values.get(i).copied().unwrap_or(0);
    for run in (0..padded).step_by(together * NIBBLE_BLOCK) {
        let bytes: [fn(i16) -> u8; 2] = [|x| (x >> 8) as u8, |x| x as u8];
        for byte in bytes {
            for half in [0, NIBBLE_BLOCK / 2] {
                for block in (run..run + together * NIBBLE_BLOCK).step_by(NIBBLE_BLOCK) {
                    out.extend((0..NIBBLE_BLOCK / 2).map(|i| byte(value(block + half + i))));
                }
            }
        }
    }
    out
}

/// For 6-bit weights with `zero` read stepped in units of 32, whole chunks of [`GROUP`]
/// units: per chunk, each unit's first half's values' sum times `zero`, then each unit's
/// second half's, as [`six_bit_terms_avx512`] takes them off its units' halves.
pub fn half_zero_sums(values: &[i16], zero: u8) -> Vec<i32> {
    let half = NIBBLE_BLOCK / 2;
    let sum = |values: &[i16]| i32::from(zero) * values.iter().map(|&v| i32::from(v)).sum::<i32>();
    let mut out = Vec::with_capacity(values.len() / half);
    for chunk in values.chunks_exact(GROUP * NIBBLE_BLOCK) {
        for h in [0, half] {
            out.extend(
                chunk
                    .chunks_exact(NIBBLE_BLOCK)
                    .map(|unit| sum(&unit[h..h + half])),
            );
        }
    }
    out
}

/// Two blocks' 4-bit values, `packed` (16 bytes each, value `j` in byte `j`'s low half and
/// `j + 16` in its high half), as bytes, zero point not taken off: the blocks' first
/// halves, then their second halves, each vector's low half the first block's.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn nibble_bytes(packed: __m256i) -> [__m256i; 2] {
    let low = _mm256_set1_epi8(0x0F);
    [
        _mm256_and_si256(packed, low),
        _mm256_and_si256(_mm256_srli_epi16::<4>(packed), low),
    ]
}

/// Units `j` and `j + 1` of 6-bit values (16 bytes of nibbles and 8 of crumbs each, see
/// `unpack_six_bits`) as bytes, 0 to 63: the units' first halves, then their second halves,
/// each vector's low half unit `j`'s. With each unit's crumbs in both 64-bit quarters of its
/// half, the top bits of values `8q + i`, at bits `2q` of crumb byte `i`, are shifted to bits
/// 4–5 in place.
///
/// # Safety
/// `nibbles` and `crumbs` must hold units `j` and `j + 1`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn six_bit_bytes(
    nibbles: *const u8,
    crumbs: *const u8,
    j: usize,
) -> [__m256i; 2] {
    // SAFETY: the caller's.
    let (packed, crumbs) = unsafe {
        (
            _mm256_loadu_si256(nibbles.add(nibble_block_offset(j)).cast()),
            _mm_loadu_si128(crumbs.add(j * 8).cast()),
        )
    };
    let [low, high] = nibble_bytes(packed);
    let crumbs = _mm256_permute4x64_epi64::<0b01_01_00_00>(_mm256_castsi128_si256(crumbs));
    let tops = _mm256_set1_epi8(0x30);
    let first = _mm256_sllv_epi64(crumbs, _mm256_setr_epi64x(4, 2, 4, 2));
    let second = _mm256_srlv_epi64(crumbs, _mm256_setr_epi64x(0, 2, 0, 2));
    [
        _mm256_or_si256(low, _mm256_and_si256(first, tops)),
        _mm256_or_si256(high, _mm256_and_si256(second, tops)),
    ]
}

/// `vpdpbusd` in its AVX-512 encoding.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
fn dot_bytes_avx512(sums: __m256i, unsigned: __m256i, signed: __m256i) -> __m256i {
    _mm256_dpbusd_epi32(sums, unsigned, signed)
}

/// `vpdpbusd` in its AVX-VNNI encoding.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
fn dot_bytes_avx(sums: __m256i, unsigned: __m256i, signed: __m256i) -> __m256i {
    _mm256_dpbusd_avx_epi32(sums, unsigned, signed)
}

/// One row's terms of 4-bit weights in blocks of 32 against each of `xs`, as the AVX2
/// kernel's `row_terms` forms them, compiled for the CPU features `$features` with the
/// byte products `$dot`.
macro_rules! nibble_terms {
    ($name:ident, $features:literal, $dot:ident) => {
        /// # Safety
        /// As for `row_terms` with 4-bit values, each of `xs` with its activations split
        /// ([`split_bytes`]); the CPU has the features this compilation enables.
        #[target_feature(enable = $features)]
        pub(super) unsafe fn $name<const V: usize>(
            row: &Row,
            xs: &[(&BlockInts, &Activations); V],
            blocks: usize,
            terms: [*mut f32; V],
        ) {
            // Each activation row's sums of a chunk of blocks from `chunk`, a block to a
            // lane: its first `pairs` pairs of blocks, the last of them a block alone where
            // `odd`, zeros after them. Literals for whole chunks, which the compiler unrolls
            // and keeps in registers.
            let chunk_sums = |chunk: usize, pairs: usize, odd: bool| -> [__m256i; V] {
                let mut sums = [[_mm256_setzero_si256(); GROUP / 2]; V];
                for p in 0..pairs {
                    // SAFETY: the chunk's blocks lie in the row, and each of `xs` holds its
                    // split activations, padded to whole chunks; a prefetch cannot fault.
                    unsafe {
                        let at = row.values.add(nibble_block_offset(chunk + 2 * p));
                        if p.is_multiple_of(2) {
                            prefetch(at, PREFETCH_BYTES_Q8);
                        }
                        let packed = match odd && p + 1 == pairs {
                            // A block's 16 bytes, read by a mask: copied to the stack and
                            // read back as one vector they waited on the copy.
                            true => _mm256_maskload_epi32(
                                at.cast(),
                                _mm256_setr_epi32(-1, -1, -1, -1, 0, 0, 0, 0),
                            ),
                            false => _mm256_loadu_si256(at.cast()),
                        };
                        let [first, second] = nibble_bytes(packed);
                        for (v, sums) in sums.iter_mut().enumerate() {
                            let x = xs[v].1.bytes.as_ptr().add((chunk + 2 * p) * BLOCK_BYTES);
                            let x = |k: usize| _mm256_loadu_si256(x.add(32 * k).cast());
                            let zero = _mm256_setzero_si256();
                            let high = $dot($dot(zero, first, x(0)), second, x(1));
                            let low = _mm256_slli_epi32::<8>(high);
                            sums[p] = $dot($dot(low, x(2), first), x(3), second);
                        }
                    }
                }
                sums.map(|pairs| block_lanes(pairs))
            };
            let whole = blocks / GROUP * GROUP;
            for chunk in (0..whole).step_by(GROUP) {
                // SAFETY: the chunk's blocks lie inside the row and the activations.
                unsafe {
                    let totals = chunk_sums(chunk, GROUP / 2, false);
                    chunk_terms::<4, V>(row, xs, chunk, GROUP, totals, terms);
                }
            }
            if whole < blocks {
                let in_chunk = blocks - whole;
                let odd = !in_chunk.is_multiple_of(2);
                // SAFETY: as above, for the row's last blocks.
                unsafe {
                    let totals = chunk_sums(whole, in_chunk.div_ceil(2), odd);
                    chunk_terms::<4, V>(row, xs, whole, in_chunk, totals, terms);
                }
            }
        }
    };
}

/// Units `unit` and `unit + 1`'s products with `x`'s activations split ([`split_bytes`]),
/// each half's summed apart, for [`six_bit_terms`]: the units' bytes (0 to 63, zero point on)
/// against the high bytes, shifted, then against the low, compiled for the CPU features
/// `$features` with the byte products `$dot`.
macro_rules! byte_half_sums {
    ($name:ident, $features:literal, $dot:ident) => {
        /// # Safety
        /// `x` holds the units' split activations; the CPU has the features this
        /// compilation enables.
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn $name(
            [first, second]: [__m256i; 2],
            x: &Activations,
            unit: usize,
        ) -> [__m256i; 2] {
            // SAFETY (here and for each vector below): the caller's.
            let x = unsafe { x.bytes.as_ptr().add(unit * BLOCK_BYTES) };
            let x = |k: usize| unsafe { _mm256_loadu_si256(x.add(32 * k).cast()) };
            let zero = _mm256_setzero_si256();
            let high = _mm256_slli_epi32::<8>($dot(zero, first, x(0)));
            let second_high = _mm256_slli_epi32::<8>($dot(zero, second, x(1)));
            [$dot(high, x(2), first), $dot(second_high, x(3), second)]
        }
    };
}

nibble_terms!(
    nibble_terms_avx512,
    "avx2,fma,f16c,avx512f,avx512vl,avx512vnni",
    dot_bytes_avx512
);
nibble_terms!(nibble_terms_avx, "avx2,fma,f16c,avxvnni", dot_bytes_avx);
byte_half_sums!(
    byte_half_sums_avx512,
    "avx2,fma,f16c,avx512f,avx512vl,avx512vnni",
    dot_bytes_avx512
);
byte_half_sums!(byte_half_sums_avx, "avx2,fma,f16c,avxvnni", dot_bytes_avx);
six_bit_terms!(
    six_bit_terms_avx512,
    "avx2,fma,f16c,avx512f,avx512vl,avx512vnni",
    byte_half_sums_avx512
);
six_bit_terms!(
    six_bit_terms_avx,
    "avx2,fma,f16c,avxvnni",
    byte_half_sums_avx
);

/// Four blocks' 4-bit values, `packed` as in [`nibble_bytes`], as bytes: the blocks' first
/// halves, then their second halves, block after block from the lowest bytes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn nibble_bytes_wide(packed: __m512i) -> [__m512i; 2] {
    let low = _mm512_set1_epi8(0x0F);
    [
        _mm512_and_si512(packed, low),
        _mm512_and_si512(_mm512_srli_epi16::<4>(packed), low),
    ]
}

/// The byte products of four blocks, `first` and `second` halves, with activations split
/// at `x` ([`split_bytes`] by fours), as two pairs' lane sums: each 256-bit half of the
/// products is the pair [`nibble_terms_avx512`] forms, the same integers.
///
/// # Safety
/// `x` holds the four blocks' split activations; the CPU has the features.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn quad_sums(first: __m512i, second: __m512i, x: *const u8) -> [__m256i; 2] {
    // SAFETY: the caller's.
    let x = |k: usize| unsafe { _mm512_loadu_si512(x.add(64 * k).cast()) };
    let zero = _mm512_setzero_si512();
    let high = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(zero, first, x(0)), second, x(1));
    let low = _mm512_slli_epi32::<8>(high);
    let sums = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(low, x(2), first), x(3), second);
    halves(sums)
}

/// A 512-bit vector's 256-bit halves, the lower first.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn halves(v: __m512i) -> [__m256i; 2] {
    [_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64::<1>(v)]
}

/// [`nibble_terms_avx512`] with 512-bit products, four blocks to a vector, for CPUs whose
/// 512-bit instructions cost no more ports than 256-bit ones (see `Features::wide`).
///
/// # Safety
/// As for [`nibble_terms_avx512`], with each of `xs`'s activations split by fours.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn nibble_terms_wide<const V: usize>(
    row: &Row,
    xs: &[(&BlockInts, &Activations); V],
    blocks: usize,
    terms: [*mut f32; V],
) {
    // Each activation row's sums of the `in_chunk` blocks from `chunk`, a block to a lane,
    // zeros after them.
    let chunk_sums = |chunk: usize, in_chunk: usize| -> [__m256i; V] {
        let mut sums = [[_mm256_setzero_si256(); GROUP / 2]; V];
        for q in 0..in_chunk.div_ceil(4) {
            // SAFETY: the quad's blocks that lie in the row are read, the rest masked off;
            // each of `xs` holds its split activations, padded to whole chunks; a prefetch
            // cannot fault.
            unsafe {
                let at = row.values.add(nibble_block_offset(chunk + 4 * q));
                prefetch(at, PREFETCH_BYTES_Q8);
                let present = in_chunk - 4 * q;
                let packed = match present >= 4 {
                    true => _mm512_loadu_si512(at.cast()),
                    false => _mm512_maskz_loadu_epi32((1 << (4 * present)) - 1, at.cast()),
                };
                let [first, second] = nibble_bytes_wide(packed);
                for (v, sums) in sums.iter_mut().enumerate() {
                    let x = xs[v].1.bytes.as_ptr().add((chunk + 4 * q) * BLOCK_BYTES);
                    [sums[2 * q], sums[2 * q + 1]] = quad_sums(first, second, x);
                }
            }
        }
        sums.map(|pairs| block_lanes(pairs))
    };
    let whole = blocks / GROUP * GROUP;
    for chunk in (0..whole).step_by(GROUP) {
        // SAFETY: the chunk's blocks lie inside the row and the activations.
        unsafe { chunk_terms::<4, V>(row, xs, chunk, GROUP, chunk_sums(chunk, GROUP), terms) };
    }
    if whole < blocks {
        let in_chunk = blocks - whole;
        // SAFETY: as above, for the row's last blocks.
        unsafe {
            let totals = chunk_sums(whole, in_chunk);
            chunk_terms::<4, V>(row, xs, whole, in_chunk, totals, terms);
        }
    }
}

/// [`six_bit_terms_avx512`] with 512-bit products, four units to a vector (see
/// [`nibble_terms_wide`]).
///
/// # Safety
/// As for [`six_bit_terms_avx512`], with each of `xs`'s activations split by fours.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn six_bit_terms_wide<const V: usize>(
    row: &Row,
    xs: &[(&BlockInts, &Activations); V],
    blocks: usize,
    terms: [*mut f32; V],
) {
    let tops = _mm512_set1_epi8(0x30);
    // As in `six_bit_terms_avx512`, for each pair of units' 256-bit half.
    let to_first = _mm512_broadcast_i64x4(_mm256_setr_epi64x(4, 2, 4, 2));
    let to_second = _mm512_broadcast_i64x4(_mm256_setr_epi64x(0, 2, 0, 2));
    // Each pair's two crumb quarters, each in two.
    let spread = _mm512_set_epi64(3, 3, 2, 2, 1, 1, 0, 0);
    for chunk in (0..blocks).step_by(GROUP) {
        let mut firsts = [[_mm256_setzero_si256(); GROUP / 2]; V];
        let mut seconds = [[_mm256_setzero_si256(); GROUP / 2]; V];
        for (q, unit) in (chunk..chunk + GROUP).step_by(4).enumerate() {
            // SAFETY: the chunk's units lie inside the row and each of `xs`; a prefetch
            // cannot fault.
            unsafe {
                let at = row.values.add(nibble_block_offset(unit));
                prefetch(at, PREFETCH_BYTES_Q8);
                let [low, high] = nibble_bytes_wide(_mm512_loadu_si512(at.cast()));
                // The crumbs, a line per two quads, as many weights ahead: not asked for,
                // they waited on memory, and Q6_K decoded at 0.9 times the speed.
                if q.is_multiple_of(2) {
                    prefetch(row.high.add(unit * 8), PREFETCH_BYTES_Q8 / 2);
                }
                let crumbs = _mm256_loadu_si256(row.high.add(unit * 8).cast());
                let crumbs = _mm512_permutexvar_epi64(spread, _mm512_castsi256_si512(crumbs));
                let first = _mm512_sllv_epi64(crumbs, to_first);
                let first = _mm512_or_si512(low, _mm512_and_si512(first, tops));
                let second = _mm512_srlv_epi64(crumbs, to_second);
                let second = _mm512_or_si512(high, _mm512_and_si512(second, tops));
                for v in 0..V {
                    let x = |k: usize| {
                        let x = xs[v].1.bytes.as_ptr().add(unit * BLOCK_BYTES);
                        _mm512_loadu_si512(x.add(64 * k).cast())
                    };
                    let zero = _mm512_setzero_si512();
                    let high = _mm512_slli_epi32::<8>(_mm512_dpbusd_epi32(zero, first, x(0)));
                    let sums = _mm512_dpbusd_epi32(high, x(2), first);
                    [firsts[v][2 * q], firsts[v][2 * q + 1]] = halves(sums);
                    let high = _mm512_slli_epi32::<8>(_mm512_dpbusd_epi32(zero, second, x(1)));
                    let sums = _mm512_dpbusd_epi32(high, x(3), second);
                    [seconds[v][2 * q], seconds[v][2 * q + 1]] = halves(sums);
                }
            }
        }
        // SAFETY: the chunk lies inside the row and each of `xs`.
        unsafe { six_bit_chunk_terms(row, xs, chunk, firsts, seconds, terms) };
    }
}
