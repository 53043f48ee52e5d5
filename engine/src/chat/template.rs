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
//! Known differences, none of which a fixture template exercises: `strftime_now` renders
//! UTC (std has no time zone database); objects without a data form (ranges, namespaces, loop
//! objects) print in minijinja's form where Python would name a memory address; the
//! ImmutableSandbox's refusal of mutating methods has nothing to refuse, because
//! pycompat offers no `append` or `update`.

use minijinja::value::{Kwargs, Serde, Value};
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
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.set_formatter(|out, _state, value| {
            if let Some(s) = value.as_str() {
                return out.write_str(s).map_err(Error::from);
            }
            let mut s = String::new();
            pyfmt::py_str(value, &mut s);
            out.write_str(&s).map_err(Error::from)
        });
        env.add_filter("tojson", tojson);
        env.add_filter("string", |v: &Value| {
            let mut s = String::new();
            pyfmt::py_str(v, &mut s);
            s
        });
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
        let tmpl = self
            .env
            .get_template(NAME)
            .map_err(|e| ChatError::Render(describe(&e)))?;
        tmpl.render(Value::from(Serde(serde_json::Value::Object(ctx))))
            .map_err(|e| match raised(&e) {
                Some(msg) => ChatError::Raised(msg),
                None => ChatError::Render(describe(&e)),
            })
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
                " ".repeat(n.max(0) as usize)
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
}
