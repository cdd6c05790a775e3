//! Each kernel against Burn's composition of the same math, on the GPU (lavapipe where there
//! is no card).

use burn::tensor::activation::{silu, softmax};
use burn::tensor::{DType, Device, Tensor, TensorData};

use super::{Input, decode_attention, project};
use crate::backend::{BackendKind, ComputeDevice};
use crate::model::cpu::test_values;
use crate::model::rope::RotaryEmbedding;

fn gpu() -> Device {
    let opened = ComputeDevice::open(BackendKind::Gpu);
    assert_eq!(
        opened.backend,
        BackendKind::Gpu,
        "these tests need a GPU or lavapipe: {:?}",
        opened.fallback
    );
    opened.device
}

fn tensor<const D: usize>(shape: [usize; D], seed: u32, device: &Device) -> Tensor<D> {
    let len = shape.iter().product();
    Tensor::from_data(TensorData::new(test_values(len, seed), shape), device)
}

/// Within float32 rounding of sums of a few thousand terms, taken in another order.
fn assert_close<const D: usize>(actual: Tensor<D>, expected: Tensor<D>, what: &str) {
    assert_eq!(actual.dims(), expected.dims(), "{what}: shape");
    let actual = actual
        .into_data()
        .try_into_vec::<f32>()
        .expect("f32 values");
    let expected = expected
        .into_data()
        .try_into_vec::<f32>()
        .expect("f32 values");
    let worst = actual
        .iter()
        .zip(&expected)
        .map(|(a, e)| (a - e).abs() / e.abs().max(1.0))
        .fold(0.0f32, f32::max);
    assert!(worst < 1e-4, "{what}: off by {worst}");
}

#[test]
fn projections_match_burns_composition() {
    let device = gpu();
    // Rows past one workgroup's share and columns not a multiple of its width; inputs too long
    // to keep in shared memory, read in vectors of four and one by one.
    for (rows, cols) in [(70, 100), (9, 4104), (5, 4102)] {
        let what = |name: &str| format!("{name}, {rows}×{cols}");
        let weight = tensor([rows, cols], 1, &device);
        let x = tensor([1, cols], 2, &device);
        let residual = tensor([1, rows], 3, &device);
        let product = |x: Tensor<2>| x.matmul(weight.clone().transpose());

        let plain = project(&weight, Input::Plain(&x), Some(&residual)).expect("runs on the GPU");
        let expected = residual.clone() + product(x.clone());
        assert_close(plain, expected, &what("plain + residual"));

        let gamma = tensor([cols], 4, &device);
        let eps = 1e-5;
        let input = Input::Normed {
            x: &x,
            gamma: &gamma,
            eps,
        };
        let normed = project(&weight, input, None).expect("runs on the GPU");
        let inv_rms = x
            .clone()
            .square()
            .mean_dim(1)
            .add_scalar(eps)
            .sqrt()
            .recip();
        let expected = product(x.clone() * inv_rms * gamma.unsqueeze::<2>());
        assert_close(normed, expected, &what("RMSNorm"));

        let gate_up = tensor([1, 2 * cols], 5, &device);
        let gated = project(&weight, Input::Gated(&gate_up), None).expect("runs on the GPU");
        let gate = gate_up.clone().narrow(1, 0, cols);
        let up = gate_up.narrow(1, cols, cols);
        assert_close(gated, product(silu(gate) * up), &what("SwiGLU"));
    }
}

#[test]
fn prompts_are_left_to_burn() {
    let device = gpu();
    let weight = tensor([8, 4], 1, &device);
    let x = tensor([2, 4], 2, &device);
    assert!(project(&weight, Input::Plain(&x), None).is_none());
}

#[test]
fn attention_matches_burns_composition_and_writes_the_cache() {
    // The first position, one within the first chunk of scores and one past two chunks,
    // into a cache with room to spare. A head of 96 channels makes a chunk of 192 positions,
    // which the maximum's reduction halves unevenly.
    for position in [0, 5, 600] {
        check_attention(4, 2, 8, position, 640);
    }
    check_attention(2, 1, 96, 300, 320);
}

fn check_attention(
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    position: usize,
    capacity: usize,
) {
    let device = gpu();
    let group = heads / kv_heads;
    let rope = RotaryEmbedding::new(head_dim, head_dim, 10_000.0, None, &device, DType::F32)
        .positions(position..position + 1);
    let qkv = tensor([1, (heads + 2 * kv_heads) * head_dim], 1, &device);
    let keys = tensor([kv_heads, capacity, head_dim], 2, &device);
    let values = tensor([kv_heads, capacity, head_dim], 3, &device);

    let (context, new_keys, new_values) = decode_attention(
        &qkv,
        rope.tables(),
        (keys.clone(), values.clone()),
        position,
        heads,
    );

    let split = |offset: usize, count: usize| {
        qkv.clone()
            .narrow(1, offset * head_dim, count * head_dim)
            .reshape([count, 1, head_dim])
    };
    let q = rope.forward(split(0, heads));
    let k = rope.forward(split(heads, kv_heads));
    let v = split(heads + kv_heads, kv_heads);
    let slot = [0..kv_heads, position..position + 1, 0..head_dim];
    let keys = keys.slice_assign(slot.clone(), k);
    let values = values.slice_assign(slot, v);
    assert_close(new_keys.clone(), keys.clone(), "keys written");
    assert_close(new_values, values.clone(), "values written");

    let seen = [0..kv_heads, 0..position + 1, 0..head_dim];
    let scores = q
        .reshape([kv_heads, group, head_dim])
        .div_scalar((head_dim as f64).sqrt())
        .matmul(keys.slice(seen.clone()).swap_dims(1, 2));
    let expected = softmax(scores, 2)
        .matmul(values.slice(seen))
        .reshape([1, heads * head_dim]);
    assert_close(
        context,
        expected,
        &format!("attention, {heads} heads of {head_dim} at position {position}"),
    );
}

#[test]
fn top_entries_are_the_largest_best_first() {
    let device = gpu();
    // The vocabulary's width (two launches), one span (one launch), a ragged last span, and
    // the largest count.
    for (len, count) in [(49_152, 64), (500, 64), (3001, 7), (2000, 256), (64, 64)] {
        // Ties among the largest values, which the lower id wins.
        let row: Vec<f32> = test_values(len, 9)
            .into_iter()
            .map(|v| (v * 64.0).round())
            .collect();
        let top = super::top_entries(
            &Tensor::from_data(TensorData::new(row.clone(), [1, len]), &device),
            count,
        )
        .expect("runs on the GPU");
        let read = top.into_data().try_into_vec::<f32>().expect("f32 values");
        let mut expected: Vec<usize> = (0..len).collect();
        expected.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
        let ids: Vec<usize> = read[count..].iter().map(|&id| id as usize).collect();
        assert_eq!(ids, expected[..count], "ids of {count} in {len}");
        let values: Vec<f32> = expected[..count].iter().map(|&id| row[id]).collect();
        assert_eq!(read[..count], values[..], "values of {count} in {len}");
    }
}
