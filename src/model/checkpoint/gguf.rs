//! A GGUF file's weights behind [`Checkpoint`]: llama.cpp's single-file format, read from its
//! memory map by the names of the layout table's GGUF column.
//!
//! llama.cpp's converter reorders the rows of the query and key projections within each head
//! for its RoPE layout (see [`crate::gguf::layout`]); this reader hands them back in Hugging
//! Face's order, so the model code is the same for both formats.

use burn::tensor::{Bytes, DType, TensorData};
use half::{bf16, f16};
use rayon::iter::Either;
use rayon::prelude::*;

use super::{Checkpoint, LayerRole, TensorRole};
use crate::gguf::{GgmlType, GgufFile, IntegerParts, TensorInfo, qk_gguf_row, split_row};
use crate::model::cpu::{BlockFactors, IntegerValues, IntegerWeights, SIX_BIT_ZERO, pack_six_bits};
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
    /// part's rows on every core: on one, a 1.7B BF16 file's 3.4 GB took 6–15 s to load.
    fn decode_into<T: Send>(
        &self,
        parts: &[(TensorRole, &TensorInfo)],
        out: &mut [T],
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
                        view.dequantize_row(self.stored_row(role, row) as u64, row_values)
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

    fn decoded<T: bytemuck::Pod + Send + Sync>(
        &self,
        parts: &[(TensorRole, &TensorInfo)],
        len: usize,
        arena: Option<&mut WeightArena>,
        from_f32: impl Fn(f32) -> T + Copy + Sync,
    ) -> Result<Bytes> {
        let mut result = Ok(());
        if let Some(bytes) = arena.and_then(|arena| {
            arena.push(len, |out| result = self.decode_into(parts, out, from_f32))
        }) {
            return result.map(|()| bytes);
        }
        let mut out = bytemuck::zeroed_vec(len);
        self.decode_into(parts, &mut out, from_f32)?;
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

/// Where one row of an integer tensor goes: bytes, or six bits (see
/// `IntegerValues::SixBits`).
enum RowOut<'a> {
    Bytes(&'a mut [i8]),
    SixBits {
        nibbles: &'a mut [u8],
        crumbs: &'a mut [u8],
    },
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
    ) -> Result<TensorData> {
        let Stack { parts, rows, cols } = self.stack(parts)?;
        let shape = match parts.as_slice() {
            [(_, info)] if info.dims.len() == 1 => vec![cols],
            _ => vec![rows, cols],
        };
        let len = rows * cols;
        let bytes = match dtype {
            DType::F32 => self.decoded(&parts, len, arena, |x| x)?,
            DType::BF16 => self.decoded(&parts, len, arena, bf16::from_f32)?,
            DType::F16 => self.decoded(&parts, len, arena, f16::from_f32)?,
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
        // Q6_K rows go straight into six bits as they are split: split to bytes first, a
        // 1.7B Q6_K file took 1.5 s more to load than it does in bytes alone.
        let six_bits = cols.is_multiple_of(32)
            && parts
                .iter()
                .all(|(_, info)| info.ggml_type == GgmlType::Q6_K);
        let mut values = vec![0i8; if six_bits { 0 } else { rows * cols }];
        let mut nibbles = vec![0u8; if six_bits { rows * cols / 2 } else { 0 }];
        let mut crumbs = vec![0u8; if six_bits { rows * cols / 4 } else { 0 }];
        let mut scales = vec![0.0; rows * per_row];
        let mut offsets = vec![0.0; if has_offsets { rows * per_row } else { 0 }];
        // Each part's rows, split on every core: one thread took a third of a 1.7B file's
        // loading here.
        let (mut values_left, mut scales_left, mut offsets_left) =
            (&mut values[..], &mut scales[..], &mut offsets[..]);
        let (mut nibbles_left, mut crumbs_left) = (&mut nibbles[..], &mut crumbs[..]);
        for &(role, info) in &parts {
            let ty = info.ggml_type;
            let view = self
                .file
                .tensor(&info.name)
                .map_err(|err| corrupt(&self.file, err))?;
            let own_block = ty.integer_block().unwrap_or(block);
            let part_rows = info.n_rows() as usize;
            let overgrown =
                || ModelError::Backend("GGUF tensor parts outgrew their stacked shape".into());
            let rows_out = match six_bits {
                false => {
                    let part =
                        take_front(&mut values_left, part_rows * cols).ok_or_else(overgrown)?;
                    Either::Left(part.par_chunks_exact_mut(cols.max(1)).map(RowOut::Bytes))
                }
                true => {
                    let part_nibbles = take_front(&mut nibbles_left, part_rows * cols / 2)
                        .ok_or_else(overgrown)?;
                    let part_crumbs =
                        take_front(&mut crumbs_left, part_rows * cols / 4).ok_or_else(overgrown)?;
                    Either::Right(
                        part_nibbles
                            .par_chunks_exact_mut((cols / 2).max(1))
                            .zip(part_crumbs.par_chunks_exact_mut((cols / 4).max(1)))
                            .map(|(nibbles, crumbs)| RowOut::SixBits { nibbles, crumbs }),
                    )
                }
            };
            let part_scales =
                take_front(&mut scales_left, part_rows * per_row).ok_or_else(overgrown)?;
            let part_offsets = match has_offsets {
                true => {
                    Some(take_front(&mut offsets_left, part_rows * per_row).ok_or_else(overgrown)?)
                }
                false => None,
            };
            let times = own_block / block;
            let split = |row: usize,
                         out: RowOut<'_>,
                         row_scales: &mut [f32],
                         row_offsets: Option<&mut [f32]>,
                         scratch: &mut RowScratch| {
                let RowScratch {
                    scales: own_scales,
                    offsets: own_offsets,
                    values: row_values,
                } = scratch;
                let bytes = view
                    .row_bytes(self.stored_row(role, row) as u64)
                    .map_err(|err| corrupt(&self.file, err))?;
                let (q, packed) = match out {
                    RowOut::Bytes(q) => (q, None),
                    RowOut::SixBits { nibbles, crumbs } => {
                        (&mut row_values[..], Some((nibbles, crumbs)))
                    }
                };
                let parts = IntegerParts {
                    q,
                    scales: own_scales,
                    offsets: own_offsets,
                };
                split_row(ty, bytes, parts).map_err(|err| corrupt(&self.file, err))?;
                if let Some((nibbles, crumbs)) = packed {
                    pack_six_bits(row_values, nibbles, crumbs);
                }
                for (out, value) in row_scales.iter_mut().zip(repeated(own_scales, times)) {
                    *out = value;
                }
                for (out, value) in row_offsets
                    .into_iter()
                    .flatten()
                    .zip(repeated(own_offsets, times))
                {
                    *out = value;
                }
                Ok::<(), ModelError>(())
            };
            let buffers = || RowScratch {
                scales: vec![0.0; cols / own_block],
                offsets: vec![0.0; cols / own_block],
                values: vec![0; if six_bits { cols } else { 0 }],
            };
            let rows_of = rows_out
                .zip(part_scales.par_chunks_exact_mut(per_row.max(1)))
                .enumerate();
            match part_offsets {
                Some(part) => rows_of
                    .zip(part.par_chunks_exact_mut(per_row.max(1)))
                    .try_for_each_init(buffers, |buffers, ((row, (q, s)), o)| {
                        split(row, q, s, Some(o), buffers)
                    })?,
                None => rows_of.try_for_each_init(buffers, |buffers, (row, (q, s))| {
                    split(row, q, s, None, buffers)
                })?,
            }
            self.file.release(info);
        }
        let values = match six_bits {
            false => IntegerValues::Bytes(values),
            true => IntegerValues::SixBits {
                nibbles,
                crumbs,
                zero: SIX_BIT_ZERO,
            },
        };
        Ok(Some(IntegerWeights {
            dims: [rows, cols],
            block,
            values,
            scales: BlockFactors::F32(scales),
            offsets: has_offsets.then_some(BlockFactors::F32(offsets)),
        }))
    }
}
