//! The interactive loop: terminal set-up and restore (also on panic), logging to a file,
//! keys and mouse → Actions, worker reports → Actions, draw after each batch.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crossterm::event::{
    self, DisableMouseCapture, EnableMouseCapture, Event, KeyCode, KeyEventKind, MouseEventKind,
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
        Event::Key(k) if k.kind != KeyEventKind::Release => {
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

/// Runs the workbench on `file` (or the picker). Returns when the user quits.
pub fn run(file: Option<&Path>) -> Result<(), String> {
    let start = Instant::now();
    init_logging();
    let cfg = config::load()?;
    let theme = cfg.theme(config::no_color_env())?;
    let keymap = cfg.keymap()?;
    let (tx, rx) = mpsc::channel::<Action>();
    let mut app = App::new(theme, keymap, Jobs::new(tx));
    if let Some(f) = file {
        app.open(f.to_path_buf());
    }
    // ratatui::init installs a panic hook that restores the terminal before the message.
    let mut terminal =
        ratatui::try_init().map_err(|e| format!("cannot start the terminal UI: {e}"))?;
    let _ = execute!(std::io::stdout(), EnableMouseCapture);
    // On a panic: log it, release the mouse, then ratatui's hook restores the terminal.
    let restore = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        log::error!("panic: {info}");
        let _ = execute!(std::io::stdout(), DisableMouseCapture);
        restore(info);
    }));
    let result = (|| -> Result<(), String> {
        let mut first = true;
        loop {
            terminal
                .draw(|f| {
                    app.body = body_of(f.area());
                    view(&app, f);
                })
                .map_err(|e| e.to_string())?;
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
                if event::poll(Duration::from_millis(30)).map_err(|e| e.to_string())? {
                    let ev = event::read().map_err(|e| e.to_string())?;
                    if let Some(a) = action_of_event(&app, &ev) {
                        app.update(a);
                    }
                    acted = true;
                }
                while let Ok(a) = rx.try_recv() {
                    app.update(a);
                    acted = true;
                }
            }
        }
    })();
    app.jobs.cancel_all();
    let _ = execute!(std::io::stdout(), DisableMouseCapture);
    ratatui::restore();
    result
}
