//! What a model on disk is, from its files alone (a GGUF file's header, a folder's
//! `config.json`), never its weights: cheap enough to read for every model the library finds,
//! so that each entry says whether this build runs it and whether it fits before it is opened.

use std::path::Path;

use crate::generation::{MemoryPlan, available_memory, gguf_model_config, model_config};
use crate::gguf::GgufFile;
use crate::model_files::{is_gguf, weight_bytes};
use crate::model_library::LocalModel;

/// A model this build can run, as its files describe it.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelFacts {
    /// The family's transformers class, e.g. "Qwen3ForCausalLM".
    pub family: &'static str,
    /// The number of weights, where the files say without reading them (GGUF files).
    pub parameters: Option<u64>,
    /// How the weights are stored: a GGUF file's tensor types, most first ("Q4_K ×196, Q6_K
    /// ×29, F32 ×57"), or a folder's `torch_dtype`.
    pub weights: Option<String>,
    /// The memory it takes, and the context it gets, on this machine now.
    pub plan: MemoryPlan,
    /// Whether it fits in the memory free now; `None` where that is unknown.
    pub fits: Option<bool>,
}

/// A model the library found, with its facts or why this build cannot run it.
#[derive(Debug, Clone, PartialEq)]
pub struct Described {
    pub model: LocalModel,
    pub facts: Result<ModelFacts, String>,
}

/// Reads the facts of every model found: a header each, on the caller's thread.
pub fn describe_all(models: Vec<LocalModel>) -> Vec<Described> {
    models
        .into_iter()
        .map(|model| Described {
            facts: read(&model.path),
            model,
        })
        .collect()
}

/// The facts of the model at `path` (a `.gguf` file or a model folder); or why this build
/// cannot run it (an unsupported family, a damaged file).
pub fn read(path: &Path) -> Result<ModelFacts, String> {
    let (config, parameters, weights) = if is_gguf(path) {
        let file = GgufFile::open(path).map_err(|err| err.to_string())?;
        let config = gguf_model_config(&file).map_err(|err| err.to_string())?;
        let parameters = file.tensors().iter().map(|tensor| tensor.n_elements).sum();
        (config, Some(parameters), Some(tensor_types(&file)))
    } else {
        let config = model_config(path).map_err(|err| err.to_string())?;
        let dtype = config.torch_dtype.clone();
        (config, None, dtype)
    };
    let family = config
        .architecture()
        .map_err(|err| err.to_string())?
        .transformers_class();
    let available = available_memory();
    let plan = MemoryPlan::new(&config, weight_bytes(path), available);
    Ok(ModelFacts {
        family,
        parameters,
        weights,
        plan,
        fits: available.map(|bytes| plan.fits_in(bytes)),
    })
}

/// How many tensors the file holds in each type, most first: "Q4_K ×196, Q6_K ×29, F32 ×57".
fn tensor_types(file: &GgufFile) -> String {
    let mut counts: Vec<(String, usize)> = Vec::new();
    for tensor in file.tensors() {
        let name = tensor.ggml_type.to_string();
        match counts.iter_mut().find(|(kind, _)| *kind == name) {
            Some((_, count)) => *count += 1,
            None => counts.push((name, 1)),
        }
    }
    if counts.is_empty() {
        return "none (a vocabulary only)".into();
    }
    counts.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    counts
        .iter()
        .map(|(kind, count)| format!("{kind} \u{d7}{count}"))
        .collect::<Vec<_>>()
        .join(", ")
}

impl ModelFacts {
    /// The storage type most of the weights have: "Q4_K", or a folder's "bfloat16".
    pub fn main_type(&self) -> Option<&str> {
        let weights = self.weights.as_deref()?;
        Some(weights.split(" \u{d7}").next().unwrap_or(weights))
    }

    /// The family as people name it: "Llama", "Qwen3", "Gemma3".
    pub fn family_name(&self) -> &'static str {
        ["ForCausalLM", "ForConditionalGeneration"]
            .iter()
            .find_map(|suffix| self.family.strip_suffix(suffix))
            .unwrap_or(self.family)
    }

    /// "135M", "1.7B": the size people name a model by.
    pub fn size_name(&self) -> Option<String> {
        let parameters = self.parameters? as f64;
        Some(if parameters >= 1e9 {
            format!("{:.1}B", parameters / 1e9)
        } else {
            format!("{:.0}M", parameters / 1e6)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn genuine() -> std::path::PathBuf {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/models/SmolLM2-135M-Instruct.Q4_1.gguf");
        assert!(
            path.is_file(),
            "{} is missing: run .ci/setup",
            path.display()
        );
        path
    }

    #[test]
    fn a_gguf_file_is_read_from_its_header() {
        let facts = read(&genuine()).expect("runs here");
        assert_eq!(facts.family, "LlamaForCausalLM");
        assert_eq!(facts.family_name(), "Llama");
        assert_eq!(facts.size_name().as_deref(), Some("135M"));
        assert_eq!(
            facts.weights.as_deref(),
            Some("Q4_1 \u{d7}210, F32 \u{d7}61, Q8_0 \u{d7}1")
        );
        assert_eq!(facts.main_type(), Some("Q4_1"));
        assert_eq!(facts.plan.model_context, 8192);
    }

    #[test]
    fn a_folder_is_read_from_its_config() {
        let folder = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-smollm");
        let facts = read(&folder).expect("runs here");
        assert_eq!(facts.family, "LlamaForCausalLM");
        assert_eq!(facts.main_type(), Some("bfloat16"));
        assert_eq!(facts.parameters, None);
    }

    #[test]
    fn an_unsupported_family_says_why() {
        let vocabulary_only = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/models/llama.cpp-vocab/ggml-vocab-gpt-2.gguf");
        let reason = read(&vocabulary_only).unwrap_err();
        assert!(reason.contains("\"gpt2\" is not supported"), "{reason}");
    }
}
