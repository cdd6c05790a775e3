//! Every integration test but the server's load test, as modules of one test binary: each
//! binary links the whole app (about 160 MB in a debug build), and a dozen of them filled a
//! clean CI machine's disk and spent most of its build time linking.
//! `tests/server_load.rs` stays its own binary because it measures its process's memory.

mod chat_templates;
mod cli;
mod common;
mod decoded_together;
mod downloads;
mod durability;
mod engine_worker;
mod fake_hub;
mod gguf;
mod gui;
mod hub_download;
mod model_errors;
mod model_families;
mod model_golden;
mod model_precision;
mod model_variants;
mod prompt_splits;
mod server;
mod text_behaviour;
mod text_golden;
mod thread_counts;
