//! What every subcommand shares: opening a file with the error → exit code mapping of
//! DESIGN.md, writing one JSON document or aligned text, and formatting helpers.
//!
//! Everything that came out of a file (tensor names, task names, descriptions, JSON
//! strings) passes through [`esc`] before it reaches a terminal; JSON output needs no such
//! step because serde_json escapes control characters itself.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::Path;
use std::process::ExitCode;

use cortiq_engine::format::{self, CmfFile, FormatError};
use serde_json::{json, Value};

/// How a command that ran to the end wants the process to exit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// Exit 0.
    Success,
    /// Exit 1 without an error message: the command reported a negative result itself
    /// (a verification failure, `diff --exit-code` on differing files).
    Failure,
}

impl From<Status> for ExitCode {
    fn from(s: Status) -> ExitCode {
        match s {
            Status::Success => ExitCode::SUCCESS,
            Status::Failure => ExitCode::from(1),
        }
    }
}

/// The result every subcommand's `run` returns.
pub type CmdResult = Result<Status, CliError>;

/// An error that ends a command, with the kind and exit code DESIGN.md assigns to it.
#[derive(Debug)]
pub struct CliError {
    /// A §1.2 error kind (`InvalidMagic`, `Bounds`, ...), `Io`, or `Usage`.
    pub kind: String,
    /// Human-readable message, unescaped (callers of [`CliError::report`] escape it).
    pub message: String,
    /// 1 for an invalid file, 2 for usage and I/O errors.
    pub code: u8,
}

impl CliError {
    /// A usage error (exit 2): unknown task or skill, bad combination of arguments.
    pub fn usage(message: impl Into<String>) -> CliError {
        CliError {
            kind: "Usage".into(),
            message: message.into(),
            code: 2,
        }
    }

    /// A local I/O failure (exit 2), e.g. writing the output.
    pub fn io(message: impl Into<String>) -> CliError {
        CliError {
            kind: "Io".into(),
            message: message.into(),
            code: 2,
        }
    }

    /// A reader error for `path`: exit 1 when the file is invalid, 2 when the operating
    /// system refused (the file may be fine; we could not read it).
    pub fn format(path: &Path, err: &FormatError) -> CliError {
        let kind = err.kind();
        let (message, code) = match err {
            // The I/O context already names the path ("open /x.cmf: ...").
            FormatError::Io { .. } => (err.message(), 2),
            _ => (format!("{}: {}", path.display(), err.message()), 1),
        };
        CliError {
            kind: kind.to_string(),
            message,
            code,
        }
    }

    /// Prints the error: `cortiq: <kind>: <message>` on stderr, and with `json` also the
    /// `{"ok": false, "error": {...}}` document on stdout so a script always gets one
    /// document to parse.
    pub fn report(&self, json: bool) {
        if json {
            let doc = json!({
                "ok": false,
                "error": { "kind": self.kind, "message": self.message },
            });
            // Nothing more can be done if stdout is gone; stderr still gets the message.
            let _ = print_json(&doc);
        }
        eprintln!("cortiq: {}: {}", self.kind, esc(&self.message));
    }

    pub fn exit_code(&self) -> ExitCode {
        ExitCode::from(self.code)
    }
}

/// Opens and validates a CMF file, mapping reader errors to exit codes.
pub fn open(path: &Path) -> Result<CmfFile, CliError> {
    // Opening a directory "works" on Unix and then fails in mmap with ENODEV; say what
    // is actually wrong.
    if path.is_dir() {
        return Err(CliError::io(format!(
            "{}: is a directory, not a CMF file",
            path.display()
        )));
    }
    CmfFile::open(path).map_err(|e| CliError::format(path, &e))
}

/// Writes `text` to stdout. A closed pipe (`cortiq tensors m.cmf | head`) is not an error
/// worth a message: the reader got what it wanted.
pub fn emit(text: &str) -> Result<(), CliError> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|_| out.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        Err(e) => Err(CliError::io(format!("writing to stdout: {e}"))),
    }
}

/// Writes one pretty-printed JSON document and a newline to stdout.
pub fn print_json(doc: &Value) -> Result<(), CliError> {
    // A `Value` always serializes; the fallback only keeps this function panic-free.
    let mut text = serde_json::to_string_pretty(doc).unwrap_or_else(|_| "null".into());
    text.push('\n');
    emit(&text)
}

/// Text from a file, safe to print to a terminal.
pub fn esc(s: &str) -> String {
    format::escape_str(s)
}

/// A path as given by the user, safe to print.
pub fn esc_path(p: &Path) -> String {
    esc(&p.to_string_lossy())
}

/// A JSON value on one line for a text view: strings without quotes, everything escaped,
/// cut to `max` characters with an ellipsis.
pub fn json_brief(v: &Value, max: usize) -> String {
    let s = match v {
        Value::String(s) => esc(s),
        Value::Null => "null".into(),
        // Compact JSON escapes control characters inside strings; escape again for the
        // non-ASCII controls serde leaves as they are.
        other => esc(&other.to_string()),
    };
    truncate(&s, max)
}

/// Cuts `s` to at most `max` characters, marking the cut with `…`.
pub fn truncate(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_string();
    }
    let mut out: String = s.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}

/// `1536` → `1.5 KiB`; bytes below 1 KiB are shown exactly.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1} {}", UNITS[unit])
}

/// `1234567` → `1,234,567`.
pub fn group_digits(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A shape as `[512, 64]`.
pub fn shape_str(shape: &[u64]) -> String {
    let dims: Vec<String> = shape.iter().map(u64::to_string).collect();
    format!("[{}]", dims.join(", "))
}

/// Bits per weight for display.
pub fn bpw(bytes: u64, params: u64) -> f64 {
    if params == 0 {
        0.0
    } else {
        bytes as f64 * 8.0 / params as f64
    }
}

/// A mask/expert/head index list as compact ranges: `0-3,5,7-8`.
pub fn ranges(items: impl IntoIterator<Item = u64>) -> String {
    let mut out = String::new();
    let mut run: Option<(u64, u64)> = None;
    let flush = |out: &mut String, (a, b): (u64, u64)| {
        if !out.is_empty() {
            out.push(',');
        }
        if a == b {
            let _ = write!(out, "{a}");
        } else {
            let _ = write!(out, "{a}-{b}");
        }
    };
    for i in items {
        run = match run {
            Some((a, b)) if i == b + 1 => Some((a, i)),
            Some(r) => {
                flush(&mut out, r);
                Some((i, i))
            }
            None => Some((i, i)),
        };
    }
    if let Some(r) = run {
        flush(&mut out, r);
    }
    if out.is_empty() {
        out.push('—');
    }
    out
}

/// Column alignment in a [`Table`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Align {
    Left,
    Right,
}

/// An aligned text table. Cells must already be escaped; widths count characters.
pub struct Table {
    headers: Option<Vec<String>>,
    align: Vec<Align>,
    rows: Vec<Vec<String>>,
    indent: usize,
}

impl Table {
    /// A table with a header row.
    pub fn new(cols: &[(&str, Align)]) -> Table {
        Table {
            headers: Some(cols.iter().map(|(h, _)| h.to_string()).collect()),
            align: cols.iter().map(|(_, a)| *a).collect(),
            rows: Vec::new(),
            indent: 2,
        }
    }

    /// A two-column `key  value` list without a header row.
    pub fn kv() -> Table {
        Table {
            headers: None,
            align: vec![Align::Left, Align::Left],
            rows: Vec::new(),
            indent: 2,
        }
    }

    pub fn indent(mut self, n: usize) -> Table {
        self.indent = n;
        self
    }

    pub fn row<S: Into<String>>(&mut self, cells: impl IntoIterator<Item = S>) {
        self.rows.push(cells.into_iter().map(Into::into).collect());
    }

    /// Shorthand for a key-value row.
    pub fn pair(&mut self, key: impl Into<String>, value: impl Into<String>) {
        self.rows.push(vec![key.into(), value.into()]);
    }

    /// Appends the table to `out`, one line per row, no trailing spaces.
    pub fn render(&self, out: &mut String) {
        let ncols = self.align.len();
        let mut widths = vec![0usize; ncols];
        for row in self.headers.iter().chain(&self.rows) {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(cell.chars().count());
            }
        }
        for row in self.headers.iter().chain(&self.rows) {
            let mut line = " ".repeat(self.indent);
            for (i, cell) in row.iter().enumerate().take(ncols) {
                let pad = widths[i].saturating_sub(cell.chars().count());
                let last = i + 1 == row.len().min(ncols);
                if i > 0 {
                    line.push_str("  ");
                }
                match self.align[i] {
                    Align::Right => {
                        line.push_str(&" ".repeat(pad));
                        line.push_str(cell);
                    }
                    Align::Left => {
                        line.push_str(cell);
                        if !last {
                            line.push_str(&" ".repeat(pad));
                        }
                    }
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
    }
}

/// `name (absent)` style placeholder for missing optional values in text views.
pub fn opt<T: ToString>(v: Option<T>) -> String {
    v.map(|v| v.to_string()).unwrap_or_else(|| "—".into())
}

/// Refuses an output path that names one of the inputs (the same file, by any path):
/// nothing overwrites a user's input.
pub fn refuse_overwriting_input(inputs: &[&Path], output: &Path) -> Result<(), CliError> {
    let Ok(out) = std::fs::canonicalize(output) else {
        return Ok(());
    }; // does not exist yet
    for input in inputs {
        if std::fs::canonicalize(input).is_ok_and(|i| i == out) {
            return Err(CliError::usage(format!(
                "the output {} is the input file; write to another path",
                output.display()
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formatting_helpers() {
        assert_eq!(human_bytes(1023), "1023 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(group_digits(1234567), "1,234,567");
        assert_eq!(group_digits(12), "12");
        assert_eq!(ranges([0, 1, 2, 3, 5, 7, 8]), "0-3,5,7-8");
        assert_eq!(ranges(std::iter::empty()), "—");
        assert_eq!(truncate("abcdef", 4), "abc…");
        assert_eq!(esc("a\u{1b}[31m"), "a\\u{1b}[31m");
    }

    #[test]
    fn table_aligns_without_trailing_spaces() {
        let mut t = Table::new(&[("name", Align::Left), ("n", Align::Right)]);
        t.row(["a", "10"]);
        t.row(["long", "2"]);
        let mut s = String::new();
        t.render(&mut s);
        assert_eq!(s, "  name   n\n  a     10\n  long   2\n");
    }
}
