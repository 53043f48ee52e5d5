//! A Hugging Face `tokenizer.json` rebuilt from GGUF `tokenizer.ggml.*` metadata.
//!
//! - `tokenizer.ggml.model = "gpt2"`: byte-level BPE. Vocabulary and merges are taken as
//!   they are; the pre-tokenizer follows `tokenizer.ggml.pre` (the split regex llama.cpp
//!   names by that key: `gpt-2`, `qwen2`, `llama-bpe`, `smollm`; unknown names fall back
//!   to GPT-2's byte-level regex).
//! - `tokenizer.ggml.model = "llama"`: SentencePiece BPE (Llama 2, Gemma). GGUF keeps the
//!   pieces and their scores but no merges; the merges are derived the way Hugging Face
//!   derives them from a SentencePiece model: every split of a piece into two pieces of
//!   the vocabulary is a merge, ranked by the merged piece's score (higher first).
//!   `▁` stands for a space, byte pieces `<0xNN>` give byte fallback.
//! - `tokenizer.ggml.model = "gemma4"`: the same SentencePiece-style BPE over `▁` text,
//!   with its merges stored in the GGUF.
//!
//! Token types (llama.cpp): 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused,
//! 6 byte. Unknown, control and user-defined tokens become `added_tokens` (control and
//! unknown ones `special`), so that they are matched whole before the model runs.

use serde_json::{json, Map, Value as Json};

use super::gguf::{Gguf, Value};

/// Why no tokenizer could be built.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("tokenizer: {0}")]
pub struct TokenizerError(pub String);

fn err(m: impl Into<String>) -> TokenizerError {
    TokenizerError(m.into())
}

pub mod token_type {
    pub const NORMAL: i64 = 1;
    pub const UNKNOWN: i64 = 2;
    pub const CONTROL: i64 = 3;
    pub const USER_DEFINED: i64 = 4;
    pub const UNUSED: i64 = 5;
    pub const BYTE: i64 = 6;
}

const QWEN2_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2's split with combining marks (`\p{M}`) kept with the letters they modify.
const QWEN35_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

fn strings(g: &Gguf, key: &str) -> Result<Option<Vec<String>>, TokenizerError> {
    let Some(v) = g.get(key) else {
        return Ok(None);
    };
    let arr = v
        .as_array()
        .ok_or_else(|| err(format!("{key} is not an array")))?;
    arr.iter()
        .map(|x| {
            x.as_str()
                .map(str::to_string)
                .ok_or_else(|| err(format!("{key} holds a non-string")))
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

fn numbers(g: &Gguf, key: &str, n: usize) -> Result<Option<Vec<f64>>, TokenizerError> {
    let Some(v) = g.get(key) else {
        return Ok(None);
    };
    let arr = v
        .as_array()
        .ok_or_else(|| err(format!("{key} is not an array")))?;
    if arr.len() != n {
        return Err(err(format!(
            "{key} has {} entries for {n} tokens",
            arr.len()
        )));
    }
    arr.iter()
        .map(|x| Value::as_f64(x).ok_or_else(|| err(format!("{key} holds a non-number"))))
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

fn added_token(id: usize, content: &str, special: bool) -> Json {
    json!({"id": id, "content": content, "single_word": false, "lstrip": false,
           "rstrip": false, "normalized": false, "special": special})
}

/// Builds `tokenizer.json` bytes; `Ok(None)` when the file carries no vocabulary.
pub fn tokenizer_json(g: &Gguf) -> Result<Option<Vec<u8>>, TokenizerError> {
    let Some(model) = g.get_str("tokenizer.ggml.model") else {
        return Ok(None);
    };
    let tokens = strings(g, "tokenizer.ggml.tokens")?
        .ok_or_else(|| err("tokenizer.ggml.tokens is missing"))?;
    let n = tokens.len();
    let types: Vec<i64> = numbers(g, "tokenizer.ggml.token_type", n)?
        .map(|v| v.into_iter().map(|x| x as i64).collect())
        .unwrap_or_else(|| vec![token_type::NORMAL; n]);
    let mut vocab = Map::new();
    for (i, t) in tokens.iter().enumerate() {
        // A duplicate piece keeps its first id, as Hugging Face's loaders do.
        if !vocab.contains_key(t) {
            vocab.insert(t.clone(), json!(i));
        }
    }
    let added: Vec<Json> = tokens
        .iter()
        .zip(&types)
        .enumerate()
        .filter(|(_, (_, &ty))| {
            matches!(
                ty,
                token_type::UNKNOWN | token_type::CONTROL | token_type::USER_DEFINED
            )
        })
        .map(|(i, (t, &ty))| added_token(i, t, ty != token_type::USER_DEFINED))
        .collect();
    let add_bos = matches!(
        g.get("tokenizer.ggml.add_bos_token"),
        Some(Value::Bool(true))
    );
    let bos = g
        .get_u64("tokenizer.ggml.bos_token_id")
        .and_then(|i| tokens.get(i as usize).map(|t| (t.clone(), i)));
    let post_bos = match (add_bos, bos) {
        (true, Some((t, id))) => Some(json!({
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": t, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": t, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": t, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {t.clone(): {"id": t, "ids": [id], "tokens": [t]}}
        })),
        _ => None,
    };
    let doc = match model {
        "gpt2" => {
            let merges = gguf_merges(g)?;
            let byte_level = |regex: bool| json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": regex});
            let split = |re: &str| json!({"type": "Split", "pattern": {"Regex": re}, "behavior": "Isolated", "invert": false});
            let pre = match pre_name(g) {
                "qwen2" => {
                    json!({"type": "Sequence", "pretokenizers": [split(QWEN2_SPLIT), byte_level(false)]})
                }
                "qwen35" => {
                    json!({"type": "Sequence", "pretokenizers": [split(QWEN35_SPLIT), byte_level(false)]})
                }
                "llama-bpe" | "llama3" => {
                    json!({"type": "Sequence", "pretokenizers": [split(LLAMA3_SPLIT), byte_level(false)]})
                }
                "smollm" => json!({"type": "Sequence", "pretokenizers": [
                    {"type": "Digits", "individual_digits": true}, byte_level(true)]}),
                _ => byte_level(true),
            };
            let post = post_bos.unwrap_or_else(|| {
                json!({"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true})
            });
            json!({
                "version": "1.0", "truncation": null, "padding": null,
                "added_tokens": added,
                "normalizer": null,
                "pre_tokenizer": pre,
                "post_processor": post,
                "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
                "model": {"type": "BPE", "dropout": null, "unk_token": null,
                          "continuing_subword_prefix": null, "end_of_word_suffix": null,
                          "fuse_unk": false, "byte_fallback": false,
                          // Llama 3 takes a pre-token found whole in the vocabulary as is,
                          // whatever the merges would build.
                          "ignore_merges": matches!(pre_name(g), "llama-bpe" | "llama3"),
                          "vocab": vocab, "merges": merges}
            })
        }
        "llama" | "gemma4" => {
            let merges = if model == "llama" {
                let scores = numbers(g, "tokenizer.ggml.scores", n)?
                    .ok_or_else(|| err("tokenizer.ggml.scores is missing"))?;
                spm_merges(&tokens, &scores, &vocab)
            } else {
                gguf_merges(g)?
            };
            let unk = tokens
                .iter()
                .zip(&types)
                .find(|(_, &t)| t == token_type::UNKNOWN)
                .map(|(s, _)| s.clone());
            // Llama 2 prepends "▁" to the text; Gemma does not
            // (`tokenizer.ggml.add_space_prefix = false`).
            let prefix = !matches!(
                g.get("tokenizer.ggml.add_space_prefix"),
                Some(Value::Bool(false))
            );
            let replace = json!({"type": "Replace", "pattern": {"String": " "}, "content": "▁"});
            let normalizer = if prefix {
                json!({"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "▁"}, replace]})
            } else {
                replace
            };
            let mut decoders = vec![
                json!({"type": "Replace", "pattern": {"String": "▁"}, "content": " "}),
                json!({"type": "ByteFallback"}),
                json!({"type": "Fuse"}),
            ];
            if prefix {
                decoders.push(json!({"type": "Strip", "content": " ", "start": 1, "stop": 0}));
            }
            json!({
                "version": "1.0", "truncation": null, "padding": null,
                "added_tokens": added,
                "normalizer": normalizer,
                "pre_tokenizer": null,
                "post_processor": post_bos,
                "decoder": {"type": "Sequence", "decoders": decoders},
                "model": {"type": "BPE", "dropout": null, "unk_token": unk,
                          "continuing_subword_prefix": null, "end_of_word_suffix": null,
                          "fuse_unk": true, "byte_fallback": true, "ignore_merges": false,
                          "vocab": vocab, "merges": merges}
            })
        }
        other => {
            return Err(err(format!(
                "tokenizer.ggml.model {other:?} is not supported (gpt2, llama and gemma4 are)"
            )))
        }
    };
    serde_json::to_vec(&doc)
        .map(Some)
        .map_err(|e| err(e.to_string()))
}

/// `tokenizer.ggml.pre`, GPT-2's when absent.
fn pre_name(g: &Gguf) -> &str {
    g.get_str("tokenizer.ggml.pre").unwrap_or("gpt-2")
}

/// The byte-level pre-tokenizers rebuilt exactly (checked against llama.cpp's tokenizer
/// test sets by `tests/gguf_vocabularies.rs`); GPT-2's regex serves the others.
const KNOWN_PRE: [&str; 9] = [
    "default",
    "gpt-2",
    "gpt-neox",
    "mpt",
    "qwen2",
    "qwen35",
    "llama-bpe",
    "llama3",
    "smollm",
];

/// What the rebuilt tokenizer may get wrong, for the import to report: a byte-level
/// vocabulary whose pre-tokenizer is not one of [`KNOWN_PRE`] is split with GPT-2's regex,
/// which can tokenize some text differently from the original.
pub fn tokenizer_warnings(g: &Gguf) -> Vec<String> {
    let pre = pre_name(g);
    if g.get_str("tokenizer.ggml.model") == Some("gpt2") && !KNOWN_PRE.contains(&pre) {
        vec![format!(
            "tokenizer.ggml.pre {pre:?} is not known: GPT-2's pre-tokenizer is used, so some \
             text (digits, punctuation, non-Latin scripts) may tokenize differently from \
             the original"
        )]
    } else {
        Vec::new()
    }
}

/// The `tokenizer.ggml.merges` list (`"left right"` strings) as `tokenizer.json` pairs.
fn gguf_merges(g: &Gguf) -> Result<Vec<Json>, TokenizerError> {
    strings(g, "tokenizer.ggml.merges")?
        .unwrap_or_default()
        .iter()
        .map(|m| {
            m.split_once(' ')
                .map(|(a, b)| json!([a, b]))
                .ok_or_else(|| err(format!("merge {m:?} has no space")))
        })
        .collect()
}

/// SentencePiece BPE merges: for each piece (by score, highest first; ties by id), every
/// split into two vocabulary pieces, those ordered by (left id, right id); the whole list
/// stably sorted by the merged piece's score, highest first.
fn spm_merges(tokens: &[String], scores: &[f64], vocab: &Map<String, Json>) -> Vec<Json> {
    let id = |s: &str| vocab.get(s).and_then(Json::as_u64);
    let mut order: Vec<usize> = (0..tokens.len()).collect();
    order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
    let mut merges: Vec<(u64, u64, f64, &str, &str)> = Vec::new();
    for &i in &order {
        let piece = tokens[i].as_str();
        let mut local = Vec::new();
        for (pos, _) in piece.char_indices().skip(1) {
            let (l, r) = piece.split_at(pos);
            if let (Some(a), Some(b)) = (id(l), id(r)) {
                local.push((a, b, scores[i], l, r));
            }
        }
        local.sort_by_key(|m| (m.0, m.1));
        merges.extend(local);
    }
    merges.sort_by(|a, b| b.2.total_cmp(&a.2));
    merges
        .into_iter()
        .map(|(_, _, _, l, r)| json!([l, r]))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> Vec<u8> {
        let p = concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/fixtures/");
        let path = format!("{p}{name}");
        std::fs::read(&path).unwrap_or_else(|e| panic!("fixture {path} is missing: {e}"))
    }

    /// The byte-level BPE rebuilt from the GGUF equals the source checkpoint's
    /// tokenizer.json in every part that decides tokenization.
    #[test]
    fn gpt2_tokenizer_equals_the_source_checkpoint() {
        let b = fixture("gguf/tiny-Q8_0.gguf");
        let g = Gguf::parse(&b).unwrap();
        let ours: Json = serde_json::from_slice(&tokenizer_json(&g).unwrap().unwrap()).unwrap();
        let theirs: Json =
            serde_json::from_slice(&fixture("hf/llama_gguf/tokenizer.json")).unwrap();
        for key in [
            "added_tokens",
            "normalizer",
            "pre_tokenizer",
            "post_processor",
            "decoder",
        ] {
            assert_eq!(ours[key], theirs[key], "{key}");
        }
        let (om, tm) = (&ours["model"], &theirs["model"]);
        for key in ["type", "vocab", "merges", "byte_fallback", "unk_token"] {
            assert_eq!(om[key], tm[key], "model.{key}");
        }
    }

    #[test]
    fn spm_merges_follow_scores() {
        let tokens: Vec<String> = ["<unk>", "▁", "a", "b", "ab", "▁a", "▁ab"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let scores = [0.0, -1.0, -2.0, -3.0, -0.5, -0.7, -0.1];
        let mut vocab = Map::new();
        for (i, t) in tokens.iter().enumerate() {
            vocab.insert(t.clone(), json!(i));
        }
        let m = spm_merges(&tokens, &scores, &vocab);
        // "▁ab" (−0.1): ▁+ab (ids 1,4) then ▁a+b (5,3); "ab" (−0.5); "▁a" (−0.7).
        assert_eq!(
            m,
            vec![
                json!(["▁", "ab"]),
                json!(["▁a", "b"]),
                json!(["a", "b"]),
                json!(["▁", "a"])
            ]
        );
    }
}
