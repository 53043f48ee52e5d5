//! The rewriting subcommands end to end through the binary: `defrag`, `moe-defrag`,
//! `moe-mask`, `requant` and `convert --route-stats` — exit codes (an unknown task is a
//! usage error naming the file's tasks; the input is never the output), JSON shapes, and
//! outputs that verify. The numerics are tested in `engine/tests/rewrite.rs`.

#[macro_use]
mod common;
use common::{code, json};

use std::path::{Path, PathBuf};

use cortiq_engine::format::masks::{build_section, MaskRecord};
use cortiq_engine::format::writer::{spec_of, write_file};
use cortiq_engine::format::CmfFile;
use cortiq_engine::tinymodel::{write_tiny, TinyFf, TinyLayer, TinyMixer, TinySpec};

fn fixture(name: &str) -> PathBuf {
    common::shared(&format!("fixtures/cmf/{name}"))
}

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A dense model (FFN 96 and 100 wide) with task `lean`: neurons ≡ 1 (mod 3) dead.
fn masked_dense(dir: &Path) -> PathBuf {
    let plain = dir.join("plain.cmf");
    let layer = |w| TinyLayer {
        mixer: TinyMixer::Attention { gated: false },
        ff: TinyFf::Dense { intermediate: w },
    };
    write_tiny(&plain, &TinySpec::awkward(vec![layer(96), layer(100)])).unwrap();
    let f = CmfFile::open(&plain).unwrap();
    let mut spec = spec_of(&f);
    spec.header.arch.as_mut().unwrap().intermediate_size = Some(100);
    // FFN rows (13 bytes each), head rows (1 byte), gates (1 byte).
    let mut blob = Vec::new();
    for _ in 0..2 {
        let mut row = vec![0u8; 13];
        for i in (0..100).filter(|i| i % 3 != 1) {
            row[i / 8] |= 1 << (i % 8);
        }
        blob.extend(row);
    }
    blob.extend([0b111, 0b111, 0b11]);
    let record = MaskRecord {
        task_id: 1,
        name: "lean".into(),
        ..Default::default()
    };
    spec.masks = Some(build_section(None, vec![record], &[blob]));
    let out = dir.join("masked.cmf");
    write_file(&out, spec, f.directory.iter().map(|e| f.tensor_bytes(e))).unwrap();
    out
}

fn route_stats(dir: &Path) -> PathBuf {
    let layer = |l: usize| {
        serde_json::json!({"layer": l, "experts": 8, "top_k": 2,
            "counts": [6, 1, 2, 0, 5, 2, 1, 3], "mass": [4.0, 0.5, 1.0, 0.0, 3.0, 1.0, 0.5, 2.0]})
    };
    let doc = serde_json::json!({"format": "cortiq-route-stats", "version": 1, "tokens": 10,
        "layers": (0..4).map(layer).collect::<Vec<_>>()});
    let p = dir.join("stats.json");
    std::fs::write(&p, doc.to_string()).unwrap();
    p
}

#[test]
fn defrag_json_and_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let masked = masked_dense(tmp.path());
    let out = tmp.path().join("lean.cmf");
    let o = run!("defrag", masked, "--task", "lean", "-o", out, "--json");
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let doc = json(&o);
    assert_eq!(doc["ok"], true);
    assert_eq!(doc["task"], "lean");
    // 96 → 64 kept, 100 → 67 kept (not a multiple of 32).
    assert_eq!(doc["layers"][0]["width_after"], 64);
    assert_eq!(doc["layers"][1]["width_after"], 67);
    assert_eq!(doc["layers"][1]["kind"], "dense");
    assert_eq!(doc["intermediate_size"], 67);
    assert!(doc["bytes_after"].as_u64() < doc["bytes_before"].as_u64());
    assert_eq!(code(&run!("verify", out)), 0);
    let o = run!("masks", out, "--json");
    assert_eq!(code(&o), 0);

    // An unknown task: exit 2, naming the tasks there are.
    let o = run!(
        "defrag",
        masked,
        "--task",
        "prose",
        "-o",
        tmp.path().join("x.cmf")
    );
    assert_eq!(code(&o), 2);
    assert!(
        stderr(&o).contains("available tasks: lean"),
        "{}",
        stderr(&o)
    );
    let o = run!(
        "defrag",
        masked,
        "--task",
        "prose",
        "-o",
        tmp.path().join("x.cmf"),
        "--json"
    );
    assert_eq!(code(&o), 2);
    let doc = json(&o);
    assert_eq!(
        (doc["ok"].clone(), doc["error"]["kind"].clone()),
        (false.into(), "Usage".into())
    );
    assert!(!tmp.path().join("x.cmf").exists());
    // A file without masks.
    let o = run!(
        "defrag",
        fixture("qwen3-q8.cmf"),
        "--task",
        "code",
        "-o",
        tmp.path().join("x.cmf")
    );
    assert_eq!(code(&o), 2);
    assert!(stderr(&o).contains("no masks"), "{}", stderr(&o));
}

#[test]
fn the_input_is_never_the_output() {
    let tmp = tempfile::tempdir().unwrap();
    let copy = tmp.path().join("m.cmf");
    std::fs::copy(fixture("qwen3_moe-masked.cmf"), &copy).unwrap();
    let before = std::fs::read(&copy).unwrap();
    let stats = route_stats(tmp.path());
    // The same file by another spelling of its path.
    let alias = tmp.path().join(".").join("m.cmf");
    let s = stats.to_str().unwrap().to_string();
    let runs: Vec<Vec<String>> = vec![
        vec!["defrag".into(), "--task".into(), "code".into()],
        vec!["moe-defrag".into(), "--task".into(), "code".into()],
        vec![
            "moe-mask".into(),
            "--stats".into(),
            s.clone(),
            "--cover".into(),
            "0.5".into(),
            "--name".into(),
            "x".into(),
        ],
        vec!["requant".into(), "--quant".into(), "q4".into()],
    ];
    for args in runs {
        let o = assert_cmd::cargo::cargo_bin_cmd!("cortiq")
            .args(&args[..1])
            .arg(&copy)
            .args(&args[1..])
            .arg("-o")
            .arg(&alias)
            .output()
            .unwrap();
        assert_eq!(code(&o), 2, "{args:?}: {}", stderr(&o));
        assert!(
            stderr(&o).contains("is the input file"),
            "{args:?}: {}",
            stderr(&o)
        );
    }
    assert_eq!(std::fs::read(&copy).unwrap(), before);
}

#[test]
fn moe_defrag_and_moe_mask_json() {
    let tmp = tempfile::tempdir().unwrap();
    let src = fixture("qwen3_moe-masked.cmf");
    let stats = route_stats(tmp.path());

    let out = tmp.path().join("code.cmf");
    let o = run!("moe-defrag", src, "--task", "code", "-o", out, "--json");
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let doc = json(&o);
    assert_eq!(doc["layers"][0]["kept"], serde_json::json!([0, 1, 4]));
    assert_eq!(doc["dropped_masks"], serde_json::json!(["code"]));
    assert_eq!(doc["experts_copied"], 33);
    assert_eq!(code(&run!("verify", out)), 0);

    let out = tmp.path().join("cover.cmf");
    let o = run!(
        "moe-defrag",
        src,
        "--stats",
        stats,
        "--cover",
        "0.7",
        "-o",
        out,
        "--json"
    );
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(json(&o)["layers"][2]["kept"], serde_json::json!([0, 4, 7]));
    // --stats needs --cover; --task excludes --stats.
    assert_eq!(
        code(&run!("moe-defrag", src, "--stats", stats, "-o", out)),
        2
    );
    assert_eq!(
        code(&run!(
            "moe-defrag",
            src,
            "--task",
            "code",
            "--stats",
            stats,
            "--cover",
            "1",
            "-o",
            out
        )),
        2
    );
    // A dense model has no experts to drop.
    let o = run!(
        "moe-defrag",
        fixture("qwen3-q8.cmf"),
        "--stats",
        stats,
        "--cover",
        "0.7",
        "-o",
        out
    );
    assert_eq!(code(&o), 2, "{}", stderr(&o));

    let out = tmp.path().join("hot.cmf");
    let o = run!(
        "moe-mask", src, "--stats", stats, "--cover", "0.7", "--name", "hot", "-o", out, "--json"
    );
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let doc = json(&o);
    assert_eq!(
        (doc["name"].clone(), doc["task_id"].clone()),
        ("hot".into(), 2.into())
    );
    assert!(doc["quality"].is_null());
    assert_eq!(doc["layers"][1]["kept"], serde_json::json!([0, 4, 7]));
    assert_eq!(code(&run!("verify", out)), 0);
    let o = run!("masks", out, "--task", "hot", "--json");
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    // The name is taken now: exit 2 unless --replace.
    let again = tmp.path().join("again.cmf");
    let o = run!("moe-mask", out, "--stats", stats, "--cover", "0.5", "--name", "hot", "-o", again);
    assert_eq!(code(&o), 2);
    assert!(stderr(&o).contains("--replace"), "{}", stderr(&o));
    let o = run!(
        "moe-mask",
        out,
        "--stats",
        stats,
        "--cover",
        "0.5",
        "--name",
        "hot",
        "--replace",
        "-o",
        again,
        "--json"
    );
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(json(&o)["replaced"], true);
    // Malformed stats: a usage error.
    let bad = tmp.path().join("bad.json");
    std::fs::write(
        &bad,
        r#"{"format": "other", "version": 1, "tokens": 0, "layers": []}"#,
    )
    .unwrap();
    assert_eq!(
        code(&run!(
            "moe-mask", src, "--stats", bad, "--cover", "0.5", "--name", "y", "-o", again
        )),
        2
    );
}

#[test]
fn requant_and_convert_route_stats() {
    let tmp = tempfile::tempdir().unwrap();
    let src = fixture("qwen3_moe-q8.cmf");
    let stats = route_stats(tmp.path());
    let out = tmp.path().join("q4.cmf");
    let o = run!(
        "requant",
        src,
        "--quant",
        "q4t",
        "--only",
        "*self_attn*",
        "--layers",
        "1-2",
        "-o",
        out,
        "--json"
    );
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let doc = json(&o);
    let changed = doc["changed"].as_array().unwrap();
    assert_eq!(changed.len(), 8, "q/k/v/o of layers 1 and 2");
    for c in changed {
        let name = c["name"].as_str().unwrap();
        assert!(
            name.contains("self_attn")
                && (name.contains("layers.1.") || name.contains("layers.2.")),
            "{name}"
        );
        assert_eq!(
            (c["from"].as_str(), c["to"].as_str()),
            (Some("q8_row"), Some("q4_tiled"))
        );
    }
    assert_eq!(code(&run!("verify", out)), 0);

    let out = tmp.path().join("vbit.cmf");
    let o = run!(
        "requant",
        src,
        "--quant",
        "vbit",
        "--route-stats",
        stats,
        "-o",
        out,
        "--json"
    );
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(json(&o)["vbit_families"], 12);
    assert_eq!(code(&run!("verify", out)), 0);
    // Usage errors: a B-field for another dtype, an unknown dtype, a bad layer list.
    assert_eq!(
        code(&run!(
            "requant",
            src,
            "--quant",
            "q8",
            "--route-stats",
            stats,
            "-o",
            out
        )),
        2
    );
    assert_eq!(code(&run!("requant", src, "--quant", "q3", "-o", out)), 2);
    assert_eq!(
        code(&run!(
            "requant", src, "--quant", "q8", "--layers", "5-2", "-o", out
        )),
        2
    );

    let hf = common::shared("fixtures/hf/qwen3_moe/config.json");
    let out = tmp.path().join("conv.cmf");
    let o = run!(
        "convert",
        "--model",
        hf.parent().unwrap(),
        "--quant",
        "vbit",
        "--route-stats",
        stats,
        "-o",
        out,
        "--json"
    );
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let o = run!("info", out, "--json");
    let prov = &json(&o)["header"]["provenance"];
    assert_eq!(prov["options"]["vbit_b_field"]["tokens"], 10, "{prov}");
    assert_eq!(
        code(&run!(
            "convert",
            "--model",
            hf.parent().unwrap(),
            "--quant",
            "q8",
            "--route-stats",
            stats,
            "-o",
            out
        )),
        2
    );
}
