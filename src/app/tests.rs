//! App-level tests: the chrome, tabs, help, the error view, the picker, and the Overview.

use super::testing::{fixture, Harness};
use super::{Action, Screen, Tab};

fn tab(h: &Harness) -> Tab {
    match &h.app.screen {
        Screen::Model(m) => m.tab,
        _ => panic!("no model open"),
    }
}

#[test]
fn tabs_cycle_by_key_digit_and_mouse() {
    let mut h = Harness::fixture("qwen3_moe-masked.cmf");
    assert_eq!(tab(&h), Tab::Overview);
    h.act(Action::NextTab);
    assert_eq!(tab(&h), Tab::Tensors);
    h.act(Action::PrevTab).act(Action::PrevTab);
    assert_eq!(tab(&h), Tab::Routing);
    h.act(Action::PrevTab);
    assert_eq!(tab(&h), Tab::Chat);
    h.act(Action::PrevTab);
    assert_eq!(tab(&h), Tab::Integrity);
    h.act(Action::GoTab(2));
    assert_eq!(tab(&h), Tab::Masks);
    // Click on the title of tab 4 in the top line.
    let screen = h.render();
    let top = screen.lines().next().unwrap();
    let col = top.find("4 Skills").expect("tab titles on the top line");
    let x = top[..col].chars().count() as u16;
    h.act(Action::Click(x, 0));
    assert_eq!(tab(&h), Tab::Skills);
    h.act(Action::Quit);
    assert!(h.app.quit);
}

#[test]
fn overview_snapshot_and_tree_navigation() {
    let mut h = Harness::fixture("qwen3_moe-masked.cmf");
    insta::assert_snapshot!("overview_moe_masked", h.render());
    // Expand tokenizer_config, then collapse arch with Left from its child.
    let screen = h.render();
    assert!(screen.contains("▾ arch"), "{screen}");
    assert!(
        screen.contains("num_experts") || screen.contains("moe"),
        "{screen}"
    );
    h.acts([Action::Down, Action::Down, Action::Down]); // format, version, arch, arch.arch_name
    h.act(Action::Left); // to arch
    h.act(Action::Left); // collapse arch
    let screen = h.render();
    assert!(screen.contains("▸ arch"), "{screen}");
    h.act(Action::Template);
    let screen = h.render();
    assert!(screen.contains("chat template"), "{screen}");
    assert!(screen.contains("<|im_start|>"), "{screen}");
    h.act(Action::Back);
    assert!(!h.render().contains("chat template —"));
}

#[test]
fn help_is_generated_from_the_keymap() {
    let mut h = Harness::fixture("qwen3-q4.cmf");
    h.act(Action::Help);
    let screen = h.render();
    assert!(screen.contains("help"), "{screen}");
    assert!(
        screen.contains("q Ctrl-c") && screen.contains("quit"),
        "{screen}"
    );
    assert!(screen.contains("run verify"), "{screen}");
    h.act(Action::Back);
    assert!(!h.app.help);
}

#[test]
fn a_corrupt_file_opens_to_an_error_view() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("bad\u{1b}[31mname.cmf");
    let mut b = std::fs::read(fixture("qwen3-q4.cmf")).unwrap();
    b[0x30] = 1; // data_off no longer a multiple of 4096
    std::fs::write(&p, b).unwrap();
    let mut h = Harness::open(&p);
    let screen = h.render();
    assert!(screen.contains("Bounds"), "{screen}");
    assert!(screen.contains("Cannot open"), "{screen}");
    assert!(
        !screen.contains('\u{1b}'),
        "control characters from names are escaped"
    );
    assert!(screen.contains("\\u{1b}"), "{screen}");
    h.act(Action::Quit);
    assert!(h.app.quit);
}

#[test]
fn the_picker_lists_cmf_files_and_opens_one() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(fixture("qwen3-q4.cmf"), dir.path().join("a.cmf")).unwrap();
    std::fs::write(dir.path().join("notes.txt"), "x").unwrap();
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    let mut h = Harness::fixture("qwen3-q4.cmf");
    h.app.screen = Screen::Picker(super::picker::Picker::new(dir.path().to_path_buf()));
    let screen = h.render();
    assert!(
        screen.contains("a.cmf") && screen.contains("sub/") && !screen.contains("notes.txt"),
        "{screen}"
    );
    h.act(Action::Enter);
    assert_eq!(tab(&h), Tab::Overview);
}

#[test]
fn overview_of_a_file_with_every_dtype_folds_what_does_not_fit() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("demo.cmf");
    cortiq_engine::synth::write_demo(&p).unwrap();
    let mut h = Harness::open(&p);
    h.height = 34;
    let screen = h.render();
    insta::assert_snapshot!("overview_demo_short_terminal", screen);
    assert!(screen.contains("more"), "{screen}");
    assert!(screen.contains("total      141"), "{screen}");
    h.height = 50;
    let tall = h.render();
    assert!(
        tall.contains("q1t") && tall.contains("vbit_ro") && !tall.contains("+1 more"),
        "{tall}"
    );
}

#[test]
fn overview_of_a_sharded_model_lists_the_shards_and_totals_the_set() {
    let dir = tempfile::tempdir().unwrap();
    let paths = super::testing::sharded_fixture(dir.path());
    assert_eq!(paths.len(), 3);
    // The last shard's name opens the set, shown by shard 1's name.
    let mut h = Harness::open(&paths[2]);
    let screen = h.render();
    insta::assert_snapshot!("overview_sharded", screen);
    assert!(screen.contains("moe-00001-of-00003.cmf"), "{screen}");
    let m = match &h.app.screen {
        Screen::Model(m) => m.model.clone(),
        _ => panic!("no model open: {screen}"),
    };
    assert_eq!(m.shards.len(), 3);
    for (k, f) in m.shards.iter().enumerate() {
        let name = format!("moe-{:05}-of-00003.cmf", k + 1);
        let row = screen
            .lines()
            .find(|l| l.contains(&name) && l.contains(&format!("{}/3", k + 1)))
            .unwrap_or_else(|| panic!("{name} listed\n{screen}"));
        assert!(row.contains(&format!(" {} ", f.directory.len())), "{row}");
    }
    // Totals over the merged set equal the unsharded file's.
    let single = Harness::fixture("qwen3_moe-masked.cmf").render();
    let line = |s: &str, key: &str| {
        s.lines()
            .find(|l| l.contains(key))
            .map(|l| l.split('│').nth(2).unwrap_or("").trim().to_string())
    };
    for key in ["tensors        ", "total   "] {
        assert_eq!(line(&screen, key), line(&single, key), "{key}\n{screen}");
    }
    assert!(screen.contains("one model in 3 files"), "{screen}");
    assert!(screen.contains("135 tensors ·"), "{screen}");
    // Masks and the chat bundle are shard 1's.
    assert!(screen.contains("template"), "{screen}");
}

#[test]
fn a_shard_set_with_a_missing_sibling_opens_to_an_error_view() {
    let dir = tempfile::tempdir().unwrap();
    let paths = super::testing::sharded_fixture(dir.path());
    std::fs::remove_file(&paths[2]).unwrap();
    let mut h = Harness::open(&paths[1]);
    let screen = h.render();
    assert!(matches!(h.app.screen, Screen::Error { .. }), "{screen}");
    assert!(screen.contains("Cannot open"), "{screen}");
    assert!(screen.contains("missing shard"), "{screen}");
}
