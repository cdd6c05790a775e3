//! The one place a [`ModelSource`] becomes a model folder or GGUF file on disk, downloading a
//! hub model first: for the inference thread, and for the command line before it starts one.

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;

use super::EngineError;
use crate::hub::{DownloadProgress, ModelDownloader};
use crate::model_source::ModelSource;

/// The model folder or GGUF file `source` names. `progress` hears about each chunk of a
/// download; setting `cancel` ends it early.
pub fn resolve_source(
    source: &ModelSource,
    progress: &mut dyn FnMut(DownloadProgress),
    cancel: &AtomicBool,
) -> Result<PathBuf, EngineError> {
    match source {
        ModelSource::Folder(path) if path.is_dir() => Ok(path.clone()),
        ModelSource::GgufFile(path) if path.is_file() => Ok(path.clone()),
        ModelSource::Folder(path) | ModelSource::GgufFile(path) => {
            Err(EngineError::ModelNotFound { path: path.clone() })
        }
        ModelSource::Hub(model_id) => ModelDownloader::from_env()
            .and_then(|downloader| downloader.ensure_model(model_id, progress, cancel))
            .map_err(|err| EngineError::from_hub(model_id, err)),
        ModelSource::HubGguf { model_id, quant } => ModelDownloader::from_env()
            .and_then(|downloader| downloader.ensure_gguf(model_id, quant, progress, cancel))
            .map_err(|err| EngineError::from_hub(model_id, err)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_folder_is_named() {
        let never = AtomicBool::new(false);
        let missing = PathBuf::from("/no/such/model/folder");
        let error =
            resolve_source(&ModelSource::Folder(missing.clone()), &mut |_| {}, &never).unwrap_err();
        assert_eq!(error, EngineError::ModelNotFound { path: missing });
    }
}
