//! `cortiq demo`: writes the self-made demo model (every writable dtype, task masks with
//! expert fields, a skill, MoE layers — see `cortiq_engine::synth`), verifies it, and shows
//! it: in the workbench when run on a terminal, as a printed summary otherwise.

use std::path::PathBuf;

use cortiq_engine::format::verify::{verify, VerifyOptions};
use cortiq_engine::synth;
use serde_json::json;

use super::common::{emit, esc_path, human_bytes, open, print_json, CliError, CmdResult, Status};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Where to write the demo model.
    #[arg(short, long, default_value = "cortiq-demo.cmf")]
    pub output: PathBuf,
    /// One JSON document on stdout.
    #[arg(long)]
    pub json: bool,
    /// Print the summary instead of opening the workbench (the default off a terminal).
    #[arg(long)]
    pub no_tui: bool,
}

impl Args {
    fn open_workbench(&self) -> bool {
        use std::io::IsTerminal;
        !self.no_tui && std::io::stdout().is_terminal() && std::io::stdin().is_terminal()
    }
}

pub fn run(args: &Args) -> CmdResult {
    let summary = synth::write_demo(&args.output).map_err(|e| CliError::io(e.to_string()))?;
    let file = open(&args.output)?;
    let report = verify(&file, &VerifyOptions::default(), &|_| {});
    if !report.ok {
        return Err(CliError {
            kind: "HashMismatch".into(),
            message: "the demo file fails its own verification".into(),
            code: 1,
        });
    }
    if args.json {
        print_json(&json!({
            "ok": true,
            "output": summary.path,
            "bytes": summary.bytes,
            "tensors": summary.tensors,
            "masks": file.masks.as_ref().map(|m| m.meta.masks.iter().map(|r| r.name.clone()).collect::<Vec<_>>()),
            "skills": file.header.skills.as_ref().map(|s| s.iter().map(|r| r.id.clone()).collect::<Vec<_>>()),
        }))?;
        return Ok(Status::Success);
    }
    let mut dtypes: Vec<&str> = file.directory.iter().map(|e| e.dtype.name()).collect();
    dtypes.sort_unstable();
    dtypes.dedup();
    emit(&format!(
        "wrote {} ({}, {} tensors) and verified it\n  dtypes  {}\n  masks   {}\n  skills  {}\n\n",
        esc_path(&args.output),
        human_bytes(summary.bytes),
        summary.tensors,
        dtypes.join(", "),
        file.masks
            .as_ref()
            .map(|m| m
                .meta
                .masks
                .iter()
                .map(|r| r.name.clone())
                .collect::<Vec<_>>()
                .join(", "))
            .unwrap_or_default(),
        file.header
            .skills
            .as_ref()
            .map(|s| s
                .iter()
                .map(|r| r.id.clone())
                .collect::<Vec<_>>()
                .join(", "))
            .unwrap_or_default(),
    ))?;
    if args.open_workbench() {
        return crate::tui(Some(&args.output));
    }
    super::info::run(&super::info::Args::text(args.output.clone()))?;
    emit(&format!(
        "\nExplore it: cortiq tensors {0} | cortiq masks {0} | cortiq skills {0} | cortiq verify {0}\n",
        esc_path(&args.output)
    ))?;
    Ok(Status::Success)
}
