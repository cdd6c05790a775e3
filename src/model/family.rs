//! The model families smolchat runs. Each is Llama's decoder block with a few changes, and a
//! [`Family`] says which: the block's load and forward read it, so that one model code serves
//! them all and a new family is a new row here, not a new model.

use std::fmt;

/// A family by the names its files give it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Architecture {
    /// Llama 1, 2 and 3.x, TinyLlama, SmolLM2.
    Llama,
    /// Qwen2 and Qwen2.5.
    Qwen2,
    /// Qwen3 (dense).
    Qwen3,
    SmolLm3,
    /// Phi-3, Phi-3.5 and Phi-4-mini.
    Phi3,
    /// Gemma 3's text models (`Gemma3ForCausalLM`: 270M, 1B).
    Gemma3,
}

impl Architecture {
    pub const ALL: [Self; 6] = [
        Self::Llama,
        Self::Qwen2,
        Self::Qwen3,
        Self::SmolLm3,
        Self::Phi3,
        Self::Gemma3,
    ];

    /// The class transformers names in `config.json`'s `architectures`.
    pub fn transformers_class(self) -> &'static str {
        match self {
            Self::Llama => "LlamaForCausalLM",
            Self::Qwen2 => "Qwen2ForCausalLM",
            Self::Qwen3 => "Qwen3ForCausalLM",
            Self::SmolLm3 => "SmolLM3ForCausalLM",
            Self::Phi3 => "Phi3ForCausalLM",
            Self::Gemma3 => "Gemma3ForCausalLM",
        }
    }

    /// `general.architecture` in a GGUF file, which also prefixes its hyper-parameter keys.
    pub fn gguf_name(self) -> &'static str {
        match self {
            Self::Llama => "llama",
            Self::Qwen2 => "qwen2",
            Self::Qwen3 => "qwen3",
            Self::SmolLm3 => "smollm3",
            Self::Phi3 => "phi3",
            Self::Gemma3 => "gemma3",
        }
    }

    /// Whether llama.cpp's converter reorders the query and key rows of each head, as it
    /// does for the families llama.cpp rotates in adjacent pairs rather than in halves.
    pub fn gguf_reorders_qk(self) -> bool {
        matches!(self, Self::Llama | Self::SmolLm3)
    }

    pub fn from_transformers_class(class: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|arch| arch.transformers_class() == class)
    }

    pub fn from_gguf_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|arch| arch.gguf_name() == name)
    }

    /// The names an error lists when a file names a family smolchat does not run.
    pub fn supported(names: fn(Self) -> &'static str) -> String {
        Self::ALL.map(names).join(", ")
    }
}

impl fmt::Display for Architecture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.transformers_class())
    }
}

/// How a family's decoder block differs from Llama's.
#[derive(Debug, Clone, PartialEq)]
pub struct Family {
    pub architecture: Architecture,
    /// Biases on the query, key and value projections (Qwen2); the output projection has none.
    pub qkv_bias: bool,
    /// An RMSNorm over each query head and each key head, before the rotation (Qwen3).
    pub qk_norm: bool,
    /// The query, key and value projections stored as one matrix (Phi-3's `qkv_proj`), and
    /// the gate and up projections as one (`gate_up_proj`): the very stacks the model
    /// multiplies by, read whole.
    pub fused_projections: bool,
    /// For each layer, whether its queries and keys are rotated: SmolLM3 leaves every fourth
    /// layer without positions.
    pub rotated_layers: Vec<bool>,
    /// Gemma 3's: RMSNorm weights are offsets from one (`x · (1 + w)`), the embeddings are
    /// scaled by `√hidden`, and each half of the block is normed on its way out too (after
    /// the output projection, and after the feed-forward's down projection).
    pub gemma_norms: bool,
    /// The gate's activation in the gated feed-forward.
    pub activation: Activation,
    /// For each layer, the window of recent positions it attends to, if it has one (Gemma
    /// 3's sliding layers), with its own RoPE base: `local_rope_theta`.
    pub windows: Vec<Option<usize>>,
    pub local_rope_theta: Option<f64>,
}

/// The activation of a gated feed-forward's gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// SwiGLU's `x · sigmoid(x)`.
    Silu,
    /// GELU by its tanh approximation (Gemma's `gelu_pytorch_tanh`).
    GeluTanh,
}

impl Family {
    pub fn rotates(&self, layer: usize) -> bool {
        self.rotated_layers.get(layer).copied().unwrap_or(true)
    }

    pub fn window(&self, layer: usize) -> Option<usize> {
        self.windows.get(layer).copied().flatten()
    }
}

/// SmolLM3's default: every `interval`-th layer (counting from one) is not rotated, as
/// transformers derives `no_rope_layers` from `no_rope_layer_interval` and llama.cpp from its
/// fixed step of 4.
pub fn rotated_except_every(interval: usize, layers: usize) -> Vec<bool> {
    (0..layers)
        .map(|layer| interval == 0 || !(layer + 1).is_multiple_of(interval))
        .collect()
}
