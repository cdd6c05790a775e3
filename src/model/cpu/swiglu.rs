//! The SwiGLU gate, `silu(gate) ⊙ up`, read straight from the fused gate/up projection.

use burn::tensor::Tensor;

use super::host::{HostFloat, HostTensor, with_host_float};
use super::math::exp_in_place;
use super::threads::split_rows;

/// Rows shorter than this many outputs in total are gated on the calling thread.
const MIN_ELEMENTS_PER_PART: usize = 16 * 1024;

/// `gate_up`: `[rows, 2 · inner]`, the gate in the first half of each row and the up
/// projection in the second; returns `silu(gate) ⊙ up`: `[rows, inner]`, or `None` off the CPU
/// backends.
pub fn swiglu(gate_up: &Tensor<2>) -> Option<Tensor<2>> {
    let [rows, width] = gate_up.dims();
    let inner = width / 2;
    let gate_up = HostTensor::of(gate_up)?;
    with_host_float!(gate_up.dtype(), E => {
        let mut out = vec![E::from_f32(0.0); rows * inner];
        gate_rows(gate_up.slice::<E>()?, inner, &mut out);
        Some(gate_up.tensor_like(out, [rows, inner]))
    })
}

/// `gate_up` holds rows of `2 · inner` values, `out` rows of `inner`.
pub fn gate_rows<E: HostFloat>(gate_up: &[E], inner: usize, out: &mut [E]) {
    let min_rows = MIN_ELEMENTS_PER_PART.div_ceil(inner.max(1));
    split_rows(out, inner, min_rows, &|first, out: &mut [E]| {
        gate(&gate_up[first * 2 * inner..], out, inner);
    });
}

#[multiversion::multiversion(targets("x86_64+avx2+fma"))]
fn gate<E: HostFloat>(gate_up: &[E], out: &mut [E], inner: usize) {
    let mut decay = vec![0.0; inner];
    for (y, row) in out
        .chunks_exact_mut(inner)
        .zip(gate_up.chunks_exact(2 * inner))
    {
        let (gate, up) = row.split_at(inner);
        for (d, &g) in decay.iter_mut().zip(gate) {
            *d = -g.to_f32();
        }
        exp_in_place(&mut decay);
        for (((y, &g), &u), d) in y.iter_mut().zip(gate).zip(up).zip(&decay) {
            *y = E::from_f32(g.to_f32() / (1.0 + d) * u.to_f32());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::gate_rows;

    #[test]
    fn gates_each_row_with_its_own_halves() {
        let gate_up = [
            0.0f32, 2.0, 5.0, 7.0, //
            -1.0, 1.0, 3.0, -2.0, //
            4.0, -3.0, 0.5, 0.25,
        ];
        let mut out = [0.0f32; 6];
        gate_rows(&gate_up, 2, &mut out);
        let silu = |x: f32| x / (1.0 + (-x).exp());
        let expected = [
            0.0,
            silu(2.0) * 7.0,
            silu(-1.0) * 3.0,
            silu(1.0) * -2.0,
            silu(4.0) * 0.5,
            silu(-3.0) * 0.25,
        ];
        for (got, want) in out.iter().zip(expected) {
            assert!((got - want).abs() < 1e-6, "{out:?}");
        }
    }
}
