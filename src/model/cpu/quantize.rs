//! 8-bit weights made on all cores: the same integers and scales as burn-flex's
//! `quantize_dynamic`, which runs on one thread and made loading with `--precision q8` take
//! over two seconds.

use burn::backend::flex::{FlexQTensor, FlexTensor};
use burn::backend::{BackendTensor, DispatchKindConversion, DispatchTensor, Flex};
use burn::tensor::quantization::{QuantScheme, QuantStore};
use burn::tensor::{Tensor, TensorData};

use super::host::HostTensor;
use super::threads::split_rows;
use super::weights::row_block;

/// Blocks quantized per task at least.
const MIN_BLOCKS_PER_PART: usize = 1024;

/// `weight` in `scheme`, when it is a burn-flex f32 matrix and `scheme` is one the kernels
/// read (symmetric 8-bit, blocks along rows, f32 scales); `None` otherwise.
pub fn quantize(weight: &Tensor<2>, scheme: &QuantScheme) -> Option<Tensor<2>> {
    let shape = weight.dims();
    let block = row_block(scheme, shape[1])?;
    let HostTensor::Flex(tensor) = HostTensor::of(weight)? else {
        return None;
    };
    let values = tensor.as_slice::<f32>()?;
    let (low, high) = scheme.value.range();
    let mut integers = vec![0i8; values.len()];
    let mut scales = vec![0.0f32; values.len() / block];
    split_rows(
        &mut scales,
        1,
        MIN_BLOCKS_PER_PART,
        &|first, scales: &mut [f32]| {
            let values = &values[first * block..(first + scales.len()) * block];
            for (values, scale) in values.chunks_exact(block).zip(scales) {
                *scale = block_scale(values, high - low);
            }
        },
    );
    split_rows(
        &mut integers,
        block,
        MIN_BLOCKS_PER_PART,
        &|first, out: &mut [i8]| {
            let values = &values[first * block..first * block + out.len()];
            let blocks = out.chunks_exact_mut(block).zip(values.chunks_exact(block));
            for ((out, values), scale) in blocks.zip(&scales[first..]) {
                let inverse = 1.0 / scale;
                for (q, &x) in out.iter_mut().zip(values) {
                    *q = (x * inverse).round().clamp(low, high) as i8;
                }
            }
        },
    );
    let integers = FlexTensor::from_data(TensorData::new(integers, shape));
    let quantized = FlexQTensor::new(
        integers,
        scheme.with_store(QuantStore::Native),
        scales,
        None,
    );
    Some(Tensor::from_dispatch(
        <DispatchTensor as DispatchKindConversion<Flex>>::from_backend(BackendTensor::Quantized(
            quantized,
        )),
    ))
}

/// The scale that maps the block's largest magnitude to the end of the integer range, as
/// burn-flex computes it (`2·max|x| / (high - low)`); a block of zeros gets the smallest
/// positive scale instead of 0.
fn block_scale(values: &[f32], range: f32) -> f32 {
    let largest = values.iter().fold(0.0f32, |m, x| m.max(x.abs()));
    let scale = 2.0 * largest / range;
    if scale > 0.0 && scale.is_finite() {
        scale
    } else {
        f32::MIN_POSITIVE
    }
}

#[cfg(test)]
mod tests {
    use burn::tensor::{Device, Tensor, TensorData};

    use super::quantize;
    use crate::model::Precision;
    use crate::model::cpu::weights::{Factors, Ints, Weight, WeightRows};

    /// The integers and scales must equal Burn's own, so that every Burn operation on the
    /// quantized weight (and the kernels' tests against Burn) sees the same numbers.
    #[test]
    fn equals_burns_quantization_bit_for_bit() {
        let device = Device::flex();
        let scheme = Precision::Q8
            .weight_quantization(&device)
            .expect("q8 has a scheme");
        let (rows, cols) = (70, 96);
        let values: Vec<f32> = (0..rows * cols)
            .map(|i| match i / 32 % 7 {
                0 => 0.0,
                1 => 1e6 * ((i % 13) as f32 - 6.0),
                _ => ((i * 7919 % 1000) as f32 / 500.0 - 1.0) * (1 + i % 5) as f32,
            })
            .collect();
        let weight = Tensor::<2>::from_data(TensorData::new(values, [rows, cols]), &device);

        let ours = quantize(&weight, &scheme).expect("flex f32 weights in the q8 scheme");
        let burns = weight.quantize_dynamic(&scheme);
        assert_eq!(ours.dtype(), burns.dtype());
        let (ours, burns) = (Weight::of(&ours), Weight::of(&burns));
        let parts = |weight: &Option<Weight>| match weight.as_ref().and_then(Weight::rows) {
            Some(WeightRows::Integers {
                values: Ints::Bytes(values),
                scales: Factors::F32(scales),
                offsets: None,
                block,
            }) => (values.to_vec(), scales.to_vec(), block),
            _ => panic!("not 8-bit rows"),
        };
        let (ours, burns) = (parts(&ours), parts(&burns));
        assert_eq!(ours.2, burns.2);
        assert_eq!(ours.1, burns.1, "scales");
        assert_eq!(ours.0, burns.0, "integers");
    }
}
