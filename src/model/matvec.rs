//! `y = W x` for one activation row: the product every decode step is made of.
//!
//! A decode step reads every weight once and does two flops per weight, so it is bound by
//! memory bandwidth, not by arithmetic. The general matmul kernels of the CPU backends are
//! tuned for the opposite case: burn-flex runs a product this small on one thread (its
//! parallel threshold is 192³ multiply-adds), and burn-ndarray rejects the one-row layout
//! for BLAS. Splitting the weight's rows over every core and streaming each row once
//! through a wide dot product is what reaches the memory bandwidth.
//!
//! The rows are split over a [`micropool`] pool, not rayon's. A decode step is ~120 of these
//! products, each 40–200 µs long, with a few dozen µs of small operations between them;
//! rayon's idle workers go to sleep within a few µs and each product then waits for one to
//! wake. micropool's workers keep spinning for a set time after their last job, and the
//! calling thread works on its share instead of waiting. In a bf16 decode step on two cores
//! this cut the time spent in products from 11.6 to 9.3 ms (23 to 29 GB/s).

use std::sync::OnceLock;

use half::{bf16, f16};
use micropool::{ThreadPool, ThreadPoolBuilder};

/// A weight element the kernel can widen to f32 on the fly.
pub trait WeightElement: Copy + Send + Sync {
    fn to_f32(self) -> f32;

    /// Widens the 8 elements at `src` into one AVX register.
    ///
    /// # Safety
    /// `src` must point to 8 readable elements, and the CPU must support AVX2 and F16C.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load8(src: *const Self) -> std::arch::x86_64::__m256;
}

impl WeightElement for f32 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(src: *const f32) -> std::arch::x86_64::__m256 {
        // SAFETY: the caller guarantees 8 readable elements and AVX.
        unsafe { std::arch::x86_64::_mm256_loadu_ps(src) }
    }
}

impl WeightElement for f16 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(src: *const f16) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm256_cvtph_ps};
        // SAFETY: the caller guarantees 8 readable elements and F16C.
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(src.cast::<__m128i>())) }
    }
}

impl WeightElement for bf16 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(src: *const bf16) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::{
            __m128i, _mm_loadu_si128, _mm256_castsi256_ps, _mm256_cvtepu16_epi32, _mm256_slli_epi32,
        };
        // bf16 is the high half of an f32: widening is a 16-bit shift.
        // SAFETY: the caller guarantees 8 readable elements and AVX2.
        unsafe {
            let bits = _mm256_cvtepu16_epi32(_mm_loadu_si128(src.cast::<__m128i>()));
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(bits))
        }
    }
}

/// How long an idle worker spins before it sleeps, in spin-loop iterations (a few ms): longer
/// than the gaps between one step's products and between tokens, short enough that the core
/// is released soon after generation ends.
const IDLE_SPIN: usize = 200_000;

/// Products smaller than this many rows run on the calling thread alone: splitting them
/// costs more than it saves.
const MIN_ROWS_PER_PART: usize = 16;

/// The helper threads, one fewer than the threads the CPU backends use (rayon's count, so
/// `RAYON_NUM_THREADS` sets both), since the calling thread does a share of each product.
/// `None` for a single thread.
fn pool() -> Option<&'static ThreadPool> {
    static POOL: OnceLock<Option<ThreadPool>> = OnceLock::new();
    POOL.get_or_init(|| {
        let helpers = rayon::current_num_threads().saturating_sub(1);
        (helpers > 0).then(|| {
            ThreadPoolBuilder::default()
                .num_threads(helpers)
                .idle_spin_cycles(IDLE_SPIN)
                .build()
        })
    })
    .as_ref()
}

/// Runs `part(first_row, out)` over contiguous row ranges that together cover `out`, one
/// range per thread; `out` holds one result per row.
fn split_rows(out: &mut [f32], part: &(impl Fn(usize, &mut [f32]) + Sync)) {
    match pool() {
        Some(pool) => {
            let parts = (pool.num_threads() + 1).min(out.len() / MIN_ROWS_PER_PART);
            split_into(pool, parts.max(1), 0, out, part);
        }
        None => part(0, out),
    }
}

fn split_into(
    pool: &ThreadPool,
    parts: usize,
    first_row: usize,
    out: &mut [f32],
    part: &(impl Fn(usize, &mut [f32]) + Sync),
) {
    if parts <= 1 {
        return part(first_row, out);
    }
    let left_parts = parts / 2;
    let middle = out.len() * left_parts / parts;
    let (left, right) = out.split_at_mut(middle);
    pool.join(
        || split_into(pool, left_parts, first_row, left, part),
        || split_into(pool, parts - left_parts, first_row + middle, right, part),
    );
}

/// `weight` is `[rows, x.len()]` row-major; returns `W x` (`rows` values).
///
/// # Panics
/// When `weight.len() != rows * x.len()`: the callers take both from one tensor's shape.
pub fn matvec<W: WeightElement>(weight: &[W], x: &[f32], rows: usize) -> Vec<f32> {
    let cols = x.len();
    assert_eq!(
        weight.len(),
        rows * cols,
        "matvec: weight is not [rows, x.len()]"
    );
    let mut out = vec![0.0; rows];
    let rows_dot = rows_dot_for_this_cpu::<W>();
    split_rows(&mut out, &|first, out: &mut [f32]| {
        let weight = &weight[first * cols..(first + out.len()) * cols];
        rows_dot(weight, x, out);
    });
    out
}

/// Rows of 8-bit integers with one f32 scale per `block` consecutive weights of a row (the
/// symmetric per-block scheme of `--precision q8`): `W[r, c] = scales[r · cols / block +
/// c / block] · weight[r, c]`. Returns `W x`.
///
/// Burn 0.22 multiplies a quantized weight by dequantizing all of it first, on every call;
/// reading the integers directly moves a quarter of the f32 bytes instead.
///
/// # Panics
/// When the lengths disagree with `rows`, `x.len()` and `block`: the callers take all of them
/// from one quantized tensor.
pub fn matvec_q8(weight: &[i8], scales: &[f32], block: usize, x: &[f32], rows: usize) -> Vec<f32> {
    let cols = x.len();
    assert!(
        block > 0
            && cols.is_multiple_of(block)
            && weight.len() == rows * cols
            && scales.len() * block == weight.len(),
        "matvec_q8: weight, scales and block do not fit [rows, x.len()]"
    );
    let mut out = vec![0.0; rows];
    let blocks_per_row = cols / block;
    let rows_dot = rows_dot_q8_for_this_cpu();
    split_rows(&mut out, &|first, out: &mut [f32]| {
        let rows = first..first + out.len();
        let weight = &weight[rows.start * cols..rows.end * cols];
        let scales = &scales[rows.start * blocks_per_row..rows.end * blocks_per_row];
        rows_dot(weight, scales, block, x, out);
    });
    out
}

type RowsDotQ8 = fn(&[i8], &[f32], usize, &[f32], &mut [f32]);

fn rows_dot_q8_for_this_cpu() -> RowsDotQ8 {
    rows_dot_q8_vectorized().unwrap_or(rows_dot_q8_portable)
}

/// The hand-vectorized 8-bit kernel, where the CPU has what it needs.
fn rows_dot_q8_vectorized() -> Option<RowsDotQ8> {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected;
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
            // SAFETY: the CPU supports the kernel's features, checked just above.
            return Some(|weight, scales, block, x, out| unsafe {
                avx2::rows_dot_q8(weight, scales, block, x, out)
            });
        }
    }
    None
}

fn rows_dot_q8_portable(weight: &[i8], scales: &[f32], block: usize, x: &[f32], out: &mut [f32]) {
    let blocks_per_row = x.len() / block;
    for ((row, scales), y) in weight
        .chunks_exact(x.len())
        .zip(scales.chunks_exact(blocks_per_row))
        .zip(out)
    {
        *y = row
            .chunks_exact(block)
            .zip(x.chunks_exact(block))
            .zip(scales)
            .map(|((q, x), scale)| {
                scale * q.iter().zip(x).map(|(&q, x)| f32::from(q) * x).sum::<f32>()
            })
            .sum();
    }
}

type RowsDot<W> = fn(&[W], &[f32], &mut [f32]);

fn rows_dot_for_this_cpu<W: WeightElement>() -> RowsDot<W> {
    rows_dot_vectorized().unwrap_or(rows_dot_portable)
}

/// The hand-vectorized kernel, where the CPU has what it needs.
fn rows_dot_vectorized<W: WeightElement>() -> Option<RowsDot<W>> {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected;
        if is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
        {
            // SAFETY: the CPU supports the kernel's features, checked just above.
            return Some(|weight, x, out| unsafe { avx2::rows_dot(weight, x, out) });
        }
    }
    None
}

/// Any CPU: plain loops with independent partial sums, which compilers vectorize.
fn rows_dot_portable<W: WeightElement>(weight: &[W], x: &[f32], out: &mut [f32]) {
    const LANES: usize = 16;
    for (row, y) in weight.chunks_exact(x.len()).zip(out) {
        let (row_blocks, row_tail) = row.as_chunks::<LANES>();
        let (x_blocks, x_tail) = x.as_chunks::<LANES>();
        let mut acc = [0.0f32; LANES];
        for (w, x) in row_blocks.iter().zip(x_blocks) {
            for lane in 0..LANES {
                acc[lane] += w[lane].to_f32() * x[lane];
            }
        }
        let tail: f32 = row_tail
            .iter()
            .zip(x_tail)
            .map(|(w, x)| w.to_f32() * x)
            .sum();
        *y = acc.iter().sum::<f32>() + tail;
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::WeightElement;

    /// One row at a time: interleaving several rows' streams measured half as fast (17 instead
    /// of 35 GB/s), as the hardware prefetcher follows one sequential stream best. Two
    /// accumulators keep two fused multiply-adds in flight.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub fn rows_dot<W: WeightElement>(weight: &[W], x: &[f32], out: &mut [f32]) {
        let cols = x.len();
        let main = cols / 16 * 16;
        for (row, y) in weight.chunks_exact(cols).zip(out) {
            let mut even = _mm256_setzero_ps();
            let mut odd = _mm256_setzero_ps();
            let mut c = 0;
            while c < main {
                // SAFETY: c + 16 <= cols, the length of both `x` and `row`.
                unsafe {
                    let p = row.as_ptr().add(c);
                    let x0 = _mm256_loadu_ps(x.as_ptr().add(c));
                    let x1 = _mm256_loadu_ps(x.as_ptr().add(c + 8));
                    even = _mm256_fmadd_ps(W::load8(p), x0, even);
                    odd = _mm256_fmadd_ps(W::load8(p.add(8)), x1, odd);
                }
                c += 16;
            }
            let tail: f32 = row[main..]
                .iter()
                .zip(&x[main..])
                .map(|(w, x)| w.to_f32() * x)
                .sum();
            *y = horizontal_sum(_mm256_add_ps(even, odd)) + tail;
        }
    }

    /// Eight integers at a time are widened to f32 and multiplied into a per-block sum, which
    /// the block's scale then folds into the row's total.
    #[target_feature(enable = "avx2,fma")]
    pub fn rows_dot_q8(weight: &[i8], scales: &[f32], block: usize, x: &[f32], out: &mut [f32]) {
        let cols = x.len();
        let blocks_per_row = cols / block;
        let vector_end = block / 8 * 8;
        for ((row, scales), y) in weight
            .chunks_exact(cols)
            .zip(scales.chunks_exact(blocks_per_row))
            .zip(out)
        {
            let mut total = _mm256_setzero_ps();
            let mut tail = 0.0;
            for (b, &scale) in scales.iter().enumerate() {
                let start = b * block;
                let mut sum = _mm256_setzero_ps();
                let mut c = 0;
                while c < vector_end {
                    // SAFETY: start + c + 8 <= start + block <= cols, the length of `row` and `x`.
                    unsafe {
                        let q = _mm_loadl_epi64(row.as_ptr().add(start + c).cast::<__m128i>());
                        let w = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
                        sum = _mm256_fmadd_ps(w, _mm256_loadu_ps(x.as_ptr().add(start + c)), sum);
                    }
                    c += 8;
                }
                total = _mm256_fmadd_ps(sum, _mm256_set1_ps(scale), total);
                let rest: f32 = row[start + vector_end..start + block]
                    .iter()
                    .zip(&x[start + vector_end..start + block])
                    .map(|(&q, x)| f32::from(q) * x)
                    .sum();
                tail += scale * rest;
            }
            *y = horizontal_sum(total) + tail;
        }
    }

    #[inline]
    #[target_feature(enable = "avx2")]
    fn horizontal_sum(v: __m256) -> f32 {
        let quad = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let pair = _mm_add_ps(quad, _mm_movehl_ps(quad, quad));
        let one = _mm_add_ss(pair, _mm_movehdup_ps(pair));
        _mm_cvtss_f32(one)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(weight: &[f32], x: &[f32]) -> Vec<f32> {
        weight
            .chunks_exact(x.len())
            .map(|row| {
                row.iter()
                    .zip(x)
                    .map(|(&w, &x)| f64::from(w) * f64::from(x))
                    .sum::<f64>() as f32
            })
            .collect()
    }

    /// Deterministic values in [-1, 1) that differ for every index.
    fn values(len: usize, seed: u32) -> Vec<f32> {
        (0..len as u32)
            .map(|i| {
                let h = (i ^ seed).wrapping_mul(2_654_435_761) >> 8;
                h as f32 / (1u32 << 23) as f32 - 1.0
            })
            .collect()
    }

    /// Every kernel this CPU can run, so that the portable one is tested on x86 too.
    fn kernels<W: WeightElement>() -> Vec<RowsDot<W>> {
        let mut kernels: Vec<RowsDot<W>> = vec![rows_dot_portable];
        kernels.extend(rows_dot_vectorized());
        kernels
    }

    fn run<W: WeightElement>(kernel: RowsDot<W>, weight: &[W], x: &[f32]) -> Vec<f32> {
        let mut out = vec![0.0; weight.len() / x.len()];
        kernel(weight, x, &mut out);
        out
    }

    /// Shapes with tails on both axes: columns not a multiple of the vector width, rows not a
    /// multiple of the task size.
    #[test]
    fn every_kernel_equals_a_float64_reference_for_every_element_type() {
        for (rows, cols) in [(1, 1), (7, 5), (67, 100), (1000, 576), (49, 1536)] {
            let weight = values(rows * cols, 1);
            let x = values(cols, 2);
            let halves: Vec<f16> = weight.iter().map(|&w| f16::from_f32(w)).collect();
            let brains: Vec<bf16> = weight.iter().map(|&w| bf16::from_f32(w)).collect();
            let close = |got: &[f32], expected: &[f32], what: &str| {
                assert_eq!(got.len(), expected.len());
                for (g, e) in got.iter().zip(expected) {
                    assert!(
                        (g - e).abs() <= 1e-4 * (1.0 + e.abs()),
                        "{what} {rows}x{cols}: {g} vs {e}"
                    );
                }
            };
            let widened = |w: &[f32]| naive(w, &x);

            let expected = naive(&weight, &x);
            close(&matvec(&weight, &x, rows), &expected, "matvec f32");
            for kernel in kernels::<f32>() {
                close(&run(kernel, &weight, &x), &expected, "f32");
            }
            let expected = widened(&halves.iter().map(|w| w.to_f32()).collect::<Vec<_>>());
            close(&matvec(&halves, &x, rows), &expected, "matvec f16");
            for kernel in kernels::<f16>() {
                close(&run(kernel, &halves, &x), &expected, "f16");
            }
            let expected = widened(&brains.iter().map(|w| w.to_f32()).collect::<Vec<_>>());
            close(&matvec(&brains, &x, rows), &expected, "matvec bf16");
            for kernel in kernels::<bf16>() {
                close(&run(kernel, &brains, &x), &expected, "bf16");
            }
        }
    }

    #[test]
    fn every_q8_kernel_equals_the_dequantized_product() {
        let mut kernels: Vec<RowsDotQ8> = vec![rows_dot_q8_portable];
        kernels.extend(rows_dot_q8_vectorized());
        for (rows, cols, block) in [(1, 32, 32), (7, 96, 32), (67, 576, 32), (9, 40, 20)] {
            let weight: Vec<i8> = values(rows * cols, 3)
                .iter()
                .map(|v| (v * 127.0) as i8)
                .collect();
            let scales: Vec<f32> = values(rows * cols / block, 4)
                .iter()
                .map(|v| 0.01 + v.abs() * 0.02)
                .collect();
            let x = values(cols, 5);
            let dequantized: Vec<f32> = weight
                .iter()
                .enumerate()
                .map(|(i, &q)| f32::from(q) * scales[i / block])
                .collect();
            let expected = naive(&dequantized, &x);
            let close = |got: &[f32]| {
                for (g, e) in got.iter().zip(&expected) {
                    assert!(
                        (g - e).abs() <= 1e-4 * (1.0 + e.abs()),
                        "{rows}x{cols}/{block}: {g} vs {e}"
                    );
                }
            };
            close(&matvec_q8(&weight, &scales, block, &x, rows));
            for kernel in &kernels {
                let mut out = vec![0.0; rows];
                kernel(&weight, &scales, block, &x, &mut out);
                close(&out);
            }
        }
    }

    #[test]
    #[should_panic(expected = "matvec: weight is not [rows, x.len()]")]
    fn a_weight_of_the_wrong_size_is_a_programming_error() {
        matvec(&[0.0f32; 10], &[0.0; 3], 3);
    }
}
