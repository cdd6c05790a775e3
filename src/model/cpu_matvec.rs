//! Sends one-row projections on the CPU backends to the [`matvec`] kernel.
//!
//! Burn's backend-extension API (`Tensor::try_into_primitive`) hands over the backend's own
//! tensor, so the kernel reads the weight where it lies, without a copy. Any other case
//! (the GPU, quantized weights, a strided view) returns `None` and the caller uses Burn's
//! matmul.

#![allow(deprecated)] // burn-ndarray is deprecated in Burn 0.22; we keep it on users' request.

use burn::backend::flex::FlexTensor;
use burn::backend::ndarray::NdArrayTensor;
use burn::backend::{Flex, NdArray};
use burn::tensor::{DType, Tensor, TensorData};
use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

use super::matvec::{WeightElement, matvec};

/// `x Wᵀ` for `x`: `[1, in]` and `W`: `[out, in]`, or `None` when the kernel does not apply.
pub fn project_row(weight: &Tensor<2>, x: &Tensor<2>) -> Option<Tensor<2>> {
    let [rows, cols] = weight.dims();
    if x.dims() != [1, cols] {
        return None;
    }
    if let Ok(weight) = weight.clone().try_into_primitive::<Flex>() {
        let x = x.clone().try_into_primitive::<Flex>().ok()?;
        return on_flex(&weight, &x, rows).map(Tensor::from_primitive::<Flex>);
    }
    if let Ok(weight) = weight.clone().try_into_primitive::<NdArray>() {
        let x = x.clone().try_into_primitive::<NdArray>().ok()?;
        return on_ndarray(&weight, &x, rows).map(Tensor::from_primitive::<NdArray>);
    }
    None
}

fn on_flex(weight: &FlexTensor, x: &FlexTensor, rows: usize) -> Option<FlexTensor> {
    let data = match weight.dtype() {
        DType::F32 => row_data(
            weight.as_slice::<f32>()?,
            x.as_slice::<f32>()?.to_vec(),
            rows,
        ),
        DType::F16 => row_data(weight.as_slice::<f16>()?, widen(x.as_slice::<f16>()?), rows),
        DType::BF16 => row_data(
            weight.as_slice::<bf16>()?,
            widen(x.as_slice::<bf16>()?),
            rows,
        ),
        _ => return None,
    };
    Some(FlexTensor::from_data(data))
}

fn on_ndarray(weight: &NdArrayTensor, x: &NdArrayTensor, rows: usize) -> Option<NdArrayTensor> {
    let (NdArrayTensor::F32(weight), NdArrayTensor::F32(x)) = (weight, x) else {
        return None;
    };
    let (weight, x) = (weight.view(), x.view());
    let data = row_data(weight.as_slice()?, x.as_slice()?.to_vec(), rows);
    Some(NdArrayTensor::from_data(data))
}

/// The product as a `[1, rows]` tensor in the weight's own element type, which is the
/// model's compute dtype.
fn row_data<W: WeightElement + Narrow>(weight: &[W], x: Vec<f32>, rows: usize) -> TensorData {
    let y = matvec(weight, &x, rows);
    TensorData::new(W::narrow(y), [1, rows])
}

fn widen<H: HalfFloatSliceExt + ?Sized>(x: &H) -> Vec<f32> {
    x.to_f32_vec()
}

/// Converts the kernel's f32 results back to the weight's element type.
trait Narrow: burn::tensor::Element + Sized {
    fn narrow(values: Vec<f32>) -> Vec<Self>;
}

impl Narrow for f32 {
    fn narrow(values: Vec<f32>) -> Vec<f32> {
        values
    }
}

impl Narrow for f16 {
    fn narrow(values: Vec<f32>) -> Vec<f16> {
        let mut out = vec![f16::ZERO; values.len()];
        out.convert_from_f32_slice(&values);
        out
    }
}

impl Narrow for bf16 {
    fn narrow(values: Vec<f32>) -> Vec<bf16> {
        let mut out = vec![bf16::ZERO; values.len()];
        out.convert_from_f32_slice(&values);
        out
    }
}
