//! `cortiq skill list|export|apply|add`: the skills of §9 and standalone skill files of §9.1.

use std::path::PathBuf;

use cortiq_engine::format::header::SkillRecord;
use cortiq_engine::format::skills::{self, SkillTensor};
use cortiq_engine::format::{hash64::hex16, CmfFile};
use serde_json::json;

use super::common::{
    emit, esc, esc_path, open, print_json, refuse_overwriting_input, CliError, CmdResult, Status,
};

#[derive(clap::Subcommand, Debug)]
pub enum Command {
    /// The skills registry (same as `cortiq skills`).
    List(super::skills::Args),
    /// Cut skill ID out of SKILLED into a standalone skill file bound to BASE.
    Export(ExportArgs),
    /// Attach a standalone skill file to its base and write the result.
    Apply(ApplyArgs),
    /// Grow a model by a skill taken from a donor .cmf of the same shape (append-only).
    Add(AddArgs),
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

#[derive(clap::Args, Debug)]
pub struct AddArgs {
    /// The model to grow.
    pub base: PathBuf,
    /// A .cmf with the same tensor shapes whose tensors become the skill's replacements.
    #[arg(long)]
    pub from: PathBuf,
    /// New skill id.
    #[arg(long)]
    pub skill: String,
    /// Display name.
    #[arg(long)]
    pub name: Option<String>,
    /// Layers whose tensors the skill replaces, e.g. `1,2,3`.
    #[arg(long, value_delimiter = ',', required = true)]
    pub layers: Vec<u64>,
    /// Write the grown model here (the base is copied, then grown).
    #[arg(short, long, conflicts_with = "in_place")]
    pub output: Option<PathBuf>,
    /// Grow BASE itself, append-only: existing bytes never change, the envelope is
    /// rewritten last, so an interrupted append leaves the old file valid.
    #[arg(long)]
    pub in_place: bool,
    #[arg(long)]
    pub json: bool,
}

impl Command {
    pub fn json(&self) -> bool {
        match self {
            Command::List(a) => a.json,
            Command::Export(a) => a.json,
            Command::Apply(a) => a.json,
            Command::Add(a) => a.json,
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
            let s = skills::apply_skill(&base, &skill, &a.output, a.force).map_err(write_err)?;
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
    }
}

fn add(a: &AddArgs) -> CmdResult {
    if a.output.is_none() && !a.in_place {
        return Err(CliError::usage(
            "say where the grown model goes: -o OUT, or --in-place to grow BASE itself",
        ));
    }
    if let Some(out) = &a.output {
        refuse_overwriting_input(&[&a.base, &a.from], out)?;
    }
    let base = open(&a.base)?;
    let donor: CmfFile = open(&a.from)?;
    let mut tensors = Vec::new();
    for e in donor.directory.iter() {
        if e.name.starts_with(skills::PREFIX) || !e.layer().is_some_and(|l| a.layers.contains(&l)) {
            continue;
        }
        tensors.push(SkillTensor {
            base_name: e.name.clone(),
            dtype: e.dtype,
            shape: e.shape.clone(),
            bytes: donor.tensor_bytes(e),
        });
    }
    if tensors.is_empty() {
        return Err(CliError::usage(format!(
            "the donor has no tensors in layers {:?}",
            a.layers
        )));
    }
    let record = SkillRecord {
        id: a.skill.clone(),
        name: a.name.clone(),
        layers: a.layers.clone(),
        quality: None, // not measured: a converter never declares quality (§5.1, §9)
        provenance: Some(
            json!({"donor": a.from.file_name().map(|n| n.to_string_lossy().into_owned())}),
        ),
        ..Default::default()
    };
    let n = tensors.len();
    let target = if a.in_place {
        drop(base);
        skills::append_skill_in_place(&a.base, record, &tensors).map_err(write_err)?;
        a.base.clone()
    } else {
        let out = a.output.clone().expect("checked above");
        drop(base);
        skills::add_skill_to_copy(&a.base, &out, record, &tensors).map_err(write_err)?;
        out
    };
    done(
        a.json,
        json!({"ok": true, "output": target, "skill": a.skill, "tensors": n}),
        format!(
            "added skill {} ({n} tensors, layers {:?}) to {}\n",
            esc(&a.skill),
            a.layers,
            esc_path(&target)
        ),
    )
}
