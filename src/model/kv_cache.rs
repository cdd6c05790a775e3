use burn::tensor::{DType, Device, Tensor};

use super::config::LlamaConfig;

/// Cached keys and values of every layer for the tokens seen so far.
///
/// Storage is allocated in blocks and grows by doubling, up to the model's context length, so
/// a short chat does not pay for 8192 positions and a long one is still bounded. New entries
/// are written in place; reading returns views of the filled prefix, never a concatenated copy.
/// Truncating to a prefix is free: the chat engine does it when an edited message makes the
/// conversation diverge from what the cache holds.
#[derive(Debug)]
pub struct KvCache {
    layers: Vec<Option<LayerCache>>,
    /// The token ids whose keys and values are cached, so that a new prompt can reuse the
    /// longest common prefix.
    tokens: Vec<u32>,
    max_len: usize,
    kv_heads: usize,
    head_dim: usize,
    dtype: DType,
    device: Device,
}

#[derive(Debug)]
struct LayerCache {
    /// `[kv_heads, capacity, head_dim]`
    keys: Tensor<3>,
    /// `[kv_heads, capacity, head_dim]`
    values: Tensor<3>,
}

/// Positions allocated at first use; a chat turn or two fits without growing.
const FIRST_BLOCK: usize = 256;

impl KvCache {
    pub fn new(config: &LlamaConfig, device: &Device, dtype: DType) -> Self {
        Self {
            layers: (0..config.num_hidden_layers).map(|_| None).collect(),
            tokens: Vec::new(),
            max_len: config.max_position_embeddings,
            kv_heads: config.num_kv_heads(),
            head_dim: config.head_dim(),
            dtype,
            device: device.clone(),
        }
    }

    /// Tokens whose keys and values are cached.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// How many leading tokens of `prompt` are already cached.
    pub fn common_prefix(&self, prompt: &[u32]) -> usize {
        self.tokens
            .iter()
            .zip(prompt)
            .take_while(|(a, b)| a == b)
            .count()
    }

    /// The context length: no more positions than this can ever be cached.
    pub fn max_len(&self) -> usize {
        self.max_len
    }

    /// Positions allocated now (across all layers the same).
    pub fn capacity(&self) -> usize {
        self.layers
            .iter()
            .flatten()
            .map(|layer| layer.keys.dims()[1])
            .next()
            .unwrap_or(0)
    }

    /// Bytes held by the allocated storage, for the memory statistics.
    pub fn bytes(&self) -> usize {
        2 * self.layers.len() * self.kv_heads * self.capacity() * self.head_dim * self.dtype.size()
    }

    /// Forgets everything after the first `len` tokens (no-op when `len` is not shorter).
    pub fn truncate(&mut self, len: usize) {
        self.tokens.truncate(len);
    }

    pub fn clear(&mut self) {
        self.tokens.clear();
    }

    /// Writes the keys and values of new tokens at positions `len..len + tokens` of one layer
    /// and returns views of all cached positions `0..len + tokens` of that layer.
    ///
    /// `keys`, `values`: `[kv_heads, tokens, head_dim]`. The cache's length only moves once
    /// every layer has written, in [`KvCache::advance`].
    pub(crate) fn append(
        &mut self,
        layer: usize,
        keys: Tensor<3>,
        values: Tensor<3>,
    ) -> (Tensor<3>, Tensor<3>) {
        let start = self.len();
        let end = start + keys.dims()[1];
        let (kv_heads, head_dim) = (self.kv_heads, self.head_dim);
        let needed = self.grown_capacity(end);
        let entry = self.layers[layer].get_or_insert_with(|| LayerCache {
            keys: Tensor::zeros([kv_heads, 0, head_dim], (&self.device, self.dtype)),
            values: Tensor::zeros([kv_heads, 0, head_dim], (&self.device, self.dtype)),
        });
        let capacity = entry.keys.dims()[1];
        if needed > capacity {
            let extra = || {
                Tensor::zeros(
                    [kv_heads, needed - capacity, head_dim],
                    (&self.device, self.dtype),
                )
            };
            entry.keys.inplace(|old| Tensor::cat(vec![old, extra()], 1));
            entry
                .values
                .inplace(|old| Tensor::cat(vec![old, extra()], 1));
        }
        let slot = [0..kv_heads, start..end, 0..head_dim];
        entry
            .keys
            .inplace(|cache| cache.slice_assign(slot.clone(), keys));
        entry
            .values
            .inplace(|cache| cache.slice_assign(slot, values));
        let filled = [0..kv_heads, 0..end, 0..head_dim];
        (
            entry.keys.clone().slice(filled.clone()),
            entry.values.clone().slice(filled),
        )
    }

    /// Records `tokens` as cached, after every layer has appended them.
    pub(crate) fn advance(&mut self, tokens: &[u32]) {
        self.tokens.extend_from_slice(tokens);
    }

    fn grown_capacity(&self, needed: usize) -> usize {
        let current = self.capacity();
        if needed <= current {
            return current;
        }
        needed.max(current * 2).max(FIRST_BLOCK).min(self.max_len)
    }
}
