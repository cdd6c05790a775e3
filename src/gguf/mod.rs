//! Reading GGUF files: llama.cpp's single-file model format.
//!
//! One GGUF file carries what otherwise takes four (`config.json`, `tokenizer.json`,
//! `tokenizer_config.json` and the weights), which makes it the simplest thing for a user
//! to download and for smolchat to verify. The pieces:
//!
//! - [`file`](mod@file): the container, parsed defensively and memory-mapped.
//! - [`metadata`]: the typed key/value store in the header.
//! - [`quant`]: ggml tensor types and their exact dequantization to `f32`.
//! - [`config`]: the Llama hyperparameters, checked.
//! - [`tokenizer`]: a Hugging Face tokenizer rebuilt from the embedded vocabulary.
//! - [`layout`]: putting llama.cpp's reordered Q/K rows back in Hugging Face order.
//! - [`error`]: the one error type, which always names the file.
//!
//! Loading weights is left to the model code, with one warning: llama.cpp's converter
//! permutes the rows of `attn_q` / `attn_k` for its RoPE layout (see
//! [`layout`]).

pub mod config;
pub mod error;
pub mod file;
pub mod layout;
pub mod metadata;
pub mod quant;
pub mod tokenizer;

pub use config::{GgufConfig, RopeScaling};
pub use error::{GgufError, GgufErrorKind};
pub use file::{GgufFile, TensorInfo, TensorView};
pub use layout::{qk_gguf_row, unpermute_qk_rows};
pub use metadata::{Metadata, MetadataArray, MetadataValue};
pub use quant::{
    DequantError, GgmlType, IntegerParts, KFactors, dequantize_row, five_bits_row, half_factors,
    k_factors, nibbles_row, split_row,
};
pub use tokenizer::GgufTokenizer;
