//! What the commands that run a model share: loading it (hash chain checked first, unless
//! `--no-verify`), the thread pool, arch overrides, and token-id parsing.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use cortiq_engine::model::{Model, ModelError, Precision};
use cortiq_engine::runtime::load::{load_verified, LoadError, LoadOptions};
use serde_json::{Map, Value};

use super::common::CliError;

#[derive(clap::Args, Debug, Clone)]
pub struct ModelArgs {
    /// Model file (or one shard of a set).
    pub file: PathBuf,
    /// Worker threads (default: every core).
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,
    /// Context length in tokens (default: the model's, at most 4096).
    #[arg(long, value_name = "N")]
    pub ctx: Option<usize>,
    /// Replace or add an arch field before loading, e.g. `--arch sliding_window=4096`
    /// (the value is JSON when it parses as JSON, else a string). Repeatable.
    #[arg(long = "arch", value_name = "KEY=VALUE")]
    pub arch: Vec<String>,
    /// Skip the hash check of the weights at load.
    #[arg(long)]
    pub no_verify: bool,
    /// Check the small links (header, directory, sections) at load and each tensor group
    /// on first use (a layer's tensors before it first runs) instead of the whole file up
    /// front: the model is ready sooner, and what a run never reaches is never hashed.
    #[arg(long, conflicts_with = "no_verify")]
    pub verify_on_load: bool,
    /// Activations of the weight products: `balanced` (the default: activations per
    /// token in two int8 levels, the codes and their residual, an int16 code, into the
    /// integer kernels of q8/q4/vbit/q1t weights; within DESIGN.md's contract), `exact` (f32
    /// activations: DESIGN.md's parity path) or `fast` (one int8 level per group of 32;
    /// the least work, but models with strong activation outliers such as SmolLM2 drift:
    /// see README.md).
    #[arg(long, value_name = "exact|balanced|fast")]
    pub precision: Option<String>,
}

/// `--task NAME --skill ID|none|auto|blend[:T]`: the choice a command runs under (`run`,
/// `ppl`, `bench`), resolved by `runtime::choice::resolve`.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct ChoiceArgs {
    /// Run under this task mask (§5; `cortiq masks FILE` lists them).
    #[arg(long, value_name = "NAME")]
    pub task: Option<String>,
    /// Read a skill's tensors (§9): a skill id, `none`, `auto` (recon-argmin routing on the
    /// prompt) or `blend[:T]` (the soft mix `Σ wᵢ·Tᵢ`, `wᵢ = softmax(−Eᵢ/T)`, T default
    /// 0.5).
    #[arg(long, value_name = "ID|none|auto|blend[:T]")]
    pub skill: Option<String>,
}

impl ChoiceArgs {
    pub fn request(&self) -> Result<cortiq_engine::runtime::choice::Request, CliError> {
        use cortiq_engine::runtime::choice::{Request, SkillRequest};
        Ok(Request {
            task: self.task.clone(),
            skill: match &self.skill {
                Some(s) => {
                    SkillRequest::parse(s).map_err(|e| CliError::usage(format!("--skill: {e}")))?
                }
                None => SkillRequest::None,
            },
        })
    }

    /// Whether a task or a skill was asked for.
    pub fn is_set(&self) -> bool {
        self.task.is_some() || self.skill.is_some()
    }
}

/// `key=value` with the value read as JSON when it is valid JSON (`false`, `8`, `"x"`).
pub fn parse_var(s: &str, flag: &str) -> Result<(String, Value), CliError> {
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| CliError::usage(format!("{flag} {s:?}: expected KEY=VALUE")))?;
    if k.is_empty() {
        return Err(CliError::usage(format!("{flag} {s:?}: empty key")));
    }
    let value = serde_json::from_str(v).unwrap_or_else(|_| Value::String(v.to_string()));
    Ok((k.to_string(), value))
}

/// `1,2,3` (spaces allowed) as token ids of a model with `vocab` tokens. An id beyond it
/// is the user's mistake (exit 2); the same id from the file's own tokenizer reaches the
/// model and is the file's fault (exit 1, see [`model_error`]).
pub fn parse_ids(s: &str, vocab: usize) -> Result<Vec<u32>, CliError> {
    let ids: Result<Vec<u32>, _> = s
        .split(|c: char| c == ',' || c.is_whitespace())
        .filter(|p| !p.is_empty())
        .map(|p| p.parse::<u32>())
        .collect();
    match ids {
        Ok(v) if v.is_empty() => Err(CliError::usage("--ids: no token ids given")),
        Ok(v) => match v.iter().find(|&&id| id as usize >= vocab) {
            Some(id) => Err(CliError::usage(format!(
                "--ids: token id {id} is outside the vocabulary (size {vocab})"
            ))),
            None => Ok(v),
        },
        Err(e) => Err(CliError::usage(format!("--ids {s:?}: {e}"))),
    }
}

pub fn model_error(path: &Path, e: &ModelError) -> CliError {
    let code = match e {
        // User-given ids were checked by `parse_ids`: an id out of range here came from
        // the file (its tokenizer or template), and is the file's fault (1).
        ModelError::ContextFull { .. } => 2,
        // An unknown task or skill is the user's request, not the file's fault.
        ModelError::UnknownChoice(_) => 2,
        _ => 1,
    };
    let why = match e {
        ModelError::TokenOutOfRange { .. } => {
            ": the file's tokenizer or template gave it, so they do not match its weights"
        }
        _ => "",
    };
    CliError {
        kind: "Model".into(),
        message: format!("{}: {e}{why}", path.display()),
        code,
    }
}

/// The CLI's form of a load failure: a damaged file exits 1 with a hint.
pub fn load_error(path: &Path, e: LoadError) -> CliError {
    match e {
        LoadError::Format(f) => CliError::format(path, &f),
        LoadError::Integrity { link, why } => CliError {
            kind: "Integrity".into(),
            message: format!(
                "{}: the {link} fails its check ({why}); `cortiq verify` shows the whole \
                 chain, --no-verify runs the model anyway",
                path.display()
            ),
            code: 1,
        },
        LoadError::Cancelled => CliError::io("cancelled"),
        LoadError::Model(m) => model_error(path, &m),
    }
}

/// Sets the size of the engine's pool and of rayon's global one (hash checks) once per
/// process.
pub fn init_threads(threads: Option<usize>) -> Result<(), CliError> {
    if let Some(n) = threads {
        if n == 0 {
            return Err(CliError::usage("--threads must be at least 1"));
        }
        // Only fails when the pool already exists: keep it then.
        let _ = rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .build_global();
        cortiq_engine::exec::set_threads(n).map_err(CliError::usage)?;
    }
    Ok(())
}

impl ModelArgs {
    pub fn overrides(&self) -> Result<Map<String, Value>, CliError> {
        let mut m = Map::new();
        for s in &self.arch {
            let (k, v) = parse_var(s, "--arch")?;
            m.insert(k, v);
        }
        Ok(m)
    }

    /// Opens, verifies and loads the model with `--precision` (else `default`); loader
    /// warnings go to stderr.
    pub fn load_with(&self, default: Precision) -> Result<Arc<Model>, CliError> {
        let precision = match self.precision.as_deref() {
            None => default,
            Some(name) => Precision::parse(name).ok_or_else(|| {
                CliError::usage(format!(
                    "--precision {name:?}: expected exact, balanced or fast"
                ))
            })?,
        };
        let mut model = self.load_model()?;
        model.set_precision(precision);
        Ok(Arc::new(model))
    }

    /// [`ModelArgs::load_with`] the default precision ([`Precision::Balanced`]).
    pub fn load(&self) -> Result<Arc<Model>, CliError> {
        self.load_with(Precision::default())
    }

    fn load_model(&self) -> Result<Model, CliError> {
        init_threads(self.threads)?;
        let overrides = self.overrides()?;
        if self.file.is_dir() {
            return Err(CliError::io(format!(
                "{}: is a directory, not a CMF file",
                self.file.display()
            )));
        }
        let opts = LoadOptions {
            skip_verify: self.no_verify,
            verify_on_first_use: self.verify_on_load,
            overrides,
            precision: Precision::default(),
        };
        let model = load_verified(&self.file, &opts).map_err(|e| load_error(&self.file, e))?;
        for w in &model.warnings {
            eprintln!("cortiq: warning: {w}");
        }
        Ok(model)
    }

    /// The window of a perplexity (`ppl`, a skill's quality): `--ctx`, or the model's
    /// whole context, at least 2 tokens.
    /// The file's chat bundle, which must have a tokenizer (`hint` ends the error, e.g.
    /// "; pass --ids").
    pub fn bundle(
        &self,
        model: &Model,
        hint: &str,
    ) -> Result<cortiq_engine::chat::ChatBundle, CliError> {
        let bundle = cortiq_engine::chat::ChatBundle::from_model(&model.file)
            .map_err(|e| CliError::usage(format!("{}: {e}", self.file.display())))?;
        if bundle.tokenizer().is_none() {
            return Err(CliError::usage(format!(
                "{}: the file has no tokenizer{hint}",
                self.file.display()
            )));
        }
        Ok(bundle)
    }

    /// `text` tokenized with the file's tokenizer (`special`: as the tokenizer adds them).
    pub fn encode(&self, model: &Model, text: &str, special: bool) -> Result<Vec<u32>, CliError> {
        let bundle = self.bundle(model, "; pass --ids")?;
        let tok = bundle.tokenizer().expect("bundle() checked the tokenizer");
        tok.encode(text, special)
            .map_err(|e| CliError::usage(format!("tokenizing: {e}")))
    }

    pub fn nll_window(&self, model: &Model) -> usize {
        let max = model.config.max_positions;
        self.ctx.unwrap_or(max).min(max).max(2)
    }

    /// The session context: `--ctx`, or the model's maximum capped at 4096.
    pub fn context(&self, model: &Model) -> usize {
        self.ctx
            .unwrap_or(4096)
            .min(model.config.max_positions)
            .max(1)
    }
}
