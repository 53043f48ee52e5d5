//! End-to-end tests of `cortiq import-gguf`: the shared GGUF fixtures become CMF files
//! that `cortiq verify` accepts; usage and file errors map to exit codes 2 and 1.

#[macro_use]
mod common;
use common::{code, json};

use std::path::PathBuf;

fn fixture(name: &str) -> PathBuf {
    common::shared(&format!("fixtures/gguf/{name}"))
}

#[test]
fn imports_q4_0_keeping_q4_0_exact_and_the_result_verifies() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("m.cmf");
    let o = run!(
        "import-gguf",
        fixture("tiny-Q4_0.gguf"),
        "-o",
        out,
        "--json"
    );
    assert_eq!(code(&o), 0, "{}", String::from_utf8_lossy(&o.stderr));
    let doc = json(&o);
    assert_eq!(doc["ok"], true);
    assert_eq!(doc["arch"], "llama");
    let tensors = doc["tensors"].as_array().unwrap();
    assert_eq!(tensors.len(), 21);
    for t in tensors {
        if t["ggml_type"] == "Q4_0" {
            assert_eq!(t["dtype"], "q4_tiled");
            assert_eq!(t["exact"], true);
            assert_eq!(t["max_abs_err"], 0.0);
        }
    }
    let v = run!("verify", out, "--json");
    assert_eq!(code(&v), 0, "{}", String::from_utf8_lossy(&v.stdout));
}

#[test]
fn a_codec_requantizes_and_reports_errors() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("m.cmf");
    let o = run!(
        "import-gguf",
        fixture("tiny-Q6_K.gguf"),
        "-o",
        out,
        "--quant",
        "q8_2f"
    );
    assert_eq!(code(&o), 0, "{}", String::from_utf8_lossy(&o.stderr));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("q8_2f") && text.contains("max |err|"),
        "{text}"
    );
    assert_eq!(code(&run!("verify", out)), 0);
}

#[test]
fn bad_quant_is_usage_and_a_non_gguf_is_invalid() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("m.cmf");
    let o = run!(
        "import-gguf",
        fixture("tiny-Q4_0.gguf"),
        "-o",
        out,
        "--quant",
        "q3"
    );
    assert_eq!(code(&o), 2);
    let bogus = dir.path().join("x.gguf");
    std::fs::write(&bogus, b"GGUF\x03\0\0\0 not really").unwrap();
    let o = run!("import-gguf", bogus, "-o", out, "--json");
    assert_eq!(code(&o), 1);
    assert_eq!(json(&o)["ok"], false);
    assert!(!out.exists());
    let src = fixture("tiny-Q4_0.gguf");
    let o = run!("import-gguf", src, "-o", src);
    assert_eq!(code(&o), 2);
}
