//! End-to-end tests of the inspection commands (`info`, `tensors`, `masks`, `skills`,
//! `diff`) on the reference fixtures in `../shared/fixtures/cmf/`, and of the exit-code
//! contract on bad inputs.
//!
//! A missing fixture fails the test with its path: these tests never pass by skipping.

use std::path::PathBuf;
use std::process::Output;

use assert_cmd::cargo::cargo_bin_cmd;
use serde_json::Value;

/// Path of a reference fixture; panics (fails the test) naming the path if it is absent.
fn fixture(name: &str) -> PathBuf {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../shared/fixtures/cmf")
        .join(name);
    assert!(p.is_file(), "fixture missing: {}", p.display());
    p
}

fn cortiq(args: &[&std::ffi::OsStr]) -> Output {
    cargo_bin_cmd!("cortiq")
        .args(args)
        .output()
        .expect("cortiq runs")
}

/// Runs cortiq with string-ish arguments.
macro_rules! run {
    ($($a:expr),* $(,)?) => {
        cortiq(&[$(std::ffi::OsStr::new(&$a)),*])
    };
}

fn code(o: &Output) -> i32 {
    o.status.code().expect("exited, not killed by a signal")
}

fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).expect("stdout is UTF-8")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Parses stdout as the one JSON document a `--json` run prints.
fn json(o: &Output) -> Value {
    serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("stdout is not one JSON document ({e}):\n{}", stdout(o)))
}

/// The tensor directory parsed straight from the bytes (spec §3), independently of the
/// engine: `(name, dtype id, shape, offset, nbytes, hash)`.
fn raw_directory(path: &std::path::Path) -> Vec<(String, u8, Vec<u64>, u64, u64, u64)> {
    let b = std::fs::read(path).unwrap();
    let u64_at = |b: &[u8], at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap());
    let u32_at = |b: &[u8], at: usize| u32::from_le_bytes(b[at..at + 4].try_into().unwrap());
    let (off, len) = (u64_at(&b, 0x20) as usize, u64_at(&b, 0x28) as usize);
    let d = &b[off..off + len];
    let (count, pool) = (u64_at(d, 0) as usize, u64_at(d, 8) as usize);
    (0..count)
        .map(|i| {
            let r = &d[16 + i * 56..16 + (i + 1) * 56];
            let (name_off, name_len) = (
                u32_at(r, 0) as usize,
                u16::from_le_bytes([r[4], r[5]]) as usize,
            );
            let name =
                String::from_utf8(d[pool + name_off..pool + name_off + name_len].to_vec()).unwrap();
            let shape = (0..r[7] as usize)
                .map(|k| u32_at(r, 8 + 4 * k) as u64)
                .collect();
            (
                name,
                r[6],
                shape,
                u64_at(r, 32),
                u64_at(r, 40),
                u64_at(r, 48),
            )
        })
        .collect()
}

#[test]
fn tensors_json_matches_the_directory() {
    let f = fixture("qwen3-q8.cmf");
    let o = run!("tensors", f, "--json");
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let list = json(&o);
    let list = list.as_array().expect("a JSON list");
    assert_eq!(list.len(), 47);

    let lm = list
        .iter()
        .find(|e| e["name"] == "lm_head.weight")
        .expect("lm_head.weight listed");
    assert_eq!(lm["dtype"], "q8_row");
    assert_eq!(lm["shape"], serde_json::json!([512, 64]));
    assert_eq!(lm["nbytes"], 33792);

    let raw = raw_directory(&f);
    assert_eq!(raw.len(), list.len());
    for ((name, _, shape, off, nbytes, hash), e) in raw.iter().zip(list) {
        assert_eq!(e["name"], name.as_str());
        assert_eq!(e["shape"], serde_json::json!(shape));
        assert_eq!(e["offset"], *off);
        assert_eq!(e["nbytes"], *nbytes);
        let h = e["hash"].as_str().expect("hash is a string");
        assert_eq!(h.len(), 16);
        assert!(
            h.chars()
                .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()),
            "{h}"
        );
        assert_eq!(h, format!("{hash:016x}"), "{name}");
    }
}

#[test]
fn tensors_filter_sort_and_text() {
    let f = fixture("qwen3_moe-masked.cmf");
    // Glob: the whole name must match.
    let o = run!("tensors", f, "--filter", "*.experts.7.*", "--json");
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let names: Vec<String> = json(&o)
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names.len(), 4 * 3, "{names:?}");
    assert!(names.iter().all(|n| n.contains(".experts.7.")));

    // Substring.
    let o = run!("tensors", f, "--filter", "input_layernorm", "--json");
    assert_eq!(json(&o).as_array().unwrap().len(), 4);

    // Largest first.
    let o = run!("tensors", f, "--sort", "size", "--reverse", "--json");
    let sizes: Vec<u64> = json(&o)
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["nbytes"].as_u64().unwrap())
        .collect();
    assert!(sizes.windows(2).all(|w| w[0] >= w[1]), "{sizes:?}");

    // Layer order is natural: layer numbers ascending, tensors outside layers first.
    let o = run!("tensors", f, "--sort", "layer", "--json");
    let layers: Vec<Option<u64>> = json(&o)
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["layer"].as_u64())
        .collect();
    assert!(layers.windows(2).all(|w| w[0] <= w[1]), "{layers:?}");

    let o = run!("tensors", f);
    assert_eq!(code(&o), 0);
    let text = stdout(&o);
    let mut lines = text.lines();
    let head = lines.next().unwrap();
    for col in ["name", "dtype", "shape", "size", "offset", "hash"] {
        assert!(head.contains(col), "header {head:?} lacks {col}");
    }
    assert!(
        text.lines().last().unwrap().starts_with("135 tensors"),
        "{text}"
    );

    // A bad --sort value is a usage error.
    assert_eq!(code(&run!("tensors", f, "--sort", "colour")), 2);
}

#[test]
fn info_reports_structure() {
    let f = fixture("qwen3_moe-masked.cmf");
    let o = run!("info", f, "--json");
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let v = json(&o);
    assert_eq!(v["ok"], true);
    assert_eq!(v["version"], 2);
    assert_eq!(
        v["required_features"]["names"],
        serde_json::json!(["TENSOR_DIR", "BINARY_MASKS"])
    );
    assert_eq!(v["tensors"]["count"], 135);
    assert_eq!(v["masks"]["names"], serde_json::json!(["code"]));
    assert_eq!(v["sparse_index_entries"], 4);
    assert_eq!(v["tokenizer"]["tokens"], 512);
    assert_eq!(v["arch"]["moe"]["num_experts"], 8);
    assert_eq!(v["header"]["arch"]["arch_name"], "qwen3_moe");
    let sections = v["sections"].as_array().unwrap();
    let masks = sections.iter().find(|s| s["name"] == "masks").unwrap();
    assert_eq!(
        (masks["offset"].as_u64(), masks["length"].as_u64()),
        (Some(348288), Some(345))
    );
    let by_dtype = v["tensors"]["by_dtype"].as_array().unwrap();
    let bytes: u64 = by_dtype.iter().map(|d| d["bytes"].as_u64().unwrap()).sum();
    assert_eq!(bytes, v["tensors"]["bytes"].as_u64().unwrap());

    let o = run!("info", f);
    assert_eq!(code(&o), 0);
    let text = stdout(&o);
    for want in [
        "qwen3_moe",
        "BINARY_MASKS",
        "8 experts, top-2",
        "FullAttention ×4",
        "q8_row",
        "code",
    ] {
        assert!(text.contains(want), "info text lacks {want:?}:\n{text}");
    }

    // `cortiq FILE` shows the same until the workbench exists.
    let bare = run!(f);
    assert_eq!(code(&bare), 0);
    assert_eq!(stdout(&bare), text);
}

#[test]
fn info_shows_unknown_header_fields() {
    let o = run!("info", fixture("qwen3_5-q8.cmf"), "--json");
    let v = json(&o);
    assert!(
        v["unknown_fields"]["arch.linear_core"].is_object(),
        "{}",
        v["unknown_fields"]
    );
    assert_eq!(
        v["arch"]["layer_types_summary"],
        "LinearAttention ×3, FullAttention ×1"
    );
}

#[test]
fn masks_moe_expert_fields() {
    let f = fixture("qwen3_moe-masked.cmf");
    let o = run!("masks", f, "--json");
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let v = json(&o);
    let code_mask = v["masks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "code")
        .expect("task code");
    assert_eq!(code_mask["has_expert_fields"], true);
    assert_eq!(code_mask["quality"], Value::Null);
    let layers = code_mask["layers"].as_array().unwrap();
    assert_eq!(layers.len(), 4);
    for l in layers {
        let d = l["experts_density"].as_f64().expect("expert density");
        assert!(d < 1.0 && d > 0.0, "{l}");
        assert_eq!(
            l["experts_active"].as_array().unwrap().len() as f64,
            d * 8.0
        );
    }
    assert_eq!(v["sparse_index"]["entries"], 4);

    let o = run!("masks", f);
    let text = stdout(&o);
    assert!(text.contains("not measured"), "{text}");

    let o = run!("masks", f, "--task", "code");
    assert_eq!(code(&o), 0);
    assert!(stdout(&o).contains("experts active"), "{}", stdout(&o));
}

#[test]
fn masks_unknown_task_is_a_usage_error() {
    let f = fixture("qwen3_moe-masked.cmf");
    let o = run!("masks", f, "--task", "poetry");
    assert_eq!(code(&o), 2);
    let err = stderr(&o);
    assert!(
        err.contains("poetry") && err.contains("available tasks: code"),
        "{err}"
    );

    let o = run!("masks", f, "--task", "poetry", "--json");
    assert_eq!(code(&o), 2);
    assert_eq!(json(&o)["error"]["kind"], "Usage");

    // A file without masks: no task can be found either.
    assert_eq!(
        code(&run!("masks", fixture("qwen3-q8.cmf"), "--task", "code")),
        2
    );
}

#[test]
fn skills_registry_and_replaced_tensors() {
    let f = fixture("qwen3-skills.cmf");
    let o = run!("skills", f, "--json");
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let v = json(&o);
    assert_eq!(v["skill_file"], false);
    let sql = v["skills"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["id"] == "sql")
        .expect("skill sql");
    assert_eq!(sql["layers"], serde_json::json!([1, 2, 3]));
    let tensors = sql["tensors"].as_array().unwrap();
    assert_eq!(tensors.len(), 9);
    assert!(tensors.iter().all(|t| t["base_present"] == true));
    assert!(tensors
        .iter()
        .any(|t| t["name"] == "skill.sql.model.layers.3.mlp.gate_proj.weight"));
    let total: u64 = tensors.iter().map(|t| t["nbytes"].as_u64().unwrap()).sum();
    assert_eq!(sql["total_bytes"].as_u64(), Some(total));
    assert_eq!(sql["selection"]["rank"], 2);
    // mean: hidden (64) f16 values; basis: rank × hidden.
    assert_eq!(sql["selection"]["mean_f16"], 64);
    assert_eq!(sql["selection"]["basis_f16"], 128);

    let text = stdout(&run!("skills", f));
    assert!(
        text.contains("skill sql") && text.contains("model.layers.1.mlp.up_proj.weight"),
        "{text}"
    );
}

#[test]
fn standalone_skill_file() {
    let f = fixture("qwen3-skillfile.cmf");
    let o = run!("skills", f, "--json");
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let v = json(&o);
    assert_eq!(v["skill_file"], true);
    assert!(v["note"].as_str().unwrap().contains("cortiq skill apply"));
    assert_eq!(v["skills"][0]["base_dir_hash"], "d3e074f94cea010a");
    assert_eq!(v["skills"][0]["base_arch"], "qwen3");
    assert!(v["skills"][0]["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .all(|t| t["base_present"] == false));

    let text = stdout(&run!("skills", f));
    assert!(
        text.contains("d3e074f94cea010a") && text.contains("not runnable"),
        "{text}"
    );

    // The hash names the backbone the skill applies to: the q8_2f model without skills.
    let base = json(&run!("info", fixture("qwen3-q8_2f.cmf"), "--json"));
    assert_eq!(base["directory_hash"], "d3e074f94cea010a");
}

#[test]
fn diff_q8_q4_changes_every_matrix_dtype() {
    let (a, b) = (fixture("qwen3-q8.cmf"), fixture("qwen3-q4.cmf"));
    let o = run!("diff", a, b, "--json");
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let v = json(&o);
    assert_eq!(v["identical"], false);
    let changed = v["tensors"]["changed"].as_array().unwrap();
    let matrices: Vec<_> = raw_directory(&a)
        .into_iter()
        .filter(|t| t.2.len() == 2)
        .collect();
    assert!(!matrices.is_empty());
    for (name, ..) in &matrices {
        let c = changed
            .iter()
            .find(|c| c["name"] == name.as_str())
            .unwrap_or_else(|| panic!("{name} not changed"));
        assert!(
            c["fields"]
                .as_array()
                .unwrap()
                .contains(&Value::from("dtype")),
            "{c}"
        );
        assert_eq!(c["a"]["dtype"], "q8_row");
        assert_eq!(c["b"]["dtype"], "q4_block");
    }
    assert_eq!(changed.len(), matrices.len());
    assert_eq!(v["tensors"]["unchanged"], 47 - matrices.len());
    assert!(v["header"]
        .as_array()
        .unwrap()
        .iter()
        .any(|c| c["path"] == "quant_type"));
    assert_eq!(v["tokenizer"]["vocab"]["equal"], true);

    let text = stdout(&run!("diff", a, b));
    assert!(
        text.contains("dtype q8_row → q4_block") && text.contains("files differ"),
        "{text}"
    );

    // --exit-code turns "differ" into exit 1, and identical files into 0.
    assert_eq!(code(&run!("diff", a, b, "--exit-code")), 1);
    let same = run!("diff", a, a, "--exit-code", "--json");
    assert_eq!(code(&same), 0);
    assert_eq!(json(&same)["identical"], true);
}

#[test]
fn diff_masks_and_skills() {
    let v = json(&run!(
        "diff",
        fixture("qwen3_moe-q8.cmf"),
        fixture("qwen3_moe-masked.cmf"),
        "--json"
    ));
    assert_eq!(v["masks"]["added"], serde_json::json!(["code"]));
    assert_eq!(v["tensors"]["changed"].as_array().unwrap().len(), 0);

    let v = json(&run!(
        "diff",
        fixture("qwen3-skills.cmf"),
        fixture("qwen3-skillfile.cmf"),
        "--json"
    ));
    let sql = &v["skills"]["changed"][0];
    assert_eq!(sql["id"], "sql");
    assert!(sql["fields"]
        .as_array()
        .unwrap()
        .iter()
        .any(|c| c["path"] == "base_dir_hash"));
    // The replaced tensors are byte-identical between the model and the cut skill.
    assert_eq!(sql["tensors"]["changed"], serde_json::json!([]));
}

#[test]
fn missing_file_is_an_io_error() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.cmf");
    for cmd in ["info", "tensors", "masks", "skills"] {
        let o = run!(cmd, missing);
        assert_eq!(code(&o), 2, "{cmd}");
        assert!(
            stderr(&o).starts_with("cortiq: Io: "),
            "{cmd}: {}",
            stderr(&o)
        );
    }
    assert_eq!(code(&run!("diff", fixture("qwen3-q8.cmf"), missing)), 2);
    assert_eq!(code(&run!(missing)), 2);
    // A directory is not a file either.
    assert_eq!(code(&run!("info", dir.path())), 2);
}

#[test]
fn garbage_is_an_invalid_file() {
    let dir = tempfile::tempdir().unwrap();
    let junk = dir.path().join("junk.cmf");
    std::fs::write(
        &junk,
        (0..4096u32)
            .map(|i| (i * 37 % 251) as u8)
            .collect::<Vec<u8>>(),
    )
    .unwrap();

    let o = run!("info", junk);
    assert_eq!(code(&o), 1);
    let err = stderr(&o);
    assert!(
        err.starts_with("cortiq: InvalidMagic: ") && err.contains("junk.cmf"),
        "{err}"
    );

    let o = run!("tensors", junk, "--json");
    assert_eq!(code(&o), 1);
    let v = json(&o);
    assert_eq!(v["ok"], false);
    assert_eq!(v["error"]["kind"], "InvalidMagic");
    assert!(v["error"]["message"].as_str().unwrap().contains("junk.cmf"));

    // A right magic with a wrong version is still an invalid file, with its own kind.
    let mut v3 = b"CMF\x01".to_vec();
    v3.extend_from_slice(&3u32.to_le_bytes());
    v3.resize(256, 0);
    let v3_path = dir.path().join("v3.cmf");
    std::fs::write(&v3_path, v3).unwrap();
    let o = run!("masks", v3_path, "--json");
    assert_eq!(code(&o), 1);
    assert_eq!(json(&o)["error"]["kind"], "UnsupportedVersion");

    // Either side of a diff.
    assert_eq!(code(&run!("diff", junk, fixture("qwen3-q8.cmf"))), 1);
}

#[test]
fn usage_errors_exit_2() {
    let f = fixture("qwen3-q8.cmf");
    assert_eq!(code(&run!("info", f, "--bogus")), 2);
    assert_eq!(code(&run!("tensors")), 2);
    assert_eq!(code(&run!("diff", f)), 2);
    assert_eq!(code(&run!()), 2);
}

#[test]
fn names_from_the_file_are_escaped() {
    // Put an ESC into a tensor name: the name pool is not hashed at open, so the file
    // still opens (only `verify` would notice).
    let src = fixture("qwen3-q8.cmf");
    let mut bytes = std::fs::read(&src).unwrap();
    let dir_off = u64::from_le_bytes(bytes[0x20..0x28].try_into().unwrap()) as usize;
    let at = dir_off
        + bytes[dir_off..]
            .windows(14)
            .position(|w| w == b"lm_head.weight")
            .expect("name in the pool");
    bytes[at + 2] = 0x1b; // lm\x1bhead.weight
    let dir = tempfile::tempdir().unwrap();
    let evil = dir.path().join("evil.cmf");
    std::fs::write(&evil, bytes).unwrap();

    let o = run!("tensors", evil);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(!o.stdout.contains(&0x1b), "raw ESC reached the terminal");
    assert!(
        stdout(&o).contains("lm\\u{1b}head.weight"),
        "{}",
        stdout(&o)
    );

    // JSON carries the real name, escaped the JSON way.
    let v = json(&run!("tensors", evil, "--json"));
    assert!(v
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e["name"] == "lm\u{1b}head.weight"));

    let o = run!("diff", src, evil);
    assert!(!o.stdout.contains(&0x1b));

    // A right-to-left override (U+202E, three bytes in UTF-8) in place of "wei": raw, it
    // would make the rest of the line display reversed.
    let mut bytes = std::fs::read(&src).unwrap();
    bytes[at + 8..at + 11].copy_from_slice("\u{202e}".as_bytes());
    let bidi = dir.path().join("bidi.cmf");
    std::fs::write(&bidi, bytes).unwrap();
    for args in [&["tensors"][..], &["info"], &["diff"]] {
        let mut cmd = assert_cmd::cargo::cargo_bin_cmd!("cortiq");
        cmd.args(args);
        if args[0] == "diff" {
            cmd.arg(&src);
        }
        let o = cmd.arg(&bidi).output().unwrap();
        let out = stdout(&o);
        assert!(
            !out.contains('\u{202e}'),
            "{args:?}: a raw override reached the terminal"
        );
        if args[0] != "info" {
            assert!(out.contains("lm_head.\\u{202e}ght"), "{args:?}: {out}");
        }
    }
}

#[test]
fn pipeline_config_json_is_shown() {
    // Turn lm_head.weight into a §12 `te.config_json` u8 tensor (same name length, dtype
    // id 6, 1-D) whose bytes are a JSON document padded with spaces.
    let mut b = std::fs::read(fixture("qwen3-q8.cmf")).unwrap();
    let u64_at =
        |b: &[u8], at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap()) as usize;
    let (dir, data) = (u64_at(&b, 0x20), u64_at(&b, 0x30));
    let (count, pool) = (u64_at(&b, dir), u64_at(&b, dir + 8));
    let rec = (0..count)
        .map(|k| dir + 16 + 56 * k)
        .find(|&r| {
            let off = u32::from_le_bytes(b[r..r + 4].try_into().unwrap()) as usize;
            &b[dir + pool + off..dir + pool + off + 14] == b"lm_head.weight"
        })
        .expect("lm_head.weight record");
    let name_off = u32::from_le_bytes(b[rec..rec + 4].try_into().unwrap()) as usize;
    b[dir + pool + name_off..dir + pool + name_off + 14].copy_from_slice(b"te.config_json");
    let nbytes = u64_at(&b, rec + 40);
    b[rec + 6] = 6;
    b[rec + 7] = 1;
    b[rec + 8..rec + 32].fill(0);
    b[rec + 8..rec + 12].copy_from_slice(&(nbytes as u32).to_le_bytes());
    let config = br#"{"model_type":"gemma2","hidden_size":64}"#;
    let start = data + u64_at(&b, rec + 32);
    b[start..start + nbytes].fill(b' ');
    b[start..start + config.len()].copy_from_slice(config);
    let dir_path = tempfile::tempdir().unwrap();
    let p = dir_path.path().join("pipe.cmf");
    std::fs::write(&p, b).unwrap();

    let o = run!("info", p, "--json");
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let c = &json(&o)["pipeline_components"][0];
    assert_eq!(c["prefix"], "te");
    assert_eq!(c["config"]["model_type"], "gemma2");
    assert!(stdout(&run!("info", p)).contains(r#"te  config 33.0 KiB: {"model_type":"gemma2""#));
}

/// `info`'s per-layer kinds: `layers` (one object per decoder layer), `layers_summary`,
/// `mtp_head`; and the text's `layers` section.
#[test]
fn info_reports_each_layers_mixer_and_feed_forward() {
    // Qwen3.5: three Gated DeltaNet layers, then full attention with the output gate.
    let f = fixture("qwen3_5-q8.cmf");
    let o = run!("info", f, "--json");
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let v = json(&o);
    let layers = v["layers"].as_array().expect("layers is a list");
    assert_eq!(layers.len(), 4);
    let mixers: Vec<&str> = layers
        .iter()
        .map(|l| l["mixer"].as_str().unwrap())
        .collect();
    assert_eq!(
        mixers,
        [
            "linear_attention",
            "linear_attention",
            "linear_attention",
            "full_attention"
        ]
    );
    let gated: Vec<bool> = layers
        .iter()
        .map(|l| l["gated"].as_bool().unwrap())
        .collect();
    assert_eq!(gated, [false, false, false, true]);
    for (i, l) in layers.iter().enumerate() {
        assert_eq!(l["index"], i as u64);
        assert_eq!(l["ffn"], "dense");
        assert_eq!(l["width"], 128);
        assert_eq!(l["experts"], Value::Null);
        assert_eq!(l["shared_expert"], false);
    }
    assert_eq!(layers[0]["declared"], "LinearAttention");
    assert_eq!(layers[3]["tensors"], 11);
    assert_eq!(
        v["layers_summary"],
        "hybrid: 3 linear-attention + 1 full-attention layers (output gate on 1); \
         4 dense layers (width 128)"
    );
    assert_eq!(v["layers_scope"], "file");
    assert_eq!(v["mtp_head"], Value::Null);
    // The layers' bytes are the directory's minus what lies outside layers.
    let in_layers: u64 = layers.iter().map(|l| l["bytes"].as_u64().unwrap()).sum();
    let outside: u64 = raw_directory(&f)
        .iter()
        .filter(|t| !t.0.starts_with("model.layers."))
        .map(|t| t.4)
        .sum();
    assert_eq!(in_layers + outside, v["tensors"]["bytes"].as_u64().unwrap());
    // Existing keys stay.
    assert_eq!(
        v["arch"]["layer_types_summary"],
        "LinearAttention ×3, FullAttention ×1"
    );
    let text = stdout(&run!("info", f));
    for want in [
        "\nlayers\n",
        "summary  hybrid: 3 linear-attention + 1 full-attention layers",
        "L0–2     linear·dense 128",
        "L3       full(gated)·dense 128",
    ] {
        assert!(text.contains(want), "info text lacks {want:?}:\n{text}");
    }

    // Qwen3-MoE: every layer MoE with 8 experts, top-2, no shared expert.
    let f = fixture("qwen3_moe-q8.cmf");
    let v = json(&run!("info", f, "--json"));
    let layers = v["layers"].as_array().unwrap();
    assert_eq!(layers.len(), 4);
    for l in layers {
        assert_eq!(l["mixer"], "full_attention");
        assert_eq!(l["gated"], false);
        assert_eq!(l["ffn"], "moe");
        assert_eq!(l["experts"], 8);
        assert_eq!(l["router_rows"], 8);
        assert_eq!(l["top_k"], 2);
        assert_eq!(l["expert_width"], 32);
        assert_eq!(l["width"], Value::Null);
        assert_eq!(l["shared_expert"], false);
        assert_eq!(l["tensors"], 33);
    }
    assert_eq!(
        v["layers_summary"],
        "4 full-attention layers; 4 MoE layers of 8 experts (top-2)"
    );
    let text = stdout(&run!("info", f));
    assert!(text.contains("L0–3     full·MoE 8e"), "{text}");
}

/// Every block kind in awkward sizes (hidden 72, 7 experts, a shared expert) and an MTP
/// head: `info` says what each layer is and that the head is not layer 0.
#[test]
fn info_reports_shared_experts_and_the_mtp_head() {
    use cortiq_engine::tinymodel::{write_tiny, TinySpec};
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("hybrid.cmf");
    write_tiny(
        &f,
        &TinySpec {
            mtp: true,
            ..TinySpec::hybrid()
        },
    )
    .unwrap();
    let v = json(&run!("info", f, "--json"));
    let layers = v["layers"].as_array().unwrap();
    let kinds: Vec<(String, String, bool)> = layers
        .iter()
        .map(|l| {
            (
                l["mixer"].as_str().unwrap().to_string(),
                l["ffn"].as_str().unwrap().to_string(),
                l["gated"].as_bool().unwrap(),
            )
        })
        .collect();
    let k = |m: &str, f: &str, g: bool| (m.to_string(), f.to_string(), g);
    assert_eq!(
        kinds,
        [
            k("linear_attention", "moe", false),
            k("full_attention", "dense", true),
            k("linear_attention", "dense", false),
            k("full_attention", "moe", false),
        ]
    );
    assert_eq!(layers[0]["experts"], 7);
    assert_eq!(layers[0]["top_k"], 3);
    assert_eq!(layers[0]["shared_expert"], true);
    assert_eq!(layers[0]["shared_expert_width"], 56);
    assert_eq!(layers[0]["shared_expert_gate"], true);
    assert_eq!(layers[3]["shared_expert"], false);
    assert_eq!(layers[1]["width"], 120);
    let head = &v["mtp_head"];
    assert_eq!(head["layers"], 1);
    assert_eq!(head["declared_layers"], 1);
    assert_eq!(head["blocks"][0]["ffn"], "dense");
    assert_eq!(head["summary"], "MTP head: 1 layer (full·dense 144)");
    // The head's tensors are its own: layer 0 counts only model.layers.0.*.
    let l0 = raw_directory(&f)
        .iter()
        .filter(|t| t.0.starts_with("model.layers.0."))
        .count();
    assert_eq!(layers[0]["tensors"], l0 as u64);
    let text = stdout(&run!("info", f));
    for want in [
        "mtp      MTP head: 1 layer (full·dense 144)",
        "L0       linear·MoE 7e+shared",
        "shared expert in 1",
    ] {
        assert!(text.contains(want), "info text lacks {want:?}:\n{text}");
    }
}
