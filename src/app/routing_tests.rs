//! The routing view driven by Actions, headless, on the synthetic demo (qwen3_moe: 8
//! experts, top-2, on layers 1, 3 and 5): a greedy chat fills the mirror with exactly the
//! routes an engine session logs for the same turns, the heat map counts top-k per token,
//! the cursor and the measure move, a new prompt cuts the log, and the export reads back
//! as route stats. Snapshots of the widget live beside it (`views/src/snapshots`).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use cortiq_engine::chat::conversation::{Conversation, Settings};
use cortiq_engine::chat::ChatBundle;
use cortiq_engine::format::shards::CmfModel;
use cortiq_engine::model::Model;
use cortiq_engine::runtime::routes::{RouteLog, RouteStats};
use cortiq_views::routing::Measure;

use super::chat::ChatCmd;
use super::routing::{Phase, RoutingCmd, RoutingState};
use super::testing::{chat, Harness};
use super::{Action, App, Screen, StartOptions, Tab};

fn routing(app: &App) -> &RoutingState {
    match &app.screen {
        Screen::Model(m) => &m.routing,
        _ => panic!("no model open"),
    }
}

fn demo(dir: &Path) -> PathBuf {
    let path = dir.join("demo.cmf");
    cortiq_engine::synth::write_demo(&path).expect("write the synthetic demo");
    path
}

/// The chat on `path`, loaded, greedy with short answers.
fn ready(path: &Path) -> Harness {
    let mut h = Harness::open_with(
        path,
        StartOptions {
            tab: Some(Tab::Chat),
            ..Default::default()
        },
    );
    h.pump_chat("the model to load", |a| chat(a).ready());
    for cmd in ["/set greedy on", "/set max-tokens 12"] {
        send(&mut h, cmd);
    }
    h
}

fn send(h: &mut Harness, text: &str) {
    h.type_text(text).act(Action::Chat(ChatCmd::Send));
}

fn wait_idle(h: &mut Harness) {
    h.pump_chat("the answer to end", |a| !chat(a).generating);
    // Route rows are sent before the step's own report: all are in by now, but pump
    // whatever is still queued.
    while let Ok(a) = h.rx.try_recv() {
        h.app.update(a);
    }
}

/// An engine conversation on `path` with the chat's settings, logging routes.
fn reference(path: &Path, settings: &Settings) -> Conversation {
    let model = Arc::new(Model::load(Arc::new(CmfModel::open(path).unwrap())).unwrap());
    let bundle = Arc::new(ChatBundle::from_model(&model.file).unwrap());
    let mut conv = Conversation::new(model, bundle, 4096, settings.clone()).unwrap();
    conv.log_routes();
    conv
}

/// The mirror holds the same positions, tokens and routes as `expected`.
fn assert_same_log(mirror: &RoutingState, tokens: &[u32], expected: &RouteLog) {
    let got = mirror.log();
    assert_eq!(got.len, expected.len, "positions");
    let ids: Vec<u32> = mirror.tokens().iter().map(|t| t.0).collect();
    assert_eq!(ids, tokens, "token ids");
    assert_eq!(got.layers.len(), expected.layers.len());
    for (a, b) in got.layers.iter().zip(&expected.layers) {
        assert_eq!((a.layer, a.experts, a.k), (b.layer, b.experts, b.k));
        assert_eq!(a.chosen, b.chosen, "layer {} experts", a.layer);
        for (x, y) in a.weights.iter().zip(&b.weights) {
            assert!((x - y).abs() < 1e-5, "layer {} weight {x} vs {y}", a.layer);
        }
    }
}

#[test]
fn a_greedy_chat_fills_the_routing_view() {
    let dir = tempfile::tempdir().unwrap();
    let path = demo(dir.path());
    let mut h = ready(&path);
    send(&mut h, "Hello, experts!");
    wait_idle(&mut h);
    h.act(Action::GoTab(6));
    let r = routing(&h.app);
    assert_eq!(r.phase, Phase::Ready);

    // The same turn in an engine conversation logs the same routes, position by position.
    let mut conv = reference(&path, &chat(&h.app).settings);
    conv.push_user("Hello, experts!");
    let (_, ids, stats) = conv.reply().unwrap().run(&mut |_| {}).unwrap();
    assert_eq!(ids, chat(&h.app).messages[1].ids, "the same greedy answer");
    let expected = conv.session().routes().unwrap();
    assert_same_log(r, conv.session().tokens(), expected);
    // The prompt and every generated token but the last (never run) are routed.
    let n = r.log().len;
    assert_eq!(n, stats.prompt_tokens + ids.len() - 1);
    assert_eq!(
        r.log().layers.iter().map(|l| l.layer).collect::<Vec<_>>(),
        [1, 3, 5]
    );

    // Heat map totals: every position chose top-k experts in every MoE layer.
    for row in r.layer_rows() {
        let total: f64 = row.values.iter().sum();
        assert_eq!(total, (n * row.top_k) as f64, "layer {}", row.layer);
        assert_eq!(row.values.len(), 8);
    }
    let screen = h.render();
    assert!(screen.contains("7 Routing"), "{screen}");
    assert!(
        screen.contains(&format!("times chosen · {n} tokens × top-2 of 8")),
        "{screen}"
    );

    // The cursor starts on the newest token; ← and Home move it, End follows again.
    assert_eq!(routing(&h.app).cursor(), Some(n - 1));
    h.act(Action::Left).act(Action::Left);
    assert_eq!(routing(&h.app).cursor(), Some(n - 3));
    h.act(Action::Home);
    assert_eq!(routing(&h.app).cursor(), Some(0));
    let (e, w) = {
        let (_, e, w) = routing(&h.app).log().at(0).next().unwrap();
        (e.to_vec(), w.to_vec())
    };
    let screen = h.render();
    assert!(screen.contains("token 1 of"), "{screen}");
    assert!(
        screen.contains(&format!("e{} {:.2} e{} {:.2}", e[0], w[0], e[1], w[1])),
        "the first token's experts at layer 1:\n{screen}"
    );
    h.act(Action::Right);
    assert_eq!(routing(&h.app).cursor(), Some(1));
    h.act(Action::End);
    assert_eq!(routing(&h.app).cursor(), Some(n - 1));

    // Layers: ↓ and ] go down, [ back up; the transcript follows the layer.
    h.act(Action::Down)
        .act(Action::Routing(RoutingCmd::NextLayer));
    assert_eq!(routing(&h.app).layer, 2);
    h.act(Action::Down);
    assert_eq!(routing(&h.app).layer, 2, "no layer past the last");
    h.act(Action::Routing(RoutingCmd::PrevLayer));
    assert!(h.render().contains("first expert at layer 3"));

    // Weight mass: with norm_topk_prob each position's weights sum to 1.
    h.act(Action::Routing(RoutingCmd::Mass));
    assert_eq!(routing(&h.app).measure, Measure::Mass);
    for row in routing(&h.app).layer_rows() {
        let total: f64 = row.values.iter().sum();
        assert!(
            (total - n as f64).abs() < 1e-3,
            "layer {}: {total}",
            row.layer
        );
    }
    assert!(h.render().contains("weight mass ·"));
    h.act(Action::Routing(RoutingCmd::Mass));
    assert_eq!(routing(&h.app).measure, Measure::Counts);

    // Export: beside the model, read back as route stats; a second export never
    // overwrites the first.
    h.act(Action::Routing(RoutingCmd::Export));
    let first = dir.path().join("demo.route-stats.json");
    let flash = h.app.flash.clone().unwrap_or_default();
    assert!(flash.contains(&first.display().to_string()), "{flash}");
    let text = std::fs::read_to_string(&first).unwrap();
    let stats = RouteStats::from_json(&text).unwrap();
    assert_eq!(stats.tokens, n as u64);
    assert_eq!(stats.model, Some(path.display().to_string()));
    let mut want = expected.stats(0..expected.len);
    want.model = stats.model.clone();
    assert_eq!(stats.layers.len(), want.layers.len());
    for (a, b) in stats.layers.iter().zip(&want.layers) {
        assert_eq!(a.counts, b.counts);
        assert_eq!(a.counts.iter().sum::<u64>(), (n * a.top_k) as u64);
    }
    h.act(Action::Routing(RoutingCmd::Export));
    let second = dir.path().join("demo.route-stats-2.json");
    assert!(second.is_file(), "{:?}", h.app.flash);
    assert_eq!(std::fs::read_to_string(&first).unwrap(), text);
    let flash = h.app.flash.clone().unwrap_or_default();
    assert!(flash.contains("demo.route-stats-2.json"), "{flash}");
    assert!(h.render().contains("written to"));
}

#[test]
fn a_new_prompt_cuts_the_log_and_a_reset_empties_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = demo(dir.path());
    let mut h = ready(&path);
    let mut conv = reference(&path, &chat(&h.app).settings);

    send(&mut h, "What is two plus two?");
    wait_idle(&mut h);
    conv.push_user("What is two plus two?");
    conv.reply().unwrap().run(&mut |_| {}).unwrap();

    // Edited: the log keeps the common prefix, then the new tail comes.
    h.act(Action::Chat(ChatCmd::EditLast));
    for _ in 0.."two plus two?".chars().count() {
        h.act(Action::Erase);
    }
    send(&mut h, "nine?");
    wait_idle(&mut h);
    conv.edit_last_user("What is nine?").unwrap();
    conv.reply().unwrap().run(&mut |_| {}).unwrap();
    assert_eq!(chat(&h.app).messages[0].text, "What is nine?");
    assert_same_log(
        routing(&h.app),
        conv.session().tokens(),
        conv.session().routes().unwrap(),
    );
    assert_ne!(routing(&h.app).log().len, 0);

    // Regenerate: the same prompt again, the same greedy answer.
    h.act(Action::Chat(ChatCmd::Regenerate));
    wait_idle(&mut h);
    conv.regenerate().unwrap().run(&mut |_| {}).unwrap();
    assert_same_log(
        routing(&h.app),
        conv.session().tokens(),
        conv.session().routes().unwrap(),
    );

    // The cursor on an early token survives; a reset empties the mirror.
    h.act(Action::GoTab(6)).act(Action::Home);
    assert_eq!(routing(&h.app).cursor(), Some(0));
    h.act(Action::GoTab(5)).act(Action::Chat(ChatCmd::Clear));
    h.pump_chat("the reset's routes", |a| routing(a).log().len == 0);
    assert!(routing(&h.app).tokens().is_empty());
    assert!(routing(&h.app)
        .layer_rows()
        .iter()
        .all(|r| r.values.iter().all(|&v| v == 0.0)));
    h.act(Action::GoTab(6));
    assert_eq!(routing(&h.app).cursor(), None);
    let screen = h.render();
    assert!(
        screen.contains("Ask something in the Chat view"),
        "{screen}"
    );
    // Nothing to export yet: said so, nothing written.
    h.act(Action::Routing(RoutingCmd::Export));
    assert!(h
        .app
        .flash
        .as_deref()
        .unwrap_or("")
        .contains("no routes yet"));
    assert!(!dir.path().join("demo.route-stats.json").exists());
}

#[test]
fn a_dense_model_gets_a_notice_and_tab_7_starts_the_chat_worker() {
    let mut h = Harness::fixture("qwen3-q8.cmf");
    // Key 7 opens the view; the chat worker starts with it.
    let seven = crossterm::event::KeyEvent::new(
        crossterm::event::KeyCode::Char('7'),
        crossterm::event::KeyModifiers::NONE,
    );
    let a = h.app.keymap.action_for(&seven).unwrap();
    assert_eq!(a, Action::GoTab(6));
    h.act(a);
    h.pump_chat("the model to load", |a| routing(a).phase != Phase::Loading);
    assert_eq!(routing(&h.app).phase, Phase::NoMoe);
    let screen = h.render();
    assert!(screen.contains("no Mixture-of-Experts layers"), "{screen}");
    assert!(
        screen.contains("no MoE layers"),
        "the status line says so:\n{screen}"
    );
    h.act(Action::Routing(RoutingCmd::Export));
    assert!(h.app.flash.as_deref().unwrap_or("").contains("no routes"));
    // The keys of the view are in the help (tall enough to show its last section).
    h.height = 90;
    h.act(Action::Help);
    let help = h.render();
    assert!(
        help.contains("Routing") && help.contains("route stats JSON"),
        "{help}"
    );
}
