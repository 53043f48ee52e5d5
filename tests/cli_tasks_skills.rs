//! Masks and skills on the command line: `run --task/--skill`, `route`, `ppl --task`,
//! `mask calibrate` (quality measured, or null without a held-out text) — exit codes,
//! JSON shapes, and that the calibrated task runs.

#[macro_use]
mod common;
use common::{code, json};

use std::path::{Path, PathBuf};

use cortiq_engine::format::CmfFile;
use cortiq_engine::tinymodel::{write_tiny, TinyFf, TinyLayer, TinyMixer, TinySpec};

fn fixture(name: &str) -> PathBuf {
    common::shared(&format!("fixtures/cmf/{name}"))
}

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn run_with_a_task_or_skill_and_unknown_names() {
    let moe = fixture("qwen3_moe-masked.cmf");
    let o = run!(
        "run",
        moe,
        "--ids",
        "1,2,3",
        "--task",
        "code",
        "--greedy",
        "--max-tokens",
        "3",
        "--json"
    );
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(json(&o)["ids"].as_array().unwrap().len(), 3);
    assert_eq!(
        stderr(&o).matches("not measured").count(),
        1,
        "one warning for an unmeasured task: {}",
        stderr(&o)
    );
    let o = run!(
        "run",
        moe,
        "--ids",
        "1,2",
        "--task",
        "prose",
        "--max-tokens",
        "2"
    );
    assert_eq!(code(&o), 2);
    assert!(
        stderr(&o).contains("the file's tasks: code"),
        "{}",
        stderr(&o)
    );

    let skills = fixture("qwen3-skills.cmf");
    let plain = run!(
        "run",
        skills,
        "--ids",
        "5,6,7,8",
        "--greedy",
        "--max-tokens",
        "6",
        "--json"
    );
    let sql = run!(
        "run",
        skills,
        "--ids",
        "5,6,7,8",
        "--greedy",
        "--max-tokens",
        "6",
        "--skill",
        "sql",
        "--json"
    );
    assert_eq!(code(&sql), 0, "{}", stderr(&sql));
    assert_ne!(
        json(&plain)["ids"],
        json(&sql)["ids"],
        "the skill changes the answer"
    );
    let o = run!(
        "run",
        skills,
        "--ids",
        "5",
        "--skill",
        "nosql",
        "--max-tokens",
        "1"
    );
    assert_eq!(code(&o), 2);
    assert!(stderr(&o).contains("skills: sql"), "{}", stderr(&o));
    let o = run!(
        "run",
        skills,
        "--ids",
        "5",
        "--skill",
        "blend:zero",
        "--max-tokens",
        "1"
    );
    assert_eq!(code(&o), 2);
    let o = run!(
        "run",
        fixture("qwen3-skillfile.cmf"),
        "--ids",
        "5",
        "--max-tokens",
        "1"
    );
    assert_eq!(code(&o), 1);
    assert!(stderr(&o).contains("cortiq skill apply"), "{}", stderr(&o));
}

#[test]
fn route_prints_e_per_skill_and_the_choice() {
    let skills = fixture("qwen3-skills.cmf");
    let o = run!(
        "route",
        skills,
        "--prompt",
        "INSERT INTO t VALUES (1, 2);",
        "--json"
    );
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let v = json(&o);
    assert_eq!(v["choice"], "sql");
    let e = v["skills"][0]["error"].as_f64().unwrap();
    assert!(e < 0.01, "E = {e} (the reference reports 0.0006)");
    assert_eq!(v["skills"][0]["phi_layer"], 2);
    let o = run!("route", skills, "--prompt", "INSERT INTO t VALUES (1, 2);");
    assert!(String::from_utf8_lossy(&o.stdout).contains("choice: sql"));
    let o = run!("route", fixture("qwen3-q8.cmf"), "--prompt", "x");
    assert_eq!(code(&o), 2, "a file without skills");
}

#[test]
fn mask_calibrate_measures_quality_and_the_task_runs() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("base.cmf");
    let layer = |w| TinyLayer {
        mixer: TinyMixer::Attention { gated: false },
        ff: TinyFf::Dense { intermediate: w },
    };
    write_tiny(&base, &TinySpec::awkward(vec![layer(90), layer(100)])).unwrap();
    let prompts = dir.path().join("p.txt");
    std::fs::write(
        &prompts,
        "def f(x): return x\nfor i in range(3): print(i)\n\nimport os\n",
    )
    .unwrap();
    let heldout = dir.path().join("h.txt");
    std::fs::write(&heldout, "while True: break\nclass A: pass\n").unwrap();
    let out = dir.path().join("code.cmf");
    // `mask calibrate SRC --task NAME --prompts P --keep K -o OUT` and more arguments.
    let calibrate = |src: &Path, name: &str, keep: &str, out: &Path, more: &[&std::ffi::OsStr]| {
        assert_cmd::cargo::cargo_bin_cmd!("cortiq")
            .args(["mask".as_ref(), "calibrate".as_ref(), src.as_os_str()])
            .args(["--task", name, "--keep", keep])
            .arg("--prompts")
            .arg(&prompts)
            .arg("-o")
            .arg(out)
            .args(more)
            .output()
            .expect("cortiq runs")
    };
    let o = calibrate(
        &base,
        "code",
        "0.5",
        &out,
        &[
            std::ffi::OsStr::new("--heads"),
            std::ffi::OsStr::new("0.67"),
            std::ffi::OsStr::new("--heldout"),
            std::ffi::OsStr::new(&heldout),
            std::ffi::OsStr::new("--json"),
        ],
    );
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let v = json(&o);
    assert_eq!(v["prompts"], 3);
    let q = &v["quality"];
    assert_eq!(q["metric"], "heldout_ppl_ratio");
    let ratio = q["value"].as_f64().unwrap();
    let (masked, dense) = (
        q["masked"].as_f64().unwrap(),
        q["baseline_dense"].as_f64().unwrap(),
    );
    assert!((ratio - masked / dense).abs() < 1e-9 && ratio.is_finite() && ratio > 0.0);
    assert_eq!(q["dataset_sha256"].as_str().unwrap().len(), 64);
    assert!(q["n_samples"].as_u64().unwrap() > 10);
    // Half of 90 and of 100 neurons masked out.
    let sparsity = v["sparsity"].as_f64().unwrap();
    assert!((sparsity - 95.0 / 190.0).abs() < 1e-9, "{sparsity}");

    // The file carries it, and ppl under it is the measured one.
    let f = CmfFile::open(&out).unwrap();
    let rec = &f.masks.as_ref().unwrap().meta.masks[0];
    assert_eq!(rec.name, "code");
    assert_eq!(rec.quality.as_ref().unwrap()["value"], q["value"]);
    let p = run!(
        "ppl",
        out,
        "--text-file",
        heldout,
        "--task",
        "code",
        "--json"
    );
    assert_eq!(code(&p), 0, "{}", stderr(&p));
    let ppl = json(&p)["ppl"].as_f64().unwrap();
    assert!((ppl - masked).abs() < 1e-6 * masked, "{ppl} vs {masked}");
    assert!(!stderr(&p).contains("not measured"));
    let r = run!(
        "run",
        out,
        "--prompt",
        "def g():",
        "--task",
        "code",
        "--max-tokens",
        "4",
        "--greedy",
        "--json"
    );
    assert_eq!(code(&r), 0, "{}", stderr(&r));

    // Without --heldout the quality is null; the same name again is refused.
    let out2 = dir.path().join("code2.cmf");
    let o = calibrate(&out, "code", "0.3", &out2, &[]);
    assert_eq!(code(&o), 2, "the name exists: {}", stderr(&o));
    let o = calibrate(
        &out,
        "lean",
        "0.3",
        &out2,
        &[std::ffi::OsStr::new("--json")],
    );
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(json(&o)["quality"].is_null());
    let f = CmfFile::open(&out2).unwrap();
    assert_eq!(f.masks.as_ref().unwrap().len(), 2);
    let o = run!(
        "run",
        out2,
        "--ids",
        "1,2",
        "--task",
        "lean",
        "--max-tokens",
        "1"
    );
    assert!(stderr(&o).contains("not measured"), "{}", stderr(&o));
    // Bad fractions, and the input as the output.
    let o = calibrate(&out, "x", "1.5", &out2, &[]);
    assert_eq!(code(&o), 2);
    let o = calibrate(&out, "x", "0.5", &out, &[]);
    assert_eq!(code(&o), 2);
}
