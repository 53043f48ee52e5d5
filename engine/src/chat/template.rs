//! Chat templates rendered with Hugging Face semantics (spec §6.1).
//!
//! HF's `apply_chat_template` compiles the template in a jinja2
//! `ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)` with the loop
//! controls extension, replaces the `tojson` filter with `json.dumps(ensure_ascii=False)`,
//! adds the globals `raise_exception` and `strftime_now`, and renders with `messages`,
//! `tools`, `documents`, `add_generation_prompt`, the tokenizer's special tokens
//! (`bos_token`, `eos_token`, ...) and any extra keyword arguments. This module rebuilds
//! that environment on minijinja:
//! - whitespace: `trim_blocks`, `lstrip_blocks`, and jinja2's default of dropping a single
//!   trailing newline of the template source;
//! - Python string/dict/list methods (`startswith`, `split`, `items`, ...) through
//!   minijinja-contrib's pycompat callback;
//! - printing as Python does (`None`, `True`, `['a']` rather than `none`, `true`, `["a"]`),
//!   also for the `string` filter;
//! - undefined values as jinja2's default `Undefined`: printing and iterating them is
//!   fine, reading an attribute of one is an error;
//! - HF's `{% generation %}` block (assistant-mask tracking) renders its body.
//!
//! The template comes with the model file, so it is hostile input: every rendering runs
//! under the bounds below ([`FUEL`], [`MAX_OUTPUT_BYTES`], [`MAX_STRING_BYTES`],
//! [`MAX_RANGE_ITEMS`], [`MAX_NESTING`]) and stops with [`ChatError::Limit`] at the first
//! one it passes, instead of looping for hours or allocating gigabytes.
//!
//! Known differences, none of which a fixture template exercises: `strftime_now` renders
//! UTC (std has no time zone database); objects without a data form (ranges, namespaces, loop
//! objects) print in minijinja's form where Python would name a memory address; the
//! ImmutableSandbox's refusal of mutating methods has nothing to refuse, because
//! pycompat offers no `append` or `update`.

use std::io;

use minijinja::value::{Kwargs, Serde, Value, ValueKind};
use minijinja::{AutoEscape, Environment, Error, ErrorKind};
use serde_json::Map;

use super::pyfmt::{self, JsonOptions};
use super::strftime::{strftime, DateTime};
use super::ChatError;

/// The template a file without a chat bundle gets (spec §6.1): plain ChatML, the same
/// form transformers used as its default template, with no injected system prompt.
pub const CHATML_TEMPLATE: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/// The name the template is registered under; it shows in error locations.
const NAME: &str = "chat_template";

/// The work budget of a rendering, in minijinja fuel, before the shares of
/// [`FUEL_PER_MESSAGE`] and [`FUEL_PER_INPUT_BYTE`]: one unit per instruction executed
/// and one per 64 bytes of data created or processed (output, strings, list slots, the
/// input of filters; see minijinja's `Environment::set_fuel`). It bounds time (nested
/// loops stop within a fraction of a second) and memory: a string is paid for when it is
/// made, and before it is made where its size is known (`'a' * n`, `indent(n)`), so a
/// rendering creates at most `budget × 64` bytes in all (256 MiB of this base) and a
/// string doubled in a loop stops there.
///
/// Measured on the fixture templates (ChatML, SmolLM2, Qwen2.5, Qwen3 with tools, tool
/// calls and `<think>` blocks): a 2000-message conversation of 300-byte turns takes 89 k
/// (ChatML) to 213 k (Qwen3) fuel; in general at most about 76 per message plus 0.09 per
/// byte of input (Qwen3; 20 000 messages take 0.5 to 2.1 M, 200 turns of 60 kB 0.6 to
/// 0.9 M). This base alone is 19× the 2000-message figure.
pub const FUEL: u64 = 4_000_000;

/// The fuel a rendering gets on top of [`FUEL`] per message: 13× the most a fixture
/// template uses, so that a long conversation keeps its margin while a hostile template
/// given an ordinary one stays near the base.
pub const FUEL_PER_MESSAGE: u64 = 1_000;

/// The fuel a rendering gets on top of [`FUEL`] per byte of its input (messages, tools
/// and extra variables as JSON): 11× the most a fixture template uses per byte.
pub const FUEL_PER_INPUT_BYTE: u64 = 1;

/// The fuel of a rendering of `messages` messages, `input_bytes` of JSON in all.
pub fn fuel_budget(messages: usize, input_bytes: usize) -> u64 {
    FUEL.saturating_add(FUEL_PER_MESSAGE.saturating_mul(messages as u64))
        .saturating_add(FUEL_PER_INPUT_BYTE.saturating_mul(input_bytes as u64))
}

/// The largest prompt a rendering may produce: 16 MiB, about four million tokens of
/// English text; the longest context windows the engine can run are a million tokens,
/// and a prompt must still fit its window after rendering.
pub const MAX_OUTPUT_BYTES: usize = 16 << 20;

/// The longest text this module's printing and filters build from one value
/// (`{{ value }}` of a list or dict, `tojson`, `string`): checked before the text is made,
/// since a list holding another list twice, forty levels deep, is cheap to build and has
/// 2^40 items to print.
pub const MAX_STRING_BYTES: usize = MAX_OUTPUT_BYTES;

/// The most items `range()` may produce (minijinja's own bound, made a named limit).
pub const MAX_RANGE_ITEMS: usize = 100_000;

/// How deeply nested a value may be to be printed or serialized: deeper (or a namespace
/// that holds itself) would recurse until the stack overflows.
pub const MAX_NESTING: usize = 256;

/// What a rendering is asked for besides the messages.
#[derive(Clone, Debug, Default)]
pub struct RenderOptions {
    /// End the prompt with the opening of an assistant turn.
    pub add_generation_prompt: bool,
    /// Tool (function) schemas, a JSON array, as HF's `tools` argument. `None` renders
    /// with `tools = none`, as HF does when no tools are given.
    pub tools: Option<serde_json::Value>,
    /// More template variables (HF's `**kwargs`), e.g. `enable_thinking: false`. They
    /// override `bos_token`/`eos_token` but not `messages`, `tools` or
    /// `add_generation_prompt`.
    pub extra: Map<String, serde_json::Value>,
    /// The tokenizer's BOS token text; left undefined in the template when `None`, as HF
    /// omits unset special tokens.
    pub bos_token: Option<String>,
    /// The tokenizer's EOS token text; undefined when `None`.
    pub eos_token: Option<String>,
    /// A smaller work budget than [`fuel_budget`] gives (never a larger one): the fuzz
    /// target renders thousands of hostile templates a second under a small cap, so one
    /// that loops spends a few milliseconds, not the production budget's hundreds.
    pub fuel_cap: Option<u64>,
}

/// A compiled chat template.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
}

/// The error `raise_exception` carries, so that rendering can tell a template's own
/// refusal from a failure of the template engine.
#[derive(Debug)]
struct Raised(String);

impl std::fmt::Display for Raised {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Raised {}

/// A bound of this module was hit; carried like [`Raised`] so that rendering reports
/// [`ChatError::Limit`].
#[derive(Debug)]
struct LimitHit(String);

impl std::fmt::Display for LimitHit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for LimitHit {}

fn limit_error(msg: String) -> Error {
    Error::new(ErrorKind::InvalidOperation, msg.clone()).with_source(LimitHit(msg))
}

/// The rendering's sink: keeps the prompt, refuses to grow past `limit` bytes.
struct BoundedWriter {
    buf: Vec<u8>,
    limit: usize,
    exceeded: bool,
}

impl io::Write for BoundedWriter {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        if self.buf.len().saturating_add(b.len()) > self.limit {
            self.exceeded = true;
            return Err(io::Error::other("output limit reached"));
        }
        self.buf.extend_from_slice(b);
        Ok(b.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl ChatTemplate {
    /// Compiles `source` in an HF-compatible environment.
    pub fn new(source: &str) -> Result<ChatTemplate, ChatError> {
        let mut env = Environment::new();
        env.set_syntax(
            minijinja::syntax::SyntaxConfig::builder()
                .trim_blocks(true)
                .lstrip_blocks(true)
                .keep_trailing_newline(false)
                .build()
                .map_err(|e| ChatError::Syntax(describe(&e)))?,
        );
        // A prompt is plain text: nothing may be HTML-escaped, whatever the name.
        env.set_auto_escape_callback(|_| AutoEscape::None);
        env.set_undefined_behavior(minijinja::UndefinedBehavior::Lenient);
        env.set_unknown_method_callback(python_method);
        env.set_formatter(|out, _state, value| {
            if let Some(s) = value.as_str() {
                return out.write_str(s).map_err(Error::from);
            }
            let s = py_str_bounded(value)?;
            out.write_str(&s).map_err(Error::from)
        });
        env.add_filter("tojson", tojson);
        env.add_filter("string", |v: &Value| py_str_bounded(v));
        env.add_filter("format", format_filter);
        env.add_function("range", range);
        env.add_function(
            "raise_exception",
            |msg: Option<Value>| -> Result<Value, Error> {
                let mut text = String::new();
                if let Some(m) = msg {
                    pyfmt::py_str(&m, &mut text);
                }
                Err(Error::new(ErrorKind::InvalidOperation, text.clone()).with_source(Raised(text)))
            },
        );
        env.add_function("strftime_now", |format: String| {
            strftime(&format, &DateTime::now_utc())
        });
        env.add_template_owned(NAME, rewrite_generation_blocks(source))
            .map_err(|e| ChatError::Syntax(describe(&e)))?;
        Ok(ChatTemplate {
            env,
            source: source.to_string(),
        })
    }

    /// The template text as given.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders `messages` (a JSON array of `{role, content, ...}` objects).
    pub fn render(
        &self,
        messages: &serde_json::Value,
        opts: &RenderOptions,
    ) -> Result<String, ChatError> {
        self.render_metered(messages, opts).map(|(text, _)| text)
    }

    /// [`render`](Self::render), and the fuel the rendering used.
    fn render_metered(
        &self,
        messages: &serde_json::Value,
        opts: &RenderOptions,
    ) -> Result<(String, u64), ChatError> {
        if !messages.is_array() {
            return Err(ChatError::Input(format!(
                "messages must be a JSON array, not {}",
                json_kind(messages)
            )));
        }
        // The order of HF's call: special tokens, then the caller's kwargs over them,
        // then the named arguments.
        let mut ctx = Map::new();
        if let Some(b) = &opts.bos_token {
            ctx.insert("bos_token".into(), b.clone().into());
        }
        if let Some(e) = &opts.eos_token {
            ctx.insert("eos_token".into(), e.clone().into());
        }
        ctx.insert("documents".into(), serde_json::Value::Null);
        for (k, v) in &opts.extra {
            ctx.insert(k.clone(), v.clone());
        }
        ctx.insert("messages".into(), messages.clone());
        ctx.insert(
            "tools".into(),
            opts.tools.clone().unwrap_or(serde_json::Value::Null),
        );
        ctx.insert(
            "add_generation_prompt".into(),
            opts.add_generation_prompt.into(),
        );
        let ctx = serde_json::Value::Object(ctx);
        // The budget scales with the input: a copy of the environment carries it.
        let input = json_len(&ctx);
        let count = messages.as_array().map_or(0, Vec::len);
        let full = fuel_budget(count, input);
        let budget = full.min(opts.fuel_cap.unwrap_or(u64::MAX));
        let mut env = self.env.clone();
        env.set_fuel(Some(budget));
        let tmpl = env
            .get_template(NAME)
            .map_err(|e| ChatError::Render(describe(&e)))?;
        let mut out = BoundedWriter {
            buf: Vec::new(),
            limit: MAX_OUTPUT_BYTES,
            exceeded: false,
        };
        let ctx = Value::from(Serde(ctx));
        let fuel = match tmpl.render_captured_to(ctx, &mut out) {
            Ok(done) => done.state().fuel_levels().map_or(0, |(used, _)| used),
            Err(_) if out.exceeded => {
                return Err(ChatError::Limit(format!(
                    "the prompt would exceed MAX_OUTPUT_BYTES ({MAX_OUTPUT_BYTES} bytes)"
                )))
            }
            Err(e) => return Err(classify(&e, budget, budget < full, count, input)),
        };
        // minijinja writes whole `str`s, so the bytes are UTF-8.
        let text = String::from_utf8(out.buf)
            .map_err(|_| ChatError::Render("the rendered prompt is not UTF-8".into()))?;
        Ok((text, fuel))
    }
}

fn json_kind(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

/// A rendering's error as a [`ChatError`]: the template's own refusal, a bound passed, or
/// any other failure.
fn classify(e: &Error, budget: u64, capped: bool, messages: usize, input: usize) -> ChatError {
    if let Some(msg) = raised(e) {
        return ChatError::Raised(msg);
    }
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(l) = err.downcast_ref::<LimitHit>() {
            return ChatError::Limit(l.0.clone());
        }
        if err
            .downcast_ref::<Error>()
            .is_some_and(|m| m.kind() == ErrorKind::OutOfFuel)
        {
            if capped {
                return ChatError::Limit(format!(
                    "the template used up its fuel: {budget} units of work (instructions, \
                     64-byte blocks of data), the cap this rendering was given"
                ));
            }
            return ChatError::Limit(format!(
                "the template used up its fuel: {budget} units of work (instructions, 64-byte \
                 blocks of data) = FUEL {FUEL} + FUEL_PER_MESSAGE {FUEL_PER_MESSAGE} × \
                 {messages} messages + FUEL_PER_INPUT_BYTE {FUEL_PER_INPUT_BYTE} × {input} \
                 bytes of input"
            ));
        }
        cur = err.source();
    }
    ChatError::Render(describe(e))
}

/// The length of `v` as JSON, without building the text.
fn json_len(v: &serde_json::Value) -> usize {
    struct Count(usize);
    impl io::Write for Count {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            self.0 += b.len();
            Ok(b.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }
    let mut c = Count(0);
    let _ = serde_json::to_writer(&mut c, v);
    c.0
}

/// The message of a `raise_exception` anywhere in the error's chain.
fn raised(e: &Error) -> Option<String> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(r) = err.downcast_ref::<Raised>() {
            return Some(r.0.clone());
        }
        cur = err.source();
    }
    None
}

/// minijinja's message with its location, and the causes behind it.
fn describe(e: &Error) -> String {
    let mut s = e.to_string();
    let mut cur = std::error::Error::source(e);
    while let Some(err) = cur {
        s.push_str(": ");
        s.push_str(&err.to_string());
        cur = err.source();
    }
    s
}

/// `range()` as minijinja has it, with [`MAX_RANGE_ITEMS`] as a named limit.
fn range(lower: isize, upper: Option<isize>, step: Option<isize>) -> Result<Value, Error> {
    let (start, end) = match upper {
        Some(upper) => (lower as i128, upper as i128),
        None => (0, lower as i128),
    };
    let len = match step.unwrap_or(1) as i128 {
        0 => 0, // minijinja refuses a zero step itself
        s if s > 0 => (end - start + s - 1).max(0) / s,
        s => (start - end - s - 1).max(0) / -s,
    };
    if len > MAX_RANGE_ITEMS as i128 {
        return Err(limit_error(format!(
            "range() of {len} items exceeds MAX_RANGE_ITEMS ({MAX_RANGE_ITEMS})"
        )));
    }
    minijinja::functions::range(lower, upper, step)
}

/// Python's methods on strings, lists and dicts (minijinja-contrib's pycompat), with
/// `str.format` refused when its widths could build more than [`MAX_STRING_BYTES`]: it
/// pads before fuel can pay for the result.
fn python_method(
    state: &mut minijinja::State,
    value: &Value,
    method: &str,
    args: &[Value],
) -> Result<Value, Error> {
    if let (Some(fmt), "format") = (value.as_str(), method) {
        check_format_keys(fmt, FormatStyle::StrFormat)?;
        check_str_format(fmt, args)?;
    }
    minijinja_contrib::pycompat::unknown_method_callback(state, value, method, args)
}

/// The builtin `format` filter (printf style, `'%(name)s' | format(...)`) behind
/// [`check_format_keys`].
fn format_filter(
    state: &mut minijinja::State,
    fmt: &Value,
    args: minijinja::value::Rest<minijinja::value::ValueOrKwargs>,
) -> Result<Value, Error> {
    if let Some(s) = fmt.as_str() {
        check_format_keys(s, FormatStyle::Printf)?;
    }
    minijinja::filters::format(state, fmt, args)
}

/// The two format-string syntaxes minijinja parses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FormatStyle {
    /// `str.format`: `{name.attr[key]:spec}`, `{{` escapes a brace.
    StrFormat,
    /// The `format` filter: `%(key)s`, `%%` escapes a percent sign.
    Printf,
}

/// Refuses a format string with a key that is not ASCII (`{name[ключ]}` of `str.format`,
/// `%(ключ)s` of the `format` filter). minijinja 3.1's format parser steps through a key
/// one byte at a time and panics inside a multi-byte character (found by the
/// `chat_template` fuzz target). The scan reads every key the parser can reach, and
/// possibly a few it would not (after a field it already refuses); a key names an
/// argument or an item of one, and no real template formats with a key that is not ASCII.
fn check_format_keys(fmt: &str, style: FormatStyle) -> Result<(), Error> {
    let b = fmt.as_bytes();
    // Index past the key starting at `from` and its closing `delim` (the end when none).
    let key_end = |from: usize, delim: u8| -> Result<usize, Error> {
        let len = b[from..]
            .iter()
            .position(|&c| c == delim)
            .unwrap_or(b.len() - from);
        if !b[from..from + len].is_ascii() {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!(
                    "format key at offset {} is not ASCII (only ASCII keys are supported)",
                    from
                ),
            ));
        }
        Ok((from + len + 1).min(b.len()))
    };
    let name_char = |c: &u8| c.is_ascii_alphanumeric() || *c == b'_';
    let skip_name = |from: usize| from + b[from..].iter().take_while(|c| name_char(c)).count();
    let mut i = 0;
    while i < b.len() {
        match (style, b[i], b.get(i + 1)) {
            (FormatStyle::StrFormat, b'{', Some(b'{'))
            | (FormatStyle::Printf, b'%', Some(b'%')) => i += 2,
            (FormatStyle::StrFormat, b'{', _) => {
                // A field name (a number or an identifier), then `.attr` and `[key]` parts.
                let name = i + 1;
                i = skip_name(name);
                while i > name && i < b.len() {
                    match b[i] {
                        b'.' => i = skip_name(i + 1),
                        b'[' => i = key_end(i + 1, b']')?,
                        _ => break,
                    }
                }
            }
            (FormatStyle::Printf, b'%', Some(b'(')) => i = key_end(i + 2, b')')?,
            _ => i += 1,
        }
    }
    Ok(())
}

/// An upper bound on what `fmt.format(*args)` makes: the format string, every argument's
/// text, and every number inside a replacement field taken as a width; a field nested in
/// another's spec (`{:>{}}`) may take its width from any integer argument.
fn check_str_format(fmt: &str, args: &[Value]) -> Result<(), Error> {
    let mut bound = fmt.len() as u128;
    let (mut depth, mut nested, mut num) = (0usize, false, 0u128);
    for c in fmt.chars() {
        match c {
            '0'..='9' if depth > 0 => {
                num = num
                    .saturating_mul(10)
                    .saturating_add(c as u128 - '0' as u128);
                continue;
            }
            '{' => {
                depth += 1;
                nested |= depth > 1;
            }
            '}' => depth = depth.saturating_sub(1),
            _ => {}
        }
        bound = bound.saturating_add(num);
        num = 0;
    }
    bound = bound.saturating_add(num);
    for a in args {
        bound = bound.saturating_add(text_len_bound(a, PY_LAYOUT)? as u128);
        if nested && a.is_integer() {
            bound = bound.saturating_add(u128::try_from(a.clone()).unwrap_or(u128::MAX));
        }
    }
    if bound > MAX_STRING_BYTES as u128 {
        return Err(limit_error(format!(
            "str.format() could build {bound} bytes, above MAX_STRING_BYTES ({MAX_STRING_BYTES})"
        )));
    }
    Ok(())
}

/// Per-item overheads of a text form, for [`text_len_bound`].
#[derive(Clone, Copy)]
struct Layout {
    /// Between items.
    item_sep: usize,
    /// Between a key and its value.
    key_sep: usize,
    /// Per nesting level on each item's line (0: one line).
    indent: usize,
}

/// Python's `str()` form: `, ` and `: `, one line.
const PY_LAYOUT: Layout = Layout {
    item_sep: 2,
    key_sep: 2,
    indent: 0,
};

/// The longest a string gets quoted and escaped, as a JSON string or a Python repr: an
/// ASCII byte escapes to at most 6 bytes (`\u0000`), a non-ASCII one to at most 3 (the
/// `\uXXXX` of a two-byte character).
fn escaped_len_bound(s: &str) -> usize {
    let extra: usize = s
        .bytes()
        .map(|b| match b {
            0x80.. => 2,
            0..=0x1f | 0x7f | b'"' | b'\\' | b'\'' => 5,
            _ => 0,
        })
        .sum();
    s.len() + extra + 2
}

/// `str(value)` as [`pyfmt::py_str`] writes it, refused past [`MAX_STRING_BYTES`] or
/// [`MAX_NESTING`].
fn py_str_bounded(v: &Value) -> Result<String, Error> {
    if let Some(s) = v.as_str() {
        return Ok(s.to_string()); // printed as it is: no larger than what already exists
    }
    text_len_bound(v, PY_LAYOUT)?;
    let mut s = String::new();
    pyfmt::py_str(v, &mut s);
    Ok(s)
}

/// An upper bound on the length of a value's printed or serialized text; an error when
/// it could exceed [`MAX_STRING_BYTES`] or the value nests deeper than [`MAX_NESTING`].
/// The walk stops as soon as the bound is passed, so it takes at most about
/// `MAX_STRING_BYTES` steps however many items a shared structure multiplies into.
fn text_len_bound(v: &Value, layout: Layout) -> Result<usize, Error> {
    let mut budget = MAX_STRING_BYTES;
    text_size(v, layout, 0, &mut budget)?;
    Ok(MAX_STRING_BYTES - budget)
}

fn text_size(v: &Value, layout: Layout, depth: usize, budget: &mut usize) -> Result<(), Error> {
    fn take(budget: &mut usize, n: usize) -> Result<(), Error> {
        *budget = budget.checked_sub(n).ok_or_else(|| {
            limit_error(format!(
                "a value's text would exceed MAX_STRING_BYTES ({MAX_STRING_BYTES} bytes)"
            ))
        })?;
        Ok(())
    }
    if depth > MAX_NESTING {
        return Err(limit_error(format!(
            "a value nests deeper than MAX_NESTING ({MAX_NESTING} levels)"
        )));
    }
    // A newline and the indentation of one item's line.
    let line = if layout.indent > 0 {
        1 + layout.indent.saturating_mul(depth + 1)
    } else {
        0
    };
    match v.kind() {
        ValueKind::String => take(budget, escaped_len_bound(v.as_str().unwrap_or_default())),
        ValueKind::Seq | ValueKind::Iterable => {
            take(budget, 2 + line)?;
            for item in v.try_iter()? {
                take(budget, layout.item_sep + line)?;
                text_size(&item, layout, depth + 1, budget)?;
            }
            Ok(())
        }
        ValueKind::Map => {
            take(budget, 2 + line)?;
            for key in v.try_iter()? {
                take(budget, layout.item_sep + layout.key_sep + line)?;
                text_size(&key, layout, depth + 1, budget)?;
                text_size(&v.get_item(&key)?, layout, depth + 1, budget)?;
            }
            Ok(())
        }
        // Numbers, None, booleans, and the short forms of other objects.
        _ => take(budget, 64),
    }
}

/// HF's `tojson`: `json.dumps(x, ensure_ascii=False, indent=None, separators=None,
/// sort_keys=False)`, each option positional or by keyword.
fn tojson(value: &Value, args: &[Value], kwargs: Kwargs) -> Result<Value, Error> {
    const NAMES: [&str; 4] = ["ensure_ascii", "indent", "separators", "sort_keys"];
    if args.len() > NAMES.len() {
        return Err(Error::from(ErrorKind::TooManyArguments));
    }
    let mut given: [Option<Value>; 4] = Default::default();
    for (slot, v) in given.iter_mut().zip(args) {
        *slot = Some(v.clone());
    }
    for (slot, name) in given.iter_mut().zip(NAMES) {
        if kwargs.has(name) {
            if slot.is_some() {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("tojson() got multiple values for argument '{name}'"),
                ));
            }
            *slot = Some(kwargs.get::<Value>(name)?);
        }
    }
    kwargs.assert_all_used()?;
    let [ensure_ascii, indent, separators, sort_keys] = given;
    let mut opts = JsonOptions {
        ensure_ascii: ensure_ascii.is_some_and(|v| v.is_true()),
        sort_keys: sort_keys.is_some_and(|v| v.is_true()),
        ..JsonOptions::default()
    };
    if let Some(ind) = indent.filter(|v| !v.is_none() && !v.is_undefined()) {
        opts.indent = Some(match ind.as_str() {
            Some(s) => s.to_string(),
            // Python multiplies a space by the number (a bool counts as 0 or 1; a
            // negative count gives the empty string).
            None => {
                let n = if ind.is_integer() {
                    i64::try_from(ind.clone())?
                } else if ind.kind() == minijinja::value::ValueKind::Bool {
                    i64::from(ind.is_true())
                } else {
                    return Err(Error::new(
                        ErrorKind::InvalidOperation,
                        "tojson: indent must be an integer or a string",
                    ));
                };
                let n = usize::try_from(n.max(0)).unwrap_or(usize::MAX);
                if n > MAX_STRING_BYTES {
                    return Err(limit_error(format!(
                        "tojson indent {n} exceeds MAX_STRING_BYTES ({MAX_STRING_BYTES})"
                    )));
                }
                " ".repeat(n)
            }
        });
        // With an indent Python drops the space after the item separator.
        opts.item_sep = ",".into();
    }
    if let Some(seps) = separators.filter(|v| !v.is_none() && !v.is_undefined()) {
        let parts: Vec<Value> = seps.try_iter()?.collect();
        match parts.as_slice() {
            [item, key] if item.as_str().is_some() && key.as_str().is_some() => {
                opts.item_sep = item.as_str().unwrap_or_default().to_string();
                opts.key_sep = key.as_str().unwrap_or_default().to_string();
            }
            _ => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    "tojson: separators must be a pair of strings",
                ))
            }
        }
    }
    text_len_bound(
        value,
        Layout {
            item_sep: opts.item_sep.len(),
            key_sep: opts.key_sep.len(),
            indent: opts.indent.as_ref().map_or(0, String::len),
        },
    )?;
    Ok(Value::from(pyfmt::json_dumps(value, &opts)?))
}

/// Turns HF's `{% generation %}` / `{% endgeneration %}` tags (which only record where
/// assistant text lies) into `{% if true %}` / `{% endif %}`, keeping their whitespace
/// control markers so the output is what jinja2 renders.
fn rewrite_generation_blocks(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(pos) = rest.find("{%") {
        out.push_str(&rest[..pos]);
        let tag = &rest[pos..];
        match parse_generation_tag(tag) {
            Some((len, open_mark, end, close_mark)) => {
                out.push_str("{%");
                out.push_str(open_mark);
                out.push_str(if end { " endif " } else { " if true " });
                out.push_str(close_mark);
                out.push_str("%}");
                rest = &tag[len..];
            }
            None => {
                out.push_str("{%");
                rest = &tag[2..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// Recognises `{%[-+] (end)generation [-+]%}` at the start of `s`: its length, the
/// markers, and whether it closes the block.
fn parse_generation_tag(s: &str) -> Option<(usize, &str, bool, &str)> {
    let mut i = 2;
    let marker = |at: usize| match s.as_bytes().get(at) {
        Some(b'-') => "-",
        Some(b'+') => "+",
        _ => "",
    };
    let open_mark = marker(i);
    i += open_mark.len();
    i += s[i..].len() - s[i..].trim_start().len();
    let (word, end) = if s[i..].starts_with("endgeneration") {
        ("endgeneration", true)
    } else if s[i..].starts_with("generation") {
        ("generation", false)
    } else {
        return None;
    };
    i += word.len();
    let after_word = i;
    i += s[i..].len() - s[i..].trim_start().len();
    if i == after_word
        && !s[i..].starts_with('-')
        && !s[i..].starts_with('+')
        && !s[i..].starts_with("%}")
    {
        return None; // a longer identifier such as `generation_prompt`
    }
    let close_mark = marker(i);
    i += close_mark.len();
    s[i..]
        .starts_with("%}")
        .then_some((i + 2, open_mark, end, close_mark))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn render(src: &str, messages: serde_json::Value, opts: &RenderOptions) -> String {
        ChatTemplate::new(src)
            .unwrap()
            .render(&messages, opts)
            .unwrap()
    }

    #[test]
    fn tojson_matches_python_json_dumps() {
        let opts = RenderOptions {
            extra: json!({"x": {"b": "<é & 'q'>", "a": [1, 2.5, null, true]}})
                .as_object()
                .unwrap()
                .clone(),
            ..Default::default()
        };
        let out = render("{{ x | tojson }}", json!([]), &opts);
        assert_eq!(out, r#"{"b": "<é & 'q'>", "a": [1, 2.5, null, true]}"#);
        let out = render("{{ x | tojson(indent=2) }}", json!([]), &opts);
        assert_eq!(
            out,
            "{\n  \"b\": \"<é & 'q'>\",\n  \"a\": [\n    1,\n    2.5,\n    null,\n    true\n  ]\n}"
        );
        let out = render(
            "{{ x.b | tojson(ensure_ascii=true) }}|{{ x | tojson(separators=(',', ':'), sort_keys=true) }}",
            json!([]),
            &opts,
        );
        assert_eq!(
            out,
            r#""<\u00e9 & 'q'>"|{"a":[1,2.5,null,true],"b":"<é & 'q'>"}"#
        );
    }

    #[test]
    fn raise_exception_is_a_chat_error() {
        let t = ChatTemplate::new(
            "{% if messages[0].role != 'user' %}{{ raise_exception('Conversation must start with a user turn') }}{% endif %}ok",
        )
        .unwrap();
        let err = t
            .render(
                &json!([{"role": "assistant", "content": "hi"}]),
                &RenderOptions::default(),
            )
            .unwrap_err();
        match err {
            ChatError::Raised(m) => assert_eq!(m, "Conversation must start with a user turn"),
            other => panic!("expected Raised, got {other:?}"),
        }
        let ok = t.render(
            &json!([{"role": "user", "content": "hi"}]),
            &RenderOptions::default(),
        );
        assert_eq!(ok.unwrap(), "ok");
    }

    #[test]
    fn syntax_and_render_errors_are_distinguished() {
        assert!(matches!(
            ChatTemplate::new("{% for x in %}"),
            Err(ChatError::Syntax(_))
        ));
        let t = ChatTemplate::new("{{ nothing.attr }}").unwrap();
        assert!(matches!(
            t.render(&json!([]), &RenderOptions::default()),
            Err(ChatError::Render(_))
        ));
        assert!(matches!(
            t.render(&json!({"role": "user"}), &RenderOptions::default()),
            Err(ChatError::Input(_))
        ));
    }

    #[test]
    fn chatml_fallback_renders() {
        let opts = RenderOptions {
            add_generation_prompt: true,
            ..Default::default()
        };
        let out = render(
            CHATML_TEMPLATE,
            json!([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]),
            &opts,
        );
        assert_eq!(
            out,
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn jinja2_whitespace_and_python_printing() {
        // trim_blocks eats the newline after a block tag, lstrip_blocks the indentation
        // before one, and one trailing newline of the source goes away.
        let src = "{% for m in messages %}\n    {% if true %}\n[{{ m.content }}]\n    {% endif %}\n{% endfor %}\n";
        let out = render(
            src,
            json!([{"content": "a"}, {"content": "b"}]),
            &RenderOptions::default(),
        );
        assert_eq!(out, "[a]\n[b]\n");
        let src =
            "{{ none }} {{ true }} {{ [1, 'x'] }} {{ 1.0 }} {{ undefined_var }}|{{ 7 | string }}";
        assert_eq!(
            render(src, json!([]), &RenderOptions::default()),
            "None True [1, 'x'] 1.0 |7"
        );
    }

    #[test]
    fn special_tokens_and_extra_variables() {
        let src = "{{ bos_token }}{% if enable_thinking is defined and enable_thinking is false %}no-think{% endif %}{{ eos_token }}";
        let mut opts = RenderOptions {
            bos_token: Some("<s>".into()),
            eos_token: Some("</s>".into()),
            ..Default::default()
        };
        assert_eq!(render(src, json!([]), &opts), "<s></s>");
        opts.extra.insert("enable_thinking".into(), json!(false));
        assert_eq!(render(src, json!([]), &opts), "<s>no-think</s>");
        opts.bos_token = None;
        assert_eq!(render(src, json!([]), &opts), "no-think</s>");
    }

    #[test]
    fn python_methods_loop_controls_and_strftime() {
        let src = "{% for m in messages %}{% if m.content.startswith('skip') %}{% continue %}{% endif %}{{ m.content.split('</think>')[-1].lstrip('\\n').upper() }};{% endfor %}{{ strftime_now('%Y') | length }}";
        let out = render(
            src,
            json!([{"content": "skip me"}, {"content": "x</think>\n\nfinal"}]),
            &RenderOptions::default(),
        );
        assert_eq!(out, "FINAL;4");
    }

    #[test]
    fn format_keys_that_are_not_ascii_are_an_error_and_ascii_ones_work() {
        let opts = RenderOptions::default();
        let msgs = json!([]);
        // minijinja 3.1 panics on these (a byte step inside a multi-byte character).
        for src in [
            "{{ '{a[é]}'.format(a={'é': 1}) }}",
            "{{ '{0[ü]}'.format([1]) }}",
            "{{ '{a.b[x}é]'.format(a=1) }}",
            "{{ '%(ключ)s' | format(ключ=1) }}",
            "{{ 'x %(a\u{fffd}' | format(a=1) }}",
        ] {
            match ChatTemplate::new(src).unwrap().render(&msgs, &opts) {
                Err(ChatError::Render(m)) => assert!(m.contains("not ASCII"), "{src}: {m}"),
                other => panic!("{src}: {other:?}"),
            }
        }
        // ASCII keys, escapes, and non-ASCII text outside keys are untouched.
        for (src, want) in [
            ("{{ '{a[k]}é{{[é]}}'.format(a={'k': 1}) }}", "1é{[é]}"),
            ("{{ '{0}[é]'.format(2) }}", "2[é]"),
            ("{{ '%(k)s ü %%(é)' | format(k=3) }}", "3 ü %(é)"),
            ("{{ 'ü%sö' | format(4) }}", "ü4ö"),
        ] {
            assert_eq!(render(src, msgs.clone(), &opts), want, "{src}");
        }
    }

    #[test]
    fn generation_blocks_render_their_body() {
        let src = "{% for m in messages %}{%- generation -%}\n  <{{ m.content }}>\n{%- endgeneration %}{% endfor %}";
        let out = render(src, json!([{"content": "a"}]), &RenderOptions::default());
        assert_eq!(out, "<a>");
        // An identifier that merely starts with the word is left alone.
        assert_eq!(
            rewrite_generation_blocks("{% if generation_prompt %}"),
            "{% if generation_prompt %}"
        );
    }

    /// A long conversation with tool calls, `<think>` blocks and tool results, every
    /// turn `body` bytes long.
    fn long_conversation(n: usize, body: usize) -> serde_json::Value {
        let text = |i: usize| {
            let mut s = format!("message {i}: ");
            while s.len() < body {
                s.push_str("the quick brown fox jumps over the lazy dog, é ü 字; ");
            }
            s
        };
        let mut m = vec![json!({"role": "system", "content": "You are a helpful assistant."})];
        let mut i = 1;
        while m.len() < n {
            m.push(json!({"role": "user", "content": text(i)}));
            if i % 5 == 0 {
                m.push(
                    json!({"role": "assistant", "content": "", "tool_calls": [{"type": "function",
                    "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]}),
                );
                m.push(json!({"role": "tool", "content": "{\"temp\": 21}"}));
            }
            m.push(json!({"role": "assistant",
                "content": format!("<think>\nreasoning {i}\n</think>\n\n{}", text(i))}));
            i += 1;
        }
        m.truncate(n);
        serde_json::Value::Array(m)
    }

    /// `fuel_cap` lowers the budget (a loop the full budget finishes stops as a limit) and
    /// never raises it; a short conversation on a fixture template fits a small cap.
    #[test]
    fn a_fuel_cap_lowers_the_budget_only() {
        let msgs = json!([{"role": "user", "content": "hi"}]);
        let looping = ChatTemplate::new(
            "{% for i in range(3000) %}{% for j in range(10) %}.{% endfor %}{% endfor %}",
        )
        .unwrap();
        let capped = |cap| RenderOptions {
            fuel_cap: Some(cap),
            ..Default::default()
        };
        let (out, used) = looping
            .render_metered(&msgs, &RenderOptions::default())
            .unwrap();
        assert_eq!(out.len(), 30_000);
        assert!(used > 30_000, "{used}");
        match looping.render(&msgs, &capped(used / 2)) {
            Err(ChatError::Limit(m)) => assert!(m.contains("the cap this rendering"), "{m}"),
            other => panic!("{other:?}"),
        }
        assert_eq!(looping.render(&msgs, &capped(u64::MAX)).unwrap(), out);
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/fixtures/chat");
        let qwen3 =
            ChatTemplate::new(&std::fs::read_to_string(dir.join("qwen3.jinja")).unwrap()).unwrap();
        let conv = long_conversation(6, 40);
        let (_, used) = qwen3
            .render_metered(&conv, &RenderOptions::default())
            .unwrap();
        assert!(used < 6_000, "{used}");
        qwen3.render(&conv, &capped(60_000)).unwrap();
    }

    /// The fuel the real templates use, against the budget: the base alone leaves a 10×
    /// margin at 2000 messages, and the whole budget keeps 10× for many short messages
    /// and for a conversation near [`MAX_OUTPUT_BYTES`]. (Measured: 89 k to 213 k fuel at
    /// 2000 messages, 0.5 to 1.7 M at 20 000 short ones, 0.6 to 0.9 M at 12 MB.)
    #[test]
    fn fixture_templates_use_a_fraction_of_the_fuel() {
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/fixtures/chat");
        assert!(dir.exists(), "{} is missing", dir.display());
        let tools = json!([{"type": "function", "function": {"name": "get_weather",
            "description": "Get the weather", "parameters": {"type": "object",
            "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]);
        let opts = RenderOptions {
            add_generation_prompt: true,
            tools: Some(tools),
            ..Default::default()
        };
        for name in [
            "chatml.jinja",
            "smollm2.jinja",
            "qwen25.jinja",
            "qwen3.jinja",
        ] {
            let t = ChatTemplate::new(&std::fs::read_to_string(dir.join(name)).unwrap()).unwrap();
            for (n, body, base_only) in
                [(2000, 300, true), (20_000, 10, false), (200, 60_000, false)]
            {
                let msgs = long_conversation(n, body);
                let (out, used) = t.render_metered(&msgs, &opts).unwrap();
                assert!(out.len() > n * body / 2, "{name}");
                let budget = if base_only {
                    FUEL
                } else {
                    // As render_metered counts the input: the context around the messages.
                    fuel_budget(n, msgs.to_string().len())
                };
                assert!(
                    used * 10 <= budget,
                    "{name}, {n} messages of {body} bytes: {used} fuel of {budget}"
                );
            }
        }
    }
}
