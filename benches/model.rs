//! One 128-token prefill and one decode step of a full-size SmolLM2-135M-shaped model with
//! random weights, on each CPU backend.

mod common;

use std::time::Duration;

use burn::tensor::DType;
use criterion::{Criterion, criterion_group, criterion_main};
use smolchat::backend::{BackendKind, ComputeDevice};
use smolchat::model::{Llama, Logits};

const PROMPT_TOKENS: usize = 128;

fn prompt(vocab: usize) -> Vec<u32> {
    (0..PROMPT_TOKENS as u32)
        .map(|i| (i * 7919 + 13) % vocab as u32)
        .collect()
}

fn bench_backend(c: &mut Criterion, backend: BackendKind) {
    let dir = common::full_size_checkpoint();
    let model = Llama::load(&dir, &ComputeDevice::open(backend).device, DType::F32).expect("load");
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
