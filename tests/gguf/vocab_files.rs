//! llama.cpp's own tokenizer tests, run against our GGUF tokenizer: vocabulary-only GGUF files
//! with inputs and the ids Hugging Face's tokenizer gave for them. These cover pre-tokenizers
//! the SmolLM2 file does not use (Llama 3's `llama-bpe`, `gpt2`, Qwen's `qwen2`) and a second
//! vocabulary for SmolLM2's regexes (`starcoder`), and a GGUF with no tensors at all.

use std::path::Path;

use smolchat::gguf::{GgufFile, GgufTokenizer};

/// Runs `ggml-vocab-{name}.gguf` against its `.inp`/`.out` pair; returns the number of cases.
fn check(name: &str, expected_pre: &str) -> usize {
    let base = super::builder::vocab_test_dir().join(format!("ggml-vocab-{name}.gguf"));
    check_files(
        &base,
        &base.with_extension("gguf.inp"),
        &base.with_extension("gguf.out"),
        name,
        expected_pre,
    )
}

/// A vocabulary file against inputs and the ids expected for them.
fn check_files(
    gguf: &Path,
    inputs: &Path,
    outputs: &Path,
    name: &str,
    expected_pre: &str,
) -> usize {
    let file = GgufFile::open(gguf).unwrap();
    assert!(file.tensors().is_empty());
    let tok = GgufTokenizer::from_gguf(&file).unwrap();
    assert_eq!(tok.pre_tokenizer, expected_pre);

    let inputs = std::fs::read_to_string(inputs).unwrap();
    let outputs = std::fs::read_to_string(outputs).unwrap();
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

/// GPT-4o's split (`gpt-4o`, Phi-4-mini's GGUF files), over the Llama 3 test vocabulary
/// renamed to it, against tiktoken's o200k pattern on the same ranks
/// (`tests/reference/gpt4o_vocab_reference.py`): llama.cpp's cases and some that tell it
/// from Llama 3's split.
#[test]
fn gpt4o_on_the_llama3_vocabulary() {
    let dir = super::builder::vocab_test_dir();
    let source = dir.join("ggml-vocab-llama-bpe.gguf");
    let renamed = tempfile::tempdir().unwrap();
    let gguf = renamed.path().join("ggml-vocab-gpt-4o.gguf");
    std::fs::write(
        &gguf,
        with_pre_tokenizer(&std::fs::read(&source).unwrap(), "gpt-4o"),
    )
    .unwrap();
    let cases = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/vocab");
    let n = check_files(
        &gguf,
        &cases.join("gpt-4o-on-llama-bpe.inp"),
        &cases.join("gpt-4o-on-llama-bpe.out"),
        "gpt-4o",
        "gpt-4o",
    );
    eprintln!("gpt-4o: {n} cases");
}

/// `file` with `tokenizer.ggml.pre` set to `pre`: a GGUF string is a little-endian u64
/// length and its bytes. The file keeps its length (zeros after a shorter value's end),
/// which a vocabulary-only file, with no tensor data, allows.
fn with_pre_tokenizer(file: &[u8], pre: &str) -> Vec<u8> {
    let key = b"tokenizer.ggml.pre";
    let mut marker = (key.len() as u64).to_le_bytes().to_vec();
    marker.extend_from_slice(key);
    let at = file
        .windows(marker.len())
        .position(|window| window == marker)
        .expect("the file names a pre-tokenizer")
        + marker.len();
    assert_eq!(file[at..at + 4], 8u32.to_le_bytes(), "a string value");
    let start = at + 4;
    let length = u64::from_le_bytes(file[start..start + 8].try_into().unwrap()) as usize;
    let mut out = file[..start].to_vec();
    out.extend_from_slice(&(pre.len() as u64).to_le_bytes());
    out.extend_from_slice(pre.as_bytes());
    out.extend_from_slice(&file[start + 8 + length..]);
    out.resize(file.len().max(out.len()), 0);
    out
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
