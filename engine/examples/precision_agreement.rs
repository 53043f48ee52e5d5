//! DESIGN.md's quantized-activation contract (argmax agreement ≥ 97% of positions, mean
//! KL ≤ 1e-3 nats against the exact path) for any model file and precision, over a
//! real-model reference's passage (its `text_ids`): what `tests/real_model_inference.rs`
//! checks on the real models' 8-bit files, measured with the same
//! [`cortiq_engine::runtime::metrics::agreement`], for the files and experiments that test
//! does not cover.
//!
//! ```text
//! cargo run --release -p cortiq-engine --example precision_agreement -- \
//!     FILE.cmf REFERENCE.safetensors [PRECISION[:ENV=VALUE,...]]... [--tokens N]
//! ```
//!
//! The variants default to `balanced fast`; `--tokens` (default 128) takes the first N ids.
//! A variant's `ENV=VALUE`s are set while it runs and removed after (an experiment behind
//! an environment variable), the exact baseline runs without them. References:
//! `../shared/fixtures/{smollm2,qwen25coder}/reference.safetensors`.
use cortiq_engine::format::shards::CmfModel;
use cortiq_engine::model::{Logits, Model, Precision};
use cortiq_engine::runtime::metrics;
use safetensors::{Dtype, SafeTensors};
use std::sync::Arc;

const USAGE: &str =
    "usage: precision_agreement FILE.cmf REFERENCE.safetensors [PRECISION[:ENV=VALUE,...]]... [--tokens N]";

fn main() {
    if let Err(e) = run() {
        eprintln!("precision_agreement: {e}");
        std::process::exit(2);
    }
}

fn run() -> Result<(), String> {
    let mut args = std::env::args().skip(1);
    let (mut pos, mut tokens) = (Vec::new(), 128usize);
    while let Some(a) = args.next() {
        if a == "--tokens" {
            let n = args.next().ok_or(USAGE)?;
            tokens = n
                .parse()
                .map_err(|_| format!("--tokens {n}: not a count"))?;
        } else {
            pos.push(a);
        }
    }
    if pos.len() < 2 {
        return Err(USAGE.into());
    }
    let mut variants: Vec<String> = pos.split_off(2);
    if variants.is_empty() {
        variants = vec!["balanced".into(), "fast".into()];
    }
    let ids = text_ids(&pos[1], tokens)?;
    let file = Arc::new(CmfModel::open(&pos[0]).map_err(|e| format!("{}: {e}", pos[0]))?);
    let mut model = Model::load(file).map_err(|e| format!("{}: {e}", pos[0]))?;
    let vocab = model.config.vocab;
    model.set_precision(Precision::Exact);
    let exact = logits(&model, &ids)?;
    for spec in &variants {
        let (name, envs) = spec.split_once(':').unwrap_or((spec, ""));
        let p = Precision::parse(name).ok_or(format!("{name}: not a precision ({USAGE})"))?;
        let envs: Vec<(&str, &str)> = envs
            .split(',')
            .filter(|kv| !kv.is_empty())
            .map(|kv| kv.split_once('=').ok_or(format!("{kv}: not ENV=VALUE")))
            .collect::<Result<_, _>>()?;
        for (k, v) in &envs {
            std::env::set_var(k, v);
        }
        model.set_precision(p);
        let other = logits(&model, &ids);
        for (k, _) in &envs {
            std::env::remove_var(k);
        }
        let m = metrics::agreement(&exact, &other?, vocab);
        let within = m.argmax >= 0.97 && m.mean_kl <= 1e-3;
        println!(
            "{spec:24} argmax {:.4}  mean KL {:.3e}  ({} positions; {})",
            m.argmax,
            m.mean_kl,
            ids.len(),
            if within {
                "within the contract"
            } else {
                "outside the contract"
            }
        );
    }
    Ok(())
}

/// The first `n` ids of the reference's `text_ids` (i32 or i64).
fn text_ids(path: &str, n: usize) -> Result<Vec<u32>, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{path}: {e}"))?;
    let st = SafeTensors::deserialize(&bytes).map_err(|e| format!("{path}: {e}"))?;
    let t = st
        .tensor("text_ids")
        .map_err(|e| format!("{path}: no text_ids: {e}"))?;
    let width = match t.dtype() {
        Dtype::I32 => 4,
        Dtype::I64 => 8,
        d => return Err(format!("{path}: text_ids is {d:?}, not i32 or i64")),
    };
    let ids: Vec<u32> = t
        .data()
        .chunks_exact(width)
        .map(|c| u32::from_le_bytes(c[..4].try_into().expect("4 bytes")))
        .take(n)
        .collect();
    if ids.is_empty() {
        return Err(format!("{path}: text_ids is empty"));
    }
    Ok(ids)
}

/// Every position's logits of one forward over `ids`.
fn logits(model: &Model, ids: &[u32]) -> Result<Vec<f32>, String> {
    let mut cache = model.new_state(ids.len());
    let mut ws = model.new_workspace(ids.len());
    model
        .forward(ids, &mut cache, &mut ws, Logits::All, None)
        .map_err(|e| e.to_string())?;
    Ok(ws.logits.clone())
}
