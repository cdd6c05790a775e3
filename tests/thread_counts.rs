//! A sequence's logits do not depend on how many threads computed them: each output of every
//! kernel is summed by one thread, in an order fixed by the shapes alone. The kernels' thread
//! count is fixed once per process (`RAYON_NUM_THREADS`, read when the first kernel runs), so
//! the test runs itself again in child processes with 1, 2 and 3 threads, each writing the
//! bits of every logit it computed, and compares them.

use std::path::{Path, PathBuf};
use std::process::Command;

use burn::tensor::DType;
use smolchat::backend::BackendKind;
use smolchat::generation::{LoadedModel, ModelOptions};
use smolchat::model::{Llama, Logits, logits_to_vec};

use crate::common::{self, argmax};

/// Where a child process writes its logits' bits; set only in the children.
const OUTPUT_VARIABLE: &str = "SMOLCHAT_THREAD_COUNTS_OUTPUT";

const TEST_NAME: &str = "thread_counts::logits_are_the_same_bits_on_one_two_and_three_threads";

/// A 40-token prompt read whole, every row of its logits kept (the prompt kernels), then
/// greedy tokens one at a time (the decode kernels).
fn bits_of(model: &Llama, out: &mut Vec<u8>) {
    let vocab = model.config().vocab_size;
    let prompt: Vec<u32> = (0..40).map(|t| ((5 + 17 * t) % vocab) as u32).collect();
    let mut cache = model.new_cache();
    let logits = model
        .forward(&prompt, &mut cache, Logits::All)
        .expect("prompt");
    let mut rows = logits_to_vec(logits).expect("logits");
    for _ in 0..4 {
        out.extend(rows.iter().flat_map(|v| v.to_bits().to_le_bytes()));
        let last = &rows[rows.len() - vocab..];
        let token = argmax(last) as u32;
        let logits = model
            .forward(&[token], &mut cache, Logits::Last)
            .expect("step");
        rows = logits_to_vec(logits).expect("logits");
    }
    out.extend(rows.iter().flat_map(|v| v.to_bits().to_le_bytes()));
}

/// Every model the child computes: the tiny checkpoints of two families in f32 and bf16 on
/// burn-flex and in f32 on burn-ndarray, and GGUF files' integer weights.
fn all_bits() -> Vec<u8> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut out = Vec::new();
    let dirs: [PathBuf; 2] = [
        common::tiny_model_dir(),
        root.join("tests/fixtures/families/qwen3"),
    ];
    for dir in dirs {
        for (backend, dtype) in [
            (BackendKind::Flex, DType::F32),
            (BackendKind::Flex, DType::BF16),
            (BackendKind::Ndarray, DType::F32),
        ] {
            let model = Llama::load(&dir, &common::device(backend), dtype)
                .unwrap_or_else(|err| panic!("{}: {err}", dir.display()));
            bits_of(&model, &mut out);
        }
    }
    for file in [
        root.join("tests/models/SmolLM2-135M-Instruct.Q4_1.gguf"),
        root.join("tests/fixtures/converted/qwen3/Q4_K_M.gguf"),
        root.join("tests/fixtures/converted/qwen3/Q8_0.gguf"),
    ] {
        let loaded = LoadedModel::load(&file, ModelOptions::default())
            .unwrap_or_else(|err| panic!("{}: {err}", file.display()));
        bits_of(&loaded.model, &mut out);
    }
    out
}

#[test]
fn logits_are_the_same_bits_on_one_two_and_three_threads() {
    if let Some(path) = std::env::var_os(OUTPUT_VARIABLE) {
        std::fs::write(&path, all_bits()).expect("write the logits");
        return;
    }
    let dir = tempfile::tempdir().expect("temporary folder");
    let outputs: Vec<(usize, Vec<u8>)> = [1, 2, 3]
        .into_iter()
        .map(|threads| {
            let path = dir.path().join(format!("{threads}.bin"));
            let status = Command::new(std::env::current_exe().expect("this test binary"))
                .args([TEST_NAME, "--exact", "--test-threads", "1"])
                .env(OUTPUT_VARIABLE, &path)
                .env("RAYON_NUM_THREADS", threads.to_string())
                .status()
                .expect("run the test binary again");
            assert!(status.success(), "the child on {threads} threads failed");
            let bits = std::fs::read(&path).unwrap_or_else(|err| {
                panic!("the child on {threads} threads wrote no logits: {err}")
            });
            (threads, bits)
        })
        .collect();
    let (_, one) = &outputs[0];
    assert!(!one.is_empty(), "no logits computed");
    for (threads, bits) in &outputs[1..] {
        assert_eq!(
            bits.len(),
            one.len(),
            "{threads} threads: a different number of logits"
        );
        let first = bits.iter().zip(one).position(|(a, b)| a != b);
        assert!(
            first.is_none(),
            "{threads} threads: logit {} differs from one thread's",
            first.unwrap_or_default() / 4
        );
    }
}
