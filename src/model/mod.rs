//! The language model, one code for every supported family (see [`Family`]): config,
//! weights, layers and the KV cache.

mod attention;
pub mod checkpoint;
mod config;
mod cpu;
mod embedding;
mod error;
mod family;
mod gpu;
mod kv_cache;
mod linear;
mod llama;
mod loader;
mod mlp;
mod precision;
pub mod random_checkpoint;
mod rms_norm;
mod rope;
mod weight_arena;

pub use config::ModelConfig;
pub use cpu::{BlockFactors, IntegerValues, IntegerWeights};
pub use error::{ModelError, Result};
pub use family::{Architecture, Family};
pub use gpu::top_entries;
pub use kv_cache::KvCache;
pub use llama::{Llama, Logits, logits_to_vec};
pub use loader::LoadProgress;
pub use precision::Precision;
