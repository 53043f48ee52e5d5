//! What the end-to-end tests share: fixture paths that fail loudly when absent, running the
//! `cortiq` binary, and reading its exit code and JSON output.
#![allow(dead_code)] // each test binary uses its own subset

pub mod tmux;

use std::path::PathBuf;
use std::process::Output;

use serde_json::Value;

/// `../shared/<rel>` beside the checkout; fails the test naming the path when it is missing.
pub fn shared(rel: &str) -> PathBuf {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../shared")
        .join(rel);
    assert!(
        p.exists(),
        "fixture missing: {} (the tests need ../shared beside the checkout)",
        p.display()
    );
    p
}

/// Runs `cortiq` with string-ish arguments and captures its output.
#[macro_export]
macro_rules! run {
    ($($a:expr),* $(,)?) => {
        assert_cmd::cargo::cargo_bin_cmd!("cortiq")
            .args([$(std::ffi::OsStr::new(&$a)),*])
            .output()
            .expect("cortiq runs")
    };
}

pub fn code(o: &Output) -> i32 {
    o.status.code().expect("exited, not killed by a signal")
}

/// Parses stdout as the one JSON document a `--json` run prints.
pub fn json(o: &Output) -> Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "not one JSON document ({e}):\n{}\n{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    })
}

/// A real model of `../shared/models/fetch.sh`: `$CMF_MODELS/<name>`, else
/// `~/.cache/cmf-models/<name>`; fails the test with how to get it when missing.
pub fn real_model(name: &str) -> PathBuf {
    let dir = std::env::var_os("CMF_MODELS")
        .map(PathBuf::from)
        .or_else(|| dirs::home_dir().map(|h| h.join(".cache/cmf-models")))
        .expect("no $CMF_MODELS and no home directory: run ../shared/models/fetch.sh");
    let p = dir.join(name);
    assert!(
        p.is_file(),
        "model {} is missing: run ../shared/models/fetch.sh",
        p.display()
    );
    p
}

/// `(offset, length)` of the envelope's section whose pair starts at `at` (§1: 0x10 the
/// header, 0x20 the directory, 0x50 the vocab …).
pub fn section(b: &[u8], at: usize) -> (usize, usize) {
    let u64_at = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap()) as usize;
    (u64_at(at), u64_at(at + 8))
}

/// Makes the envelope's header and directory hashes (§8.1) match the bytes again after a
/// test rewrote either, so that what it planted lies past those two links.
pub fn reseal(b: &mut [u8]) {
    use cortiq_engine::format::hash64::hash64;
    for (pair, hash_at) in [(0x10, 0x70), (0x20, 0x78)] {
        let (off, len) = section(b, pair);
        let h = hash64(&b[off..off + len]);
        b[hash_at..hash_at + 8].copy_from_slice(&h.to_le_bytes());
    }
}
