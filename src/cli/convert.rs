//! `cortiq convert --model DIR --quant Q -o OUT`: a Hugging Face checkpoint (safetensors +
//! config + tokenizer) into a CMF v2 file, streamed tensor by tensor (see
//! `cortiq_engine::import::hf`). The output appears only when complete.

use std::io::IsTerminal;
use std::path::PathBuf;

use cortiq_engine::format::DType;
use cortiq_engine::import::hf::{self, ConvertOptions, HfError};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::json;

use super::common::{
    emit, esc, esc_path, human_bytes, print_json, refuse_overwriting_input, CliError, CmdResult,
    Status,
};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Hugging Face checkpoint directory (config.json, *.safetensors, tokenizer files).
    #[arg(long)]
    pub model: PathBuf,
    /// Dtype of the weight matrices: q8, q8_2f, q4, q4t, q4tp, vbit, q1, q1s, q1t, f16,
    /// bf16, f32 (norms and 1-D tensors stay f16 unless f32).
    #[arg(long, default_value = "q8")]
    pub quant: String,
    /// Output file (sharded outputs are named OUT-00001-of-0000N.cmf).
    #[arg(short, long)]
    pub output: PathBuf,
    #[command(flatten)]
    pub vbit: super::requant::VbitArgs,
    /// Dtype for a matrix the chosen codec cannot hold (cols % 32 != 0); default q8_row.
    #[arg(long)]
    pub fallback: Option<String>,
    /// Split the output into shards of at most N GB (rough f32 size, spec §10).
    #[arg(long)]
    pub shard_max_gb: Option<f64>,
    /// Round Gemma's √hidden embedding scale to bf16, as transformers does when it runs
    /// the model in bf16 (default: the exact f32 value of transformers in f32 and llama.cpp).
    #[arg(long)]
    pub embed_scale_bf16: bool,
    /// One JSON document on stdout (no progress bar).
    #[arg(long)]
    pub json: bool,
}

/// `--quant` name → dtype; `vbit` means the row-offset variant, the converter default
/// of spec §3.1.
pub(crate) fn parse_quant(name: &str) -> Result<DType, CliError> {
    let d = DType::from_name(name).filter(|d| !d.is_reserved());
    match d {
        Some(DType::Vbit) => Ok(DType::VbitRo),
        Some(d) => Ok(d),
        None => Err(CliError::usage(format!(
            "unknown --quant {name:?}: use q8, q8_2f, q4, q4t, q4tp, vbit, q1, q1s, q1t, f16, bf16 or f32"
        ))),
    }
}

pub(crate) fn hf_error(e: HfError) -> CliError {
    match e {
        HfError::Io { .. } => CliError::io(e.to_string()),
        HfError::Unsupported(m) => CliError::usage(m),
        other => CliError {
            kind: "InvalidCheckpoint".into(),
            message: other.to_string(),
            code: 1,
        },
    }
}

pub fn run(args: &Args) -> CmdResult {
    let quant = parse_quant(&args.quant)?;
    let mut opts = ConvertOptions::new(quant);
    (opts.encode.mean_bits, opts.b_field) = args.vbit.resolve(quant)?;
    if let Some(f) = &args.fallback {
        opts.fallback = Some(parse_quant(f)?);
    }
    if let Some(gb) = args.shard_max_gb {
        if !(gb.is_finite() && gb > 0.0) {
            return Err(CliError::usage("--shard-max-gb must be a positive number"));
        }
        opts.shard_max_bytes = Some((gb * 1e9) as u64);
    }
    opts.embed_scale_bf16 = args.embed_scale_bf16;
    opts.source_label = Some(args.model.display().to_string());
    refuse_overwriting_input(&[&args.model], &args.output)?;

    let bar = ProgressBar::new(0);
    if args.json || !std::io::stderr().is_terminal() {
        bar.set_draw_target(ProgressDrawTarget::hidden());
    } else {
        bar.set_draw_target(ProgressDrawTarget::stderr());
        if let Ok(style) = ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} {wide_msg}",
        ) {
            bar.set_style(style);
        }
    }
    let summary = hf::convert(&args.model, &args.output, &opts, &mut |p| {
        bar.set_length(p.total as u64);
        bar.set_position(p.done as u64);
        bar.set_message(esc(p.name));
    })
    .map_err(hf_error);
    bar.finish_and_clear();
    let summary = summary?;

    let bytes: u64 = summary.files.iter().map(|f| f.bytes).sum();
    if args.json {
        print_json(&json!({
            "ok": true,
            "quant": quant.name(),
            "outputs": summary.files.iter().map(|f| &f.path).collect::<Vec<_>>(),
            "bytes": bytes,
            "source_bytes": summary.source_bytes,
            "tensors": summary.tensors,
            "fallbacks": summary.fallbacks,
        }))?;
    } else {
        let mut text = format!(
            "converted {} ({}) -> {} ({}), {} tensors, {}\n",
            esc_path(&args.model),
            human_bytes(summary.source_bytes),
            summary
                .files
                .iter()
                .map(|f| esc_path(&f.path))
                .collect::<Vec<_>>()
                .join(", "),
            human_bytes(bytes),
            summary.tensors,
            quant.name()
        );
        for f in &summary.fallbacks {
            text.push_str(&format!(
                "  {}: {} ({})\n",
                esc(&f.tensor),
                f.dtype,
                esc(&f.reason)
            ));
        }
        emit(&text)?;
    }
    Ok(Status::Success)
}
