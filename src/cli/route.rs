//! `cortiq route FILE --prompt P [--json]`: recon-argmin skill routing (§9) — each skill's
//! reconstruction error `E = ‖r − BBᵀr‖²/‖φ‖²` of the prompt at its `phi_layer`, and the
//! skill `--skill auto` would choose (the least E). Also the soft-mix weights
//! `softmax(−E/T)` at `--temperature`.

use cortiq_engine::runtime::skill_route::route;
use serde_json::json;

use super::common::{emit, esc, print_json, CliError, CmdResult, Status};
use super::engine::{model_error, parse_ids, ModelArgs};

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The prompt to route (its raw tokens: no chat template).
    #[arg(
        short = 'p',
        long,
        required_unless_present = "ids",
        conflicts_with = "ids"
    )]
    pub prompt: Option<String>,
    /// Token ids to route in place of a prompt.
    #[arg(long, value_name = "1,2,3")]
    pub ids: Option<String>,
    /// Temperature of the soft-mix weights shown beside E.
    #[arg(long, default_value_t = 0.5)]
    pub temperature: f32,
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: &Args) -> CmdResult {
    if !(a.temperature.is_finite() && a.temperature > 0.0) {
        return Err(CliError::usage("--temperature must be positive"));
    }
    let model = a.model.load()?;
    let ids = match (&a.ids, &a.prompt) {
        (Some(s), _) => parse_ids(s, model.config.vocab)?,
        (None, Some(p)) => a.model.encode(&model, p, false)?,
        (None, None) => return Err(CliError::usage("give --prompt or --ids")),
    };
    if ids.is_empty() {
        return Err(CliError::usage("the prompt has no tokens"));
    }
    if model.skills.is_empty() {
        return Err(CliError::usage(format!(
            "{}: the file has no skills to route to",
            a.model.file.display()
        )));
    }
    let r = route(&model, &ids).map_err(|e| model_error(&a.model.file, &e))?;
    let weights = r.blend(a.temperature);
    let choice = r.choice.map(|k| r.scores[k as usize].id.clone());
    if a.json {
        let skills: Vec<_> = r
            .scores
            .iter()
            .zip(&weights)
            .map(|(s, w)| {
                json!({"id": s.id, "phi_layer": s.phi_layer, "error": s.error,
                       "blend_weight": w, "problem": s.problem})
            })
            .collect();
        print_json(&json!({
            "tokens": r.tokens, "skills": skills, "choice": choice,
            "temperature": a.temperature,
        }))?;
        return Ok(Status::Success);
    }
    let mut out = format!("routing {} prompt tokens (recon-argmin, §9)\n\n", r.tokens);
    let width = r
        .scores
        .iter()
        .map(|s| esc(&s.id).len())
        .max()
        .unwrap_or(5)
        .max(5);
    out.push_str(&format!(
        "  {:<width$}  phi_layer  {:>9}  blend (T={})\n",
        "skill", "E", a.temperature
    ));
    for (s, w) in r.scores.iter().zip(&weights) {
        let layer = s.phi_layer.map_or("—".into(), |l| l.to_string());
        match (s.error, &s.problem) {
            (Some(e), _) => out.push_str(&format!(
                "  {:<width$}  {layer:>9}  {e:>9.4}  {w:.3}{}\n",
                esc(&s.id),
                if r.choice == Some(s.index) {
                    "  ← chosen"
                } else {
                    ""
                }
            )),
            (None, p) => out.push_str(&format!(
                "  {:<width$}  {layer:>9}  {:>9}  not scored: {}\n",
                esc(&s.id),
                "—",
                esc(p.as_deref().unwrap_or("no selection"))
            )),
        }
    }
    out.push_str(&format!(
        "\nchoice: {}\n",
        choice
            .as_deref()
            .map_or("none (no skill can be scored)".into(), esc)
    ));
    emit(&out)?;
    Ok(Status::Success)
}
