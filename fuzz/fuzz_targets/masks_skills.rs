//! The header's skill registry and the masks section, decoded directly (no envelope, so
//! every input reaches the decoders): `Header::parse` either fails or yields a header
//! whose skill subspaces decode consistently and which re-parses once serialized;
//! `Masks::parse` (with the header's arch, or a fixed one) either fails or yields masks
//! whose every bit field can be read and which `build_section` writes back to a section
//! that parses again. Nothing panics.
//!
//! Input: `[flags u8][header_len u16 LE][header JSON][masks section]`; flag bit 0 is the
//! LOOP_MASKS feature, bit 1 forces the fixed arch.
#![no_main]

use cortiq_engine::format::header::{Arch, Header, Moe, Selection};
use cortiq_engine::format::masks::{build_section, Masks};
use cortiq_engine::format::skills::{replaced_name, skill_tensor_name};
use libfuzzer_sys::fuzz_target;

/// The arch masks are sized by when the header has none: small, with experts, so that
/// expert fields are reachable too.
fn fallback_arch() -> Arch {
    Arch {
        arch_name: "qwen3_moe".into(),
        hidden_size: 64,
        intermediate_size: Some(40),
        num_layers: 3,
        num_attention_heads: Some(4),
        vocab_size: 512,
        moe: Some(Moe {
            num_experts: 6,
            top_k: 2,
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn skills(header: &Header) {
    for s in header.skills.iter().flatten() {
        let full = skill_tensor_name(&s.id, "model.layers.0.mlp.up_proj.weight");
        assert_eq!(
            replaced_name(&full, &s.id),
            Some("model.layers.0.mlp.up_proj.weight")
        );
        if let Some(sel) = &s.selection {
            for b64 in [&sel.mean, &sel.basis] {
                match (Selection::decode_f16(b64), Selection::f16_count(b64)) {
                    (Ok(v), Ok(n)) => assert_eq!(v.len() as u64, n),
                    (Err(_), Err(_)) => {}
                    (a, b) => panic!("decode_f16 and f16_count disagree: {a:?} / {b:?}"),
                }
            }
        }
    }
}

fn masks(section: &[u8], arch: &Arch, loop_masks: bool) {
    let Ok(m) = Masks::parse(section, Some(arch), loop_masks) else {
        return;
    };
    let mut records = Vec::new();
    let mut blobs = Vec::new();
    for i in 0..m.len() {
        let v = m.view(section, i);
        let l = v.layout;
        for visit in 0..l.visits {
            let f = v.ffn(visit);
            assert!(f.ones().all(|b| b < l.intermediate));
            let _ = v.heads(visit).density();
            let _ = v.experts(visit).map(|e| e.count_ones());
        }
        let _ = v.gates().ones().count();
        let _ = v.ffn_sparsity();
        assert_eq!(m.find(&v.record.name), Some(i), "names are unique");
        let r = v.record;
        records.push(r.clone());
        blobs.push(section[r.blob_off as usize..(r.blob_off + r.blob_len) as usize].to_vec());
    }
    // What the writer makes of parsed masks (calibrate, moe-defrag) must parse again.
    let rebuilt = build_section(m.meta.default_task.clone(), records, &blobs);
    if let Err(e) = Masks::parse(&rebuilt, Some(arch), loop_masks) {
        panic!("a rebuilt masks section does not parse: {e}");
    }
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 3 {
        return;
    }
    let flags = data[0];
    let n = u16::from_le_bytes([data[1], data[2]]) as usize;
    let rest = &data[3..];
    let (head, section) = rest.split_at(n.min(rest.len()));
    let header = Header::parse(head).ok().map(|(h, _)| h);
    if let Some(h) = &header {
        skills(h);
        // The writer's form of a parsed header parses again (skills are appended by
        // rewriting the header).
        if let Err(e) = Header::parse(&h.to_bytes()) {
            panic!("a serialized header does not parse: {e}");
        }
    }
    let arch = match header.as_ref().and_then(|h| h.arch.clone()) {
        Some(a) if flags & 2 == 0 => a,
        _ => fallback_arch(),
    };
    masks(section, &arch, flags & 1 != 0);
});
