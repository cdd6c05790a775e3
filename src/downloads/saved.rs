//! The unfinished downloads on disk, so that they go on after a restart: a small JSON file
//! beside the conversations, replaced whole on every change.

use std::io;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::atomic_file::{keep_damaged_copy, write_atomic};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Saved {
    pub spec: String,
    pub paused: bool,
}

#[derive(Serialize, Deserialize)]
struct File {
    downloads: Vec<Saved>,
}

/// The downloads kept in `path`, and what was wrong with it, if anything. A damaged file is
/// kept beside as `.damaged` rather than overwritten unread.
pub fn load(path: &Path) -> (Vec<Saved>, Option<String>) {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return (Vec::new(), None),
        Err(err) => {
            let problem = format!("Downloads: cannot read {}: {err}", path.display());
            return (Vec::new(), Some(problem));
        }
    };
    match serde_json::from_slice::<File>(&bytes) {
        Ok(file) => (file.downloads, None),
        Err(err) => {
            let kept = keep_damaged_copy(path);
            let problem = format!(
                "Downloads: {} is not a list of downloads ({err}), so none are resumed; {kept}",
                path.display()
            );
            (Vec::new(), Some(problem))
        }
    }
}

pub fn save(path: &Path, downloads: &[Saved]) -> Result<(), String> {
    let file = File {
        downloads: downloads.to_vec(),
    };
    let bytes = serde_json::to_vec_pretty(&file).map_err(|err| err.to_string())?;
    write_atomic(path, &bytes)
        .map_err(|err| format!("Downloads: cannot write {}: {err}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn downloads_come_back_as_they_were_saved() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("downloads.json");
        assert_eq!(load(&path), (Vec::new(), None));
        let kept = vec![
            Saved {
                spec: "org/model-GGUF:Q4_K_M".into(),
                paused: false,
            },
            Saved {
                spec: "org/model".into(),
                paused: true,
            },
        ];
        save(&path, &kept).unwrap();
        assert_eq!(load(&path), (kept, None));
    }

    #[test]
    fn a_damaged_file_is_named_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("downloads.json");
        std::fs::write(&path, b"{\"downloads\": [{\"spec\": 3}]}").unwrap();
        let (downloads, problem) = load(&path);
        assert!(downloads.is_empty());
        let problem = problem.expect("a problem");
        assert!(problem.contains("downloads.json"), "{problem}");
        assert!(problem.contains("downloads.json.damaged"), "{problem}");
        assert_eq!(
            std::fs::read(dir.path().join("downloads.json.damaged")).unwrap(),
            b"{\"downloads\": [{\"spec\": 3}]}"
        );
    }
}
