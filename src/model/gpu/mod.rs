//! Kernels for the GPU (burn-wgpu, or any CubeCL runtime), written in CubeCL and reached
//! through Burn's backend-extension API.
//!
//! A decode step runs one token: each operation is a few microseconds of arithmetic behind a
//! launch whose fixed cost is larger, and Burn composes a layer of some twenty launches. These
//! kernels do a layer's work in five (six once attention spans more than one chunk of
//! positions): the RMSNorm with the projection after it (q/k/v, and gate/up), RoPE with the
//! cache write and the whole attention, the SwiGLU gate with the down projection, and the
//! residual adds inside the projections that end each block. The model's
//! modules ask them first for one token on a GPU and use Burn's composition of the same math
//! otherwise (prompts, the CPU backends, quantized weights); the tests compare the two.
//! A last kernel finds a row's likeliest logits, so that a step reads back those instead of
//! the vocabulary.

mod attention;
mod extension;
mod matvec;
mod top;

use burn::backend::{Dispatch, DispatchDevice};
use burn::tensor::{DType, Tensor};

use extension::DecodeKernels;
use matvec::Prologue;

/// The widest head [`decode_attention`] takes: one workgroup's threads.
pub const MAX_HEAD_DIM: usize = attention::THREADS;

/// What a projection reads.
pub enum Input<'a> {
    /// `x`: `[1, cols]`.
    Plain(&'a Tensor<2>),
    /// `x` through an RMSNorm of weight `gamma` (`[cols]`).
    Normed {
        x: &'a Tensor<2>,
        gamma: &'a Tensor<1>,
        eps: f64,
    },
    /// `[1, 2 · cols]`, gate then up: the product reads `silu(gate) ⊙ up`.
    Gated(&'a Tensor<2>),
}

/// Whether `x` is one token's activations on a GPU, in a float type the kernels compute in.
pub fn runs_decode_step(x: &Tensor<2>) -> bool {
    x.dims()[0] == 1 && on_gpu(x) && matches!(x.dtype(), DType::F32 | DType::F16 | DType::BF16)
}

/// Whether `x` lives on a CubeCL device, where these kernels run.
fn on_gpu(x: &Tensor<2>) -> bool {
    matches!(x.device().as_dispatch(), DispatchDevice::Cube(_))
}

/// `[residual +] weight · input` in one launch, or `None` where it does not apply: not one
/// token on a GPU, or a weight held in another type than the activations (quantized).
pub fn project(
    weight: &Tensor<2>,
    input: Input<'_>,
    residual: Option<&Tensor<2>>,
) -> Option<Tensor<2>> {
    let (x, prologue, gamma, eps) = match input {
        Input::Plain(x) => (x, Prologue::Plain, None, 0.0),
        Input::Normed { x, gamma, eps } => (x, Prologue::RmsNorm, Some(gamma), eps),
        Input::Gated(x) => (x, Prologue::SwiGlu, None, 0.0),
    };
    if !runs_decode_step(x) || weight.dtype() != x.dtype() {
        return None;
    }
    let [rows, cols] = weight.dims();
    let read = if prologue == Prologue::SwiGlu {
        2 * cols
    } else {
        cols
    };
    let shapes_fit = x.dims()[1] == read
        && gamma.is_none_or(|gamma| gamma.dims() == [cols] && gamma.dtype() == x.dtype())
        && residual.is_none_or(|r| r.dims() == [1, rows] && r.dtype() == x.dtype());
    if !shapes_fit {
        return None;
    }
    let unused = || x.clone().into_dispatch();
    let y = <Dispatch as DecodeKernels>::matvec(
        weight.clone().into_dispatch(),
        x.clone().into_dispatch(),
        gamma.map_or_else(unused, |gamma| gamma.clone().into_dispatch()),
        residual.map_or_else(unused, |residual| residual.clone().into_dispatch()),
        eps as f32,
        prologue,
        residual.is_some(),
    );
    Some(Tensor::from_dispatch(y))
}

/// One token's attention (`[1, heads · head_dim]`) from its fused q/k/v projection `qkv`,
/// writing its rotated key and its value into `keys` and `values` (`[kv_heads, capacity,
/// head_dim]`) at `position`, which the caches hand back. `cos` and `signed_sin` are the
/// position's (`[1, head_dim]`, a `RopeRows`). The caller checks [`runs_decode_step`] first.
pub fn decode_attention(
    qkv: &Tensor<2>,
    (cos, signed_sin): (&Tensor<2>, &Tensor<2>),
    (keys, values): (Tensor<3>, Tensor<3>),
    position: usize,
    heads: usize,
) -> (Tensor<2>, Tensor<3>, Tensor<3>) {
    let [kv_heads, capacity, head_dim] = keys.dims();
    assert!(
        runs_decode_step(qkv)
            && qkv.dims()[1] == (heads + 2 * kv_heads) * head_dim
            && heads.is_multiple_of(kv_heads)
            && head_dim.is_multiple_of(2)
            && head_dim <= MAX_HEAD_DIM
            && position < capacity
            && cos.dims() == [1, head_dim]
            && signed_sin.dims() == cos.dims()
            && values.dims() == keys.dims(),
        "decode attention called outside its shapes"
    );
    let (context, keys, values) = <Dispatch as DecodeKernels>::decode_attention(
        qkv.clone().into_dispatch(),
        cos.clone().into_dispatch(),
        signed_sin.clone().into_dispatch(),
        keys.into_dispatch(),
        values.into_dispatch(),
        position,
        heads,
    );
    (
        Tensor::from_dispatch(context),
        Tensor::from_dispatch(keys),
        Tensor::from_dispatch(values),
    )
}

/// The `count` largest logits of `row` (`[1, len]`, f32, on a GPU) and their ids, best first
/// (ties: the lower id), as one `[1, 2 · count]` tensor: values, then ids as f32 (exact below
/// 2²⁴). `None` off the GPU, for another shape or type, or for more than 256 entries.
pub fn top_entries(row: &Tensor<2>, count: usize) -> Option<Tensor<2>> {
    let [rows, len] = row.dims();
    let applies = rows == 1
        && (1..=len.min(top::THREADS)).contains(&count)
        && len < 1 << 24
        && row.dtype() == DType::F32
        && on_gpu(row);
    if !applies {
        return None;
    }
    let (values, ids) =
        <Dispatch as DecodeKernels>::top_entries(row.clone().into_dispatch(), count);
    let best = |entries| Tensor::<1>::from_dispatch(entries);
    Some(Tensor::cat(vec![best(values), best(ids)], 0).reshape([1, 2 * count]))
}

#[cfg(test)]
mod tests;
