//! The gated feed-forward's gate, `activation(gate) ⊙ up`, read straight from the fused
//! gate/up projection: SwiGLU's `silu`, and Gemma's GELU by its tanh approximation.
//!
//! Both are `g · sigmoid(s)`: `s = g` for `silu`, and since `½ (1 + tanh t) = sigmoid(2t)`,
//! `s = 2 √(2/π) (g + 0.044715 g³)` for GELU. One pass of the vectorized exponential serves
//! both, where Burn's composition of GELU made eight passes over the gate, one of them a
//! scalar `tanh` per value.

use burn::tensor::Tensor;

use super::host::{HostFloat, HostTensor, with_host_float};
use super::math::exp_in_place;
use super::threads::{filled, split_rows};
use crate::model::family::Activation;

/// Rows shorter than this many outputs in total are gated on the calling thread.
const MIN_ELEMENTS_PER_PART: usize = 16 * 1024;

/// `gate_up`: `[rows, 2 · inner]`, the gate in the first half of each row and the up
/// projection in the second; returns `activation(gate) ⊙ up`: `[rows, inner]`, or `None` off
/// the CPU backends.
pub fn gated(gate_up: &Tensor<2>, activation: Activation) -> Option<Tensor<2>> {
    let [rows, width] = gate_up.dims();
    let inner = width / 2;
    let gate_up = HostTensor::of(gate_up)?;
    with_host_float!(gate_up.dtype(), E => {
        let mut out = filled(rows * inner, E::from_f32(0.0));
        gate_rows(gate_up.slice::<E>()?, inner, activation, &mut out);
        Some(gate_up.tensor_like(out, [rows, inner]))
    })
}

/// `gate_up` holds rows of `2 · inner` values, `out` rows of `inner`.
pub fn gate_rows<E: HostFloat>(gate_up: &[E], inner: usize, activation: Activation, out: &mut [E]) {
    let min_rows = MIN_ELEMENTS_PER_PART.div_ceil(inner.max(1));
    split_rows(out, inner, min_rows, &|first, out: &mut [E]| {
        gate(&gate_up[first * 2 * inner..], out, inner, activation);
    });
}

/// `2 √(2/π)` and `2 √(2/π) · 0.044715`: GELU's sigmoid argument is `g · (A + B g²)`.
const GELU_A: f32 = 1.595_769_2;
const GELU_B: f32 = GELU_A * 0.044_715;

#[multiversion::multiversion(targets("x86_64+avx2+fma"))]
fn gate<E: HostFloat>(gate_up: &[E], out: &mut [E], inner: usize, activation: Activation) {
    let mut decay = vec![0.0; inner];
    for (y, row) in out
        .chunks_exact_mut(inner)
        .zip(gate_up.chunks_exact(2 * inner))
    {
        let (gate, up) = row.split_at(inner);
        // `-s` of `g · sigmoid(s)`, whose exponential the next line takes.
        match activation {
            Activation::Silu => {
                for (d, &g) in decay.iter_mut().zip(gate) {
                    *d = -g.to_f32();
                }
            }
            Activation::GeluTanh => {
                for (d, &g) in decay.iter_mut().zip(gate) {
                    let g = g.to_f32();
                    *d = -g * (GELU_A + GELU_B * g * g);
                }
            }
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
    use crate::model::family::Activation;

    #[test]
    fn gates_each_row_with_its_own_halves() {
        let gate_up = [
            0.0f32, 2.0, 5.0, 7.0, //
            -1.0, 1.0, 3.0, -2.0, //
            4.0, -3.0, 0.5, 0.25,
        ];
        let mut out = [0.0f32; 6];
        gate_rows(&gate_up, 2, Activation::Silu, &mut out);
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

    /// Against PyTorch's formula in f64, from far below zero (where the gate closes, and
    /// the exponential overflows) to far above.
    #[test]
    fn gelu_gates_as_pytorchs_tanh_formula() {
        let gate: Vec<f32> = (-200..=200).map(|i| i as f32 * 0.06).collect();
        let gate_up: Vec<f32> = gate.iter().flat_map(|&g| [g, 1.5]).collect();
        let mut out = vec![0.0f32; gate.len()];
        gate_rows(&gate_up, 1, Activation::GeluTanh, &mut out);
        for (&g, &y) in gate.iter().zip(&out) {
            let x = f64::from(g);
            let t = ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x.powi(3))).tanh();
            let want = 0.5 * x * (1.0 + t) * 1.5;
            assert!(
                (f64::from(y) - want).abs() <= 2e-6 * want.abs().max(1.0),
                "{g}: {y} against {want}"
            );
        }
    }
}
