//! The GPU kernels as operations of Burn's CubeCL backend, through Burn's backend-extension
//! API: with fusion on, each is queued in the fusion stream like Burn's own operations and
//! launched when the stream runs, so no call here waits for the device.

use burn::backend::cubecl::dtype_to_storage_type;
use burn::backend::fusion::custom::TensorSpec;
use burn::backend::tensor::FloatTensor;
use burn::backend::{Backend, backend_extension};
use burn::tensor::Shape;
use burn_cubecl::CubeBackend;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_dtype;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use super::attention::{
    THREADS as ATTENTION_THREADS, combine_chunks_kernel, decode_attention_kernel,
};
use super::matvec::{MAX_STAGED, Prologue, ROWS_PER_STEP, WIDTH, matvec_kernel};
use super::top::{CHUNK, THREADS, top_kernel};

/// Workgroups per projection at most on a software renderer (lavapipe), where the CPU's cores
/// stand in for a GPU's: few, so that each one's prologue (the norm's sum of squares, the
/// staged input) serves several steps of rows. With one workgroup per step the LM head took
/// 40 ms there instead of 35. A GPU gets one workgroup per step (up to the 65535 one launch
/// axis allows), the parallelism its memory needs (on an H200, 10.6 µs a projection on average
/// for SmolLM2-135M, against about 50 µs of launch cost each).
const SOFTWARE_RENDERER_WORKGROUPS: usize = 64;
const MAX_WORKGROUPS: usize = 65_535;
/// Threads per attention workgroup on a software renderer (see `decode_attention`).
const SOFTWARE_RENDERER_ATTENTION_THREADS: usize = 64;

/// Whether `tensor`'s device is a software renderer (lavapipe), whose workgroups run on the
/// CPU's cores.
fn software_renderer(tensor: &CubeTensor) -> bool {
    tensor.client.properties().identity.physical.is_none()
}

#[backend_extension(Cube, Fusion)]
pub trait DecodeKernels: Backend {
    /// `[1, rows]` = `[residual +] weight · prologue(input)`; `gamma` and `residual` are read
    /// only when the prologue and `add_residual` say so (pass any tensor otherwise).
    #[fusion(dtype = input, shape = Shape::new([1, weight[0]]))]
    #[allow(clippy::too_many_arguments)]
    fn matvec(
        weight: FloatTensor<Self>,
        input: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        residual: FloatTensor<Self>,
        eps: f32,
        prologue: Prologue,
        add_residual: bool,
    ) -> FloatTensor<Self>;

    /// One token's attention output `[1, heads · head_dim]`, and the key and value caches
    /// with the token's key and value written at `position`.
    #[fusion(meta = attention_outputs)]
    #[allow(clippy::too_many_arguments)]
    fn decode_attention(
        qkv: FloatTensor<Self>,
        cos: FloatTensor<Self>,
        signed_sin: FloatTensor<Self>,
        keys: FloatTensor<Self>,
        values: FloatTensor<Self>,
        position: usize,
        heads: usize,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>);

    /// The `count` largest entries of an f32 row `[1, len]` and their ids (as f32), best first,
    /// as two `[count]` tensors; `count` is at most 256.
    #[fusion(meta = top_outputs)]
    fn top_entries(row: FloatTensor<Self>, count: usize) -> (FloatTensor<Self>, FloatTensor<Self>);
}

fn top_outputs(row: &TensorSpec, count: &usize) -> (TensorSpec, TensorSpec) {
    let spec = TensorSpec::new(Shape::new([*count]), row.dtype);
    (spec.clone(), spec)
}

fn attention_outputs(
    qkv: &TensorSpec,
    _cos: &TensorSpec,
    _signed_sin: &TensorSpec,
    keys: &TensorSpec,
    values: &TensorSpec,
    _position: &usize,
    heads: &usize,
) -> (TensorSpec, TensorSpec, TensorSpec) {
    let head_dim = keys.shape[2];
    (
        TensorSpec::new(Shape::new([1, heads * head_dim]), qkv.dtype),
        keys.clone(),
        values.clone(),
    )
}

impl DecodeKernels for CubeBackend {
    fn matvec(
        weight: CubeTensor,
        input: CubeTensor,
        gamma: CubeTensor,
        residual: CubeTensor,
        eps: f32,
        prologue: Prologue,
        add_residual: bool,
    ) -> CubeTensor {
        let (rows, cols) = (weight.meta.shape()[0], weight.meta.shape()[1]);
        let dtype = input.dtype;
        let output = empty_device_dtype(
            input.client.clone(),
            input.device.clone(),
            Shape::new([1, rows]),
            dtype,
        );
        // Four values per load where the rows allow it.
        let vector_size = if cols.is_multiple_of(4) { 4 } else { 1 };
        let budget = if software_renderer(&input) {
            SOFTWARE_RENDERER_WORKGROUPS
        } else {
            MAX_WORKGROUPS
        };
        let workgroups = rows.div_ceil(ROWS_PER_STEP).clamp(1, budget) as u32;
        // SAFETY: every index the kernel reads or writes is below the lengths checked by
        // `gpu::project` (`rows · cols` weights, `cols` or `2 · cols` inputs, `rows` outputs).
        unsafe {
            matvec_kernel::launch_unchecked(
                &output.client,
                CubeCount::Static(workgroups, 1, 1),
                CubeDim::new_1d(WIDTH as u32),
                vector_size,
                into_contiguous(weight).into_buffer_arg(),
                into_contiguous(input).into_buffer_arg(),
                into_contiguous(gamma).into_buffer_arg(),
                into_contiguous(residual).into_buffer_arg(),
                output.clone().into_buffer_arg(),
                rows,
                cols,
                eps,
                prologue,
                add_residual,
                if cols <= MAX_STAGED {
                    cols / vector_size
                } else {
                    0
                },
                dtype_to_storage_type(dtype),
            );
        }
        output
    }

    fn decode_attention(
        qkv: CubeTensor,
        cos: CubeTensor,
        signed_sin: CubeTensor,
        keys: CubeTensor,
        values: CubeTensor,
        position: usize,
        heads: usize,
    ) -> (CubeTensor, CubeTensor, CubeTensor) {
        let shape = keys.meta.shape();
        let (kv_heads, capacity, head_dim) = (shape[0], shape[1], shape[2]);
        let dtype = qkv.dtype;
        // A software renderer runs a workgroup's threads on one core, where more threads are
        // more barrier work and no more parallelism.
        let threads = if software_renderer(&qkv) {
            SOFTWARE_RENDERER_ATTENTION_THREADS
        } else {
            ATTENTION_THREADS
        };
        let lanes = (threads / head_dim).max(1);
        let chunk = lanes * head_dim;
        let halving = (chunk - 1).checked_ilog2().map_or(0, |bits| 1 << bits);
        let chunks = (position + 1).div_ceil(chunk);
        // The result, and after it what each chunk leaves for the combining launch: one
        // allocation.
        let context = heads * head_dim;
        let left_by_chunks = if chunks > 1 {
            heads * chunks * (head_dim + 2)
        } else {
            0
        };
        let buffer = empty_device_dtype(
            qkv.client.clone(),
            qkv.device.clone(),
            Shape::new([context + left_by_chunks]),
            dtype,
        );
        // Written in place when the cache holds the only reference to its buffers, as it
        // does between steps.
        let writable = |cache: CubeTensor| {
            let cache = into_contiguous(cache);
            if cache.can_mut() { cache } else { cache.copy() }
        };
        let (keys, values) = (writable(keys), writable(values));
        // SAFETY: `gpu::decode_attention` checked the shapes: `qkv` holds `heads + 2 ·
        // kv_heads` heads, the tables reach `position`, and the caches hold `capacity >
        // position` positions of `kv_heads` heads; `chunks` chunks of `chunk` positions
        // cover the `position + 1` positions, and `buffer` holds what they leave.
        unsafe {
            decode_attention_kernel::launch_unchecked(
                &buffer.client,
                CubeCount::Static(heads as u32, chunks as u32, 1),
                CubeDim::new_1d(chunk as u32),
                into_contiguous(qkv).into_buffer_arg(),
                into_contiguous(cos).into_buffer_arg(),
                into_contiguous(signed_sin).into_buffer_arg(),
                keys.clone().into_buffer_arg(),
                values.clone().into_buffer_arg(),
                buffer.clone().into_buffer_arg(),
                position,
                capacity,
                1.0 / (head_dim as f32).sqrt(),
                heads,
                kv_heads,
                head_dim,
                lanes,
                halving,
                dtype_to_storage_type(dtype),
            );
            if chunks > 1 {
                combine_chunks_kernel::launch_unchecked(
                    &buffer.client,
                    CubeCount::Static(heads as u32, 1, 1),
                    CubeDim::new_1d(head_dim as u32),
                    buffer.clone().into_buffer_arg(),
                    chunks,
                    heads,
                    head_dim,
                    dtype_to_storage_type(dtype),
                );
            }
        }
        let output = CubeTensor::new_contiguous(
            buffer.client,
            buffer.device,
            Shape::new([1, context]),
            buffer.handle,
            dtype,
        );
        (output, keys, values)
    }

    fn top_entries(row: CubeTensor, count: usize) -> (CubeTensor, CubeTensor) {
        let len = row.meta.shape().num_elements();
        let row = into_contiguous(row);
        let span = CHUNK - count;
        let groups = len.div_ceil(span);
        let empty = |len: usize| {
            empty_device_dtype(
                row.client.clone(),
                row.device.clone(),
                Shape::new([len]),
                row.dtype,
            )
        };
        let launch = |values: &CubeTensor, ids: &CubeTensor, len, span, groups, indexed| {
            let (out_values, out_ids) = (empty(groups * count), empty(groups * count));
            // SAFETY: `gpu::top_entries` checked that the row is f32 and `count` within
            // 1..=THREADS; workgroup `g` reads `values` and `ids` below `len` and writes
            // `count` entries at `g · count` of outputs that hold `groups · count`.
            unsafe {
                top_kernel::launch_unchecked(
                    &row.client,
                    CubeCount::Static(groups as u32, 1, 1),
                    CubeDim::new_1d(THREADS as u32),
                    values.clone().into_buffer_arg(),
                    ids.clone().into_buffer_arg(),
                    out_values.clone().into_buffer_arg(),
                    out_ids.clone().into_buffer_arg(),
                    len,
                    span,
                    indexed,
                    count,
                );
            }
            (out_values, out_ids)
        };
        // Each span's best, then (when there are several spans) the best of those.
        let (values, ids) = launch(&row, &row, len, span, groups, true);
        if groups == 1 {
            return (values, ids);
        }
        let candidates = groups * count;
        launch(&values, &ids, candidates, candidates, 1, false)
    }
}
