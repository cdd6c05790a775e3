//! `y = W x` for one activation row: the product every decode step is made of.
//!
//! The row kernels add their products to the output, so that a projection can land on the
//! residual stream it feeds without another pass.
//!
//! A decode step reads every weight once and does two flops per weight, so it is bound by
//! memory bandwidth, not by arithmetic. The general matmul kernels of the CPU backends are
//! tuned for the opposite case: burn-flex runs a product this small on one thread (its
//! parallel threshold is 192³ multiply-adds), and burn-ndarray rejects the one-row layout
//! for BLAS. Splitting the weight's rows over every core and streaming each row once
//! through a wide dot product is what reaches the memory bandwidth.

use super::host::HostFloat;
use super::threads::split_rows;
use super::weights::WeightRows;

/// Products smaller than this many rows run on the calling thread alone: splitting them
/// costs more than it saves.
const MIN_ROWS_PER_PART: usize = 16;

/// Adds `W x` to `out` (one value per row of `W`, which is `[out.len(), x.len()]`).
///
/// # Panics
/// When the lengths do not fit those shapes: the callers take them from tensor shapes.
pub fn matvec(weight: WeightRows<'_>, x: &[f32], out: &mut [f32]) {
    assert_eq!(
        weight.len(),
        out.len() * x.len(),
        "matvec: weight is not [out.len(), x.len()]"
    );
    match weight {
        WeightRows::F32(weight) => dense(weight, x, out),
        WeightRows::F16(weight) => dense(weight, x, out),
        WeightRows::Bf16(weight) => dense(weight, x, out),
        WeightRows::Q8 {
            values,
            scales,
            block,
        } => quantized(values, scales, block, x, out),
    }
}

fn dense<W: HostFloat>(weight: &[W], x: &[f32], out: &mut [f32]) {
    let cols = x.len();
    let rows_dot = rows_dot_for_this_cpu::<W>();
    split_rows(out, 1, MIN_ROWS_PER_PART, &|first, out: &mut [f32]| {
        let weight = &weight[first * cols..(first + out.len()) * cols];
        rows_dot(weight, x, out);
    });
}

/// Rows of 8-bit integers with one f32 scale per `block` consecutive weights of a row (the
/// symmetric per-block scheme of `--precision q8`).
///
/// Burn 0.22 multiplies a quantized weight by dequantizing all of it first, on every call;
/// reading the integers directly moves a quarter of the f32 bytes instead.
fn quantized(weight: &[i8], scales: &[f32], block: usize, x: &[f32], out: &mut [f32]) {
    let cols = x.len();
    assert!(
        block > 0 && cols.is_multiple_of(block) && scales.len() * block == weight.len(),
        "matvec: 8-bit weights, scales and block do not fit [rows, x.len()]"
    );
    let blocks_per_row = cols / block;
    let rows_dot = rows_dot_q8_for_this_cpu();
    split_rows(out, 1, MIN_ROWS_PER_PART, &|first, out: &mut [f32]| {
        let rows = first..first + out.len();
        let weight = &weight[rows.start * cols..rows.end * cols];
        let scales = &scales[rows.start * blocks_per_row..rows.end * blocks_per_row];
        rows_dot(weight, scales, block, x, out);
    });
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
        *y += row
            .chunks_exact(block)
            .zip(x.chunks_exact(block))
            .zip(scales)
            .map(|((q, x), scale)| {
                scale * q.iter().zip(x).map(|(&q, x)| f32::from(q) * x).sum::<f32>()
            })
            .sum::<f32>();
    }
}

type RowsDot<W> = fn(&[W], &[f32], &mut [f32]);

fn rows_dot_for_this_cpu<W: HostFloat>() -> RowsDot<W> {
    rows_dot_vectorized().unwrap_or(rows_dot_portable)
}

/// The hand-vectorized kernel, where the CPU has what it needs.
fn rows_dot_vectorized<W: HostFloat>() -> Option<RowsDot<W>> {
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
fn rows_dot_portable<W: HostFloat>(weight: &[W], x: &[f32], out: &mut [f32]) {
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
        *y += acc.iter().sum::<f32>() + tail;
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::HostFloat;
    use crate::model::cpu::math::horizontal_sum;

    /// One row at a time: interleaving several rows' streams measured half as fast (17 instead
    /// of 35 GB/s), as the hardware prefetcher follows one sequential stream best. Two
    /// accumulators keep two fused multiply-adds in flight.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub fn rows_dot<W: HostFloat>(weight: &[W], x: &[f32], out: &mut [f32]) {
        let cols = x.len();
        let main = cols / 32 * 32;
        for (row, y) in weight.chunks_exact(cols).zip(out) {
            let mut sums = [_mm256_setzero_ps(); 4];
            let mut c = 0;
            while c < main {
                // SAFETY: c + 32 <= cols, the length of both `x` and `row`.
                unsafe {
                    let p = row.as_ptr().add(c);
                    for (k, sum) in sums.iter_mut().enumerate() {
                        let x = _mm256_loadu_ps(x.as_ptr().add(c + 8 * k));
                        *sum = _mm256_fmadd_ps(W::load8(p.add(8 * k)), x, *sum);
                    }
                }
                c += 32;
            }
            let tail: f32 = row[main..]
                .iter()
                .zip(&x[main..])
                .map(|(w, x)| w.to_f32() * x)
                .sum();
            let even = _mm256_add_ps(sums[0], sums[2]);
            let odd = _mm256_add_ps(sums[1], sums[3]);
            *y += horizontal_sum(_mm256_add_ps(even, odd)) + tail;
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
            *y += horizontal_sum(total) + tail;
        }
    }
}

#[cfg(test)]
mod tests {
    use half::{bf16, f16};

    use super::*;
    use crate::model::cpu::test_values as values;

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

    /// Every kernel this CPU can run, so that the portable one is tested on x86 too.
    fn kernels<W: HostFloat>() -> Vec<RowsDot<W>> {
        let mut kernels: Vec<RowsDot<W>> = vec![rows_dot_portable];
        kernels.extend(rows_dot_vectorized());
        kernels
    }

    /// The kernels add to what `out` holds: start from ones and take them off again.
    fn run<W: HostFloat>(kernel: RowsDot<W>, weight: &[W], x: &[f32]) -> Vec<f32> {
        let mut out = vec![1.0; weight.len() / x.len()];
        kernel(weight, x, &mut out);
        out.iter().map(|y| y - 1.0).collect()
    }

    fn product(weight: WeightRows<'_>, x: &[f32]) -> Vec<f32> {
        let mut out = vec![1.0; weight.len() / x.len()];
        matvec(weight, x, &mut out);
        out.iter().map(|y| y - 1.0).collect()
    }

    /// `matvec` and every kernel for `W` against the f64 product of the weights as stored.
    fn check<W: HostFloat>(weight: &[W], rows: WeightRows<'_>, x: &[f32], what: &str) {
        let stored: Vec<f32> = weight.iter().map(|w| w.to_f32()).collect();
        let expected = naive(&stored, x);
        let close = |got: &[f32], what: &str| {
            assert_eq!(got.len(), expected.len());
            for (g, e) in got.iter().zip(&expected) {
                assert!(
                    (g - e).abs() <= 1e-4 * (1.0 + e.abs()),
                    "{what}: {g} vs {e}"
                );
            }
        };
        close(&product(rows, x), &format!("matvec {what}"));
        for kernel in kernels::<W>() {
            close(&run(kernel, weight, x), what);
        }
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
            let shape = format!("{rows}x{cols}");
            check(
                &weight,
                WeightRows::F32(&weight),
                &x,
                &format!("f32 {shape}"),
            );
            check(
                &halves,
                WeightRows::F16(&halves),
                &x,
                &format!("f16 {shape}"),
            );
            check(
                &brains,
                WeightRows::Bf16(&brains),
                &x,
                &format!("bf16 {shape}"),
            );
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
            let rows_of = WeightRows::Q8 {
                values: &weight,
                scales: &scales,
                block,
            };
            close(&product(rows_of, &x));
            for kernel in &kernels {
                let mut out = vec![1.0; rows];
                kernel(&weight, &scales, block, &x, &mut out);
                close(&out.iter().map(|y| y - 1.0).collect::<Vec<_>>());
            }
        }
    }

    #[test]
    #[should_panic(expected = "matvec: weight is not [out.len(), x.len()]")]
    fn a_weight_of_the_wrong_size_is_a_programming_error() {
        matvec(WeightRows::F32(&[0.0; 10]), &[0.0; 3], &mut [0.0; 3]);
    }
}
