//! Speculative decoding with an MTP head (§2.1): greedy output identical to plain decoding
//! whatever the draft quality (drafts accepted and rejected, KV and recurrent state rolled
//! back), and with sampling the same output distribution.

use std::sync::Arc;

use cortiq_engine::format::shards::CmfModel;
use cortiq_engine::model::Model;
use cortiq_engine::runtime::sampler::SamplingParams;
use cortiq_engine::runtime::session::{GenerateParams, GenerationStats, Session, Step};
use cortiq_engine::tinymodel::{write_tiny, TinyFf, TinyLayer, TinyMixer, TinySpec};

fn build(spec: &TinySpec) -> (tempfile::TempDir, Arc<Model>) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.cmf");
    write_tiny(&path, spec).unwrap();
    let model = Model::load(Arc::new(CmfModel::open(&path).unwrap())).unwrap();
    assert!(model.mtp.is_some(), "the tiny model has its MTP head");
    (dir, Arc::new(model))
}

fn generate(
    session: &mut Session,
    prompt: &[u32],
    params: &GenerateParams,
) -> (Vec<u32>, GenerationStats) {
    let mut g = session.start(prompt, params).unwrap();
    let mut out = Vec::new();
    loop {
        match g.next().unwrap() {
            Step::Token(t) => out.push(t.id),
            Step::Done(stats) => return (out, stats),
            Step::Prefill { .. } => {}
        }
    }
}

fn greedy(max_tokens: usize) -> GenerateParams {
    GenerateParams {
        max_tokens,
        sampling: SamplingParams::greedy(),
        stop_ids: vec![],
    }
}

/// Prompts of 1 to 140 tokens (one crosses a prefill chunk), pseudo-random ids.
fn prompts(n: usize, vocab: u32) -> Vec<Vec<u32>> {
    (0..n)
        .map(|i| {
            let len = [1, 2, 3, 5, 8, 13, 21, 34, 140][i % 9];
            (0..len)
                .map(|j| ((i * 131 + j * 29 + 7) as u32) % vocab)
                .collect()
        })
        .collect()
}

fn dense_spec() -> TinySpec {
    TinySpec::awkward(vec![
        TinyLayer {
            mixer: TinyMixer::Attention { gated: false },
            ff: TinyFf::Dense { intermediate: 100 },
        };
        2
    ])
}

/// Greedy decoding with and without the head, over 22 prompts and lengths 1–40; returns
/// (drafted, accepted) summed.
fn identical_streams(model: &Arc<Model>) -> (usize, usize) {
    let vocab = model.config.vocab as u32;
    let mut plain = Session::new(model.clone(), 256);
    let mut spec = Session::new(model.clone(), 256);
    spec.set_speculative(true).unwrap();
    let (mut drafted, mut accepted) = (0, 0);
    for (i, p) in prompts(22, vocab).iter().enumerate() {
        let max = [1, 2, 7, 40][i % 4];
        let (a, sa) = generate(&mut plain, p, &greedy(max));
        let (b, sb) = generate(&mut spec, p, &greedy(max));
        assert_eq!(a, b, "prompt {i} ({} tokens): streams differ", p.len());
        assert_eq!((sa.drafted, sa.accepted), (0, 0));
        assert!(sb.accepted <= sb.drafted);
        drafted += sb.drafted;
        accepted += sb.accepted;
    }
    (drafted, accepted)
}

#[test]
fn greedy_output_is_identical_with_a_good_draft() {
    for spec in [dense_spec(), TinySpec::hybrid()] {
        let (_dir, model) = build(&TinySpec {
            mtp: true,
            successor: true,
            ..spec
        });
        let (drafted, accepted) = identical_streams(&model);
        assert!(drafted > 100, "{drafted} drafts");
        // The successor head predicts well (the useless head below covers rejections).
        eprintln!("good draft: acceptance {accepted}/{drafted}");
        assert!(accepted * 2 > drafted, "acceptance {accepted}/{drafted}");
    }
}

#[test]
fn greedy_output_is_identical_with_a_useless_draft() {
    for spec in [dense_spec(), TinySpec::hybrid()] {
        let (_dir, model) = build(&TinySpec { mtp: true, ..spec });
        let (drafted, accepted) = identical_streams(&model);
        // A random head is nearly always wrong: a rollback at almost every position.
        assert!(
            drafted > 100 && accepted * 10 < drafted,
            "acceptance {accepted}/{drafted}"
        );
    }
}

/// A regenerated answer (the same prompt again) and a follow-up turn reuse the state and
/// the head's state; the stream still equals plain decoding.
#[test]
fn reuse_across_turns_keeps_the_guarantee() {
    let (_dir, model) = build(&TinySpec {
        mtp: true,
        successor: true,
        ..TinySpec::hybrid()
    });
    let mut plain = Session::new(model.clone(), 256);
    let mut spec = Session::new(model.clone(), 256);
    spec.set_speculative(true).unwrap();
    let p1: Vec<u32> = vec![5, 17, 33, 2, 90];
    for prompt in [p1.clone(), p1.clone()] {
        assert_eq!(
            generate(&mut plain, &prompt, &greedy(12)).0,
            generate(&mut spec, &prompt, &greedy(12)).0
        );
    }
    let (answer, _) = generate(&mut plain, &p1, &greedy(12));
    let (again, stats) = generate(&mut spec, &p1, &greedy(12));
    assert_eq!(answer, again);
    assert_eq!(stats.reused_tokens, p1.len() - 1, "the prompt is reused");
    let mut p2 = p1.clone();
    p2.extend_from_slice(&answer);
    p2.extend_from_slice(&[7, 8, 9]);
    assert_eq!(
        generate(&mut plain, &p2, &greedy(15)).0,
        generate(&mut spec, &p2, &greedy(15)).0
    );
}

/// With sampling, the second generated token (the first one judged by the acceptance
/// rule) has the same distribution with and without speculation: the total variation
/// between the two empirical distributions stays within three times what sampling noise
/// alone gives, for a good draft (mostly accepted) and a useless one (mostly rejected:
/// the residual distribution at work).
#[test]
fn sampling_keeps_the_output_distribution() {
    for (successor, temperature, n) in [(true, 12.0, 3000u64), (false, 1.0, 6000)] {
        let (_dir, model) = build(&TinySpec {
            mtp: true,
            successor,
            ..dense_spec()
        });
        let vocab = model.config.vocab;
        let prompt = [11u32, 40, 3];
        let histogram = |speculate: bool| {
            let mut s = Session::new(model.clone(), 64);
            s.set_speculative(speculate).unwrap();
            let mut h = vec![0f64; vocab];
            let mut accepted = 0;
            for seed in 0..n {
                let params = GenerateParams {
                    max_tokens: 2,
                    sampling: SamplingParams {
                        temperature,
                        seed,
                        ..SamplingParams::greedy()
                    },
                    stop_ids: vec![],
                };
                let (out, stats) = generate(&mut s, &prompt, &params);
                h[out[1] as usize] += 1.0 / n as f64;
                accepted += stats.accepted;
            }
            (h, accepted)
        };
        let (plain, _) = histogram(false);
        let (spec, accepted) = histogram(true);
        let support = plain.iter().filter(|&&p| p > 0.0).count();
        assert!(support > 5, "the distribution is spread ({support} tokens)");
        let what = if successor {
            "good draft"
        } else {
            "useless draft"
        };
        eprintln!("{what}: {accepted} of {n} drafts accepted");
        if successor {
            assert!(accepted as u64 * 2 > n, "{what}: {accepted} accepted");
        } else {
            assert!((accepted as u64) * 4 < n, "{what}: {accepted} accepted");
        }
        // E|p̂ − q̂| for two independent samples of n is about √(4p(1−p)/(πn)) per token.
        let noise: f64 = plain
            .iter()
            .map(|&p| (4.0 * p * (1.0 - p) / (std::f64::consts::PI * n as f64)).sqrt())
            .sum::<f64>()
            / 2.0;
        let tv: f64 = plain
            .iter()
            .zip(&spec)
            .map(|(a, b)| (a - b).abs())
            .sum::<f64>()
            / 2.0;
        assert!(
            tv < 3.0 * noise,
            "{what}: total variation {tv}, noise {noise}"
        );
    }
}

#[test]
fn a_model_without_a_head_refuses_speculation() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("plain.cmf");
    write_tiny(&path, &dense_spec()).unwrap();
    let model = Model::load(Arc::new(CmfModel::open(&path).unwrap())).unwrap();
    let mut s = Session::new(Arc::new(model), 16);
    let e = s.set_speculative(true).unwrap_err();
    assert!(e.contains("no MTP head"), "{e}");
}
