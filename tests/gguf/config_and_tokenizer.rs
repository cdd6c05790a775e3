//! Model configuration and tokenizer construction on hand-built files: llama.cpp's defaults,
//! RoPE scaling keys, and the named refusals.

use super::builder::{Builder, V};
use smolchat::gguf::{GgufConfig, GgufErrorKind, GgufFile, GgufTokenizer, RopeScaling};

/// A tiny valid Llama: width 8, 2 heads, vocabulary of 4, no optional keys.
fn tiny_llama() -> Builder {
    Builder::default()
        .kv("general.architecture", V::str("llama"))
        .kv("llama.context_length", V::U32(128))
        .kv("llama.embedding_length", V::U32(8))
        .kv("llama.block_count", V::U32(1))
        .kv("llama.feed_forward_length", V::U32(16))
        .kv("llama.attention.head_count", V::U32(2))
        .kv("llama.attention.layer_norm_rms_epsilon", V::F32(1e-6))
        .kv("tokenizer.ggml.tokens", V::strs(&["a", "b", "c", "d"]))
        .f32_tensor("token_embd.weight", &[8, 4], &[0.5; 32])
}

fn config(b: Builder) -> Result<GgufConfig, GgufErrorKind> {
    let file = GgufFile::from_bytes("cfg.gguf", b.build()).unwrap();
    GgufConfig::from_gguf(&file).map_err(|e| e.kind)
}

#[test]
fn defaults_follow_llama_cpp() {
    let c = config(tiny_llama()).unwrap();
    assert_eq!(c.head_count_kv, 2, "defaults to head_count");
    assert_eq!(c.rope_freq_base, 10_000.0);
    assert_eq!(c.rope_dimension_count, 4, "defaults to the head dimension");
    assert_eq!(c.vocab_size, 4, "from the token list");
    assert_eq!(c.rope_scaling, None);
    assert!(c.tied_embeddings);
    let untied = config(tiny_llama().f32_tensor("output.weight", &[8, 4], &[0.0; 32])).unwrap();
    assert!(!untied.tied_embeddings);
}

#[test]
fn rope_scaling_is_reported() {
    let llama3 = tiny_llama()
        .kv("llama.rope.scaling.type", V::str("llama3"))
        .kv("llama.rope.scaling.factor", V::F32(8.0))
        .kv("llama.rope.scaling.original_context_length", V::U64(8192))
        .kv("llama.rope.scaling.low_freq_factor", V::F32(1.0))
        .kv("llama.rope.scaling.high_freq_factor", V::F32(4.0))
        .f32_tensor("rope_freqs.weight", &[2], &[1.0, 8.0]);
    let c = config(llama3).unwrap();
    assert_eq!(
        c.rope_scaling,
        Some(RopeScaling {
            kind: "llama3".into(),
            factor: Some(8.0),
            original_context_length: Some(8192),
            low_freq_factor: Some(1.0),
            high_freq_factor: Some(4.0),
        })
    );
    assert!(c.has_rope_freqs_tensor);
    let none = tiny_llama()
        .kv("llama.rope.scaling.type", V::str("none"))
        .kv("llama.rope.scaling.factor", V::F32(1.0));
    assert_eq!(config(none).unwrap().rope_scaling, None);
    let legacy = config(tiny_llama().kv("llama.rope.scale_linear", V::F32(2.0))).unwrap();
    assert_eq!(
        legacy.rope_scaling.map(|r| (r.kind, r.factor)),
        Some(("linear".into(), Some(2.0)))
    );
}

#[test]
fn refusals_name_what_is_wrong() {
    let mamba = Builder::default().kv("general.architecture", V::str("mamba"));
    let file = GgufFile::from_bytes("m.gguf", mamba.build()).unwrap();
    let err = GgufConfig::from_gguf(&file).unwrap_err();
    assert_eq!(
        err.to_string(),
        "GGUF file m.gguf: architecture \"mamba\" is not supported (smolchat runs llama, qwen2, qwen3, smollm3, phi3, gemma3)"
    );

    let missing = Builder {
        kvs: tiny_llama()
            .kvs
            .into_iter()
            .filter(|(k, _)| k != "llama.block_count")
            .collect(),
        ..tiny_llama()
    };
    assert!(
        matches!(config(missing), Err(GgufErrorKind::MissingKey { key }) if key == "llama.block_count")
    );

    let reasons = [
        (
            tiny_llama().kv("llama.attention.head_count_kv", V::U32(3)),
            "head_count_kv 3",
        ),
        (
            tiny_llama().kv("llama.rope.dimension_count", V::U32(6)),
            "dimension_count 6",
        ),
        (
            tiny_llama().kv("llama.vocab_size", V::U32(5)),
            "expected [8, 5]",
        ),
    ];
    for (b, expected) in reasons {
        match config(b) {
            Err(GgufErrorKind::InvalidConfig { reason }) => {
                assert!(reason.contains(expected), "{reason}")
            }
            other => panic!("{other:?}"),
        }
    }
    let odd_heads = Builder {
        kvs: tiny_llama()
            .kvs
            .into_iter()
            .map(|(k, v)| {
                if k == "llama.attention.head_count" {
                    (k, V::U32(3))
                } else {
                    (k, v)
                }
            })
            .collect(),
        ..tiny_llama()
    };
    assert!(matches!(
        config(odd_heads),
        Err(GgufErrorKind::InvalidConfig { .. })
    ));
}

/// A byte-level BPE vocabulary of six tokens: "ab" and "Ġa" ( " a") are merges.
fn tiny_tokenizer() -> Builder {
    Builder::default()
        .kv("tokenizer.ggml.model", V::str("gpt2"))
        .kv("tokenizer.ggml.pre", V::str("smollm"))
        .kv(
            "tokenizer.ggml.tokens",
            V::strs(&["<|end|>", "a", "b", "ab", "Ġ", "Ġa", "1"]),
        )
        .kv(
            "tokenizer.ggml.token_type",
            V::Arr(5, [3, 1, 1, 1, 1, 1, 1].map(V::I32).to_vec()),
        )
        .kv("tokenizer.ggml.merges", V::strs(&["a b", "Ġ a"]))
        .kv("tokenizer.ggml.eos_token_id", V::U32(0))
}

fn tokenizer(b: Builder) -> Result<GgufTokenizer, GgufErrorKind> {
    let file = GgufFile::from_bytes("tok.gguf", b.build()).unwrap();
    GgufTokenizer::from_gguf(&file).map_err(|e| e.kind)
}

#[test]
fn a_tiny_vocabulary_tokenizes() {
    let t = tokenizer(tiny_tokenizer()).unwrap();
    let enc = t.tokenizer.encode("ab a<|end|>11", true).unwrap();
    assert_eq!(enc.get_tokens(), ["ab", "Ġa", "<|end|>", "1", "1"]);
    assert_eq!(enc.get_ids(), [3, 5, 0, 6, 6]);
    assert_eq!(t.tokenizer.decode(enc.get_ids(), true).unwrap(), "ab a11");
    assert_eq!(
        (
            t.eos_token_id,
            t.bos_token_id,
            t.special_token_ids.as_slice()
        ),
        (Some(0), None, &[0][..])
    );
    assert_eq!(t.chat_template, None);
}

#[test]
fn tokenizer_refusals() {
    let spm = tiny_tokenizer().kv("tokenizer.ggml.model", V::str("llama"));
    // The later key is a duplicate, which the parser itself refuses; rebuild without it instead.
    assert!(GgufFile::from_bytes("t", spm.build()).is_err());
    let replace = |key: &str, v: V| Builder {
        kvs: tiny_tokenizer()
            .kvs
            .into_iter()
            .map(|(k, old)| if k == key { (k, v.clone()) } else { (k, old) })
            .collect(),
        ..tiny_tokenizer()
    };
    assert!(matches!(
        tokenizer(replace("tokenizer.ggml.model", V::str("bert"))),
        Err(GgufErrorKind::UnsupportedTokenizerModel { found }) if found == "bert"
    ));
    match tokenizer(replace("tokenizer.ggml.pre", V::str("falcon"))) {
        Err(e @ GgufErrorKind::UnsupportedPreTokenizer { .. }) => {
            assert!(
                e.to_string()
                    .contains("\"falcon\" is not supported (known: smollm, starcoder, gpt-2"),
                "{e}"
            )
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        tokenizer(replace("tokenizer.ggml.eos_token_id", V::U32(7))),
        Err(GgufErrorKind::InvalidValue { key, .. }) if key == "tokenizer.ggml.eos_token_id"
    ));
    let errors = [
        (
            replace("tokenizer.ggml.merges", V::strs(&["ab"])),
            "merge \"ab\"",
        ),
        (
            replace("tokenizer.ggml.merges", V::strs(&["a x"])),
            "building the BPE model",
        ),
        (
            replace("tokenizer.ggml.token_type", V::Arr(5, vec![V::I32(1)])),
            "1 entries for 7 tokens",
        ),
        (
            replace("tokenizer.ggml.tokens", V::strs(&["a", "a"])),
            "token \"a\" appears more than once",
        ),
    ];
    for (b, expected) in errors {
        match tokenizer(b) {
            Err(GgufErrorKind::Tokenizer { reason }) => {
                assert!(reason.contains(expected), "{reason}")
            }
            other => panic!("{expected}: {other:?}"),
        }
    }
}
