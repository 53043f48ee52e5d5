//! End-to-end tests of the inference commands (`logits`, `run`, `ppl`, `bench`) on the
//! reference-written fixtures: results agree with the fixtures' references and with each
//! other, and bad input gets a clear error and the documented exit code.

#[macro_use]
mod common;
use common::{code, json};

use std::path::PathBuf;

use safetensors::SafeTensors;
use serde_json::Value;

fn model() -> PathBuf {
    common::shared("fixtures/cmf/qwen3-q8.cmf")
}

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn f32s(st: &SafeTensors, name: &str) -> Vec<f32> {
    st.tensor(name)
        .unwrap_or_else(|e| panic!("{name}: {e}"))
        .data()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn reference_ids() -> (Vec<u32>, Vec<f32>) {
    let bytes = std::fs::read(common::shared(
        "fixtures/cmf/qwen3-q8.reference.safetensors",
    ))
    .unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let t = st.tensor("input_ids").unwrap();
    let ids = match t.dtype() {
        safetensors::Dtype::I64 => t
            .data()
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()) as u32)
            .collect(),
        _ => t
            .data()
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes(c.try_into().unwrap()) as u32)
            .collect(),
    };
    (ids, f32s(&st, "logits"))
}

fn csv(ids: &[u32]) -> String {
    ids.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
}

fn ids_of(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("an id array")
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

#[test]
fn logits_match_the_reference_and_hidden_states_have_their_shape() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("l.safetensors");
    let (ids, want) = reference_ids();
    let o = run!(
        "logits",
        model(),
        "--ids",
        csv(&ids),
        "--out",
        out,
        "--hidden",
        "--json"
    );
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(json(&o)["tokens"], ids.len());
    let bytes = std::fs::read(&out).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let got = f32s(&st, "logits");
    assert_eq!(st.tensor("logits").unwrap().shape(), [ids.len(), 512]);
    let max_ref = want.iter().fold(0f32, |m, v| m.max(v.abs()));
    let worst = got
        .iter()
        .zip(&want)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(worst <= 1e-3 * (1.0 + max_ref), "max |Δ| {worst}");
    // [L+1, T, H] for 4 layers of 64.
    assert_eq!(
        st.tensor("hidden_states").unwrap().shape(),
        [5, ids.len(), 64]
    );
    // The output is never the input.
    let o = run!("logits", model(), "--ids", "1,2", "--out", model());
    assert_eq!(code(&o), 2, "{}", stderr(&o));
}

#[test]
fn ppl_is_the_mean_nll_of_the_logits() {
    let dir = tempfile::tempdir().unwrap();
    let (ids, _) = reference_ids();
    let o = run!("ppl", model(), "--ids", csv(&ids), "--json");
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let j = json(&o);
    let nll: Vec<f64> = j["nll"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    assert_eq!(nll.len(), ids.len() - 1);
    let mean = nll.iter().sum::<f64>() / nll.len() as f64;
    assert!((j["ppl"].as_f64().unwrap() - mean.exp()).abs() < 1e-9);
    // nll[i] = -log softmax(logits[i])[ids[i+1]], from the logits command's output.
    let out = dir.path().join("l.safetensors");
    let o = run!("logits", model(), "--ids", csv(&ids), "--out", out);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let bytes = std::fs::read(&out).unwrap();
    let logits = f32s(&SafeTensors::deserialize(&bytes).unwrap(), "logits");
    for i in [0, 7, ids.len() - 2] {
        let row = &logits[i * 512..(i + 1) * 512];
        let max = row.iter().fold(f32::MIN, |m, &v| m.max(v)) as f64;
        let lse = max
            + row
                .iter()
                .map(|&v| (v as f64 - max).exp())
                .sum::<f64>()
                .ln();
        let want = lse - row[ids[i + 1] as usize] as f64;
        assert!(
            (nll[i] - want).abs() < 1e-4,
            "position {i}: {} vs {want}",
            nll[i]
        );
    }
    // Windows: a context of 8 scores 32 tokens in 4 windows, each first token unscored.
    let o = run!("ppl", model(), "--ids", csv(&ids), "--ctx", "8", "--json");
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let j = json(&o);
    assert_eq!(j["windows"], 4);
    assert_eq!(j["nll"].as_array().unwrap().len(), ids.len() - 4);
    // A text file goes through the file's tokenizer.
    let text = dir.path().join("t.txt");
    std::fs::write(&text, "The quick brown fox jumps over the lazy dog.").unwrap();
    let o = run!("ppl", model(), "--text-file", text, "--json");
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(json(&o)["ppl"].as_f64().unwrap() > 1.0);
}

#[test]
fn run_generates_deterministically_and_reports_stats() {
    let (ids, _) = reference_ids();
    let greedy = |extra: &[&str]| {
        let mut args = vec!["run".to_string(), model().display().to_string()];
        args.extend(["--ids", &csv(&ids[..8]), "--max-tokens", "6", "--json"].map(String::from));
        args.extend(extra.iter().map(|s| s.to_string()));
        let o = assert_cmd::cargo::cargo_bin_cmd!("cortiq")
            .args(&args)
            .output()
            .unwrap();
        assert_eq!(code(&o), 0, "{}", stderr(&o));
        json(&o)
    };
    let a = greedy(&["--greedy"]);
    let b = greedy(&["--greedy", "--seed", "9"]);
    assert_eq!(a["ids"], b["ids"], "greedy does not depend on the seed");
    let n = ids_of(&a["ids"]).len();
    assert!((1..=6).contains(&n));
    let stats = &a["stats"];
    assert_eq!(stats["prompt_tokens"], 8);
    assert_eq!(stats["generated_tokens"], n);
    assert!(stats["decode_tok_s"].as_f64().is_some());
    // Sampling: the same seed repeats itself.
    let sampled = [
        "--seed",
        "1",
        "--temperature",
        "1.5",
        "--top-k",
        "0",
        "--top-p",
        "1",
        "--min-p",
        "0",
        "--ignore-eos",
    ];
    let s1 = greedy(&sampled);
    let s2 = greedy(&sampled);
    assert_eq!(s1["ids"], s2["ids"]);
    assert_eq!(ids_of(&s1["ids"]).len(), 6);
    assert_eq!(s1["stats"]["stop"], "max_tokens");
    // A prompt through the template and tokenizer: text is the decoded answer.
    let o = run!(
        "run",
        model(),
        "--prompt",
        "Hello",
        "--greedy",
        "--max-tokens",
        "5",
        "--json"
    );
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let j = json(&o);
    assert!(j["text"].is_string());
    assert!(
        j["stats"]["prompt_tokens"].as_u64().unwrap() > 5,
        "the template adds the system turn"
    );
}

#[test]
fn chat_reads_turns_from_stdin_and_keeps_history() {
    let o = assert_cmd::cargo::cargo_bin_cmd!("cortiq")
        .args(["run"])
        .arg(model())
        .args(["--greedy", "--max-tokens", "3", "--stats"])
        .write_stdin("Hello\nAnd again\n/exit\n")
        .output()
        .unwrap();
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let err = stderr(&o);
    let turns: Vec<&str> = err.lines().filter(|l| l.starts_with('[')).collect();
    assert_eq!(turns.len(), 2, "{err}");
    // The second turn reuses the first turn's cache.
    assert!(turns[0].contains("(0 reused)"), "{err}");
    assert!(!turns[1].contains("(0 reused)"), "{err}");
}

#[test]
fn bench_reports_the_design_keys() {
    let o = run!(
        "bench",
        model(),
        "--prompt-tokens",
        "16",
        "--tokens",
        "4",
        "--repeat",
        "1",
        "--threads",
        "1",
        "--json"
    );
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let j = json(&o);
    for k in [
        "prefill_tok_s",
        "decode_tok_s",
        "ttft_s",
        "peak_rss_bytes",
        "baseline_rss_bytes",
    ] {
        assert!(j[k].as_f64().is_some_and(|v| v > 0.0), "{k}: {j}");
    }
    // The process before the model is part of the peak, never more.
    assert!(j["baseline_rss_bytes"].as_f64() <= j["peak_rss_bytes"].as_f64());
    // The file mapped in 2 MiB pages is resident, so part of the peak (Linux reports it).
    let huge = &j["file_huge_page_bytes"];
    if cfg!(target_os = "linux") {
        assert!(huge.as_u64() <= j["peak_rss_bytes"].as_u64(), "{j}");
        assert!(huge.is_u64(), "{j}");
        // The peak's parts: the weights the run touched (some, never more than the file)
        // and the heap (KV and buffers at least), each within the peak.
        let w = j["weights_resident_bytes"]
            .as_u64()
            .expect("weights resident");
        assert!(w > 0 && w <= j["model_bytes"].as_u64().unwrap(), "{j}");
        let anon = j["rss_anon_bytes"].as_u64().expect("anonymous RSS");
        assert!(anon >= j["kv_bytes"].as_u64().unwrap(), "{j}");
        assert!(w + anon <= j["peak_rss_bytes"].as_u64().unwrap(), "{j}");
    }
}

/// `bench --json` on `file` (16-token prompt, 8 tokens, 2 repetitions, 1 thread) with
/// `extra` flags and `env` set.
fn bench_json(file: &std::path::Path, extra: &[&str], env: &[(&str, &str)]) -> Value {
    let mut cmd = assert_cmd::cargo::cargo_bin_cmd!("cortiq");
    cmd.args(["bench".as_ref(), file.as_os_str()]);
    cmd.args([
        "--prompt-tokens",
        "16",
        "--tokens",
        "8",
        "--repeat",
        "2",
        "--threads",
        "1",
        "--json",
    ]);
    cmd.args(extra);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let o = cmd.output().expect("cortiq runs");
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    json(&o)
}

/// The bytes one decoded token reads, from the tensor directory alone: every 2-D matrix
/// (MTP and skill tensors aside), a MoE layer's routed experts × top-k / experts, one row
/// of the embedding, and the embedding whole once more when it is also the LM head.
fn bytes_per_token_from_directory(file: &std::path::Path) -> u64 {
    let tensors = json(&run!("tensors", file, "--json"));
    let arch = json(&run!("info", file, "--json"))["header"]["arch"].clone();
    let top_k = arch["moe"]["top_k"].as_u64();
    let has_head = tensors
        .as_array()
        .unwrap()
        .iter()
        .any(|t| t["name"] == "lm_head.weight");
    let mut total = 0u64;
    let mut experts: std::collections::BTreeMap<String, (u64, std::collections::BTreeSet<String>)> =
        Default::default();
    for t in tensors.as_array().unwrap() {
        let name = t["name"].as_str().unwrap();
        let nbytes = t["nbytes"].as_u64().unwrap();
        let shape = t["shape"].as_array().unwrap();
        if shape.len() != 2 || name.starts_with("model.mtp") || name.starts_with("skill.") {
            continue;
        }
        if name == "model.embed_tokens.weight" {
            total += nbytes / shape[0].as_u64().unwrap();
            if !has_head {
                total += nbytes;
            }
        } else if let Some((layer, rest)) = name.split_once(".mlp.experts.") {
            let e = experts.entry(layer.to_string()).or_default();
            e.0 += nbytes;
            e.1.insert(rest.split('.').next().unwrap().to_string());
        } else {
            total += nbytes;
        }
    }
    for (bytes, ids) in experts.values() {
        total += bytes * top_k.expect("experts without arch.moe") / ids.len() as u64;
    }
    total
}

/// The fields issue 11's benchmark reads: the SIMD level and precision the run used,
/// the weight bytes per token (checked against the tensor directory: dense, MoE with
/// top-k, a tied head), and no heap allocation in the decode loop.
#[test]
fn bench_reports_kernel_precision_bytes_and_allocations() {
    for stem in ["qwen3-q8", "qwen3_moe-q8", "gemma3-q8", "qwen3_5-q8"] {
        let file = common::shared(&format!("fixtures/cmf/{stem}.cmf"));
        let j = bench_json(&file, &[], &[]);
        assert!(
            ["scalar", "avx2", "avx512"].contains(&j["kernel"].as_str().unwrap_or("?")),
            "{stem}: {j}"
        );
        let want = bytes_per_token_from_directory(&file);
        assert_eq!(j["weight_bytes_per_token"].as_u64(), Some(want), "{stem}");
        assert!(want < j["model_bytes"].as_u64().unwrap(), "{stem}");
        assert_eq!(j["allocs_per_token"].as_f64(), Some(0.0), "{stem}: {j}");
        assert_eq!(j["decode_allocs"].as_u64(), Some(0), "{stem}");
        // The default precision is one `--precision` accepts, and reports itself.
        let default = j["precision"].as_str().expect("a precision").to_string();
        let again = bench_json(&file, &["--precision", &default], &[]);
        assert_eq!(again["precision"], default.as_str(), "{stem}");
    }
    let file = model();
    for p in ["exact", "fast"] {
        let j = bench_json(&file, &["--precision", p], &[]);
        assert_eq!(j["precision"], p);
        assert_eq!(j["allocs_per_token"].as_f64(), Some(0.0), "{p}: {j}");
    }
    // The smallest run fits its warm-up in its context (1 + 1 positions).
    let o = run!(
        "bench",
        &file,
        "--prompt-tokens",
        "1",
        "--tokens",
        "1",
        "--repeat",
        "1",
        "--json"
    );
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    // A forced SIMD level is the one reported (scalar runs on every CPU).
    let j = bench_json(
        &file,
        &[],
        &[("CORTIQ_SIMD", "scalar"), ("CORTIQ_KERNEL", "scalar")],
    );
    assert_eq!(j["kernel"], "scalar", "{j}");
    assert_eq!(j["allocs_per_token"].as_f64(), Some(0.0), "{j}");
}

/// `bench --bandwidth`: no model needed, both figures positive; `bench` without a file
/// and without --bandwidth is a usage error.
#[test]
fn bench_bandwidth_measures_without_a_model() {
    let o = run!(
        "bench",
        "--bandwidth",
        "--bandwidth-mib",
        "64",
        "--threads",
        "2",
        "--json"
    );
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let j = json(&o);
    for k in ["read_bandwidth_bytes_s", "l3_bandwidth_bytes_s"] {
        assert!(j[k].as_f64().is_some_and(|v| v > 0.0), "{k}: {j}");
    }
    assert_eq!(j["threads"], 2);
    assert_eq!(j["buffer_bytes"].as_u64(), Some(64 << 20));
    // How much of the buffer is in 2 MiB pages: Linux says (0 where THP is off).
    #[cfg(target_os = "linux")]
    assert!(
        j["buffer_huge_page_bytes"].as_u64().is_some(),
        "buffer_huge_page_bytes: {j}"
    );
    let o = run!("bench", "--json");
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(stderr(&o).contains("--bandwidth"), "{}", stderr(&o));
}

fn fixture_cmf(name: &str) -> PathBuf {
    common::shared(&format!("fixtures/cmf/{name}"))
}

/// Copies `src` to `out` with one vocabulary entry of its tokenizer renumbered from 3xx
/// to 9xx, beyond the 512 embedding rows, and the vocab and header hashes recomputed, so
/// that the file verifies. Returns the renumbered token's text.
fn tokenizer_beyond_the_vocabulary(src: &std::path::Path, out: &std::path::Path) -> String {
    use cortiq_engine::format::hash64::{hash64, hex16};
    let mut b = std::fs::read(src).unwrap();
    let (voff, vlen) = common::section(&b, 0x50);
    let (hoff, hlen) = common::section(&b, 0x10);
    let old_vocab = hex16(hash64(&b[voff..voff + vlen]));
    let vocab = String::from_utf8(b[voff..voff + vlen].to_vec()).unwrap();
    // A lowercase word entry `"word": 3xx,` on a line of its own.
    let (at, word) = vocab
        .match_indices("\": 3")
        .find_map(|(i, _)| {
            let start = vocab[..i].rfind('"')? + 1;
            let word = &vocab[start..i];
            let digits = &vocab[i + 3..i + 6];
            (word.len() > 1
                && word.chars().all(|c| c.is_ascii_lowercase())
                && digits.chars().all(|c| c.is_ascii_digit())
                && vocab[i + 6..].starts_with(','))
            .then(|| (i + 3, word.to_string()))
        })
        .expect("a three-digit lowercase entry");
    b[voff + at] = b'9';
    let new_vocab = hex16(hash64(&b[voff..voff + vlen]));
    let header = String::from_utf8(b[hoff..hoff + hlen].to_vec()).unwrap();
    assert!(
        header.contains(&old_vocab),
        "the header records the vocab hash"
    );
    let header = header.replace(&old_vocab, &new_vocab);
    b[hoff..hoff + hlen].copy_from_slice(header.as_bytes());
    common::reseal(&mut b);
    std::fs::write(out, &b).unwrap();
    let o = run!("verify", out);
    assert_eq!(code(&o), 0, "{}", String::from_utf8_lossy(&o.stdout));
    word
}

#[test]
fn bad_input_gets_a_clear_error_and_exit_code() {
    // Unparseable ids, an id outside the vocabulary: usage errors.
    let o = run!("run", model(), "--ids", "1,x", "--json");
    assert_eq!(code(&o), 2);
    assert_eq!(json(&o)["error"]["kind"], "Usage");
    let o = run!(
        "logits",
        model(),
        "--ids",
        "1,99999",
        "--out",
        "/tmp/never-written.safetensors"
    );
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(
        stderr(&o).contains("outside the vocabulary"),
        "{}",
        stderr(&o)
    );
    // A MoE model runs (the reference's own file).
    let o = run!(
        "run",
        common::shared("fixtures/cmf/qwen3_moe-q8.cmf"),
        "--ids",
        "1,2,3",
        "--max-tokens",
        "4",
        "--greedy",
        "--json"
    );
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(json(&o)["ids"].as_array().unwrap().len(), 4);
    // A flipped weight byte is caught before it can change an answer.
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.cmf");
    let mut bytes = std::fs::read(model()).unwrap();
    let info = json(&run!("info", model(), "--json"));
    let data = info["sections"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "data")
        .unwrap();
    let at = (data["offset"].as_u64().unwrap() + data["length"].as_u64().unwrap() / 2) as usize;
    bytes[at] ^= 0x40;
    std::fs::write(&bad, &bytes).unwrap();
    let o = run!(
        "run",
        bad,
        "--ids",
        "1,2",
        "--greedy",
        "--max-tokens",
        "1",
        "--json"
    );
    assert_eq!(code(&o), 1, "{}", stderr(&o));
    assert_eq!(json(&o)["error"]["kind"], "Integrity");
    assert!(stderr(&o).contains("tensor model."), "{}", stderr(&o));
    let o = run!(
        "run",
        bad,
        "--ids",
        "1,2",
        "--greedy",
        "--max-tokens",
        "1",
        "--json",
        "--no-verify"
    );
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    // --verify-on-load: the same flipped byte is caught when its layer first runs, with
    // the tensor named; a clean file gives the same tokens as with the up-front check.
    let o = run!(
        "run",
        bad,
        "--ids",
        "1,2",
        "--greedy",
        "--max-tokens",
        "1",
        "--json",
        "--verify-on-load"
    );
    assert_eq!(code(&o), 1, "{}", stderr(&o));
    assert!(
        stderr(&o).contains("fails its check on first use") && stderr(&o).contains("tensor model."),
        "{}",
        stderr(&o)
    );
    let ids = |extra: &[&str]| {
        let o = assert_cmd::cargo::cargo_bin_cmd!("cortiq")
            .arg("run")
            .arg(model())
            .args(["--ids", "1,2,3", "--greedy", "--max-tokens", "6", "--json"])
            .args(extra)
            .output()
            .unwrap();
        assert_eq!(code(&o), 0, "{}", stderr(&o));
        json(&o)["ids"].clone()
    };
    assert_eq!(ids(&["--verify-on-load"]), ids(&[]));
    // A tensor whose dtype its block cannot use (the embedding as opaque reserved bytes;
    // the directory hash made to match): a load error naming the tensor.
    {
        let odd = dir.path().join("odd-dtype.cmf");
        let mut b = std::fs::read(model()).unwrap();
        let f = cortiq_engine::format::CmfFile::open(model()).unwrap();
        let k = f
            .directory
            .iter()
            .position(|e| e.name == "model.embed_tokens.weight")
            .unwrap();
        let doff = f.envelope.directory.off as usize;
        drop(f);
        let record = cortiq_engine::format::directory::RECORD_LEN as usize;
        b[doff + 16 + k * record + 6] = 6;
        common::reseal(&mut b);
        std::fs::write(&odd, &b).unwrap();
        let o = run!("run", odd, "--ids", "1,2", "--max-tokens", "1");
        assert_eq!(code(&o), 1, "{}", stderr(&o));
        assert!(
            stderr(&o).contains("tensor model.embed_tokens.weight")
                && stderr(&o).contains("reserved"),
            "{}",
            stderr(&o)
        );
    }
    // A Gemma 3 file without its sliding window is run with a warning, not silently.
    let o = run!(
        "run",
        common::shared("fixtures/cmf/gemma3-q8.cmf"),
        "--ids",
        "1,2",
        "--max-tokens",
        "1",
        "--greedy"
    );
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(stderr(&o).contains("sliding_window"), "{}", stderr(&o));
    // The file's own tokenizer gives an id beyond its embedding rows (the vocab and
    // header hashes made to match): the file's fault, exit 1.
    let oov = dir.path().join("oov.cmf");
    let word = tokenizer_beyond_the_vocabulary(&fixture_cmf("qwen3-q4.cmf"), &oov);
    let text = dir.path().join("text.txt");
    std::fs::write(&text, format!("{word} {word} {word}")).unwrap();
    let text = text.to_str().unwrap();
    for args in [
        vec!["run", "--prompt", word.as_str(), "--max-tokens", "1"],
        vec!["ppl", "--text-file", text],
    ] {
        let o = assert_cmd::cargo::cargo_bin_cmd!("cortiq")
            .args(&args[..1])
            .arg(&oov)
            .args(&args[1..])
            .output()
            .unwrap();
        assert_eq!(code(&o), 1, "{args:?}: {}", stderr(&o));
        assert!(
            stderr(&o).contains("outside the vocabulary") && stderr(&o).contains("tokenizer"),
            "{}",
            stderr(&o)
        );
    }
    // A context of 0 positions in the file: every command refuses it (exit 1).
    for args in [
        vec!["run", "--ids", "1,2", "--max-tokens", "1"],
        vec![
            "logits",
            "--ids",
            "1,2",
            "--out",
            "/tmp/never-written.safetensors",
        ],
        vec!["ppl", "--ids", "1,2,3"],
    ] {
        let o = assert_cmd::cargo::cargo_bin_cmd!("cortiq")
            .args(&args[..1])
            .arg(model())
            .args(&args[1..])
            .args(["--arch", "max_position_embeddings=0"])
            .output()
            .unwrap();
        assert_eq!(code(&o), 1, "{args:?}: {}", stderr(&o));
        assert!(
            stderr(&o).contains("max_position_embeddings"),
            "{}",
            stderr(&o)
        );
    }
    // A NaN weight, run with --no-verify (as a hostile writer's matching hashes would
    // let it run): no endless token 0 with exit 0, but an error naming the layer where
    // the values broke.
    {
        use cortiq_engine::tinymodel::{write_tiny, TinyLayer, TinySpec};
        let nan = dir.path().join("nan.cmf");
        let spec = TinySpec::awkward(vec![
            TinyLayer::attention_dense(96),
            TinyLayer::attention_dense(80),
        ]);
        write_tiny(&nan, &spec).unwrap();
        let f = cortiq_engine::format::CmfFile::open(&nan).unwrap();
        let e = f
            .directory
            .iter()
            .find(|e| e.name == "model.layers.1.mlp.up_proj.weight")
            .unwrap();
        let at = (f.envelope.data.off + e.off + 4 * 7) as usize;
        drop(f);
        let mut b = std::fs::read(&nan).unwrap();
        b[at..at + 4].copy_from_slice(&f32::NAN.to_le_bytes());
        std::fs::write(&nan, &b).unwrap();
        let out = dir.path().join("nan.safetensors");
        let out = out.to_str().unwrap();
        for args in [
            &["run", "--greedy", "--max-tokens", "3"][..],
            &["logits", "--out", out],
        ] {
            let cmd = args[0];
            let o = assert_cmd::cargo::cargo_bin_cmd!("cortiq")
                .arg(cmd)
                .arg(&nan)
                .args(["--ids", "1,2,3", "--no-verify"])
                .args(&args[1..])
                .output()
                .unwrap();
            assert_eq!(code(&o), 1, "{cmd}: {}", stderr(&o));
            assert!(
                stderr(&o).contains("layer 1 is not finite"),
                "{cmd}: {}",
                stderr(&o)
            );
        }
    }
    // Wrong flags.
    let o = run!("run", model(), "--ids", "1", "--top-p", "0");
    assert_eq!(code(&o), 2);
    let o = run!("bench", model(), "--tokens", "0");
    assert_eq!(code(&o), 2);
}

#[test]
fn chat_commands_set_save_load_and_replay() {
    let dir = tempfile::tempdir().unwrap();
    let saved = dir.path().join("s.json");
    let o = assert_cmd::cargo::cargo_bin_cmd!("cortiq")
        .args(["run"])
        .arg(model())
        .args(["--max-tokens", "4", "--ignore-eos"])
        .write_stdin(format!(
            "/set greedy on\n/set temp x\n/system Be brief.\nHello\n/save {}\n/bogus\n/exit\n",
            saved.display()
        ))
        .output()
        .unwrap();
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let err = stderr(&o);
    assert!(err.contains("[greedy"), "{err}");
    assert!(err.contains("/set: \"x\" is not a number"), "{err}");
    assert!(err.contains("[system prompt set]"), "{err}");
    assert!(err.contains("[saved 2 messages"), "{err}");
    assert!(err.contains("unknown command /bogus"), "{err}");
    let s: Value = serde_json::from_str(&std::fs::read_to_string(&saved).unwrap()).unwrap();
    assert_eq!(s["format"], "cortiq-session");
    assert_eq!(s["system"], "Be brief.");
    assert_eq!(s["sampling"]["greedy"], true);
    assert_eq!(s["precision"], "balanced", "the default precision");
    assert_eq!(s["messages"][0]["content"], "Hello");
    assert_eq!(ids_of(&s["messages"][1]["ids"]).len(), 4);
    assert_eq!(s["model"]["directory_hash"].as_str().unwrap().len(), 16);

    // Loaded again (--session and /load), the greedy answer replays identically.
    for how in ["flag", "command"] {
        let mut cmd = assert_cmd::cargo::cargo_bin_cmd!("cortiq");
        cmd.args(["run"]).arg(model()).args(["--ignore-eos"]);
        let input = if how == "flag" {
            cmd.arg("--session").arg(&saved);
            "/replay\n/show\n".to_string()
        } else {
            format!("/load {}\n/replay\n/show\n", saved.display())
        };
        let o = cmd.write_stdin(input).output().unwrap();
        assert_eq!(code(&o), 0, "{}", stderr(&o));
        let err = stderr(&o);
        assert!(
            err.contains("[replayed 1 answers: 1 identical, 0 differ]"),
            "{how}: {err}"
        );
        assert!(err.contains("[system: Be brief.]"), "{how}: {err}");
    }
    // A damaged session file is refused with a usage error.
    std::fs::write(&saved, "{\"format\": 1}").unwrap();
    let o = assert_cmd::cargo::cargo_bin_cmd!("cortiq")
        .args(["run"])
        .arg(model())
        .arg("--session")
        .arg(&saved)
        .write_stdin("")
        .output()
        .unwrap();
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(stderr(&o).contains("not a saved session"), "{}", stderr(&o));
}

/// The self-made hybrid (Gated DeltaNet, gated attention, MoE, an MTP head): `run --mtp`
/// gives the same ids as plain greedy decoding and reports its drafts; a file without a
/// head refuses `--mtp` with a usage error.
#[test]
fn run_mtp_gives_the_plain_greedy_stream() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("hybrid.cmf");
    assert_eq!(code(&run!("demo", "--hybrid", "-o", &file, "--json")), 0);
    let go = |extra: &[&str]| {
        let mut args = vec!["run", file.to_str().unwrap(), "--ids", "4,8,15,16,23,42"];
        args.extend_from_slice(&["--greedy", "--max-tokens", "24", "--ignore-eos", "--json"]);
        args.extend_from_slice(extra);
        let o = assert_cmd::cargo::cargo_bin_cmd!("cortiq")
            .args(&args)
            .output()
            .expect("cortiq runs");
        assert_eq!(code(&o), 0, "{}", stderr(&o));
        json(&o)
    };
    let (plain, spec) = (go(&[]), go(&["--mtp"]));
    assert_eq!(ids_of(&plain["ids"]), ids_of(&spec["ids"]));
    assert_eq!(ids_of(&plain["ids"]).len(), 24);
    assert_eq!(plain["stats"]["drafted"], 0);
    let drafted = spec["stats"]["drafted"].as_u64().unwrap();
    assert!(drafted >= 12, "{drafted} drafts");
    assert!(spec["stats"]["accepted"].as_u64().unwrap() <= drafted);
    let o = run!("run", model(), "--ids", "1,2", "--mtp", "--json");
    assert_eq!(code(&o), 2);
    assert!(stderr(&o).contains("no MTP head"), "{}", stderr(&o));
}

/// `--route-stats` writes the documented JSON: one entry per MoE layer, counts summing to
/// positions × top-k and (renormalised top-k) mass to positions; a dense file refuses it.
#[test]
fn run_route_stats_writes_counts_and_mass() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("routes.json");
    let o = run!(
        "run",
        common::shared("fixtures/cmf/qwen3_moe-q8.cmf"),
        "--ids",
        "5,6,7,8,9",
        "--greedy",
        "--max-tokens",
        "6",
        "--ignore-eos",
        "--route-stats",
        &out,
        "--json"
    );
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert_eq!(v["format"], "cortiq-route-stats");
    assert_eq!(v["version"], 1);
    // 5 prompt tokens and 5 of the 6 generated ones ran through the model.
    assert_eq!(v["tokens"], 10);
    let layers = v["layers"].as_array().unwrap();
    assert_eq!(layers.len(), 4);
    for l in layers {
        assert_eq!(l["experts"], 8);
        let counts: u64 = l["counts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c.as_u64().unwrap())
            .sum();
        assert_eq!(counts, 10 * l["top_k"].as_u64().unwrap());
        let mass: f64 = l["mass"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c.as_f64().unwrap())
            .sum();
        assert!((mass - 10.0).abs() < 1e-4, "mass {mass}");
    }
    let o = run!("run", model(), "--ids", "1,2", "--route-stats", &out);
    assert_eq!(code(&o), 2);
    assert!(
        stderr(&o).contains("no mixture-of-experts"),
        "{}",
        stderr(&o)
    );
}

/// `bench --mtp --json` reports both speeds, the speed-up and the acceptance; the
/// recurrent state does not grow with the context while the KV bytes do.
#[test]
fn bench_mtp_and_state_sizes() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("hybrid.cmf");
    assert_eq!(code(&run!("demo", "--hybrid", "-o", &file, "--json")), 0);
    let bench = |prompt: &str| {
        let o = run!(
            "bench",
            &file,
            "--mtp",
            "--prompt-tokens",
            prompt,
            "--tokens",
            "8",
            "--repeat",
            "1",
            "--json"
        );
        assert_eq!(code(&o), 0, "{}", stderr(&o));
        json(&o)
    };
    let (short, long) = (bench("8"), bench("40"));
    for k in [
        "plain_decode_tok_s",
        "mtp_decode_tok_s",
        "speedup",
        "acceptance",
    ] {
        assert!(
            short["mtp"][k].as_f64().unwrap() > 0.0,
            "{k}: {}",
            short["mtp"]
        );
    }
    assert!(short["recurrent_state_bytes"].as_u64().unwrap() > 0);
    assert_eq!(
        short["recurrent_state_bytes"],
        long["recurrent_state_bytes"]
    );
    let (ks, kl) = (
        short["kv_bytes"].as_u64().unwrap(),
        long["kv_bytes"].as_u64().unwrap(),
    );
    assert_eq!(
        ks * 48,
        kl * 16,
        "KV bytes are proportional to the context (16 vs 48)"
    );
}
