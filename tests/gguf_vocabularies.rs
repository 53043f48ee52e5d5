//! Tokenizers rebuilt from real GGUF vocabularies encode exactly as the originals do.
//!
//! The oracle is llama.cpp's tokenizer test set (`models/ggml-vocab-*.gguf` with `.inp`
//! inputs and `.out` token ids, the ids written by Hugging Face's tokenizer for those
//! inputs), fetched by `scripts/fetch-vocabs.sh` into `$CMF_VOCABS` (default
//! `~/.cache/cmf-vocabs`). It covers vocabularies no model here has: SentencePiece ones
//! (llama-spm, phi-3, Gemma's) beside more byte-level BPE pre-tokenizers.
#![cfg(feature = "real-models")]

use std::path::PathBuf;

use cortiq_engine::chat::tokenizer::Tokenizer;
use cortiq_engine::import::gguf::Gguf;
use cortiq_engine::import::gguf_tokenizer::{tokenizer_json, tokenizer_warnings};

fn vocab_dir() -> PathBuf {
    let dir = std::env::var_os("CMF_VOCABS")
        .map(PathBuf::from)
        .or_else(|| dirs::home_dir().map(|h| h.join(".cache/cmf-vocabs")))
        .expect("no $CMF_VOCABS and no home directory: run scripts/fetch-vocabs.sh");
    assert!(
        dir.join("ggml-vocab-llama-spm.gguf").is_file(),
        "GGUF vocabularies missing in {}: run scripts/fetch-vocabs.sh",
        dir.display()
    );
    dir
}

/// `(input, expected ids)` pairs of one vocabulary's test set.
fn cases(name: &str) -> Vec<(String, Vec<u32>)> {
    let dir = vocab_dir();
    let inp = std::fs::read_to_string(dir.join(format!("ggml-vocab-{name}.gguf.inp"))).unwrap();
    let out = std::fs::read_to_string(dir.join(format!("ggml-vocab-{name}.gguf.out"))).unwrap();
    let inputs: Vec<&str> = inp
        .strip_suffix("\n__ggml_vocab_test__\n")
        .unwrap_or(&inp)
        .split("\n__ggml_vocab_test__\n")
        .collect();
    let outputs: Vec<Vec<u32>> = out
        .lines()
        .map(|l| l.split_whitespace().map(|t| t.parse().unwrap()).collect())
        .collect();
    assert_eq!(
        inputs.len(),
        outputs.len(),
        "{name}: inputs and outputs disagree"
    );
    inputs.into_iter().map(String::from).zip(outputs).collect()
}

fn tokenizer(name: &str) -> Tokenizer {
    let bytes = std::fs::read(vocab_dir().join(format!("ggml-vocab-{name}.gguf"))).unwrap();
    let g = Gguf::parse(&bytes).unwrap();
    let json = tokenizer_json(&g)
        .unwrap()
        .unwrap_or_else(|| panic!("{name}: no tokenizer"));
    Tokenizer::from_bytes(&json).unwrap()
}

/// Encodes every case of each vocabulary; fails naming the cases that differ.
fn assert_exact(names: &[&str]) {
    for name in names {
        let tok = tokenizer(name);
        let bad: Vec<String> = cases(name)
            .into_iter()
            .filter_map(|(text, want)| {
                let got = tok.encode(&text, false).unwrap();
                (got != want).then(|| format!("{text:?}: got {got:?}, want {want:?}"))
            })
            .collect();
        assert!(
            bad.is_empty(),
            "{name}: {} of its cases differ:\n{}",
            bad.len(),
            bad.join("\n")
        );
    }
}

/// SentencePiece-style vocabularies: Llama 2's and Phi-3's (pieces and scores, merges
/// derived from the scores) and Gemma's (pieces and merges over `▁` text).
#[test]
fn sentencepiece_vocabularies_encode_exactly() {
    assert_exact(&["llama-spm", "phi-3", "gemma-4"]);
}

/// Byte-level BPE vocabularies with each pre-tokenizer we rebuild.
#[test]
fn byte_level_vocabularies_encode_exactly() {
    assert_exact(&["gpt-2", "llama-bpe", "qwen2", "qwen35", "mpt"]);
}

/// A pre-tokenizer we do not rebuild is reported, never silently approximated; a
/// vocabulary kind we do not handle is a clear error.
#[test]
fn unknown_vocabularies_are_reported() {
    for name in ["deepseek-llm", "falcon", "command-r"] {
        let bytes = std::fs::read(vocab_dir().join(format!("ggml-vocab-{name}.gguf"))).unwrap();
        let g = Gguf::parse(&bytes).unwrap();
        let w = tokenizer_warnings(&g);
        assert_eq!(w.len(), 1, "{name}: {w:?}");
        assert!(w[0].contains("is not known"), "{name}: {w:?}");
    }
    let bytes = std::fs::read(vocab_dir().join("ggml-vocab-qwen2.gguf")).unwrap();
    assert!(tokenizer_warnings(&Gguf::parse(&bytes).unwrap()).is_empty());
    let bytes = std::fs::read(vocab_dir().join("ggml-vocab-bert-bge.gguf")).unwrap();
    let e = tokenizer_json(&Gguf::parse(&bytes).unwrap()).unwrap_err();
    assert!(e.to_string().contains("\"bert\" is not supported"), "{e}");
}
