//! Sends one-row projections on the CPU backends to the [`matvec`] kernel.
//!
//! Burn's backend-extension API (`Tensor::try_into_primitive`, `Tensor::into_dispatch`) hands
//! over the backend's own tensor, so the kernel reads the weight where it lies, without a
//! copy. Any other case (the GPU, other quantization schemes, a strided view) returns `None`
//! and the caller uses Burn's matmul.

#![allow(deprecated)] // burn-ndarray is deprecated in Burn 0.22; we keep it on users' request.

use burn::backend::flex::{FlexQTensor, FlexTensor};
use burn::backend::ndarray::NdArrayTensor;
use burn::backend::{BackendTensor, DispatchTensorKind, Flex, NdArray, TensorMetadata};
use burn::tensor::quantization::{QuantMode, QuantScheme, QuantStore, QuantValue};
use burn::tensor::{DType, Tensor, TensorData};
use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

use super::matvec::{WeightElement, matvec, matvec_q8};

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
    if let DispatchTensorKind::Flex(BackendTensor::Quantized(weight)) =
        weight.clone().into_dispatch().kind
    {
        let x = x.clone().try_into_primitive::<Flex>().ok()?;
        return on_flex_quantized(&weight, &x, rows).map(Tensor::from_primitive::<Flex>);
    }
    if let Ok(weight) = weight.clone().try_into_primitive::<NdArray>() {
        let x = x.clone().try_into_primitive::<NdArray>().ok()?;
        return on_ndarray(&weight, &x, rows).map(Tensor::from_primitive::<NdArray>);
    }
    None
}

fn on_flex(weight: &FlexTensor, x: &FlexTensor, rows: usize) -> Option<FlexTensor> {
    let data = match weight.dtype() {
        DType::F32 => row_data(weight.as_slice::<f32>()?, x.as_slice::<f32>()?, rows),
        DType::F16 => row_data(
            weight.as_slice::<f16>()?,
            &x.as_slice::<f16>()?.to_f32_vec(),
            rows,
        ),
        DType::BF16 => row_data(
            weight.as_slice::<bf16>()?,
            &x.as_slice::<bf16>()?.to_f32_vec(),
            rows,
        ),
        _ => return None,
    };
    Some(FlexTensor::from_data(data))
}

/// 8-bit weights with one scale per block of a row, stored one integer per byte: the scheme
/// `--precision q8` uses on the CPU. Other schemes keep Burn's matmul.
fn on_flex_quantized(weight: &FlexQTensor, x: &FlexTensor, rows: usize) -> Option<FlexTensor> {
    let DType::QFloat(scheme) = weight.dtype() else {
        return None;
    };
    let cols = weight.shape()[1];
    let block = row_block(&scheme, cols)?;
    let values = weight.tensor().as_slice::<i8>()?;
    let scales = weight.scales();
    if scales.len() * block != values.len() {
        return None;
    }
    let y = matvec_q8(values, scales, block, x.as_slice::<f32>()?, rows);
    Some(FlexTensor::from_data(TensorData::new(y, [1, rows])))
}

/// The block length when `scheme` is symmetric 8-bit with blocks along rows only and no
/// second, per-tensor scale.
fn row_block(scheme: &QuantScheme, cols: usize) -> Option<usize> {
    let eight_bit = matches!(scheme.value, QuantValue::Q8S | QuantValue::Q8F);
    let plain = scheme.mode == QuantMode::Symmetric
        && scheme.store == QuantStore::Native
        && scheme.tensor_scale().is_none();
    let block = scheme.block_size()?.to_dim_vec(2);
    let block = match block.as_slice() {
        [1, block] if *block > 0 => usize::from(*block),
        _ => return None,
    };
    (eight_bit && plain && cols.is_multiple_of(block)).then_some(block)
}

fn on_ndarray(weight: &NdArrayTensor, x: &NdArrayTensor, rows: usize) -> Option<NdArrayTensor> {
    let (NdArrayTensor::F32(weight), NdArrayTensor::F32(x)) = (weight, x) else {
        return None;
    };
    let (weight, x) = (weight.view(), x.view());
    let data = row_data(weight.as_slice()?, x.as_slice()?, rows);
    Some(NdArrayTensor::from_data(data))
}

/// The product as a `[1, rows]` tensor in the weight's own element type, which is the
/// model's compute dtype.
fn row_data<W: WeightElement + Narrow>(weight: &[W], x: &[f32], rows: usize) -> TensorData {
    let y = matvec(weight, x, rows);
    TensorData::new(W::narrow(y), [1, rows])
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

#[cfg(test)]
mod tests {
    use burn::tensor::{Device, Tensor, TensorData};

    use super::project_row;
    use crate::model::Precision;

    fn tensor(rows: usize, cols: usize, seed: usize, device: &Device) -> Tensor<2> {
        let values: Vec<f32> = (0..rows * cols)
            .map(|i| (((i * 7919 + seed * 104_729) % 1000) as f32 / 500.0) - 1.0)
            .collect();
        Tensor::from_data(TensorData::new(values, [rows, cols]), device)
    }

    /// Reading Burn's own quantized tensor checks what the kernel's unit tests cannot: that
    /// the integers and scales are laid out as the kernel assumes.
    #[test]
    fn quantized_flex_weights_give_the_dequantized_product() {
        let device = Device::flex();
        let scheme = Precision::Q8
            .weight_quantization(&device)
            .expect("q8 has a scheme");
        let weight = tensor(48, 96, 1, &device).quantize_dynamic(&scheme);
        let x = tensor(1, 96, 2, &device);

        let got = project_row(&weight, &x).expect("the q8 kernel takes Burn's q8 weights");
        let expected = x.matmul(weight.dequantize().transpose());
        let (got, expected) = (
            got.into_data().try_to_vec::<f32>().expect("f32"),
            expected.into_data().try_to_vec::<f32>().expect("f32"),
        );
        assert_eq!(got.len(), 48);
        for (g, e) in got.iter().zip(&expected) {
            assert!((g - e).abs() < 1e-4, "{g} vs {e}");
        }
    }

    #[test]
    fn plain_flex_weights_give_burns_product() {
        let device = Device::flex();
        let weight = tensor(40, 70, 3, &device);
        let x = tensor(1, 70, 4, &device);
        let got = project_row(&weight, &x).expect("the kernel takes f32 rows");
        let expected = x.clone().matmul(weight.clone().transpose());
        let (got, expected) = (
            got.into_data().try_to_vec::<f32>().expect("f32"),
            expected.into_data().try_to_vec::<f32>().expect("f32"),
        );
        for (g, e) in got.iter().zip(&expected) {
            assert!((g - e).abs() < 1e-4, "{g} vs {e}");
        }
        let two_rows = tensor(2, 70, 5, &device);
        assert!(
            project_row(&weight, &two_rows).is_none(),
            "prefill keeps Burn's matmul"
        );
    }
}
