//! How much memory a model will take, known before its weights are read: the weights, and the
//! KV cache at the context it gets. A 4B model's own context (40,960 tokens for Qwen3) can
//! ask for more cache than the machine has, so the context is the model's own capped by what
//! fits beside the weights.

use std::path::Path;

use super::error::GenerationError;
use crate::gguf::{GgufConfig, GgufFile};
use crate::model::ModelConfig;
use crate::model_files::{CONFIG_FILE, is_gguf, weight_bytes};
use crate::stats::memory;

/// What the model and its cache will take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryPlan {
    /// The weights as their files hold them, which is what the CPU keeps.
    pub weights_bytes: u64,
    /// Keys and values for one position, in f32 as the cache holds them, of the layers that
    /// keep every position.
    pub kv_bytes_per_token: u64,
    /// What the layers with a window keep at most, whatever the context: three windows each
    /// (see `KvCache::advance`).
    pub kv_window_bytes: u64,
    /// The model's own context length.
    pub model_context: usize,
    /// The context it gets: its own, or what fits in the memory available now.
    pub context: usize,
}

/// Share of the available memory the weights and a full cache may take: the rest is for the
/// window, the activations and everything else the machine runs.
const USABLE_SHARE: f64 = 0.8;
/// No smaller context than this is offered for lack of memory: a chat needs room, and a
/// machine this short of memory will say so when the cache grows.
const MIN_CONTEXT: usize = 2048;
/// Capped contexts are a multiple of this, so that the number reads as a choice.
const CONTEXT_STEP: usize = 1024;

impl MemoryPlan {
    /// The plan for `config`, whose weights take `weights_bytes`, on a machine with
    /// `available_bytes` free (`None`: unknown, no cap).
    pub fn new(config: &ModelConfig, weights_bytes: u64, available_bytes: Option<u64>) -> Self {
        let row =
            (2 * config.num_kv_heads() * config.head_dim() * std::mem::size_of::<f32>()) as u64;
        let model_context = config.max_position_embeddings;
        let windows = config.layer_windows();
        let kv_bytes_per_token =
            windows.iter().filter(|window| window.is_none()).count() as u64 * row;
        let kv_window_bytes = windows
            .iter()
            .flatten()
            .map(|&window| (3 * window).min(model_context) as u64 * row)
            .sum();
        let context = match available_bytes {
            None => model_context,
            Some(available) => {
                let room = (available as f64 * USABLE_SHARE) as u64;
                let fits = room.saturating_sub(weights_bytes + kv_window_bytes)
                    / kv_bytes_per_token.max(1);
                let fits = (fits as usize / CONTEXT_STEP * CONTEXT_STEP).max(MIN_CONTEXT);
                model_context.min(fits)
            }
        };
        Self {
            weights_bytes,
            kv_bytes_per_token,
            kv_window_bytes,
            model_context,
            context,
        }
    }

    /// The plan for the model at `path` (a folder or a `.gguf` file), from its config and the
    /// size of its weight files, without reading the weights.
    pub fn of(path: &Path) -> Result<Self, GenerationError> {
        Ok(Self::new(
            &model_config(path)?,
            weight_bytes(path),
            available_memory(),
        ))
    }

    /// Whether the weights and a cache of the smallest context offered fit in
    /// `available_bytes`, with the share left for everything else.
    pub fn fits_in(&self, available_bytes: u64) -> bool {
        let cache = self.kv_bytes_per_token * self.model_context.min(MIN_CONTEXT) as u64;
        let needed = self.weights_bytes + self.kv_window_bytes + cache;
        needed as f64 <= available_bytes as f64 * USABLE_SHARE
    }

    /// Whether a weights file of `bytes` whose config is not known yet (a file on the hub)
    /// leaves room for a cache in `available_bytes`: within the usable share, with a tenth of
    /// it kept for the cache.
    pub fn weights_may_fit(bytes: u64, available_bytes: u64) -> bool {
        bytes as f64 <= available_bytes as f64 * USABLE_SHARE * 0.9
    }

    /// The KV cache at the full context.
    pub fn kv_bytes(&self) -> u64 {
        self.kv_bytes_per_token * self.context as u64 + self.kv_window_bytes
    }

    /// For the window and the logs: "weights 1.1 GB + KV cache up to 0.9 GB at 8,192 tokens".
    pub fn describe(&self) -> String {
        let mut line = format!(
            "weights {} + KV cache up to {} at {} tokens",
            gigabytes(self.weights_bytes),
            gigabytes(self.kv_bytes()),
            self.context
        );
        if self.context < self.model_context {
            line.push_str(&format!(
                " (the model's {} would not fit in the memory free now)",
                self.model_context
            ));
        }
        line
    }
}

/// The config of the model at `path` (a folder or a `.gguf` file), checked, without reading
/// the weights.
pub fn model_config(path: &Path) -> Result<ModelConfig, GenerationError> {
    if is_gguf(path) {
        gguf_model_config(&GgufFile::open(path)?)
    } else {
        Ok(ModelConfig::from_file(&path.join(CONFIG_FILE))?)
    }
}

/// The config an open GGUF file's metadata describes, checked.
pub fn gguf_model_config(file: &GgufFile) -> Result<ModelConfig, GenerationError> {
    Ok(ModelConfig::from_gguf(&GgufConfig::from_gguf(file)?)?)
}

fn gigabytes(bytes: u64) -> String {
    format!("{:.1} GB", bytes as f64 / 1e9)
}

/// Memory the system can give without swapping, where the platform says (Linux's
/// `MemAvailable`); `None` elsewhere, which leaves the context uncapped.
pub fn available_memory() -> Option<u64> {
    memory::available_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(context: usize) -> ModelConfig {
        let mut json: serde_json::Value = serde_json::from_str(include_str!(
            "../../tests/fixtures/smollm2-135m-instruct/config.json"
        ))
        .expect("JSON");
        json["max_position_embeddings"] = context.into();
        ModelConfig::from_json(&json.to_string()).expect("valid")
    }

    #[test]
    fn the_context_is_the_models_own_when_it_fits() {
        // SmolLM2-135M: 30 layers, 3 KV heads of 64: 46,080 bytes a position.
        let plan = MemoryPlan::new(&config(8192), 270_000_000, Some(16_000_000_000));
        assert_eq!(plan.kv_bytes_per_token, 30 * 2 * 3 * 64 * 4);
        assert_eq!(plan.context, 8192);
        assert!(
            plan.describe()
                .starts_with("weights 0.3 GB + KV cache up to 0.4 GB")
        );
        assert_eq!(MemoryPlan::new(&config(8192), 0, None).context, 8192);
    }

    /// Gemma 3's sliding layers keep three windows whatever the context (the tiny one's two
    /// sliding layers have windows of 4, beside one global layer).
    #[test]
    fn layers_with_a_window_count_three_windows() {
        let config = ModelConfig::from_file(std::path::Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/families/gemma3/config.json"
        )))
        .expect("config");
        let row = (2 * config.num_kv_heads() * config.head_dim() * 4) as u64;
        let plan = MemoryPlan::new(&config, 0, None);
        assert_eq!(plan.kv_bytes_per_token, row);
        assert_eq!(plan.kv_window_bytes, 2 * 12 * row);
        assert_eq!(plan.kv_bytes(), (256 + 24) * row);
    }

    #[test]
    fn a_context_that_does_not_fit_is_capped_to_what_does() {
        // 80% of 1 GB less 0.3 GB of weights leaves room for 10,850 positions.
        let plan = MemoryPlan::new(&config(131_072), 300_000_000, Some(1_000_000_000));
        assert_eq!(plan.context, 10 * 1024);
        assert!(plan.describe().contains("the model's 131072 would not fit"));
        // Never below the minimum, however little is free.
        let starved = MemoryPlan::new(&config(131_072), 300_000_000, Some(100_000_000));
        assert_eq!(starved.context, MIN_CONTEXT);
    }

    /// A model fits when its weights and a cache of the smallest context take at most the
    /// usable share: 0.3 GB and 2,048 × 46,080 bytes (94 MB) need 0.49 GB free.
    #[test]
    fn a_model_fits_when_weights_and_the_smallest_cache_do() {
        let plan = MemoryPlan::new(&config(8192), 300_000_000, None);
        assert!(plan.fits_in(500_000_000));
        assert!(!plan.fits_in(480_000_000));
        // Weights alone, before the config is known: 0.72 of what is free.
        assert!(MemoryPlan::weights_may_fit(720_000_000, 1_000_000_000));
        assert!(!MemoryPlan::weights_may_fit(730_000_000, 1_000_000_000));
    }
}
