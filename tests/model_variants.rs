//! Head layouts, untied heads, storage precisions and RoPE/eps values the golden fixture does
//! not cover, checked against the naive f64 reference; and the KV cache checked against full
//! forward passes.

use crate::common;

use burn::tensor::DType;
use common::reference::ReferenceLlama;
use common::{assert_close, full_forward, random_model, small_config};
use serde_json::json;
use smolchat::backend::BackendKind;
use smolchat::model::random_checkpoint::StorageDtype;
use smolchat::model::{Llama, Logits, logits_to_vec};

const BACKENDS: [BackendKind; 3] = [BackendKind::Flex, BackendKind::Ndarray, BackendKind::Gpu];

fn tokens(count: usize, vocab: u32) -> Vec<u32> {
    (0..count as u32).map(|i| (i * 37 + 11) % vocab).collect()
}

fn variant(overrides: serde_json::Value, dtype: StorageDtype) {
    let mut config = small_config();
    for (key, value) in overrides.as_object().expect("object") {
        config[key] = value.clone();
    }
    let dir = random_model(config.clone(), dtype, 7);
    let vocab = config["vocab_size"].as_u64().expect("vocab") as u32;
    let input = tokens(40, vocab);
    let expected: Vec<f64> = ReferenceLlama::load(dir.path()).logits(&input).concat();
    for backend in BACKENDS {
        let model =
            Llama::load(dir.path(), &common::device(backend), DType::F32).expect("variant loads");
        let logits = full_forward(&model, &input);
        assert_close(
            &logits,
            &expected,
            common::logit_tolerance(backend),
            &format!("{backend} {overrides}"),
        );
    }
}

#[test]
fn multi_head_attention_with_untied_head_in_f32() {
    variant(
        json!({"num_key_value_heads": 4, "tie_word_embeddings": false, "rms_norm_eps": 1e-6, "rope_theta": 10000.0}),
        StorageDtype::F32,
    );
}

/// Llama 3.1/3.2's scaling, with an original context short enough that 40 positions cross it
/// and the frequencies fall in all three bands.
#[test]
fn llama3_rope_scaling_in_f32() {
    variant(
        json!({"rope_theta": 10000.0, "rope_scaling": {
            "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 16
        }}),
        StorageDtype::F32,
    );
}

#[test]
fn multi_query_attention_in_f16() {
    variant(
        json!({"num_key_value_heads": 1, "rope_theta": 500000.0}),
        StorageDtype::F16,
    );
}

#[test]
fn explicit_head_dim_wider_than_hidden_in_bf16() {
    variant(
        json!({"hidden_size": 48, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "rms_norm_eps": 1e-4}),
        StorageDtype::Bf16,
    );
}

/// The variants above check the logits of f32 runs from every storage type; this checks that
/// on the CPU those runs read a half-precision checkpoint's matrices as stored (half the
/// bytes per decode step), and that the GPU, whose matmul wants one type, gets f32.
#[test]
fn f32_runs_hold_half_precision_matrices_as_stored_on_the_cpu() {
    for (stored, dtype) in [
        (StorageDtype::Bf16, DType::BF16),
        (StorageDtype::F16, DType::F16),
        (StorageDtype::F32, DType::F32),
    ] {
        let dir = random_model(small_config(), stored, 5);
        let load = |backend| {
            Llama::load(dir.path(), &common::device(backend), DType::F32).expect("model loads")
        };
        assert_eq!(
            load(BackendKind::Flex).weight_dtype(),
            Some(dtype),
            "{stored:?}"
        );
        assert_eq!(
            load(BackendKind::Gpu).weight_dtype(),
            Some(DType::F32),
            "{stored:?}"
        );
    }
}

#[test]
fn prefill_chunks_and_decode_steps_equal_one_full_pass() {
    let dir = random_model(small_config(), StorageDtype::Bf16, 3);
    let input = tokens(30, 320);
    for backend in BACKENDS {
        let model = Llama::load(dir.path(), &common::device(backend), DType::F32).expect("loads");
        let expected: Vec<f64> = full_forward(&model, &input)
            .iter()
            .map(|&v| v as f64)
            .collect();
        let mut cache = model.new_cache();
        let mut rows = Vec::new();
        for chunk in [&input[..17], &input[17..22]] {
            rows.extend(
                logits_to_vec(
                    model
                        .forward(chunk, &mut cache, Logits::All)
                        .expect("chunk"),
                )
                .expect("read"),
            );
        }
        for token in &input[22..] {
            rows.extend(
                logits_to_vec(
                    model
                        .forward(&[*token], &mut cache, Logits::Last)
                        .expect("step"),
                )
                .expect("read"),
            );
        }
        assert_eq!(cache.len(), input.len());
        assert_close(
            &rows,
            &expected,
            common::logit_tolerance(backend) / 10.0,
            &format!("{backend} cached vs full"),
        );
    }
}

#[test]
fn truncated_cache_recomputes_a_diverging_suffix() {
    let dir = random_model(small_config(), StorageDtype::Bf16, 4);
    let model =
        Llama::load(dir.path(), &common::device(BackendKind::Flex), DType::F32).expect("loads");
    let original = tokens(20, 320);
    let mut edited = original.clone();
    edited[12..].iter_mut().for_each(|t| *t = (*t + 5) % 320);
    let expected: Vec<f64> = full_forward(&model, &edited)[12 * 320..]
        .iter()
        .map(|&v| v as f64)
        .collect();

    let mut cache = model.new_cache();
    model
        .forward(&original, &mut cache, Logits::Last)
        .expect("first pass");
    cache.truncate(12);
    assert_eq!(cache.len(), 12);
    let suffix = logits_to_vec(
        model
            .forward(&edited[12..], &mut cache, Logits::All)
            .expect("suffix"),
    )
    .expect("read");
    assert_close(&suffix, &expected, 1e-4, "suffix after truncate");
}

/// The prediction kept with a prompt read whole: asked again, the prompt reuses every
/// position, also after decode steps went on past it; one token less goes back to where the
/// prompt's pass began; a cut before its end drops it. A copy of a cache's first pass reads
/// on bit for bit as the cache does.
#[test]
fn a_prompt_read_whole_keeps_its_prediction_and_its_start_copies_exactly() {
    let dir = random_model(small_config(), StorageDtype::Bf16, 4);
    let model =
        Llama::load(dir.path(), &common::device(BackendKind::Flex), DType::F32).expect("loads");
    let prompt = tokens(20, 320);
    let mut cache = model.new_cache();
    model
        .forward(&prompt[..8], &mut cache, Logits::Last)
        .expect("first pass");
    model
        .forward(&prompt[8..], &mut cache, Logits::Last)
        .expect("last pass");
    assert_eq!(cache.prediction(), None, "kept only when asked");
    cache.keep_prediction(&[1.0, 2.0]);
    model.forward(&[3], &mut cache, Logits::Last).expect("step");
    assert_eq!(
        cache.prediction(),
        None,
        "the cache went on past the prompt"
    );
    assert_eq!(cache.reusable_prefix(&prompt), 20);
    assert_eq!(cache.reusable_prefix(&prompt[..19]), 8);
    cache.truncate(20);
    assert_eq!(cache.prediction(), Some(&[1.0, 2.0][..]));
    cache.truncate(19);
    assert_eq!(cache.prediction(), None);
    model
        .forward(&prompt[19..], &mut cache, Logits::Last)
        .expect("the last token again");
    assert_eq!(
        cache.prediction(),
        None,
        "dropped, not waiting for the same length"
    );

    // A copy of the first pass's positions reads on as the cache it came from does.
    let mut copy = model.new_cache();
    assert!(copy.copy_prefix(&cache, 8));
    assert_eq!(copy.tokens(), &prompt[..8]);
    assert_eq!(copy.reusable_prefix(&prompt), 8);
    cache.truncate(8);
    let read_on = |cache: &mut smolchat::model::KvCache| {
        logits_to_vec(
            model
                .forward(&prompt[8..], cache, Logits::Last)
                .expect("the rest"),
        )
        .expect("read")
    };
    let (copied, original) = (read_on(&mut copy), read_on(&mut cache));
    assert!(
        copied
            .iter()
            .zip(&original)
            .all(|(a, b)| a.to_bits() == b.to_bits())
    );
}

#[test]
fn cache_grows_past_its_first_block_and_stays_bounded() {
    let mut config = small_config();
    config["max_position_embeddings"] = 300.into();
    let dir = random_model(config, StorageDtype::Bf16, 5);
    let model =
        Llama::load(dir.path(), &common::device(BackendKind::Flex), DType::F32).expect("loads");
    let input = tokens(300, 320);
    let expected: Vec<f64> = full_forward(&model, &input)[299 * 320..]
        .iter()
        .map(|&v| v as f64)
        .collect();

    let mut cache = model.new_cache();
    model
        .forward(&input[..250], &mut cache, Logits::Last)
        .expect("prefill");
    assert_eq!(cache.capacity(), 256);
    let mut last = Vec::new();
    for token in &input[250..] {
        last = logits_to_vec(
            model
                .forward(&[*token], &mut cache, Logits::Last)
                .expect("step"),
        )
        .expect("read");
    }
    assert_eq!(
        cache.capacity(),
        300,
        "capacity is capped at the context length"
    );
    assert_close(&last, &expected, 1e-4, "last row after growth");
    let overflow = model
        .forward(&[1], &mut cache, Logits::Last)
        .unwrap_err()
        .to_string();
    assert!(
        overflow.contains("301") && overflow.contains("300"),
        "{overflow}"
    );
    assert_eq!(
        cache.len(),
        300,
        "a refused token leaves the cache as it was"
    );
}

/// Leaving a long conversation hands its cache's memory back: truncated far below its
/// capacity, the cache keeps room to grow twice over, and what it still holds reads as before.
#[test]
fn a_cache_cut_far_back_gives_its_memory_back() {
    let mut config = small_config();
    config["max_position_embeddings"] = 2048.into();
    let dir = random_model(config, StorageDtype::Bf16, 7);
    let model =
        Llama::load(dir.path(), &common::device(BackendKind::Flex), DType::F32).expect("loads");
    let input = tokens(1500, 320);
    let mut cache = model.new_cache();
    model
        .forward(&input, &mut cache, Logits::Last)
        .expect("prefill");
    assert_eq!(cache.capacity(), 1500);
    let long = cache.bytes();

    cache.truncate(700);
    assert_eq!(cache.capacity(), 1500, "a cut to half keeps the allocation");
    cache.truncate(12);
    assert_eq!(cache.capacity(), 512, "room for 256 positions twice over");
    assert!(
        cache.bytes() * 2 < long,
        "{} of {long} bytes kept",
        cache.bytes()
    );

    let expected: Vec<f64> = full_forward(&model, &input[..20])[19 * 320..]
        .iter()
        .map(|&v| v as f64)
        .collect();
    let last = logits_to_vec(
        model
            .forward(&input[12..20], &mut cache, Logits::Last)
            .expect("after the cut"),
    )
    .expect("read");
    assert_close(&last, &expected, 1e-4, "the kept positions after the cut");
}

#[test]
fn sharded_checkpoint_loads_like_a_single_file() {
    let dir = random_model(small_config(), StorageDtype::Bf16, 6);
    let single =
        Llama::load(dir.path(), &common::device(BackendKind::Flex), DType::F32).expect("loads");
    let input = tokens(10, 320);
    let expected: Vec<f64> = full_forward(&single, &input)
        .iter()
        .map(|&v| v as f64)
        .collect();

    let bytes = std::fs::read(dir.path().join("model.safetensors")).expect("read");
    let file = safetensors::SafeTensors::deserialize(&bytes).expect("parse");
    let mut names = file.names();
    names.sort();
    let mut weight_map = serde_json::Map::new();
    for (shard, part) in names.chunks(names.len() / 2 + 1).enumerate() {
        let shard_name = format!("model-{:05}-of-00002.safetensors", shard + 1);
        let views: Vec<_> = part
            .iter()
            .map(|name| (*name, file.tensor(name).expect("tensor")))
            .collect();
        safetensors::serialize_to_file(views, None, &dir.path().join(&shard_name))
            .expect("write shard");
        for name in part {
            weight_map.insert(name.to_string(), shard_name.clone().into());
        }
    }
    std::fs::remove_file(dir.path().join("model.safetensors")).expect("remove single file");
    std::fs::write(
        dir.path().join("model.safetensors.index.json"),
        json!({"metadata": {}, "weight_map": weight_map}).to_string(),
    )
    .expect("write index");

    let sharded = Llama::load(dir.path(), &common::device(BackendKind::Flex), DType::F32)
        .expect("sharded loads");
    assert_close(
        &full_forward(&sharded, &input),
        &expected,
        0.0,
        "sharded vs single",
    );
}
