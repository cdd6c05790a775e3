//! One decode-step projection in one launch: `y = [residual +] W · f(x)`, where `f` is the
//! RMSNorm before the projection, the SwiGLU gate before it, or nothing.
//!
//! Burn runs the same math as three to five launches (norm reductions, elementwise scaling,
//! matmul, residual add). For one token each of them is a few microseconds of arithmetic
//! behind a launch's fixed cost, so folding them into the product's own pass is what makes
//! decode fast on a GPU. Each workgroup first applies the prologue to the whole input (for
//! the norm, after summing its squares), which every workgroup repeats rather than wait for
//! another launch to do it once, then computes rows, eight threads to a row, each row's
//! sum reduced in shared memory.

use cubecl::prelude::*;

/// Threads per workgroup.
pub const WIDTH: usize = 64;
/// Threads sharing one row: neighbouring threads read neighbouring weights (one contiguous
/// load per row on a SIMD lane group, coalesced on a GPU), and the row's sum takes three
/// halvings instead of six.
const ROW_THREADS: usize = 8;
/// Rows a workgroup computes at once.
pub const ROWS_PER_STEP: usize = WIDTH / ROW_THREADS;
/// The longest input the workgroup keeps in shared memory after the prologue, so that each
/// row reads it from there instead of normalizing or gating every value again: 12 KB of
/// f32, which with the row sums stays within the 16 KB every Vulkan and WebGPU device has.
pub const MAX_STAGED: usize = 3072;

/// What the projection applies to its input first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Prologue {
    Plain,
    /// `x / sqrt(mean(x²) + ε) · γ`.
    RmsNorm,
    /// The input is `[gate | up]`, and the projection reads `silu(gate) ⊙ up`.
    SwiGlu,
}

/// `weight`: `[rows, cols]`; `input`: `[cols]` (`[2 · cols]` for SwiGLU); `gamma`: the norm's
/// `[cols]` (read only for [`Prologue::RmsNorm`]); `residual`: `[rows]` (read only when
/// `add_residual`); all but `residual` and `output` read in vectors of `N` values, which
/// divides `cols`. Workgroup `c` computes rows `ROWS_PER_STEP · (c + k · count) + …`.
/// `staged` is the input's length in vectors when at most [`MAX_STAGED`] values, else 0.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub fn matvec_kernel<F: Float, N: Size>(
    weight: &[Vector<F, N>],
    input: &[Vector<F, N>],
    gamma: &[Vector<F, N>],
    residual: &[F],
    output: &mut [F],
    rows: usize,
    cols: usize,
    eps: f32,
    #[comptime] prologue: Prologue,
    #[comptime] add_residual: bool,
    #[comptime] staged: usize,
    #[define(F)] _dtype: ElemType,
) {
    let unit = UNIT_POS as usize;
    let width = weight.vector_size();
    let vectors = cols / width;
    let mut partial = Shared::<[F]>::new_slice(WIDTH);

    let mut inv_rms = F::new(1.0);
    if comptime!(prologue == Prologue::RmsNorm) {
        let mut squares = Vector::<F, N>::new(F::new(0.0));
        let mut i = unit;
        while i < vectors {
            let value = input[i];
            squares += value * value;
            i += WIDTH;
        }
        partial[unit] = lane_sum::<F, N>(squares);
        sync_cube();
        // Halved at run time: a constant cannot be changed in place.
        let mut stride = CUBE_DIM_X as usize / 2;
        while stride > 0 {
            if unit < stride {
                partial[unit] = partial[unit] + partial[unit + stride];
            }
            sync_cube();
            stride /= 2;
        }
        inv_rms = (partial[0] / F::cast_from(cols as u32) + F::cast_from(eps)).inverse_sqrt();
        // Every thread has read the total before the rows' sums overwrite it.
        sync_cube();
    }

    let mut stage = Shared::<[Vector<F, N>]>::new_slice(comptime!(staged.max(1)));
    if comptime!(staged > 0) {
        let mut i = unit;
        while i < vectors {
            stage[i] = prologue_value::<F, N>(input, gamma, i, vectors, inv_rms, prologue);
            i += WIDTH;
        }
        sync_cube();
    }

    let lane = unit % ROW_THREADS;
    let mut first_row = CUBE_POS_X as usize * ROWS_PER_STEP;
    while first_row < rows {
        let row = first_row + unit / ROW_THREADS;
        let mut sum = Vector::<F, N>::new(F::new(0.0));
        if row < rows {
            let start = row * vectors;
            let mut i = lane;
            while i < vectors {
                let x = if comptime!(staged > 0) {
                    stage[i]
                } else {
                    prologue_value::<F, N>(input, gamma, i, vectors, inv_rms, prologue)
                };
                sum += weight[start + i] * x;
                i += ROW_THREADS;
            }
        }
        partial[unit] = lane_sum::<F, N>(sum);
        sync_cube();
        let mut stride = CUBE_DIM_X as usize / (2 * ROWS_PER_STEP);
        while stride > 0 {
            if lane < stride {
                partial[unit] = partial[unit] + partial[unit + stride];
            }
            sync_cube();
            stride /= 2;
        }
        if lane == 0 && row < rows {
            let mut result = partial[unit];
            if comptime!(add_residual) {
                result += residual[row];
            }
            output[row] = result;
        }
        // Every row's sum is written before the next rows' overwrite `partial`.
        sync_cube();
        first_row += CUBE_COUNT_X as usize * ROWS_PER_STEP;
    }
}

/// The projection's `i`th vector of input values after the prologue; `vectors` is the
/// input's length in vectors (SwiGLU's `up` starts there).
#[cube]
fn prologue_value<F: Float, N: Size>(
    input: &[Vector<F, N>],
    gamma: &[Vector<F, N>],
    i: usize,
    vectors: usize,
    inv_rms: F,
    #[comptime] prologue: Prologue,
) -> Vector<F, N> {
    let mut x = input[i];
    if comptime!(prologue == Prologue::RmsNorm) {
        x = x * Vector::<F, N>::new(inv_rms) * gamma[i];
    }
    if comptime!(prologue == Prologue::SwiGlu) {
        let one = Vector::<F, N>::new(F::new(1.0));
        x = x / (one + (Vector::<F, N>::new(F::new(0.0)) - x).exp()) * input[vectors + i];
    }
    x
}

/// The sum of a vector's values.
#[cube]
fn lane_sum<F: Float, N: Size>(vector: Vector<F, N>) -> F {
    let mut sum = F::new(0.0);
    #[unroll]
    for k in 0..N::value() {
        sum += vector.extract(k);
    }
    sum
}
