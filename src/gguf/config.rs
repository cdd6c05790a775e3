//! The hyperparameters a GGUF file declares, gathered into one plain struct.
//!
//! The model code should not know GGUF key names, and a file that would build a wrong model
//! should be refused here, with the key named, rather than produce garbage tokens later. So
//! this reads every key once, applies llama.cpp's defaults where a key is optional, and checks
//! the relations the forward pass relies on (heads divide the width, KV heads divide heads).
//! RoPE scaling is reported, not applied or refused: whether the model supports it is the
//! model code's decision.

use super::error::{GgufError, GgufErrorKind};
use super::file::GgufFile;
use crate::model::Architecture;

/// Token embedding tensor; doubles as the output head when [`OUTPUT_TENSOR`] is absent.
pub const TOKEN_EMBD_TENSOR: &str = "token_embd.weight";
pub const OUTPUT_TENSOR: &str = "output.weight";
/// Per-dimension RoPE frequency divisors llama.cpp's converter writes for Llama 3.1-style
/// scaling instead of metadata keys.
pub const ROPE_FREQS_TENSOR: &str = "rope_freqs.weight";
/// Phi-3's LongRoPE long factors, which llama.cpp's converter writes as a tensor.
pub const LONG_ROPE_FACTORS_TENSOR: &str = "rope_factors_long.weight";

/// Hyperparameters of a model of a supported family. Keys are named here as Llama's
/// (`llama.…`); a file of another family has them under its own `general.architecture`.
#[derive(Clone, Debug, PartialEq)]
pub struct GgufConfig {
    /// `general.architecture`, one that [`Architecture::from_gguf_name`] knows.
    pub architecture: String,
    /// Context length the model was trained for (`llama.context_length`).
    pub context_length: u32,
    /// Model width (`llama.embedding_length`).
    pub embedding_length: u32,
    /// Number of transformer blocks (`llama.block_count`).
    pub block_count: u32,
    /// Hidden width of the MLP (`llama.feed_forward_length`).
    pub feed_forward_length: u32,
    /// Query heads (`llama.attention.head_count`).
    pub head_count: u32,
    /// Key/value heads (`llama.attention.head_count_kv`; defaults to `head_count`).
    pub head_count_kv: u32,
    /// Dimensions per query and key head (`llama.attention.key_length`; defaults to
    /// `embedding_length / head_count`). Qwen3's heads are wider than that.
    pub key_length: u32,
    /// RoPE base θ (`llama.rope.freq_base`; defaults to 10000).
    pub rope_freq_base: f32,
    /// RMSNorm epsilon (`llama.attention.layer_norm_rms_epsilon`).
    pub rms_norm_eps: f32,
    /// Vocabulary size (`llama.vocab_size`, else the length of `tokenizer.ggml.tokens`).
    pub vocab_size: u32,
    /// Dimensions per head that RoPE rotates (`llama.rope.dimension_count`; defaults to the
    /// head dimension).
    pub rope_dimension_count: u32,
    /// RoPE scaling, if the file declares any other than `"none"`.
    pub rope_scaling: Option<RopeScaling>,
    /// Whether the file carries a [`ROPE_FREQS_TENSOR`] (Llama 3.1-style scaling baked into
    /// per-dimension factors).
    pub has_rope_freqs_tensor: bool,
    /// The output head reuses the token embedding: there is no [`OUTPUT_TENSOR`].
    pub tied_embeddings: bool,
    /// `llama.attention.sliding_window`, where a family uses one (0 and absent: none).
    pub sliding_window: Option<u32>,
    /// Which layers slide, `llama.attention.sliding_window_pattern`: a flag per layer, or a
    /// period `n` (every `n`th layer attends to everything). Absent: the family's default.
    pub sliding_window_pattern: Option<SlidingPattern>,
    /// The RoPE base of the sliding layers (`llama.rope.freq_base_swa`).
    pub rope_freq_base_swa: Option<f32>,
    /// `llama.final_logit_softcapping`, where a family has one.
    pub final_logit_softcapping: Option<f32>,
    /// Phi-3's LongRoPE, when the file carries [`LONG_ROPE_FACTORS_TENSOR`].
    pub long_rope: Option<LongRope>,
}

/// llama.cpp's two ways of saying which layers attend through a sliding window.
#[derive(Clone, Debug, PartialEq)]
pub enum SlidingPattern {
    /// One flag per layer: true where the layer slides.
    Layers(Vec<bool>),
    /// Every `n`th layer (the last of each `n`) attends to everything, the others slide;
    /// 0: every layer slides.
    Period(u32),
}

impl SlidingPattern {
    /// Whether layer `index` attends through the window.
    pub fn slides(&self, index: usize) -> bool {
        match self {
            Self::Layers(flags) => flags.get(index).copied().unwrap_or(false),
            Self::Period(0) => true,
            &Self::Period(n) => {
                let n = n as usize;
                index % n < n - 1
            }
        }
    }
}

/// What LongRoPE needs beside its factor tensors: `llama.rope.scaling.original_context_length`
/// and `llama.rope.scaling.attn_factor`.
#[derive(Clone, Debug, PartialEq)]
pub struct LongRope {
    pub original_context_length: u32,
    pub attention_factor: Option<f32>,
}

/// RoPE scaling as declared by `llama.rope.scaling.*`.
#[derive(Clone, Debug, PartialEq)]
pub struct RopeScaling {
    /// `llama.rope.scaling.type`: `"linear"`, `"yarn"`, `"llama3"`, `"longrope"`, ...
    pub kind: String,
    pub factor: Option<f32>,
    pub original_context_length: Option<u32>,
    /// Llama 3's band edges. llama.cpp's converter does not write these (it writes
    /// [`ROPE_FREQS_TENSOR`]); other writers do, under `llama.rope.scaling.{low,high}_freq_factor`.
    pub low_freq_factor: Option<f32>,
    pub high_freq_factor: Option<f32>,
}

impl GgufConfig {
    /// Reads and checks the configuration of `file`.
    pub fn from_gguf(file: &GgufFile) -> Result<Self, GgufError> {
        let arch = file.get_str("general.architecture")?;
        if Architecture::from_gguf_name(arch).is_none() {
            return Err(file.error(GgufErrorKind::UnsupportedArchitecture {
                found: arch.to_owned(),
                supported: Architecture::supported(Architecture::gguf_name),
            }));
        }
        let key = |name: &str| format!("{arch}.{name}");
        let head_count = file.get_u32(&key("attention.head_count"))?;
        let embedding_length = file.get_u32(&key("embedding_length"))?;
        let invalid = |reason: String| file.error(GgufErrorKind::InvalidConfig { reason });
        let key_length = match file.get_u32_opt(&key("attention.key_length"))? {
            Some(length) => length,
            None if head_count != 0 && embedding_length.is_multiple_of(head_count) => {
                embedding_length / head_count
            }
            None => {
                return Err(invalid(format!(
                    "{arch}.embedding_length {embedding_length} is not a multiple of {arch}.attention.head_count {head_count}"
                )));
            }
        };
        let vocab_size = match file.get_u32_opt(&key("vocab_size"))? {
            Some(v) => v,
            None => {
                let n = file.get_str_array("tokenizer.ggml.tokens")?.len();
                u32::try_from(n).map_err(|_| invalid(format!("{n} tokens is too many")))?
            }
        };
        let config = Self {
            architecture: arch.to_owned(),
            context_length: file.get_u32(&key("context_length"))?,
            embedding_length,
            block_count: file.get_u32(&key("block_count"))?,
            feed_forward_length: file.get_u32(&key("feed_forward_length"))?,
            head_count,
            head_count_kv: file
                .get_u32_opt(&key("attention.head_count_kv"))?
                .unwrap_or(head_count),
            key_length,
            rope_freq_base: file
                .get_f32_opt(&key("rope.freq_base"))?
                .unwrap_or(10_000.0),
            rms_norm_eps: file.get_f32(&key("attention.layer_norm_rms_epsilon"))?,
            vocab_size,
            rope_dimension_count: file
                .get_u32_opt(&key("rope.dimension_count"))?
                .unwrap_or(key_length),
            rope_scaling: rope_scaling(file, arch)?,
            has_rope_freqs_tensor: file.tensor_info(ROPE_FREQS_TENSOR).is_some(),
            tied_embeddings: file.tensor_info(OUTPUT_TENSOR).is_none(),
            sliding_window: file
                .get_u32_opt(&key("attention.sliding_window"))?
                .filter(|&window| window > 0),
            sliding_window_pattern: sliding_pattern(
                file,
                &key("attention.sliding_window_pattern"),
            )?,
            rope_freq_base_swa: file.get_f32_opt(&key("rope.freq_base_swa"))?,
            final_logit_softcapping: file.get_f32_opt(&key("final_logit_softcapping"))?,
            long_rope: match file.tensor_info(LONG_ROPE_FACTORS_TENSOR) {
                None => None,
                Some(_) => Some(LongRope {
                    original_context_length: file
                        .get_u32(&key("rope.scaling.original_context_length"))?,
                    attention_factor: file.get_f32_opt(&key("rope.scaling.attn_factor"))?,
                }),
            },
        };
        config.check(file).map_err(invalid)?;
        Ok(config)
    }

    /// Dimensions per attention head.
    pub fn head_dim(&self) -> u32 {
        self.key_length
    }

    fn check(&self, file: &GgufFile) -> Result<(), String> {
        let c = self;
        let arch = &c.architecture;
        let positive = [
            ("context_length", c.context_length),
            ("block_count", c.block_count),
            ("feed_forward_length", c.feed_forward_length),
            ("attention.head_count", c.head_count),
            ("attention.head_count_kv", c.head_count_kv),
            ("attention.key_length", c.key_length),
            ("vocab_size", c.vocab_size),
            ("rope.dimension_count", c.rope_dimension_count),
        ];
        if let Some((key, _)) = positive.iter().find(|(_, v)| *v == 0) {
            return Err(format!("{arch}.{key} is 0"));
        }
        if !c.head_count.is_multiple_of(c.head_count_kv) {
            return Err(format!(
                "{arch}.attention.head_count {} is not a multiple of {arch}.attention.head_count_kv {}",
                c.head_count, c.head_count_kv
            ));
        }
        if c.rope_dimension_count > c.head_dim() || !c.rope_dimension_count.is_multiple_of(2) {
            return Err(format!(
                "{arch}.rope.dimension_count {} must be even and at most the head dimension {}",
                c.rope_dimension_count,
                c.head_dim()
            ));
        }
        if !(c.rms_norm_eps.is_finite() && c.rms_norm_eps > 0.0) {
            return Err(format!(
                "{arch}.attention.layer_norm_rms_epsilon {} is not positive",
                c.rms_norm_eps
            ));
        }
        if !(c.rope_freq_base.is_finite() && c.rope_freq_base > 0.0) {
            return Err(format!(
                "{arch}.rope.freq_base {} is not positive",
                c.rope_freq_base
            ));
        }
        // The embedding is the one tensor whose shape the vocabulary size must match; every
        // other shape is the model loader's to check.
        let embd = file
            .tensor_info(TOKEN_EMBD_TENSOR)
            .ok_or_else(|| format!("tensor {TOKEN_EMBD_TENSOR:?} is missing"))?;
        let expected = [u64::from(c.embedding_length), u64::from(c.vocab_size)];
        if embd.dims != expected {
            return Err(format!(
                "tensor {TOKEN_EMBD_TENSOR:?} has dims {:?}, expected {expected:?} (embedding_length, vocab_size)",
                embd.dims
            ));
        }
        Ok(())
    }
}

fn rope_scaling(file: &GgufFile, arch: &str) -> Result<Option<RopeScaling>, GgufError> {
    let key = |name: &str| format!("{arch}.rope.{name}");
    let kind = file.get_str_opt(&key("scaling.type"))?;
    // Before `rope.scaling.type` existed, linear scaling was written as `rope.scale_linear`.
    let legacy_linear = file.get_f32_opt(&key("scale_linear"))?;
    let factor = file.get_f32_opt(&key("scaling.factor"))?.or(legacy_linear);
    let kind = match (kind, factor) {
        (Some("none"), _) | (None, None) => return Ok(None),
        (None, Some(1.0)) => return Ok(None),
        (None, Some(_)) => "linear".to_owned(),
        (Some(k), _) => k.to_owned(),
    };
    Ok(Some(RopeScaling {
        kind,
        factor,
        original_context_length: file.get_u32_opt(&key("scaling.original_context_length"))?,
        low_freq_factor: file.get_f32_opt(&key("scaling.low_freq_factor"))?,
        high_freq_factor: file.get_f32_opt(&key("scaling.high_freq_factor"))?,
    }))
}

/// `key` as per-layer flags or as a period: llama.cpp's converter writes either.
fn sliding_pattern(file: &GgufFile, key: &str) -> Result<Option<SlidingPattern>, GgufError> {
    match file.get_bool_array_opt(key) {
        Ok(flags) => Ok(flags.map(|flags| SlidingPattern::Layers(flags.to_vec()))),
        Err(_) => Ok(file.get_u32_opt(key)?.map(SlidingPattern::Period)),
    }
}
