//! Llama 3's RoPE scaling in a GGUF file: llama.cpp's converter writes it as a
//! `rope_freqs.weight` tensor of per-frequency factors rather than as metadata. A tiny model
//! with those factors must give the logits of the same model with the scaling declared in
//! its metadata (the path tested against transformers), and differ from it unscaled.

use burn::tensor::{DType, Device};
use smolchat::gguf::{GgufConfig, GgufFile, qk_gguf_row};
use smolchat::model::checkpoint::gguf::GgufCheckpoint;
use smolchat::model::{Llama, Logits, ModelConfig, Precision, logits_to_vec};

use super::builder::{Builder, V};

const HIDDEN: usize = 8;
const HEADS: usize = 2;
const HEAD_DIM: usize = HIDDEN / HEADS;
const FFN: usize = 16;
const VOCAB: usize = 4;
/// Short, so that both of the head's frequencies are scaled: one blended, one divided.
const ORIGINAL_CONTEXT: f32 = 16.0;
const FACTOR: f32 = 8.0;
const LOW: f32 = 1.0;
const HIGH: f32 = 4.0;

fn values(len: usize, seed: usize) -> Vec<f32> {
    (0..len)
        .map(|i| (((i * 7919 + seed * 104_729) % 1000) as f32 / 500.0 - 1.0) * 0.5)
        .collect()
}

/// A matrix `[rows, cols]` in Hugging Face's layout, as GGUF stores it (ggml dims reversed);
/// the query and key rows in llama.cpp's order, which the reader undoes.
fn matrix(b: Builder, name: &str, rows: usize, cols: usize, seed: usize) -> Builder {
    let hf = values(rows * cols, seed);
    let mut stored = hf.clone();
    if name.contains("attn_q") || name.contains("attn_k") {
        for row in 0..rows {
            let at = qk_gguf_row(row, HEAD_DIM);
            stored[at * cols..(at + 1) * cols].copy_from_slice(&hf[row * cols..(row + 1) * cols]);
        }
    }
    b.f32_tensor(name, &[cols as u64, rows as u64], &stored)
}

fn tiny_model() -> Builder {
    let b = Builder::default()
        .kv("general.architecture", V::str("llama"))
        .kv("llama.context_length", V::U32(128))
        .kv("llama.embedding_length", V::U32(HIDDEN as u32))
        .kv("llama.block_count", V::U32(1))
        .kv("llama.feed_forward_length", V::U32(FFN as u32))
        .kv("llama.attention.head_count", V::U32(HEADS as u32))
        .kv("llama.attention.layer_norm_rms_epsilon", V::F32(1e-6))
        .kv("tokenizer.ggml.tokens", V::strs(&["a", "b", "c", "d"]))
        .f32_tensor("blk.0.attn_norm.weight", &[HIDDEN as u64], &[1.0; HIDDEN])
        .f32_tensor("blk.0.ffn_norm.weight", &[HIDDEN as u64], &[1.0; HIDDEN])
        .f32_tensor("output_norm.weight", &[HIDDEN as u64], &[1.0; HIDDEN]);
    let b = matrix(b, "token_embd.weight", VOCAB, HIDDEN, 1);
    let b = matrix(b, "blk.0.attn_q.weight", HIDDEN, HIDDEN, 2);
    let b = matrix(b, "blk.0.attn_k.weight", HIDDEN, HIDDEN, 3);
    let b = matrix(b, "blk.0.attn_v.weight", HIDDEN, HIDDEN, 4);
    let b = matrix(b, "blk.0.attn_output.weight", HIDDEN, HIDDEN, 5);
    let b = matrix(b, "blk.0.ffn_gate.weight", FFN, HIDDEN, 6);
    let b = matrix(b, "blk.0.ffn_up.weight", FFN, HIDDEN, 7);
    matrix(b, "blk.0.ffn_down.weight", HIDDEN, FFN, 8)
}

/// The factors llama.cpp's converter writes for Llama 3's scaling.
fn converter_factors() -> Vec<f32> {
    (0..HEAD_DIM / 2)
        .map(|i| {
            let inv_freq = 1.0 / 10_000f32.powf((2 * i) as f32 / HEAD_DIM as f32);
            let wavelength = 2.0 * std::f32::consts::PI / inv_freq;
            if wavelength < ORIGINAL_CONTEXT / HIGH {
                1.0
            } else if wavelength > ORIGINAL_CONTEXT / LOW {
                FACTOR
            } else {
                let smooth = (ORIGINAL_CONTEXT / wavelength - LOW) / (HIGH - LOW);
                1.0 / ((1.0 - smooth) / FACTOR + smooth)
            }
        })
        .collect()
}

/// The logits of 48 tokens, far past the original context.
fn logits(model: Builder) -> Result<Vec<f32>, String> {
    let file = GgufFile::from_bytes("tiny.gguf", model.build()).map_err(|e| e.to_string())?;
    let config = ModelConfig::from_gguf(&GgufConfig::from_gguf(&file).map_err(|e| e.to_string())?)
        .map_err(|e| e.to_string())?;
    let checkpoint = GgufCheckpoint::new(file, Some(config.head_dim()));
    let device = Device::flex();
    let model = Llama::from_checkpoint(config, &checkpoint, &device, Precision::F32, &mut |_| {})
        .map_err(|e| e.to_string())?;
    let tokens: Vec<u32> = (0..48).map(|i| (i * 3 % VOCAB) as u32).collect();
    let mut cache = model.new_cache();
    let logits = model
        .forward(&tokens, &mut cache, Logits::All)
        .map_err(|e| e.to_string())?;
    assert_eq!(logits.dtype(), DType::F32);
    logits_to_vec(logits).map_err(|e| e.to_string())
}

#[test]
fn stored_rope_factors_give_the_declared_llama3_scaling() {
    let factors = converter_factors();
    assert!(factors[0] > 1.0 && factors[0] < FACTOR && factors[1] == FACTOR);
    let stored = logits(tiny_model().f32_tensor("rope_freqs.weight", &[2], &factors)).unwrap();
    let declared = logits(
        tiny_model()
            .kv("llama.rope.scaling.type", V::str("llama3"))
            .kv("llama.rope.scaling.factor", V::F32(FACTOR))
            .kv(
                "llama.rope.scaling.original_context_length",
                V::U64(ORIGINAL_CONTEXT as u64),
            )
            .kv("llama.rope.scaling.low_freq_factor", V::F32(LOW))
            .kv("llama.rope.scaling.high_freq_factor", V::F32(HIGH)),
    )
    .unwrap();
    let plain = logits(tiny_model()).unwrap();
    let differs = |a: &[f32], b: &[f32]| {
        a.iter()
            .zip(b)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f32::max)
    };
    assert!(
        differs(&stored, &declared) < 1e-5,
        "{}",
        differs(&stored, &declared)
    );
    assert!(
        differs(&stored, &plain) > 1e-3,
        "the scaling changes the logits"
    );

    let bad = logits(tiny_model().f32_tensor("rope_freqs.weight", &[2], &[1.0, 0.0]))
        .expect_err("a zero factor is refused");
    assert!(bad.contains("rope_freqs.weight"), "{bad}");
    let short = logits(tiny_model().f32_tensor("rope_freqs.weight", &[1], &[1.0]))
        .expect_err("one factor per frequency");
    assert!(short.contains("rope_freqs.weight"), "{short}");
}
