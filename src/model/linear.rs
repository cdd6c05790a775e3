use burn::module::{Module, Param};
use burn::tensor::Tensor;

/// A bias-free projection `y = x Wᵀ` with `W` kept in Hugging Face's `[out, in]` layout.
///
/// Keeping the stored layout means loading needs no transpose, fused projections are plain
/// row-stacks of their parts, and the tied LM head is the embedding matrix itself.
#[derive(Module, Debug)]
pub struct Linear {
    weight: Param<Tensor<2>>,
}

impl Linear {
    pub fn new(weight: Tensor<2>) -> Self {
        Self {
            weight: Param::from_tensor(weight),
        }
    }

    /// `x`: `[tokens, in]` → `[tokens, out]`. Kept 2-D: a batched 3-D matmul against the
    /// transposed view is an order of magnitude slower on the CPU backends.
    pub fn forward(&self, x: Tensor<2>) -> Tensor<2> {
        x.matmul(self.weight.val().transpose())
    }
}
