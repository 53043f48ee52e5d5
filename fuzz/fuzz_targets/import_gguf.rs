//! Any bytes as a GGUF file: `import-gguf` with `keep`, `vbit` (streamed after a first
//! pass) and `q1t` (streamed in three passes; shapes whose groups straddle rows take the
//! whole-tensor path) either fails with an error or writes a file that opens and
//! verifies; it never panics. Inputs go through a file in a temporary directory, as the
//! importer maps files.
#![no_main]

use cortiq_engine::format::verify::{verify, VerifyOptions};
use cortiq_engine::format::{CmfFile, DType};
use cortiq_engine::import::gguf_import::{import_gguf, QuantMode};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("in.gguf");
    std::fs::write(&src, data).unwrap();
    for mode in [
        QuantMode::Keep,
        QuantMode::Codec(DType::Vbit),
        QuantMode::Codec(DType::Q1t),
    ] {
        let out = dir.path().join("out.cmf");
        if import_gguf(&src, &out, mode, &mut |_| {}).is_ok() {
            let f = CmfFile::open(&out).expect("an imported file opens");
            let v = verify(&f, &VerifyOptions::default(), &|_| {});
            assert!(v.ok, "an imported file verifies");
        }
    }
});
