//! `cortiq moe-mask FILE --stats S.json --cover C --name NAME -o OUT` (§5 expert fields):
//! a copy of FILE with one more task mask whose expert fields make routable, per MoE
//! layer, the experts reaching fraction C of the routing mass in the route stats; every
//! FFN neuron, head and layer stays on. Its `quality` is null (not measured), its
//! `sparsity` the share of experts it turns off. Existing masks are kept as they are; a
//! name already taken is an error unless `--replace`.

use std::path::PathBuf;

use cortiq_engine::import::rewrite::experts::{moe_mask, MoeMaskOptions};
use serde_json::json;

use super::common::{
    emit, esc, esc_path, open, print_json, refuse_overwriting_input, CmdResult, Status,
};
use super::defrag::rewrite_error;
use super::moe_defrag::{keep_table, read_route_stats};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// MoE model file.
    pub file: PathBuf,
    /// Route stats JSON (`cortiq run --route-stats`, the Routing view's `x`).
    #[arg(long, value_name = "S.json")]
    pub stats: PathBuf,
    /// Fraction of each layer's routing mass the routable experts must reach, in (0, 1].
    #[arg(long)]
    pub cover: f64,
    /// The new task's name.
    #[arg(long)]
    pub name: String,
    /// Replace a mask of the same name.
    #[arg(long)]
    pub replace: bool,
    /// Output file (must not be the input).
    #[arg(short, long)]
    pub output: PathBuf,
    /// One JSON document on stdout.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: &Args) -> CmdResult {
    refuse_overwriting_input(&[&args.file], &args.output)?;
    let stats = read_route_stats(&args.stats)?;
    let file = open(&args.file)?;
    let opts = MoeMaskOptions {
        stats: &stats,
        cover: args.cover,
        name: args.name.clone(),
        replace: args.replace,
    };
    let s = moe_mask(&file, &args.output, &opts).map_err(|e| rewrite_error(&args.file, e))?;
    if args.json {
        print_json(&json!({
            "ok": true,
            "output": s.write.path,
            "name": s.name,
            "task_id": s.task_id,
            "replaced": s.replaced,
            "sparsity": s.sparsity,
            "quality": null,
            "intermediate_size_added": s.intermediate_size_added,
            "layers": s.layers,
        }))?;
        return Ok(Status::Success);
    }
    let mut text = format!(
        "{} mask {} (task {}, cover {}, {:.1}% of the experts off, quality not measured) -> {}\n",
        if s.replaced { "replaced" } else { "added" },
        esc(&s.name),
        s.task_id,
        args.cover,
        s.sparsity * 100.0,
        esc_path(&args.output)
    );
    if let Some(n) = s.intermediate_size_added {
        text.push_str(&format!(
            "  arch.intermediate_size was absent: set to {n} (the widest FFN) to size the masks\n"
        ));
    }
    keep_table(&s.layers, &mut text);
    emit(&text)?;
    Ok(Status::Success)
}
