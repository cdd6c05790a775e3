//! The families beside Llama (Qwen2 with its biases, Qwen3 with its head norms and wide heads,
//! SmolLM3 with its unrotated layers, Phi-3 with its fused projections and LongRoPE, Gemma 3
//! with its four norms a layer, GELU and sliding windows) against transformers' own float32 logits for tiny random
//! checkpoints written by `tests/reference/families_reference.py`: on every backend, a prompt in
//! one pass and token by token through the KV cache, from the Hugging Face folder and from the
//! GGUF files llama.cpp's converter and quantizer make of it.

use std::path::{Path, PathBuf};

use burn::tensor::DType;
use smolchat::backend::BackendKind;
use smolchat::generation::{LoadedModel, ModelOptions};
use smolchat::gguf::{GgufConfig, GgufFile};
use smolchat::model::{Architecture, Llama, Logits, ModelConfig, ModelError, logits_to_vec};
use smolchat::text::ChatMessage;

use crate::common::{self, assert_close, full_forward, greedy_ids, one_token_at_a_time};

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

/// A file llama.cpp's own tools made of a family (`tests/reference/converted_families.py`):
/// `F32` and `Q8_0` from the family's fixture folder, `Q4_K_M` from a checkpoint of the same
/// family at hidden 256 (K types quantize rows of 256).
fn converted(family: &str, kind: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(format!("tests/fixtures/converted/{family}/{kind}.gguf"))
}

/// The converted files' reference: transformers' logits and greedy ids for the weights each
/// file holds, dequantized; the tiny tokenizer's ids for a text and the chat template's
/// rendering of a conversation.
fn converted_reference(family: &str) -> serde_json::Value {
    let path = converted(family, "F32").with_file_name("reference.json");
    let text =
        std::fs::read_to_string(&path).unwrap_or_else(|err| panic!("{}: {err}", path.display()));
    serde_json::from_str(&text).expect("reference is JSON")
}

/// Log-probabilities of each row of `logits`, `vocab` wide.
fn log_softmax_rows<T: Copy + Into<f64>>(logits: &[T], vocab: usize) -> Vec<f64> {
    logits
        .chunks_exact(vocab)
        .flat_map(|row| {
            let row: Vec<f64> = row.iter().map(|&v| v.into()).collect();
            let max = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let log_sum = row.iter().map(|v| (v - max).exp()).sum::<f64>().ln() + max;
            row.into_iter().map(move |v| v - log_sum)
        })
        .collect()
}

/// Every family as a user's GGUF file of it: written by llama.cpp's converter, quantized by
/// `llama-quantize`, opened as the app opens a file (config, tokenizer and chat template from
/// the metadata). On every backend the F32 file's logits are within the float32 tolerance of
/// transformers' and the quantized files' log-probabilities within the genuine files' bound
/// (0.01) of transformers' on the same weights dequantized; the greedy ids are transformers'.
#[test]
fn files_llama_cpp_made_match_transformers() {
    let chat = [
        ChatMessage::user("Hi there"),
        ChatMessage::assistant("Hello."),
        ChatMessage::user("Tell me a story."),
    ];
    for family in GGUF_FAMILIES {
        let reference = converted_reference(family);
        let input: Vec<u32> = serde_json::from_value(reference["input_ids"].clone()).expect("ids");
        for kind in ["F32", "Q8_0", "Q4_K_M"] {
            let expected: Vec<Vec<f64>> =
                serde_json::from_value(reference[kind]["logits"].clone()).expect("logits");
            let vocab = expected[0].len();
            let expected: Vec<f64> = expected.concat();
            let greedy: Vec<u32> =
                serde_json::from_value(reference[kind]["greedy_ids"].clone()).expect("ids");
            for backend in BACKENDS {
                let what = format!("{family} {kind} on {backend}");
                let options = ModelOptions {
                    backend,
                    ..ModelOptions::default()
                };
                let loaded = LoadedModel::load(&converted(family, kind), options)
                    .unwrap_or_else(|err| panic!("{what}: {err}"));
                let logits = full_forward(&loaded.model, &input);
                if kind == "F32" {
                    let tolerance = common::logit_tolerance(backend);
                    assert_close(&logits, &expected, tolerance, &what);
                } else {
                    let ours = log_softmax_rows(&logits, vocab);
                    let theirs = log_softmax_rows(&expected, vocab);
                    let error = ours
                        .iter()
                        .zip(&theirs)
                        .map(|(a, b)| (a - b).abs())
                        .fold(0.0, f64::max);
                    assert!(error < 1e-2, "{what}: a log-probability off by {error}");
                }
                let ids = greedy_ids(&loaded.model, &input, greedy.len());
                assert_eq!(ids, greedy, "{what}: greedy ids");
            }
        }
        let loaded =
            LoadedModel::load(&converted(family, "F32"), ModelOptions::default()).expect("loads");
        let text = reference["text"].as_str().expect("text");
        let ids: Vec<u32> = serde_json::from_value(reference["text_ids"].clone()).expect("ids");
        let encoded = loaded.tokenizer.encode(text, false).expect("encodes");
        assert_eq!(encoded, ids, "{family}: the file's tokenizer on {text:?}");
        assert!(!loaded.template.is_fallback(), "{family}: no chat template");
        let rendered = loaded.template.render(&chat, true).expect("renders");
        assert_eq!(
            rendered,
            reference["chat"].as_str().expect("chat"),
            "{family}"
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

/// A Gemma 3 GGUF file says how wide its window is and which base its sliding layers rotate
/// by, but not which layers slide: as llama.cpp does, every sixth layer attends to everything
/// (as in every Gemma 3 model), unless the file names its pattern.
#[test]
fn a_gemma3_gguf_file_slides_all_but_every_sixth_layer() {
    let file = GgufFile::open(converted("gemma3", "F32")).expect("opens");
    let config =
        ModelConfig::from_gguf(&GgufConfig::from_gguf(&file).expect("metadata")).expect("config");
    let family = config.family().expect("family");
    assert_eq!(
        family.windows,
        [Some(4), Some(4), Some(4), Some(4), Some(4), None]
    );
    assert_eq!(family.local_rope_theta, Some(10_000.0));
    assert_eq!(config.rope_theta, 1e6);
    assert_eq!(config.query_pre_attn_scalar, Some(16.0));
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
