//! The families beside Llama (Qwen2 with its biases, Qwen3 with its head norms and wide heads,
//! SmolLM3 with its unrotated layers, Phi-3 with its fused projections and LongRoPE, Gemma 3
//! with its four norms a layer, GELU and sliding windows) against transformers' own float32 logits for tiny random
//! checkpoints written by `tests/reference/families_reference.py`: on every backend, a prompt in
//! one pass and token by token through the KV cache, from the Hugging Face folder and from a
//! GGUF file holding the same weights under llama.cpp's names.

use std::path::{Path, PathBuf};

use burn::tensor::DType;
use safetensors::SafeTensors;
use smolchat::backend::BackendKind;
use smolchat::gguf::{GgufConfig, GgufFile, qk_gguf_row};
use smolchat::model::checkpoint::gguf::GgufCheckpoint;
use smolchat::model::checkpoint::{LayerRole, TensorRole};
use smolchat::model::{
    Architecture, Llama, Logits, ModelConfig, ModelError, Precision, logits_to_vec,
};

use crate::common::{self, assert_close, full_forward, greedy_ids, one_token_at_a_time};
use crate::gguf::builder::{Builder, V};

const FAMILIES: [&str; 7] = [
    "qwen2", "qwen3", "smollm3", "phi3", "gemma3", "phi4", "gemma3mm",
];
const GGUF_FAMILIES: [&str; 6] = ["qwen2", "qwen3", "smollm3", "phi3", "phi4", "gemma3"];
const BACKENDS: [BackendKind; 3] = [BackendKind::Flex, BackendKind::Ndarray, BackendKind::Gpu];

fn family_dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/fixtures/families/{name}"))
}

struct Reference {
    input_ids: Vec<u32>,
    /// Every position's logits, row after row.
    logits: Vec<f64>,
    greedy_ids: Vec<u32>,
}

impl Reference {
    fn load(dir: &Path) -> Self {
        let text = std::fs::read_to_string(dir.join("reference.json")).expect("reference.json");
        let json: serde_json::Value = serde_json::from_str(&text).expect("reference is JSON");
        let ids = |key: &str| -> Vec<u32> {
            json[key]
                .as_array()
                .unwrap_or_else(|| panic!("{key}"))
                .iter()
                .map(|id| id.as_u64().expect("an id") as u32)
                .collect()
        };
        let logits = json["logits"]
            .as_array()
            .expect("logits")
            .iter()
            .flat_map(|row| row.as_array().expect("a row of logits").clone())
            .map(|v| v.as_f64().expect("a logit"))
            .collect();
        Self {
            input_ids: ids("input_ids"),
            logits,
            greedy_ids: ids("greedy_ids"),
        }
    }
}

fn load(dir: &Path, backend: BackendKind) -> Llama {
    Llama::load(dir, &common::device(backend), DType::F32)
        .unwrap_or_else(|err| panic!("{}: {err}", dir.display()))
}

#[test]
fn each_family_matches_transformers_on_every_backend() {
    for family in FAMILIES {
        let dir = family_dir(family);
        let reference = Reference::load(&dir);
        for backend in BACKENDS {
            let model = load(&dir, backend);
            let what = format!("{family} on {backend}");
            let tolerance = common::logit_tolerance(backend);
            let prompt = full_forward(&model, &reference.input_ids);
            assert_close(
                &prompt,
                &reference.logits,
                tolerance,
                &format!("{what}, prompt"),
            );
            let steps = one_token_at_a_time(&model, &reference.input_ids);
            assert_close(
                &steps,
                &reference.logits,
                tolerance,
                &format!("{what}, steps"),
            );
            let greedy = greedy_ids(&model, &reference.input_ids, reference.greedy_ids.len());
            assert_eq!(greedy, reference.greedy_ids, "{what}: greedy ids");
        }
    }
}

/// The same weights as a GGUF file of the family's `general.architecture`, laid out as
/// llama.cpp's converter lays them out (query and key rows reordered where it does so).
fn gguf_of(dir: &Path) -> GgufFile {
    let config = ModelConfig::from_file(&dir.join("config.json")).expect("config");
    let family = config.family().expect("family");
    let arch = family.architecture.gguf_name();
    let bytes = std::fs::read(dir.join("model.safetensors")).expect("weights");
    let weights = SafeTensors::deserialize(&bytes).expect("safetensors");
    let key = |name: &str| format!("{arch}.{name}");
    let count = |n: usize| V::U32(n as u32);
    let tokens: Vec<String> = (0..config.vocab_size).map(|i| format!("t{i}")).collect();
    let tokens: Vec<&str> = tokens.iter().map(String::as_str).collect();
    let mut builder = Builder::default()
        .kv("general.architecture", V::str(arch))
        .kv(
            &key("context_length"),
            count(config.max_position_embeddings),
        )
        .kv(&key("embedding_length"), count(config.hidden_size))
        .kv(&key("block_count"), count(config.num_hidden_layers))
        .kv(&key("feed_forward_length"), count(config.intermediate_size))
        .kv(
            &key("attention.head_count"),
            count(config.num_attention_heads),
        )
        .kv(
            &key("attention.head_count_kv"),
            count(config.num_kv_heads()),
        )
        .kv(&key("attention.key_length"), count(config.head_dim()))
        .kv(&key("rope.dimension_count"), count(config.rotary_dim()))
        .kv(&key("attention.value_length"), count(config.head_dim()))
        .kv(&key("rope.freq_base"), V::F32(config.rope_theta as f32))
        .kv(
            &key("attention.layer_norm_rms_epsilon"),
            V::F32(config.rms_norm_eps as f32),
        )
        .kv("tokenizer.ggml.tokens", V::strs(&tokens));
    for role in TensorRole::all(&config, &family) {
        let view = weights
            .tensor(&role.safetensors_name())
            .expect("tensor in the fixture");
        let values: Vec<f32> = view
            .data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        let shape = view.shape().to_vec();
        let mut stored = values.clone();
        // Gemma's norms as llama.cpp's converter writes them: the factor `1 + w` itself.
        if family.gemma_norms && is_norm(role) {
            stored.iter_mut().for_each(|w| *w += 1.0);
        }
        let reordered = matches!(
            role,
            TensorRole::Layer(_, LayerRole::Query | LayerRole::Key)
        );
        if reordered && family.architecture.gguf_reorders_qk() {
            let cols = shape[1];
            for row in 0..shape[0] {
                let at = qk_gguf_row(row, config.head_dim());
                stored[at * cols..(at + 1) * cols]
                    .copy_from_slice(&values[row * cols..(row + 1) * cols]);
            }
        }
        let dims: Vec<u64> = shape.iter().rev().map(|&d| d as u64).collect();
        builder = builder.f32_tensor(&role.gguf_name(), &dims, &stored);
    }
    // Gemma 3's windows: the width, which layers slide (as a flag per layer: the fixture's
    // three layers are not llama.cpp's default pattern of six), the sliding layers' base.
    if let (Some(window), Some(layer_types)) = (config.sliding_window, &config.layer_types) {
        let flags: Vec<bool> = layer_types
            .iter()
            .map(|kind| kind == "sliding_attention")
            .collect();
        let local_base = config.rope_local_base_freq.expect("a local base") as f32;
        builder = builder
            .kv(&key("attention.sliding_window"), count(window))
            .kv(&key("attention.sliding_window_pattern"), V::bools(&flags))
            .kv(&key("rope.freq_base_swa"), V::F32(local_base));
    }
    // LongRoPE as llama.cpp's converter writes it: the factors as tensors, the original
    // context and the attention factor as metadata.
    if let Some(scaling) = config
        .rope_scaling
        .as_ref()
        .filter(|s| s["rope_type"] == "longrope")
    {
        let original = scaling["original_max_position_embeddings"]
            .as_u64()
            .expect("original context") as f64;
        let scale = config.max_position_embeddings as f64 / original;
        let attention_factor = (1.0 + scale.ln() / original.ln()).sqrt();
        let factors = |key: &str| -> Vec<f32> {
            let list = scaling[key].as_array().expect("factors");
            list.iter()
                .map(|v| v.as_f64().expect("a factor") as f32)
                .collect()
        };
        let half = [config.rotary_dim() as u64 / 2];
        builder = builder
            .kv(
                &key("rope.scaling.original_context_length"),
                V::U32(original as u32),
            )
            .kv(
                &key("rope.scaling.attn_factor"),
                V::F32(attention_factor as f32),
            )
            .f32_tensor("rope_factors_long.weight", &half, &factors("long_factor"))
            .f32_tensor("rope_factors_short.weight", &half, &factors("short_factor"));
    }
    GgufFile::from_bytes(format!("{}.gguf", arch), builder.build()).expect("a valid GGUF image")
}

#[test]
fn each_family_from_gguf_matches_transformers() {
    for family in GGUF_FAMILIES {
        let dir = family_dir(family);
        let reference = Reference::load(&dir);
        let file = gguf_of(&dir);
        let config = ModelConfig::from_gguf(&GgufConfig::from_gguf(&file).expect("metadata"))
            .unwrap_or_else(|err| panic!("{family}: {err}"));
        let folder = ModelConfig::from_file(&dir.join("config.json")).expect("config");
        let architecture = config.architecture().expect("architecture");
        assert_eq!(architecture, folder.architecture().expect("architecture"));
        // Phi-4-mini's partial rotation, from `rope.dimension_count`.
        assert_eq!(config.rotary_dim(), folder.rotary_dim(), "{family}");
        let reordered = architecture.gguf_reorders_qk().then(|| config.head_dim());
        let checkpoint = GgufCheckpoint::new(file, reordered);
        let device = common::device(BackendKind::Flex);
        let model =
            Llama::from_checkpoint(config, &checkpoint, &device, Precision::F32, &mut |_| {})
                .unwrap_or_else(|err| panic!("{family} from GGUF: {err}"));
        let logits = full_forward(&model, &reference.input_ids);
        let tolerance = common::logit_tolerance(BackendKind::Flex);
        assert_close(
            &logits,
            &reference.logits,
            tolerance,
            &format!("{family} GGUF"),
        );
    }
}

/// A file of a family smolchat does not run names it and lists those it does.
#[test]
fn an_unsupported_architecture_is_refused_with_the_supported_list() {
    let text = std::fs::read_to_string(family_dir("qwen3").join("config.json")).expect("config");
    let text = text.replace("Qwen3ForCausalLM", "MistralForCausalLM");
    let err = ModelConfig::from_json(&text).expect_err("Mistral is refused");
    assert!(
        matches!(err, ModelError::UnsupportedArchitecture { .. }),
        "{err:?}"
    );
    let message = err.to_string();
    assert!(message.contains("MistralForCausalLM"), "{message}");
    for architecture in Architecture::ALL {
        assert!(
            message.contains(architecture.transformers_class()),
            "{message}"
        );
    }
}

fn is_norm(role: TensorRole) -> bool {
    matches!(
        role,
        TensorRole::FinalNorm
            | TensorRole::Layer(
                _,
                LayerRole::AttentionNorm
                    | LayerRole::MlpNorm
                    | LayerRole::QueryNorm
                    | LayerRole::KeyNorm
                    | LayerRole::AttentionOutputNorm
                    | LayerRole::FeedForwardNorm
                    | LayerRole::FeedForwardOutputNorm
            )
    )
}

/// A Gemma 3 GGUF file reads as its `config.json` does: the same windows, bases and scale,
/// with the query scale and activation llama.cpp implies rather than stores.
#[test]
fn a_gemma3_gguf_file_gives_the_config_of_its_folder() {
    let dir = family_dir("gemma3");
    let folder = ModelConfig::from_file(&dir.join("config.json")).expect("config");
    let file = gguf_of(&dir);
    let gguf =
        ModelConfig::from_gguf(&GgufConfig::from_gguf(&file).expect("metadata")).expect("config");
    assert_eq!(
        gguf.family().expect("family"),
        folder.family().expect("family")
    );
    assert_eq!(gguf.layer_types, folder.layer_types);
    assert_eq!(gguf.query_pre_attn_scalar, folder.query_pre_attn_scalar);
    assert_eq!(gguf.rope_theta, folder.rope_theta);
}

/// transformers 5 writes `rope_theta` inside `rope_parameters`; the fixture's Qwen3 uses a
/// theta of 100, far from the default, so reading the old key alone would be caught above too.
#[test]
fn rope_theta_is_read_from_rope_parameters() {
    let config = ModelConfig::from_file(&family_dir("qwen3").join("config.json")).expect("config");
    assert_eq!(config.rope_theta, 100.0);
    assert_eq!(config.head_dim(), 32);
    let config =
        ModelConfig::from_file(&family_dir("smollm3").join("config.json")).expect("config");
    let family = config.family().expect("family");
    assert_eq!(family.rotated_layers, [true, true, true, false]);
    // Gemma 3's are per kind of layer.
    let config = ModelConfig::from_file(&family_dir("gemma3").join("config.json")).expect("config");
    assert_eq!(config.rope_theta, 1e6);
    let family = config.family().expect("family");
    assert_eq!(family.local_rope_theta, Some(10_000.0));
    assert_eq!(family.windows, [Some(4), Some(4), None]);
}

/// Gemma 3's sliding layers keep only what later passes can see: after 200 positions
/// (a window of 4), decoded one at a time and then as a 30-token prompt, the host cache holds
/// the global layer's 200-odd positions and a few for each sliding layer, and the logits
/// equal a full forward pass over every position. A prompt that would need a position the
/// sliding layers let go of runs whole again.
#[test]
fn gemma3_sliding_layers_keep_only_their_window() {
    let model = load(&family_dir("gemma3"), BackendKind::Flex);
    let config = model.config();
    let vocab = config.vocab_size as u32;
    let input: Vec<u32> = (0..230u32).map(|i| 1 + (i * 37) % (vocab - 1)).collect();
    let expected: Vec<f64> = full_forward(&model, &input)[229 * vocab as usize..]
        .iter()
        .map(|&v| f64::from(v))
        .collect();

    let mut cache = model.new_cache();
    for &token in &input[..200] {
        model
            .forward(&[token], &mut cache, Logits::Last)
            .expect("step");
    }
    let last = logits_to_vec(
        model
            .forward(&input[200..], &mut cache, Logits::Last)
            .expect("prompt"),
    )
    .expect("read");
    assert_close(&last, &expected, 1e-4, "after the sliding layers let go");

    // One global layer of three; each sliding layer holds at most three windows and the
    // last prompt's 30 positions.
    let row_bytes = 2 * config.num_kv_heads() * config.head_dim() * size_of::<f32>();
    let global = cache.capacity() * row_bytes;
    assert!(
        cache.bytes() <= global + 2 * 64 * row_bytes,
        "{} bytes held, the global layer {global}",
        cache.bytes()
    );
    // Two more tokens, one at a time: a prompt that parts from the cache at the last one
    // runs only that step again.
    for token in [5, 6] {
        model
            .forward(&[token], &mut cache, Logits::Last)
            .expect("step");
    }
    let mut parting = cache.tokens()[..231].to_vec();
    parting.push(7);
    assert_eq!(cache.reusable_prefix(&parting), 231);
    // The 30-token pass began before the oldest position the sliding layers keep (a
    // second window past the first), and position 99 is long gone: both run whole.
    assert_eq!(cache.reusable_prefix(&input), 0);
    assert_eq!(cache.reusable_prefix(&input[..100]), 0);
}
