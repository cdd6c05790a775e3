//! Links the fuzz targets against libFuzzer's runtime as clang ships it (Debian's
//! `libclang-rt-14-dev`, or the archive `LIBFUZZER_LIB` names), which brings `main`.

use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-env-changed=LIBFUZZER_LIB");
    let archive = std::env::var_os("LIBFUZZER_LIB")
        .map(PathBuf::from)
        .or_else(find_clang_runtime)
        .unwrap_or_else(|| {
            panic!(
                "libFuzzer's runtime was not found: install libclang-rt-14-dev (or another \
                 version), or set LIBFUZZER_LIB to libclang_rt.fuzzer-x86_64.a"
            )
        });
    println!("cargo:rustc-link-arg-bins={}", archive.display());
    println!("cargo:rustc-link-arg-bins=-lstdc++");
}

fn find_clang_runtime() -> Option<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib")
        .ok()?
        .flatten()
        .filter(|entry| entry.file_name().to_string_lossy().starts_with("llvm-"))
        .flat_map(|llvm| {
            std::fs::read_dir(llvm.path().join("lib/clang"))
                .into_iter()
                .flatten()
        })
        .flatten()
        .map(|version| version.path().join("lib/linux/libclang_rt.fuzzer-x86_64.a"))
        .filter(|archive| archive.is_file())
        .collect();
    found.sort();
    found.pop()
}
