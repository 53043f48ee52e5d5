//! Test harness: a headless app driven by Actions, rendered into ratatui's TestBackend.
//! Worker reports are pumped from the channel explicitly, so tests are deterministic.

use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

use cortiq_views::Theme;
use ratatui::backend::TestBackend;
use ratatui::Terminal;

use super::chat::ChatState;
use super::jobs::Jobs;
use super::keymap::Keymap;
use super::{body_of, view, Action, App, Screen};

/// `../shared/fixtures/cmf/<name>`; fails the test naming the path when missing.
pub fn fixture(name: &str) -> PathBuf {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../shared/fixtures/cmf")
        .join(name);
    assert!(
        p.is_file(),
        "fixture missing: {} (the tests need ../shared/fixtures)",
        p.display()
    );
    p
}

/// qwen3_moe-masked.cmf written as a shard set `dir/moe-0000k-of-0000n.cmf` (§10: at most
/// 500 kB of rough f32 size each: three shards); the paths in shard order.
pub fn sharded_fixture(dir: &Path) -> Vec<PathBuf> {
    use cortiq_engine::format::{writer, CmfFile};
    let src = CmfFile::open(fixture("qwen3_moe-masked.cmf")).expect("the fixture opens");
    let spec = writer::spec_of(&src);
    let shards = writer::write_sharded(&dir.join("moe.cmf"), spec, 500_000, |i| {
        Ok(std::borrow::Cow::Borrowed(
            src.tensor_bytes(&src.directory.entries[i]),
        ))
    })
    .expect("write the shards");
    shards.into_iter().map(|s| s.path).collect()
}

/// The chat view's state (started).
pub fn chat(app: &App) -> &ChatState {
    match &app.screen {
        Screen::Model(m) => m.chat.as_ref().expect("the chat view started"),
        _ => panic!("no model open"),
    }
}

pub fn chat_mut(app: &mut App) -> &mut ChatState {
    match &mut app.screen {
        Screen::Model(m) => m.chat.as_mut().expect("the chat view started"),
        _ => panic!("no model open"),
    }
}

pub struct Harness {
    pub app: App,
    pub rx: Receiver<Action>,
    pub width: u16,
    pub height: u16,
}

impl Harness {
    /// An app on `path` with the plain theme (snapshots carry no colours) at 120×36.
    pub fn open(path: &Path) -> Harness {
        Harness::open_with(path, super::StartOptions::default())
    }

    /// [`Harness::open`] starting as `start` says; the chat runs the engine.
    pub fn open_with(path: &Path, start: super::StartOptions) -> Harness {
        let (tx, rx) = mpsc::channel();
        let mut app = App::new(Theme::plain(), Keymap::default_map(), Jobs::new(tx.clone()));
        app.chat_tx = Some(tx);
        app.start = start;
        app.open(path.to_path_buf());
        let mut h = Harness {
            app,
            rx,
            width: 120,
            height: 36,
        };
        h.render(); // sets the body area, as the real loop does before the first key
        h
    }

    pub fn fixture(name: &str) -> Harness {
        Harness::open(&fixture(name))
    }

    pub fn act(&mut self, a: Action) -> &mut Harness {
        self.app.update(a);
        self
    }

    pub fn acts(&mut self, actions: impl IntoIterator<Item = Action>) -> &mut Harness {
        for a in actions {
            self.app.update(a);
        }
        self
    }

    /// Types a string as `Action::Input`s.
    pub fn type_text(&mut self, s: &str) -> &mut Harness {
        for c in s.chars() {
            self.app.update(Action::Input(c));
        }
        self
    }

    /// Feeds worker reports until `done(app)` holds, like [`Harness::pump_until`], with a
    /// longer limit for model loads on a busy machine.
    pub fn pump_chat(&mut self, what: &str, done: impl Fn(&App) -> bool) -> &mut Harness {
        self.pump_within(what, Duration::from_secs(120), done)
    }

    /// Feeds worker reports to the app until `done(app)` holds; panics after 20 s.
    pub fn pump_until(&mut self, what: &str, done: impl Fn(&App) -> bool) -> &mut Harness {
        self.pump_within(what, Duration::from_secs(20), done)
    }

    fn pump_within(
        &mut self,
        what: &str,
        limit: Duration,
        done: impl Fn(&App) -> bool,
    ) -> &mut Harness {
        let start = Instant::now();
        while !done(&self.app) {
            match self.rx.recv_timeout(Duration::from_millis(50)) {
                Ok(a) => self.app.update(a),
                Err(_) => assert!(start.elapsed() < limit, "timed out waiting for {what}"),
            }
        }
        self
    }

    /// The screen as text, one line per terminal row (trailing spaces trimmed).
    pub fn render(&mut self) -> String {
        let mut term =
            Terminal::new(TestBackend::new(self.width, self.height)).expect("test terminal");
        let frame = term
            .draw(|f| {
                self.app.body = body_of(f.area());
                view(&self.app, f);
            })
            .expect("draw");
        let buf = frame.buffer;
        let mut out = String::new();
        for y in 0..buf.area.height {
            let mut line = String::new();
            for x in 0..buf.area.width {
                line.push_str(buf[(x, y)].symbol());
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

/// `qwen3-skills.cmf` (skill `sql` with a routing subspace; 4 layers, FFN width 128, 4
/// heads) with a masks section added, written to `dir/skills-masked.cmf`: task `half`
/// (every odd FFN neuron dead, quality not measured) and a task whose name carries
/// control characters (head 0 off in every layer, quality measured).
pub fn skills_masked_fixture(dir: &Path) -> PathBuf {
    use cortiq_engine::format::masks::{build_section, MaskRecord};
    use cortiq_engine::format::{writer, CmfFile};
    let src = CmfFile::open(fixture("qwen3-skills.cmf")).expect("the fixture opens");
    let (layers, inter, heads) = (4usize, 128usize, 4usize);
    let bits = |n: usize, on: &dyn Fn(usize) -> bool| {
        let mut b = vec![0u8; n.div_ceil(8)];
        for i in (0..n).filter(|&i| on(i)) {
            b[i / 8] |= 1 << (i % 8);
        }
        b
    };
    let blob = |ffn: &dyn Fn(usize) -> bool, head: &dyn Fn(usize) -> bool| {
        let mut out = Vec::new();
        for _ in 0..layers {
            out.extend(bits(inter, ffn));
        }
        for _ in 0..layers {
            out.extend(bits(heads, head));
        }
        out.extend(bits(layers, &|_| true));
        out
    };
    let section = build_section(
        None,
        vec![
            MaskRecord {
                task_id: 1,
                name: "half".into(),
                ..MaskRecord::default()
            },
            MaskRecord {
                task_id: 2,
                name: HOSTILE_TASK.into(),
                quality: Some(serde_json::json!({"metric": "ppl", "ratio": 1.01})),
                ..MaskRecord::default()
            },
        ],
        &[
            blob(&|j| j % 2 == 0, &|_| true),
            blob(&|_| true, &|h| h != 0),
        ],
    );
    let mut spec = writer::spec_of(&src);
    spec.masks = Some(section);
    let out = dir.join("skills-masked.cmf");
    let payloads: Vec<&[u8]> = src.directory.iter().map(|e| src.tensor_bytes(e)).collect();
    writer::write_file(&out, spec, payloads).expect("write the masked copy");
    out
}

/// The second task of [`skills_masked_fixture`]: a name no terminal should get raw.
pub const HOSTILE_TASK: &str = "evil\u{1b}[31m\nname";
