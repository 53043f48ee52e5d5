//! `cortiq`: the workbench for CMF v2 model files.
//!
//! `cortiq FILE` opens the workbench; every view is also a scriptable subcommand. Exit
//! codes (DESIGN.md): 0 success, 1 the file is invalid or fails a check, 2 usage or I/O
//! error. clap's own usage errors already exit 2.

mod app;
mod cli;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use cli::common::CmdResult;

/// Inspect, verify and run CMF v2 model files.
#[derive(Parser, Debug)]
#[command(
    name = "cortiq",
    version,
    about,
    long_about = "Inspect, verify and run CMF v2 model files.\n\n\
        `cortiq FILE` opens FILE in the interactive workbench (not built yet: for now it \
        prints what `cortiq info FILE` prints). Every view is also a subcommand; those that \
        print take --json for one JSON document on stdout.\n\n\
        Exit codes: 0 success; 1 the file is invalid or fails verification; 2 usage or I/O error.",
    args_conflicts_with_subcommands = true,
    arg_required_else_help = true
)]
struct Cli {
    /// Model file to open in the workbench (for now: `cortiq info FILE`).
    file: Option<PathBuf>,

    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Open FILE in the interactive workbench (for now: prints `info`).
    Tui(TuiArgs),
    /// Envelope, sections, header, tensor totals, tokenizer, masks, skills, warnings.
    Info(cli::info::Args),
    /// The tensor directory, filtered and sorted.
    Tensors(cli::tensors::Args),
    /// Task masks: per-layer density of neurons, heads, gates and experts.
    Masks(cli::masks::Args),
    /// The skills registry and each skill's replaced tensors.
    Skills(cli::skills::Args),
    /// Compare two files: tensors, header, masks, skills, tokenizer.
    Diff(cli::diff::Args),
    /// Check the integrity chain (header, directory, sections, every tensor) and the signature.
    Verify(cli::verify::Args),
    /// Write a detached Ed25519 signature `<FILE>.sig`.
    Sign(cli::sign::Args),
    /// Rewrite a file tightly (drops dead bytes left by append-only growth).
    Compact(cli::compact::Args),
    /// Skills: list, export to a standalone skill file, apply one, add one (append-only).
    #[command(subcommand)]
    Skill(cli::skill::Command),
    /// Write a self-made demo model (every dtype, masks, a skill, experts) and show it.
    Demo(cli::demo::Args),
}

/// Arguments of `cortiq tui`; the workbench task will move this into `src/app`.
#[derive(clap::Args, Debug)]
struct TuiArgs {
    /// Model file.
    file: PathBuf,
}

impl Command {
    /// Whether errors must also be reported as a JSON document on stdout.
    fn json(&self) -> bool {
        match self {
            Command::Tui(_) => false,
            Command::Info(a) => a.json,
            Command::Tensors(a) => a.json,
            Command::Masks(a) => a.json,
            Command::Skills(a) => a.json,
            Command::Diff(a) => a.json,
            Command::Verify(a) => a.json,
            Command::Sign(a) => a.json,
            Command::Compact(a) => a.json,
            Command::Skill(c) => c.json(),
            Command::Demo(a) => a.json,
        }
    }

    fn run(&self) -> CmdResult {
        match self {
            Command::Tui(a) => match app::terminal::run(Some(&a.file)) {
                Ok(()) => Ok(cli::common::Status::Success),
                Err(e) => Err(cli::common::CliError::io(e)),
            },
            Command::Info(a) => cli::info::run(a),
            Command::Tensors(a) => cli::tensors::run(a),
            Command::Masks(a) => cli::masks::run(a),
            Command::Skills(a) => cli::skills::run(a),
            Command::Diff(a) => cli::diff::run(a),
            Command::Verify(a) => cli::verify::run(a),
            Command::Sign(a) => cli::sign::run(a),
            Command::Compact(a) => cli::compact::run(a),
            Command::Skill(c) => cli::skill::run(c),
            Command::Demo(a) => cli::demo::run(a),
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // `cortiq FILE` is the workbench's entry point; until it exists it shows `info`.
    let command = match (cli.command, cli.file) {
        (Some(c), _) => c,
        (None, Some(file)) => Command::Tui(TuiArgs { file }),
        // arg_required_else_help already printed help and exited 2 for a bare `cortiq`.
        (None, None) => return ExitCode::from(2),
    };
    match command.run() {
        Ok(status) => status.into(),
        Err(e) => {
            e.report(command.json());
            e.exit_code()
        }
    }
}
