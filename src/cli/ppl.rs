//! `cortiq ppl FILE (--text-file F | --ids ...)`: teacher-forced negative log-likelihood of
//! every token given the ones before it, and the perplexity `exp(mean nll)`. A text longer
//! than the model's context is scored in consecutive windows, each starting fresh.

use std::path::PathBuf;

use cortiq_engine::runtime::calibrate::text_nll;
use cortiq_engine::runtime::choice::resolve;
use serde_json::json;

use super::common::{emit, print_json, CliError, CmdResult, Status};
use super::engine::{model_error, parse_ids, ChoiceArgs, ModelArgs};

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// UTF-8 text to score, tokenized with the file's tokenizer (special tokens as the
    /// tokenizer adds them, e.g. a BOS).
    #[arg(
        long,
        value_name = "FILE",
        conflicts_with = "ids",
        required_unless_present = "ids"
    )]
    pub text_file: Option<PathBuf>,
    /// Token ids to score, comma-separated.
    #[arg(long, value_name = "1,2,3")]
    pub ids: Option<String>,
    #[command(flatten)]
    pub choice: ChoiceArgs,
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: &Args) -> CmdResult {
    let model = a.model.load()?;
    let ids = match (&a.ids, &a.text_file) {
        (Some(s), _) => parse_ids(s, model.config.vocab)?,
        (None, Some(path)) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| CliError::usage(format!("--text-file {}: {e}", path.display())))?;
            a.model.encode(&model, &text, true)?
        }
        (None, None) => return Err(CliError::usage("give --text-file or --ids")),
    };
    if ids.len() < 2 {
        return Err(CliError::usage(
            "perplexity needs at least 2 tokens (the first is only context)",
        ));
    }
    let window = a.model.nll_window(&model);
    let err = |e| model_error(&a.model.file, &e);
    let req = a.choice.request()?;
    let chosen = resolve(&model, &req, &ids).map_err(err)?;
    for w in &chosen.warnings {
        eprintln!("cortiq: warning: {w}");
    }
    let nlls = text_nll(&model, &ids, window, &chosen.active).map_err(err)?;
    let windows = ids.len().div_ceil(window);
    let mean = nlls.iter().sum::<f64>() / nlls.len().max(1) as f64;
    let ppl = mean.exp();
    if a.json {
        print_json(&json!({
            "nll": nlls,
            "ppl": ppl,
            "mean_nll": mean,
            "tokens": ids.len(),
            "scored": nlls.len(),
            "windows": windows,
            "window": window,
            "choice": cortiq_engine::runtime::session::label_of(&model, &chosen.active),
        }))?;
    } else {
        emit(&format!(
            "perplexity {ppl:.4} (mean nll {mean:.4} over {} tokens, {windows} window{} of up to {window})\n",
            nlls.len(),
            if windows == 1 { "" } else { "s" }
        ))?;
    }
    Ok(Status::Success)
}
