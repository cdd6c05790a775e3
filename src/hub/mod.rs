//! Getting model files from the Hugging Face hub into the shared Hugging
//! Face cache, so the app can run a model it does not ship with.

mod blob;
mod cache;
mod completeness;
mod error;
mod gguf_choice;
mod http;
mod model_id;
mod progress;
mod search;
mod snapshot;

pub use cache::{
    DEFAULT_ENDPOINT, HubCache, endpoint_from_env, resolve_cache_dir, resolve_endpoint,
};
pub use error::HubError;
pub use http::{Retries, Timeouts};
pub use model_id::{DEFAULT_MODEL_ID, is_hub_model_id};
pub use progress::{DownloadProgress, Reconnecting, render_progress_line, stderr_progress};
pub use search::{FoundModel, RepositoryFile};
pub use snapshot::{HubOptions, ModelDownloader};
