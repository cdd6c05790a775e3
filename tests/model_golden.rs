//! The model against logits computed by Hugging Face transformers (float32) for the tiny
//! SmolLM-shaped checkpoint, on every backend: both CPU backends and the GPU (wgpu).

use crate::common;

use burn::tensor::DType;
use common::{Golden, argmax, assert_close, full_forward, greedy_ids, logsumexp, tiny_model_dir};
use smolchat::backend::BackendKind;
use smolchat::model::{Llama, Logits, logits_to_vec};

const BACKENDS: [BackendKind; 3] = [BackendKind::Flex, BackendKind::Ndarray, BackendKind::Gpu];

fn load(backend: BackendKind) -> Llama {
    Llama::load(&tiny_model_dir(), &common::device(backend), DType::F32)
        .expect("tiny fixture loads")
}

/// Checks rows of logits against the stored head columns, argmax and logsumexp.
fn check_rows(
    backend: BackendKind,
    what: &str,
    logits: &[f32],
    vocab: usize,
    head: (&[usize], &[f64]),
    lse: &[f64],
    argmaxes: Option<&[u32]>,
) {
    let columns = head.0[1];
    for (row, expected_head) in head.1.chunks(columns).enumerate() {
        let actual = &logits[row * vocab..(row + 1) * vocab];
        assert_close(
            &actual[..columns],
            expected_head,
            common::logit_tolerance(backend),
            &format!("{backend} {what} row {row}"),
        );
        let lse_diff = (logsumexp(actual) - lse[row]).abs();
        assert!(
            lse_diff <= common::logit_tolerance(backend),
            "{backend} {what} row {row}: logsumexp off by {lse_diff:e}"
        );
        if let Some(argmaxes) = argmaxes {
            assert_eq!(
                argmax(actual) as u32,
                argmaxes[row],
                "{backend} {what} row {row}: argmax"
            );
        }
    }
}

#[test]
fn prompt_logits_match_transformers() {
    let golden = Golden::load();
    let prompt = golden.ids("prompt_ids");
    let argmaxes = golden.ids("prompt_argmax");
    for backend in BACKENDS {
        let model = load(backend);
        let vocab = model.config().vocab_size;
        let logits = full_forward(&model, &prompt);
        assert_eq!(logits.len(), prompt.len() * vocab);
        check_rows(
            backend,
            "prompt",
            &logits,
            vocab,
            golden.floats("prompt_logits_head"),
            golden.floats("prompt_logsumexp").1,
            Some(&argmaxes),
        );
    }
}

/// Row 0 is the prediction after the prompt; row `k` the one after also feeding the first
/// `k` greedy tokens one at a time through the KV cache.
#[test]
fn decode_steps_after_prefill_match_transformers() {
    let golden = Golden::load();
    let prompt = golden.ids("prompt_ids");
    let greedy = golden.ids("greedy_ids");
    let (head_shape, head) = golden.floats("step_logits_head");
    let lse = golden.floats("step_logsumexp").1;
    for backend in BACKENDS {
        let model = load(backend);
        let vocab = model.config().vocab_size;
        let mut cache = model.new_cache();
        let mut logits = logits_to_vec(
            model
                .forward(&prompt, &mut cache, Logits::Last)
                .expect("prefill"),
        )
        .expect("read");
        for step in 0..head_shape[0] {
            if step > 0 {
                logits = logits_to_vec(
                    model
                        .forward(&greedy[step - 1..step], &mut cache, Logits::Last)
                        .expect("decode"),
                )
                .expect("read");
            }
            let row = &head[step * head_shape[1]..(step + 1) * head_shape[1]];
            check_rows(
                backend,
                &format!("decode step {step}"),
                &logits,
                vocab,
                (&[1, head_shape[1]], row),
                &lse[step..=step],
                None,
            );
        }
        assert_eq!(cache.len(), prompt.len() + head_shape[0] - 1);
    }
}

#[test]
fn long_context_last_row_matches_transformers() {
    let golden = Golden::load();
    let ids = golden.ids("long_ids");
    let (_, expected) = golden.floats("long_last_logits");
    for backend in BACKENDS {
        let model = load(backend);
        let mut cache = model.new_cache();
        let logits = logits_to_vec(
            model
                .forward(&ids, &mut cache, Logits::Last)
                .expect("forward"),
        )
        .expect("read");
        assert_close(
            &logits,
            expected,
            common::logit_tolerance(backend),
            &format!("{backend} 700-token last row"),
        );
    }
}

#[test]
fn greedy_generation_with_kv_cache_matches_transformers() {
    let golden = Golden::load();
    let prompt = golden.ids("prompt_ids");
    let expected = golden.ids("greedy_ids");
    for backend in BACKENDS {
        let generated = greedy_ids(&load(backend), &prompt, expected.len());
        assert_eq!(generated, expected, "{backend} greedy ids");
    }
}

#[test]
fn naive_reference_matches_transformers() {
    let golden = Golden::load();
    let prompt = golden.ids("prompt_ids");
    let (shape, head) = golden.floats("prompt_logits_head");
    let reference = common::reference::ReferenceLlama::load(&tiny_model_dir());
    for (row, logits) in reference.logits(&prompt).iter().enumerate() {
        let logits: Vec<f32> = logits.iter().map(|&v| v as f32).collect();
        assert_close(
            &logits[..shape[1]],
            &head[row * shape[1]..(row + 1) * shape[1]],
            1e-3,
            &format!("reference row {row}"),
        );
    }
}

/// Generation through the app's loop on the GPU, once reading every step's logits back (as
/// log-probabilities need) and once only the likeliest tokens: the same tokens with the same
/// probabilities and alternatives, greedy (transformers' ids) and sampled, in one read per
/// step where the likeliest tokens decide.
#[test]
fn tokens_chosen_from_the_likeliest_on_the_gpu_equal_those_from_the_whole_row() {
    use smolchat::generation::{GenerationSession, LoadedModel, ModelOptions, Step};
    use smolchat::text::SamplingParams;

    let golden = Golden::load();
    let prompt = golden.ids("prompt_ids");
    let expected = golden.ids("greedy_ids");
    let options = ModelOptions {
        backend: BackendKind::Gpu,
        ..ModelOptions::default()
    };
    let loaded = LoadedModel::load(&tiny_model_dir(), options).expect("tiny fixture loads");
    assert_eq!(
        loaded.device.backend,
        BackendKind::Gpu,
        "{:?}",
        loaded.device.fallback
    );
    let run = |params: &SamplingParams, whole_row: bool| {
        let mut cache = loaded.model.new_cache();
        let mut session =
            GenerationSession::start(&loaded, &mut cache, &prompt, params, expected.len())
                .expect("prefill")
                .ignoring_stop_tokens()
                .with_logprobs(whole_row.then_some(1));
        let mut tokens = Vec::new();
        while let Step::Token(token) = session.step().expect("step") {
            let alternatives: Vec<u32> = token.alternatives.iter().map(|a| a.0).collect();
            tokens.push((token.id, token.probability, alternatives));
        }
        (tokens, session.stats().device_reads)
    };
    let greedy = SamplingParams {
        temperature: 0.0,
        ..SamplingParams::default()
    };
    let sampled = SamplingParams {
        seed: 3,
        ..SamplingParams::default()
    };
    for (what, params) in [("greedy", &greedy), ("sampled", &sampled)] {
        let (whole, _) = run(params, true);
        let (top, reads) = run(params, false);
        if what == "greedy" {
            let ids: Vec<u32> = top.iter().map(|t| t.0).collect();
            assert_eq!(ids, expected, "greedy ids from the likeliest tokens");
            assert_eq!(reads, top.len() + 1, "one read per step");
        }
        assert_eq!(whole.len(), top.len());
        for (step, (w, t)) in whole.iter().zip(&top).enumerate() {
            assert_eq!((w.0, &w.2), (t.0, &t.2), "{what} step {step}");
            assert!(
                (w.1 - t.1).abs() < 1e-4,
                "{what} step {step}: {} vs {}",
                t.1,
                w.1
            );
        }
    }
}
