use std::path::Path;

use burn::module::{Module, Param};
use burn::tensor::quantization::QuantScheme;
use burn::tensor::{DType, Device, Int, Tensor, TensorData};

use super::attention::Attention;
use super::checkpoint::Checkpoint;
use super::config::LlamaConfig;
use super::cpu;
use super::error::{ModelError, Result};
use super::kv_cache::KvCache;
use super::linear::{Linear, project};
use super::mlp::Mlp;
use super::precision::Precision;
use super::rms_norm::RmsNorm;
use super::rope::RotaryEmbedding;
use super::weight_arena::WeightArena;

/// One transformer block: pre-norm attention and pre-norm SwiGLU, each added to the residual.
#[derive(Module, Debug)]
pub struct DecoderLayer {
    attention_norm: RmsNorm,
    attention: Attention,
    mlp_norm: RmsNorm,
    mlp: Mlp,
}

/// A Llama-architecture causal language model, written once for every Burn backend: the
/// device it was loaded on decides where it runs.
#[derive(Module, Debug)]
pub struct Llama {
    /// `[vocab, hidden]`
    embedding: Param<Tensor<2>>,
    layers: Vec<DecoderLayer>,
    norm: RmsNorm,
    /// `None` when the head is tied to the embedding matrix.
    lm_head: Option<Linear>,
    rope: RotaryEmbedding,
    #[module(skip)]
    config: LlamaConfig,
    #[module(skip)]
    dtype: DType,
}

/// Which rows of logits a forward pass should produce.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Logits {
    /// One row per input token (evaluation, tests).
    All,
    /// Only the last token's row: all that generation needs, and it skips the costly vocabulary
    /// projection for every other prompt token.
    Last,
}

impl Llama {
    /// Loads `config.json` and the safetensors weights of a checkpoint folder onto `device`,
    /// holding weights and activations in `dtype` (F32, BF16 or F16).
    pub fn load(dir: &Path, device: &Device, dtype: DType) -> Result<Self> {
        Self::read(dir, device, dtype, None)
    }

    /// Loads at a precision the user picked: compute in its float type, and quantize the
    /// projection weights when it asks for integers.
    pub fn load_in(dir: &Path, device: &Device, precision: Precision) -> Result<Self> {
        let quantization = precision.weight_quantization(device);
        Self::read(dir, device, precision.compute_dtype(), quantization)
    }

    fn read(
        dir: &Path,
        device: &Device,
        dtype: DType,
        quantization: Option<QuantScheme>,
    ) -> Result<Self> {
        let config = LlamaConfig::from_file(&dir.join("config.json"))?;
        let checkpoint = Checkpoint::open(dir)?;
        if !device.supports_dtype(dtype) {
            return Err(ModelError::UnsupportedComputeDtype {
                dtype: format!("{dtype:?}"),
            });
        }
        // On burn-flex the float weights go into one arena on huge pages (see `WeightArena`);
        // burn-ndarray would copy them out of it on every use, an accelerator copies them to
        // its own memory, and quantized weights are replaced.
        let arena = cpu::reads_shared_weights_in_place(device)
            .then(|| WeightArena::with_capacity(checkpoint.stored_values() * dtype.size()))
            .flatten();
        let mut loader = Loader {
            checkpoint: &checkpoint,
            device,
            dtype,
            arena,
            quantization,
        };
        let hidden = config.hidden_size;
        let head_dim = config.head_dim();
        let (heads, kv_heads) = (config.num_attention_heads, config.num_kv_heads());
        let inter = config.intermediate_size;
        let eps = config.rms_norm_eps;

        let layers = (0..config.num_hidden_layers)
            .map(|i| {
                let p = format!("model.layers.{i}");
                let qkv = loader.projection(&[
                    (
                        &format!("{p}.self_attn.q_proj.weight"),
                        [heads * head_dim, hidden],
                    ),
                    (
                        &format!("{p}.self_attn.k_proj.weight"),
                        [kv_heads * head_dim, hidden],
                    ),
                    (
                        &format!("{p}.self_attn.v_proj.weight"),
                        [kv_heads * head_dim, hidden],
                    ),
                ])?;
                let output = loader.projection(&[(
                    &format!("{p}.self_attn.o_proj.weight"),
                    [hidden, heads * head_dim],
                )])?;
                let gate_up = loader.projection(&[
                    (&format!("{p}.mlp.gate_proj.weight"), [inter, hidden]),
                    (&format!("{p}.mlp.up_proj.weight"), [inter, hidden]),
                ])?;
                let down = loader
                    .projection(&[(&format!("{p}.mlp.down_proj.weight"), [hidden, inter])])?;
                Ok(DecoderLayer {
                    attention_norm: RmsNorm::new(
                        loader.vector(&format!("{p}.input_layernorm.weight"), hidden)?,
                        eps,
                    ),
                    attention: Attention::new(qkv, output, heads, kv_heads, head_dim),
                    mlp_norm: RmsNorm::new(
                        loader.vector(&format!("{p}.post_attention_layernorm.weight"), hidden)?,
                        eps,
                    ),
                    mlp: Mlp::new(gate_up, down, inter),
                })
            })
            .collect::<Result<Vec<_>>>()?;

        let embedding = loader.matrix("model.embed_tokens.weight", [config.vocab_size, hidden])?;
        let lm_head = if config.tie_word_embeddings {
            None
        } else {
            Some(Linear::new(
                loader.matrix("lm_head.weight", [config.vocab_size, hidden])?,
            ))
        };
        let norm = RmsNorm::new(loader.vector("model.norm.weight", hidden)?, eps);
        check_no_extra_layers(&config, &checkpoint)?;

        let rope = RotaryEmbedding::new(
            head_dim,
            config.max_position_embeddings,
            config.rope_theta,
            device,
            dtype,
        );
        Ok(Self {
            embedding: Param::from_tensor(embedding),
            layers,
            norm,
            lm_head,
            rope,
            config,
            dtype,
        })
    }

    pub fn config(&self) -> &LlamaConfig {
        &self.config
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The float type the weight matrices are held in, which can be narrower than
    /// [`Llama::dtype`] (see `Loader::storage_dtype`); 8-bit projections aside.
    pub fn weight_dtype(&self) -> DType {
        self.embedding.val().dtype()
    }

    pub fn device(&self) -> Device {
        self.embedding.val().device()
    }

    /// An empty cache sized for this model.
    pub fn new_cache(&self) -> KvCache {
        KvCache::new(&self.config, &self.device(), self.dtype)
    }

    /// Runs `tokens` at positions `cache.len()..` and appends them to the cache.
    ///
    /// A whole prompt is one call (prefill); generation then calls with one token at a time.
    /// Returns logits `[rows, vocab]` in f32, rows as `logits` asks.
    pub fn forward(
        &self,
        tokens: &[u32],
        cache: &mut KvCache,
        logits: Logits,
    ) -> Result<Tensor<2>> {
        // The CPU backends spread each operation over rayon's pool. Called from outside the
        // pool, each of a step's ~150 operations waits for sleeping workers to wake (tens of
        // µs each, a fifth of a decode step); on a pool thread it starts at once and the
        // other workers join in.
        rayon::scope(|_| self.forward_in_pool(tokens, cache, logits))
    }

    fn forward_in_pool(
        &self,
        tokens: &[u32],
        cache: &mut KvCache,
        logits: Logits,
    ) -> Result<Tensor<2>> {
        let count = tokens.len();
        if count == 0 {
            return Err(ModelError::EmptyInput);
        }
        let vocab_size = self.config.vocab_size;
        if let Some(&id) = tokens.iter().find(|&&id| id as usize >= vocab_size) {
            return Err(ModelError::TokenOutOfRange { id, vocab_size });
        }
        let start = cache.len();
        if start + count > cache.max_len() {
            return Err(ModelError::ContextOverflow {
                needed: start + count,
                limit: cache.max_len(),
            });
        }
        let device = self.device();
        let ids = Tensor::<1, Int>::from_data(
            TensorData::new(
                tokens.iter().map(|&id| id as i64).collect::<Vec<_>>(),
                [count],
            ),
            &device,
        );
        let mut hidden = self.embedding.val().select(0, ids).cast(self.dtype);
        let mask = (count > 1 && !cache.is_host()).then(|| self.causal_mask(start, count, &device));
        // Each sub-block adds its output to the residual stream `hidden`.
        for (index, layer) in self.layers.iter().enumerate() {
            hidden = layer.attention.forward(
                layer.attention_norm.forward(hidden.clone()),
                hidden,
                index,
                &self.rope,
                cache,
                mask.as_ref(),
            )?;
            hidden = layer
                .mlp
                .forward(layer.mlp_norm.forward(hidden.clone()), hidden);
        }
        cache.advance(tokens);

        if logits == Logits::Last {
            hidden = hidden.narrow(0, count - 1, 1);
        }
        let hidden = self.norm.forward(hidden);
        let logits = match &self.lm_head {
            Some(head) => head.forward(hidden),
            None => {
                let embedding = self.embedding.val();
                let kernel_weight = cpu::Weight::of(&embedding);
                project(&embedding, kernel_weight.as_ref(), hidden, None)
            }
        };
        Ok(logits.cast(DType::F32))
    }

    /// Additive mask `[1, group · count, start + count]`: query token `t` (at position
    /// `start + t`) sees keys `0..=start + t`; rows repeat for each query head of a group.
    fn causal_mask(&self, start: usize, count: usize, device: &Device) -> Tensor<3> {
        let total = start + count;
        let group = self.config.group_size();
        let mut values = Vec::with_capacity(group * count * total);
        for _ in 0..group {
            for t in 0..count {
                values.extend((0..total).map(|key| {
                    if key <= start + t {
                        0.0
                    } else {
                        f32::NEG_INFINITY
                    }
                }));
            }
        }
        Tensor::<3>::from_data(TensorData::new(values, [1, group * count, total]), device)
            .cast(self.dtype)
    }
}

/// Reads tensors from a checkpoint straight into tensors on the target device, in the compute
/// dtype: `from_data` alone would convert them to the device's default float type.
struct Loader<'a> {
    checkpoint: &'a Checkpoint,
    device: &'a Device,
    dtype: DType,
    /// Where float weights are decoded on the CPU.
    arena: Option<WeightArena>,
    /// The integers the decoder layers' projection weights are stored in, if any. The
    /// embedding (and the LM head tied to it) stays in float: a row lookup into a
    /// block-quantized matrix would dequantize all of it on every token.
    quantization: Option<QuantScheme>,
}

impl Loader<'_> {
    fn matrix(&mut self, name: &str, shape: [usize; 2]) -> Result<Tensor<2>> {
        let dtype = self.storage_dtype(&[name]);
        let data = self
            .checkpoint
            .tensor(name, &shape, dtype, self.arena.as_mut())?;
        Ok(Tensor::from_data(data, (self.device, dtype)))
    }

    fn vector(&mut self, name: &str, len: usize) -> Result<Tensor<1>> {
        let data = self
            .checkpoint
            .tensor(name, &[len], self.dtype, self.arena.as_mut())?;
        Ok(Tensor::from_data(data, (self.device, self.dtype)))
    }

    /// A projection, its parts stacked row-wise into one matrix (e.g. q, k and v, which
    /// one fused product then multiplies by), quantized as soon as it is read so that memory
    /// never holds the float copy of more than one.
    fn projection(&mut self, parts: &[(&str, [usize; 2])]) -> Result<Linear> {
        let (arena, dtype) = match self.quantization {
            Some(_) => (None, self.dtype),
            None => {
                let names: Vec<&str> = parts.iter().map(|(name, _)| *name).collect();
                let dtype = self.storage_dtype(&names);
                (self.arena.as_mut(), dtype)
            }
        };
        let data = self.checkpoint.stacked(parts, dtype, arena)?;
        let weight = Tensor::from_data(data, (self.device, dtype));
        Ok(match &self.quantization {
            Some(scheme) => Linear::new(weight).quantized(scheme),
            None => Linear::new(weight),
        })
    }

    /// The type a weight matrix is held in: the compute type, except where that is f32 on
    /// the CPU and the checkpoint stores the weight in bf16 or f16. Widening those to f32 is
    /// exact and the CPU kernels widen each weight as they read it, so they compute the very
    /// same products from half the bytes; decode, which streams every weight once per token,
    /// runs nearly twice as fast and the model takes half the memory.
    fn storage_dtype(&self, names: &[&str]) -> DType {
        let stored: Vec<Option<DType>> = names
            .iter()
            .map(|name| self.checkpoint.stored_dtype(name))
            .collect();
        match stored.first() {
            Some(&Some(half @ (DType::BF16 | DType::F16)))
                if cpu::is_host(self.device)
                    && self.dtype == DType::F32
                    && self.device.supports_dtype(half)
                    && stored.iter().all(|&dtype| dtype == Some(half)) =>
            {
                half
            }
            _ => self.dtype,
        }
    }
}

/// A checkpoint with more layers than `num_hidden_layers` means the config belongs to another
/// model; running a prefix of its layers would produce fluent-looking nonsense.
fn check_no_extra_layers(config: &LlamaConfig, checkpoint: &Checkpoint) -> Result<()> {
    let extra = format!(
        "model.layers.{}.input_layernorm.weight",
        config.num_hidden_layers
    );
    if checkpoint.contains(&extra) {
        return Err(ModelError::UnsupportedConfig {
            field: "num_hidden_layers",
            value: config.num_hidden_layers.to_string(),
            reason: "the weights hold more layers than config.json declares",
        });
    }
    Ok(())
}

/// Reads logits back from the device as one flat row-major `Vec<f32>`.
pub fn logits_to_vec(logits: Tensor<2>) -> Result<Vec<f32>> {
    logits
        .into_data()
        .try_into_vec::<f32>()
        .map_err(|err| ModelError::Backend(format!("reading logits back: {err:?}")))
}
