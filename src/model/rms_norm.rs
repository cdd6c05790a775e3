use burn::module::{Module, Param};
use burn::tensor::Tensor;

use super::checkpoint::TensorRole;
use super::cpu;
use super::error::Result;
use super::loader::Loader;

/// Root-mean-square layer norm: `x / sqrt(mean(x²) + ε) · w`, per token.
#[derive(Module, Debug)]
pub struct RmsNorm {
    weight: Param<Tensor<1>>,
    eps: f64,
}

impl RmsNorm {
    /// The norm whose weight is `role`, with the config's ε.
    pub fn load(loader: &mut Loader, role: TensorRole) -> Result<Self> {
        Ok(Self {
            weight: Param::from_tensor(loader.vector(role)?),
            eps: loader.config().rms_norm_eps,
        })
    }

    /// The per-channel scale `[hidden]`.
    pub fn weight(&self) -> Tensor<1> {
        self.weight.val()
    }

    pub fn eps(&self) -> f64 {
        self.eps
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
