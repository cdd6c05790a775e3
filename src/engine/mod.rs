//! The inference engine: one background thread that owns the model and its KV cache, driven
//! over channels so that no client (the window, the local server's requests) ever waits on
//! the model, and served to any number of clients through one queue.

mod error;
mod handle;
mod protocol;
mod queue;
mod shared;
mod slots;
mod source;
mod worker;

pub use error::EngineError;
pub use handle::{
    Client, DEFAULT_PARALLEL, DEFAULT_QUEUE_LIMIT, EngineHandle, EngineOptions, Stopper,
};
pub use protocol::{
    Command, Event, GenerateRequest, LiveStats, ModelInfo, Prompt, Reply, RequestId,
};
pub use source::resolve_source;
