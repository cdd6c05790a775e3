//! The full-size SmolLM2-135M-shaped checkpoint with random weights that every benchmark
//! runs on (speed does not depend on the values). Written on first use into
//! `target/bench-models/`, next to the genuine tokenizer and chat template.

use std::path::PathBuf;

use smolchat::model::ModelConfig;
use smolchat::model::random_checkpoint::{StorageDtype, write_random_weights};

pub fn full_size_checkpoint() -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let source = root.join("tests/fixtures/smollm2-135m-instruct");
    let dir = root.join("target/bench-models/smollm2-135m-random");
    if !dir.join("model.safetensors").is_file() {
        std::fs::create_dir_all(&dir).expect("create bench model dir");
        for entry in std::fs::read_dir(&source).expect("fixture folder") {
            let entry = entry.expect("fixture entry");
            std::fs::copy(entry.path(), dir.join(entry.file_name())).expect("copy fixture file");
        }
        let config = ModelConfig::from_file(&dir.join("config.json")).expect("config");
        write_random_weights(&config, StorageDtype::Bf16, 0, &dir).expect("write weights");
    }
    dir
}
