//! `cortiq moe-defrag FILE (--stats S.json --cover C | --task NAME) -o OUT` (§11.1): only
//! the experts a workload routes to are kept — the smallest top set reaching fraction C
//! of each layer's routing mass in route stats (`cortiq-route-stats` v1, as `run
//! --route-stats` writes them), or the experts a task's expert fields make routable.
//! Kept experts are renumbered `0..k`, router rows gathered, payloads copied byte for
//! byte (`cortiq_engine::import::rewrite::experts`). Masks with expert fields are dropped
//! (they name the old experts); the others are kept.

use std::path::{Path, PathBuf};

use cortiq_engine::import::rewrite::experts::{moe_defrag, KeepFrom, LayerKeep};
use cortiq_engine::runtime::routes::RouteStats;
use serde_json::json;

use super::common::{
    emit, esc, esc_path, human_bytes, open, print_json, ranges, refuse_overwriting_input, Align,
    CliError, CmdResult, Status, Table,
};
use super::defrag::rewrite_error;

#[derive(clap::Args, Debug)]
#[command(group(clap::ArgGroup::new("from").required(true).args(["stats", "task"])))]
pub struct Args {
    /// MoE model file.
    pub file: PathBuf,
    /// Route stats JSON (`cortiq run --route-stats`, the Routing view's `x`).
    #[arg(long, value_name = "S.json", requires = "cover")]
    pub stats: Option<PathBuf>,
    /// Fraction of each layer's routing mass the kept experts must reach, in (0, 1].
    #[arg(long, requires = "stats")]
    pub cover: Option<f64>,
    /// Keep the experts routable under this task's expert fields.
    #[arg(long, conflicts_with_all = ["stats", "cover"])]
    pub task: Option<String>,
    /// Output file (must not be the input).
    #[arg(short, long)]
    pub output: PathBuf,
    /// One JSON document on stdout.
    #[arg(long)]
    pub json: bool,
}

/// Reads a route-stats document: a missing file is an I/O error, a malformed one a usage
/// error (exit 2 either way).
pub(crate) fn read_route_stats(path: &Path) -> Result<RouteStats, CliError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| CliError::io(format!("read {}: {e}", path.display())))?;
    RouteStats::from_json(&text).map_err(|e| CliError::usage(format!("{}: {e}", path.display())))
}

/// The kept-experts table of a layer list (moe-defrag and moe-mask print the same).
pub(crate) fn keep_table(layers: &[LayerKeep], text: &mut String) {
    let mut t = Table::new(&[
        ("layer", Align::Right),
        ("experts", Align::Right),
        ("kept", Align::Right),
        ("which", Align::Left),
    ]);
    for l in layers {
        let mut which = ranges(l.kept.iter().copied());
        if let Some(n) = &l.note {
            which.push_str(&format!(" ({})", esc(n)));
        }
        t.row([
            l.layer.to_string(),
            l.experts.to_string(),
            l.kept.len().to_string(),
            which,
        ]);
    }
    t.render(text);
}

pub fn run(args: &Args) -> CmdResult {
    refuse_overwriting_input(&[&args.file], &args.output)?;
    let stats = args.stats.as_deref().map(read_route_stats).transpose()?;
    let file = open(&args.file)?;
    let from = match (&stats, &args.task) {
        (Some(stats), _) => KeepFrom::Stats {
            stats,
            cover: args.cover.unwrap_or(1.0),
        },
        (None, Some(task)) => KeepFrom::Task(task),
        (None, None) => {
            return Err(CliError::usage(
                "give --stats S.json --cover C, or --task NAME",
            ))
        }
    };
    let s = moe_defrag(&file, &args.output, from).map_err(|e| rewrite_error(&args.file, e))?;
    if args.json {
        print_json(&json!({
            "ok": true,
            "output": s.write.path,
            "bytes_before": file.len(),
            "bytes_after": s.write.bytes,
            "tensors": s.write.tensors,
            "experts_copied": s.experts_copied,
            "experts_dropped": s.experts_dropped,
            "dropped_masks": s.dropped_masks,
            "layers": s.layers,
        }))?;
        return Ok(Status::Success);
    }
    let mut text = format!(
        "moe-defrag {} ({}) -> {} ({}): {} expert tensors copied, {} dropped\n",
        esc_path(&args.file),
        human_bytes(file.len()),
        esc_path(&args.output),
        human_bytes(s.write.bytes),
        s.experts_copied,
        s.experts_dropped
    );
    if !s.dropped_masks.is_empty() {
        let names: Vec<String> = s.dropped_masks.iter().map(|n| esc(n)).collect();
        text.push_str(&format!(
            "  masks dropped (their expert fields name the old experts): {}\n",
            names.join(", ")
        ));
    }
    keep_table(&s.layers, &mut text);
    emit(&text)?;
    Ok(Status::Success)
}
