use burn::module::Module;
use burn::tensor::Tensor;
use burn::tensor::activation::softmax;

use super::checkpoint::{LayerRole, TensorRole};
use super::cpu::{self, HeadLayout};
use super::error::{ModelError, Result};
use super::family::Family;
use super::gpu;
use super::kv_cache::{DeviceLayer, KvCache, LayerCache};
use super::linear::Linear;
use super::loader::Loader;
use super::rms_norm::RmsNorm;
use super::rope::RopeRows;

/// Grouped-query self-attention: `num_heads` query heads share `num_kv_heads` key/value heads
/// (equal counts is MHA, one KV head is MQA).
///
/// Query heads are grouped under the KV head they share and the group is laid out along the
/// token axis, so one batched matmul per KV head serves every query head of its group without
/// copying keys and values `group` times.
#[derive(Module, Debug)]
pub struct Attention {
    qkv: Linear,
    /// Qwen3's norms of each query and key head, applied before the rotation.
    head_norms: Option<HeadNorms>,
    output: Linear,
    /// Gemma 3's norm of the output projection's result, before the residual add.
    output_norm: Option<RmsNorm>,
    /// The window of recent positions this layer attends to (Gemma 3's sliding layers).
    window: Option<usize>,
    /// Which layer's keys and values in the cache are this block's.
    layer: usize,
    num_heads: usize,
    num_kv_heads: usize,
    head_dim: usize,
}

/// An RMSNorm over each head's `head_dim` values, one weight for the query heads and one for
/// the key heads.
#[derive(Module, Debug)]
struct HeadNorms {
    query: RmsNorm,
    key: RmsNorm,
}

impl Attention {
    pub fn load(loader: &mut Loader, layer: usize, family: &Family) -> Result<Self> {
        let config = loader.config();
        let role = |role| TensorRole::Layer(layer, role);
        let parts: Vec<TensorRole> = LayerRole::query_key_value(family)
            .iter()
            .map(|&part| role(part))
            .collect();
        let mut qkv = loader.projection(&parts)?;
        if family.qkv_bias {
            let biases = [
                LayerRole::QueryBias,
                LayerRole::KeyBias,
                LayerRole::ValueBias,
            ]
            .map(|bias| loader.vector(role(bias)))
            .into_iter()
            .collect::<Result<Vec<_>>>()?;
            qkv = qkv.with_bias(Tensor::cat(biases, 0));
        }
        let head_norms = if family.qk_norm {
            Some(HeadNorms {
                query: RmsNorm::load(loader, role(LayerRole::QueryNorm))?,
                key: RmsNorm::load(loader, role(LayerRole::KeyNorm))?,
            })
        } else {
            None
        };
        let output_norm = if family.gemma_norms {
            Some(RmsNorm::load(loader, role(LayerRole::AttentionOutputNorm))?)
        } else {
            None
        };
        Ok(Self {
            qkv,
            head_norms,
            output: loader.projection(&[role(LayerRole::AttentionOutput)])?,
            output_norm,
            window: family.window(layer),
            layer,
            num_heads: config.num_attention_heads,
            num_kv_heads: config.num_kv_heads(),
            head_dim: config.head_dim(),
        })
    }

    /// `x + attention(norm(x))` for `x`: `[tokens, hidden]` at positions `cache.len()..`;
    /// `mask`: additive causal mask `[1, group · tokens, cached + tokens]` for a device cache
    /// (windowed for a layer with a window), `None` for a single token (it sees everything,
    /// or its window) or a host cache (the CPU kernel masks by position).
    pub fn add_to(
        &self,
        x: Tensor<2>,
        norm: &RmsNorm,
        rope: &RopeRows,
        cache: &mut KvCache,
        mask: Option<&Tensor<3>>,
    ) -> Result<Tensor<2>> {
        let [tokens, _] = x.dims();
        let start = cache.len();
        let qkv = self.queries_keys_values(&x, norm);
        let context = match cache.layer(self.layer, tokens) {
            LayerCache::Host(rows) => {
                let (cos, signed_sin) = rope.tables();
                let layout = self.layout();
                cpu::self_attention(&qkv, cos, signed_sin, rows, start, layout, self.window)
                    .ok_or_else(unreadable)?
            }
            // The GPU's decode kernel walks every cached position: a window it would cross
            // takes Burn's composition, which narrows the cache to it.
            LayerCache::Device(slot)
                if gpu::runs_decode_step(&qkv)
                    && self.head_dim <= gpu::MAX_HEAD_DIM
                    && self.window.is_none_or(|window| start < window) =>
            {
                slot.write_with(|keys, values| {
                    gpu::decode_attention(
                        &qkv,
                        rope.tables(),
                        (keys, values),
                        start,
                        self.num_heads,
                    )
                })
            }
            LayerCache::Device(slot) => self.attend_on_device(qkv, slot, rope, mask),
        };
        Ok(self.add_output(x, context))
    }

    /// [`Attention::add_to`] for one new token of each of several sequences on the CPU: row
    /// `i` of `x` follows `caches[i]` and turns by `ropes[i]`. The projections take every
    /// row at once, and each row comes out as it does alone (see `cpu::MATVEC_ROWS`).
    pub fn add_each(
        &self,
        x: Tensor<2>,
        norm: &RmsNorm,
        ropes: &[&RopeRows],
        caches: &mut [&mut KvCache],
    ) -> Result<Tensor<2>> {
        let qkv = self.queries_keys_values(&x, norm);
        let mut sequences = Vec::with_capacity(caches.len());
        for (cache, rope) in caches.iter_mut().zip(ropes) {
            let start = cache.len();
            let LayerCache::Host(rows) = cache.layer(self.layer, 1) else {
                return Err(ModelError::Backend(
                    "sequences are stepped together only on the CPU".into(),
                ));
            };
            let (cos, signed_sin) = rope.tables();
            sequences.push(cpu::NextToken {
                cos,
                signed_sin,
                cache: rows,
                start,
            });
        }
        let context = cpu::self_attention_each(&qkv, &mut sequences, self.layout(), self.window)
            .ok_or_else(unreadable)?;
        Ok(self.add_output(x, context))
    }

    /// The fused projection of `norm(x)`, each query and key head normalized where the
    /// family does.
    fn queries_keys_values(&self, x: &Tensor<2>, norm: &RmsNorm) -> Tensor<2> {
        let qkv = self.qkv.forward_normed(x.clone(), norm);
        match &self.head_norms {
            Some(norms) => self.normalize_heads(qkv, norms),
            None => qkv,
        }
    }

    /// `x` plus the output projection of `context`.
    fn add_output(&self, x: Tensor<2>, context: Tensor<2>) -> Tensor<2> {
        match &self.output_norm {
            Some(norm) => x + norm.forward(self.output.forward(context)),
            None => self.output.add_to(x, context),
        }
    }

    /// `[q | k | v]` with each query head and each key head normalized.
    fn normalize_heads(&self, qkv: Tensor<2>, norms: &HeadNorms) -> Tensor<2> {
        let [tokens, _] = qkv.dims();
        let (heads, kv_heads, head_dim) = (self.num_heads, self.num_kv_heads, self.head_dim);
        let per_head = |offset: usize, count: usize, norm: &RmsNorm| {
            let x = qkv
                .clone()
                .narrow(1, offset * head_dim, count * head_dim)
                .reshape([tokens * count, head_dim]);
            norm.forward(x).reshape([tokens, count * head_dim])
        };
        let queries = per_head(0, heads, &norms.query);
        let keys = per_head(heads, kv_heads, &norms.key);
        let values = qkv.narrow(1, (heads + kv_heads) * head_dim, kv_heads * head_dim);
        Tensor::cat(vec![queries, keys, values], 1)
    }

    fn layout(&self) -> HeadLayout {
        HeadLayout {
            heads: self.num_heads,
            kv_heads: self.num_kv_heads,
            head_dim: self.head_dim,
        }
    }

    /// The same attention in Burn operations, for a cache of device tensors.
    fn attend_on_device(
        &self,
        qkv: Tensor<2>,
        cache: DeviceLayer<'_>,
        rope: &RopeRows,
        mask: Option<&Tensor<3>>,
    ) -> Tensor<2> {
        let [tokens, _] = qkv.dims();
        let (heads, kv_heads, head_dim) = (self.num_heads, self.num_kv_heads, self.head_dim);
        let group = heads / kv_heads;

        let split = |offset: usize, count: usize| {
            qkv.clone()
                .narrow(1, offset * head_dim, count * head_dim)
                .reshape([tokens, count, head_dim])
                .swap_dims(0, 1)
        };
        // Queries and keys lie side by side in the fused projection: one rotation serves both.
        let qk = rope.forward(split(0, heads + kv_heads));
        let q = qk.clone().narrow(0, 0, heads);
        let k = qk.narrow(0, heads, kv_heads);
        let v = split(heads + kv_heads, kv_heads);
        let (mut keys, mut values) = cache.append(k, v);
        // One new token with a window sees only the window's positions; several get a
        // windowed mask.
        let cached = keys.dims()[1];
        if let Some(window) = self.window.filter(|&window| tokens == 1 && cached > window) {
            keys = keys.narrow(1, cached - window, window);
            values = values.narrow(1, cached - window, window);
        }

        let q = q.mul_scalar(1.0 / (head_dim as f64).sqrt()).reshape([
            kv_heads,
            group * tokens,
            head_dim,
        ]);
        let mut scores = q.matmul(keys.swap_dims(1, 2));
        if let Some(mask) = mask {
            scores = scores + mask.clone();
        }
        softmax(scores, 2)
            .matmul(values)
            .reshape([heads, tokens, head_dim])
            .swap_dims(0, 1)
            .reshape([tokens, heads * head_dim])
    }
}

/// What the CPU attention kernel's `None` means: a tensor it cannot read in place.
fn unreadable() -> ModelError {
    ModelError::Backend("the CPU attention kernel cannot read this tensor".into())
}
