//! `cortiq prompt FILE --messages M.json`: the exact prompt the file's chat template
//! (spec §6.1) makes of a conversation, optionally with its token ids.
//!
//! Text output is the rendered string and nothing else, so `cortiq prompt ... > p.txt`
//! holds exactly what the model would be fed; `--ids` adds one line of comma-separated ids.

use std::io::Read as _;
use std::path::{Path, PathBuf};

use cortiq_engine::chat::{ChatBundle, ChatError, RenderOptions, TemplateOrigin};
use cortiq_engine::format::CmfModel;
use serde_json::{json, Map, Value};

use super::common::{self, CliError, CmdResult, Status};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Model file (.cmf), or any shard of a set.
    pub file: PathBuf,
    /// The conversation: a JSON array of {"role", "content", ...} objects, or an object
    /// {"messages": [...]} (whose "tools" are used when --tools is not given). `-` reads
    /// standard input.
    #[arg(long, short = 'm', value_name = "M.json")]
    pub messages: PathBuf,
    /// Tool (function) schemas: a JSON array, or an object {"tools": [...]}.
    #[arg(long, value_name = "T.json")]
    pub tools: Option<PathBuf>,
    /// Render with this Jinja template instead of the file's.
    #[arg(long, value_name = "T.jinja")]
    pub template: Option<PathBuf>,
    /// Do not end the prompt with the opening of an assistant turn.
    #[arg(long)]
    pub no_generation_prompt: bool,
    /// A template variable (repeatable); VALUE is taken as JSON when it parses
    /// (`enable_thinking=false` is the boolean), else as a string.
    #[arg(long = "var", value_name = "KEY=VALUE")]
    pub vars: Vec<String>,
    /// Also print the prompt's token ids (comma-separated, on a line of their own).
    #[arg(long)]
    pub ids: bool,
    /// Print one JSON document {"prompt", "ids", "template", ...}.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: &Args) -> CmdResult {
    // Inputs first: a typo in a flag should not cost a model open.
    let doc = read_json(&args.messages, "messages")?;
    let (messages, embedded_tools) = split_messages(doc, &args.messages)?;
    let tools = match &args.tools {
        Some(p) => Some(tools_of(read_json(p, "tools")?, p)?),
        None => embedded_tools,
    };
    let extra = parse_vars(&args.vars)?;
    let custom = match &args.template {
        Some(p) => Some(
            std::fs::read_to_string(p)
                .map_err(|e| CliError::io(format!("{}: {e}", p.display())))?,
        ),
        None => None,
    };

    if args.file.is_dir() {
        return Err(CliError::io(format!(
            "{}: is a directory, not a CMF file",
            args.file.display()
        )));
    }
    let model = CmfModel::open(&args.file).map_err(|e| CliError::format(&args.file, &e))?;
    let bundle = match &custom {
        // The file's own template is not compiled when another replaces it: a broken one
        // must not stand in the way of trying a fix.
        Some(src) => {
            let primary = model.primary();
            let mut cfg = primary.header.tokenizer_config.clone();
            if let Some(c) = cfg.as_mut() {
                c.chat_template = None;
            }
            ChatBundle::from_parts(primary.vocab_bytes(), cfg.as_ref())
                .map_err(|e| chat_error(&args.file, e, false))?
                .with_template(src)
                .map_err(|e| chat_error(&args.file, e, true))?
        }
        None => ChatBundle::from_model(&model).map_err(|e| chat_error(&args.file, e, false))?,
    };

    let opts = RenderOptions {
        add_generation_prompt: !args.no_generation_prompt,
        tools,
        extra,
        ..RenderOptions::default()
    };
    let prompt = bundle
        .render_chat(&messages, &opts)
        .map_err(|e| chat_error(&args.file, e, custom.is_some()))?;
    let ids = if args.ids || (args.json && bundle.tokenizer().is_some()) {
        Some(
            bundle
                .encode_prompt(&prompt)
                .map_err(|e| chat_error(&args.file, e, false))?,
        )
    } else {
        None
    };

    if args.json {
        let mut doc = json!({
            "prompt": prompt,
            "ids": ids,
            "template": match bundle.template_origin() {
                TemplateOrigin::File => "file",
                TemplateOrigin::ChatMl => "chatml",
                TemplateOrigin::Custom => "path",
            },
            "add_generation_prompt": opts.add_generation_prompt,
            "eos_token_ids": bundle.eos_token_ids(),
        });
        if let Some(p) = &args.template {
            doc["template_path"] = json!(p.to_string_lossy());
        }
        common::print_json(&doc)?;
    } else {
        let mut out = prompt;
        if let Some(ids) = &ids {
            if !out.is_empty() && !out.ends_with('\n') {
                out.push('\n');
            }
            let list: Vec<String> = ids.iter().map(u32::to_string).collect();
            out.push_str(&list.join(","));
            out.push('\n');
        }
        common::emit(&out)?;
    }
    Ok(Status::Success)
}

/// Maps a chat error to the exit-code contract: the template's own `raise_exception`,
/// a failing render and a broken file are exit 1; a template the user supplied that does
/// not compile, or ids asked of a file without a tokenizer, are usage errors (exit 2).
fn chat_error(file: &Path, e: ChatError, user_template: bool) -> CliError {
    let (kind, code) = match &e {
        ChatError::Raised(_) => ("TemplateError", 1),
        ChatError::Syntax(_) if user_template => ("Usage", 2),
        ChatError::Syntax(_) | ChatError::Render(_) | ChatError::Limit(_) => ("TemplateError", 1),
        ChatError::Input(_) | ChatError::NoTokenizer => ("Usage", 2),
        ChatError::Tokenizer(_) => ("Tokenizer", 1),
    };
    let message = match &e {
        ChatError::Raised(m) => format!("the chat template refused the conversation: {m}"),
        ChatError::NoTokenizer => format!(
            "{}: the file has no tokenizer (vocab section), so --ids cannot be given",
            file.display()
        ),
        ChatError::Syntax(_) | ChatError::Tokenizer(_) if !user_template => {
            format!("{}: {e}", file.display())
        }
        _ => e.to_string(),
    };
    CliError {
        kind: kind.into(),
        message,
        code,
    }
}

/// Reads and parses a JSON input file (`-` = stdin); every failure is a usage/I-O error.
fn read_json(path: &Path, what: &str) -> Result<Value, CliError> {
    let text = if path.as_os_str() == "-" {
        let mut s = String::new();
        std::io::stdin()
            .read_to_string(&mut s)
            .map_err(|e| CliError::io(format!("reading {what} from standard input: {e}")))?;
        s
    } else {
        std::fs::read_to_string(path)
            .map_err(|e| CliError::io(format!("{what} file {}: {e}", path.display())))?
    };
    serde_json::from_str(&text).map_err(|e| {
        CliError::usage(format!(
            "{what} file {} is not valid JSON: {e}",
            path.display()
        ))
    })
}

/// The messages array, and the tools of a `{"messages", "tools"}` request object.
fn split_messages(doc: Value, path: &Path) -> Result<(Value, Option<Value>), CliError> {
    match doc {
        Value::Array(_) => Ok((doc, None)),
        Value::Object(mut o) if o.get("messages").is_some_and(Value::is_array) => {
            let tools = o.remove("tools").filter(|t| !t.is_null());
            let messages = o.remove("messages").unwrap_or_default();
            Ok((messages, tools))
        }
        _ => Err(CliError::usage(format!(
            "messages file {}: expected a JSON array of messages or an object with a \"messages\" array",
            path.display()
        ))),
    }
}

/// The tools array of a tools file.
fn tools_of(doc: Value, path: &Path) -> Result<Value, CliError> {
    match doc {
        Value::Array(_) => Ok(doc),
        Value::Object(mut o) if o.get("tools").is_some_and(Value::is_array) => {
            Ok(o.remove("tools").unwrap_or_default())
        }
        _ => Err(CliError::usage(format!(
            "tools file {}: expected a JSON array of tool schemas or an object with a \"tools\" array",
            path.display()
        ))),
    }
}

/// `KEY=VALUE` pairs as template variables; VALUE as JSON when it parses.
fn parse_vars(vars: &[String]) -> Result<Map<String, Value>, CliError> {
    let mut out = Map::new();
    for v in vars {
        let Some((key, value)) = v.split_once('=') else {
            return Err(CliError::usage(format!(
                "--var {v:?}: expected KEY=VALUE (e.g. enable_thinking=false)"
            )));
        };
        if key.is_empty() {
            return Err(CliError::usage(format!("--var {v:?}: the key is empty")));
        }
        let value = serde_json::from_str(value).unwrap_or_else(|_| Value::String(value.into()));
        out.insert(key.to_string(), value);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vars_parse_as_json_or_string() {
        let m = parse_vars(&[
            "enable_thinking=false".into(),
            "n=3".into(),
            "name=Bob".into(),
            "eq=a=b".into(),
            "empty=".into(),
        ])
        .unwrap();
        assert_eq!(m["enable_thinking"], json!(false));
        assert_eq!(m["n"], json!(3));
        assert_eq!(m["name"], json!("Bob"));
        assert_eq!(m["eq"], json!("a=b"));
        assert_eq!(m["empty"], json!(""));
        assert_eq!(parse_vars(&["novalue".into()]).unwrap_err().code, 2);
    }
}
