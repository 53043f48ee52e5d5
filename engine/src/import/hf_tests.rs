//! `import::hf` against the fixtures of `../shared/fixtures/hf` (checkpoints written by
//! transformers) and `../shared/fixtures/cmf` (files the reference converter wrote).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::hf::{self, ConvertOptions};
use crate::format::verify::{verify, VerifyOptions};
use crate::format::{CmfFile, CmfModel, DType};
use crate::quant::{self, EncodeOptions};

const FAMILIES: [&str; 9] = [
    "llama",
    "llama_gguf",
    "qwen2",
    "qwen2_moe",
    "qwen3",
    "qwen3_5",
    "qwen3_5_moe",
    "qwen3_moe",
    "gemma3",
];

fn shared(rel: &str) -> PathBuf {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../shared/fixtures")
        .join(rel);
    assert!(
        p.exists(),
        "{} is missing: these tests need ../shared beside the checkout",
        p.display()
    );
    p
}

/// Every tensor of the checkpoint's safetensors, read independently of the converter.
/// Tensors by name: shape and f32 values.
type Tensors = HashMap<String, (Vec<u64>, Vec<f32>)>;

fn source_tensors(dir: &Path) -> Tensors {
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    st.tensors()
        .into_iter()
        .map(|(name, v)| {
            assert_eq!(v.dtype(), safetensors::Dtype::F32, "{name}");
            let vals = v
                .data()
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            let shape = v.shape().iter().map(|&d| d as u64).collect();
            (name, (shape, vals))
        })
        .collect()
}

/// Writes `tensors` (name, shape, little-endian bytes of `dtype`) as `path`.
fn write_safetensors(
    path: &Path,
    dtype: safetensors::Dtype,
    tensors: &[(String, Vec<u64>, Vec<u8>)],
) {
    let views: Vec<(String, safetensors::tensor::TensorView)> = tensors
        .iter()
        .map(|(n, s, b)| {
            let shape: Vec<usize> = s.iter().map(|&d| d as usize).collect();
            (
                n.clone(),
                safetensors::tensor::TensorView::new(dtype, shape, b).unwrap(),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, None, path).unwrap();
}

fn payload_check(d: DType, s: &[u64], b: &[u8]) -> Result<(), String> {
    quant::validate(d, s, b).map_err(|e| e.to_string())
}

fn assert_verifies(path: &Path) -> CmfFile {
    let file = CmfFile::open(path).unwrap();
    let opts = VerifyOptions {
        payload_check: Some(payload_check),
        ..VerifyOptions::default()
    };
    let report = verify(&file, &opts, &|_| {});
    assert!(report.ok, "{}: {:?}", path.display(), report.first_failure);
    file
}

fn convert(family: &str, quant: DType, out: &Path) -> hf::ConvertSummary {
    let mut opts = ConvertOptions::new(quant);
    opts.source_label = Some(format!("shared/fixtures/hf/{family}"));
    hf::convert(&shared(&format!("hf/{family}")), out, &opts, &mut |_| {}).unwrap()
}

#[test]
fn every_family_converts_exactly_at_f32() {
    let tmp = tempfile::tempdir().unwrap();
    for family in FAMILIES {
        let out = tmp.path().join(format!("{family}.cmf"));
        let summary = convert(family, DType::F32, &out);
        assert!(
            summary.fallbacks.is_empty(),
            "{family}: {:?}",
            summary.fallbacks
        );
        let file = assert_verifies(&out);
        let src = source_tensors(&shared(&format!("hf/{family}")));
        assert_eq!(file.directory.len(), src.len(), "{family}");
        for (name, (shape, values)) in &src {
            let (e, bytes) = file
                .tensor(name)
                .unwrap_or_else(|| panic!("{family}: {name} missing"));
            assert_eq!(e.dtype, DType::F32, "{family}: {name}");
            assert_eq!(&e.shape, shape, "{family}: {name}");
            let got = quant::decode(e.dtype, &e.shape, bytes).unwrap();
            let same = got
                .iter()
                .zip(values)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "{family}: {name} differs from the source");
        }
        assert!(file.vocab_bytes().is_some(), "{family}: no vocab");
    }
}

#[test]
fn every_quant_stays_within_the_codec_bound() {
    let tmp = tempfile::tempdir().unwrap();
    let quants = [
        DType::Q8Row,
        DType::Q8_2f,
        DType::Q4Block,
        DType::Q4Tiled,
        DType::Q4tp,
        DType::VbitRo,
        DType::Q1,
        DType::Q1s,
        DType::Q1t,
        DType::F16,
        DType::Bf16,
    ];
    for family in [
        "qwen3",
        "qwen3_moe",
        "qwen3_5",
        "qwen3_5_moe",
        "gemma3",
        "qwen2_moe",
    ] {
        let src = source_tensors(&shared(&format!("hf/{family}")));
        for q in quants {
            let out = tmp.path().join(format!("{family}-{q}.cmf"));
            convert(family, q, &out);
            let file = assert_verifies(&out);
            let mut quantized = 0;
            for e in file.directory.iter() {
                let (shape, values) = &src[&e.name];
                let bytes = file.tensor_bytes(e);
                let got = quant::decode(e.dtype, &e.shape, bytes).unwrap();
                let bound = quant::error_bounds(e.dtype, &e.shape, bytes).unwrap();
                assert_eq!(&e.shape, shape);
                for (i, ((a, b), m)) in got.iter().zip(values).zip(&bound).enumerate() {
                    assert!(
                        (a - b).abs() <= *m,
                        "{family} {q}: {} [{i}] {a} vs {b} (bound {m})",
                        e.name
                    );
                }
                if e.dtype == q {
                    quantized += 1;
                }
                // 1-D and tiny tensors are f16 whatever the quant (§3.2).
                if e.shape.len() == 1 {
                    assert_eq!(e.dtype, DType::F16, "{family} {q}: {}", e.name);
                }
            }
            assert!(quantized > 0, "{family} {q}: nothing quantized");
        }
    }
}

/// The `arch` of the reference-written file, field by field: ours must agree on every
/// field it writes. `null` there means "absent"; ours omits such fields.
#[test]
fn header_matches_the_reference_converter() {
    let tmp = tempfile::tempdir().unwrap();
    for family in ["qwen3", "qwen3_moe", "qwen3_5", "gemma3"] {
        let reference = CmfFile::open(shared(&format!("cmf/{family}-q8.cmf"))).unwrap();
        let out = tmp.path().join(format!("{family}.cmf"));
        convert(family, DType::Q8Row, &out);
        let ours = CmfFile::open(&out).unwrap();
        let r = serde_json::to_value(&reference.header).unwrap();
        let o = serde_json::to_value(&ours.header).unwrap();
        let (ra, oa) = (&r["arch"], &o["arch"]);
        for (k, rv) in ra.as_object().unwrap() {
            let ov = oa.get(k).unwrap_or(&Value::Null);
            if family == "gemma3" && k == "rope_theta" {
                // Deliberate: the reference records the sliding layers' theta (10000) as
                // the model's; we record the full-attention theta and the sliding one as
                // rope_local_base_freq.
                assert_eq!(ov.as_f64(), Some(1_000_000.0));
                assert_eq!(oa["rope_local_base_freq"].as_f64(), rv.as_f64());
                continue;
            }
            let equal = match (rv.as_f64(), ov.as_f64()) {
                (Some(a), Some(b)) => a == b,
                _ => rv == ov,
            };
            assert!(equal, "{family}: arch.{k}: reference {rv}, ours {ov}");
        }
        assert_eq!(r["tokenizer_config"], o["tokenizer_config"], "{family}");
        assert_eq!(r["quant_type"], o["quant_type"], "{family}");
        assert_eq!(r["provenance"]["tool"], o["provenance"]["tool"]);
        assert_eq!(
            r["provenance"]["source_model"],
            o["provenance"]["source_model"]
        );
        // Same tensor set, same dtypes.
        assert_eq!(reference.directory.len(), ours.directory.len(), "{family}");
        for e in reference.directory.iter() {
            let mine = ours.directory.get(&e.name).unwrap();
            assert_eq!((mine.dtype, &mine.shape), (e.dtype, &e.shape), "{}", e.name);
        }
    }
}

#[test]
fn norm_style_and_moe_per_family() {
    let tmp = tempfile::tempdir().unwrap();
    let expect = [
        ("llama", "qwen", None),
        ("qwen2", "qwen", None),
        ("qwen2_moe", "qwen", Some((false, Some(64)))),
        ("qwen3_moe", "qwen", Some((true, None))),
        ("qwen3_5", "gemma", None),
        ("qwen3_5_moe", "gemma", Some((true, Some(64)))),
        ("gemma3", "gemma", None),
    ];
    for (family, norm, moe) in expect {
        let out = tmp.path().join(format!("{family}.cmf"));
        convert(family, DType::Q8Row, &out);
        let file = CmfFile::open(&out).unwrap();
        let h = serde_json::to_value(&file.header).unwrap();
        assert_eq!(h["arch"]["norm_style"], norm, "{family}");
        match moe {
            None => assert!(h["arch"].get("moe").is_none(), "{family}"),
            Some((norm_topk, shared)) => {
                let m = &h["arch"]["moe"];
                assert_eq!(m["num_experts"], 8, "{family}");
                assert_eq!(m["top_k"], 2, "{family}");
                assert_eq!(m["moe_intermediate_size"], 32, "{family}");
                assert_eq!(m["norm_topk_prob"], norm_topk, "{family}");
                assert_eq!(m["shared_expert_intermediate_size"].as_u64(), shared);
            }
        }
    }
}

/// §2.2: a layer's experts lie contiguous by role in the data section — all gate_proj,
/// then all up_proj, then all down_proj — with nothing else in between.
#[test]
fn moe_experts_are_contiguous_by_role() {
    let tmp = tempfile::tempdir().unwrap();
    for family in ["qwen2_moe", "qwen3_moe", "qwen3_5_moe"] {
        let out = tmp.path().join(format!("{family}.cmf"));
        convert(family, DType::Q4Block, &out);
        let file = CmfFile::open(&out).unwrap();
        let mut by_off: Vec<_> = file.directory.iter().collect();
        by_off.sort_by_key(|e| e.off);
        let mut layers_seen = 0;
        for layer in 0..4 {
            let prefix = format!("model.layers.{layer}.mlp.experts.");
            let pos: Vec<usize> = (0..by_off.len())
                .filter(|&i| by_off[i].name.starts_with(&prefix))
                .collect();
            if pos.is_empty() {
                continue;
            }
            layers_seen += 1;
            assert_eq!(pos.len(), 24, "{family} layer {layer}");
            assert_eq!(
                pos[23] - pos[0],
                23,
                "{family} layer {layer}: not contiguous"
            );
            let mut want = Vec::new();
            for role in ["gate_proj", "up_proj", "down_proj"] {
                for e in 0..8 {
                    want.push(format!("{prefix}{e}.{role}.weight"));
                }
            }
            let got: Vec<&str> = pos.iter().map(|&i| by_off[i].name.as_str()).collect();
            assert_eq!(got, want, "{family} layer {layer}");
        }
        assert!(layers_seen >= 2, "{family}");
    }
}

#[test]
fn sharded_output_holds_every_tensor() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("q.cmf");
    let mut opts = ConvertOptions::new(DType::Q8Row);
    opts.shard_max_bytes = Some(200_000);
    let s = hf::convert(&shared("hf/qwen3"), &out, &opts, &mut |_| {}).unwrap();
    assert!(s.files.len() > 1, "{} files", s.files.len());
    for f in &s.files {
        assert_verifies(&f.path);
    }
    let model = CmfModel::open(&s.files[0].path).unwrap();
    assert_eq!(model.tensor_count(), s.tensors);
    assert!(!out.exists());
}

/// A bf16 / f16 checkpoint (the qwen3 fixture rewritten) converts at f32 to exactly the
/// source values; experts stored fused as 3-D tensors split into per-expert entries.
#[test]
fn half_precision_sources_and_fused_experts() {
    let src_dir = shared("hf/qwen3_moe");
    let src = source_tensors(&src_dir);
    for (st_dtype, round) in [
        (
            safetensors::Dtype::BF16,
            (|x: f32| half::bf16::from_f32(x).to_le_bytes()) as fn(f32) -> [u8; 2],
        ),
        (safetensors::Dtype::F16, |x: f32| {
            half::f16::from_f32(x).to_le_bytes()
        }),
    ] {
        let tmp = tempfile::tempdir().unwrap();
        for f in ["config.json", "tokenizer.json", "tokenizer_config.json"] {
            std::fs::copy(src_dir.join(f), tmp.path().join(f)).unwrap();
        }
        // Fuse each layer's experts the transformers-5 way: gate_up_proj [E, 2I, H],
        // down_proj [E, H, I]; rename everything under model.language_model.
        let mut out: Vec<(String, Vec<u64>, Vec<u8>)> = Vec::new();
        let enc = |v: &[f32]| v.iter().flat_map(|&x| round(x)).collect::<Vec<u8>>();
        for layer in 0..4 {
            let p = format!("model.layers.{layer}.mlp.experts.");
            let (mut gu, mut down) = (Vec::new(), Vec::new());
            for e in 0..8 {
                gu.extend(&src[&format!("{p}{e}.gate_proj.weight")].1);
                gu.extend(&src[&format!("{p}{e}.up_proj.weight")].1);
                down.extend(&src[&format!("{p}{e}.down_proj.weight")].1);
            }
            let q = format!("model.language_model.layers.{layer}.mlp.experts.");
            out.push((format!("{q}gate_up_proj"), vec![8, 64, 64], enc(&gu)));
            out.push((format!("{q}down_proj"), vec![8, 64, 32], enc(&down)));
        }
        for (name, (shape, v)) in &src {
            if name.contains(".mlp.experts.") {
                continue;
            }
            let n = name.replacen("model.", "model.language_model.", 1);
            out.push((n, shape.clone(), enc(v)));
        }
        write_safetensors(&tmp.path().join("model.safetensors"), st_dtype, &out);
        let cmf = tmp.path().join("out.cmf");
        let opts = ConvertOptions::new(DType::F32);
        let s = hf::convert(tmp.path(), &cmf, &opts, &mut |_| {}).unwrap();
        assert_eq!(s.tensors, src.len());
        let file = assert_verifies(&cmf);
        for (name, (shape, values)) in &src {
            let (got, _) = decoded(&file, name, shape);
            for (a, b) in got.iter().zip(values) {
                let want = match st_dtype {
                    safetensors::Dtype::BF16 => half::bf16::from_f32(*b).to_f32(),
                    _ => half::f16::from_f32(*b).to_f32(),
                };
                assert_eq!(a.to_bits(), want.to_bits(), "{name}");
            }
        }
    }
}

#[test]
fn codec_that_cannot_hold_a_matrix_falls_back_and_says_so() {
    let opts = ConvertOptions::new(DType::Q4tp);
    let (d, why) = hf::choose_dtype("x.weight", &[64, 48], &opts);
    assert_eq!(d, DType::Q8Row);
    assert!(why.unwrap().contains("cols = 48"));
    let (d, why) = hf::choose_dtype("x.weight", &[64, 64], &opts);
    assert_eq!((d, why), (DType::Q4tp, None));
    let (d, _) = hf::choose_dtype("model.norm.weight", &[64], &opts);
    assert_eq!(d, DType::F16);
    let (d, _) = hf::choose_dtype("model.norm.weight", &[64], &ConvertOptions::new(DType::F32));
    assert_eq!(d, DType::F32);
    let mut opts = ConvertOptions::new(DType::VbitRo);
    opts.encode = EncodeOptions {
        mean_bits: Some(5.0),
        ..EncodeOptions::default()
    };
    let (d, _) = hf::choose_dtype("x.weight", &[4, 40], &opts);
    assert_eq!(d, DType::Q8Row);
}

#[test]
fn names_are_normalised() {
    assert_eq!(
        hf::canonical_name("model.language_model.layers.0.mlp.gate.weight").as_deref(),
        Some("model.layers.0.mlp.gate.weight")
    );
    assert_eq!(
        hf::canonical_name("mtp.fc.weight").as_deref(),
        Some("model.mtp.eh_proj.weight")
    );
    assert_eq!(
        hf::canonical_name("mtp.layers.0.self_attn.q_proj.weight").as_deref(),
        Some("model.mtp.layers.0.self_attn.q_proj.weight")
    );
    assert_eq!(
        hf::canonical_name("model.visual.blocks.0.attn.qkv.weight"),
        None
    );
    assert_eq!(
        hf::canonical_name("lm_head.weight").as_deref(),
        Some("lm_head.weight")
    );
}

#[test]
fn a_broken_checkpoint_is_an_error_not_a_panic() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("o.cmf");
    let opts = ConvertOptions::new(DType::Q8Row);
    assert!(hf::convert(tmp.path(), &out, &opts, &mut |_| {}).is_err());
    std::fs::write(
        tmp.path().join("config.json"),
        b"{\"model_type\":\"llama\"}",
    )
    .unwrap();
    std::fs::write(
        tmp.path().join("model.safetensors"),
        b"\x10\0\0\0\0\0\0\0{}",
    )
    .unwrap();
    assert!(hf::convert(tmp.path(), &out, &opts, &mut |_| {}).is_err());
    assert!(!out.exists());
}

/// A Qwen3-Next style checkpoint (the qwen3_5 fixture with its Gated DeltaNet projections
/// fused into `in_proj_qkvz` / `in_proj_ba`, interleaved per key head) converts to the
/// separate Qwen3.5 tensors, exactly.
#[test]
fn fused_qwen3_next_projections_are_split() {
    let src_dir = shared("hf/qwen3_5");
    let src = source_tensors(&src_dir);
    let (nk, r, dk, dv, cols) = (2usize, 2usize, 16usize, 16usize, 64usize);
    let rows = |v: &[f32], r0: usize, n: usize| v[r0 * cols..(r0 + n) * cols].to_vec();
    let tmp = tempfile::tempdir().unwrap();
    for f in ["config.json", "tokenizer.json"] {
        std::fs::copy(src_dir.join(f), tmp.path().join(f)).unwrap();
    }
    let mut out: Vec<(String, Vec<u64>, Vec<f32>)> = Vec::new();
    let mut fused_layers = 0;
    for (name, (shape, v)) in &src {
        if let Some(base) = name.strip_suffix("in_proj_qkv.weight") {
            fused_layers += 1;
            let z = &src[&format!("{base}in_proj_z.weight")].1;
            let b = &src[&format!("{base}in_proj_b.weight")].1;
            let a = &src[&format!("{base}in_proj_a.weight")].1;
            let (mut qkvz, mut ba) = (Vec::new(), Vec::new());
            for g in 0..nk {
                qkvz.extend(rows(v, g * dk, dk));
                qkvz.extend(rows(v, nk * dk + g * dk, dk));
                qkvz.extend(rows(v, 2 * nk * dk + g * r * dv, r * dv));
                qkvz.extend(rows(z, g * r * dv, r * dv));
                ba.extend(rows(b, g * r, r));
                ba.extend(rows(a, g * r, r));
            }
            let n = (qkvz.len() / cols) as u64;
            out.push((format!("{base}in_proj_qkvz.weight"), vec![n, 64], qkvz));
            out.push((
                format!("{base}in_proj_ba.weight"),
                vec![(nk * 2 * r) as u64, 64],
                ba,
            ));
        } else if ["in_proj_z.weight", "in_proj_b.weight", "in_proj_a.weight"]
            .iter()
            .any(|s| name.ends_with(s))
        {
            continue;
        } else {
            out.push((name.clone(), shape.clone(), v.clone()));
        }
    }
    assert_eq!(fused_layers, 3);
    let out: Vec<(String, Vec<u64>, Vec<u8>)> = out
        .into_iter()
        .map(|(n, s, v)| (n, s, v.iter().flat_map(|x| x.to_le_bytes()).collect()))
        .collect();
    write_safetensors(
        &tmp.path().join("model.safetensors"),
        safetensors::Dtype::F32,
        &out,
    );
    let cmf = tmp.path().join("out.cmf");
    hf::convert(
        tmp.path(),
        &cmf,
        &ConvertOptions::new(DType::F32),
        &mut |_| {},
    )
    .unwrap();
    let file = assert_verifies(&cmf);
    assert_eq!(file.directory.len(), src.len());
    for (name, (shape, values)) in &src {
        let (e, bytes) = file
            .tensor(name)
            .unwrap_or_else(|| panic!("{name} missing"));
        assert_eq!(&e.shape, shape, "{name}");
        assert_eq!(
            &quant::decode(e.dtype, &e.shape, bytes).unwrap(),
            values,
            "{name}"
        );
    }
}

/// A multimodal-style checkpoint: `text_config` nesting, `model.language_model.` prefix, a
/// vision tensor, Qwen-style MTP tensors, weights sharded over two files with an index.
#[test]
fn multimodal_sharded_checkpoint_with_mtp() {
    let src_dir = shared("hf/qwen3_5");
    let src = source_tensors(&src_dir);
    let tmp = tempfile::tempdir().unwrap();
    for f in [
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
    ] {
        std::fs::copy(src_dir.join(f), tmp.path().join(f)).unwrap();
    }
    let mut text: Value =
        serde_json::from_slice(&std::fs::read(src_dir.join("config.json")).unwrap()).unwrap();
    text["mtp_num_hidden_layers"] = 1.into();
    let root = serde_json::json!({
        "model_type": "qwen3_5",
        "text_config": text,
        "vision_config": {"depth": 1},
        "eos_token_id": 7,
    });
    std::fs::write(tmp.path().join("config.json"), root.to_string()).unwrap();
    std::fs::write(
        tmp.path().join("generation_config.json"),
        r#"{"eos_token_id": [2, 5]}"#,
    )
    .unwrap();

    // (checkpoint name, canonical name, shape, values)
    let mut all: Vec<(String, String, Vec<u64>, Vec<f32>)> = Vec::new();
    for (name, (shape, v)) in &src {
        let ck = name.replacen("model.", "model.language_model.", 1);
        all.push((ck, name.clone(), shape.clone(), v.clone()));
        if let Some(rest) = name.strip_prefix("model.layers.3.") {
            all.push((
                format!("mtp.layers.0.{rest}"),
                format!("model.mtp.layers.0.{rest}"),
                shape.clone(),
                v.iter().map(|x| x * 0.5).collect(),
            ));
        }
    }
    let norm = src["model.norm.weight"].1.clone();
    for (ck, canon) in [
        ("mtp.pre_fc_norm_embedding.weight", "model.mtp.enorm.weight"),
        ("mtp.pre_fc_norm_hidden.weight", "model.mtp.hnorm.weight"),
        ("mtp.norm.weight", "model.mtp.norm.weight"),
    ] {
        all.push((ck.into(), canon.into(), vec![64], norm.clone()));
    }
    let fc: Vec<f32> = (0..64 * 128)
        .map(|i| (i % 97) as f32 * 0.01 - 0.4)
        .collect();
    all.push((
        "mtp.fc.weight".into(),
        "model.mtp.eh_proj.weight".into(),
        vec![64, 128],
        fc,
    ));
    all.push((
        "model.visual.patch_embed.proj.weight".into(),
        String::new(),
        vec![4, 8],
        vec![1.0; 32],
    ));

    let mut weight_map = serde_json::Map::new();
    let half = all.len() / 2;
    for (k, chunk) in [&all[..half], &all[half..]].into_iter().enumerate() {
        let file = format!("model-{:05}-of-00002.safetensors", k + 1);
        let bytes: Vec<Vec<u8>> = chunk
            .iter()
            .map(|t| t.3.iter().flat_map(|x| x.to_le_bytes()).collect())
            .collect();
        let views: Vec<(String, safetensors::tensor::TensorView)> = chunk
            .iter()
            .zip(&bytes)
            .map(|(t, b)| {
                let shape: Vec<usize> = t.2.iter().map(|&d| d as usize).collect();
                weight_map.insert(t.0.clone(), file.clone().into());
                let v = safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape, b)
                    .unwrap();
                (t.0.clone(), v)
            })
            .collect();
        safetensors::serialize_to_file(views, None, &tmp.path().join(&file)).unwrap();
    }
    std::fs::write(
        tmp.path().join("model.safetensors.index.json"),
        serde_json::json!({"metadata": {}, "weight_map": weight_map}).to_string(),
    )
    .unwrap();

    let cmf = tmp.path().join("out.cmf");
    hf::convert(
        tmp.path(),
        &cmf,
        &ConvertOptions::new(DType::F32),
        &mut |_| {},
    )
    .unwrap();
    let file = assert_verifies(&cmf);
    assert_eq!(
        file.directory.len(),
        all.len() - 1,
        "the vision tensor is dropped"
    );
    for (_, canon, shape, values) in all.iter().filter(|t| !t.1.is_empty()) {
        let (e, bytes) = file
            .tensor(canon)
            .unwrap_or_else(|| panic!("{canon} missing"));
        assert_eq!(&e.shape, shape, "{canon}");
        assert_eq!(
            &quant::decode(e.dtype, &e.shape, bytes).unwrap(),
            values,
            "{canon}"
        );
    }
    let h = serde_json::to_value(&file.header).unwrap();
    assert_eq!(h["arch"]["arch_name"], "qwen3_5_text");
    assert_eq!(h["arch"]["norm_style"], "gemma");
    assert_eq!(h["arch"]["mtp"]["num_layers"], 1);
    assert_eq!(h["arch"]["mtp"]["share_lm_head"], true);
    assert_eq!(h["provenance"]["dropped_tensors"], 1);
    // EOS from the text config (2), generation_config (2, 5); the tokenizer's <|im_end|> is 2.
    assert_eq!(
        h["tokenizer_config"]["eos_token_ids"],
        serde_json::json!([2, 5])
    );
    assert!(h["tokenizer_config"]["chat_template"]
        .as_str()
        .unwrap()
        .contains("im_start"));
}

#[test]
fn arch_from_older_and_other_configs() {
    // Gemma 2 style: no layer_types (alternating), top-level rope_theta, soft-capping.
    let cfg = serde_json::json!({
        "model_type": "gemma2", "hidden_size": 64, "num_hidden_layers": 4,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "vocab_size": 512, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
        "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0,
        "sliding_window": 4096, "query_pre_attn_scalar": 256,
        "hidden_activation": "gelu_pytorch_tanh"
    });
    let a = serde_json::to_value(hf::build_arch(&cfg, &["model.embed_tokens.weight"]).unwrap())
        .unwrap();
    assert_eq!(
        a["layer_types"],
        serde_json::json!([
            "SlidingAttention",
            "FullAttention",
            "SlidingAttention",
            "FullAttention"
        ])
    );
    assert_eq!(a["norm_style"], "gemma");
    assert_eq!(a["tie_word_embeddings"], true);
    assert_eq!(a["attn_logit_softcapping"], 50.0);
    assert_eq!(a["rope_theta"], 10000.0);
    // Qwen3-Next style: full_attention_interval, norm_topk_prob default true, local experts.
    let cfg = serde_json::json!({
        "model_type": "qwen3_next", "hidden_size": 64, "num_hidden_layers": 4,
        "num_attention_heads": 4, "vocab_size": 512, "full_attention_interval": 4,
        "num_local_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
        "rope_scaling": {"rope_type": "yarn", "factor": 4.0}
    });
    let a = serde_json::to_value(
        hf::build_arch(&cfg, &["lm_head.weight", "model.layers.0.mlp.gate.weight"]).unwrap(),
    )
    .unwrap();
    assert_eq!(a["layer_types"][2], "LinearAttention");
    assert_eq!(a["layer_types"][3], "FullAttention");
    assert_eq!(a["norm_style"], "gemma");
    assert_eq!(a["head_dim"], 16);
    assert_eq!(a["moe"]["num_experts"], 8);
    assert_eq!(a["moe"]["norm_topk_prob"], true);
    assert_eq!(a["rope_scaling"]["factor"], 4.0);
    // top_k above the expert count is refused, not written.
    let mut bad = cfg.clone();
    bad["num_experts_per_tok"] = 9.into();
    assert!(hf::build_arch(&bad, &["model.layers.0.mlp.gate.weight"]).is_err());
}

/// Gemma 3's sliding layers keep their own RoPE base (10000) next to the global one
/// (10^6) whichever way config.json spells it: transformers 5's per-kind
/// `rope_parameters` (the fixture), transformers 4's top-level `rope_theta` +
/// `rope_local_base_freq`, or no local base at all (transformers' default).
#[test]
fn gemma3_local_rope_base_in_every_config_style() {
    let v5: Value =
        serde_json::from_slice(&std::fs::read(shared("hf/gemma3/config.json")).unwrap()).unwrap();
    let mut v4 = v5.clone();
    let m = v4.as_object_mut().unwrap();
    m.remove("rope_parameters");
    m.insert("rope_theta".into(), 1_000_000.0.into());
    m.insert("rope_local_base_freq".into(), 10_000.0.into());
    m.insert("rope_scaling".into(), Value::Null);
    let mut bare = v4.clone();
    bare.as_object_mut().unwrap().remove("rope_local_base_freq");
    for (style, cfg) in [("v5", v5), ("v4", v4), ("no local base", bare)] {
        let a = serde_json::to_value(hf::build_arch(&cfg, &["model.embed_tokens.weight"]).unwrap())
            .unwrap();
        assert_eq!(a["rope_theta"].as_f64(), Some(1_000_000.0), "{style}");
        assert_eq!(
            a["rope_local_base_freq"].as_f64(),
            Some(10_000.0),
            "{style}"
        );
    }
}

/// The gemma3 fixture rebuilt with hidden size `hidden` (random weights, the fixture's
/// tokenizer), as an f32 checkpoint in `dir`; the embedding's values are returned.
fn gemma3_with_hidden(dir: &Path, hidden: u64) -> Vec<f32> {
    let src = shared("hf/gemma3");
    for f in [
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
    ] {
        std::fs::copy(src.join(f), dir.join(f)).unwrap();
    }
    let mut cfg: Value =
        serde_json::from_slice(&std::fs::read(src.join("config.json")).unwrap()).unwrap();
    cfg["hidden_size"] = hidden.into();
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    let mut rng = crate::synth::Rng::new(96);
    let mut embed = Vec::new();
    let mut out = Vec::new();
    for (name, (shape, _)) in source_tensors(&src) {
        // The hidden axis: the input of every projection but o_proj / down_proj, whose
        // output it is, and the length of every norm but the per-head q/k norms.
        let shape = match shape.as_slice() {
            [_] if name.contains("_norm.") => shape.clone(),
            [_] => vec![hidden],
            [rows, _] if !name.contains("o_proj") && !name.contains("down_proj") => {
                vec![*rows, hidden]
            }
            [_, cols] => vec![hidden, *cols],
            _ => unreachable!("{name}"),
        };
        let n: u64 = shape.iter().product();
        let vals: Vec<f32> = (0..n).map(|_| 0.5 * rng.normal()).collect();
        if name == "model.embed_tokens.weight" {
            embed = vals.clone();
        }
        let bytes = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
        out.push((name, shape, bytes));
    }
    write_safetensors(
        &dir.join("model.safetensors"),
        safetensors::Dtype::F32,
        &out,
    );
    embed
}

/// Gemma's √hidden embedding scale is the exact f32 root (transformers in f32,
/// llama.cpp), for a hidden size whose root bf16 cannot hold (√96 = 9.79795… vs bf16
/// 9.8125); the engine scales by exactly that; bf16 rounding only when asked for.
#[test]
fn gemma_embedding_scale_is_the_exact_f32_root() {
    let hidden = 96u64;
    let exact = (hidden as f32).sqrt();
    let rounded = half::bf16::from_f32(exact).to_f32();
    assert_ne!(exact, rounded, "the test needs a root bf16 cannot hold");
    let tmp = tempfile::tempdir().unwrap();
    let embed = gemma3_with_hidden(tmp.path(), hidden);
    let out = tmp.path().join("g.cmf");
    hf::convert(
        tmp.path(),
        &out,
        &ConvertOptions::new(DType::F32),
        &mut |_| {},
    )
    .unwrap();
    let file = assert_verifies(&out);
    let arch = file.header.arch.as_ref().unwrap();
    let m = arch.extra["embed_multiplier"].as_f64().unwrap();
    assert_eq!(
        m, exact as f64,
        "embed_multiplier {m}, f32 √{hidden} = {exact}"
    );
    assert_eq!(m, hf::embed_scale(hidden));

    // The engine's embedding output: the stored row times exactly that scale.
    let model =
        crate::model::Model::load(std::sync::Arc::new(CmfModel::open(&out).unwrap())).unwrap();
    assert_eq!(model.config.embed_multiplier, Some(exact));
    let (mut cache, mut ws) = (model.new_state(8), model.new_workspace(1));
    let mut states = Vec::new();
    let id = 7usize;
    model
        .forward(
            &[id as u32],
            &mut cache,
            &mut ws,
            crate::model::Logits::Last,
            Some(&mut states),
        )
        .unwrap();
    let h = hidden as usize;
    for (i, (got, e)) in states[..h].iter().zip(&embed[id * h..]).enumerate() {
        assert_eq!(got.to_bits(), (e * exact).to_bits(), "embedding [{i}]");
    }

    // The bf16-rounded scale is an explicit option, recorded in provenance.
    let mut opts = ConvertOptions::new(DType::F32);
    opts.embed_scale_bf16 = true;
    let out = tmp.path().join("g-bf16.cmf");
    hf::convert(tmp.path(), &out, &opts, &mut |_| {}).unwrap();
    let file = CmfFile::open(&out).unwrap();
    let h = serde_json::to_value(&file.header).unwrap();
    assert_eq!(h["arch"]["embed_multiplier"].as_f64(), Some(rounded as f64));
    assert_eq!(h["provenance"]["options"]["embed_scale_bf16"], true);
}

/// Tensor `name` of `file` (which must have `shape`) decoded, and its per-element bound.
fn decoded(file: &CmfFile, name: &str, shape: &[u64]) -> (Vec<f32>, Vec<f32>) {
    let (e, bytes) = file
        .tensor(name)
        .unwrap_or_else(|| panic!("{name} missing"));
    assert_eq!(e.shape, shape, "{name}");
    (
        quant::decode(e.dtype, &e.shape, bytes).unwrap(),
        quant::error_bounds(e.dtype, &e.shape, bytes).unwrap(),
    )
}

/// The qwen3_moe fixture's tensors and a directory holding its config and tokenizer, for
/// a test to write its own rearranged weights into.
fn moe_fixture_copy() -> (Tensors, tempfile::TempDir) {
    let src_dir = shared("hf/qwen3_moe");
    let tmp = tempfile::tempdir().unwrap();
    for f in ["config.json", "tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(src_dir.join(f), tmp.path().join(f)).unwrap();
    }
    (source_tensors(&src_dir), tmp)
}

/// §3.2: a vbit budget is shared by the routed experts of a layer and projection. With
/// expert 0 of every layer 16× louder than the others, joint water-filling gives it about
/// log2(16) = 4 bits more per row than its quiet siblings, while each family's mean width
/// stays within the budget; per-tensor allocation would give every expert the same mean.
#[test]
fn moe_experts_share_a_vbit_budget_per_family() {
    let (src, tmp) = moe_fixture_copy();
    let out: Vec<(String, Vec<u64>, Vec<u8>)> = src
        .iter()
        .map(|(name, (shape, v))| {
            let k = if name.contains(".mlp.experts.0.") {
                16.0
            } else {
                1.0
            };
            let bytes = v.iter().flat_map(|x| (x * k).to_le_bytes()).collect();
            (name.clone(), shape.clone(), bytes)
        })
        .collect();
    write_safetensors(
        &tmp.path().join("model.safetensors"),
        safetensors::Dtype::F32,
        &out,
    );
    for dtype in [DType::Vbit, DType::VbitRo] {
        let cmf = tmp.path().join(format!("{dtype}.cmf"));
        let mut opts = ConvertOptions::new(dtype);
        opts.encode.mean_bits = Some(4.5);
        hf::convert(tmp.path(), &cmf, &opts, &mut |_| {}).unwrap();
        let file = assert_verifies(&cmf);
        let mean_bits = |name: &str| {
            let (e, bytes) = file.tensor(name).unwrap();
            assert_eq!(e.dtype, dtype, "{name}");
            let rows = e.shape[0] as usize;
            bytes[..rows].iter().map(|&b| b as f64).sum::<f64>() / rows as f64
        };
        for layer in 0..4 {
            for role in ["gate_proj", "up_proj", "down_proj"] {
                let name = |e: usize| format!("model.layers.{layer}.mlp.experts.{e}.{role}.weight");
                let means: Vec<f64> = (0..8).map(|e| mean_bits(&name(e))).collect();
                let family = means.iter().sum::<f64>() / 8.0;
                assert!(
                    family <= 4.5 + 1e-9,
                    "{dtype} {layer} {role}: mean {family}"
                );
                for (e, m) in means.iter().enumerate().skip(1) {
                    assert!(
                        means[0] >= m + 3.0,
                        "{dtype} {layer} {role}: loud expert {:.2} bits, expert {e} {m:.2}",
                        means[0]
                    );
                }
            }
        }
        // Dense matrices keep their own budget.
        let q = mean_bits("model.layers.0.self_attn.q_proj.weight");
        assert!(q <= 4.5 && q > 3.5, "{dtype}: q_proj mean {q}");
        let prov = file.header.provenance.as_ref().unwrap();
        assert!(prov["options"]["vbit_budget"].is_string(), "{prov}");
        // Each expert decodes within its codec bound of the source.
        for (name, (shape, _)) in &src {
            let (got, bound) = decoded(&file, name, shape);
            let (_, _, want) = out.iter().find(|(n, _, _)| n == name).unwrap();
            for (i, (a, m)) in got.iter().zip(&bound).enumerate() {
                let w = f32::from_le_bytes(want[4 * i..4 * i + 4].try_into().unwrap());
                assert!((a - w).abs() <= *m, "{dtype} {name} [{i}]");
            }
        }
    }
}

/// Experts fused the other way round, `[E, in, out]` per role (as some checkpoints store
/// them): each expert comes out as its `[out, in]` matrix, exactly at f32 and within the
/// bound at q8; any block of rows reads as the same rows of the whole.
#[test]
fn transposed_fused_experts_are_split() {
    let (src, tmp) = moe_fixture_copy();
    let le = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let mut out: Vec<(String, Vec<u64>, Vec<u8>)> = Vec::new();
    for layer in 0..4 {
        let p = format!("model.layers.{layer}.mlp.experts.");
        for role in ["gate_proj", "up_proj", "down_proj"] {
            let mut fused = Vec::new();
            let mut dims = (0, 0);
            for e in 0..8 {
                let (shape, v) = &src[&format!("{p}{e}.{role}.weight")];
                let (o, i) = (shape[0] as usize, shape[1] as usize);
                dims = (i, o);
                // [out, in] -> [in, out]
                fused.extend((0..i * o).map(|k| v[(k % o) * i + k / o]));
            }
            out.push((
                format!("{p}{role}"),
                vec![8, dims.0 as u64, dims.1 as u64],
                le(&fused),
            ));
        }
    }
    for (name, (shape, v)) in &src {
        if !name.contains(".mlp.experts.") {
            out.push((name.clone(), shape.clone(), le(v)));
        }
    }
    write_safetensors(
        &tmp.path().join("model.safetensors"),
        safetensors::Dtype::F32,
        &out,
    );

    let ck = hf::Checkpoint::open(tmp.path()).unwrap();
    for name in [
        "model.layers.2.mlp.experts.5.down_proj.weight",
        "model.layers.0.mlp.experts.7.gate_proj.weight",
    ] {
        let t = ck.tensor(name).unwrap();
        let (shape, want) = &src[name];
        assert_eq!(&t.shape, shape);
        let all = ck.values(t).unwrap();
        assert_eq!(&all, want, "{name}");
        let cols = shape[1] as usize;
        let mut part = vec![0f32; 5 * cols];
        ck.read_rows(t, 3..8, cols, &mut part).unwrap();
        assert_eq!(&part[..], &want[3 * cols..8 * cols], "{name} rows 3..8");
    }
    for q in [DType::F32, DType::Q8Row] {
        let cmf = tmp.path().join(format!("{q}.cmf"));
        hf::convert(tmp.path(), &cmf, &ConvertOptions::new(q), &mut |_| {}).unwrap();
        let file = assert_verifies(&cmf);
        for (name, (shape, values)) in &src {
            let (got, bound) = decoded(&file, name, shape);
            for (i, ((a, b), m)) in got.iter().zip(values).zip(&bound).enumerate() {
                assert!((a - b).abs() <= *m, "{q} {name} [{i}]: {a} vs {b}");
            }
        }
    }
}
