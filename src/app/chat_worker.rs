//! The chat worker: a long-lived thread that owns the model and the [`Conversation`],
//! takes commands over a channel and reports every step back as an Action. The UI never
//! waits on the engine; a running answer is cancelled through a shared flag, checked
//! between steps. Every report of a request carries its job id, so that the chat state
//! drops stale ones in one place.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;

use cortiq_engine::chat::conversation::{Conversation, Message, ReplyStep, SavedSession, Settings};
use cortiq_engine::chat::ChatBundle;
use cortiq_engine::exec::Foreground;
use cortiq_engine::format::shards::CmfModel;
use cortiq_engine::model::{ModelError, Precision};
use cortiq_engine::runtime::load::{load_unverified, verify_model, LoadError, LoadOptions};
use cortiq_engine::runtime::session::GenerationStats;

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
            | ChatReport::Replayed { job, .. } => Some(*job),
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
    report(ChatReport::Ready {
        precision: name_of(precision).into(),
        capacity: conv.session().capacity(),
        warnings: conv.model().warnings.clone(),
    });
    while let Ok(cmd) = rx.recv() {
        match cmd {
            ChatCommand::Send { job, text } => {
                conv.push_user(text);
                answer(&mut conv, job, cancel, report, Start::Reply, gate);
            }
            ChatCommand::Regenerate { job } => {
                answer(&mut conv, job, cancel, report, Start::Regenerate, gate)
            }
            ChatCommand::EditResend { job, text } => match conv.edit_last_user(text) {
                Ok(()) => answer(&mut conv, job, cancel, report, Start::Reply, gate),
                Err(e) => report(ChatReport::Failed {
                    job,
                    message: e.to_string(),
                }),
            },
            ChatCommand::Reset => conv.reset(),
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
            } => load_session(&mut conv, job, &session, replay, cancel, report),
            ChatCommand::LoadUnverified => {}
        }
    }
}

fn name_of(p: Precision) -> &'static str {
    match p {
        Precision::Exact => "exact",
        Precision::Fast => "fast",
    }
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
        Ok(c) => Some(c),
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

/// Runs one answer to its end, reporting each step.
fn answer(
    conv: &mut Conversation,
    job: u64,
    cancel: &AtomicBool,
    report: &(dyn Fn(ChatReport) + Sync),
    start: Start,
    gate: Option<&Gate>,
) {
    let _fg = Foreground::begin();
    // A second handle on the bundle decodes token texts while the reply holds the
    // conversation.
    let bundle = Arc::clone(conv.bundle_arc());
    let tok = bundle.tokenizer();
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
            return;
        }
    };
    loop {
        if let Some(g) = gate {
            g.pass();
        }
        if cancel.load(Ordering::Relaxed) {
            reply.cancel();
        }
        match reply.next() {
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
                });
                return;
            }
            Err(e) => {
                report(ChatReport::Failed {
                    job,
                    message: e.to_string(),
                });
                return;
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
