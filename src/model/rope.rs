use std::ops::Range;

use burn::tensor::{DType, Device, Tensor, TensorData};

use super::config::{Llama3RopeScaling, LongRopeScaling};

/// How the RoPE frequencies are scaled.
#[derive(Debug, Clone, PartialEq)]
pub enum FrequencyScaling {
    /// Llama 3's formula from its parameters, as transformers computes it.
    Llama3(Llama3RopeScaling),
    /// Each frequency divided by its factor, as llama.cpp applies a GGUF file's
    /// `rope_freqs.weight` (its converter writes Llama 3's scaling so).
    Factors(Vec<f32>),
    /// Phi-3's LongRoPE.
    LongRope(LongRopeScaling),
    /// Every frequency divided by the factor.
    Linear(f32),
}

/// Rotary position embedding in Hugging Face's "rotate_half" layout: the two halves of each
/// head vector, not interleaved pairs, form the rotated coordinates.
///
/// `rope(x) = x·cos + rotate_half(x)·sin` with `rotate_half([a, b]) = [-b, a]`. We store `sin`
/// with its first half negated, so the rotation is `x·cos + [b, a]·sin'`: one swap of halves
/// per call and no negation.
///
/// Only the frequencies are kept; each forward pass computes the cosines and sines of its own
/// positions ([`RotaryEmbedding::positions`]). Tables for the whole context were 4 MiB of
/// SmolLM2's ~140, a few thousand sines per prompt cost nothing next to the model, and the
/// angles are the same f32 products either way.
#[derive(Clone, Debug)]
pub struct RotaryEmbedding {
    inv_freq: Vec<f32>,
    /// LongRoPE's frequencies for a pass that reaches past this many positions.
    long: Option<(usize, Vec<f32>)>,
    /// What cosines and sines are multiplied by (LongRoPE's attention factor; else 1): the
    /// first `rotated_pairs` pairs'; the ones past a partial rotation pass unscaled.
    scale: f32,
    rotated_pairs: usize,
    device: Device,
    dtype: DType,
}

/// The rotation of a run of consecutive positions.
#[derive(Clone, Debug)]
pub struct RopeRows {
    /// `[positions, head_dim]`
    cos: Tensor<2>,
    /// `[positions, head_dim]`, first half negated.
    signed_sin: Tensor<2>,
}

impl RotaryEmbedding {
    /// Frequencies are computed as transformers computes them (f32 inverse frequencies, f32
    /// angles), so positions far into the context agree with the reference to the last bit
    /// that matters.
    ///
    /// `rotary_dim` below `head_dim` rotates part of each head (Phi-4-mini's
    /// `partial_rotary_factor`): its frequencies are those of a head of `rotary_dim`, and the
    /// pairs past them turn by zero. That equals rotating the first `rotary_dim` values in
    /// halves of their own once the query and key rows are laid out so (see
    /// [`crate::model::ModelConfig::rotary_dim`] and `Loader::projection`).
    pub fn new(
        head_dim: usize,
        rotary_dim: usize,
        theta: f64,
        scaling: Option<&FrequencyScaling>,
        device: &Device,
        dtype: DType,
    ) -> Self {
        let padded = |mut inv_freq: Vec<f32>| {
            inv_freq.resize(head_dim / 2, 0.0);
            inv_freq
        };
        let (long, scale) = match scaling {
            Some(FrequencyScaling::LongRope(long_rope)) => (
                Some((
                    long_rope.original_max_position_embeddings,
                    padded(divided(rotary_dim, theta, &long_rope.long_factor)),
                )),
                long_rope.attention_factor,
            ),
            _ => (None, 1.0),
        };
        Self {
            inv_freq: padded(inverse_frequencies(rotary_dim, theta, scaling)),
            long,
            scale,
            rotated_pairs: rotary_dim / 2,
            device: device.clone(),
            dtype,
        }
    }

    /// The rotation by angle zero at every position (cosines one, sines zero): the layers
    /// of a family that gives some layers no positions multiply by it and come out
    /// unchanged, bit for bit, through the same kernels as the others.
    pub fn identity(head_dim: usize, device: &Device, dtype: DType) -> Self {
        Self {
            inv_freq: vec![0.0; head_dim / 2],
            long: None,
            scale: 1.0,
            rotated_pairs: 0,
            device: device.clone(),
            dtype,
        }
    }

    /// The cosines and sines of the positions `positions`.
    ///
    /// With LongRoPE a pass whose last position lies past the original context takes the
    /// long factors for all its positions, as transformers decides per forward pass.
    pub fn positions(&self, positions: Range<usize>) -> RopeRows {
        let inv_freq = match &self.long {
            Some((original, long)) if positions.end > *original => long,
            _ => &self.inv_freq,
        };
        let head_dim = 2 * inv_freq.len();
        let count = positions.len();
        let scales: Vec<f32> = (0..inv_freq.len())
            .map(|pair| {
                if pair < self.rotated_pairs {
                    self.scale
                } else {
                    1.0
                }
            })
            .collect();
        let mut cos = Vec::with_capacity(count * head_dim);
        let mut signed_sin = Vec::with_capacity(count * head_dim);
        for position in positions {
            let angles: Vec<f32> = inv_freq.iter().map(|f| position as f32 * f).collect();
            for half_index in 0..2 {
                cos.extend(angles.iter().zip(&scales).map(|(a, s)| a.cos() * s));
                let sign = if half_index == 0 { -1.0 } else { 1.0 };
                signed_sin.extend(
                    angles
                        .iter()
                        .zip(&scales)
                        .map(|(a, s)| sign * (a.sin() * s)),
                );
            }
        }
        let table = |values: Vec<f32>| {
            Tensor::<2>::from_data(TensorData::new(values, [count, head_dim]), &self.device)
                .cast(self.dtype)
        };
        RopeRows {
            cos: table(cos),
            signed_sin: table(signed_sin),
        }
    }
}

impl RopeRows {
    /// `[positions, head_dim]` each: cosines, and sines with their first half negated.
    pub fn tables(&self) -> (&Tensor<2>, &Tensor<2>) {
        (&self.cos, &self.signed_sin)
    }

    /// `x`: `[heads, positions, head_dim]`, for these positions.
    pub fn forward(&self, x: Tensor<3>) -> Tensor<3> {
        let half = x.dims()[2] / 2;
        let cos = self.cos.clone().unsqueeze::<3>();
        let sin = self.signed_sin.clone().unsqueeze::<3>();
        let swapped = Tensor::cat(
            vec![
                x.clone().narrow(2, half, half),
                x.clone().narrow(2, 0, half),
            ],
            2,
        );
        x * cos + swapped * sin
    }
}

/// For a rotation over the first `rotary_dim` values of each head, which value of the stored
/// head each value of the head as [`RotaryEmbedding`] rotates it comes from: the rotated
/// halves `0..r/2` and `r/2..r` go to the heads of the two halves, the values past them fill
/// what is left of each half (where the frequencies are zero).
pub fn partial_rotation_order(head_dim: usize, rotary_dim: usize) -> Vec<usize> {
    let (half, rotated_half) = (head_dim / 2, rotary_dim / 2);
    let passed_half = half - rotated_half;
    let mut source = vec![0; head_dim];
    for i in 0..rotated_half {
        source[i] = i;
        source[half + i] = rotated_half + i;
    }
    for k in 0..passed_half {
        source[rotated_half + k] = rotary_dim + k;
        source[half + rotated_half + k] = rotary_dim + passed_half + k;
    }
    source
}

/// `θ^(-2i/d)` for each pair of dimensions, in f32 as transformers computes them, scaled.
fn inverse_frequencies(
    head_dim: usize,
    theta: f64,
    scaling: Option<&FrequencyScaling>,
) -> Vec<f32> {
    let half = head_dim / 2;
    let plain = (0..half).map(|i| 1.0 / (theta as f32).powf((2 * i) as f32 / head_dim as f32));
    match scaling {
        None => plain.collect(),
        Some(FrequencyScaling::Llama3(s)) => llama3_scaled(plain, s),
        Some(FrequencyScaling::Factors(factors)) => plain
            .zip(factors)
            .map(|(inv_freq, factor)| inv_freq / factor)
            .collect(),
        Some(FrequencyScaling::LongRope(long_rope)) => {
            divided(head_dim, theta, &long_rope.short_factor)
        }
        Some(FrequencyScaling::Linear(factor)) => plain.map(|inv_freq| inv_freq / factor).collect(),
    }
}

/// LongRoPE's `1 / (factor · θ^(2i/d))`, in f32 as transformers computes it.
fn divided(head_dim: usize, theta: f64, factors: &[f32]) -> Vec<f32> {
    factors
        .iter()
        .enumerate()
        .map(|(i, factor)| 1.0 / (factor * (theta as f32).powf((2 * i) as f32 / head_dim as f32)))
        .collect()
}

/// With Llama 3 scaling, frequencies whose wavelength exceeds the original context divided by
/// `low_freq_factor` are divided by `factor`, those shorter than it divided by
/// `high_freq_factor` are kept, and the ones between are blended smoothly.
fn llama3_scaled(plain: impl Iterator<Item = f32>, s: &Llama3RopeScaling) -> Vec<f32> {
    let (factor, low, high, original) = (
        s.factor as f32,
        s.low_freq_factor as f32,
        s.high_freq_factor as f32,
        s.original_max_position_embeddings as f32,
    );
    let (long_wavelength, short_wavelength) = (original / low, original / high);
    plain
        .map(|inv_freq| {
            let wavelength = 2.0 * std::f32::consts::PI / inv_freq;
            if wavelength < short_wavelength {
                inv_freq
            } else if wavelength > long_wavelength {
                inv_freq / factor
            } else {
                let smooth = (original / wavelength - low) / (high - low);
                (1.0 - smooth) * inv_freq / factor + smooth * inv_freq
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// transformers' frequencies for these parameters (`tests/reference/llama3_rope_reference.py`).
    #[test]
    fn llama3_scaling_matches_transformers() {
        let scaling = Llama3RopeScaling {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 16.0,
        };
        let expected: [f64; 8] = [
            5.760563612e-01,
            3.952847049e-02,
            1.250000019e-02,
            3.952847328e-03,
            1.249999972e-03,
            3.952847328e-04,
            1.250000059e-04,
            3.952847328e-05,
        ];
        let ours = inverse_frequencies(16, 10000.0, Some(&FrequencyScaling::Llama3(scaling)));
        for (i, (&ours, theirs)) in ours.iter().zip(expected).enumerate() {
            assert!(
                ((f64::from(ours) - theirs) / theirs).abs() < 1e-6,
                "{i}: {ours} vs {theirs}"
            );
        }
    }

    /// The order puts every stored value once, and is the identity for a whole rotation.
    #[test]
    fn partial_rotation_order_is_a_permutation() {
        assert_eq!(partial_rotation_order(8, 8), (0..8).collect::<Vec<_>>());
        // Pairs (0, 2), (1, 3) rotate; 4..8 pass.
        assert_eq!(partial_rotation_order(8, 4), [0, 1, 4, 5, 2, 3, 6, 7]);
        let mut order = partial_rotation_order(96, 72);
        order.sort_unstable();
        assert_eq!(order, (0..96).collect::<Vec<_>>());
    }

    /// LongRoPE takes its short factors for a pass within the original context and its long
    /// ones for a pass that reaches past it, and scales cosines and sines alike.
    #[test]
    fn long_rope_takes_the_long_factors_past_the_original_context() {
        let scaling = LongRopeScaling {
            short_factor: vec![1.0, 2.0],
            long_factor: vec![4.0, 8.0],
            original_max_position_embeddings: 8,
            attention_factor: 1.5,
        };
        let rope = RotaryEmbedding::new(
            4,
            4,
            100.0,
            Some(&FrequencyScaling::LongRope(scaling)),
            &Device::flex(),
            DType::F32,
        );
        let angle = |rows: &RopeRows, row: usize, i: usize| -> f32 {
            let (cos, sin) = rows.tables();
            let cos: Vec<f32> = cos.clone().into_data().try_to_vec().expect("f32");
            let sin: Vec<f32> = sin.clone().into_data().try_to_vec().expect("f32");
            let (c, s) = (cos[row * 4 + i] / 1.5, sin[row * 4 + 2 + i] / 1.5);
            assert!(
                (c * c + s * s - 1.0).abs() < 1e-5,
                "scaled by the attention factor"
            );
            s.atan2(c)
        };
        let within = rope.positions(7..8);
        let past = rope.positions(7..9);
        // Position 7, pair 1: 7 / (2 · 100^(2/4)) within; 7 / (8 · 10) past.
        assert!((angle(&within, 0, 1) - 0.35).abs() < 1e-5);
        assert!((angle(&past, 0, 1) - 0.0875).abs() < 1e-5);
    }

    /// The factors llama.cpp's converter writes for Llama 3's scaling (1 for short
    /// wavelengths, `factor` for long ones, `1 / ((1 − smooth) / factor + smooth)` between)
    /// give transformers' frequencies.
    #[test]
    fn stored_factors_give_llama3_frequencies() {
        let scaling = Llama3RopeScaling {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 16.0,
        };
        let plain = inverse_frequencies(16, 10000.0, None);
        let factors: Vec<f32> = plain
            .iter()
            .map(|&inv_freq| {
                let wavelength = 2.0 * std::f32::consts::PI / inv_freq;
                if wavelength < 16.0 / 4.0 {
                    1.0
                } else if wavelength > 16.0 / 1.0 {
                    8.0
                } else {
                    let smooth = (16.0 / wavelength - 1.0) / (4.0 - 1.0);
                    1.0 / ((1.0 - smooth) / 8.0 + smooth)
                }
            })
            .collect();
        assert!(factors.iter().any(|&f| f > 1.0 && f < 8.0), "a blended one");
        let stored = inverse_frequencies(16, 10000.0, Some(&FrequencyScaling::Factors(factors)));
        let llama3 = inverse_frequencies(16, 10000.0, Some(&FrequencyScaling::Llama3(scaling)));
        for (i, (s, l)) in stored.iter().zip(&llama3).enumerate() {
            assert!(((s - l) / l).abs() < 1e-6, "{i}: {s} vs {l}");
        }
    }
}
