use std::path::PathBuf;
use std::sync::atomic::AtomicBool;

use crate::hub::{ModelDownloader, ModelSource, stderr_progress};

/// `--model` takes a local folder or a hub id (`org/name`); a hub id is fetched into the
/// shared Hugging Face cache first, with a progress bar on stderr.
pub fn resolve(spec: &str) -> Result<PathBuf, String> {
    match ModelSource::parse(spec) {
        ModelSource::Local(path) => {
            if path.is_dir() {
                Ok(path)
            } else {
                Err(format!(
                    "model folder {} does not exist (give a folder with config.json and model.safetensors, or a hub id such as HuggingFaceTB/SmolLM2-135M-Instruct)",
                    path.display()
                ))
            }
        }
        ModelSource::Hub(model_id) => {
            let never_cancelled = AtomicBool::new(false);
            let mut progress = stderr_progress();
            ModelDownloader::from_env()
                .and_then(|downloader| {
                    downloader.ensure_model(&model_id, &mut progress, &never_cancelled)
                })
                .map_err(|err| err.to_string())
        }
    }
}
