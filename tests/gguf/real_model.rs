//! The genuine SmolLM2-135M-Instruct Q4_1 file: its metadata, its tensors, and a tokenizer
//! built from it that must agree with the model's own `tokenizer.json`.

use std::collections::BTreeMap;

use smolchat::gguf::{GgmlType, GgufConfig, GgufFile, GgufTokenizer, unpermute_qk_rows};
use tokenizers::Tokenizer;

fn open() -> GgufFile {
    GgufFile::open(super::builder::real_model()).expect("the real file opens")
}

#[test]
fn metadata_and_config() {
    let file = open();
    assert_eq!(file.version(), 3);
    assert_eq!(file.get_str("general.architecture").unwrap(), "llama");
    assert_eq!(file.tensors().len(), 272);
    let config = GgufConfig::from_gguf(&file).unwrap();
    let expected = GgufConfig {
        architecture: "llama".into(),
        context_length: 8192,
        embedding_length: 576,
        block_count: 30,
        feed_forward_length: 1536,
        head_count: 9,
        head_count_kv: 3,
        key_length: 64,
        rope_freq_base: 100_000.0,
        rms_norm_eps: 1e-5,
        vocab_size: 49152,
        rope_dimension_count: 64,
        rope_scaling: None,
        has_rope_freqs_tensor: false,
        tied_embeddings: true,
        sliding_window: None,
        sliding_window_pattern: None,
        rope_freq_base_swa: None,
        final_logit_softcapping: None,
        long_rope: None,
    };
    assert_eq!(config, expected);
    assert_eq!(config.head_dim(), 64);

    // The same facts as the Hugging Face config.json of the model.
    let hf: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/smollm2-135m-instruct/config.json"
        ))
        .unwrap(),
    )
    .unwrap();
    assert_eq!(hf["hidden_size"], config.embedding_length);
    assert_eq!(hf["num_hidden_layers"], config.block_count);
    assert_eq!(hf["intermediate_size"], config.feed_forward_length);
    assert_eq!(hf["num_attention_heads"], config.head_count);
    assert_eq!(hf["num_key_value_heads"], config.head_count_kv);
    assert_eq!(hf["vocab_size"], config.vocab_size);
    assert_eq!(
        hf["rope_theta"].as_f64().unwrap() as f32,
        config.rope_freq_base
    );
    assert_eq!(
        hf["rms_norm_eps"].as_f64().unwrap() as f32,
        config.rms_norm_eps
    );
    assert_eq!(hf["tie_word_embeddings"], config.tied_embeddings);
}

#[test]
fn tensor_types_and_shapes() {
    let file = open();
    let mut by_type: BTreeMap<&str, usize> = BTreeMap::new();
    for t in file.tensors() {
        *by_type.entry(t.ggml_type.name()).or_default() += 1;
    }
    eprintln!("tensor types: {by_type:?}");
    assert_eq!(
        by_type,
        BTreeMap::from([("F32", 61), ("Q4_1", 210), ("Q8_0", 1)])
    );
    let embd = file.tensor_info("token_embd.weight").unwrap();
    assert_eq!(
        (embd.ggml_type, embd.dims.as_slice()),
        (GgmlType::Q8_0, &[576, 49152][..])
    );
    let q = file.tensor_info("blk.0.attn_q.weight").unwrap();
    assert_eq!((q.ggml_type, q.shape()), (GgmlType::Q4_1, vec![576, 576]));
    assert_eq!(
        file.tensor_info("blk.29.attn_k.weight").unwrap().shape(),
        [192, 576]
    );
    assert_eq!(
        file.tensor_info("blk.0.ffn_down.weight").unwrap().shape(),
        [576, 1536]
    );
    assert!(file.tensor_info("output.weight").is_none());
}

/// Mean, standard deviation and the extreme |x| of a slice, in f64.
fn stats(xs: &[f32]) -> (f64, f64, f64) {
    let n = xs.len() as f64;
    let mean = xs.iter().map(|&x| x as f64).sum::<f64>() / n;
    let var = xs.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / n;
    let max = xs.iter().map(|&x| (x as f64).abs()).fold(0.0, f64::max);
    (mean, var.sqrt(), max)
}

#[test]
fn dequantized_weights_look_like_trained_weights() {
    let file = open();
    // Every token embedding row (Q8_0) has a finite, non-zero norm.
    let embd = file.tensor("token_embd.weight").unwrap();
    let mut row = vec![0f32; 576];
    let mut norms = Vec::with_capacity(49152);
    for r in 0..embd.info.n_rows() {
        embd.dequantize_row(r, &mut row).unwrap();
        let norm = row.iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!(norm.is_finite() && norm > 0.0, "token {r} has norm {norm}");
        norms.push(norm);
    }
    let (mean_norm, _, max_norm) = stats(&norms);
    eprintln!("token_embd row norms: mean {mean_norm:.3}, max {max_norm:.3}");

    // Q4_1 matrices: centred near zero, finite, with a spread a trained 576-wide layer has.
    for t in file
        .tensors()
        .iter()
        .filter(|t| t.ggml_type == GgmlType::Q4_1)
    {
        let values = file.tensor(&t.name).unwrap().to_f32_vec().unwrap();
        assert!(values.iter().all(|x| x.is_finite()), "{}", t.name);
        let (mean, std, max) = stats(&values);
        assert!(mean.abs() < 0.01, "{}: mean {mean}", t.name);
        assert!((0.005..0.5).contains(&std), "{}: std {std}", t.name);
        assert!(max < 20.0, "{}: max |x| {max}", t.name);
        // Q4_1 has 16 levels per 32-element block: no block may decode to more than 16 values.
        for block in values.chunks(32).take(64) {
            let mut distinct: Vec<u32> = block.iter().map(|x| x.to_bits()).collect();
            distinct.sort_unstable();
            distinct.dedup();
            assert!(distinct.len() <= 16, "{}", t.name);
        }
    }
    // RMSNorm gains (F32, read as stored): finite, bounded, not all zero. (Their scale varies
    // by layer: blk.0.attn_norm averages 0.001 with both signs, blk.0.ffn_norm about 0.1.)
    for t in file
        .tensors()
        .iter()
        .filter(|t| t.ggml_type == GgmlType::F32)
    {
        let values = file.tensor(&t.name).unwrap().to_f32_vec().unwrap();
        let (_, std, max) = stats(&values);
        assert!(
            max.is_finite() && max > 0.0 && max < 100.0,
            "{}: max |x| {max}",
            t.name
        );
        assert!(std.is_finite(), "{}", t.name);
    }
}

/// Evidence for llama.cpp's Q/K row permutation. In Hugging Face's layout the two coordinates
/// RoPE rotates together are `i` and `i + head_dim/2` of a head; the converter moves them to
/// rows `2i` and `2i + 1`. Rotated partners carry similar weight (the rotation mixes them), so
/// in the file the norms of rows `2i` and `2i + 1` should agree far better than those of rows
/// `i` and `i + 32`, and after `unpermute_qk_rows` the other way round. `v` is not permuted
/// and shows no such pattern (printed for comparison).
#[test]
fn q_and_k_rows_are_interleaved_by_the_converter() {
    let file = open();
    const HEAD_DIM: usize = 64;
    // Mean |log(norm a / norm b)| over the row pairs `pair(i)` (offsets within a head).
    let mismatch = |w: &[f32], cols: usize, pair: fn(usize) -> (usize, usize)| -> f64 {
        let rows = w.len() / cols;
        let norm = |r: usize| {
            w[r * cols..(r + 1) * cols]
                .iter()
                .map(|x| (x * x) as f64)
                .sum::<f64>()
                .sqrt()
        };
        let pairs: Vec<(usize, usize)> = (0..rows / HEAD_DIM)
            .flat_map(|head| (0..HEAD_DIM / 2).map(move |i| (head, pair(i))))
            .map(|(head, (a, b))| (head * HEAD_DIM + a, head * HEAD_DIM + b))
            .collect();
        pairs
            .iter()
            .map(|&(a, b)| (norm(a).ln() - norm(b).ln()).abs())
            .sum::<f64>()
            / pairs.len() as f64
    };
    let adjacent: fn(usize) -> (usize, usize) = |i| (2 * i, 2 * i + 1);
    let halves: fn(usize) -> (usize, usize) = |i| (i, i + HEAD_DIM / 2);
    let mut evidence = Vec::new();
    for layer in 0..30 {
        for which in ["attn_q", "attn_k", "attn_v"] {
            let name = format!("blk.{layer}.{which}.weight");
            let t = file.tensor(&name).unwrap();
            let cols = t.info.row_len() as usize;
            let w = t.to_f32_vec().unwrap();
            let (adj, half) = (mismatch(&w, cols, adjacent), mismatch(&w, cols, halves));
            // After undoing the converter, the partners must be rows i and i + 32 instead.
            let hf_half = mismatch(&unpermute_qk_rows(&w, cols, HEAD_DIM), cols, halves);
            if layer % 10 == 0 || layer == 29 {
                eprintln!(
                    "{name}: mean |log norm ratio| of rows 2i/2i+1 {adj:.3}, rows i/i+32 {half:.3}"
                );
            }
            evidence.push((which, adj, half, hf_half));
        }
    }
    for which in ["attn_q", "attn_k"] {
        let mean_of = |f: fn(&(&str, f64, f64, f64)) -> f64| -> f64 {
            evidence.iter().filter(|e| e.0 == which).map(f).sum::<f64>() / 30.0
        };
        let (adj, half) = (mean_of(|e| e.1), mean_of(|e| e.2));
        eprintln!("{which}, mean of 30 layers: rows 2i/2i+1 {adj:.3}, rows i/i+32 {half:.3}");
        assert!(
            adj < 0.75 * half,
            "{which}: stored partners should be adjacent rows"
        );
        let layers_agreeing = evidence
            .iter()
            .filter(|e| e.0 == which && e.1 < e.2)
            .count();
        assert!(
            layers_agreeing >= 27,
            "{which}: only {layers_agreeing}/30 layers show the pattern"
        );
        // Unpermuted, the partners are rows i and i+32: the very pairs that were adjacent. (Norms
        // cannot tell these from the rows then adjacent, which are neighbouring frequencies and
        // so similar too: about 0.16 either way.)
        for &(_, adj, _, hf_half) in evidence.iter().filter(|e| e.0 == which) {
            assert!(
                (hf_half - adj).abs() < 1e-9,
                "{which}: unpermuting should move partners to i, i+32"
            );
        }
    }
}

/// Text that exercises every rule of the pre-tokenizer and the byte-level fallback.
const CORPUS: &[&str] = &[
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "I'm sure they'll say we've done it; she'd agree, wouldn't you?",
    "Où est la bibliothèque ? Ça dépend : à côté de l'église, près du théâtre.",
    "Größenmaßstäbe für Übergänge — ça ne coûte « que » 5 €.",
    "我们今天去公园散步，天气很好。",
    "日本語のテキストと한국어 텍스트",
    "Emoji: 🦙🚀👍🏽 and 👨‍👩‍👧‍👦 family, flags 🇫🇷🇯🇵",
    "Digits 1234567 and 3.14159, 2024-01-31, 1,000,000.00 and ٣٤٥",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "fn main() {\n\tlet x = vec![1, 2, 3];\n\tprintln!(\"{x:?}\");\n}\n",
    "tabs\tand\t\tdouble tabs\t\t\tand trailing   ",
    "   leading spaces and    runs of     spaces   ",
    "\n\n\n",
    "line one\n\nline three\r\nwindows line\r\n",
    " ",
    "",
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>",
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n",
    "<|endoftext|><repo_name>smolchat<file_sep>src/main.rs<gh_stars>100",
    "not special: <|im_start and im_end|> and <| im_start |>",
    "URL https://huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct?x=1&y=%20 e-mail a.b@c.de",
    "ÀÉÎÕÜ àéîõü ÆØÅ æøå ß ẞ",
    "Zero-width\u{200b}joiner\u{200d}and\u{feff}BOM, combining e\u{301} vs é",
    "Control chars \u{1}\u{7f} and NUL-free binary-ish ÿþ",
    "'s 't 're 've 'm 'll 'd 'S 'T",
    "Привет, мир! Γειά σου κόσμε! مرحبا بالعالم",
    "    indented code\n\t\ttabbed\n  \t mixed",
    "a\u{a0}b non-breaking space and\u{3000}ideographic space",
];

#[test]
fn tokenizer_matches_tokenizer_json() {
    let (file, json) = (open(), super::builder::reference_tokenizer_json());
    let ours = GgufTokenizer::from_gguf(&file).unwrap();
    let reference = Tokenizer::from_file(json).unwrap();

    assert_eq!(ours.pre_tokenizer, "smollm");
    assert_eq!(
        (ours.bos_token_id, ours.eos_token_id, ours.padding_token_id),
        (Some(1), Some(2), Some(2))
    );
    assert_eq!(ours.unknown_token_id, Some(0));
    assert!(!ours.add_bos_token && !ours.add_eos_token);
    assert_eq!(ours.special_token_ids, (0..17).collect::<Vec<u32>>());
    let template = ours.chat_template.as_deref().unwrap();
    assert!(
        template.starts_with("{% for message in messages %}"),
        "{template}"
    );
    assert_eq!(ours.tokenizer.get_vocab(true), reference.get_vocab(true));

    let mut checked = 0;
    for text in CORPUS {
        for add_special in [false, true] {
            let got = ours.tokenizer.encode(*text, add_special).unwrap();
            let want = reference.encode(*text, add_special).unwrap();
            assert_eq!(
                got.get_ids(),
                want.get_ids(),
                "ids of {text:?} (add_special_tokens {add_special})"
            );
            assert_eq!(got.get_tokens(), want.get_tokens(), "{text:?}");
            checked += 1;
        }
        let ids = ours
            .tokenizer
            .encode(*text, false)
            .unwrap()
            .get_ids()
            .to_vec();
        let decoded = ours.tokenizer.decode(&ids, false).unwrap();
        assert_eq!(decoded, *text, "round trip of {text:?}");
        for skip in [false, true] {
            assert_eq!(
                decoded_by(&ours.tokenizer, &ids, skip),
                decoded_by(&reference, &ids, skip),
                "{text:?}"
            );
        }
    }
    eprintln!("{checked} encodings identical to tokenizer.json");
}

fn decoded_by(t: &Tokenizer, ids: &[u32], skip_special: bool) -> String {
    t.decode(ids, skip_special).unwrap()
}

/// Every single token decodes alike, including the ones no corpus text would produce.
#[test]
fn every_token_decodes_like_tokenizer_json() {
    let (file, json) = (open(), super::builder::reference_tokenizer_json());
    let ours = GgufTokenizer::from_gguf(&file).unwrap().tokenizer;
    let reference = Tokenizer::from_file(json).unwrap();
    for id in 0..49152u32 {
        assert_eq!(
            ours.decode(&[id], false).unwrap(),
            reference.decode(&[id], false).unwrap(),
            "token {id}"
        );
    }
}

/// Real tensors decode bit-identically to gguf-py (hashes from `make_real_tensor_hashes.py`).
#[test]
fn real_tensors_match_gguf_py_bit_for_bit() {
    let file = open();
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/gguf/real_tensor_hashes.json"
    );
    let reference: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    const K: u64 = 0x9E37_79B9_7F4A_7C15;
    for (name, want) in reference["tensors"].as_object().unwrap() {
        let values = file.tensor(name).unwrap().to_f32_vec().unwrap();
        assert_eq!(values.len() as u64, want["n"].as_u64().unwrap(), "{name}");
        let mut power = 1u64;
        let mut hash = 0u64;
        for v in &values {
            power = power.wrapping_mul(K);
            hash = hash.wrapping_add((v.to_bits() as u64).wrapping_mul(power));
        }
        assert_eq!(hash, want["hash"].as_u64().unwrap(), "{name}");
    }
}
