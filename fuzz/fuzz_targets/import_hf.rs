//! Any checkpoint directory for the Hugging Face importer: `convert` (config.json, the
//! safetensors files or shards with their index, tokenizer files) either fails with an
//! error or writes files that open and verify, payloads included; it never panics.
//! Files go through a temporary directory, as the importer maps them.
//!
//! Input: `[opts u8]` then records `[file u8][len u32 LE][bytes]` (a short record takes
//! what is left). `opts & 7` picks the quant, bit 3 shards the output.
#![no_main]

use cortiq_engine::format::verify::{verify, VerifyOptions};
use cortiq_engine::format::{CmfFile, DType};
use cortiq_engine::import::hf::{convert, ConvertOptions};
use cortiq_engine::quant::payload_check;
use libfuzzer_sys::fuzz_target;

const FILES: [&str; 8] = [
    "config.json",
    "model.safetensors",
    "model.safetensors.index.json",
    "model-00001-of-00002.safetensors",
    "model-00002-of-00002.safetensors",
    "tokenizer_config.json",
    "generation_config.json",
    "chat_template.jinja",
];

const QUANTS: [DType; 8] = [
    DType::F32,
    DType::F16,
    DType::Q8Row,
    DType::Q4Block,
    DType::Q4tp,
    DType::Vbit,
    DType::Q1t,
    DType::Q8_2f,
];

fuzz_target!(|data: &[u8]| {
    let Some((&opts_byte, mut rest)) = data.split_first() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("ck");
    std::fs::create_dir(&src).unwrap();
    while let Some((&which, r)) = rest.split_first() {
        let Some((len, r)) = r.split_first_chunk::<4>() else {
            break;
        };
        let len = (u32::from_le_bytes(*len) as usize).min(r.len());
        let (bytes, r) = r.split_at(len);
        rest = r;
        std::fs::write(src.join(FILES[which as usize % FILES.len()]), bytes).unwrap();
    }
    let mut opts = ConvertOptions::new(QUANTS[(opts_byte & 7) as usize]);
    if opts_byte & 8 != 0 {
        opts.shard_max_bytes = Some(16 << 10);
    }
    let out = dir.path().join("out.cmf");
    let Ok(summary) = convert(&src, &out, &opts, &mut |_| {}) else {
        return;
    };
    for f in &summary.files {
        let file = CmfFile::open(&f.path).expect("a converted file opens");
        let v = verify(
            &file,
            &VerifyOptions {
                payload_check: Some(payload_check),
                ..VerifyOptions::default()
            },
            &|_| {},
        );
        assert!(v.ok, "a converted file verifies: {:?}", v.first_failure);
    }
});
