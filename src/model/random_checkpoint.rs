//! Writes a checkpoint with random weights for any config, so that benchmarks and tests can
//! run a full-size model without downloading one.

use std::path::Path;

use half::{bf16, f16};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use safetensors::tensor::{Dtype, TensorView};

use super::checkpoint::TensorRole;
use super::config::ModelConfig;
use super::error::{ModelError, Result};
use crate::model_files::SINGLE_WEIGHTS_FILE;

/// How the random weights are stored on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum StorageDtype {
    F32,
    F16,
    Bf16,
}

impl StorageDtype {
    /// The precision a config's `torch_dtype` names; bf16 when absent or unknown.
    pub fn from_torch_dtype(name: Option<&str>) -> Self {
        match name {
            Some("float32") => StorageDtype::F32,
            Some("float16") => StorageDtype::F16,
            _ => StorageDtype::Bf16,
        }
    }

    fn encode(self, values: &[f32]) -> Vec<u8> {
        match self {
            StorageDtype::F32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
            StorageDtype::F16 => values
                .iter()
                .flat_map(|v| f16::from_f32(*v).to_le_bytes())
                .collect(),
            StorageDtype::Bf16 => values
                .iter()
                .flat_map(|v| bf16::from_f32(*v).to_le_bytes())
                .collect(),
        }
    }

    fn safetensors(self) -> Dtype {
        match self {
            StorageDtype::F32 => Dtype::F32,
            StorageDtype::F16 => Dtype::F16,
            StorageDtype::Bf16 => Dtype::BF16,
        }
    }
}

/// Writes `model.safetensors` with random weights for `config` into `dir`.
///
/// Matrices are uniform with the standard deviation of the config's `initializer_range`
/// (0.02 when absent), as are biases, and norm weights near one: the statistics of a freshly initialised model,
/// so activations stay in a realistic range.
pub fn write_random_weights(
    config: &ModelConfig,
    dtype: StorageDtype,
    seed: u64,
    dir: &Path,
) -> Result<()> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let half_width = config.initializer_range.unwrap_or(0.02) as f32 * 3f32.sqrt();
    let family = config.family()?;
    let tensors: Vec<(String, Vec<usize>, Vec<u8>)> = TensorRole::all(config, &family)
        .into_iter()
        .map(|role| {
            let shape = role.shape(config);
            let count = shape.iter().product();
            let is_bias = matches!(role, TensorRole::Layer(_, layer_role) if layer_role.is_bias());
            let values: Vec<f32> = if shape.len() == 1 && !is_bias {
                (0..count)
                    .map(|_| 1.0 + rng.random_range(-0.1..0.1))
                    .collect()
            } else {
                (0..count)
                    .map(|_| rng.random_range(-half_width..half_width))
                    .collect()
            };
            let bytes = dtype.encode(&values);
            (role.safetensors_name(), shape, bytes)
        })
        .collect();
    let views = tensors
        .iter()
        .map(|(name, shape, bytes)| {
            TensorView::new(dtype.safetensors(), shape.clone(), bytes)
                .map(|view| (name.as_str(), view))
        })
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|err| ModelError::Backend(err.to_string()))?;
    let path = dir.join(SINGLE_WEIGHTS_FILE);
    let metadata = Some([("format".to_string(), "pt".to_string())].into());
    safetensors::serialize_to_file(views, metadata, &path).map_err(|err| ModelError::WriteFailed {
        path,
        reason: err.to_string(),
    })
}
