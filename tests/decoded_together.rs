//! Several sequences decoded together (`Llama::forward_each`, what the engine's slots run)
//! against each decoded alone: every family's block, float and integer weights, f32 and bf16
//! activations, on both CPU backends. Each row must be bit for bit what the sequence gets
//! alone, whatever else is in the step and wherever each sequence stands in its context.

use std::path::{Path, PathBuf};

use burn::tensor::DType;
use smolchat::backend::BackendKind;
use smolchat::generation::{LoadedModel, ModelOptions};
use smolchat::model::{Llama, Logits, logits_to_vec};

use crate::common::{self, argmax};

/// Prompts of different lengths, so that the sequences stand at different positions.
fn prompts(vocab: usize) -> Vec<Vec<u32>> {
    [3, 11, 1, 7, 20, 5, 2, 9, 14]
        .iter()
        .enumerate()
        .map(|(i, &len)| {
            (0..len)
                .map(|t| ((7 + 31 * i + 13 * t) % vocab) as u32)
                .collect()
        })
        .collect()
}

/// Each prompt read, then `steps` greedy tokens one at a time: the tokens fed and the bits
/// of every step's logits.
fn alone(model: &Llama, prompt: &[u32], steps: usize) -> (Vec<u32>, Vec<Vec<u32>>) {
    let mut cache = model.new_cache();
    let logits = model
        .forward(prompt, &mut cache, Logits::Last)
        .expect("prompt");
    let mut row = logits_to_vec(logits).expect("logits");
    let (mut fed, mut rows) = (Vec::new(), Vec::new());
    for _ in 0..steps {
        let token = argmax(&row) as u32;
        let logits = model
            .forward(&[token], &mut cache, Logits::Last)
            .expect("step");
        row = logits_to_vec(logits).expect("logits");
        fed.push(token);
        rows.push(row.iter().map(|v| v.to_bits()).collect());
    }
    (fed, rows)
}

/// The same sequences decoded together, `group` at a time joining at different steps: the
/// first of each group from the start, the others one step later each.
fn check(model: &Llama, what: &str) {
    let vocab = model.config().vocab_size;
    let prompts = prompts(vocab);
    let steps = 4;
    let expected: Vec<(Vec<u32>, Vec<Vec<u32>>)> =
        prompts.iter().map(|p| alone(model, p, steps)).collect();
    for group in [2, 4, prompts.len()] {
        for members in (0..prompts.len()).collect::<Vec<_>>().chunks(group) {
            let mut caches: Vec<_> = members.iter().map(|_| model.new_cache()).collect();
            for (cache, &m) in caches.iter_mut().zip(members) {
                model
                    .forward(&prompts[m], cache, Logits::Last)
                    .expect("prompt");
            }
            // Sequence `k` of the group takes its first step at step `k` of the group.
            for step in 0..steps + members.len() - 1 {
                let stepping: Vec<(usize, usize)> = members
                    .iter()
                    .enumerate()
                    .filter(|&(k, _)| (k..k + steps).contains(&step))
                    .map(|(k, &m)| (k, m))
                    .collect();
                let tokens: Vec<u32> = stepping
                    .iter()
                    .map(|&(k, m)| expected[m].0[step - k])
                    .collect();
                let mut chosen: Vec<_> = caches
                    .iter_mut()
                    .enumerate()
                    .filter(|(k, _)| stepping.iter().any(|&(s, _)| s == *k))
                    .map(|(_, cache)| cache)
                    .collect();
                let logits = model
                    .forward_each(&tokens, &mut chosen)
                    .expect("a step together");
                let logits = logits_to_vec(logits).expect("logits");
                for (row, &(k, m)) in logits.chunks_exact(vocab).zip(&stepping) {
                    let bits: Vec<u32> = row.iter().map(|v| v.to_bits()).collect();
                    assert!(
                        bits == expected[m].1[step - k],
                        "{what}: sequence {m}, step {}, beside {} others, differs from alone",
                        step - k,
                        stepping.len() - 1
                    );
                }
            }
        }
    }
}

fn family_dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/fixtures/families/{name}"))
}

#[test]
fn every_family_decodes_together_as_alone() {
    let mut dirs: Vec<(String, PathBuf)> = ["qwen2", "qwen3", "smollm3", "phi3", "gemma3"]
        .iter()
        .map(|name| (name.to_string(), family_dir(name)))
        .collect();
    dirs.push(("llama".into(), common::tiny_model_dir()));
    for (name, dir) in dirs {
        // burn-ndarray computes in f32 alone.
        for (backend, dtypes) in [
            (BackendKind::Flex, &[DType::F32, DType::BF16][..]),
            (BackendKind::Ndarray, &[DType::F32][..]),
        ] {
            for &dtype in dtypes {
                let model = Llama::load(&dir, &common::device(backend), dtype)
                    .unwrap_or_else(|err| panic!("{name}: {err}"));
                check(&model, &format!("{name} in {dtype:?} on {backend}"));
            }
        }
    }
}

/// Integer weights as GGUF files hold them: the genuine SmolLM2 Q4_1 file, and the K types
/// and Q8_0 that llama.cpp's quantizer wrote for a Qwen3 checkpoint.
#[test]
fn integer_weights_decode_together_as_alone() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let files = [
        root.join("tests/models/SmolLM2-135M-Instruct.Q4_1.gguf"),
        root.join("tests/fixtures/converted/qwen3/Q4_K_M.gguf"),
        root.join("tests/fixtures/converted/qwen3/Q8_0.gguf"),
    ];
    for file in files {
        let loaded = LoadedModel::load(&file, ModelOptions::default())
            .unwrap_or_else(|err| panic!("{}: {err}", file.display()));
        check(&loaded.model, &file.display().to_string());
    }
}
