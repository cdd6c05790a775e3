//! `X Wᵀ` for a prompt against integer weights (a GGUF file's, and `--precision q8`) in
//! blocks of 32: the activations are rounded to 16-bit integers per block, as for a decode
//! step, and each tile of weight rows and tokens multiplies integers, summing pairs of
//! products in one instruction, and takes both blocks' scales once per block.
//!
//! The f32 path widens every weight and runs f32 gemm, which on our 2-core machine peaks
//! near 330 prompt tokens/s for SmolLM2-135M whatever the weights; llama.cpp multiplies
//! integers and runs its prompts about twice as fast.
//!
//! The offsets some types have add `offset · Σ x` per block, a dot product of a row's
//! offsets and a token's block sums as each tile ends: a separate f32 product of all the
//! sums by all the offsets, only 18 to 48 blocks deep, ran on one thread while the other
//! waited, 10% of a Q4_0 prompt's time.

use std::ops::Range;

use super::Shape;
use crate::model::cpu::matvec::BlockInts;
use crate::model::cpu::threads::{SharedOutput, split_ranges};
use crate::model::cpu::weights::{Ints, WeightRows};

/// The values a tile multiplies per step: the blocks of 32 of every GGUF integer type but
/// Q6_K, or two of Q6_K's blocks of 16 (bytes only), each with its own scale.
const BLOCK: usize = 32;

/// Q6_K's block, half a step.
const HALF_BLOCK: usize = BLOCK / 2;

/// Fewest weight rows a thread takes at once.
const MIN_ROWS_PER_RANGE: usize = 48;

/// `out = X Wᵀ` (or `out += X Wᵀ` when `accumulate`) for `x`: `[tokens, cols]`, integer
/// weights `[rows, cols]` in blocks of 32 and `out`: `[tokens, rows]`, when the CPU has AVX2;
/// returns whether it did.
///
/// # Panics
/// When the lengths do not fit those shapes: the callers take them from tensor shapes.
pub fn product(
    weight: WeightRows<'_>,
    x: &[f32],
    tokens: usize,
    out: &mut [f32],
    accumulate: bool,
) -> bool {
    #[cfg(target_arch = "x86_64")]
    if let WeightRows::Integers {
        values,
        scales,
        offsets,
        block,
    } = weight
        && supported()
        && (block == BLOCK || (block == HALF_BLOCK && matches!(values, Ints::Bytes(_))))
    {
        let weight = Weights {
            values,
            scales,
            offsets,
            halves: block == HALF_BLOCK,
        };
        return multiply(Kernel::for_this_cpu(), weight, x, tokens, out, accumulate);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (weight, x, tokens, out, accumulate);
    false
}

/// Integer weights in blocks of [`BLOCK`], or of [`HALF_BLOCK`] when `halves`.
#[derive(Clone, Copy)]
struct Weights<'a> {
    values: Ints<'a>,
    scales: &'a [f32],
    offsets: Option<&'a [f32]>,
    halves: bool,
}

/// [`product`] with `kernel`, which the CPU must have.
#[cfg(target_arch = "x86_64")]
fn multiply(
    kernel: Kernel,
    weight: Weights<'_>,
    x: &[f32],
    tokens: usize,
    out: &mut [f32],
    accumulate: bool,
) -> bool {
    let cols = x.len() / tokens.max(1);
    if tokens == 0 || !cols.is_multiple_of(BLOCK) {
        return false;
    }
    let rows = weight.values.len() / cols;
    let block = if weight.halves { HALF_BLOCK } else { BLOCK };
    let blocks = cols / block;
    assert!(
        tokens * cols == x.len()
            && rows * cols == weight.values.len()
            && out.len() == tokens * rows
            && weight.scales.len() == rows * blocks
            && weight
                .offsets
                .is_none_or(|offsets| offsets.len() == rows * blocks),
        "integer matmul: x, weight, scales and out do not fit [tokens, cols], [rows, cols], \
         [rows, cols / block], [tokens, rows]"
    );
    let rounded = BlockInts::of(x, block);
    let by_block = TokenBlocks::of(&rounded, tokens);
    let shape = Shape { tokens, rows, cols };
    let shared = SharedOutput::new(out);
    let (tile_rows, tile_tokens) = kernel.tile(weight);
    split_ranges(
        rows.div_ceil(tile_rows),
        MIN_ROWS_PER_RANGE / tile_rows,
        &|tiles: Range<usize>| {
            let rows_of_range = tiles.start * tile_rows..(tiles.end * tile_rows).min(rows);
            for first_row in rows_of_range.step_by(tile_rows) {
                // The tile's weight rows stay in the L1 cache while every token passes.
                for first_token in (0..tokens).step_by(tile_tokens) {
                    let at = Tile {
                        first_token,
                        first_row,
                    };
                    let tokens = Tokens {
                        x: &rounded,
                        by_block: &by_block,
                    };
                    // SAFETY: the CPU has the kernel's features (the caller's promise) and the
                    // sizes are checked above. The tile reads rows of `x` and `weight` below
                    // `tokens` and `rows`, and writes elements of `out` in the columns of this
                    // range's rows, which no other range touches.
                    unsafe { kernel.tile_at(weight, tokens, shape, at, &shared, accumulate) };
                }
            }
        },
    );
    true
}

/// Tokens a tile takes at once, at most: the lanes of one f32 vector of AVX2.
const TILE_TOKENS_MAX: usize = 8;

/// The tokens' scales block by block, so that a tile finds its tokens' side by side; each
/// block is padded with [`TILE_TOKENS_MAX`] zeros past the last token.
struct TokenBlocks {
    scales: Vec<f32>,
    stride: usize,
}

impl TokenBlocks {
    fn of(x: &BlockInts, tokens: usize) -> Self {
        let blocks = x.scales.len() / tokens;
        let stride = tokens + TILE_TOKENS_MAX;
        let mut scales = vec![0.0; blocks * stride];
        for (t, token) in x.scales.chunks_exact(blocks).enumerate() {
            for (b, &scale) in token.iter().enumerate() {
                scales[b * stride + t] = scale;
            }
        }
        Self { scales, stride }
    }

    /// The scales of block `b` from `first_token` on, [`TILE_TOKENS_MAX`] of them.
    ///
    /// # Safety
    /// `b` must be a block and `first_token` a token of the prompt.
    unsafe fn scales(&self, b: usize, first_token: usize) -> *const f32 {
        // SAFETY: as the caller guarantees; the padding holds the lanes past the last token.
        unsafe { self.scales.as_ptr().add(b * self.stride + first_token) }
    }
}

/// The rounded tokens a tile reads.
#[derive(Clone, Copy)]
struct Tokens<'a> {
    x: &'a BlockInts,
    by_block: &'a TokenBlocks,
}

/// Where a tile starts.
#[derive(Clone, Copy)]
struct Tile {
    first_token: usize,
    first_row: usize,
}

#[cfg(target_arch = "x86_64")]
fn supported() -> bool {
    use std::arch::is_x86_feature_detected;
    is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")
}

/// The tile kernels. AVX2 multiplies a block as two vectors of sixteen 16-bit pairs,
/// AVX-512 as one of thirty-two, with twice the registers for a larger tile.
#[cfg(target_arch = "x86_64")]
mod kernels {
    /// `TOKENS × ROWS` outputs from the tile's first token and row. At the edges
    /// the missing tokens and rows repeat the last one and their sums are dropped.
    ///
    /// # Safety (of each kernel's `tile`)
    /// The CPU must have the module's features; `weight` must point to `rows` rows of `cols`
    /// values (bytes, or nibbles in blocks of 32 when `NIBBLES`), `scales` (and `offsets`
    /// when `OFFSETS`) hold one per block of 32 (of 16 when `HALVES`), `tokens` be
    /// `[tokens, cols]` rounded in the same blocks, and no other thread may touch the tile's
    /// elements of `out`.
    macro_rules! tile_kernel {
        ($features:literal, $sum:ty, $zero:expr, $weights:ty, $widened:ident, $products:ident,
         $total:ident) => {
            #[target_feature(enable = $features)]
            #[allow(clippy::too_many_arguments)]
            pub unsafe fn tile<
                const NIBBLES: bool,
                const HALVES: bool,
                const OFFSETS: bool,
                const ROWS: usize,
                const TOKENS: usize,
            >(
                weight: *const u8,
                zero: u8,
                scales: &[f32],
                offsets: &[f32],
                tokens_in: Tokens<'_>,
                shape: Shape,
                at: Tile,
                out: &SharedOutput<f32>,
                accumulate: bool,
            ) {
                use std::arch::x86_64::*;
                let Shape { tokens, rows, cols } = shape;
                let parts = if HALVES { 2 } else { 1 };
                let blocks = cols / BLOCK * parts;
                let row_bytes = if NIBBLES { cols / 2 } else { cols };
                let row_of = |j: usize| (at.first_row + j).min(rows - 1);
                let token_of = |i: usize| (at.first_token + i).min(tokens - 1);
                let row_blocks = std::array::from_fn::<_, ROWS, _>(|j| row_of(j) * blocks);
                // SAFETY: every row and token index is clamped inside the shape.
                let (rows_in, x) = unsafe {
                    (
                        std::array::from_fn::<_, ROWS, _>(|j| weight.add(row_of(j) * row_bytes)),
                        std::array::from_fn::<_, TOKENS, _>(|i| {
                            tokens_in.x.values.as_ptr().add(token_of(i) * cols)
                        }),
                    )
                };
                let mut sums: [[$sum; ROWS]; TOKENS] = [[$zero; ROWS]; TOKENS];
                for step in 0..cols / BLOCK {
                    // SAFETY: step < cols / BLOCK and every index is clamped inside the
                    // shape, so the step's values and blocks lie inside each row, scale row
                    // and token; the token blocks are padded past the last token.
                    unsafe {
                        let by_block = tokens_in.by_block;
                        // Both blocks' scales, one per token (and half step), spilled so that
                        // each product takes its own as a broadcast from memory.
                        let mut scale = [[[0.0f32; TILE_TOKENS_MAX]; 2]; ROWS];
                        let mut w: [$weights; ROWS] = std::mem::zeroed();
                        for part in 0..parts {
                            let b = step * parts + part;
                            let token_scales = _mm256_loadu_ps(by_block.scales(b, at.first_token));
                            for j in 0..ROWS {
                                let row_scale = *scales.get_unchecked(row_blocks[j] + b);
                                _mm256_storeu_ps(
                                    scale[j][part].as_mut_ptr(),
                                    _mm256_mul_ps(token_scales, _mm256_set1_ps(row_scale)),
                                );
                            }
                        }
                        for j in 0..ROWS {
                            w[j] = $widened::<NIBBLES>(rows_in[j], step, zero);
                        }
                        // Opaque to the optimizer, which would otherwise hold all the
                        // broadcasts in registers and spill the sums to make room.
                        let scale = std::hint::black_box(&scale);
                        for (i, sums) in sums.iter_mut().enumerate() {
                            let v = x[i].add(step * BLOCK);
                            for (j, sum) in sums.iter_mut().enumerate() {
                                let halves = [scale[j][0][i], scale[j][1][i]];
                                *sum = $products::<HALVES>(w[j], v, halves, *sum);
                            }
                        }
                    }
                }
                for (i, sums) in sums.iter().enumerate() {
                    let token = at.first_token + i;
                    if token >= tokens {
                        break;
                    }
                    for (j, &sum) in sums.iter().enumerate() {
                        let row = at.first_row + j;
                        if row >= rows {
                            break;
                        }
                        // SAFETY: (token, row) lies inside `out`, and the caller gives this tile's
                        // elements to this thread alone.
                        unsafe {
                            let y = out.at(token * rows + row);
                            let mut sum = $total(sum);
                            if OFFSETS {
                                let offsets = &offsets[row_blocks[j]..][..blocks];
                                let sums = &tokens_in.x.sums[token * blocks..][..blocks];
                                sum += crate::model::cpu::math::dot(offsets, sums);
                            }
                            *y = if accumulate { *y + sum } else { sum };
                        }
                    }
                }
            }
        };
    }

    pub mod avx2 {
        use std::arch::x86_64::*;

        use super::super::{BLOCK, Shape, TILE_TOKENS_MAX, Tile, Tokens};
        use crate::model::cpu::threads::SharedOutput;

        use crate::model::cpu::math::{horizontal_sum, unpack_nibbles};

        /// Rows × tokens of a tile of each `Format`.
        pub const TILES: [(usize, usize); 3] = [(2, 4), (2, 4), (2, 4)];

        tile_kernel!(
            "avx2,fma",
            __m256,
            _mm256_setzero_ps(),
            [__m256i; 2],
            widened,
            products,
            horizontal_sum
        );

        /// Block `b` of a row as two vectors of sixteen 16-bit values (nibbles less `zero`).
        ///
        /// # Safety
        /// Block `b` must lie inside the row at `row`.
        #[inline]
        #[target_feature(enable = "avx2,fma")]
        unsafe fn widened<const NIBBLES: bool>(row: *const u8, b: usize, zero: u8) -> [__m256i; 2] {
            // SAFETY: as the caller guarantees.
            unsafe {
                if NIBBLES {
                    let zero = _mm256_set1_epi16(i16::from(zero));
                    unpack_nibbles(_mm_loadu_si128(row.add(b * BLOCK / 2).cast()), zero)
                } else {
                    let bytes = row.add(b * BLOCK).cast::<__m128i>();
                    [
                        _mm256_cvtepi8_epi16(_mm_loadu_si128(bytes)),
                        _mm256_cvtepi8_epi16(_mm_loadu_si128(bytes.add(1))),
                    ]
                }
            }
        }

        /// `sum + scale · (w · x)` for a step of 32 values of a weight row and a token, with
        /// `scale[0]` for all of them, or for the first 16 and `scale[1]` for the rest when
        /// `HALVES`.
        ///
        /// # Safety
        /// 32 values must lie at `x`.
        #[inline]
        #[target_feature(enable = "avx2,fma")]
        unsafe fn products<const HALVES: bool>(
            w: [__m256i; 2],
            x: *const i16,
            scale: [f32; 2],
            sum: __m256,
        ) -> __m256 {
            // SAFETY: as the caller guarantees.
            unsafe {
                let x = x.cast::<__m256i>();
                let first = _mm256_madd_epi16(w[0], _mm256_loadu_si256(x));
                let second = _mm256_madd_epi16(w[1], _mm256_loadu_si256(x.add(1)));
                if HALVES {
                    let sum =
                        _mm256_fmadd_ps(_mm256_cvtepi32_ps(first), _mm256_set1_ps(scale[0]), sum);
                    _mm256_fmadd_ps(_mm256_cvtepi32_ps(second), _mm256_set1_ps(scale[1]), sum)
                } else {
                    let pairs = _mm256_add_epi32(first, second);
                    _mm256_fmadd_ps(_mm256_cvtepi32_ps(pairs), _mm256_set1_ps(scale[0]), sum)
                }
            }
        }
    }

    pub mod avx512 {
        use std::arch::x86_64::*;

        use super::super::{BLOCK, Shape, TILE_TOKENS_MAX, Tile, Tokens};
        use crate::model::cpu::threads::SharedOutput;

        /// Rows × tokens of a tile of each `Format`. Nibbles take more tokens to share the
        /// unpacking of each row's block (3 × 4 tiles of bytes ran prompts 25% faster than
        /// 3 × 6, whose sums no longer all fit in registers; 2 × 8 tiles of nibbles 10%
        /// faster than 3 × 4).
        pub const TILES: [(usize, usize); 3] = [(3, 4), (2, 8), (3, 4)];

        tile_kernel!(
            "avx2,fma,avx512f,avx512bw",
            __m512,
            _mm512_setzero_ps(),
            __m512i,
            widened,
            products,
            total
        );

        /// Block `b` of a row as one vector of thirty-two 16-bit values (nibbles less `zero`).
        ///
        /// # Safety
        /// Block `b` must lie inside the row at `row`.
        #[inline]
        #[target_feature(enable = "avx2,fma,avx512f,avx512bw")]
        unsafe fn widened<const NIBBLES: bool>(row: *const u8, b: usize, zero: u8) -> __m512i {
            // SAFETY: as the caller guarantees.
            unsafe {
                if NIBBLES {
                    // ggml's Q4 layout: byte j holds value j low and value j + 16 high. Each
                    // byte widens twice, once shifted by four.
                    let packed =
                        _mm256_broadcastsi128_si256(_mm_loadu_si128(row.add(b * BLOCK / 2).cast()));
                    let shifts =
                        _mm512_inserti64x4::<1>(_mm512_setzero_si512(), _mm256_set1_epi16(4));
                    let both = _mm512_srlv_epi16(_mm512_cvtepu8_epi16(packed), shifts);
                    let zero = _mm512_set1_epi16(i16::from(zero));
                    _mm512_sub_epi16(_mm512_and_si512(both, _mm512_set1_epi16(0x0F)), zero)
                } else {
                    _mm512_cvtepi8_epi16(_mm256_loadu_si256(row.add(b * BLOCK).cast()))
                }
            }
        }

        /// As AVX2's `products`: the first 16 values' pairs land in the low eight lanes,
        /// which take `scale[0]` by a masked product when `HALVES`.
        ///
        /// # Safety
        /// 32 values must lie at `x`.
        #[inline]
        #[target_feature(enable = "avx2,fma,avx512f,avx512bw")]
        unsafe fn products<const HALVES: bool>(
            w: __m512i,
            x: *const i16,
            scale: [f32; 2],
            sum: __m512,
        ) -> __m512 {
            // SAFETY: as the caller guarantees.
            unsafe {
                let pairs = _mm512_cvtepi32_ps(_mm512_madd_epi16(w, _mm512_loadu_si512(x.cast())));
                if HALVES {
                    let sum = _mm512_mask3_fmadd_ps(pairs, _mm512_set1_ps(scale[0]), sum, 0x00FF);
                    _mm512_mask3_fmadd_ps(pairs, _mm512_set1_ps(scale[1]), sum, 0xFF00)
                } else {
                    _mm512_fmadd_ps(pairs, _mm512_set1_ps(scale[0]), sum)
                }
            }
        }

        #[inline]
        #[target_feature(enable = "avx2,fma,avx512f,avx512bw")]
        fn total(sum: __m512) -> f32 {
            _mm512_reduce_add_ps(sum)
        }
    }
}

/// How the weights a tile reads are stored, in the order of the kernels' `TILES`.
#[derive(Clone, Copy)]
enum Format {
    /// Bytes in blocks of 32.
    Bytes,
    /// Nibbles in blocks of 32.
    Nibbles,
    /// Bytes in blocks of 16.
    Halves,
}

impl Format {
    fn of(weight: Weights<'_>) -> Self {
        match (weight.values, weight.halves) {
            (Ints::Nibbles { .. }, _) => Self::Nibbles,
            (Ints::Bytes(_), false) => Self::Bytes,
            (Ints::Bytes(_), true) => Self::Halves,
        }
    }
}

/// Which compilation of the tile kernel runs.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
enum Kernel {
    Avx2,
    Avx512,
}

#[cfg(target_arch = "x86_64")]
impl Kernel {
    fn for_this_cpu() -> Self {
        use std::arch::is_x86_feature_detected;
        if is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bw") {
            Self::Avx512
        } else {
            Self::Avx2
        }
    }

    /// Rows and tokens of one tile of `weight`.
    fn tile(self, weight: Weights<'_>) -> (usize, usize) {
        let tiles = match self {
            Self::Avx2 => kernels::avx2::TILES,
            Self::Avx512 => kernels::avx512::TILES,
        };
        tiles[Format::of(weight) as usize]
    }

    /// # Safety
    /// As the kernels' `tile`, with the CPU features of this kernel.
    unsafe fn tile_at(
        self,
        weight: Weights<'_>,
        tokens: Tokens<'_>,
        shape: Shape,
        at: Tile,
        out: &SharedOutput<f32>,
        accumulate: bool,
    ) {
        use kernels::{avx2, avx512};
        let (values, zero) = match weight.values {
            Ints::Bytes(w) => (w.as_ptr().cast::<u8>(), 0),
            Ints::Nibbles { values, zero } => (values.as_ptr(), zero),
        };
        let (scales, offsets) = (weight.scales, weight.offsets.unwrap_or_default());
        macro_rules! run {
            ($kernel:ident, $format:expr, $offsets:literal) => {
                $kernel::tile::<
                    { matches!($format, Format::Nibbles) },
                    { matches!($format, Format::Halves) },
                    $offsets,
                    { $kernel::TILES[$format as usize].0 },
                    { $kernel::TILES[$format as usize].1 },
                >(
                    values, zero, scales, offsets, tokens, shape, at, out, accumulate,
                )
            };
            ($kernel:ident, $format:expr) => {
                match weight.offsets.is_some() {
                    true => run!($kernel, $format, true),
                    false => run!($kernel, $format, false),
                }
            };
        }
        let format = Format::of(weight);
        // SAFETY: as the caller guarantees.
        unsafe {
            match (self, format) {
                (Self::Avx2, Format::Bytes) => run!(avx2, Format::Bytes),
                (Self::Avx2, Format::Nibbles) => run!(avx2, Format::Nibbles),
                (Self::Avx2, Format::Halves) => run!(avx2, Format::Halves),
                (Self::Avx512, Format::Bytes) => run!(avx512, Format::Bytes),
                (Self::Avx512, Format::Nibbles) => run!(avx512, Format::Nibbles),
                (Self::Avx512, Format::Halves) => run!(avx512, Format::Halves),
            }
        }
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::{BLOCK, BlockInts, HALF_BLOCK, Kernel, Weights, multiply};
    use crate::model::cpu::test_values as values;
    use crate::model::cpu::weights::Ints;

    /// Every compilation the CPU runs, on bytes and nibbles, with and without offsets and
    /// accumulating, for shapes that leave partial tiles, against an f64 product of the
    /// values the kernel reads: the weights as stored and the activations as rounded.
    #[test]
    fn tiles_equal_a_float64_product_of_what_they_read() {
        use std::arch::is_x86_feature_detected;
        let mut kernels = vec![];
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
            kernels.push(Kernel::Avx2);
        }
        if matches!(Kernel::for_this_cpu(), Kernel::Avx512) {
            kernels.push(Kernel::Avx512);
        }
        for (tokens, rows, cols) in [(1, 1, 32), (5, 7, 64), (7, 10, 576), (13, 100, 96)] {
            // Per block of 16, for Q6_K's; blocks of 32 take every other.
            let blocks = rows * cols / HALF_BLOCK;
            let bytes: Vec<i8> = values(rows * cols, 1)
                .iter()
                .map(|v| (v * 127.0) as i8)
                .collect();
            let fours: Vec<i8> = values(rows * cols, 2)
                .iter()
                .map(|v| (v.abs() * 15.0) as i8)
                .collect();
            // Q4_0's -8 to 7, stored as 0 to 15 with a zero of 8.
            let centred: Vec<i8> = fours.iter().map(|&q| q - 8).collect();
            let nibbles: Vec<u8> = fours
                .chunks_exact(32)
                .flat_map(|b| (0..16).map(move |j| b[j] as u8 | (b[j + 16] as u8) << 4))
                .collect();
            let scales: Vec<f32> = values(blocks, 3)
                .iter()
                .map(|v| 0.01 + v.abs() * 0.02)
                .collect();
            let offsets = values(blocks, 4);
            let mut x = values(tokens * cols, 5);
            x[cols / 2] = 30.0;
            let base = values(tokens * rows, 6);
            for kernel in kernels.iter().copied() {
                let nibbles = |zero| Ints::Nibbles {
                    values: &nibbles,
                    zero,
                };
                for (ints, stored, block) in [
                    (Ints::Bytes(&bytes), &bytes, BLOCK),
                    (Ints::Bytes(&bytes), &bytes, HALF_BLOCK),
                    (nibbles(0), &fours, BLOCK),
                    (nibbles(8), &centred, BLOCK),
                ] {
                    let rounded = BlockInts::of(&x, block);
                    let blocks = rows * cols / block;
                    let (scales, offsets) = (&scales[..blocks], &offsets[..blocks]);
                    for (with_offsets, accumulate) in [(false, false), (true, false), (true, true)]
                    {
                        let weight = Weights {
                            values: ints,
                            scales,
                            offsets: with_offsets.then_some(offsets),
                            halves: block == HALF_BLOCK,
                        };
                        let mut out = if accumulate {
                            base.clone()
                        } else {
                            vec![f32::NAN; tokens * rows]
                        };
                        assert!(multiply(kernel, weight, &x, tokens, &mut out, accumulate));
                        for t in 0..tokens {
                            for r in 0..rows {
                                let mut want = if accumulate {
                                    f64::from(base[t * rows + r])
                                } else {
                                    0.0
                                };
                                for c in 0..cols {
                                    let (w, xi) = (r * cols + c, t * cols + c);
                                    let x_rounded = f64::from(rounded.values[xi])
                                        * f64::from(rounded.scales[xi / block]);
                                    want += f64::from(stored[w])
                                        * f64::from(scales[w / block])
                                        * x_rounded;
                                    if with_offsets {
                                        want += f64::from(offsets[w / block]) * f64::from(x[xi]);
                                    }
                                }
                                let got = f64::from(out[t * rows + r]);
                                assert!(
                                    (got - want).abs() < 1e-4 * (1.0 + want.abs()),
                                    "{tokens}x{rows}x{cols}, block {block} ({t}, {r}): {got} vs {want}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}
