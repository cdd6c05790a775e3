//! Checks the text pipeline against `reference.json`, produced by Hugging Face
//! transformers from the same fixture files.

use std::path::Path;

use serde_json::Value;
use smolchat::text::{ChatMessage, ChatTemplate, StopTokens, StreamDecoder, TextTokenizer};

const FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/tiny-smollm");

fn fixture() -> &'static Path {
    Path::new(FIXTURE)
}

fn reference() -> Value {
    let path = fixture().join("reference.json");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|err| panic!("fixture {} is missing: {err}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|err| panic!("{} is invalid: {err}", path.display()))
}

fn tokenizer() -> TextTokenizer {
    TextTokenizer::load(fixture()).unwrap_or_else(|err| panic!("fixture tokenizer: {err}"))
}

fn ids(value: &Value) -> Vec<u32> {
    serde_json::from_value(value.clone()).expect("reference ids are a list of u32")
}

fn cases<'a>(reference: &'a Value, key: &str) -> &'a [Value] {
    let cases = reference[key]
        .as_array()
        .unwrap_or_else(|| panic!("reference.json has no `{key}` list"));
    assert!(!cases.is_empty(), "reference.json `{key}` is empty");
    cases
}

/// Streams `ids` through a `StreamDecoder` and returns the concatenated pieces.
fn stream(tokenizer: &TextTokenizer, ids: &[u32], skip_special_tokens: bool) -> String {
    let mut decoder = StreamDecoder::new(tokenizer, skip_special_tokens);
    let mut text = String::new();
    for &id in ids {
        if let Some(piece) = decoder.push(id).expect("push") {
            assert!(!piece.is_empty(), "empty piece for id {id}");
            text.push_str(&piece);
        }
    }
    if let Some(rest) = decoder.finish().expect("finish") {
        text.push_str(&rest);
    }
    text
}

#[test]
fn tokenizer_matches_transformers() {
    let reference = reference();
    let tokenizer = tokenizer();
    for case in cases(&reference, "tokenizer_cases") {
        let text = case["text"].as_str().expect("case text");
        assert_eq!(
            tokenizer.encode(text, false).expect("encode"),
            ids(&case["ids"]),
            "encoding {text:?}"
        );
    }
}

#[test]
fn tokenizer_basics() {
    let tokenizer = tokenizer();
    assert_eq!(tokenizer.token_id("<|im_end|>"), Some(2));
    assert_eq!(tokenizer.token_id("<|im_start|>"), Some(1));
    assert_eq!(tokenizer.token_id("definitely not a token"), None);
    assert_eq!(tokenizer.vocab_size(), 49152);
    let text = "Hello, world! <|im_end|>";
    let encoded = tokenizer.encode(text, false).expect("encode");
    assert_eq!(tokenizer.decode(&encoded, false).expect("decode"), text);
    assert_eq!(
        tokenizer.decode(&encoded, true).expect("decode"),
        "Hello, world! "
    );
}

#[test]
fn chat_template_matches_transformers() {
    let reference = reference();
    let tokenizer = tokenizer();
    let template = ChatTemplate::from_dir(fixture()).expect("template");
    assert!(!template.is_fallback());
    assert_eq!(template.bos_token(), Some("<|im_start|>"));
    assert_eq!(template.eos_token(), Some("<|im_end|>"));
    for case in cases(&reference, "chat_template_cases") {
        let messages: Vec<ChatMessage> =
            serde_json::from_value(case["messages"].clone()).expect("case messages");
        let add_generation_prompt = case["add_generation_prompt"].as_bool().expect("flag");
        let expected_text = case["text"].as_str().expect("case text");
        let text = template
            .render(&messages, add_generation_prompt)
            .expect("render");
        assert_eq!(text, expected_text);
        assert_eq!(
            tokenizer.encode(&text, false).expect("encode"),
            ids(&case["ids"]),
            "ids for {text:?}"
        );
    }
}

#[test]
fn streaming_matches_full_decode() {
    let reference = reference();
    let tokenizer = tokenizer();
    let prompt = reference["prompt"].as_str().expect("prompt");
    let mut sequences = vec![tokenizer.encode(prompt, false).expect("encode prompt")];
    for key in ["tokenizer_cases", "chat_template_cases"] {
        sequences.extend(cases(&reference, key).iter().map(|case| ids(&case["ids"])));
    }
    for sequence in &sequences {
        for skip in [false, true] {
            assert_eq!(
                stream(&tokenizer, sequence, skip),
                tokenizer.decode(sequence, skip).expect("decode"),
                "ids {sequence:?}, skip_special_tokens {skip}"
            );
        }
    }
    assert_eq!(stream(&tokenizer, &sequences[0], false), prompt);
}

#[test]
fn streaming_holds_back_partial_characters() {
    let tokenizer = tokenizer();
    // "🚀" is split over several byte-level tokens.
    let ids = tokenizer.encode(" 🚀", false).expect("encode");
    assert!(
        ids.len() > 1,
        "the rocket should need several tokens: {ids:?}"
    );
    let mut decoder = StreamDecoder::new(&tokenizer, false);
    let pieces: Vec<Option<String>> = ids
        .iter()
        .map(|&id| decoder.push(id).expect("push"))
        .collect();
    for piece in pieces.iter().flatten() {
        assert!(
            !piece.contains('\u{FFFD}'),
            "emitted a broken character: {piece:?}"
        );
    }
    let last = pieces
        .last()
        .cloned()
        .flatten()
        .expect("the last id completes the rocket");
    assert!(last.ends_with('🚀'), "last piece {last:?}");

    // Stopping mid-character: finish() hands over what is held back.
    let mut decoder = StreamDecoder::new(&tokenizer, false);
    assert_eq!(decoder.push(ids[0]).expect("push"), None);
    assert_eq!(
        decoder.finish().expect("finish"),
        Some(tokenizer.decode(&ids[..1], false).expect("decode"))
    );
    assert_eq!(decoder.finish().expect("finish"), None);
}

#[test]
fn streaming_keeps_leading_spaces() {
    let tokenizer = tokenizer();
    let ids = tokenizer.encode("one two three", false).expect("encode");
    let mut decoder = StreamDecoder::new(&tokenizer, false);
    let pieces: Vec<String> = ids
        .iter()
        .filter_map(|&id| decoder.push(id).expect("push"))
        .collect();
    assert_eq!(pieces, ["one", " two", " three"]);
}

#[test]
fn stop_tokens_of_fixture_are_im_end() {
    let tokenizer = tokenizer();
    let stop = StopTokens::from_dir(fixture(), &tokenizer).expect("stop tokens");
    assert_eq!(stop.ids(), &[2]);
    assert!(stop.contains(2));
    assert!(!stop.contains(1));
}
