//! Kernels for the CPU backends (burn-flex and burn-ndarray), reached through Burn's
//! backend-extension API.
//!
//! Burn runs each tensor operation as its own pass with its own output; on a CPU, for one
//! token at a time, that overhead and some slow paths (bf16 products that widen the whole
//! KV cache, a matrix-vector product on one thread) cost more than the arithmetic. The
//! model's modules ask these kernels first and use Burn's composition of the same math
//! when they decline: on the GPU, or for a layout they do not handle. Each kernel is tested
//! against that composition or an f64 reference.

mod attention_kernel;
mod cache_lines;
mod features;
mod gated;
mod host;
mod math;
mod matmul;
mod matvec;
mod pool;
mod projection;
mod quantize;
mod rms_norm;
mod threads;
mod weights;

pub use attention_kernel::{HeadLayout, NextToken, self_attention, self_attention_each};
pub use gated::gated;
pub use host::{HostFloat, is_host, reads_shared_weights_in_place};
pub use projection::{MATVEC_ROWS, project};
pub use quantize::quantize;
pub use rms_norm::rms_norm;
pub use weights::{
    BlockFactors, IntegerValues, IntegerWeights, RowOrder, SIX_BIT_ZERO, Weight,
    fifth_bits_in_order, pack_six_bits,
};

/// `buffer` at least `len` long: the kernels' per-thread buffers only grow.
fn grow<T: Default + Clone>(buffer: &mut Vec<T>, len: usize) {
    if buffer.len() < len {
        buffer.resize(len, T::default());
    }
}

/// Deterministic values in [-1, 1) that differ for every index: the kernels' test inputs.
#[cfg(test)]
pub(super) fn test_values(len: usize, seed: u32) -> Vec<f32> {
    (0..len as u32)
        .map(|i| {
            let h = (i ^ seed).wrapping_mul(2_654_435_761) >> 8;
            h as f32 / (1u32 << 23) as f32 - 1.0
        })
        .collect()
}
