//! A GGUF file's weights behind [`Checkpoint`]: llama.cpp's single-file format, read from its
//! memory map by the names of the layout table's GGUF column.
//!
//! llama.cpp's converter reorders the rows of the query and key projections within each head
//! for its RoPE layout (see [`crate::gguf::layout`]); this reader hands them back in Hugging
//! Face's order, so the model code is the same for both formats.

use burn::tensor::{Bytes, DType, TensorData};
use half::{bf16, f16};
use rayon::prelude::*;

use super::{Checkpoint, LayerRole, TensorRole};
use crate::gguf::{
    GgmlType, GgufFile, IntegerParts, KFactors, TensorInfo, five_bits_row, half_factors, k_factors,
    nibbles_row, qk_gguf_row, split_row,
};
use crate::model::cpu::{
    BlockFactors, HostFloat, IntegerValues, IntegerWeights, RowOrder, SIX_BIT_ZERO,
    fifth_bits_in_order, pack_six_bits,
};
use crate::model::error::{ModelError, Result};
use crate::model::weight_arena::WeightArena;

pub struct GgufCheckpoint {
    file: GgufFile,
    /// The head width within which the converter reordered query and key rows, if it did.
    reordered_heads: Option<usize>,
}

impl GgufCheckpoint {
    /// `reordered_heads`: the config's head dimension for families whose query and key rows
    /// llama.cpp's converter reorders ([`Architecture::gguf_reorders_qk`]), else `None`.
    /// The file's metadata is dropped (see [`GgufFile::without_metadata`]).
    ///
    /// [`Architecture::gguf_reorders_qk`]: crate::model::Architecture::gguf_reorders_qk
    pub fn new(file: GgufFile, reordered_heads: Option<usize>) -> Self {
        Self {
            file: file.without_metadata(),
            reordered_heads,
        }
    }

    fn info(&self, role: TensorRole, shape: &[usize]) -> Result<&TensorInfo> {
        let name = role.gguf_name();
        let info = self
            .file
            .tensor_info(&name)
            .ok_or_else(|| ModelError::MissingTensor {
                name: name.clone(),
                location: self.file.path().to_path_buf(),
            })?;
        let found: Vec<usize> = info.shape().iter().map(|&d| d as usize).collect();
        if found != shape {
            return Err(ModelError::WrongShape {
                name,
                expected: shape.to_vec(),
                found,
            });
        }
        if !info.ggml_type.can_dequantize() {
            return Err(ModelError::UnsupportedDtype {
                name,
                dtype: info.ggml_type.name().to_string(),
            });
        }
        Ok(info)
    }

    /// The parts' tensors, each checked against its shape, and the rows and columns of
    /// their stack.
    fn stack(&self, parts: &[(TensorRole, Vec<usize>)]) -> Result<Stack<'_>> {
        let parts = parts
            .iter()
            .map(|(role, shape)| Ok((*role, self.info(*role, shape)?)))
            .collect::<Result<Vec<_>>>()?;
        let cols = parts.first().map_or(1, |(_, info)| info.row_len() as usize);
        let rows = parts.iter().map(|(_, info)| info.n_rows() as usize).sum();
        Ok(Stack { parts, rows, cols })
    }

    /// The GGUF row that holds Hugging Face row `row` of `role`.
    fn stored_row(&self, role: TensorRole, row: usize) -> usize {
        match (role, self.reordered_heads) {
            (TensorRole::Layer(_, LayerRole::Query | LayerRole::Key), Some(head_dim)) => {
                qk_gguf_row(row, head_dim)
            }
            _ => row,
        }
    }

    /// Decodes the parts, row after row in Hugging Face order, into `out` as `T`, each
    /// part's rows on every core: on one, a 1.7B BF16 file's 3.4 GB took 6–15 s to load. A
    /// part stored as `T` already (`held`) is copied as it is, not widened and rounded back.
    fn decode_into<T: bytemuck::Pod + Send>(
        &self,
        parts: &[(TensorRole, &TensorInfo)],
        out: &mut [T],
        held: GgmlType,
        from_f32: impl Fn(f32) -> T + Sync,
    ) -> Result<()> {
        let row_len = parts
            .first()
            .map_or(1, |(_, info)| info.row_len() as usize)
            .max(1);
        let mut rest = out;
        for &(role, info) in parts {
            let view = self
                .file
                .tensor(&info.name)
                .map_err(|err| corrupt(&self.file, err))?;
            let len = info.n_rows() as usize * row_len;
            if rest.len() < len {
                return Err(ModelError::Backend(
                    "GGUF tensor parts outgrew their stacked shape".into(),
                ));
            }
            let (part, after) = std::mem::take(&mut rest).split_at_mut(len);
            part.par_chunks_exact_mut(row_len)
                .enumerate()
                .try_for_each_init(
                    || vec![0.0; info.row_len() as usize],
                    |row_values, (row, out)| {
                        let row = self.stored_row(role, row) as u64;
                        if info.ggml_type == held && cfg!(target_endian = "little") {
                            let bytes = view
                                .row_bytes(row)
                                .map_err(|err| corrupt(&self.file, err))?;
                            let out: &mut [u8] = bytemuck::cast_slice_mut(out);
                            if out.len() != bytes.len() {
                                return Err(corrupt(
                                    &self.file,
                                    format!(
                                        "tensor {} has rows of {} bytes where the stack holds {}",
                                        info.name,
                                        bytes.len(),
                                        out.len()
                                    ),
                                ));
                            }
                            out.copy_from_slice(bytes);
                            return Ok(());
                        }
                        view.dequantize_row(row, row_values)
                            .map_err(|err| corrupt(&self.file, err))?;
                        for (slot, &value) in out.iter_mut().zip(row_values.iter()) {
                            *slot = from_f32(value);
                        }
                        Ok(())
                    },
                )?;
            self.file.release(info);
            rest = after;
        }
        Ok(())
    }

    fn decoded<T: HostFloat>(
        &self,
        parts: &[(TensorRole, &TensorInfo)],
        (len, cols, order): (usize, usize, RowOrder),
        arena: Option<&mut WeightArena>,
        held: GgmlType,
        from_f32: impl Fn(f32) -> T + Copy + Sync,
    ) -> Result<Bytes> {
        let fill = |out: &mut [T]| {
            self.decode_into(parts, out, held, from_f32)
                .map(|()| order.arrange(out, cols))
        };
        let mut result = Ok(());
        if let Some(bytes) = arena.and_then(|arena| arena.push(len, |out| result = fill(out))) {
            return result.map(|()| bytes);
        }
        let mut out = bytemuck::zeroed_vec(len);
        fill(&mut out)?;
        Ok(Bytes::from_elems(out))
    }
}

fn corrupt(file: &GgufFile, err: impl std::fmt::Display) -> ModelError {
    ModelError::CorruptWeights {
        path: file.path().to_path_buf(),
        reason: err.to_string(),
    }
}

/// Matrices stacked row-wise: the parts in order, with their rows in all.
struct Stack<'a> {
    parts: Vec<(TensorRole, &'a TensorInfo)>,
    rows: usize,
    cols: usize,
}

/// A thread's buffers for splitting rows: a row's own scales and offsets (per block of its
/// type), and its values where they are packed after splitting.
struct RowScratch {
    scales: Vec<f32>,
    offsets: Vec<f32>,
    values: Vec<i8>,
}

/// How a stack's values are held (see `IntegerValues`). Rows of one type whose values fit go
/// straight into their bits: split to bytes and packed after, a 1.7B Q6_K file took 1.5 s
/// more to load, and a Q4_K_M file wrote and packed twice its 4-bit values.
#[derive(Clone, Copy)]
enum ValueForm {
    Bytes,
    /// Q4_0, Q4_1 and Q4_K, as stored (see `nibbles_row`): Q4_0's signed values shifted by 8,
    /// as `IntegerWeights::packed` shifts them.
    Nibbles {
        shift: u8,
    },
    /// Q5_0, Q5_1 and Q5_K, as stored (see `five_bits_row`): Q5_0's signed values shifted by
    /// 16, as `IntegerWeights::packed` shifts them.
    FiveBits {
        shift: u8,
    },
    /// Q6_K.
    SixBits,
}

/// How a stack's scales and offsets are held (see `BlockFactors`): for a stack of one type,
/// as its file holds them, f16 per block or a K type's base per `per` blocks and integer per
/// block (see `KFactors`); f32 per block where parts of different types share a block.
/// Written in f32 and compacted after, a 1.7B file's factors took a second pass each.
#[derive(Clone, Copy)]
enum FactorForm {
    Floats,
    Halves,
    Scaled { per: usize },
}

/// A stack's scales and offsets as they are written, in their [`FactorForm`].
enum FactorsOut {
    Floats {
        scales: Vec<f32>,
        offsets: Option<Vec<f32>>,
    },
    Halves {
        scales: Vec<f16>,
        offsets: Option<Vec<f16>>,
    },
    Scaled {
        per: usize,
        scales: (Vec<f16>, Vec<i8>),
        offsets: Option<(Vec<f16>, Vec<i8>)>,
    },
}

impl FactorsOut {
    fn new(form: FactorForm, blocks: usize, has_offsets: bool) -> Self {
        match form {
            FactorForm::Floats => Self::Floats {
                scales: vec![0.0; blocks],
                offsets: has_offsets.then(|| vec![0.0; blocks]),
            },
            FactorForm::Halves => Self::Halves {
                scales: vec![f16::ZERO; blocks],
                offsets: has_offsets.then(|| vec![f16::ZERO; blocks]),
            },
            FactorForm::Scaled { per } => {
                let scaled = || (vec![f16::ZERO; blocks / per], vec![0; blocks]);
                Self::Scaled {
                    per,
                    scales: scaled(),
                    offsets: has_offsets.then(scaled),
                }
            }
        }
    }

    /// Each row's, rows of `per_row` blocks.
    fn rows(&mut self, per_row: usize) -> Vec<RowFactors<'_>> {
        let per_row = per_row.max(1);
        match self {
            Self::Floats { scales, offsets } => scales
                .chunks_exact_mut(per_row)
                .zip(each_row(offsets.as_deref_mut(), per_row))
                .map(|(scales, offsets)| RowFactors::Floats { scales, offsets })
                .collect(),
            Self::Halves { scales, offsets } => scales
                .chunks_exact_mut(per_row)
                .zip(each_row(offsets.as_deref_mut(), per_row))
                .map(|(scales, offsets)| RowFactors::Halves { scales, offsets })
                .collect(),
            Self::Scaled {
                per,
                scales,
                offsets,
            } => {
                let bases_per_row = (per_row / *per).max(1);
                let (offset_bases, offset_steps) = match offsets {
                    Some((bases, steps)) => (Some(&mut bases[..]), Some(&mut steps[..])),
                    None => (None, None),
                };
                scales
                    .0
                    .chunks_exact_mut(bases_per_row)
                    .zip(scales.1.chunks_exact_mut(per_row))
                    .zip(each_row(offset_bases, bases_per_row))
                    .zip(each_row(offset_steps, per_row))
                    .map(|(((bases, steps), offset_bases), offset_steps)| {
                        RowFactors::Scaled(KFactors {
                            scales: (bases, steps),
                            offsets: offset_bases.zip(offset_steps),
                        })
                    })
                    .collect()
            }
        }
    }

    fn into_factors(self) -> (BlockFactors, Option<BlockFactors>) {
        match self {
            Self::Floats { scales, offsets } => {
                (BlockFactors::F32(scales), offsets.map(BlockFactors::F32))
            }
            Self::Halves { scales, offsets } => {
                (BlockFactors::F16(scales), offsets.map(BlockFactors::F16))
            }
            Self::Scaled {
                per,
                scales,
                offsets,
            } => {
                let scaled = |(bases, steps)| BlockFactors::Scaled { bases, steps, per };
                (scaled(scales), offsets.map(scaled))
            }
        }
    }
}

/// `values` in rows of `width`, or `None` for every row where there are none.
fn each_row<T>(values: Option<&mut [T]>, width: usize) -> impl Iterator<Item = Option<&mut [T]>> {
    let mut rows = values.map(|values| values.chunks_exact_mut(width));
    std::iter::from_fn(move || match &mut rows {
        Some(rows) => rows.next().map(Some),
        None => Some(None),
    })
}

/// Where one row of an integer stack goes.
struct RowOut<'a> {
    values: RowValues<'a>,
    factors: RowFactors<'a>,
}

enum RowValues<'a> {
    Bytes(&'a mut [i8]),
    Nibbles(&'a mut [u8]),
    FiveBits {
        nibbles: &'a mut [u8],
        high: &'a mut [u32],
    },
    SixBits {
        nibbles: &'a mut [u8],
        crumbs: &'a mut [u8],
    },
}

enum RowFactors<'a> {
    Floats {
        scales: &'a mut [f32],
        offsets: Option<&'a mut [f32]>,
    },
    /// The f16 scales (and minimums) of Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 (see `half_factors`).
    Halves {
        scales: &'a mut [f16],
        offsets: Option<&'a mut [f16]>,
    },
    Scaled(KFactors<'a>),
}

/// The first `len` of `left`, which keeps the rest; `None` when it holds fewer.
fn take_front<'a, T>(left: &mut &'a mut [T], len: usize) -> Option<&'a mut [T]> {
    let (front, rest) = std::mem::take(left).split_at_mut_checked(len)?;
    *left = rest;
    Some(front)
}

/// Repeats each of `values` `times` times: a part's scales at a finer block.
fn repeated(values: &[f32], times: usize) -> impl Iterator<Item = f32> + '_ {
    values
        .iter()
        .flat_map(move |&value| std::iter::repeat_n(value, times))
}

impl Checkpoint for GgufCheckpoint {
    fn norm_weights_as_defined(&self) -> bool {
        false
    }

    fn contains(&self, role: TensorRole) -> bool {
        self.file.tensor_info(&role.gguf_name()).is_some()
    }

    fn stored_dtype(&self, role: TensorRole) -> Option<DType> {
        match self.file.tensor_info(&role.gguf_name())?.ggml_type {
            GgmlType::F32 => Some(DType::F32),
            GgmlType::F16 => Some(DType::F16),
            GgmlType::BF16 => Some(DType::BF16),
            _ => None,
        }
    }

    fn float_values(&self) -> usize {
        self.file
            .tensors()
            .iter()
            .filter(|info| info.ggml_type.integer_block().is_none())
            .map(|info| info.n_elements as usize)
            .sum()
    }

    fn stacked(
        &self,
        parts: &[(TensorRole, Vec<usize>)],
        dtype: DType,
        arena: Option<&mut WeightArena>,
        order: RowOrder,
    ) -> Result<TensorData> {
        let Stack { parts, rows, cols } = self.stack(parts)?;
        let shape = match parts.as_slice() {
            [(_, info)] if info.dims.len() == 1 => vec![cols],
            _ => vec![rows, cols],
        };
        let held = (rows * cols, cols, order);
        let bytes = match dtype {
            DType::F32 => self.decoded(&parts, held, arena, GgmlType::F32, |x| x)?,
            DType::BF16 => self.decoded(&parts, held, arena, GgmlType::BF16, bf16::from_f32)?,
            DType::F16 => self.decoded(&parts, held, arena, GgmlType::F16, f16::from_f32)?,
            other => {
                return Err(ModelError::Backend(format!(
                    "weights cannot be held as {other:?}"
                )));
            }
        };
        Ok(TensorData::from_bytes(bytes, shape, dtype))
    }

    fn integer_types_differ(&self, parts: &[(TensorRole, Vec<usize>)]) -> bool {
        self.stack(parts).is_ok_and(|stack| {
            let mut types = stack.parts.iter().map(|(_, info)| info.ggml_type);
            types
                .next()
                .is_some_and(|first| types.any(|ty| ty != first))
        })
    }

    /// Parts of different types (a Q4_K_M file mixes them within one fused projection) share
    /// the finest block among them; a coarser part's scales repeat.
    fn integer_stacked(
        &self,
        parts: &[(TensorRole, Vec<usize>)],
    ) -> Result<Option<IntegerWeights>> {
        let Stack { parts, rows, cols } = self.stack(parts)?;
        let Some(block) = parts
            .iter()
            .map(|(_, info)| info.ggml_type.integer_block())
            .collect::<Option<Vec<_>>>()
            .and_then(|blocks| blocks.into_iter().min())
        else {
            return Ok(None);
        };
        let has_offsets = parts.iter().any(|(_, info)| info.ggml_type.has_offsets());
        let per_row = cols / block;
        let one_type = parts
            .first()
            .map(|(_, info)| info.ggml_type)
            .filter(|&ty| parts.iter().all(|(_, info)| info.ggml_type == ty));
        let value_form = match one_type {
            _ if !cols.is_multiple_of(32) => ValueForm::Bytes,
            Some(GgmlType::Q6_K) => ValueForm::SixBits,
            Some(GgmlType::Q4_0) => ValueForm::Nibbles { shift: 8 },
            Some(GgmlType::Q4_1 | GgmlType::Q4_K) => ValueForm::Nibbles { shift: 0 },
            Some(GgmlType::Q5_0) => ValueForm::FiveBits { shift: 16 },
            Some(GgmlType::Q5_1 | GgmlType::Q5_K) => ValueForm::FiveBits { shift: 0 },
            _ => ValueForm::Bytes,
        };
        let factor_form = match one_type {
            Some(ty @ (GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K)) => FactorForm::Scaled {
                per: ty.block_size() / block,
            },
            Some(
                GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q5_1 | GgmlType::Q8_0,
            ) => FactorForm::Halves,
            _ => FactorForm::Floats,
        };
        let (value_bytes, nibbles, crumbs, words) = match value_form {
            ValueForm::Bytes => (rows * cols, 0, 0, 0),
            ValueForm::Nibbles { .. } => (0, rows * cols / 2, 0, 0),
            ValueForm::FiveBits { .. } => (0, rows * cols / 2, 0, rows * cols / 32),
            ValueForm::SixBits => (0, rows * cols / 2, rows * cols / 4, 0),
        };
        let (mut values, mut nibbles, mut crumbs, mut high) = (
            vec![0i8; value_bytes],
            vec![0u8; nibbles],
            vec![0u8; crumbs],
            vec![0u32; words],
        );
        let mut factors = FactorsOut::new(factor_form, rows * per_row, has_offsets);
        let value_rows: Vec<RowValues<'_>> = match value_form {
            ValueForm::Bytes => values
                .chunks_exact_mut(cols.max(1))
                .map(RowValues::Bytes)
                .collect(),
            ValueForm::Nibbles { .. } => nibbles
                .chunks_exact_mut((cols / 2).max(1))
                .map(RowValues::Nibbles)
                .collect(),
            ValueForm::FiveBits { .. } => nibbles
                .chunks_exact_mut((cols / 2).max(1))
                .zip(high.chunks_exact_mut((cols / 32).max(1)))
                .map(|(nibbles, high)| RowValues::FiveBits { nibbles, high })
                .collect(),
            ValueForm::SixBits => nibbles
                .chunks_exact_mut((cols / 2).max(1))
                .zip(crumbs.chunks_exact_mut((cols / 4).max(1)))
                .map(|(nibbles, crumbs)| RowValues::SixBits { nibbles, crumbs })
                .collect(),
        };
        let mut row_outs: Vec<RowOut<'_>> = value_rows
            .into_iter()
            .zip(factors.rows(per_row))
            .map(|(values, factors)| RowOut { values, factors })
            .collect();
        // Each part's rows, split on every core: one thread took a third of a 1.7B file's
        // loading here.
        let mut left = &mut row_outs[..];
        for &(role, info) in &parts {
            let ty = info.ggml_type;
            let view = self
                .file
                .tensor(&info.name)
                .map_err(|err| corrupt(&self.file, err))?;
            let own_block = ty.integer_block().unwrap_or(block);
            let part = take_front(&mut left, info.n_rows() as usize).ok_or_else(|| {
                ModelError::Backend("GGUF tensor parts outgrew their stacked shape".into())
            })?;
            let times = own_block / block;
            let split = |row: usize, out: &mut RowOut<'_>, scratch: &mut RowScratch| {
                let RowScratch {
                    scales: own_scales,
                    offsets: own_offsets,
                    values: row_values,
                } = scratch;
                let bytes = view
                    .row_bytes(self.stored_row(role, row) as u64)
                    .map_err(|err| corrupt(&self.file, err))?;
                let corrupt_row = |err| corrupt(&self.file, err);
                // Nibbles and f16 or K-type factors are read as stored; the rest is split.
                let mut split_into = |q: &mut [i8]| {
                    let parts = IntegerParts {
                        q,
                        scales: own_scales,
                        offsets: own_offsets,
                    };
                    split_row(ty, bytes, parts)
                };
                match &mut out.values {
                    RowValues::Bytes(q) => split_into(q).map_err(corrupt_row)?,
                    RowValues::Nibbles(nibbles) => {
                        nibbles_row(ty, bytes, nibbles).map_err(corrupt_row)?
                    }
                    RowValues::FiveBits { nibbles, high } => {
                        five_bits_row(ty, bytes, nibbles, high).map_err(corrupt_row)?;
                        for word in high.iter_mut() {
                            *word = fifth_bits_in_order(*word);
                        }
                    }
                    RowValues::SixBits { nibbles, crumbs } => {
                        split_into(row_values).map_err(corrupt_row)?;
                        pack_six_bits(row_values, nibbles, crumbs);
                    }
                }
                match &mut out.factors {
                    // Parts of different types: bytes, split above.
                    RowFactors::Floats { scales, offsets } => {
                        for (out, value) in scales.iter_mut().zip(repeated(own_scales, times)) {
                            *out = value;
                        }
                        let offsets = offsets.iter_mut().flat_map(|offsets| offsets.iter_mut());
                        for (out, value) in offsets.zip(repeated(own_offsets, times)) {
                            *out = value;
                        }
                    }
                    RowFactors::Halves { scales, offsets } => {
                        half_factors(ty, bytes, scales, offsets.as_deref_mut())
                            .map_err(corrupt_row)?
                    }
                    RowFactors::Scaled(factors) => {
                        k_factors(ty, bytes, factors).map_err(corrupt_row)?
                    }
                }
                Ok::<(), ModelError>(())
            };
            // Only six bits are split into bytes before they are packed.
            let split_values = match value_form {
                ValueForm::SixBits => cols,
                ValueForm::Bytes | ValueForm::Nibbles { .. } | ValueForm::FiveBits { .. } => 0,
            };
            let buffers = || RowScratch {
                scales: vec![0.0; cols / own_block],
                offsets: vec![0.0; cols / own_block],
                values: vec![0; split_values],
            };
            part.par_iter_mut()
                .enumerate()
                .try_for_each_init(buffers, |scratch, (row, out)| split(row, out, scratch))?;
            self.file.release(info);
        }
        drop(row_outs);
        let (scales, offsets) = factors.into_factors();
        let values = match value_form {
            ValueForm::Bytes => IntegerValues::Bytes(values),
            ValueForm::Nibbles { shift } => IntegerValues::Nibbles {
                values: nibbles,
                zero: shift,
            },
            ValueForm::FiveBits { shift } => IntegerValues::FiveBits {
                nibbles,
                high,
                zero: shift,
            },
            ValueForm::SixBits => IntegerValues::SixBits {
                nibbles,
                crumbs,
                zero: SIX_BIT_ZERO,
            },
        };
        Ok(Some(IntegerWeights {
            dims: [rows, cols],
            block,
            values,
            scales,
            offsets,
        }))
    }
}
