//! Link options for the `smolchat` binary.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    // Relative relocations packed (DT_RELR, glibc 2.36+): our position-independent binary has
    // 230 thousand of them (5.6 MB of `.rela.dyn`), which the dynamic loader reads whole at
    // every start, so that all of it stayed in the process's memory: 4% of its peak with
    // SmolLM2-135M. Packed they take a few kilobytes. Linkers that do not know the option
    // ignore it with a warning, and GNU ld only packs when the C library supports it.
    let target = |key: &str| std::env::var(key).unwrap_or_default();
    if target("CARGO_CFG_TARGET_OS") == "linux" && target("CARGO_CFG_TARGET_ENV") == "gnu" {
        println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
}
