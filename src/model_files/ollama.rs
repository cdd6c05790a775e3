//! How Ollama keeps a model: a manifest (`manifests/<registry>/<namespace>/<model>/<tag>`,
//! JSON) names the blob (`blobs/sha256-<hex>`) that holds its GGUF weights, and the manifest's
//! path is the model's name.

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// The largest manifest read; real ones are about a kilobyte.
const MAX_MANIFEST_BYTES: u64 = 1 << 20;
/// The layer of a manifest that holds the GGUF weights.
const MODEL_LAYER: &str = "application/vnd.ollama.image.model";
/// Folder levels of `manifests/`: registry, namespace, model, and the tags inside.
const MANIFEST_DEPTH: usize = 3;

/// The manifests of the store at `root`, while `budget` (entries read) lasts.
pub fn manifests(root: &Path, budget: &mut usize) -> Vec<PathBuf> {
    let mut found = Vec::new();
    super::walk(
        &root.join("manifests"),
        MANIFEST_DEPTH,
        budget,
        &mut |_| true,
        &mut found,
    );
    found
}

/// The name Ollama shows for the manifest at `manifest` of the store at `root`: `model:tag`
/// for its own library, `namespace/model:tag` for a user's models, and the registry in front
/// for others (`hf.co/org/repo:tag`).
pub fn name_of(root: &Path, manifest: &Path) -> String {
    let relative = manifest
        .strip_prefix(root.join("manifests"))
        .unwrap_or(manifest);
    let parts: Vec<String> = relative
        .components()
        .map(|part| part.as_os_str().to_string_lossy().into_owned())
        .collect();
    match parts.as_slice() {
        [registry, namespace, model, tag] if registry == "registry.ollama.ai" => {
            if namespace == "library" {
                format!("{model}:{tag}")
            } else {
                format!("{namespace}/{model}:{tag}")
            }
        }
        [registry, namespace, model, tag] => format!("{registry}/{namespace}/{model}:{tag}"),
        _ => relative.display().to_string(),
    }
}

/// The name Ollama gives the model whose weights are `blob` (`<store>/blobs/sha256-<hex>`),
/// from the store's manifests; the first in order when several tags share it.
pub fn name(blob: &Path) -> Option<String> {
    let file = blob.file_name()?.to_str()?;
    let blobs = blob.parent()?;
    if !file.starts_with("sha256-") || blobs.file_name()? != "blobs" {
        return None;
    }
    let root = blobs.parent()?;
    let mut budget = super::WALK_BUDGET;
    manifests(root, &mut budget)
        .iter()
        .filter(|manifest| weights(root, manifest).is_ok_and(|weights| weights == blob))
        .map(|manifest| name_of(root, manifest))
        .min()
}

#[derive(Deserialize)]
struct Manifest {
    layers: Vec<Layer>,
}

#[derive(Deserialize)]
struct Layer {
    #[serde(rename = "mediaType")]
    media_type: String,
    digest: String,
}

/// The blob a manifest names as the model's weights, or why it names none.
pub fn weights(root: &Path, manifest: &Path) -> Result<PathBuf, String> {
    let mut text = String::new();
    fs::File::open(manifest)
        .and_then(|file| file.take(MAX_MANIFEST_BYTES).read_to_string(&mut text))
        .map_err(|err| format!("cannot read its manifest {}: {err}", manifest.display()))?;
    let manifest: Manifest = serde_json::from_str(&text)
        .map_err(|err| format!("its manifest is not one Ollama writes: {err}"))?;
    let layer = manifest
        .layers
        .iter()
        .find(|layer| layer.media_type == MODEL_LAYER)
        .ok_or("its manifest names no weights")?;
    let digest = layer
        .digest
        .strip_prefix("sha256:")
        .filter(|hex| !hex.is_empty() && hex.bytes().all(|byte| byte.is_ascii_hexdigit()))
        .ok_or_else(|| format!("its weights' digest {:?} is not sha256", layer.digest))?;
    Ok(root.join("blobs").join(format!("sha256-{digest}")))
}
