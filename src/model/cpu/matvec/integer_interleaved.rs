//! The decode kernel of 4-bit weights held interleaved, sixteen rows to a line
//! (`IntegerValues::Interleaved`), on CPUs with AVX-512 VNNI.
//!
//! The other kernels read a row at a time, a block's products spread over the lanes of a
//! vector, and spend as much on adding the lanes across, scaling each block and adding the
//! rows' terms in turn as on the products themselves: on a 1.7B Q4_0 file (AMD EPYC, family
//! 26) leaving out the scaling alone made a decode step 1.16× as fast. Here each 32-bit lane
//! holds a row: one 64-byte line is four bytes of a block of each of sixteen rows, its
//! nibbles times four activations broadcast are sixteen rows' sums in one `vpdpbusd`, and a
//! block's sums, scaled, are added to the sixteen outputs as they stand, with no sum across
//! lanes and no transposition. It decoded a 1.7B Q4_0 file 1.31× as fast as the row kernel
//! (with VNNI, in 512-bit vectors) and the 135M one 1.24×, Q4_K_M 1.06×.
//!
//! The activations stay 16-bit (see `BlockInts`), split into bytes as `integer_vnni` splits
//! them, `x = 256·high + low`: the weights (0 to 15 as stored) are the unsigned operand beside
//! the high bytes and the signed one beside the low. Each block's integer sum, its term and
//! the order the terms are added in are every other kernel's, so the bits are too.

use std::arch::x86_64::*;

use super::avx2::prefetch;
use super::integer_avx512::{products, transpose, widened};
use super::{BlockInts, grow};
use crate::model::cpu::weights::{
    Factors, INTERLEAVED_BLOCK_BYTES, INTERLEAVED_LINE_BYTES, INTERLEAVED_ROWS as ROWS,
    NIBBLE_BLOCK,
};

/// How far ahead of the line being read the kernel asks for weights: four times the other
/// integer kernels' distance, as this one reads them about as much faster. Against 2 KB,
/// 8 KB decoded a 1.7B Q4_0 file 1.05–1.2× as fast (five alternated pairs) and Q4_K_M
/// 0.98–1.09× (three); 16 and 32 KB were no better.
const PREFETCH_BYTES: usize = 8192;

/// The activations as the kernel reads them besides their values.
pub struct Activations {
    /// Per block of 32, its values' high bytes (signed), then their low bytes (unsigned).
    bytes: Vec<u8>,
    /// Per block, the weights' zero point times the sum of its values, which comes off the
    /// block's sum of products with the weights as stored.
    zero_sums: Vec<i32>,
    /// The block scales repeated for each row of a group, which its factors multiply element
    /// by element.
    scales: Vec<f32>,
}

impl Activations {
    /// For weights whose values are stored plus `zero`.
    pub fn of(x: &BlockInts, zero: u8) -> Self {
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
            zero_sums: x.zero_sums(zero),
            scales: x.scales.repeat(ROWS),
        }
    }
}

/// Adds each row's product with each of the `V` activation rows to that row's output,
/// offsets included, every output summed as `token_lanes` sums it: each block's integer sum
/// whole, less the zero point's share, scaled (`cvt(sum) · (w_scale · x_scale)`, then
/// `+ offset · Σx` in one rounding), and the blocks' terms added to the output in turn. Each
/// line of weights is loaded and split into nibbles once for all `V` activation rows.
///
/// # Safety
/// The CPU must have AVX-512 F, BW, VL and VNNI, FMA and F16C; `values` must hold
/// `outs[v].len()` rows (whole groups of [`ROWS`]) of `x.values.len()` 4-bit values
/// interleaved, and `scales` and `offsets` one factor per block of 32 of those rows; each
/// `prepared` is [`Activations::of`] its `x` with the weights' zero point.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub unsafe fn rows_dot<const V: usize>(
    values: &[u8],
    scales: Factors<'_>,
    offsets: Option<Factors<'_>>,
    xs: [(&BlockInts, &Activations); V],
    buffer: &mut Vec<f32>,
    outs: &mut [&mut [f32]; V],
) {
    let blocks = xs[0].0.scales.len();
    let group = ROWS * blocks;
    // Each activation row's factors times its scales, and the offsets: for one activation
    // row as they are formed, a row's blocks together, each block's sixteen gathered from
    // there (a decode step 1.03–1.07× as fast as with the transposes below); for several,
    // transposed once to a block's sixteen rows together, which as many gathers per block
    // made 0.7× as fast. A group's factors as they are formed, for the transposes.
    let gathered = V == 1;
    let needed = (V + 2) * group;
    grow(buffer, needed);
    let (scaled, rest) = buffer[..needed].split_at_mut(V * group);
    let (offsets_of_group, by_row) = rest.split_at_mut(group);
    // Where a block's factor of each of a group's sixteen rows lies, as they are formed.
    let rows_apart = _mm512_mullo_epi32(
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
        _mm512_set1_epi32(blocks as i32),
    );
    let low_bits = _mm512_set1_epi8(0x0F);
    let zero = _mm512_setzero_si512();
    let rows = outs[0].len();
    for (g, first) in (0..rows).step_by(ROWS).enumerate() {
        let factors = first * blocks..(first + ROWS) * blocks;
        // The next group's factors, asked for a line per block while this group's weights
        // are read: read cold when the group begins, they were a quarter of a step.
        let next = factors.end..(factors.end + group).min(rows * blocks);
        let [scales_ahead, steps_ahead] = scales.range(next.clone()).stored();
        let [offsets_ahead, their_steps] =
            offsets.map_or([&[][..]; 2], |offsets| offsets.range(next.clone()).stored());
        let ahead = [scales_ahead, steps_ahead, offsets_ahead, their_steps];
        // SAFETY: the buffers hold a group's factors; `prepared` repeats the activations'
        // scales for each of its rows.
        unsafe {
            for (v, (_, prepared)) in xs.iter().enumerate() {
                let scaled = &mut scaled[v * group..][..group];
                match gathered {
                    true => products(scales.range(factors.clone()), &prepared.scales, scaled),
                    false => {
                        products(scales.range(factors.clone()), &prepared.scales, by_row);
                        by_block(by_row, blocks, scaled);
                    }
                }
            }
            if let Some(offsets) = offsets {
                match gathered {
                    true => widened(offsets.range(factors.clone()), offsets_of_group),
                    false => {
                        widened(offsets.range(factors.clone()), by_row);
                        by_block(by_row, blocks, offsets_of_group);
                    }
                }
            }
        }
        // SAFETY: the group's outputs, its lines of weights and each activation row's blocks
        // lie where read, as the caller guarantees; a prefetch cannot fault.
        unsafe {
            let lines = values.as_ptr().add(g * blocks * INTERLEAVED_BLOCK_BYTES);
            let mut sums: [__m512; V] =
                std::array::from_fn(|v| _mm512_loadu_ps(outs[v].as_ptr().add(first)));
            for b in 0..blocks {
                for bytes in &ahead {
                    if let Some(line) = bytes.get(64 * b..) {
                        prefetch(line.as_ptr(), 0);
                    }
                }
                let at = lines.add(b * INTERLEAVED_BLOCK_BYTES);
                // Line `k`: each row's bytes `4k..4k + 4`, values `4k..4k + 4` in their low
                // halves and `16 + 4k..` in their high ones.
                let line: [__m512i; 4] = std::array::from_fn(|k| {
                    let at = at.add(k * INTERLEAVED_LINE_BYTES);
                    prefetch(at, PREFETCH_BYTES);
                    _mm512_loadu_si512(at.cast())
                });
                let lows = line.map(|line| _mm512_and_si512(line, low_bits));
                let highs =
                    line.map(|line| _mm512_and_si512(_mm512_srli_epi16::<4>(line), low_bits));
                for (v, sums) in sums.iter_mut().enumerate() {
                    let x = xs[v].1.bytes.as_ptr().add(b * 2 * NIBBLE_BLOCK);
                    // Bytes `i..i + 4` of the block's split activations, in every lane.
                    let four =
                        |i: usize| _mm512_set1_epi32(x.add(i).cast::<i32>().read_unaligned());
                    let (mut high, mut high_2, mut low, mut low_2) = (zero, zero, zero, zero);
                    for k in 0..4 {
                        high = _mm512_dpbusd_epi32(high, lows[k], four(4 * k));
                        high_2 = _mm512_dpbusd_epi32(high_2, highs[k], four(16 + 4 * k));
                        low = _mm512_dpbusd_epi32(low, four(32 + 4 * k), lows[k]);
                        low_2 = _mm512_dpbusd_epi32(low_2, four(48 + 4 * k), highs[k]);
                    }
                    let high = _mm512_slli_epi32::<8>(_mm512_add_epi32(high, high_2));
                    let total = _mm512_add_epi32(high, _mm512_add_epi32(low, low_2));
                    let zero_sum = _mm512_set1_epi32(xs[v].1.zero_sums[b]);
                    let total = _mm512_sub_epi32(total, zero_sum);
                    // Block `b`'s factors of the group's rows.
                    let of_block = |factors: *const f32| match gathered {
                        true => _mm512_i32gather_ps::<4>(rows_apart, factors.add(b).cast()),
                        false => _mm512_loadu_ps(factors.add(b * ROWS)),
                    };
                    let scale = of_block(scaled.as_ptr().add(v * group));
                    let mut term = _mm512_mul_ps(_mm512_cvtepi32_ps(total), scale);
                    if offsets.is_some() {
                        let offset = of_block(offsets_of_group.as_ptr());
                        let x_sum = _mm512_set1_ps(xs[v].0.sums[b]);
                        term = _mm512_fmadd_ps(x_sum, offset, term);
                    }
                    *sums = _mm512_add_ps(*sums, term);
                }
            }
            for (v, sums) in sums.iter().enumerate() {
                _mm512_storeu_ps(outs[v].as_mut_ptr().add(first), *sums);
            }
        }
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
