//! The elements of a CPU backend's tensor, read where they lie.
//!
//! Burn's backend-extension API (`Tensor::try_into_primitive`) hands over the backend's own
//! tensor: burn-flex and burn-ndarray keep theirs in ordinary host memory, so a kernel can
//! borrow it as a slice without a copy and wrap its result as a new tensor of the same
//! backend.

#![allow(deprecated)] // burn-ndarray is deprecated in Burn 0.22; we keep it on users' request.

use burn::backend::flex::FlexTensor;
use burn::backend::ndarray::NdArrayTensor;
use burn::backend::{DispatchDevice, Flex, NdArray, TensorMetadata};
use burn::tensor::{DType, Device, Shape, Tensor, TensorData};
use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

/// A float element type the CPU kernels read and write. They compute in f32 and widen or
/// narrow at the edges, so bf16 and f16 models lose no precision inside a fused kernel.
pub trait HostFloat: burn::tensor::Element + bytemuck::Pod + Send + Sync {
    /// Call it on a value, not a reference: on `&E`, method lookup finds Burn's
    /// `ToElement::to_f32(&self)` first, which for f16 is `half`'s one-value call.
    fn to_f32(self) -> f32;

    fn from_f32(value: f32) -> Self;

    /// Rounds `values` to this type; f32 takes them as they are, without a copy.
    fn narrowed(values: Vec<f32>) -> Vec<Self>;

    /// `values` as `Self` when `Self` is f32 (burn-ndarray's only float type).
    fn from_f32_slice(values: &[f32]) -> Option<&[Self]>;

    /// Whether a weight of this type sums each whole block of `matvec::PAIRED_COLUMNS`
    /// columns in pairs on x86-64 (`matvec::paired_columns`): bf16's kernels widen two
    /// columns of a 32-bit word with an instruction each.
    const PAIRED: bool = false;

    /// Widens the 8 elements at `src` into one AVX register.
    ///
    /// # Safety
    /// `src` must point to 8 readable elements, and the CPU must support AVX2 and F16C.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load8(src: *const Self) -> std::arch::x86_64::__m256;

    /// Widens the 16 elements at `src` into one AVX-512 register.
    ///
    /// # Safety
    /// `src` must point to 16 readable elements, and the CPU must support AVX512F.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load16(src: *const Self) -> std::arch::x86_64::__m512;
}

impl HostFloat for f32 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }

    #[inline(always)]
    fn from_f32(value: f32) -> Self {
        value
    }

    fn narrowed(values: Vec<f32>) -> Vec<f32> {
        values
    }

    fn from_f32_slice(values: &[f32]) -> Option<&[f32]> {
        Some(values)
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(src: *const f32) -> std::arch::x86_64::__m256 {
        // SAFETY: the caller guarantees 8 readable elements and AVX.
        unsafe { std::arch::x86_64::_mm256_loadu_ps(src) }
    }

    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn load16(src: *const f32) -> std::arch::x86_64::__m512 {
        // SAFETY: the caller guarantees 16 readable elements.
        unsafe { std::arch::x86_64::_mm512_loadu_ps(src) }
    }
}

impl HostFloat for f16 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        widened_f16(self.to_bits())
    }

    #[inline(always)]
    fn from_f32(value: f32) -> Self {
        f16::from_bits(narrowed_to_f16(value))
    }

    fn narrowed(values: Vec<f32>) -> Vec<f16> {
        let mut out = vec![f16::ZERO; values.len()];
        out.convert_from_f32_slice(&values);
        out
    }

    fn from_f32_slice(_: &[f32]) -> Option<&[f16]> {
        None
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(src: *const f16) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm256_cvtph_ps};
        // SAFETY: the caller guarantees 8 readable elements and F16C.
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(src.cast::<__m128i>())) }
    }

    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn load16(src: *const f16) -> std::arch::x86_64::__m512 {
        use std::arch::x86_64::{_mm256_loadu_si256, _mm512_cvtph_ps};
        // SAFETY: the caller guarantees 16 readable elements.
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(src.cast())) }
    }
}

impl HostFloat for bf16 {
    const PAIRED: bool = true;

    #[inline(always)]
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }

    #[inline(always)]
    fn from_f32(value: f32) -> Self {
        bf16::from_f32(value)
    }

    fn narrowed(values: Vec<f32>) -> Vec<bf16> {
        rounded_to_bf16(&values)
    }

    fn from_f32_slice(_: &[f32]) -> Option<&[bf16]> {
        None
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(src: *const bf16) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::{
            __m128i, _mm_loadu_si128, _mm256_castsi256_ps, _mm256_cvtepu16_epi32, _mm256_slli_epi32,
        };
        // bf16 is the high half of an f32: widening is a 16-bit shift.
        // SAFETY: the caller guarantees 8 readable elements and AVX2.
        unsafe {
            let bits = _mm256_cvtepu16_epi32(_mm_loadu_si128(src.cast::<__m128i>()));
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(bits))
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn load16(src: *const bf16) -> std::arch::x86_64::__m512 {
        use std::arch::x86_64::{
            _mm256_loadu_si256, _mm512_castsi512_ps, _mm512_cvtepu16_epi32, _mm512_slli_epi32,
        };
        // As `load8`: a 16-bit shift.
        // SAFETY: the caller guarantees 16 readable elements.
        unsafe {
            let bits = _mm512_cvtepu16_epi32(_mm256_loadu_si256(src.cast()));
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(bits))
        }
    }
}

/// `values` rounded to bf16, to nearest with ties to even, as `bf16::from_f32` rounds them.
/// Written without branches, so that it compiles to vector code: `half` converts one value
/// at a time, which in a bf16 decode step took 1–2% of the time, on the calling thread
/// alone.
#[multiversion::multiversion(targets("x86_64+avx2"))]
fn rounded_to_bf16(values: &[f32]) -> Vec<bf16> {
    values
        .iter()
        .map(|value| {
            let bits = value.to_bits();
            // Adding 0x7FFF and the lowest kept bit carries into the kept half exactly when
            // the dropped half is over one half, or is one half and the kept half is odd.
            let rounded = bits.wrapping_add(0x7FFF + ((bits >> 16) & 1)) >> 16;
            let quiet_nan = (bits >> 16) | 0x40;
            bf16::from_bits(if value.is_nan() { quiet_nan } else { rounded } as u16)
        })
        .collect()
}

/// The f32 of f16 `bits`, equal to `f16::to_f32` bit for bit.
///
/// This and [`narrowed_to_f16`] are written without calls, so that they compile to vector
/// code inside the kernels' loops. `half` converts one value per call, through a check for
/// F16C: in an f16 prompt those calls, with the scalar loops around them (the SwiGLU gate,
/// RoPE, the projections' inputs), took about a sixth of the time.
#[inline(always)]
fn widened_f16(bits: u16) -> f32 {
    let bits = u32::from(bits);
    let sign = (bits & 0x8000) << 16;
    let magnitude = bits & 0x7FFF;
    // Exponent and mantissa moved to f32's places read as a value 2¹¹² too small (f32's
    // exponent bias is 112 more than f16's); the product is exact, subnormals included.
    let scaled = (f32::from_bits(magnitude << 13) * f32::from_bits(0x7780_0000)).to_bits();
    // Infinities and NaNs (all exponent bits set) keep that exponent; NaNs come back quiet.
    let special = match magnitude {
        0x7C00 => 0x7F80_0000,
        m if m > 0x7C00 => 0x7FC0_0000,
        _ => 0,
    };
    f32::from_bits(sign | scaled | special)
}

/// `value` rounded to f16, to nearest with ties to even, equal to `f16::from_f32` bit for
/// bit (see [`widened_f16`] for why it is written out).
#[inline(always)]
fn narrowed_to_f16(value: f32) -> u16 {
    const HALF: u32 = 0x3F00_0000;
    let bits = value.to_bits();
    let sign = (bits >> 16) & 0x8000;
    let magnitude = bits & 0x7FFF_FFFF;
    // Below f16's smallest normal (2⁻¹⁴), adding one half in f32 rounds the value to a
    // multiple of 2⁻²⁴, f16's subnormal step, and leaves it in the low mantissa bits.
    let subnormal = (f32::from_bits(magnitude) + f32::from_bits(HALF))
        .to_bits()
        .wrapping_sub(HALF);
    // Otherwise: rebias the exponent, and round the 13 dropped bits to nearest, ties to
    // the even kept value; a carry may run into the exponent, up to infinity.
    let odd = (magnitude >> 13) & 1;
    let normal = magnitude.wrapping_add(0xC800_0FFF).wrapping_add(odd) >> 13;
    let rounded = match magnitude {
        m if m > 0x7F80_0000 => 0x7E00 | ((m >> 13) & 0x3FF),
        m if m >= 0x4780_0000 => 0x7C00,
        m if m < 0x3880_0000 => subnormal,
        _ => normal,
    };
    (sign | rounded) as u16
}

/// Runs `$body` with the type `$E` bound to the element type of `$dtype`, for the float types
/// the kernels support; any other dtype gives `None`.
macro_rules! with_host_float {
    ($dtype:expr, $E:ident => $body:expr) => {
        match $dtype {
            burn::tensor::DType::F32 => {
                type $E = f32;
                $body
            }
            burn::tensor::DType::F16 => {
                type $E = half::f16;
                $body
            }
            burn::tensor::DType::BF16 => {
                type $E = half::bf16;
                $body
            }
            _ => None,
        }
    };
}
pub(crate) use with_host_float;

/// Whether `device` keeps its tensors in host memory, where these kernels read them.
pub fn is_host(device: &Device) -> bool {
    matches!(
        device.as_dispatch(),
        DispatchDevice::Flex(_) | DispatchDevice::NdArray(_)
    )
}

/// Whether `device` is burn-flex's, which reads weights from shared bytes (such as a
/// [`crate::model::weight_arena::WeightArena`]) in place. burn-ndarray copies such bytes on
/// every operation that reads them, so it needs buffers of its own.
pub fn reads_shared_weights_in_place(device: &Device) -> bool {
    matches!(device.as_dispatch(), DispatchDevice::Flex(_))
}

/// A tensor of a CPU backend, out of Burn's dispatch layer.
#[derive(Clone, Debug)]
pub enum HostTensor {
    Flex(FlexTensor),
    NdArray(NdArrayTensor),
}

impl HostTensor {
    /// The backend's own tensor behind `tensor`, or `None` off the CPU backends. Cloning a
    /// tensor only counts a reference, so this copies no elements.
    pub fn of<const D: usize>(tensor: &Tensor<D>) -> Option<Self> {
        if let Ok(flex) = tensor.clone().try_into_primitive::<Flex>() {
            return Some(Self::Flex(flex));
        }
        tensor
            .clone()
            .try_into_primitive::<NdArray>()
            .ok()
            .map(Self::NdArray)
    }

    pub fn dtype(&self) -> DType {
        match self {
            Self::Flex(tensor) => tensor.dtype(),
            Self::NdArray(tensor) => tensor.dtype(),
        }
    }

    pub fn shape(&self) -> Shape {
        match self {
            Self::Flex(tensor) => tensor.shape(),
            Self::NdArray(tensor) => tensor.shape(),
        }
    }

    /// The elements in row-major order, when they are of type `E` and lie contiguously.
    pub fn slice<E: HostFloat>(&self) -> Option<&[E]> {
        match self {
            Self::Flex(tensor) => tensor.as_slice::<E>(),
            Self::NdArray(NdArrayTensor::F32(storage)) => {
                E::from_f32_slice(storage.view().to_slice()?)
            }
            Self::NdArray(_) => None,
        }
    }

    /// A new tensor of this tensor's backend holding `values` in `shape`.
    pub fn tensor_like<const D: usize, E: HostFloat>(
        &self,
        values: Vec<E>,
        shape: [usize; D],
    ) -> Tensor<D> {
        let data = TensorData::new(values, shape);
        match self {
            Self::Flex(_) => Tensor::from_primitive::<Flex>(FlexTensor::from_data(data)),
            Self::NdArray(_) => Tensor::from_primitive::<NdArray>(NdArrayTensor::from_data(data)),
        }
    }
}

#[cfg(test)]
mod tests {
    use half::{bf16, f16};

    use super::{narrowed_to_f16, rounded_to_bf16, widened_f16};

    #[test]
    fn f16_widening_equals_halfs_bit_for_bit() {
        for bits in 0..=u16::MAX {
            assert_eq!(
                widened_f16(bits).to_bits(),
                f16::from_bits(bits).to_f32().to_bits(),
                "{bits:#06x}"
            );
        }
    }

    /// Every exponent with many mantissas, the values on both sides of each rounding tie,
    /// the subnormal and overflow ranges, and the special values.
    #[test]
    fn f16_rounding_equals_halfs_bit_for_bit() {
        let ties = (0..=u32::MAX >> 13)
            .step_by(3)
            .flat_map(|kept| [0x0FFF, 0x1000, 0x1001].map(|dropped| (kept << 13) | dropped));
        let values = (0..=u32::MAX)
            .step_by(4099)
            .chain(ties)
            .map(f32::from_bits)
            .chain([
                0.0,
                -0.0,
                65504.0,
                65519.99,
                65520.0,
                f32::INFINITY,
                f32::NEG_INFINITY,
                f32::NAN,
                -f32::NAN,
                f32::from_bits(0x7F80_0001),
                f32::from_bits(0x3300_0000),
                f32::from_bits(0x3300_0001),
            ]);
        for value in values {
            assert_eq!(
                narrowed_to_f16(value),
                f16::from_f32(value).to_bits(),
                "{value:e} ({:#010x})",
                value.to_bits()
            );
        }
    }

    /// Every exponent with many mantissas, ties included, and the special values.
    #[test]
    fn bf16_rounding_equals_halfs_bit_for_bit() {
        let mut values: Vec<f32> = (0..=u32::MAX)
            .step_by(65_521)
            .chain((0..=u32::MAX).step_by(1 << 15))
            .chain((0..=u32::MAX >> 15).map(|kept| (kept << 15) | 0x7FFF))
            .map(f32::from_bits)
            .collect();
        values.extend([
            0.0,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::MAX,
            f32::MIN,
        ]);
        values.extend([f32::NAN, -f32::NAN, f32::from_bits(0x7F80_0001)]);
        let got = rounded_to_bf16(&values);
        for (value, got) in values.iter().zip(got) {
            assert_eq!(
                got.to_bits(),
                bf16::from_f32(*value).to_bits(),
                "{value:e} ({:#010x})",
                value.to_bits()
            );
        }
    }
}
