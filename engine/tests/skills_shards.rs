mod common;

use std::collections::BTreeSet;

use cortiq_engine::format::skills::{self, SkillTensor};
use cortiq_engine::format::verify::{verify, VerifyOptions};
use cortiq_engine::format::{writer, CmfFile, CmfModel};

fn name_hashes(f: &CmfFile) -> BTreeSet<(String, u64)> {
    f.directory
        .iter()
        .map(|e| (e.name.clone(), e.hash))
        .collect()
}

fn verified(f: &CmfFile) {
    let r = verify(f, &VerifyOptions::default(), &|_| {});
    assert!(r.ok, "{:?}: {:?}", f.path, r.failures);
}

#[test]
fn applying_the_reference_skill_file_rebuilds_the_skilled_model() {
    let base = CmfFile::open(common::fixture("cmf/qwen3-q8_2f.cmf")).unwrap();
    let skill = CmfFile::open(common::fixture("cmf/qwen3-skillfile.cmf")).unwrap();
    let skilled = CmfFile::open(common::fixture("cmf/qwen3-skills.cmf")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("applied.cmf");
    skills::apply_skill(&base, &skill, &out, false).unwrap();
    let got = CmfFile::open(&out).unwrap();
    verified(&got);
    assert_eq!(name_hashes(&got), name_hashes(&skilled));
    assert_eq!(got.header.skills.as_ref().unwrap()[0].id, "sql");
    assert!(!got.is_skill_file());

    // A base with another directory is refused unless forced.
    let other = CmfFile::open(common::fixture("cmf/qwen3-q8.cmf")).unwrap();
    let err = skills::apply_skill(&other, &skill, &dir.path().join("x.cmf"), false).unwrap_err();
    assert!(err.to_string().contains("d3e074f94cea010a"), "{err}");
    assert!(
        !dir.path().join("x.cmf").exists(),
        "a refused apply writes nothing"
    );
    skills::apply_skill(&other, &skill, &dir.path().join("x.cmf"), true).unwrap();
}

#[test]
fn exporting_a_skill_matches_the_reference_skill_file() {
    let base = CmfFile::open(common::fixture("cmf/qwen3-q8_2f.cmf")).unwrap();
    let skilled = CmfFile::open(common::fixture("cmf/qwen3-skills.cmf")).unwrap();
    let reference = CmfFile::open(common::fixture("cmf/qwen3-skillfile.cmf")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("sql.cmf");
    skills::export_skill(&skilled, "sql", &base, &out).unwrap();
    let got = CmfFile::open(&out).unwrap();
    verified(&got);
    assert!(got.is_skill_file());
    let rec = &got.header.skills.as_ref().unwrap()[0];
    assert_eq!(rec.base_dir_hash.as_deref(), Some("d3e074f94cea010a"));
    assert_eq!(name_hashes(&got), name_hashes(&reference));
}

#[test]
fn append_in_place_keeps_every_existing_byte() {
    let src = common::fixture("cmf/qwen3-q8_2f.cmf");
    let skilled = CmfFile::open(common::fixture("cmf/qwen3-skills.cmf")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("grow.cmf");
    std::fs::copy(&src, &path).unwrap();
    let before = std::fs::read(&path).unwrap();
    let record = skilled.header.skills.as_ref().unwrap()[0].clone();
    let tensors: Vec<SkillTensor> = skills::skill_tensors(&skilled, "sql")
        .into_iter()
        .map(|(e, b)| SkillTensor {
            base_name: b.into(),
            dtype: e.dtype,
            shape: e.shape.clone(),
            bytes: skilled.tensor_bytes(e),
        })
        .collect();
    assert_eq!(tensors.len(), 9);
    skills::append_skill_in_place(&path, record.clone(), &tensors).unwrap();
    let after = std::fs::read(&path).unwrap();
    assert_eq!(
        &after[128..before.len()],
        &before[128..],
        "append-only: nothing before the old end changes but the envelope"
    );
    let grown = CmfFile::open(&path).unwrap();
    verified(&grown);
    assert_eq!(name_hashes(&grown), name_hashes(&skilled));
    let old = CmfFile::open(&src).unwrap();
    for e in old.directory.iter() {
        assert_eq!(grown.directory.get(&e.name).unwrap().off, e.off);
    }
    // Adding the same skill again is refused and leaves the file valid.
    assert!(skills::append_skill_in_place(&path, record.clone(), &tensors).is_err());
    verified(&CmfFile::open(&path).unwrap());

    // The copying variant leaves its input alone.
    let out = dir.path().join("copy.cmf");
    skills::add_skill_to_copy(&src, &out, record, &tensors).unwrap();
    assert_eq!(std::fs::read(&src).unwrap(), before);
    assert_eq!(
        name_hashes(&CmfFile::open(&out).unwrap()),
        name_hashes(&skilled)
    );
    // And compact makes the grown file tight again, with the same tensors.
    let tight = dir.path().join("tight.cmf");
    writer::compact(&grown, &tight).unwrap();
    assert!(std::fs::metadata(&tight).unwrap().len() < after.len() as u64);
    assert_eq!(
        name_hashes(&CmfFile::open(&tight).unwrap()),
        name_hashes(&skilled)
    );
}

#[test]
fn sharded_write_and_open_from_any_shard() {
    let src = CmfFile::open(common::fixture("cmf/qwen3_moe-masked.cmf")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("moe.cmf");
    let spec = writer::spec_of(&src);
    let shards = writer::write_sharded(&out, spec, 200_000, |i| {
        Ok(std::borrow::Cow::Borrowed(
            src.tensor_bytes(&src.directory.entries[i]),
        ))
    })
    .unwrap();
    assert!(shards.len() >= 3, "{} shards", shards.len());
    let n = shards.len() as u32;
    for s in &shards {
        let f = CmfFile::open(&s.path).unwrap();
        verified(&f); // every shard verifies on its own
    }
    for no in 1..=n {
        let m = CmfModel::open(writer::shard_name(&out, no, n)).unwrap();
        assert_eq!(m.shards.len(), n as usize);
        assert_eq!(m.tensor_count(), src.directory.len());
        for e in src.directory.iter() {
            assert_eq!(m.tensor_bytes(&e.name).unwrap(), src.tensor_bytes(e));
        }
        assert!(m.primary().masks.is_some());
        assert!(m.primary().vocab_bytes().is_some());
    }
    let second = CmfFile::open(writer::shard_name(&out, 2, n)).unwrap();
    assert!(second.masks.is_none() && second.vocab_bytes().is_none());
    assert!(second.header.tokenizer_config.is_none());

    // A renamed non-first shard cannot stand in for the model.
    let renamed = dir.path().join("lonely.cmf");
    std::fs::copy(writer::shard_name(&out, 2, n), &renamed).unwrap();
    assert!(CmfModel::open(&renamed).is_err());
    // A missing sibling is an error naming it.
    std::fs::remove_file(writer::shard_name(&out, n, n)).unwrap();
    let err = CmfModel::open(writer::shard_name(&out, 1, n)).unwrap_err();
    assert!(err.to_string().contains("missing shard"), "{err}");
}

#[test]
fn a_failing_sharded_write_leaves_nothing_behind() {
    let src = CmfFile::open(common::fixture("cmf/qwen3_moe-masked.cmf")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("moe.cmf");
    let n = src.directory.len();
    let err = writer::write_sharded(&out, writer::spec_of(&src), 200_000, |i| {
        if i + 1 == n {
            return Err(cortiq_engine::format::FormatError::Parse(
                "source went away".into(),
            ));
        }
        Ok(std::borrow::Cow::Borrowed(
            src.tensor_bytes(&src.directory.entries[i]),
        ))
    });
    assert!(err.is_err());
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(
        left.is_empty(),
        "no shard and no temporary file remain: {left:?}"
    );
}
