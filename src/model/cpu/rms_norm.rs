//! RMSNorm in one pass per row: Burn's composition of it is seven operations, each with its
//! own output tensor, which cost more than the arithmetic in a decode step.

use burn::tensor::Tensor;

use super::host::{HostFloat, HostTensor, with_host_float};
use super::threads::split_rows;

/// Rows shorter than this many elements in total are normalized on the calling thread.
const MIN_ELEMENTS_PER_PART: usize = 32 * 1024;

/// `x / sqrt(mean(x²) + eps) · weight` per row of `x`: `[rows, dim]`, or `None` off the CPU
/// backends.
pub fn rms_norm(x: &Tensor<2>, weight: &Tensor<1>, eps: f64) -> Option<Tensor<2>> {
    let shape = x.dims();
    let x = HostTensor::of(x)?;
    let weight = HostTensor::of(weight)?;
    with_host_float!(x.dtype(), E => {
        let (x_values, weight) = (x.slice::<E>()?, weight.slice::<E>()?);
        let mut out = vec![E::from_f32(0.0); x_values.len()];
        normalize_rows(x_values, weight, eps as f32, &mut out);
        Some(x.tensor_like(out, shape))
    })
}

/// Sums of squares are taken in f32 whatever the element type, as transformers does.
pub fn normalize_rows<E: HostFloat>(x: &[E], weight: &[E], eps: f32, out: &mut [E]) {
    let dim = weight.len();
    let min_rows = MIN_ELEMENTS_PER_PART.div_ceil(dim.max(1));
    split_rows(out, dim, min_rows, &|first, out: &mut [E]| {
        let x = &x[first * dim..first * dim + out.len()];
        for (x, y) in x.chunks_exact(dim).zip(out.chunks_exact_mut(dim)) {
            let sum_of_squares: f32 = x.iter().map(|&v| v.to_f32() * v.to_f32()).sum();
            let scale = 1.0 / (sum_of_squares / dim as f32 + eps).sqrt();
            for ((y, &x), &w) in y.iter_mut().zip(x).zip(weight) {
                *y = E::from_f32(x.to_f32() * scale * w.to_f32());
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::normalize_rows;

    #[test]
    fn each_row_has_unit_root_mean_square_before_the_weight() {
        let x = [3.0f32, 4.0, 0.0, 0.0, 1.0, 1.0];
        let weight = [1.0f32, 2.0];
        let mut out = [0.0f32; 6];
        normalize_rows(&x, &weight, 1e-5, &mut out);
        let rms = (12.5f32 + 1e-5).sqrt();
        let expected = [3.0 / rms, 8.0 / rms, 0.0, 0.0, 1.0, 2.0];
        for (got, want) in out.iter().zip(expected) {
            assert!((got - want).abs() < 1e-4, "{out:?}");
        }
    }
}
