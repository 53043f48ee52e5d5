//! The engine on a structurally valid but hostile file, as `cortiq run --no-verify` meets
//! it: a small valid model (written once by `tinymodel::write_tiny` in several dtypes and
//! block kinds, or a masked / skilled fixture when `../shared/fixtures` is there) with
//! fuzz bytes written over its header, directory or weights, then `CmfFile::from_bytes`,
//! `Model::load` and, if it loads, a 3-token prefill and one decode step, optionally under
//! the file's first task mask or skill. Every step either fails with an error or
//! succeeds; never a panic, a hang or unbounded memory, and logits that come back are
//! finite (the forward reports NaN/Inf as an error).
//!
//! Input: `[base u8][run u8]` then patches `[region u8][offset u32 LE][len u8][bytes]`;
//! regions: 0 the data section, 1 the header, 2 the directory, 3 the whole file
//! (offsets wrap around the region). run: bits 0-1 precision, bit 2 all logits,
//! bit 3 a decode step, bit 4 the first task mask, bit 5 the first skill.
#![no_main]

use std::path::Path;
use std::sync::{Arc, OnceLock};

use cortiq_engine::format::shards::CmfModel;
use cortiq_engine::format::{CmfFile, DType, Section};
use cortiq_engine::model::select::SkillChoice;
use cortiq_engine::model::{Logits, Model, Precision};
use cortiq_engine::tinymodel::{write_tiny, TinyFf, TinyLayer, TinyMixer, TinySpec};
use libfuzzer_sys::fuzz_target;

/// A valid file and where its sections lie.
struct Base {
    bytes: Vec<u8>,
    header: Section,
    directory: Section,
    data: Section,
}

fn small(dtype: DType, layers: Vec<TinyLayer>, mtp: bool) -> TinySpec {
    TinySpec {
        hidden: 32,
        heads: 2,
        kv_heads: 1,
        head_dim: 16,
        mtp,
        dtype,
        ..TinySpec::awkward(layers)
    }
}

fn specs() -> Vec<TinySpec> {
    let gdn = TinyMixer::GatedDeltaNet {
        key_heads: 1,
        value_heads: 2,
        dk: 16,
        dv: 32,
        kernel: 2,
    };
    let moe = TinyFf::Moe {
        experts: 4,
        top_k: 2,
        intermediate: 32,
        shared: Some(32),
    };
    let dense = || vec![TinyLayer::attention_dense(64)];
    let hybrid = || {
        vec![
            TinyLayer {
                mixer: gdn.clone(),
                ff: moe.clone(),
            },
            TinyLayer {
                mixer: TinyMixer::Attention { gated: true },
                ff: TinyFf::Dense { intermediate: 64 },
            },
        ]
    };
    vec![
        small(DType::F32, dense(), false),
        small(DType::Q8Row, hybrid(), true),
        small(DType::Q4tp, hybrid(), false),
        small(DType::Q1t, dense(), false),
        small(DType::Vbit, hybrid(), false),
        small(DType::Q8_2f, dense(), false),
        small(DType::Q4Block, dense(), false),
        small(DType::F16, hybrid(), false),
    ]
}

fn base_of(bytes: Vec<u8>) -> Option<Base> {
    let f = CmfFile::from_bytes(bytes.clone()).ok()?;
    let e = &f.envelope;
    Some(Base {
        header: e.header,
        directory: e.directory,
        data: e.data,
        bytes,
    })
}

fn bases() -> &'static [Base] {
    static B: OnceLock<Vec<Base>> = OnceLock::new();
    B.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let mut out = Vec::new();
        for (i, spec) in specs().iter().enumerate() {
            let p = dir.path().join(format!("{i}.cmf"));
            write_tiny(&p, spec).unwrap_or_else(|e| panic!("tiny model {i}: {e}"));
            out.push(base_of(std::fs::read(&p).unwrap()).expect("a tiny model opens"));
        }
        // A task mask and a skill registry reach the forward only through these.
        let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/fixtures/cmf");
        for name in ["qwen3_moe-masked.cmf", "qwen3-skills.cmf"] {
            if let Some(b) = std::fs::read(fixtures.join(name)).ok().and_then(base_of) {
                out.push(b);
            }
        }
        out
    })
}

fn patch(base: &Base, mut script: &[u8]) -> Vec<u8> {
    let mut bytes = base.bytes.clone();
    while let Some((&region, r)) = script.split_first() {
        let Some((off, r)) = r.split_first_chunk::<4>() else {
            break;
        };
        let Some((&len, r)) = r.split_first() else {
            break;
        };
        let len = (len as usize).min(r.len());
        let (with, r) = r.split_at(len);
        script = r;
        let (start, size) = match region & 3 {
            0 => (base.data.off, base.data.len),
            1 => (base.header.off, base.header.len),
            2 => (base.directory.off, base.directory.len),
            _ => (0, bytes.len() as u64),
        };
        if size == 0 {
            continue;
        }
        let at = (start + u32::from_le_bytes(*off) as u64 % size) as usize;
        let end = (at + with.len()).min(bytes.len());
        bytes[at..end].copy_from_slice(&with[..end - at]);
    }
    bytes
}

fuzz_target!(|data: &[u8]| {
    let [which, run, script @ ..] = data else {
        return;
    };
    let bases = bases();
    let base = &bases[*which as usize % bases.len()];
    let bytes = patch(base, script);
    let Ok(file) = CmfFile::from_bytes(bytes) else {
        return;
    };
    let Ok(cmf) = CmfModel::from_files(vec![file]) else {
        return;
    };
    let Ok(mut model) = Model::load(Arc::new(cmf)) else {
        return;
    };
    model.set_precision(match run & 3 {
        0 => Precision::Exact,
        1 => Precision::Fast,
        _ => Precision::Balanced,
    });
    let mut state = model.new_state(8);
    let mut ws = model.new_workspace(4);
    if run & 16 != 0 {
        let first = model
            .file
            .primary()
            .masks
            .as_ref()
            .and_then(|m| m.meta.masks.first())
            .map(|r| r.name.clone());
        if let Some(name) = first {
            match model.task(&name) {
                Ok(t) => ws.active.task = Some(t),
                Err(_) => return,
            }
        }
    }
    if run & 32 != 0 && model.skills.first().is_some_and(|s| s.problem.is_none()) {
        ws.active.skill = SkillChoice::One(0);
    }
    let vocab = model.config.vocab as u32;
    let tokens = [1 % vocab.max(1), 7 % vocab.max(1), 200 % vocab.max(1)];
    let logits = if run & 4 != 0 {
        Logits::All
    } else {
        Logits::Last
    };
    if model
        .forward(&tokens, &mut state, &mut ws, logits, None)
        .is_err()
    {
        return;
    }
    assert!(ws.logits.iter().all(|v| v.is_finite()), "non-finite logits");
    if run & 8 != 0
        && model
            .forward(&tokens[..1], &mut state, &mut ws, Logits::Last, None)
            .is_ok()
    {
        assert!(ws.logits.iter().all(|v| v.is_finite()), "non-finite logits");
    }
});
