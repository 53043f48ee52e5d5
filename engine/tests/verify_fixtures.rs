mod common;

use cortiq_engine::format::signature::SignatureStatus;
use cortiq_engine::format::verify::{verify, LinkStatus, VerifyOptions};
use cortiq_engine::format::{writer, CmfFile};

fn opts() -> VerifyOptions<'static> {
    VerifyOptions {
        signature: true,
        ..Default::default()
    }
}

#[test]
fn every_reference_file_verifies() {
    for p in common::cmf_fixtures() {
        let f = CmfFile::open(&p).unwrap();
        let r = verify(&f, &opts(), &|_| {});
        assert!(r.ok, "{}: {:?}", p.display(), r.failures);
        assert_eq!(r.tensors_checked, f.directory.len());
        // Header and directory hashes are recorded by the reference writer: really checked.
        assert_eq!(r.links[0].status, LinkStatus::Ok, "{}", p.display());
        assert_eq!(r.links[1].status, LinkStatus::Ok, "{}", p.display());
    }
}

#[test]
fn reference_signature_is_valid_and_trust_is_reported() {
    let p = common::fixture("cmf/qwen3-signed.cmf");
    let f = CmfFile::open(&p).unwrap();
    let r = verify(&f, &opts(), &|_| {});
    let pk = "dbec9ee0ff7684d058a71d71a4d8093a9463763bed813aa32761b473411ad3f5";
    assert_eq!(
        r.signature,
        Some(SignatureStatus::SelfConsistent { pubkey: pk.into() })
    );
    let trusted = VerifyOptions {
        signature: true,
        trusted_keys: vec![hex::decode(pk).unwrap().try_into().unwrap()],
        ..Default::default()
    };
    let r = verify(&f, &trusted, &|_| {});
    assert!(r.ok);
    assert_eq!(
        r.signature,
        Some(SignatureStatus::Trusted { pubkey: pk.into() })
    );
    let other = VerifyOptions {
        signature: true,
        trusted_keys: vec![[9u8; 32]],
        ..Default::default()
    };
    let r = verify(&f, &other, &|_| {});
    assert!(
        !r.ok,
        "a signature by a key the user does not trust must not pass"
    );
    assert!(matches!(
        r.signature,
        Some(SignatureStatus::UntrustedKey { .. })
    ));
}

#[test]
fn compact_is_a_faithful_and_stable_rewrite() {
    let dir = tempfile::tempdir().unwrap();
    for p in common::cmf_fixtures() {
        let f = CmfFile::open(&p).unwrap();
        let out1 = dir.path().join("a.cmf");
        let out2 = dir.path().join("b.cmf");
        writer::compact(&f, &out1).unwrap();
        let g = CmfFile::open(&out1).unwrap();
        let r = verify(&g, &VerifyOptions::default(), &|_| {});
        assert!(r.ok, "{}: {:?}", p.display(), r.failures);
        assert_eq!(g.directory.len(), f.directory.len());
        for (a, b) in f.directory.iter().zip(g.directory.iter()) {
            assert_eq!(
                (&a.name, a.dtype, &a.shape, a.nbytes, a.hash),
                (&b.name, b.dtype, &b.shape, b.nbytes, b.hash)
            );
            assert_eq!(f.tensor_bytes(a), g.tensor_bytes(b));
        }
        assert_eq!(f.vocab_bytes(), g.vocab_bytes());
        assert_eq!(
            f.envelope.required_features,
            g.envelope.required_features,
            "{}",
            p.display()
        );
        assert_eq!(
            f.masks.as_ref().map(|m| m.meta.clone()),
            g.masks.as_ref().map(|m| m.meta.clone())
        );
        writer::compact(&g, &out2).unwrap();
        assert_eq!(
            std::fs::read(&out1).unwrap(),
            std::fs::read(&out2).unwrap(),
            "{}: rewrite not byte-identical",
            p.display()
        );
        // At most a page of alignment more, plus the strong digests this writer adds
        // (67 bytes a tensor, and the sections').
        let digests = 67 * f.directory.len() as u64 + 400;
        assert!(
            std::fs::metadata(&out1).unwrap().len()
                <= std::fs::metadata(&p).unwrap().len() + 4096 + digests
        );
    }
}
