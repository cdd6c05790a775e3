//! A projection weight `[rows, cols]` as the CPU kernels read it, whatever its storage.

use std::ops::Range;
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
/// block`. Every GGUF integer type (Q4_0 … Q8_0, Q4_K … Q6_K) is exactly this, so the integer
/// kernels multiply them without rounding anything.
#[derive(Debug)]
pub struct IntegerWeights {
    pub dims: [usize; 2],
    pub block: usize,
    pub values: IntegerValues,
    pub scales: BlockFactors,
    /// `None` where every offset is zero (the types without a minimum).
    pub offsets: Option<BlockFactors>,
}

/// The scales or offsets of [`IntegerWeights`], one per block: in f16 where every one is an
/// f16 exactly, as a GGUF file's own are for Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 (half the bytes:
/// 8 MiB of a SmolLM2-135M file's 4-bit weights), in f32 otherwise (the K types' products of
/// two scales).
#[derive(Debug)]
pub enum BlockFactors {
    F16(Vec<f16>),
    F32(Vec<f32>),
}

impl BlockFactors {
    /// The same factors in f16 when that holds them exactly.
    pub fn compacted(self) -> Self {
        match self {
            Self::F32(values) if values.iter().all(|&v| f16::from_f32(v).to_f32() == v) => {
                Self::F16(values.iter().map(|&v| f16::from_f32(v)).collect())
            }
            factors => factors,
        }
    }

    pub fn borrowed(&self) -> Factors<'_> {
        match self {
            Self::F16(values) => Factors::F16(values),
            Self::F32(values) => Factors::F32(values),
        }
    }
}

/// [`BlockFactors`], borrowed.
#[derive(Clone, Copy, Debug)]
pub enum Factors<'a> {
    F16(&'a [f16]),
    F32(&'a [f32]),
}

impl<'a> Factors<'a> {
    pub fn len(self) -> usize {
        match self {
            Self::F16(values) => values.len(),
            Self::F32(values) => values.len(),
        }
    }

    pub fn get(self, index: usize) -> f32 {
        match self {
            Self::F16(values) => values[index].to_f32(),
            Self::F32(values) => values[index],
        }
    }

    pub fn range(self, range: Range<usize>) -> Self {
        match self {
            Self::F16(values) => Self::F16(&values[range]),
            Self::F32(values) => Self::F32(&values[range]),
        }
    }

    /// The factors `range` as f32: where they lie when stored so, else converted into
    /// `buffer`, which only grows. The kernels take them so, a row or a tile of rows at a time.
    pub fn f32s<'b>(self, range: Range<usize>, buffer: &'b mut Vec<f32>) -> &'b [f32]
    where
        'a: 'b,
    {
        match self {
            Self::F32(values) => &values[range],
            Self::F16(values) => {
                if buffer.len() < range.len() {
                    buffer.resize(range.len(), 0.0);
                }
                let out = &mut buffer[..range.len()];
                values[range].convert_to_f32_slice(out);
                out
            }
        }
    }
}

/// How [`IntegerWeights`] hold their values.
#[derive(Debug)]
pub enum IntegerValues {
    Bytes(Vec<i8>),
    /// 4-bit values in blocks of 32, as ggml's Q4 types lay them out: byte `j` of a block
    /// holds element `j` in its low half and `j + 16` in its high, each the value plus
    /// `zero` (8 for Q4_0's -8 to 7, 0 for the types with offsets). Half the bytes of
    /// [`IntegerValues::Bytes`] for the 4-bit types, which decode streams.
    Nibbles {
        values: Vec<u8>,
        zero: u8,
    },
}

/// The block of packed 4-bit values.
pub const NIBBLE_BLOCK: usize = 32;

/// The values of integer weights, borrowed.
#[derive(Clone, Copy)]
pub enum Ints<'a> {
    Bytes(&'a [i8]),
    /// See [`IntegerValues::Nibbles`].
    Nibbles {
        values: &'a [u8],
        zero: u8,
    },
}

/// The elements of a weight, borrowed where they lie.
#[derive(Clone, Copy)]
pub enum WeightRows<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
    Bf16(&'a [bf16]),
    /// Integers with one scale, and maybe an offset, per `block` consecutive weights of a
    /// row: `W[r, c] = scales[b] · values[r · cols + c] (+ offsets[b])` for
    /// `b = (r · cols + c) / block`.
    Integers {
        values: Ints<'a>,
        scales: Factors<'a>,
        offsets: Option<Factors<'a>>,
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
                (scales.len() * block == values.len()).then_some(WeightRows::Integers {
                    values: Ints::Bytes(values),
                    scales: Factors::F32(scales),
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
    /// The same weights with their scales and offsets in f16 where that holds them exactly
    /// (see `BlockFactors`).
    pub fn compacted(self) -> Self {
        Self {
            scales: self.scales.compacted(),
            offsets: self.offsets.map(BlockFactors::compacted),
            ..self
        }
    }

    pub fn rows(&self) -> WeightRows<'_> {
        WeightRows::Integers {
            values: match &self.values {
                IntegerValues::Bytes(values) => Ints::Bytes(values),
                &IntegerValues::Nibbles { ref values, zero } => Ints::Nibbles { values, zero },
            },
            scales: self.scales.borrowed(),
            offsets: self.offsets.as_ref().map(BlockFactors::borrowed),
            block: self.block,
        }
    }

    /// The same weights with two values per byte, where every block's values fit in 4 bits
    /// (the Q4 types): values from -8 to 7 are shifted up by 8, which the kernels take off
    /// again (Q4_0). Where only some blocks need the shift (a stack of Q4_0 and Q4_1 parts)
    /// their offsets take `8 · scale` off instead, exactly (a power-of-two multiple of the
    /// scale).
    pub fn packed(self) -> Self {
        let IntegerValues::Bytes(values) = &self.values else {
            return self;
        };
        if self.block != NIBBLE_BLOCK {
            return self;
        }
        let shifts: Option<Vec<u8>> = values
            .chunks_exact(NIBBLE_BLOCK)
            .map(|block| {
                let (low, high) = block
                    .iter()
                    .fold((i8::MAX, i8::MIN), |(l, h), &q| (l.min(q), h.max(q)));
                match (low, high) {
                    (0.., ..=15) => Some(0),
                    (-8.., ..=7) => Some(8),
                    _ => None,
                }
            })
            .collect();
        let Some(shifts) = shifts else {
            return self;
        };
        // Allocated whole: collected from the iterator, which cannot tell its length, the
        // vector grew by doubling and kept up to twice the bytes.
        let mut nibbles = Vec::with_capacity(values.len() / 2);
        nibbles.extend(values.chunks_exact(NIBBLE_BLOCK).zip(&shifts).flat_map(
            |(block, &shift)| {
                let nibble = move |q: i8| (q as u8).wrapping_add(shift);
                (0..NIBBLE_BLOCK / 2).map(move |j| nibble(block[j]) | nibble(block[j + 16]) << 4)
            },
        ));
        if shifts.iter().all(|&shift| shift == 8) {
            return Self {
                values: IntegerValues::Nibbles {
                    values: nibbles,
                    zero: 8,
                },
                ..self
            };
        }
        let offsets = match shifts.iter().any(|&shift| shift != 0) {
            true => {
                let (scales, offsets) = (
                    self.scales.borrowed(),
                    self.offsets.as_ref().map(BlockFactors::borrowed),
                );
                Some(BlockFactors::F32(
                    shifts
                        .iter()
                        .enumerate()
                        .map(|(b, &shift)| {
                            let offset = offsets.map_or(0.0, |offsets| offsets.get(b));
                            offset - f32::from(shift) * scales.get(b)
                        })
                        .collect(),
                ))
            }
            false => self.offsets,
        };
        Self {
            values: IntegerValues::Nibbles {
                values: nibbles,
                zero: 0,
            },
            offsets,
            ..self
        }
    }
}

impl Ints<'_> {
    pub fn len(&self) -> usize {
        match self {
            Self::Bytes(values) => values.len(),
            Self::Nibbles { values, .. } => values.len() * 2,
        }
    }

    /// The values of the `block`-long block `b`, as bytes; `unpacked` holds nibbles' values.
    pub fn block<'a>(
        &'a self,
        b: usize,
        block: usize,
        unpacked: &'a mut [i8; NIBBLE_BLOCK],
    ) -> &'a [i8] {
        match self {
            Self::Bytes(values) => &values[b * block..(b + 1) * block],
            &Self::Nibbles { values, zero } => {
                let bytes = &values[b * NIBBLE_BLOCK / 2..(b + 1) * NIBBLE_BLOCK / 2];
                nibbles_as_bytes(bytes, zero, unpacked);
                unpacked
            }
        }
    }
}

/// Whole blocks of nibbles (see [`IntegerValues::Nibbles`]) as one byte per value, `zero`
/// taken off, written so that the compiler vectorizes it.
pub fn nibbles_as_bytes(nibbles: &[u8], zero: u8, bytes: &mut [i8]) {
    let zero = zero as i8;
    let blocks = nibbles
        .chunks_exact(NIBBLE_BLOCK / 2)
        .zip(bytes.chunks_exact_mut(NIBBLE_BLOCK));
    for (packed, block) in blocks {
        let (low, high) = block.split_at_mut(NIBBLE_BLOCK / 2);
        for ((&byte, low), high) in packed.iter().zip(low).zip(high) {
            *low = (byte & 0x0F) as i8 - zero;
            *high = (byte >> 4) as i8 - zero;
        }
    }
}

impl WeightRows<'_> {
    pub fn len(&self) -> usize {
        match self {
            Self::F32(values) => values.len(),
            Self::F16(values) => values.len(),
            Self::Bf16(values) => values.len(),
            Self::Integers { values, .. } => values.len(),
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
            Self::Integers {
                values,
                scales,
                offsets,
                block,
            } => {
                // Rows hold whole blocks, so `start` is where a block begins.
                let first = start / block;
                let mut unpacked = [0; NIBBLE_BLOCK];
                for (b, out) in out.chunks_exact_mut(*block).enumerate() {
                    let b = first + b;
                    let (scale, offset) =
                        (scales.get(b), offsets.map_or(0.0, |offsets| offsets.get(b)));
                    for (out, &value) in out.iter_mut().zip(values.block(b, *block, &mut unpacked))
                    {
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

#[cfg(test)]
mod tests {
    use super::{BlockFactors, IntegerValues, IntegerWeights};

    fn widened(weights: &IntegerWeights) -> Vec<f32> {
        let mut out = vec![f32::NAN; weights.dims[0] * weights.dims[1]];
        weights.rows().widen(0, &mut out);
        out
    }

    fn weights(values: Vec<i8>, offsets: Option<Vec<f32>>) -> IntegerWeights {
        let blocks = values.len() / 32;
        IntegerWeights {
            dims: [2, values.len() / 2],
            block: 32,
            scales: BlockFactors::F32((0..blocks).map(|b| 0.5 + b as f32 * 0.25).collect()),
            offsets: offsets.map(BlockFactors::F32),
            values: IntegerValues::Bytes(values),
        }
    }

    /// Q4_0's values (-8 to 7, no offsets) and Q4_1's (0 to 15, offsets) pack into nibbles
    /// that widen to the very same weights; 5-bit values stay bytes.
    #[test]
    fn four_bit_blocks_pack_exactly_and_wider_ones_stay_bytes() {
        let signed: Vec<i8> = (0..128).map(|i| (i * 5 % 16) as i8 - 8).collect();
        let unsigned: Vec<i8> = (0..128).map(|i| (i * 7 % 16) as i8).collect();
        let mixed: Vec<i8> = signed[..64]
            .iter()
            .chain(&unsigned[64..])
            .copied()
            .collect();
        let quarter = Some(vec![-1.5, 0.25, 3.0, -0.125]);
        // The zero each packing takes, and whether it has offsets.
        let cases = [
            (signed, None, 8, false),
            (unsigned.clone(), quarter, 0, true),
            (mixed, None, 0, true),
        ];
        for (values, offsets, zero, with_offsets) in cases {
            let bytes = weights(values.clone(), offsets.clone());
            let packed = weights(values, offsets).packed();
            assert!(matches!(
                packed.values,
                IntegerValues::Nibbles { ref values, zero: z } if values.len() == 64 && z == zero
            ));
            assert_eq!(packed.offsets.is_some(), with_offsets);
            assert_eq!(widened(&packed), widened(&bytes));
        }
        let five_bit: Vec<i8> = (0..128).map(|i| (i % 32) as i8 - 16).collect();
        let packed = weights(five_bit, None).packed();
        assert!(matches!(packed.values, IntegerValues::Bytes(_)));
    }
}
