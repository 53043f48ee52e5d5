//! `cortiq`: the workbench for CMF v2 model files.
//!
//! `cortiq FILE` opens the workbench; every view is also a scriptable subcommand. Exit
//! codes (DESIGN.md): 0 success, 1 the file is invalid or fails a check, 2 usage or I/O
//! error. clap's own usage errors already exit 2.

mod alloc_count;
mod app;
mod cli;
mod trust;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use cli::common::CmdResult;

/// Counts allocations (`cortiq bench` reports those of its decode loop).
#[global_allocator]
static GLOBAL: alloc_count::Counting = alloc_count::Counting;

/// Inspect, verify and run CMF v2 model files.
#[derive(Parser, Debug)]
#[command(
    name = "cortiq",
    version,
    about,
    long_about = "Inspect, verify and run CMF v2 model files.\n\n\
        `cortiq FILE` opens FILE in the interactive workbench (`cortiq` alone opens a file \
        picker); when standard output is not a terminal it prints what `cortiq info FILE` \
        prints. Every view is also a subcommand; those that print take --json for one JSON \
        document on stdout.\n\n\
        Config: <config dir>/cortiq/config.toml (or $CORTIQ_CONFIG): theme, colors, keys. \
        NO_COLOR is honoured. Logs: <cache dir>/cortiq/cortiq.log (or $CORTIQ_LOG).\n\n\
        Exit codes: 0 success; 1 the file is invalid or fails verification; 2 usage or I/O error.",
    args_conflicts_with_subcommands = true
)]
struct Cli {
    /// Model file to open in the workbench.
    file: Option<PathBuf>,
    /// Open the Chat view with this saved session (its answers are replayed and compared).
    #[arg(long, value_name = "S.json")]
    session: Option<PathBuf>,

    #[command(subcommand)]
    command: Option<Command>,
}

// Parsed once per process: the size of the largest variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
enum Command {
    /// Open FILE in the interactive workbench (a picker without FILE).
    Tui(TuiArgs),
    /// Envelope, sections, header, tensor totals, tokenizer, masks, skills, warnings.
    Info(cli::info::Args),
    /// The tensor directory, filtered and sorted.
    Tensors(cli::tensors::Args),
    /// Task masks: per-layer density of neurons, heads, gates and experts.
    Masks(cli::masks::Args),
    /// Author task masks: `mask calibrate` (from activation statistics, quality measured).
    #[command(subcommand)]
    Mask(cli::mask::Command),
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
    /// Import a GGUF file (llama, qwen2, qwen3, gemma3) as a CMF file.
    ImportGguf(cli::import_gguf::Args),
    /// Render a conversation with the file's chat template (optionally with token ids).
    Prompt(cli::prompt::Args),
    /// Convert a Hugging Face checkpoint directory into a CMF file.
    Convert(cli::convert::Args),
    /// Remove a task mask's dead FFN neurons from the file (§11).
    Defrag(cli::defrag::Args),
    /// Keep only the experts a workload routes to (route stats or a task's expert fields, §11.1).
    MoeDefrag(cli::moe_defrag::Args),
    /// Add a task mask whose expert fields come from route stats (§5).
    MoeMask(cli::moe_mask::Args),
    /// Re-encode chosen tensors into another dtype, copying the rest unchanged (§3.1).
    Requant(cli::requant::Args),
    /// Skills: list, export to a standalone skill file, apply one, add one (append-only).
    #[command(subcommand)]
    Skill(cli::skill::Command),
    /// Fetch SmolLM2-135M-Instruct once, import it as a demo CMF and chat with it (--synthetic: the self-made demo).
    Demo(cli::demo::Args),
    /// Every position's logits (and hidden states) of one forward, as safetensors.
    Logits(cli::logits::Args),
    /// Prefill and decode speed, time to first token, peak RSS.
    Bench(cli::bench::Args),
    /// Chat with the model, or answer one prompt (`--prompt`, `--ids`).
    Run(cli::run::Args),
    /// Perplexity: teacher-forced negative log-likelihood per token of a text.
    Ppl(cli::ppl::Args),
    /// Score the skills for a prompt (recon-argmin routing, §9): E per skill and the choice.
    Route(cli::route::Args),
}

/// Arguments of `cortiq tui`; the workbench task will move this into `src/app`.
#[derive(clap::Args, Debug)]
struct TuiArgs {
    /// Model file; without it, a picker over the `.cmf` files of the current directory.
    file: Option<PathBuf>,
    /// Open the Chat view with this saved session (its answers are replayed and compared).
    #[arg(long, value_name = "S.json")]
    session: Option<PathBuf>,
}

impl Command {
    /// Whether errors must also be reported as a JSON document on stdout.
    fn json(&self) -> bool {
        match self {
            Command::Tui(_) => false,
            Command::Info(a) => a.json,
            Command::Tensors(a) => a.json,
            Command::Masks(a) => a.json,
            Command::Mask(c) => c.json(),
            Command::Skills(a) => a.json,
            Command::Diff(a) => a.json,
            Command::Verify(a) => a.json,
            Command::Sign(a) => a.json,
            Command::Compact(a) => a.json,
            Command::ImportGguf(a) => a.json,
            Command::Prompt(a) => a.json,
            Command::Convert(a) => a.json,
            Command::Defrag(a) => a.json,
            Command::MoeDefrag(a) => a.json,
            Command::MoeMask(a) => a.json,
            Command::Requant(a) => a.json,
            Command::Skill(c) => c.json(),
            Command::Demo(a) => a.json,
            Command::Logits(a) => a.json,
            Command::Bench(a) => a.json,
            Command::Run(a) => a.json,
            Command::Ppl(a) => a.json,
            Command::Route(a) => a.json,
        }
    }

    fn run(&self) -> CmdResult {
        match self {
            Command::Tui(a) => tui(a.file.as_deref(), a.session.as_deref()),
            Command::Info(a) => cli::info::run(a),
            Command::Tensors(a) => cli::tensors::run(a),
            Command::Masks(a) => cli::masks::run(a),
            Command::Mask(c) => cli::mask::run(c),
            Command::Skills(a) => cli::skills::run(a),
            Command::Diff(a) => cli::diff::run(a),
            Command::Verify(a) => cli::verify::run(a),
            Command::Sign(a) => cli::sign::run(a),
            Command::Compact(a) => cli::compact::run(a),
            Command::ImportGguf(a) => cli::import_gguf::run(a),
            Command::Prompt(a) => cli::prompt::run(a),
            Command::Convert(a) => cli::convert::run(a),
            Command::Defrag(a) => cli::defrag::run(a),
            Command::MoeDefrag(a) => cli::moe_defrag::run(a),
            Command::MoeMask(a) => cli::moe_mask::run(a),
            Command::Requant(a) => cli::requant::run(a),
            Command::Skill(c) => cli::skill::run(c),
            Command::Demo(a) => cli::demo::run(a),
            Command::Logits(a) => cli::logits::run(a),
            Command::Bench(a) => cli::bench::run(a),
            Command::Run(a) => cli::run::run(a),
            Command::Ppl(a) => cli::ppl::run(a),
            Command::Route(a) => cli::route::run(a),
        }
    }
}

/// The workbench on a terminal; `info` (or usage help) when output goes to a pipe or file,
/// so `cortiq FILE | less` and scripts still get something useful.
fn tui(file: Option<&std::path::Path>, session: Option<&std::path::Path>) -> CmdResult {
    use std::io::IsTerminal;
    let mut start = app::StartOptions::default();
    if let Some(s) = session {
        if file.is_none() {
            return Err(cli::common::CliError::usage("--session needs a model file"));
        }
        start.session = Some(cli::run::read_session(s).map_err(cli::common::CliError::usage)?);
        start.tab = Some(app::Tab::Chat);
    }
    if !std::io::stdout().is_terminal() || !std::io::stdin().is_terminal() {
        return match file {
            Some(f) => cli::info::run(&cli::info::Args::text(f.to_path_buf())),
            None => Err(cli::common::CliError::usage(
                "no file given and no terminal for the picker (see --help)",
            )),
        };
    }
    app::terminal::run_with(file, start)
        .map(|()| cli::common::Status::Success)
        .map_err(cli::common::CliError::io)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // `cortiq FILE` is the workbench's entry point; until it exists it shows `info`.
    let command = match (cli.command, cli.file) {
        (Some(c), _) => c,
        (None, file) => Command::Tui(TuiArgs {
            file,
            session: cli.session,
        }),
    };
    match command.run() {
        Ok(status) => status.into(),
        Err(e) => {
            e.report(command.json());
            e.exit_code()
        }
    }
}
