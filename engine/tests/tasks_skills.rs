//! Task masks (§5) and skills (§9) at run time: a masked run equals the model whose dead
//! neurons, heads and layers are zeroed; an expert mask equals routing restricted by
//! hand; a skill equals the model with its tensors swapped in; routing picks the skill
//! its prompts were fitted on; switching mid-conversation under both cache policies.

mod common;

use std::path::Path;
use std::sync::Arc;

use cortiq_engine::chat::ChatBundle;
use cortiq_engine::format::dtype::DType;
use cortiq_engine::format::masks::{build_section, MaskRecord};
use cortiq_engine::format::writer::{spec_of, write_file};
use cortiq_engine::format::{CmfFile, CmfModel};
use cortiq_engine::model::block::FeedForward;
use cortiq_engine::model::moe::{LayerRoutes, MoeScratch};
use cortiq_engine::model::select::{Active, SkillChoice, TaskMask};
use cortiq_engine::model::{Logits, Model, ModelError};
use cortiq_engine::quant::{self, matrix, EncodeOptions};
use cortiq_engine::runtime::choice::{resolve, Request, SkillRequest};
use cortiq_engine::runtime::session::{Session, SwitchPolicy};
use cortiq_engine::runtime::skill_route;
use cortiq_engine::tinymodel::{write_tiny, TinyFf, TinyLayer, TinyMixer, TinySpec};

fn load(path: &Path) -> Arc<Model> {
    Arc::new(Model::load(Arc::new(CmfModel::open(path).unwrap())).unwrap())
}

/// Every position's logits of `tokens` under `active`.
fn logits(model: &Model, tokens: &[u32], active: &Active) -> Vec<f32> {
    let mut state = model.new_state(tokens.len());
    let mut ws = model.new_workspace(tokens.len());
    ws.active = active.clone();
    model
        .forward(tokens, &mut state, &mut ws, Logits::All, None)
        .unwrap();
    ws.logits.clone()
}

/// DESIGN.md's bound for f32 weights: max |Δ| ≤ 1e-3·(1 + max|logit|), same argmax.
fn assert_close(a: &[f32], b: &[f32], vocab: usize, what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: lengths");
    let scale = 1.0 + a.iter().fold(0f32, |m, v| m.max(v.abs()));
    let worst = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max);
    assert!(
        worst <= 1e-3 * scale,
        "{what}: max |Δlogit| {worst} > {}",
        1e-3 * scale
    );
    for (i, (ra, rb)) in a.chunks(vocab).zip(b.chunks(vocab)).enumerate() {
        assert_eq!(
            cortiq_engine::runtime::sampler::argmax(ra),
            cortiq_engine::runtime::sampler::argmax(rb),
            "{what}: argmax differs at position {i}"
        );
    }
}

/// Rewrites `src` into `out` with every tensor's values passed through `edit`
/// (re-encoded in its own dtype), the header through `header`, and `masks` as the
/// masks section.
fn rewrite(
    src: &Path,
    out: &Path,
    masks: Option<Vec<u8>>,
    header: impl Fn(&mut cortiq_engine::format::header::Header),
    edit: impl Fn(&str, &[u64], &mut [f32]),
) {
    let f = CmfFile::open(src).unwrap();
    let mut spec = spec_of(&f);
    header(&mut spec.header);
    spec.masks = masks;
    let payloads: Vec<Vec<u8>> = f
        .directory
        .iter()
        .map(|e| {
            let mut v = quant::decode(e.dtype, &e.shape, f.tensor_bytes(e)).unwrap();
            edit(&e.name, &e.shape, &mut v);
            quant::encode(e.dtype, &e.shape, &v, &EncodeOptions::default()).unwrap()
        })
        .collect();
    write_file(out, spec, payloads.iter().map(|p| p.as_slice())).unwrap();
}

/// LSB-first bit field of `n` bits.
fn bits(n: usize, on: impl Fn(usize) -> bool) -> Vec<u8> {
    let mut b = vec![0u8; n.div_ceil(8)];
    for i in (0..n).filter(|&i| on(i)) {
        b[i / 8] |= 1 << (i % 8);
    }
    b
}

/// What one mask turns off, per layer.
struct Dead {
    ffn: Vec<Vec<usize>>,
    heads: Vec<Vec<usize>>,
    gated_off: Vec<usize>,
}

fn mask_blob(layers: usize, inter: usize, heads: usize, d: &Dead) -> Vec<u8> {
    let mut blob = Vec::new();
    for l in 0..layers {
        blob.extend(bits(inter, |j| !d.ffn[l].contains(&j)));
    }
    for l in 0..layers {
        blob.extend(bits(heads, |h| !d.heads[l].contains(&h)));
    }
    blob.extend(bits(layers, |l| !d.gated_off.contains(&l)));
    blob
}

fn record(name: &str) -> MaskRecord {
    MaskRecord {
        name: name.into(),
        task_id: 1,
        ..MaskRecord::default()
    }
}

/// A masked run of `spec` equals the run of the same model with the dead neurons'
/// gate rows, the dead heads' o_proj columns and the gated-off layers' o_proj and
/// down_proj zeroed.
fn masked_equals_zeroed(spec: TinySpec, inter: usize, dead: Dead) {
    let dir = tempfile::tempdir().unwrap();
    let (base, masked, zeroed) = (
        dir.path().join("base.cmf"),
        dir.path().join("masked.cmf"),
        dir.path().join("zeroed.cmf"),
    );
    write_tiny(&base, &spec).unwrap();
    let (layers, heads, hd) = (
        spec.layers.len(),
        spec.heads as usize,
        spec.head_dim as usize,
    );
    let section = build_section(
        None,
        vec![record("t")],
        &[mask_blob(layers, inter, heads, &dead)],
    );
    let set_inter = |h: &mut cortiq_engine::format::header::Header| {
        h.arch.as_mut().unwrap().intermediate_size = Some(inter as u64)
    };
    rewrite(&base, &masked, Some(section), set_inter, |_, _, _| {});
    rewrite(&base, &zeroed, None, set_inter, |name, shape, v| {
        let Some(rest) = name.strip_prefix("model.layers.") else {
            return;
        };
        let (l, what) = rest.split_once('.').unwrap();
        let l: usize = l.parse().unwrap();
        let Some(&cols) = shape.get(1) else { return };
        let cols = cols as usize;
        let off = dead.gated_off.contains(&l);
        match what {
            "mlp.gate_proj.weight" => {
                for &j in &dead.ffn[l] {
                    v[j * cols..(j + 1) * cols].fill(0.0);
                }
            }
            "self_attn.o_proj.weight" | "mlp.down_proj.weight" if off => v.fill(0.0),
            "self_attn.o_proj.weight" => {
                for row in v.chunks_exact_mut(cols) {
                    for &h in &dead.heads[l] {
                        row[h * hd..(h + 1) * hd].fill(0.0);
                    }
                }
            }
            _ => {}
        }
    });
    let (m, z) = (load(&masked), load(&zeroed));
    let task = TaskMask::by_name(&m, "t").unwrap();
    let live: usize = task
        .layers
        .iter()
        .filter_map(|l| l.ffn.as_ref())
        .map(|f| f.len())
        .sum();
    assert!(live > 0 && task.ffn_live < 1.0, "the mask masks neurons");
    assert!(
        task.packed_bytes() > 0,
        "row-scaled down_proj packs its live columns"
    );
    let active = Active {
        task: Some(Arc::new(task)),
        skill: SkillChoice::None,
    };
    let tokens: Vec<u32> = (0..23).map(|i| (i * 37 + 5) % 259).collect();
    let vocab = m.config.vocab;
    let got = logits(&m, &tokens, &active);
    let want = logits(&z, &tokens, &Active::default());
    assert_close(&got, &want, vocab, "masked vs zeroed (batch)");
    let plain = logits(&m, &tokens, &Active::default());
    assert!(
        plain.iter().zip(&got).any(|(a, b)| (a - b).abs() > 1e-3),
        "the mask changes the logits"
    );
    // Token by token through a session (decode path: the row-subset matvec).
    let mut s = Session::new(m.clone(), 64);
    s.switch(active, SwitchPolicy::Reprefill).unwrap();
    s.prefill(&tokens[..1]).unwrap();
    for (i, &t) in tokens.iter().enumerate().skip(1) {
        s.step(t).unwrap();
        let row = &want[i * vocab..(i + 1) * vocab];
        assert_close(s.logits(), row, vocab, &format!("decode at {i}"));
    }
}

fn dense_layers(n: usize, inter: u64) -> Vec<TinyLayer> {
    (0..n)
        .map(|_| TinyLayer {
            mixer: TinyMixer::Attention { gated: false },
            ff: TinyFf::Dense {
                intermediate: inter,
            },
        })
        .collect()
}

#[test]
fn masked_run_equals_zeroed_weights_at_two_sizes() {
    // Hidden 72, 3 heads of 24, width 100.
    masked_equals_zeroed(
        TinySpec::awkward(dense_layers(3, 100)),
        100,
        Dead {
            ffn: vec![
                (0..100).filter(|j| j % 3 == 1).collect(),
                (40..77).collect(),
                vec![],
            ],
            heads: vec![vec![], vec![1], vec![0, 2]],
            gated_off: vec![2],
        },
    );
    // Hidden 56, 7 heads of 8 (GQA 7:1), width 60.
    let mut spec = TinySpec::awkward(dense_layers(2, 60));
    spec.hidden = 56;
    spec.heads = 7;
    spec.head_dim = 8;
    spec.seed = 5;
    masked_equals_zeroed(
        spec,
        60,
        Dead {
            ffn: vec![(0..60).filter(|j| j % 2 == 0).collect(), vec![59, 3]],
            heads: vec![vec![6], vec![]],
            gated_off: vec![],
        },
    );
    // 8-bit rows: down_proj's live columns are packed in q8_row (the same codes and row
    // scales); zeroing whole gate rows re-encodes exactly.
    let mut spec = TinySpec::awkward(dense_layers(2, 100));
    spec.dtype = DType::Q8Row;
    masked_equals_zeroed(
        spec,
        100,
        Dead {
            ffn: vec![
                (0..100).filter(|j| j % 4 != 0).collect(),
                (10..60).collect(),
            ],
            heads: vec![vec![], vec![]],
            gated_off: vec![],
        },
    );
}

/// A `[rows, cols]` test matrix encoded in `dtype`: its payload and decoded values.
fn encoded(dtype: DType, rows: usize, cols: usize) -> (Vec<u8>, Vec<f32>) {
    let values: Vec<f32> = (0..rows * cols)
        .map(|i| ((i * 7919) % 211) as f32 / 70.0 - 1.5)
        .collect();
    let shape = [rows as u64, cols as u64];
    let bytes = quant::encode(dtype, &shape, &values, &EncodeOptions::default()).unwrap();
    let full = quant::decode(dtype, &shape, &bytes).unwrap();
    (bytes, full)
}

#[test]
fn gathered_columns_decode_to_the_gathered_values() {
    use DType::*;
    let (rows, cols) = (9usize, 40usize);
    let keep: Vec<u32> = vec![0, 3, 4, 5, 17, 31, 39];
    let shape = [rows as u64, cols as u64];
    for dtype in [F32, F16, Bf16, Q8Row, Q8_2f] {
        let (bytes, full) = encoded(dtype, rows, cols);
        let packed = quant::gather_columns(dtype, &shape, &bytes, &keep).unwrap();
        let got = quant::decode(dtype, &[rows as u64, keep.len() as u64], &packed).unwrap();
        for r in 0..rows {
            for (k, &c) in keep.iter().enumerate() {
                assert_eq!(
                    got[r * keep.len() + k],
                    full[r * cols + c as usize],
                    "{dtype:?}"
                );
            }
        }
    }
    let (q4, _) = encoded(Q4Block, rows, cols);
    assert!(quant::gather_columns(Q4Block, &shape, &q4, &keep).is_none());
    // Rows: every layout whose rows are self-contained (4-bit groups when cols % 32 == 0).
    let (rows, cols) = (11usize, 64usize);
    let keep: Vec<u32> = vec![0, 2, 3, 7, 10];
    let shape = [rows as u64, cols as u64];
    for dtype in [F32, F16, Bf16, Q8Row, Q8_2f, Q4Block, Q4Tiled] {
        let (bytes, full) = encoded(dtype, rows, cols);
        let packed = quant::gather_rows(dtype, &shape, &bytes, &keep).unwrap();
        let got = quant::decode(dtype, &[keep.len() as u64, cols as u64], &packed).unwrap();
        for (k, &r) in keep.iter().enumerate() {
            let r = r as usize;
            assert_eq!(
                &got[k * cols..(k + 1) * cols],
                &full[r * cols..(r + 1) * cols],
                "{dtype:?}"
            );
        }
    }
    let odd = [3u64, 40];
    let q4 = quant::encode(
        DType::Q4Block,
        &odd,
        &vec![0.5; 120],
        &EncodeOptions::default(),
    )
    .unwrap();
    assert!(
        quant::gather_rows(DType::Q4Block, &odd, &q4, &[1]).is_none(),
        "groups across rows"
    );
    assert!(quant::gather_columns(DType::F32, &shape, &[0u8; 4], &keep).is_none());
}

/// A tiny MoE layer's forward with `routable` against the restricted routing computed
/// by hand from its router and experts.
fn restricted_by_hand(norm_topk_prob: bool) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("moe.cmf");
    let mut spec = TinySpec::awkward(vec![TinyLayer {
        mixer: TinyMixer::Attention { gated: false },
        ff: TinyFf::Moe {
            experts: 7,
            top_k: 3,
            intermediate: 20,
            shared: Some(12),
        },
    }]);
    spec.norm_topk_prob = norm_topk_prob;
    write_tiny(&path, &spec).unwrap();
    let model = load(&path);
    let FeedForward::Moe(moe) = &model.layers[0].ff else {
        panic!("a MoE layer")
    };
    let h = model.config.hidden;
    let t = 5;
    let x: Vec<f32> = (0..t * h)
        .map(|i| ((i * 7919) % 113) as f32 / 50.0 - 1.1)
        .collect();
    for routable in [
        vec![true, false, true, true, false, true, false],
        vec![false, true, false, false, true, false, false], // fewer than top_k
    ] {
        let mut s = MoeScratch::new(7, 3, 20, h, t);
        let mut routes = LayerRoutes::new(0, 3, t);
        let mut got = vec![0f32; t * h];
        moe.forward(
            &x,
            t,
            &mut s,
            &mut routes,
            &mut got,
            Default::default(),
            Some(&routable),
        )
        .unwrap();
        let open: Vec<usize> = (0..7).filter(|&e| routable[e]).collect();
        let k = 3.min(open.len());
        for i in 0..t {
            let xi = &x[i * h..(i + 1) * h];
            let mut logit = vec![0f32; 7];
            moe.router.forward(xi, 1, &mut logit);
            let max = open.iter().map(|&e| logit[e]).fold(f32::MIN, f32::max);
            let z: f32 = open.iter().map(|&e| (logit[e] - max).exp()).sum();
            let mut p: Vec<(usize, f32)> = open
                .iter()
                .map(|&e| (e, (logit[e] - max).exp() / z))
                .collect();
            p.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
            p.truncate(k);
            if norm_topk_prob {
                let s: f32 = p.iter().map(|q| q.1).sum();
                p.iter_mut().for_each(|q| q.1 /= s);
            }
            let mut want = vec![0f64; h];
            let mut y = vec![0f32; h];
            let mut ms = cortiq_engine::model::mlp::MlpScratch::new(20, 1);
            for &(e, w) in &p {
                moe.experts[e].forward(xi, 1, &mut ms, &mut y, Default::default(), None);
                for (a, &v) in want.iter_mut().zip(&y) {
                    *a += f64::from(w * v);
                }
            }
            let shared = moe.shared.as_ref().unwrap();
            shared.forward(xi, 1, &mut ms, &mut y, Default::default(), None);
            let mut g = [0f32];
            moe.shared_gate.as_ref().unwrap().forward(xi, 1, &mut g);
            let gate = 1.0 / (1.0 + (-g[0]).exp());
            for (a, &v) in want.iter_mut().zip(&y) {
                *a += f64::from(gate * v);
            }
            let (ex, wt) = routes.token(i);
            let chosen: Vec<usize> = ex.iter().take(k).map(|&e| e as usize).collect();
            assert_eq!(
                chosen,
                p.iter().map(|q| q.0).collect::<Vec<_>>(),
                "token {i}"
            );
            assert!(wt[k..].iter().all(|&w| w == 0.0));
            if !norm_topk_prob {
                // The masked experts' mass is renormalised away, not dropped.
                let full: f32 = wt[..k].iter().sum();
                assert!(full > 0.0 && full <= 1.0 + 1e-6);
            }
            for (j, (&a, &b)) in got[i * h..(i + 1) * h].iter().zip(&want).enumerate() {
                assert!(
                    (f64::from(a) - b).abs() < 1e-4 * (1.0 + b.abs()),
                    "norm_topk_prob {norm_topk_prob}, token {i}, dim {j}: {a} vs {b}"
                );
            }
        }
    }
}

#[test]
fn expert_mask_equals_routing_restricted_by_hand() {
    restricted_by_hand(true);
    restricted_by_hand(false);
}

#[test]
fn reference_expert_mask_runs_and_routes_only_its_experts() {
    let model = load(&common::fixture("cmf/qwen3_moe-masked.cmf"));
    let r = resolve(
        &model,
        &Request {
            task: Some("code".into()),
            skill: SkillRequest::None,
        },
        &[],
    )
    .unwrap();
    assert!(
        r.warnings.iter().any(|w| w.contains("not measured")),
        "{:?}",
        r.warnings
    );
    let task = r.active.task.clone().unwrap();
    let mut s = Session::new(model.clone(), 64);
    s.log_routes();
    s.switch(r.active, SwitchPolicy::Reprefill).unwrap();
    let tokens: Vec<u32> = (0..17).map(|i| (i * 31 + 2) % 500).collect();
    s.prefill(&tokens).unwrap();
    assert!(s.logits().iter().all(|v| v.is_finite()));
    let log = s.routes().unwrap();
    let mut checked = 0;
    for pos in 0..log.len {
        for (layer, experts, _) in log.at(pos) {
            let open = task.layers[layer].experts.as_ref().unwrap();
            for &e in experts {
                assert!(
                    open[e as usize],
                    "layer {layer} routed to masked expert {e}"
                );
                checked += 1;
            }
        }
    }
    assert!(checked > 0);
    // An unknown task lists the file's tasks.
    let err = TaskMask::by_name(&model, "prose").unwrap_err();
    assert!(err.to_string().contains("code"), "{err}");
}

#[test]
fn skill_equals_the_model_with_its_tensors_swapped_in() {
    let skilled = common::fixture("cmf/qwen3-skills.cmf");
    let dir = tempfile::tempdir().unwrap();
    let swapped = dir.path().join("swapped.cmf");
    // The backbone with every replaced tensor's payload taken from skill.sql.*.
    let f = CmfFile::open(&skilled).unwrap();
    let spec = spec_of(&f);
    let payloads: Vec<&[u8]> = f
        .directory
        .iter()
        .map(|e| match f.tensor(&format!("skill.sql.{}", e.name)) {
            Some((_, b)) => b,
            None => f.tensor_bytes(e),
        })
        .collect();
    write_file(&swapped, spec, payloads).unwrap();
    let (m, w) = (load(&skilled), load(&swapped));
    assert_eq!(m.skills.len(), 1);
    assert_eq!(m.skills[0].replaced.len(), 9);
    assert!(m.skills[0].problem.is_none());
    let tokens: Vec<u32> = (0..19).map(|i| (i * 53 + 7) % 512).collect();
    let sql = Active {
        task: None,
        skill: SkillChoice::One(0),
    };
    let got = logits(&m, &tokens, &sql);
    let want = logits(&w, &tokens, &Active::default());
    assert_eq!(got, want, "the same bytes through the same kernels");
    let base = logits(&m, &tokens, &Active::default());
    assert_ne!(got, base, "the skill changes the answer");
    // A blend of the one skill with weight 1 is that skill (materialised in f32).
    let r = resolve(
        &m,
        &Request {
            task: None,
            skill: SkillRequest::Blend { temperature: 0.5 },
        },
        &tokens,
    )
    .unwrap();
    assert_eq!(r.blend_bytes, 9 * 128 * 64 * 4);
    let blended = logits(&m, &tokens, &r.active);
    assert_close(&blended, &want, m.config.vocab, "blend of one skill");
}

#[test]
fn routing_over_the_skill_prompts_picks_sql() {
    let path = common::fixture("cmf/qwen3-skills.cmf");
    let model = load(&path);
    let bundle = ChatBundle::from_model(&model.file).unwrap();
    let tok = bundle.tokenizer().unwrap();
    let prompts = std::fs::read_to_string(common::fixture("cmf/skill-prompts.txt")).unwrap();
    let mut n = 0;
    for line in prompts.lines().filter(|l| !l.trim().is_empty()) {
        let r = skill_route::route(&model, &tok.encode(line, false).unwrap()).unwrap();
        assert_eq!(r.choice, Some(0), "{line}");
        let e = r.scores[0].error.unwrap();
        // The reference reports 0.0006 to 0.33 for these lines.
        assert!(e < 0.4, "{line}: E = {e} (in scope)");
        n += 1;
    }
    assert_eq!(n, 4);
    let off = skill_route::route(
        &model,
        &tok.encode("The weather is nice today and I went for a walk.", false)
            .unwrap(),
    )
    .unwrap();
    let e = off.scores[0].error.unwrap();
    // The reference implementation reports 1.6437 for this prompt.
    assert!((e - 1.6437).abs() < 0.02, "off-topic E = {e}");
}

#[test]
fn a_standalone_skill_file_is_refused_with_guidance() {
    let f = Arc::new(CmfModel::open(common::fixture("cmf/qwen3-skillfile.cmf")).unwrap());
    match Model::load(f) {
        Err(ModelError::Unsupported(m)) => assert!(m.contains("cortiq skill apply"), "{m}"),
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("a skill file must not run"),
    }
}

#[test]
fn unknown_names_list_what_the_file_has() {
    let model = load(&common::fixture("cmf/qwen3-skills.cmf"));
    let req = |skill: &str| Request {
        task: None,
        skill: SkillRequest::parse(skill).unwrap(),
    };
    let e = resolve(&model, &req("nosuch"), &[1]).unwrap_err();
    assert!(e.to_string().contains("skills: sql"), "{e}");
    let e = resolve(
        &model,
        &Request {
            task: Some("code".into()),
            skill: SkillRequest::None,
        },
        &[1],
    )
    .unwrap_err();
    assert!(e.to_string().contains("no task masks"), "{e}");
    assert!(SkillRequest::parse("blend:-1").is_err());
    assert_eq!(
        SkillRequest::parse("blend:0.25").unwrap(),
        SkillRequest::Blend { temperature: 0.25 }
    );
}

#[test]
fn switching_mid_conversation_under_both_policies() {
    let dir = tempfile::tempdir().unwrap();
    let (base, masked) = (dir.path().join("b.cmf"), dir.path().join("m.cmf"));
    let spec = TinySpec::awkward(dense_layers(2, 90));
    write_tiny(&base, &spec).unwrap();
    let dead = Dead {
        ffn: vec![(0..90).filter(|j| j % 2 == 1).collect(), (0..45).collect()],
        heads: vec![vec![2], vec![]],
        gated_off: vec![],
    };
    let section = build_section(None, vec![record("half")], &[mask_blob(2, 90, 3, &dead)]);
    rewrite(
        &base,
        &masked,
        Some(section),
        |h| h.arch.as_mut().unwrap().intermediate_size = Some(90),
        |_, _, _| {},
    );
    let model = load(&masked);
    let half = Active {
        task: Some(Arc::new(TaskMask::by_name(&model, "half").unwrap())),
        skill: SkillChoice::None,
    };
    let first: Vec<u32> = (0..21).map(|i| (i * 11 + 3) % 259).collect();
    let mut more = first.clone();
    more.extend([17, 99, 4, 250]);
    let vocab = model.config.vocab;
    let fresh = |active: &Active, tokens: &[u32]| {
        let mut s = Session::new(model.clone(), 64);
        s.switch(active.clone(), SwitchPolicy::Reprefill).unwrap();
        s.prefill(tokens).unwrap();
        s.logits().to_vec()
    };

    // Re-prefill: equal to a fresh session under the new choice.
    let mut s = Session::new(model.clone(), 64);
    s.prefill(&first).unwrap();
    let r = s.switch(half.clone(), SwitchPolicy::Reprefill).unwrap();
    assert_eq!(r.recomputed, first.len());
    assert!(s.position_labels().all(|l| l == "task half"));
    assert_eq!(s.logits(), fresh(&half, &first).as_slice());
    let reused = s.prefill(&more).unwrap();
    assert_eq!(reused, first.len());
    assert_eq!(s.logits(), fresh(&half, &more).as_slice());

    // Keep the cache: the old positions stay (approximate), tagged with the old choice,
    // and the next prompt reuses them.
    let mut s = Session::new(model.clone(), 64);
    s.prefill(&first).unwrap();
    let r = s.switch(half.clone(), SwitchPolicy::KeepCache).unwrap();
    assert_eq!(r.kept, first.len());
    let reused = s.prefill(&more).unwrap();
    assert_eq!(reused, first.len());
    let labels: Vec<&str> = s.position_labels().collect();
    assert_eq!(labels[0], "backbone");
    assert_eq!(labels[labels.len() - 1], "task half");
    let exact = fresh(&half, &more);
    assert_ne!(
        s.logits(),
        exact.as_slice(),
        "kept positions make it approximate"
    );
    let _ = vocab;

    // Switching back re-prefills only what the other choice computed.
    let r = s
        .switch(Active::default(), SwitchPolicy::Reprefill)
        .unwrap();
    assert!(r.recomputed > 0);
    assert_eq!(s.logits(), fresh(&Active::default(), &more).as_slice());
}

#[test]
fn row_subset_products_equal_the_full_products() {
    let (rows, cols) = (37usize, 96usize);
    let values: Vec<f32> = (0..rows * cols)
        .map(|i| ((i * 2654435761usize) % 1000) as f32 / 500.0 - 1.0)
        .collect();
    let x: Vec<f32> = (0..5 * cols).map(|i| (i % 17) as f32 / 8.0 - 1.0).collect();
    let sel: Vec<u32> = vec![0, 1, 2, 3, 5, 6, 7, 8, 9, 13, 20, 21, 22, 23, 24, 36];
    for dtype in [
        DType::F32,
        DType::Q8Row,
        DType::Q4Block,
        DType::Q8_2f,
        DType::Bf16,
    ] {
        let shape = [rows as u64, cols as u64];
        let bytes = quant::encode(dtype, &shape, &values, &EncodeOptions::default()).unwrap();
        let m = matrix::Matrix::new(dtype, &shape, &bytes).unwrap();
        for p in [matrix::Precision::Exact, matrix::Precision::Fast] {
            for t in [1usize, 5] {
                let mut full = vec![0f32; t * rows];
                matrix::matmul_with(&m, &bytes, &x[..t * cols], t, &mut full, p);
                let mut part = vec![0f32; t * sel.len()];
                matrix::matmul_rows_with(&m, &bytes, &x[..t * cols], t, &sel, &mut part, p);
                for j in 0..t {
                    for (k, &r) in sel.iter().enumerate() {
                        assert_eq!(
                            part[j * sel.len() + k].to_bits(),
                            full[j * rows + r as usize].to_bits(),
                            "{dtype:?} {p:?} t={t} token {j} row {r}"
                        );
                    }
                }
            }
        }
    }
}
