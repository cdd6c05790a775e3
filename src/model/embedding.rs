use std::sync::Arc;

use burn::module::Module;
use burn::tensor::{DType, Device, Int, Tensor, TensorData};

use super::checkpoint::TensorRole;
use super::cpu::IntegerWeights;
use super::error::Result;
use super::linear::Linear;
use super::loader::Loader;

/// Token embeddings: the row of a `[vocab, hidden]` matrix for each token id.
#[derive(Module, Debug)]
pub struct Embedding {
    #[module(skip)]
    matrix: Matrix,
}

/// `[vocab, hidden]`
#[derive(Clone, Debug)]
enum Matrix {
    Float(Tensor<2>),
    /// As a GGUF file stores it, on the CPU (see `Loader::integers`): a lookup widens just
    /// the rows it needs, and the tied LM head multiplies the integers.
    Integers {
        weights: Arc<IntegerWeights>,
        device: Device,
    },
}

impl Embedding {
    pub fn load(loader: &mut Loader) -> Result<Self> {
        let matrix = match loader.integers(&[TensorRole::Embedding])? {
            Some(weights) => Matrix::Integers {
                weights: Arc::new(weights),
                device: loader.device().clone(),
            },
            None => Matrix::Float(loader.matrix(TensorRole::Embedding)?),
        };
        Ok(Self { matrix })
    }

    /// `[tokens, hidden]`, in the type the matrix is held in, which can be narrower than the
    /// compute type (see `Loader::storage_dtype`); f32 from integers.
    pub fn forward(&self, tokens: &[u32]) -> Tensor<2> {
        match &self.matrix {
            Matrix::Float(weight) => {
                let ids = Tensor::<1, Int>::from_data(
                    TensorData::new(
                        tokens.iter().map(|&id| id as i64).collect::<Vec<_>>(),
                        [tokens.len()],
                    ),
                    &weight.device(),
                );
                weight.clone().select(0, ids)
            }
            Matrix::Integers { weights, device } => {
                let cols = weights.dims[1];
                let mut rows = vec![0.0; tokens.len() * cols];
                for (&id, row) in tokens.iter().zip(rows.chunks_exact_mut(cols)) {
                    weights.rows().widen(id as usize * cols, row);
                }
                Tensor::from_data(TensorData::new(rows, [tokens.len(), cols]), device)
            }
        }
    }

    /// The LM head of a config that ties it to the embedding: the same matrix, read as a
    /// projection onto the vocabulary.
    pub fn tied_head(&self) -> Linear {
        match &self.matrix {
            Matrix::Float(weight) => Linear::new(weight.clone()),
            Matrix::Integers { weights, .. } => Linear::integers(weights.clone()),
        }
    }

    /// The float type the matrix is held in; `None` for integers.
    pub fn dtype(&self) -> Option<DType> {
        match &self.matrix {
            Matrix::Float(weight) => Some(weight.dtype()),
            Matrix::Integers { .. } => None,
        }
    }

    pub fn device(&self) -> Device {
        match &self.matrix {
            Matrix::Float(weight) => weight.device(),
            Matrix::Integers { device, .. } => device.clone(),
        }
    }
}
