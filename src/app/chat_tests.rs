//! The chat view driven by Actions, headless, on the reference-written `qwen3-q8.cmf`
//! (its own tokenizer and template, random weights): streaming, stop, regenerate, edit,
//! saved sessions and their replay, the token inspector against the engine's softmax,
//! files it cannot chat with. Snapshots of the view live beside the widget
//! (`views/src/snapshots`); the ones here show the app filling it.

use std::sync::Arc;

use cortiq_engine::chat::conversation::{Conversation, SavedSession, Settings};
use cortiq_engine::chat::ChatBundle;
use cortiq_engine::format::shards::CmfModel;
use cortiq_engine::model::Model;
use cortiq_engine::runtime::session::{token_probs, Session, StopReason};

use super::chat::{Availability, ChatCmd};
use super::testing::{chat, chat_mut, fixture, Harness};
use super::{Action, StartOptions, Tab};

/// The chat on `name`, its model loaded, with greedy short answers that ignore EOS (the
/// fixture's random weights would otherwise end at random places).
fn ready(name: &str, gate: Option<super::chat_worker::Gate>) -> Harness {
    let mut h = Harness::open_with(
        &fixture(name),
        StartOptions {
            tab: Some(Tab::Chat),
            chat_gate: gate,
            ..Default::default()
        },
    );
    h.pump_chat("the model to load", |a| chat(a).ready());
    h
}

fn send(h: &mut Harness, text: &str) {
    h.type_text(text).act(Action::Chat(ChatCmd::Send));
}

fn set(h: &mut Harness, cmd: &str) {
    send(h, cmd);
    assert!(chat(&h.app).input.text.is_empty(), "{cmd} was not taken");
}

fn wait_idle(h: &mut Harness) {
    h.pump_chat("the answer to end", |a| !chat(a).generating);
}

#[test]
fn a_turn_streams_into_the_transcript() {
    let mut h = ready("qwen3-q8.cmf", None);
    assert!(
        chat(&h.app).focused,
        "entering the chat puts the cursor in the input"
    );
    set(&mut h, "/set greedy on");
    set(&mut h, "/set max-tokens 24");
    send(&mut h, "Hello there");
    assert!(chat(&h.app).generating);
    // The first token arrives while the answer is still streaming.
    h.pump_chat("a first token", |a| {
        chat(a).messages.last().is_some_and(|m| !m.ids.is_empty())
    });
    wait_idle(&mut h);
    let c = chat(&h.app);
    assert_eq!(c.messages.len(), 2);
    let reply = &c.messages[1];
    assert!(!reply.streaming && !reply.stopped);
    assert_eq!(reply.tokens.len(), reply.ids.len());
    assert!(reply.ids.len() <= 24);
    let stats = c.last_stats.as_ref().unwrap();
    assert!(stats.decode_tok_s > 0.0 && stats.prompt_tokens > 3);
    let screen = h.render();
    assert!(screen.contains("Hello there"), "{screen}");
    assert!(screen.contains("tok/s"), "{screen}");
    // History: ↑ in the empty input recalls the question.
    h.act(Action::Up);
    assert_eq!(chat(&h.app).input.text, "Hello there");
}

#[test]
fn esc_stops_an_answer_midway_and_keeps_it() {
    let gate: super::chat_worker::Gate = Arc::default();
    let mut h = ready("qwen3-q8.cmf", Some(gate.clone()));
    set(&mut h, "/set max-tokens 400");
    // One prefill chunk and three tokens, then the worker waits.
    gate.allow(Some(4));
    send(&mut h, "Tell me a long story");
    h.pump_chat("three tokens", |a| {
        chat(a).messages.last().is_some_and(|m| m.ids.len() >= 3)
    });
    h.act(Action::Back);
    // Ctrl-C while generating stops too, and never quits.
    h.act(Action::Quit);
    assert!(!h.app.quit, "Ctrl-C quit while an answer streamed");
    gate.allow(None);
    wait_idle(&mut h);
    let c = chat(&h.app);
    let reply = c.messages.last().unwrap();
    assert!(reply.stopped, "the partial answer is marked stopped");
    assert!(
        reply.ids.len() >= 3 && reply.ids.len() < 400,
        "{}",
        reply.ids.len()
    );
    assert_eq!(c.last_stats.as_ref().unwrap().stop, StopReason::Cancelled);
    assert!(h.render().contains("stopped"));
    // Not generating: Esc leaves the input, q then quits as everywhere.
    h.act(Action::Back);
    assert!(!chat(&h.app).focused);
    h.act(Action::Quit);
    assert!(h.app.quit);
}

#[test]
fn regenerate_and_edit_resend_replace_the_answer() {
    let mut h = ready("qwen3-q8.cmf", None);
    set(&mut h, "/set greedy on");
    set(&mut h, "/set max-tokens 8");
    send(&mut h, "What is two plus two?");
    wait_idle(&mut h);
    let first = chat(&h.app).messages[1].ids.clone();
    h.act(Action::Chat(ChatCmd::Regenerate));
    assert!(chat(&h.app).generating);
    wait_idle(&mut h);
    let c = chat(&h.app);
    assert_eq!(c.messages.len(), 2, "regenerate replaces the answer");
    assert_eq!(
        c.messages[1].ids, first,
        "greedy regenerates the same answer"
    );
    assert!(
        c.last_stats.as_ref().unwrap().reused_tokens > 0,
        "the prompt came from the cache"
    );

    // Edit the question: the input gets it back; Enter resends it in its place.
    h.act(Action::Chat(ChatCmd::EditLast));
    assert_eq!(chat(&h.app).input.text, "What is two plus two?");
    for _ in 0.."two plus two?".chars().count() {
        h.act(Action::Erase);
    }
    send(&mut h, "three times three?");
    wait_idle(&mut h);
    let c = chat(&h.app);
    assert_eq!(c.messages.len(), 2);
    assert_eq!(c.messages[0].text, "What is three times three?");
    assert!(!c.messages[1].ids.is_empty());

    // Clear: a new session.
    h.act(Action::Chat(ChatCmd::Clear));
    assert!(chat(&h.app).messages.is_empty());
}

#[test]
fn the_token_inspector_shows_the_engines_softmax() {
    let mut h = ready("qwen3-q8.cmf", None);
    set(&mut h, "/set temp 1.2");
    set(&mut h, "/set seed 5");
    set(&mut h, "/set max-tokens 6");
    set(&mut h, "/system Answer briefly.");
    send(&mut h, "Name a colour");
    wait_idle(&mut h);
    let c = chat(&h.app);
    let reply = c.messages[1].clone();
    assert!(!reply.tokens.is_empty());

    // The engine's own softmax at each position, from a separate session.
    let path = fixture("qwen3-q8.cmf");
    let model = Arc::new(Model::load(Arc::new(CmfModel::open(&path).unwrap())).unwrap());
    let bundle = Arc::new(ChatBundle::from_model(&model.file).unwrap());
    let mut conv = Conversation::new(
        model.clone(),
        bundle,
        256,
        Settings {
            system: Some("Answer briefly.".into()),
            ..Settings::default()
        },
    )
    .unwrap();
    conv.push_user("Name a colour");
    let prompt = conv.prompt_ids().unwrap();
    let mut s = Session::new(model, 256);
    s.prefill(&prompt).unwrap();
    for t in &reply.tokens {
        let (p, top) = token_probs(s.logits(), t.id);
        assert!((t.prob - p).abs() < 1e-6, "{} vs {p}", t.prob);
        let ids: Vec<u32> = top.iter().map(|(id, _)| id).collect();
        let shown: Vec<u32> = t.top.iter().map(|(id, _, _)| *id).collect();
        assert_eq!(ids, shown);
        s.step(t.id).unwrap();
    }

    // The inspector opens on the last token; ← moves to the previous one.
    h.act(Action::Chat(ChatCmd::TokenInspector));
    assert!(chat(&h.app).prob_mode);
    h.act(Action::Left);
    let screen = h.render();
    let n = reply.tokens.len();
    let t = &reply.tokens[n - 2];
    assert!(
        screen.contains(&format!("{:.1}%", t.prob * 100.0))
            || screen.contains(&format!("{:.2}%", t.prob * 100.0)),
        "{screen}"
    );
    assert!(screen.contains(&format!("{}", t.top[0].0)), "{screen}");
    h.act(Action::Back);
    assert!(!chat(&h.app).prob_mode);
}

#[test]
fn a_saved_greedy_session_replays_to_identical_ids() {
    let dir = tempfile::tempdir().unwrap();
    let saved = dir.path().join("s.json");
    let mut h = ready("qwen3-q8.cmf", None);
    set(&mut h, "/set greedy on");
    set(&mut h, "/set max-tokens 10");
    send(&mut h, "Hi");
    wait_idle(&mut h);
    set(&mut h, &format!("/save {}", saved.display()));
    h.pump_chat("the save", |_| saved.exists());
    let s = SavedSession::from_json(&std::fs::read_to_string(&saved).unwrap()).unwrap();
    assert_eq!(s.messages.len(), 2);
    assert_eq!(s.messages[1].ids, chat(&h.app).messages[1].ids);
    assert!(s.sampling.greedy);

    // `cortiq FILE --session S.json`: the workbench opens with it and replays it.
    let mut h2 = Harness::open_with(
        &fixture("qwen3-q8.cmf"),
        StartOptions {
            tab: Some(Tab::Chat),
            session: Some(s.clone()),
            ..Default::default()
        },
    );
    h2.pump_chat("the replay", |a| {
        chat(a)
            .replay
            .as_deref()
            .is_some_and(|r| r.contains("reproduced") || r.contains("differ"))
    });
    let c = chat(&h2.app);
    assert_eq!(
        c.replay.as_deref(),
        Some("replay: all 1 answers reproduced the saved tokens")
    );
    assert_eq!(c.messages.len(), 2);
    assert_eq!(c.messages[1].ids, s.messages[1].ids);
    assert!(c.settings.sampling.is_greedy());
}

#[test]
fn a_skill_file_shows_its_notice() {
    {
        let (name, words) = ("qwen3-skillfile.cmf", "skill file");
        let mut h = Harness::open_with(
            &fixture(name),
            StartOptions {
                tab: Some(Tab::Chat),
                ..Default::default()
            },
        );
        h.pump_chat("the notice", |a| {
            matches!(chat(a).availability, Availability::Unavailable { .. })
        });
        let screen = h.render();
        assert!(screen.contains(words), "{name}: {screen}");
        // The rest of the workbench works as before.
        h.act(Action::GoTab(1));
        assert!(h.render().contains("Tensors"));
    }
}

#[test]
fn a_file_failing_its_hash_chain_is_refused_until_overridden() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("damaged.cmf");
    let src = fixture("qwen3-q8.cmf");
    let at = {
        let f = cortiq_engine::format::CmfFile::open(&src).unwrap();
        let e = f
            .directory
            .entries
            .iter()
            .find(|e| e.name.contains("mlp"))
            .unwrap();
        f.tensor_bytes(e).as_ptr() as usize - f.bytes().as_ptr() as usize + 7
    };
    let mut bytes = std::fs::read(&src).unwrap();
    bytes[at] ^= 0x55; // inside an MLP weight
    std::fs::write(&path, bytes).unwrap();
    let mut h = Harness::open_with(
        &path,
        StartOptions {
            tab: Some(Tab::Chat),
            ..Default::default()
        },
    );
    h.pump_chat("the refusal", |a| {
        matches!(
            chat(a).availability,
            Availability::Unavailable {
                can_override: true,
                ..
            }
        )
    });
    assert!(h.render().contains("hash chain fails"));
    h.act(Action::Chat(ChatCmd::Override));
    h.pump_chat("the unverified load", |a| {
        !matches!(chat(a).availability, Availability::Loading { .. })
    });
    assert_eq!(chat(&h.app).availability, Availability::Ready);
}

#[test]
fn snapshot_of_a_chat_with_the_sampling_panel() {
    let mut h = ready("qwen3-q8.cmf", None);
    set(&mut h, "/set greedy on");
    set(&mut h, "/set seed 3");
    set(&mut h, "/set max-tokens 5");
    send(&mut h, "Hello");
    wait_idle(&mut h);
    // Timings vary: hide them from the snapshot.
    chat_mut(&mut h.app).last_stats = None;
    for m in chat_mut(&mut h.app).messages.iter_mut() {
        m.meta = None;
    }
    h.act(Action::Chat(ChatCmd::Sampling))
        .act(Action::Down)
        .act(Action::Right);
    assert_eq!(chat(&h.app).settings.sampling.top_k, 45);
    insta::assert_snapshot!("chat_sampling_over_transcript", h.render());
}

#[test]
fn copy_takes_the_reply_or_one_code_block_and_entering_focuses_the_input() {
    let mut h = ready("qwen3-q8.cmf", None);
    // A reply with two code blocks, as the worker would have streamed it.
    let text = "Two ways:\n\n```rust\nfn a() {}\n```\n\nand\n\n```sh\necho b\n```\n";
    {
        let c = chat_mut(&mut h.app);
        c.messages.push(super::chat::ChatMsg {
            role: Some(cortiq_engine::chat::conversation::Role::Assistant),
            text: text.into(),
            ..Default::default()
        });
    }
    h.act(Action::Chat(ChatCmd::CopyReply));
    assert_eq!(h.app.take_clipboard().as_deref(), Some(text));
    h.act(Action::Chat(ChatCmd::CopyCode));
    assert_eq!(h.app.take_clipboard().as_deref(), Some("fn a() {}\n"));
    h.act(Action::Chat(ChatCmd::CopyCode));
    assert_eq!(h.app.take_clipboard().as_deref(), Some("echo b\n"));
    assert!(h.render().contains("rust"));
    // Esc leaves the input; visiting another view and coming back puts the cursor there.
    h.act(Action::Back);
    assert!(!chat(&h.app).focused);
    h.act(Action::GoTab(0)).act(Action::GoTab(5));
    assert!(chat(&h.app).focused);
}
