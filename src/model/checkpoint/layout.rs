//! Every tensor of a Llama checkpoint by its role in the model, with its name in each weight
//! format and its shape from the config: the one place a tensor name is spelled.
//!
//! The model asks for roles, and each weight format's reader turns a role into its own name,
//! so a second format is a second column here and a second reader, with no change to the
//! model: `safetensors.rs` reads the first column, `gguf.rs` the second (llama.cpp's names).

use crate::model::config::ModelConfig;
use crate::model::family::Family;

/// A tensor of the model, by what it does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TensorRole {
    /// The token embeddings, which the LM head also reads when the config ties them.
    Embedding,
    /// `Layer(i, role)`: a tensor of decoder layer `i`.
    Layer(usize, LayerRole),
    /// The norm before the LM head.
    FinalNorm,
    /// Only in checkpoints whose config does not tie the head to the embedding.
    LmHead,
    /// llama.cpp's `rope_freqs.weight`: a divisor for each RoPE frequency, Llama 3's scaling
    /// in a GGUF file (a Hugging Face folder says it in `config.json` instead). Only read
    /// when the config names it.
    RopeFactors,
    /// Phi-3's LongRoPE factors in a GGUF file (`config.json` lists them instead).
    LongRopeFactors,
    ShortRopeFactors,
}

/// A tensor of one decoder layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerRole {
    AttentionNorm,
    Query,
    Key,
    Value,
    /// Qwen2's biases of the query, key and value projections.
    QueryBias,
    KeyBias,
    ValueBias,
    /// Qwen3's RMSNorm weights over each query head and each key head.
    QueryNorm,
    KeyNorm,
    /// Phi-3's query, key and value projections in one matrix, stacked in that order.
    QueryKeyValue,
    /// Phi-3's gate and up projections in one matrix, gate first.
    GateUp,
    /// Gemma 3's norms of the attention's output, of the feed-forward's input (where Llama's
    /// `post_attention_layernorm` is the latter) and of its output.
    AttentionOutputNorm,
    FeedForwardNorm,
    FeedForwardOutputNorm,
    AttentionOutput,
    MlpNorm,
    Gate,
    Up,
    Down,
}

/// One role's names: Hugging Face safetensors (`model.layers.{i}.` + name) and GGUF
/// (`blk.{i}.` + name), each followed by `.weight`, or `.bias` for a bias.
struct Names {
    safetensors: &'static str,
    gguf: &'static str,
    suffix: &'static str,
}

const fn weight(safetensors: &'static str, gguf: &'static str) -> Names {
    Names {
        safetensors,
        gguf,
        suffix: "weight",
    }
}

const fn bias(safetensors: &'static str, gguf: &'static str) -> Names {
    Names {
        safetensors,
        gguf,
        suffix: "bias",
    }
}

impl LayerRole {
    /// The roles of a layer's query, key and value projections in `family`, stacked in this
    /// order into the one matrix the model multiplies by.
    pub fn query_key_value(family: &Family) -> &'static [LayerRole] {
        if family.fused_projections {
            &[Self::QueryKeyValue]
        } else {
            &[Self::Query, Self::Key, Self::Value]
        }
    }

    /// The roles of a layer's gate and up projections in `family`, stacked likewise.
    pub fn gate_up(family: &Family) -> &'static [LayerRole] {
        if family.fused_projections {
            &[Self::GateUp]
        } else {
            &[Self::Gate, Self::Up]
        }
    }

    /// A layer's tensors in `family`: Llama's, then the family's own.
    pub fn all(family: &Family) -> Vec<LayerRole> {
        let biases = [Self::QueryBias, Self::KeyBias, Self::ValueBias];
        let norms = [Self::QueryNorm, Self::KeyNorm];
        let mut roles = vec![Self::AttentionNorm];
        roles.extend(Self::query_key_value(family));
        roles.push(Self::AttentionOutput);
        if family.gemma_norms {
            roles.extend([Self::AttentionOutputNorm, Self::FeedForwardNorm]);
        } else {
            roles.push(Self::MlpNorm);
        }
        roles.extend(Self::gate_up(family));
        roles.push(Self::Down);
        if family.gemma_norms {
            roles.push(Self::FeedForwardOutputNorm);
        }
        if family.qkv_bias {
            roles.extend(biases);
        }
        if family.qk_norm {
            roles.extend(norms);
        }
        roles
    }

    fn names(self) -> Names {
        match self {
            Self::AttentionNorm => weight("input_layernorm", "attn_norm"),
            Self::Query => weight("self_attn.q_proj", "attn_q"),
            Self::Key => weight("self_attn.k_proj", "attn_k"),
            Self::Value => weight("self_attn.v_proj", "attn_v"),
            Self::QueryBias => bias("self_attn.q_proj", "attn_q"),
            Self::KeyBias => bias("self_attn.k_proj", "attn_k"),
            Self::ValueBias => bias("self_attn.v_proj", "attn_v"),
            Self::QueryNorm => weight("self_attn.q_norm", "attn_q_norm"),
            Self::KeyNorm => weight("self_attn.k_norm", "attn_k_norm"),
            Self::QueryKeyValue => weight("self_attn.qkv_proj", "attn_qkv"),
            // llama.cpp keeps Phi-3's fused gate and up under the up projection's name.
            Self::GateUp => weight("mlp.gate_up_proj", "ffn_up"),
            Self::AttentionOutputNorm => weight("post_attention_layernorm", "post_attention_norm"),
            Self::FeedForwardNorm => weight("pre_feedforward_layernorm", "ffn_norm"),
            Self::FeedForwardOutputNorm => weight("post_feedforward_layernorm", "post_ffw_norm"),
            Self::AttentionOutput => weight("self_attn.o_proj", "attn_output"),
            Self::MlpNorm => weight("post_attention_layernorm", "ffn_norm"),
            Self::Gate => weight("mlp.gate_proj", "ffn_gate"),
            Self::Up => weight("mlp.up_proj", "ffn_up"),
            Self::Down => weight("mlp.down_proj", "ffn_down"),
        }
    }

    pub fn safetensors_name(self, layer: usize) -> String {
        let names = self.names();
        format!(
            "model.layers.{layer}.{}.{}",
            names.safetensors, names.suffix
        )
    }

    pub fn gguf_name(self, layer: usize) -> String {
        let names = self.names();
        format!("blk.{layer}.{}.{}", names.gguf, names.suffix)
    }

    /// The shape `config` implies, matrices in Hugging Face's `[out, in]` layout.
    pub fn shape(self, config: &ModelConfig) -> Vec<usize> {
        let hidden = config.hidden_size;
        let queries = config.num_attention_heads * config.head_dim();
        let keys = config.num_kv_heads() * config.head_dim();
        let inter = config.intermediate_size;
        match self {
            Self::AttentionNorm
            | Self::MlpNorm
            | Self::AttentionOutputNorm
            | Self::FeedForwardNorm
            | Self::FeedForwardOutputNorm => vec![hidden],
            Self::Query => vec![queries, hidden],
            Self::Key | Self::Value => vec![keys, hidden],
            Self::QueryBias => vec![queries],
            Self::KeyBias | Self::ValueBias => vec![keys],
            Self::QueryNorm | Self::KeyNorm => vec![config.head_dim()],
            Self::QueryKeyValue => vec![queries + 2 * keys, hidden],
            Self::GateUp => vec![2 * inter, hidden],
            Self::AttentionOutput => vec![hidden, queries],
            Self::Gate | Self::Up => vec![inter, hidden],
            Self::Down => vec![hidden, inter],
        }
    }

    /// Whether the role is a bias, which random weights draw near zero rather than one.
    pub fn is_bias(self) -> bool {
        self.names().suffix == "bias"
    }
}

impl TensorRole {
    /// Every tensor a checkpoint of `config`'s `family` holds, in the order the forward pass
    /// uses them.
    pub fn all(config: &ModelConfig, family: &Family) -> Vec<TensorRole> {
        let layer_roles = LayerRole::all(family);
        let layers = (0..config.num_hidden_layers).flat_map(|layer| {
            layer_roles
                .iter()
                .map(move |&role| TensorRole::Layer(layer, role))
        });
        let head = (!config.tie_word_embeddings).then_some(TensorRole::LmHead);
        std::iter::once(TensorRole::Embedding)
            .chain(layers)
            .chain([TensorRole::FinalNorm])
            .chain(head)
            .collect()
    }

    pub fn safetensors_name(self) -> String {
        match self {
            Self::Layer(layer, role) => role.safetensors_name(layer),
            Self::Embedding => "model.embed_tokens.weight".into(),
            Self::FinalNorm => "model.norm.weight".into(),
            Self::LmHead => "lm_head.weight".into(),
            // No Hugging Face checkpoint holds these.
            Self::RopeFactors | Self::LongRopeFactors | Self::ShortRopeFactors => self.gguf_name(),
        }
    }

    pub fn gguf_name(self) -> String {
        match self {
            Self::Layer(layer, role) => role.gguf_name(layer),
            Self::Embedding => "token_embd.weight".into(),
            Self::FinalNorm => "output_norm.weight".into(),
            Self::LmHead => "output.weight".into(),
            Self::RopeFactors => "rope_freqs.weight".into(),
            Self::LongRopeFactors => "rope_factors_long.weight".into(),
            Self::ShortRopeFactors => "rope_factors_short.weight".into(),
        }
    }

    /// The shape `config` implies, matrices in Hugging Face's `[out, in]` layout.
    pub fn shape(self, config: &ModelConfig) -> Vec<usize> {
        match self {
            Self::Layer(_, role) => role.shape(config),
            Self::Embedding | Self::LmHead => vec![config.vocab_size, config.hidden_size],
            Self::FinalNorm => vec![config.hidden_size],
            // One per rotated frequency: fewer than the head's pairs under a partial rotation.
            Self::RopeFactors | Self::LongRopeFactors | Self::ShortRopeFactors => {
                vec![config.rotary_dim() / 2]
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::TensorRole;
    use crate::model::config::ModelConfig;

    /// Two roles under one name would load one tensor twice and never read the other.
    #[test]
    fn every_role_has_its_own_name_in_each_format() {
        let config = ModelConfig::from_json(
            r#"{"hidden_size": 8, "num_hidden_layers": 2, "num_attention_heads": 2,
                "intermediate_size": 16, "vocab_size": 10, "max_position_embeddings": 4}"#,
        )
        .expect("config");
        let mut family = config.family().expect("family");
        family.qkv_bias = true;
        family.qk_norm = true;
        let roles = TensorRole::all(&config, &family);
        assert_eq!(roles.len(), 1 + 2 * 14 + 1 + 1);
        family.fused_projections = true;
        let fused = TensorRole::all(&config, &family);
        assert_eq!(fused.len(), 1 + 2 * 11 + 1 + 1);
        family.gemma_norms = true;
        let gemma = TensorRole::all(&config, &family);
        assert_eq!(gemma.len(), 1 + 2 * 13 + 1 + 1);
        for roles in [roles, fused, gemma] {
            for name in [TensorRole::safetensors_name, TensorRole::gguf_name] {
                let names: HashSet<String> = roles.iter().map(|&role| name(role)).collect();
                assert_eq!(names.len(), roles.len());
            }
        }
    }
}
