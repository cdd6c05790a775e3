//! `X Wᵀ` for a prompt against float weights on CPUs with AVX-512 (register tiles of 6 weight
//! rows × 4 tokens) or AVX2 (5 rows × 2 tokens): the tile's sums stay in registers while the
//! columns pass, and no weight is widened or packed in memory (on AVX2, the prompt's columns
//! are reordered once per product, [`avx2_halves`]). On CPUs with AVX2 alone, the loader lays
//! the float projections out by lane for `lane_tiles`, which the projections hand them to;
//! the AVX2 tiles here take float weights held as stored (an output head that is also the
//! embedding, rows not in whole groups of sixteen, rows a partial rotation reorders). Two
//! kinds of operands share the AVX-512 tile:
//!
//! - f32 activations against f32, f16 or bf16 weights ([`product`]): each weight is widened
//!   to f32 in the register it is loaded into, and every product is f32. Each output is
//!   summed in the order of the decode kernel (`matvec`): sixteen lanes in column order (for
//!   bf16, in pairs of columns: `matvec::paired_columns`), then `sum_of_sixteen`. So a token
//!   gets the same bits decoded, in a short prompt or in a long one, and a prompt read as
//!   cache plus remainder gets the logits it gets whole (issue 37). For that, every prompt
//!   takes the tiles, however long; prompts are read in blocks of tokens that stay in the
//!   second-level cache while the weights pass.
//! - bf16 activations against bf16 weights ([`bf16_product`], `--precision bf16`), on CPUs
//!   with AVX512-BF16: one instruction multiplies 32 pairs and adds them, two by two, into 16
//!   f32 sums. A product of two bf16 values is exact in f32, so the sums differ from f32's
//!   only in the order of the additions, and in that the instruction reads subnormal inputs
//!   (below 1e-38) as zero.

use half::bf16;

use super::{Shape, for_each_row_tile, token_blocks};
use crate::model::cpu::cache_lines::CacheLines;
use crate::model::cpu::host::HostFloat;
#[cfg(target_arch = "x86_64")]
use crate::model::cpu::math::sum_of_sixteen;
use crate::model::cpu::matvec::{PAIRED_COLUMNS, paired_columns};
use crate::model::cpu::threads::SharedOutput;
use crate::model::cpu::weights::WeightRows;

/// Tokens of one AVX-512 tile.
const TILE_TOKENS: usize = 4;

/// Weight rows of one AVX-512 tile. The tile's 24 sums, its tokens' four vectors and one
/// weight vector take 29 of the 32 vector registers.
const TILE_ROWS: usize = 6;

/// Fewest tiles of weight rows a thread takes at once.
const MIN_TILES_PER_RANGE: usize = 4;

/// `out = X Wᵀ` (or `out += X Wᵀ` when `accumulate`) for f32 `x`: `[tokens, cols]`, a float
/// `weight`: `[rows, cols]` and `out`: `[tokens, rows]`, all row-major, when the CPU has
/// AVX-512 and `cols` is a multiple of 16; returns whether it did.
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
    match weight {
        WeightRows::F32(weight) => widened(weight, x, tokens, out, accumulate),
        WeightRows::F16(weight) => widened(weight, x, tokens, out, accumulate),
        // Both tiles need AVX2 (AVX-512 comes with it): without, the activations are not paired.
        WeightRows::Bf16(weight) if PairedBf16Avx2::supported() => {
            let x = paired_columns(x, x.len() / tokens.max(1));
            tiles::<PairedBf16>(weight, &x, tokens, out, accumulate)
                || tiles::<PairedBf16Avx2>(weight, &x, tokens, out, accumulate)
        }
        // `lane_tiles` takes the rows laid out by lane, from the activations as they are.
        WeightRows::F32ByLane { .. }
        | WeightRows::F16ByLane { .. }
        | WeightRows::Bf16ByLane { .. }
        | WeightRows::Bf16(_)
        | WeightRows::Integers { .. } => false,
    }
}

/// [`product`] for weights of `E`: the AVX-512 tiles, or the AVX2 ones with the same sums.
fn widened<E: HostFloat>(
    weight: &[E],
    x: &[f32],
    tokens: usize,
    out: &mut [f32],
    accumulate: bool,
) -> bool {
    if tiles::<Widened<E>>(weight, x, tokens, out, accumulate) {
        return true;
    }
    let cols = x.len() / tokens.max(1);
    if !WidenedAvx2::<E>::supported() || !cols.is_multiple_of(WidenedAvx2::<E>::LANES) {
        return false;
    }
    AVX2_HALVES.with_borrow_mut(|laid_out| {
        let laid_out = laid_out.first(x.len());
        avx2_halves(x, cols, laid_out);
        tiles::<WidenedAvx2<E>>(weight, laid_out, tokens, out, accumulate)
    })
}

thread_local! {
    /// The prompt laid out by [`avx2_halves`], on the thread that starts the product.
    static AVX2_HALVES: std::cell::RefCell<CacheLines<f32>> =
        const { std::cell::RefCell::new(CacheLines::new()) };
}

/// `x`: `[tokens, cols]` into `out` with each token's chunks of columns ([`avx2_chunks`])
/// laid out for the AVX2 tiles' halves: the columns of lanes 0–7 of each block of 16 (its
/// first eight), then those of lanes 8–15. Each half then reads the tokens' values in one
/// run, where in place it read half of every line, twice: on Zen 3, 1.7B F16 prompts ran
/// 1.02–1.42× as fast in three alternated rounds on two cores, and a 3-layer file of that
/// width about 1.06× on one (docs/performance.md). Laying out the weight rows so too, a
/// copy per tile of rows, ran 135M prompts 0.84× as fast.
fn avx2_halves(x: &[f32], cols: usize, out: &mut [f32]) {
    for (row, out) in x.chunks_exact(cols).zip(out.chunks_exact_mut(cols)) {
        for chunk in avx2_chunks(cols) {
            let blocks = chunk.len() / 16;
            for side in 0..2 {
                for block in 0..blocks {
                    let from = chunk.start + 16 * block + 8 * side;
                    let to = chunk.start + (side * blocks + block) * 8;
                    out[to..to + 8].copy_from_slice(&row[from..from + 8]);
                }
            }
        }
    }
}

/// [`product`] for bf16 activations and weights, when the CPU has AVX512-BF16 and `cols` is
/// a multiple of 32.
///
/// # Panics
/// As [`product`].
pub fn bf16_product(
    weight: &[bf16],
    x: &[bf16],
    tokens: usize,
    out: &mut [f32],
    accumulate: bool,
) -> bool {
    tiles::<Bf16Pairs>(weight, x, tokens, out, accumulate)
}

/// The tiles of `O` over the whole product, when the CPU has `O`'s features.
fn tiles<O: Operands>(
    weight: &[O::Weight],
    x: &[O::Activation],
    tokens: usize,
    out: &mut [f32],
    accumulate: bool,
) -> bool {
    let Some(shape) = Shape::of(tokens, x.len(), weight.len(), out.len(), O::LANES) else {
        return false;
    };
    if !O::supported() {
        return false;
    }
    #[cfg(target_arch = "x86_64")]
    {
        let out = SharedOutput::new(out);
        let row_bytes = shape.cols * size_of::<O::Activation>();
        for block in token_blocks(tokens, row_bytes, O::TILE_TOKENS) {
            for_each_row_tile(
                shape.rows,
                O::TILE_ROWS,
                (block.len(), MIN_TILES_PER_RANGE),
                &|first_row| {
                    // The tile's weight rows stay in the first-level cache while the block passes.
                    for first_token in block.clone().step_by(O::TILE_TOKENS) {
                        // SAFETY: `supported()` checked the CPU's features. The tile reads rows
                        // of `x` and `weight` below `tokens` and `rows` (checked to fit), and
                        // writes elements of `out` in the columns of this thread's rows, for
                        // tokens of this block.
                        unsafe {
                            O::tile(weight, x, shape, (first_token, first_row), &out, accumulate)
                        };
                    }
                },
            );
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (weight, out, accumulate);
    true
}

/// What a tile multiplies: its operands' element types, and the kernel that loads and
/// multiplies them.
trait Operands {
    type Weight: Copy + Sync;
    type Activation: Copy + Sync;
    /// Columns per step: the columns must be a multiple of it.
    const LANES: usize;
    const TILE_TOKENS: usize = TILE_TOKENS;
    const TILE_ROWS: usize = TILE_ROWS;

    /// Whether this CPU has the kernel's features.
    fn supported() -> bool;

    /// The `Self::TILE_TOKENS × Self::TILE_ROWS` outputs from `(first_token, first_row)`.
    /// At the edges of `x` and `weight` the missing tokens and rows repeat the last one, and
    /// their sums are dropped.
    ///
    /// # Safety
    /// [`Operands::supported`] must hold; `x`, `weight` and `out` must fit `shape` with
    /// `cols` a multiple of [`Operands::LANES`], and no other thread may touch the tile's
    /// elements of `out`.
    #[cfg(target_arch = "x86_64")]
    unsafe fn tile(
        weight: &[Self::Weight],
        x: &[Self::Activation],
        shape: Shape,
        at: (usize, usize),
        out: &SharedOutput<f32>,
        accumulate: bool,
    );
}

/// f32 activations against weights of `E`, each widened to f32 in its register.
struct Widened<E>(std::marker::PhantomData<E>);

/// [`Widened`] on CPUs with AVX2 but not AVX-512: each output's sixteen lanes in two
/// registers, as the decode kernel holds them, so the sums have the same bits
/// ([`AVX2_TOKENS`] by [`AVX2_ROWS`]). It takes the activations as [`avx2_halves`] lays them
/// out.
struct WidenedAvx2<E>(std::marker::PhantomData<E>);

/// f32 activations in pairs of columns (`paired_columns`) against bf16 weights, 32 of them
/// widened by two instructions: the odd columns' by masking off each 32-bit word's low half,
/// the even ones' by shifting it up.
struct PairedBf16;

/// [`PairedBf16`] on CPUs with AVX2 but not AVX-512, with the same sums.
struct PairedBf16Avx2;

/// bf16 activations against bf16 weights, 32 pairs per instruction.
struct Bf16Pairs;

/// One tile's loop, the same for every kind of operand: `load_weight` and
/// `load_activation` read `lanes` columns from a pointer, `multiply_add` adds their
/// products into a vector of 16 f32 sums.
#[cfg(target_arch = "x86_64")]
macro_rules! tile_loop {
    (
        $weight:expr, $x:expr, $shape:expr, $at:expr, $out:expr, $accumulate:expr, $lanes:expr,
        load_weight: $load_weight:expr,
        load_activation: $load_activation:expr,
        multiply_add: $multiply_add:expr $(,)?
    ) => {{
        use std::arch::x86_64::*;
        let Shape { tokens, rows, cols } = $shape;
        let (first_token, first_row) = $at;
        let (weight, x) = ($weight, $x);
        let tokens_in: [_; TILE_TOKENS] = rows_from(x, first_token, tokens, cols);
        let rows_in: [_; TILE_ROWS] = rows_from(weight, first_row, rows, cols);
        let mut sums = [[_mm512_setzero_ps(); TILE_ROWS]; TILE_TOKENS];
        let mut c = 0;
        while c < cols {
            // SAFETY: c + lanes <= cols, and each pointer starts a row of `cols` values.
            unsafe {
                let values = tokens_in.map(|token| $load_activation(token.add(c)));
                for (j, row) in rows_in.iter().enumerate() {
                    let w = $load_weight(row.add(c));
                    for (sums, &v) in sums.iter_mut().zip(&values) {
                        sums[j] = $multiply_add(sums[j], v, w);
                    }
                }
            }
            c += $lanes;
        }
        // SAFETY: as the tile's caller guarantees.
        unsafe { store(totals(sums), $shape, $at, $out, $accumulate) };
    }};
}

/// Each of a tile's sixteen-lane sums, ended with [`sum_of_sixteen`].
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,avx512vl")]
fn totals<const T: usize, const R: usize>(
    sums: [[std::arch::x86_64::__m512; R]; T],
) -> [[f32; R]; T] {
    use std::arch::x86_64::*;
    sums.map(|sums| {
        sums.map(|sum| {
            let high = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(sum)));
            sum_of_sixteen(_mm512_castps512_ps256(sum), high)
        })
    })
}

/// Pointers to the `N` rows of `cols` values from row `first` of `values`, which holds
/// `count` rows; past the last, the last again (a tile at the edge drops those sums).
#[cfg(target_arch = "x86_64")]
fn rows_from<T, const N: usize>(
    values: &[T],
    first: usize,
    count: usize,
    cols: usize,
) -> [*const T; N] {
    std::array::from_fn(|i| values[(first + i).min(count - 1) * cols..].as_ptr())
}

/// Writes a tile's totals (`totals[i][j]` for token `first_token + i` and weight row
/// `first_row + j`, `at` being the pair) to `out`, or adds them to it when `accumulate`;
/// those past the last token or row are dropped.
///
/// # Safety
/// `out` must fit `shape`, and no other thread may touch the tile's elements of it.
#[cfg(target_arch = "x86_64")]
unsafe fn store<const T: usize, const R: usize>(
    totals: [[f32; R]; T],
    shape: Shape,
    (first_token, first_row): (usize, usize),
    out: &SharedOutput<f32>,
    accumulate: bool,
) {
    let Shape { tokens, rows, .. } = shape;
    let write = |token: usize, row: usize, total: f32| {
        // SAFETY: (token, row) lies inside `out`, and the caller gives this tile's elements
        // to this thread alone.
        unsafe {
            let y = out.at(token * rows + row);
            *y = if accumulate { *y + total } else { total };
        }
    };
    if first_token + T <= tokens && first_row + R <= rows {
        // Loops of fixed length for all but the edge tiles: the compiler writes them out,
        // where with the edge's length it called `memcpy` for every row of the tile.
        for (i, totals) in totals.iter().enumerate() {
            for (j, &total) in totals.iter().enumerate() {
                write(first_token + i, first_row + j, total);
            }
        }
    } else {
        for (token, totals) in (first_token..tokens).zip(totals) {
            for (row, total) in (first_row..rows).zip(totals) {
                write(token, row, total);
            }
        }
    }
}

impl<E: HostFloat> Operands for Widened<E> {
    type Weight = E;
    type Activation = f32;
    const LANES: usize = 16;

    fn supported() -> bool {
        #[cfg(target_arch = "x86_64")]
        return crate::model::cpu::features::cpu().avx512;
        #[cfg(not(target_arch = "x86_64"))]
        false
    }

    /// With AVX-512 VL: the sums' last steps are 256- and 128-bit, and without it only the
    /// sixteen registers those reach could hold them, so eight of the 24 lived on the stack.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    unsafe fn tile(
        weight: &[E],
        x: &[f32],
        shape: Shape,
        at: (usize, usize),
        out: &SharedOutput<f32>,
        accumulate: bool,
    ) {
        tile_loop!(
            weight, x, shape, at, out, accumulate, Self::LANES,
            load_weight: E::load16,
            load_activation: _mm512_loadu_ps,
            multiply_add: fused_multiply_add,
        )
    }
}

impl<E: HostFloat> Operands for WidenedAvx2<E> {
    type Weight = E;
    type Activation = f32;
    const LANES: usize = 16;
    const TILE_TOKENS: usize = AVX2_TOKENS;
    const TILE_ROWS: usize = AVX2_ROWS;

    fn supported() -> bool {
        #[cfg(target_arch = "x86_64")]
        return crate::model::cpu::features::cpu().avx2;
        #[cfg(not(target_arch = "x86_64"))]
        false
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn tile(
        weight: &[E],
        x: &[f32],
        shape: Shape,
        at: (usize, usize),
        out: &SharedOutput<f32>,
        accumulate: bool,
    ) {
        let Shape { tokens, rows, cols } = shape;
        let (first_token, first_row) = at;
        let tokens_in = rows_from(x, first_token, tokens, cols);
        let rows_in = rows_from(weight, first_row, rows, cols);
        let mut sums = [[[std::arch::x86_64::_mm256_setzero_ps(); AVX2_ROWS]; AVX2_TOKENS]; 2];
        for chunk in avx2_chunks(cols) {
            for (side, sums) in sums.iter_mut().enumerate() {
                // SAFETY: the pointers start rows of `cols` values, a multiple of 16, as the
                // chunk's start and end are.
                unsafe { avx2_half(&tokens_in, &rows_in, chunk.clone(), side, sums) };
            }
        }
        let [low, high] = sums;
        // SAFETY: as the tile's caller guarantees.
        unsafe { store(avx2_totals(low, high), shape, at, out, accumulate) };
    }
}

/// Tokens and weight rows of an AVX2 tile. Its sums are those of an output's low eight lanes
/// over a chunk of columns ([`AVX2_CHUNK`]), then its high eight's (as `matvec`'s decode
/// kernel holds them, in two registers), so that ten outputs' sums of one half, two tokens'
/// values, a weight vector and (for bf16 pairs) a mask fit in the sixteen registers, and no
/// sum waits on its last multiply-add within a step. Two tokens by five rows read each
/// token's vector for five products where three by three read it for three: on Zen 3, whose
/// second-level cache fed the tokens' lines slower than its two FMA units used them, 1.7B
/// BF16 prompts ran 1.10× as fast and F16 1.08× (docs/performance.md). Summed both halves
/// at once, 3 × 2 kept all their sums in registers on natural columns, but bf16 pairs' mask
/// put two of them on the stack, and that ran 0.97× as fast as the natural order.
const AVX2_TOKENS: usize = 2;
const AVX2_ROWS: usize = 5;

/// Columns of which an AVX2 tile sums both halves before it goes on to the next. 1024 keep
/// its two tokens' values (8 KiB) and five 16-bit weight rows (10 KiB) within 18 KiB, so that
/// the second half finds the lines the first half read in a 32 KiB first-level cache (Zen
/// 3's): the halves over whole rows of 2048 columns (36 KiB) read every line from the
/// second-level cache twice. A multiple of [`PAIRED_COLUMNS`]; each lane's sum still takes
/// its columns in order, so the bits are the same.
const AVX2_CHUNK: usize = 1024;

/// The chunks of [`AVX2_CHUNK`] columns of `0..end`, in order.
fn avx2_chunks(end: usize) -> impl Iterator<Item = std::ops::Range<usize>> {
    (0..end)
        .step_by(AVX2_CHUNK)
        .map(move |start| start..(start + AVX2_CHUNK).min(end))
}

/// The sums of an AVX2 tile's half `side` of the lanes (0: lanes 0–7, 1: lanes 8–15), going
/// on from those in `total` over `columns` in column order, sixteen at a time: the weights'
/// values where they lie, the tokens' as [`avx2_halves`] lays out a chunk (16 columns are
/// laid out in column order). Summed in a local copy, unlike [`paired_half`]'s: inlined in
/// [`WidenedAvx2`]'s tile, adding into `total` in place ran F16 prompts 0.91–0.95× as fast
/// on Zen 3.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C; every pointer must start a row holding `columns`,
/// whose length is a multiple of 16.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn avx2_half<E: HostFloat>(
    tokens_in: &[*const f32; AVX2_TOKENS],
    rows_in: &[*const E; AVX2_ROWS],
    columns: std::ops::Range<usize>,
    side: usize,
    total: &mut [[std::arch::x86_64::__m256; AVX2_ROWS]; AVX2_TOKENS],
) {
    use std::arch::x86_64::*;
    let mut sums = *total;
    let half = columns.len() / 2;
    let tokens_in = tokens_in.map(|token| token.wrapping_add(columns.start + side * half));
    for (i, c) in columns.step_by(16).enumerate() {
        let at = c + 8 * side;
        // SAFETY: at + 8 <= the columns' end, in every row, and 8 · i + 8 <= half (the
        // caller's).
        unsafe {
            let values = tokens_in.map(|token| _mm256_loadu_ps(token.add(8 * i)));
            for (j, row) in rows_in.iter().enumerate() {
                let w = E::load8(row.add(at));
                for (sums, &v) in sums.iter_mut().zip(&values) {
                    sums[j] = _mm256_fmadd_ps(v, w, sums[j]);
                }
            }
        }
    }
    *total = sums;
}

/// Each output of an AVX2 tile from its two halves' sums, ended with [`sum_of_sixteen`].
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2")]
fn avx2_totals(
    low: [[std::arch::x86_64::__m256; AVX2_ROWS]; AVX2_TOKENS],
    high: [[std::arch::x86_64::__m256; AVX2_ROWS]; AVX2_TOKENS],
) -> [[f32; AVX2_ROWS]; AVX2_TOKENS] {
    std::array::from_fn(|t| std::array::from_fn(|j| sum_of_sixteen(low[t][j], high[t][j])))
}

impl Operands for PairedBf16 {
    type Weight = bf16;
    type Activation = f32;
    const LANES: usize = 16;

    fn supported() -> bool {
        Widened::<bf16>::supported()
    }

    /// With AVX-512 VL, as [`Widened`]'s tile. Each whole block of 32 columns takes its even
    /// columns, then its odd ones; a last 16 columns are widened as [`Widened`] widens them.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    unsafe fn tile(
        weight: &[bf16],
        x: &[f32],
        shape: Shape,
        at: (usize, usize),
        out: &SharedOutput<f32>,
        accumulate: bool,
    ) {
        use std::arch::x86_64::*;
        let Shape { tokens, rows, cols } = shape;
        let (first_token, first_row) = at;
        let tokens_in: [_; TILE_TOKENS] = rows_from(x, first_token, tokens, cols);
        let rows_in: [_; TILE_ROWS] = rows_from(weight, first_row, rows, cols);
        let mut sums = [[_mm512_setzero_ps(); TILE_ROWS]; TILE_TOKENS];
        let high_halves = _mm512_set1_epi32(0xFFFF_0000_u32 as i32);
        let paired = cols / PAIRED_COLUMNS * PAIRED_COLUMNS;
        let mut c = 0;
        while c < paired {
            // The even columns' products, then the odd ones': each weight row is read twice
            // (from the first-level cache), so that four tokens' values, the tile's sums
            // and one weight vector fit in the registers.
            for odd in [false, true] {
                // SAFETY: c + 32 <= cols, and each pointer starts a row of `cols` values.
                unsafe {
                    let at = c + if odd { PAIRED_COLUMNS / 2 } else { 0 };
                    let values = tokens_in.map(|token| _mm512_loadu_ps(token.add(at)));
                    for (j, row) in rows_in.iter().enumerate() {
                        let pairs = _mm512_loadu_si512(row.add(c).cast());
                        let w = _mm512_castsi512_ps(match odd {
                            true => _mm512_and_si512(pairs, high_halves),
                            false => _mm512_slli_epi32::<16>(pairs),
                        });
                        for (sums, &v) in sums.iter_mut().zip(&values) {
                            sums[j] = _mm512_fmadd_ps(v, w, sums[j]);
                        }
                    }
                }
            }
            c += PAIRED_COLUMNS;
        }
        if c < cols {
            // SAFETY: c + 16 == cols, a multiple of 16.
            unsafe {
                let values = tokens_in.map(|token| _mm512_loadu_ps(token.add(c)));
                for (j, row) in rows_in.iter().enumerate() {
                    let w = half::bf16::load16(row.add(c));
                    for (sums, &v) in sums.iter_mut().zip(&values) {
                        sums[j] = _mm512_fmadd_ps(v, w, sums[j]);
                    }
                }
            }
        }
        // SAFETY: as the tile's caller guarantees.
        unsafe { store(totals(sums), shape, at, out, accumulate) };
    }
}

impl Operands for PairedBf16Avx2 {
    type Weight = bf16;
    type Activation = f32;
    const LANES: usize = 16;
    const TILE_TOKENS: usize = AVX2_TOKENS;
    const TILE_ROWS: usize = AVX2_ROWS;

    fn supported() -> bool {
        WidenedAvx2::<bf16>::supported()
    }

    /// [`WidenedAvx2`]'s tile in [`PairedBf16`]'s order: lanes 0–7 of an output take the
    /// pairs of each block's first sixteen columns, lanes 8–15 the rest's.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn tile(
        weight: &[bf16],
        x: &[f32],
        shape: Shape,
        at: (usize, usize),
        out: &SharedOutput<f32>,
        accumulate: bool,
    ) {
        let Shape { tokens, rows, cols } = shape;
        let (first_token, first_row) = at;
        let tokens_in = rows_from(x, first_token, tokens, cols);
        let rows_in = rows_from(weight, first_row, rows, cols);
        let paired = cols / PAIRED_COLUMNS * PAIRED_COLUMNS;
        let (tokens_in, rows_in) = (&tokens_in, &rows_in);
        let mut low = [[std::arch::x86_64::_mm256_setzero_ps(); AVX2_ROWS]; AVX2_TOKENS];
        let mut high = low;
        // SAFETY: the pointers start rows of `cols` values; the blocks of 32 before `paired`
        // are whole, and the columns after them 16 or none.
        unsafe {
            for chunk in avx2_chunks(paired) {
                paired_half::<0>(tokens_in, rows_in, chunk.clone(), &mut low);
                paired_half::<1>(tokens_in, rows_in, chunk, &mut high);
            }
            if paired < cols {
                avx2_half(tokens_in, rows_in, paired..cols, 0, &mut low);
                avx2_half(tokens_in, rows_in, paired..cols, 1, &mut high);
            }
        }
        // SAFETY: as the tile's caller guarantees.
        unsafe { store(avx2_totals(low, high), shape, at, out, accumulate) };
    }
}

/// Half `SIDE` of [`PairedBf16Avx2`]'s sums (0: lanes 0–7), going on in `sums` over the
/// whole blocks of 32 in `columns`. A function of its own per half, so that each half's loop
/// gets the registers to itself: inlined in the tile, the second half's loop kept one of its
/// sums on the stack, stored and loaded again at every step. It adds into `sums` itself: an
/// array passed in and returned cost two `memcpy` calls a tile, which at SmolLM2-135M's 576
/// columns is a tile's tenth; summed in a local copy, the compiler loaded each row's pairs
/// once for both passes, and holding five of them put a sum on the stack.
///
/// # Safety
/// The CPU must have AVX2 and FMA; every pointer must start a row holding `columns`, whose
/// start and end are multiples of [`PAIRED_COLUMNS`].
#[cfg(target_arch = "x86_64")]
#[inline(never)]
#[target_feature(enable = "avx2,fma")]
unsafe fn paired_half<const SIDE: usize>(
    tokens_in: &[*const f32; AVX2_TOKENS],
    rows_in: &[*const bf16; AVX2_ROWS],
    columns: std::ops::Range<usize>,
    sums: &mut [[std::arch::x86_64::__m256; AVX2_ROWS]; AVX2_TOKENS],
) {
    use std::arch::x86_64::*;
    let high_halves = _mm256_set1_epi32(0xFFFF_0000_u32 as i32);
    for c in columns.step_by(PAIRED_COLUMNS) {
        for odd in [false, true] {
            let at = c + 8 * SIDE + if odd { PAIRED_COLUMNS / 2 } else { 0 };
            // SAFETY: c + 32 <= the columns' end, in every row (the caller's).
            unsafe {
                let values = tokens_in.map(|token| _mm256_loadu_ps(token.add(at)));
                for (j, row) in rows_in.iter().enumerate() {
                    let pairs = _mm256_loadu_si256(row.add(c + 16 * SIDE).cast());
                    let w = _mm256_castsi256_ps(match odd {
                        true => _mm256_and_si256(pairs, high_halves),
                        false => _mm256_slli_epi32::<16>(pairs),
                    });
                    for (sums, &v) in sums.iter_mut().zip(&values) {
                        sums[j] = _mm256_fmadd_ps(v, w, sums[j]);
                    }
                }
            }
        }
    }
}

impl Operands for Bf16Pairs {
    type Weight = bf16;
    type Activation = bf16;
    const LANES: usize = 32;

    fn supported() -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            crate::model::cpu::features::cpu().avx512_bf16
        }
        #[cfg(not(target_arch = "x86_64"))]
        false
    }

    /// With AVX-512 VL, as [`Widened`]'s tile.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
    unsafe fn tile(
        weight: &[bf16],
        x: &[bf16],
        shape: Shape,
        at: (usize, usize),
        out: &SharedOutput<f32>,
        accumulate: bool,
    ) {
        tile_loop!(
            weight, x, shape, at, out, accumulate, Self::LANES,
            load_weight: bf16_pairs,
            load_activation: bf16_pairs,
            multiply_add: _mm512_dpbf16_ps,
        )
    }
}

/// `sum + v · w`, in the argument order of `_mm512_dpbf16_ps`.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f")]
fn fused_multiply_add(
    sum: std::arch::x86_64::__m512,
    v: std::arch::x86_64::__m512,
    w: std::arch::x86_64::__m512,
) -> std::arch::x86_64::__m512 {
    std::arch::x86_64::_mm512_fmadd_ps(v, w, sum)
}

/// 32 bf16 values from `at`, as the instruction's operand type.
///
/// # Safety
/// `at` must point to 32 readable values.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn bf16_pairs(at: *const bf16) -> std::arch::x86_64::__m512bh {
    use std::arch::x86_64::*;
    // SAFETY: as the caller guarantees; both types are 64-byte vectors.
    unsafe { std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(at.cast())) }
}

#[cfg(test)]
mod tests {
    use half::{bf16, f16};

    use super::{
        AVX2_CHUNK, Bf16Pairs, Operands, PairedBf16, PairedBf16Avx2, Widened, WidenedAvx2,
        avx2_halves, bf16_product, product, tiles,
    };
    use crate::model::cpu::host::HostFloat;
    use crate::model::cpu::matvec::{matvecs, paired_columns};
    use crate::model::cpu::test_values as values;
    use crate::model::cpu::weights::WeightRows;

    /// Checks `got` against an f64 reference `x Wᵀ` (+ `base`) of the values as stored.
    fn check(got: &[f32], x: &[f32], weight: &[f32], base: Option<&[f32]>, tokens: usize) {
        let cols = x.len() / tokens;
        let rows = weight.len() / cols;
        for t in 0..tokens {
            for r in 0..rows {
                let dot: f64 = (0..cols)
                    .map(|c| f64::from(x[t * cols + c]) * f64::from(weight[r * cols + c]))
                    .sum();
                let want = dot + base.map_or(0.0, |base| f64::from(base[t * rows + r]));
                let got = f64::from(got[t * rows + r]);
                assert!(
                    (got - want).abs() < 1e-4 * (1.0 + want.abs()),
                    "{tokens}x{rows}x{cols} ({t}, {r}): {got} vs {want}"
                );
            }
        }
    }

    /// Each float weight type against f32 activations, and bf16 pairs; shapes whose tokens
    /// and rows leave partial tiles, columns of one and of many vectors, with and without
    /// accumulating.
    #[test]
    fn products_equal_a_float64_reference_for_every_operand_type() {
        for (tokens, rows, cols) in [(1, 1, 32), (5, 7, 64), (4, 6, 576), (13, 100, 96)] {
            let weight = values(rows * cols, 1);
            let halves: Vec<f16> = weight.iter().map(|&w| f16::from_f32(w)).collect();
            let brains: Vec<bf16> = weight.iter().map(|&w| bf16::from_f32(w)).collect();
            let widen = |w: &[f32]| w.to_vec();
            let x: Vec<f32> = values(tokens * cols, 2).iter().map(|v| v * 4.0).collect();
            let x_brains: Vec<bf16> = x.iter().map(|&v| bf16::from_f32(v)).collect();
            let base = values(tokens * rows, 3);
            for accumulate in [false, true] {
                let start = || match accumulate {
                    true => base.clone(),
                    false => vec![f32::NAN; tokens * rows],
                };
                let base = accumulate.then_some(&base[..]);
                let stored: [(WeightRows<'_>, Vec<f32>); 3] = [
                    (WeightRows::F32(&weight), widen(&weight)),
                    (
                        WeightRows::F16(&halves),
                        halves.iter().map(|w| w.to_f32()).collect(),
                    ),
                    (
                        WeightRows::Bf16(&brains),
                        brains.iter().map(|w| w.to_f32()).collect(),
                    ),
                ];
                for (rows_of, widened) in stored {
                    let mut out = start();
                    let ran = product(rows_of, &x, tokens, &mut out, accumulate);
                    assert_eq!(
                        ran,
                        WidenedAvx2::<f32>::supported(),
                        "runs wherever the CPU has AVX2"
                    );
                    if ran {
                        check(&out, &x, &widened, base, tokens);
                    }
                }
                let mut out = start();
                let ran = bf16_product(&brains, &x_brains, tokens, &mut out, accumulate);
                assert_eq!(
                    ran,
                    Bf16Pairs::supported(),
                    "runs wherever the CPU has AVX512-BF16"
                );
                if ran {
                    let x: Vec<f32> = x_brains.iter().map(|v| v.to_f32()).collect();
                    let w: Vec<f32> = brains.iter().map(|w| w.to_f32()).collect();
                    check(&out, &x, &w, base, tokens);
                }
            }
        }
    }

    /// The AVX2 tiles give the AVX-512 tiles' bits, and every token the bits the decode
    /// kernel gives it alone: neither the CPU's instruction set nor the tokens read with it
    /// change a token's outputs. bf16 weights take the activations in pairs of columns, in
    /// whole blocks of 32 and then a last 16; the AVX2 tiles' chunks are two whole ones and
    /// one of 592 columns.
    #[test]
    fn both_tiles_sum_each_output_as_the_decode_kernel_does() {
        fn check<E: HostFloat, Narrow, Wide>(
            weight: &[E],
            rows: WeightRows<'_>,
            [narrow_order, wide_order]: [Order; 2],
        ) where
            Narrow: Operands<Weight = E, Activation = f32>,
            Wide: Operands<Weight = E, Activation = f32>,
        {
            let (tokens, cols) = (7, COLS);
            let rows_count = weight.len() / cols;
            let x = values(tokens * cols, 2);
            let mut decoded = vec![0.0; tokens * rows_count];
            for (x, out) in x.chunks(cols).zip(decoded.chunks_mut(rows_count)) {
                matvecs(rows, x, 1, out);
            }
            let mut narrow = vec![f32::NAN; tokens * rows_count];
            assert_eq!(
                tiles::<Narrow>(weight, &narrow_order(&x, cols), tokens, &mut narrow, false),
                Narrow::supported()
            );
            let mut wide = vec![f32::NAN; tokens * rows_count];
            assert_eq!(
                tiles::<Wide>(weight, &wide_order(&x, cols), tokens, &mut wide, false),
                Wide::supported()
            );
            let bits = |v: &[f32]| v.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            if Narrow::supported() {
                assert_eq!(bits(&narrow), bits(&decoded), "AVX2 tiles against decode");
            }
            if Wide::supported() {
                assert_eq!(bits(&wide), bits(&decoded), "AVX-512 tiles against decode");
            }
        }
        type Order = fn(&[f32], usize) -> Vec<f32>;
        const COLS: usize = 2 * AVX2_CHUNK + 592;
        let weight = values(13 * COLS, 1);
        let brains: Vec<bf16> = weight.iter().map(|&w| bf16::from_f32(w)).collect();
        let as_they_are: Order = |x, _| x.to_vec();
        let in_halves: Order = |x, cols| {
            let mut laid_out = vec![f32::NAN; x.len()];
            avx2_halves(x, cols, &mut laid_out);
            laid_out
        };
        check::<_, WidenedAvx2<f32>, Widened<f32>>(
            &weight,
            WeightRows::F32(&weight),
            [in_halves, as_they_are],
        );
        let paired: Order = |x, cols| paired_columns(x, cols).to_vec();
        check::<_, PairedBf16Avx2, PairedBf16>(&brains, WeightRows::Bf16(&brains), [paired; 2]);
    }

    #[test]
    fn columns_that_are_not_whole_vectors_are_declined() {
        let (tokens, rows, cols) = (2, 3, 40);
        let weight = vec![1.0; rows * cols];
        let x = vec![1.0; tokens * cols];
        let mut out = vec![0.0; tokens * rows];
        assert!(!product(
            WeightRows::F32(&weight),
            &x,
            tokens,
            &mut out,
            false
        ));
        let brains = vec![bf16::ONE; rows * cols];
        let x = vec![bf16::ONE; tokens * cols];
        assert!(!bf16_product(&brains, &x, tokens, &mut out, false));
        assert_eq!(out, vec![0.0; tokens * rows]);
    }
}
