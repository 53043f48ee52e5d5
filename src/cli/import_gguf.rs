//! `cortiq import-gguf FILE.gguf -o OUT [--quant keep|CODEC]`: a GGUF file (llama, qwen2,
//! qwen3, gemma3) as a CMF file, one tensor at a time, with the error each tensor took.

use std::path::PathBuf;

use cortiq_engine::import::gguf_import::{self, ImportError, QuantMode, TensorReport};
use serde_json::json;

use super::common::{
    emit, esc, esc_path, human_bytes, print_json, refuse_overwriting_input, shape_str, CliError,
    CmdResult, Status,
};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// GGUF file to import.
    pub file: PathBuf,
    /// Output CMF file (must not be the input).
    #[arg(short, long)]
    pub output: PathBuf,
    /// `keep` stores F32/F16/BF16 as they are and Q4_0 as q4_tiled (no second
    /// quantization) and re-encodes other types as q8_row (f16 where q8_row does not fit);
    /// a codec name (q8, q4, q4t, q8_2f, vbit, f16, ...) re-encodes every 2-D tensor with it.
    #[arg(long, default_value = "keep")]
    pub quant: String,
    /// `vbit`: mean code bits per weight, 3 to 8 (8 = every row at 8 bits with a scale
    /// per group of 32, the precision of llama.cpp's Q8_0).
    #[arg(long, value_name = "B")]
    pub mean_bits: Option<f32>,
    /// One JSON document on stdout.
    #[arg(long)]
    pub json: bool,
}

fn import_error(path: &std::path::Path, e: ImportError) -> CliError {
    match e {
        ImportError::Gguf(cortiq_engine::import::gguf::GgufError::Io { .. })
        | ImportError::Write(_) => CliError::io(e.to_string()),
        _ => CliError {
            kind: "InvalidGguf".into(),
            message: format!("{}: {e}", path.display()),
            code: 1,
        },
    }
}

pub fn run(args: &Args) -> CmdResult {
    let mode = QuantMode::parse(&args.quant).ok_or_else(|| {
        CliError::usage(format!(
            "--quant {:?}: expected keep or a writable CMF dtype (q8, q4, q4t, f16, ...)",
            args.quant
        ))
    })?;
    let mut encode = cortiq_engine::quant::EncodeOptions::default();
    if let Some(b) = args.mean_bits {
        if mode != QuantMode::Codec(cortiq_engine::format::DType::Vbit)
            && mode != QuantMode::Codec(cortiq_engine::format::DType::VbitRo)
        {
            return Err(CliError::usage("--mean-bits applies to --quant vbit only"));
        }
        if !(3.0..=8.0).contains(&b) {
            return Err(CliError::usage(format!(
                "--mean-bits must lie in [3, 8], got {b}"
            )));
        }
        encode.mean_bits = Some(b);
    }
    refuse_overwriting_input(&[&args.file], &args.output)?;
    let json = args.json;
    let mut print_row = |r: &TensorReport| {
        if !json {
            let how = if r.exact {
                "exact".to_string()
            } else {
                format!("max |err| {:.3e}", r.max_abs_err)
            };
            // Progress lines; a closed stdout only loses them.
            let _ = emit(&format!(
                "  {:<48} {:<7} -> {:<8} {:<14} {}\n",
                esc(&r.name),
                r.ggml_type,
                r.dtype.name(),
                shape_str(&r.shape),
                how
            ));
        }
    };
    let report =
        gguf_import::import_gguf_with(&args.file, &args.output, mode, &encode, &mut print_row)
            .map_err(|e| import_error(&args.file, e))?;
    for w in &report.warnings {
        eprintln!("warning: {w}");
    }
    if json {
        print_json(&json!({
            "ok": true,
            "warnings": report.warnings,
            "source": report.source,
            "output": report.summary.path,
            "arch": report.arch,
            "quant": report.quant,
            "bytes": report.summary.bytes,
            "tensors": report.tensors,
        }))?;
    } else {
        let exact = report.tensors.iter().filter(|t| t.exact).count();
        emit(&format!(
            "imported {} ({}) -> {} ({}), {} tensors, {} stored exactly\n",
            esc_path(&args.file),
            report.arch,
            esc_path(&args.output),
            human_bytes(report.summary.bytes),
            report.tensors.len(),
            exact
        ))?;
    }
    Ok(Status::Success)
}
