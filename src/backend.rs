//! Which Burn backend runs the model, chosen at run time.

use std::sync::OnceLock;

use burn::tensor::Device;
use burn::tensor::wgpu::WgpuBackend;

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
    /// burn-wgpu on the system's GPU (Vulkan, or Metal on macOS).
    Gpu,
}

impl BackendKind {
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Flex => "flex",
            BackendKind::Ndarray => "ndarray",
            BackendKind::Gpu => "gpu",
        }
    }
}

impl std::fmt::Display for BackendKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The backend a model actually runs on. Asking for the GPU on a machine without a usable
/// adapter gives the default CPU backend and says why, so that the app keeps working.
#[derive(Debug, Clone)]
pub struct ComputeDevice {
    pub backend: BackendKind,
    pub device: Device,
    /// Why the requested backend could not be used, when it could not.
    pub fallback: Option<String>,
}

impl ComputeDevice {
    pub fn open(requested: BackendKind) -> Self {
        let (backend, device, fallback) = match requested {
            BackendKind::Flex => (BackendKind::Flex, Device::flex(), None),
            #[allow(deprecated)]
            BackendKind::Ndarray => (BackendKind::Ndarray, Device::ndarray(), None),
            BackendKind::Gpu => match gpu_device() {
                Ok(device) => (BackendKind::Gpu, device, None),
                Err(reason) => (
                    BackendKind::Flex,
                    Device::flex(),
                    Some(format!(
                        "no usable GPU ({reason}); running on the CPU ({}) instead",
                        BackendKind::Flex
                    )),
                ),
            },
        };
        Self {
            backend,
            device,
            fallback,
        }
    }

    /// What runs the model, as a user would name it: the GPU adapter, or the CPU backend.
    pub fn name(&self) -> String {
        match self.backend {
            BackendKind::Gpu => match self.device.identity() {
                Some(identity) => format!("{} (gpu)", identity.name),
                None => "gpu".into(),
            },
            cpu_backend => format!("CPU ({cpu_backend})"),
        }
    }

    /// A GPU backend on a software rasterizer (llvmpipe, lavapipe): no card behind it, so it
    /// computes on the CPU, slower than the CPU backends.
    pub fn is_software_renderer(&self) -> bool {
        self.backend == BackendKind::Gpu
            && self
                .device
                .identity()
                .is_some_and(|identity| identity.physical.is_none())
    }

    /// Bytes the GPU allocator holds; `None` on the CPU, where the process's resident memory
    /// already says it.
    pub fn device_memory_bytes(&self) -> Option<u64> {
        match self.backend {
            BackendKind::Gpu => self
                .device
                .memory_pool_usage()
                .map(|usage| usage.bytes_reserved),
            _ => None,
        }
    }
}

/// The wgpu runtime can be initialised only once per process, so its device (or the reason
/// there is none) is kept for every later model load.
fn gpu_device() -> Result<Device, String> {
    static GPU: OnceLock<Result<Device, String>> = OnceLock::new();
    GPU.get_or_init(|| {
        Device::wgpu_options()
            .graphics_api(native_graphics_api())
            .init()
            .map_err(|err| err.to_string())
    })
    .clone()
}

/// Pinned rather than automatic: without a Vulkan driver, wgpu's automatic choice falls back
/// to OpenGL, which deadlocked on software rasterisers.
fn native_graphics_api() -> WgpuBackend {
    if cfg!(target_os = "macos") {
        WgpuBackend::Metal
    } else {
        WgpuBackend::Vulkan
    }
}
