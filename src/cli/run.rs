//! `cortiq run FILE`: chat in the terminal (history kept, answers streamed, Ctrl-C stops
//! the answer and not the program, `/commands` for settings and sessions), or one-shot
//! with `--prompt` or `--ids`. `--json` prints `{"ids", "text", "stats"}` (DESIGN.md).
//! The chat goes through the engine's `Conversation`, as the workbench's chat view does.

use std::io::{BufRead, IsTerminal, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use cortiq_engine::chat::conversation::{
    Conversation, ConversationError, ReplyStep, SavedSession, Settings,
};
use cortiq_engine::chat::ChatBundle;
use cortiq_engine::model::Model;
use cortiq_engine::runtime::choice::{resolve, Request, Resolved, SkillRequest};
use cortiq_engine::runtime::sampler::SamplingParams;
use cortiq_engine::runtime::session::{
    label_of, GenerateParams, GenerationStats, Session, Step, SwitchPolicy, SwitchReport,
};
use serde_json::{json, Map, Value};

use super::common::{emit, esc, esc_path, print_json, CliError, CmdResult, Status};
use super::engine::{model_error, parse_ids, parse_var, ChoiceArgs, ModelArgs};

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// One-shot: answer this and exit (without it, an interactive chat).
    #[arg(short = 'p', long, conflicts_with = "ids")]
    pub prompt: Option<String>,
    /// One-shot on token ids (no tokenizer, no template), comma-separated.
    #[arg(long, value_name = "1,2,3")]
    pub ids: Option<String>,
    /// Feed the prompt text as it is, without the chat template.
    #[arg(long)]
    pub raw: bool,
    /// A system message opening the conversation.
    #[arg(long)]
    pub system: Option<String>,
    /// A chat-template variable, e.g. `enable_thinking=false`. Repeatable.
    #[arg(long = "var", value_name = "KEY=VALUE")]
    pub vars: Vec<String>,
    /// Greedy decoding (the same as --temperature 0).
    #[arg(long)]
    pub greedy: bool,
    #[arg(long, default_value_t = 512, value_name = "N")]
    pub max_tokens: usize,
    #[arg(long, default_value_t = 0.8)]
    pub temperature: f32,
    /// 0 = off.
    #[arg(long, default_value_t = 40)]
    pub top_k: usize,
    #[arg(long, default_value_t = 0.95)]
    pub top_p: f32,
    #[arg(long, default_value_t = 0.05)]
    pub min_p: f32,
    /// 1 = off.
    #[arg(long, default_value_t = 1.0)]
    pub repeat_penalty: f32,
    /// Sampling seed (default: from the clock).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Keep generating past the end-of-sequence tokens.
    #[arg(long)]
    pub ignore_eos: bool,
    /// Print timings after each answer (stderr).
    #[arg(long)]
    pub stats: bool,
    /// Start from a saved session (`/save` in the chat, or the workbench's): its
    /// messages and settings.
    #[arg(long, value_name = "S.json", conflicts_with_all = ["prompt", "ids"])]
    pub session: Option<std::path::PathBuf>,
    /// Speculative decoding with the file's MTP head (§2.1): the same output as without
    /// it when greedy (the same distribution when sampling), faster when drafts are
    /// accepted. The stats report drafts and acceptance.
    #[arg(long)]
    pub mtp: bool,
    /// Write per-layer expert selection counts and weight mass (MoE models) of every
    /// position run, as JSON (format `cortiq-route-stats` v1; `moe-mask` and
    /// `moe-defrag` read it). Written at the end, atomically.
    #[arg(long, value_name = "FILE.json")]
    pub route_stats: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub choice: ChoiceArgs,
    /// What a switch in the chat does to the conversation already cached: `reprefill`
    /// (computes it again under the new choice: exact) or `keep` (keeps it: fast, but
    /// approximate, since it was computed under the old choice).
    #[arg(long, value_name = "reprefill|keep", default_value = "reprefill")]
    pub switch: String,
    #[arg(long)]
    pub json: bool,
}

/// The task and skill the user asked for, and what switching does.
struct Choosing {
    req: Request,
    policy: SwitchPolicy,
    /// Warnings already printed (each once).
    warned: std::collections::BTreeSet<String>,
}

impl Choosing {
    fn from_args(a: &Args) -> Result<Choosing, CliError> {
        Ok(Choosing {
            req: a.choice.request()?,
            policy: parse_policy(&a.switch).map_err(CliError::usage)?,
            warned: Default::default(),
        })
    }

    fn is_plain(&self) -> bool {
        self.req == Request::default()
    }

    /// Resolves the request for `prompt` (raw tokens of what the user asks); prints its
    /// warnings once each.
    fn resolve(&mut self, a: &Args, model: &Model, prompt: &[u32]) -> Result<Resolved, CliError> {
        let r = resolve(model, &self.req, prompt).map_err(|e| model_error(&a.model.file, &e))?;
        for w in &r.warnings {
            if self.warned.insert(w.clone()) {
                eprintln!("cortiq: warning: {w}");
            }
        }
        if r.blend_bytes > 0 && !a.json {
            eprintln!(
                "cortiq: skill blend: {} of weights materialised",
                super::common::human_bytes(r.blend_bytes as u64)
            );
        }
        Ok(r)
    }
}

fn parse_policy(s: &str) -> Result<SwitchPolicy, String> {
    match s {
        "reprefill" | "exact" => Ok(SwitchPolicy::Reprefill),
        "keep" | "keep-cache" => Ok(SwitchPolicy::KeepCache),
        _ => Err(format!("switch policy {s:?}: expected reprefill or keep")),
    }
}

/// Raw tokens of `text` (what routing scores): no template, no special tokens.
fn routing_ids(bundle: &ChatBundle, text: &str) -> Vec<u32> {
    bundle
        .tokenizer()
        .and_then(|t| t.encode(text, false).ok())
        .unwrap_or_default()
}

/// Resolves the choice for the last user message and switches the conversation when it
/// changes; says so in the chat.
fn choose_for_turn(
    a: &Args,
    conv: &mut Conversation,
    choosing: &mut Choosing,
    announce: bool,
) -> Result<(), CliError> {
    if choosing.is_plain() && conv.session().active_label() == "backbone" {
        return Ok(());
    }
    let text = conv.last_user().unwrap_or_default().to_string();
    let ids = routing_ids(conv.bundle(), &text);
    let model = conv.model().clone();
    let r = choosing.resolve(a, &model, &ids)?;
    let label = label_of(&model, &r.active);
    if label == conv.session().active_label() {
        return Ok(());
    }
    let report = conv
        .switch(r.active, choosing.policy)
        .map_err(|e| conversation_error(a, e))?;
    if announce {
        eprintln!("{}", switch_line(&report));
    }
    Ok(())
}

/// `[── task code (re-prefilled 120 positions in 0.08 s) ──]`
fn switch_line(r: &SwitchReport) -> String {
    let how = match r.policy {
        SwitchPolicy::KeepCache => format!("cache kept: {} positions from {}", r.kept, r.from),
        SwitchPolicy::Reprefill => format!(
            "re-prefilled {} positions in {:.2} s",
            r.recomputed, r.elapsed_s
        ),
    };
    format!("[── {} ({how}) ──]", r.to)
}

impl Args {
    fn sampling(&self) -> Result<SamplingParams, CliError> {
        let p = SamplingParams {
            temperature: if self.greedy { 0.0 } else { self.temperature },
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repetition_penalty: self.repeat_penalty,
            seed: self.seed.unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos() as u64)
            }),
        };
        p.validate().map_err(CliError::usage)?;
        Ok(p)
    }

    fn vars(&self) -> Result<Map<String, Value>, CliError> {
        let mut extra = Map::new();
        for v in &self.vars {
            let (k, val) = parse_var(v, "--var")?;
            extra.insert(k, val);
        }
        Ok(extra)
    }

    fn settings(&self) -> Result<Settings, CliError> {
        Ok(Settings {
            system: self.system.clone(),
            vars: self.vars()?,
            sampling: self.sampling()?,
            max_tokens: self.max_tokens,
            ignore_eos: self.ignore_eos,
        })
    }
}

fn chat_error(a: &Args, e: impl std::fmt::Display) -> CliError {
    CliError {
        kind: "Chat".into(),
        message: format!("{}: {e}", a.model.file.display()),
        code: 1,
    }
}

fn conversation_error(a: &Args, e: ConversationError) -> CliError {
    match e {
        ConversationError::Model { error, .. } => model_error(&a.model.file, &error),
        ConversationError::ContextFull { .. } => CliError {
            kind: "Model".into(),
            message: format!("{}: {e}", a.model.file.display()),
            code: 2,
        },
        other => chat_error(a, other),
    }
}

fn stats_line(s: &GenerationStats) -> String {
    format!(
        "[{} prompt tokens ({} reused) at {:.1} tok/s, {} generated at {:.1} tok/s, ttft {:.0} ms, {} of {} context, stop: {:?}{}]",
        s.prompt_tokens,
        s.reused_tokens,
        s.prefill_tok_s,
        s.generated_tokens,
        s.decode_tok_s,
        s.ttft_s * 1e3,
        s.context_used,
        s.context_capacity,
        s.stop,
        if s.drafted > 0 {
            format!(
                ", MTP drafts {} accepted of {} ({:.0}%)",
                s.accepted,
                s.drafted,
                100.0 * s.accepted as f64 / s.drafted as f64
            )
        } else {
            String::new()
        }
    )
}

/// Ctrl-C cancels the answer being generated; at the prompt it ends the program.
struct Interrupt {
    cancel: Arc<AtomicBool>,
    generating: Arc<AtomicBool>,
}

impl Interrupt {
    fn install() -> Interrupt {
        let cancel = Arc::new(AtomicBool::new(false));
        let generating = Arc::new(AtomicBool::new(false));
        let (c, g) = (cancel.clone(), generating.clone());
        // Without a handler (another one installed) Ctrl-C simply ends the program.
        let _ = ctrlc::set_handler(move || {
            if g.load(Ordering::SeqCst) {
                c.store(true, Ordering::SeqCst);
            } else {
                eprintln!();
                std::process::exit(130);
            }
        });
        Interrupt { cancel, generating }
    }

    fn begin(&self) {
        self.cancel.store(false, Ordering::SeqCst);
        self.generating.store(true, Ordering::SeqCst);
    }

    fn end(&self) {
        self.generating.store(false, Ordering::SeqCst);
    }

    fn requested(&self) -> bool {
        self.cancel.load(Ordering::Relaxed)
    }
}

pub fn run(a: &Args) -> CmdResult {
    if a.max_tokens == 0 {
        return Err(CliError::usage("--max-tokens must be at least 1"));
    }
    let settings = a.settings()?;
    let model = a.model.load()?;
    let bundle = Arc::new(ChatBundle::from_model(&model.file).map_err(|e| chat_error(a, e))?);
    let interrupt = Interrupt::install();
    let context = a.model.context(&model);
    if a.mtp && model.mtp.is_none() {
        return Err(CliError::usage(format!(
            "--mtp: {} has no MTP head (model.mtp.*)",
            a.model.file.display()
        )));
    }
    if a.route_stats.is_some() && !model.has_moe() {
        return Err(CliError::usage(format!(
            "--route-stats: {} has no mixture-of-experts layer",
            a.model.file.display()
        )));
    }

    let mut choosing = Choosing::from_args(a)?;
    if a.ids.is_some() || (a.prompt.is_some() && a.raw) {
        return one_shot_raw(
            a,
            &model,
            &bundle,
            &settings,
            context,
            &interrupt,
            &mut choosing,
        );
    }
    let mut conv = Conversation::new(model.clone(), bundle.clone(), context, settings).map_err(
        |e| match e {
            ConversationError::Chat(cortiq_engine::chat::ChatError::NoTokenizer) => chat_error(
                a,
                "the file has no tokenizer: nothing to chat with (use --ids)",
            ),
            e => conversation_error(a, e),
        },
    )?;
    if a.mtp {
        conv.set_speculative(true).map_err(CliError::usage)?;
    }
    if a.route_stats.is_some() {
        conv.log_routes();
    }
    if let Some(p) = &a.prompt {
        conv.push_user(p.as_str());
        choose_for_turn(a, &mut conv, &mut choosing, false)?;
        let stream = !a.json;
        let (ids, text, stats) = answer(a, &mut conv, &interrupt, stream, false)?;
        write_route_stats(a, conv.session())?;
        return print_answer(a, &ids, &text, &stats);
    }
    if a.json {
        return Err(CliError::usage("--json needs --prompt or --ids"));
    }
    if let Some(path) = &a.session {
        let saved = read_session(path).map_err(CliError::usage)?;
        if let Some(w) = load_session(&mut conv, &saved) {
            eprintln!("cortiq: warning: {w}");
        }
    }
    if !choosing.req.skill.needs_prompt() && !choosing.is_plain() {
        // A fixed choice holds from the first turn (and unknown names fail before it).
        let model = conv.model().clone();
        let r = choosing.resolve(a, &model, &[])?;
        conv.switch(r.active, SwitchPolicy::Reprefill)
            .map_err(|e| conversation_error(a, e))?;
    }
    let r = chat_loop(a, &mut conv, &interrupt, &mut choosing);
    write_route_stats(a, conv.session())?;
    r
}

/// `--route-stats`: the counts of every position the session holds.
fn write_route_stats(a: &Args, session: &Session) -> Result<(), CliError> {
    let (Some(path), Some(log)) = (&a.route_stats, session.routes()) else {
        return Ok(());
    };
    let mut stats = log.stats(0..log.len);
    stats.model = Some(a.model.file.display().to_string());
    let text = serde_json::to_string_pretty(&stats).expect("route stats serialise");
    cortiq_engine::format::writer::write_atomic(path, text.as_bytes())
        .map_err(|e| CliError::io(format!("--route-stats: {e}")))?;
    Ok(())
}

/// The end of a one-shot answer: the JSON document, or a newline and the stats line.
fn print_answer(a: &Args, ids: &[u32], text: &str, stats: &GenerationStats) -> CmdResult {
    if a.json {
        print_json(&json!({ "ids": ids, "text": text, "stats": stats }))?;
    } else {
        emit("\n")?;
        if a.stats {
            eprintln!("{}", stats_line(stats));
        }
    }
    Ok(Status::Success)
}

/// `--ids`, or `--prompt --raw`: the tokens as they are, no template.
fn one_shot_raw(
    a: &Args,
    model: &Arc<cortiq_engine::model::Model>,
    bundle: &ChatBundle,
    settings: &Settings,
    context: usize,
    interrupt: &Interrupt,
    choosing: &mut Choosing,
) -> CmdResult {
    let prompt_ids = if let Some(ids) = &a.ids {
        parse_ids(ids, model.config.vocab)?
    } else {
        let tok = bundle
            .tokenizer()
            .ok_or_else(|| chat_error(a, "the file has no tokenizer; use --ids"))?;
        // Raw text gets the tokenizer's own special tokens (a BOS for Llama-style ones).
        tok.encode(a.prompt.as_deref().unwrap_or_default(), true)
            .map_err(|e| chat_error(a, e))?
    };
    let params = GenerateParams {
        max_tokens: settings.max_tokens,
        sampling: settings.sampling.clone(),
        stop_ids: if a.ignore_eos {
            Vec::new()
        } else {
            bundle.eos_token_ids().to_vec()
        },
    };
    let mut session = Session::new(model.clone(), context);
    if a.mtp {
        session.set_speculative(true).map_err(CliError::usage)?;
    }
    if a.route_stats.is_some() {
        session.log_routes();
    }
    if !choosing.is_plain() {
        let r = choosing.resolve(a, model, &prompt_ids)?;
        session
            .switch(r.active, SwitchPolicy::Reprefill)
            .map_err(|e| model_error(&a.model.file, &e))?;
    }
    let mut printer = bundle.tokenizer().map(|t| t.stream(true));
    let mut text = String::new();
    let mut out = std::io::stdout();
    let stream = !a.json;
    interrupt.begin();
    let result = (|| {
        let mut g = session.start(&prompt_ids, &params)?;
        loop {
            if interrupt.requested() {
                g.cancel();
            }
            match g.next().map_err(|e| e.error)? {
                Step::Token(t) => {
                    if let Some(p) = printer.as_mut() {
                        if let Ok(Some(piece)) = p.step(t.id) {
                            if stream {
                                let _ = write!(out, "{}", esc_keep_newlines(&piece));
                                let _ = out.flush();
                            }
                            text.push_str(&piece);
                        }
                    }
                }
                Step::Prefill { .. } => {}
                Step::Done(stats) => return Ok((g.output().to_vec(), stats)),
            }
        }
    })();
    interrupt.end();
    let (ids, stats) = result.map_err(|e| model_error(&a.model.file, &e))?;
    write_route_stats(a, &session)?;
    if let Some(Ok(Some(rest))) = printer.as_mut().map(|p| p.finish()) {
        if stream {
            let _ = write!(out, "{}", esc_keep_newlines(&rest));
        }
        text.push_str(&rest);
    }
    print_answer(a, &ids, &text, &stats)
}

const CHAT_HELP: &str = "commands:
  /system TEXT        set the system prompt (/system alone clears it)
  /set KEY VALUE      temp, top-k, top-p, min-p, repeat, seed, max-tokens, greedy on|off,
                      ignore-eos on|off,
                      var NAME=VALUE (a template variable, e.g. var enable_thinking=false)
  /show               the settings in force
  /retry              answer the last question again
  /reset              forget the conversation
  /save FILE          save the session (messages, settings, generated ids) as JSON
  /load FILE          continue a saved session
  /replay             generate every answer of the conversation again and compare the ids
  /task NAME|none     run under a task mask from the next answer on
  /skill ID|none|auto|blend[:T]
                      read a skill's tensors (auto: routed on each message)
  /switch keep|reprefill
                      what a switch does with the cached conversation
  /exit               quit (also Ctrl-D)";

fn chat_loop(
    a: &Args,
    conv: &mut Conversation,
    interrupt: &Interrupt,
    choosing: &mut Choosing,
) -> CmdResult {
    let interactive = std::io::stdin().is_terminal();
    if interactive {
        eprintln!(
            "chat with {} ({} template; Ctrl-C stops an answer, Ctrl-D or /exit quits, /help lists commands)",
            a.model.file.display(),
            conv.bundle().template_origin().as_str()
        );
    }
    let stdin = std::io::stdin();
    let mut line = String::new();
    loop {
        if interactive {
            eprint!("> ");
            let _ = std::io::stderr().flush();
        }
        line.clear();
        match stdin.lock().read_line(&mut line) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) => return Err(CliError::io(format!("reading stdin: {e}"))),
        }
        let text = line.trim_end_matches(['\n', '\r']);
        if text.trim().is_empty() {
            continue;
        }
        let retry = match command(a, conv, text.trim(), choosing) {
            Command::Message => false,
            Command::Retry => true,
            Command::Done(msg) => {
                if !msg.is_empty() {
                    eprintln!("{msg}");
                }
                continue;
            }
            Command::Exit => break,
        };
        if !retry {
            conv.push_user(text);
        }
        if let Err(e) = choose_for_turn(a, conv, choosing, true) {
            eprintln!("[{}]", e.message);
            let mut msgs = conv.messages().to_vec();
            msgs.pop();
            conv.set_messages(msgs);
            continue;
        }
        match answer(a, conv, interrupt, true, retry) {
            Ok((_, _, stats)) => {
                emit("\n")?;
                if a.stats || stats.stop != cortiq_engine::runtime::session::StopReason::Eos {
                    eprintln!("{}", stats_line(&stats));
                }
            }
            Err(e) if e.code == 2 || e.kind == "Chat" => {
                // The turn did not fit or the template refused it: say so, keep chatting.
                eprintln!("[{}]", e.message);
                let mut msgs = conv.messages().to_vec();
                if msgs.last().map(|m| m.role)
                    == Some(cortiq_engine::chat::conversation::Role::User)
                    && !retry
                {
                    msgs.pop();
                    conv.set_messages(msgs);
                }
            }
            Err(e) => return Err(e),
        }
    }
    Ok(Status::Success)
}

enum Command {
    /// Not a command: a message to answer.
    Message,
    Retry,
    Exit,
    /// Handled; print this.
    Done(String),
}

/// `/commands` of the line chat.
fn command(a: &Args, conv: &mut Conversation, text: &str, choosing: &mut Choosing) -> Command {
    let Some(rest) = text.strip_prefix('/') else {
        return Command::Message;
    };
    let (name, arg) = rest
        .split_once(char::is_whitespace)
        .map_or((rest, ""), |(n, r)| (n, r.trim()));
    let done = |s: String| Command::Done(s);
    match name {
        "exit" | "quit" => Command::Exit,
        "task" | "skill" | "switch" if !arg.is_empty() => {
            let mut next = choosing.req.clone();
            match name {
                "task" => next.task = (arg != "none").then(|| arg.to_string()),
                "skill" => match SkillRequest::parse(arg) {
                    Ok(s) => next.skill = s,
                    Err(e) => return done(format!("[/skill: {e}]")),
                },
                _ => {
                    return match parse_policy(arg) {
                        Ok(p) => {
                            choosing.policy = p;
                            done(format!("[switches: {arg}]"))
                        }
                        Err(e) => done(format!("[/switch: {e}]")),
                    }
                }
            }
            let prev = std::mem::replace(&mut choosing.req, next);
            if choosing.req.skill.needs_prompt() {
                return done("[the skill is chosen on each message]".into());
            }
            let model = conv.model().clone();
            let switched = choosing.resolve(a, &model, &[]).and_then(|r| {
                conv.switch(r.active, choosing.policy)
                    .map_err(|e| conversation_error(a, e))
            });
            match switched {
                Ok(report) => done(switch_line(&report)),
                Err(e) => {
                    choosing.req = prev;
                    done(format!("[/{name}: {}]", e.message))
                }
            }
        }
        "help" | "?" => done(CHAT_HELP.into()),
        "reset" | "clear" => {
            conv.reset();
            done("[conversation forgotten]".into())
        }
        "system" => {
            conv.settings.system = (!arg.is_empty()).then(|| arg.to_string());
            done(if arg.is_empty() {
                "[system prompt cleared]".into()
            } else {
                "[system prompt set]".into()
            })
        }
        "set" => match set_setting(&mut conv.settings, arg) {
            Ok(()) => done(format!("[{}]", settings_line(&conv.settings))),
            Err(e) => done(format!("[/set: {e}]")),
        },
        "show" | "settings" => done(format!(
            "[{}]\n[system: {}]",
            settings_line(&conv.settings),
            conv.settings.system.as_deref().unwrap_or("(none)")
        )),
        "retry" | "regen" => {
            if conv.messages().last().map(|m| m.role)
                == Some(cortiq_engine::chat::conversation::Role::Assistant)
            {
                let mut msgs = conv.messages().to_vec();
                msgs.pop();
                conv.set_messages(msgs);
                Command::Retry
            } else {
                done("[no answer to retry]".into())
            }
        }
        "save" if !arg.is_empty() => {
            let saved = SavedSession::of(
                conv,
                &a.model.file.display().to_string(),
                conv.model().precision(),
            );
            match cortiq_engine::format::writer::write_atomic(
                std::path::Path::new(arg),
                saved.to_json().as_bytes(),
            ) {
                Ok(()) => done(format!(
                    "[saved {} messages to {}]",
                    conv.messages().len(),
                    esc_path(std::path::Path::new(arg))
                )),
                Err(e) => done(format!("[/save: {e}]")),
            }
        }
        "load" if !arg.is_empty() => match read_session(std::path::Path::new(arg)) {
            Ok(saved) => {
                let warning = load_session(conv, &saved);
                done(format!(
                    "[loaded {} messages]{}",
                    saved.messages.len(),
                    warning
                        .map(|w| format!("\n[warning: {w}]"))
                        .unwrap_or_default()
                ))
            }
            Err(e) => done(format!("[/load: {e}]")),
        },
        "replay" => {
            let saved = SavedSession::of(conv, "", conv.model().precision());
            match conv.replay(&saved) {
                Ok(turns) if turns.is_empty() => done("[nothing to replay]".into()),
                Ok(turns) => {
                    let same = turns.iter().filter(|t| t.same()).count();
                    done(format!(
                        "[replayed {} answers: {same} identical, {} differ{}]",
                        turns.len(),
                        turns.len() - same,
                        if conv.settings.sampling.is_greedy() {
                            ""
                        } else {
                            " (sampling is not greedy: answers may differ)"
                        }
                    ))
                }
                Err(e) => done(format!("[/replay: {e}]")),
            }
        }
        _ => done(format!("[unknown command /{name}: /help lists them]")),
    }
}

pub fn read_session(path: &std::path::Path) -> Result<SavedSession, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    SavedSession::from_json(&text).map_err(|e| format!("{}: {e}", path.display()))
}

/// Takes a saved session's messages and settings; a warning when it was saved from
/// another model.
fn load_session(conv: &mut Conversation, saved: &SavedSession) -> Option<String> {
    conv.settings = saved.settings();
    conv.set_messages(saved.messages.clone());
    let hash = conv.model().file.primary().directory_hash();
    (!saved.matches_model(hash)).then(|| {
        format!(
            "the session was saved from another model ({}, directory hash {}); answers will differ",
            saved.model.path, saved.model.directory_hash
        )
    })
}

/// The sampler in one line.
pub fn settings_line(s: &Settings) -> String {
    let p = &s.sampling;
    let how = if p.is_greedy() {
        "greedy".to_string()
    } else {
        format!(
            "temp {} · top-k {} · top-p {} · min-p {}",
            p.temperature, p.top_k, p.top_p, p.min_p
        )
    };
    format!(
        "{how} · repeat {} · seed {} · max {} tokens",
        p.repetition_penalty, p.seed, s.max_tokens
    )
}

/// `/set KEY VALUE`.
pub fn set_setting(s: &mut Settings, arg: &str) -> Result<(), String> {
    let (key, value) = arg
        .split_once(char::is_whitespace)
        .map(|(k, v)| (k, v.trim()))
        .ok_or("expected KEY VALUE (e.g. /set temp 0.3)")?;
    let mut next = s.clone();
    let num = |v: &str| {
        v.parse::<f32>()
            .map_err(|_| format!("{v:?} is not a number"))
    };
    let int = |v: &str| {
        v.parse::<u64>()
            .map_err(|_| format!("{v:?} is not a whole number"))
    };
    match key {
        "temp" | "temperature" => next.sampling.temperature = num(value)?,
        "top-k" | "top_k" => next.sampling.top_k = int(value)? as usize,
        "top-p" | "top_p" => next.sampling.top_p = num(value)?,
        "min-p" | "min_p" => next.sampling.min_p = num(value)?,
        "repeat" | "repeat-penalty" | "repeat_penalty" => {
            next.sampling.repetition_penalty = num(value)?
        }
        "seed" => next.sampling.seed = int(value)?,
        "max-tokens" | "max_tokens" => {
            next.max_tokens = (int(value)? as usize).max(1);
        }
        "greedy" => match value {
            "on" | "true" | "1" => next.sampling.temperature = 0.0,
            "off" | "false" | "0" => {
                if next.sampling.temperature <= 0.0 {
                    next.sampling.temperature = Settings::default().sampling.temperature;
                }
            }
            other => return Err(format!("greedy {other:?}: expected on or off")),
        },
        "ignore-eos" | "ignore_eos" => match value {
            "on" | "true" | "1" => next.ignore_eos = true,
            "off" | "false" | "0" => next.ignore_eos = false,
            other => return Err(format!("ignore-eos {other:?}: expected on or off")),
        },
        "var" => {
            let (k, v) = parse_var(value, "var").map_err(|e| e.message)?;
            next.vars.insert(k, v);
        }
        other => return Err(format!("unknown setting {other:?}")),
    }
    next.sampling.validate()?;
    *s = next;
    Ok(())
}

/// Generates one answer to the conversation's last user message (or, with `retry`, the
/// same question again), streaming its text to stdout when `stream`.
fn answer(
    a: &Args,
    conv: &mut Conversation,
    interrupt: &Interrupt,
    stream: bool,
    _retry: bool,
) -> Result<(Vec<u32>, String, GenerationStats), CliError> {
    let mut out = std::io::stdout();
    let mut printed = 0;
    interrupt.begin();
    let result = (|| {
        let mut reply = conv.reply()?;
        loop {
            if interrupt.requested() {
                reply.cancel();
            }
            match reply.next()? {
                ReplyStep::Token {
                    piece: Some(piece), ..
                } if stream => {
                    // Model output may hold control characters: escape them.
                    let _ = write!(out, "{}", esc_keep_newlines(&piece));
                    let _ = out.flush();
                    printed += piece.len();
                }
                ReplyStep::Done(stats) => {
                    // What the detokenizer held back until the end.
                    if stream {
                        let rest = reply.text().get(printed..).unwrap_or_default();
                        let _ = write!(out, "{}", esc_keep_newlines(rest));
                    }
                    return Ok((reply.ids().to_vec(), reply.text().to_string(), stats));
                }
                _ => {}
            }
        }
    })();
    interrupt.end();
    result.map_err(|e| conversation_error(a, e))
}

/// [`esc`] for generated text, which may hold newlines and tabs but nothing that moves the
/// cursor or changes the terminal.
fn esc_keep_newlines(s: &str) -> String {
    s.split('\n')
        .map(|l| l.split('\t').map(esc).collect::<Vec<_>>().join("\t"))
        .collect::<Vec<_>>()
        .join("\n")
}
