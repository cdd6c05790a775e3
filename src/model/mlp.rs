use burn::module::Module;
use burn::tensor::Tensor;
use burn::tensor::activation::silu;

use super::checkpoint::{LayerRole, TensorRole};
use super::cpu;
use super::error::Result;
use super::family::Family;
use super::linear::Linear;
use super::loader::Loader;
use super::rms_norm::RmsNorm;

/// The SwiGLU feed-forward block: `down(silu(gate(x)) ⊙ up(x))`.
///
/// `gate` and `up` are one fused matmul whose output halves are the two projections.
#[derive(Module, Debug)]
pub struct Mlp {
    gate_up: Linear,
    down: Linear,
    intermediate: usize,
}

impl Mlp {
    pub fn load(loader: &mut Loader, layer: usize, family: &Family) -> Result<Self> {
        let role = |role| TensorRole::Layer(layer, role);
        let gate_up: Vec<TensorRole> = LayerRole::gate_up(family)
            .iter()
            .map(|&part| role(part))
            .collect();
        Ok(Self {
            gate_up: loader.projection(&gate_up)?,
            down: loader.projection(&[role(LayerRole::Down)])?,
            intermediate: loader.config().intermediate_size,
        })
    }

    /// `x + mlp(norm(x))` for `x`: `[tokens, hidden]`.
    pub fn add_to(&self, x: Tensor<2>, norm: &RmsNorm) -> Tensor<2> {
        let gate_up = self.gate_up.forward_normed(x.clone(), norm);
        self.down.add_gated_to(x, gate_up, |gate_up| {
            cpu::swiglu(&gate_up).unwrap_or_else(|| {
                let gate = gate_up.clone().narrow(1, 0, self.intermediate);
                let up = gate_up.narrow(1, self.intermediate, self.intermediate);
                silu(gate) * up
            })
        })
    }
}
