//! Interoperability with the reference implementation's CLI, used as a black box: files our
//! writer makes open and verify there, it decodes every tensor we encode to exactly the
//! values our decoder gives, and on the reference's own files it lists the same masks and
//! skills and decodes the same values as we do. Run by `scripts/slow-checks.sh`, which
//! installs the reference CLI; without it these tests fail and say how to get it.
#![cfg(feature = "peer-tests")]

use std::path::{Path, PathBuf};
use std::process::Command;

use cortiq_engine::format::dtype::WRITABLE;
use cortiq_engine::format::header::Header;
use cortiq_engine::format::skills;
use cortiq_engine::format::writer::{self, TensorPlan, WriteSpec};
use cortiq_engine::format::{CmfFile, DType, SectionKind};
use cortiq_engine::quant::{self, EncodeOptions};

fn shared(rel: &str) -> PathBuf {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../shared")
        .join(rel);
    assert!(
        p.exists(),
        "{} is missing: these tests need ../shared beside the checkout",
        p.display()
    );
    p
}

fn reference() -> PathBuf {
    let p = std::env::var_os("CORTIQ_REFERENCE_CLI")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var("HOME").unwrap_or_default())
                .join(".cache/cmf-peers/bin/cortiq")
        });
    assert!(
        p.exists(),
        "the reference CLI is not at {} — run scripts/slow-checks.sh (or ../shared/bench/peers.sh) to install it",
        p.display()
    );
    p
}

fn ref_ok(args: &[&std::ffi::OsStr]) -> String {
    let out = Command::new(reference())
        .args(args)
        .output()
        .expect("run the reference CLI");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "reference {:?} failed:\n{text}", args);
    text
}

fn ref_verify(path: &Path) {
    let text = ref_ok(&["verify".as_ref(), path.as_os_str()]);
    assert!(
        text.contains("all tensor hashes match") && text.lines().any(|l| l.trim() == "OK"),
        "{}:\n{text}",
        path.display()
    );
}

/// Every tensor of `file` dumped by the reference as f32, compared with our decoder.
fn ref_decodes_like_us(path: &Path) -> usize {
    let dir = tempfile::tempdir().unwrap();
    let listing = ref_ok(&[
        "dequant".as_ref(),
        "--all".as_ref(),
        "--name".as_ref(),
        "".as_ref(),
        "--out".as_ref(),
        dir.path().as_os_str(),
        path.as_os_str(),
    ]);
    let f = CmfFile::open(path).unwrap();
    // The dump lists `name<TAB>dtype<TAB>[shape]` per tensor: the same directory as ours.
    // Names compared case- and underscore-blind; the reference spells q4tp "Q4TiledP".
    let norm = |s: &str| match s.to_ascii_lowercase().replace('_', "").as_str() {
        "q4tiledp" => "q4tp".to_string(),
        other => other.to_string(),
    };
    let mut listed = 0;
    for line in listing.lines() {
        let cols: Vec<&str> = line.split('\t').collect();
        if cols.len() != 3 {
            continue;
        }
        let e = f.directory.get(cols[0]).unwrap_or_else(|| {
            panic!(
                "{}: reference lists {:?}, we do not",
                path.display(),
                cols[0]
            )
        });
        assert_eq!(
            norm(cols[1]),
            norm(e.dtype.name()),
            "{}: {}",
            path.display(),
            e.name
        );
        let shape = format!("{:?}", e.shape);
        assert_eq!(cols[2], shape, "{}: {}", path.display(), e.name);
        listed += 1;
    }
    assert_eq!(
        listed,
        f.directory.len(),
        "{}: the reference listed {listed} tensors",
        path.display()
    );
    let mut n = 0;
    for e in f.directory.iter() {
        let theirs: Vec<f32> = std::fs::read(dir.path().join(format!("{}.bin", e.name)))
            .unwrap_or_else(|err| panic!("{}: reference dump of {}: {err}", path.display(), e.name))
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        let ours = quant::decode(e.dtype, &e.shape, f.tensor_bytes(e)).unwrap();
        assert_eq!(ours.len(), theirs.len(), "{}: {}", path.display(), e.name);
        for (i, (a, b)) in ours.iter().zip(&theirs).enumerate() {
            // The same bytes decoded by two implementations: equal up to f32 rounding of the
            // product order (ladder scales are computed iteratively).
            let tol = 1e-6 * a.abs().max(b.abs()).max(1e-30);
            assert!(
                (a - b).abs() <= tol,
                "{}: {} [{}] {:?}: ours {a}, reference {b}",
                path.display(),
                e.name,
                i,
                e.dtype
            );
        }
        n += 1;
    }
    n
}

fn f32_tensors(path: &Path) -> Vec<(String, Vec<u64>, Vec<f32>)> {
    let bytes = std::fs::read(path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut v: Vec<_> = st
        .tensors()
        .into_iter()
        .map(|(name, t)| {
            assert_eq!(t.dtype(), safetensors::Dtype::F32, "{name}");
            let vals = t
                .data()
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect();
            (name, t.shape().iter().map(|&d| d as u64).collect(), vals)
        })
        .collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

/// A small converter for the test: qwen3's f32 weights with every 2-D tensor the codec can
/// hold in `dtype`, the rest in f16, and the reference file's header and tokenizer.
fn write_per_dtype(dtype: DType, out: &Path) {
    let like = CmfFile::open(shared("fixtures/cmf/qwen3-q8.cmf")).unwrap();
    let tensors = f32_tensors(&shared("fixtures/hf/qwen3/model.safetensors"));
    let mut header: Header = like.header.clone();
    header.quant_type = Some("F32".into()); // informational only
    let plan: Vec<TensorPlan> = tensors
        .iter()
        .map(|(name, shape, _)| {
            let fits = shape.len() == 2 && shape[1] % 32 == 0;
            TensorPlan {
                name: name.clone(),
                dtype: if fits { dtype } else { DType::F16 },
                shape: shape.clone(),
            }
        })
        .collect();
    let opts = EncodeOptions {
        mean_bits: Some(5.0),
        outlier_fraction: Some(0.01),
    };
    let payloads: Vec<Vec<u8>> = plan
        .iter()
        .zip(&tensors)
        .map(|(p, (_, _, v))| quant::encode(p.dtype, &p.shape, v, &opts).unwrap())
        .collect();
    let spec = WriteSpec {
        header,
        tensors: plan,
        vocab: Some(like.section_bytes(SectionKind::Vocab).to_vec()),
        ..Default::default()
    };
    writer::write_file(out, spec, payloads.iter().map(|p| p.as_slice())).unwrap();
}

#[test]
fn one_file_per_dtype_verifies_and_decodes_identically_in_the_reference() {
    let dir = tempfile::tempdir().unwrap();
    for d in WRITABLE {
        let p = dir.path().join(format!("qwen3-{}.cmf", d.name()));
        write_per_dtype(d, &p);
        ref_verify(&p);
        assert_eq!(ref_decodes_like_us(&p), 47, "{d}");
    }
}

#[test]
fn demo_masked_skilled_sharded_and_grown_files_verify_in_the_reference() {
    let dir = tempfile::tempdir().unwrap();
    let demo = dir.path().join("demo.cmf");
    cortiq_engine::synth::write_demo(&demo).unwrap();
    ref_verify(&demo);
    assert_eq!(ref_decodes_like_us(&demo), 141);
    let masks = ref_ok(&["masks".as_ref(), demo.as_os_str()]);
    for task in ["general", "code", "chat"] {
        assert!(
            masks.contains(task),
            "reference masks listing lacks {task}:\n{masks}"
        );
    }

    // Masked (rewritten by our writer).
    let masked = dir.path().join("masked.cmf");
    writer::compact(
        &CmfFile::open(shared("fixtures/cmf/qwen3_moe-masked.cmf")).unwrap(),
        &masked,
    )
    .unwrap();
    ref_verify(&masked);
    assert!(ref_ok(&["masks".as_ref(), masked.as_os_str()]).contains("code"));

    // Skilled: the reference skill file applied by us; and a skill file exported by us.
    let base = CmfFile::open(shared("fixtures/cmf/qwen3-q8_2f.cmf")).unwrap();
    let skilled = dir.path().join("skilled.cmf");
    skills::apply_skill(
        &base,
        &CmfFile::open(shared("fixtures/cmf/qwen3-skillfile.cmf")).unwrap(),
        &skilled,
        false,
    )
    .unwrap();
    ref_verify(&skilled);
    let list = ref_ok(&["skill".as_ref(), "list".as_ref(), skilled.as_os_str()]);
    assert!(list.contains("sql"), "{list}");
    let exported = dir.path().join("sql-skill.cmf");
    skills::export_skill(&CmfFile::open(&skilled).unwrap(), "sql", &base, &exported).unwrap();
    let applied_by_ref = dir.path().join("applied-by-ref.cmf");
    ref_ok(&[
        "skill".as_ref(),
        "apply".as_ref(),
        shared("fixtures/cmf/qwen3-q8_2f.cmf").as_os_str(),
        exported.as_os_str(),
        "-o".as_ref(),
        applied_by_ref.as_os_str(),
    ]);
    ref_verify(&applied_by_ref);

    // Grown append-only, in place.
    let grown = dir.path().join("grown.cmf");
    std::fs::copy(shared("fixtures/cmf/qwen3-q8_2f.cmf"), &grown).unwrap();
    let donor = CmfFile::open(shared("fixtures/cmf/qwen3-skills.cmf")).unwrap();
    let record = donor.header.skills.as_ref().unwrap()[0].clone();
    let tensors: Vec<skills::SkillTensor> = skills::skill_tensors(&donor, "sql")
        .into_iter()
        .map(|(e, b)| skills::SkillTensor {
            base_name: b.into(),
            dtype: e.dtype,
            shape: e.shape.clone(),
            bytes: donor.tensor_bytes(e),
        })
        .collect();
    skills::append_skill_in_place(&grown, record, &tensors).unwrap();
    ref_verify(&grown);

    // Sharded: every shard verifies on its own, and the set opens from shard 1.
    let src = CmfFile::open(shared("fixtures/cmf/qwen3_moe-masked.cmf")).unwrap();
    let out = dir.path().join("moe.cmf");
    let shards = writer::write_sharded(&out, writer::spec_of(&src), 200_000, |i| {
        Ok(std::borrow::Cow::Borrowed(
            src.tensor_bytes(&src.directory.entries[i]),
        ))
    })
    .unwrap();
    assert!(shards.len() > 1);
    for s in &shards {
        ref_verify(&s.path);
    }
    let info = ref_ok(&["info".as_ref(), shards[0].path.as_os_str()]);
    assert!(
        info.contains("135"),
        "the reference should see all 135 tensors of the set:\n{info}"
    );
}

#[test]
fn on_reference_files_we_see_what_the_reference_sees() {
    let dir = shared("fixtures/cmf");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "cmf"))
        .collect();
    files.sort();
    assert_eq!(files.len(), 13);
    for p in &files {
        let f = CmfFile::open(p).unwrap();
        // Same tensors, dtypes, shapes (the reference's dump lists them) and decoded values.
        let n = ref_decodes_like_us(p);
        assert_eq!(n, f.directory.len());
        let info = ref_ok(&["info".as_ref(), p.as_os_str()]);
        assert!(
            info.contains(&format!("Tensors:     {}", f.directory.len())),
            "{}:\n{info}",
            p.display()
        );
        if let Some(m) = &f.masks {
            let listing = ref_ok(&["masks".as_ref(), p.as_os_str()]);
            for r in &m.meta.masks {
                assert!(listing.contains(&r.name), "{}: {}", p.display(), r.name);
            }
        }
        if let Some(s) = &f.header.skills {
            let listing = ref_ok(&["skill".as_ref(), "list".as_ref(), p.as_os_str()]);
            for r in s {
                assert!(listing.contains(&r.id), "{}: {}", p.display(), r.id);
            }
        }
    }
}

#[test]
fn our_gguf_imports_verify_and_decode_identically_in_the_reference() {
    use cortiq_engine::import::gguf_import::{import_gguf, QuantMode};
    let dir = tempfile::tempdir().unwrap();
    let mut n = 0;
    for entry in std::fs::read_dir(shared("fixtures/gguf")).unwrap() {
        let src = entry.unwrap().path();
        if src.extension().is_none_or(|e| e != "gguf") {
            continue;
        }
        for (mode, tag) in [
            (QuantMode::Keep, "keep"),
            (QuantMode::Codec(DType::Q4tp), "q4tp"),
        ] {
            let out = dir.path().join(format!(
                "{}-{tag}.cmf",
                src.file_stem().unwrap().to_string_lossy()
            ));
            import_gguf(&src, &out, mode, &mut |_| {})
                .unwrap_or_else(|e| panic!("{}: {e}", src.display()));
            ref_verify(&out);
            assert!(ref_decodes_like_us(&out) > 0);
            n += 1;
        }
    }
    assert_eq!(n, 28, "14 GGUF fixtures × 2 modes");
}
