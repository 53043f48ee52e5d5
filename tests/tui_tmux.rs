//! End-to-end: the workbench in a real terminal. tmux runs `cortiq` on a fixture, keys are
//! sent with send-keys and the screen is read with capture-pane: every view is visited,
//! tensors are filtered, a histogram opened, verify run to green, a corrupted copy opened
//! to its error view, a MoE chat's routes shown in the routing view (with a task switch
//! in the chat first), and quitting leaves the terminal (the tmux pane) cleanly.

mod common;
use common::tmux::Session;

use std::path::PathBuf;

fn fixture(name: &str) -> PathBuf {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../shared/fixtures/cmf")
        .join(name);
    assert!(p.is_file(), "fixture missing: {}", p.display());
    p
}

#[test]
fn the_workbench_in_a_real_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("moe.cmf");
    std::fs::copy(fixture("qwen3_moe-masked.cmf"), &model).unwrap();
    let log = dir.path().join("cortiq.log");
    let s = Session::start("cortiq-e2e", &model, &log);

    // 1 Overview
    s.wait_for(&["1 Overview", "5 Integrity", "arch_name", "qwen3_moe"]);
    // 2 Tensors: filter, then details with the histogram.
    s.keys(&["2"]);
    s.wait_for(&["lm_head.weight", "model.embed_tokens.weight"]);
    s.keys(&["/"]);
    s.literal("lm_head");
    s.keys(&["Enter"]);
    let screen = s.wait_for(&["lm_head.weight"]);
    assert!(
        !screen.contains("model.embed_tokens.weight"),
        "the filter keeps only lm_head:\n{screen}"
    );
    s.keys(&["Enter"]);
    s.wait_for(&["std", "histogram"]);
    // 3 Masks, 4 Skills
    s.keys(&["3"]);
    s.wait_for(&["code"]);
    s.keys(&["4"]);
    s.wait_for(&["4 Skills", "no skills"]);
    // 5 Integrity: verify to green.
    s.keys(&["5", "v"]);
    s.wait_for(&["OK"]);
    // Help, then quit cleanly.
    s.keys(&["?"]);
    s.wait_for(&["help", "run verify"]);
    s.keys(&["Escape", "q"]);
    let after = s.wait_exit();
    assert!(after.contains("EXITED 0"), "{after}");
    assert!(
        !after.contains("5 Integrity"),
        "the alternate screen is left on quit:\n{after}"
    );
    let log_text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        log_text.contains("first frame after"),
        "the log records the first frame:\n{log_text}"
    );

    // A corrupted copy opens to a readable error view naming the §1.2 error.
    let bad = dir.path().join("bad.cmf");
    let mut b = std::fs::read(fixture("qwen3-q4.cmf")).unwrap();
    b[0] = b'X';
    std::fs::write(&bad, b).unwrap();
    let s = Session::start("cortiq-e2e-bad", &bad, &log);
    s.wait_for(&["Cannot open", "InvalidMagic"]);
    s.keys(&["q"]);
    assert!(s.wait_exit().contains("EXITED 0"));
}

#[test]
fn the_routing_view_shows_a_moe_chats_experts() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("demo.cmf");
    // The synthetic demo: qwen3_moe, 8 experts (top-2) on layers 1, 3 and 5.
    cortiq_engine::synth::write_demo(&model).unwrap();
    let log = dir.path().join("cortiq.log");
    // Not a prefix of another test's session name: tmux matches targets by prefix.
    let s = Session::start("cortiq-routing-e2e", &model, &log);
    s.wait_for(&["1 Overview", "7 Routing"]);
    s.keys(&["6"]);
    s.wait_for_within(&["ctx 0/"], std::time::Duration::from_secs(60));
    for cmd in ["/set greedy on", "/set max-tokens 8", "Hello"] {
        s.literal(cmd);
        s.keys(&["Enter"]);
    }
    s.wait_for_within(
        &["tok/s", "token limit"],
        std::time::Duration::from_secs(60),
    );
    // A task switch between answers: one the engine refuses says why, one it takes
    // marks the transcript (re-prefill, the default policy).
    s.literal("/task code");
    s.keys(&["Enter"]);
    s.wait_for(&["cannot switch", "mixture of experts"]);
    s.literal("/task general");
    s.keys(&["Enter"]);
    s.wait_for(&[
        "── task general · re-prefilled",
        "task general · switch re-prefills",
    ]);
    // Esc leaves the input, so 7 switches views instead of typing.
    s.keys(&["Escape", "7"]);
    let screen = s.wait_for(&[
        "experts per layer",
        "× top-2 of 8",
        "first expert at layer 1",
    ]);
    assert!(
        screen.contains("▶ 1") && screen.contains("  3") && screen.contains("  5"),
        "a heat-map row per MoE layer:\n{screen}"
    );
    assert!(
        ['░', '▒', '▓', '█'].iter().any(|g| screen.contains(*g)),
        "the heat map shades the experts chosen:\n{screen}"
    );
    s.keys(&["m", "Down"]);
    s.wait_for(&["weight mass ·", "first expert at layer 3"]);
    s.keys(&["q"]);
    assert!(s.wait_exit().contains("EXITED 0"));
}

#[test]
fn a_panic_restores_the_terminal_and_is_logged() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("cortiq.log");
    let s = Session::start_with(
        "cortiq-e2e-panic",
        &fixture("qwen3-q4.cmf"),
        &log,
        "CORTIQ_PANIC_AFTER_FIRST_FRAME=1",
    );
    let after = s.wait_exit();
    assert!(
        after.contains("panic requested"),
        "the panic message is shown after the terminal is restored:\n{after}"
    );
    assert!(
        !after.contains("1 Overview"),
        "the alternate screen was left:\n{after}"
    );
    assert!(
        !after.contains("EXITED 0"),
        "a panic is not a success:\n{after}"
    );
    let log_text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        log_text.contains("panic"),
        "the panic is logged:\n{log_text}"
    );
}

/// SIGTERM and SIGHUP end the workbench with the terminal restored (no alternate screen
/// left, the mouse released) and the process ended by the signal (128 + its number).
#[test]
fn sigterm_and_sighup_restore_the_terminal() {
    for (sig, status) in [("TERM", "EXITED 143"), ("HUP", "EXITED 129")] {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("cortiq.log");
        let s = Session::start(
            &format!("cortiq-signal-{sig}"),
            &fixture("qwen3-q4.cmf"),
            &log,
        );
        s.wait_for(&["1 Overview"]);
        s.signal(sig);
        let after = s.wait_exit();
        assert!(after.contains(status), "SIG{sig}:\n{after}");
        assert!(
            !after.contains("1 Overview"),
            "SIG{sig}: the alternate screen was left:\n{after}"
        );
        let log_text = std::fs::read_to_string(&log).unwrap_or_default();
        assert!(
            log_text.contains("ended by signal"),
            "SIG{sig}: the log says why:\n{log_text}"
        );
    }
}

/// Closing the terminal (its window, here the tmux session) while an answer streams ends
/// the workbench within seconds. crossterm 0.29 reads a hung-up terminal in an endless
/// loop; the workbench stayed behind at full CPU.
#[test]
fn closing_the_terminal_ends_the_workbench() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("cortiq.log");
    let s = Session::start("cortiq-hangup", &fixture("qwen3-q4.cmf"), &log);
    s.wait_for(&["1 Overview"]);
    s.keys(&["6"]);
    s.wait_for(&["message"]);
    s.literal("Tell me a long story.");
    s.keys(&["Enter"]);
    let pid = s.program_pid();
    s.close_terminal();
    let start = std::time::Instant::now();
    // Gone, or a zombie nobody reaps (the pane's shell ended with the terminal).
    let running = || {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|st| {
                let state = st.rsplit(')').next().unwrap_or("").trim_start();
                !state.starts_with('Z')
            })
            .unwrap_or(false)
    };
    while running() {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(10),
            "cortiq ({pid}) still runs 10 s after its terminal closed; its log:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}
