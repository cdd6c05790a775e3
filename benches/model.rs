//! One 128-token prefill and one decode step of a full-size SmolLM2-135M-shaped model with
//! random weights, for each CPU backend and the precisions that matter on it; and the same
//! at 2000 tokens on burn-flex, where attention over the cache is a large part of the work.

mod common;

use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use smolchat::backend::{BackendKind, ComputeDevice};
use smolchat::model::{Llama, Logits, Precision};

const PROMPT_TOKENS: usize = 128;

const LONG_PROMPT_TOKENS: usize = 2000;

fn prompt(vocab: usize, len: usize) -> Vec<u32> {
    (0..len as u32)
        .map(|i| (i * 7919 + 13) % vocab as u32)
        .collect()
}

fn bench(c: &mut Criterion, backend: BackendKind, precision: Precision, prompt_len: usize) {
    let dir = common::full_size_checkpoint();
    let device = ComputeDevice::open(backend).device;
    let model = Llama::load_in(&dir, &device, precision, &mut |_| {}).expect("load");
    let tokens = prompt(model.config().vocab_size, prompt_len);
    let mut group = c.benchmark_group(format!("smollm2-135m/{backend}/{precision}"));
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(10));

    let mut cache = model.new_cache();
    group.bench_function(format!("prefill-{prompt_len}"), |b| {
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
    group.bench_function(format!("decode-step-at-{prompt_len}"), |b| {
        b.iter(|| {
            cache.truncate(prompt_len);
            model
                .forward(&[42], &mut cache, Logits::Last)
                .expect("decode")
                .into_data()
        })
    });
    group.finish();
}

fn model_benches(c: &mut Criterion) {
    for precision in [Precision::F32, Precision::Bf16, Precision::Q8] {
        bench(c, BackendKind::Flex, precision, PROMPT_TOKENS);
    }
    bench(c, BackendKind::Ndarray, Precision::F32, PROMPT_TOKENS);
    bench(c, BackendKind::Flex, Precision::F32, LONG_PROMPT_TOKENS);
}

criterion_group!(benches, model_benches);
criterion_main!(benches);
