use burn::module::{Module, Param};
use burn::tensor::{DType, Device, Int, Tensor, TensorData};

use super::checkpoint::TensorRole;
use super::error::Result;
use super::linear::Linear;
use super::loader::Loader;

/// Token embeddings: the row of a `[vocab, hidden]` matrix for each token id.
#[derive(Module, Debug)]
pub struct Embedding {
    /// `[vocab, hidden]`
    weight: Param<Tensor<2>>,
}

impl Embedding {
    pub fn load(loader: &mut Loader) -> Result<Self> {
        Ok(Self {
            weight: Param::from_tensor(loader.matrix(TensorRole::Embedding)?),
        })
    }

    /// `[tokens, hidden]`, in the type the matrix is held in, which can be narrower than the
    /// compute type (see `Loader::storage_dtype`).
    pub fn forward(&self, tokens: &[u32]) -> Tensor<2> {
        let weight = self.weight.val();
        let ids = Tensor::<1, Int>::from_data(
            TensorData::new(
                tokens.iter().map(|&id| id as i64).collect::<Vec<_>>(),
                [tokens.len()],
            ),
            &weight.device(),
        );
        weight.select(0, ids)
    }

    /// The LM head of a config that ties it to the embedding: the same matrix, read as a
    /// projection onto the vocabulary.
    pub fn tied_head(&self) -> Linear {
        Linear::new(self.weight.val())
    }

    pub fn dtype(&self) -> DType {
        self.weight.val().dtype()
    }

    pub fn device(&self) -> Device {
        self.weight.val().device()
    }
}
