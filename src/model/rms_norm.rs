use burn::module::{Module, Param};
use burn::tensor::Tensor;

use super::cpu;

/// Root-mean-square layer norm: `x / sqrt(mean(x²) + ε) · w`, per token.
#[derive(Module, Debug)]
pub struct RmsNorm {
    weight: Param<Tensor<1>>,
    eps: f64,
}

impl RmsNorm {
    pub fn new(weight: Tensor<1>, eps: f64) -> Self {
        Self {
            weight: Param::from_tensor(weight),
            eps,
        }
    }

    /// `x`: `[tokens, hidden]`.
    pub fn forward(&self, x: Tensor<2>) -> Tensor<2> {
        if let Some(y) = cpu::rms_norm(&x, &self.weight.val(), self.eps) {
            return y;
        }
        let inv_rms = x
            .clone()
            .square()
            .mean_dim(1)
            .add_scalar(self.eps)
            .sqrt()
            .recip();
        x * inv_rms * self.weight.val().unsqueeze::<2>()
    }
}
