use std::path::Path;

use serde::Deserialize;

use super::error::{ModelError, Result};
use super::family::{Activation, Architecture, Family, rotated_except_every};
use crate::gguf::GgufConfig;
use crate::gguf::config::SlidingPattern;

/// The hyper-parameters of a checkpoint of any supported family, in the terms of its
/// `config.json` (a GGUF file's metadata is translated into them).
///
/// Every number the model needs comes from here; nothing about SmolLM2 is hard-coded, so any
/// checkpoint of a supported family with the same file layout loads.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct ModelConfig {
    #[serde(default)]
    pub architectures: Vec<String>,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    /// Absent in older configs, which then mean plain multi-head attention.
    pub num_key_value_heads: Option<usize>,
    /// Absent in most configs, which then mean `hidden_size / num_attention_heads`.
    pub head_dim: Option<usize>,
    pub intermediate_size: usize,
    pub vocab_size: usize,
    #[serde(default = "default_rope_theta")]
    pub rope_theta: f64,
    #[serde(default = "default_rms_norm_eps")]
    pub rms_norm_eps: f64,
    pub max_position_embeddings: usize,
    #[serde(default)]
    pub tie_word_embeddings: bool,
    /// `dtype` in configs transformers 5 writes.
    #[serde(alias = "dtype")]
    pub torch_dtype: Option<String>,
    #[serde(default)]
    pub rope_scaling: Option<serde_json::Value>,
    /// transformers 5 writes `rope_theta` and the scaling together under this key; read into
    /// the two fields above (see [`ModelConfig::from_json`]).
    #[serde(default)]
    pub rope_parameters: Option<serde_json::Value>,
    #[serde(default)]
    pub hidden_act: Option<String>,
    /// The standard deviation of freshly initialised weights; used for random checkpoints.
    #[serde(default)]
    pub initializer_range: Option<f64>,
    #[serde(default)]
    pub attention_bias: bool,
    #[serde(default)]
    pub mlp_bias: bool,
    /// SmolLM3: per layer, 1 where its queries and keys are rotated and 0 where not.
    #[serde(default)]
    pub no_rope_layers: Option<Vec<u8>>,
    /// SmolLM3: without `no_rope_layers`, every this-many-th layer is not rotated (4).
    #[serde(default)]
    pub no_rope_layer_interval: Option<usize>,
    /// Qwen2/Qwen3/SmolLM3: attention over a window of recent positions in some layers.
    #[serde(default)]
    pub use_sliding_window: bool,
    /// transformers' per-layer attention kinds (`full_attention`, `sliding_attention`).
    #[serde(default)]
    pub layer_types: Option<Vec<String>>,
    /// The window of recent positions a layer attends to, where the family uses it (Phi-3
    /// always; Qwen only with `use_sliding_window`).
    #[serde(default)]
    pub sliding_window: Option<usize>,
    /// Phi-3's pretraining context, beyond which LongRoPE takes its long factors.
    #[serde(default)]
    pub original_max_position_embeddings: Option<usize>,
    /// The share of each head that RoPE rotates (Phi-4-mini's 0.75).
    #[serde(default)]
    pub partial_rotary_factor: Option<f64>,
    /// Gemma's name for `hidden_act`.
    #[serde(default)]
    pub hidden_activation: Option<String>,
    /// Gemma 3: attention scores are scaled by `query_pre_attn_scalar^-½`.
    #[serde(default)]
    pub query_pre_attn_scalar: Option<f64>,
    /// Gemma 3: the RoPE base of its sliding layers.
    #[serde(default)]
    pub rope_local_base_freq: Option<f64>,
    /// Gemma 2's caps on scores and logits (Gemma 3 has none).
    #[serde(default)]
    pub attn_logit_softcapping: Option<f64>,
    #[serde(default)]
    pub final_logit_softcapping: Option<f64>,
    /// Gemma 3's encoder-style variants attend both ways.
    #[serde(default)]
    pub use_bidirectional_attention: Option<bool>,
}

/// The `rope_type` a GGUF file's config gets when its scaling is the `rope_freqs.weight`
/// tensor (no `config.json` says it).
const STORED_FACTORS: &str = "rope_freqs.weight";
/// Likewise for Phi-3's LongRoPE, whose factors are the `rope_factors_long.weight` and
/// `rope_factors_short.weight` tensors.
const STORED_LONG_ROPE: &str = "rope_factors_long.weight";

/// A RoPE frequency scaling the model supports, as the config declares it.
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    /// `rope_type: llama3` with its parameters.
    Llama3(Llama3RopeScaling),
    /// `rope_type: longrope` (Phi-3.5, Phi-4-mini).
    LongRope(LongRopeScaling),
    /// `rope_type: linear`: every frequency divided by `factor` (Gemma 3 4B's global layers).
    Linear(f32),
    /// Llama 3's scaling as a GGUF file carries it: a factor per frequency in the weights'
    /// `rope_freqs.weight` tensor, read with them.
    StoredFactors,
    /// LongRoPE as a GGUF file carries it: the factors are tensors, read with the weights.
    StoredLongRope {
        original_max_position_embeddings: usize,
        attention_factor: f32,
    },
}

/// Llama 3's frequency scaling (`rope_type: llama3`).
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
pub struct Llama3RopeScaling {
    pub factor: f64,
    pub low_freq_factor: f64,
    pub high_freq_factor: f64,
    pub original_max_position_embeddings: f64,
}

/// Phi-3's LongRoPE, as transformers applies it: each frequency divided by its short factor,
/// or by its long one in a forward pass that reaches past the original context, and the
/// cosines and sines multiplied by `attention_factor`.
#[derive(Debug, Clone, PartialEq)]
pub struct LongRopeScaling {
    pub short_factor: Vec<f32>,
    pub long_factor: Vec<f32>,
    pub original_max_position_embeddings: usize,
    pub attention_factor: f32,
}

/// Gemma 3's kinds of layer as llama.cpp reads them from a GGUF file: without a window every
/// layer attends to everything; with one, the file's pattern, or llama.cpp's default of five
/// sliding layers to one global.
fn gemma3_layer_types(gguf: &GgufConfig) -> Vec<String> {
    let pattern = gguf
        .sliding_window_pattern
        .clone()
        .unwrap_or(SlidingPattern::Period(6));
    (0..gguf.block_count as usize)
        .map(|layer| {
            let slides = gguf.sliding_window.is_some() && pattern.slides(layer);
            if slides {
                "sliding_attention"
            } else {
                "full_attention"
            }
            .to_string()
        })
        .collect()
}

/// `query_pre_attn_scalar`, which GGUF files leave out: the head width, except for the 27B
/// model (62 layers), whose queries are scaled by the model width per head, as llama.cpp does.
fn gemma3_query_scalar(gguf: &GgufConfig) -> f64 {
    if gguf.block_count == 62 && gguf.head_count > 0 {
        f64::from(gguf.embedding_length / gguf.head_count)
    } else {
        f64::from(gguf.head_dim())
    }
}

/// The class of Gemma 3's multimodal checkpoints (4B and up), whose language model is a
/// `Gemma3ForCausalLM` described by their `text_config`.
const GEMMA3_MULTIMODAL: &str = "Gemma3ForConditionalGeneration";

/// Gemma3TextConfig's defaults in transformers, which the `text_config` of the checkpoints
/// on the hub leaves out (google/gemma-3-4b-it's names only what differs from them).
fn gemma3_text_defaults() -> serde_json::Value {
    serde_json::json!({
        "vocab_size": 262_208,
        "hidden_size": 2304,
        "intermediate_size": 9216,
        "num_hidden_layers": 26,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "hidden_activation": "gelu_pytorch_tanh",
        "max_position_embeddings": 131_072,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1_000_000.0,
        "rope_local_base_freq": 10_000.0,
        "query_pre_attn_scalar": 256,
        "sliding_window": 4096,
        "tie_word_embeddings": true,
    })
}

/// A multimodal Gemma 3 config's language model, as a `Gemma3ForCausalLM` config (its
/// weights are read without their `language_model.` prefix, see `checkpoint/safetensors.rs`);
/// any other config as it is, with its class's default for a tied head.
fn language_model_config(mut json: serde_json::Value) -> serde_json::Value {
    let names_class = |json: &serde_json::Value, name: &str| {
        json["architectures"]
            .as_array()
            .is_some_and(|classes| classes.iter().any(|class| class == name))
    };
    if !names_class(&json, GEMMA3_MULTIMODAL) {
        // transformers' Gemma 3 and SmolLM3 configs tie the head to the embedding unless
        // they say otherwise, and their checkpoints rely on it: google/gemma-3-1b-it's
        // config leaves the key out and its weights hold no `lm_head`. Every other class
        // here defaults to a head of its own.
        let tied_by_default = [Architecture::Gemma3, Architecture::SmolLm3]
            .iter()
            .any(|architecture| names_class(&json, architecture.transformers_class()));
        if let Some(fields) = json.as_object_mut().filter(|_| tied_by_default) {
            fields
                .entry("tie_word_embeddings")
                .or_insert(serde_json::Value::Bool(true));
        }
        return json;
    }
    let mut text = gemma3_text_defaults();
    if let (Some(fields), Some(given)) = (text.as_object_mut(), json["text_config"].as_object()) {
        fields.extend(given.clone());
        fields.insert(
            "architectures".into(),
            serde_json::json!([Architecture::Gemma3.transformers_class()]),
        );
        if let Some(tied) = json
            .get("tie_word_embeddings")
            .filter(|_| !given.contains_key("tie_word_embeddings"))
        {
            fields.insert("tie_word_embeddings".into(), tied.clone());
        }
    }
    text
}

fn default_rope_theta() -> f64 {
    10_000.0
}

fn default_rms_norm_eps() -> f64 {
    1e-6
}

impl ModelConfig {
    /// Llama 3's frequency scaling (`rope_type: llama3`, as Llama 3.1 and 3.2 use, or its
    /// factors stored in a GGUF file), `None` without `rope_scaling`; any other scaling is
    /// refused by name.
    pub fn rope_scaling(&self) -> Result<Option<RopeScaling>> {
        let Some(scaling) = self.rope_scaling.as_ref().filter(|v| !v.is_null()) else {
            return Ok(None);
        };
        let refuse = |reason: &'static str| ModelError::UnsupportedConfig {
            field: "rope_scaling",
            value: scaling.to_string(),
            reason,
        };
        // Older configs say `type`, newer ones `rope_type`.
        let kind = scaling
            .get("rope_type")
            .or_else(|| scaling.get("type"))
            .and_then(|kind| kind.as_str());
        match kind {
            Some("llama3") => {}
            Some(STORED_FACTORS) => return Ok(Some(RopeScaling::StoredFactors)),
            Some(STORED_LONG_ROPE) => {
                let (original, attention_factor) = self.long_rope_lengths(scaling)?;
                return Ok(Some(RopeScaling::StoredLongRope {
                    original_max_position_embeddings: original,
                    attention_factor,
                }));
            }
            Some("longrope" | "su") => {
                return self
                    .long_rope(scaling)
                    .map(|long| Some(RopeScaling::LongRope(long)));
            }
            Some("linear") => {
                let factor = scaling.get("factor").and_then(|f| f.as_f64());
                return match factor.filter(|f| f.is_finite() && *f > 0.0) {
                    Some(factor) => Ok(Some(RopeScaling::Linear(factor as f32))),
                    None => Err(refuse("linear scaling needs a positive factor")),
                };
            }
            _ => {
                return Err(refuse(
                    "only Llama 3's (rope_type llama3), Phi-3's (longrope) and linear scalings are supported among scaled RoPE variants",
                ));
            }
        }
        let parsed: Llama3RopeScaling = serde_json::from_value(scaling.clone()).map_err(|_| {
            refuse("llama3 scaling needs factor, low_freq_factor, high_freq_factor and original_max_position_embeddings")
        })?;
        let sane = parsed.factor > 0.0
            && parsed.low_freq_factor > 0.0
            && parsed.high_freq_factor > parsed.low_freq_factor
            && parsed.original_max_position_embeddings > 0.0;
        if !sane {
            return Err(refuse(
                "llama3 scaling needs positive factors with high_freq_factor above low_freq_factor",
            ));
        }
        Ok(Some(RopeScaling::Llama3(parsed)))
    }

    /// LongRoPE's parameters, with transformers' defaults: the original context from the
    /// config when the scaling does not say it, the factor from the two context lengths, and
    /// the attention factor `√(1 + ln factor / ln original)`.
    fn long_rope(&self, scaling: &serde_json::Value) -> Result<LongRopeScaling> {
        let (original, attention_factor) = self.long_rope_lengths(scaling)?;
        let refuse = |reason: &'static str| ModelError::UnsupportedConfig {
            field: "rope_scaling",
            value: scaling.to_string(),
            reason,
        };
        let factors = |key: &str| -> Result<Vec<f32>> {
            let values = scaling
                .get(key)
                .and_then(|v| v.as_array())
                .ok_or_else(|| refuse("longrope needs short_factor and long_factor lists"))?;
            let factors: Vec<f32> = values
                .iter()
                .filter_map(|v| v.as_f64())
                .map(|v| v as f32)
                .filter(|v| v.is_finite() && *v > 0.0)
                .collect();
            if factors.len() != values.len() || factors.len() != self.rotary_dim() / 2 {
                return Err(refuse(
                    "longrope needs one positive factor per pair of head dimensions",
                ));
            }
            Ok(factors)
        };
        Ok(LongRopeScaling {
            short_factor: factors("short_factor")?,
            long_factor: factors("long_factor")?,
            original_max_position_embeddings: original,
            attention_factor,
        })
    }

    /// LongRoPE's original context and attention factor.
    fn long_rope_lengths(&self, scaling: &serde_json::Value) -> Result<(usize, f32)> {
        let refuse = |reason: &'static str| ModelError::UnsupportedConfig {
            field: "rope_scaling",
            value: scaling.to_string(),
            reason,
        };
        let original = scaling
            .get("original_max_position_embeddings")
            .and_then(|v| v.as_u64())
            .map(|v| v as usize)
            .or(self.original_max_position_embeddings)
            .filter(|&original| original > 1)
            .ok_or_else(|| refuse("longrope needs original_max_position_embeddings"))?;
        let factor = scaling
            .get("factor")
            .and_then(|v| v.as_f64())
            .unwrap_or(self.max_position_embeddings as f64 / original as f64);
        let attention_factor = match scaling.get("attention_factor").and_then(|v| v.as_f64()) {
            Some(given) => given,
            None if factor <= 1.0 => 1.0,
            None => (1.0 + factor.ln() / (original as f64).ln()).sqrt(),
        };
        Ok((original, attention_factor as f32))
    }

    /// Reads and validates `config.json`; the error names the file and the offending field.
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|source| ModelError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_json(&text).map_err(|err| match err {
            ModelError::ConfigJson { source, .. } => ModelError::ConfigJson {
                path: path.to_path_buf(),
                source,
            },
            other => other,
        })
    }

    pub fn from_json(text: &str) -> Result<Self> {
        let json_error = |source| ModelError::ConfigJson {
            path: "config.json".into(),
            source,
        };
        let json: serde_json::Value = serde_json::from_str(text).map_err(json_error)?;
        let mut config: Self =
            serde_json::from_value(language_model_config(json)).map_err(json_error)?;
        config.read_rope_parameters()?;
        config.validate()?;
        Ok(config)
    }

    /// Moves transformers 5's `rope_parameters` (`rope_theta` beside the scaling's fields,
    /// `rope_type` `default` for none) into `rope_theta` and `rope_scaling`.
    fn read_rope_parameters(&mut self) -> Result<()> {
        let Some(mut parameters) = self.rope_parameters.take().filter(|v| !v.is_null()) else {
            return Ok(());
        };
        // Gemma 3's are per kind of layer: its full-attention layers' are the model's, its
        // sliding layers' give their base.
        if let Some(full) = parameters.get("full_attention").cloned() {
            self.rope_local_base_freq = parameters
                .pointer("/sliding_attention/rope_theta")
                .and_then(|theta| theta.as_f64())
                .or(self.rope_local_base_freq);
            parameters = full;
        }
        if let Some(theta) = parameters.get("rope_theta") {
            self.rope_theta = theta
                .as_f64()
                .ok_or_else(|| ModelError::UnsupportedConfig {
                    field: "rope_parameters.rope_theta",
                    value: theta.to_string(),
                    reason: "must be a number",
                })?;
        }
        if let Some(partial) = parameters.get("partial_rotary_factor") {
            self.partial_rotary_factor = partial.as_f64();
        }
        let kind = parameters
            .get("rope_type")
            .or_else(|| parameters.get("type"));
        if kind.is_some_and(|kind| kind != "default") {
            self.rope_scaling = Some(parameters);
        }
        Ok(())
    }

    /// The same facts from a GGUF file's metadata, in `config.json`'s terms, so one model code
    /// serves both formats; validated like a `config.json`.
    pub fn from_gguf(gguf: &GgufConfig) -> Result<Self> {
        let rope_scaling = gguf
            .rope_scaling
            .as_ref()
            .map(|scaling| {
                serde_json::json!({
                    "rope_type": scaling.kind,
                    "factor": scaling.factor,
                    "original_max_position_embeddings": scaling.original_context_length,
                    "low_freq_factor": scaling.low_freq_factor,
                    "high_freq_factor": scaling.high_freq_factor,
                })
            })
            .or_else(|| {
                gguf.has_rope_freqs_tensor
                    .then(|| serde_json::json!({ "rope_type": STORED_FACTORS }))
            })
            .or_else(|| {
                gguf.long_rope.as_ref().map(|long_rope| {
                    serde_json::json!({
                        "rope_type": STORED_LONG_ROPE,
                        "original_max_position_embeddings": long_rope.original_context_length,
                        "attention_factor": long_rope.attention_factor,
                    })
                })
            });
        let head_dim = gguf.head_dim() as usize;
        let architecture = Architecture::from_gguf_name(&gguf.architecture).ok_or_else(|| {
            ModelError::UnsupportedArchitecture {
                name: gguf.architecture.clone(),
                supported: Architecture::supported(Architecture::gguf_name),
            }
        })?;
        let gemma = architecture == Architecture::Gemma3;
        let config = Self {
            architectures: vec![architecture.transformers_class().into()],
            hidden_size: gguf.embedding_length as usize,
            num_hidden_layers: gguf.block_count as usize,
            num_attention_heads: gguf.head_count as usize,
            num_key_value_heads: Some(gguf.head_count_kv as usize),
            head_dim: Some(head_dim),
            intermediate_size: gguf.feed_forward_length as usize,
            vocab_size: gguf.vocab_size as usize,
            rope_theta: f64::from(gguf.rope_freq_base),
            rms_norm_eps: f64::from(gguf.rms_norm_eps),
            max_position_embeddings: gguf.context_length as usize,
            tie_word_embeddings: gguf.tied_embeddings,
            torch_dtype: None,
            rope_scaling,
            rope_parameters: None,
            hidden_act: None,
            initializer_range: None,
            attention_bias: false,
            mlp_bias: false,
            no_rope_layers: None,
            // llama.cpp's fixed step for SmolLM3; the key means nothing to other families.
            no_rope_layer_interval: (architecture == Architecture::SmolLm3).then_some(4),
            use_sliding_window: false,
            layer_types: gemma.then(|| gemma3_layer_types(gguf)),
            sliding_window: gguf.sliding_window.map(|window| window as usize),
            original_max_position_embeddings: None,
            partial_rotary_factor: (gguf.rope_dimension_count < gguf.head_dim()
                && architecture == Architecture::Phi3)
                .then(|| f64::from(gguf.rope_dimension_count) / f64::from(gguf.head_dim())),
            hidden_activation: gemma.then(|| "gelu_pytorch_tanh".into()),
            query_pre_attn_scalar: gemma.then(|| gemma3_query_scalar(gguf)),
            rope_local_base_freq: gemma
                .then(|| gguf.rope_freq_base_swa.map_or(10_000.0, f64::from)),
            attn_logit_softcapping: None,
            final_logit_softcapping: gguf.final_logit_softcapping.map(f64::from),
            use_bidirectional_attention: None,
        };
        if config.rotary_dim() != gguf.rope_dimension_count as usize {
            return Err(ModelError::UnsupportedConfig {
                field: "rope.dimension_count",
                value: gguf.rope_dimension_count.to_string(),
                reason: "RoPE over part of each head is supported for Phi-3's family only, \
                         over an even share of it",
            });
        }
        config.validate()?;
        Ok(config)
    }

    /// The family `architectures` names; a config without the field is Llama's.
    pub fn architecture(&self) -> Result<Architecture> {
        match self.architectures.first() {
            None => Ok(Architecture::Llama),
            Some(class) => Architecture::from_transformers_class(class).ok_or_else(|| {
                ModelError::UnsupportedArchitecture {
                    name: class.clone(),
                    supported: Architecture::supported(Architecture::transformers_class),
                }
            }),
        }
    }

    /// How this family's block differs from Llama's.
    pub fn family(&self) -> Result<Family> {
        let architecture = self.architecture()?;
        let layers = self.num_hidden_layers;
        let rotated_layers = match (architecture, &self.no_rope_layers) {
            (Architecture::SmolLm3, Some(flags)) => flags.iter().map(|&flag| flag != 0).collect(),
            (Architecture::SmolLm3, None) => {
                rotated_except_every(self.no_rope_layer_interval.unwrap_or(4), layers)
            }
            _ => vec![true; layers],
        };
        let gemma = architecture == Architecture::Gemma3;
        let window_of = |sliding: bool| sliding.then_some(self.sliding_window).flatten();
        let windows = match (gemma, &self.layer_types) {
            (false, _) => vec![None; layers],
            (true, Some(kinds)) => kinds
                .iter()
                .map(|kind| window_of(kind == "sliding_attention"))
                .collect(),
            // transformers' default: every sixth layer attends to everything.
            (true, None) => (0..layers)
                .map(|layer| window_of(!(layer + 1).is_multiple_of(6)))
                .collect(),
        };
        Ok(Family {
            architecture,
            qkv_bias: architecture == Architecture::Qwen2,
            qk_norm: matches!(architecture, Architecture::Qwen3 | Architecture::Gemma3),
            fused_projections: architecture == Architecture::Phi3,
            rotated_layers,
            gemma_norms: gemma,
            activation: if gemma {
                Activation::GeluTanh
            } else {
                Activation::Silu
            },
            windows,
            local_rope_theta: gemma.then(|| self.rope_local_base_freq.unwrap_or(10_000.0)),
        })
    }

    /// Each layer's window of recent positions, where it has one: the family's, or none for a
    /// config whose family cannot be read (which loading refuses first).
    pub fn layer_windows(&self) -> Vec<Option<usize>> {
        self.family()
            .map(|family| family.windows)
            .unwrap_or_else(|_| vec![None; self.num_hidden_layers])
    }

    pub fn num_kv_heads(&self) -> usize {
        self.num_key_value_heads.unwrap_or(self.num_attention_heads)
    }

    pub fn head_dim(&self) -> usize {
        self.head_dim
            .unwrap_or(self.hidden_size / self.num_attention_heads.max(1))
    }

    /// The values of each query and key head that RoPE rotates: all of them, or the share
    /// `partial_rotary_factor` gives (truncated, as transformers takes it).
    pub fn rotary_dim(&self) -> usize {
        match self.partial_rotary_factor {
            Some(share) if share < 1.0 => (self.head_dim() as f64 * share) as usize,
            _ => self.head_dim(),
        }
    }

    /// Query heads that share one key/value head (1 = MHA, all heads = MQA).
    pub fn group_size(&self) -> usize {
        self.num_attention_heads / self.num_kv_heads()
    }

    /// Rejects what the forward pass does not implement, instead of producing wrong logits.
    pub fn validate(&self) -> Result<()> {
        fn unsupported(
            field: &'static str,
            value: impl ToString,
            reason: &'static str,
        ) -> ModelError {
            ModelError::UnsupportedConfig {
                field,
                value: value.to_string(),
                reason,
            }
        }
        if self.architectures.len() > 1 {
            return Err(unsupported(
                "architectures",
                self.architectures.join(", "),
                "a checkpoint names one architecture",
            ));
        }
        let family = self.family()?;
        self.rope_scaling()?;
        let activation = self
            .hidden_activation
            .as_deref()
            .or(self.hidden_act.as_deref());
        let expected = match family.activation {
            Activation::Silu => "silu",
            Activation::GeluTanh => "gelu_pytorch_tanh",
        };
        if let Some(act) = activation.filter(|act| *act != expected) {
            return Err(unsupported(
                "hidden_act",
                act,
                "this architecture runs silu (SwiGLU), Gemma 3 gelu_pytorch_tanh",
            ));
        }
        if let Some(scalar) = self
            .query_pre_attn_scalar
            .filter(|&scalar| scalar != self.head_dim() as f64)
        {
            return Err(unsupported(
                "query_pre_attn_scalar",
                scalar,
                "scores are scaled by the head dimension; another scalar is not supported",
            ));
        }
        if self.use_bidirectional_attention == Some(true) {
            return Err(unsupported(
                "use_bidirectional_attention",
                true,
                "a chat model attends to earlier positions only",
            ));
        }
        for (field, cap) in [
            ("attn_logit_softcapping", self.attn_logit_softcapping),
            ("final_logit_softcapping", self.final_logit_softcapping),
        ] {
            if let Some(cap) = cap {
                return Err(unsupported(
                    field,
                    cap,
                    "soft-capped logits are not supported",
                ));
            }
        }
        // Qwen2's biases are its architecture's, whatever this says; elsewhere it would put
        // one on the output projection too.
        if self.attention_bias && family.architecture != Architecture::Qwen2 {
            return Err(unsupported(
                "attention_bias",
                true,
                "biased projections are not supported in this architecture",
            ));
        }
        if self.use_sliding_window {
            return Err(unsupported(
                "use_sliding_window",
                true,
                "sliding-window attention is not supported in this architecture",
            ));
        }
        let sliding_allowed = family.architecture == Architecture::Gemma3;
        if let Some(kind) = self.layer_types.iter().flatten().find(|kind| {
            !(kind.as_str() == "full_attention"
                || (sliding_allowed && kind.as_str() == "sliding_attention"))
        }) {
            return Err(unsupported(
                "layer_types",
                kind,
                "only full_attention layers (and Gemma 3's sliding_attention) are supported",
            ));
        }
        // transformers' default when `layer_types` is absent has sliding layers too.
        let slides = self
            .layer_types
            .as_ref()
            .is_none_or(|kinds| kinds.iter().any(|kind| kind == "sliding_attention"));
        if sliding_allowed && slides && self.sliding_window.is_none_or(|window| window == 0) {
            return Err(unsupported(
                "sliding_window",
                0,
                "Gemma 3's sliding layers need a positive window",
            ));
        }
        if family.windows.len() != self.num_hidden_layers {
            return Err(unsupported(
                "layer_types",
                family.windows.len(),
                "needs one entry per layer",
            ));
        }
        if family.architecture == Architecture::Phi3
            && let Some(window) = self
                .sliding_window
                .filter(|&window| window < self.max_position_embeddings)
        {
            return Err(unsupported(
                "sliding_window",
                window,
                "sliding-window attention is not supported in this architecture",
            ));
        }
        if let Some(partial) = self.partial_rotary_factor {
            let rotary = self.rotary_dim();
            if !(partial > 0.0 && partial <= 1.0) || rotary == 0 || !rotary.is_multiple_of(2) {
                return Err(unsupported(
                    "partial_rotary_factor",
                    partial,
                    "must rotate an even, positive number of each head's values",
                ));
            }
        }
        if family.rotated_layers.len() != self.num_hidden_layers {
            return Err(unsupported(
                "no_rope_layers",
                family.rotated_layers.len(),
                "needs one entry per layer",
            ));
        }
        if self.mlp_bias {
            return Err(unsupported(
                "mlp_bias",
                true,
                "biased projections are not supported",
            ));
        }
        for (field, value) in [
            ("hidden_size", self.hidden_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_kv_heads()),
            ("intermediate_size", self.intermediate_size),
            ("vocab_size", self.vocab_size),
            ("max_position_embeddings", self.max_position_embeddings),
        ] {
            if value == 0 {
                return Err(unsupported(field, 0, "must be positive"));
            }
        }
        if self.head_dim.is_none() && !self.hidden_size.is_multiple_of(self.num_attention_heads) {
            return Err(unsupported(
                "hidden_size",
                self.hidden_size,
                "must be divisible by num_attention_heads",
            ));
        }
        if self.head_dim() == 0 || !self.head_dim().is_multiple_of(2) {
            return Err(unsupported(
                "head_dim",
                self.head_dim(),
                "must be a positive even number",
            ));
        }
        if !self.num_attention_heads.is_multiple_of(self.num_kv_heads()) {
            return Err(unsupported(
                "num_key_value_heads",
                self.num_kv_heads(),
                "must divide num_attention_heads",
            ));
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 0.0) {
            return Err(unsupported(
                "rope_theta",
                self.rope_theta,
                "must be a positive number",
            ));
        }
        // Zero is refused as a GGUF file's is: a row of zeros would then divide by zero.
        if !(self.rms_norm_eps.is_finite() && self.rms_norm_eps > 0.0) {
            return Err(unsupported(
                "rms_norm_eps",
                self.rms_norm_eps,
                "must be a positive number",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMOLLM2: &str = include_str!("../../tests/fixtures/smollm2-135m-instruct/config.json");

    fn with(field: &str, value: serde_json::Value) -> String {
        let mut json: serde_json::Value = serde_json::from_str(SMOLLM2).expect("fixture is JSON");
        json[field] = value;
        json.to_string()
    }

    fn rejected_field(json: &str) -> &'static str {
        match ModelConfig::from_json(json) {
            Err(ModelError::UnsupportedConfig { field, .. }) => field,
            other => panic!("expected an unsupported-config error, got {other:?}"),
        }
    }

    /// llama.cpp's default for Gemma 3 files that name no pattern: five sliding layers, then
    /// one global, as google/gemma-3-1b-it's 26 layers are; none slide without a window.
    #[test]
    fn gemma3_gguf_layers_follow_llama_cpps_default_pattern() {
        let mut gguf = GgufConfig {
            architecture: "gemma3".into(),
            context_length: 32768,
            embedding_length: 1152,
            block_count: 26,
            feed_forward_length: 6912,
            head_count: 4,
            head_count_kv: 1,
            key_length: 256,
            rope_freq_base: 1_000_000.0,
            rms_norm_eps: 1e-6,
            vocab_size: 262_144,
            rope_dimension_count: 256,
            rope_scaling: None,
            has_rope_freqs_tensor: false,
            tied_embeddings: true,
            sliding_window: Some(512),
            sliding_window_pattern: None,
            rope_freq_base_swa: None,
            final_logit_softcapping: None,
            long_rope: None,
        };
        let config = ModelConfig::from_gguf(&gguf).expect("config");
        let global: Vec<usize> = (0..26)
            .filter(|&i| config.layer_types.as_ref().expect("types")[i] == "full_attention")
            .collect();
        assert_eq!(global, [5, 11, 17, 23]);
        assert_eq!(config.rope_local_base_freq, Some(10_000.0));
        assert_eq!(config.query_pre_attn_scalar, Some(256.0));
        gguf.sliding_window_pattern = Some(SlidingPattern::Period(2));
        let config = ModelConfig::from_gguf(&gguf).expect("config");
        assert_eq!(
            config.layer_types.as_ref().expect("types")[..3],
            ["sliding_attention", "full_attention", "sliding_attention"]
        );
        gguf.sliding_window = None;
        let config = ModelConfig::from_gguf(&gguf).expect("config");
        assert!(
            config
                .layer_types
                .expect("types")
                .iter()
                .all(|kind| kind == "full_attention")
        );
    }

    #[test]
    fn reads_smollm2_config() {
        let config = ModelConfig::from_json(SMOLLM2).expect("valid config");
        assert_eq!(config.hidden_size, 576);
        assert_eq!(config.num_hidden_layers, 30);
        assert_eq!(config.num_attention_heads, 9);
        assert_eq!(config.num_kv_heads(), 3);
        assert_eq!(config.head_dim(), 64);
        assert_eq!(config.group_size(), 3);
        assert_eq!(config.intermediate_size, 1536);
        assert_eq!(config.vocab_size, 49152);
        assert_eq!(config.max_position_embeddings, 8192);
        assert_eq!(config.rope_theta, 100_000.0);
        assert_eq!(config.rms_norm_eps, 1e-5);
        assert!(config.tie_word_embeddings);
        assert_eq!(config.torch_dtype.as_deref(), Some("bfloat16"));
    }

    #[test]
    fn explicit_head_dim_and_missing_kv_heads() {
        let mut json: serde_json::Value = serde_json::from_str(SMOLLM2).expect("fixture is JSON");
        json["head_dim"] = 32.into();
        json.as_object_mut()
            .expect("object")
            .remove("num_key_value_heads");
        let config = ModelConfig::from_json(&json.to_string()).expect("valid config");
        assert_eq!(config.head_dim(), 32);
        assert_eq!(config.num_kv_heads(), 9);
        assert_eq!(config.group_size(), 1);
    }

    #[test]
    fn rejects_other_architectures() {
        let json = with("architectures", serde_json::json!(["MistralForCausalLM"]));
        let message = ModelConfig::from_json(&json).unwrap_err().to_string();
        assert!(message.contains("MistralForCausalLM"), "{message}");
        assert!(message.contains("Qwen3ForCausalLM"), "{message}");
    }

    #[test]
    fn each_family_reads_its_changes_from_config_json() {
        let family = |class: &str, extra: serde_json::Value| {
            let mut json: serde_json::Value = serde_json::from_str(SMOLLM2).expect("JSON");
            json["architectures"] = serde_json::json!([class]);
            json["num_hidden_layers"] = 8.into();
            for (key, value) in extra.as_object().expect("object") {
                json[key] = value.clone();
            }
            ModelConfig::from_json(&json.to_string())
                .and_then(|config| config.family())
                .expect("a supported family")
        };
        let qwen2 = family("Qwen2ForCausalLM", serde_json::json!({}));
        assert!(qwen2.qkv_bias && !qwen2.qk_norm);
        let qwen3 = family("Qwen3ForCausalLM", serde_json::json!({"head_dim": 128}));
        assert!(qwen3.qk_norm && !qwen3.qkv_bias);
        let smollm3 = family("SmolLM3ForCausalLM", serde_json::json!({}));
        let unrotated: Vec<usize> = (0..8).filter(|&layer| !smollm3.rotates(layer)).collect();
        assert_eq!(unrotated, [3, 7]);
        let listed = family(
            "SmolLM3ForCausalLM",
            serde_json::json!({"no_rope_layers": [0, 1, 1, 1, 1, 1, 1, 1]}),
        );
        assert!(!listed.rotates(0) && listed.rotates(3));
    }

    #[test]
    fn refuses_what_the_families_do_not_implement_yet() {
        let mut json: serde_json::Value = serde_json::from_str(SMOLLM2).expect("JSON");
        json["architectures"] = serde_json::json!(["Qwen2ForCausalLM"]);
        json["use_sliding_window"] = true.into();
        assert_eq!(rejected_field(&json.to_string()), "use_sliding_window");
        json["use_sliding_window"] = false.into();
        json["layer_types"] = serde_json::json!(vec!["sliding_attention"; 30]);
        assert_eq!(rejected_field(&json.to_string()), "layer_types");
        let mut json: serde_json::Value = serde_json::from_str(SMOLLM2).expect("JSON");
        json["architectures"] = serde_json::json!(["SmolLM3ForCausalLM"]);
        json["no_rope_layers"] = serde_json::json!([1, 1, 0]);
        assert_eq!(rejected_field(&json.to_string()), "no_rope_layers");
        json["no_rope_layers"] = serde_json::Value::Null;
        json["attention_bias"] = true.into();
        assert_eq!(rejected_field(&json.to_string()), "attention_bias");
        // Phi-3-mini-4k attends to a window of 2047 of its 4096 positions; Phi-3.5's window is
        // wider than its context, which is no window at all.
        let mut json: serde_json::Value = serde_json::from_str(SMOLLM2).expect("JSON");
        json["architectures"] = serde_json::json!(["Phi3ForCausalLM"]);
        json["sliding_window"] = 2047.into();
        assert_eq!(rejected_field(&json.to_string()), "sliding_window");
        json["sliding_window"] = 262_144.into();
        assert!(ModelConfig::from_json(&json.to_string()).is_ok());
        json["partial_rotary_factor"] = 0.75.into();
        let config = ModelConfig::from_json(&json.to_string()).expect("Phi-4-mini's share");
        assert_eq!(config.rotary_dim(), 48);
        json["partial_rotary_factor"] = 0.0.into();
        assert_eq!(rejected_field(&json.to_string()), "partial_rotary_factor");
    }

    /// A head tied to the embedding where the config leaves `tie_word_embeddings` out, as
    /// transformers' classes have it: Gemma 3's and SmolLM3's tie, the others do not.
    #[test]
    fn an_unnamed_tie_follows_the_class_default() {
        let config = |class: &str, tie: Option<bool>| {
            let mut json: serde_json::Value = serde_json::from_str(SMOLLM2).expect("JSON");
            json["architectures"] = serde_json::json!([class]);
            if class.starts_with("Gemma3") {
                json["sliding_window"] = 512.into();
                json["hidden_activation"] = "gelu_pytorch_tanh".into();
                json["hidden_act"] = "gelu_pytorch_tanh".into();
            }
            match (json.as_object_mut(), tie) {
                (Some(fields), None) => _ = fields.remove("tie_word_embeddings"),
                (_, Some(tie)) => json["tie_word_embeddings"] = tie.into(),
                (None, None) => unreachable!("the fixture is an object"),
            }
            ModelConfig::from_json(&json.to_string()).expect("valid")
        };
        assert!(config("Gemma3ForCausalLM", None).tie_word_embeddings);
        assert!(config("SmolLM3ForCausalLM", None).tie_word_embeddings);
        assert!(!config("Gemma3ForCausalLM", Some(false)).tie_word_embeddings);
        assert!(!config("LlamaForCausalLM", None).tie_word_embeddings);
        assert!(!config("Qwen3ForCausalLM", None).tie_word_embeddings);
    }

    /// google/gemma-3-4b-it's config names only what differs from Gemma3TextConfig's
    /// defaults; its language model is read with them.
    #[test]
    fn a_multimodal_gemma3_config_gives_its_language_model() {
        let json = r#"{"architectures": ["Gemma3ForConditionalGeneration"],
            "model_type": "gemma3", "vision_config": {"hidden_size": 1152},
            "text_config": {"hidden_size": 2560, "intermediate_size": 10240,
                "model_type": "gemma3_text", "num_hidden_layers": 34,
                "rope_scaling": {"factor": 8.0, "rope_type": "linear"}, "sliding_window": 1024}}"#;
        let config = ModelConfig::from_json(json).expect("valid");
        let family = config.family().expect("family");
        assert_eq!(family.architecture, Architecture::Gemma3);
        assert_eq!(
            (
                config.hidden_size,
                config.num_hidden_layers,
                config.head_dim()
            ),
            (2560, 34, 256)
        );
        assert_eq!(config.vocab_size, 262_208);
        assert!(config.tie_word_embeddings);
        assert!(matches!(
            config.rope_scaling(),
            Ok(Some(RopeScaling::Linear(factor))) if factor == 8.0
        ));
        let windows: Vec<Option<usize>> = family.windows;
        assert_eq!(
            windows.iter().filter(|w| w.is_none()).count(),
            5,
            "every sixth layer"
        );
        assert_eq!(windows[0], Some(1024));
    }

    /// `rms_norm_eps` 0 was accepted from config.json and refused from GGUF.
    #[test]
    fn rms_norm_eps_must_be_positive_in_either_format() {
        assert_eq!(
            rejected_field(&with("rms_norm_eps", 0.0.into())),
            "rms_norm_eps"
        );
        assert_eq!(
            rejected_field(&with("rms_norm_eps", (-1e-6).into())),
            "rms_norm_eps"
        );
    }

    #[test]
    fn reads_transformers_5_rope_parameters() {
        let mut json: serde_json::Value = serde_json::from_str(SMOLLM2).expect("JSON");
        json.as_object_mut().expect("object").remove("rope_theta");
        json["rope_parameters"] = serde_json::json!({"rope_theta": 1e6, "rope_type": "default"});
        let config = ModelConfig::from_json(&json.to_string()).expect("valid");
        assert_eq!(config.rope_theta, 1e6);
        assert_eq!(config.rope_scaling().expect("no scaling"), None);
        json["rope_parameters"] = serde_json::json!({
            "rope_theta": 5e5, "rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192
        });
        let config = ModelConfig::from_json(&json.to_string()).expect("valid");
        assert_eq!(config.rope_theta, 5e5);
        assert!(matches!(
            config.rope_scaling(),
            Ok(Some(RopeScaling::Llama3(_)))
        ));
    }

    #[test]
    fn accepts_llama3_rope_scaling_and_rejects_the_others() {
        let json = with(
            "rope_scaling",
            serde_json::json!({"type": "yarn", "factor": 2.0}),
        );
        assert_eq!(rejected_field(&json), "rope_scaling");
        let llama3 = serde_json::json!({
            "rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192
        });
        let config = ModelConfig::from_json(&with("rope_scaling", llama3.clone())).unwrap();
        assert_eq!(
            config.rope_scaling().unwrap(),
            Some(RopeScaling::Llama3(Llama3RopeScaling {
                factor: 32.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_position_embeddings: 8192.0,
            }))
        );
        let gguf_factors = serde_json::json!({"rope_type": "rope_freqs.weight"});
        let config = ModelConfig::from_json(&with("rope_scaling", gguf_factors)).unwrap();
        assert_eq!(
            config.rope_scaling().unwrap(),
            Some(RopeScaling::StoredFactors)
        );
        let mut incomplete = llama3;
        incomplete
            .as_object_mut()
            .unwrap()
            .remove("high_freq_factor");
        assert_eq!(
            rejected_field(&with("rope_scaling", incomplete)),
            "rope_scaling"
        );
    }

    #[test]
    fn rejects_hidden_not_divisible_by_heads() {
        assert_eq!(
            rejected_field(&with("num_attention_heads", 7.into())),
            "hidden_size"
        );
    }

    #[test]
    fn rejects_heads_not_divisible_by_kv_heads() {
        let message = ModelConfig::from_json(&with("num_key_value_heads", 2.into()))
            .unwrap_err()
            .to_string();
        assert!(message.contains("num_key_value_heads = 2"), "{message}");
    }

    #[test]
    fn rejects_biases_and_other_activations() {
        assert_eq!(
            rejected_field(&with("attention_bias", true.into())),
            "attention_bias"
        );
        assert_eq!(
            rejected_field(&with("hidden_act", "gelu".into())),
            "hidden_act"
        );
    }

    #[test]
    fn malformed_json_names_the_file() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("config.json");
        std::fs::write(&path, "{ not json").expect("write");
        let message = ModelConfig::from_file(&path).unwrap_err().to_string();
        assert!(message.contains(&path.display().to_string()), "{message}");
    }
}
