//! `cortiq defrag FILE --task NAME -o OUT` (§11): the task mask's dead FFN neurons removed
//! from the file (`cortiq_engine::import::rewrite::defrag`). The output has no masks
//! section and records `provenance.defrag`.
//!
//! A mask that also turns off attention heads or layer gates is refused (head and layer
//! pruning are out of scope, §11) unless `--ffn-only` asks for its FFN bits alone.

use std::path::{Path, PathBuf};

use cortiq_engine::format::FormatError;
use cortiq_engine::import::rewrite::defrag::{defrag, DefragOptions};
use cortiq_engine::import::rewrite::RewriteError;
use serde_json::json;

use super::common::{
    emit, esc, esc_path, human_bytes, open, opt, print_json, refuse_overwriting_input, Align,
    CliError, CmdResult, Status, Table,
};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Model file with task masks.
    pub file: PathBuf,
    /// The task whose dead FFN neurons are removed.
    #[arg(long)]
    pub task: String,
    /// Output file (must not be the input).
    #[arg(short, long)]
    pub output: PathBuf,
    /// Apply only the mask's FFN bits when it also turns off heads or layers (those are
    /// then kept and run).
    #[arg(long)]
    pub ffn_only: bool,
    /// One JSON document on stdout.
    #[arg(long)]
    pub json: bool,
}

/// The exit code of a rewrite's failure: a request the file cannot honour is a usage
/// error (2), a file that contradicts itself is invalid (1), I/O is 2.
pub(crate) fn rewrite_error(path: &Path, e: RewriteError) -> CliError {
    match e {
        RewriteError::UnknownTask { .. } | RewriteError::Refused(_) => {
            CliError::usage(e.to_string())
        }
        RewriteError::Invalid(m) => CliError {
            kind: "Invalid".into(),
            message: format!("{}: {m}", path.display()),
            code: 1,
        },
        RewriteError::Format(f @ FormatError::Io { .. }) => CliError::io(f.to_string()),
        RewriteError::Format(f) => CliError::format(path, &f),
    }
}

pub fn run(args: &Args) -> CmdResult {
    refuse_overwriting_input(&[&args.file], &args.output)?;
    let file = open(&args.file)?;
    let opts = DefragOptions {
        task: args.task.clone(),
        ffn_only: args.ffn_only,
    };
    let s = defrag(&file, &args.output, &opts).map_err(|e| rewrite_error(&args.file, e))?;
    if args.json {
        print_json(&json!({
            "ok": true,
            "output": s.write.path,
            "task": s.task,
            "bytes_before": file.len(),
            "bytes_after": s.write.bytes,
            "tensors": s.write.tensors,
            "rewritten": s.rewritten,
            "intermediate_size": s.intermediate_size,
            "ignored": s.ignored,
            "layers": s.layers,
        }))?;
        return Ok(Status::Success);
    }
    let mut text = format!(
        "defragged {} ({}) by task {} -> {} ({}), {} tensors re-encoded\n",
        esc_path(&args.file),
        human_bytes(file.len()),
        esc(&s.task),
        esc_path(&args.output),
        human_bytes(s.write.bytes),
        s.rewritten
    );
    if !s.ignored.is_empty() {
        text.push_str(&format!(
            "  --ffn-only: the mask's {} were not applied\n",
            s.ignored.join(" and ")
        ));
    }
    let mut t = Table::new(&[
        ("layer", Align::Right),
        ("ffn", Align::Left),
        ("width", Align::Right),
        ("kept", Align::Right),
        ("down_proj", Align::Left),
    ]);
    for l in &s.layers {
        let down = match (l.down_dtype_before, l.down_dtype_after) {
            (Some(a), Some(b)) if a != b => format!("{a} -> {b}"),
            (_, b) => opt(b),
        };
        t.row([
            l.layer.to_string(),
            l.kind.to_string(),
            opt(l.width_before),
            opt(l.width_after),
            down,
        ]);
    }
    t.render(&mut text);
    emit(&text)?;
    Ok(Status::Success)
}
