//! The prompt tile for CPUs with AVX512-VNNI: sixteen tokens side by side in the lanes of a
//! vector, each pair of a weight row's values broadcast to all of them, so that a block of
//! 32 values is 16 multiply-adds into integer sums (`vpdpwssd`), then one conversion and one
//! scaling per block. A tile of rows by a few tokens converted and scaled every 32 products,
//! and those two instructions took as long as the products themselves.
//!
//! CPUs without AVX-512 VNNI run the same tile on 256-bit vectors ([`Lanes::Avx2`]): the same
//! products summed in the same order, so each output gets the same bits on either; with
//! AVX-VNNI a pair's products are one `vpdpwssd` again, without it a `vpmaddwd` and an add.
//!
//! Putting tokens, not weight rows, in the lanes costs no transposing of weights: the
//! rounded prompt is laid out once per product ([`TokenPairs`]) and the weight rows stay as
//! they are, widened to 16 bits per tile of rows.
//!
//! The columns are taken [`CHUNK_COLS`] at a time, every tile of a band passing over one
//! chunk of the prompt before the next, so that the chunk stays in the L2 cache: a 128-token
//! prompt is 2 MiB of pairs at 8192 columns (a feed-forward's down projection at 1.7B), more
//! than the cache, and was read from memory again for every tile of rows. Each output's sum
//! goes on from where the previous chunk left it, in the same order of blocks as without
//! chunks. For the same reason a product added onto the output (`accumulate`: the residual)
//! starts from the output's value and adds the blocks to it.
//!
//! That order is every integer kernel's (the decode kernels in `matvec` sum so too): each
//! block's term (its integer sum converted, times the token's and the row's scales
//! multiplied, plus its offset term in one rounding) added to the output in turn. A token's
//! outputs are then the same bits however many tokens it is read with, so a prompt read as
//! cache and remainder gives the logits it gives whole.
//!
//! A band of [`BAND_TILES`] tiles keeps its outputs' running sums in the tile's own layout,
//! a vector of tokens per row ([`Band`]), where the tile adds each block's terms to them,
//! and moves them to the output's, a token's rows side by side, once per product. The tile
//! wrote the output element by element, sixteen tokens a row apart: at 2048 rows every one
//! of them fell in the same set of the L1 cache, and those writes took a fifth of a Q6_K
//! prompt's tile time.
//!
//! The weights' offsets (Q4_1, Q4_K, Q5_K) are summed in the tile, `offset · Σ x` per block
//! beside the block's product, where a pass after the tile read and wrote every output
//! again: 20% of a Q4_K product's time.

use std::arch::x86_64::*;
use std::ops::Range;

use super::{BLOCK, HALF_BLOCK, SCRATCH, Scratch, Shape, TokenBlocks, Weights};
use crate::model::cpu::cache_lines::CacheLines;
use crate::model::cpu::math::transpose_8x8;
use crate::model::cpu::matvec::{BlockInts, STEPPED_LARGEST, read_stepped};
use crate::model::cpu::threads::{SharedOutput, split_ranges_of, split_rows};
use crate::model::cpu::weights::{Factors, INTERLEAVED_ROWS, Ints};
use crate::model::cpu::{features, grow};

/// Tokens in the lanes of one vector (of two, on 256 bits).
pub const LANES: usize = 16;

/// Weight rows of a tile: each vector of tokens read from the L2 cache serves twelve rows'
/// products. With six (whose float sums fitted in registers beside the integer ones),
/// 1.7B-shaped Q4_K_M, Q6_K and Q8_0 files' prompts ran at 0.98–0.99× this speed (medians
/// of four alternated rounds, Intel Xeon with AVX-512).
const ROWS: usize = 12;

/// Weight rows the 256-bit tile takes at once, half a tile: their twelve integer sums, a
/// group's two vectors of tokens and a row's broadcast pair take 15 of AVX2's sixteen
/// registers (a `vpmaddwd`'s products the last), the float sums staying in the [`Band`] as
/// [`tile_at`]'s do. Against three rows with the float sums in registers, 1.7B-shaped
/// files' prompts ran 1.09× (Q4_K_M) and 1.10× (Q6_K) as fast with AVX-VNNI, 1.01× and 1.02×
/// without (Intel Xeon capped, medians of alternated runs).
const ROWS_256: usize = 6;

const _: () = assert!(
    ROWS.is_multiple_of(ROWS_256),
    "a tile is whole steps of 256-bit rows"
);

/// Which vectors the tile runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lanes {
    /// AVX-512 with VNNI: sixteen tokens to a vector.
    Avx512,
    /// AVX2: eight tokens to a vector, with AVX-VNNI's dot products where `vnni`.
    Avx2 { vnni: bool },
}

impl Lanes {
    /// The widest this CPU has: AVX-512 without VNNI takes the 256-bit tile, whose products
    /// it has, and gets the same bits.
    pub fn for_this_cpu() -> Self {
        let cpu = features::cpu();
        match cpu.avx512_vnni {
            true => Self::Avx512,
            false => Self::Avx2 { vnni: cpu.avx_vnni },
        }
    }

    /// Every compilation this CPU runs.
    #[cfg(test)]
    pub fn all_for_this_cpu() -> Vec<Self> {
        let cpu = features::cpu();
        let mut all = vec![Self::Avx2 { vnni: false }];
        if cpu.avx_vnni {
            all.push(Self::Avx2 { vnni: true });
        }
        if cpu.avx512_vnni {
            all.push(Self::Avx512);
        }
        all
    }
}

/// Groups of [`LANES`] tokens of a tile: the 12 × 2 integer sums, the two vectors of tokens
/// and a row's broadcast pair take 27 of AVX-512's 32 registers, and 128 tokens split into
/// tiles with no group left over. The float sums stay in the [`Band`], in the L1 cache.
const GROUPS: usize = 2;

/// Columns of a chunk: 128 tokens' pairs of them are 512 KiB, a quarter of the L2 cache. In
/// a C replica of the tile at 8192 columns, 2048 and 4096 ran 1.3 times as fast as all at
/// once, 512 no faster.
const CHUNK_COLS: usize = 2048;

/// Tiles of rows whose sums a [`Band`] holds: the band's weights are unpacked once per
/// chunk, as before, and the prompt's chunk is read once per band from the L2 cache. Four
/// tiles of twelve rows are the 48 that eight of six were.
const BAND_TILES: usize = 4;

/// Words from one of a tile's widened rows to the next, whatever the chunk's width: at a
/// stride known when compiling, every row's pair is addressed from one register (twelve row
/// pointers did not fit beside the loop's others, and were read from the stack each pair).
/// The 32 words past a whole chunk put the rows' lines in different sets of the L1 cache.
const WORD_STRIDE: usize = CHUNK_COLS + 32;

/// How far ahead of the pair of columns it multiplies the tile asks for the prompt's, which
/// come from the L2 cache: without it the tile waited on them, and a Qwen3-1.7B Q4_K_M
/// prompt ran at 55.8 tok/s instead of 61.6 (medians of three alternated runs; 8 and 48
/// pairs ahead were as fast as 16). The weights' rows are in the L1 cache already.
const PREFETCH_PAIRS: usize = 16;

/// `out = X Wᵀ` (or `out += X Wᵀ` when `accumulate`) for `x` of `shape`, on `lanes`.
///
/// # Safety
/// The CPU must have what `lanes` names (AVX-512 F, BW and VNNI; AVX2 and FMA, and AVX-VNNI
/// where `vnni`); `weight` must be of `shape` (as `super::multiply` checks it).
pub unsafe fn multiply(
    lanes: Lanes,
    weight: Weights<'_>,
    x: &[f32],
    shape: Shape,
    out: &mut [f32],
    accumulate: bool,
) {
    let Shape { tokens, rows, cols } = shape;
    let stepped = Stepped::of(weight);
    let (x, block) = match (stepped, weight.halves) {
        (Some(_), _) => (BlockInts::within(x, BLOCK, STEPPED_LARGEST), BLOCK),
        (None, true) => (BlockInts::of(x, HALF_BLOCK), HALF_BLOCK),
        (None, false) => (BlockInts::of(x, BLOCK), BLOCK),
    };
    let by_block = TokenBlocks::of(&x, tokens, weight.offsets.is_some());
    let pairs = TokenPairs::of(&x.values, cols);
    let out = SharedOutput::new(out);
    let weight_blocks = cols / if weight.halves { HALF_BLOCK } else { BLOCK };
    macro_rules! compiled {
        ($tile_at:ident) => {
            match (block == HALF_BLOCK, weight.offsets.is_some()) {
                (false, false) => $tile_at::<false, false> as TileAt,
                (false, true) => $tile_at::<false, true>,
                (true, false) => $tile_at::<true, false>,
                (true, true) => $tile_at::<true, true>,
            }
        };
    }
    let tile_at = match lanes {
        Lanes::Avx512 => compiled!(tile_at),
        Lanes::Avx2 { vnni: false } => compiled!(tile_at_avx2),
        Lanes::Avx2 { vnni: true } => compiled!(tile_at_avx_vnni),
    };
    let groups = pairs.groups();
    // How many rows ahead of the row it widens the product asks the L2 cache for its
    // weights: the next tile's, or for interleaved rows the next group's, whose rows each
    // ask for a share of their group's lines (`Ints::stored`), so that a group's lines are
    // asked for over the group before it. Sixteen rows ahead made a 1.7B Q5_K_M file's
    // prompts (not interleaved) 0.96–1.00× as fast.
    let rows_ahead = match weight.values {
        Ints::Interleaved { .. }
        | Ints::SixBitsInterleaved { .. }
        | Ints::FiveBitsInterleaved { .. }
        | Ints::BytesInterleaved { .. } => INTERLEAVED_ROWS,
        _ => ROWS,
    };
    // A band a range: each takes tens of microseconds or more, and larger ranges left the
    // thread that finished first waiting out another's last one.
    split_ranges_of(rows.div_ceil(ROWS), BAND_TILES, &|tiles: Range<usize>| {
        SCRATCH.with_borrow_mut(|scratch| {
            let Scratch {
                words,
                scales,
                offsets,
                sums,
            } = scratch;
            for first_tile in tiles.clone().step_by(BAND_TILES) {
                let band_tiles = first_tile..(first_tile + BAND_TILES).min(tiles.end);
                let band_rows = band_tiles.start * ROWS..(band_tiles.end * ROWS).min(rows);
                let mut band = Band::new(sums, band_rows.start, groups);
                match accumulate {
                    // SAFETY: the band's rows are this range's, which no other touches.
                    true => unsafe { band.load(&out, shape, band_rows.clone()) },
                    false => band.zero(),
                }
                // The band's factors in f32, once for all its chunks and tiles: widened
                // for each tile of each chunk, factors laid out by block (a group of
                // sixteen rows widened for a tile of six) made the 1.7B Q4_K_M file's
                // prompts 0.92–0.97× as fast.
                let band_blocks = band_rows.start * weight_blocks..band_rows.end * weight_blocks;
                let band_scales = match stepped {
                    Some(stepped) => stepped.bases(band_blocks.clone(), scales),
                    None => weight.scales.f32s(band_blocks.clone(), scales),
                };
                let band_offsets =
                    (weight.offsets).map(|factors| factors.f32s(band_blocks.clone(), offsets));
                for first_col in (0..cols).step_by(CHUNK_COLS) {
                    let chunk_cols = CHUNK_COLS.min(cols - first_col);
                    let chunk = Chunk {
                        blocks: first_col / block..(first_col + chunk_cols) / block,
                    };
                    for first_row in band_rows.clone().step_by(ROWS) {
                        let tile_rows = first_row..(first_row + ROWS).min(rows);
                        grow(words, ROWS * WORD_STRIDE);
                        for (row, words) in
                            tile_rows.clone().zip(words.chunks_exact_mut(WORD_STRIDE))
                        {
                            let start = row * cols + first_col;
                            if row + rows_ahead < rows {
                                let next = start + rows_ahead * cols;
                                prefetch(weight.values.stored(next..next + chunk_cols));
                            }
                            let steps = stepped.map(|stepped| {
                                &stepped.steps[start / HALF_BLOCK..][..chunk_cols / HALF_BLOCK]
                            });
                            let words = &mut words[..chunk_cols];
                            // SAFETY: the CPU has the features of `lanes` (the caller's
                            // promise), AVX2 among them; a chunk is whole blocks of one
                            // row, as `cols` is.
                            unsafe {
                                match (weight.values, steps, lanes) {
                                    (Ints::Bytes(values), None, Lanes::Avx512) => {
                                        widen(&values[start..][..chunk_cols], words)
                                    }
                                    (values, ..) => values.widen(start, steps, words),
                                }
                            };
                        }
                        let tile = TileRows {
                            words: &words[..],
                            scales: rows_of_band(band_scales, &band_rows, &tile_rows),
                            offsets: band_offsets
                                .map(|offsets| rows_of_band(offsets, &band_rows, &tile_rows)),
                            first: first_row,
                        };
                        let running = band.tile(first_row);
                        for first_token in (0..tokens).step_by(GROUPS * LANES) {
                            // SAFETY: the CPU has the features (the caller's promise),
                            // the tile holds its rows of the chunk, and the band holds
                            // the tile's rows for every group of the prompt.
                            unsafe {
                                let by = &by_block;
                                tile_at(&tile, &chunk, &pairs, by, shape, first_token, running)
                            };
                        }
                    }
                }
                // SAFETY: as for `load`.
                unsafe { band.store(&out, shape, band_rows) };
            }
        })
    });
}

/// Asks the L2 cache for every line of `stored`: the next tile's weights, which unpacking
/// waited on (Q6_K's took 8% of a prompt, most of it waiting), arrive while this tile
/// multiplies. Not the L1 cache, through which the tile streams the prompt meanwhile.
fn prefetch(stored: [&[u8]; 2]) {
    for bytes in stored {
        for line in bytes.chunks(64) {
            // SAFETY: a prefetch reads nothing the program can observe and cannot fault.
            unsafe { _mm_prefetch::<_MM_HINT_T1>(line.as_ptr().cast()) };
        }
    }
}

/// The running sums of a band of tiles' outputs, as the tile keeps them: per row of the band
/// (a tile's rows past the weight's last included), [`LANES`] tokens to a vector, every
/// group of the prompt (those past its last token hold sums that are dropped).
struct Band<'a> {
    sums: &'a mut [f32],
    first_row: usize,
    /// Floats per row: the prompt's groups of tokens, whole.
    per_row: usize,
}

impl<'a> Band<'a> {
    /// The band from `first_row`, in `buffer`, for a prompt of `groups` groups of [`LANES`].
    fn new(buffer: &'a mut CacheLines<f32>, first_row: usize, groups: usize) -> Self {
        let per_row = groups.next_multiple_of(GROUPS) * LANES;
        Self {
            sums: buffer.first(BAND_TILES * ROWS * per_row),
            first_row,
            per_row,
        }
    }

    /// The sums of the tile from `first_row` on (a tile of the band), which the tile reads
    /// and writes.
    fn tile(&mut self, first_row: usize) -> TileSums {
        let at = (first_row - self.first_row) * self.per_row;
        assert!(
            at + ROWS * self.per_row <= self.sums.len(),
            "a tile of the band"
        );
        TileSums {
            // SAFETY: the tile's rows lie inside the band, checked above.
            first: unsafe { self.sums.as_mut_ptr().add(at) },
            per_row: self.per_row,
        }
    }

    /// The sums start from zero, for a product not added to the output.
    fn zero(&mut self) {
        self.sums.fill(0.0);
    }

    /// The sums start from `out`'s values of `rows` (the band's), for a product added to it.
    ///
    /// # Safety
    /// The CPU must have AVX2; no other thread may touch `out`'s elements of `rows`, which
    /// lie inside it (`shape`).
    unsafe fn load(&mut self, out: &SharedOutput<f32>, shape: Shape, rows: Range<usize>) {
        let band = self.rows(&rows, shape.tokens);
        // SAFETY: (token, row) lies inside `out` for every token and row of the band, whose
        // elements are this thread's alone; the band holds every token of its rows.
        unsafe {
            let from = Strided::new(out.at(rows.start), shape.rows);
            transpose::<false>(from, band, shape.tokens, rows.len())
        }
    }

    /// `out`'s values of `rows` (the band's) become the sums.
    ///
    /// # Safety
    /// As for [`Self::load`].
    unsafe fn store(&mut self, out: &SharedOutput<f32>, shape: Shape, rows: Range<usize>) {
        let band = self.rows(&rows, shape.tokens);
        // SAFETY: as in `load`.
        unsafe {
            let to = Strided::new(out.at(rows.start), shape.rows);
            transpose::<true>(band, to, rows.len(), shape.tokens)
        }
    }

    /// The sums of `rows` (the band's) for `tokens` tokens, a row's tokens side by side,
    /// checked to lie inside the band.
    fn rows(&mut self, rows: &Range<usize>, tokens: usize) -> Strided {
        let band = &mut self.sums[(rows.start - self.first_row) * self.per_row..];
        assert!(
            band.len() >= (rows.len() - 1) * self.per_row + tokens,
            "the band's rows"
        );
        Strided::new(band.as_mut_ptr(), self.per_row)
    }
}

/// Floats whose element `(i, j)` lies at `first + i·stride + j`.
#[derive(Clone, Copy)]
struct Strided {
    first: *mut f32,
    stride: usize,
}

impl Strided {
    fn new(first: *mut f32, stride: usize) -> Self {
        Self { first, stride }
    }

    /// # Safety
    /// `(i, j)` must lie inside the floats.
    unsafe fn at(self, i: usize, j: usize) -> *mut f32 {
        // SAFETY: the caller's.
        unsafe { self.first.add(i * self.stride + j) }
    }
}

/// Element `(i, j)` of `from` to `(j, i)` of `to`, for `i < n`, `j < m`: between the band's
/// layout and the output's, eight by eight through registers. Element by element, the
/// strided reads took a twentieth of a 1.7B Q6_K prompt's time. The output's rows (a
/// token's) are read or written whole, eight tokens at a time (`ALONG_TO` where the output
/// is `to`): eight rows of the band at a time, every token's, would visit each of the
/// output's lines several times, the tokens' lines falling in the same sets of the L1 cache
/// (rows of 2048 or 8192 floats). The two orders measured level (1.7B Q6_K 1.01–1.02×,
/// Q8_0 0.96–1.05×).
///
/// # Safety
/// The CPU must have AVX2; both must hold every element named, and not overlap.
#[target_feature(enable = "avx2,fma")]
unsafe fn transpose<const ALONG_TO: bool>(from: Strided, to: Strided, n: usize, m: usize) {
    let (whole_n, whole_m) = (n / 8 * 8, m / 8 * 8);
    let (outer, inner) = match ALONG_TO {
        true => (whole_m, whole_n),
        false => (whole_n, whole_m),
    };
    for a in (0..outer).step_by(8) {
        for b in (0..inner).step_by(8) {
            let (i, j) = if ALONG_TO { (b, a) } else { (a, b) };
            // SAFETY: the eight by eight elements from (i, j) lie inside both.
            unsafe {
                let rows = std::array::from_fn(|k| _mm256_loadu_ps(from.at(i + k, j)));
                for (k, column) in transpose_8x8(rows).into_iter().enumerate() {
                    _mm256_storeu_ps(to.at(j + k, i), column);
                }
            }
        }
    }
    for i in 0..n {
        let done = if i < whole_n { whole_m } else { 0 };
        for j in done..m {
            // SAFETY: (i, j) lies inside both.
            unsafe { *to.at(j, i) = *from.at(i, j) };
        }
    }
}

/// A tile's rows of a [`Band`]: row `j`'s sums of tokens from `t` at `first + j·per_row + t`.
#[derive(Clone, Copy)]
struct TileSums {
    first: *mut f32,
    per_row: usize,
}

/// Q6_K's scales: each block of 16 has an integer step of its super-block's base
/// (`Factors::Scaled`). The tile takes such weights multiplied by their steps as they are
/// widened (at most 32 · 128 in magnitude: blocks of 16 are Q6_K's alone, whose values are
/// 6 bits, see `GgmlType::integer_block`), so that both halves
/// of a block of 32 share one scale, the base: one conversion and scaling per 32 values,
/// not per 16, with the activations rounded to 15 bits per 32 instead of 16 bits per 16.
#[derive(Clone, Copy)]
struct Stepped<'a> {
    bases: &'a [half::f16],
    steps: &'a [i8],
    /// Where the factors start in the count the bases go by (as in `Factors::Scaled`).
    first: usize,
    per: usize,
}

impl<'a> Stepped<'a> {
    fn of(weight: Weights<'a>) -> Option<Self> {
        match weight.scales {
            Factors::Scaled {
                bases,
                steps,
                first,
                per,
            } if weight.halves && read_stepped(HALF_BLOCK, weight.scales, weight.offsets) => {
                Some(Self {
                    bases,
                    steps,
                    first,
                    per,
                })
            }
            _ => None,
        }
    }

    /// The base of each pair of the blocks of 16 `blocks`, in `buffer`.
    fn bases(self, blocks: Range<usize>, buffer: &mut Vec<f32>) -> &[f32] {
        let pairs = blocks.len() / 2;
        grow(buffer, pairs);
        // A group's pairs at a time, from one division, where one per pair took 1% of a
        // Qwen3-1.7B Q4_K_M prompt.
        let pairs_per = self.per / 2;
        let start = self.first + blocks.start;
        let (mut group, mut first) = (start / self.per, 0);
        let mut end = ((group + 1) * self.per - start).div_ceil(2).min(pairs);
        while first < pairs {
            buffer[first..end].fill(self.bases[group].to_f32());
            (group, first, end) = (group + 1, end, (end + pairs_per).min(pairs));
        }
        &buffer[..pairs]
    }
}

/// Rows `rows` of a band's factors (rows `band`, as many factors each).
fn rows_of_band<'f>(factors: &'f [f32], band: &Range<usize>, rows: &Range<usize>) -> &'f [f32] {
    let per_row = factors.len() / band.len();
    &factors[(rows.start - band.start) * per_row..][..rows.len() * per_row]
}

/// The columns a tile multiplies at once.
struct Chunk {
    /// The weights' blocks of the chunk, counted in a row.
    blocks: Range<usize>,
}

/// A tile's weight rows.
struct TileRows<'a> {
    /// [`ROWS`] rows of the chunk widened to 16 bits, [`WORD_STRIDE`] apart; those past the
    /// weight's last hold what an earlier tile left there, or zeros.
    words: &'a [i16],
    /// One per block of each of the tile's rows, whole rows.
    scales: &'a [f32],
    offsets: Option<&'a [f32]>,
    /// The first row's index in the weight.
    first: usize,
}

/// A rounded prompt as pairs of 16-bit values, sixteen tokens side by side: for each group of
/// [`LANES`] tokens and each pair of columns, one 32-bit pair per token, zero past the last
/// token.
struct TokenPairs {
    pairs: CacheLines<u32>,
    /// Pairs of columns in a token.
    per_token: usize,
}

impl TokenPairs {
    /// `values`: `[tokens, cols]`. Each thread lays out groups of its own: on one thread
    /// this took 5% of a 2048-column product.
    fn of(values: &[i16], cols: usize) -> Self {
        let per_token = cols / 2;
        let tokens = values.len() / cols;
        let mut pairs = CacheLines::zeroed(tokens.div_ceil(LANES) * per_token * LANES);
        split_rows(
            &mut pairs,
            per_token * LANES,
            1,
            &|first_group, groups: &mut [u32]| {
                for (g, group) in groups.chunks_exact_mut(per_token * LANES).enumerate() {
                    let first = (first_group + g) * LANES;
                    let group_tokens = values[first * cols..].chunks_exact(cols).take(LANES);
                    for (lane, token) in group_tokens.enumerate() {
                        let lanes = group.iter_mut().skip(lane).step_by(LANES);
                        for (to, pair) in lanes.zip(token.chunks_exact(2)) {
                            *to = u32::from(pair[0] as u16) | u32::from(pair[1] as u16) << 16;
                        }
                    }
                }
            },
        );
        Self { pairs, per_token }
    }

    fn groups(&self) -> usize {
        self.pairs.len() / (self.per_token * LANES)
    }
}

/// Bytes widened to 16 bits, 32 at a time, on AVX-512: with `Ints::widen`, which takes 16 at
/// a time on AVX2, a 1.7B Q8_0 file's prompts ran 0.90–1.02× as fast (median 0.97× in five
/// alternated runs).
///
/// # Safety
/// The CPU must have AVX-512 F and BW; `bytes` and `words` must be as long, a multiple of 32.
#[target_feature(enable = "avx2,fma,avx512f,avx512bw")]
unsafe fn widen(bytes: &[i8], words: &mut [i16]) {
    for (bytes, words) in bytes.chunks_exact(32).zip(words.chunks_exact_mut(32)) {
        // SAFETY: each chunk holds 32 values.
        unsafe {
            let wide = _mm512_cvtepi8_epi16(_mm256_loadu_si256(bytes.as_ptr().cast()));
            _mm512_storeu_si512(words.as_mut_ptr().cast(), wide);
        }
    }
}

/// `GROUPS · LANES` tokens from `first_token` (a multiple of [`LANES`]) by the rows of
/// `tile`, over the columns of `chunk`, onto their `running` sums, which it adds each
/// block's terms to. Rows past the weight's last multiply whatever their words hold, and
/// groups past the last repeat that; their sums are dropped.
///
/// # Safety
/// The CPU must have AVX-512 F, BW and VNNI; `tile` must hold `ROWS` rows of words for
/// `chunk` (the weight's rows left, and any words past them), in blocks of 32 (of 16 when
/// `HALVES`), with offsets when `OFFSETS`; `tokens` and `by_block` be the prompt of `shape`,
/// and `running` hold the tile's rows for every group of the prompt, whole.
#[target_feature(enable = "avx2,fma,avx512f,avx512bw,avx512vnni")]
unsafe fn tile_at<const HALVES: bool, const OFFSETS: bool>(
    tile: &TileRows<'_>,
    chunk: &Chunk,
    tokens: &TokenPairs,
    by_block: &TokenBlocks,
    shape: Shape,
    first_token: usize,
    running: TileSums,
) {
    let Shape { rows, cols, .. } = shape;
    let block = if HALVES { HALF_BLOCK } else { BLOCK };
    let blocks = cols / block;
    let first_group = first_token / LANES;
    let group_of = |g: usize| (first_group + g).min(tokens.groups() - 1);
    let tile_rows = ROWS.min(rows - tile.first);
    let row_of = |j: usize| j.min(tile_rows - 1);
    let first_pair = chunk.blocks.start * block / 2;
    // SAFETY: every group is clamped inside the prompt, every row lies inside the tile's
    // words; `first_pair` is the chunk's first pair of columns.
    let (x, w) = unsafe {
        (
            std::array::from_fn::<_, GROUPS, _>(|g| {
                tokens
                    .pairs
                    .as_ptr()
                    .add((group_of(g) * tokens.per_token + first_pair) * LANES)
            }),
            std::array::from_fn::<_, ROWS, _>(|j| tile.words.as_ptr().add(j * WORD_STRIDE)),
        )
    };
    let row_scales: [&[f32]; ROWS] =
        std::array::from_fn(|j| &tile.scales[row_of(j) * blocks..][..blocks]);
    let offsets = tile.offsets.unwrap_or(tile.scales);
    let row_offsets: [&[f32]; ROWS] =
        std::array::from_fn(|j| &offsets[row_of(j) * blocks..][..blocks]);
    // SAFETY: the sums hold every row of the tile and every group of the prompt.
    let lanes = |j: usize, g: usize| unsafe {
        (running.first).add(j * running.per_row + (first_group + g) * LANES)
    };
    for (local, b) in chunk.blocks.clone().enumerate() {
        let mut ints = [[_mm512_setzero_si512(); GROUPS]; ROWS];
        for pair in local * block / 2..(local + 1) * block / 2 {
            // SAFETY: `pair` lies inside the chunk of every row and token, whose pointers
            // are clamped inside the buffers.
            unsafe {
                let x: [__m512i; GROUPS] = std::array::from_fn(|g| {
                    let ahead = x[g].wrapping_add((pair + PREFETCH_PAIRS) * LANES);
                    _mm_prefetch::<_MM_HINT_T0>(ahead.cast::<i8>());
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
        // SAFETY: as for the scales; the sums are padded alike, and read only with offsets.
        let token_sums: [__m512; GROUPS] = std::array::from_fn(|g| match OFFSETS {
            true => unsafe { _mm512_loadu_ps(by_block.sums(b, group_of(g) * LANES)) },
            false => _mm512_setzero_ps(),
        });
        // Each row's scaling written out, so that the integer sums stay in their registers.
        // As a loop over the rows, which the compiler did not unroll with offsets, the sums
        // were kept in memory, stored at every pair (Q4_K_M prompts at 0.70× the speed); as
        // that loop with the sums taken out through `black_box` once per block, 1.7B Q8_0
        // prompts ran 0.95×, Q6_K 0.97–0.98× and Q4_K_M 0.97–1.01× (medians of alternated
        // runs, Intel Xeon).
        let scale_row = |j: usize| {
            // SAFETY: `b` is a block of the chunk, so of every row's factors.
            let (row_scale, offset) = unsafe {
                (
                    _mm512_set1_ps(*row_scales[j].get_unchecked(b)),
                    _mm512_set1_ps(*row_offsets[j].get_unchecked(b)),
                )
            };
            for (g, &int) in ints[j].iter().enumerate() {
                let scale = _mm512_mul_ps(token_scales[g], row_scale);
                let mut term = _mm512_mul_ps(_mm512_cvtepi32_ps(int), scale);
                if OFFSETS {
                    term = _mm512_fmadd_ps(token_sums[g], offset, term);
                }
                // SAFETY: as above.
                unsafe {
                    let sum = lanes(j, g);
                    _mm512_storeu_ps(sum, _mm512_add_ps(_mm512_loadu_ps(sum), term));
                }
            }
        };
        macro_rules! rows {
            ($($j:literal)*) => {
                const _: () = assert!([$($j),*].len() == ROWS, "every row of the tile");
                $( scale_row($j); )*
            };
        }
        rows!(0 1 2 3 4 5 6 7 8 9 10 11);
    }
}

/// A compilation of the tile, as [`tile_at`] for one set of vectors and weights.
type TileAt = unsafe fn(&TileRows<'_>, &Chunk, &TokenPairs, &TokenBlocks, Shape, usize, TileSums);

/// `sum` plus the products of the pairs of `x` and `w`, as `vpdpwssd` adds them: a
/// `vpmaddwd` then an add, which wrap alike.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn add_pairs_avx2(sum: __m256i, x: __m256i, w: __m256i) -> __m256i {
    _mm256_add_epi32(sum, _mm256_madd_epi16(x, w))
}

/// [`add_pairs_avx2`] in one instruction.
#[inline]
#[target_feature(enable = "avx2,fma,avxvnni")]
fn add_pairs_avx_vnni(sum: __m256i, x: __m256i, w: __m256i) -> __m256i {
    _mm256_dpwssd_avx_epi32(sum, x, w)
}

/// [`tile_at`] on 256-bit vectors: each group of [`LANES`] tokens is two vectors, and the
/// tile's rows are taken [`ROWS_256`] at a time. Each output's integer sums, scaling,
/// offsets and order of blocks are [`tile_at`]'s, so it gets the same bits.
macro_rules! tile_at_256 {
    ($name:ident, $features:literal, $add_pairs:ident) => {
        /// # Safety
        /// As for [`tile_at`], with the CPU features this compilation enables.
        #[target_feature(enable = $features)]
        unsafe fn $name<const HALVES: bool, const OFFSETS: bool>(
            tile: &TileRows<'_>,
            chunk: &Chunk,
            tokens: &TokenPairs,
            by_block: &TokenBlocks,
            shape: Shape,
            first_token: usize,
            running: TileSums,
        ) {
            const HALF: usize = LANES / 2;
            let Shape { rows, cols, .. } = shape;
            let block = if HALVES { HALF_BLOCK } else { BLOCK };
            let blocks = cols / block;
            let tile_rows = ROWS.min(rows - tile.first);
            let first_pair = chunk.blocks.start * block / 2;
            let offsets = tile.offsets.unwrap_or(tile.scales);
            for g in 0..GROUPS {
                let first = (first_token / LANES + g) * LANES;
                if first >= shape.tokens {
                    break;
                }
                let group = first / LANES;
                // SAFETY: the group starts at a token of the prompt; `first_pair` is the
                // chunk's first pair of columns.
                let x = unsafe {
                    tokens
                        .pairs
                        .as_ptr()
                        .add((group * tokens.per_token + first_pair) * LANES)
                };
                for first_row in (0..tile_rows).step_by(ROWS_256) {
                    let row_of = |j: usize| (first_row + j).min(tile_rows - 1);
                    // SAFETY: the sums hold every row of the tile and every group of the
                    // prompt.
                    let lanes = |j: usize, h: usize| unsafe {
                        (running.first).add((first_row + j) * running.per_row + first + h * HALF)
                    };
                    // SAFETY: every row is clamped inside the tile.
                    let w: [*const i16; ROWS_256] = std::array::from_fn(|j| unsafe {
                        tile.words.as_ptr().add(row_of(j) * WORD_STRIDE)
                    });
                    let row_scales: [&[f32]; ROWS_256] =
                        std::array::from_fn(|j| &tile.scales[row_of(j) * blocks..][..blocks]);
                    let row_offsets: [&[f32]; ROWS_256] =
                        std::array::from_fn(|j| &offsets[row_of(j) * blocks..][..blocks]);
                    for (local, b) in chunk.blocks.clone().enumerate() {
                        let mut ints = [[_mm256_setzero_si256(); 2]; ROWS_256];
                        for pair in local * block / 2..(local + 1) * block / 2 {
                            // SAFETY: `pair` lies inside the chunk of every row and token,
                            // whose pointers are clamped inside the buffers.
                            unsafe {
                                let at_pair = x.add(pair * LANES);
                                let ahead = x.wrapping_add((pair + PREFETCH_PAIRS) * LANES);
                                _mm_prefetch::<_MM_HINT_T0>(ahead.cast::<i8>());
                                let x: [__m256i; 2] = std::array::from_fn(|h| {
                                    _mm256_loadu_si256(at_pair.add(h * HALF).cast::<__m256i>())
                                });
                                for (j, ints) in ints.iter_mut().enumerate() {
                                    let w = w[j].add(pair * 2).cast::<i32>().read_unaligned();
                                    let w = _mm256_set1_epi32(w);
                                    for (int, &x) in ints.iter_mut().zip(&x) {
                                        *int = $add_pairs(*int, x, w);
                                    }
                                }
                            }
                        }
                        // SAFETY: the token blocks are padded past the last token by
                        // [`LANES`], and the group starts at a token of the prompt.
                        let token_scales: [__m256; 2] = std::array::from_fn(|h| unsafe {
                            _mm256_loadu_ps(by_block.scales(b, group * LANES + h * HALF))
                        });
                        // SAFETY: as for the scales; the sums are padded alike, and read
                        // only with offsets.
                        let token_sums: [__m256; 2] = std::array::from_fn(|h| match OFFSETS {
                            true => unsafe {
                                _mm256_loadu_ps(by_block.sums(b, group * LANES + h * HALF))
                            },
                            false => _mm256_setzero_ps(),
                        });
                        // The integer sums stay in their registers for the scaling, which
                        // the compiler unrolls for six rows by itself (for [`tile_at`]'s
                        // twelve it is written out); taken out through `black_box` once per
                        // block, 1.7B-shaped prompts ran 0.94–0.98× as fast (Intel Xeon
                        // capped at AVX2 and at AVX-VNNI, medians of alternated runs).
                        for (j, ints) in ints.iter().enumerate() {
                            // SAFETY: `b` is a block of the chunk, so of every row's factors.
                            let (row_scale, offset) = unsafe {
                                (
                                    _mm256_set1_ps(*row_scales[j].get_unchecked(b)),
                                    _mm256_set1_ps(*row_offsets[j].get_unchecked(b)),
                                )
                            };
                            for (h, &int) in ints.iter().enumerate() {
                                let scale = _mm256_mul_ps(token_scales[h], row_scale);
                                let mut term = _mm256_mul_ps(_mm256_cvtepi32_ps(int), scale);
                                if OFFSETS {
                                    term = _mm256_fmadd_ps(token_sums[h], offset, term);
                                }
                                // SAFETY: as above.
                                unsafe {
                                    let sum = lanes(j, h);
                                    _mm256_storeu_ps(
                                        sum,
                                        _mm256_add_ps(_mm256_loadu_ps(sum), term),
                                    );
                                }
                            }
                        }
                    }
                }
            }
        }
    };
}

tile_at_256!(tile_at_avx2, "avx2,fma", add_pairs_avx2);
tile_at_256!(tile_at_avx_vnni, "avx2,fma,avxvnni", add_pairs_avx_vnni);
