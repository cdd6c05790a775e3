use std::sync::Arc;

use burn::module::{Module, Param};
use burn::tensor::quantization::QuantScheme;
use burn::tensor::{DType, Tensor};

use super::cpu;
use super::gpu;
use super::rms_norm::RmsNorm;

/// A projection `y = x Wᵀ (+ b)` with `W` kept in Hugging Face's `[out, in]` layout.
///
/// Keeping the stored layout means loading needs no transpose, fused projections are plain
/// row-stacks of their parts, and the tied LM head is the embedding matrix itself.
#[derive(Module, Debug)]
pub struct Linear {
    /// `[out]`, added after the product; only Qwen2's query, key and value projections have
    /// one.
    bias: Option<Param<Tensor<1>>>,
    /// `None` when the weight is held only as the CPU kernels read it (a GGUF file's
    /// integers, which no Burn tensor type holds exactly; floats laid out by lane).
    weight: Option<Param<Tensor<2>>>,
    /// The same weight as the CPU kernels read it, extracted once (see [`cpu::Weight`]);
    /// `None` off the CPU backends.
    #[module(skip)]
    kernel_weight: Option<cpu::Weight>,
}

impl Linear {
    pub fn new(weight: Tensor<2>) -> Self {
        Self {
            bias: None,
            kernel_weight: cpu::Weight::of(&weight),
            weight: Some(Param::from_tensor(weight)),
        }
    }

    /// A projection by integer weights, multiplied as stored by the CPU kernels.
    pub fn integers(weight: Arc<cpu::IntegerWeights>) -> Self {
        Self::stored(cpu::Weight::Integers(weight))
    }

    /// A projection the CPU kernels hold as stored, with no tensor of its own.
    pub fn stored(weight: cpu::Weight) -> Self {
        Self {
            bias: None,
            weight: None,
            kernel_weight: Some(weight),
        }
    }

    /// The same projection plus `bias`: `[out]`.
    pub fn with_bias(self, bias: Tensor<1>) -> Self {
        Self {
            bias: Some(Param::from_tensor(bias)),
            ..self
        }
    }

    /// The same projection with its weight stored in `scheme`'s integers.
    pub fn quantized(self, scheme: &QuantScheme) -> Self {
        let Some(weight) = self.weight else {
            return self;
        };
        let weight = weight.val();
        Self {
            bias: self.bias,
            ..Self::new(
                cpu::quantize(&weight, scheme).unwrap_or_else(|| weight.quantize_dynamic(scheme)),
            )
        }
    }

    /// `x`: `[tokens, in]` → `[tokens, out]`.
    pub fn forward(&self, x: Tensor<2>) -> Tensor<2> {
        self.product(x, None)
    }

    /// `residual + x Wᵀ`: on the CPU the product lands on the residual stream in the same
    /// pass, rounded once.
    pub fn add_to(&self, residual: Tensor<2>, x: Tensor<2>) -> Tensor<2> {
        self.product(x, Some(residual))
    }

    /// `norm(x) Wᵀ`: on a GPU, for one token, in one launch with the norm.
    pub fn forward_normed(&self, x: Tensor<2>, norm: &RmsNorm) -> Tensor<2> {
        if self.may_run_on_gpu() {
            let gamma = norm.weight();
            let input = gpu::Input::Normed {
                x: &x,
                gamma: &gamma,
                eps: norm.eps(),
            };
            if let Some(y) = self.on_gpu(input, None) {
                return self.biased(y);
            }
        }
        self.forward(norm.forward(x))
    }

    /// `residual + gated(x) Wᵀ`, where `x` is `[gate | up]` and `gated` is SwiGLU's
    /// `silu(gate) ⊙ up`: on a GPU, for one token, in one launch with the gate.
    pub fn add_gated_to(
        &self,
        residual: Tensor<2>,
        x: Tensor<2>,
        gated: impl FnOnce(Tensor<2>) -> Tensor<2>,
    ) -> Tensor<2> {
        if self.may_run_on_gpu()
            && self.bias.is_none()
            && let Some(y) = self.on_gpu(gpu::Input::Gated(&x), Some(&residual))
        {
            return y;
        }
        self.add_to(residual, gated(x))
    }

    /// Only weights the CPU kernels do not hold can be on a GPU; asking spares the CPU's
    /// decode steps the GPU kernels' checks.
    fn may_run_on_gpu(&self) -> bool {
        self.kernel_weight.is_none()
    }

    fn on_gpu(&self, input: gpu::Input<'_>, residual: Option<&Tensor<2>>) -> Option<Tensor<2>> {
        let weight = self.weight.as_ref()?.val();
        gpu::project(&weight, input, residual)
    }

    /// `y + b`, when the projection has a bias.
    fn biased(&self, y: Tensor<2>) -> Tensor<2> {
        match &self.bias {
            Some(bias) => y + bias.val().unsqueeze::<2>(),
            None => y,
        }
    }

    /// `x Wᵀ + b` (plus `residual`, for projections without a bias).
    fn product(&self, x: Tensor<2>, residual: Option<Tensor<2>>) -> Tensor<2> {
        if self.bias.is_some() {
            let y = self.unbiased_product(x, None);
            let y = self.biased(y);
            return match residual {
                Some(residual) => residual + y,
                None => y,
            };
        }
        self.unbiased_product(x, residual)
    }

    /// `x Wᵀ` (plus `residual`): the CPU kernels where they apply, else Burn's matmul, kept
    /// 2-D (a batched 3-D matmul against a transposed view is an order of magnitude slower on
    /// the CPU backends).
    fn unbiased_product(&self, x: Tensor<2>, residual: Option<Tensor<2>>) -> Tensor<2> {
        if let Some(y) = self
            .kernel_weight
            .as_ref()
            .and_then(|w| cpu::project(w, &x, residual.as_ref()))
        {
            return y;
        }
        if self.may_run_on_gpu()
            && let Some(y) = self.on_gpu(gpu::Input::Plain(&x), residual.as_ref())
        {
            return y;
        }
        // Float weights may be held narrower than the activations (see `Loader::storage_dtype`).
        let weight = match &self.weight {
            Some(weight) => weight.val(),
            // Only `Linear::stored` holds no tensor, and its weights (integers, or floats
            // laid out by lane) always widen.
            None => self
                .kernel_weight
                .as_ref()
                .and_then(|weight| weight.dense(&x.device()))
                .expect("a Linear without a tensor holds weights that widen"),
        };
        let weight = match weight.dtype() {
            stored @ (DType::F32 | DType::BF16 | DType::F16) if stored != x.dtype() => {
                weight.cast(x.dtype())
            }
            _ => weight,
        };
        let y = x.matmul(weight.transpose());
        match residual {
            Some(residual) => residual + y,
            None => y,
        }
    }
}
