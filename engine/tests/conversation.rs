//! The session as a stepper and the conversation service on a reference-written file
//! (`qwen3-q8.cmf`: tokenizer, template and weights): token probabilities are the model's
//! softmax, cancellation keeps the partial answer, regenerate / edit / reset behave, and a
//! saved greedy session replays to the same ids.

mod common;

use std::sync::Arc;

use cortiq_engine::chat::conversation::{
    Conversation, ConversationError, ReplyStep, Role, SavedSession, Settings,
};
use cortiq_engine::chat::ChatBundle;
use cortiq_engine::format::shards::CmfModel;
use cortiq_engine::model::{Model, Precision};
use cortiq_engine::runtime::sampler::SamplingParams;
use cortiq_engine::runtime::session::{
    token_probs, GenerateParams, Session, Step, StopReason, PREFILL_CHUNK, TOP_ALTERNATIVES,
};

fn model() -> Arc<Model> {
    let file = CmfModel::open(common::fixture("cmf/qwen3-q8.cmf")).unwrap();
    Arc::new(Model::load(Arc::new(file)).unwrap())
}

fn greedy_settings(max_tokens: usize) -> Settings {
    Settings {
        sampling: SamplingParams::greedy(),
        max_tokens,
        // The random test weights rarely say EOS; keep answers at max_tokens.
        ignore_eos: true,
        ..Settings::default()
    }
}

fn conversation(m: &Arc<Model>, max_tokens: usize) -> Conversation {
    let bundle = Arc::new(ChatBundle::from_model(&m.file).unwrap());
    Conversation::new(m.clone(), bundle, 256, greedy_settings(max_tokens)).unwrap()
}

#[test]
fn each_token_reports_the_softmax_of_its_logits() {
    let m = model();
    let prompt: Vec<u32> = (1..40).collect();
    let params = GenerateParams {
        max_tokens: 5,
        sampling: SamplingParams {
            temperature: 1.3,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.3,
            seed: 7,
        },
        stop_ids: vec![],
    };
    // The stepped session's reports against a second session run by hand.
    let mut s = Session::new(m.clone(), 128);
    let mut reference = Session::new(m.clone(), 128);
    reference.prefill(&prompt).unwrap();
    let mut g = s.start(&prompt, &params).unwrap();
    let mut prefill_steps = 0;
    let mut tokens = Vec::new();
    loop {
        match g.next().unwrap() {
            Step::Prefill { done, total } => {
                prefill_steps += 1;
                assert_eq!(total, prompt.len());
                assert!(done <= total);
            }
            Step::Token(t) => {
                let logits = reference.logits().to_vec();
                let max = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
                let sum: f64 = logits.iter().map(|&l| f64::from(l - max).exp()).sum();
                let p = |id: u32| (f64::from(logits[id as usize] - max).exp() / sum) as f32;
                assert!(
                    (t.prob - p(t.id)).abs() <= 1e-6,
                    "{} vs {}",
                    t.prob,
                    p(t.id)
                );
                assert_eq!(t.top.len, TOP_ALTERNATIVES);
                let mut order: Vec<u32> = (0..logits.len() as u32).collect();
                order.sort_by(|&a, &b| logits[b as usize].total_cmp(&logits[a as usize]));
                let top: Vec<u32> = t.top.iter().map(|(id, _)| id).collect();
                assert_eq!(top, order[..TOP_ALTERNATIVES]);
                for (id, q) in t.top.iter() {
                    assert!((q - p(id)).abs() <= 1e-6);
                }
                reference.step(t.id).unwrap();
                tokens.push(t.id);
            }
            Step::Done(stats) => {
                assert_eq!(stats.stop, StopReason::MaxTokens);
                assert_eq!(stats.generated_tokens, 5);
                break;
            }
        }
    }
    // 39 prompt tokens fit one chunk.
    assert_eq!(prefill_steps, 1);
    assert_eq!(g.output(), &tokens[..]);
    // Done stays done.
    assert!(matches!(g.next().unwrap(), Step::Done(_)));
}

#[test]
fn token_probs_handles_nan_and_short_vocabularies() {
    let (p, top) = token_probs(&[0.0, f32::NAN, 0.0], 1);
    assert_eq!(p, 0.0);
    assert_eq!(top.len, 2);
    assert!((top.probs[0] - 0.5).abs() < 1e-6);
    assert_eq!(top.ids[..2], [0, 2]);
    let (p, top) = token_probs(&[f32::NAN; 4], 0);
    assert_eq!((p, top.len), (0.0, 0));
}

#[test]
fn stepping_equals_generate_and_cancel_keeps_the_prefix() {
    let m = model();
    let c = PREFILL_CHUNK;
    let prompt: Vec<u32> = (3..3 + 2 * c as u32 + 19).collect(); // three prefill chunks
    let params = GenerateParams {
        max_tokens: 8,
        sampling: SamplingParams::greedy(),
        stop_ids: vec![],
    };
    let mut a = Session::new(m.clone(), 4 * c);
    let (ids, _) = a.generate(&prompt, &params, None, &mut |_| {}).unwrap();
    let mut b = Session::new(m.clone(), 4 * c);
    let mut g = b.start(&prompt, &params).unwrap();
    let mut steps = Vec::new();
    // Cancel after the second prefill chunk: nothing generated, the cache holds two.
    for _ in 0..2 {
        steps.push(g.next().unwrap());
    }
    g.cancel();
    match g.next().unwrap() {
        Step::Done(stats) => {
            assert_eq!(stats.stop, StopReason::Cancelled);
            assert_eq!(stats.generated_tokens, 0);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        steps,
        vec![
            Step::Prefill {
                done: c,
                total: prompt.len()
            },
            Step::Prefill {
                done: 2 * c,
                total: prompt.len()
            }
        ]
    );
    assert_eq!(b.tokens().len(), 2 * c);
    // The next start reuses those positions and gives generate's answer.
    let mut g = b.start(&prompt, &params).unwrap();
    assert_eq!(g.prompt_split(), (19, 2 * c));
    let mut out = Vec::new();
    loop {
        match g.next().unwrap() {
            Step::Token(t) => out.push(t.id),
            Step::Prefill { .. } => {}
            Step::Done(_) => break,
        }
    }
    assert_eq!(out, ids);
}

#[test]
fn a_cancelled_reply_stays_in_the_transcript_and_regenerate_replaces_it() {
    let m = model();
    let mut conv = conversation(&m, 12);
    conv.push_user("Hello there");
    let mut reply = conv.reply().unwrap();
    let mut got = 0;
    while got < 3 {
        if let ReplyStep::Token { .. } = reply.next().unwrap() {
            got += 1;
        }
    }
    reply.cancel();
    let ReplyStep::Done(stats) = reply.next().unwrap() else {
        panic!("a cancelled reply ends")
    };
    assert_eq!(stats.stop, StopReason::Cancelled);
    drop(reply);
    let last = conv.messages().last().unwrap().clone();
    assert_eq!(last.role, Role::Assistant);
    assert_eq!(last.stop, Some(StopReason::Cancelled));
    assert_eq!(last.ids.len(), 3);
    assert_eq!(conv.messages().len(), 2);

    // Regenerate: the stopped answer is replaced by a whole one, which starts the same
    // (greedy) and reuses the cached prompt.
    let (_, ids, stats) = conv.regenerate().unwrap().run(&mut |_| {}).unwrap();
    assert_eq!(ids.len(), 12);
    assert_eq!(ids[..3], last.ids[..]);
    assert!(stats.reused_tokens > 0);
    assert_eq!(conv.messages().len(), 2);
    assert_eq!(conv.messages()[1].stop, Some(StopReason::MaxTokens));

    // Edit and resend: the question changes, the old answer is gone.
    conv.edit_last_user("Something else").unwrap();
    assert_eq!(conv.messages().len(), 1);
    conv.reply().unwrap().run(&mut |_| {}).unwrap();
    assert_eq!(conv.messages().len(), 2);
    assert_eq!(conv.last_user(), Some("Something else"));
    assert!(matches!(
        conv.regenerate().map(|_| ()),
        Ok(()) // dropped at once: recorded as a stopped (empty) answer
    ));
    assert_eq!(
        conv.messages().last().unwrap().stop,
        Some(StopReason::Cancelled)
    );

    // A reply needs a user message last.
    assert!(matches!(conv.reply(), Err(ConversationError::State(_))));
    conv.reset();
    assert!(conv.messages().is_empty());
    assert!(conv.session().tokens().is_empty());
}

#[test]
fn a_saved_greedy_session_replays_to_the_same_ids() {
    let m = model();
    let mut conv = conversation(&m, 6);
    conv.settings.system = Some("Be brief.".into());
    for q in ["What is 2+2?", "And 3+3?"] {
        conv.push_user(q);
        conv.reply().unwrap().run(&mut |_| {}).unwrap();
    }
    let saved = SavedSession::of(&conv, "qwen3-q8.cmf", Precision::Exact);
    let text = saved.to_json();
    let back = SavedSession::from_json(&text).unwrap();
    assert_eq!(back, saved);
    assert!(back.matches_model(m.file.primary().directory_hash()));
    assert_eq!(back.messages.len(), 4);

    // A fresh conversation on the same model replays both answers identically.
    let mut other = conversation(&m, 6);
    other.settings = back.settings();
    let turns = other.replay(&back).unwrap();
    assert_eq!(turns.len(), 2);
    assert!(turns.iter().all(|t| t.same()), "{turns:?}");
    assert_eq!(other.messages(), &back.messages[..]);

    // A changed id is reported as different.
    let mut tampered = back.clone();
    tampered.messages[1].ids[0] ^= 1;
    let turns = other.replay(&tampered).unwrap();
    assert!(!turns[0].same() && turns[1].same());

    // Malformed sessions are refused with a reason.
    assert!(SavedSession::from_json("{}").is_err());
    let wrong = text.replace("cortiq-session", "other");
    assert!(SavedSession::from_json(&wrong)
        .unwrap_err()
        .contains("format"));
}
