//! `cortiq requant FILE --quant Q -o OUT [--only PATTERN]... [--layers 3,5-7]
//! [--mean-bits B] [--route-stats S.json]` (§3.1): chosen 2-D weight tensors re-encoded
//! into dtype Q in a streamed rewrite; every other tensor's bytes copied unchanged
//! (`cortiq_engine::import::rewrite::requant`).
//!
//! `--only` takes what `tensors --filter` takes (a glob with `*`/`?`, else a substring),
//! any number of times; `--layers` keeps decoder layers `model.layers.{i}.*` only. Without
//! `--only`, routers and gates keep their precision (as `convert` keeps them).
//! `--route-stats` (vbit only) is the §3.2 B-field: each expert's row magnitudes are
//! multiplied by its selection frequency when its layer's experts share a bit budget.

use std::collections::BTreeSet;
use std::path::PathBuf;

use cortiq_engine::format::directory::TensorEntry;
use cortiq_engine::format::DType;
use cortiq_engine::import::bfield::BField;
use cortiq_engine::import::rewrite::layer_of;
use cortiq_engine::import::rewrite::requant::{requant, RequantOptions};
use cortiq_engine::quant::EncodeOptions;
use serde_json::json;

use super::common::{
    emit, esc, esc_path, human_bytes, open, print_json, refuse_overwriting_input, CliError,
    CmdResult, Status,
};
use super::convert::parse_quant;
use super::defrag::rewrite_error;
use super::moe_defrag::read_route_stats;
use super::tensors::matches_filter;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Model file to rewrite.
    pub file: PathBuf,
    /// Target dtype: q8, q8_2f, q4, q4t, q4tp, vbit, q1, q1s, q1t, f16, bf16, f32.
    #[arg(long)]
    pub quant: String,
    /// Output file (must not be the input).
    #[arg(short, long)]
    pub output: PathBuf,
    /// Tensors to re-encode: a glob (`*`, `?`) or a substring of the name; repeatable.
    #[arg(long, value_name = "PATTERN")]
    pub only: Vec<String>,
    /// Decoder layers to re-encode, e.g. `3,5-7`.
    #[arg(long, value_name = "LIST")]
    pub layers: Option<String>,
    #[command(flatten)]
    pub vbit: VbitArgs,
    /// One JSON document on stdout.
    #[arg(long)]
    pub json: bool,
}

/// `3,5-7` → {3, 5, 6, 7}.
pub(crate) fn parse_layer_list(s: &str) -> Result<BTreeSet<u64>, CliError> {
    let bad = |why: &str| CliError::usage(format!("--layers {s:?}: {why}"));
    let mut out = BTreeSet::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let num = |x: &str| x.trim().parse::<u64>().map_err(|e| bad(&e.to_string()));
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (num(a)?, num(b)?);
                if a > b || b - a > 1 << 20 {
                    return Err(bad(
                        "a range runs low to high and spans at most 2^20 layers",
                    ));
                }
                out.extend(a..=b);
            }
            None => {
                out.insert(num(part)?);
            }
        }
    }
    if out.is_empty() {
        return Err(bad("no layers given"));
    }
    Ok(out)
}

/// The `vbit` options `requant` and `convert` share.
#[derive(clap::Args, Debug)]
pub struct VbitArgs {
    /// vbit: mean code bits per weight, in [3, 8].
    #[arg(long)]
    pub mean_bits: Option<f32>,
    /// vbit: route stats (`cortiq run --route-stats`) whose expert selection frequencies
    /// weight the bit allocation of MoE experts (§3.2 B-field).
    #[arg(long, value_name = "S.json")]
    pub route_stats: Option<PathBuf>,
}

impl VbitArgs {
    /// The mean-bits budget and B-field, refused for a target other than vbit.
    pub(crate) fn resolve(&self, quant: DType) -> Result<(Option<f32>, Option<BField>), CliError> {
        let vbit = matches!(quant, DType::Vbit | DType::VbitRo);
        if let Some(b) = self.mean_bits {
            if !vbit {
                return Err(CliError::usage("--mean-bits applies to --quant vbit only"));
            }
            if !(3.0..=8.0).contains(&b) {
                return Err(CliError::usage(format!(
                    "--mean-bits must lie in [3, 8], got {b}"
                )));
            }
        }
        let Some(path) = &self.route_stats else {
            return Ok((self.mean_bits, None));
        };
        if !vbit {
            return Err(CliError::usage(
                "--route-stats applies to --quant vbit only (it weights vbit bit widths)",
            ));
        }
        let stats = read_route_stats(path)?;
        let b = BField::from_stats(&stats)
            .map_err(|e| CliError::usage(format!("{}: {e}", path.display())))?;
        Ok((self.mean_bits, Some(b)))
    }
}

pub fn run(args: &Args) -> CmdResult {
    refuse_overwriting_input(&[&args.file], &args.output)?;
    let quant = parse_quant(&args.quant)?;
    let (mean_bits, b_field) = args.vbit.resolve(quant)?;
    let layers = args.layers.as_deref().map(parse_layer_list).transpose()?;
    let file = open(&args.file)?;
    let select = |e: &TensorEntry| {
        let name_ok = args.only.is_empty() || args.only.iter().any(|p| matches_filter(p, &e.name));
        let layer_ok = layers
            .as_ref()
            .is_none_or(|set| layer_of(&e.name).is_some_and(|(l, _)| set.contains(&l)));
        name_ok && layer_ok
    };
    let opts = RequantOptions {
        quant,
        select: &select,
        explicit: !args.only.is_empty(),
        encode: EncodeOptions {
            mean_bits,
            ..EncodeOptions::default()
        },
        b_field,
        selection: json!({
            "only": args.only,
            "layers": layers,
            "route_stats": args.vbit.route_stats.as_ref().map(|p| p.display().to_string()),
        }),
    };
    let s = requant(&file, &args.output, &opts).map_err(|e| rewrite_error(&args.file, e))?;
    if args.json {
        print_json(&json!({
            "ok": true,
            "output": s.write.path,
            "quant": quant.name(),
            "bytes_before": file.len(),
            "bytes_after": s.write.bytes,
            "tensors": s.write.tensors,
            "changed": s.changed,
            "skipped": s.skipped,
            "vbit_families": s.vbit_families,
        }))?;
        return Ok(Status::Success);
    }
    let mut text = format!(
        "requant {} ({}) -> {} ({}): {} tensors re-encoded as {}\n",
        esc_path(&args.file),
        human_bytes(file.len()),
        esc_path(&args.output),
        human_bytes(s.write.bytes),
        s.changed.len(),
        quant.name()
    );
    for c in &s.changed {
        text.push_str(&format!(
            "  {}: {} -> {} ({} -> {})\n",
            esc(&c.name),
            c.from,
            c.to,
            human_bytes(c.bytes_before),
            human_bytes(c.bytes_after)
        ));
    }
    for k in &s.skipped {
        text.push_str(&format!(
            "  kept {} ({}): {}\n",
            esc(&k.name),
            k.dtype,
            esc(&k.reason)
        ));
    }
    emit(&text)?;
    Ok(Status::Success)
}
