//! Math the kernels share: element-wise functions written so that the compiler vectorizes
//! them, and the horizontal sum that ends the hand-vectorized dot products.
//!
//! `f32::exp` is a call into libm per element; the SwiGLU gate and the attention softmax take
//! millions of exponentials per prompt, so they use this branch-free polynomial instead, which
//! the compiler turns into SIMD code in each caller's own instruction set (the kernels are
//! compiled twice by `multiversion`, for AVX2 and for the baseline).

/// The sum of the eight lanes of an AVX register: the last step of a dot product.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2")]
pub fn horizontal_sum(v: std::arch::x86_64::__m256) -> f32 {
    use std::arch::x86_64::*;
    let quad = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let pair = _mm_add_ps(quad, _mm_movehl_ps(quad, quad));
    let one = _mm_add_ss(pair, _mm_movehdup_ps(pair));
    _mm_cvtss_f32(one)
}

/// The sum of sixteen lanes, given as their low and high eight, in the one order every float
/// weight's product ends with: lane `l` and `l + 8` first, then [`horizontal_sum`]'s order.
/// The decode kernel (two AVX registers a row) and the prompt tiles (one AVX-512 register)
/// both end here, so a token's output has the same bits in either.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2")]
pub fn sum_of_sixteen(low: std::arch::x86_64::__m256, high: std::arch::x86_64::__m256) -> f32 {
    horizontal_sum(std::arch::x86_64::_mm256_add_ps(low, high))
}

/// A block of 32 four-bit values as ggml's Q4 types pack them (byte `j` holds value `j` in
/// its low half and value `j + 16` in its high half), as two vectors of sixteen 16-bit values,
/// `zero` (in every lane) taken off.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2")]
pub fn unpack_nibbles(
    packed: std::arch::x86_64::__m128i,
    zero: std::arch::x86_64::__m256i,
) -> [std::arch::x86_64::__m256i; 2] {
    use std::arch::x86_64::*;
    let mask = _mm_set1_epi8(0x0F);
    [
        _mm256_sub_epi16(_mm256_cvtepu8_epi16(_mm_and_si128(packed, mask)), zero),
        _mm256_sub_epi16(
            _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16::<4>(packed), mask)),
            zero,
        ),
    ]
}

/// [`unpack_nibbles`] for 5-bit values (see `IntegerValues::FiveBits`): `high`, the block's
/// fifth bits in `fifth_bit`'s order, shifted per 32-bit lane so that each 16-bit lane's bit
/// lies at its bottom, adds 16 where it is set.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2")]
pub fn unpack_five_bits(
    packed: std::arch::x86_64::__m128i,
    high: u32,
    zero: std::arch::x86_64::__m256i,
) -> [std::arch::x86_64::__m256i; 2] {
    use std::arch::x86_64::*;
    let high = _mm256_set1_epi32(high as i32);
    let bottoms = _mm256_set1_epi32(0x0001_0001);
    let sixteens = |shifts: __m256i| {
        _mm256_slli_epi16::<4>(_mm256_and_si256(_mm256_srlv_epi32(high, shifts), bottoms))
    };
    let firsts = sixteens(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    let seconds = sixteens(_mm256_setr_epi32(8, 9, 10, 11, 12, 13, 14, 15));
    let [low, upper] = unpack_nibbles(packed, _mm256_setzero_si256());
    [
        _mm256_sub_epi16(_mm256_or_si256(low, firsts), zero),
        _mm256_sub_epi16(_mm256_or_si256(upper, seconds), zero),
    ]
}

/// [`unpack_five_bits`] for a word of fifth bits in `interleaved_fifth_bit`'s order (see
/// `IntegerValues::FiveBitsInterleaved`), whose bits lie in no order one shift per 32-bit
/// lane undoes: each 16-bit lane takes the half of the word its bit lies in, and a
/// comparison with that bit alone makes it 16 where it is set.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2")]
pub fn unpack_five_bits_interleaved(
    packed: std::arch::x86_64::__m128i,
    high: u32,
    zero: std::arch::x86_64::__m256i,
) -> [std::arch::x86_64::__m256i; 2] {
    use std::arch::x86_64::*;
    let high = _mm256_set1_epi32(high as i32);
    let sixteens = |half: usize| {
        let [picks, bits] = INTERLEAVED_FIFTH_BITS[half];
        // SAFETY: each array is 32 bytes.
        let (picks, bits) = unsafe {
            (
                _mm256_loadu_si256(picks.as_ptr().cast()),
                _mm256_loadu_si256(bits.as_ptr().cast()),
            )
        };
        let set = _mm256_cmpeq_epi16(
            _mm256_and_si256(_mm256_shuffle_epi8(high, picks), bits),
            bits,
        );
        _mm256_and_si256(set, _mm256_set1_epi16(16))
    };
    let [low, upper] = unpack_nibbles(packed, _mm256_setzero_si256());
    [
        _mm256_sub_epi16(_mm256_or_si256(low, sixteens(0)), zero),
        _mm256_sub_epi16(_mm256_or_si256(upper, sixteens(1)), zero),
    ]
}

/// For each half of a block's elements, as [`unpack_five_bits_interleaved`] reads their
/// fifth bits from a word in every 32-bit lane: the bytes each 16-bit lane takes from its
/// 128-bit lane's copy (the word's half that holds the element's bit), then that bit alone.
#[cfg(target_arch = "x86_64")]
const INTERLEAVED_FIFTH_BITS: [[[u8; 32]; 2]; 2] = {
    use super::weights::interleaved_fifth_bit;
    let mut out = [[[0; 32]; 2]; 2];
    let mut half = 0;
    while half < 2 {
        let mut lane = 0;
        while lane < 16 {
            let bit = interleaved_fifth_bit(16 * half + lane);
            let (word, mask) = (bit / 16, 1u16 << (bit % 16));
            // Lane `lane`'s two bytes, from the word's copy at the start of their 128-bit
            // lane, which the shuffle numbers bytes within.
            let at = 2 * lane;
            out[half][0][at] = 2 * word as u8;
            out[half][0][at + 1] = 2 * word as u8 + 1;
            out[half][1][at] = mask as u8;
            out[half][1][at + 1] = (mask >> 8) as u8;
            lane += 1;
        }
        half += 1;
    }
    out
};

/// Blocks of 5-bit values (`nibbles` and `high` as `IntegerValues::FiveBits` holds them) as
/// one byte per value, `zero` taken off: [`unpack_five_bits`], narrowed back to bytes, for
/// `Ints::unpack` (embedding rows, f32 copies of weights). The prompt tile widens its rows
/// with `Ints::widen` instead.
///
/// # Safety
/// `bytes` must hold 32 values per word of `high` and `nibbles` 16 bytes per word.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
pub unsafe fn five_bits_as_bytes(nibbles: &[u8], high: &[u32], zero: u8, bytes: &mut [i8]) {
    use std::arch::x86_64::*;
    let zero = _mm256_set1_epi16(i16::from(zero));
    for (b, &high) in high.iter().enumerate() {
        // SAFETY: block `b` lies inside `nibbles` and `bytes`, the caller guarantees.
        unsafe {
            let packed = _mm_loadu_si128(nibbles.as_ptr().add(16 * b).cast());
            store_as_bytes(
                unpack_five_bits(packed, high, zero),
                bytes.as_mut_ptr().add(32 * b),
            );
        }
    }
}

/// 32 values widened to 16 bits, in two halves in order, narrowed back to bytes at `to`.
///
/// # Safety
/// `to` must hold 32 bytes; the values must fit in a byte.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn store_as_bytes(halves: [std::arch::x86_64::__m256i; 2], to: *mut i8) {
    use std::arch::x86_64::*;
    let [first, second] = halves;
    // Packing works within 128-bit lanes; the permutation puts the halves in order.
    let ordered = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packs_epi16(first, second));
    // SAFETY: the caller's.
    unsafe { _mm256_storeu_si256(to.cast(), ordered) };
}

/// A block's 16 bytes of nibbles (see [`unpack_nibbles`]) as its 32 values in order, one
/// per byte: the low halves, then the high ones shifted down. Bits 4–7 of each byte are not
/// yet cleared: the callers mask them, some after adding more bits.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2")]
pub fn nibbles_in_order(packed: std::arch::x86_64::__m128i) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::*;
    _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(packed), _mm_srli_epi16::<4>(packed))
}

/// Blocks of 4-bit values (see [`unpack_nibbles`]) as one byte per value, `zero` taken off,
/// two blocks at a time, for `Ints::unpack` (embedding rows, f32 copies of weights). Written
/// when the prompt tile unpacked its rows so, where the compiled loop had taken a tenth of a
/// Q4_K_M prompt's time; the tile now widens them with `Ints::widen`.
///
/// # Safety
/// `bytes` must hold two values per byte of `nibbles`, in whole blocks of 32.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
pub unsafe fn nibbles_as_bytes(nibbles: &[u8], zero: u8, bytes: &mut [i8]) {
    use std::arch::x86_64::*;
    let (mask, zero) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(zero as i8));
    let (pairs, rest) = (nibbles.len() / 32, nibbles.len() % 32);
    for p in 0..pairs {
        // SAFETY: blocks `2p` and `2p + 1` lie inside `nibbles` and `bytes`.
        unsafe {
            let packed = _mm256_loadu_si256(nibbles.as_ptr().add(32 * p).cast());
            let low = _mm256_sub_epi8(_mm256_and_si256(packed, mask), zero);
            let high =
                _mm256_sub_epi8(_mm256_and_si256(_mm256_srli_epi16::<4>(packed), mask), zero);
            // Each block's low halves then its high ones are its values in order.
            let out = bytes.as_mut_ptr().add(64 * p);
            _mm256_storeu_si256(out.cast(), _mm256_permute2x128_si256::<0x20>(low, high));
            _mm256_storeu_si256(
                out.add(32).cast(),
                _mm256_permute2x128_si256::<0x31>(low, high),
            );
        }
    }
    if rest > 0 {
        // SAFETY: the last block lies inside `nibbles` and `bytes`.
        unsafe {
            let both = nibbles_in_order(_mm_loadu_si128(nibbles.as_ptr().add(32 * pairs).cast()));
            let values = _mm256_sub_epi8(_mm256_and_si256(both, mask), zero);
            _mm256_storeu_si256(bytes.as_mut_ptr().add(64 * pairs).cast(), values);
        }
    }
}

/// A unit of 32 six-bit values (`nibbles` and `crumbs` as `IntegerValues::SixBits` holds
/// them) as two vectors of sixteen 16-bit values, `zero` (in every lane) taken off. The top
/// bits of elements `8q + j` lie at bit `2q` of crumb byte `j`: widened to a 16-bit lane per
/// byte and shifted by `4 - 2q`, each lands at bits 4–5 (a 32-bit shift, which AVX2 has,
/// moves a lane's bits across into its neighbour only below bit 4 or above bit 5, which the
/// mask clears).
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2")]
pub fn unpack_six_bits(
    packed: std::arch::x86_64::__m128i,
    crumbs: u64,
    zero: std::arch::x86_64::__m256i,
) -> [std::arch::x86_64::__m256i; 2] {
    use std::arch::x86_64::*;
    let wide = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(crumbs as i64)));
    let tops = _mm256_set1_epi16(0x30);
    let first = _mm256_and_si256(
        _mm256_sllv_epi32(wide, _mm256_setr_epi32(4, 4, 4, 4, 2, 2, 2, 2)),
        tops,
    );
    let second = _mm256_and_si256(
        _mm256_srlv_epi32(wide, _mm256_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2)),
        tops,
    );
    let [low, upper] = unpack_nibbles(packed, _mm256_setzero_si256());
    [
        _mm256_sub_epi16(_mm256_or_si256(low, first), zero),
        _mm256_sub_epi16(_mm256_or_si256(upper, second), zero),
    ]
}

/// Units of 6-bit values (see [`unpack_six_bits`]) as one byte per value, `zero` taken off,
/// for `Ints::unpack` (embedding rows, f32 copies of weights).
///
/// # Safety
/// `bytes` must hold 32 values per 8 bytes of `crumbs` and `nibbles` 16 bytes per 8.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
pub unsafe fn six_bits_as_bytes(nibbles: &[u8], crumbs: &[u8], zero: u8, bytes: &mut [i8]) {
    use std::arch::x86_64::*;
    let zero = _mm256_set1_epi16(i16::from(zero));
    for u in 0..crumbs.len() / 8 {
        // SAFETY: unit `u` lies inside `crumbs`, and inside `nibbles` and `bytes` as the
        // caller guarantees.
        unsafe {
            let crumbs = crumbs.as_ptr().add(8 * u).cast::<u64>().read_unaligned();
            let packed = _mm_loadu_si128(nibbles.as_ptr().add(16 * u).cast());
            store_as_bytes(
                unpack_six_bits(packed, crumbs, zero),
                bytes.as_mut_ptr().add(32 * u),
            );
        }
    }
}

/// `Σ a·b`, in eight independent partial sums, which compilers vectorize.
#[inline(always)]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0.0f32; 8];
    for (a, b) in a.chunks_exact(8).zip(b.chunks_exact(8)) {
        for ((lane, a), b) in lanes.iter_mut().zip(a).zip(b) {
            *lane += a * b;
        }
    }
    let tail = a.len() / 8 * 8;
    let tail: f32 = a[tail..].iter().zip(&b[tail..]).map(|(a, b)| a * b).sum();
    lanes.iter().sum::<f32>() + tail
}

/// `e^x` for every element of `values`, in place, to within 2 ulp; results below the smallest
/// normal f32 (inputs under -87.3) are flushed to 0, and inputs over 88.72 give infinity, as
/// `f32::exp` does. NaN stays NaN.
#[inline(always)]
pub fn exp_in_place(values: &mut [f32]) {
    for value in values {
        *value = exp(*value);
    }
}

/// Cephes' `expf`: Cody–Waite range reduction `x = n·ln 2 + r` with |r| ≤ ln 2 / 2, a
/// polynomial for `e^r`, and `2^n` built in the exponent bits of two factors, so that every
/// `n` in range gives a normal float.
#[inline(always)]
fn exp(x: f32) -> f32 {
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    const MAX_INPUT: f32 = 88.722_83;
    const MIN_INPUT: f32 = -87.336_55;
    let clamped = x.clamp(MIN_INPUT, MAX_INPUT);
    let n = (clamped * std::f32::consts::LOG2_E).round_ties_even();
    let r = clamped - n * LN2_HI - n * LN2_LO;
    let p = 1.0
        + r
        + r * r
            * (0.5
                + r * (1.666_666_5e-1
                    + r * (4.166_579_6e-2
                        + r * (8.333_452e-3 + r * (1.398_2e-3 + r * 1.987_569_1e-4)))));
    let n = n as i32;
    let power_of_two = |exponent: i32| f32::from_bits(((exponent + 127) as u32) << 23);
    let result = p * power_of_two(n >> 1) * power_of_two(n - (n >> 1));
    if x > MAX_INPUT {
        f32::INFINITY
    } else if x < MIN_INPUT {
        0.0
    } else if x.is_nan() {
        x
    } else {
        result
    }
}

/// Eight vectors of eight floats as a matrix, transposed: pairs interleaved, then quads,
/// then the 128-bit halves exchanged.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2")]
pub fn transpose_8x8(rows: [std::arch::x86_64::__m256; 8]) -> [std::arch::x86_64::__m256; 8] {
    use std::arch::x86_64::*;
    let [r0, r1, r2, r3, r4, r5, r6, r7] = rows;
    let pairs = [
        _mm256_unpacklo_ps(r0, r1),
        _mm256_unpackhi_ps(r0, r1),
        _mm256_unpacklo_ps(r2, r3),
        _mm256_unpackhi_ps(r2, r3),
        _mm256_unpacklo_ps(r4, r5),
        _mm256_unpackhi_ps(r4, r5),
        _mm256_unpacklo_ps(r6, r7),
        _mm256_unpackhi_ps(r6, r7),
    ];
    let quads = [
        _mm256_shuffle_ps::<0x44>(pairs[0], pairs[2]),
        _mm256_shuffle_ps::<0xEE>(pairs[0], pairs[2]),
        _mm256_shuffle_ps::<0x44>(pairs[1], pairs[3]),
        _mm256_shuffle_ps::<0xEE>(pairs[1], pairs[3]),
        _mm256_shuffle_ps::<0x44>(pairs[4], pairs[6]),
        _mm256_shuffle_ps::<0xEE>(pairs[4], pairs[6]),
        _mm256_shuffle_ps::<0x44>(pairs[5], pairs[7]),
        _mm256_shuffle_ps::<0xEE>(pairs[5], pairs[7]),
    ];
    [
        _mm256_permute2f128_ps::<0x20>(quads[0], quads[4]),
        _mm256_permute2f128_ps::<0x20>(quads[1], quads[5]),
        _mm256_permute2f128_ps::<0x20>(quads[2], quads[6]),
        _mm256_permute2f128_ps::<0x20>(quads[3], quads[7]),
        _mm256_permute2f128_ps::<0x31>(quads[0], quads[4]),
        _mm256_permute2f128_ps::<0x31>(quads[1], quads[5]),
        _mm256_permute2f128_ps::<0x31>(quads[2], quads[6]),
        _mm256_permute2f128_ps::<0x31>(quads[3], quads[7]),
    ]
}

#[cfg(test)]
mod tests {
    use super::exp_in_place;

    #[test]
    fn exp_is_within_two_ulp_of_libm_over_the_whole_range() {
        let mut inputs: Vec<f32> = (-8800..=8860).map(|i| i as f32 / 100.0).collect();
        inputs.extend([0.0, -0.0, 1e-30, -1e-30, 0.5, -0.5]);
        let mut got = inputs.clone();
        exp_in_place(&mut got);
        for (x, got) in inputs.iter().zip(got) {
            let want = x.exp();
            let ulp = (want.to_bits() as i64 - got.to_bits() as i64).abs();
            assert!(
                ulp <= 2 || (want < 1e-37 && got.abs() < 1e-37),
                "exp({x}) = {got}, libm {want}"
            );
        }
    }

    #[test]
    fn exp_saturates_like_libm() {
        let mut values = [
            -1000.0f32,
            -88.0,
            89.0,
            1000.0,
            f32::NEG_INFINITY,
            f32::INFINITY,
        ];
        exp_in_place(&mut values);
        assert_eq!(values[0], 0.0);
        assert_eq!(values[3], f32::INFINITY);
        assert_eq!(values[4], 0.0);
        assert_eq!(values[5], f32::INFINITY);
        assert!(values[1] < 1e-37 && values[2] == f32::INFINITY);
        let mut nan = [f32::NAN];
        exp_in_place(&mut nan);
        assert!(nan[0].is_nan());
    }
}
