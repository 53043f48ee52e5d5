//! Task masks and skills in the workbench, headless, driven by Actions: switching the
//! chat's task and skill between answers under both cache policies (the divider says
//! which; a re-prefill answers as a fresh conversation under the new choice does), the
//! pickers, unknown choices, the Skills view's E column, the Masks view's active task,
//! the routing view's expert mask, and compare mode. The fixture is `qwen3-skills.cmf`
//! with a masks section added (`testing::skills_masked_fixture`), and
//! `qwen3_moe-masked.cmf` for expert fields.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use cortiq_engine::chat::conversation::{Conversation, Message, Settings};
use cortiq_engine::chat::ChatBundle;
use cortiq_engine::format::shards::CmfModel;
use cortiq_engine::model::Model;
use cortiq_engine::runtime::choice::{resolve, Request, SkillRequest};
use cortiq_engine::runtime::sampler::SamplingParams;
use cortiq_engine::runtime::session::SwitchPolicy;
use cortiq_engine::runtime::skill_route;

use super::chat::{ChatCmd, ChatState};
use super::compare::Divergence;
use super::testing::{chat, chat_mut, fixture, skills_masked_fixture, Harness, HOSTILE_TASK};
use super::{Action, App, Screen, StartOptions, Tab};

fn screen_of(app: &App) -> &super::ModelScreen {
    match &app.screen {
        Screen::Model(m) => m,
        _ => panic!("no model open"),
    }
}

const MAX_TOKENS: usize = 6;

/// The chat on a fresh [`skills_masked_fixture`] (kept in the returned directory).
fn masked_chat(gate: Option<super::chat_worker::Gate>) -> (tempfile::TempDir, PathBuf, Harness) {
    let dir = tempfile::tempdir().unwrap();
    let path = skills_masked_fixture(dir.path());
    let h = ready(&path, gate);
    (dir, path, h)
}

/// The chat on `path`, loaded, greedy, short answers that ignore EOS.
fn ready(path: &Path, gate: Option<super::chat_worker::Gate>) -> Harness {
    let mut h = Harness::open_with(
        path,
        StartOptions {
            tab: Some(Tab::Chat),
            chat_gate: gate,
            ..Default::default()
        },
    );
    h.pump_chat("the model to load", |a| chat(a).ready());
    for cmd in [
        "/set greedy on".to_string(),
        format!("/set max-tokens {MAX_TOKENS}"),
        "/set ignore-eos on".to_string(),
        // The status line shows the seed: fixed, for the snapshots.
        "/set seed 7".to_string(),
    ] {
        send(&mut h, &cmd);
        assert!(chat(&h.app).input.text.is_empty(), "{cmd} was not taken");
    }
    h
}

fn send(h: &mut Harness, text: &str) {
    h.type_text(text).act(Action::Chat(ChatCmd::Send));
}

fn ask(h: &mut Harness, text: &str) -> Vec<u32> {
    send(h, text);
    h.pump_chat("the answer to end", |a| !chat(a).generating);
    let c = chat(&h.app);
    let m = c.messages.last().unwrap();
    assert!(m.error.is_none(), "{:?}", m.error);
    m.ids.clone()
}

/// Sends a `/command` and feeds reports until the worker answered it.
fn switch(h: &mut Harness, cmd: &str, dividers: usize) {
    send(h, cmd);
    h.pump_chat(cmd, |a| chat(a).dividers.len() == dividers);
}

/// The answer of a fresh conversation on `path` with `settings` under `req`, after
/// `history`.
fn fresh_answer(
    path: &Path,
    settings: &Settings,
    req: &Request,
    history: &[Message],
    question: &str,
) -> Vec<u32> {
    let model = Arc::new(Model::load(Arc::new(CmfModel::open(path).unwrap())).unwrap());
    let bundle = Arc::new(ChatBundle::from_model(&model.file).unwrap());
    let settings = settings.clone();
    let mut conv = Conversation::new(model.clone(), bundle, 4096, settings).unwrap();
    let r = resolve(&model, req, &[]).unwrap();
    conv.switch(r.active, SwitchPolicy::Reprefill).unwrap();
    let mut msgs = history.to_vec();
    msgs.push(Message::user(question));
    conv.set_messages(msgs);
    let (ids, _, _) = run_reply(&mut conv);
    ids
}

fn run_reply(conv: &mut Conversation) -> (Vec<u32>, String, ()) {
    use cortiq_engine::chat::conversation::ReplyStep;
    let mut reply = conv.reply().unwrap();
    loop {
        if let ReplyStep::Done(_) = reply.next().unwrap() {
            return (reply.ids().to_vec(), reply.text().to_string(), ());
        }
    }
}

/// The chat's transcript as engine messages.
fn history(c: &ChatState) -> Vec<Message> {
    c.messages
        .iter()
        .map(|m| Message {
            role: m.role.unwrap(),
            content: m.text.clone(),
            ids: m.ids.clone(),
            stop: None,
            choice: None,
        })
        .collect()
}

/// Timings vary from run to run: out of the snapshot.
fn steady(h: &mut Harness) -> String {
    let c = chat_mut(&mut h.app);
    c.last_stats = None;
    for m in c.messages.iter_mut() {
        m.meta = None;
    }
    let screen = h.render();
    // `re-prefilled 40 positions in 0.01 s`: the seconds vary.
    let mut out = String::new();
    for line in screen.lines() {
        match (line.find(" positions in "), line.find(" s ─")) {
            (Some(a), Some(b)) if a < b => {
                out.push_str(&line[..a + " positions in ".len()]);
                out.push('…');
                out.push_str(&line[b..]);
            }
            _ => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

#[test]
fn switching_task_and_skill_mid_conversation_under_both_policies() {
    let (_dir, path, mut h) = masked_chat(None);
    let first = ask(&mut h, "SELECT name FROM users WHERE id = 1;");
    assert_eq!(first.len(), MAX_TOKENS);

    // Keep the cache, switch the task: the divider says the positions stay.
    send(&mut h, "/switch keep");
    switch(&mut h, "/task half", 1);
    let c = chat(&h.app);
    assert_eq!(c.active.label, "task half");
    let (before, text) = &c.dividers[0];
    assert_eq!(*before, 2, "after the first answer");
    assert!(
        text.starts_with("task half · cache kept: ") && text.contains("computed under backbone"),
        "{text}"
    );
    let kept: usize = text["task half · cache kept: ".len()..]
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        kept > MAX_TOKENS,
        "the prompt and the answer were cached: {kept}"
    );
    let flash = h.app.flash.clone().unwrap_or_default();
    assert!(flash.contains("not measured"), "the warning: {flash}");
    let second = ask(&mut h, "INSERT INTO t VALUES (1, 2);");
    assert_eq!(second.len(), MAX_TOKENS);
    assert_eq!(
        chat(&h.app).messages[3].choice.as_deref(),
        Some("task half"),
        "the answer names its choice"
    );

    // Re-prefill, and a skill on top of the task (picked in the skill picker).
    send(&mut h, "/switch reprefill");
    h.act(Action::Chat(ChatCmd::SkillPicker));
    h.act(Action::Down).act(Action::Enter);
    h.pump_chat("the skill switch", |a| chat(a).dividers.len() == 2);
    let c = chat(&h.app);
    assert_eq!(c.active.label, "task half + skill sql");
    let (before, text) = &c.dividers[1];
    assert_eq!(*before, 4);
    assert!(
        text.starts_with("task half + skill sql · re-prefilled "),
        "{text}"
    );
    // The warning was shown once: taking the task again says nothing more of it.
    assert!(!h
        .app
        .flash
        .clone()
        .unwrap_or_default()
        .contains("not measured"));
    let hist = history(chat(&h.app));
    let third = ask(&mut h, "UPDATE accounts SET balance = 0;");
    let want = fresh_answer(
        &path,
        &chat(&h.app).settings,
        &Request {
            task: Some("half".into()),
            skill: SkillRequest::Id("sql".into()),
        },
        &hist,
        "UPDATE accounts SET balance = 0;",
    );
    assert_eq!(
        third, want,
        "after a re-prefill the answer is a fresh conversation's under the new choice"
    );
    assert_eq!(
        chat(&h.app).messages[5].choice.as_deref(),
        Some("task half + skill sql")
    );

    // Keep the cache again, back to the backbone: the old positions are kept.
    send(&mut h, "/switch keep");
    switch(&mut h, "/task none", 3);
    switch(&mut h, "/skill none", 4);
    let c = chat(&h.app);
    assert_eq!(c.active.label, "backbone");
    assert!(
        c.dividers[2].1.contains("cache kept: ")
            && c.dividers[2]
                .1
                .contains("computed under task half + skill sql"),
        "{:?}",
        c.dividers
    );
    let screen = steady(&mut h);
    insta::assert_snapshot!("chat_switch_dividers", screen);
    for want in [
        "── task half · cache kept:",
        "── task half + skill sql · re-prefilled",
    ] {
        assert!(screen.contains(want), "{want:?} in\n{screen}");
    }
    assert!(screen.contains("switch keeps the cache"), "{screen}");
    // Clearing the conversation forgets the dividers, not the choice.
    h.act(Action::Chat(ChatCmd::Clear));
    assert!(chat(&h.app).dividers.is_empty());
}

#[test]
fn auto_chooses_the_skill_on_each_message() {
    let (_dir, _path, mut h) = masked_chat(None);
    send(&mut h, "/skill auto");
    h.pump_chat("the worker to take auto", |a| {
        chat(a).request.skill == SkillRequest::Auto
    });
    assert!(chat(&h.app).dividers.is_empty(), "auto waits for a message");
    // A SQL prompt routes to `sql`: the switch is made before its answer.
    ask(&mut h, "SELECT name FROM users WHERE id = 1;");
    let c = chat(&h.app);
    assert_eq!(c.active.label, "skill sql");
    assert_eq!(c.dividers.len(), 1);
    assert_eq!(c.dividers[0].0, 1, "between the question and its answer");
    assert_eq!(c.messages[1].choice.as_deref(), Some("skill sql"));
    assert!(h.render().contains("skill sql · skill auto"));
}

#[test]
fn unknown_and_unusable_choices_are_messages() {
    let (_dir, _path, mut h) = masked_chat(None);
    send(&mut h, "/task nope");
    h.pump_chat("the refusal", |a| {
        a.flash
            .as_deref()
            .is_some_and(|f| f.contains("cannot switch"))
    });
    let flash = h.app.flash.clone().unwrap();
    assert!(flash.contains("half"), "it lists the file's tasks: {flash}");
    assert!(
        !flash.contains('\u{1b}') && !flash.contains('\n'),
        "{flash:?}"
    );
    assert_eq!(chat(&h.app).active.label, "backbone");
    send(&mut h, "/skill blend:x");
    assert!(h.app.flash.clone().unwrap().contains("not a number"));
    send(&mut h, "/skill gone");
    h.pump_chat("the refusal", |a| {
        a.flash.as_deref().is_some_and(|f| f.contains("no skill"))
    });
    send(&mut h, "/switch sideways");
    assert!(h.app.flash.clone().unwrap().contains("keep or reprefill"));
    // The hostile task switches like any other, shown escaped.
    h.act(Action::Chat(ChatCmd::TaskPicker));
    h.act(Action::End).act(Action::Enter);
    h.pump_chat("the switch", |a| chat(a).dividers.len() == 1);
    assert_eq!(
        chat(&h.app).active.label,
        format!("task {HOSTILE_TASK}"),
        "the engine's label is the raw name"
    );
    let screen = h.render();
    assert!(!screen.contains('\u{1b}'), "{screen}");
    assert!(screen.contains("task evil\\u{1b}[31m\\nname"), "{screen}");
    // A file without masks or skills says so instead of an empty picker.
    let mut plain = ready(&fixture("qwen3-q8.cmf"), None);
    plain.act(Action::Chat(ChatCmd::TaskPicker));
    assert!(plain.app.flash.clone().unwrap().contains("no task masks"));
    plain.act(Action::Chat(ChatCmd::Compare));
    assert!(plain
        .app
        .flash
        .clone()
        .unwrap()
        .contains("type a prompt first"));
    plain.type_text("Hi").act(Action::Chat(ChatCmd::Compare));
    assert!(plain
        .app
        .flash
        .clone()
        .unwrap()
        .contains("no task masks or skills"));
}

#[test]
fn snapshots_of_the_pickers() {
    let (_dir, _path, mut h) = masked_chat(None);
    h.act(Action::Chat(ChatCmd::TaskPicker)).act(Action::Down);
    let screen = h.render();
    insta::assert_snapshot!("chat_task_picker", screen);
    assert!(screen.contains("▶  half"), "{screen}");
    assert!(screen.contains(" ● none"), "the current choice: {screen}");
    assert!(screen.contains("quality not measured"), "{screen}");
    assert!(!screen.contains('\u{1b}'));
    h.act(Action::Back);
    h.act(Action::Chat(ChatCmd::SkillPicker))
        .act(Action::End)
        .act(Action::Right)
        .act(Action::Chat(ChatCmd::Policy));
    let screen = h.render();
    insta::assert_snapshot!("chat_skill_picker", screen);
    assert!(screen.contains("T 0.60"), "{screen}");
    assert!(screen.contains("at a switch: keep the cache"), "{screen}");
    // Enter takes the blend at that temperature.
    h.act(Action::Enter);
    h.pump_chat("the blend request", |a| {
        matches!(chat(a).request.skill, SkillRequest::Blend { temperature } if (temperature - 0.6).abs() < 1e-6)
    });
}

#[test]
fn the_skills_view_shows_e_for_the_chats_last_message() {
    let (_dir, path, mut h) = masked_chat(None);
    let q = "SELECT name FROM users WHERE id = 1;";
    ask(&mut h, q);
    h.act(Action::GoTab(3));
    h.pump_chat("the routing scores", |a| {
        screen_of(a).skills.scores().is_some()
    });
    // The engine's own scores for the same raw tokens.
    let model = Model::load(Arc::new(CmfModel::open(&path).unwrap())).unwrap();
    let bundle = ChatBundle::from_model(&model.file).unwrap();
    let ids = bundle.tokenizer().unwrap().encode(q, false).unwrap();
    let want = skill_route::route(&model, &ids).unwrap();
    let got = screen_of(&h.app).skills.scores().unwrap().clone();
    assert_eq!(got, want);
    let e = want.scores[0].error.unwrap();
    let screen = h.render();
    insta::assert_snapshot!("skills_e_column", screen);
    assert!(
        screen.contains(&format!("{} ◀", cortiq_views::skills::e_text(e))),
        "E and the least-E mark:\n{screen}"
    );
    assert!(
        screen.contains("the chat's last message “SELECT"),
        "{screen}"
    );
    assert!(screen.contains("E (this prompt)"), "{screen}");
    // The chat's own skill is marked in its column.
    h.act(Action::GoTab(5));
    switch(&mut h, "/skill sql", 1);
    h.act(Action::GoTab(3));
    let screen = h.render();
    let row = screen.lines().find(|l| l.contains("▶ sql")).unwrap();
    assert!(row.contains(" ◀  ●  "), "{screen}");
}

#[test]
fn a_probe_prompt_routes_and_waits_for_a_streaming_answer() {
    let gate: super::chat_worker::Gate = Arc::default();
    let (_dir, _path, mut h) = masked_chat(Some(gate.clone()));
    // No chat message: a probe typed in the Skills view.
    h.act(Action::GoTab(3)).act(Action::Filter);
    assert!(h.app.typing());
    h.type_text("INSERT INTO t VALUES (1, 2);")
        .act(Action::Enter);
    h.pump_chat("the probe's scores", |a| {
        screen_of(a).skills.scores().is_some()
    });
    let r = screen_of(&h.app).skills.scores().unwrap().clone();
    assert_eq!(r.choice, Some(0));
    assert!(r.scores[0].error.unwrap() < 0.01, "{r:?}");
    assert!(h.render().contains("the probe “INSERT"));

    // An answer held midway keeps the cores: the new prompt's scores wait for it.
    h.act(Action::GoTab(5));
    // The prefill and two tokens, then the worker waits (it answers 6).
    gate.allow(Some(4));
    send(&mut h, "DELETE FROM logs WHERE day < 3;");
    h.pump_chat("a first token", |a| {
        chat(a).messages.last().is_some_and(|m| !m.ids.is_empty())
    });
    h.act(Action::GoTab(3));
    let deadline = std::time::Instant::now() + Duration::from_millis(600);
    while std::time::Instant::now() < deadline {
        if let Ok(a) = h.rx.recv_timeout(Duration::from_millis(20)) {
            h.app.update(a);
        }
    }
    assert!(
        screen_of(&h.app).skills.scores().is_none(),
        "routing ran while the answer streamed"
    );
    assert!(h.render().contains("computing…"));
    gate.allow(None);
    h.pump_chat("the scores after the answer", |a| {
        screen_of(a).skills.scores().is_some()
    });
}

#[test]
fn the_masks_view_marks_the_chats_task() {
    let (_dir, _path, mut h) = masked_chat(None);
    switch(&mut h, "/task half", 1);
    h.act(Action::GoTab(2)).act(Action::Down);
    assert_eq!(screen_of(&h.app).masks.active, Some(0));
    let screen = h.render();
    insta::assert_snapshot!("masks_active_task", screen);
    assert!(screen.contains("● the chat runs under half"), "{screen}");
    assert!(screen.contains(" ●   1 half"), "{screen}");
    // Back to no task: no mark.
    h.act(Action::GoTab(5));
    switch(&mut h, "/task none", 2);
    assert_eq!(screen_of(&h.app).masks.active, None);
}

#[test]
fn the_routing_view_draws_the_tasks_expert_fields() {
    let mut h = ready(&fixture("qwen3_moe-masked.cmf"), None);
    send(&mut h, "/task code");
    h.pump_chat("the task", |a| chat(a).active.label == "task code");
    ask(&mut h, "Hello");
    while let Ok(a) = h.rx.try_recv() {
        h.app.update(a);
    }
    h.act(Action::GoTab(6));
    let m = screen_of(&h.app);
    let mask = m
        .routing
        .mask_experts
        .clone()
        .expect("the task's expert fields");
    let task = chat(&h.app).active.task.clone().unwrap();
    for (row, l) in mask.iter().zip(&m.routing.log().layers) {
        assert_eq!(Some(row), task.layers[l.layer].experts.as_ref());
        // Every position ran under the task: no masked expert was ever chosen.
        for &e in &l.chosen {
            assert!(
                row[e as usize],
                "layer {}: expert {e} is masked out",
                l.layer
            );
        }
    }
    let screen = h.render();
    assert!(screen.contains("× masked out by task code"), "{screen}");
    assert!(screen.contains('×'));
    // Off again: the grid has no mask.
    h.act(Action::GoTab(5));
    switch(&mut h, "/task none", 2);
    assert!(screen_of(&h.app).routing.mask_experts.is_none());
}

#[test]
fn compare_answers_one_prompt_under_two_choices() {
    let (_dir, path, mut h) = masked_chat(None);
    let q = "SELECT name FROM users WHERE id = 1;";
    h.type_text(q).act(Action::Chat(ChatCmd::Compare));
    // A: what the chat runs (the backbone); B: the first skill.
    let screen = h.render();
    assert!(screen.contains("‹ sql ›"), "{screen}");
    h.act(Action::Enter);
    h.pump_chat("the compare run", |a| !chat(a).comparing());
    // Compare answers greedy, with the chat's other settings.
    let settings = Settings {
        sampling: SamplingParams::greedy(),
        ..chat(&h.app).settings.clone()
    };
    let want: Vec<Vec<u32>> = [SkillRequest::None, SkillRequest::Id("sql".into())]
        .into_iter()
        .map(|skill| fresh_answer(&path, &settings, &Request { task: None, skill }, &[], q))
        .collect();
    let c = compare_state(&h.app);
    assert_eq!(c.sides[0].ids, want[0], "A: the backbone's greedy answer");
    assert_eq!(c.sides[1].ids, want[1], "B: skill sql's");
    let first = want[0].iter().zip(&want[1]).position(|(a, b)| a != b);
    let first = first.expect("the skill changes the answer");
    assert_eq!(c.divergence(), Divergence::At(first));
    let screen = steady(&mut h);
    insta::assert_snapshot!("chat_compare", screen);
    assert!(screen.contains("⟦"), "the divergence is marked:\n{screen}");
    assert!(
        screen.contains(&format!("the answers part at token {}", first + 1)),
        "{screen}"
    );
    // Esc closes; the conversation is untouched.
    h.act(Action::Back);
    assert!(chat(&h.app).messages.is_empty());
    assert!(chat(&h.app).compare().is_none());
}

fn compare_state(app: &App) -> super::compare::CompareState {
    chat(app).compare().cloned().expect("compare mode is open")
}

#[test]
fn compare_stops_when_cancelled() {
    let (_dir, _path, mut h) = masked_chat(None);
    send(&mut h, "/set max-tokens 400");
    h.type_text("Tell me a story")
        .act(Action::Chat(ChatCmd::Compare));
    // Hold the job before it starts, cancel it, then let it go.
    let gate = h.app.jobs.gate();
    let held = gate.write().unwrap();
    h.act(Action::Enter);
    assert!(chat(&h.app).comparing());
    h.act(Action::Cancel);
    assert!(!chat(&h.app).comparing());
    drop(held);
    h.pump_chat("both sides to stop", |a| {
        chat(a)
            .compare()
            .is_some_and(|c| c.sides.iter().all(|s| s.finished()))
    });
    let c = compare_state(&h.app);
    for s in &c.sides {
        assert!(s.ids.len() < 400, "{}", s.ids.len());
        assert_eq!(
            s.stop,
            Some(cortiq_engine::runtime::session::StopReason::Cancelled)
        );
    }
}

#[test]
fn a_pick_made_while_an_answer_streams_applies_after_it() {
    let gate: super::chat_worker::Gate = Arc::default();
    let (_dir, _path, mut h) = masked_chat(Some(gate.clone()));
    gate.allow(Some(4));
    send(&mut h, "SELECT name FROM users WHERE id = 1;");
    h.pump_chat("a first token", |a| {
        chat(a).messages.last().is_some_and(|m| !m.ids.is_empty())
    });
    // Typing goes nowhere while generating: the picker still works.
    h.act(Action::Chat(ChatCmd::TaskPicker));
    assert!(h.render().contains("the switch applies after it"));
    h.act(Action::Down).act(Action::Enter);
    assert!(
        h.app
            .flash
            .clone()
            .unwrap()
            .contains("applies after this answer"),
        "{:?}",
        h.app.flash
    );
    assert_eq!(chat(&h.app).active.label, "backbone");
    gate.allow(None);
    h.pump_chat("the switch", |a| chat(a).dividers.len() == 1);
    let c = chat(&h.app);
    assert_eq!(
        c.messages[1].ids.len(),
        MAX_TOKENS,
        "the answer ran to its end"
    );
    assert_eq!(c.messages[1].choice, None, "under the backbone");
    assert_eq!(c.dividers[0].0, 2, "the divider follows the answer");
    assert_eq!(c.active.label, "task half");
}
