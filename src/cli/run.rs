//! `cortiq run FILE`: chat in the terminal (history kept within the session, answers
//! streamed, Ctrl-C stops the answer and not the program), or one-shot with `--prompt`
//! or `--ids`. `--json` prints `{"ids", "text", "stats"}` (DESIGN.md).

use std::io::{BufRead, IsTerminal, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use cortiq_engine::chat::template::RenderOptions;
use cortiq_engine::chat::ChatBundle;
use cortiq_engine::runtime::sampler::SamplingParams;
use cortiq_engine::runtime::session::{Event, GenerateParams, GenerationStats, Session};
use serde_json::{json, Map, Value};

use super::common::{emit, esc, print_json, CliError, CmdResult, Status};
use super::engine::{model_error, parse_ids, parse_var, ModelArgs};

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
    #[arg(long)]
    pub json: bool,
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

    fn render_options(&self) -> Result<RenderOptions, CliError> {
        let mut extra = Map::new();
        for v in &self.vars {
            let (k, val) = parse_var(v, "--var")?;
            extra.insert(k, val);
        }
        Ok(RenderOptions {
            add_generation_prompt: true,
            extra,
            ..Default::default()
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

fn stats_line(s: &GenerationStats) -> String {
    format!(
        "[{} prompt tokens ({} reused) at {:.1} tok/s, {} generated at {:.1} tok/s, ttft {:.0} ms, {} of {} context, stop: {:?}]",
        s.prompt_tokens,
        s.reused_tokens,
        s.prefill_tok_s,
        s.generated_tokens,
        s.decode_tok_s,
        s.ttft_s * 1e3,
        s.context_used,
        s.context_capacity,
        s.stop
    )
}

pub fn run(a: &Args) -> CmdResult {
    if a.max_tokens == 0 {
        return Err(CliError::usage("--max-tokens must be at least 1"));
    }
    let sampling = a.sampling()?;
    let render = a.render_options()?;
    let model = a.model.load()?;
    let bundle = ChatBundle::from_model(&model.file).map_err(|e| chat_error(a, e))?;
    let mut session = Session::new(model.clone(), a.model.context(&model));
    let params = GenerateParams {
        max_tokens: a.max_tokens,
        sampling,
        stop_ids: if a.ignore_eos {
            Vec::new()
        } else {
            bundle.eos_token_ids().to_vec()
        },
    };

    // Ctrl-C cancels the answer being generated; at the prompt it ends the program.
    let cancel = Arc::new(AtomicBool::new(false));
    let generating = Arc::new(AtomicBool::new(false));
    {
        let (cancel, generating) = (cancel.clone(), generating.clone());
        // Without a handler (another one installed) Ctrl-C simply ends the program.
        let _ = ctrlc::set_handler(move || {
            if generating.load(Ordering::SeqCst) {
                cancel.store(true, Ordering::SeqCst);
            } else {
                eprintln!();
                std::process::exit(130);
            }
        });
    }

    let one_shot = a.prompt.is_some() || a.ids.is_some();
    if one_shot {
        let prompt_ids = if let Some(ids) = &a.ids {
            parse_ids(ids)?
        } else {
            let text = a.prompt.as_deref().unwrap_or_default();
            let rendered = if a.raw {
                text.to_string()
            } else {
                let mut messages = Vec::new();
                if let Some(s) = &a.system {
                    messages.push(json!({"role": "system", "content": s}));
                }
                messages.push(json!({"role": "user", "content": text}));
                bundle
                    .render_chat(&Value::Array(messages), &render)
                    .map_err(|e| chat_error(a, e))?
            };
            let tok = bundle
                .tokenizer()
                .ok_or_else(|| chat_error(a, "the file has no tokenizer; use --ids"))?;
            // Raw text gets the tokenizer's own special tokens; a rendered chat has them.
            tok.encode(&rendered, a.raw).map_err(|e| chat_error(a, e))?
        };
        let stream = !a.json;
        let (ids, text, stats) = answer(
            a,
            &bundle,
            &mut session,
            &prompt_ids,
            &params,
            &cancel,
            &generating,
            stream,
        )?;
        if a.json {
            print_json(&json!({ "ids": ids, "text": text, "stats": stats }))?;
        } else {
            emit("\n")?;
            if a.stats {
                eprintln!("{}", stats_line(&stats));
            }
        }
        return Ok(Status::Success);
    }

    // Interactive chat.
    if a.json {
        return Err(CliError::usage("--json needs --prompt or --ids"));
    }
    let tok = bundle
        .tokenizer()
        .ok_or_else(|| chat_error(a, "the file has no tokenizer: nothing to chat with"))?;
    let interactive = std::io::stdin().is_terminal();
    if interactive {
        eprintln!(
            "chat with {} ({} template; Ctrl-C stops an answer, Ctrl-D or /exit quits, /reset forgets)",
            a.model.file.display(),
            bundle.template_origin().as_str()
        );
    }
    let mut messages: Vec<Value> = Vec::new();
    if let Some(s) = &a.system {
        messages.push(json!({"role": "system", "content": s}));
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
        match text.trim() {
            "" => continue,
            "/exit" | "/quit" => break,
            "/reset" => {
                messages.retain(|m| m["role"] == "system");
                session.reset();
                eprintln!("[conversation forgotten]");
                continue;
            }
            _ => {}
        }
        messages.push(json!({"role": "user", "content": text}));
        let rendered = bundle
            .render_chat(&Value::Array(messages.clone()), &render)
            .map_err(|e| chat_error(a, e))?;
        let prompt_ids = tok.encode(&rendered, false).map_err(|e| chat_error(a, e))?;
        if prompt_ids.len() >= session.capacity() {
            eprintln!(
                "[the conversation ({} tokens) fills the context of {}: /reset to start over]",
                prompt_ids.len(),
                session.capacity()
            );
            messages.pop();
            continue;
        }
        let (_, answer_text, stats) = answer(
            a,
            &bundle,
            &mut session,
            &prompt_ids,
            &params,
            &cancel,
            &generating,
            true,
        )?;
        emit("\n")?;
        if a.stats || stats.stop != cortiq_engine::runtime::session::StopReason::Eos {
            eprintln!("{}", stats_line(&stats));
        }
        messages.push(json!({"role": "assistant", "content": answer_text}));
    }
    Ok(Status::Success)
}

/// Generates one answer, streaming its text to stdout when `stream`.
#[allow(clippy::too_many_arguments)]
fn answer(
    a: &Args,
    bundle: &ChatBundle,
    session: &mut Session,
    prompt: &[u32],
    params: &GenerateParams,
    cancel: &AtomicBool,
    generating: &AtomicBool,
    stream: bool,
) -> Result<(Vec<u32>, String, GenerationStats), CliError> {
    let mut text = String::new();
    let mut printer = bundle.tokenizer().map(|t| t.stream(true));
    let mut failure = None;
    let mut out = std::io::stdout();
    cancel.store(false, Ordering::SeqCst);
    generating.store(true, Ordering::SeqCst);
    let result = session.generate(prompt, params, Some(cancel), &mut |ev| {
        if let (Event::Token { id, .. }, Some(p)) = (ev, printer.as_mut()) {
            match p.step(*id) {
                Ok(Some(piece)) => {
                    if stream {
                        // Model output may hold control characters: escape them.
                        let _ = write!(out, "{}", esc_keep_newlines(&piece));
                        let _ = out.flush();
                    }
                    text.push_str(&piece);
                }
                Ok(None) => {}
                Err(e) => failure = Some(e.to_string()),
            }
        }
    });
    generating.store(false, Ordering::SeqCst);
    let (ids, stats) = result.map_err(|e| model_error(&a.model.file, &e))?;
    if let Some(p) = printer.as_mut() {
        if let Ok(Some(rest)) = p.finish() {
            if stream {
                let _ = write!(out, "{}", esc_keep_newlines(&rest));
            }
            text.push_str(&rest);
        }
    }
    if let Some(f) = failure {
        return Err(chat_error(a, f));
    }
    Ok((ids, text, stats))
}

/// [`esc`] for generated text, which may hold newlines and tabs but nothing that moves the
/// cursor or changes the terminal.
fn esc_keep_newlines(s: &str) -> String {
    s.split('\n')
        .map(|l| l.split('\t').map(esc).collect::<Vec<_>>().join("\t"))
        .collect::<Vec<_>>()
        .join("\n")
}
