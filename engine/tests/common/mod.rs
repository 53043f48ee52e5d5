//! Shared helpers for the engine's integration tests.
#![allow(dead_code)]

use std::path::PathBuf;

/// `../shared/fixtures/<rel>` from the project root. Panics with how to get it when missing:
/// a test whose oracle is absent must fail, not pass.
pub fn fixture(rel: &str) -> PathBuf {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../shared/fixtures")
        .join(rel);
    assert!(
        p.exists(),
        "fixture {} is missing: the tests need the shared fixtures checked out at ../shared/fixtures (beside the project root)",
        p.display()
    );
    p
}

/// Every `.cmf` file of `../shared/fixtures/cmf`, sorted.
pub fn cmf_fixtures() -> Vec<PathBuf> {
    let dir = fixture("cmf");
    let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "cmf"))
        .collect();
    v.sort();
    assert!(
        v.len() >= 13,
        "expected the 13 reference .cmf fixtures in {}, found {}",
        dir.display(),
        v.len()
    );
    v
}
