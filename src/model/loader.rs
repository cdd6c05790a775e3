//! Reads tensors from a [`Checkpoint`] into tensors on the target device, by role, in the
//! types the model holds them in.

use std::sync::Arc;

use burn::tensor::quantization::QuantScheme;
use burn::tensor::{DType, Device, Tensor, TensorData};

use super::checkpoint::{Checkpoint, LayerRole, TensorRole};
use super::config::ModelConfig;
use super::cpu;
use super::error::{ModelError, Result};
use super::linear::Linear;
use super::rope::partial_rotation_order;
use super::weight_arena::WeightArena;

/// How far a load has come, for a progress bar: the decoder layers hold nearly all of a
/// model's weights, so layers read of all is close to the share of the time spent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoadProgress {
    pub layers_read: usize,
    pub layers: usize,
}

impl LoadProgress {
    /// The share read, from 0 to 1.
    pub fn fraction(&self) -> f32 {
        self.layers_read as f32 / self.layers.max(1) as f32
    }
}

/// What each module's `load` reads its weights through. Shapes come from the config, so a
/// module asks only for roles; tensors are made in the compute dtype (`from_data` alone would
/// convert them to the device's default float type).
pub struct Loader<'a> {
    checkpoint: &'a dyn Checkpoint,
    config: &'a ModelConfig,
    device: &'a Device,
    dtype: DType,
    /// Where float weights are decoded on the CPU.
    arena: Option<WeightArena>,
    /// The integers the decoder layers' projection weights are stored in, if any. The
    /// embedding (and the LM head tied to it) stays in float: a row lookup into a
    /// block-quantized matrix would dequantize all of it on every token.
    quantization: Option<QuantScheme>,
    /// Norm weights are offsets from one (Gemma's).
    norm_weights_offset: bool,
}

impl<'a> Loader<'a> {
    pub fn new(
        checkpoint: &'a dyn Checkpoint,
        config: &'a ModelConfig,
        device: &'a Device,
        dtype: DType,
        quantization: Option<QuantScheme>,
    ) -> Self {
        // On burn-flex the float weights go into one arena on huge pages (see `WeightArena`);
        // burn-ndarray would copy them out of it on every use, an accelerator copies them to
        // its own memory, and quantized weights are replaced.
        let arena = cpu::reads_shared_weights_in_place(device)
            .then(|| WeightArena::with_capacity(checkpoint.float_values() * dtype.size()))
            .flatten();
        Self {
            checkpoint,
            config,
            device,
            dtype,
            arena,
            quantization,
            norm_weights_offset: checkpoint.norm_weights_as_defined()
                && config.family().is_ok_and(|family| family.gemma_norms),
        }
    }

    /// Whether RMSNorm weights are stored as offsets from one (see [`crate::model::Family`]).
    pub fn norm_weights_offset(&self) -> bool {
        self.norm_weights_offset
    }

    pub fn config(&self) -> &'a ModelConfig {
        self.config
    }

    pub fn device(&self) -> &'a Device {
        self.device
    }

    /// The parts stacked as the integers they are stored in, on the CPU, when every part is
    /// stored so (see [`Checkpoint::integer_stacked`]); the kernels read them as stored, in a
    /// quarter to an eighth of the f32 bytes, whatever the precision.
    pub fn integers(&mut self, parts: &[TensorRole]) -> Result<Option<cpu::IntegerWeights>> {
        if !cpu::is_host(self.device) {
            return Ok(None);
        }
        let shaped: Vec<(TensorRole, Vec<usize>)> = parts
            .iter()
            .map(|&role| (role, role.shape(self.config)))
            .collect();
        let Some(weights) = self.checkpoint.integer_stacked(&shaped)? else {
            return Ok(None);
        };
        let weights = match self.rotation_order(&shaped) {
            Some(order) => weights.with_rows_from(&order).ok_or_else(|| {
                ModelError::Backend("cannot reorder the rotated rows of packed integers".into())
            })?,
            None => weights,
        };
        Ok(Some(weights.packed().compacted().interleaved()))
    }

    /// [`Loader::integers`] as the kernels' weight: parts stored in different types held
    /// apart, each as stored (see [`cpu::Weight::Stacked`]).
    fn integer_weight(&mut self, parts: &[TensorRole]) -> Result<Option<cpu::Weight>> {
        let shaped: Vec<(TensorRole, Vec<usize>)> = parts
            .iter()
            .map(|&role| (role, role.shape(self.config)))
            .collect();
        if parts.len() < 2 || !self.checkpoint.integer_types_differ(&shaped) {
            let integers = self.integers(parts)?;
            return Ok(integers.map(|integers| cpu::Weight::Integers(Arc::new(integers))));
        }
        let mut held = Vec::with_capacity(parts.len());
        for &part in parts {
            let Some(integers) = self.integers(&[part])? else {
                return Ok(None);
            };
            held.push(cpu::Weight::Integers(Arc::new(integers)));
        }
        Ok(Some(cpu::Weight::Stacked(held)))
    }

    pub fn matrix(&mut self, role: TensorRole) -> Result<Tensor<2>> {
        let dtype = self.storage_dtype(&[role]);
        let shape = role.shape(self.config);
        let data = self
            .checkpoint
            .tensor(role, &shape, dtype, self.arena.as_mut())?;
        Ok(Tensor::from_data(data, (self.device, dtype)))
    }

    pub fn vector(&mut self, role: TensorRole) -> Result<Tensor<1>> {
        let shape = role.shape(self.config);
        let data = self
            .checkpoint
            .tensor(role, &shape, self.dtype, self.arena.as_mut())?;
        Ok(Tensor::from_data(data, (self.device, self.dtype)))
    }

    /// A projection, its parts stacked row-wise into one matrix (e.g. q, k and v, which
    /// one fused product then multiplies by), quantized as soon as it is read so that memory
    /// never holds the float copy of more than one.
    /// Parts stored as integers stay so on the CPU (see [`Loader::integers`]).
    pub fn projection(&mut self, parts: &[TensorRole]) -> Result<Linear> {
        if let Some(weight) = self.integer_weight(parts)? {
            return Ok(Linear::stored(weight));
        }
        let dtype = match self.quantization {
            Some(_) => self.dtype,
            None => self.storage_dtype(parts),
        };
        let parts: Vec<(TensorRole, Vec<usize>)> = parts
            .iter()
            .map(|&role| (role, role.shape(self.config)))
            .collect();
        let rotation = self.rotation_order(&parts);
        let rows = parts.iter().map(|(_, shape)| shape[0]).sum();
        let cols = parts.first().map_or(0, |(_, shape)| shape[1]);
        // Rows laid out by lane are held for the kernels alone (`Linear::stored`): no Burn
        // tensor of them could be quantized or have its rows reordered, so those loads keep
        // the stored order.
        let order = match (&self.quantization, &rotation) {
            (None, None) => cpu::RowOrder::for_matrix([rows, cols], dtype, self.device),
            _ => cpu::RowOrder::AsStored,
        };
        let arena = match self.quantization {
            Some(_) => None,
            None => self.arena.as_mut(),
        };
        let mut data = self.checkpoint.stacked(&parts, dtype, arena, order)?;
        if let Some(rotation) = rotation {
            reorder_rows(&mut data, &rotation)?;
        }
        let weight = Tensor::from_data(data, (self.device, dtype));
        if order == cpu::RowOrder::ByLane {
            let weight = cpu::Weight::by_lane(&weight).ok_or_else(|| {
                ModelError::Backend("weights laid out by lane off the CPU backends".into())
            })?;
            return Ok(Linear::stored(weight));
        }
        Ok(match &self.quantization {
            Some(scheme) => Linear::new(weight).quantized(scheme),
            None => Linear::new(weight),
        })
    }

    /// For a stack holding query or key rows, with a rotation over part of each head: where
    /// each row of the stack comes from, the query and key heads' rows laid out as
    /// [`partial_rotation_order`] says (scores are the same, as queries and keys are
    /// reordered alike), the value rows as they are. Each part is laid out on its own, as a
    /// projection whose parts are stored in different types holds them apart.
    fn rotation_order(&self, parts: &[(TensorRole, Vec<usize>)]) -> Option<Vec<usize>> {
        let config = self.config;
        let (head_dim, rotary_dim) = (config.head_dim(), config.rotary_dim());
        let rotated_heads = |role: TensorRole| match role {
            TensorRole::Layer(_, LayerRole::Query) => config.num_attention_heads,
            TensorRole::Layer(_, LayerRole::Key) => config.num_kv_heads(),
            TensorRole::Layer(_, LayerRole::QueryKeyValue) => {
                config.num_attention_heads + config.num_kv_heads()
            }
            _ => 0,
        };
        if rotary_dim == head_dim || parts.iter().all(|&(role, _)| rotated_heads(role) == 0) {
            return None;
        }
        let within = partial_rotation_order(head_dim, rotary_dim);
        let mut order = Vec::new();
        for (role, shape) in parts {
            let (first, rotated_rows) = (order.len(), rotated_heads(*role) * head_dim);
            order.extend((0..shape[0]).map(|row| match row < rotated_rows {
                true => first + row / head_dim * head_dim + within[row % head_dim],
                false => first + row,
            }));
        }
        Some(order)
    }

    /// The type a weight matrix is held in: the compute type, except where that is f32 on
    /// the CPU and the checkpoint stores the weight in bf16 or f16. Widening those to f32 is
    /// exact and the CPU kernels widen each weight as they read it, so they compute the very
    /// same products from half the bytes; decode, which streams every weight once per token,
    /// runs nearly twice as fast and the model takes half the memory.
    fn storage_dtype(&self, roles: &[TensorRole]) -> DType {
        let stored: Vec<Option<DType>> = roles
            .iter()
            .map(|&role| self.checkpoint.stored_dtype(role))
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

/// Rows of a `[rows, cols]` matrix reordered: row `i` becomes the old row `source[i]`.
fn reorder_rows(data: &mut TensorData, source: &[usize]) -> Result<()> {
    fn reorder<E: burn::tensor::Element>(data: &mut TensorData, source: &[usize]) -> Result<()> {
        let values = data
            .as_mut_slice::<E>()
            .map_err(|err| ModelError::Backend(format!("reordering rotated rows: {err:?}")))?;
        let cols = values.len() / source.len().max(1);
        let before = values.to_vec();
        for (row, &from) in source.iter().enumerate() {
            values[row * cols..(row + 1) * cols]
                .copy_from_slice(&before[from * cols..(from + 1) * cols]);
        }
        Ok(())
    }
    match data.dtype() {
        DType::F32 => reorder::<f32>(data, source),
        DType::BF16 => reorder::<half::bf16>(data, source),
        DType::F16 => reorder::<half::f16>(data, source),
        other => Err(ModelError::Backend(format!(
            "cannot reorder rotated rows held in {other:?}"
        ))),
    }
}
