//! Which Burn backend runs the model, chosen at run time.

use burn::tensor::Device;

/// A compute backend the user can pick (`--backend`, settings panel).
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Default,
    clap::ValueEnum,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    /// burn-flex: Burn's maintained pure-Rust CPU backend (SIMD, multi-threaded). The faster of
    /// the two CPU backends on every figure we measured, hence the default.
    #[default]
    Flex,
    /// burn-ndarray: deprecated in Burn 0.22 but kept because users asked for it.
    Ndarray,
}

impl BackendKind {
    pub fn device(self) -> Device {
        match self {
            BackendKind::Flex => Device::flex(),
            #[allow(deprecated)]
            BackendKind::Ndarray => Device::ndarray(),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Flex => "flex",
            BackendKind::Ndarray => "ndarray",
        }
    }
}

impl std::fmt::Display for BackendKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
