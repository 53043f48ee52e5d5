//! `cortiq convert`: Hugging Face checkpoints of `../shared/fixtures/hf` into CMF files,
//! end to end through the binary (options, JSON output, exit codes, sharding), and — with
//! the `peer-tests` feature — checked by the reference implementation's CLI.

#[macro_use]
mod common;
use common::{code, json};

use std::path::{Path, PathBuf};

use serde_json::Value;

fn hf(family: &str) -> PathBuf {
    common::shared(&format!("fixtures/hf/{family}/config.json"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn convert(family: &str, quant: &str, out: &Path) -> Value {
    let o = run!(
        "convert",
        "--model",
        hf(family),
        "--quant",
        quant,
        "-o",
        out,
        "--json"
    );
    assert_eq!(code(&o), 0, "{}", String::from_utf8_lossy(&o.stderr));
    json(&o)
}

#[test]
fn converts_and_our_verify_accepts_it() {
    let tmp = tempfile::tempdir().unwrap();
    for (family, quant) in [("qwen3_5_moe", "q4tp"), ("gemma3", "vbit"), ("llama", "q8")] {
        let out = tmp.path().join(format!("{family}.cmf"));
        let doc = convert(family, quant, &out);
        assert_eq!(doc["ok"], true);
        assert!(doc["tensors"].as_u64().unwrap() > 10);
        let o = run!("verify", out, "--json");
        assert_eq!(code(&o), 0, "{}", String::from_utf8_lossy(&o.stdout));
        // The header records what was asked for.
        let o = run!("info", out, "--json");
        let info = json(&o);
        let text = info.to_string();
        assert!(text.contains("cortiq convert"), "{text}");
    }
    // Nothing left behind but the outputs.
    let names: Vec<String> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names.len(), 3, "{names:?}");
}

#[test]
fn mean_bits_and_shards() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("v.cmf");
    let o = run!(
        "convert",
        "--model",
        hf("qwen3"),
        "--quant",
        "vbit",
        "--mean-bits",
        "6",
        "-o",
        out,
        "--json"
    );
    assert_eq!(code(&o), 0, "{}", String::from_utf8_lossy(&o.stderr));
    let out = tmp.path().join("s.cmf");
    let o = run!(
        "convert",
        "--model",
        hf("qwen3"),
        "--quant",
        "q8",
        "-o",
        out,
        "--shard-max-gb",
        "0.0002",
        "--json"
    );
    assert_eq!(code(&o), 0, "{}", String::from_utf8_lossy(&o.stderr));
    let doc = json(&o);
    let outputs = doc["outputs"].as_array().unwrap();
    assert!(outputs.len() > 1, "{doc}");
    for p in outputs {
        let o = run!("verify", p.as_str().unwrap());
        assert_eq!(code(&o), 0);
    }
}

#[test]
fn usage_and_input_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("x.cmf");
    let o = run!(
        "convert",
        "--model",
        hf("qwen3"),
        "--quant",
        "q3",
        "-o",
        out
    );
    assert_eq!(code(&o), 2);
    let o = run!(
        "convert",
        "--model",
        hf("qwen3"),
        "--quant",
        "q8",
        "--mean-bits",
        "5",
        "-o",
        out
    );
    assert_eq!(code(&o), 2);
    let o = run!(
        "convert",
        "--model",
        tmp.path(),
        "--quant",
        "q8",
        "-o",
        out,
        "--json"
    );
    assert_ne!(code(&o), 0);
    assert_eq!(json(&o)["ok"], false);
    assert!(!out.exists());
}

/// The reference CLI opens and verifies what we write, for every family and several quants.
#[cfg(feature = "peer-tests")]
#[test]
fn the_reference_cli_verifies_our_files() {
    let reference = std::env::var_os("CORTIQ_REFERENCE_CLI")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var("HOME").unwrap_or_default())
                .join(".cache/cmf-peers/bin/cortiq")
        });
    assert!(
        reference.exists(),
        "the reference CLI is not at {} — run scripts/slow-checks.sh",
        reference.display()
    );
    let tmp = tempfile::tempdir().unwrap();
    for family in [
        "llama",
        "llama_gguf",
        "qwen2",
        "qwen2_moe",
        "qwen3",
        "qwen3_5",
        "qwen3_5_moe",
        "qwen3_moe",
        "gemma3",
    ] {
        for quant in ["f32", "q8", "q4tp", "vbit", "q1t"] {
            let out = tmp.path().join(format!("{family}-{quant}.cmf"));
            convert(family, quant, &out);
            let o = std::process::Command::new(&reference)
                .arg("verify")
                .arg(&out)
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&o.stdout).into_owned()
                + &String::from_utf8_lossy(&o.stderr);
            assert!(
                o.status.success() && text.lines().any(|l| l.trim() == "OK"),
                "{family} {quant}:\n{text}"
            );
        }
    }
}
