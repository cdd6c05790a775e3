use burn::module::Module;
use burn::tensor::Tensor;
use burn::tensor::activation::silu;

use super::checkpoint::{LayerRole, TensorRole};
use super::cpu;
use super::error::Result;
use super::family::{Activation, Family};
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
    /// Gemma 3's norm of the down projection's result, before the residual add.
    output_norm: Option<RmsNorm>,
    #[module(skip)]
    activation: Activation,
}

impl Mlp {
    pub fn load(loader: &mut Loader, layer: usize, family: &Family) -> Result<Self> {
        let role = |role| TensorRole::Layer(layer, role);
        let gate_up: Vec<TensorRole> = LayerRole::gate_up(family)
            .iter()
            .map(|&part| role(part))
            .collect();
        let output_norm = if family.gemma_norms {
            Some(RmsNorm::load(
                loader,
                role(LayerRole::FeedForwardOutputNorm),
            )?)
        } else {
            None
        };
        Ok(Self {
            gate_up: loader.projection(&gate_up)?,
            down: loader.projection(&[role(LayerRole::Down)])?,
            intermediate: loader.config().intermediate_size,
            output_norm,
            activation: family.activation,
        })
    }

    /// `x + mlp(norm(x))` for `x`: `[tokens, hidden]`.
    pub fn add_to(&self, x: Tensor<2>, norm: &RmsNorm) -> Tensor<2> {
        let gate_up = self.gate_up.forward_normed(x.clone(), norm);
        match &self.output_norm {
            Some(output_norm) => x + output_norm.forward(self.down.forward(self.gated(gate_up))),
            None => self
                .down
                .add_gated_to(x, gate_up, |gate_up| self.gated(gate_up)),
        }
    }

    /// `activation(gate) ⊙ up` of `[gate | up]`.
    fn gated(&self, gate_up: Tensor<2>) -> Tensor<2> {
        let halves = |gate_up: Tensor<2>| {
            let gate = gate_up.clone().narrow(1, 0, self.intermediate);
            let up = gate_up.narrow(1, self.intermediate, self.intermediate);
            (gate, up)
        };
        cpu::gated(&gate_up, self.activation).unwrap_or_else(|| {
            let (gate, up) = halves(gate_up);
            match self.activation {
                Activation::Silu => silu(gate) * up,
                Activation::GeluTanh => gelu_tanh(gate) * up,
            }
        })
    }
}

/// GELU by its tanh approximation, as PyTorch's `gelu(approximate="tanh")` computes it:
/// `½ x (1 + tanh(√(2/π) (x + 0.044715 x³)))`.
fn gelu_tanh(x: Tensor<2>) -> Tensor<2> {
    let inner = (x.clone() + x.clone().powi_scalar(3).mul_scalar(0.044715))
        .mul_scalar((2.0 / std::f64::consts::PI).sqrt());
    x.clone().mul_scalar(0.5) * inner.tanh().add_scalar(1.0)
}
