//! `cortiq skill list|export|apply|add|bake`: the skills of §9 and standalone skill files
//! of §9.1. `add` grows a model by a donor's tensors, `bake` by a precision skill; both
//! fit the routing subspace to `--prompts` and measure `quality` on `--heldout` with the
//! skill applied at run time (on a grown temporary copy, before the final file is
//! written), or leave it null.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use cortiq_engine::chat::tokenizer::Tokenizer;
use cortiq_engine::chat::ChatBundle;
use cortiq_engine::format::hash64::hex16;
use cortiq_engine::format::header::{Selection, SkillRecord};
use cortiq_engine::format::skills;
use cortiq_engine::model::Model;
use cortiq_engine::runtime::calibrate::sha256_hex;
use cortiq_engine::runtime::load::LoadOptions;
use cortiq_engine::runtime::skill_author::{
    check_id, measure, plan, selection, switchable, write, AuthorError, Encoding, Heldout, Source,
    Target,
};
use serde_json::json;

use super::common::{
    emit, esc, esc_path, human_bytes, open, print_json, ranges, refuse_overwriting_input, CliError,
    CmdResult, Status,
};
use super::engine::{load_error, model_error, ModelArgs};

#[derive(clap::Subcommand, Debug)]
pub enum Command {
    /// The skills registry (same as `cortiq skills`).
    List(super::skills::Args),
    /// Cut skill ID out of SKILLED into a standalone skill file bound to BASE.
    Export(ExportArgs),
    /// Attach a standalone skill file to its base and write the result.
    Apply(ApplyArgs),
    /// Grow a model by a skill taken from a same-architecture donor (.cmf or Hugging Face
    /// checkpoint), with its routing subspace and measured quality (append-only).
    Add(AddArgs),
    /// Grow a model by a precision skill: chosen layers re-encoded at a higher precision
    /// from the weights' original, with measured quality.
    Bake(BakeArgs),
}

#[derive(clap::Args, Debug)]
pub struct ExportArgs {
    /// The model that carries the skill.
    pub skilled: PathBuf,
    /// Skill id in its registry.
    #[arg(long)]
    pub skill: String,
    /// The base the skill will be applied to (its directory hash binds the skill file).
    #[arg(long)]
    pub base: PathBuf,
    #[arg(short, long)]
    pub output: PathBuf,
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::Args, Debug)]
pub struct ApplyArgs {
    pub base: PathBuf,
    pub skill: PathBuf,
    #[arg(short, long)]
    pub output: PathBuf,
    /// Apply even when the skill was cut for a different base (result outside the spec).
    #[arg(long)]
    pub force: bool,
    #[arg(long)]
    pub json: bool,
}

/// The parts of `skill add` and `skill bake` after the tensors: routing, quality, where
/// the grown model goes.
#[derive(clap::Args, Debug)]
pub struct Authoring {
    /// Also replace the token embedding and the LM head (they belong to no layer).
    #[arg(long)]
    pub embeddings: bool,
    /// Display name.
    #[arg(long)]
    pub name: Option<String>,
    /// Prompts the skill is for, one per line (raw text, tokenized without special tokens,
    /// as routing scores a prompt): the routing subspace (§9 `selection`) is fitted to the
    /// backbone's hidden states of them. Without it the skill has no selection (`--skill
    /// auto` cannot choose it).
    #[arg(long, value_name = "P.txt")]
    pub prompts: Option<PathBuf>,
    /// The layer whose output is φ (default: the middle layer).
    #[arg(long, value_name = "L", requires = "prompts")]
    pub phi_layer: Option<u64>,
    /// Principal directions of the subspace (default 2, at most the prompt count − 1).
    #[arg(long, value_name = "R", requires = "prompts")]
    pub rank: Option<u64>,
    /// Held-out text (tokenized as `ppl --text-file` does): `quality` is its perplexity
    /// with the skill against the backbone, measured on a grown temporary copy. Without
    /// it, quality stays null (not measured).
    #[arg(long, value_name = "H.txt")]
    pub heldout: Option<PathBuf>,
    /// Write the grown model here (the base is copied, then grown).
    #[arg(short, long, conflicts_with = "in_place")]
    pub output: Option<PathBuf>,
    /// Grow the base itself, append-only: existing bytes never change, the envelope is
    /// rewritten last, so an interrupted append leaves the old file valid (quality is
    /// measured on a temporary copy first).
    #[arg(long)]
    pub in_place: bool,
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::Args, Debug)]
pub struct AddArgs {
    /// The model to grow.
    #[command(flatten)]
    pub model: ModelArgs,
    /// The donor: a .cmf with the backbone's tensor shapes, or a Hugging Face checkpoint
    /// directory of the same architecture (encoded in the backbone's dtypes).
    #[arg(long)]
    pub from: PathBuf,
    /// New skill id.
    #[arg(long = "skill", visible_alias = "id", value_name = "ID")]
    pub skill: String,
    /// Layers whose tensors the skill replaces, e.g. `1,2,3`, `4-7` or `all`.
    #[arg(long, required = true)]
    pub layers: String,
    #[command(flatten)]
    pub out: Authoring,
}

#[derive(clap::Args, Debug)]
pub struct BakeArgs {
    /// The model to grow (e.g. a q4 backbone).
    #[command(flatten)]
    pub model: ModelArgs,
    /// The higher-precision source of the same weights: a Hugging Face checkpoint
    /// directory or a .cmf with the same tensor names and shapes (the f16/q8 original).
    #[arg(long)]
    pub from: PathBuf,
    /// Layers to bake, e.g. `0-3`, `all`.
    #[arg(long, required = true)]
    pub layers: String,
    /// The skill's dtype: q8, q8_2f, q4, f16, bf16, f32, ... (`q8_row` where it cannot
    /// hold a shape); only tensors it stores at more bits per weight than the backbone
    /// are baked.
    #[arg(long, value_name = "Q")]
    pub quant: String,
    /// New skill id.
    #[arg(long = "id", visible_alias = "skill", value_name = "ID")]
    pub skill: String,
    #[command(flatten)]
    pub out: Authoring,
}

impl Command {
    pub fn json(&self) -> bool {
        match self {
            Command::List(a) => a.json,
            Command::Export(a) => a.json,
            Command::Apply(a) => a.json,
            Command::Add(a) => a.out.json,
            Command::Bake(a) => a.out.json,
        }
    }
}

fn write_err(e: cortiq_engine::format::FormatError) -> CliError {
    match e {
        cortiq_engine::format::FormatError::Io { .. } => CliError::io(e.to_string()),
        other => CliError {
            kind: other.kind().to_string(),
            message: other.message(),
            code: 2,
        },
    }
}

fn done(json: bool, doc: serde_json::Value, text: String) -> CmdResult {
    if json {
        print_json(&doc)?;
    } else {
        emit(&text)?;
    }
    Ok(Status::Success)
}

pub fn run(cmd: &Command) -> CmdResult {
    match cmd {
        Command::List(a) => super::skills::run(a),
        Command::Export(a) => {
            refuse_overwriting_input(&[&a.skilled, &a.base], &a.output)?;
            let skilled = open(&a.skilled)?;
            let base = open(&a.base)?;
            let s =
                skills::export_skill(&skilled, &a.skill, &base, &a.output).map_err(write_err)?;
            done(
                a.json,
                json!({"ok": true, "output": s.path, "tensors": s.tensors, "base_dir_hash": hex16(base.directory_hash())}),
                format!(
                    "exported skill {} ({} tensors) to {}, bound to base directory hash {}\n",
                    esc(&a.skill),
                    s.tensors,
                    esc_path(&a.output),
                    hex16(base.directory_hash())
                ),
            )
        }
        Command::Apply(a) => {
            refuse_overwriting_input(&[&a.base, &a.skill], &a.output)?;
            let base = open(&a.base)?;
            let skill = open(&a.skill)?;
            // The arguments' roles and the base they were cut for are the user's choice
            // (exit 2); anything else that stops the apply is in the files (a malformed
            // record, tensors that do not fit the base under --force): exit 1.
            if let Some(why) = skills::apply_refusal(&base, &skill, a.force) {
                return Err(CliError::usage(why));
            }
            let s = skills::apply_skill(&base, &skill, &a.output, a.force).map_err(|e| {
                let mut e = write_err(e);
                if e.kind != "Io" {
                    e.code = 1;
                }
                e
            })?;
            done(
                a.json,
                json!({"ok": true, "output": s.path, "tensors": s.tensors}),
                format!(
                    "applied {} to {}: {} ({} tensors)\n",
                    esc_path(&a.skill),
                    esc_path(&a.base),
                    esc_path(&a.output),
                    s.tensors
                ),
            )
        }
        Command::Add(a) => add(a),
        Command::Bake(a) => bake(a),
    }
}

/// What `skill add` and `skill bake` differ in.
struct Job<'a> {
    model: &'a ModelArgs,
    from: &'a Path,
    skill: &'a str,
    layers: &'a str,
    encoding: Encoding,
    out: &'a Authoring,
}

fn add(a: &AddArgs) -> CmdResult {
    author(&Job {
        model: &a.model,
        from: &a.from,
        skill: &a.skill,
        layers: &a.layers,
        encoding: Encoding::Donor,
        out: &a.out,
    })
}

fn bake(a: &BakeArgs) -> CmdResult {
    let quant = super::convert::parse_quant(&a.quant)?;
    author(&Job {
        model: &a.model,
        from: &a.from,
        skill: &a.skill,
        layers: &a.layers,
        encoding: Encoding::Precision(quant),
        out: &a.out,
    })
}

/// An authoring failure: the user's request exits 2, a damaged source 1.
fn author_error(path: &Path, e: AuthorError) -> CliError {
    match e {
        AuthorError::Request(m) => CliError::usage(m),
        AuthorError::Format(f) => CliError::format(path, &f),
        AuthorError::Hf(h) => super::convert::hf_error(h),
        AuthorError::Load(l) => load_error(path, l),
        AuthorError::Model(m) => model_error(path, &m),
        e @ AuthorError::Quant { .. } => CliError {
            kind: "Quant".into(),
            message: format!("{}: {e}", path.display()),
            code: 1,
        },
    }
}

/// `--layers`: a list with ranges, or `all`.
fn layer_set(s: &str, n_layers: u64) -> Result<BTreeSet<u64>, CliError> {
    if s.trim() == "all" {
        if n_layers == 0 {
            return Err(CliError::usage("--layers all: the model has no layers"));
        }
        return Ok((0..n_layers).collect());
    }
    let set = super::requant::parse_layer_list(s)?;
    match set.iter().find(|&&l| l >= n_layers) {
        Some(l) => Err(CliError::usage(format!(
            "--layers: layer {l} is past the model's {n_layers} layers"
        ))),
        None => Ok(set),
    }
}

fn read_text(path: &Path, flag: &str) -> Result<String, CliError> {
    std::fs::read_to_string(path)
        .map_err(|e| CliError::usage(format!("{flag} {}: {e}", path.display())))
}

/// A fitted routing subspace and what it was fitted on.
struct Fitted {
    selection: Selection,
    prompts: usize,
    tokens: usize,
    sha256: String,
}

fn fit(out: &Authoring, path: &Path, model: &Model, tok: &Tokenizer) -> Result<Fitted, CliError> {
    let text = read_text(path, "--prompts")?;
    let prompts: Vec<Vec<u32>> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| tok.encode(l, false))
        .filter(|r| r.as_ref().map_or(true, |ids| !ids.is_empty()))
        .collect::<Result<_, _>>()
        .map_err(|e| CliError::usage(format!("tokenizing --prompts: {e}")))?;
    if prompts.is_empty() {
        return Err(CliError::usage(format!(
            "--prompts {}: no prompt (one per line)",
            path.display()
        )));
    }
    let n_layers = model.layers.len() as u64;
    let phi_layer = out.phi_layer.unwrap_or(n_layers / 2);
    if phi_layer >= n_layers {
        return Err(CliError::usage(format!(
            "--phi-layer {phi_layer}: the model has {n_layers} layers (0..{})",
            n_layers.saturating_sub(1)
        )));
    }
    let most = (prompts.len() as u64 - 1).max(1);
    let rank = match out.rank {
        None => 2.min(most),
        Some(0) => return Err(CliError::usage("--rank must be at least 1")),
        Some(r) if r > most => {
            return Err(CliError::usage(format!(
                "--rank {r}: {} prompts span at most {most} directions around their mean",
                prompts.len()
            )))
        }
        Some(r) => r,
    };
    let selection = selection(model, &prompts, phi_layer as usize, rank as usize)
        .map_err(|e| author_error(path, e))?;
    Ok(Fitted {
        selection,
        prompts: prompts.len(),
        tokens: prompts.iter().map(Vec::len).sum(),
        sha256: sha256_hex(text.as_bytes()),
    })
}

fn author(j: &Job) -> CmdResult {
    let out = j.out;
    if out.output.is_none() && !out.in_place {
        return Err(CliError::usage(
            "say where the grown model goes: -o OUT, or --in-place to grow the base itself",
        ));
    }
    let base_path = j.model.file.as_path();
    let mut inputs = vec![base_path, j.from];
    inputs.extend(out.prompts.as_deref());
    inputs.extend(out.heldout.as_deref());
    if let Some(o) = &out.output {
        refuse_overwriting_input(&inputs, o)?;
    }
    let base = open(base_path)?;
    if base.header.shard.is_some() {
        return Err(CliError::usage(format!(
            "{}: one shard of a sharded model (§10); skills grow a single-file model",
            base_path.display()
        )));
    }
    check_id(&base, j.skill).map_err(|e| author_error(base_path, e))?;
    let n_layers = base.header.arch.as_ref().map_or(0, |a| a.num_layers);
    let layers = layer_set(j.layers, n_layers)?;
    let needs_model = out.prompts.is_some() || out.heldout.is_some();
    let model = match j.model.load() {
        Ok(m) => Some(m),
        // The format-level growth works without the engine: replace the matrices.
        Err(e) if e.kind == "Model" && !needs_model => {
            eprintln!(
                "cortiq: warning: {}; replacing every matrix of the layers",
                esc(&e.message)
            );
            None
        }
        Err(e) => return Err(e),
    };
    let names: BTreeSet<String> = match &model {
        Some(m) => switchable(m),
        None => base
            .directory
            .iter()
            .filter(|e| e.shape.len() == 2)
            .flat_map(|e| {
                let stem = e.name.strip_suffix(".weight").unwrap_or(&e.name);
                [e.name.clone(), format!("{stem}.bias")]
            })
            .collect(),
    };
    let source = Source::open(j.from).map_err(|e| author_error(j.from, e))?;
    let plan = plan(
        &base,
        &|n| names.contains(n),
        &source,
        &layers,
        out.embeddings,
        j.encoding,
    )
    .map_err(|e| author_error(j.from, e))?;
    if plan.tensors.is_empty() {
        let why = plan
            .skipped
            .iter()
            .find(|s| s.unchanged)
            .or(plan.skipped.first())
            .map_or("the layers have no such tensors".into(), |s| {
                format!("{}: {}", s.tensor, s.reason)
            });
        return Err(CliError::usage(format!(
            "nothing to replace in layers {}: every tensor stays the backbone's ({why})",
            ranges(layers.iter().copied())
        )));
    }

    let tok = match (&model, needs_model) {
        (Some(m), true) => {
            let bundle = ChatBundle::from_model(&m.file)
                .map_err(|e| CliError::usage(format!("{}: {e}", base_path.display())))?;
            Some(bundle)
        }
        _ => None,
    };
    let tokenizer = || {
        tok.as_ref().and_then(|b| b.tokenizer()).ok_or_else(|| {
            CliError::usage(format!(
                "{}: the file has no tokenizer for --prompts / --heldout",
                base_path.display()
            ))
        })
    };
    let fitted = match (&out.prompts, &model) {
        (Some(p), Some(m)) => Some(fit(out, p, m, tokenizer()?)?),
        _ => None,
    };

    let source_name = j.from.file_name().map(|n| n.to_string_lossy().into_owned());
    let mut provenance = match j.encoding {
        Encoding::Donor => json!({"kind": "donor", "donor": source_name,
                                   "donor_kind": source.kind(), "tool": "cortiq skill add"}),
        Encoding::Precision(q) => json!({"kind": "precision", "quant": q.name(),
                                          "source": source_name, "source_kind": source.kind(),
                                          "tool": "cortiq skill bake"}),
    };
    if let Some(f) = &fitted {
        provenance["prompts"] = json!({"count": f.prompts, "tokens": f.tokens,
                                       "sha256": f.sha256});
    }
    if !plan.fallbacks.is_empty() {
        provenance["fallbacks"] = json!(plan.fallbacks);
    }
    let mut record = SkillRecord {
        id: j.skill.to_string(),
        name: out.name.clone(),
        layers: plan.layers(),
        selection: fitted.as_ref().map(|f| f.selection.clone()),
        // Measured below or null: a converter never declares quality (§5.1, §9).
        quality: None,
        provenance: Some(provenance),
        ..Default::default()
    };
    let tensors = plan.skill_tensors();

    let quality = match (&out.heldout, &model) {
        (Some(h), Some(m)) => {
            let text = read_text(h, "--heldout")?;
            let ids = tokenizer()?
                .encode(&text, true)
                .map_err(|e| CliError::usage(format!("tokenizing --heldout: {e}")))?;
            let window = j.model.nll_window(m);
            let scratch = match &out.output {
                Some(o) => parent_dir(o),
                None => parent_dir(base_path),
            };
            let load = LoadOptions {
                skip_verify: true,
                verify_on_first_use: false,
                overrides: j.model.overrides()?,
                precision: m.precision(),
            };
            let held = Heldout {
                ids: &ids,
                bytes: text.as_bytes(),
                window,
            };
            let q = measure(base_path, &scratch, &record, &tensors, &held, &load)
                .map_err(|e| author_error(base_path, e))?;
            Some(q)
        }
        _ => None,
    };
    record.quality = quality.clone();
    let selection = record.selection.clone();
    let replaced_layers = record.layers.clone();
    drop(model);
    drop(base); // unmap before an in-place append
    let target = match &out.output {
        Some(o) => Target::Copy(o),
        None => Target::InPlace,
    };
    let written = write(base_path, target, record, &tensors).map_err(|e| match e {
        AuthorError::Format(f) => write_err(f),
        other => author_error(base_path, other),
    })?;

    let n = tensors.len();
    let doc = json!({
        "ok": true,
        "output": written,
        "skill": j.skill,
        "tensors": n,
        "bytes": plan.bytes(),
        "layers": replaced_layers,
        "selection": selection.as_ref().map(|s| json!({
            "metric": s.metric, "phi_layer": s.phi_layer, "rank": s.rank,
            "prompts": fitted.as_ref().map(|f| f.prompts),
        })),
        "quality": quality,
        "skipped": plan.skipped,
        "fallbacks": plan.fallbacks,
        "provenance_kind": match j.encoding { Encoding::Donor => "donor", Encoding::Precision(_) => "precision" },
    });
    let mut text = format!(
        "{} {} ({n} tensors, {}, layers {}) to {}\n",
        match j.encoding {
            Encoding::Donor => "added skill",
            Encoding::Precision(_) => "baked precision skill",
        },
        esc(j.skill),
        human_bytes(plan.bytes()),
        ranges(replaced_layers.iter().copied()),
        esc_path(&written)
    );
    match (&selection, &fitted) {
        (Some(s), Some(f)) => text.push_str(&format!(
            "  routing: subspace of rank {} at layer {}, fitted on {} prompts ({} tokens)\n",
            s.rank.unwrap_or(0),
            s.phi_layer,
            f.prompts,
            f.tokens
        )),
        _ => text
            .push_str("  routing: no selection (no --prompts): `--skill auto` cannot choose it\n"),
    }
    match &quality {
        Some(q) => text.push_str(&format!(
            "  quality: held-out perplexity {:.4} with the skill, {:.4} backbone ({} tokens)\n",
            q["overlaid"].as_f64().unwrap_or(f64::NAN),
            q["backbone"].as_f64().unwrap_or(f64::NAN),
            q["n_samples"]
        )),
        None => text.push_str("  quality: not measured (no --heldout)\n"),
    }
    let kept = plan.skipped.len();
    if kept > 0 {
        text.push_str(&format!(
            "  {kept} tensor{} of the layers stay the backbone's (--json lists them and why)\n",
            if kept == 1 { "" } else { "s" }
        ));
    }
    for f in &plan.fallbacks {
        text.push_str(&format!(
            "  {}: {} ({})\n",
            esc(&f.tensor),
            f.dtype,
            esc(&f.reason)
        ));
    }
    done(out.json, doc, text)
}

fn parent_dir(p: &Path) -> PathBuf {
    match p.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    }
}
