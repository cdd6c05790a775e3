//! A `tokenizers::Tokenizer` assembled from the vocabulary a GGUF file carries.
//!
//! A GGUF file is self-contained: `tokenizer.ggml.*` holds the vocabulary, merges (or, for
//! SentencePiece vocabularies, scores) and token types that a `tokenizer.json` would, but not
//! the pre-tokenizer, which
//! llama.cpp identifies only by name (`tokenizer.ggml.pre`) and implements in its own code.
//! We rebuild the same pipeline from Hugging Face's pieces (BPE model, regex `Split`s,
//! `ByteLevel`) instead of writing a tokenizer, so the result is tested against the model's own
//! `tokenizer.json` and shares its battle-tested BPE.
//!
//! The pre-tokenizer table is deliberately short: each name maps to llama.cpp's regex list
//! (`llm_tokenizer_bpe` in `llama-vocab.cpp`) or to the `tokenizer.json` it was converted
//! from, and only names checked against a real tokenizer are admitted. An unknown name is an
//! error, because a wrong pre-tokenizer gives plausible but different token ids, which the
//! model then reads as slightly wrong text.

use tokenizers::decoders::DecoderWrapper;
use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::models::bpe::{BPE, Vocab};
use tokenizers::normalizers::{
    NormalizerWrapper, Prepend, Replace, Sequence as NormalizerSequence,
};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::{AddedToken, SplitDelimiterBehavior, Tokenizer};

use super::error::{GgufError, GgufErrorKind};
use super::file::GgufFile;

/// GPT-2's split: contractions, letters, digits, other symbols, each optionally after one
/// space; whitespace runs keep their last space for the following word. This is the regex
/// `ByteLevel { use_regex: true }` applies; llama.cpp drops the final `|\s+`, which changes
/// nothing because unmatched text becomes a piece of its own either way.
const GPT2_REGEX: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";

/// Llama 3's split, as in its `tokenizer.json`: case-insensitive contractions, a letter run
/// with at most one leading non-letter, digits in groups of at most three, and newlines kept
/// with the whitespace before them.
const LLAMA3_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Qwen2's split (Qwen2, Qwen2.5 and Qwen3 share it): Llama 3's, but every digit alone.
const QWEN2_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// tiktoken's o200k split (GPT-4o's vocabulary, and Phi-4-mini's): a letter run is capitals
/// then lower case, or capitals alone, with marks and caseless letters joining either side and
/// case-insensitive contractions attached; digits in groups of at most three; symbols keep the
/// newlines and slashes after them. As tiktoken writes it; llama.cpp rewrites the letter
/// classes for its regex engine ("not a-z" for capitals), and agreed on every test case.
const GPT4O_REGEX: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// How one `tokenizer.ggml.pre` name pre-tokenizes.
struct PreTokenizerSpec {
    /// `tokenizer.ggml.pre` values llama.cpp treats this way.
    names: &'static [&'static str],
    /// Applied in order, each splitting the pieces the previous one produced.
    regexes: &'static [&'static str],
    /// Look a whole piece up in the vocabulary before merging (Llama 3 does; merges could
    /// otherwise fail to rebuild some long tokens).
    ignore_merges: bool,
    /// Whether llama.cpp prepends BOS when `tokenizer.ggml.add_bos_token` is absent.
    add_bos_default: bool,
}

const PRE_TOKENIZERS: &[PreTokenizerSpec] = &[
    // SmolLM2 and StarCoder: every digit alone, then GPT-2's split.
    PreTokenizerSpec {
        names: &["smollm", "starcoder"],
        regexes: &[r"\p{N}", GPT2_REGEX],
        ignore_merges: false,
        add_bos_default: false,
    },
    PreTokenizerSpec {
        names: &["gpt-2"],
        regexes: &[GPT2_REGEX],
        ignore_merges: false,
        add_bos_default: false,
    },
    PreTokenizerSpec {
        names: &["qwen2", "deepseek-r1-qwen"],
        regexes: &[QWEN2_REGEX],
        ignore_merges: false,
        add_bos_default: false,
    },
    PreTokenizerSpec {
        names: &["gpt-4o"],
        regexes: &[GPT4O_REGEX],
        // tiktoken takes a piece that is a token whole. llama.cpp builds every piece from
        // merges, and some tokens are out of their reach ("Cửa Việt" takes it five tokens
        // where tiktoken takes three).
        ignore_merges: true,
        add_bos_default: false,
    },
    PreTokenizerSpec {
        names: &["llama-bpe", "llama3", "llama-v3"],
        regexes: &[LLAMA3_REGEX],
        ignore_merges: true,
        add_bos_default: true,
    },
];

/// `tokenizer.ggml.model` `llama`: SentencePiece's BPE, whatever `tokenizer.ggml.pre` says.
const SENTENCEPIECE: PreTokenizerSpec = PreTokenizerSpec {
    names: &[],
    regexes: &[],
    ignore_merges: false,
    add_bos_default: true,
};

/// Why a tokenizer could not be built: the file, or what it holds.
enum BuildError {
    Gguf(GgufError),
    Reason(String),
}

/// Byte-level BPE (`tokenizer.ggml.model` `gpt2`): the file's merges, the pre-tokenizer's
/// regexes, and bytes written as GPT-2's printable stand-ins.
fn byte_level_tokenizer(
    file: &GgufFile,
    vocab: Vocab,
    spec: &PreTokenizerSpec,
) -> Result<Tokenizer, BuildError> {
    let merges = file
        .get_str_array("tokenizer.ggml.merges")
        .map_err(BuildError::Gguf)?
        .iter()
        .map(|m| {
            split_merge(m).ok_or_else(|| {
                BuildError::Reason(format!(
                    "merge {m:?} is not two tokens separated by a space"
                ))
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .ignore_merges(spec.ignore_merges)
        .build()
        .map_err(|e| BuildError::Reason(format!("building the BPE model: {e}")))?;

    let mut pieces = Vec::with_capacity(spec.regexes.len() + 1);
    for &regex in spec.regexes {
        let split = Split::new(
            SplitPattern::Regex(regex.to_owned()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map_err(|e| BuildError::Reason(format!("pre-tokenizer regex {regex:?}: {e}")))?;
        pieces.push(PreTokenizerWrapper::Split(split));
    }
    // Splitting is done above; ByteLevel only maps bytes to the printable stand-ins the
    // vocabulary is written in (space → 'Ġ', newline → 'Ċ').
    pieces.push(PreTokenizerWrapper::ByteLevel(ByteLevel::new(
        false, true, false,
    )));

    let mut tokenizer = Tokenizer::new(bpe);
    tokenizer.with_pre_tokenizer(Some(Sequence::new(pieces)));
    tokenizer.with_decoder(Some(ByteLevelDecoder::default()));
    Ok(tokenizer)
}

/// SentencePiece's BPE (`tokenizer.ggml.model` `llama`: Llama 2, TinyLlama, Phi-3): spaces
/// written as `▁` with one put before the text, pieces merged by the scores of what they
/// make, and bytes the vocabulary lacks spelled as its `<0xXX>` tokens.
///
/// llama.cpp merges the adjacent pair whose merged piece scores highest; BPE merges the pair
/// of lowest rank, so the merges are every pair that makes a vocabulary piece, ranked by that
/// piece's score (as transformers rebuilds them for a GGUF file without merges). The rest is
/// Hugging Face's own pieces, as in these models' `tokenizer.json`.
fn sentencepiece_tokenizer(
    tokens: &[String],
    vocab: Vocab,
    scores: &[f32],
    unknown: Option<&String>,
    add_space_prefix: bool,
) -> Result<Tokenizer, String> {
    let merges = merges_by_score(&vocab, tokens, scores);
    let mut builder = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .byte_fallback(true)
        .fuse_unk(true);
    if let Some(unknown) = unknown {
        builder = builder.unk_token(unknown.clone());
    }
    let bpe = builder
        .build()
        .map_err(|e| format!("building the BPE model: {e}"))?;
    let mut normalizers = Vec::new();
    if add_space_prefix {
        normalizers.push(NormalizerWrapper::Prepend(Prepend::new(SPACE.into())));
    }
    normalizers.push(NormalizerWrapper::Replace(
        Replace::new(" ", SPACE).map_err(|e| e.to_string())?,
    ));
    let mut decoders = vec![
        DecoderWrapper::Replace(Replace::new(SPACE, " ").map_err(|e| e.to_string())?),
        DecoderWrapper::ByteFallback(ByteFallback::new()),
        DecoderWrapper::Fuse(Fuse::new()),
    ];
    if add_space_prefix {
        decoders.push(DecoderWrapper::Strip(Strip::new(' ', 1, 0)));
    }
    let mut tokenizer = Tokenizer::new(bpe);
    tokenizer.with_normalizer(Some(NormalizerSequence::new(normalizers)));
    tokenizer.with_decoder(Some(DecoderSequence::new(decoders)));
    Ok(tokenizer)
}

/// SentencePiece's word boundary.
const SPACE: &str = "\u{2581}";

/// Every split of a vocabulary piece into two vocabulary pieces, best-scoring piece first.
fn merges_by_score(vocab: &Vocab, tokens: &[String], scores: &[f32]) -> Vec<(String, String)> {
    let mut merges: Vec<(f32, usize, &str, &str)> = Vec::new();
    for (token, &score) in tokens.iter().zip(scores) {
        for (split, _) in token.char_indices().skip(1) {
            let (left, right) = token.split_at(split);
            if vocab.contains_key(left) && vocab.contains_key(right) {
                merges.push((score, vocab[token] as usize, left, right));
            }
        }
    }
    // Ties in score keep the vocabulary's order, then the left piece's length.
    merges.sort_by(|a, b| {
        b.0.total_cmp(&a.0)
            .then(a.1.cmp(&b.1))
            .then(b.2.len().cmp(&a.2.len()))
    });
    merges
        .into_iter()
        .map(|(_, _, left, right)| (left.to_owned(), right.to_owned()))
        .collect()
}

/// `tokenizer.ggml.token_type` values (llama.cpp's `llama_token_type`).
mod token_type {
    pub const CONTROL: i32 = 3;
    pub const USER_DEFINED: i32 = 4;
}

/// The tokenizer and the special-token facts the chat loop needs.
#[derive(Clone, Debug)]
pub struct GgufTokenizer {
    pub tokenizer: Tokenizer,
    /// `tokenizer.ggml.pre`, the pre-tokenizer the vocabulary was built for.
    pub pre_tokenizer: String,
    pub bos_token_id: Option<u32>,
    pub eos_token_id: Option<u32>,
    pub padding_token_id: Option<u32>,
    pub unknown_token_id: Option<u32>,
    /// Whether encoding with special tokens prepends BOS / appends EOS (already applied by
    /// `tokenizer`'s post-processor).
    pub add_bos_token: bool,
    pub add_eos_token: bool,
    /// `tokenizer.chat_template`, a Jinja template.
    pub chat_template: Option<String>,
    /// Ids of control and user-defined tokens, which the tokenizer treats as special.
    pub special_token_ids: Vec<u32>,
}

impl GgufTokenizer {
    /// Builds the tokenizer `file` describes.
    pub fn from_gguf(file: &GgufFile) -> Result<Self, GgufError> {
        let fail = |reason: String| file.error(GgufErrorKind::Tokenizer { reason });
        let model = file.get_str("tokenizer.ggml.model")?;
        let sentencepiece = match model {
            "gpt2" => false,
            "llama" => true,
            _ => {
                return Err(file.error(GgufErrorKind::UnsupportedTokenizerModel {
                    found: model.to_owned(),
                }));
            }
        };
        let pre = file.get_str_opt("tokenizer.ggml.pre")?.unwrap_or("default");
        let spec = PRE_TOKENIZERS.iter().find(|s| s.names.contains(&pre));
        let Some(spec) = spec.or(sentencepiece.then_some(&SENTENCEPIECE)) else {
            let known = PRE_TOKENIZERS
                .iter()
                .flat_map(|s| s.names)
                .copied()
                .collect::<Vec<_>>()
                .join(", ");
            return Err(file.error(GgufErrorKind::UnsupportedPreTokenizer {
                found: pre.to_owned(),
                known,
            }));
        };

        let tokens = file.get_str_array("tokenizer.ggml.tokens")?;
        let n_tokens = u32::try_from(tokens.len())
            .map_err(|_| fail(format!("{} tokens is too many", tokens.len())))?;
        let vocab: Vocab = tokens
            .iter()
            .zip(0..)
            .map(|(t, id)| (t.clone(), id))
            .collect();
        if vocab.len() != tokens.len() {
            let dup = first_duplicate(tokens).unwrap_or_default();
            return Err(fail(format!(
                "token {dup:?} appears more than once in tokenizer.ggml.tokens"
            )));
        }
        let mut tokenizer = if sentencepiece {
            let scores = file.get_f32_array("tokenizer.ggml.scores")?;
            if scores.len() != tokens.len() {
                return Err(fail(format!(
                    "tokenizer.ggml.scores has {} entries for {} tokens",
                    scores.len(),
                    tokens.len()
                )));
            }
            let unknown = file
                .get_u32_opt("tokenizer.ggml.unknown_token_id")?
                .and_then(|id| tokens.get(id as usize));
            let add_space_prefix = file
                .get_bool_opt("tokenizer.ggml.add_space_prefix")?
                .unwrap_or(true);
            sentencepiece_tokenizer(tokens, vocab, scores, unknown, add_space_prefix)
                .map_err(fail)?
        } else {
            byte_level_tokenizer(file, vocab, spec).map_err(|reason| match reason {
                BuildError::Gguf(err) => err,
                BuildError::Reason(reason) => fail(reason),
            })?
        };

        let id_key = |key: &str| -> Result<Option<u32>, GgufError> {
            match file.get_u32_opt(key)? {
                Some(id) if id >= n_tokens => Err(file.error(GgufErrorKind::InvalidValue {
                    key: key.to_owned(),
                    value: id.to_string(),
                    expected: format!("a token id below the vocabulary size {n_tokens}"),
                })),
                id => Ok(id),
            }
        };
        let bos_token_id = id_key("tokenizer.ggml.bos_token_id")?;
        let eos_token_id = id_key("tokenizer.ggml.eos_token_id")?;
        let padding_token_id = id_key("tokenizer.ggml.padding_token_id")?;
        let unknown_token_id = id_key("tokenizer.ggml.unknown_token_id")?;
        let add_bos_token = file
            .get_bool_opt("tokenizer.ggml.add_bos_token")?
            .unwrap_or(spec.add_bos_default);
        let add_eos_token = file
            .get_bool_opt("tokenizer.ggml.add_eos_token")?
            .unwrap_or(false);

        let types = match file.metadata().get("tokenizer.ggml.token_type") {
            None => Vec::new(),
            Some(_) => {
                let types = file.get_i32_array("tokenizer.ggml.token_type")?;
                if types.len() != tokens.len() {
                    return Err(fail(format!(
                        "tokenizer.ggml.token_type has {} entries for {} tokens",
                        types.len(),
                        tokens.len()
                    )));
                }
                types.to_vec()
            }
        };
        let of_type = |wanted: i32| -> Vec<u32> {
            (0..n_tokens)
                .filter(|&id| types.get(id as usize) == Some(&wanted))
                .collect()
        };
        let added = |ids: &[u32], special: bool| -> Vec<AddedToken> {
            ids.iter()
                .map(|&id| AddedToken::from(tokens[id as usize].clone(), special).normalized(false))
                .collect()
        };
        // Both kinds are matched whole in input text, never split by the pre-tokenizer.
        // Control tokens are special: `decode(.., skip_special_tokens = true)` drops them.
        // User-defined ones are text that llama.cpp, like transformers, shows: Qwen3's
        // `<think>` and `</think>`, which a reply's reader must see.
        let control = of_type(token_type::CONTROL);
        let user_defined = of_type(token_type::USER_DEFINED);
        tokenizer.add_special_tokens(&added(&control, true));
        tokenizer.add_tokens(&added(&user_defined, false));
        let mut special_token_ids = [control, user_defined].concat();
        special_token_ids.sort_unstable();

        if add_bos_token || add_eos_token {
            let processor = post_processor(
                tokens,
                add_bos_token.then_some(bos_token_id),
                add_eos_token.then_some(eos_token_id),
            )
            .map_err(fail)?;
            tokenizer.with_post_processor(Some(processor));
        }

        Ok(Self {
            tokenizer,
            pre_tokenizer: pre.to_owned(),
            bos_token_id,
            eos_token_id,
            padding_token_id,
            unknown_token_id,
            add_bos_token,
            add_eos_token,
            chat_template: file
                .get_str_opt("tokenizer.chat_template")?
                .map(str::to_owned),
            special_token_ids,
        })
    }
}

/// A merge is written `"left right"`. Splitting at the first space after the first character
/// follows llama.cpp; byte-level tokens never contain a literal space.
fn split_merge(merge: &str) -> Option<(String, String)> {
    let first = merge.chars().next()?.len_utf8();
    let at = merge[first..].find(' ')? + first;
    let (left, right) = (&merge[..at], &merge[at + 1..]);
    (!right.is_empty()).then(|| (left.to_owned(), right.to_owned()))
}

fn first_duplicate(tokens: &[String]) -> Option<&str> {
    let mut seen = std::collections::HashSet::with_capacity(tokens.len());
    tokens
        .iter()
        .find(|t| !seen.insert(t.as_str()))
        .map(String::as_str)
}

/// Prepends BOS and/or appends EOS when encoding with special tokens. Each `Option<Option<_>>`
/// is "not wanted" / "wanted but the file names no such token" / "wanted, this id".
fn post_processor(
    tokens: &[String],
    bos: Option<Option<u32>>,
    eos: Option<Option<u32>>,
) -> Result<TemplateProcessing, String> {
    let mut specials = Vec::new();
    let mut wanted = |which: &str, id: Option<Option<u32>>| -> Result<Option<String>, String> {
        match id {
            None => Ok(None),
            Some(None) => Err(format!(
                "add_{which}_token is set but there is no {which}_token_id"
            )),
            Some(Some(id)) => {
                let token = tokens[id as usize].clone();
                specials.push((token.clone(), id));
                Ok(Some(token))
            }
        }
    };
    let (bos, eos) = (wanted("bos", bos)?, wanted("eos", eos)?);
    let template = |seq: &str, type_id: &str| -> Vec<String> {
        bos.iter()
            .map(|b| format!("{b}{type_id}"))
            .chain([format!("{seq}{type_id}")])
            .chain(eos.iter().map(|e| format!("{e}{type_id}")))
            .collect()
    };
    let single = template("$A", "");
    let pair: Vec<String> = single.iter().cloned().chain(template("$B", ":1")).collect();
    TemplateProcessing::builder()
        .try_single(single)?
        .try_pair(pair)?
        .special_tokens(specials)
        .build()
        .map_err(|e| e.to_string())
}
