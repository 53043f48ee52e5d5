//! `cortiq skill add` and `cortiq skill bake` end to end: skills grown from donors (a .cmf
//! and a Hugging Face checkpoint) and precision skills baked from a higher-precision
//! original, their routing subspaces fitted to prompts and their quality measured with
//! the skill applied at run time. References come from elsewhere: `route`, `ppl --skill`,
//! `convert` of the same checkpoint, the f32 twin of a q4 model, transformers' logits.

#[macro_use]
mod common;
use common::{code, json};

use std::path::{Path, PathBuf};
use std::sync::Arc;

use cortiq_engine::format::dtype::DType;
use cortiq_engine::format::{CmfFile, CmfModel};
use cortiq_engine::model::select::{Active, SkillChoice};
use cortiq_engine::model::{Logits, Model};
use cortiq_engine::tinymodel::{write_tiny, TinyLayer, TinySpec};
use serde_json::Value;

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn ok(o: &std::process::Output) -> Value {
    assert_eq!(code(o), 0, "{}", stderr(o));
    json(o)
}

/// Hidden 72, three layers (dense 100 and 96 around a Gated DeltaNet + dense 90).
fn tiny(seed: u64, dtype: DType) -> TinySpec {
    TinySpec {
        seed,
        dtype,
        ..TinySpec::awkward(vec![
            TinyLayer::attention_dense(100),
            TinyLayer::deltanet_dense(10, 14, 90),
            TinyLayer::attention_dense(96),
        ])
    }
}

/// `tiny(seed, dtype)` models in `dir`, named by seed and dtype.
fn models<const N: usize>(dir: &Path, specs: [(u64, DType); N]) -> [PathBuf; N] {
    specs.map(|(seed, dtype)| {
        let p = dir.join(format!("tiny-{seed}-{dtype}.cmf"));
        write_tiny(&p, &tiny(seed, dtype)).unwrap();
        p
    })
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

fn sha256_of(path: &Path) -> String {
    let o = std::process::Command::new("sha256sum")
        .arg(path)
        .output()
        .expect("sha256sum runs");
    String::from_utf8_lossy(&o.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}

const SQL: [&str; 3] = [
    "SELECT name, id FROM users WHERE id = 42 ORDER BY name;",
    "INSERT INTO orders (id, total) VALUES (7, 19.99);",
    "UPDATE stock SET qty = qty - 1 WHERE sku = 'A-17';",
];
const PROSE: [&str; 3] = [
    "the old man walked slowly along the quiet river at dusk",
    "she remembered the summer when the orchard was full of bees",
    "rain fell softly on the roofs of the little sleeping town",
];

fn route(file: &Path, prompt: &str) -> Value {
    ok(&run!("route", file, "--prompt", prompt, "--json"))
}

/// E of skill `id` in a `route --json` document.
fn error_of(r: &Value, id: &str) -> f64 {
    r["skills"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["id"] == id)
        .unwrap()["error"]
        .as_f64()
        .unwrap()
}

fn ppl(file: &Path, text: &Path, skill: Option<&str>) -> Value {
    let o = match skill {
        Some(s) => run!("ppl", file, "--text-file", text, "--skill", s, "--json"),
        None => run!("ppl", file, "--text-file", text, "--json"),
    };
    ok(&o)
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * b.abs().max(1.0)
}

#[test]
fn two_skills_from_two_donors_route_their_prompts_and_measure_quality() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let [base, donor_a, donor_b] = models(
        d,
        [(11, DType::Q8Row), (21, DType::Q8Row), (31, DType::F32)],
    );
    let sql = write(d, "sql.txt", &SQL.join("\n"));
    let prose = write(d, "prose.txt", &format!("{}\n\n", PROSE.join("\n")));
    let held_sql = write(
        d,
        "held-sql.txt",
        "DELETE FROM logs WHERE day < 3;\nSELECT 1;\n",
    );
    let held_prose = write(
        d,
        "held-prose.txt",
        "the wind moved through the tall grass\n",
    );

    // -o with --skill, then --in-place with its alias --id.
    let grown = d.join("grown.cmf");
    let a = ok(&run!(
        "skill",
        "add",
        base,
        "--from",
        donor_a,
        "--skill",
        "sql",
        "--layers",
        "1,2",
        "--prompts",
        sql,
        "--heldout",
        held_sql,
        "-o",
        grown,
        "--json"
    ));
    assert_eq!(a["layers"], serde_json::json!([1, 2]));
    assert_eq!(a["selection"]["phi_layer"], 1, "the middle of 3 layers");
    assert_eq!(a["selection"]["rank"], 2, "default 2 = prompts − 1");
    // Norms stay the backbone's: the engine switches matrices.
    let skipped = a["skipped"].as_array().unwrap();
    assert!(skipped
        .iter()
        .any(|s| s["tensor"] == "model.layers.1.input_layernorm.weight"));
    let before = std::fs::read(&grown).unwrap();
    let b = ok(&run!(
        "skill",
        "add",
        grown,
        "--from",
        donor_b,
        "--id",
        "prose",
        "--layers",
        "1-2",
        "--prompts",
        prose,
        "--heldout",
        held_prose,
        "--in-place",
        "--json"
    ));
    assert_eq!(b["output"], serde_json::json!(grown));
    // Append-only: every byte after the envelope is where it was.
    let after = std::fs::read(&grown).unwrap();
    assert!(after.len() > before.len());
    assert_eq!(after[128..before.len()], before[128..]);
    assert_eq!(code(&run!("verify", grown)), 0);
    // The f32 donor's tensors keep their dtype (a .cmf donor's bytes are copied).
    let f = CmfFile::open(&grown).unwrap();
    let (e, _) = f
        .tensor("skill.prose.model.layers.2.mlp.up_proj.weight")
        .unwrap();
    assert_eq!(e.dtype, DType::F32);
    let (e, bytes) = f
        .tensor("skill.sql.model.layers.1.linear_attn.out_proj.weight")
        .unwrap();
    let donor = CmfFile::open(&donor_a).unwrap();
    assert_eq!(
        (e.dtype, bytes),
        (
            DType::Q8Row,
            donor
                .tensor("model.layers.1.linear_attn.out_proj.weight")
                .unwrap()
                .1
        )
    );
    assert!(f
        .tensor("skill.sql.model.layers.0.mlp.up_proj.weight")
        .is_none());

    // The measuring copies are gone.
    let left: Vec<_> = std::fs::read_dir(d)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".cortiq"))
        .collect();
    assert!(left.is_empty(), "{left:?}");

    // Routing: each prompt set goes to its own skill, with a small E.
    for (prompts, own, other) in [(&SQL, "sql", "prose"), (&PROSE, "prose", "sql")] {
        for p in prompts.iter() {
            let r = route(&grown, p);
            assert_eq!(r["choice"], own, "{p}: {r}");
            let (e_own, e_other) = (error_of(&r, own), error_of(&r, other));
            assert!(e_own < 1e-3, "{p}: E = {e_own}");
            assert!(e_other > 10.0 * e_own, "{p}: {e_own} vs {e_other}");
        }
    }
    // And prompts it was not fitted on, of the same kinds.
    for (p, own) in [
        ("SELECT id, price FROM items WHERE price > 10;", "sql"),
        ("the children ran laughing down the green hill", "prose"),
    ] {
        assert_eq!(route(&grown, p)["choice"], own, "{p}");
    }
    // --skill auto picks the same (routed on the scored text).
    for (text, label) in [(&sql, "skill sql"), (&prose, "skill prose")] {
        let v = ppl(&grown, text, Some("auto"));
        assert_eq!(v["choice"], label);
    }

    // Quality: what `ppl --skill` and `ppl` measure on the held-out text.
    for (id, held, doc) in [("sql", &held_sql, &a), ("prose", &held_prose, &b)] {
        let q = &doc["quality"];
        assert_eq!(q["metric"], "ppl");
        let with = ppl(&grown, held, Some(id));
        let without = ppl(&grown, held, None);
        assert!(
            close(
                q["overlaid"].as_f64().unwrap(),
                with["ppl"].as_f64().unwrap()
            ),
            "{q} {with}"
        );
        assert!(
            close(
                q["backbone"].as_f64().unwrap(),
                without["ppl"].as_f64().unwrap()
            ),
            "{q} {without}"
        );
        assert_ne!(q["overlaid"], q["backbone"], "the skill changes the model");
        assert_eq!(q["n_samples"], with["scored"]);
        assert_eq!(q["dataset_sha256"], sha256_of(held));
        // The file says the same.
        let rec = f
            .header
            .skills
            .iter()
            .flatten()
            .find(|s| s.id == id)
            .unwrap();
        assert_eq!(rec.quality.as_ref().unwrap(), q);
        assert_eq!(rec.provenance.as_ref().unwrap()["kind"], "donor");
    }

    // Without --heldout: quality stays null; without --prompts: no selection.
    let bare = d.join("bare.cmf");
    let v = ok(&run!(
        "skill", "add", base, "--from", donor_a, "--id", "x", "--layers", "0", "-o", bare, "--json"
    ));
    assert!(v["quality"].is_null() && v["selection"].is_null(), "{v}");
    let f = CmfFile::open(&bare).unwrap();
    let rec = &f.header.skills.as_ref().unwrap()[0];
    assert!(rec.quality.is_none() && rec.selection.is_none());
    let o = run!(
        "skill",
        "add",
        base,
        "--from",
        donor_a,
        "--id",
        "y",
        "--layers",
        "0",
        "-o",
        d.join("t.cmf")
    );
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("quality: not measured"), "{text}");
}

#[test]
fn usage_errors_exit_2_and_leave_the_base_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let [base, donor] = models(d, [(11, DType::Q8Row), (21, DType::Q8Row)]);
    let narrow = d.join("narrow.cmf");
    let layers = vec![TinyLayer::attention_dense(64); 3];
    write_tiny(&narrow, &TinySpec::awkward(layers)).unwrap();
    let prompts = write(d, "p.txt", &SQL.join("\n"));
    let empty = write(d, "empty.txt", "\n  \n");
    let short = write(d, "short.txt", "x");
    let garbage = write(d, "garbage.cmf", "not a model at all, just text");
    let missing = d.join("missing.txt");
    let original = std::fs::read(&base).unwrap();
    let out = d.join("out.cmf");
    // Arguments after `skill add BASE --from DONOR --id s --layers`; `{p}` etc. stand for
    // the files above. Every case exits 2.
    let cases = [
        ("1", "-o OUT, or --in-place"),
        ("3 --in-place", "past the model's 3 layers"),
        ("2-1 --in-place", "low to high"),
        ("1 --in-place --prompts {p} --rank 0", "at least 1"),
        ("1 --in-place --prompts {p} --rank 3", "at most 2"),
        ("1 --in-place --prompts {p} --phi-layer 3", "has 3 layers"),
        ("1 --in-place --rank 1", "--prompts"),
        ("1 --in-place --prompts {empty}", "no prompt"),
        ("1 --in-place --heldout {short}", "at least 2 tokens"),
        ("1 --in-place --heldout {missing}", "--heldout"),
    ];
    for (args, needle) in cases {
        let mut cmd = assert_cmd::cargo::cargo_bin_cmd!("cortiq");
        cmd.args(["skill", "add"])
            .arg(&base)
            .arg("--from")
            .arg(&donor);
        cmd.args(["--id", "s", "--layers"]);
        for a in args.split(' ') {
            match a {
                "{p}" => cmd.arg(&prompts),
                "{empty}" => cmd.arg(&empty),
                "{short}" => cmd.arg(&short),
                "{missing}" => cmd.arg(&missing),
                _ => cmd.arg(a),
            };
        }
        let o = cmd.output().unwrap();
        assert_eq!(code(&o), 2, "{needle}: {}", stderr(&o));
        assert!(stderr(&o).contains(needle), "{needle}: {}", stderr(&o));
        let now = std::fs::read(&base).unwrap();
        assert!(now == original, "{needle}: the base is untouched");
    }
    let add = |from: &Path, id: &str, layers: &str| {
        run!("skill", "add", base, "--from", from, "--id", id, "--layers", layers, "-o", out)
    };
    for (o, want, needle) in [
        (add(&narrow, "s", "1"), 2, "architecture"),
        (add(&garbage, "s", "1"), 1, "garbage.cmf"),
        (add(&d.join("none.cmf"), "s", "1"), 2, "none.cmf"),
        (add(&donor, "a.b", "1"), 2, "without dots"),
        (add(&base, "s", "1"), 2, "nothing to replace"),
    ] {
        assert_eq!(code(&o), want, "{needle}: {}", stderr(&o));
        assert!(stderr(&o).contains(needle), "{needle}: {}", stderr(&o));
        assert!(!out.exists(), "{needle}: nothing written");
    }
    // A taken id.
    ok(&run!(
        "skill", "add", base, "--from", donor, "--id", "s", "--layers", "1", "-o", out, "--json"
    ));
    let again = d.join("again.cmf");
    let o = run!("skill", "add", out, "--from", donor, "--id", "s", "--layers", "2", "-o", again);
    assert_eq!(code(&o), 2);
    assert!(stderr(&o).contains("already has a skill"), "{}", stderr(&o));
    // bake: an unknown dtype, a source that is no more precise.
    let o = run!(
        "skill", "bake", base, "--from", donor, "--id", "p", "--layers", "1", "--quant", "q9",
        "-o", again
    );
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    let o = run!(
        "skill", "bake", base, "--from", donor, "--id", "p", "--layers", "1", "--quant", "q4",
        "-o", again
    );
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(stderr(&o).contains("nothing to replace"), "{}", stderr(&o));
    assert!(!again.exists());
}

// ---- bake ---------------------------------------------------------------------------

fn load(path: &Path) -> Arc<Model> {
    Arc::new(Model::load(Arc::new(CmfModel::open(path).unwrap())).unwrap())
}

fn logits(model: &Model, ids: &[u32], active: &Active) -> Vec<f32> {
    let mut state = model.new_state(ids.len());
    let mut ws = model.new_workspace(ids.len());
    ws.active = active.clone();
    model
        .forward(ids, &mut state, &mut ws, Logits::All, None)
        .unwrap();
    ws.logits[..ids.len() * model.config.vocab].to_vec()
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()))
}

/// Mean KL(p_ref ‖ p) over positions.
fn mean_kl(reference: &[f32], got: &[f32], vocab: usize) -> f64 {
    let logp = |row: &[f32]| -> Vec<f64> {
        let m = row.iter().fold(f32::MIN, |a, &b| a.max(b)) as f64;
        let z = row.iter().map(|&v| (v as f64 - m).exp()).sum::<f64>().ln() + m;
        row.iter().map(|&v| v as f64 - z).collect()
    };
    let rows = reference.len() / vocab;
    let mut kl = 0.0;
    for (r, g) in reference.chunks(vocab).zip(got.chunks(vocab)) {
        let (lr, lg) = (logp(r), logp(g));
        kl += lr
            .iter()
            .zip(&lg)
            .map(|(a, b)| a.exp() * (a - b))
            .sum::<f64>();
    }
    kl / rows as f64
}

fn skill_index(m: &Model, id: &str) -> Active {
    Active {
        task: None,
        skill: SkillChoice::One(m.skill_index(id).unwrap()),
    }
}

#[test]
fn a_baked_q8_skill_brings_a_q4_model_closer_to_its_f32_twin() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (q4, f32_twin) = (d.join("q4.cmf"), d.join("f32.cmf"));
    write_tiny(&q4, &tiny(5, DType::Q4Block)).unwrap();
    write_tiny(&f32_twin, &tiny(5, DType::F32)).unwrap();
    let held = write(d, "held.txt", "a quiet evening by the river, then rain.\n");
    let prompts = write(d, "p.txt", &PROSE.join("\n"));
    let out = d.join("baked.cmf");
    let v = ok(&run!(
        "skill",
        "bake",
        q4,
        "--from",
        f32_twin,
        "--layers",
        "all",
        "--embeddings",
        "--quant",
        "q8_row",
        "--id",
        "q8",
        "--prompts",
        prompts,
        "--heldout",
        held,
        "-o",
        out,
        "--json"
    ));
    assert_eq!(v["layers"], serde_json::json!([0, 1, 2]));
    assert!(v["fallbacks"].as_array().unwrap().is_empty());
    // Every q4 matrix re-encoded: those of every layer (the Gated DeltaNet's in_proj_a/b
    // too: they are q4 here), the embedding and the head. Norms and vectors stay.
    let f = CmfFile::open(&out).unwrap();
    let base = CmfFile::open(&q4).unwrap();
    let skill: Vec<_> = f
        .directory
        .iter()
        .filter(|e| e.name.starts_with("skill.q8."))
        .collect();
    let want = base
        .directory
        .iter()
        .filter(|e| e.dtype == DType::Q4Block)
        .count();
    assert!(f.tensor("skill.q8.lm_head.weight").is_some());
    assert_eq!(skill.len(), want);
    assert!(skill.iter().all(|e| e.dtype == DType::Q8Row));
    let rec = &f.header.skills.as_ref().unwrap()[0];
    let prov = rec.provenance.as_ref().unwrap();
    assert_eq!(prov["kind"], "precision");
    assert_eq!(prov["quant"], "q8_row");
    assert_eq!(prov["source"], "f32.cmf");
    assert!(rec.selection.is_some());

    // Closer to the f32 model: max |Δlogit| and KL.
    let ids: Vec<u32> = (0..24u32).map(|i| (i * 31 + 5) % 259).collect();
    let m = load(&out);
    let reference = logits(&load(&f32_twin), &ids, &Active::default());
    let backbone = logits(&m, &ids, &Active::default());
    let baked = logits(&m, &ids, &skill_index(&m, "q8"));
    let (d_q4, d_q8) = (
        max_diff(&backbone, &reference),
        max_diff(&baked, &reference),
    );
    let (kl_q4, kl_q8) = (
        mean_kl(&reference, &backbone, 259),
        mean_kl(&reference, &baked, 259),
    );
    assert!(
        d_q8 < 0.5 * d_q4,
        "max |Δlogit|: q8 skill {d_q8}, q4 backbone {d_q4}"
    );
    assert!(
        kl_q8 < 0.5 * kl_q4,
        "KL: q8 skill {kl_q8}, q4 backbone {kl_q4}"
    );

    // Its held-out perplexity, as `ppl --skill` measures it.
    let q = &v["quality"];
    let with = ppl(&out, &held, Some("q8"));
    assert!(close(
        q["overlaid"].as_f64().unwrap(),
        with["ppl"].as_f64().unwrap()
    ));
    let f32_ppl = ppl(&f32_twin, &held, None)["ppl"].as_f64().unwrap();
    let gap = |p: f64| (p - f32_ppl).abs();
    assert!(
        gap(q["overlaid"].as_f64().unwrap()) < gap(q["backbone"].as_f64().unwrap()),
        "the baked ppl is nearer the f32 one: {q} vs {f32_ppl}"
    );
    let text = String::from_utf8_lossy(
        &run!(
            "skill",
            "bake",
            q4,
            "--from",
            f32_twin,
            "--layers",
            "0",
            "--quant",
            "q8",
            "--id",
            "q8",
            "--heldout",
            held,
            "-o",
            d.join("text.cmf")
        )
        .stdout,
    )
    .into_owned();
    assert!(text.contains("held-out perplexity"), "{text}");

    // A dtype that cannot hold hidden 72 (q4tp: rows in groups of 32) falls back to q8_row,
    // which a 1-bit backbone still gains from; the fallbacks are reported.
    let [q1, twin] = models(d, [(11, DType::Q1), (11, DType::F32)]);
    let v = ok(&run!(
        "skill",
        "bake",
        q1,
        "--from",
        twin,
        "--layers",
        "0",
        "--quant",
        "q4tp",
        "--id",
        "p",
        "-o",
        d.join("fb.cmf"),
        "--json"
    ));
    let fallbacks = v["fallbacks"].as_array().unwrap();
    assert_eq!(
        fallbacks.len(),
        v["tensors"].as_u64().unwrap() as usize,
        "{v}"
    );
    assert!(fallbacks.iter().all(|f| f["dtype"] == "q8_row"), "{v}");
    let f = CmfFile::open(d.join("fb.cmf")).unwrap();
    let prov = f.header.skills.as_ref().unwrap()[0]
        .provenance
        .clone()
        .unwrap();
    assert_eq!(prov["fallbacks"].as_array().unwrap().len(), fallbacks.len());

    // In place, from the same source: the base grows, the record is the same kind.
    let grow = d.join("grow.cmf");
    std::fs::copy(&q4, &grow).unwrap();
    ok(&run!(
        "skill",
        "bake",
        grow,
        "--from",
        f32_twin,
        "--layers",
        "1",
        "--quant",
        "f16",
        "--skill",
        "f16",
        "--heldout",
        held,
        "--in-place",
        "--json"
    ));
    assert_eq!(code(&run!("verify", grow)), 0);
    let f = CmfFile::open(&grow).unwrap();
    let rec = &f.header.skills.as_ref().unwrap()[0];
    assert_eq!(rec.layers, [1]);
    assert!(rec.quality.is_some());
}

// ---- Hugging Face sources -----------------------------------------------------------

fn hf(family: &str) -> PathBuf {
    common::shared(&format!("fixtures/hf/{family}/config.json"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn convert(src: &Path, quant: &str, out: &Path) {
    ok(&run!(
        "convert", "--model", src, "--quant", quant, "-o", out, "--json"
    ));
}

/// A copy of checkpoint `src` whose tensors of layer 1 are scaled by `1 + 0.2·sin(i)`.
fn perturbed(src: &Path, out: &Path) {
    std::fs::create_dir_all(out).unwrap();
    for f in [
        "config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
    ] {
        if src.join(f).exists() {
            std::fs::copy(src.join(f), out.join(f)).unwrap();
        }
    }
    let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut owned: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    for (name, view) in st.tensors() {
        assert_eq!(
            view.dtype(),
            safetensors::Dtype::F32,
            "the fixtures are f32"
        );
        let mut data = view.data().to_vec();
        if name.contains("layers.1.") {
            for (i, c) in data.chunks_exact_mut(4).enumerate() {
                let v = f32::from_le_bytes(c.try_into().unwrap()) * (1.0 + 0.2 * (i as f32).sin());
                c.copy_from_slice(&v.to_le_bytes());
            }
        }
        owned.push((name.to_string(), view.shape().to_vec(), data));
    }
    let views: Vec<(String, safetensors::tensor::TensorView)> = owned
        .iter()
        .map(|(n, s, d)| {
            (
                n.clone(),
                safetensors::tensor::TensorView::new(safetensors::Dtype::F32, s.clone(), d)
                    .unwrap(),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, None, &out.join("model.safetensors")).unwrap();
}

#[test]
fn a_hugging_face_donor_is_encoded_as_converting_it_would() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let donor = d.join("donor-hf");
    perturbed(&hf("qwen3"), &donor);
    let (base, reference) = (d.join("base.cmf"), d.join("ref.cmf"));
    convert(&hf("qwen3"), "q8", &base);
    convert(&donor, "q8", &reference);
    let out = d.join("grown.cmf");
    let v = ok(&run!(
        "skill", "add", base, "--from", donor, "--id", "hf", "--layers", "1", "-o", out, "--json"
    ));
    let f = CmfFile::open(&out).unwrap();
    let r = CmfFile::open(&reference).unwrap();
    let b = CmfFile::open(&base).unwrap();
    let mut n = 0;
    for e in b
        .directory
        .iter()
        .filter(|e| e.name.starts_with("model.layers.1."))
    {
        match f.tensor(&format!("skill.hf.{}", e.name)) {
            Some((se, bytes)) => {
                let (re, rb) = r.tensor(&e.name).unwrap();
                assert_eq!((se.dtype, bytes), (re.dtype, rb), "{}", e.name);
                assert_eq!(se.dtype, e.dtype, "{}: the backbone's dtype", e.name);
                n += 1;
            }
            None => assert_eq!(e.shape.len(), 1, "{}: only vectors stay", e.name),
        }
    }
    assert_eq!(v["tensors"], n);
    assert!(n >= 7, "q/k/v/o and gate/up/down");
    let rec = &f.header.skills.as_ref().unwrap()[0];
    assert_eq!(rec.provenance.as_ref().unwrap()["donor_kind"], "hf");
}

#[test]
fn a_precision_skill_baked_from_the_checkpoint_nears_transformers() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (base, q8) = (d.join("q4.cmf"), d.join("q8.cmf"));
    convert(&hf("qwen3"), "q4", &base);
    convert(&hf("qwen3"), "q8", &q8);
    let out = d.join("baked.cmf");
    ok(&run!(
        "skill",
        "bake",
        base,
        "--from",
        hf("qwen3"),
        "--layers",
        "all",
        "--quant",
        "q8",
        "--id",
        "q8",
        "-o",
        out,
        "--json"
    ));
    // Every re-encoded tensor is what `convert --quant q8` writes for it.
    let (f, r) = (CmfFile::open(&out).unwrap(), CmfFile::open(&q8).unwrap());
    let skill: Vec<_> = f
        .directory
        .iter()
        .filter(|e| e.name.starts_with("skill.q8."))
        .collect();
    assert!(!skill.is_empty());
    for e in &skill {
        let name = e.name.strip_prefix("skill.q8.").unwrap();
        let (re, rb) = r.tensor(name).unwrap();
        assert_eq!((e.dtype, f.tensor_bytes(e)), (re.dtype, rb), "{name}");
    }
    // And the logits move toward transformers' (f32 weights).
    let refs = std::fs::read(hf("qwen3").join("reference.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&refs).unwrap();
    let ids: Vec<u32> = st
        .tensor("input_ids")
        .unwrap()
        .data()
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes(c.try_into().unwrap()) as u32)
        .collect();
    let want: Vec<f32> = st
        .tensor("logits")
        .unwrap()
        .data()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    let m = load(&out);
    let backbone = logits(&m, &ids, &Active::default());
    let baked = logits(&m, &ids, &skill_index(&m, "q8"));
    let (d4, d8) = (max_diff(&backbone, &want), max_diff(&baked, &want));
    assert!(d8 < d4, "q8 skill {d8} vs q4 backbone {d4}");
    let v = m.config.vocab;
    assert!(mean_kl(&want, &baked, v) < mean_kl(&want, &backbone, v));
}
