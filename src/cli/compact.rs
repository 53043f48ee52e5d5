//! `cortiq compact FILE -o OUT`: a plain tight rewrite (dead bytes, gaps and stale
//! metadata left by append-only growth dropped; tensors, masks, vocab, index unchanged).

use std::path::PathBuf;

use cortiq_engine::format::writer;
use serde_json::json;

use super::common::{
    emit, esc_path, human_bytes, open, print_json, refuse_overwriting_input, CliError, CmdResult,
    Status,
};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Model file to rewrite.
    pub file: PathBuf,
    /// Output file (must not be the input).
    #[arg(short, long)]
    pub output: PathBuf,
    /// One JSON document on stdout.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: &Args) -> CmdResult {
    refuse_overwriting_input(&[&args.file], &args.output)?;
    let file = open(&args.file)?;
    // A reserved dtype or another defect of the input is the file's fault (1); I/O stays 2.
    let summary =
        writer::compact(&file, &args.output).map_err(|e| CliError::format(&args.file, &e))?;
    if args.json {
        print_json(
            &json!({"ok": true, "output": summary.path, "bytes_before": file.len(), "bytes_after": summary.bytes, "tensors": summary.tensors}),
        )?;
    } else {
        emit(&format!(
            "compacted {} ({}) -> {} ({}), {} tensors\n",
            esc_path(&args.file),
            human_bytes(file.len()),
            esc_path(&args.output),
            human_bytes(summary.bytes),
            summary.tensors
        ))?;
    }
    Ok(Status::Success)
}
