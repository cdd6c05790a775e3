//! Where the weights come from: the tensors the model needs, by role ([`TensorRole`]), read
//! from a weight format behind the [`Checkpoint`] trait, so that the model's loading code
//! names no file format.

use burn::tensor::{DType, TensorData};

use super::cpu::IntegerWeights;
pub use super::cpu::RowOrder;
use super::error::Result;
use super::weight_arena::WeightArena;

pub mod gguf;
mod layout;
pub mod safetensors;

pub use layout::{LayerRole, TensorRole};

/// A checkpoint's tensors, read by role and converted to the type the model holds them in.
///
/// Shapes are the ones the config implies; a reader refuses a tensor stored in another shape,
/// or missing, with an error that names it as the file does.
pub trait Checkpoint {
    /// Whether the checkpoint holds the tensor at all.
    fn contains(&self, role: TensorRole) -> bool;

    /// The float type a tensor is stored in, if the checkpoint has it.
    fn stored_dtype(&self, role: TensorRole) -> Option<DType>;

    /// Whether RMSNorm weights are stored as a family defines them: Gemma's as offsets from
    /// one (`x · (1 + w)`). llama.cpp's converter adds the one in, so its files hold the
    /// factor itself.
    fn norm_weights_as_defined(&self) -> bool {
        true
    }

    /// Values stored in float types across the checkpoint's tensors: what an arena for its
    /// float weights needs to hold (integer weights are kept apart, see
    /// [`Checkpoint::integer_stacked`]).
    fn float_values(&self) -> usize;

    /// One tensor in `dtype`, decoded into `arena` when one is given and has room: the stack
    /// of that one part, unless a reader has a faster way.
    fn tensor(
        &self,
        role: TensorRole,
        shape: &[usize],
        dtype: DType,
        arena: Option<&mut WeightArena>,
    ) -> Result<TensorData> {
        self.stacked(&[(role, shape.to_vec())], dtype, arena, RowOrder::AsStored)
    }

    /// Matrices of one column count stacked row-wise into one, e.g. the q, k and v
    /// projections into the single matrix that one fused matmul multiplies by, its rows held
    /// in `order`.
    fn stacked(
        &self,
        parts: &[(TensorRole, Vec<usize>)],
        dtype: DType,
        arena: Option<&mut WeightArena>,
        order: RowOrder,
    ) -> Result<TensorData>;

    /// The stack of [`Checkpoint::stacked`] as small integers with scales (and offsets), when
    /// every part is stored that way: the CPU kernels multiply them as stored. `None` for a
    /// format or part without integers.
    fn integer_stacked(
        &self,
        parts: &[(TensorRole, Vec<usize>)],
    ) -> Result<Option<IntegerWeights>> {
        let _ = parts;
        Ok(None)
    }

    /// Whether the parts are stored in different integer types (a Q4_K_M file's v beside q
    /// and k), which the CPU holds apart, each as stored.
    fn integer_types_differ(&self, parts: &[(TensorRole, Vec<usize>)]) -> bool {
        let _ = parts;
        false
    }
}
