//! MoE and Gated DeltaNet blocks on self-made models of awkward sizes: experts found by
//! presence (§11.1), a NaN router logit reported with its layer, batch and token-by-token
//! forwards agreeing, and speculative rollback of recurrent state.

use std::sync::Arc;

use cortiq_engine::format::shards::CmfModel;
use cortiq_engine::format::CmfFile;
use cortiq_engine::model::{Logits, Model, ModelError};
use cortiq_engine::tinymodel::{write_tiny, TinyFf, TinyLayer, TinyMixer, TinySpec};

fn moe_spec(experts: u64, top_k: u64, nominal: Option<u64>) -> TinySpec {
    TinySpec {
        nominal_experts: nominal,
        ..TinySpec::awkward(vec![
            TinyLayer {
                mixer: TinyMixer::Attention { gated: false },
                ff: TinyFf::Moe {
                    experts,
                    top_k,
                    intermediate: 44,
                    shared: Some(30),
                },
            },
            TinyLayer {
                mixer: TinyMixer::GatedDeltaNet {
                    key_heads: 1,
                    value_heads: 3,
                    dk: 10,
                    dv: 14,
                    kernel: 2,
                },
                ff: TinyFf::Dense { intermediate: 50 },
            },
        ])
    }
}

fn load(dir: &tempfile::TempDir, spec: &TinySpec) -> Model {
    let path = dir.path().join("m.cmf");
    write_tiny(&path, spec).unwrap();
    Model::load(Arc::new(CmfModel::open(&path).unwrap())).unwrap()
}

#[test]
fn experts_are_enumerated_by_presence() {
    let dir = tempfile::tempdir().unwrap();
    // A defragmented layer: 5 experts kept of a nominal 8, top-k 3.
    let m = load(&dir, &moe_spec(5, 3, Some(8)));
    let moe = m.layers[0].moe().unwrap();
    assert_eq!((moe.num_experts(), moe.top_k), (5, 3));
    assert_eq!(moe.router.out_dim(), 5);
    // top-k shrinks to the experts present.
    let m = load(&dir, &moe_spec(2, 3, Some(8)));
    assert_eq!(m.layers[0].moe().unwrap().top_k, 2);
    let mut state = m.new_state(8);
    let mut ws = m.new_workspace(3);
    m.forward(&[1, 2, 3], &mut state, &mut ws, Logits::All, None)
        .unwrap();
    let r = &ws.routes[0];
    for i in 0..3 {
        let (e, w) = r.token(i);
        assert!(e[0] != e[1] && e.iter().all(|&x| x < 2));
        assert!(
            (w.iter().sum::<f32>() - 1.0).abs() < 1e-6,
            "renormalised: {w:?}"
        );
    }
}

/// More expert tensors than the arch's nominal count is a malformed file.
#[test]
fn more_experts_than_declared_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.cmf");
    write_tiny(&path, &moe_spec(6, 2, Some(4))).unwrap();
    let Err(e) = Model::load(Arc::new(CmfModel::open(&path).unwrap())) else {
        panic!("a file with more experts than declared loads");
    };
    assert!(matches!(e, ModelError::Config { .. }), "{e}");
    assert!(e.to_string().contains("more experts"), "{e}");
}

/// A router weight set to NaN: the forward fails naming the layer, the state is reset,
/// nothing panics.
#[test]
fn a_nan_router_logit_names_its_layer() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.cmf");
    write_tiny(&path, &moe_spec(5, 2, None)).unwrap();
    let f = CmfFile::open(&path).unwrap();
    let (e, _) = f.tensor("model.layers.0.mlp.gate.weight").unwrap();
    let at = f.envelope.data.off + e.off;
    drop(f);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[at as usize..at as usize + 4].copy_from_slice(&f32::NAN.to_le_bytes());
    std::fs::write(&path, &bytes).unwrap();
    let m = Model::load(Arc::new(CmfModel::open(&path).unwrap())).unwrap();
    let mut state = m.new_state(8);
    let mut ws = m.new_workspace(4);
    let err = m
        .forward(&[3, 4], &mut state, &mut ws, Logits::Last, None)
        .unwrap_err();
    assert!(matches!(err, ModelError::Numeric(_)), "{err}");
    assert!(err.to_string().contains("layer 0"), "{err}");
    assert_eq!(
        state.len, 0,
        "a failed forward leaves no half-advanced state"
    );
}

/// Batch and one-token forwards of the awkward hybrid (every block kind, hidden 72, 7
/// experts top-3, Gated DeltaNet with dk 12 / dv 20, partial rotary, zero-centred norms):
/// within the contract, and MoE/attention-only models bit for bit.
#[test]
fn awkward_sizes_agree_between_batch_and_steps() {
    let dir = tempfile::tempdir().unwrap();
    for spec in [TinySpec::hybrid(), moe_spec(7, 3, None)] {
        let m = load(&dir, &spec);
        let ids: Vec<u32> = (0..45).map(|i| (i * 37 + 5) % 259).collect();
        let v = m.config.vocab;
        let mut state = m.new_state(64);
        let mut ws = m.new_workspace(45);
        m.forward(&ids, &mut state, &mut ws, Logits::All, None)
            .unwrap();
        let batch = ws.logits.clone();
        let mut state = m.new_state(64);
        let mut ws = m.new_workspace(1);
        let mut stepped = Vec::new();
        for &id in &ids {
            m.forward(&[id], &mut state, &mut ws, Logits::Last, None)
                .unwrap();
            stepped.extend_from_slice(&ws.logits[..v]);
        }
        let max_ref = stepped.iter().fold(0f32, |a, b| a.max(b.abs()));
        let worst = batch
            .iter()
            .zip(&stepped)
            .fold(0f32, |a, (x, y)| a.max((x - y).abs()));
        assert!(worst <= 1e-3 * (1.0 + max_ref), "max |Δ| {worst}");
    }
}

/// Recurrent state rolls back to any position recorded in the last forward, and a
/// snapshot restores exactly.
#[test]
fn recurrent_state_rolls_back_and_restores() {
    let dir = tempfile::tempdir().unwrap();
    let m = load(&dir, &TinySpec::hybrid());
    let v = m.config.vocab;
    let mut ws = m.new_workspace(4);
    // Reference: the same forwards, each row computed in the same form.
    let run = |chunks: &[&[u32]], ws: &mut cortiq_engine::model::Workspace| {
        let mut a = m.new_state(16);
        for c in chunks {
            m.forward(c, &mut a, ws, Logits::Last, None).unwrap();
        }
        ws.logits[..v].to_vec()
    };
    let want = run(&[&[1, 2], &[3], &[9]], &mut ws);
    // 2 tokens, then [3, 7] recorded and rolled back to after 3, then 9.
    let mut b = m.new_state(16);
    m.forward(&[1, 2], &mut b, &mut ws, Logits::Last, None)
        .unwrap();
    b.keep_history(2);
    m.forward(&[3, 7], &mut b, &mut ws, Logits::Last, None)
        .unwrap();
    assert!(b.rollback(3), "back to after token 3");
    b.drop_history();
    m.forward(&[9], &mut b, &mut ws, Logits::Last, None)
        .unwrap();
    assert_eq!(
        ws.logits[..v],
        want[..],
        "rollback restores the state exactly"
    );
    assert!(
        !b.rollback(2),
        "a position outside the recorded forward is refused"
    );
    // Snapshot and restore.
    let want = run(&[&[1, 2, 3], &[9]], &mut ws);
    let mut c = m.new_state(16);
    m.forward(&[1, 2, 3], &mut c, &mut ws, Logits::Last, None)
        .unwrap();
    let mut snap = Default::default();
    c.snapshot_into(&mut snap);
    m.forward(&[4, 4, 4], &mut c, &mut ws, Logits::Last, None)
        .unwrap();
    c.restore(&snap);
    m.forward(&[9], &mut c, &mut ws, Logits::Last, None)
        .unwrap();
    assert_eq!(ws.logits[..v], want[..], "restore returns to the snapshot");
}
