//! llama.cpp's own tokenizer tests, run against our GGUF tokenizer: vocabulary-only GGUF files
//! with inputs and the ids Hugging Face's tokenizer gave for them. These cover pre-tokenizers
//! the SmolLM2 file does not use (Llama 3's `llama-bpe`, `gpt2`, Qwen's `qwen2`) and a second
//! vocabulary for SmolLM2's regexes (`starcoder`), and a GGUF with no tensors at all.

use smolchat::gguf::{GgufFile, GgufTokenizer};

/// Runs `ggml-vocab-{name}.gguf` against its `.inp`/`.out` pair; returns the number of cases.
fn check(name: &str, expected_pre: &str) -> usize {
    let dir = super::builder::vocab_test_dir();
    let base = dir.join(format!("ggml-vocab-{name}.gguf"));
    let file = GgufFile::open(&base).unwrap();
    assert!(file.tensors().is_empty());
    let tok = GgufTokenizer::from_gguf(&file).unwrap();
    assert_eq!(tok.pre_tokenizer, expected_pre);

    let inputs = std::fs::read_to_string(base.with_extension("gguf.inp")).unwrap();
    let outputs = std::fs::read_to_string(base.with_extension("gguf.out")).unwrap();
    // Cases are separated by this marker line, and the file ends with one.
    let inputs: Vec<&str> = inputs.split("\n__ggml_vocab_test__\n").collect();
    let outputs: Vec<&str> = outputs.split('\n').collect();
    assert_eq!(inputs.len(), outputs.len());
    let cases = inputs.len() - 1;
    for (text, ids) in inputs.iter().zip(&outputs).take(cases) {
        let want: Vec<u32> = ids
            .split_whitespace()
            .map(|id| id.parse().unwrap())
            .collect();
        let got = tok.tokenizer.encode(*text, false).unwrap();
        assert_eq!(got.get_ids(), want, "{name}: {text:?}");
        assert_eq!(
            tok.tokenizer.decode(&want, false).unwrap(),
            *text,
            "{name}: decode of {text:?}"
        );
    }
    cases
}

#[test]
fn llama3_llama_bpe() {
    let n = check("llama-bpe", "llama-bpe");
    eprintln!("llama-bpe: {n} cases");
}

#[test]
fn llama3_adds_bos_when_asked() {
    let dir = super::builder::vocab_test_dir();
    let file = GgufFile::open(dir.join("ggml-vocab-llama-bpe.gguf")).unwrap();
    let tok = GgufTokenizer::from_gguf(&file).unwrap();
    // The file has no `tokenizer.ggml.add_bos_token`; llama.cpp defaults it on for Llama 3.
    assert!(tok.add_bos_token);
    let with = tok.tokenizer.encode("Hello world", true).unwrap();
    let without = tok.tokenizer.encode("Hello world", false).unwrap();
    assert_eq!(with.get_ids()[0], tok.bos_token_id.unwrap());
    assert_eq!(with.get_tokens()[0], "<|begin_of_text|>");
    assert_eq!(&with.get_ids()[1..], without.get_ids());
}

#[test]
fn starcoder_shares_smollm_regexes() {
    let n = check("starcoder", "starcoder");
    eprintln!("starcoder: {n} cases");
}

#[test]
fn gpt2() {
    let n = check("gpt-2", "gpt-2");
    eprintln!("gpt-2: {n} cases");
}

/// Qwen2, Qwen2.5 and Qwen3 share this vocabulary and split.
#[test]
fn qwen2() {
    let n = check("qwen2", "qwen2");
    eprintln!("qwen2: {n} cases");
}

/// SentencePiece (`tokenizer.ggml.model` `llama`): Llama 2's vocabulary, and Phi-3's.
#[test]
fn llama_spm() {
    let n = check("llama-spm", "default");
    eprintln!("llama-spm: {n} cases");
}

#[test]
fn phi3() {
    let n = check("phi-3", "default");
    eprintln!("phi-3: {n} cases");
}
