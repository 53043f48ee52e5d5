//! The interactive loop: terminal set-up and restore (also on panic, SIGTERM and SIGHUP),
//! logging to a file,
//! keys and mouse → Actions, worker reports → Actions, draw after each batch. Frame times
//! (draw, and key to frame) are summed up in the log at exit, idle frames apart from
//! frames drawn while an answer streams.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use signal_hook::consts::{SIGHUP, SIGTERM};

use crossterm::event::{
    self, DisableBracketedPaste, DisableMouseCapture, EnableBracketedPaste, EnableMouseCapture,
    Event, KeyCode, KeyEventKind, MouseEventKind,
};
use crossterm::execute;

use super::config;
use super::jobs::Jobs;
use super::{body_of, view, Action, App};

/// Where logs go: never to the screen.
pub fn log_path() -> PathBuf {
    if let Some(p) = std::env::var_os("CORTIQ_LOG") {
        return PathBuf::from(p);
    }
    dirs::cache_dir()
        .unwrap_or_else(std::env::temp_dir)
        .join("cortiq")
        .join("cortiq.log")
}

fn init_logging() {
    let path = log_path();
    if let Some(dir) = path.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    if let Ok(f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
    {
        let _ =
            simplelog::WriteLogger::init(log::LevelFilter::Info, simplelog::Config::default(), f);
    }
}

/// Translates a terminal event.
pub fn action_of_event(app: &App, ev: &Event) -> Option<Action> {
    match ev {
        Event::Paste(s) if app.typing() => Some(Action::Paste(s.clone())),
        Event::Key(k) if k.kind != KeyEventKind::Release => {
            if let Some(c) = app.active_chat() {
                return chat_key(app, c, k);
            }
            if app.typing() {
                return match k.code {
                    KeyCode::Char(c)
                        if !k
                            .modifiers
                            .contains(crossterm::event::KeyModifiers::CONTROL) =>
                    {
                        Some(Action::Input(c))
                    }
                    KeyCode::Backspace => Some(Action::Erase),
                    KeyCode::Enter => Some(Action::Enter),
                    KeyCode::Esc => Some(Action::Back),
                    KeyCode::Up => Some(Action::Up),
                    KeyCode::Down => Some(Action::Down),
                    _ => app.keymap.action_for(k),
                };
            }
            if k.code == KeyCode::Backspace {
                return Some(Action::Erase);
            }
            app.keymap.action_for(k)
        }
        Event::Mouse(m) => match m.kind {
            MouseEventKind::Down(_) => Some(Action::Click(m.column, m.row)),
            MouseEventKind::ScrollUp => Some(Action::ScrollUp),
            MouseEventKind::ScrollDown => Some(Action::ScrollDown),
            _ => None,
        },
        Event::Resize(w, h) => Some(Action::Resize(*w, *h)),
        _ => None,
    }
}

/// Keys in the chat view: its own commands first (they use Ctrl, Alt and F keys, so they
/// work while typing), then typing, then the global keys.
fn chat_key(
    app: &App,
    c: &super::chat::ChatState,
    k: &crossterm::event::KeyEvent,
) -> Option<Action> {
    use crossterm::event::KeyModifiers as M;
    let plain_char =
        matches!(k.code, KeyCode::Char(_)) && !k.modifiers.intersects(M::CONTROL | M::ALT);
    if !(plain_char && c.typing()) {
        if let Some(a) = app.keymap.chat_action_for(k) {
            // Enter edits inside a popup field; the chat's own Enter only in the input.
            if !matches!(a, Action::Chat(super::chat::ChatCmd::Send)) || c.focused {
                return Some(a);
            }
        }
    }
    if c.typing() {
        return match k.code {
            KeyCode::Char(ch) if !k.modifiers.contains(M::CONTROL) => Some(Action::Input(ch)),
            KeyCode::Backspace => Some(Action::Erase),
            KeyCode::Enter => Some(Action::Enter),
            KeyCode::Esc => Some(Action::Back),
            KeyCode::Left => Some(Action::Left),
            KeyCode::Right => Some(Action::Right),
            KeyCode::Up => Some(Action::Up),
            KeyCode::Down => Some(Action::Down),
            KeyCode::Home => Some(Action::Home),
            KeyCode::End => Some(Action::End),
            KeyCode::PageUp => Some(Action::PageUp),
            KeyCode::PageDown => Some(Action::PageDown),
            KeyCode::Tab if c.takes_tab() => Some(Action::NextTab),
            _ => app.keymap.action_for(k),
        };
    }
    if k.code == KeyCode::Backspace {
        return Some(Action::Erase);
    }
    app.keymap.action_for(k)
}

/// Runs the workbench on `file` (or the picker). Returns when the user quits.
pub fn run(file: Option<&Path>) -> Result<(), String> {
    run_with(file, super::StartOptions::default())
}

/// The workbench on `path`, opened on the Chat view with `suggested_prompt` in the input
/// (README's first command ends here).
pub fn run_chat_demo(path: &Path, suggested_prompt: &str) -> Result<(), String> {
    run_with(
        Some(path),
        super::StartOptions {
            tab: Some(super::Tab::Chat),
            suggested_prompt: Some(suggested_prompt.to_string()),
            ..Default::default()
        },
    )
}

/// Runs the workbench on `file`, starting as `start` says (a tab, a suggested prompt, a
/// saved session).
pub fn run_with(file: Option<&Path>, start_opts: super::StartOptions) -> Result<(), String> {
    let start = Instant::now();
    init_logging();
    let cfg = config::load()?;
    let theme = cfg.theme(config::no_color_env())?;
    let keymap = cfg.keymap()?;
    let (tx, rx) = mpsc::channel::<Action>();
    let mut app = App::new(theme, keymap, Jobs::new(tx.clone()));
    app.chat_tx = Some(tx);
    app.start = start_opts;
    if let Some(f) = file {
        app.open(f.to_path_buf());
    }
    // ratatui::init installs a panic hook that restores the terminal before the message.
    let mut terminal =
        ratatui::try_init().map_err(|e| format!("cannot start the terminal UI: {e}"))?;
    let _ = execute!(std::io::stdout(), EnableMouseCapture, EnableBracketedPaste);
    // On a panic: log it, release the mouse, then ratatui's hook restores the terminal.
    let restore = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        log::error!("panic: {info}");
        let _ = execute!(
            std::io::stdout(),
            DisableMouseCapture,
            DisableBracketedPaste
        );
        restore(info);
    }));
    // SIGTERM and SIGHUP (a closed terminal window, `kill`) end the loop like `q` does,
    // so the terminal is restored; the signal is raised again after that, so whoever sent
    // it sees the process end by it.
    let signalled = Arc::new(AtomicUsize::new(0));
    for sig in [SIGTERM, SIGHUP] {
        if let Err(e) = signal_hook::flag::register_usize(sig, Arc::clone(&signalled), sig as usize)
        {
            log::warn!("cannot watch signal {sig}: {e}");
        }
    }
    watch_for_a_stuck_loop();
    let tty_in = cfg!(unix) && stdin_is_terminal();
    let mut frames = FrameStats::default();
    let result = (|| -> Result<(), String> {
        let mut first = true;
        // An event was just read: crossterm may hold more from the same read.
        let mut drain = false;
        // When the last key arrived that no frame has shown yet (for the frame-time log).
        let mut key_at: Option<Instant> = None;
        loop {
            let t_draw = Instant::now();
            terminal
                .draw(|f| {
                    app.body = body_of(f.area());
                    view(&app, f);
                })
                .map_err(|e| e.to_string())?;
            let draw_ms = t_draw.elapsed().as_secs_f64() * 1e3;
            let key_ms = key_at.take().map(|t| t.elapsed().as_secs_f64() * 1e3);
            frames.record(app.answer_streaming(), draw_ms, key_ms);
            if let Some(k) = key_ms {
                log::info!("frame: key to frame {k:.1} ms (draw {draw_ms:.1} ms)");
            }
            if let Some(text) = app.take_clipboard() {
                // OSC 52: the terminal (also over ssh, and tmux with set-clipboard) copies.
                let _ = execute!(
                    std::io::stdout(),
                    crossterm::clipboard::CopyToClipboard::to_clipboard_from(text)
                );
            }
            if first {
                log::info!(
                    "first frame after {:.1} ms",
                    start.elapsed().as_secs_f64() * 1e3
                );
                first = false;
                // Lets the end-to-end test check that a panic restores the terminal.
                if std::env::var_os("CORTIQ_PANIC_AFTER_FIRST_FRAME").is_some() {
                    panic!("panic requested by CORTIQ_PANIC_AFTER_FIRST_FRAME");
                }
            }
            if app.quit {
                return Ok(());
            }
            // Wait for input or a worker's report, whichever comes first.
            let mut acted = false;
            while !acted {
                if signalled.load(Ordering::Relaxed) != 0 {
                    return Ok(());
                }
                // On a terminal, wait in our own poll of it and ask crossterm only without
                // waiting (see `terminal_hung_up`); right after an event, not at all, so
                // that events crossterm read at once come without delay.
                let wait = Duration::from_millis(if drain { 0 } else { 30 });
                if tty_in && terminal_hung_up(wait) {
                    log::info!("the terminal hung up");
                    signalled.store(SIGHUP as usize, Ordering::Relaxed);
                    return Ok(());
                }
                let timeout = if tty_in { Duration::ZERO } else { wait };
                drain = false;
                if event::poll(timeout).map_err(|e| e.to_string())? {
                    let ev = event::read().map_err(|e| e.to_string())?;
                    if matches!(ev, Event::Key(_)) {
                        key_at.get_or_insert_with(Instant::now);
                    }
                    if let Some(a) = action_of_event(&app, &ev) {
                        app.update(a);
                    }
                    acted = true;
                    drain = true;
                }
                while let Ok(a) = rx.try_recv() {
                    app.update(a);
                    acted = true;
                }
            }
        }
    })();
    app.jobs.cancel_all();
    log::info!("{}", frames.summary());
    let _ = execute!(
        std::io::stdout(),
        DisableMouseCapture,
        DisableBracketedPaste
    );
    // Not `ratatui::restore`, which prints a failure to stderr: on a hung-up terminal that
    // print failed too, and panicked.
    if let Err(e) = ratatui::try_restore() {
        log::warn!("cannot restore the terminal: {e}");
    }
    let sig = signalled.load(Ordering::Relaxed);
    if sig != 0 {
        log::info!("ended by signal {sig}");
        // Flush the log before the default action ends the process.
        log::logger().flush();
        if let Err(e) = signal_hook::low_level::emulate_default_handler(sig as i32) {
            log::warn!("cannot raise signal {sig} again: {e}");
        }
    }
    result
}

/// Whether standard input is a terminal (crossterm then reads it; otherwise it opens
/// `/dev/tty`, and the loop waits in crossterm's poll as before).
fn stdin_is_terminal() -> bool {
    use std::io::IsTerminal;
    std::io::stdin().is_terminal()
}

/// Waits up to `wait` for input on the terminal (standard input); whether it hung up (its
/// window closed, the link dropped). crossterm 0.29 reads a hung-up terminal in an endless
/// loop (a read of 0 bytes is not the end to it), inside `event::poll`, where neither a
/// signal nor the time limit ends it: the workbench stayed at full CPU after its window
/// closed. So the loop polls the terminal itself and calls crossterm only when it is
/// still there.
#[cfg(unix)]
fn terminal_hung_up(wait: Duration) -> bool {
    let mut fds = [libc::pollfd {
        fd: 0,
        events: libc::POLLIN,
        revents: 0,
    }];
    let ms = wait.as_millis().min(i32::MAX as u128) as i32;
    // SAFETY: one valid `pollfd`, for the call's duration.
    let n = unsafe { libc::poll(fds.as_mut_ptr(), 1, ms) };
    n > 0 && fds[0].revents & (libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0
}

/// Elsewhere the loop waits in crossterm's poll (`tty_in` is false).
#[cfg(not(unix))]
fn terminal_hung_up(_: Duration) -> bool {
    false
}

/// After SIGTERM or SIGHUP, gives the terminal loop a few seconds to end (it restores the
/// terminal, then raises the signal again); if it has not, ends the process by the signal
/// from here. A backstop for a loop stuck where it cannot see the signal (as in a read of
/// a hung-up terminal by a crossterm of another version). The thread blocks until a
/// signal comes.
fn watch_for_a_stuck_loop() {
    let mut signals = match signal_hook::iterator::Signals::new([SIGTERM, SIGHUP]) {
        Ok(s) => s,
        Err(e) => return log::warn!("cannot watch for a stuck loop: {e}"),
    };
    let spawned = std::thread::Builder::new()
        .name("cortiq-signal-watch".into())
        .spawn(move || {
            if let Some(sig) = signals.forever().next() {
                std::thread::sleep(Duration::from_secs(3));
                log::warn!("the terminal loop did not end 3 s after signal {sig}; ending here");
                log::logger().flush();
                let _ = signal_hook::low_level::emulate_default_handler(sig);
                std::process::exit(128 + sig);
            }
        });
    if let Err(e) = spawned {
        log::warn!("cannot start the signal watch: {e}");
    }
}

/// Frame times of one run, for the log: the time to draw each frame and, for frames that
/// answer a key, the time from the key to the frame on screen; frames drawn while an
/// answer streams (worker reports arrive between keys) apart from idle ones.
#[derive(Default)]
struct FrameStats {
    /// `[idle, while an answer streams]`.
    groups: [FrameGroup; 2],
}

#[derive(Default)]
struct FrameGroup {
    frames: u64,
    draw_ms: Samples,
    key_ms: Samples,
}

/// The last [`Samples::CAP`] values, so that a session left open for days keeps a
/// bounded log buffer.
#[derive(Default)]
struct Samples {
    values: Vec<f32>,
    next: usize,
}

impl Samples {
    const CAP: usize = 1 << 16;

    fn push(&mut self, v: f64) {
        if self.values.len() < Self::CAP {
            self.values.push(v as f32);
        } else {
            self.values[self.next] = v as f32;
            self.next = (self.next + 1) % Self::CAP;
        }
    }

    /// `median m, p99 p, max x ms` (nearest-rank quantiles), or `none`.
    fn describe(&self) -> String {
        if self.values.is_empty() {
            return "none".into();
        }
        let mut v = self.values.clone();
        v.sort_by(f32::total_cmp);
        let q = |p: f64| v[((p * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1];
        format!(
            "median {:.2}, p99 {:.2}, max {:.2} ms",
            q(0.5),
            q(0.99),
            v[v.len() - 1]
        )
    }
}

impl FrameStats {
    fn record(&mut self, streaming: bool, draw_ms: f64, key_ms: Option<f64>) {
        let g = &mut self.groups[streaming as usize];
        g.frames += 1;
        g.draw_ms.push(draw_ms);
        if let Some(k) = key_ms {
            g.key_ms.push(k);
        }
    }

    fn summary(&self) -> String {
        let [idle, busy] = &self.groups;
        let part = |name: &str, g: &FrameGroup| {
            format!(
                "{name}: {} frames, draw {}, key to frame ({} keys) {}",
                g.frames,
                g.draw_ms.describe(),
                g.key_ms.values.len(),
                g.key_ms.describe()
            )
        };
        format!(
            "frame times · {} · {}",
            part("idle", idle),
            part("while an answer streamed", busy)
        )
    }
}

#[cfg(test)]
mod frame_stats_tests {
    use super::*;

    #[test]
    fn the_summary_splits_idle_and_streaming_frames_and_ranks_quantiles() {
        let mut s = FrameStats::default();
        for i in 1..=100 {
            s.record(false, i as f64, (i % 2 == 0).then_some(i as f64 + 0.5));
        }
        s.record(true, 7.0, Some(9.0));
        let text = s.summary();
        assert_eq!(
            text,
            "frame times · idle: 100 frames, draw median 50.00, p99 99.00, max 100.00 ms, \
             key to frame (50 keys) median 50.50, p99 100.50, max 100.50 ms · \
             while an answer streamed: 1 frames, draw median 7.00, p99 7.00, max 7.00 ms, \
             key to frame (1 keys) median 9.00, p99 9.00, max 9.00 ms"
        );
        assert!(FrameStats::default()
            .summary()
            .contains("0 frames, draw none"));
    }

    #[test]
    fn samples_keep_the_last_cap_values() {
        let mut s = Samples::default();
        for i in 0..Samples::CAP + 10 {
            s.push(i as f64);
        }
        assert_eq!(s.values.len(), Samples::CAP);
        assert!(s
            .describe()
            .ends_with(&format!("max {}.00 ms", Samples::CAP + 9)));
        assert!(!s.values.contains(&0.0) && s.values.contains(&10.0));
    }
}
