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
    /// The norm whose weight is `role`, with the config's ε. Gemma stores each weight as an
    /// offset from one (`x · (1 + w)`): it is held as `1 + w`, computed once here in the
    /// compute type (f32 by default, where transformers computes it too).
    pub fn load(loader: &mut Loader, role: TensorRole) -> Result<Self> {
        let mut weight = loader.vector(role)?;
        if loader.norm_weights_offset() {
            weight = weight.add_scalar(1.0);
        }
        Ok(Self {
            weight: Param::from_tensor(weight),
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
