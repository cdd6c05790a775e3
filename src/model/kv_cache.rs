use burn::tensor::{DType, Device, Tensor};

use super::config::ModelConfig;
use super::cpu;

/// Cached keys and values of every layer for the tokens seen so far.
///
/// Storage is allocated in blocks and grows by doubling, up to the model's context length, so
/// a short chat does not pay for 8192 positions and a long one is still bounded. New entries
/// are written in place; reading never concatenates a copy. Truncating to a prefix is free:
/// the chat engine does it when an edited message makes the conversation diverge from what
/// the cache holds.
#[derive(Debug)]
pub struct KvCache {
    store: Store,
    /// The token ids whose keys and values are cached, so that a new prompt can reuse the
    /// longest common prefix.
    tokens: Vec<u32>,
    /// Where each forward pass over the cached tokens began, ascending (see
    /// [`KvCache::reusable_prefix`]).
    starts: Vec<usize>,
    /// What the model predicted after the prompt last read whole into the cache, and that
    /// prompt's length (see [`KvCache::prediction`]).
    prediction: Option<(usize, Vec<f32>)>,
    max_len: usize,
    /// Values per position and layer, of the keys and of the values each.
    kv_width: usize,
    /// Each layer's window of recent positions, where it has one (Gemma 3's sliding layers):
    /// a host cache keeps only what the next passes can see there (see [`KvCache::advance`]).
    windows: Vec<Option<usize>>,
}

/// Where the keys and values live, which decides how attention reads them.
#[derive(Debug)]
enum Store {
    /// Host memory, written and read in place by the CPU attention kernel (burn-flex,
    /// burn-ndarray).
    Host(Vec<CachedRows>),
    /// Tensors on the model's device, read by Burn's composition of attention (the GPU).
    Device(DeviceLayers),
}

#[derive(Debug)]
struct DeviceLayers {
    layers: Vec<Option<LayerTensors>>,
    kv_heads: usize,
    head_dim: usize,
    dtype: DType,
    device: Device,
}

#[derive(Debug)]
struct LayerTensors {
    /// `[kv_heads, capacity, head_dim]`
    keys: Tensor<3>,
    /// `[kv_heads, capacity, head_dim]`
    values: Tensor<3>,
}

/// Positions allocated at first use; a chat turn or two fits without growing.
const FIRST_BLOCK: usize = 256;

/// Room for `needed` positions where `current` are allocated: by doubling, from the first
/// block, up to the context length.
fn grown(needed: usize, current: usize, max_len: usize) -> usize {
    if needed <= current {
        return current;
    }
    needed.max(current * 2).max(FIRST_BLOCK).min(max_len)
}

impl KvCache {
    pub fn new(config: &ModelConfig, device: &Device, dtype: DType) -> Self {
        let layers = config.num_hidden_layers;
        let store = if cpu::is_host(device) {
            Store::Host((0..layers).map(|_| CachedRows::default()).collect())
        } else {
            Store::Device(DeviceLayers {
                layers: (0..layers).map(|_| None).collect(),
                kv_heads: config.num_kv_heads(),
                head_dim: config.head_dim(),
                dtype,
                device: device.clone(),
            })
        };
        Self {
            store,
            tokens: Vec::new(),
            starts: Vec::new(),
            prediction: None,
            max_len: config.max_position_embeddings,
            kv_width: config.num_kv_heads() * config.head_dim(),
            windows: config.layer_windows(),
        }
    }

    /// The same cache holding at most `max_len` positions (never more than the model's
    /// context).
    pub fn limited_to(self, max_len: usize) -> Self {
        Self {
            max_len: self.max_len.min(max_len),
            ..self
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

    /// How many leading tokens of `prompt` to keep. A prompt that goes on past everything
    /// cached keeps it all. The prompt last read whole into the cache, asked again (a request
    /// sent again, Regenerate), keeps it all too: its [`prediction`](Self::prediction) is kept
    /// with it, and nothing runs again. One that parts from the cache inside it (an edited
    /// message) is cut back to where the pass that computed that part began, so that at
    /// least its last token runs again: a pass over more tokens rounds differently from
    /// passes over fewer (a prompt's matrix products against one token's), so a prompt run
    /// again from where it first began answers bit for bit as it did. Decode steps are passes
    /// of one token, so only a prompt's own pass is ever run again whole.
    ///
    /// A layer with a window has let go of positions before it: a prefix whose next pass
    /// would see one of those is not reusable, and the prompt runs whole.
    pub fn reusable_prefix(&self, prompt: &[u32]) -> usize {
        let common = self.common_prefix(prompt);
        let predicted = self
            .prediction
            .as_ref()
            .is_some_and(|(read, _)| *read == prompt.len());
        let goes_on = common == self.len() && common < prompt.len();
        let asked_again = predicted && common == prompt.len();
        let prefix = if goes_on || asked_again {
            common
        } else {
            let limit = common.min(prompt.len().saturating_sub(1));
            self.starts
                .iter()
                .rev()
                .find(|&&start| start <= limit)
                .copied()
                .unwrap_or(0)
        };
        if self.can_resume_at(prefix) {
            prefix
        } else {
            0
        }
    }

    /// What the model predicted after the cached positions (their last token's logits),
    /// when they are the prompt last read whole into the cache. Kept so that the same prompt
    /// asked again is answered without reading it: reading it again would run its last pass
    /// over the same cached positions (see [`KvCache::reusable_prefix`]) and give these bits.
    pub fn prediction(&self) -> Option<&[f32]> {
        match &self.prediction {
            Some((read, logits)) if *read == self.len() => Some(logits),
            _ => None,
        }
    }

    /// Keeps `logits` as what the model predicts after the prompt now cached, which has just
    /// been read whole.
    pub fn keep_prediction(&mut self, logits: &[f32]) {
        self.prediction = Some((self.len(), logits.to_vec()));
    }

    /// Makes this cache hold the first `len` positions of `source`, as `source` computed
    /// them, so that a prompt can reuse another cache's prefix without cutting that cache
    /// short; false, leaving this cache as it was, where they cannot be copied (a device
    /// cache, or a layer with a window that let go of some of them).
    pub fn copy_prefix(&mut self, source: &KvCache, len: usize) -> bool {
        let (Store::Host(layers), Store::Host(from)) = (&mut self.store, &source.store) else {
            return false;
        };
        if len > source.len() || from.iter().any(|rows| rows.first > 0) {
            return false;
        }
        let values = len * self.kv_width;
        for (rows, from) in layers.iter_mut().zip(from) {
            rows.keys.clear();
            rows.keys.extend_from_slice(&from.keys[..values]);
            rows.values.clear();
            rows.values.extend_from_slice(&from.values[..values]);
            rows.first = 0;
        }
        self.tokens.clear();
        self.tokens.extend_from_slice(&source.tokens[..len]);
        self.starts = source
            .starts
            .iter()
            .copied()
            .filter(|&start| start < len)
            .collect();
        self.prediction = None;
        true
    }

    /// Whether every layer still holds what a pass starting at `position` sees.
    fn can_resume_at(&self, position: usize) -> bool {
        let Store::Host(layers) = &self.store else {
            return true;
        };
        layers.iter().zip(&self.windows).all(|(rows, window)| {
            rows.first == 0 || window.is_some_and(|window| rows.first + window <= position + 1)
        })
    }

    /// The context length: no more positions than this can ever be cached.
    pub fn max_len(&self) -> usize {
        self.max_len
    }

    /// Positions allocated now (across all layers the same).
    pub fn capacity(&self) -> usize {
        match &self.store {
            Store::Host(layers) => layers
                .iter()
                .map(|rows| rows.keys.capacity() / self.kv_width)
                .max()
                .unwrap_or(0),
            Store::Device(device) => device
                .layers
                .iter()
                .flatten()
                .map(|layer| layer.keys.dims()[1])
                .next()
                .unwrap_or(0),
        }
    }

    /// Bytes held by the allocated storage, for the memory statistics.
    pub fn bytes(&self) -> usize {
        match &self.store {
            Store::Host(layers) => layers
                .iter()
                .map(|rows| (rows.keys.capacity() + rows.values.capacity()) * size_of::<f32>())
                .sum(),
            Store::Device(device) => {
                2 * device.layers.len() * self.capacity() * self.kv_width * device.dtype.size()
            }
        }
    }

    /// Forgets everything after the first `len` tokens (no-op when `len` is not shorter).
    /// Where a layer with a window no longer holds what a pass at `len` sees (a length
    /// [`KvCache::reusable_prefix`] does not give), everything is forgotten: check `len()`.
    pub fn truncate(&mut self, len: usize) {
        let len = if self.can_resume_at(len.min(self.len())) {
            len
        } else {
            0
        };
        self.tokens.truncate(len);
        self.starts.retain(|&start| start < len);
        if self
            .prediction
            .as_ref()
            .is_some_and(|(read, _)| *read > len)
        {
            self.prediction = None;
        }
        if let Store::Host(layers) = &mut self.store {
            for rows in layers.iter_mut().filter(|rows| rows.first > len) {
                *rows = CachedRows::default();
            }
        }
        self.release_unused();
    }

    pub fn clear(&mut self) {
        self.truncate(0);
    }

    /// Hands back the host memory of positions far past the ones kept, leaving room to grow
    /// twice over: a long chat's cache (hundreds of MB at 8k positions) otherwise stayed
    /// allocated after the window left that chat, until a restart.
    fn release_unused(&mut self) {
        let (len, kv_width) = (self.len(), self.kv_width);
        let Store::Host(layers) = &mut self.store else {
            return;
        };
        let mut released = false;
        for rows in layers {
            let held = len.saturating_sub(rows.first);
            let keep = held.max(FIRST_BLOCK);
            if rows.keys.capacity() <= 4 * keep * kv_width {
                continue;
            }
            for buffer in [&mut rows.keys, &mut rows.values] {
                buffer.truncate(held * kv_width);
                buffer.shrink_to(2 * keep * kv_width);
            }
            released = true;
        }
        if released {
            crate::stats::memory::release_freed_heap();
        }
    }

    /// Whether attention reads this cache with the CPU kernel, which needs no mask.
    pub(crate) fn is_host(&self) -> bool {
        matches!(self.store, Store::Host(_))
    }

    /// Where one layer writes the keys and values of `new_tokens` more positions, with room
    /// made for them. The cache's length only moves once every layer has written, in
    /// [`KvCache::advance`].
    pub(crate) fn layer(&mut self, layer: usize, new_tokens: usize) -> LayerCache<'_> {
        let start = self.len();
        let kv_width = self.kv_width;
        let (max_len, device_capacity) = (self.max_len, self.grown_capacity(start + new_tokens));
        let window = self.windows[layer];
        match &mut self.store {
            Store::Host(layers) => {
                let rows = &mut layers[layer];
                let needed = start + new_tokens - rows.first;
                let current = rows.keys.capacity() / kv_width;
                // A layer with a window holds at most three windows before a pass.
                let most = window.map_or(max_len, |window| needed.max(3 * window));
                let capacity = grown(needed, current, max_len).min(most);
                for buffer in [&mut rows.keys, &mut rows.values] {
                    buffer.reserve_exact((capacity * kv_width).saturating_sub(buffer.len()));
                }
                LayerCache::Host(rows)
            }
            Store::Device(layers) => LayerCache::Device(DeviceLayer {
                layers,
                layer,
                positions: start..start + new_tokens,
                capacity: device_capacity,
            }),
        }
    }

    /// Records `tokens` as cached, after every layer has appended them in one pass.
    ///
    /// A host layer with a window then lets go of positions no later pass sees, keeping a
    /// second window's worth so that a prompt run again a little further back (Regenerate)
    /// still finds them, and letting go a window's worth at a time.
    pub(crate) fn advance(&mut self, tokens: &[u32]) {
        self.starts.push(self.tokens.len());
        self.tokens.extend_from_slice(tokens);
        let (len, kv_width) = (self.len(), self.kv_width);
        let Store::Host(layers) = &mut self.store else {
            return;
        };
        for (rows, window) in layers.iter_mut().zip(&self.windows) {
            let Some(window) = *window else { continue };
            let first = (len + 1).saturating_sub(2 * window);
            if first >= rows.first + window {
                let dropped = (first - rows.first) * kv_width;
                rows.keys.drain(..dropped);
                rows.values.drain(..dropped);
                rows.first = first;
            }
        }
    }

    fn grown_capacity(&self, needed: usize) -> usize {
        grown(needed, self.capacity(), self.max_len)
    }
}

/// One layer's cached keys and values in host memory, row `p` holding position `p`'s
/// `kv_heads · head_dim` values, so that new positions are appended and a shorter prefix is
/// a truncation. Kept in f32 whatever the model's dtype: the attention arithmetic is f32, and
/// widening bf16 keys on every read would cost more than the memory saved.
#[derive(Debug, Default)]
pub struct CachedRows {
    pub keys: Vec<f32>,
    pub values: Vec<f32>,
    /// The position of the first row: 0, or for a layer with a window the oldest position
    /// kept (see [`KvCache::advance`]).
    pub first: usize,
}

/// One layer's storage, as [`KvCache::layer`] hands it to attention.
pub(crate) enum LayerCache<'a> {
    Host(&'a mut CachedRows),
    Device(DeviceLayer<'a>),
}

/// One layer of a device cache, about to receive the positions `positions`.
pub(crate) struct DeviceLayer<'a> {
    layers: &'a mut DeviceLayers,
    layer: usize,
    positions: std::ops::Range<usize>,
    /// Positions to allocate if there are fewer.
    capacity: usize,
}

impl DeviceLayer<'_> {
    /// Writes the keys and values of the new positions and returns views of all cached
    /// positions of the layer. `keys`, `values`: `[kv_heads, tokens, head_dim]`.
    pub(crate) fn append(mut self, keys: Tensor<3>, values: Tensor<3>) -> (Tensor<3>, Tensor<3>) {
        let (kv_heads, head_dim) = (self.layers.kv_heads, self.layers.head_dim);
        let mut entry = self.take_grown();
        let slot = [0..kv_heads, self.positions.clone(), 0..head_dim];
        entry.keys = entry.keys.slice_assign(slot.clone(), keys);
        entry.values = entry.values.slice_assign(slot, values);
        let filled = [0..kv_heads, 0..self.positions.end, 0..head_dim];
        let filled = (
            entry.keys.clone().slice(filled.clone()),
            entry.values.clone().slice(filled),
        );
        self.layers.layers[self.layer] = Some(entry);
        filled
    }

    /// Hands the whole key and value buffers `[kv_heads, capacity, head_dim]` to `write`,
    /// which writes the new positions (in place, as the cache holds the only reference) and
    /// hands them back.
    pub(crate) fn write_with<R>(
        mut self,
        write: impl FnOnce(Tensor<3>, Tensor<3>) -> (R, Tensor<3>, Tensor<3>),
    ) -> R {
        let entry = self.take_grown();
        let (result, keys, values) = write(entry.keys, entry.values);
        self.layers.layers[self.layer] = Some(LayerTensors { keys, values });
        result
    }

    /// The layer's buffers, taken out of the cache and grown to `capacity` positions.
    fn take_grown(&mut self) -> LayerTensors {
        let layers = &mut *self.layers;
        let (kv_heads, head_dim) = (layers.kv_heads, layers.head_dim);
        let (device, dtype) = (&layers.device, layers.dtype);
        let zeros = |len: usize| Tensor::zeros([kv_heads, len, head_dim], (device, dtype));
        let mut entry = layers.layers[self.layer]
            .take()
            .unwrap_or_else(|| LayerTensors {
                keys: zeros(0),
                values: zeros(0),
            });
        let allocated = entry.keys.dims()[1];
        if self.capacity > allocated {
            let extra = self.capacity - allocated;
            entry.keys = Tensor::cat(vec![entry.keys, zeros(extra)], 1);
            entry.values = Tensor::cat(vec![entry.values, zeros(extra)], 1);
        }
        entry
    }
}
