//! Python's text forms of template values, so that a rendered prompt matches what jinja2
//! produces under Hugging Face's `apply_chat_template` byte for byte.
//!
//! Two places need them:
//! - printing `{{ value }}`: jinja2 writes `str(value)` — `None`, `True`, `1.0`, lists and
//!   dicts as Python reprs (`['a', 1]`), where minijinja would write `none`, `true`, `["a", 1]`;
//! - HF's `tojson` filter, which is `json.dumps(x, ensure_ascii=False, indent=None,
//!   separators=None, sort_keys=False)`: `", "` / `": "` separators, key order kept, no HTML
//!   escaping, floats in Python's repr.

use minijinja::value::{Value, ValueKind};
use minijinja::{Error, ErrorKind};

/// `json.dumps` options, with Python's defaults as HF's filter passes them.
#[derive(Clone, Debug)]
pub(crate) struct JsonOptions {
    /// Escape every non-ASCII character as `\uXXXX` (HF's default: false).
    pub ensure_ascii: bool,
    /// `None`: one line. `Some(s)`: newline before each item, `s` repeated per level.
    pub indent: Option<String>,
    /// Between items.
    pub item_sep: String,
    /// Between a key and its value.
    pub key_sep: String,
    /// Keys in sorted order instead of insertion order.
    pub sort_keys: bool,
}

impl Default for JsonOptions {
    fn default() -> Self {
        JsonOptions {
            ensure_ascii: false,
            indent: None,
            item_sep: ", ".into(),
            key_sep: ": ".into(),
            sort_keys: false,
        }
    }
}

fn not_serializable(v: &Value) -> Error {
    // Python says "Object of type Undefined is not JSON serializable"; say the same.
    let kind = match v.kind() {
        ValueKind::Undefined => "Undefined".to_string(),
        k => k.to_string(),
    };
    Error::new(
        ErrorKind::InvalidOperation,
        format!("Object of type {kind} is not JSON serializable"),
    )
}

/// `json.dumps(value, ...)` as Python writes it.
pub(crate) fn json_dumps(value: &Value, opts: &JsonOptions) -> Result<String, Error> {
    let mut out = String::new();
    write_json(value, opts, 0, &mut out)?;
    Ok(out)
}

fn newline_indent(opts: &JsonOptions, level: usize, out: &mut String) {
    if let Some(ind) = &opts.indent {
        out.push('\n');
        for _ in 0..level {
            out.push_str(ind);
        }
    }
}

fn write_json(v: &Value, opts: &JsonOptions, level: usize, out: &mut String) -> Result<(), Error> {
    match v.kind() {
        ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number => write_json_number(v, out)?,
        ValueKind::String => json_string(v.as_str().unwrap_or_default(), opts.ensure_ascii, out),
        // Lists, and lazily produced sequences (`x|reverse`), as JSON arrays: minijinja
        // yields iterables where Python would already hold a list.
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(&opts.item_sep);
                }
                newline_indent(opts, level + 1, out);
                write_json(item, opts, level + 1, out)?;
            }
            newline_indent(opts, level, out);
            out.push(']');
        }
        ValueKind::Map => {
            let mut entries = Vec::new();
            for key in v.try_iter()? {
                let item = v.get_item(&key)?;
                entries.push((json_key(&key)?, item));
            }
            if entries.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            if opts.sort_keys {
                entries.sort_by(|a, b| a.0.cmp(&b.0));
            }
            out.push('{');
            for (i, (key, item)) in entries.iter().enumerate() {
                if i > 0 {
                    out.push_str(&opts.item_sep);
                }
                newline_indent(opts, level + 1, out);
                json_string(key, opts.ensure_ascii, out);
                out.push_str(&opts.key_sep);
                write_json(item, opts, level + 1, out)?;
            }
            newline_indent(opts, level, out);
            out.push('}');
        }
        _ => return Err(not_serializable(v)),
    }
    Ok(())
}

/// Python converts non-string keys the way it writes the scalar (`1` → `"1"`,
/// `True` → `"true"`, `None` → `"null"`).
fn json_key(k: &Value) -> Result<String, Error> {
    Ok(match k.kind() {
        ValueKind::String => k.as_str().unwrap_or_default().to_string(),
        ValueKind::None => "null".into(),
        ValueKind::Bool => if k.is_true() { "true" } else { "false" }.into(),
        ValueKind::Number => {
            let mut s = String::new();
            write_json_number(k, &mut s)?;
            s
        }
        _ => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!(
                    "keys must be str, int, float, bool or None, not {}",
                    k.kind()
                ),
            ))
        }
    })
}

fn write_json_number(v: &Value, out: &mut String) -> Result<(), Error> {
    if v.is_integer() {
        // Display of an integer value is its decimal form, whatever its width.
        out.push_str(&v.to_string());
        return Ok(());
    }
    let f = f64::try_from(v.clone())?;
    if f.is_nan() {
        out.push_str("NaN");
    } else if f.is_infinite() {
        out.push_str(if f > 0.0 { "Infinity" } else { "-Infinity" });
    } else {
        out.push_str(&float_repr(f));
    }
    Ok(())
}

/// A JSON string literal as Python's encoder writes it: only `"`, `\` and control
/// characters escaped (lowercase hex), everything else literal unless `ensure_ascii`.
pub(crate) fn json_string(s: &str, ensure_ascii: bool, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => push_u16_escape(c as u32, out),
            // With ensure_ascii Python escapes everything outside ' '..='~' (so DEL too).
            c if ensure_ascii && (c as u32) > 0x7e => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    push_u16_escape(u32::from(*unit), out);
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

fn push_u16_escape(unit: u32, out: &mut String) {
    out.push_str(&format!("\\u{unit:04x}"));
}

/// Python's `repr(float)`: the shortest round-tripping digits, positional notation for
/// decimal exponents in -4..16, otherwise `1e+16` style with at least two exponent digits,
/// and always a `.0` on integral values in positional form.
pub(crate) fn float_repr(f: f64) -> String {
    if f.is_nan() {
        return "nan".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "inf" } else { "-inf" }.into();
    }
    if f == 0.0 {
        return if f.is_sign_negative() { "-0.0" } else { "0.0" }.into();
    }
    // Rust's `{:e}` without precision is the shortest round-trip form, e.g. `-1.25e-7`.
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci
        .split_once('e')
        .expect("LowerExp always has an exponent");
    let exp: i32 = exp.parse().expect("LowerExp exponent is an integer");
    let (neg, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => (true, m),
        None => (false, mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let mut out = String::new();
    if neg {
        out.push('-');
    }
    if (-4..16).contains(&exp) {
        if exp >= 0 {
            let int_len = exp as usize + 1;
            if digits.len() <= int_len {
                out.push_str(&digits);
                out.push_str(&"0".repeat(int_len - digits.len()));
                out.push_str(".0");
            } else {
                out.push_str(&digits[..int_len]);
                out.push('.');
                out.push_str(&digits[int_len..]);
            }
        } else {
            out.push_str("0.");
            out.push_str(&"0".repeat((-exp - 1) as usize));
            out.push_str(&digits);
        }
    } else {
        out.push_str(&digits[..1]);
        if digits.len() > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        out.push('e');
        out.push(if exp < 0 { '-' } else { '+' });
        out.push_str(&format!("{:02}", exp.abs()));
    }
    out
}

/// `str(value)`: what jinja2 prints for `{{ value }}`. Undefined prints nothing, as with
/// jinja2's default `Undefined`.
pub(crate) fn py_str(v: &Value, out: &mut String) {
    match v.kind() {
        ValueKind::Undefined => {}
        ValueKind::String => out.push_str(v.as_str().unwrap_or_default()),
        _ => py_repr(v, out),
    }
}

/// `repr(value)`: how Python shows a value inside a printed list or dict.
fn py_repr(v: &Value, out: &mut String) {
    match v.kind() {
        ValueKind::Undefined => out.push_str("Undefined"),
        ValueKind::None => out.push_str("None"),
        ValueKind::Bool => out.push_str(if v.is_true() { "True" } else { "False" }),
        ValueKind::Number => {
            if v.is_integer() {
                out.push_str(&v.to_string());
            } else {
                match f64::try_from(v.clone()) {
                    Ok(f) => out.push_str(&float_repr(f)),
                    Err(_) => out.push_str(&v.to_string()),
                }
            }
        }
        ValueKind::String => str_repr(v.as_str().unwrap_or_default(), out),
        ValueKind::Seq => match v.try_iter() {
            Ok(items) => {
                let tuple = v.is_tuple();
                out.push(if tuple { '(' } else { '[' });
                let mut n = 0;
                for (i, item) in items.enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    py_repr(&item, out);
                    n += 1;
                }
                if tuple && n == 1 {
                    out.push(',');
                }
                out.push(if tuple { ')' } else { ']' });
            }
            Err(_) => out.push_str(&v.to_string()),
        },
        ValueKind::Map => match v.try_iter() {
            Ok(keys) => {
                out.push('{');
                for (i, key) in keys.enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    py_repr(&key, out);
                    out.push_str(": ");
                    py_repr(&v.get_item(&key).unwrap_or_default(), out);
                }
                out.push('}');
            }
            Err(_) => out.push_str(&v.to_string()),
        },
        // Ranges, namespaces, loop objects: Python's forms name memory addresses; there is
        // nothing to match, so minijinja's own form it is.
        _ => out.push_str(&v.to_string()),
    }
}

/// `repr(str)`: single quotes unless the text holds `'` and no `"`; escapes for the
/// backslash, the chosen quote and unprintable characters.
fn str_repr(s: &str, out: &mut String) {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if !is_printable(c) => {
                let n = c as u32;
                if n <= 0xff {
                    out.push_str(&format!("\\x{n:02x}"));
                } else if n <= 0xffff {
                    out.push_str(&format!("\\u{n:04x}"));
                } else {
                    out.push_str(&format!("\\U{n:08x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push(quote);
}

/// An approximation of Python's `str.isprintable` per character: controls, separators
/// other than the space, surrogates, private use and the common format characters are
/// unprintable. Unassigned code points (which Python also escapes) are not tracked: that
/// would need the Unicode tables, and chat text does not carry them.
fn is_printable(c: char) -> bool {
    let n = c as u32;
    !matches!(n,
        0x00..=0x1f | 0x7f..=0xa0 | 0xad
        | 0x600..=0x605 | 0x61c | 0x6dd | 0x70f
        | 0x1680 | 0x180e
        | 0x2000..=0x200f | 0x2028..=0x202f | 0x205f..=0x2064 | 0x2066..=0x206f
        | 0x3000 | 0xd800..=0xf8ff | 0xfeff | 0xfff9..=0xfffb
        | 0x110bd | 0x1bca0..=0x1bca3 | 0x1d173..=0x1d17a | 0xe0001 | 0xe0020..=0xe007f
        | 0xf0000..=0x10ffff)
}

#[cfg(test)]
mod tests {
    use super::*;
    use minijinja::value::Serde;

    #[test]
    fn float_repr_matches_python() {
        for (f, s) in [
            (1.0, "1.0"),
            (0.1, "0.1"),
            (-2.5, "-2.5"),
            (1e16, "1e+16"),
            (1e15, "1000000000000000.0"),
            (123456789.125, "123456789.125"),
            (1e-4, "0.0001"),
            (1.5e-5, "1.5e-05"),
            (1e100, "1e+100"),
            (-0.0, "-0.0"),
            (f64::INFINITY, "inf"),
        ] {
            assert_eq!(float_repr(f), s, "{f}");
        }
    }

    #[test]
    fn str_of_values_is_pythons() {
        let v = Value::from(Serde(serde_json::json!({
            "a": [1, 2.0, true, null, "it's", "x\ny"],
            "b": "q\"'"
        })));
        let mut out = String::new();
        py_str(&v, &mut out);
        assert_eq!(
            out,
            r#"{'a': [1, 2.0, True, None, "it's", 'x\ny'], 'b': 'q"\''}"#
        );
        let mut out = String::new();
        py_str(&Value::UNDEFINED, &mut out);
        assert_eq!(out, "");
    }

    #[test]
    fn json_dumps_indent_and_ascii() {
        let v = Value::from(Serde(
            serde_json::json!({"b": [1, {"c": []}], "a": "é\u{1F600}"}),
        ));
        let opts = JsonOptions {
            indent: Some("  ".into()),
            item_sep: ",".into(),
            ..JsonOptions::default()
        };
        assert_eq!(
            json_dumps(&v, &opts).unwrap(),
            "{\n  \"b\": [\n    1,\n    {\n      \"c\": []\n    }\n  ],\n  \"a\": \"é\u{1F600}\"\n}"
        );
        let opts = JsonOptions {
            ensure_ascii: true,
            sort_keys: true,
            ..JsonOptions::default()
        };
        assert_eq!(
            json_dumps(&v, &opts).unwrap(),
            r#"{"a": "\u00e9\ud83d\ude00", "b": [1, {"c": []}]}"#
        );
    }
}
