//! Looking for a model on the hub before downloading it: the model-listing API
//! (`/api/models?search=`), and one repository's files with their sizes
//! (`/api/models/{id}/revision/{rev}?blobs=true`), each GGUF file with its quantization, so a
//! user can pick one that fits this machine and fetch it with `models pull org/name:QUANT`.

use serde_json::Value;

use super::error::HubError;
use super::gguf_choice::quant_of;
use super::http;
use super::snapshot::ModelDownloader;

/// A repository the listing found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FoundModel {
    pub id: String,
    pub downloads: u64,
    pub likes: u64,
    /// Its formats, from the hub's tags: "gguf", "safetensors".
    pub formats: Vec<String>,
}

/// One file of a repository.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepositoryFile {
    pub name: String,
    /// In bytes, where the hub says.
    pub size: Option<u64>,
    /// A GGUF file's quantization, from its name ("Q4_K_M").
    pub quant: Option<String>,
}

/// The formats smolchat reads, as the hub tags them.
const FORMATS: [&str; 2] = ["gguf", "safetensors"];

impl ModelDownloader {
    /// Repositories whose name matches `query`, most downloaded first, at most `limit`.
    pub fn search(&self, query: &str, limit: usize) -> Result<Vec<FoundModel>, HubError> {
        let url = format!(
            "{}/api/models?search={}&sort=downloads&direction=-1&limit={limit}",
            self.options().endpoint,
            encode(query)
        );
        let listing = self.get_json(&url)?;
        let models = listing.as_array().ok_or_else(|| HubError::Network {
            url: url.clone(),
            reason: "the model list is not a JSON array".into(),
        })?;
        Ok(models.iter().filter_map(found_model).collect())
    }

    /// The files of repository `model_id` at the configured revision, with their sizes.
    pub fn repository_files(&self, model_id: &str) -> Result<Vec<RepositoryFile>, HubError> {
        let url = format!(
            "{}/api/models/{model_id}/revision/{}?blobs=true",
            self.options().endpoint,
            self.options().revision
        );
        let listing = self.get_json(&url)?;
        let siblings = listing["siblings"]
            .as_array()
            .ok_or_else(|| HubError::Network {
                url: url.clone(),
                reason: "the file list has no siblings".into(),
            })?;
        Ok(siblings
            .iter()
            .filter_map(|sibling| {
                let name = sibling["rfilename"].as_str()?.to_string();
                Some(RepositoryFile {
                    size: sibling["size"].as_u64(),
                    quant: name.ends_with(".gguf").then(|| quant_of(&name)).flatten(),
                    name,
                })
            })
            .collect())
    }

    fn get_json(&self, url: &str) -> Result<Value, HubError> {
        let mut response = http::get(self.agent(), url, None)?;
        let status = response.status().as_u16();
        if status != 200 {
            return Err(HubError::Http {
                url: url.to_string(),
                status,
            });
        }
        let text = response
            .body_mut()
            .read_to_string()
            .map_err(|err| http::network_error(url, err))?;
        serde_json::from_str(&text).map_err(|err| HubError::Network {
            url: url.to_string(),
            reason: format!("the answer is not JSON: {err}"),
        })
    }
}

fn found_model(entry: &Value) -> Option<FoundModel> {
    let tags: Vec<&str> = entry["tags"]
        .as_array()
        .map(|tags| tags.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    Some(FoundModel {
        id: entry["id"].as_str()?.to_string(),
        downloads: entry["downloads"].as_u64().unwrap_or(0),
        likes: entry["likes"].as_u64().unwrap_or(0),
        formats: FORMATS
            .iter()
            .filter(|format| tags.contains(format))
            .map(|format| format.to_string())
            .collect(),
    })
}

/// `query` as a URL's query value: unreserved characters as they are, every other byte
/// percent-encoded.
fn encode(query: &str) -> String {
    query
        .bytes()
        .map(|byte| match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (byte as char).to_string()
            }
            other => format!("%{other:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_query_is_percent_encoded() {
        assert_eq!(encode("qwen3 1.7b&x=é"), "qwen3%201.7b%26x%3D%C3%A9");
    }

    #[test]
    fn a_listing_entry_names_the_formats_smolchat_reads() {
        let entry = serde_json::json!({
            "id": "org/m-GGUF", "downloads": 12, "likes": 3,
            "tags": ["gguf", "text-generation", "license:apache-2.0"]
        });
        let found = found_model(&entry).expect("an id");
        assert_eq!(found.id, "org/m-GGUF");
        assert_eq!((found.downloads, found.likes), (12, 3));
        assert_eq!(found.formats, ["gguf"]);
        assert_eq!(found_model(&serde_json::json!({"downloads": 1})), None);
    }
}
