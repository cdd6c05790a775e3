//! One 128-token prefill and one decode step of a full-size SmolLM2-135M-shaped model with
//! random weights, on each CPU backend. The checkpoint is written on first use into
//! `target/bench-models/` (the weights' values do not change the speed).

use std::path::PathBuf;
use std::time::Duration;

use burn::tensor::DType;
use criterion::{Criterion, criterion_group, criterion_main};
use smolchat::backend::BackendKind;
use smolchat::model::random_checkpoint::{StorageDtype, write_random_weights};
use smolchat::model::{Llama, LlamaConfig, Logits};

const PROMPT_TOKENS: usize = 128;

fn full_size_checkpoint() -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let dir = root.join("target/bench-models/smollm2-135m-random");
    if !dir.join("model.safetensors").is_file() {
        let config_path = root.join("tests/fixtures/smollm2-135m-instruct/config.json");
        std::fs::create_dir_all(&dir).expect("create bench model dir");
        std::fs::copy(&config_path, dir.join("config.json")).expect("copy config");
        let config = LlamaConfig::from_file(&config_path).expect("config");
        write_random_weights(&config, StorageDtype::Bf16, 0, &dir).expect("write weights");
    }
    dir
}

fn prompt(vocab: usize) -> Vec<u32> {
    (0..PROMPT_TOKENS as u32)
        .map(|i| (i * 7919 + 13) % vocab as u32)
        .collect()
}

fn bench_backend(c: &mut Criterion, backend: BackendKind) {
    let dir = full_size_checkpoint();
    let model = Llama::load(&dir, &backend.device(), DType::F32).expect("load");
    let tokens = prompt(model.config().vocab_size);
    let mut group = c.benchmark_group(format!("smollm2-135m-f32/{backend}"));
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(10));

    let mut cache = model.new_cache();
    group.bench_function("prefill-128", |b| {
        b.iter(|| {
            cache.clear();
            model
                .forward(&tokens, &mut cache, Logits::Last)
                .expect("prefill")
                .into_data()
        })
    });

    cache.clear();
    model
        .forward(&tokens, &mut cache, Logits::Last)
        .expect("prefill");
    group.bench_function("decode-step-at-128", |b| {
        b.iter(|| {
            cache.truncate(PROMPT_TOKENS);
            model
                .forward(&[42], &mut cache, Logits::Last)
                .expect("decode")
                .into_data()
        })
    });
    group.finish();
}

fn model_benches(c: &mut Criterion) {
    bench_backend(c, BackendKind::Flex);
    bench_backend(c, BackendKind::Ndarray);
}

criterion_group!(benches, model_benches);
criterion_main!(benches);
