use std::path::Path;

use burn::module::Module;
use burn::tensor::quantization::QuantScheme;
use burn::tensor::{DType, Device, Tensor, TensorData};

use super::attention::Attention;
use super::checkpoint::safetensors::SafetensorsCheckpoint;
use super::checkpoint::{Checkpoint, LayerRole, TensorRole};
use super::config::{LongRopeScaling, ModelConfig, RopeScaling};
use super::cpu;
use super::embedding::Embedding;
use super::error::{ModelError, Result};
use super::family::Family;
use super::kv_cache::KvCache;
use super::linear::Linear;
use super::loader::{LoadProgress, Loader};
use super::mlp::Mlp;
use super::precision::Precision;
use super::rms_norm::RmsNorm;
use super::rope::{FrequencyScaling, RopeRows, RotaryEmbedding};
use crate::model_files::CONFIG_FILE;

/// One transformer block: pre-norm attention and pre-norm SwiGLU, each added to the residual.
#[derive(Module, Debug)]
pub struct DecoderLayer {
    attention_norm: RmsNorm,
    attention: Attention,
    mlp_norm: RmsNorm,
    mlp: Mlp,
    /// Which of the model's rotations ([`Llama::rotations`]) this layer's queries and keys take.
    rotation: usize,
    /// The window of recent positions the layer attends to, if it has one.
    #[module(skip)]
    window: Option<usize>,
}

impl DecoderLayer {
    fn load(loader: &mut Loader, layer: usize, family: &Family) -> Result<Self> {
        let norm = |role| TensorRole::Layer(layer, role);
        let mlp_norm = if family.gemma_norms {
            LayerRole::FeedForwardNorm
        } else {
            LayerRole::MlpNorm
        };
        Ok(Self {
            attention_norm: RmsNorm::load(loader, norm(LayerRole::AttentionNorm))?,
            attention: Attention::load(loader, layer, family)?,
            mlp_norm: RmsNorm::load(loader, norm(mlp_norm))?,
            mlp: Mlp::load(loader, layer, family)?,
            rotation: GLOBAL,
            window: family.window(layer),
        })
    }

    /// `x`: `[tokens, hidden]` at positions `cache.len()..`; `mask` as [`Attention::add_to`]
    /// takes it. With `last_only`, only the last token's row goes on through the MLP and
    /// out, as the last layer's when only the last logits are wanted: every token's keys
    /// and values are still cached, and each row's sums do not depend on the rows beside
    /// it, so the row is the one the whole pass gives.
    fn forward(
        &self,
        x: Tensor<2>,
        rope: &RopeRows,
        cache: &mut KvCache,
        mask: Option<&Tensor<3>>,
        last_only: bool,
    ) -> Result<Tensor<2>> {
        // x + attention(norm(x)), then x + mlp(norm(x)); each sum is formed inside the
        // block's output projection, in the same pass as the product.
        let x = self
            .attention
            .add_to(x, &self.attention_norm, rope, cache, mask)?;
        let x = if last_only {
            let [count, _] = x.dims();
            x.narrow(0, count - 1, 1)
        } else {
            x
        };
        Ok(self.mlp.add_to(x, &self.mlp_norm))
    }

    /// [`DecoderLayer::forward`] for one new token of each of several sequences (see
    /// [`Attention::add_each`]).
    fn forward_each(
        &self,
        x: Tensor<2>,
        ropes: &[&RopeRows],
        caches: &mut [&mut KvCache],
    ) -> Result<Tensor<2>> {
        let x = self
            .attention
            .add_each(x, &self.attention_norm, ropes, caches)?;
        Ok(self.mlp.add_to(x, &self.mlp_norm))
    }
}

/// A causal language model of any supported family (Llama's block as its [`Family`] changes
/// it), written once for every Burn backend: the device it was loaded on decides where it runs.
#[derive(Module, Debug)]
pub struct Llama {
    embedding: Embedding,
    layers: Vec<DecoderLayer>,
    norm: RmsNorm,
    lm_head: Linear,
    /// The rotary embeddings the layers take, by index: the config's, then where a family
    /// needs them one of zero frequencies for layers that see no positions (SmolLM3), which
    /// rotates by angle zero and so leaves queries and keys exactly as they are, and one of
    /// the sliding layers' own base (Gemma 3).
    #[module(skip)]
    rotations: Vec<RotaryEmbedding>,
    /// What the embeddings are multiplied by (Gemma's `√hidden`).
    #[module(skip)]
    embedding_scale: Option<f64>,
    #[module(skip)]
    config: ModelConfig,
    #[module(skip)]
    dtype: DType,
}

/// [`Llama::rotations`]' index of the config's rotary embedding; the others are added as
/// layers need them.
const GLOBAL: usize = 0;

/// Which rows of logits a forward pass should produce.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Logits {
    /// One row per input token (evaluation, tests).
    All,
    /// Only the last token's row: all that generation needs, and it skips the costly vocabulary
    /// projection and the last layer's MLP for every other prompt token.
    Last,
}

impl Llama {
    /// Loads `config.json` and the safetensors weights of a checkpoint folder onto `device`,
    /// holding weights and activations in `dtype` (F32, BF16 or F16).
    pub fn load(dir: &Path, device: &Device, dtype: DType) -> Result<Self> {
        let config = ModelConfig::from_file(&dir.join(CONFIG_FILE))?;
        Self::read(
            config,
            &SafetensorsCheckpoint::open(dir)?,
            device,
            dtype,
            None,
            &mut |_| {},
        )
    }

    /// Loads at a precision the user picked: compute in its float type, and quantize the
    /// projection weights when it asks for integers.
    pub fn load_in(
        dir: &Path,
        device: &Device,
        precision: Precision,
        progress: &mut dyn FnMut(LoadProgress),
    ) -> Result<Self> {
        let config = ModelConfig::from_file(&dir.join(CONFIG_FILE))?;
        let checkpoint = SafetensorsCheckpoint::open(dir)?;
        Self::from_checkpoint(config, &checkpoint, device, precision, progress)
    }

    /// Loads the weights of any format: whatever reads them implements [`Checkpoint`].
    /// `progress` hears of each layer read, which is most of a load's time.
    pub fn from_checkpoint(
        config: ModelConfig,
        checkpoint: &dyn Checkpoint,
        device: &Device,
        precision: Precision,
        progress: &mut dyn FnMut(LoadProgress),
    ) -> Result<Self> {
        let quantization = precision.weight_quantization(device);
        Self::read(
            config,
            checkpoint,
            device,
            precision.compute_dtype(),
            quantization,
            progress,
        )
    }

    fn read(
        config: ModelConfig,
        checkpoint: &dyn Checkpoint,
        device: &Device,
        dtype: DType,
        quantization: Option<QuantScheme>,
        progress: &mut dyn FnMut(LoadProgress),
    ) -> Result<Self> {
        if !device.supports_dtype(dtype) {
            return Err(ModelError::UnsupportedComputeDtype {
                dtype: format!("{dtype:?}"),
            });
        }
        let family = config.family()?;
        let mut loader = Loader::new(checkpoint, &config, device, dtype, quantization);
        let embedding = Embedding::load(&mut loader)?;
        let count = config.num_hidden_layers;
        let mut layers = Vec::with_capacity(count);
        for layer in 0..count {
            layers.push(DecoderLayer::load(&mut loader, layer, &family)?);
            progress(LoadProgress {
                layers_read: layer + 1,
                layers: count,
            });
        }
        let norm = RmsNorm::load(&mut loader, TensorRole::FinalNorm)?;
        let lm_head = load_lm_head(&mut loader, &embedding)?;
        check_no_extra_layers(&config, checkpoint)?;

        let rope = RotaryEmbedding::new(
            config.head_dim(),
            config.rotary_dim(),
            config.rope_theta,
            frequency_scaling(&config, checkpoint)?.as_ref(),
            device,
            dtype,
        );
        let head_dim = config.head_dim();
        let mut rotations = vec![rope];
        let mut add = |rotation: RotaryEmbedding| {
            rotations.push(rotation);
            rotations.len() - 1
        };
        let identity = (0..layers.len())
            .any(|layer| !family.rotates(layer))
            .then(|| add(RotaryEmbedding::identity(head_dim, device, dtype)));
        let local = family
            .local_rope_theta
            .filter(|_| layers.iter().any(|layer| layer.window.is_some()))
            .map(|theta| {
                add(RotaryEmbedding::new(
                    head_dim, head_dim, theta, None, device, dtype,
                ))
            });
        for (index, layer) in layers.iter_mut().enumerate() {
            layer.rotation = match (family.rotates(index), layer.window, identity, local) {
                (false, _, Some(identity), _) => identity,
                (true, Some(_), _, Some(local)) => local,
                _ => GLOBAL,
            };
        }
        Ok(Self {
            embedding,
            layers,
            norm,
            lm_head,
            rotations,
            embedding_scale: family
                .gemma_norms
                .then(|| (config.hidden_size as f64).sqrt()),
            config,
            dtype,
        })
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The float type the weight matrices are held in, which can be narrower than
    /// [`Llama::dtype`] (see `Loader::storage_dtype`); 8-bit projections aside. `None` when
    /// they are a GGUF file's integers, kept as stored.
    pub fn weight_dtype(&self) -> Option<DType> {
        self.embedding.dtype()
    }

    pub fn device(&self) -> Device {
        self.embedding.device()
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
        let count = tokens.len();
        if count == 0 {
            return Err(ModelError::EmptyInput);
        }
        self.check_tokens(tokens)?;
        let start = cache.len();
        if start + count > cache.max_len() {
            return Err(ModelError::ContextOverflow {
                needed: start + count,
                limit: cache.max_len(),
            });
        }
        let mut hidden = self.embed(tokens);
        // Burn's composition on a device cache masks prompts: causally, and for layers with
        // a window also by it.
        let masked = count > 1 && !cache.is_host();
        let mask = masked.then(|| self.causal_mask(start, count, None));
        let window = self.layers.iter().find_map(|layer| layer.window);
        let windowed_mask = window
            .filter(|_| masked)
            .map(|window| self.causal_mask(start, count, Some(window)));
        let rotations: Vec<RopeRows> = self
            .rotations
            .iter()
            .map(|rotation| rotation.positions(start..start + count))
            .collect();
        // A config has at least one layer (`ModelConfig` checks).
        let last_layer = self.layers.len() - 1;
        for (index, layer) in self.layers.iter().enumerate() {
            let rope = &rotations[layer.rotation];
            let mask = match layer.window {
                Some(_) => windowed_mask.as_ref(),
                None => mask.as_ref(),
            };
            // The last layer's MLP is about 3% of a 24-layer model's prompt.
            let last_only = logits == Logits::Last && index == last_layer;
            hidden = layer.forward(hidden, rope, cache, mask, last_only)?;
        }
        cache.advance(tokens);

        let logits = self.lm_head.forward_normed(hidden, &self.norm);
        Ok(logits.cast(DType::F32))
    }

    /// One decode step of several sequences: `tokens[i]` follows what `caches[i]` holds.
    /// Returns their logits `[tokens.len(), vocab]` in f32, row `i` bit for bit the row
    /// `forward(&[tokens[i]], caches[i], Logits::Last)` gives: on the CPU each weight is read
    /// once for up to [`cpu::MATVEC_ROWS`] sequences, whose projections sum each row as
    /// they do alone, and each attends over its own cache. Elsewhere (a GPU) each sequence
    /// is stepped alone.
    pub fn forward_each(&self, tokens: &[u32], caches: &mut [&mut KvCache]) -> Result<Tensor<2>> {
        if tokens.len() != caches.len() || tokens.is_empty() {
            return Err(ModelError::EmptyInput);
        }
        let together = tokens.len() > 1 && caches.iter().all(|cache| cache.is_host());
        if !together {
            let rows = tokens
                .iter()
                .zip(caches.iter_mut())
                .map(|(&token, cache)| self.forward(&[token], cache, Logits::Last))
                .collect::<Result<Vec<_>>>()?;
            return Ok(Tensor::cat(rows, 0));
        }
        let mut rows = Vec::new();
        for (tokens, caches) in tokens
            .chunks(cpu::MATVEC_ROWS)
            .zip(caches.chunks_mut(cpu::MATVEC_ROWS))
        {
            rows.push(self.step_together(tokens, caches)?);
        }
        Ok(Tensor::cat(rows, 0))
    }

    /// [`Llama::forward_each`] for at most [`cpu::MATVEC_ROWS`] sequences on host caches.
    fn step_together(&self, tokens: &[u32], caches: &mut [&mut KvCache]) -> Result<Tensor<2>> {
        self.check_tokens(tokens)?;
        if let Some(full) = caches.iter().find(|cache| cache.len() >= cache.max_len()) {
            return Err(ModelError::ContextOverflow {
                needed: full.len() + 1,
                limit: full.max_len(),
            });
        }
        let mut hidden = self.embed(tokens);
        // Each rotation at each sequence's next position.
        let rotations: Vec<Vec<RopeRows>> = self
            .rotations
            .iter()
            .map(|rotation| {
                caches
                    .iter()
                    .map(|cache| rotation.positions(cache.len()..cache.len() + 1))
                    .collect()
            })
            .collect();
        for layer in &self.layers {
            let ropes: Vec<&RopeRows> = rotations[layer.rotation].iter().collect();
            hidden = layer.forward_each(hidden, &ropes, caches)?;
        }
        for (cache, &token) in caches.iter_mut().zip(tokens) {
            cache.advance(&[token]);
        }
        let logits = self.lm_head.forward_normed(hidden, &self.norm);
        Ok(logits.cast(DType::F32))
    }

    /// Refuses ids past the vocabulary.
    fn check_tokens(&self, tokens: &[u32]) -> Result<()> {
        let vocab_size = self.config.vocab_size;
        match tokens.iter().find(|&&id| id as usize >= vocab_size) {
            Some(&id) => Err(ModelError::TokenOutOfRange { id, vocab_size }),
            None => Ok(()),
        }
    }

    /// The embeddings of `tokens`, `[tokens, hidden]`, in the compute type.
    fn embed(&self, tokens: &[u32]) -> Tensor<2> {
        let hidden = self.embedding.forward(tokens).cast(self.dtype);
        match self.embedding_scale {
            // In the embeddings' own type, as transformers scales them.
            Some(scale) => hidden.mul_scalar(scale as f32),
            None => hidden,
        }
    }

    /// Additive mask `[1, group · count, start + count]`: query token `t` (at position
    /// `start + t`) sees keys `0..=start + t`, or with a `window` only the last `window` of
    /// them; rows repeat for each query head of a group.
    fn causal_mask(&self, start: usize, count: usize, window: Option<usize>) -> Tensor<3> {
        let total = start + count;
        let group = self.config.group_size();
        let mut values = Vec::with_capacity(group * count * total);
        for _ in 0..group {
            for t in 0..count {
                let position = start + t;
                let first = window.map_or(0, |window| (position + 1).saturating_sub(window));
                values.extend((0..total).map(|key| {
                    if (first..=position).contains(&key) {
                        0.0
                    } else {
                        f32::NEG_INFINITY
                    }
                }));
            }
        }
        Tensor::<3>::from_data(
            TensorData::new(values, [1, group * count, total]),
            &self.device(),
        )
        .cast(self.dtype)
    }
}

/// The projection onto the vocabulary: the embedding matrix itself when the config ties them.
fn load_lm_head(loader: &mut Loader, embedding: &Embedding) -> Result<Linear> {
    if loader.config().tie_word_embeddings {
        Ok(embedding.tied_head())
    } else {
        Ok(Linear::new(loader.matrix(TensorRole::LmHead)?))
    }
}

/// The config's RoPE scaling, with a GGUF file's stored factors read from its weights.
fn frequency_scaling(
    config: &ModelConfig,
    checkpoint: &dyn Checkpoint,
) -> Result<Option<FrequencyScaling>> {
    Ok(match config.rope_scaling()? {
        None => None,
        Some(RopeScaling::Llama3(scaling)) => Some(FrequencyScaling::Llama3(scaling)),
        Some(RopeScaling::LongRope(scaling)) => Some(FrequencyScaling::LongRope(scaling)),
        Some(RopeScaling::Linear(factor)) => Some(FrequencyScaling::Linear(factor)),
        Some(RopeScaling::StoredFactors) => Some(FrequencyScaling::Factors(stored_factors(
            config,
            checkpoint,
            TensorRole::RopeFactors,
        )?)),
        Some(RopeScaling::StoredLongRope {
            original_max_position_embeddings,
            attention_factor,
        }) => Some(FrequencyScaling::LongRope(LongRopeScaling {
            short_factor: stored_factors(config, checkpoint, TensorRole::ShortRopeFactors)?,
            long_factor: stored_factors(config, checkpoint, TensorRole::LongRopeFactors)?,
            original_max_position_embeddings,
            attention_factor,
        })),
    })
}

/// A GGUF file's RoPE factors tensor (one per frequency), checked.
fn stored_factors(
    config: &ModelConfig,
    checkpoint: &dyn Checkpoint,
    role: TensorRole,
) -> Result<Vec<f32>> {
    let factors = checkpoint
        .tensor(role, &role.shape(config), DType::F32, None)?
        .try_into_vec::<f32>()
        .map_err(|err| ModelError::Backend(format!("reading RoPE factors: {err:?}")))?;
    if let Some(bad) = factors.iter().find(|f| !(f.is_finite() && **f > 0.0)) {
        return Err(ModelError::UnsupportedConfig {
            field: "rope factors",
            value: format!("{bad} in {}", role.gguf_name()),
            reason: "RoPE frequency factors must be positive and finite",
        });
    }
    Ok(factors)
}

/// A checkpoint with more layers than `num_hidden_layers` means the config belongs to another
/// model; running a prefix of its layers would produce fluent-looking nonsense.
fn check_no_extra_layers(config: &ModelConfig, checkpoint: &dyn Checkpoint) -> Result<()> {
    let extra = TensorRole::Layer(config.num_hidden_layers, LayerRole::AttentionNorm);
    if checkpoint.contains(extra) {
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
        .try_into_data()
        .map_err(|err| ModelError::Backend(format!("reading logits back: {err:?}")))?
        .try_into_vec::<f32>()
        .map_err(|err| ModelError::Backend(format!("reading logits back: {err:?}")))
}
