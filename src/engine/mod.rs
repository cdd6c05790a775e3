//! The inference engine: one background thread that owns the model and its KV cache, driven
//! over channels so that the GUI thread never waits on the model.

mod error;
mod handle;
mod protocol;
mod worker;

pub use error::EngineError;
pub use handle::{EngineHandle, Stopper};
pub use protocol::{Command, Event, GenerateRequest, LiveStats, ModelInfo, RequestId};
