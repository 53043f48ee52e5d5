//! `cortiq logits FILE --ids 1,2,3 --out OUT.safetensors [--hidden]`: one full-sequence
//! forward, every position's logits (and with `--hidden` the hidden states as
//! transformers reports them) in a safetensors file — the parity tool.

use std::path::PathBuf;

use cortiq_engine::model::Logits;
use safetensors::tensor::{Dtype, TensorView};
use serde_json::json;

use super::common::{emit, print_json, refuse_overwriting_input, CliError, CmdResult, Status};
use super::engine::{model_error, parse_ids, ModelArgs};

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Token ids, comma-separated.
    #[arg(long, value_name = "1,2,3")]
    pub ids: String,
    /// Output safetensors file: `input_ids` i32 [T], `logits` f32 [T, V].
    #[arg(
        short = 'o',
        long = "out",
        alias = "output",
        value_name = "OUT.safetensors"
    )]
    pub out: PathBuf,
    /// Also write `hidden_states` f32 [L+1, T, H].
    #[arg(long)]
    pub hidden: bool,
    #[arg(long)]
    pub json: bool,
}

fn le_bytes<T: Copy>(v: &[T], f: impl Fn(T) -> [u8; 4]) -> Vec<u8> {
    v.iter().flat_map(|&x| f(x)).collect()
}

pub fn run(a: &Args) -> CmdResult {
    refuse_overwriting_input(&[&a.model.file], &a.out)?;
    let model = a.model.load()?;
    let ids = parse_ids(&a.ids, model.config.vocab)?;
    let c = &model.config;
    let t = ids.len();
    let mut cache = model.new_state(t);
    let mut ws = model.new_workspace(t);
    let mut hidden = a.hidden.then(Vec::new);
    model
        .forward(&ids, &mut cache, &mut ws, Logits::All, hidden.as_mut())
        .map_err(|e| model_error(&a.model.file, &e))?;

    let ids_i32: Vec<i32> = ids.iter().map(|&i| i as i32).collect();
    let ids_bytes = le_bytes(&ids_i32, i32::to_le_bytes);
    let logit_bytes = le_bytes(&ws.logits, f32::to_le_bytes);
    let hidden_bytes = hidden.as_ref().map(|h| le_bytes(h, f32::to_le_bytes));
    fn view(dtype: Dtype, shape: Vec<usize>, data: &[u8]) -> Result<TensorView<'_>, CliError> {
        TensorView::new(dtype, shape, data).map_err(|e| CliError::io(format!("safetensors: {e}")))
    }
    let mut tensors = vec![
        (
            "input_ids".to_string(),
            view(Dtype::I32, vec![t], &ids_bytes)?,
        ),
        (
            "logits".to_string(),
            view(Dtype::F32, vec![t, c.vocab], &logit_bytes)?,
        ),
    ];
    if let Some(hb) = &hidden_bytes {
        tensors.push((
            "hidden_states".to_string(),
            view(Dtype::F32, vec![c.n_layers + 1, t, c.hidden], hb)?,
        ));
    }
    let bytes = safetensors::serialize(tensors, None)
        .map_err(|e| CliError::io(format!("safetensors: {e}")))?;
    cortiq_engine::format::writer::write_atomic(&a.out, &bytes)
        .map_err(|e| CliError::io(e.message()))?;
    if a.json {
        print_json(&json!({
            "ok": true,
            "output": a.out.display().to_string(),
            "tokens": t,
            "vocab": c.vocab,
            "hidden": a.hidden,
        }))?;
    } else {
        emit(&format!(
            "wrote {} ({t} positions × {} logits{})\n",
            a.out.display(),
            c.vocab,
            if a.hidden { ", hidden states" } else { "" }
        ))?;
    }
    Ok(Status::Success)
}
