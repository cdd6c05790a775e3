//! A prompt read whole against the same prompt read as cache and remainder, split at every
//! point: the logits after its last token must be the same bits (issue 37's split
//! invariance), where the kernels sum in one order whatever the number of tokens.

use std::path::Path;

use burn::tensor::DType;
use smolchat::backend::BackendKind;
use smolchat::generation::{LoadedModel, ModelOptions};
use smolchat::model::{Llama, Logits, logits_to_vec};

use crate::common;

/// The bits of the logits after `prompt`, read in the calls that `calls` bounds.
fn last_logits(model: &Llama, prompt: &[u32], calls: &[usize]) -> Vec<u32> {
    let mut cache = model.new_cache();
    let mut logits = Vec::new();
    for call in calls.windows(2) {
        let read = model
            .forward(&prompt[call[0]..call[1]], &mut cache, Logits::Last)
            .expect("a part of the prompt");
        logits = logits_to_vec(read).expect("logits");
    }
    logits.iter().map(|v| v.to_bits()).collect()
}

/// The bits of the last row of the logits of every token of `prompt`, read whole: with
/// [`Logits::Last`] only the last token goes through the last layer's MLP, and its row must be
/// the one it gets beside the others.
fn last_of_all_logits(model: &Llama, prompt: &[u32]) -> Vec<u32> {
    let mut cache = model.new_cache();
    let all = model
        .forward(prompt, &mut cache, Logits::All)
        .expect("the prompt");
    let all = logits_to_vec(all).expect("logits");
    let vocab = model.config().vocab_size;
    all[all.len() - vocab..]
        .iter()
        .map(|v| v.to_bits())
        .collect()
}

/// Float weights (the tiny checkpoint's bf16), with activations in bf16 (`--precision bf16`)
/// and in f32 (the default, which every safetensors checkpoint runs at): a prompt's products
/// and a decode step's sum each output in the same order, and so does attention.
#[test]
fn a_float_prompt_split_anywhere_gives_the_logits_it_gives_whole() {
    for dtype in [DType::BF16, DType::F32] {
        let model = Llama::load(
            &common::tiny_model_dir(),
            &common::device(BackendKind::Flex),
            dtype,
        )
        .expect("the tiny model");
        let vocab = model.config().vocab_size;
        // Past a range of 256 keys, so that attention merges several, and past the 32 tokens
        // of one block of queries.
        let prompt: Vec<u32> = (0..300)
            .map(|t| ((7 + 13 * t * t + 5 * t) % vocab) as u32)
            .collect();
        let whole = last_logits(&model, &prompt, &[0, prompt.len()]);
        assert!(
            last_of_all_logits(&model, &prompt) == whole,
            "{dtype:?}: the last row of every token's logits differs from the last logits"
        );
        let splits = (1..=40).chain([100, 255, 256, 257, 270, 290, 299]);
        for split in splits {
            assert!(
                last_logits(&model, &prompt, &[0, split, prompt.len()]) == whole,
                "{dtype:?}: split after {split} of {} tokens: the logits differ from the whole \
                 prompt's",
                prompt.len()
            );
        }
        let last_ones_alone: Vec<usize> = [0].into_iter().chain(280..=prompt.len()).collect();
        assert!(
            last_logits(&model, &prompt, &last_ones_alone) == whole,
            "{dtype:?}: the last 20 tokens read one at a time: the logits differ from the whole \
             prompt's"
        );
    }
}

/// Integer weights as GGUF files hold them (the genuine SmolLM2 Q4_1 file; the K types and
/// Q8_0 that llama.cpp's quantizer wrote for a Qwen3 checkpoint): a decode step, a few
/// tokens and a prompt each sum every output in the order the prompt kernel does, so a
/// 40-token prompt split at any point, or read a token at a time from any point (a reply's
/// tokens, then the conversation read again), gives the logits it gives whole.
#[test]
fn an_integer_prompt_split_anywhere_gives_the_logits_it_gives_whole() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for file in [
        crate::gguf::builder::real_model(),
        root.join("tests/fixtures/converted/qwen3/Q4_K_M.gguf"),
        root.join("tests/fixtures/converted/qwen3/Q8_0.gguf"),
    ] {
        let loaded = LoadedModel::load(&file, ModelOptions::default())
            .unwrap_or_else(|err| panic!("{}: {err}", file.display()));
        let file = file.display();
        let model = &loaded.model;
        let vocab = model.config().vocab_size;
        let prompt: Vec<u32> = (0..40)
            .map(|t| ((11 + 17 * t * t + 3 * t) % vocab) as u32)
            .collect();
        let whole = last_logits(model, &prompt, &[0, prompt.len()]);
        assert!(
            last_of_all_logits(model, &prompt) == whole,
            "{file}: the last row of every token's logits differs from the last logits"
        );
        for split in 1..prompt.len() {
            assert!(
                last_logits(model, &prompt, &[0, split, prompt.len()]) == whole,
                "{file}: split after {split} of {} tokens: the logits differ from the whole \
                 prompt's",
                prompt.len()
            );
        }
        for from in [1, 25, 39] {
            let calls: Vec<usize> = [0].into_iter().chain(from..=prompt.len()).collect();
            assert!(
                last_logits(model, &prompt, &calls) == whole,
                "{file}: the tokens from {from} read one at a time: the logits differ from \
                 the whole prompt's"
            );
        }
    }
}
