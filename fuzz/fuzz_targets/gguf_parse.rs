//! libFuzzer entry point: any byte string must parse to a file or a named error, never panic
//! (libFuzzer also reports allocations over `-malloc_limit_mb`, default 2048, as crashes).
//! Seed it with the real file's first few KB and `tests/gguf/fuzz.rs`'s synthetic file.
#![no_main]

use smolchat::gguf::{GgufConfig, GgufFile};
use smolchat_fuzz::fuzz_target;

fuzz_target!(|data| {
    let Ok(file) = GgufFile::from_bytes("fuzz.gguf", data.to_vec()) else {
        return;
    };
    for info in file.tensors() {
        let tensor = file.tensor(&info.name).expect("listed tensors exist");
        if info.n_elements < 1 << 20 {
            let _ = tensor.to_f32_vec();
        }
    }
    let _ = GgufConfig::from_gguf(&file);
});
