//! Fixtures and helpers shared by the integration tests.
#![allow(dead_code)]

pub mod http;
pub mod reference;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use burn::tensor::Device;
use safetensors::SafeTensors;
use smolchat::backend::{BackendKind, ComputeDevice};
use smolchat::model::{Llama, Logits, logits_to_vec};

/// The device of `backend`. A GPU test must run on a GPU (in CI: Mesa's software Vulkan
/// driver), never quietly on the CPU fallback.
pub fn device(backend: BackendKind) -> Device {
    let compute = ComputeDevice::open(backend);
    if let Some(reason) = compute.fallback {
        panic!("{backend}: {reason}; on Debian, `bash .ci/setup` installs Mesa's Vulkan driver");
    }
    compute.device
}

/// Logit tolerance against the float32 reference: GPU kernels sum in other orders and may use
/// fused multiply-adds, so they get the looser bound the GPU issue allows.
pub fn logit_tolerance(backend: BackendKind) -> f64 {
    match backend {
        BackendKind::Gpu => 1e-2,
        _ => 1e-3,
    }
}

/// Logits of every input token from one forward pass over a fresh cache, row-major.
pub fn full_forward(model: &Llama, input: &[u32]) -> Vec<f32> {
    let mut cache = model.new_cache();
    logits_to_vec(
        model
            .forward(input, &mut cache, Logits::All)
            .expect("forward"),
    )
    .expect("read")
}

/// The logits of every token of `input`, each from its own call with the KV cache: the path
/// a decode step takes (matrix-vector products, single-row attention).
pub fn one_token_at_a_time(model: &Llama, input: &[u32]) -> Vec<f32> {
    let mut cache = model.new_cache();
    input
        .iter()
        .flat_map(|&token| {
            logits_to_vec(
                model
                    .forward(&[token], &mut cache, Logits::Last)
                    .expect("step"),
            )
            .expect("read")
        })
        .collect()
}

/// `count` greedy ids after `prompt`, decoded one token at a time with the KV cache.
pub fn greedy_ids(model: &Llama, prompt: &[u32], count: usize) -> Vec<u32> {
    let mut cache = model.new_cache();
    let mut logits = logits_to_vec(
        model
            .forward(prompt, &mut cache, Logits::Last)
            .expect("prefill"),
    )
    .expect("read");
    let mut generated = Vec::with_capacity(count);
    while generated.len() < count {
        let next = argmax(&logits) as u32;
        generated.push(next);
        if generated.len() < count {
            logits = logits_to_vec(
                model
                    .forward(&[next], &mut cache, Logits::Last)
                    .expect("decode"),
            )
            .expect("read");
        }
    }
    generated
}

pub fn tiny_model_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-smollm")
}

pub fn smollm2_config_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/smollm2-135m-instruct/config.json")
}

/// The reference outputs computed by Hugging Face transformers for the tiny checkpoint.
pub struct Golden {
    tensors: HashMap<String, (Vec<usize>, Vec<f64>)>,
    pub json: serde_json::Value,
}

impl Golden {
    pub fn load() -> Self {
        let dir = tiny_model_dir();
        let bytes = std::fs::read(dir.join("reference.safetensors"))
            .expect("tests/fixtures/tiny-smollm/reference.safetensors must exist");
        let file = SafeTensors::deserialize(&bytes).expect("reference.safetensors is valid");
        let tensors = file
            .tensors()
            .into_iter()
            .map(|(name, view)| {
                (
                    name,
                    (view.shape().to_vec(), to_f64(view.dtype(), view.data())),
                )
            })
            .collect();
        let json = serde_json::from_slice(
            &std::fs::read(dir.join("reference.json")).expect("reference.json must exist"),
        )
        .expect("reference.json is valid JSON");
        Self { tensors, json }
    }

    pub fn floats(&self, name: &str) -> (&[usize], &[f64]) {
        let (shape, values) = self
            .tensors
            .get(name)
            .unwrap_or_else(|| panic!("reference tensor {name} missing"));
        (shape, values)
    }

    pub fn ids(&self, name: &str) -> Vec<u32> {
        self.floats(name).1.iter().map(|&v| v as u32).collect()
    }
}

/// Decodes a safetensors buffer of any numeric dtype the tests meet into f64.
pub fn to_f64(dtype: safetensors::Dtype, data: &[u8]) -> Vec<f64> {
    use safetensors::Dtype;
    match dtype {
        Dtype::F32 => data
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()) as f64)
            .collect(),
        Dtype::F16 => data
            .chunks_exact(2)
            .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f64())
            .collect(),
        Dtype::BF16 => data
            .chunks_exact(2)
            .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f64())
            .collect(),
        Dtype::I64 => data
            .chunks_exact(8)
            .map(|b| i64::from_le_bytes(b.try_into().unwrap()) as f64)
            .collect(),
        other => panic!("test helper does not decode {other:?}"),
    }
}

pub fn logsumexp(row: &[f32]) -> f64 {
    let max = row.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
    max + row
        .iter()
        .map(|&v| (v as f64 - max).exp())
        .sum::<f64>()
        .ln()
}

pub fn argmax(row: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best
}

/// Largest absolute difference, with the index where it occurs, for a useful failure message.
pub fn max_abs_diff(actual: &[f32], expected: &[f64]) -> (f64, usize) {
    assert_eq!(actual.len(), expected.len(), "length mismatch");
    actual
        .iter()
        .zip(expected)
        .map(|(&a, &e)| (a as f64 - e).abs())
        .enumerate()
        .fold((0.0, 0), |(best, at), (i, d)| {
            if d > best || d.is_nan() {
                (d, i)
            } else {
                (best, at)
            }
        })
}

pub fn assert_close(actual: &[f32], expected: &[f64], tolerance: f64, what: &str) {
    let (diff, at) = max_abs_diff(actual, expected);
    assert!(
        diff <= tolerance,
        "{what}: max |Δ| = {diff:e} at index {at} (actual {}, expected {}), tolerance {tolerance:e}",
        actual[at],
        expected[at]
    );
}

/// Copies the tiny checkpoint into a fresh temp dir that a test may break.
pub fn tiny_model_copy() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    for entry in std::fs::read_dir(tiny_model_dir()).expect("fixture dir") {
        let entry = entry.expect("dir entry");
        std::fs::copy(entry.path(), dir.path().join(entry.file_name())).expect("copy fixture");
    }
    dir
}

/// Writes a config.json for a small Llama variant and random weights for it.
pub fn random_model(
    config: serde_json::Value,
    dtype: smolchat::model::random_checkpoint::StorageDtype,
    seed: u64,
) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("config.json"), config.to_string()).expect("write config");
    let config = smolchat::model::ModelConfig::from_file(&dir.path().join("config.json"))
        .expect("valid config");
    smolchat::model::random_checkpoint::write_random_weights(&config, dtype, seed, dir.path())
        .expect("write weights");
    dir
}

/// A small Llama config whose fields the variant tests override.
pub fn small_config() -> serde_json::Value {
    serde_json::json!({
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 320,
        "max_position_embeddings": 512,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": true,
        "initializer_range": 0.15,
        "torch_dtype": "bfloat16"
    })
}
