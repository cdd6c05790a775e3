use burn::module::Module;
use burn::tensor::{DType, Device, Tensor, TensorData};

/// Rotary position embedding in Hugging Face's "rotate_half" layout: the two halves of each
/// head vector, not interleaved pairs, form the rotated coordinates.
///
/// `rope(x) = x·cos + rotate_half(x)·sin` with `rotate_half([a, b]) = [-b, a]`. We store `sin`
/// with its first half negated, so the rotation is `x·cos + [b, a]·sin'`: one swap of halves
/// per call and no negation.
#[derive(Module, Debug)]
pub struct RotaryEmbedding {
    /// `[max_positions, head_dim]`
    cos: Tensor<2>,
    /// `[max_positions, head_dim]`, first half negated.
    signed_sin: Tensor<2>,
    half: usize,
}

impl RotaryEmbedding {
    /// Tables are computed as transformers computes them (f32 inverse frequencies, f32
    /// angles), so positions far into the context agree with the reference to the last bit
    /// that matters.
    pub fn new(
        head_dim: usize,
        max_positions: usize,
        theta: f64,
        device: &Device,
        dtype: DType,
    ) -> Self {
        let half = head_dim / 2;
        let inv_freq: Vec<f32> = (0..half)
            .map(|i| 1.0 / (theta as f32).powf((2 * i) as f32 / head_dim as f32))
            .collect();
        let mut cos = Vec::with_capacity(max_positions * head_dim);
        let mut signed_sin = Vec::with_capacity(max_positions * head_dim);
        for position in 0..max_positions {
            let angles: Vec<f32> = inv_freq.iter().map(|f| position as f32 * f).collect();
            for half_index in 0..2 {
                cos.extend(angles.iter().map(|a| a.cos()));
                let sign = if half_index == 0 { -1.0 } else { 1.0 };
                signed_sin.extend(angles.iter().map(|a| sign * a.sin()));
            }
        }
        let table = |values: Vec<f32>| {
            Tensor::<2>::from_data(TensorData::new(values, [max_positions, head_dim]), device)
                .cast(dtype)
        };
        Self {
            cos: table(cos),
            signed_sin: table(signed_sin),
            half,
        }
    }

    /// The tables `[max_positions, head_dim]`: cosines, and sines with their first half
    /// negated.
    pub fn tables(&self) -> (&Tensor<2>, &Tensor<2>) {
        (&self.cos, &self.signed_sin)
    }

    /// `x`: `[heads, tokens, head_dim]` for the positions `start..start + tokens`.
    pub fn forward(&self, x: Tensor<3>, start: usize) -> Tensor<3> {
        let [_, tokens, _] = x.dims();
        let rows = start..start + tokens;
        let cos = self.cos.clone().slice([rows.clone()]).unsqueeze::<3>();
        let sin = self.signed_sin.clone().slice([rows]).unsqueeze::<3>();
        let swapped = Tensor::cat(
            vec![
                x.clone().narrow(2, self.half, self.half),
                x.clone().narrow(2, 0, self.half),
            ],
            2,
        );
        x * cos + swapped * sin
    }
}
