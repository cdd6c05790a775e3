//! A projection weight `[rows, cols]` as the CPU kernels read it, whatever its storage.

use burn::backend::flex::FlexQTensor;
use burn::backend::{BackendTensor, DispatchTensorKind, TensorMetadata};
use burn::tensor::quantization::{QuantMode, QuantScheme, QuantStore, QuantValue};
use burn::tensor::{DType, Tensor};
use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

use super::host::HostTensor;

/// The backend's own weight tensor, held so that [`Weight::rows`] can borrow from it.
///
/// A projection extracts it once, when the weight is made: Burn hands out a backend's
/// tensor only by value, and cloning burn-flex's 8-bit tensor to get one copies its scales
/// (13 MB per token in all, 4% of a q8 decode step, on the calling thread alone).
#[derive(Clone, Debug)]
pub enum Weight {
    Float(HostTensor),
    /// burn-flex's 8-bit weights (`--precision q8`).
    Quantized(FlexQTensor),
}

/// The elements of a weight, borrowed where they lie.
#[derive(Clone, Copy)]
pub enum WeightRows<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
    Bf16(&'a [bf16]),
    /// Symmetric 8-bit integers with one f32 scale per `block` consecutive weights of a row:
    /// `W[r, c] = scales[(r · cols + c) / block] · values[r · cols + c]`.
    Q8 {
        values: &'a [i8],
        scales: &'a [f32],
        block: usize,
    },
}

impl Weight {
    /// The weight behind `tensor`, or `None` off the CPU backends and for quantization
    /// schemes the kernels do not read.
    pub fn of(tensor: &Tensor<2>) -> Option<Self> {
        if let DispatchTensorKind::Flex(BackendTensor::Quantized(weight)) =
            tensor.clone().into_dispatch().kind
        {
            return Some(Self::Quantized(weight));
        }
        HostTensor::of(tensor).map(Self::Float)
    }

    /// `[rows, cols]`
    pub fn dims(&self) -> [usize; 2] {
        match self {
            Self::Float(tensor) => tensor.shape().dims(),
            Self::Quantized(weight) => weight.shape().dims(),
        }
    }

    pub fn rows(&self) -> Option<WeightRows<'_>> {
        match self {
            Self::Float(tensor) => match tensor.dtype() {
                DType::F32 => tensor.slice().map(WeightRows::F32),
                DType::F16 => tensor.slice().map(WeightRows::F16),
                DType::BF16 => tensor.slice().map(WeightRows::Bf16),
                _ => None,
            },
            Self::Quantized(weight) => {
                let DType::QFloat(scheme) = weight.dtype() else {
                    return None;
                };
                let block = row_block(&scheme, weight.shape()[1])?;
                let values = weight.tensor().as_slice::<i8>()?;
                let scales = weight.scales();
                (scales.len() * block == values.len()).then_some(WeightRows::Q8 {
                    values,
                    scales,
                    block,
                })
            }
        }
    }
}

impl WeightRows<'_> {
    pub fn len(&self) -> usize {
        match self {
            Self::F32(values) => values.len(),
            Self::F16(values) => values.len(),
            Self::Bf16(values) => values.len(),
            Self::Q8 { values, .. } => values.len(),
        }
    }

    /// The f32 elements from `start`, when they are stored as f32 and need no copy.
    pub fn as_f32(&self, start: usize, len: usize) -> Option<&[f32]> {
        match self {
            Self::F32(values) => values.get(start..start + len),
            _ => None,
        }
    }

    /// Writes the elements `start..start + out.len()` (row-major) into `out` as f32; both
    /// bounds fall on row boundaries.
    pub fn widen(&self, start: usize, out: &mut [f32]) {
        let range = start..start + out.len();
        match self {
            Self::F32(values) => out.copy_from_slice(&values[range]),
            Self::F16(values) => values[range].convert_to_f32_slice(out),
            Self::Bf16(values) => values[range].convert_to_f32_slice(out),
            Self::Q8 {
                values,
                scales,
                block,
            } => {
                // Rows hold whole blocks, so `start` is where a block begins.
                let blocks = out
                    .chunks_exact_mut(*block)
                    .zip(values[range].chunks_exact(*block));
                for ((out, values), scale) in blocks.zip(&scales[start / block..]) {
                    for (out, &value) in out.iter_mut().zip(values) {
                        *out = scale * f32::from(value);
                    }
                }
            }
        }
    }
}

/// The block length when `scheme` is symmetric 8-bit with blocks along rows only and no
/// second, per-tensor scale: the scheme `--precision q8` uses on the CPU.
pub fn row_block(scheme: &QuantScheme, cols: usize) -> Option<usize> {
    let eight_bit = matches!(scheme.value, QuantValue::Q8S | QuantValue::Q8F);
    let plain = scheme.mode == QuantMode::Symmetric
        && scheme.store == QuantStore::Native
        && scheme.tensor_scale().is_none();
    let block = scheme.block_size()?.to_dim_vec(2);
    let block = match block.as_slice() {
        [1, block] if *block > 0 => usize::from(*block),
        _ => return None,
    };
    (eight_bit && plain && cols.is_multiple_of(block)).then_some(block)
}
