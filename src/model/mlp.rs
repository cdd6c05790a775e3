use burn::module::Module;
use burn::tensor::Tensor;
use burn::tensor::activation::silu;

use super::cpu;
use super::linear::Linear;

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
    pub fn new(gate_up: Linear, down: Linear, intermediate: usize) -> Self {
        Self {
            gate_up,
            down,
            intermediate,
        }
    }

    /// `residual + mlp(x)` for `x`: `[tokens, hidden]`.
    pub fn forward(&self, x: Tensor<2>, residual: Tensor<2>) -> Tensor<2> {
        let gate_up = self.gate_up.forward(x);
        let gated = cpu::swiglu(&gate_up).unwrap_or_else(|| {
            let gate = gate_up.clone().narrow(1, 0, self.intermediate);
            let up = gate_up.narrow(1, self.intermediate, self.intermediate);
            silu(gate) * up
        });
        self.down.forward_onto(gated, residual)
    }
}
