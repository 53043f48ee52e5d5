//! The workbench as state + Action + update (the Elm pattern). Everything the user or a
//! worker does arrives as an [`Action`]; [`App::update`] changes the state; [`view`]
//! renders the state through the pure widgets of `cortiq-views`. Background work runs on
//! threads (`jobs`) and reports back as Actions over a channel, so nothing blocks the UI.
//! `src/app` never does arithmetic on weights: workers call the engine for that.

pub mod chat;
#[cfg(test)]
mod chat_tests;
pub mod chat_worker;
pub mod choice;
#[cfg(test)]
mod choice_tests;
pub mod compare;
pub mod config;
pub mod integrity;
pub mod jobs;
pub mod keymap;
pub mod masks;
pub mod overview;
pub mod picker;
pub mod routing;
#[cfg(test)]
mod routing_tests;
pub mod skills;
pub mod tensors;
pub mod terminal;
#[cfg(test)]
pub mod testing;
#[cfg(test)]
mod tests;
pub mod view;

use std::path::PathBuf;
use std::sync::Arc;

use cortiq_engine::format::{CmfFile, CmfModel};
use cortiq_views::chrome::{self, ChromeVm, ErrorVm, HelpVm, PickerVm};
use cortiq_views::Theme;
use ratatui::layout::Rect;
use ratatui::Frame;

use self::jobs::{JobReport, Jobs};
use self::keymap::Keymap;

/// The views, in tab order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tab {
    Overview,
    Tensors,
    Masks,
    Skills,
    Integrity,
    Chat,
    Routing,
}

impl Tab {
    pub const ALL: [Tab; 7] = [
        Tab::Overview,
        Tab::Tensors,
        Tab::Masks,
        Tab::Skills,
        Tab::Integrity,
        Tab::Chat,
        Tab::Routing,
    ];
    pub fn title(self) -> &'static str {
        match self {
            Tab::Overview => "Overview",
            Tab::Tensors => "Tensors",
            Tab::Masks => "Masks",
            Tab::Skills => "Skills",
            Tab::Integrity => "Integrity",
            Tab::Chat => "Chat",
            Tab::Routing => "Routing",
        }
    }
    fn index(self) -> usize {
        Tab::ALL.iter().position(|&t| t == self).unwrap_or(0)
    }
}

/// Everything that can happen. Keys are translated into these by the keymap; workers send
/// [`Action::Job`]; tests drive the app with them directly.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    Quit,
    Help,
    NextTab,
    PrevTab,
    GoTab(usize),
    Up,
    Down,
    PageUp,
    PageDown,
    Home,
    End,
    Left,
    Right,
    Enter,
    /// Esc: close a popup, leave a mode, cancel a filter.
    Back,
    /// Start typing a filter (`/`).
    Filter,
    /// A character typed while a text field has focus.
    Input(char),
    /// Backspace while a text field has focus.
    Erase,
    /// Sort by the next column (`s`), or reverse the order (`S`).
    SortNext,
    SortReverse,
    /// Group rows by layer (`g`).
    Group,
    /// Switch what a view shows (`f`: field of a heat map, detail mode, ...).
    Cycle,
    /// Show the chat template (`t`).
    Template,
    /// Start a verify run (`v`), cancel running work (`c`).
    Verify,
    Cancel,
    /// Open the file picker (`o`).
    OpenPicker,
    /// Mouse: a click at terminal cell (column, row); wheel.
    Click(u16, u16),
    ScrollUp,
    ScrollDown,
    /// A bracketed paste.
    Paste(String),
    /// A command of the chat view.
    Chat(chat::ChatCmd),
    /// A command of the routing view.
    Routing(routing::RoutingCmd),
    Resize(u16, u16),
    /// A worker's report.
    Job(JobReport),
}

/// What the workbench shows: a file, why a file did not open, or the picker.
pub enum Screen {
    Model(Box<ModelScreen>),
    Error {
        path: String,
        kind: String,
        message: String,
    },
    Picker(picker::Picker),
}

/// An open model and the state of each view.
pub struct ModelScreen {
    /// Shard 1 of a sharded model (§10), or the file: what lives there (header, masks,
    /// vocab, skills) is read from it.
    pub file: Arc<CmfFile>,
    /// Every shard, with the merged directory (a single file is a set of one).
    pub model: Arc<CmfModel>,
    pub tab: Tab,
    pub overview: overview::OverviewState,
    /// Built on the first visit: indexing 10⁵ names should not delay the first frame.
    pub tensors: Option<tensors::TensorsState>,
    pub masks: masks::MasksState,
    pub skills: skills::SkillsState,
    pub integrity: integrity::IntegrityState,
    /// Started on the first visit of the Chat tab (or at once when the workbench opens
    /// on it): loading a model costs nothing until someone wants to chat.
    pub chat: Option<chat::ChatState>,
    /// Mirrors the chat's route log (MoE models) from the chat worker's reports.
    pub routing: routing::RoutingState,
}

impl ModelScreen {
    /// The state of `tab`; `None` while it has not been built (it is on first visit).
    pub fn view(&self, tab: Tab) -> Option<&dyn view::View> {
        Some(match tab {
            Tab::Overview => &self.overview,
            Tab::Tensors => self.tensors.as_ref()?,
            Tab::Masks => &self.masks,
            Tab::Skills => &self.skills,
            Tab::Integrity => &self.integrity,
            Tab::Chat => self.chat.as_ref()?,
            Tab::Routing => &self.routing,
        })
    }

    pub fn view_mut(&mut self, tab: Tab) -> Option<&mut dyn view::View> {
        Some(match tab {
            Tab::Overview => &mut self.overview,
            Tab::Tensors => self.tensors.as_mut()?,
            Tab::Masks => &mut self.masks,
            Tab::Skills => &mut self.skills,
            Tab::Integrity => &mut self.integrity,
            Tab::Chat => self.chat.as_mut()?,
            Tab::Routing => &mut self.routing,
        })
    }
}

/// How the workbench starts on a file.
#[derive(Clone, Debug, Default)]
pub struct StartOptions {
    pub tab: Option<Tab>,
    /// Shown in the chat input while it is empty.
    pub suggested_prompt: Option<String>,
    /// A saved session to continue (and replay) in the chat.
    pub session: Option<cortiq_engine::chat::conversation::SavedSession>,
    pub precision: cortiq_engine::model::Precision,
    /// Tests pause the chat worker's steps with it (see `chat_worker::Gate`).
    pub chat_gate: Option<chat_worker::Gate>,
}

pub struct App {
    pub screen: Screen,
    pub help: bool,
    pub quit: bool,
    pub theme: Theme,
    pub keymap: Keymap,
    pub jobs: Jobs,
    /// The body area of the last frame (for mouse hit-testing and page sizes).
    pub body: Rect,
    /// One-line message for the status bar (errors of actions, hints).
    pub flash: Option<String>,
    /// Where chat workers report (the loop's channel); `None` runs no engine.
    pub chat_tx: Option<std::sync::mpsc::Sender<Action>>,
    pub start: StartOptions,
}

/// What every view's `update` may use besides its own state.
pub struct Ctx<'a> {
    pub file: &'a Arc<CmfFile>,
    pub jobs: &'a mut Jobs,
    /// Rows visible in the body (for page up/down).
    pub page: usize,
    pub body: Rect,
    pub flash: &'a mut Option<String>,
}

impl App {
    pub fn new(theme: Theme, keymap: Keymap, jobs: Jobs) -> App {
        App {
            screen: Screen::Picker(picker::Picker::new(
                std::env::current_dir().unwrap_or_default(),
            )),
            help: false,
            quit: false,
            theme,
            keymap,
            jobs,
            body: Rect::new(0, 0, 80, 22),
            flash: None,
            chat_tx: None,
            start: StartOptions::default(),
        }
    }

    /// The chat view's state, started on first use.
    fn ensure_chat(
        m: &mut ModelScreen,
        tx: &Option<std::sync::mpsc::Sender<Action>>,
        start: &mut StartOptions,
    ) {
        if m.chat.is_some() {
            return;
        }
        let path = m.file.path.clone().unwrap_or_default();
        let mut c =
            chat::ChatState::new(path, start.precision, tx.clone(), start.chat_gate.clone());
        if let Some(p) = &start.suggested_prompt {
            c.suggested = p.clone();
        }
        c.choices = choice::Choices::of(&m.file);
        if let Some(s) = start.session.take() {
            c.load_session(s, true);
        }
        m.chat = Some(c);
    }

    /// Opens `path`: the model, or the error view naming why it did not open.
    pub fn open(&mut self, path: PathBuf) {
        self.jobs.cancel_all();
        log::info!("open {}", path.display());
        let t0 = std::time::Instant::now();
        let ms = |t: std::time::Instant| t.elapsed().as_secs_f64() * 1e3;
        // Any shard's name opens the whole set; a missing or inconsistent sibling is an
        // error of the set, shown as such.
        self.screen = match CmfModel::open(&path) {
            Ok(m) => {
                let model = Arc::new(m);
                let file = Arc::clone(&model.shards[0]);
                let t_open = ms(t0);
                let t = std::time::Instant::now();
                let overview = overview::OverviewState::new(&model);
                let t_overview = ms(t);
                let t = std::time::Instant::now();
                let (masks, skills) = (
                    masks::MasksState::new(&file),
                    skills::SkillsState::new(&file),
                );
                let t_masks = ms(t);
                let t = std::time::Instant::now();
                let integrity = integrity::IntegrityState::new(&model);
                log::info!(
                    "opened {} tensors in {} file(s): {t_open:.1} ms, overview {t_overview:.1}, masks+skills {t_masks:.1}, integrity {:.1}",
                    model.tensor_count(),
                    model.shards.len(),
                    ms(t)
                );
                let mut screen = Box::new(ModelScreen {
                    tab: self.start.tab.unwrap_or(Tab::Overview),
                    overview,
                    tensors: None,
                    masks,
                    skills,
                    integrity,
                    chat: None,
                    routing: routing::RoutingState::new(),
                    file,
                    model,
                });
                if matches!(screen.tab, Tab::Chat | Tab::Routing) {
                    App::ensure_chat(&mut screen, &self.chat_tx, &mut self.start);
                }
                Screen::Model(screen)
            }
            Err(e) => {
                log::warn!("{}: {e}", path.display());
                Screen::Error {
                    path: path.display().to_string(),
                    kind: e.kind().to_string(),
                    message: e.message(),
                }
            }
        };
    }

    pub fn update(&mut self, action: Action) {
        // A message stays until the user does something; worker reports do not clear it.
        if !matches!(action, Action::Job(_)) {
            self.flash = None;
        }
        // Ctrl-C stops an answer being generated; it never quits then.
        if let (Action::Quit | Action::Chat(chat::ChatCmd::Stop), Screen::Model(m)) =
            (&action, &mut self.screen)
        {
            if let Some(c) = m.chat.as_mut().filter(|c| c.generating) {
                self.flash = c.update(&Action::Chat(chat::ChatCmd::Stop), 1);
                return;
            }
        }
        let action = match action {
            Action::Chat(chat::ChatCmd::Stop) => Action::Quit,
            a => a,
        };
        match &action {
            Action::Quit => {
                self.quit = true;
                return;
            }
            Action::Help => {
                self.help = !self.help;
                return;
            }
            Action::Back if self.help => {
                self.help = false;
                return;
            }
            Action::Resize(..) => return,
            Action::OpenPicker => {
                let dir = match &self.screen {
                    Screen::Model(m) => m
                        .file
                        .path
                        .as_ref()
                        .and_then(|p| p.parent().map(|d| d.to_path_buf())),
                    _ => None,
                };
                self.screen = Screen::Picker(picker::Picker::new(
                    dir.unwrap_or_else(|| std::env::current_dir().unwrap_or_default()),
                ));
                return;
            }
            _ => {}
        }
        if self.help {
            return;
        }
        let page = self.body.height.saturating_sub(3).max(1) as usize;
        match &mut self.screen {
            Screen::Picker(p) => {
                if let Some(path) = p.update(&action) {
                    self.open(path);
                }
            }
            Screen::Error { .. } => {}
            Screen::Model(m) => {
                let before = m.tab;
                match action {
                    Action::NextTab => m.tab = Tab::ALL[(m.tab.index() + 1) % Tab::ALL.len()],
                    Action::PrevTab => {
                        m.tab = Tab::ALL[(m.tab.index() + Tab::ALL.len() - 1) % Tab::ALL.len()]
                    }
                    Action::GoTab(i) if i < Tab::ALL.len() => m.tab = Tab::ALL[i],
                    Action::Click(x, 0) => {
                        if let Some(t) = tab_at(&self.keymap, m, x) {
                            m.tab = t;
                        }
                    }
                    action => {
                        let file = m.file.clone();
                        let mut ctx = Ctx {
                            file: &file,
                            jobs: &mut self.jobs,
                            page,
                            body: self.body,
                            flash: &mut self.flash,
                        };
                        // Job reports go to every view, whatever tab is shown.
                        if let Action::Job(report) = &action {
                            for t in Tab::ALL {
                                if let Some(v) = m.view_mut(t) {
                                    v.on_job(report, &mut ctx);
                                }
                            }
                            sync_views(m, &mut self.jobs);
                            return;
                        }
                        if let Some(v) = m.view_mut(m.tab) {
                            v.update(&action, &mut ctx);
                        }
                    }
                }
                if m.tab == Tab::Tensors && m.tensors.is_none() {
                    m.tensors = Some(tensors::TensorsState::new(&m.model));
                }
                // The routing view shows the chat's conversation, the Skills view routes on
                // the chat's model: they start the worker too.
                if matches!(m.tab, Tab::Chat | Tab::Routing)
                    || m.tab == Tab::Skills && m.skills.wants_engine()
                {
                    App::ensure_chat(m, &self.chat_tx, &mut self.start);
                }
                sync_views(m, &mut self.jobs);
                // Entering the chat puts the cursor in the input.
                if m.tab == Tab::Chat && before != Tab::Chat {
                    if let Some(c) = m.chat.as_mut() {
                        c.focused = true;
                    }
                }
            }
        }
    }

    /// Whether a text field has focus (keys then type instead of commanding).
    pub fn typing(&self) -> bool {
        match &self.screen {
            Screen::Model(m) => m.view(m.tab).is_some_and(|v| v.typing()),
            _ => false,
        }
    }

    /// An answer is being generated (in whichever view is shown): the frame statistics
    /// count such frames apart.
    pub fn answer_streaming(&self) -> bool {
        match &self.screen {
            Screen::Model(m) => m.chat.as_ref().is_some_and(|c| c.generating),
            _ => false,
        }
    }

    /// The chat view, when it is the one shown.
    pub fn active_chat(&self) -> Option<&chat::ChatState> {
        match &self.screen {
            Screen::Model(m) if m.tab == Tab::Chat => m.chat.as_ref(),
            _ => None,
        }
    }

    /// Text the chat asked to copy, for the terminal (OSC 52).
    pub fn take_clipboard(&mut self) -> Option<String> {
        match &mut self.screen {
            Screen::Model(m) => m.chat.as_mut().and_then(|c| c.clipboard.take()),
            _ => None,
        }
    }
}

/// What one view shows of another's state: the Skills view's E is for the chat's last
/// question (computed while the Skills view is shown).
fn sync_views(m: &mut ModelScreen, jobs: &mut Jobs) {
    m.skills
        .set_chat_prompt(m.chat.as_ref().and_then(|c| c.last_user_text()));
    if m.tab == Tab::Skills {
        m.skills.refresh(jobs);
    }
}

/// The new offset of a scrolled popup or panel for a movement action (`None` for any
/// other action): one line, a page, or either end, kept within `0..=max`.
pub fn scrolled(a: &Action, pos: u16, page: u16, max: u16) -> Option<u16> {
    let next = match a {
        Action::Up | Action::ScrollUp => pos.saturating_sub(1),
        Action::Down | Action::ScrollDown => pos.saturating_add(1),
        Action::PageUp => pos.saturating_sub(page),
        Action::PageDown => pos.saturating_add(page),
        Action::Home => 0,
        Action::End => max,
        _ => return None,
    };
    Some(next.min(max))
}

/// The tab whose title covers column `x` of the top line (as `render_chrome` lays it out).
fn tab_at(_keymap: &Keymap, m: &ModelScreen, x: u16) -> Option<Tab> {
    let title = file_title(&m.file);
    let mut col = format!(" cortiq │ {title} ").chars().count() as u16;
    for t in Tab::ALL {
        let w = format!(" {} {} ", t.index() + 1, t.title()).chars().count() as u16;
        if x >= col && x < col + w {
            return Some(t);
        }
        col += w + 1;
    }
    None
}

fn file_title(file: &CmfFile) -> String {
    file.path
        .as_ref()
        .and_then(|p| p.file_name())
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "(in memory)".into())
}

/// Renders the whole screen: a pure function of the app state.
pub fn view(app: &App, f: &mut Frame) {
    let area = f.area();
    let titles: Vec<&str> = Tab::ALL.iter().map(|t| t.title()).collect();
    match &app.screen {
        Screen::Picker(p) => {
            let entries = p.entries();
            chrome::render_picker(
                f,
                area,
                &PickerVm {
                    dir: &p.dir.display().to_string(),
                    entries: &entries,
                    selected: p.selected,
                    message: p.message.as_deref(),
                },
                &app.theme,
            );
        }
        Screen::Error {
            path,
            kind,
            message,
        } => {
            chrome::render_error(
                f,
                area,
                &ErrorVm {
                    path,
                    kind,
                    message,
                },
                &app.theme,
            );
        }
        Screen::Model(m) => {
            let (status, hint) = m.view(m.tab).map(|v| v.status(&m.file)).unwrap_or_default();
            let title = file_title(&m.file);
            let chrome = ChromeVm {
                title: &title,
                tabs: &titles,
                active: m.tab.index(),
                status: app.flash.clone().unwrap_or(status),
                hint: format!("{hint} · ? help · q quit"),
                job: Tab::ALL
                    .iter()
                    .find_map(|&t| m.view(t).and_then(|v| v.job_progress())),
            };
            let body = chrome::render_chrome(f, area, &chrome, &app.theme);
            match m.view(m.tab) {
                Some(v) => v.render(f, body, &m.file, &app.theme),
                // Built on the first visit, right after this frame.
                None => f.render_widget(ratatui::widgets::Paragraph::new(" indexing…"), body),
            }
        }
    }
    if app.help {
        chrome::render_help(
            f,
            area,
            &HelpVm {
                sections: app.keymap.help_sections(),
            },
            &app.theme,
        );
    }
}

/// The body area for a terminal of `area` (the chrome takes the top and bottom lines).
pub fn body_of(area: Rect) -> Rect {
    Rect::new(
        area.x,
        area.y + 1,
        area.width,
        area.height.saturating_sub(2),
    )
}
