//! Checkpoints in Hugging Face's safetensors format, read in place from memory-mapped files.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use ::safetensors::SafeTensors;
use ::safetensors::tensor::{Dtype, Metadata, TensorInfo};
use burn::tensor::{Bytes, DType, TensorData};
use half::{bf16, f16};
use memmap2::Mmap;

use super::{Checkpoint, TensorRole};
use crate::mapped_file::release_pages;
use crate::model::cpu::{HostFloat, RowOrder};
use crate::model::error::{ModelError, Result};
use crate::model::weight_arena::WeightArena;
use crate::model_files::{SHARD_INDEX_FILE, SINGLE_WEIGHTS_FILE};

/// The weights of a Hugging Face checkpoint folder: one [`SINGLE_WEIGHTS_FILE`], or the shards
/// listed in [`SHARD_INDEX_FILE`].
///
/// Files are memory-mapped and each tensor is converted straight from the mapping into the
/// compute precision, so loading never holds the checkpoint in memory twice.
pub struct SafetensorsCheckpoint {
    shards: Vec<Shard>,
    /// Each tensor the model may read, by the name `layout.rs` gives it: its shard and its
    /// name there.
    tensor_shard: HashMap<String, (usize, String)>,
    location: PathBuf,
}

/// Where a multimodal checkpoint keeps its language model (Gemma 3 4B and up: beside
/// `vision_tower.` and `multi_modal_projector.`).
const LANGUAGE_MODEL_PREFIX: &str = "language_model.";

/// The tensors of a checkpoint by the names the model reads: as stored, or, in a multimodal
/// checkpoint whose language model sits under [`LANGUAGE_MODEL_PREFIX`], that part alone
/// without the prefix (the vision tower is not read).
fn by_model_name(stored: HashMap<String, usize>) -> HashMap<String, (usize, String)> {
    let embedding = TensorRole::Embedding.safetensors_name();
    let prefixed = !stored.contains_key(&embedding)
        && stored.contains_key(&format!("{LANGUAGE_MODEL_PREFIX}{embedding}"));
    stored
        .into_iter()
        .filter_map(|(name, shard)| {
            let model_name = if prefixed {
                name.strip_prefix(LANGUAGE_MODEL_PREFIX)?.to_owned()
            } else {
                name.clone()
            };
            Some((model_name, (shard, name)))
        })
        .collect()
}

struct Shard {
    path: PathBuf,
    mmap: Mmap,
    data_start: usize,
    metadata: Metadata,
}

#[derive(serde::Deserialize)]
struct ShardIndex {
    weight_map: HashMap<String, String>,
}

impl SafetensorsCheckpoint {
    pub fn open(dir: &Path) -> Result<Self> {
        let index_path = dir.join(SHARD_INDEX_FILE);
        if index_path.is_file() {
            Self::open_sharded(dir, &index_path)
        } else {
            let path = dir.join(SINGLE_WEIGHTS_FILE);
            let shard = Shard::open(&path)?;
            let tensor_shard = by_model_name(
                shard
                    .metadata
                    .tensors()
                    .into_keys()
                    .map(|name| (name, 0))
                    .collect(),
            );
            Ok(Self {
                shards: vec![shard],
                tensor_shard,
                location: path,
            })
        }
    }

    fn open_sharded(dir: &Path, index_path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(index_path).map_err(|source| ModelError::Io {
            path: index_path.to_path_buf(),
            source,
        })?;
        let index: ShardIndex =
            serde_json::from_str(&text).map_err(|err| ModelError::CorruptWeights {
                path: index_path.to_path_buf(),
                reason: err.to_string(),
            })?;
        let mut file_names: Vec<&String> = index.weight_map.values().collect();
        file_names.sort();
        file_names.dedup();
        let shards = file_names
            .iter()
            .map(|name| Shard::open(&dir.join(name)))
            .collect::<Result<Vec<_>>>()?;
        let mut tensor_shard = HashMap::new();
        for (tensor, file) in &index.weight_map {
            let shard =
                file_names
                    .binary_search(&file)
                    .map_err(|_| ModelError::CorruptWeights {
                        path: index_path.to_path_buf(),
                        reason: format!("shard {file} of tensor {tensor} is not listed"),
                    })?;
            tensor_shard.insert(tensor.clone(), shard);
        }
        Ok(Self {
            shards,
            tensor_shard: by_model_name(tensor_shard),
            location: index_path.to_path_buf(),
        })
    }

    fn part(&self, name: &str, shape: &[usize]) -> Result<Part<'_>> {
        let missing = || ModelError::MissingTensor {
            name: name.to_string(),
            location: self.location.clone(),
        };
        let (shard, stored) = self.tensor_shard.get(name).ok_or_else(missing)?;
        let shard = &self.shards[*shard];
        let info = shard.metadata.info(stored).ok_or_else(missing)?;
        if info.shape != shape {
            return Err(ModelError::WrongShape {
                name: name.to_string(),
                expected: shape.to_vec(),
                found: info.shape.clone(),
            });
        }
        if !matches!(info.dtype, Dtype::F32 | Dtype::F16 | Dtype::BF16) {
            return Err(ModelError::UnsupportedDtype {
                name: name.to_string(),
                dtype: format!("{:?}", info.dtype),
            });
        }
        Ok(Part { shard, info })
    }
}

impl Checkpoint for SafetensorsCheckpoint {
    fn contains(&self, role: TensorRole) -> bool {
        self.tensor_shard.contains_key(&role.safetensors_name())
    }

    fn stored_dtype(&self, role: TensorRole) -> Option<DType> {
        let (shard, stored) = self.tensor_shard.get(&role.safetensors_name())?;
        match self.shards[*shard].metadata.info(stored)?.dtype {
            Dtype::F32 => Some(DType::F32),
            Dtype::BF16 => Some(DType::BF16),
            Dtype::F16 => Some(DType::F16),
            _ => None,
        }
    }

    fn float_values(&self) -> usize {
        self.tensor_shard
            .values()
            .filter_map(|(shard, stored)| self.shards[*shard].metadata.info(stored))
            .map(|info| info.shape.iter().product::<usize>())
            .sum()
    }

    fn tensor(
        &self,
        role: TensorRole,
        shape: &[usize],
        dtype: DType,
        arena: Option<&mut WeightArena>,
    ) -> Result<TensorData> {
        let part = self.part(&role.safetensors_name(), shape)?;
        convert(&[part], shape.to_vec(), dtype, (arena, RowOrder::AsStored))
    }

    fn stacked(
        &self,
        parts: &[(TensorRole, Vec<usize>)],
        dtype: DType,
        arena: Option<&mut WeightArena>,
        order: RowOrder,
    ) -> Result<TensorData> {
        let parts = parts
            .iter()
            .map(|(role, shape)| self.part(&role.safetensors_name(), shape))
            .collect::<Result<Vec<_>>>()?;
        let rows = parts.iter().map(|part| part.info.shape[0]).sum();
        let cols = parts.first().map_or(0, |part| part.info.shape[1]);
        convert(&parts, vec![rows, cols], dtype, (arena, order))
    }
}

fn convert(
    parts: &[Part],
    shape: Vec<usize>,
    dtype: DType,
    (arena, order): (Option<&mut WeightArena>, RowOrder),
) -> Result<TensorData> {
    let len = shape.iter().product();
    let held = (len, shape.last().copied().unwrap_or(1), order);
    let bytes = match dtype {
        DType::F32 => decoded(parts, held, arena, |x| x),
        DType::BF16 => decoded(parts, held, arena, bf16::from_f32),
        DType::F16 => decoded(parts, held, arena, f16::from_f32),
        other => {
            return Err(ModelError::Backend(format!(
                "weights cannot be held as {other:?}"
            )));
        }
    };
    Ok(TensorData::from_bytes(bytes, shape, dtype))
}

/// A tensor found in a shard, already checked for shape and dtype.
struct Part<'a> {
    shard: &'a Shard,
    info: &'a TensorInfo,
}

/// The parts decoded one after another into `len` values of the compute element type, in
/// the arena when there is room, else in a buffer of their own.
fn decoded<T: HostFloat>(
    parts: &[Part],
    (len, cols, order): (usize, usize, RowOrder),
    arena: Option<&mut WeightArena>,
    from_f32: impl Fn(f32) -> T + Copy,
) -> Bytes {
    let fill = |out: &mut [T]| {
        decode_into(parts, out, from_f32);
        order.arrange(out, cols);
    };
    if let Some(bytes) = arena.and_then(|arena| arena.push(len, fill)) {
        return bytes;
    }
    let mut out = bytemuck::zeroed_vec(len);
    fill(&mut out);
    Bytes::from_elems(out)
}

/// Decodes the little-endian bytes of each part into `out`, which has room for all of them.
fn decode_into<T>(parts: &[Part], out: &mut [T], from_f32: impl Fn(f32) -> T + Copy) {
    let mut written = 0;
    for Part { shard, info } in parts {
        let bytes = shard.bytes(info);
        let out = &mut out[written..];
        written += match info.dtype {
            Dtype::BF16 => write(
                out,
                bytes
                    .chunks_exact(2)
                    .map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32()),
                from_f32,
            ),
            Dtype::F16 => write(
                out,
                bytes
                    .chunks_exact(2)
                    .map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32()),
                from_f32,
            ),
            _ => write(
                out,
                bytes
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
                from_f32,
            ),
        };
        shard.release(info);
    }
}

/// Writes `values` into the front of `out`; returns how many.
fn write<T>(
    out: &mut [T],
    values: impl Iterator<Item = f32>,
    from_f32: impl Fn(f32) -> T,
) -> usize {
    let mut count = 0;
    for (slot, value) in out.iter_mut().zip(values) {
        *slot = from_f32(value);
        count += 1;
    }
    count
}

impl Shard {
    fn open(path: &Path) -> Result<Self> {
        let io_error = |source| ModelError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(io_error)?;
        // SAFETY: the mapping is read-only and private to this process. Another program
        // truncating the file while we read it could fault; that is the accepted trade of every
        // memory-mapped model loader, and it is what keeps loading at one copy of the weights.
        let mmap = unsafe { Mmap::map(&file) }.map_err(io_error)?;
        let (header_len, metadata) =
            SafeTensors::read_metadata(&mmap).map_err(|err| ModelError::CorruptWeights {
                path: path.to_path_buf(),
                reason: err.to_string(),
            })?;
        Ok(Self {
            path: path.to_path_buf(),
            mmap,
            data_start: 8 + header_len,
            metadata,
        })
    }

    fn bytes(&self, info: &TensorInfo) -> &[u8] {
        let (start, end) = info.data_offsets;
        &self.mmap[self.data_start + start..self.data_start + end]
    }

    /// Hands the mapped pages of a converted tensor back to the kernel (see
    /// [`release_pages`]).
    fn release(&self, info: &TensorInfo) {
        let (start, end) = info.data_offsets;
        release_pages(&self.mmap, self.data_start + start..self.data_start + end);
    }
}

impl std::fmt::Debug for SafetensorsCheckpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SafetensorsCheckpoint")
            .field(
                "files",
                &self.shards.iter().map(|s| &s.path).collect::<Vec<_>>(),
            )
            .finish()
    }
}
