//! The GGUF reader (`src/gguf/`): the container parser and its named errors, the metadata and
//! config, dequantization against an independent implementation, fuzzed headers, and the
//! genuine SmolLM2-135M-Instruct file with a tokenizer that must match `tokenizer.json`.

pub mod builder;
mod config_and_tokenizer;
mod dequant_reference;
mod float_weights;
mod fuzz;
mod genuine_answers;
mod integer_weights;
mod parse;
mod real_model;
mod rope_factors;
mod vocab_files;
