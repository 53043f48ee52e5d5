//! State of the Chat view (6): the transcript as the UI shows it, the input with its
//! history, the settings, the popups (sampling, settings, prompt and token inspectors),
//! and the handle on the chat worker that owns the model. Rendering is a pure function
//! of this state through `cortiq_views::chat`; the only memo is the Markdown lines of
//! each message per width.
//!
//! Task masks and skills: F6 picks the task, F7 the skill (`none`, an id, `auto`,
//! `blend` with its temperature), F8 what a switch does to the cache (keep it: fast,
//! approximate; re-prefill: exact), and `/task`, `/skill`, `/switch` do the same in the
//! input. A pick goes to the worker at once; the worker runs one command at a time, so a
//! pick made while an answer streams applies after that answer (the status says so).
//! Each switch puts a divider in the transcript; each answer names the choice it ran
//! under. F9 opens compare mode (`super::compare`).

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::mpsc::Sender;

use cortiq_engine::chat::conversation::{Message, Role, SavedSession, Settings};
use cortiq_engine::model::Precision;
use cortiq_engine::runtime::choice::{Request, SkillRequest};
use cortiq_engine::runtime::session::{GenerationStats, StopReason, SwitchPolicy};
use cortiq_views::chat::{
    self as widget, AltTokenVm, BodyVm, ChatState as Phase, ChatVm, DividerVm, EditVm, InputVm,
    MessageVm, NoticeVm, PopupVm, PromptTokenVm, PromptVm, SamplerParams, SamplingRowVm,
    SamplingVm, SettingsField, SettingsVm, StatusVm, TokenInspectorVm, TokenVm,
};
use cortiq_views::choice::{CompareRowVm, CompareSideVm, CompareVm, PickRowVm, PickerVm};
use cortiq_views::markdown::{self, MdOptions};
use cortiq_views::util::esc;
use cortiq_views::Theme;
use ratatui::layout::Rect;
use ratatui::text::Line;
use ratatui::Frame;

use super::chat_worker::{
    ActiveInfo, ChatCommand, ChatReport, ChatWorker, SharedEngine, TokenReport,
};
use super::choice::{self, Choices};
use super::compare::{self, CompareJob, CompareReport, CompareState, Divergence};
use super::Action;

/// Chat commands (keys of the keymap's Chat section).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChatCmd {
    Send,
    Newline,
    Focus,
    Stop,
    Regenerate,
    EditLast,
    Clear,
    Sampling,
    Settings,
    PromptInspector,
    TokenInspector,
    CopyReply,
    CopyCode,
    Thinking,
    Save,
    Override,
    /// The task picker (F6).
    TaskPicker,
    /// The skill picker (F7).
    SkillPicker,
    /// Keep the cache or re-prefill at a switch (F8).
    Policy,
    /// Compare mode (F9).
    Compare,
}

/// Background work the chat asks of the app's jobs (it has no handle on them itself).
#[derive(Clone, Debug)]
pub enum JobRequest {
    Compare(Box<CompareJob>),
    CancelCompare,
}

/// One message as shown.
#[derive(Clone, Debug, Default)]
pub struct ChatMsg {
    pub role: Option<Role>,
    pub text: String,
    pub ids: Vec<u32>,
    /// Per generated token (this session's answers; loaded ones have none).
    pub tokens: Vec<TokenReport>,
    pub streaming: bool,
    pub stopped: bool,
    pub error: Option<String>,
    pub meta: Option<String>,
    /// The task/skill label an answer was generated under (`None`: the backbone).
    pub choice: Option<String>,
}

/// Where the model stands.
#[derive(Clone, Debug, PartialEq)]
pub enum Availability {
    Loading {
        done: u64,
        total: u64,
    },
    Ready,
    Unavailable {
        title: String,
        message: String,
        bad: bool,
        can_override: bool,
    },
}

#[derive(Clone, Debug, PartialEq)]
enum Popup {
    Sampling {
        row: usize,
        edit: Option<(String, usize)>,
        note: Option<String>,
    },
    Settings {
        field: SettingsField,
        editing: Option<usize>,
        note: Option<String>,
    },
    Prompt {
        scroll: usize,
        ids: bool,
    },
    Token {
        index: usize,
    },
    Task {
        row: usize,
    },
    Skill {
        row: usize,
    },
    Compare(Box<CompareState>),
}

/// A single-line-or-more text field with a cursor (char index).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Field {
    pub text: String,
    pub cursor: usize,
}

impl Field {
    fn byte(&self, char_idx: usize) -> usize {
        self.text
            .char_indices()
            .nth(char_idx)
            .map_or(self.text.len(), |(b, _)| b)
    }
    pub fn insert(&mut self, s: &str) {
        let at = self.byte(self.cursor);
        self.text.insert_str(at, s);
        self.cursor += s.chars().count();
    }
    pub fn erase(&mut self) {
        if self.cursor > 0 {
            let at = self.byte(self.cursor - 1);
            self.text.remove(at);
            self.cursor -= 1;
        }
    }
    fn set(&mut self, s: &str) {
        self.text = s.to_string();
        self.cursor = s.chars().count();
    }
    fn edit(&mut self, a: &Action) -> bool {
        match a {
            Action::Input(c) => self.insert(&c.to_string()),
            Action::Paste(s) => self.insert(&s.replace("\r\n", "\n").replace('\r', "\n")),
            Action::Erase => self.erase(),
            Action::Left => self.cursor = self.cursor.saturating_sub(1),
            Action::Right => self.cursor = (self.cursor + 1).min(self.text.chars().count()),
            Action::Home => self.cursor = 0,
            Action::End => self.cursor = self.text.chars().count(),
            _ => return false,
        }
        true
    }
}

/// Memoized Markdown lines of one message.
#[derive(Default)]
struct Rendered {
    key: (u16, usize, bool),
    lines: Vec<Line<'static>>,
}

pub struct ChatState {
    worker: Option<ChatWorker>,
    pub availability: Availability,
    pub messages: Vec<ChatMsg>,
    pub input: Field,
    pub focused: bool,
    history: Vec<String>,
    history_pos: Option<usize>,
    pub settings: Settings,
    pub generating: bool,
    prefill: Option<(usize, usize)>,
    /// The request whose reports count; older ones are dropped.
    job: u64,
    pub last_stats: Option<GenerationStats>,
    pub precision: Precision,
    capacity: usize,
    pub scroll: usize,
    popup: Option<Popup>,
    pub prob_mode: bool,
    expand_thinking: bool,
    /// The input holds the last question being edited: Enter resends it.
    editing_last: bool,
    prompt_tokens: Vec<(String, u32, bool)>,
    settings_text: (Field, Field),
    code_block: usize,
    /// Text for the terminal to copy (OSC 52); taken by the loop.
    pub clipboard: Option<String>,
    pub suggested: String,
    /// The saved session to compare with after a load (for the replay verdict).
    pub replay: Option<String>,
    model_path: PathBuf,
    cache: RefCell<Vec<Rendered>>,
    tick: usize,
    /// The file's tasks and skills (set when the view starts).
    pub choices: Choices,
    /// What the worker holds: the task and skill asked for (from its reports).
    pub request: Request,
    /// What a switch does to the cached positions (the user's choice).
    pub policy: SwitchPolicy,
    /// What the forwards run under (from the worker's reports).
    pub active: ActiveInfo,
    /// Switch markers: before which message, and the divider's text.
    pub dividers: Vec<(usize, String)>,
    /// Warnings already shown (each once).
    warned: BTreeSet<String>,
    /// The blend temperature of the skill picker.
    pub blend_t: f32,
    /// The worker's model, for compare runs.
    engine: Option<SharedEngine>,
    /// Id of the last `Choose` sent (the worker's reports carry it back); `Some` while
    /// it has not been answered.
    choosing: Option<u64>,
    choose_seq: u64,
    job_requests: Vec<JobRequest>,
    compare_runs: u64,
}

fn sampler_of(s: &Settings) -> SamplerParams {
    SamplerParams {
        greedy: s.sampling.is_greedy(),
        temperature: s.sampling.temperature,
        top_k: s.sampling.top_k,
        top_p: s.sampling.top_p,
        min_p: s.sampling.min_p,
        repeat_penalty: s.sampling.repetition_penalty,
        seed: Some(s.sampling.seed),
    }
}

const SAMPLING_ROWS: [&str; 8] = [
    "temperature",
    "top-k",
    "top-p",
    "min-p",
    "repeat penalty",
    "seed",
    "max tokens",
    "greedy",
];

impl ChatState {
    /// The view for `path`; the worker starts at once (`tx` takes its reports) unless
    /// `tx` is `None` (a view without an engine, for tests of the layout).
    pub fn new(
        path: PathBuf,
        precision: Precision,
        tx: Option<Sender<Action>>,
        gate: Option<super::chat_worker::Gate>,
    ) -> ChatState {
        let mut settings = Settings::default();
        settings.sampling.seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64 % 1_000_000);
        ChatState {
            worker: tx.map(|tx| ChatWorker::spawn(path.clone(), precision, tx, gate)),
            availability: Availability::Loading { done: 0, total: 0 },
            messages: Vec::new(),
            input: Field::default(),
            focused: true,
            history: Vec::new(),
            history_pos: None,
            settings,
            generating: false,
            prefill: None,
            job: 0,
            last_stats: None,
            precision,
            capacity: 0,
            scroll: 0,
            popup: None,
            prob_mode: false,
            expand_thinking: false,
            editing_last: false,
            prompt_tokens: Vec::new(),
            settings_text: (Field::default(), Field::default()),
            code_block: 0,
            clipboard: None,
            suggested: String::new(),
            replay: None,
            model_path: path,
            cache: RefCell::new(Vec::new()),
            tick: 0,
            choices: Choices::default(),
            request: Request::default(),
            policy: SwitchPolicy::Reprefill,
            active: ActiveInfo::default(),
            dividers: Vec::new(),
            warned: BTreeSet::new(),
            blend_t: choice::BLEND_T,
            engine: None,
            choosing: None,
            choose_seq: 0,
            job_requests: Vec::new(),
            compare_runs: 0,
        }
    }

    /// The background work asked for since the last call (the app's jobs run it).
    pub fn take_job_requests(&mut self) -> Vec<JobRequest> {
        std::mem::take(&mut self.job_requests)
    }

    /// The text of the last user message, if any.
    pub fn last_user_text(&self) -> Option<&str> {
        self.messages
            .iter()
            .rev()
            .find(|m| m.role == Some(Role::User))
            .map(|m| m.text.as_str())
    }

    /// Asks the worker to run under `request` from now on (after a running answer).
    fn choose(&mut self, request: Request) -> Option<String> {
        self.choose_seq += 1;
        self.choosing = Some(self.choose_seq);
        self.send(ChatCommand::Choose {
            job: self.choose_seq,
            request: request.clone(),
            policy: self.policy,
        });
        let what = choice::request_text(&request);
        Some(if self.generating {
            format!("{what}: applies after this answer")
        } else if request.skill.needs_prompt() {
            format!("{what}: the skill is chosen on each message")
        } else {
            format!("switching to {what}…")
        })
    }

    /// Flips what a switch does to the cache; the worker takes it with the next choice.
    fn toggle_policy(&mut self) -> Option<String> {
        self.policy = choice::other_policy(self.policy);
        // The worker's per-message choices (auto, blend) use it too.
        if self.request.skill.needs_prompt() {
            self.choose_seq += 1;
            self.send(ChatCommand::Choose {
                job: self.choose_seq,
                request: self.request.clone(),
                policy: self.policy,
            });
        }
        Some(format!(
            "at a switch: {} (from the next switch)",
            choice::policy_text(self.policy)
        ))
    }

    /// A compare run's report.
    pub fn on_compare(&mut self, r: &CompareReport) -> Option<String> {
        let Some(Popup::Compare(c)) = &mut self.popup else {
            return None;
        };
        c.on_report(r);
        match &r.step {
            compare::CompareStep::Started { warnings, .. } => self.warn_once(warnings),
            _ => None,
        }
    }

    /// Compare mode, when it is open.
    pub fn compare(&self) -> Option<&CompareState> {
        match &self.popup {
            Some(Popup::Compare(c)) => Some(c),
            _ => None,
        }
    }

    /// Whether a compare run is in progress.
    pub fn comparing(&self) -> bool {
        self.compare().is_some_and(|c| c.running)
    }

    /// The warnings not shown before, joined (each is shown once).
    fn warn_once(&mut self, warnings: &[String]) -> Option<String> {
        let new: Vec<String> = warnings
            .iter()
            .filter(|w| self.warned.insert((*w).clone()))
            .map(|w| esc(w))
            .collect();
        (!new.is_empty()).then(|| format!("warning: {}", new.join("; ")))
    }

    fn send(&self, c: ChatCommand) {
        if let Some(w) = &self.worker {
            w.send(c);
        }
    }

    fn next_job(&mut self) -> u64 {
        self.job += 1;
        self.job
    }

    pub fn ready(&self) -> bool {
        self.availability == Availability::Ready
    }

    /// Whether keys should type into a field.
    pub fn typing(&self) -> bool {
        match &self.popup {
            Some(Popup::Sampling { edit, .. }) => edit.is_some(),
            Some(Popup::Settings { editing, .. }) => editing.is_some(),
            Some(_) => false,
            None => self.focused && self.ready(),
        }
    }

    /// A saved session to continue (`cortiq FILE --session S.json`), with a replay of its
    /// answers when `replay`.
    pub fn load_session(&mut self, saved: SavedSession, replay: bool) {
        self.settings = saved.settings();
        let job = self.next_job();
        self.generating = replay;
        if replay {
            self.replay = Some("replaying the saved answers…".into());
        }
        self.send(ChatCommand::Load {
            job,
            session: Box::new(saved),
            replay,
        });
    }

    /// A worker's report.
    pub fn on_report(&mut self, r: &ChatReport) -> Option<String> {
        // Stale reports (of a request since replaced) are dropped here, in one place.
        if r.job().is_some_and(|j| j != self.job) {
            return None;
        }
        match r {
            ChatReport::Verifying { done, total } => {
                self.availability = Availability::Loading {
                    done: *done,
                    total: *total,
                }
            }
            ChatReport::Ready {
                precision: _,
                capacity,
                warnings,
            } => {
                self.availability = Availability::Ready;
                self.capacity = *capacity;
                self.send(ChatCommand::Settings(self.settings.clone()));
                if !warnings.is_empty() {
                    return Some(format!("model: {}", warnings.join("; ")));
                }
            }
            ChatReport::Unavailable {
                title,
                message,
                bad,
                can_override,
            } => {
                self.availability = Availability::Unavailable {
                    title: title.clone(),
                    message: message.clone(),
                    bad: *bad,
                    can_override: *can_override,
                }
            }
            ChatReport::Prefill { done, total, .. } => self.prefill = Some((*done, *total)),
            ChatReport::Token { token, .. } => {
                self.prefill = None;
                if let Some(m) = self.messages.last_mut().filter(|m| m.streaming) {
                    m.text.push_str(&token.piece);
                    m.ids.push(token.id);
                    m.tokens.push(token.clone());
                }
            }
            ChatReport::Done {
                text,
                ids,
                stats,
                choice,
                ..
            } => {
                self.generating = false;
                self.prefill = None;
                if let Some(m) = self.messages.last_mut().filter(|m| m.streaming) {
                    m.streaming = false;
                    m.text = text.clone();
                    m.ids = ids.clone();
                    m.choice = choice.clone();
                    m.stopped = stats.stop == StopReason::Cancelled;
                    m.meta = Some(format!(
                        "{} tokens · {:.1} tok/s · {}",
                        stats.generated_tokens,
                        stats.decode_tok_s,
                        stop_word(stats.stop)
                    ));
                }
                log::info!(
                    "answer: {} prompt tokens ({} reused) at {:.1} tok/s, {} generated at {:.1} tok/s, ttft {:.0} ms, stop {:?}",
                    stats.prompt_tokens,
                    stats.reused_tokens,
                    stats.prefill_tok_s,
                    stats.generated_tokens,
                    stats.decode_tok_s,
                    stats.ttft_s * 1e3,
                    stats.stop
                );
                self.last_stats = Some(stats.clone());
            }
            ChatReport::Failed { message, .. } => {
                self.generating = false;
                // A failed replay has no verdict to wait for.
                self.replay = None;
                self.prefill = None;
                match self.messages.last_mut().filter(|m| m.streaming) {
                    Some(m) => {
                        m.streaming = false;
                        m.error = Some(message.clone());
                    }
                    None => return Some(message.clone()),
                }
            }
            ChatReport::Prompt { tokens, .. } => self.prompt_tokens = tokens.clone(),
            ChatReport::Messages { messages, .. } => {
                self.messages = messages.iter().map(msg_of).collect();
                self.dividers.clear();
                self.cache.borrow_mut().clear();
                if self.replay.is_none() {
                    self.generating = false;
                }
            }
            ChatReport::Replayed { same, differ, .. } => {
                self.generating = false;
                let verdict = if *differ == 0 {
                    format!("replay: all {same} answers reproduced the saved tokens")
                } else {
                    format!(
                        "replay: {differ} of {} answers differ from the saved tokens",
                        same + differ
                    )
                };
                self.replay = Some(verdict.clone());
                return Some(verdict);
            }
            ChatReport::Note(n) => return Some(n.clone()),
            // The routing view's (7).
            ChatReport::RouteLayout { .. } | ChatReport::Routes { .. } => {}
            ChatReport::Engine(e) => self.engine = Some(e.clone()),
            ChatReport::Choice(c) => {
                let super::chat_worker::ChoiceReport {
                    job,
                    request,
                    policy,
                    active,
                    switch,
                    warnings,
                    blend_bytes,
                    ..
                } = &**c;
                if self.choosing.is_some_and(|c| c <= *job) {
                    self.choosing = None;
                }
                self.request = request.clone();
                self.policy = *policy;
                self.active = active.clone();
                let mut notes = Vec::new();
                if let Some(r) = switch {
                    // Before the answer it was made for (a per-message choice), or after
                    // the last message.
                    let before = match self.messages.last() {
                        Some(m) if m.streaming => self.messages.len() - 1,
                        _ => self.messages.len(),
                    };
                    self.dividers.push((before, choice::divider_text(r)));
                    notes.push(format!("now {}", esc(&r.to)));
                }
                if *blend_bytes > 0 {
                    notes.push(format!(
                        "the blend holds {} of weights",
                        cortiq_views::util::human_bytes(*blend_bytes as u64)
                    ));
                }
                if let Some(w) = self.warn_once(warnings) {
                    notes.push(w);
                }
                if !notes.is_empty() {
                    return Some(notes.join(" · "));
                }
            }
            ChatReport::ChoiceRefused { job, message } => {
                if self.choosing.is_some_and(|c| c <= *job) {
                    self.choosing = None;
                }
                return Some(format!("cannot switch: {}", esc(message)));
            }
        }
        None
    }

    /// Handles an action; returns a message for the status bar.
    pub fn update(&mut self, a: &Action, page: usize) -> Option<String> {
        self.tick = self.tick.wrapping_add(1);
        if let Action::Chat(ChatCmd::Override) = a {
            if matches!(
                self.availability,
                Availability::Unavailable {
                    can_override: true,
                    ..
                }
            ) {
                self.availability = Availability::Loading { done: 0, total: 0 };
                self.send(ChatCommand::LoadUnverified);
                return Some("loading without the hash check (as --no-verify)".into());
            }
            return None;
        }
        if !self.ready() {
            return None;
        }
        if self.popup.is_some() {
            return self.update_popup(a, page);
        }
        match a {
            Action::Chat(c) => return self.command(*c),
            Action::Back => {
                if self.generating {
                    self.stop();
                    return Some("stopped".into());
                }
                self.focused = false;
            }
            Action::PageUp | Action::ScrollUp => {
                self.scroll += if matches!(a, Action::PageUp) {
                    page.max(1)
                } else {
                    3
                }
            }
            Action::PageDown | Action::ScrollDown => {
                self.scroll = self
                    .scroll
                    .saturating_sub(if matches!(a, Action::PageDown) {
                        page.max(1)
                    } else {
                        3
                    })
            }
            Action::Enter if !self.focused => self.focused = true,
            Action::Up
                if self.focused && self.input.text.is_empty()
                    || self.history_pos.is_some() && self.focused && matches!(a, Action::Up) =>
            {
                self.recall(true)
            }
            Action::Down if self.focused && self.history_pos.is_some() => self.recall(false),
            Action::Up if !self.focused => self.scroll += 1,
            Action::Down if !self.focused => self.scroll = self.scroll.saturating_sub(1),
            Action::Home if !self.focused => self.scroll = usize::MAX / 2,
            Action::End if !self.focused => self.scroll = 0,
            a if self.focused && self.input.edit(a) => self.history_pos = None,
            _ => {}
        }
        None
    }

    fn recall(&mut self, back: bool) {
        if self.history.is_empty() {
            return;
        }
        let n = self.history.len();
        let pos = match (self.history_pos, back) {
            (None, true) => Some(n - 1),
            (Some(0), true) => Some(0),
            (Some(p), true) => Some(p - 1),
            (Some(p), false) if p + 1 < n => Some(p + 1),
            _ => None,
        };
        self.history_pos = pos;
        match pos {
            Some(p) => {
                let t = self.history[p].clone();
                self.input.set(&t);
            }
            None => self.input.set(""),
        }
    }

    fn stop(&mut self) {
        if let Some(w) = &self.worker {
            w.stop();
        }
    }

    fn last_reply(&self) -> Option<&ChatMsg> {
        self.messages
            .iter()
            .rev()
            .find(|m| m.role == Some(Role::Assistant))
    }

    fn command(&mut self, c: ChatCmd) -> Option<String> {
        match c {
            ChatCmd::Send if !self.focused => self.focused = true,
            ChatCmd::Send => return self.submit(),
            ChatCmd::Newline if self.focused => self.input.insert("\n"),
            ChatCmd::Focus => self.focused = true,
            ChatCmd::Stop => {
                if self.generating {
                    self.stop();
                    return Some("stopped".into());
                }
            }
            ChatCmd::Regenerate => {
                if self.generating {
                    return Some("an answer is being generated: Esc stops it".into());
                }
                if self.messages.last().and_then(|m| m.role) != Some(Role::Assistant) {
                    return Some("no answer to regenerate".into());
                }
                self.messages.pop();
                self.start_reply(|job| ChatCommand::Regenerate { job });
            }
            ChatCmd::EditLast => {
                if self.generating {
                    return Some("an answer is being generated: Esc stops it".into());
                }
                let last = self
                    .messages
                    .iter()
                    .rev()
                    .find(|m| m.role == Some(Role::User))
                    .map(|m| m.text.clone());
                match last {
                    Some(t) => {
                        self.input.set(&t);
                        self.focused = true;
                        self.editing_last = true;
                        return Some(
                            "editing the last question: Enter resends it, Esc keeps the old one"
                                .into(),
                        );
                    }
                    None => return Some("no question to edit".into()),
                }
            }
            ChatCmd::Clear => {
                if self.generating {
                    self.stop();
                }
                self.messages.clear();
                self.dividers.clear();
                self.cache.borrow_mut().clear();
                self.last_stats = None;
                self.scroll = 0;
                self.editing_last = false;
                self.next_job();
                self.generating = false;
                self.send(ChatCommand::Reset);
                return Some("conversation cleared: a new session".into());
            }
            ChatCmd::Sampling => {
                self.popup = Some(Popup::Sampling {
                    row: 0,
                    edit: None,
                    note: None,
                })
            }
            ChatCmd::Settings => {
                let vars = self
                    .settings
                    .vars
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join("\n");
                self.settings_text
                    .0
                    .set(self.settings.system.as_deref().unwrap_or(""));
                self.settings_text.1.set(&vars);
                self.popup = Some(Popup::Settings {
                    field: SettingsField::SystemPrompt,
                    editing: None,
                    note: None,
                });
            }
            ChatCmd::PromptInspector => {
                let job = self.next_job();
                self.prompt_tokens.clear();
                self.send(ChatCommand::Inspect { job });
                self.popup = Some(Popup::Prompt {
                    scroll: 0,
                    ids: false,
                });
            }
            ChatCmd::TokenInspector => match self.last_reply().map(|m| m.tokens.len()) {
                Some(n) if n > 0 => {
                    self.prob_mode = true;
                    self.popup = Some(Popup::Token { index: n - 1 });
                }
                _ => return Some("no reply of this session to inspect".into()),
            },
            ChatCmd::CopyReply => match self.last_reply().map(|m| m.text.clone()) {
                Some(text) => {
                    let n = text.chars().count();
                    self.clipboard = Some(text);
                    return Some(format!("copied the reply ({n} chars)"));
                }
                None => return Some("no reply to copy".into()),
            },
            ChatCmd::CopyCode => {
                let blocks = self
                    .last_reply()
                    .map(|m| markdown::code_blocks(&m.text))
                    .unwrap_or_default();
                if blocks.is_empty() {
                    return Some("the last reply has no code block".into());
                }
                let i = self.code_block % blocks.len();
                self.code_block += 1;
                self.clipboard = Some(blocks[i].code.clone());
                return Some(format!("copied code block #{} of {}", i + 1, blocks.len()));
            }
            ChatCmd::Thinking => {
                self.expand_thinking = !self.expand_thinking;
                self.cache.borrow_mut().clear();
            }
            ChatCmd::Save => {
                let stem = self
                    .model_path
                    .file_stem()
                    .map(|s| s.to_string_lossy().into_owned())
                    .unwrap_or_else(|| "cortiq".into());
                let path = PathBuf::from(format!("{stem}.session.json"));
                self.send(ChatCommand::Save { path });
            }
            ChatCmd::TaskPicker => {
                if self.choices.tasks.is_empty() {
                    return Some("this file has no task masks (the Masks view, 3)".into());
                }
                self.popup = Some(Popup::Task {
                    row: self.choices.task_row(self.request.task.as_deref()),
                })
            }
            ChatCmd::SkillPicker => {
                if self.choices.skills.is_empty() {
                    return Some("this file has no skills (the Skills view, 4)".into());
                }
                if let SkillRequest::Blend { temperature } = self.request.skill {
                    self.blend_t = temperature;
                }
                self.popup = Some(Popup::Skill {
                    row: self.choices.skill_row(&self.request.skill),
                })
            }
            ChatCmd::Policy => return self.toggle_policy(),
            ChatCmd::Compare => return self.open_compare(),
            ChatCmd::Newline | ChatCmd::Override => {}
        }
        None
    }

    /// F9: compare mode on the input's text, or else the last question.
    fn open_compare(&mut self) -> Option<String> {
        let prompt = Some(self.input.text.trim())
            .filter(|t| !t.is_empty() && !t.starts_with('/'))
            .or(self.last_user_text())
            .or(Some(self.suggested.as_str()).filter(|s| !s.is_empty()))
            .map(str::to_string);
        let Some(prompt) = prompt else {
            return Some(
                "type a prompt first: compare answers it under two choices, side by side".into(),
            );
        };
        if self.choices.tasks.is_empty() && self.choices.skills.is_empty() {
            return Some("this file has no task masks or skills to compare".into());
        }
        self.popup = Some(Popup::Compare(Box::new(CompareState::new(
            prompt,
            &self.choices,
            &self.request,
        ))));
        None
    }

    /// Enter in compare mode: both answers, A then B, in a background job.
    fn start_compare(&mut self) -> Option<String> {
        let Some(engine) = self.engine.clone() else {
            return Some("the model is not loaded yet".into());
        };
        self.compare_runs += 1;
        let run = self.compare_runs;
        let settings = self.settings.clone();
        let choices = self.choices.clone();
        let Some(Popup::Compare(c)) = &mut self.popup else {
            return None;
        };
        c.run = run;
        c.running = true;
        c.sides = Default::default();
        let job = CompareJob {
            run,
            engine,
            requests: [c.request(&choices, 0), c.request(&choices, 1)],
            prompt: c.prompt.clone(),
            settings,
        };
        self.job_requests.push(JobRequest::Compare(Box::new(job)));
        if self.generating {
            return Some("compare waits for the chat's answer to end".into());
        }
        None
    }

    /// Enter in the input: a `/command`, an edited question, or a new one.
    fn submit(&mut self) -> Option<String> {
        // Enter on an empty input of a new chat sends the suggested prompt.
        if self.input.text.trim().is_empty()
            && self.messages.is_empty()
            && !self.suggested.is_empty()
        {
            let s = self.suggested.clone();
            self.input.set(&s);
        }
        let text = self.input.text.trim_end().to_string();
        if text.trim().is_empty() {
            return None;
        }
        if self.generating {
            return Some("an answer is being generated: Esc stops it".into());
        }
        if let Some(cmd) = text.strip_prefix('/') {
            let r = self.slash(cmd.trim());
            if r.as_ref().is_none_or(|m| !m.starts_with("unknown")) {
                self.input.set("");
            }
            return r;
        }
        self.history.push(text.clone());
        self.history_pos = None;
        self.input.set("");
        self.scroll = 0;
        if std::mem::take(&mut self.editing_last) {
            if let Some(i) = self
                .messages
                .iter()
                .rposition(|m| m.role == Some(Role::User))
            {
                self.messages.truncate(i);
            }
            self.push_user(&text);
            let t = text.clone();
            self.start_reply(move |job| ChatCommand::EditResend { job, text: t });
        } else {
            self.push_user(&text);
            let t = text.clone();
            self.start_reply(move |job| ChatCommand::Send { job, text: t });
        }
        None
    }

    fn push_user(&mut self, text: &str) {
        self.messages.push(ChatMsg {
            role: Some(Role::User),
            text: text.to_string(),
            ..Default::default()
        });
    }

    fn start_reply(&mut self, cmd: impl FnOnce(u64) -> ChatCommand) {
        let job = self.next_job();
        self.messages.push(ChatMsg {
            role: Some(Role::Assistant),
            streaming: true,
            ..Default::default()
        });
        self.generating = true;
        self.prob_mode = false;
        self.code_block = 0;
        self.scroll = 0;
        self.send(cmd(job));
    }

    /// `/system`, `/set`, `/save`, `/load`, `/reset` in the chat input, as in `cortiq run`.
    fn slash(&mut self, cmd: &str) -> Option<String> {
        let (name, arg) = cmd
            .split_once(char::is_whitespace)
            .map_or((cmd, ""), |(n, r)| (n, r.trim()));
        match name {
            "reset" | "clear" => self.command(ChatCmd::Clear),
            "system" => {
                self.settings.system = (!arg.is_empty()).then(|| arg.to_string());
                self.send(ChatCommand::Settings(self.settings.clone()));
                Some("system prompt set (from the next answer)".into())
            }
            "set" => match crate::cli::run::set_setting(&mut self.settings, arg) {
                Ok(()) => {
                    self.send(ChatCommand::Settings(self.settings.clone()));
                    Some(crate::cli::run::settings_line(&self.settings))
                }
                Err(e) => Some(format!("/set: {e}")),
            },
            "save" if !arg.is_empty() => {
                self.send(ChatCommand::Save {
                    path: PathBuf::from(arg),
                });
                None
            }
            "load" | "replay" if !arg.is_empty() => {
                match crate::cli::run::read_session(std::path::Path::new(arg)) {
                    Ok(s) => {
                        self.load_session(s, name == "replay");
                        Some(format!("loading {arg}"))
                    }
                    Err(e) => Some(e),
                }
            }
            "task" if !arg.is_empty() => self.choose(Request {
                task: (arg != "none").then(|| arg.to_string()),
                skill: self.request.skill.clone(),
            }),
            "skill" if !arg.is_empty() => match SkillRequest::parse(arg) {
                Ok(skill) => self.choose(Request {
                    task: self.request.task.clone(),
                    skill,
                }),
                Err(e) => Some(format!("/skill: {}", esc(&e))),
            },
            "switch" if !arg.is_empty() => {
                let want = match arg {
                    "keep" | "keep-cache" => SwitchPolicy::KeepCache,
                    "reprefill" | "exact" => SwitchPolicy::Reprefill,
                    _ => return Some("/switch: keep or reprefill".into()),
                };
                if want == self.policy {
                    Some(format!("at a switch: {}", choice::policy_text(want)))
                } else {
                    self.toggle_policy()
                }
            }
            _ => Some(format!(
                "unknown command /{}: /system TEXT, /set KEY VALUE, /task NAME|none, /skill ID|none|auto|blend[:T], /switch keep|reprefill, /save FILE, /load FILE, /replay FILE, /reset",
                esc(name)
            )),
        }
    }

    fn update_popup(&mut self, a: &Action, page: usize) -> Option<String> {
        let n_tokens = self.last_reply().map_or(0, |m| m.tokens.len());
        let popup = self.popup.as_mut()?;
        match popup {
            Popup::Task { row } => {
                let last = self.choices.task_rows() - 1;
                if pick_move(a, row, last) {
                    return None;
                }
                match a {
                    Action::Back | Action::Chat(ChatCmd::TaskPicker) => self.popup = None,
                    Action::Chat(ChatCmd::Policy) => return self.toggle_policy(),
                    Action::Enter | Action::Chat(ChatCmd::Send) => {
                        let task = self.choices.task_at(*row);
                        self.popup = None;
                        return self.choose(Request {
                            task,
                            skill: self.request.skill.clone(),
                        });
                    }
                    _ => {}
                }
            }
            Popup::Skill { row } => {
                let last = self.choices.skill_rows() - 1;
                if pick_move(a, row, last) {
                    return None;
                }
                match a {
                    Action::Back | Action::Chat(ChatCmd::SkillPicker) => self.popup = None,
                    Action::Left | Action::Right if *row == last => {
                        let d = if matches!(a, Action::Right) {
                            0.1
                        } else {
                            -0.1
                        };
                        self.blend_t = ((self.blend_t + d) * 20.0).round() / 20.0;
                        self.blend_t = self.blend_t.clamp(0.05, 5.0);
                    }
                    Action::Chat(ChatCmd::Policy) => return self.toggle_policy(),
                    Action::Enter | Action::Chat(ChatCmd::Send) => {
                        let skill = self.choices.skill_at(*row, self.blend_t);
                        self.popup = None;
                        return self.choose(Request {
                            task: self.request.task.clone(),
                            skill,
                        });
                    }
                    _ => {}
                }
            }
            Popup::Compare(c) => match a {
                Action::Back | Action::Chat(ChatCmd::Compare) => {
                    if c.running {
                        self.job_requests.push(JobRequest::CancelCompare);
                    }
                    self.popup = None;
                }
                Action::Cancel | Action::Chat(ChatCmd::Stop) if c.running => {
                    c.running = false;
                    self.job_requests.push(JobRequest::CancelCompare);
                    return Some("compare stopped".into());
                }
                Action::Up | Action::ScrollUp => c.row = c.row.saturating_sub(1),
                Action::Down | Action::ScrollDown => {
                    c.row = (c.row + 1).min(compare::ROWS.len() - 1)
                }
                Action::Left | Action::Right if !c.running => {
                    c.nudge(&self.choices, matches!(a, Action::Right))
                }
                Action::Enter | Action::Chat(ChatCmd::Send) => {
                    if c.running {
                        return Some("compare is running: c stops it".into());
                    }
                    return self.start_compare();
                }
                _ => {}
            },
            Popup::Prompt { scroll, ids } => match a {
                Action::Back | Action::Chat(ChatCmd::PromptInspector) => self.popup = None,
                Action::Input('i') | Action::Chat(ChatCmd::Focus) => *ids = !*ids,
                a => {
                    if let Some(s) = super::scrolled(a, *scroll as u16, page as u16, u16::MAX) {
                        *scroll = s as usize;
                    }
                }
            },
            Popup::Token { index } => {
                let n = n_tokens;
                match a {
                    Action::Back | Action::Chat(ChatCmd::TokenInspector) => {
                        self.popup = None;
                        self.prob_mode = false;
                    }
                    Action::Left | Action::Up => *index = index.saturating_sub(1),
                    Action::Right | Action::Down => *index = (*index + 1).min(n.saturating_sub(1)),
                    Action::Home => *index = 0,
                    Action::End => *index = n.saturating_sub(1),
                    _ => {}
                }
            }
            Popup::Sampling { row, edit, note } => {
                if let Some((text, cur)) = edit {
                    let mut f = Field {
                        text: text.clone(),
                        cursor: *cur,
                    };
                    match a {
                        Action::Enter | Action::Chat(ChatCmd::Send) => {
                            let key = [
                                "temp",
                                "top-k",
                                "top-p",
                                "min-p",
                                "repeat",
                                "seed",
                                "max-tokens",
                                "greedy",
                            ][*row];
                            let r = crate::cli::run::set_setting(
                                &mut self.settings,
                                &format!("{key} {}", f.text.trim()),
                            );
                            match r {
                                Ok(()) => {
                                    *edit = None;
                                    *note = None;
                                    self.send(ChatCommand::Settings(self.settings.clone()));
                                }
                                Err(e) => *note = Some(e),
                            }
                            return None;
                        }
                        Action::Back => {
                            *edit = None;
                            return None;
                        }
                        a => {
                            f.edit(a);
                        }
                    }
                    *edit = Some((f.text, f.cursor));
                    return None;
                }
                match a {
                    Action::Back | Action::Chat(ChatCmd::Sampling) => self.popup = None,
                    Action::Up => *row = row.saturating_sub(1),
                    Action::Down => *row = (*row + 1).min(SAMPLING_ROWS.len() - 1),
                    Action::Left | Action::Right => {
                        let up = matches!(a, Action::Right);
                        let r = *row;
                        nudge(&mut self.settings, r, up);
                        self.send(ChatCommand::Settings(self.settings.clone()));
                    }
                    Action::Enter | Action::Chat(ChatCmd::Send) => {
                        if *row == 7 {
                            let r = *row;
                            nudge(&mut self.settings, r, true);
                            self.send(ChatCommand::Settings(self.settings.clone()));
                        } else {
                            let v = sampling_value(&self.settings, *row);
                            *edit = Some((v.clone(), v.chars().count()));
                        }
                    }
                    _ => {}
                }
            }
            Popup::Settings {
                field,
                editing,
                note,
            } => {
                let f = match field {
                    SettingsField::SystemPrompt => &mut self.settings_text.0,
                    SettingsField::Variables => &mut self.settings_text.1,
                };
                if editing.is_some() {
                    match a {
                        Action::Back => {
                            *editing = None;
                            // Apply both fields.
                            let system = self.settings_text.0.text.trim().to_string();
                            let mut vars = serde_json::Map::new();
                            for line in self
                                .settings_text
                                .1
                                .text
                                .lines()
                                .filter(|l| !l.trim().is_empty())
                            {
                                match crate::cli::engine::parse_var(line.trim(), "variable") {
                                    Ok((k, v)) => {
                                        vars.insert(k, v);
                                    }
                                    Err(e) => {
                                        *note = Some(e.message);
                                        return None;
                                    }
                                }
                            }
                            *note = None;
                            self.settings.system = (!system.is_empty()).then_some(system);
                            self.settings.vars = vars;
                            self.send(ChatCommand::Settings(self.settings.clone()));
                            return Some("settings apply from the next answer".into());
                        }
                        Action::Enter
                        | Action::Chat(ChatCmd::Send)
                        | Action::Chat(ChatCmd::Newline) => f.insert("\n"),
                        a => {
                            f.edit(a);
                        }
                    }
                    *editing = Some(f.cursor);
                    return None;
                }
                match a {
                    Action::Back | Action::Chat(ChatCmd::Settings) => self.popup = None,
                    Action::Up | Action::Down | Action::NextTab | Action::PrevTab => {
                        *field = match field {
                            SettingsField::SystemPrompt => SettingsField::Variables,
                            SettingsField::Variables => SettingsField::SystemPrompt,
                        }
                    }
                    Action::Enter | Action::Chat(ChatCmd::Send) => *editing = Some(f.cursor),
                    _ => {}
                }
            }
        }
        None
    }

    /// Whether the popup takes Tab (the settings panel switches fields with it).
    pub fn takes_tab(&self) -> bool {
        matches!(self.popup, Some(Popup::Settings { .. }))
    }

    pub fn status(&self) -> (String, String) {
        let status = match &self.availability {
            Availability::Loading { done, total } if *total > 0 => {
                format!("checking the hash chain… {}%", done * 100 / total)
            }
            Availability::Loading { .. } => "loading the model…".into(),
            Availability::Ready => match &self.replay {
                Some(r) => r.clone(),
                None => format!(
                    "{} messages · {}",
                    self.messages.len(),
                    crate::cli::run::settings_line(&self.settings)
                ),
            },
            Availability::Unavailable { title, .. } => title.clone(),
        };
        let hint = if self.generating {
            "Esc/Ctrl-C stop · F6 task · F7 skill (after this answer)".to_string()
        } else if self.focused {
            "Enter send · Alt-Enter newline · ↑ history · Esc leave input · F2 sampling · F3 system · F4 prompt · F5 tokens · F6 task · F7 skill · F8 cache · F9 compare".into()
        } else {
            "i type · Ctrl-R regenerate · Ctrl-E edit · Ctrl-L clear · Ctrl-Y copy · Ctrl-S save · F6 task · F7 skill · F8 cache · F9 compare"
                .into()
        };
        (status, hint)
    }

    /// The status line's segment on the choice: what runs, and what a switch does.
    fn choice_line(&self) -> String {
        if self.choices.tasks.is_empty() && self.choices.skills.is_empty() {
            return String::new();
        }
        let mut c = esc(&self.active.label);
        match &self.request.skill {
            SkillRequest::Auto => c.push_str(" · skill auto"),
            SkillRequest::Blend { temperature } => {
                c.push_str(&format!(" · skill blend T {temperature:.2}"))
            }
            _ => {}
        }
        if self.choosing.is_some() {
            c.push_str(" · switching…");
        }
        c.push_str(match self.policy {
            SwitchPolicy::KeepCache => " · switch keeps the cache",
            SwitchPolicy::Reprefill => " · switch re-prefills",
        });
        c
    }

    /// The picker's rows and the popup's view model.
    fn picker_vm<'a>(
        &self,
        skill: bool,
        row: usize,
        labels: &'a [(String, String)],
    ) -> PickerVm<'a> {
        let current = if skill {
            self.choices.skill_row(&self.request.skill)
        } else {
            self.choices.task_row(self.request.task.as_deref())
        };
        PickerVm {
            title: if skill {
                "skill (§9) — the tensors the forward reads"
            } else {
                "task mask (§5) — what the forward computes"
            },
            rows: labels
                .iter()
                .enumerate()
                .map(|(i, (label, note))| PickRowVm {
                    label,
                    note,
                    current: i == current,
                    selected: i == row,
                })
                .collect(),
            policy: match self.policy {
                SwitchPolicy::KeepCache => {
                    "at a switch: keep the cache (fast, approximate) · F8 re-prefill"
                }
                SwitchPolicy::Reprefill => {
                    "at a switch: re-prefill (exact) · F8 keep the cache (fast)"
                }
            },
            note: self
                .generating
                .then_some("an answer is streaming: the switch applies after it"),
            hint: if skill {
                "↑↓ choose · ←/→ blend T · Enter switch · Esc close"
            } else {
                "↑↓ choose · Enter switch · Esc close"
            },
        }
    }

    /// The rendered lines of message `i` at `width`, memoized.
    fn lines_of(&self, i: usize, width: u16, theme: &Theme) {
        let m = &self.messages[i];
        let key = (width, m.text.len(), self.expand_thinking);
        let mut cache = self.cache.borrow_mut();
        if cache.len() < self.messages.len() {
            cache.resize_with(self.messages.len(), Rendered::default);
        }
        cache.truncate(self.messages.len());
        if cache[i].key == key && (!cache[i].lines.is_empty() || m.text.is_empty()) {
            return;
        }
        cache[i].lines = match m.role {
            Some(Role::Assistant) => markdown::render(
                &m.text,
                width,
                theme,
                &MdOptions {
                    expand_thinking: self.expand_thinking,
                    thinking_open: false,
                    toggle_key: "Ctrl-T",
                },
            ),
            _ => markdown::render_plain(&m.text, width, theme.base),
        };
        cache[i].key = key;
    }

    pub fn render(&self, f: &mut Frame, area: Rect, theme: &Theme) {
        let notice_text;
        let notice = match &self.availability {
            Availability::Unavailable {
                title,
                message,
                bad,
                ..
            } => {
                notice_text = (title.clone(), message.clone());
                Some(NoticeVm {
                    title: &notice_text.0,
                    text: &notice_text.1,
                    bad: *bad,
                })
            }
            _ => None,
        };
        let width = widget::text_width(area);
        for i in 0..self.messages.len() {
            if !(self.prob_mode && Some(i) == self.last_reply_index()) {
                self.lines_of(i, width, theme);
            }
        }
        let cache = self.cache.borrow();
        let token_vms: Vec<TokenVm> = match self.last_reply_index() {
            Some(i) if self.prob_mode => self.messages[i]
                .tokens
                .iter()
                .map(|t| TokenVm {
                    text: &t.piece,
                    prob: t.prob,
                })
                .collect(),
            _ => Vec::new(),
        };
        let selected_token = match &self.popup {
            Some(Popup::Token { index }) => Some(*index),
            _ => None,
        };
        // An answer's meta ends with the choice it ran under.
        let metas: Vec<Option<String>> = self
            .messages
            .iter()
            .map(|m| match (&m.meta, &m.choice) {
                (Some(meta), Some(c)) => Some(format!("{meta} · {}", esc(c))),
                (None, Some(c)) => Some(esc(c)),
                (meta, None) => meta.clone(),
            })
            .collect();
        let dividers: Vec<DividerVm> = self
            .dividers
            .iter()
            .map(|(before, text)| DividerVm {
                before: *before,
                text,
            })
            .collect();
        let messages: Vec<MessageVm> = self
            .messages
            .iter()
            .enumerate()
            .map(|(i, m)| {
                let role = match m.role {
                    Some(Role::User) => widget::Role::User,
                    _ => widget::Role::Assistant,
                };
                let body = if self.prob_mode && Some(i) == self.last_reply_index() {
                    BodyVm::Tokens {
                        tokens: &token_vms,
                        selected: selected_token,
                    }
                } else {
                    BodyVm::Lines(cache.get(i).map_or(&[][..], |r| &r.lines[..]))
                };
                MessageVm {
                    role,
                    body,
                    meta: metas[i].as_deref(),
                    streaming: m.streaming,
                    stopped: m.stopped,
                    error: m.error.as_deref(),
                    selected: false,
                }
            })
            .collect();
        let sampler = widget::sampler_summary(&sampler_of(&self.settings));
        let choice_line = self.choice_line();
        let state = match (&self.availability, self.generating, self.prefill) {
            (Availability::Loading { .. }, _, _) => Phase::Loading,
            (_, true, Some((done, total))) => Phase::Prefilling { done, total },
            (_, true, None) => Phase::Generating,
            _ if self
                .last_stats
                .as_ref()
                .is_some_and(|s| s.stop == StopReason::Cancelled) =>
            {
                Phase::Stopped
            }
            _ => Phase::Idle,
        };
        let stats = self.last_stats.as_ref();
        let live_context = stats.map(|s| (s.context_used, s.context_capacity));
        let status = StatusVm {
            state,
            prefill_tok_s: stats.map(|s| s.prefill_tok_s),
            decode_tok_s: stats.map(|s| s.decode_tok_s),
            ttft_s: stats.map(|s| s.ttft_s),
            context: live_context.or((self.capacity > 0).then_some((0, self.capacity))),
            sampler: &sampler,
            precision: self.precision.name(),
            choice: &choice_line,
        };
        let placeholder = if self.suggested.is_empty() {
            "Ask something… (Enter sends · /system /set /save /load /reset)".to_string()
        } else {
            format!("Try: {} (Enter asks it)", self.suggested)
        };
        let rows: Vec<SamplingRowVm>;
        let prompt_vms: Vec<PromptTokenVm>;
        let alts: Vec<AltTokenVm>;
        let labels: Vec<(String, String)>;
        let compare_text: (Vec<String>, [String; 2], [String; 2], String);
        let popup = match &self.popup {
            None => None,
            Some(Popup::Task { row }) => {
                labels = (0..self.choices.task_rows())
                    .map(|i| self.choices.task_label(i))
                    .collect();
                Some(PopupVm::Picker(self.picker_vm(false, *row, &labels)))
            }
            Some(Popup::Skill { row }) => {
                labels = (0..self.choices.skill_rows())
                    .map(|i| self.choices.skill_label(i, self.blend_t))
                    .collect();
                Some(PopupVm::Picker(self.picker_vm(true, *row, &labels)))
            }
            Some(Popup::Compare(c)) => {
                let state_of = |s: &compare::CompareSide| match (&s.error, s.stop) {
                    (Some(_), _) => "failed".to_string(),
                    (None, Some(stop)) => stop_word(stop).to_string(),
                    (None, None) if c.running => "running".into(),
                    (None, None) => "—".into(),
                };
                compare_text = (
                    (0..compare::ROWS.len())
                        .map(|r| c.value(&self.choices, r))
                        .collect(),
                    [0, 1].map(|i| {
                        c.sides[i]
                            .label
                            .as_deref()
                            .map(esc)
                            .unwrap_or_else(|| compare::asked(&self.choices, c, i))
                    }),
                    [state_of(&c.sides[0]), state_of(&c.sides[1])],
                    c.summary(),
                );
                let diverge = match c.divergence() {
                    Divergence::At(i) => Some(i),
                    _ => None,
                };
                Some(PopupVm::Compare(CompareVm {
                    prompt: &c.prompt,
                    rows: compare::ROWS
                        .iter()
                        .enumerate()
                        .map(|(i, label)| CompareRowVm {
                            label,
                            value: &compare_text.0[i],
                            selected: i == c.row,
                        })
                        .collect(),
                    sides: [0, 1].map(|i| CompareSideVm {
                        title: &compare_text.1[i],
                        tokens: c.sides[i].texts.iter().map(String::as_str).collect(),
                        state: &compare_text.2[i],
                        error: c.sides[i].error.as_deref(),
                    }),
                    diverge,
                    summary: &compare_text.3,
                    hint: if c.running {
                        "c stop · Esc close"
                    } else {
                        "↑↓ row · ←/→ change · Enter answer under A and B (greedy) · Esc close"
                    },
                }))
            }
            Some(Popup::Sampling { row, edit, note }) => {
                rows = SAMPLING_ROWS
                    .iter()
                    .enumerate()
                    .map(|(i, label)| SamplingRowVm {
                        label,
                        value: sampling_value(&self.settings, i),
                        selected: i == *row,
                        disabled: self.settings.sampling.is_greedy()
                            && (0..=4).contains(&i)
                            && i != 4,
                    })
                    .collect();
                Some(PopupVm::Sampling(SamplingVm {
                    rows,
                    edit: edit.as_ref().map(|(t, c)| EditVm {
                        text: t,
                        cursor: *c,
                    }),
                    note: note.as_deref(),
                    hint: widget::SAMPLING_HINT,
                }))
            }
            Some(Popup::Settings {
                field,
                editing,
                note,
            }) => Some(PopupVm::Settings(SettingsVm {
                system_prompt: &self.settings_text.0.text,
                variables: &self.settings_text.1.text,
                focus: *field,
                editing: *editing,
                note: note.as_deref(),
                hint: "↑↓ switch field · Enter edit · Esc applies / closes",
            })),
            Some(Popup::Prompt { scroll, ids }) => {
                prompt_vms = self
                    .prompt_tokens
                    .iter()
                    .map(|(t, id, special)| PromptTokenVm {
                        text: t,
                        id: *id,
                        special: *special,
                    })
                    .collect();
                Some(PopupVm::Prompt(PromptVm {
                    tokens: &prompt_vms,
                    show_ids: *ids,
                    scroll: *scroll,
                    hint: widget::PROMPT_HINT,
                }))
            }
            Some(Popup::Token { index }) => {
                let m = self.last_reply();
                match m.and_then(|m| m.tokens.get(*index).map(|t| (m, t))) {
                    Some((m, t)) => {
                        alts = t
                            .top
                            .iter()
                            .map(|(id, text, p)| AltTokenVm {
                                text,
                                id: *id,
                                prob: *p,
                            })
                            .collect();
                        Some(PopupVm::Token(TokenInspectorVm {
                            index: *index,
                            count: m.tokens.len(),
                            text: &t.text,
                            id: t.id,
                            prob: t.prob,
                            alternatives: &alts,
                            hint: widget::TOKEN_HINT,
                        }))
                    }
                    None => None,
                }
            }
        };
        let loading_text = match &self.availability {
            Availability::Loading { done, total } if *total > 0 => {
                format!(
                    "Checking the hash chain before the model runs: {}%",
                    done * 100 / total
                )
            }
            _ => "Loading the model…".to_string(),
        };
        let notice = notice.or_else(|| match &self.availability {
            Availability::Loading { .. } => Some(NoticeVm {
                title: "Loading",
                text: &loading_text,
                bad: false,
            }),
            _ => None,
        });
        let vm = ChatVm {
            messages: &messages,
            dividers: &dividers,
            scroll: self.scroll,
            input: InputVm {
                text: &self.input.text,
                cursor: self.input.cursor,
                focused: self.focused,
                placeholder: &placeholder,
            },
            status,
            notice,
            popup,
            tick: self.tick,
        };
        widget::render(f, area, &vm, theme);
    }

    fn last_reply_index(&self) -> Option<usize> {
        self.messages
            .iter()
            .rposition(|m| m.role == Some(Role::Assistant))
    }
}

/// ↑↓ Home End in a picker of rows `0..=last`; whether `a` was one of them.
fn pick_move(a: &Action, row: &mut usize, last: usize) -> bool {
    *row = match a {
        Action::Up | Action::ScrollUp => row.saturating_sub(1),
        Action::Down | Action::ScrollDown => (*row + 1).min(last),
        Action::Home => 0,
        Action::End => last,
        _ => return false,
    };
    true
}

fn msg_of(m: &Message) -> ChatMsg {
    ChatMsg {
        role: Some(m.role),
        text: m.content.clone(),
        ids: m.ids.clone(),
        stopped: m.stop == Some(StopReason::Cancelled),
        meta: (m.role == Role::Assistant && !m.ids.is_empty())
            .then(|| format!("{} tokens · loaded", m.ids.len())),
        choice: m.choice.clone(),
        ..Default::default()
    }
}

fn stop_word(s: StopReason) -> &'static str {
    match s {
        StopReason::Eos => "end",
        StopReason::MaxTokens => "token limit",
        StopReason::ContextFull => "context full",
        StopReason::Cancelled => "stopped",
        StopReason::Error => "error",
        StopReason::Running => "running",
    }
}

fn sampling_value(s: &Settings, row: usize) -> String {
    let p = &s.sampling;
    match row {
        0 => format!("{}", p.temperature),
        1 => format!("{}", p.top_k),
        2 => format!("{}", p.top_p),
        3 => format!("{}", p.min_p),
        4 => format!("{}", p.repetition_penalty),
        5 => format!("{}", p.seed),
        6 => format!("{}", s.max_tokens),
        _ => if p.is_greedy() { "on" } else { "off" }.into(),
    }
}

/// ←/→ on a sampling row.
fn nudge(s: &mut Settings, row: usize, up: bool) {
    let p = &mut s.sampling;
    let step = |v: f32, d: f32, lo: f32, hi: f32| {
        let n = if up { v + d } else { v - d };
        ((n / d).round() * d).clamp(lo, hi)
    };
    match row {
        0 => p.temperature = step(p.temperature, 0.1, 0.0, 5.0),
        1 => {
            p.top_k = if up {
                p.top_k + 5
            } else {
                p.top_k.saturating_sub(5)
            }
        }
        2 => p.top_p = step(p.top_p, 0.05, 0.05, 1.0),
        3 => p.min_p = step(p.min_p, 0.01, 0.0, 1.0),
        4 => p.repetition_penalty = step(p.repetition_penalty, 0.05, 0.05, 3.0),
        5 => {
            p.seed = if up {
                p.seed.wrapping_add(1)
            } else {
                p.seed.wrapping_sub(1)
            }
        }
        6 => {
            s.max_tokens = if up {
                s.max_tokens + 64
            } else {
                s.max_tokens.saturating_sub(64).max(1)
            }
        }
        _ => {
            if p.is_greedy() {
                p.temperature = Settings::default().sampling.temperature;
            } else {
                p.temperature = 0.0;
            }
        }
    }
}
