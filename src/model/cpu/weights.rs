//! A projection weight `[rows, cols]` as the CPU kernels read it, whatever its storage.

use std::sync::Arc;

use burn::backend::flex::FlexQTensor;
use burn::backend::{BackendTensor, DispatchTensorKind, TensorMetadata};
use burn::tensor::quantization::{QuantMode, QuantScheme, QuantStore, QuantValue};
use burn::tensor::{DType, Device, Tensor, TensorData};
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
    /// A GGUF file's integer weights, kept as stored (see [`IntegerWeights`]).
    Integers(Arc<IntegerWeights>),
}

/// Weights stored as small integers with a scale, and in some types an offset, per block of
/// a row: `W[r, c] = scales[b] · values[r · cols + c] + offsets[b]` for `b = (r · cols + c) /
/// block`. Every GGUF integer type (Q4_0 … Q8_0, Q4_K … Q6_K) is exactly this, its values
/// unpacked to one byte each, so the 8-bit kernels multiply them without rounding anything.
#[derive(Debug)]
pub struct IntegerWeights {
    pub dims: [usize; 2],
    pub block: usize,
    pub values: Vec<i8>,
    pub scales: Vec<f32>,
    /// `None` where every offset is zero (the types without a minimum).
    pub offsets: Option<Vec<f32>>,
}

/// The elements of a weight, borrowed where they lie.
#[derive(Clone, Copy)]
pub enum WeightRows<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
    Bf16(&'a [bf16]),
    /// 8-bit integers with one f32 scale, and maybe an offset, per `block` consecutive
    /// weights of a row: `W[r, c] = scales[b] · values[r · cols + c] (+ offsets[b])` for
    /// `b = (r · cols + c) / block`.
    Q8 {
        values: &'a [i8],
        scales: &'a [f32],
        offsets: Option<&'a [f32]>,
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
            Self::Integers(weight) => weight.dims,
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
                    offsets: None,
                    block,
                })
            }
            Self::Integers(weight) => Some(weight.rows()),
        }
    }

    /// The weight as a plain f32 tensor on `device`, for Burn's matmul where the kernels
    /// decline.
    pub fn dense(&self, device: &Device) -> Option<Tensor<2>> {
        let rows = self.rows()?;
        let mut values = vec![0.0; rows.len()];
        rows.widen(0, &mut values);
        Some(Tensor::from_data(
            TensorData::new(values, self.dims()),
            device,
        ))
    }
}

impl IntegerWeights {
    pub fn rows(&self) -> WeightRows<'_> {
        WeightRows::Q8 {
            values: &self.values,
            scales: &self.scales,
            offsets: self.offsets.as_deref(),
            block: self.block,
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
                offsets,
                block,
            } => {
                // Rows hold whole blocks, so `start` is where a block begins.
                let first = start / block;
                let blocks = out
                    .chunks_exact_mut(*block)
                    .zip(values[range].chunks_exact(*block))
                    .enumerate();
                for (b, (out, values)) in blocks {
                    let scale = scales[first + b];
                    let offset = offsets.map_or(0.0, |offsets| offsets[first + b]);
                    for (out, &value) in out.iter_mut().zip(values) {
                        *out = scale * f32::from(value) + offset;
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
