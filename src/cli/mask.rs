//! `cortiq mask calibrate FILE --task NAME --prompts P.txt --keep F [--heads F]
//! [--heldout H.txt] -o OUT`: a task mask from the activation mass of every FFN neuron
//! (and the importance of every head) over the prompts, its quality measured as the
//! held-out perplexity ratio against the dense model (§5.1) — `null` without a held-out
//! text, never invented.

use std::path::{Path, PathBuf};

use cortiq_engine::runtime::calibrate::{task_mask, write_with_mask, TaskSpec};
use serde_json::{json, Value};

use super::common::{
    emit, esc, esc_path, open, print_json, refuse_overwriting_input, CliError, CmdResult, Status,
};
use super::engine::{model_error, ModelArgs};

#[derive(clap::Subcommand, Debug)]
pub enum Command {
    /// Make a task mask from activation statistics over prompts, with measured quality.
    Calibrate(CalibrateArgs),
}

impl Command {
    pub fn json(&self) -> bool {
        match self {
            Command::Calibrate(a) => a.json,
        }
    }
}

#[derive(clap::Args, Debug)]
pub struct CalibrateArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The new task's name.
    #[arg(long)]
    pub task: String,
    /// Prompts that represent the task, one per line.
    #[arg(long, value_name = "P.txt")]
    pub prompts: PathBuf,
    /// Fraction of every dense layer's FFN neurons to keep (those with the most
    /// activation mass), in (0, 1].
    #[arg(long, value_name = "FRACTION")]
    pub keep: f64,
    /// Fraction of every attention layer's heads to keep (the most important), in (0, 1].
    #[arg(long, value_name = "FRACTION", default_value_t = 1.0)]
    pub heads: f64,
    /// Held-out text of the task: the quality is its perplexity with the mask over
    /// without (without it, quality is null: not measured).
    #[arg(long, value_name = "H.txt")]
    pub heldout: Option<PathBuf>,
    /// Calibrate on the prompt lines as raw text (default: each line as a one-turn chat,
    /// through the file's chat template, as the task will be used).
    #[arg(long)]
    pub raw: bool,
    /// Replace a task of the same name.
    #[arg(long)]
    pub replace: bool,
    #[arg(short, long)]
    pub output: PathBuf,
    #[arg(long)]
    pub json: bool,
}

pub fn run(cmd: &Command) -> CmdResult {
    match cmd {
        Command::Calibrate(a) => calibrate(a),
    }
}

fn read(path: &Path, what: &str) -> Result<String, CliError> {
    std::fs::read_to_string(path)
        .map_err(|e| CliError::usage(format!("{what} {}: {e}", path.display())))
}

fn calibrate(a: &CalibrateArgs) -> CmdResult {
    let fraction_ok = |f: f64| f.is_finite() && f > 0.0 && f <= 1.0;
    if !fraction_ok(a.keep) || !fraction_ok(a.heads) {
        return Err(CliError::usage(
            "--keep and --heads are fractions in (0, 1]",
        ));
    }
    if a.task.is_empty() || a.task.chars().any(char::is_control) {
        return Err(CliError::usage("--task needs a printable name"));
    }
    let mut inputs = vec![a.model.file.as_path(), a.prompts.as_path()];
    inputs.extend(a.heldout.as_deref());
    refuse_overwriting_input(&inputs, &a.output)?;
    let file = open(&a.model.file)?;
    let model = a.model.load()?;
    let bundle = a.model.bundle(&model, "")?;
    let tok = bundle.tokenizer().expect("bundle() checked the tokenizer");
    let encode = |text: &str| {
        tok.encode(text, true)
            .map_err(|e| CliError::usage(format!("tokenizing: {e}")))
    };
    let as_chat = |line: &str| -> Result<Vec<u32>, CliError> {
        if a.raw {
            return encode(line);
        }
        let opts = cortiq_engine::chat::template::RenderOptions {
            add_generation_prompt: true,
            ..Default::default()
        };
        let text = bundle
            .render_chat(&json!([{"role": "user", "content": line}]), &opts)
            .map_err(|e| CliError::usage(format!("rendering a prompt (--raw skips it): {e}")))?;
        bundle
            .encode_prompt(&text)
            .map_err(|e| CliError::usage(format!("tokenizing: {e}")))
    };
    let prompts: Vec<Vec<u32>> = read(&a.prompts, "--prompts")?
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(as_chat)
        .collect::<Result<_, _>>()?;
    if prompts.is_empty() {
        return Err(CliError::usage("--prompts has no prompt (one per line)"));
    }
    let err = |e| model_error(&a.model.file, &e);

    let bar = indicatif::ProgressBar::new(prompts.len() as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template("calibrating {bar:30} {pos}/{len} prompts {msg}")
            .expect("a valid template"),
    );
    if a.json {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    let heldout = match &a.heldout {
        None => None,
        Some(path) => {
            let text = read(path, "--heldout")?;
            let ids = encode(&text)?;
            if ids.len() < 2 {
                return Err(CliError::usage("--heldout needs at least 2 tokens"));
            }
            Some((ids, text))
        }
    };
    let spec = TaskSpec {
        name: &a.task,
        prompts: &prompts,
        keep: a.keep,
        keep_heads: a.heads,
        heldout: heldout.as_ref().map(|(i, t)| (i.as_slice(), t.as_bytes())),
        window: a.model.context(&model),
    };
    let (mut record, blob, tokens) =
        task_mask(&model, &spec, &mut |done, _| bar.set_position(done as u64)).map_err(err)?;
    bar.finish_and_clear();
    if let Some(c) = record.extra.get_mut("calibration") {
        c["chat"] = json!(!a.raw);
    }
    let sparsity = record.sparsity.unwrap_or(0.0);
    let quality = record.quality.clone().unwrap_or(Value::Null);
    let field = file
        .header
        .arch
        .as_ref()
        .and_then(|x| x.intermediate_size)
        .map_or(model.config.intermediate as u64, |n| n);
    let summary =
        write_with_mask(&file, &a.output, record, blob, a.replace, Some(field)).map_err(|e| {
            CliError {
                kind: e.kind().to_string(),
                message: e.message(),
                code: 2,
            }
        })?;
    if a.json {
        print_json(&json!({
            "ok": true, "output": summary.path, "task": a.task, "sparsity": sparsity,
            "prompts": prompts.len(), "tokens": tokens, "quality": quality,
        }))?;
    } else {
        let q = match quality.get("value").and_then(Value::as_f64) {
            Some(v) => format!(
                "held-out perplexity ×{v:.4} of dense ({:.3} vs {:.3}, {} tokens)",
                quality["masked"].as_f64().unwrap_or(0.0),
                quality["baseline_dense"].as_f64().unwrap_or(0.0),
                quality["n_samples"]
            ),
            None => "quality not measured (no --heldout)".into(),
        };
        emit(&format!(
            "task {}: {:.1}% of FFN neurons masked out, from {} prompts ({} tokens); {q}\n\
             wrote {}\n",
            esc(&a.task),
            100.0 * sparsity,
            prompts.len(),
            tokens,
            esc_path(&a.output)
        ))?;
    }
    Ok(Status::Success)
}
