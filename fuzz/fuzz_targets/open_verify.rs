//! Any bytes: `open` either fails with an error or yields a file whose every view and
//! `verify` run without panicking.
#![no_main]

use cortiq_engine::format::verify::{verify, VerifyOptions};
use cortiq_engine::format::CmfFile;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(f) = CmfFile::from_bytes(data.to_vec()) else {
        return;
    };
    for i in 0..f.masks.as_ref().map_or(0, |m| m.len()) {
        let v = f.mask_view(i).unwrap();
        for visit in 0..v.layout.visits {
            let _ = v.ffn(visit).density();
            let _ = v.heads(visit).density();
            let _ = v.experts(visit).map(|e| e.density());
        }
        let _ = v.gates().count_ones();
    }
    let _ = f.pipeline_components();
    let _ = verify(&f, &VerifyOptions::default(), &|_| {});
});
