//! `X Wᵀ` for a prompt against integer weights (a GGUF file's, and `--precision q8`) in
//! blocks of 32 or 16: the activations are rounded to 16-bit integers per block, as for a
//! decode step, and each tile of weight rows and tokens multiplies integers, summing pairs
//! of products in one instruction, and takes both blocks' scales once per block.
//!
//! The f32 path widens every weight and runs f32 gemm, which on our 2-core machine peaks
//! near 330 prompt tokens/s for SmolLM2-135M whatever the weights; llama.cpp multiplies
//! integers and runs its prompts about twice as fast.
//!
//! AVX2 and AVX-512 tiles of a few weight rows by a few tokens, and from 16 tokens on
//! [`token_lanes`], which puts sixteen tokens in the lanes of a vector (of two on AVX2) and
//! runs prompts 1.6–1.75× faster than the AVX-512 tile where the CPU has AVX512-VNNI.
//!
//! 4- and 5-bit values are unpacked to bytes once per tile of rows, into a buffer of the
//! thread's, not once per tile of tokens: unpacked in the tile, Q4_0 prompts ran 15% slower
//! than Q8_0's.
//!
//! The offsets some types have add `offset · Σ x` per block: for each tile of rows, once
//! its tiles of tokens are done, every token's at once, vectorized over the tokens. A
//! separate f32 gemm of all the block sums by all the offsets, only 18 to 48 blocks deep,
//! ran on one thread while the other waited (10% of a Q4_0 prompt's time); a dot product per
//! output as each tile ended cost Q4_1 prompts 8%.

use std::cell::RefCell;
use std::ops::Range;

#[cfg(target_arch = "x86_64")]
mod token_lanes;

#[cfg(target_arch = "x86_64")]
use token_lanes::Lanes;

use super::Shape;
use crate::model::cpu::features;
use crate::model::cpu::matvec::BlockInts;
use crate::model::cpu::threads::{SharedOutput, split_ranges};
use crate::model::cpu::weights::{Factors, Ints, WeightRows};

/// The values a tile multiplies per step: the blocks of 32 of every GGUF integer type but
/// Q6_K, or two of Q6_K's blocks of 16 (bytes only), each with its own scale.
const BLOCK: usize = 32;

/// Q6_K's block, half a step.
const HALF_BLOCK: usize = BLOCK / 2;

/// Fewest weight rows a thread takes at once.
const MIN_ROWS_PER_RANGE: usize = 48;

/// `out = X Wᵀ` (or `out += X Wᵀ` when `accumulate`) for `x`: `[tokens, cols]`, integer
/// weights `[rows, cols]` in blocks of 32 (or of 16, as bytes) and `out`: `[tokens, rows]`,
/// when the CPU has AVX2; returns whether it did.
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
        && (block == BLOCK || block == HALF_BLOCK)
        && values.read_in(block)
    {
        let weight = Weights {
            values,
            scales,
            offsets,
            halves: block == HALF_BLOCK,
        };
        let kernel = match Kernel::for_this_cpu() {
            // Lanes past the last token are multiplied for nothing: below 16 tokens the
            // other tiles are faster (AVX-512, Q4_0, 4 tokens: 157–165 tok/s against 328–358;
            // 8: 321–334 against 428–429; 16: 553–573 against 513–530).
            Kernel::TokenLanes(lanes) if tokens < token_lanes::LANES => {
                Kernel::Tiles(Tiles::of_width(lanes))
            }
            kernel => kernel,
        };
        return multiply(kernel, weight, x, tokens, out, accumulate);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (weight, x, tokens, out, accumulate);
    false
}

/// Integer weights in blocks of [`BLOCK`], or of [`HALF_BLOCK`] when `halves`.
#[derive(Clone, Copy)]
struct Weights<'a> {
    values: Ints<'a>,
    scales: Factors<'a>,
    offsets: Option<Factors<'a>>,
    halves: bool,
}

/// A thread's buffers, for both families of tiles, which only grow.
struct Scratch {
    /// The 4- or 5-bit values the thread multiplies next as bytes: a tile of rows, or one
    /// row of a chunk of columns for [`token_lanes`].
    bytes: Vec<i8>,
    /// [`token_lanes`]' tile of rows of a chunk, widened to 16 bits.
    words: Vec<i16>,
    /// The tile's scales and offsets in f32, where they are stored otherwise.
    scales: Vec<f32>,
    offsets: Vec<f32>,
    /// One row's offset terms for every token.
    offset_terms: Vec<f32>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = const {
        RefCell::new(Scratch {
            bytes: Vec::new(),
            words: Vec::new(),
            scales: Vec::new(),
            offsets: Vec::new(),
            offset_terms: Vec::new(),
        })
    };
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
    let Some(shape) = Shape::of(tokens, x.len(), weight.values.len(), out.len(), BLOCK) else {
        return false;
    };
    let Shape { rows, cols, .. } = shape;
    let block = if weight.halves { HALF_BLOCK } else { BLOCK };
    let blocks = cols / block;
    assert!(
        weight.scales.len() == rows * blocks
            && weight
                .offsets
                .is_none_or(|offsets| offsets.len() == rows * blocks),
        "integer matmul: scales and offsets do not fit [rows, cols / block]"
    );
    let compiled = match kernel {
        Kernel::Tiles(compiled) => compiled,
        Kernel::TokenLanes(lanes) => {
            // SAFETY: the CPU has the features of `lanes` (the caller's promise), and the
            // shapes are checked above.
            unsafe { token_lanes::multiply(lanes, weight, x, shape, out, accumulate) };
            return true;
        }
    };
    let rounded = BlockInts::of(x, block);
    let by_block = TokenBlocks::of(&rounded, tokens, weight.offsets.is_some());
    let shared = SharedOutput::new(out);
    let tokens_in = Tokens {
        x: &rounded,
        by_block: &by_block,
    };
    let (tile_rows, tile_tokens) = compiled.tile();
    split_ranges(
        rows.div_ceil(tile_rows),
        MIN_ROWS_PER_RANGE / tile_rows,
        &|tiles: Range<usize>| {
            SCRATCH.with_borrow_mut(|scratch| {
                let Scratch {
                    bytes,
                    scales,
                    offsets,
                    offset_terms: terms,
                    ..
                } = scratch;
                let rows_of_range = tiles.start * tile_rows..(tiles.end * tile_rows).min(rows);
                for first_row in rows_of_range.step_by(tile_rows) {
                    let tile_rows = first_row..(first_row + tile_rows).min(rows);
                    let len = tile_rows.len() * cols;
                    let tile_blocks = tile_rows.start * blocks..tile_rows.end * blocks;
                    let values = match weight.values {
                        Ints::Bytes(values) => &values[first_row * cols..][..len],
                        packed => {
                            grow(bytes, len);
                            let bytes = &mut bytes[..len];
                            packed.unpack(first_row * cols, bytes);
                            bytes
                        }
                    };
                    let tile_weight = TileWeight {
                        values,
                        scales: weight.scales.f32s(tile_blocks.clone(), scales),
                    };
                    // The tile's weight rows stay in the L1 cache while every token passes.
                    for first_token in (0..tokens).step_by(tile_tokens) {
                        let at = Tile {
                            first_token,
                            first_row,
                        };
                        // SAFETY: the CPU has the kernel's features (the caller's promise) and
                        // the sizes are checked above. The tile reads its rows of `values`
                        // and rows of `x` below `tokens`, and writes elements of `out` in the
                        // columns of this range's rows, which no other range touches.
                        unsafe {
                            compiled.tile_at(
                                weight.halves,
                                tile_weight,
                                tokens_in,
                                shape,
                                at,
                                &shared,
                                accumulate,
                            )
                        };
                    }
                    if let Some(tile_offsets) = weight.offsets {
                        let tile_offsets = tile_offsets.f32s(tile_blocks, offsets);
                        grow(terms, tokens);
                        let terms = &mut terms[..tokens];
                        for (row, offsets) in tile_rows.zip(tile_offsets.chunks_exact(blocks)) {
                            offset_terms(offsets, &by_block, terms);
                            for (t, &term) in terms.iter().enumerate() {
                                // SAFETY: (t, row) lies inside `out`; this range's rows are
                                // this thread's alone.
                                unsafe { *shared.at(t * rows + row) += term };
                            }
                        }
                    }
                }
            })
        },
    );
    true
}

/// `buffer` at least `len` long: the threads' buffers only grow.
fn grow<T: Default + Clone>(buffer: &mut Vec<T>, len: usize) {
    if buffer.len() < len {
        buffer.resize(len, T::default());
    }
}

/// `terms[t] = Σ_b offsets[b] · sums[b, t]`: a row's offset terms for every token, the
/// tokens' sums of each block side by side.
#[multiversion::multiversion(targets("x86_64+avx512f", "x86_64+avx2+fma"))]
fn offset_terms(offsets: &[f32], by_block: &TokenBlocks, terms: &mut [f32]) {
    terms.fill(0.0);
    let tokens = terms.len();
    for (&offset, sums) in offsets
        .iter()
        .zip(by_block.sums.chunks_exact(by_block.stride))
    {
        for (term, &sum) in terms.iter_mut().zip(&sums[..tokens]) {
            *term += offset * sum;
        }
    }
}

/// One tile's weight rows as bytes and their scales, from its first row.
#[derive(Clone, Copy)]
struct TileWeight<'a> {
    values: &'a [i8],
    scales: &'a [f32],
}

/// Tokens a tile of `kernels` takes at once, at most: the lanes of one f32 vector of AVX2.
const TILE_TOKENS_MAX: usize = 8;

/// Zeros past the last token in each block of [`TokenBlocks`]: the lanes of one f32 vector of
/// AVX-512, the most any tile reads at once.
const SCALE_PADDING: usize = 16;

/// The tokens' scales (and block sums, for offsets) block by block, so that a tile finds its
/// tokens' side by side; each block is padded with [`SCALE_PADDING`] zeros past the last
/// token.
struct TokenBlocks {
    scales: Vec<f32>,
    /// Empty without offsets.
    sums: Vec<f32>,
    stride: usize,
}

impl TokenBlocks {
    fn of(x: &BlockInts, tokens: usize, with_sums: bool) -> Self {
        let blocks = x.scales.len() / tokens;
        let stride = tokens + SCALE_PADDING;
        let by_block = |per_token: &[f32]| {
            let mut by_block = vec![0.0; blocks * stride];
            for (t, token) in per_token.chunks_exact(blocks).enumerate() {
                for (b, &value) in token.iter().enumerate() {
                    by_block[b * stride + t] = value;
                }
            }
            by_block
        };
        Self {
            scales: by_block(&x.scales),
            sums: if with_sums {
                by_block(&x.sums)
            } else {
                Vec::new()
            },
            stride,
        }
    }

    /// The scales of block `b` from `first_token` on, up to [`SCALE_PADDING`] of them.
    ///
    /// # Safety
    /// `b` must be a block and `first_token` a token of the prompt.
    unsafe fn scales(&self, b: usize, first_token: usize) -> *const f32 {
        // SAFETY: as the caller guarantees; the padding holds the lanes past the last token.
        unsafe { self.scales.as_ptr().add(b * self.stride + first_token) }
    }

    /// The sums of block `b` from `first_token` on, as [`Self::scales`].
    ///
    /// # Safety
    /// As [`Self::scales`], and the blocks must have been taken with their sums.
    #[cfg(target_arch = "x86_64")]
    unsafe fn sums(&self, b: usize, first_token: usize) -> *const f32 {
        // SAFETY: as the caller guarantees.
        unsafe { self.sums.as_ptr().add(b * self.stride + first_token) }
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
    features::cpu().avx2
}

/// The tile kernels. AVX2 multiplies a step of 32 values as two vectors of sixteen 16-bit
/// pairs, AVX-512 as one of thirty-two, with twice the registers for a larger tile.
#[cfg(target_arch = "x86_64")]
mod kernels {
    /// `TOKENS × ROWS` outputs from the tile's first token and row. At the edges
    /// the missing tokens and rows repeat the last one and their sums are dropped.
    ///
    /// # Safety (of each kernel's `tile`)
    /// The CPU must have the module's features; `weight.values` must hold the tile's rows
    /// (those of `rows` from its first) of `cols` bytes, `weight.scales` one per block of 32
    /// (of 16 when `HALVES`) of each of those rows, `tokens` be `[tokens, cols]` rounded in the same
    /// blocks, and no other thread may touch the tile's elements of `out`.
    macro_rules! tile_kernel {
        ($features:literal, $sum:ty, $zero:expr, $weights:ty, $widened:ident, $products:ident,
         $total:ident) => {
            #[target_feature(enable = $features)]
            pub unsafe fn tile<const HALVES: bool, const ROWS: usize, const TOKENS: usize>(
                weight: TileWeight<'_>,
                tokens_in: Tokens<'_>,
                shape: Shape,
                at: Tile,
                out: &SharedOutput<f32>,
                accumulate: bool,
            ) {
                use std::arch::x86_64::*;
                let Shape { tokens, rows, cols } = shape;
                let TileWeight { values, scales } = weight;
                let parts = if HALVES { 2 } else { 1 };
                let blocks = cols / BLOCK * parts;
                let row_of = |j: usize| (at.first_row + j).min(rows - 1);
                let token_of = |i: usize| (at.first_token + i).min(tokens - 1);
                let row_blocks =
                    std::array::from_fn::<_, ROWS, _>(|j| (row_of(j) - at.first_row) * blocks);
                // SAFETY: every row and token index is clamped inside the shape, and the tile's
                // rows lie in `values` from its first.
                let (rows_in, x) = unsafe {
                    (
                        std::array::from_fn::<_, ROWS, _>(|j| {
                            values.as_ptr().add((row_of(j) - at.first_row) * cols)
                        }),
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
                        let w: [$weights; ROWS] =
                            std::array::from_fn(|j| $widened(rows_in[j].add(step * BLOCK)));
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
                            let sum = $total(sum);
                            *y = if accumulate { *y + sum } else { sum };
                        }
                    }
                }
            }
        };
    }

    pub mod avx2 {
        use std::arch::x86_64::*;

        use super::super::{BLOCK, Shape, TILE_TOKENS_MAX, Tile, TileWeight, Tokens};
        use crate::model::cpu::math::horizontal_sum;
        use crate::model::cpu::threads::SharedOutput;

        /// Rows × tokens of a tile.
        pub const TILE: (usize, usize) = (2, 4);

        tile_kernel!(
            "avx2,fma",
            __m256,
            _mm256_setzero_ps(),
            [__m256i; 2],
            widened,
            products,
            horizontal_sum
        );

        /// 32 bytes at `at` as two vectors of sixteen 16-bit values.
        ///
        /// # Safety
        /// 32 bytes must lie at `at`.
        #[inline]
        #[target_feature(enable = "avx2,fma")]
        unsafe fn widened(at: *const i8) -> [__m256i; 2] {
            // SAFETY: as the caller guarantees.
            unsafe {
                let bytes = at.cast::<__m128i>();
                [
                    _mm256_cvtepi8_epi16(_mm_loadu_si128(bytes)),
                    _mm256_cvtepi8_epi16(_mm_loadu_si128(bytes.add(1))),
                ]
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

        use super::super::{BLOCK, Shape, TILE_TOKENS_MAX, Tile, TileWeight, Tokens};
        use crate::model::cpu::threads::SharedOutput;

        /// Rows × tokens of a tile: 3 × 4 ran prompts 25% faster than 3 × 6, whose sums no
        /// longer all fit in registers, and faster than 4 × 4 and 2 × 8.
        pub const TILE: (usize, usize) = (3, 4);

        tile_kernel!(
            "avx2,fma,avx512f,avx512bw",
            __m512,
            _mm512_setzero_ps(),
            __m512i,
            widened,
            products,
            total
        );

        /// 32 bytes at `at` as one vector of thirty-two 16-bit values.
        ///
        /// # Safety
        /// 32 bytes must lie at `at`.
        #[inline]
        #[target_feature(enable = "avx2,fma,avx512f,avx512bw")]
        unsafe fn widened(at: *const i8) -> __m512i {
            // SAFETY: as the caller guarantees.
            unsafe { _mm512_cvtepi8_epi16(_mm256_loadu_si256(at.cast())) }
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

/// Which kernel runs a product.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
enum Kernel {
    /// Tiles of a few weight rows by a few tokens.
    Tiles(Tiles),
    /// See [`token_lanes`].
    TokenLanes(Lanes),
}

#[cfg(target_arch = "x86_64")]
impl Kernel {
    fn for_this_cpu() -> Self {
        let cpu = features::cpu();
        if cpu.avx512_vnni {
            Self::TokenLanes(Lanes::Avx512)
        } else if cpu.avx512 {
            Self::Tiles(Tiles::Avx512)
        } else {
            Self::TokenLanes(Lanes::Avx2 { vnni: cpu.avx_vnni })
        }
    }

    /// The kernels this CPU can run.
    #[cfg(test)]
    fn all_for_this_cpu() -> Vec<Self> {
        let cpu = features::cpu();
        let mut kernels = vec![];
        if supported() {
            kernels.push(Self::Tiles(Tiles::Avx2));
            kernels.push(Self::TokenLanes(Lanes::Avx2 { vnni: false }));
        }
        if cpu.avx_vnni {
            kernels.push(Self::TokenLanes(Lanes::Avx2 { vnni: true }));
        }
        if cpu.avx512 {
            kernels.push(Self::Tiles(Tiles::Avx512));
        }
        if cpu.avx512_vnni {
            kernels.push(Self::TokenLanes(Lanes::Avx512));
        }
        kernels
    }
}

/// Which compilation of the tile kernel runs.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
enum Tiles {
    Avx2,
    Avx512,
}

#[cfg(target_arch = "x86_64")]
impl Tiles {
    /// The tiles on the vectors `lanes` runs on.
    fn of_width(lanes: Lanes) -> Self {
        match lanes {
            Lanes::Avx512 => Self::Avx512,
            Lanes::Avx2 { .. } => Self::Avx2,
        }
    }

    /// Rows and tokens of one tile.
    fn tile(self) -> (usize, usize) {
        match self {
            Self::Avx2 => kernels::avx2::TILE,
            Self::Avx512 => kernels::avx512::TILE,
        }
    }

    /// # Safety
    /// As the kernels' `tile`, with the CPU features of this kernel.
    #[allow(clippy::too_many_arguments)]
    unsafe fn tile_at(
        self,
        halves: bool,
        tile_weight: TileWeight<'_>,
        tokens: Tokens<'_>,
        shape: Shape,
        at: Tile,
        out: &SharedOutput<f32>,
        accumulate: bool,
    ) {
        use kernels::{avx2, avx512};
        macro_rules! run {
            ($kernel:ident, $halves:literal) => {
                $kernel::tile::<$halves, { $kernel::TILE.0 }, { $kernel::TILE.1 }>(
                    tile_weight,
                    tokens,
                    shape,
                    at,
                    out,
                    accumulate,
                )
            };
        }
        // SAFETY: as the caller guarantees.
        unsafe {
            match (self, halves) {
                (Self::Avx2, false) => run!(avx2, false),
                (Self::Avx2, true) => run!(avx2, true),
                (Self::Avx512, false) => run!(avx512, false),
                (Self::Avx512, true) => run!(avx512, true),
            }
        }
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use half::f16;

    use super::{BLOCK, BlockInts, HALF_BLOCK, Kernel, Weights, multiply};
    use crate::model::cpu::test_values as values;
    use crate::model::cpu::weights::{BlockFactors, IntegerValues, Ints};

    /// `multiply` into NaNs, or onto `base` (`[tokens, rows]`) when `accumulate`.
    fn product(
        kernel: Kernel,
        weight: Weights<'_>,
        x: &[f32],
        tokens: usize,
        base: &[f32],
        accumulate: bool,
    ) -> Vec<f32> {
        let mut out = match accumulate {
            true => base.to_vec(),
            false => vec![f32::NAN; base.len()],
        };
        assert!(multiply(kernel, weight, x, tokens, &mut out, accumulate));
        out
    }

    /// Every compilation the CPU runs, on bytes, 4- and 5-bit values, with and without offsets and
    /// accumulating, for shapes that leave partial tiles, against an f64 product of the
    /// values the kernel reads: the weights as stored and the activations as rounded.
    #[test]
    fn tiles_equal_a_float64_product_of_what_they_read() {
        let kernels = Kernel::all_for_this_cpu();
        for (tokens, rows, cols) in [
            (1, 1, 32),
            (5, 7, 64),
            (7, 10, 576),
            (13, 100, 96),
            (37, 20, 64),
            // Three chunks of columns for `token_lanes`, the last one short.
            (19, 9, 4160),
        ] {
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
            let fives: Vec<i8> = values(rows * cols, 7)
                .iter()
                .map(|v| (v.abs() * 31.0) as i8)
                .collect();
            // Q5_0's -16 to 15, stored as 0 to 31 with a zero of 16.
            let centred_fives: Vec<i8> = fives.iter().map(|&q| q - 16).collect();
            // Q6_K's -32 to 31 in blocks of 16, stored as 0 to 63 with a zero of 32.
            let sixes: Vec<i8> = values(rows * cols, 8)
                .iter()
                .map(|v| (v * 31.0) as i8)
                .collect();
            let packings = [&fours, &centred, &fives, &centred_fives]
                .map(|values| IntegerValues::packing(values, BLOCK));
            let six_bits = IntegerValues::packing(&sixes, HALF_BLOCK);
            assert!(matches!(
                (&packings, &six_bits),
                (
                    [
                        IntegerValues::Nibbles { .. },
                        IntegerValues::Nibbles { .. },
                        IntegerValues::FiveBits { .. },
                        IntegerValues::FiveBits { .. },
                    ],
                    IntegerValues::SixBits { .. }
                )
            ));
            // f16 values, which nibbles below take as f16, as a GGUF file's are.
            let as_f16 = |v: f32| f16::from_f32(v).to_f32();
            let scales: Vec<f32> = values(blocks, 3)
                .iter()
                .map(|v| as_f16(0.01 + v.abs() * 0.02))
                .collect();
            let offsets: Vec<f32> = values(blocks, 4).into_iter().map(as_f16).collect();
            let mut x = values(tokens * cols, 5);
            x[cols / 2] = 30.0;
            let base = values(tokens * rows, 6);
            for kernel in kernels.iter().copied() {
                let [fours_in, centred_in, fives_in, centred_fives_in] =
                    packings.each_ref().map(IntegerValues::borrowed);
                for (ints, stored, block) in [
                    (Ints::Bytes(&bytes), &bytes, BLOCK),
                    (Ints::Bytes(&bytes), &bytes, HALF_BLOCK),
                    (fours_in, &fours, BLOCK),
                    (centred_in, &centred, BLOCK),
                    (fives_in, &fives, BLOCK),
                    (centred_fives_in, &centred_fives, BLOCK),
                    (six_bits.borrowed(), &sixes, HALF_BLOCK),
                ] {
                    let rounded = BlockInts::of(&x, block);
                    let blocks = rows * cols / block;
                    let (scales, offsets) = (&scales[..blocks], &offsets[..blocks]);
                    let factors = |values: &[f32]| match ints {
                        Ints::Bytes(_) => BlockFactors::F32(values.to_vec()),
                        _ => BlockFactors::F16(values.iter().map(|&v| f16::from_f32(v)).collect()),
                    };
                    let (scale_factors, offset_factors) = (factors(scales), factors(offsets));
                    for (with_offsets, accumulate) in [(false, false), (true, false), (true, true)]
                    {
                        let weight = Weights {
                            values: ints,
                            scales: scale_factors.borrowed(),
                            offsets: with_offsets.then(|| offset_factors.borrowed()),
                            halves: block == HALF_BLOCK,
                        };
                        let out = product(kernel, weight, &x, tokens, &base, accumulate);
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

    /// Every compilation of [`super::token_lanes`] against its arithmetic written out: each
    /// block's products summed in 32-bit integers, converted, scaled by the token's and the
    /// row's scales multiplied, added by a fused multiply-add, then the block's offset term,
    /// block after block over every chunk of columns. So the 256-bit tiles give the AVX-512
    /// tile's bits, and a prompt reads alike on either kind of CPU.
    #[test]
    fn token_lanes_sum_in_one_order_on_every_vector_width() {
        let kernels: Vec<Kernel> = Kernel::all_for_this_cpu()
            .into_iter()
            .filter(|kernel| matches!(kernel, Kernel::TokenLanes(_)))
            .collect();
        assert!(
            !kernels.is_empty(),
            "every x86-64 CPU this runs on has AVX2"
        );
        let (tokens, rows, cols) = (37, 13, 4160);
        let bytes: Vec<i8> = values(rows * cols, 21)
            .iter()
            .map(|v| (v * 127.0) as i8)
            .collect();
        let fours: Vec<i8> = values(rows * cols, 22)
            .iter()
            .map(|v| (v.abs() * 15.0) as i8 - 8)
            .collect();
        let nibbles = IntegerValues::packing(&fours, BLOCK);
        let mut x = values(tokens * cols, 23);
        x[5 * cols + 99] = -40.0;
        let base = values(tokens * rows, 24);
        for (ints, stored, block) in [
            (Ints::Bytes(&bytes), &bytes, BLOCK),
            (Ints::Bytes(&bytes), &bytes, HALF_BLOCK),
            (nibbles.borrowed(), &fours, BLOCK),
        ] {
            let blocks = cols / block;
            let scales: Vec<f32> = values(rows * blocks, 25)
                .iter()
                .map(|v| f16::from_f32(0.01 + v.abs() * 0.02).to_f32())
                .collect();
            let offsets: Vec<f32> = values(rows * blocks, 26)
                .iter()
                .map(|&v| f16::from_f32(v).to_f32())
                .collect();
            let (scale_factors, offset_factors) = (
                BlockFactors::F32(scales.clone()),
                BlockFactors::F32(offsets.clone()),
            );
            let rounded = BlockInts::of(&x, block);
            for (with_offsets, accumulate) in [(false, false), (true, false), (true, true)] {
                let mut want = vec![0.0f32; tokens * rows];
                for t in 0..tokens {
                    for r in 0..rows {
                        let mut sum = if accumulate { base[t * rows + r] } else { 0.0 };
                        for b in 0..blocks {
                            let int: i32 = (0..block)
                                .map(|k| {
                                    let c = b * block + k;
                                    i32::from(stored[r * cols + c])
                                        * i32::from(rounded.values[t * cols + c])
                                })
                                .sum();
                            let scale = rounded.scales[t * blocks + b] * scales[r * blocks + b];
                            sum = (int as f32).mul_add(scale, sum);
                            if with_offsets {
                                let token_sum = rounded.sums[t * blocks + b];
                                sum = token_sum.mul_add(offsets[r * blocks + b], sum);
                            }
                        }
                        want[t * rows + r] = sum;
                    }
                }
                for &kernel in &kernels {
                    let weight = Weights {
                        values: ints,
                        scales: scale_factors.borrowed(),
                        offsets: with_offsets.then(|| offset_factors.borrowed()),
                        halves: block == HALF_BLOCK,
                    };
                    let got = product(kernel, weight, &x, tokens, &base, accumulate);
                    let lanes = match kernel {
                        Kernel::TokenLanes(lanes) => lanes,
                        Kernel::Tiles(_) => unreachable!("filtered above"),
                    };
                    for (i, (got, want)) in got.iter().zip(&want).enumerate() {
                        assert_eq!(
                            got.to_bits(),
                            want.to_bits(),
                            "{lanes:?}, block {block}, offsets {with_offsets}, accumulate \
                             {accumulate}, token {}, row {}: {got} against {want}",
                            i / rows,
                            i % rows
                        );
                    }
                }
            }
        }
    }

    /// Q6_K's blocks of 16, whose scales are integer steps of a base per super-block as a
    /// GGUF file's are, through every compilation the CPU runs (`token_lanes` multiplies
    /// the values by their steps and rounds the activations to 15 bits per 32), within the
    /// rounding of the activations of the true product, over several chunks of columns.
    #[test]
    fn stepped_blocks_of_16_equal_a_float64_product_within_the_rounding() {
        let (tokens, rows, cols) = (21, 8, 2304);
        let weights: Vec<i8> = values(rows * cols, 11)
            .iter()
            .map(|v| ((v * 32.0) as i8).clamp(-32, 31))
            .collect();
        let blocks = rows * cols / HALF_BLOCK;
        let bases = values(blocks / 16, 12);
        let steps = values(blocks, 13);
        let scales: Vec<f32> = (0..blocks)
            .map(|b| {
                let base = f16::from_f32(0.001 + bases[b / 16].abs() * 0.01).to_f32();
                base * ((steps[b] * 128.0) as i8) as f32
            })
            .collect();
        let factors = BlockFactors::F32(scales.clone()).compacted(HALF_BLOCK);
        assert!(matches!(factors, BlockFactors::Scaled { per: 16, .. }));
        let mut x = values(tokens * cols, 14);
        x[3 * cols + 40] = -25.0;
        let base = values(tokens * rows, 15);
        for kernel in Kernel::all_for_this_cpu() {
            for accumulate in [false, true] {
                let weight = Weights {
                    values: Ints::Bytes(&weights),
                    scales: factors.borrowed(),
                    offsets: None,
                    halves: true,
                };
                let out = product(kernel, weight, &x, tokens, &base, accumulate);
                for t in 0..tokens {
                    let x = &x[t * cols..][..cols];
                    for r in 0..rows {
                        let (mut want, mut bound) = (0.0f64, 0.0f64);
                        if accumulate {
                            want = f64::from(base[t * rows + r]);
                        }
                        for c in 0..cols {
                            let w = f64::from(weights[r * cols + c])
                                * f64::from(scales[(r * cols + c) / HALF_BLOCK]);
                            want += w * f64::from(x[c]);
                            let block = &x[c / BLOCK * BLOCK..][..BLOCK];
                            let largest = block.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                            bound += w.abs() * f64::from(largest) / 16383.0;
                        }
                        let got = f64::from(out[t * rows + r]);
                        assert!(
                            (got - want).abs() <= bound + 1e-5 * (1.0 + want.abs()),
                            "({t}, {r}): {got} vs {want}, bound {bound}"
                        );
                    }
                }
            }
        }
    }
}
