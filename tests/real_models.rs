#![cfg(feature = "real-models")]
//! The real models of `../shared/models/fetch.sh` import, verify, and carry a tokenizer
//! that encodes the fixtures' `text_ids` / `chat_ids` exactly from their text.
//!
//! `cargo test --release --features real-models --test real_models` (scripts/slow-checks.sh
//! fetches the models first). Models: `$CMF_MODELS`, else `~/.cache/cmf-models`.

mod common;

use std::path::PathBuf;
use std::time::Instant;

use cortiq_engine::format::verify::{verify, VerifyOptions};
use cortiq_engine::format::{CmfFile, DType};
use cortiq_engine::import::gguf_import::{import_gguf, QuantMode};
use safetensors::{Dtype, SafeTensors};
use serde_json::Value;

fn fixture(dir: &str) -> Vec<u8> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../shared/fixtures")
        .join(dir)
        .join("reference.safetensors");
    std::fs::read(&p).unwrap_or_else(|e| panic!("fixture {} is missing: {e}", p.display()))
}

/// The fixture's token ids (I32 or I64).
fn ids(st: &SafeTensors, name: &str) -> Vec<u32> {
    let t = st
        .tensor(name)
        .unwrap_or_else(|e| panic!("fixture has no {name}: {e}"));
    let b = t.data();
    match t.dtype() {
        Dtype::I32 => b
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes(c.try_into().unwrap()) as u32)
            .collect(),
        Dtype::I64 => b
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()) as u32)
            .collect(),
        d => panic!("{name} is {d:?}, not an integer tensor"),
    }
}

/// A metadata entry: the fixtures store each value JSON-encoded (a quoted string).
fn meta(bytes: &[u8], key: &str) -> String {
    let (_, m) = SafeTensors::read_metadata(bytes).expect("fixture header parses");
    let raw = m
        .metadata()
        .as_ref()
        .and_then(|md| md.get(key))
        .unwrap_or_else(|| panic!("fixture metadata has no {key}"))
        .clone();
    match serde_json::from_str::<Value>(&raw) {
        Ok(Value::String(s)) => s,
        _ => raw,
    }
}

fn payload_check(dtype: DType, shape: &[u64], bytes: &[u8]) -> Result<(), String> {
    cortiq_engine::quant::validate(dtype, shape, bytes).map_err(|e| e.to_string())
}

fn check(gguf: &str, fixture_dir: &str) {
    let src = common::real_model(gguf);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("model.cmf");

    let t = Instant::now();
    let report = import_gguf(&src, &out, QuantMode::Keep, &mut |_| {})
        .unwrap_or_else(|e| panic!("{gguf}: import failed: {e}"));
    let import_s = t.elapsed().as_secs_f64();
    let exact = report.tensors.iter().filter(|t| t.exact).count();
    eprintln!(
        "{gguf}: imported {} tensors ({exact} exact, arch {}) in {import_s:.2} s",
        report.tensors.len(),
        report.arch
    );

    let file = CmfFile::open(&out).unwrap_or_else(|e| panic!("{gguf}: open failed: {e}"));
    let t = Instant::now();
    let opts = VerifyOptions {
        payload_check: Some(payload_check),
        ..VerifyOptions::default()
    };
    let v = verify(&file, &opts, &|_| {});
    eprintln!(
        "{gguf}: verified {} tensors, {} bytes hashed in {:.2} s",
        v.tensors_checked,
        v.bytes_hashed,
        t.elapsed().as_secs_f64()
    );
    assert!(v.ok, "{gguf}: verify failed: {:?}", v.failures);

    let tc = file
        .header
        .tokenizer_config
        .as_ref()
        .unwrap_or_else(|| panic!("{gguf}: no tokenizer_config"));
    assert!(!tc.eos_token_ids.is_empty(), "{gguf}: no EOS ids");
    assert!(
        tc.chat_template.as_deref().is_some_and(|s| !s.is_empty()),
        "{gguf}: no chat template"
    );

    let vocab = file
        .vocab_bytes()
        .unwrap_or_else(|| panic!("{gguf}: no embedded tokenizer.json"));
    let tok = tokenizers::Tokenizer::from_bytes(vocab)
        .unwrap_or_else(|e| panic!("{gguf}: tokenizer.json does not load: {e}"));

    let fx = fixture(fixture_dir);
    let st = SafeTensors::deserialize(&fx).expect("fixture parses");
    // Neither id list begins with a BOS (SmolLM2's chat begins with <|im_start|> = 1, its
    // passage with "Licensed"; Qwen has no BOS), so the text is encoded as it is.
    for (text_key, ids_key) in [("text", "text_ids"), ("rendered_chat", "chat_ids")] {
        let text = meta(&fx, text_key);
        let want = ids(&st, ids_key);
        let got = tok
            .encode(text.as_str(), false)
            .unwrap_or_else(|e| panic!("{gguf}: encoding {text_key} failed: {e}"))
            .get_ids()
            .to_vec();
        if got != want {
            let first = got.iter().zip(&want).position(|(a, b)| a != b);
            panic!(
                "{gguf}: {ids_key} differ (first difference at {first:?}; {} vs {} ids)\n\
                 ours:      {got:?}\nreference: {want:?}",
                got.len(),
                want.len()
            );
        }
        // And back: byte-level BPE decodes to the text itself.
        let back = tok
            .decode(&want, false)
            .unwrap_or_else(|e| panic!("{gguf}: decoding {ids_key} failed: {e}"));
        assert_eq!(
            back, text,
            "{gguf}: {ids_key} do not decode to the {text_key}"
        );
        eprintln!(
            "{gguf}: {ids_key}: {} ids equal, decode round-trips",
            want.len()
        );
    }
}

#[test]
fn smollm2_imports_verifies_and_tokenizes_the_fixtures() {
    check("SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2");
}

#[test]
fn qwen25coder_imports_verifies_and_tokenizes_the_fixtures() {
    check("Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf", "qwen25coder");
}
