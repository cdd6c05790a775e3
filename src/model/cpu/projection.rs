//! Projections `x Wᵀ` on the CPU: up to [`MATVEC_ROWS`] activation rows (the projections of
//! a decode step, for one sequence or several decoded together) stream the weight through
//! [`matvecs`]; more rows (a prompt) go to [`bf16_matmul`] when
//! both are bf16, to [`by_lane_matmul`] for weights laid out by lane (AVX2 without AVX-512),
//! to [`integer_matmul`] when the weight is integers in blocks of 32 or 16, to
//! [`float_matmul`] for float weights on AVX-512, and to [`matmul`] (gemm) otherwise.
//!
//! Any other case (the GPU, quantization schemes the kernels do not read, a strided view)
//! returns `None` and the caller uses Burn's matmul.

use burn::tensor::Tensor;
use half::bf16;

use super::cache_lines::CacheLines;
use super::host::{HostFloat, HostTensor, with_host_float};
use super::matmul::{bf16_matmul, by_lane_matmul, float_matmul, integer_matmul, matmul};
use super::matvec::matvecs;
use super::threads::filled;
use super::weights::{Weight, WeightRows};

/// The most activation rows multiplied as decode steps: each row then gets exactly the sums it
/// gets alone, whatever rows are beside it, so sequences can be decoded together (see
/// `Llama::forward_each`). The arithmetic grows with the rows while the weights are read once;
/// past eight rows, a prompt's tiles are faster.
pub const MATVEC_ROWS: usize = 8;

/// `x Wᵀ`, plus `residual` when given, for `x`: `[tokens, in]`, `W`: `[out, in]` and
/// `residual`: `[tokens, out]`; `None` when the kernels do not apply. The sum is formed in
/// f32 before it is rounded to the activations' type, once.
pub fn project(weight: &Weight, x: &Tensor<2>, residual: Option<&Tensor<2>>) -> Option<Tensor<2>> {
    let [tokens, cols] = x.dims();
    let [rows, weight_cols] = weight.dims();
    if weight_cols != cols || residual.is_some_and(|r| r.dims() != [tokens, rows]) {
        return None;
    }
    if let Weight::Stacked(parts) = weight {
        let parts = parts.iter().map(|part| project(part, x, None));
        let y = Tensor::cat(parts.collect::<Option<Vec<_>>>()?, 1);
        return Some(match residual {
            Some(residual) => y + residual.clone(),
            None => y,
        });
    }
    let weight = weight.rows()?;
    let x = HostTensor::of(x)?;
    let residual = match residual {
        Some(residual) => Some(HostTensor::of(residual)?),
        None => None,
    };
    with_host_float!(x.dtype(), E => {
        let mut y = match &residual {
            Some(residual) => widened::<E>(residual)?,
            None => filled(tokens * rows, 0.0),
        };
        let accumulate = residual.is_some();
        if tokens <= MATVEC_ROWS {
            matvecs(weight, &activations::<E>(&x)?, tokens, &mut y);
        } else if !bf16_product(weight, &x, tokens, &mut y, accumulate)
            && !by_lane_product::<E>(weight, &x, tokens, &mut y, accumulate)
        {
            let x = activations::<E>(&x)?;
            // Each tile kernel declines the other's weights.
            if !integer_matmul(weight, &x, tokens, &mut y, accumulate)
                && !float_matmul(weight, &x, tokens, &mut y, accumulate)
            {
                matmul(weight, &x, tokens, &mut y, accumulate);
            }
        }
        Some(x.tensor_like(E::narrowed(y), [tokens, rows]))
    })
}

/// A prompt's product straight from bf16 activations and weights, where the CPU can;
/// returns whether it ran.
fn bf16_product(
    weight: WeightRows<'_>,
    x: &HostTensor,
    tokens: usize,
    out: &mut [f32],
    accumulate: bool,
) -> bool {
    match (weight, x.slice::<bf16>()) {
        (WeightRows::Bf16(weight), Some(x)) => bf16_matmul(weight, x, tokens, out, accumulate),
        _ => false,
    }
}

/// A prompt's product against float weights laid out by lane, which lays the
/// activations out by lane itself, widening them as it goes: [`activations`]' copy would only
/// be copied again. Returns whether it ran.
fn by_lane_product<E: HostFloat>(
    weight: WeightRows<'_>,
    x: &HostTensor,
    tokens: usize,
    out: &mut [f32],
    accumulate: bool,
) -> bool {
    let Some(x) = x.slice::<E>() else {
        return false;
    };
    match weight {
        WeightRows::F32ByLane { values, .. } => by_lane_matmul(values, x, tokens, out, accumulate),
        WeightRows::F16ByLane { values, .. } => by_lane_matmul(values, x, tokens, out, accumulate),
        WeightRows::Bf16ByLane { values, .. } => by_lane_matmul(values, x, tokens, out, accumulate),
        _ => false,
    }
}

/// A tensor's elements in f32, the kernels' input type.
fn widened<E: HostFloat>(x: &HostTensor) -> Option<Vec<f32>> {
    Some(x.slice::<E>()?.iter().map(|&v| v.to_f32()).collect())
}

/// [`widened`] from the start of a cache line, for the activations the kernels read a
/// vector at a time.
fn activations<E: HostFloat>(x: &HostTensor) -> Option<CacheLines<f32>> {
    let x = x.slice::<E>()?;
    let mut wide = CacheLines::zeroed(x.len());
    for (wide, &v) in wide.iter_mut().zip(x) {
        *wide = v.to_f32();
    }
    Some(wide)
}

#[cfg(test)]
mod tests {
    #![allow(deprecated)] // burn-ndarray, kept on users' request.

    use burn::tensor::{Device, Tensor, TensorData};

    use super::project;
    use crate::model::Precision;
    use crate::model::cpu::Weight;

    fn tensor(rows: usize, cols: usize, seed: usize, device: &Device) -> Tensor<2> {
        let values: Vec<f32> = (0..rows * cols)
            .map(|i| (((i * 7919 + seed * 104_729) % 1000) as f32 / 500.0) - 1.0)
            .collect();
        Tensor::from_data(TensorData::new(values, [rows, cols]), device)
    }

    /// Within 1e-4 relative to the magnitude (plus one): the integer kernels round the
    /// activations to 16 bits, 1.5e-5 of each block's largest.
    fn assert_close(got: Tensor<2>, expected: Tensor<2>) {
        assert_eq!(got.dims(), expected.dims());
        let got = got.into_data().try_to_vec::<f32>().expect("f32");
        let expected = expected.into_data().try_to_vec::<f32>().expect("f32");
        for (g, e) in got.iter().zip(&expected) {
            assert!((g - e).abs() < 1e-4 * (1.0 + e.abs()), "{g} vs {e}");
        }
    }

    /// A decode row and a prompt, with and without a residual, on both CPU backends.
    #[test]
    fn float_weights_give_burns_product_plus_the_residual() {
        for device in [Device::flex(), Device::ndarray()] {
            let weight = tensor(40, 70, 3, &device);
            for tokens in [1, 5] {
                let x = tensor(tokens, 70, 4, &device);
                let residual = tensor(tokens, 40, 6, &device);
                let product = x.clone().matmul(weight.clone().transpose());
                let kernel_weight = Weight::of(&weight).expect("a host tensor");
                let got = project(&kernel_weight, &x, None).expect("the kernels take f32 weights");
                assert_close(got, product.clone());
                let got = project(&kernel_weight, &x, Some(&residual)).expect("and a residual");
                assert_close(got, product + residual);
            }
        }
    }

    /// Parts held apart, one in 4-bit blocks of 32, one in bytes in blocks of 16 with offsets
    /// and one in 6-bit blocks of 16, multiply as their dense stack does, for a decode row and
    /// a prompt.
    #[test]
    fn stacked_parts_give_the_product_of_their_dense_stack() {
        use std::sync::Arc;

        use crate::model::cpu::{BlockFactors, IntegerValues, IntegerWeights};

        let device = Device::flex();
        let cols = 64;
        let part = |rows: usize, block: usize, bits: u32, seed: usize| {
            let values: Vec<i8> = (0..rows * cols)
                .map(|i| (((i * 37 + seed * 11) % (1 << bits)) as i32 - (1 << (bits - 1))) as i8)
                .collect();
            let factors =
                |scale: f32| (0..rows * cols / block).map(move |b| scale * (1 + b % 3) as f32);
            let values = match bits {
                4 | 6 => IntegerValues::packing(&values, block),
                _ => IntegerValues::Bytes(values),
            };
            Weight::Integers(Arc::new(IntegerWeights {
                dims: [rows, cols],
                block,
                values,
                scales: BlockFactors::F32(factors(0.01).collect()),
                offsets: (bits == 8).then(|| BlockFactors::F32(factors(-0.02).collect())),
            }))
        };
        let stacked = Weight::Stacked(vec![
            part(5, 32, 4, 1),
            part(3, 16, 8, 2),
            part(4, 16, 6, 3),
        ]);
        assert_eq!(stacked.dims(), [12, cols]);
        let dense = stacked.dense(&device).expect("integer parts widen");
        for tokens in [1, 4] {
            let x = tensor(tokens, cols, 4, &device);
            let residual = tensor(tokens, 12, 6, &device);
            let product = x.clone().matmul(dense.clone().transpose());
            let got = project(&stacked, &x, Some(&residual)).expect("the kernels take the parts");
            assert_close(got, product + residual);
        }
    }

    /// Each token's outputs, bit for bit, whatever tokens it is multiplied with: alone (a
    /// decode step), beside a few (sequences decoded together), or in prompts of every length
    /// the prompt kernel takes, for every integer form: bytes in blocks of 32 and 16, 4-, 5-
    /// and 6-bit values, with and without offsets, Q6_K's stepped factors and K-type ones,
    /// rows of 18, 19 and 48 blocks (chunks of 16 with the rest, an odd last block), 4-bit and
    /// stepped 6-bit values interleaved where the CPU reads them so (4-bit ones with their
    /// factors laid out by block), with and without a residual. A prompt read as cache plus
    /// remainder, or decoded beside other sequences, gets the logits it gets alone.
    #[test]
    fn a_tokens_integer_product_does_not_depend_on_the_tokens_beside_it() {
        use std::sync::Arc;

        use half::f16;

        use crate::model::cpu::weights::INTERLEAVED_ROWS;
        use crate::model::cpu::{BlockFactors, IntegerValues, IntegerWeights, features};

        let device = Device::flex();
        let weight = |rows: usize, cols: usize, block: usize, bits: u32, offsets: bool, stepped| {
            let values: Vec<i8> = (0..rows * cols)
                .map(|i| {
                    let v = ((i * 7919 + bits as usize * 31) % (1 << bits)) as i32;
                    match offsets {
                        true => v as i8,
                        false => (v - (1 << (bits - 1))) as i8,
                    }
                })
                .collect();
            let blocks = rows * cols / block;
            let factor = |b: usize, seed: usize| {
                let v = ((b * 104_729 + seed) % 1000) as f32 / 1000.0;
                f16::from_f32(0.001 + v * 0.01).to_f32()
            };
            let scales: Vec<f32> = match stepped {
                // A base per 16 blocks times an 8-bit step, as Q6_K's (and, per 8 blocks of
                // 32, as Q4_K's).
                true => (0..blocks)
                    .map(|b| factor(b / 16, 1) * (((b * 37) % 255) as i32 - 127) as f32)
                    .collect(),
                false => (0..blocks).map(|b| factor(b, 1)).collect(),
            };
            let values = match bits {
                8 => IntegerValues::Bytes(values),
                _ => IntegerValues::packing(&values, block),
            };
            let scales = BlockFactors::F32(scales).compacted(block);
            assert_eq!(stepped, matches!(scales, BlockFactors::Scaled { .. }));
            let weights = IntegerWeights {
                dims: [rows, cols],
                block,
                values,
                scales,
                offsets: offsets
                    .then(|| BlockFactors::F32((0..blocks).map(|b| -factor(b, 2)).collect()))
                    .map(|offsets| offsets.compacted(block)),
            }
            .interleaved();
            let interleaves =
                (bits == 4 || bits == 5 || bits == 6 && stepped || bits == 8 && block == 32)
                    && rows.is_multiple_of(INTERLEAVED_ROWS)
                    && features::cpu().interleaves(bits);
            assert_eq!(
                interleaves,
                matches!(
                    weights.values,
                    IntegerValues::Interleaved { .. }
                        | IntegerValues::SixBitsInterleaved { .. }
                        | IntegerValues::FiveBitsInterleaved { .. }
                        | IntegerValues::BytesInterleaved { .. }
                )
            );
            Weight::Integers(Arc::new(weights))
        };
        let tokens = 40;
        for (rows, cols, block, bits, offsets, stepped) in [
            (37, 576, 32, 8, false, false),
            (37, 608, 32, 8, true, false),
            (48, 576, 32, 8, false, false),
            (48, 608, 32, 8, true, false),
            (37, 768, 16, 8, false, false),
            (37, 768, 16, 8, false, true),
            (37, 576, 32, 4, false, false),
            (37, 608, 32, 4, true, false),
            (48, 576, 32, 4, false, false),
            (48, 608, 32, 4, true, false),
            (48, 768, 32, 4, true, true),
            (37, 576, 32, 5, true, false),
            (37, 608, 32, 5, false, false),
            (48, 576, 32, 5, true, false),
            (48, 608, 32, 5, false, false),
            (37, 768, 16, 6, false, false),
            (37, 768, 16, 6, false, true),
            (48, 768, 16, 6, false, true),
        ] {
            let x = tensor(tokens, cols, 8, &device);
            assert_each_token_as_in_the_whole(
                &weight(rows, cols, block, bits, offsets, stepped),
                &x,
                &[1, 3, 8, 9, 15, 16, 23],
                &format!(
                    "{rows}x{cols} {bits}-bit in blocks of {block}, offsets {offsets}, \
                     stepped {stepped}"
                ),
            );
        }
    }

    /// As for integers, f32 activations against f32, f16 and bf16 weights (the default
    /// precision's path for every safetensors checkpoint and float GGUF tensor): a decode
    /// row, sequences decoded together, short prompts and prompts long enough to be read in
    /// several blocks of tokens (4,096 columns make blocks of 32).
    #[test]
    fn a_tokens_float_product_does_not_depend_on_the_tokens_beside_it() {
        use half::{bf16, f16};

        let device = Device::flex();
        let (rows, tokens) = (37, 130);
        for cols in [576, 4096] {
            let weight = tensor(rows, cols, 7, &device);
            let x = tensor(tokens, cols, 8, &device);
            let values = weight.clone().into_data().to_vec::<f32>().expect("f32");
            let halves: Vec<f16> = values.iter().map(|&v| f16::from_f32(v)).collect();
            let brains: Vec<bf16> = values.iter().map(|&v| bf16::from_f32(v)).collect();
            for (weight, what) in [
                (weight.clone(), "f32"),
                (
                    Tensor::from_data(TensorData::new(halves, [rows, cols]), &device),
                    "f16",
                ),
                (
                    Tensor::from_data(TensorData::new(brains, [rows, cols]), &device),
                    "bf16",
                ),
            ] {
                let weight = Weight::of(&weight).expect("a host tensor");
                assert_each_token_as_in_the_whole(
                    &weight,
                    &x,
                    &[1, 3, 8, 9, 33, 100],
                    &format!("{what} weights, {cols} columns"),
                );
            }
        }
    }

    /// `x`'s product with `weight`, with and without a residual, read in runs of each length
    /// of `runs` tokens: every token's outputs must have the bits they have in the product of
    /// the whole of `x`.
    fn assert_each_token_as_in_the_whole(
        weight: &Weight,
        x: &Tensor<2>,
        runs: &[usize],
        what: &str,
    ) {
        let [tokens, cols] = x.dims();
        let [rows, _] = weight.dims();
        let residual = tensor(tokens, rows, 9, &x.device());
        for residual in [None, Some(&residual)] {
            let whole = project(weight, x, residual).expect("the kernels take the weight");
            let whole = whole.into_data().to_vec::<f32>().expect("f32");
            for &run in runs {
                for first in (0..tokens).step_by(run) {
                    let len = run.min(tokens - first);
                    let part = x.clone().slice([first..first + len, 0..cols]);
                    let residual = residual.map(|r| r.clone().slice([first..first + len, 0..rows]));
                    let got = project(weight, &part, residual.as_ref()).expect("a part");
                    let got = got.into_data().to_vec::<f32>().expect("f32");
                    let want = &whole[first * rows..(first + len) * rows];
                    for (i, (g, w)) in got.iter().zip(want).enumerate() {
                        assert_eq!(
                            g.to_bits(),
                            w.to_bits(),
                            "{what}, residual {}: token {} of a run of {len}, row {}: {g} \
                             against {w}",
                            residual.is_some(),
                            first + i / rows,
                            i % rows
                        );
                    }
                }
            }
        }
    }

    /// Reading Burn's own quantized tensor checks what the kernels' unit tests cannot: that
    /// the integers and scales are laid out as the kernels assume.
    #[test]
    fn quantized_flex_weights_give_the_dequantized_product() {
        let device = Device::flex();
        let scheme = Precision::Q8
            .weight_quantization(&device)
            .expect("q8 has a scheme");
        let weight = tensor(48, 96, 1, &device).quantize_dynamic(&scheme);
        for tokens in [1, 3] {
            let x = tensor(tokens, 96, 2, &device);
            let kernel_weight = Weight::of(&weight).expect("burn-flex's q8 tensor");
            let got =
                project(&kernel_weight, &x, None).expect("the kernels take Burn's q8 weights");
            assert_close(
                got,
                x.clone().matmul(weight.clone().dequantize().transpose()),
            );
        }
    }
}
