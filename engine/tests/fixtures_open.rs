mod common;

use cortiq_engine::format::{CmfFile, SectionKind};

#[test]
fn every_reference_file_opens() {
    for p in common::cmf_fixtures() {
        let f = CmfFile::open(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        assert!(!f.directory.is_empty(), "{}", p.display());
        assert!(f.header.arch.is_some(), "{}", p.display());
        eprintln!(
            "{}: {} tensors, warnings {:?}",
            p.display(),
            f.directory.len(),
            f.warnings
        );
    }
}

#[test]
fn masked_moe_file_has_its_expert_mask() {
    let f = CmfFile::open(common::fixture("cmf/qwen3_moe-masked.cmf")).unwrap();
    let m = f.mask_by_name("code").expect("mask 'code'");
    assert!(m.record.has_expert_fields);
    assert_eq!(m.layout.visits, 4);
    assert_eq!(m.ffn(0).count_ones(), 128);
    let e = m.experts(0).unwrap();
    assert_eq!(e.bits, 8);
    assert!(e.count_ones() < 8, "the code mask narrows routing");
    let idx = f
        .index
        .as_ref()
        .expect("this reference file carries a sparse index");
    assert_eq!(idx.len(), 4);
    assert!(!f.section_bytes(SectionKind::Vocab).is_empty());
}
