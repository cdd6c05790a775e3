//! The prompt tile for CPUs with AVX512-VNNI: sixteen tokens side by side in the lanes of a
//! vector, each pair of a weight row's values broadcast to all of them, so that a block of
//! 32 values is 16 multiply-adds into integer sums (`vpdpwssd`), then one conversion and one
//! scaling per block. The tile of `kernels::avx512` converts and scales every 32 products,
//! and those two instructions took as long as the products themselves.
//!
//! Putting tokens, not weight rows, in the lanes costs no transposing of weights: the
//! rounded prompt is laid out once per product ([`TokenPairs`]) and the weight rows stay as
//! they are, widened to 16 bits per tile of rows.

use std::arch::x86_64::*;

use super::{Shape, Tile, TokenBlocks};
use crate::model::cpu::threads::SharedOutput;

/// Tokens in the lanes of one vector.
pub const LANES: usize = 16;

/// Weight rows of a tile.
const ROWS: usize = 6;

/// Groups of [`LANES`] tokens of a tile: 6 × 2 keeps both the integer and the float sums
/// of all twelve in registers with room for the step's vectors, and 128 tokens split into
/// tiles with no group left over.
const GROUPS: usize = 2;

/// Rows × tokens of a tile.
pub const TILE: (usize, usize) = (ROWS, GROUPS * LANES);

/// A rounded prompt as pairs of 16-bit values, sixteen tokens side by side: for each group of
/// [`LANES`] tokens and each pair of columns, one 32-bit pair per token, zero past the last
/// token.
pub struct TokenPairs {
    pairs: Vec<u32>,
    /// Pairs of columns in a token.
    per_token: usize,
}

impl TokenPairs {
    /// `values`: `[tokens, cols]`.
    pub fn of(values: &[i16], cols: usize) -> Self {
        let per_token = cols / 2;
        let tokens = values.len() / cols;
        let mut pairs = vec![0; tokens.div_ceil(LANES) * per_token * LANES];
        for (t, token) in values.chunks_exact(cols).enumerate() {
            let group = &mut pairs[t / LANES * per_token * LANES..][..per_token * LANES];
            for (to, pair) in group
                .iter_mut()
                .skip(t % LANES)
                .step_by(LANES)
                .zip(token.chunks_exact(2))
            {
                *to = u32::from(pair[0] as u16) | u32::from(pair[1] as u16) << 16;
            }
        }
        Self { pairs, per_token }
    }

    fn groups(&self) -> usize {
        self.pairs.len() / (self.per_token * LANES)
    }
}

/// `bytes` widened to 16 bits, 32 at a time. The compiled loop (SSE2, outside this module's
/// features) took 7% of a Q8_0 prompt's time and this one 5%, most of it waiting for the
/// weights to arrive from memory, which they do here first.
///
/// # Safety
/// The CPU must have AVX-512 F and BW; `bytes` and `words` must be as long, a multiple of 32.
#[target_feature(enable = "avx2,fma,avx512f,avx512bw")]
pub unsafe fn widen(bytes: &[i8], words: &mut [i16]) {
    for (bytes, words) in bytes.chunks_exact(32).zip(words.chunks_exact_mut(32)) {
        // SAFETY: each chunk holds 32 values.
        unsafe {
            let wide = _mm512_cvtepi8_epi16(_mm256_loadu_si256(bytes.as_ptr().cast()));
            _mm512_storeu_si512(words.as_mut_ptr().cast(), wide);
        }
    }
}

/// `TOKENS × ROWS` outputs from the tile's first token (a multiple of [`LANES`]) and row:
/// `words` holds the tile's rows widened to 16 bits, `cols` each, and `scales` one per block
/// of 32 (of 16 when `HALVES`) of each of them. Rows past the last repeat it and
/// groups past the last repeat that; their sums are dropped.
///
/// # Safety
/// The CPU must have AVX-512 F, BW and VNNI; `words` must hold `ROWS` rows (or the rows left)
/// of `shape.cols` values, `tokens` and `by_block` be the prompt of `shape`, and no other
/// thread may touch the tile's elements of `out`.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,avx512f,avx512bw,avx512vnni")]
pub unsafe fn tile<const HALVES: bool>(
    words: &[i16],
    scales: &[f32],
    tokens: &TokenPairs,
    by_block: &TokenBlocks,
    shape: Shape,
    at: Tile,
    out: &SharedOutput<f32>,
    accumulate: bool,
) {
    let Shape { rows, cols, .. } = shape;
    let block = if HALVES { 16 } else { 32 };
    let blocks = cols / block;
    let first_group = at.first_token / LANES;
    let group_of = |g: usize| (first_group + g).min(tokens.groups() - 1);
    let tile_rows = ROWS.min(rows - at.first_row);
    let row_of = |j: usize| j.min(tile_rows - 1);
    // SAFETY: every group and row is clamped inside the prompt and the tile.
    let (x, w) = unsafe {
        (
            std::array::from_fn::<_, GROUPS, _>(|g| {
                tokens
                    .pairs
                    .as_ptr()
                    .add(group_of(g) * tokens.per_token * LANES)
            }),
            std::array::from_fn::<_, ROWS, _>(|j| words.as_ptr().add(row_of(j) * cols)),
        )
    };
    let row_scales: [&[f32]; ROWS] =
        std::array::from_fn(|j| &scales[row_of(j) * blocks..][..blocks]);
    let mut sums = [[_mm512_setzero_ps(); GROUPS]; ROWS];
    for b in 0..blocks {
        let mut ints = [[_mm512_setzero_si512(); GROUPS]; ROWS];
        for pair in b * block / 2..(b + 1) * block / 2 {
            // SAFETY: `pair` lies inside every row and token, whose pointers are clamped
            // inside the buffers.
            unsafe {
                let x: [__m512i; GROUPS] = std::array::from_fn(|g| {
                    _mm512_loadu_si512(x[g].add(pair * LANES).cast::<__m512i>())
                });
                for (j, ints) in ints.iter_mut().enumerate() {
                    let w = _mm512_set1_epi32(w[j].add(pair * 2).cast::<i32>().read_unaligned());
                    for (int, &x) in ints.iter_mut().zip(&x) {
                        *int = _mm512_dpwssd_epi32(*int, x, w);
                    }
                }
            }
        }
        // SAFETY: the token blocks are padded past the last token by a vector's lanes, and
        // each clamped group starts at a token of the prompt.
        let token_scales: [__m512; GROUPS] = std::array::from_fn(|g| unsafe {
            _mm512_loadu_ps(by_block.scales(b, group_of(g) * LANES))
        });
        for (sums, (ints, row_scales)) in sums.iter_mut().zip(ints.iter().zip(&row_scales)) {
            let row_scale = _mm512_set1_ps(row_scales[b]);
            for ((sum, &int), &token_scale) in sums.iter_mut().zip(ints).zip(&token_scales) {
                let scale = _mm512_mul_ps(token_scale, row_scale);
                *sum = _mm512_fmadd_ps(_mm512_cvtepi32_ps(int), scale, *sum);
            }
        }
    }
    for (j, sums) in sums.iter().enumerate().take(tile_rows) {
        let row = at.first_row + j;
        for (g, &sum) in sums.iter().enumerate() {
            let mut lanes = [0.0f32; LANES];
            // SAFETY: `lanes` holds one vector.
            unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), sum) };
            let first = at.first_token + g * LANES;
            for (t, &value) in (first..shape.tokens).zip(&lanes) {
                // SAFETY: (t, row) lies inside `out`, and the caller gives this tile's
                // elements to this thread alone.
                unsafe {
                    let y = out.at(t * rows + row);
                    *y = if accumulate { *y + value } else { value };
                }
            }
        }
    }
}
