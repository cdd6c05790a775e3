//! The GGUF container: header, metadata, tensor infos, and tensor data borrowed from a memory map.
//!
//! Layout (v2 and v3 are identical on disk; v3 only promised little-endian explicitly):
//! magic `GGUF`, u32 version, u64 tensor count, u64 metadata count, the metadata entries, the
//! tensor infos, padding to `general.alignment` (default 32), then the data section. Tensor
//! offsets are relative to the data section.
//!
//! The parser treats every number in the file as a claim to be checked before it is used.
//! A count or length is compared with the bytes that remain *before* anything is allocated:
//! each element of an array, string or table needs at least a known number of bytes, so
//! `count × smallest element` must fit in what is left. Allocation is therefore bounded by a
//! small multiple of the file's size whatever the header says, and a truncated or lying file
//! gives a named [`GgufErrorKind`] instead of a panic or an out-of-memory abort. Tensor
//! extents are checked against the file once, at open, so handing out `&[u8]` slices later
//! cannot fail or go out of bounds.
//!
//! Weights are memory-mapped rather than read: the file is ~100 MB and most of it is only
//! dequantized once into the model's own buffers, so the page cache serves it and the
//! process never holds a second copy.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use super::error::{GgufError, GgufErrorKind};
use super::metadata::{FromMetadata, Metadata, MetadataArray, MetadataValue, type_id, type_name};
use super::quant::{DequantError, GgmlType, dequantize_row};
use crate::mapped_file::release_pages;

const MAGIC: &[u8; 4] = b"GGUF";
/// Alignment of the data section and of every tensor when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// The metadata key that overrides [`DEFAULT_ALIGNMENT`].
pub const ALIGNMENT_KEY: &str = "general.alignment";
/// ggml tensors have at most four dimensions (`GGML_MAX_DIMS`).
const MAX_DIMS: u32 = 4;
/// Real files nest arrays at most one level; the limit only stops a crafted file from
/// recursing the parser off its stack (each level costs the file just 12 bytes).
const MAX_ARRAY_DEPTH: usize = 8;

/// A parsed GGUF file whose tensor data stays in the file (memory-mapped) or in a byte buffer.
pub struct GgufFile {
    path: PathBuf,
    bytes: Storage,
    header: Header,
}

enum Storage {
    Mapped(Mmap),
    Owned(Vec<u8>),
}

impl std::ops::Deref for Storage {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Storage::Mapped(m) => m,
            Storage::Owned(v) => v,
        }
    }
}

/// Where one tensor is and what it holds. Checked against the file when it was opened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    /// Dimensions in ggml order: `dims[0]` is the contiguous (row) dimension, so a PyTorch
    /// `[out, in]` weight appears here as `[in, out]`.
    pub dims: Vec<u64>,
    pub ggml_type: GgmlType,
    /// Offset of the tensor's first byte from the start of the data section.
    pub offset: u64,
    pub n_elements: u64,
    pub n_bytes: u64,
}

impl TensorInfo {
    /// Elements per row (`dims[0]`; 1 for a zero-dimensional tensor).
    pub fn row_len(&self) -> u64 {
        self.dims.first().copied().unwrap_or(1)
    }

    /// Number of rows: the product of all dimensions but the first.
    pub fn n_rows(&self) -> u64 {
        self.dims.iter().skip(1).product()
    }

    /// The shape in row-major (PyTorch/safetensors) order, outermost first.
    pub fn shape(&self) -> Vec<u64> {
        self.dims.iter().rev().copied().collect()
    }
}

/// A tensor's info and its bytes in the file.
#[derive(Clone, Copy, Debug)]
pub struct TensorView<'a> {
    pub info: &'a TensorInfo,
    pub data: &'a [u8],
    path: &'a Path,
}

impl<'a> TensorView<'a> {
    /// The bytes of row `row`.
    pub fn row_bytes(&self, row: u64) -> Result<&'a [u8], GgufError> {
        let n_rows = self.info.n_rows();
        if row >= n_rows {
            return Err(
                self.request_error(format!("row {row} requested, but it has {n_rows} rows"))
            );
        }
        let row_size = (self.info.n_bytes / n_rows) as usize;
        let start = row as usize * row_size;
        Ok(&self.data[start..start + row_size])
    }

    /// Dequantizes row `row` into `out`, which must hold exactly one row.
    pub fn dequantize_row(&self, row: u64, out: &mut [f32]) -> Result<(), GgufError> {
        if out.len() as u64 != self.info.row_len() {
            return Err(self.request_error(format!(
                "an output of {} elements was given for rows of {}",
                out.len(),
                self.info.row_len()
            )));
        }
        let bytes = self.row_bytes(row)?;
        dequantize_row(self.info.ggml_type, bytes, out).map_err(|e| self.dequant_error(e))
    }

    /// The whole tensor as `f32`, rows in order.
    pub fn to_f32_vec(&self) -> Result<Vec<f32>, GgufError> {
        let ty = self.info.ggml_type;
        if !ty.can_dequantize() {
            return Err(self.dequant_error(DequantError::Unsupported(ty)));
        }
        let mut out = vec![0f32; self.info.n_elements as usize];
        dequantize_row(ty, self.data, &mut out).map_err(|e| self.dequant_error(e))?;
        Ok(out)
    }

    fn request_error(&self, reason: String) -> GgufError {
        let tensor = self.info.name.clone();
        GgufError::new(
            self.path,
            GgufErrorKind::BadTensorRequest { tensor, reason },
        )
    }

    fn dequant_error(&self, e: DequantError) -> GgufError {
        let tensor = self.info.name.clone();
        let kind = match e {
            DequantError::Unsupported(ty) => GgufErrorKind::UnsupportedTensorType {
                tensor,
                type_name: ty.name(),
            },
            // Sizes were checked at open, so this is a bug, but still not worth a panic.
            other => GgufErrorKind::BadTensorRequest {
                tensor,
                reason: other.to_string(),
            },
        };
        GgufError::new(self.path, kind)
    }
}

impl GgufFile {
    /// Opens and memory-maps `path`, and checks its header, metadata and tensor extents.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, GgufError> {
        let path = path.as_ref();
        let io = |e| GgufError::new(path, GgufErrorKind::Io(e));
        let file = std::fs::File::open(path).map_err(io)?;
        // SAFETY: the map is read-only and lives as long as `self`. Another process truncating
        // or rewriting the file while it is mapped would be undefined behaviour; smolchat owns
        // its models directory and only ever replaces a model file by renaming a new one over
        // it, which leaves this mapping's inode intact.
        let map = unsafe { Mmap::map(&file) }.map_err(io)?;
        Self::from_storage(path.to_owned(), Storage::Mapped(map))
    }

    /// Parses a GGUF image held in memory; `label` stands in for the path in errors.
    pub fn from_bytes(label: impl Into<PathBuf>, bytes: Vec<u8>) -> Result<Self, GgufError> {
        Self::from_storage(label.into(), Storage::Owned(bytes))
    }

    fn from_storage(path: PathBuf, bytes: Storage) -> Result<Self, GgufError> {
        match parse(&bytes) {
            Ok(header) => Ok(Self {
                path,
                bytes,
                header,
            }),
            Err(kind) => Err(GgufError::new(path, kind)),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The GGUF format version (2 or 3).
    pub fn version(&self) -> u32 {
        self.header.version
    }

    pub fn alignment(&self) -> u64 {
        self.header.alignment
    }

    /// File offset of the data section.
    pub fn data_offset(&self) -> u64 {
        self.header.data_offset
    }

    pub fn metadata(&self) -> &Metadata {
        &self.header.metadata
    }

    /// All tensor infos, in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.header.tensors
    }

    pub fn tensor_info(&self, name: &str) -> Option<&TensorInfo> {
        self.header
            .tensor_index
            .get(name)
            .map(|&i| &self.header.tensors[i])
    }

    /// The named tensor and its bytes; [`GgufErrorKind::MissingTensor`] if absent.
    pub fn tensor(&self, name: &str) -> Result<TensorView<'_>, GgufError> {
        let info = self.tensor_info(name).ok_or_else(|| {
            self.error(GgufErrorKind::MissingTensor {
                tensor: name.to_owned(),
            })
        })?;
        // In bounds: checked in `parse`.
        let start = (self.header.data_offset + info.offset) as usize;
        let data = &self.bytes[start..start + info.n_bytes as usize];
        Ok(TensorView {
            info,
            data,
            path: &self.path,
        })
    }

    /// Hands the mapped pages of a converted tensor back to the kernel (see
    /// [`release_pages`]): a Q4_0 SmolLM2-135M peaked at 245 MB without it, 92 MB of it the
    /// mapped file.
    pub fn release(&self, info: &TensorInfo) {
        if let Storage::Mapped(map) = &self.bytes {
            let start = (self.header.data_offset + info.offset) as usize;
            release_pages(map, start..start + info.n_bytes as usize);
        }
    }

    /// The file without its metadata, for a reader of tensors alone: the config, tokenizer and
    /// template have been read from it by then, and its ~100k tokenizer strings (5 MB, and
    /// the mapped pages they were parsed from) would otherwise be held while the weights
    /// load, which is when memory peaks.
    pub fn without_metadata(mut self) -> Self {
        self.header.metadata = Metadata::default();
        if let Storage::Mapped(map) = &self.bytes {
            release_pages(map, 0..self.header.data_offset as usize);
        }
        self
    }

    /// An error about this file.
    pub fn error(&self, kind: GgufErrorKind) -> GgufError {
        GgufError::new(&self.path, kind)
    }

    fn required<'a, T: FromMetadata<'a>>(&'a self, key: &str) -> Result<T, GgufError> {
        self.optional(key)?.ok_or_else(|| {
            self.error(GgufErrorKind::MissingKey {
                key: key.to_owned(),
            })
        })
    }

    fn optional<'a, T: FromMetadata<'a>>(&'a self, key: &str) -> Result<Option<T>, GgufError> {
        self.header
            .metadata
            .typed(key)
            .map_err(|kind| self.error(kind))
    }

    /// Any integer value that fits in a `u32`.
    pub fn get_u32(&self, key: &str) -> Result<u32, GgufError> {
        self.required(key)
    }
    pub fn get_u32_opt(&self, key: &str) -> Result<Option<u32>, GgufError> {
        self.optional(key)
    }
    /// An `f32` (or an `f64`, narrowed).
    pub fn get_f32(&self, key: &str) -> Result<f32, GgufError> {
        self.required(key)
    }
    pub fn get_f32_opt(&self, key: &str) -> Result<Option<f32>, GgufError> {
        self.optional(key)
    }
    pub fn get_bool_opt(&self, key: &str) -> Result<Option<bool>, GgufError> {
        self.optional(key)
    }
    pub fn get_str(&self, key: &str) -> Result<&str, GgufError> {
        self.required(key)
    }
    pub fn get_str_opt(&self, key: &str) -> Result<Option<&str>, GgufError> {
        self.optional(key)
    }
    pub fn get_str_array(&self, key: &str) -> Result<&[String], GgufError> {
        self.required(key)
    }
    pub fn get_f32_array(&self, key: &str) -> Result<&[f32], GgufError> {
        self.required(key)
    }
    pub fn get_i32_array(&self, key: &str) -> Result<&[i32], GgufError> {
        self.required(key)
    }
    pub fn get_bool_array_opt(&self, key: &str) -> Result<Option<&[bool]>, GgufError> {
        self.optional(key)
    }
}

impl fmt::Debug for GgufFile {
    /// Counts rather than contents: the metadata alone holds ~100k tokenizer strings.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("version", &self.header.version)
            .field("metadata_entries", &self.header.metadata.len())
            .field("tensors", &self.header.tensors.len())
            .field("alignment", &self.header.alignment)
            .field("data_offset", &self.header.data_offset)
            .finish_non_exhaustive()
    }
}

/// What `parse` learns from a file's bytes.
struct Header {
    version: u32,
    metadata: Metadata,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
    alignment: u64,
    data_offset: u64,
}

fn parse(bytes: &[u8]) -> Result<Header, GgufErrorKind> {
    let mut r = Reader { bytes, pos: 0 };
    let magic = r.take(4, || "the magic".into())?;
    if magic != MAGIC {
        return Err(GgufErrorKind::BadMagic {
            found: magic.to_vec(),
        });
    }
    let version = r.u32(|| "the version".into())?;
    match version {
        2 | 3 => {}
        v if matches!(v.swap_bytes(), 1..=3) => return Err(GgufErrorKind::BigEndian { version }),
        _ => return Err(GgufErrorKind::UnsupportedVersion { version }),
    }
    let tensor_count = r.u64(|| "the tensor count".into())?;
    let kv_count = r.u64(|| "the metadata count".into())?;

    // Smallest metadata entry: key length (8) + value type (4) + a one-byte value.
    let kv_count = r.check_count(kv_count, 8 + 4 + 1, || "the metadata table".into())?;
    let mut metadata = Metadata::with_capacity(kv_count);
    for i in 0..kv_count {
        let key = r.string(|| format!("the key of metadata entry {i}"))?;
        let value_type = r.u32(|| format!("the value type of metadata key {key:?}"))?;
        let value = read_value(&mut r, value_type, &key, 0)?;
        metadata.insert(key, value)?;
    }

    let alignment = match metadata.typed::<u32>(ALIGNMENT_KEY)? {
        None => DEFAULT_ALIGNMENT,
        Some(a) if a.is_power_of_two() => a.into(),
        Some(a) => {
            return Err(GgufErrorKind::InvalidValue {
                key: ALIGNMENT_KEY.into(),
                value: a.to_string(),
                expected: "a non-zero power of two".into(),
            });
        }
    };

    // Smallest tensor info: name length (8) + n_dims (4) + type (4) + offset (8).
    let tensor_count = r.check_count(tensor_count, 8 + 4 + 4 + 8, || "the tensor table".into())?;
    let mut tensors = Vec::with_capacity(tensor_count);
    let mut tensor_index = HashMap::with_capacity(tensor_count);
    for i in 0..tensor_count {
        let info = read_tensor_info(&mut r, i, alignment)?;
        if tensor_index.insert(info.name.clone(), i).is_some() {
            return Err(GgufErrorKind::DuplicateTensor { tensor: info.name });
        }
        tensors.push(info);
    }

    let file_len = bytes.len() as u64;
    let data_offset = (r.pos as u64).next_multiple_of(alignment);
    for t in &tensors {
        let out_of_bounds = || GgufErrorKind::TensorOutOfBounds {
            tensor: t.name.clone(),
            start: data_offset.saturating_add(t.offset),
            end: data_offset
                .saturating_add(t.offset)
                .saturating_add(t.n_bytes),
            file_len,
        };
        let end = data_offset
            .checked_add(t.offset)
            .and_then(|start| start.checked_add(t.n_bytes))
            .ok_or_else(out_of_bounds)?;
        if end > file_len {
            return Err(out_of_bounds());
        }
    }
    Ok(Header {
        version,
        metadata,
        tensors,
        tensor_index,
        alignment,
        data_offset,
    })
}

fn read_tensor_info(
    r: &mut Reader<'_>,
    i: usize,
    alignment: u64,
) -> Result<TensorInfo, GgufErrorKind> {
    let name = r.string(|| format!("the name of tensor {i}"))?;
    let n_dims = r.u32(|| format!("the dimension count of tensor {name:?}"))?;
    if n_dims > MAX_DIMS {
        return Err(GgufErrorKind::TooManyDims {
            tensor: name,
            n_dims,
            max: MAX_DIMS,
        });
    }
    let mut dims = Vec::with_capacity(n_dims as usize);
    for d in 0..n_dims {
        dims.push(r.u64(|| format!("dimension {d} of tensor {name:?}"))?);
    }
    let type_id = r.u32(|| format!("the type of tensor {name:?}"))?;
    let offset = r.u64(|| format!("the data offset of tensor {name:?}"))?;

    let Some(ggml_type) = GgmlType::from_id(type_id) else {
        return Err(GgufErrorKind::UnknownGgmlType {
            tensor: name,
            type_id,
        });
    };
    // ggml stores dimensions as int64_t, so the element count must fit one too. Zero-sized
    // dimensions count as 1 here, so that no partial product (such as `n_rows`) can overflow
    // either, whichever dimension is zero.
    let fits = dims
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d.max(1)))
        .is_some_and(|n| n <= i64::MAX as u64);
    if !fits {
        return Err(GgufErrorKind::DimsOverflow { tensor: name, dims });
    }
    let n_elements = dims.iter().product();
    let row_len = dims.first().copied().unwrap_or(1);
    let block_size = ggml_type.block_size() as u64;
    if !row_len.is_multiple_of(block_size) {
        return Err(GgufErrorKind::PartialBlock {
            tensor: name,
            type_name: ggml_type.name(),
            row_len,
            block_size,
        });
    }
    let Some(n_bytes) = ggml_type.bytes_for(n_elements) else {
        return Err(GgufErrorKind::DimsOverflow { tensor: name, dims });
    };
    if !offset.is_multiple_of(alignment) {
        return Err(GgufErrorKind::MisalignedTensor {
            tensor: name,
            offset,
            alignment,
        });
    }
    Ok(TensorInfo {
        name,
        dims,
        ggml_type,
        offset,
        n_elements,
        n_bytes,
    })
}

fn read_value(
    r: &mut Reader<'_>,
    value_type: u32,
    key: &str,
    depth: usize,
) -> Result<MetadataValue, GgufErrorKind> {
    let what = || format!("the value of metadata key {key:?}");
    Ok(match value_type {
        type_id::U8 => MetadataValue::U8(r.array::<1>(what)?[0]),
        type_id::I8 => MetadataValue::I8(r.array::<1>(what)?[0] as i8),
        type_id::U16 => MetadataValue::U16(u16::from_le_bytes(r.array(what)?)),
        type_id::I16 => MetadataValue::I16(i16::from_le_bytes(r.array(what)?)),
        type_id::U32 => MetadataValue::U32(u32::from_le_bytes(r.array(what)?)),
        type_id::I32 => MetadataValue::I32(i32::from_le_bytes(r.array(what)?)),
        type_id::F32 => MetadataValue::F32(f32::from_le_bytes(r.array(what)?)),
        type_id::BOOL => MetadataValue::Bool(r.array::<1>(what)?[0] != 0),
        type_id::STRING => MetadataValue::String(r.string(what)?),
        type_id::ARRAY => MetadataValue::Array(read_array(r, key, depth + 1)?),
        type_id::U64 => MetadataValue::U64(u64::from_le_bytes(r.array(what)?)),
        type_id::I64 => MetadataValue::I64(i64::from_le_bytes(r.array(what)?)),
        type_id::F64 => MetadataValue::F64(f64::from_le_bytes(r.array(what)?)),
        type_id => {
            return Err(GgufErrorKind::UnknownValueType {
                key: key.to_owned(),
                type_id,
            });
        }
    })
}

/// Reads an array header (element type, count) and its elements.
fn read_array(r: &mut Reader<'_>, key: &str, depth: usize) -> Result<MetadataArray, GgufErrorKind> {
    if depth > MAX_ARRAY_DEPTH {
        return Err(GgufErrorKind::NestingTooDeep {
            key: key.to_owned(),
            max_depth: MAX_ARRAY_DEPTH,
        });
    }
    let elem_type = r.u32(|| format!("the element type of array {key:?}"))?;
    let count = r.u64(|| format!("the length of array {key:?}"))?;
    let min_elem_bytes = match elem_type {
        type_id::U8 | type_id::I8 | type_id::BOOL => 1,
        type_id::U16 | type_id::I16 => 2,
        type_id::U32 | type_id::I32 | type_id::F32 => 4,
        type_id::U64 | type_id::I64 | type_id::F64 => 8,
        type_id::STRING => 8,    // the length prefix
        type_id::ARRAY => 4 + 8, // element type + count
        type_id => {
            return Err(GgufErrorKind::UnknownValueType {
                key: key.to_owned(),
                type_id,
            });
        }
    };
    let what = || format!("array {key:?} of {}", type_name(elem_type));
    let n = r.check_count(count, min_elem_bytes, what)?;

    macro_rules! numbers {
        ($variant:ident, $t:ty) => {{
            let bytes = r.take(n as u64 * min_elem_bytes, what)?;
            MetadataArray::$variant(
                bytes
                    .chunks_exact(size_of::<$t>())
                    .map(|c| <$t>::from_le_bytes(c.try_into().expect("chunk of the type's size")))
                    .collect(),
            )
        }};
    }
    Ok(match elem_type {
        type_id::U8 => MetadataArray::U8(r.take(n as u64, what)?.to_vec()),
        type_id::I8 => {
            MetadataArray::I8(r.take(n as u64, what)?.iter().map(|&b| b as i8).collect())
        }
        type_id::BOOL => {
            MetadataArray::Bool(r.take(n as u64, what)?.iter().map(|&b| b != 0).collect())
        }
        type_id::U16 => numbers!(U16, u16),
        type_id::I16 => numbers!(I16, i16),
        type_id::U32 => numbers!(U32, u32),
        type_id::I32 => numbers!(I32, i32),
        type_id::F32 => numbers!(F32, f32),
        type_id::U64 => numbers!(U64, u64),
        type_id::I64 => numbers!(I64, i64),
        type_id::F64 => numbers!(F64, f64),
        type_id::STRING => {
            let mut v = Vec::with_capacity(n);
            for i in 0..n {
                v.push(r.string(|| format!("element {i} of array {key:?}"))?);
            }
            MetadataArray::String(v)
        }
        _ => {
            let mut v = Vec::with_capacity(n);
            for _ in 0..n {
                v.push(read_array(r, key, depth + 1)?);
            }
            MetadataArray::Array(v)
        }
    })
}

/// A cursor that refuses to read past the end, naming what it was reading when it does.
struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn remaining(&self) -> u64 {
        (self.bytes.len() - self.pos) as u64
    }

    fn take(&mut self, n: u64, what: impl FnOnce() -> String) -> Result<&'a [u8], GgufErrorKind> {
        let available = self.remaining();
        if n > available {
            return Err(GgufErrorKind::Truncated {
                what: what(),
                offset: self.pos as u64,
                needed: n,
                available,
            });
        }
        let start = self.pos;
        self.pos += n as usize;
        Ok(&self.bytes[start..self.pos])
    }

    fn array<const N: usize>(
        &mut self,
        what: impl FnOnce() -> String,
    ) -> Result<[u8; N], GgufErrorKind> {
        Ok(self
            .take(N as u64, what)?
            .try_into()
            .expect("take returns N bytes"))
    }

    fn u32(&mut self, what: impl FnOnce() -> String) -> Result<u32, GgufErrorKind> {
        self.array(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: impl FnOnce() -> String) -> Result<u64, GgufErrorKind> {
        self.array(what).map(u64::from_le_bytes)
    }

    fn string(&mut self, what: impl Fn() -> String) -> Result<String, GgufErrorKind> {
        let len = self.u64(&what)?;
        let offset = self.pos as u64;
        let bytes = self.take(len, &what)?;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_owned()),
            Err(_) => Err(GgufErrorKind::InvalidUtf8 {
                what: what(),
                offset,
            }),
        }
    }

    /// `count` as a `usize`, once `count` entries of at least `min_entry_bytes` each are known
    /// to fit in the bytes left: the check that keeps a lying count from allocating.
    fn check_count(
        &self,
        count: u64,
        min_entry_bytes: u64,
        what: impl FnOnce() -> String,
    ) -> Result<usize, GgufErrorKind> {
        let available = self.remaining();
        match count.checked_mul(min_entry_bytes) {
            Some(needed) if needed <= available => Ok(count as usize),
            _ => Err(GgufErrorKind::CountTooLarge {
                what: what(),
                count,
                min_entry_bytes,
                available,
            }),
        }
    }
}
