//! `owner/repo:QUANT`, the form llama.cpp and Ollama take: which `.gguf` file of a repository
//! holding one model in several quantizations is meant.

use std::path::Path;

use super::error::HubError;
use crate::model_files::is_gguf;

/// The file of `files` (a repository's listing) whose name carries `quant` as a whole
/// word, e.g. `Q4_K_M` in `SmolLM2-135M-Instruct-Q4_K_M.gguf` (case does not matter).
pub(crate) fn choose(model_id: &str, quant: &str, files: &[String]) -> Result<String, HubError> {
    let ggufs: Vec<&String> = files
        .iter()
        .filter(|file| is_gguf(Path::new(file)))
        .collect();
    let matching: Vec<&String> = ggufs
        .iter()
        .copied()
        .filter(|file| quant_of(file).is_some_and(|q| q.eq_ignore_ascii_case(quant)))
        .collect();
    match matching.as_slice() {
        [one] => Ok((*one).clone()),
        [] => Err(HubError::NoSuchQuantization {
            model_id: model_id.to_string(),
            quant: quant.to_string(),
            available: ggufs.iter().filter_map(|file| quant_of(file)).collect(),
        }),
        several => Err(HubError::AmbiguousQuantization {
            model_id: model_id.to_string(),
            quant: quant.to_string(),
            files: several.iter().map(|file| (*file).clone()).collect(),
        }),
    }
}

/// The quantization a GGUF file name ends with: the last `-` or `.` separated word of its
/// stem (`...-Q4_K_M.gguf`, `....q8_0.gguf`), upper-cased.
pub(crate) fn quant_of(file: &str) -> Option<String> {
    let stem = Path::new(file).file_stem()?.to_str()?;
    let word = stem.rsplit(['-', '.']).next()?;
    let looks_like_quant = word.len() >= 2
        && word.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && word.chars().any(|c| c.is_ascii_digit());
    looks_like_quant.then(|| word.to_ascii_uppercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(names: &[&str]) -> Vec<String> {
        names.iter().map(|name| name.to_string()).collect()
    }

    #[test]
    fn the_quantization_is_a_whole_word_of_the_file_name() {
        let listing = files(&[
            "README.md",
            "SmolLM2-135M-Instruct-Q4_K_M.gguf",
            "SmolLM2-135M-Instruct-Q4_K_S.gguf",
            "smollm2-135m-instruct.q8_0.gguf",
            "SmolLM2-135M-Instruct-F16.gguf",
        ]);
        assert_eq!(
            choose("o/r", "q4_k_m", &listing).unwrap(),
            "SmolLM2-135M-Instruct-Q4_K_M.gguf"
        );
        assert_eq!(
            choose("o/r", "Q8_0", &listing).unwrap(),
            "smollm2-135m-instruct.q8_0.gguf"
        );
        match choose("o/r", "Q4", &listing).unwrap_err() {
            HubError::NoSuchQuantization { available, .. } => {
                assert_eq!(available, ["Q4_K_M", "Q4_K_S", "Q8_0", "F16"]);
            }
            other => panic!("{other}"),
        }
    }
}
