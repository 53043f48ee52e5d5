//! The chat worker: a long-lived thread that owns the model and the [`Conversation`],
//! takes commands over a channel and reports every step back as an Action. The UI never
//! waits on the engine; a running answer is cancelled through a shared flag, checked
//! between steps. Every report of a request carries its job id, so that the chat state
//! drops stale ones in one place. For MoE models the worker also reports the session's
//! route log as it grows or is cut, for the routing view's mirror.
//!
//! Task masks and skills (§5, §9) are chosen with [`ChatCommand::Choose`], as `cortiq run`
//! does: a fixed choice (a task, a skill id, none) is resolved and switched at once; `auto`
//! and `blend` are resolved on each user message's raw tokens before its answer. The
//! worker runs one command at a time, so a choice sent while an answer streams applies
//! after that answer, never in the middle of it. Every switch is reported
//! ([`ChatReport::Choice`]) with the engine's [`SwitchReport`]: the transcript's divider.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;

use cortiq_engine::chat::conversation::{Conversation, Message, ReplyStep, SavedSession, Settings};
use cortiq_engine::chat::ChatBundle;
use cortiq_engine::exec::Foreground;
use cortiq_engine::format::shards::CmfModel;
use cortiq_engine::model::select::{SkillChoice, TaskMask};
use cortiq_engine::model::{Model, ModelError, Precision};
use cortiq_engine::runtime::choice::{resolve, Request, SkillRequest};
use cortiq_engine::runtime::load::{load_unverified, verify_model, LoadError, LoadOptions};
use cortiq_engine::runtime::session::{
    label_of, GenerationStats, Session, SwitchPolicy, SwitchReport,
};
use cortiq_engine::runtime::skill_route::Routing;

use super::jobs::JobReport;
use super::Action;

/// Context positions a chat gets (the model's maximum when smaller).
pub const CHAT_CONTEXT: usize = 4096;

/// What the chat view asks of its worker.
#[derive(Clone, Debug, PartialEq)]
pub enum ChatCommand {
    /// Add a user message and answer it.
    Send {
        job: u64,
        text: String,
    },
    /// Answer the last question again.
    Regenerate {
        job: u64,
    },
    /// Replace the last user message and answer it.
    EditResend {
        job: u64,
        text: String,
    },
    /// Forget the conversation (a new session: the cache is emptied).
    Reset,
    /// Settings for the next answers.
    Settings(Settings),
    /// The rendered prompt of the conversation, token by token.
    Inspect {
        job: u64,
    },
    Save {
        path: PathBuf,
    },
    /// Continue a saved session; `replay` generates its answers again and compares.
    Load {
        job: u64,
        session: Box<SavedSession>,
        replay: bool,
    },
    /// Run the model although its hash chain failed (the user said so).
    LoadUnverified,
    /// Run under this task mask and skill from now on; a switch treats the cached
    /// positions as `policy` says. Applied between answers (after a running one).
    Choose {
        job: u64,
        request: Request,
        policy: SwitchPolicy,
    },
}

/// The model and chat bundle the worker loaded, shared read-only with the background
/// jobs that run sessions of their own on it (skill routing, compare): one load, one
/// mmap.
#[derive(Clone)]
pub struct SharedEngine {
    pub model: Arc<Model>,
    pub bundle: Arc<ChatBundle>,
}

impl std::fmt::Debug for SharedEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SharedEngine")
    }
}

impl PartialEq for SharedEngine {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.model, &other.model) && Arc::ptr_eq(&self.bundle, &other.bundle)
    }
}

impl SharedEngine {
    /// Raw tokens of `text` (what skill routing scores): no template, no special tokens.
    pub fn raw_tokens(&self, text: &str) -> Vec<u32> {
        self.bundle
            .tokenizer()
            .and_then(|t| t.encode(text, false).ok())
            .unwrap_or_default()
    }
}

/// The skill part of what the session runs under.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum ActiveSkill {
    #[default]
    None,
    /// Registry index.
    One(u16),
    /// A soft mix: a weight per registry index.
    Blend(Vec<f32>),
}

/// What the session's forwards run under, as the views show it.
#[derive(Clone, Debug, PartialEq)]
pub struct ActiveInfo {
    /// The engine's label (`backbone`, `task code`, `skill sql`, …), from the file's names:
    /// escape it before showing it.
    pub label: String,
    pub task: Option<Arc<TaskMask>>,
    pub skill: ActiveSkill,
}

impl Default for ActiveInfo {
    fn default() -> Self {
        ActiveInfo {
            label: "backbone".into(),
            task: None,
            skill: ActiveSkill::None,
        }
    }
}

impl ActiveInfo {
    fn of(session: &Session) -> ActiveInfo {
        let a = session.active();
        ActiveInfo {
            label: session.active_label().to_string(),
            task: a.task.clone(),
            skill: match &a.skill {
                SkillChoice::None => ActiveSkill::None,
                SkillChoice::One(k) => ActiveSkill::One(*k),
                SkillChoice::Blend { weights, .. } => ActiveSkill::Blend(weights.clone()),
            },
        }
    }
}

/// A token as the views show it.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenReport {
    pub id: u32,
    /// The text this token completed in the stream (empty while a character is split).
    pub piece: String,
    /// The token decoded alone.
    pub text: String,
    pub prob: f32,
    /// The ten most likely tokens at its position: id, text, probability.
    pub top: Vec<(u32, String, f32)>,
}

/// One MoE layer of the model as the route log holds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RouteLayer {
    /// The model's layer index.
    pub layer: usize,
    pub experts: usize,
    /// Experts each position chooses.
    pub k: usize,
}

/// The session's route log since the last report: a mirror cuts its copy to `from`
/// positions (a truncation when it holds more: a new prompt not sharing the prefix, a
/// reset), then appends these rows.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RouteRows {
    pub from: usize,
    /// Per new position: the token the forward took as input, and that token decoded
    /// alone (cut short).
    pub tokens: Vec<(u32, String)>,
    /// Per MoE layer, in the order of [`ChatReport::RouteLayout`]: `[rows, k]` expert ids
    /// (best first) and their weights.
    pub layers: Vec<(Vec<u32>, Vec<f32>)>,
}

/// A choice the worker took (see [`ChatReport::Choice`]).
#[derive(Clone, Debug, PartialEq)]
pub struct ChoiceReport {
    /// The `Choose` it answers, or the answer it was resolved for.
    pub job: u64,
    /// What the worker now holds (the skill may be `auto`/`blend`, resolved per message).
    pub request: Request,
    pub policy: SwitchPolicy,
    /// What the forwards run under now.
    pub active: ActiveInfo,
    /// The switch it made (`None`: the choice did not change what runs, or waits for the
    /// next message): a divider in the transcript.
    pub switch: Option<SwitchReport>,
    /// The message's routing scores (`auto`, `blend`).
    pub routing: Option<Routing>,
    /// What the user should know (an unmeasured task), each time it applies.
    pub warnings: Vec<String>,
    /// Weights a blend materialised.
    pub blend_bytes: usize,
}

/// What the worker reports.
#[derive(Clone, Debug, PartialEq)]
pub enum ChatReport {
    /// The hash chain is being checked.
    Verifying {
        done: u64,
        total: u64,
    },
    Ready {
        precision: String,
        capacity: usize,
        warnings: Vec<String>,
    },
    /// The model cannot be chatted with; `can_override` when only its check failed.
    Unavailable {
        title: String,
        message: String,
        bad: bool,
        can_override: bool,
    },
    Prefill {
        job: u64,
        done: usize,
        total: usize,
    },
    Token {
        job: u64,
        token: TokenReport,
    },
    /// The answer ended (also when stopped); its final text and ids.
    Done {
        job: u64,
        text: String,
        ids: Vec<u32>,
        stats: GenerationStats,
        /// The label of the choice it was generated under (`None`: the backbone).
        choice: Option<String>,
    },
    Failed {
        job: u64,
        message: String,
    },
    Prompt {
        job: u64,
        tokens: Vec<(String, u32, bool)>,
    },
    /// The whole transcript, after a load.
    Messages {
        job: u64,
        messages: Vec<Message>,
    },
    /// A replay's verdict: per answer, whether the ids came out the same.
    Replayed {
        job: u64,
        same: usize,
        differ: usize,
    },
    /// One line for the status bar.
    Note(String),
    /// The model's MoE layers, sent once before `Ready` (empty for a dense model: it
    /// logs no routes).
    RouteLayout {
        layers: Vec<RouteLayer>,
    },
    /// Route rows new since the last such report (see [`RouteRows`]). They describe
    /// the worker's session, so a mirror applies every one in order, whatever its job.
    Routes {
        job: u64,
        rows: RouteRows,
    },
    /// The loaded model, for jobs that run their own sessions (sent once, before `Ready`).
    Engine(SharedEngine),
    /// The worker took a choice (a `Choose`, or `auto`/`blend` resolved for a message).
    /// It describes the worker's conversation, so every one applies, whatever its job.
    Choice(Box<ChoiceReport>),
    /// A `Choose` the engine refused (an unknown name, an unusable skill): the worker
    /// keeps what it ran under. Applies whatever its job.
    ChoiceRefused {
        job: u64,
        message: String,
    },
}

impl ChatReport {
    /// The request it answers; `None` for reports about the worker itself.
    pub fn job(&self) -> Option<u64> {
        match self {
            ChatReport::Prefill { job, .. }
            | ChatReport::Token { job, .. }
            | ChatReport::Done { job, .. }
            | ChatReport::Failed { job, .. }
            | ChatReport::Prompt { job, .. }
            | ChatReport::Messages { job, .. }
            | ChatReport::Replayed { job, .. }
            | ChatReport::Routes { job, .. } => Some(*job),
            _ => None,
        }
    }
}

/// A test's hold on the worker's steps: with a limit set, each step of an answer takes
/// one permit and waits for more when none is left, so "stop midway" is deterministic.
#[derive(Debug, Default)]
pub struct StepGate {
    permits: std::sync::Mutex<Option<usize>>,
    more: std::sync::Condvar,
}

pub type Gate = Arc<StepGate>;

impl StepGate {
    /// Allows `n` more steps, then holds the worker (`None`: no limit).
    #[cfg_attr(not(test), allow(dead_code))]
    pub fn allow(&self, n: Option<usize>) {
        *self.permits.lock().unwrap_or_else(|e| e.into_inner()) = n;
        self.more.notify_all();
    }

    fn pass(&self) {
        let mut p = self.permits.lock().unwrap_or_else(|e| e.into_inner());
        while *p == Some(0) {
            p = self.more.wait(p).unwrap_or_else(|e| e.into_inner());
        }
        if let Some(n) = p.as_mut() {
            *n -= 1;
        }
    }
}

/// The UI's handle on the worker.
pub struct ChatWorker {
    tx: Sender<ChatCommand>,
    cancel: Arc<AtomicBool>,
}

impl ChatWorker {
    /// Starts the worker on `path`: it checks and loads the model, then waits for
    /// commands. Reports go to `out` as `Action::Job(JobReport::Chat(..))`.
    pub fn spawn(
        path: PathBuf,
        precision: Precision,
        out: Sender<Action>,
        gate: Option<Gate>,
    ) -> ChatWorker {
        let (tx, rx) = mpsc::channel();
        let cancel = Arc::new(AtomicBool::new(false));
        let c = cancel.clone();
        std::thread::Builder::new()
            .name("cortiq-chat".into())
            .spawn(move || {
                let report = |r: ChatReport| {
                    let _ = out.send(Action::Job(JobReport::Chat(r)));
                };
                run(&path, precision, &rx, &c, &report, gate.as_ref());
            })
            .expect("spawn the chat worker");
        ChatWorker { tx, cancel }
    }

    pub fn send(&self, c: ChatCommand) {
        if matches!(
            c,
            ChatCommand::Send { .. }
                | ChatCommand::Regenerate { .. }
                | ChatCommand::EditResend { .. }
                | ChatCommand::Load { .. }
        ) {
            self.cancel.store(false, Ordering::SeqCst);
        }
        // A gone worker (it failed to load) has said why already.
        let _ = self.tx.send(c);
    }

    /// Stops the running answer between two steps.
    pub fn stop(&self) {
        self.cancel.store(true, Ordering::SeqCst);
    }
}

impl Drop for ChatWorker {
    fn drop(&mut self) {
        // The channel closes with the sender; a running answer stops at its next step.
        self.cancel.store(true, Ordering::SeqCst);
    }
}

fn unavailable(title: &str, message: String, bad: bool, can_override: bool) -> ChatReport {
    ChatReport::Unavailable {
        title: title.into(),
        message,
        bad,
        can_override,
    }
}

fn run(
    path: &std::path::Path,
    precision: Precision,
    rx: &Receiver<ChatCommand>,
    cancel: &AtomicBool,
    report: &(dyn Fn(ChatReport) + Sync),
    gate: Option<&Gate>,
) {
    let Some(mut conv) = load(path, precision, rx, cancel, report) else {
        return;
    };
    report(ChatReport::RouteLayout {
        layers: conv
            .session()
            .routes()
            .map(|log| {
                log.layers
                    .iter()
                    .map(|l| RouteLayer {
                        layer: l.layer,
                        experts: l.experts,
                        k: l.k,
                    })
                    .collect()
            })
            .unwrap_or_default(),
    });
    let mut routes = RouteSync::default();
    let mut choosing = Choosing::default();
    report(ChatReport::Engine(SharedEngine {
        model: conv.model().clone(),
        bundle: Arc::clone(conv.bundle_arc()),
    }));
    report(ChatReport::Ready {
        precision: name_of(precision).into(),
        capacity: conv.session().capacity(),
        warnings: conv.model().warnings.clone(),
    });
    while let Ok(cmd) = rx.recv() {
        let asks = match &cmd {
            ChatCommand::Send { job, .. }
            | ChatCommand::Regenerate { job }
            | ChatCommand::EditResend { job, .. } => Some(*job),
            _ => None,
        };
        match cmd {
            ChatCommand::Send { job, text } => {
                conv.push_user(text);
                let turn = Turn {
                    job,
                    start: Start::Reply,
                    choosing: &choosing,
                };
                if !answer(&mut conv, turn, cancel, report, gate, &mut routes) {
                    // As `cortiq run`: the question is not kept without its answer.
                    let mut msgs = conv.messages().to_vec();
                    msgs.pop();
                    conv.set_messages(msgs);
                }
            }
            ChatCommand::Regenerate { job } => {
                let turn = Turn {
                    job,
                    start: Start::Regenerate,
                    choosing: &choosing,
                };
                answer(&mut conv, turn, cancel, report, gate, &mut routes);
            }
            ChatCommand::EditResend { job, text } => match conv.edit_last_user(text) {
                Ok(()) => {
                    let turn = Turn {
                        job,
                        start: Start::Reply,
                        choosing: &choosing,
                    };
                    answer(&mut conv, turn, cancel, report, gate, &mut routes);
                }
                Err(e) => report(ChatReport::Failed {
                    job,
                    message: e.to_string(),
                }),
            },
            ChatCommand::Choose {
                job,
                request,
                policy,
            } => choose(
                &mut conv,
                &mut choosing,
                job,
                request,
                policy,
                &mut routes,
                report,
            ),
            ChatCommand::Reset => {
                conv.reset();
                let job = routes.job;
                routes.sync(conv.session(), conv.bundle(), job, true, report);
            }
            ChatCommand::Settings(s) => conv.settings = s,
            ChatCommand::Inspect { job } => report(inspect(&conv, job)),
            ChatCommand::Save { path } => {
                let saved = SavedSession::of(
                    &conv,
                    &conv
                        .model()
                        .file
                        .primary()
                        .path
                        .clone()
                        .unwrap_or_default()
                        .display()
                        .to_string(),
                    conv.model().precision(),
                );
                let note = match cortiq_engine::format::writer::write_atomic(
                    &path,
                    saved.to_json().as_bytes(),
                ) {
                    Ok(()) => format!(
                        "saved {} messages to {}",
                        conv.messages().len(),
                        path.display()
                    ),
                    Err(e) => format!("cannot save the session: {e}"),
                };
                report(ChatReport::Note(note));
            }
            ChatCommand::Load {
                job,
                session,
                replay,
            } => {
                load_session(&mut conv, job, &session, replay, cancel, report);
                // A replay ran whole answers: compare the tokens to find what changed.
                routes.sync(conv.session(), conv.bundle(), job, true, report);
            }
            ChatCommand::LoadUnverified => {}
        }
        if let Some(job) = asks {
            // A prompt refused before its first step may still have cut the state.
            routes.sync(conv.session(), conv.bundle(), job, true, report);
        }
    }
}

fn name_of(p: Precision) -> &'static str {
    p.name()
}

/// Checks and loads the model; `None` after reporting why it cannot chat.
fn load(
    path: &std::path::Path,
    precision: Precision,
    rx: &Receiver<ChatCommand>,
    cancel: &AtomicBool,
    report: &(dyn Fn(ChatReport) + Sync),
) -> Option<Conversation> {
    let file = match CmfModel::open(path) {
        Ok(f) => Arc::new(f),
        Err(e) => {
            report(unavailable(
                "The file does not open",
                e.to_string(),
                true,
                false,
            ));
            return None;
        }
    };
    if file.primary().is_skill_file() {
        report(unavailable(
            "A skill file has no model to chat with",
            "This is a standalone skill file (SKILL_FILE): its tensors replace parts of the \
             base model it is bound to, and it runs only once applied to that base \
             (`cortiq skill apply BASE SKILL -o OUT`). The other views work as before."
                .into(),
            false,
            false,
        ));
        return None;
    }
    let total: u64 = file.shards.iter().map(|s| s.len()).sum();
    // Progress in whole percents: a file of 10⁵ tensors must not flood the channel.
    let shown = std::sync::atomic::AtomicU64::new(0);
    let progress = |e: cortiq_engine::format::verify::VerifyEvent| {
        if let cortiq_engine::format::verify::VerifyEvent::Progress { bytes_done, .. } = e {
            let pct = bytes_done.saturating_mul(100) / total.max(1);
            if shown.fetch_max(pct, Ordering::Relaxed) < pct {
                report(ChatReport::Verifying {
                    done: bytes_done,
                    total,
                });
            }
        }
    };
    report(ChatReport::Verifying { done: 0, total });
    match verify_model(&file, Some(cancel), &progress) {
        Ok(()) => {}
        Err(LoadError::Integrity { link, why }) => {
            report(unavailable(
                "The hash chain fails: chat is refused",
                format!(
                    "The {link} fails its check ({why}). A damaged file can give silently \
                     wrong answers; the Integrity view (5) shows the whole chain. Press \
                     Ctrl-O to chat with it anyway (as --no-verify does)."
                ),
                true,
                true,
            ));
            // Wait for the override (or the app closing the channel).
            loop {
                match rx.recv() {
                    Ok(ChatCommand::LoadUnverified) => break,
                    Ok(_) => continue,
                    Err(_) => return None,
                }
            }
        }
        Err(e) => {
            report(unavailable(
                "The model cannot be checked",
                e.to_string(),
                true,
                false,
            ));
            return None;
        }
    }
    let model = match load_unverified(
        file.clone(),
        &LoadOptions {
            precision,
            ..Default::default()
        },
    ) {
        Ok(m) => Arc::new(m),
        Err(LoadError::Model(ModelError::Unsupported(what))) => {
            report(unavailable(
                "The engine cannot run this model yet",
                format!("It needs {what}. The other views work as before."),
                false,
                false,
            ));
            return None;
        }
        Err(e) => {
            report(unavailable(
                "The model does not load",
                e.to_string(),
                true,
                false,
            ));
            return None;
        }
    };
    let bundle = match ChatBundle::from_model(&file) {
        Ok(b) => Arc::new(b),
        Err(e) => {
            report(unavailable(
                "The chat bundle does not load",
                e.to_string(),
                true,
                false,
            ));
            return None;
        }
    };
    let context = CHAT_CONTEXT.min(model.config.max_positions).max(1);
    match Conversation::new(model, bundle, context, Settings::default()) {
        Ok(mut c) => {
            // The routing view (7) shows every position's experts (a no-op without MoE).
            c.log_routes();
            Some(c)
        }
        Err(e) => {
            report(unavailable(
                "Nothing to chat with",
                e.to_string(),
                false,
                false,
            ));
            None
        }
    }
}

enum Start {
    Reply,
    Regenerate,
}

/// One answer to run: its job, how it starts, and what to run it under.
struct Turn<'a> {
    job: u64,
    start: Start,
    choosing: &'a Choosing,
}

/// What the routing view's mirror of the route log holds: the tokens of the rows sent.
#[derive(Default)]
struct RouteSync {
    sent: Vec<u32>,
    /// The last request's id (a reset has none of its own).
    job: u64,
}

/// Longest token text a route row carries: the view shows short pieces only.
const PIECE_CHARS: usize = 24;

impl RouteSync {
    /// Reports the rows of `session`'s route log that the mirror lacks. Within an answer
    /// the log only grows (`full` false: O(1) besides the new rows); after a new prompt,
    /// a reset or a replay (`full`) the sent tokens are compared with the session's, so a
    /// recomputed tail is sent again. Nothing at all for a model without MoE.
    fn sync(
        &mut self,
        session: &Session,
        bundle: &ChatBundle,
        job: u64,
        full: bool,
        report: &(dyn Fn(ChatReport) + Sync),
    ) {
        self.job = job;
        let Some(log) = session.routes() else {
            return;
        };
        let tokens = session.tokens();
        let len = log.len.min(tokens.len());
        let keep = if full {
            self.sent
                .iter()
                .zip(&tokens[..len])
                .take_while(|(a, b)| a == b)
                .count()
        } else {
            self.sent.len().min(len)
        };
        if keep == self.sent.len() && keep == len {
            return;
        }
        let rows = keep..len;
        let tok = bundle.tokenizer();
        let new = RouteRows {
            from: keep,
            tokens: tokens[rows.clone()]
                .iter()
                .map(|&id| {
                    let text = tok
                        .and_then(|t| t.decode(&[id], false).ok())
                        .unwrap_or_default();
                    (id, text.chars().take(PIECE_CHARS).collect())
                })
                .collect(),
            layers: log
                .layers
                .iter()
                .map(|l| {
                    let span = rows.start * l.k..rows.end * l.k;
                    (l.chosen[span.clone()].to_vec(), l.weights[span].to_vec())
                })
                .collect(),
        };
        self.sent.truncate(keep);
        self.sent.extend_from_slice(&tokens[rows]);
        report(ChatReport::Routes { job, rows: new });
    }
}

/// Runs one answer to its end, reporting each step.
/// `auto` and `blend` are resolved for the message first; `false` when that failed
/// (reported) and nothing was answered.
fn answer(
    conv: &mut Conversation,
    turn: Turn,
    cancel: &AtomicBool,
    report: &(dyn Fn(ChatReport) + Sync),
    gate: Option<&Gate>,
    routes: &mut RouteSync,
) -> bool {
    let Turn {
        job,
        start,
        choosing,
    } = turn;
    if let Err(message) = choose_for_turn(conv, choosing, job, routes, report) {
        report(ChatReport::Failed { job, message });
        return false;
    }
    let _fg = Foreground::begin();
    // A second handle on the bundle decodes token texts while the reply holds the
    // conversation.
    let bundle = Arc::clone(conv.bundle_arc());
    let tok = bundle.tokenizer();
    let choice = Some(conv.session().active_label().to_string()).filter(|l| l != "backbone");
    let started = match start {
        Start::Reply => conv.reply(),
        Start::Regenerate => conv.regenerate(),
    };
    let mut reply = match started {
        Ok(r) => r,
        Err(e) => {
            report(ChatReport::Failed {
                job,
                message: e.to_string(),
            });
            return true;
        }
    };
    // Starting cut the log to the prefix the new prompt shares with it.
    routes.sync(reply.session(), &bundle, job, true, report);
    loop {
        if let Some(g) = gate {
            g.pass();
        }
        if cancel.load(Ordering::Relaxed) {
            reply.cancel();
        }
        let step = reply.next();
        // Every step that ran the model logged its rows (nothing to do without MoE).
        routes.sync(reply.session(), &bundle, job, false, report);
        match step {
            Ok(ReplyStep::Prefill { done, total }) => {
                report(ChatReport::Prefill { job, done, total })
            }
            Ok(ReplyStep::Token { token, piece }) => {
                let text_of = |id: u32| {
                    tok.and_then(|t| t.decode(&[id], false).ok())
                        .unwrap_or_default()
                };
                report(ChatReport::Token {
                    job,
                    token: TokenReport {
                        id: token.id,
                        piece: piece.unwrap_or_default(),
                        text: text_of(token.id),
                        prob: token.prob,
                        top: token
                            .top
                            .iter()
                            .map(|(id, p)| (id, text_of(id), p))
                            .collect(),
                    },
                });
            }
            Ok(ReplyStep::Done(stats)) => {
                report(ChatReport::Done {
                    job,
                    text: reply.text().to_string(),
                    ids: reply.ids().to_vec(),
                    stats,
                    choice,
                });
                return true;
            }
            Err(e) => {
                report(ChatReport::Failed {
                    job,
                    message: e.to_string(),
                });
                return true;
            }
        }
    }
}

fn inspect(conv: &Conversation, job: u64) -> ChatReport {
    let failed = |message: String| ChatReport::Failed { job, message };
    let text = match conv.prompt_text() {
        Ok(t) => t,
        Err(e) => return failed(e.to_string()),
    };
    let Some(tok) = conv.bundle().tokenizer() else {
        return failed("no tokenizer".into());
    };
    let ids = match tok.encode(&text, false) {
        Ok(ids) => ids,
        Err(e) => return failed(e.to_string()),
    };
    let tokens = ids
        .iter()
        .map(|&id| {
            (
                tok.decode(&[id], false).unwrap_or_default(),
                id,
                tok.is_special(id),
            )
        })
        .collect();
    ChatReport::Prompt { job, tokens }
}

fn load_session(
    conv: &mut Conversation,
    job: u64,
    saved: &SavedSession,
    replay: bool,
    cancel: &AtomicBool,
    report: &(dyn Fn(ChatReport) + Sync),
) {
    conv.settings = saved.settings();
    if !saved.matches_model(conv.model().file.primary().directory_hash()) {
        report(ChatReport::Note(format!(
            "the session was saved from another model ({}): answers will differ",
            saved.model.path
        )));
    }
    if replay {
        let _fg = Foreground::begin();
        let result = conv.replay_until(saved, &|| cancel.load(Ordering::Relaxed));
        report(ChatReport::Messages {
            job,
            messages: saved.messages.clone(),
        });
        match result {
            Ok(turns) => {
                let same = turns.iter().filter(|t| t.same()).count();
                report(ChatReport::Replayed {
                    job,
                    same,
                    differ: turns.len() - same,
                });
            }
            Err(e) => report(ChatReport::Failed {
                job,
                message: e.to_string(),
            }),
        }
    } else {
        conv.set_messages(saved.messages.clone());
        report(ChatReport::Messages {
            job,
            messages: saved.messages.clone(),
        });
    }
}

/// The task and skill the user asked for, and what a switch does to the cache.
#[derive(Clone, Debug)]
struct Choosing {
    req: Request,
    policy: SwitchPolicy,
}

impl Default for Choosing {
    fn default() -> Self {
        Choosing {
            req: Request::default(),
            policy: SwitchPolicy::Reprefill,
        }
    }
}

/// Switches the conversation to `resolved` unless it already runs under that choice;
/// the switch's report, or why the engine refused it.
fn switch_to(
    conv: &mut Conversation,
    active: cortiq_engine::model::select::Active,
    policy: SwitchPolicy,
    routes: &mut RouteSync,
    job: u64,
    report: &(dyn Fn(ChatReport) + Sync),
) -> Result<Option<SwitchReport>, String> {
    if label_of(conv.model(), &active) == conv.session().active_label() {
        return Ok(None);
    }
    let _fg = Foreground::begin();
    let r = conv.switch(active, policy).map_err(|e| e.to_string())?;
    if r.recomputed > 0 {
        // The recomputed positions routed anew (an expert mask changes the routes):
        // the mirror gets them again.
        let keep = conv.session().tokens().len().saturating_sub(r.recomputed);
        routes.sent.truncate(keep);
        routes.sync(conv.session(), conv.bundle(), job, true, report);
    }
    Ok(Some(r))
}

/// A `Choose`: a fixed choice is resolved and switched to now; `auto` and `blend` wait
/// for the next message (their task, if any, is checked now).
fn choose(
    conv: &mut Conversation,
    choosing: &mut Choosing,
    job: u64,
    request: Request,
    policy: SwitchPolicy,
    routes: &mut RouteSync,
    report: &(dyn Fn(ChatReport) + Sync),
) {
    let model = conv.model().clone();
    let refused = |message: String| ChatReport::ChoiceRefused { job, message };
    let now = if request.skill.needs_prompt() {
        Request {
            task: request.task.clone(),
            skill: SkillRequest::None,
        }
    } else {
        request.clone()
    };
    let resolved = {
        let _fg = Foreground::begin();
        resolve(&model, &now, &[])
    };
    let r = match resolved {
        Ok(r) => r,
        Err(e) => return report(refused(e.to_string())),
    };
    let switch = if request.skill.needs_prompt() {
        None
    } else {
        match switch_to(conv, r.active, policy, routes, job, report) {
            Ok(s) => s,
            Err(e) => return report(refused(e)),
        }
    };
    choosing.req = request;
    choosing.policy = policy;
    report(ChatReport::Choice(Box::new(ChoiceReport {
        job,
        request: choosing.req.clone(),
        policy,
        active: ActiveInfo::of(conv.session()),
        switch,
        routing: None,
        warnings: r.warnings,
        blend_bytes: r.blend_bytes,
    })));
}

/// Before an answer: `auto` and `blend` are resolved on the last user message's raw
/// tokens, and the conversation switches when the choice changes (as `cortiq run`).
fn choose_for_turn(
    conv: &mut Conversation,
    choosing: &Choosing,
    job: u64,
    routes: &mut RouteSync,
    report: &(dyn Fn(ChatReport) + Sync),
) -> Result<(), String> {
    if !choosing.req.skill.needs_prompt() {
        return Ok(());
    }
    let model = conv.model().clone();
    let text = conv.last_user().unwrap_or_default().to_string();
    let ids: Vec<u32> = conv
        .bundle()
        .tokenizer()
        .and_then(|t| t.encode(&text, false).ok())
        .unwrap_or_default();
    let resolved = {
        let _fg = Foreground::begin();
        resolve(&model, &choosing.req, &ids)
    };
    let r = resolved.map_err(|e| e.to_string())?;
    let switch = switch_to(conv, r.active, choosing.policy, routes, job, report)?;
    report(ChatReport::Choice(Box::new(ChoiceReport {
        job,
        request: choosing.req.clone(),
        policy: choosing.policy,
        active: ActiveInfo::of(conv.session()),
        switch,
        routing: r.routing,
        warnings: r.warnings,
        blend_bytes: r.blend_bytes,
    })));
    Ok(())
}
