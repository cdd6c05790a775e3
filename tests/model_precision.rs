//! What the reduced precisions cost in accuracy, against transformers' float32 logits on the
//! tiny fixture. Run with `--nocapture` to print the figures the performance issue reports.

use crate::common;

use common::{
    Golden, argmax, full_forward, greedy_ids, max_abs_diff, one_token_at_a_time, tiny_model_dir,
};
use smolchat::backend::BackendKind;
use smolchat::model::{Llama, ModelError, Precision};

struct Accuracy {
    /// Largest logit error over the stored head columns of every prompt row, from the prompt
    /// in one pass and from one token at a time (the decode step's kernels).
    max_abs_error: f64,
    /// Prompt rows whose argmax equals the reference's.
    argmax_agreement: usize,
    rows: usize,
    /// Greedy ids generated with the KV cache before the first one that differs.
    greedy_prefix: usize,
}

fn measure(backend: BackendKind, precision: Precision) -> Accuracy {
    let golden = Golden::load();
    let prompt = golden.ids("prompt_ids");
    let model = Llama::load_in(
        &tiny_model_dir(),
        &common::device(backend),
        precision,
        &mut |_| {},
    )
    .expect("tiny fixture loads");
    let vocab = model.config().vocab_size;
    let logits = full_forward(&model, &prompt);
    let stepped = one_token_at_a_time(&model, &prompt);
    let (shape, head) = golden.floats("prompt_logits_head");
    let columns = shape[1];
    let reference_argmax = golden.ids("prompt_argmax");
    let (mut prompt_error, mut step_error): (f64, f64) = (0.0, 0.0);
    let mut argmax_agreement = 0;
    for (row, expected) in head.chunks(columns).enumerate() {
        let actual = &logits[row * vocab..(row + 1) * vocab];
        let stepped = &stepped[row * vocab..(row + 1) * vocab];
        prompt_error = prompt_error.max(max_abs_diff(&actual[..columns], expected).0);
        step_error = step_error.max(max_abs_diff(&stepped[..columns], expected).0);
        argmax_agreement += usize::from(argmax(actual) as u32 == reference_argmax[row]);
    }
    let max_abs_error = prompt_error.max(step_error);

    let expected = golden.ids("greedy_ids");
    let greedy_prefix = greedy_ids(&model, &prompt, expected.len())
        .iter()
        .zip(&expected)
        .take_while(|(generated, want)| generated == want)
        .count();
    let accuracy = Accuracy {
        max_abs_error,
        argmax_agreement,
        rows: prompt.len(),
        greedy_prefix,
    };
    println!(
        "{backend} {precision}: max |logit error| {prompt_error:.2e} in one pass, \
         {step_error:.2e} one token at a time, prompt argmax {}/{}, greedy ids {}/{}",
        accuracy.argmax_agreement,
        accuracy.rows,
        accuracy.greedy_prefix,
        expected.len()
    );
    accuracy
}

/// Bounds for a random-weight model, whose top logits are nearly tied: a correct reduced
/// precision stays within 0.1 of every logit, keeps 80% of the argmaxes and the first half of
/// the greedy ids; a wrong scale, layout or dtype misses all three by far.
fn assert_close_to_float32(backend: BackendKind, precision: Precision) {
    let accuracy = measure(backend, precision);
    let greedy = Golden::load().ids("greedy_ids").len();
    assert!(
        accuracy.max_abs_error < 0.1,
        "{backend} {precision}: logit error {:e}",
        accuracy.max_abs_error
    );
    assert!(
        accuracy.argmax_agreement * 10 >= accuracy.rows * 8,
        "{backend} {precision}: argmax agrees on {}/{} rows",
        accuracy.argmax_agreement,
        accuracy.rows
    );
    assert!(
        accuracy.greedy_prefix * 2 >= greedy,
        "{backend} {precision}: greedy ids agree for {}/{greedy}",
        accuracy.greedy_prefix
    );
}

#[test]
fn half_precisions_stay_close_to_float32() {
    for precision in [Precision::Bf16, Precision::F16] {
        assert_close_to_float32(BackendKind::Flex, precision);
    }
    assert_close_to_float32(BackendKind::Gpu, Precision::F16);
}

#[test]
fn eight_bit_weights_stay_close_to_float32() {
    for backend in [BackendKind::Flex, BackendKind::Ndarray, BackendKind::Gpu] {
        assert_close_to_float32(backend, Precision::Q8);
    }
}

#[test]
fn float32_is_exact_at_the_golden_tolerance() {
    let accuracy = measure(BackendKind::Flex, Precision::F32);
    assert!(accuracy.max_abs_error < 1e-3);
    assert_eq!(accuracy.argmax_agreement, accuracy.rows);
    assert_eq!(
        accuracy.greedy_prefix,
        Golden::load().ids("greedy_ids").len()
    );
}

#[test]
fn a_precision_the_backend_cannot_compute_in_is_a_clear_error() {
    #[allow(deprecated)]
    let ndarray = burn::tensor::Device::ndarray();
    for precision in [Precision::Bf16, Precision::F16] {
        let err = Llama::load_in(&tiny_model_dir(), &ndarray, precision, &mut |_| {})
            .expect_err("ndarray does not compute in half precision");
        assert!(
            matches!(err, ModelError::UnsupportedComputeDtype { .. }),
            "{err}"
        );
    }
}
