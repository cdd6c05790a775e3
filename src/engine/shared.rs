//! What the inference thread publishes for its clients, apart from both so that the worker
//! and the handle that starts it do not import each other.

use std::sync::Mutex;
use std::sync::PoisonError;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};

use super::protocol::ModelInfo;

/// What the worker publishes for every client to read without a round trip.
#[derive(Debug)]
pub(super) struct Shared {
    pub(super) model: Mutex<Option<ModelInfo>>,
    /// Generations waiting for a slot.
    pub(super) queued: AtomicUsize,
    /// Tokens generated since the engine started, for every client together.
    pub(super) generated_tokens: AtomicU64,
    /// False once the worker has ended: nothing will answer any more.
    pub(super) running: AtomicBool,
    /// The id the next request gets: one counter, so ids are unique across clients.
    pub(super) next_request: AtomicU64,
}

impl Shared {
    pub(super) fn new() -> Self {
        Self {
            model: Mutex::new(None),
            queued: AtomicUsize::new(0),
            generated_tokens: AtomicU64::new(0),
            running: AtomicBool::new(true),
            next_request: AtomicU64::new(1),
        }
    }

    pub(super) fn set_model(&self, info: Option<ModelInfo>) {
        *self.model.lock().unwrap_or_else(PoisonError::into_inner) = info;
    }
}
