//! smolchat: a local chat app for small Llama-architecture language models, built on Burn.

pub mod atomic_file;
pub mod backend;
pub mod cli;
pub mod downloads;
pub mod engine;
pub mod generation;
pub mod gguf;
pub mod hub;
pub mod mapped_file;
pub mod model;
pub mod model_files;
pub mod model_library;
pub mod model_source;
pub mod server;
pub mod stats;
pub mod store;
pub mod text;
pub mod ui;
