//! One error type for everything read from a GGUF file.
//!
//! A GGUF file is untrusted input: a truncated download, a file from another tool, or a
//! deliberately lying header must all end in an error a user can act on, never a panic or a
//! multi-gigabyte allocation. So every error names the file it came from (`GgufError::path`)
//! and the thing that was wrong (the key, the tensor, the value) in `GgufErrorKind`. The path is
//! kept outside the kind so the parser, which works on bytes, need not carry it around; it is
//! attached once at the boundary where a file becomes a `GgufFile`.

use std::path::PathBuf;

/// An error about one GGUF file, with the path it came from.
#[derive(Debug, thiserror::Error)]
#[error("GGUF file {}: {kind}", path.display())]
pub struct GgufError {
    /// The file the error is about (for files parsed from memory, the label they were given).
    pub path: PathBuf,
    /// What was wrong.
    pub kind: GgufErrorKind,
}

impl GgufError {
    pub(crate) fn new(path: impl Into<PathBuf>, kind: GgufErrorKind) -> Self {
        Self {
            path: path.into(),
            kind,
        }
    }
}

/// What was wrong with a GGUF file, its metadata, its tensors, or what was asked of it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GgufErrorKind {
    // --- reading the file ---
    #[error("cannot read the file: {0}")]
    Io(#[from] std::io::Error),

    // --- container structure ---
    #[error("not a GGUF file: the magic is {found:02x?}, expected \"GGUF\"")]
    BadMagic { found: Vec<u8> },
    #[error("GGUF version {version} is not supported (only 2 and 3)")]
    UnsupportedVersion { version: u32 },
    #[error(
        "the file is big-endian (version field reads {version:#010x}); only little-endian GGUF is supported"
    )]
    BigEndian { version: u32 },
    #[error(
        "truncated: {what} needs {needed} bytes at offset {offset}, but only {available} remain"
    )]
    Truncated {
        what: String,
        offset: u64,
        needed: u64,
        available: u64,
    },
    #[error(
        "{what} claims {count} entries of at least {min_entry_bytes} bytes each, but only {available} bytes remain"
    )]
    CountTooLarge {
        what: String,
        count: u64,
        min_entry_bytes: u64,
        available: u64,
    },
    #[error("{what} at offset {offset} is not valid UTF-8")]
    InvalidUtf8 { what: String, offset: u64 },

    // --- metadata ---
    #[error("metadata key {key:?} has unknown value type id {type_id}")]
    UnknownValueType { key: String, type_id: u32 },
    #[error("metadata key {key:?} nests arrays deeper than {max_depth} levels")]
    NestingTooDeep { key: String, max_depth: usize },
    #[error("metadata key {key:?} appears more than once")]
    DuplicateKey { key: String },
    #[error("metadata key {key:?} is missing")]
    MissingKey { key: String },
    #[error("metadata key {key:?} is {found}, expected {expected}")]
    WrongType {
        key: String,
        expected: &'static str,
        found: String,
    },
    #[error("metadata key {key:?} has value {value}, which is not {expected}")]
    InvalidValue {
        key: String,
        value: String,
        expected: String,
    },

    // --- tensor infos ---
    #[error("tensor {tensor:?} has {n_dims} dimensions; at most {max} are allowed")]
    TooManyDims {
        tensor: String,
        n_dims: u32,
        max: u32,
    },
    #[error("tensor {tensor:?} has dimensions {dims:?} whose element count overflows")]
    DimsOverflow { tensor: String, dims: Vec<u64> },
    #[error("tensor {tensor:?} has unknown ggml type id {type_id}")]
    UnknownGgmlType { tensor: String, type_id: u32 },
    #[error(
        "tensor {tensor:?} of type {type_name} has rows of {row_len} elements, not a multiple of its block size {block_size}"
    )]
    PartialBlock {
        tensor: String,
        type_name: &'static str,
        row_len: u64,
        block_size: u64,
    },
    #[error(
        "tensor {tensor:?} has data offset {offset}, not a multiple of the alignment {alignment}"
    )]
    MisalignedTensor {
        tensor: String,
        offset: u64,
        alignment: u64,
    },
    #[error(
        "tensor {tensor:?} occupies file bytes {start}..{end}, past the end of the {file_len}-byte file"
    )]
    TensorOutOfBounds {
        tensor: String,
        start: u64,
        end: u64,
        file_len: u64,
    },
    #[error("tensor {tensor:?} appears more than once")]
    DuplicateTensor { tensor: String },

    // --- using tensors ---
    #[error("tensor {tensor:?} is missing")]
    MissingTensor { tensor: String },
    #[error("tensor {tensor:?} has type {type_name}, which cannot be dequantized")]
    UnsupportedTensorType {
        tensor: String,
        type_name: &'static str,
    },
    #[error("tensor {tensor:?}: {reason}")]
    BadTensorRequest { tensor: String, reason: String },

    // --- model configuration and tokenizer ---
    #[error("architecture {found:?} is not supported (smolchat runs {supported})")]
    UnsupportedArchitecture { found: String, supported: String },
    #[error("invalid model configuration: {reason}")]
    InvalidConfig { reason: String },
    #[error(
        "tokenizer model {found:?} is not supported (only \"gpt2\", byte-level BPE, and \"llama\", SentencePiece)"
    )]
    UnsupportedTokenizerModel { found: String },
    #[error("pre-tokenizer {found:?} is not supported (known: {known})")]
    UnsupportedPreTokenizer { found: String, known: String },
    #[error("tokenizer: {reason}")]
    Tokenizer { reason: String },
}
