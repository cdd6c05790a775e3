//! How many bytes each weight costs while the model runs: decode on a CPU reads every weight
//! once per token, so fewer bytes is the main lever on speed and memory.

use burn::tensor::quantization::{QuantScheme, QuantStore, QuantValue, ScaleDtype};
use burn::tensor::{DType, Device};

/// A precision the user can pick (`--precision`, settings panel).
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Default,
    clap::ValueEnum,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// Reference quality: logits equal transformers' float32 to 1e-3. Computed in f32; on
    /// the CPU a bf16 or f16 checkpoint's matrices stay in their stored type, which widens
    /// to f32 exactly, so this reads no more bytes per token than `Bf16`. A GGUF file's
    /// integer weights stay as stored too, and multiply activations rounded to 16 bits per
    /// block of 32 (log-probabilities within 1e-2; llama.cpp's 8-bit rounding is 0.2 off).
    #[default]
    F32,
    /// The checkpoint's own storage precision: half the bytes of f32.
    Bf16,
    /// Half the bytes of f32, with more mantissa and less range than bf16.
    F16,
    /// The decoder layers' projection weights in symmetric 8-bit integers with one f32 scale
    /// per block of 32 (Burn's quantization); activations and norms stay f32, and the
    /// embedding stays float as `F32` holds it.
    Q8,
}

impl Precision {
    /// The float type activations, the KV cache and the unquantized weights are held in.
    pub fn compute_dtype(self) -> DType {
        match self {
            Precision::F32 | Precision::Q8 => DType::F32,
            Precision::Bf16 => DType::BF16,
            Precision::F16 => DType::F16,
        }
    }

    /// The quantization applied to the projection weights after loading on `device`, if any.
    /// The CPU backends store one byte per value; the GPU runtimes (the devices that report an
    /// identity) pack four values into each `u32`.
    pub fn weight_quantization(self, device: &Device) -> Option<QuantScheme> {
        (self == Precision::Q8).then(|| {
            let store = if device.identity().is_some() {
                QuantStore::PackedU32(0)
            } else {
                QuantStore::Native
            };
            QuantScheme::default()
                .with_value(QuantValue::Q8S)
                .with_store(store)
                .per_block([32], ScaleDtype::F32)
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Precision::F32 => "f32",
            Precision::Bf16 => "bf16",
            Precision::F16 => "f16",
            Precision::Q8 => "q8",
        }
    }
}

impl std::fmt::Display for Precision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
