//! `cortiq tensors FILE`: the tensor directory as a table or a JSON list.

use std::cmp::Ordering;
use std::path::PathBuf;

use cortiq_engine::format::{CmfModel, TensorEntry};
use serde_json::{json, Value};

use super::common::{
    self, bpw, esc, group_digits, human_bytes, shape_str, Align, CmdResult, Status, Table,
};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Model file (.cmf).
    pub file: PathBuf,
    /// Keep tensors whose name contains this text, or matches it as a glob when it has
    /// `*` or `?` (the glob must match the whole name).
    #[arg(long, short = 'f', value_name = "SUBSTR_OR_GLOB")]
    pub filter: Option<String>,
    /// Order of the rows; without it, directory order.
    #[arg(long, short = 's', value_enum)]
    pub sort: Option<SortKey>,
    /// Reverse the order.
    #[arg(long, short = 'r')]
    pub reverse: bool,
    /// Print a JSON list of {name, dtype, shape, nbytes, offset, hash, ...}.
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum SortKey {
    /// Byte order of the names.
    Name,
    /// Dtype id, then name.
    Dtype,
    /// Stored bytes, then name.
    Size,
    /// Offset in the data section.
    Offset,
    /// Layer number, then name with numbers compared as numbers; tensors outside layers first.
    Layer,
}

pub fn run(args: &Args) -> CmdResult {
    let file = common::open(&args.file)?;
    // A shard lists the merged directory of its whole set (§10), each row with its shard.
    let model = match file.header.shard {
        Some(_) => {
            Some(CmfModel::open(&args.file).map_err(|e| common::CliError::format(&args.file, &e))?)
        }
        None => None,
    };
    let all: Vec<(Option<usize>, &TensorEntry)> = match &model {
        Some(m) => m.tensors().map(|(s, e)| (Some(s + 1), e)).collect(),
        None => file.directory.iter().map(|e| (None, e)).collect(),
    };
    let total = all.len();
    let mut rows: Vec<(Option<usize>, &TensorEntry)> = all
        .into_iter()
        .filter(|(_, e)| {
            args.filter
                .as_deref()
                .is_none_or(|f| matches_filter(f, &e.name))
        })
        .collect();
    if let Some(key) = args.sort {
        // Stable sorts: equal keys keep directory order.
        rows.sort_by(|a, b| compare(key, a.1, b.1));
    }
    if args.reverse {
        rows.reverse();
    }
    if args.json {
        let list: Vec<Value> = rows
            .iter()
            .map(|(shard, e)| {
                let mut v = entry_json(e);
                if let (Some(no), Some(obj)) = (shard, v.as_object_mut()) {
                    obj.insert("shard".into(), json!(no));
                }
                v
            })
            .collect();
        common::print_json(&Value::Array(list))?;
    } else {
        common::emit(&text(&rows, total, model.is_some()))?;
    }
    Ok(Status::Success)
}

/// The JSON shape of one directory entry (DESIGN.md: name, dtype, shape, nbytes, offset,
/// hash; the rest are extras).
pub fn entry_json(e: &TensorEntry) -> Value {
    json!({
        "name": e.name,
        "dtype": e.dtype.name(),
        "shape": e.shape,
        "nbytes": e.nbytes,
        "offset": e.off,
        "hash": format!("{:016x}", e.hash),
        "numel": e.numel(),
        "bits_per_weight": e.bits_per_weight(),
        "layer": e.layer(),
    })
}

fn text(rows: &[(Option<usize>, &TensorEntry)], total_in_file: usize, sharded: bool) -> String {
    let mut cols = vec![
        ("name", Align::Left),
        ("dtype", Align::Left),
        ("shape", Align::Left),
        ("params", Align::Right),
        ("size", Align::Right),
        ("bpw", Align::Right),
        ("offset", Align::Right),
        ("hash", Align::Left),
    ];
    if sharded {
        cols.push(("shard", Align::Right));
    }
    let mut t = Table::new(&cols).indent(0);
    let (mut params, mut bytes) = (0u64, 0u64);
    for (shard, e) in rows {
        params += e.numel();
        bytes += e.nbytes;
        let mut cells = vec![
            esc(&e.name),
            e.dtype.name().to_string(),
            shape_str(&e.shape),
            group_digits(e.numel()),
            human_bytes(e.nbytes),
            format!("{:.2}", e.bits_per_weight()),
            e.off.to_string(),
            format!("{:016x}", e.hash),
        ];
        if let Some(no) = shard {
            cells.push(no.to_string());
        }
        t.row(cells);
    }
    let mut out = String::new();
    if !rows.is_empty() {
        t.render(&mut out);
    }
    let shown = if rows.len() == total_in_file {
        format!("{} tensors", rows.len())
    } else {
        format!("{} of {} tensors", rows.len(), total_in_file)
    };
    out.push_str(&format!(
        "{shown}, {} parameters, {} ({} bytes), {:.2} bits/weight\n",
        group_digits(params),
        human_bytes(bytes),
        group_digits(bytes),
        bpw(bytes, params)
    ));
    out
}

fn compare(key: SortKey, a: &TensorEntry, b: &TensorEntry) -> Ordering {
    match key {
        SortKey::Name => a.name.cmp(&b.name),
        SortKey::Dtype => a
            .dtype
            .id()
            .cmp(&b.dtype.id())
            .then_with(|| a.name.cmp(&b.name)),
        SortKey::Size => a.nbytes.cmp(&b.nbytes).then_with(|| a.name.cmp(&b.name)),
        SortKey::Offset => a.off.cmp(&b.off),
        SortKey::Layer => a
            .layer()
            .cmp(&b.layer())
            .then_with(|| natural_cmp(&a.name, &b.name)),
    }
}

/// Compares names with runs of digits taken as numbers: `experts.9` < `experts.10`.
pub fn natural_cmp(a: &str, b: &str) -> Ordering {
    let (mut a, mut b) = (a.as_bytes(), b.as_bytes());
    loop {
        match (a.first(), b.first()) {
            (None, None) => return Ordering::Equal,
            (None, Some(_)) => return Ordering::Less,
            (Some(_), None) => return Ordering::Greater,
            (Some(x), Some(y)) if x.is_ascii_digit() && y.is_ascii_digit() => {
                let da = a.iter().take_while(|c| c.is_ascii_digit()).count();
                let db = b.iter().take_while(|c| c.is_ascii_digit()).count();
                // Compare the numbers without parsing (no overflow on long runs): strip
                // leading zeros, then a longer number is larger, then digit by digit.
                let na = trim_zeros(&a[..da]);
                let nb = trim_zeros(&b[..db]);
                let ord = na
                    .len()
                    .cmp(&nb.len())
                    .then_with(|| na.cmp(nb))
                    .then_with(|| da.cmp(&db));
                if ord != Ordering::Equal {
                    return ord;
                }
                a = &a[da..];
                b = &b[db..];
            }
            (Some(x), Some(y)) => {
                if x != y {
                    return x.cmp(y);
                }
                a = &a[1..];
                b = &b[1..];
            }
        }
    }
}

fn trim_zeros(d: &[u8]) -> &[u8] {
    let z = d.iter().take_while(|&&c| c == b'0').count();
    &d[z..]
}

/// A glob (`*` any run, `?` one character) when the pattern has one of those, else a
/// substring test.
pub fn matches_filter(pattern: &str, name: &str) -> bool {
    if pattern.contains(['*', '?']) {
        let p: Vec<char> = pattern.chars().collect();
        let n: Vec<char> = name.chars().collect();
        glob_match(&p, &n)
    } else {
        name.contains(pattern)
    }
}

/// Iterative wildcard matching with single-star backtracking: linear in practice, never
/// exponential on hostile patterns.
fn glob_match(p: &[char], n: &[char]) -> bool {
    let (mut pi, mut ni) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ni < n.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == n[ni]) {
            pi += 1;
            ni += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ni));
            pi += 1;
        } else if let Some((sp, sn)) = star {
            pi = sp + 1;
            ni = sn + 1;
            star = Some((sp, sn + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters() {
        assert!(matches_filter("mlp", "model.layers.0.mlp.up_proj.weight"));
        assert!(matches_filter("*.layers.1?.*", "model.layers.12.x"));
        assert!(!matches_filter("*.layers.1?.*", "model.layers.1.x"));
        assert!(matches_filter("lm_head*", "lm_head.weight"));
        assert!(!matches_filter("lm_head", "model.norm.weight"));
        assert!(matches_filter("*", ""));
    }

    #[test]
    fn natural_order() {
        assert_eq!(natural_cmp("experts.9.w", "experts.10.w"), Ordering::Less);
        assert_eq!(natural_cmp("a10", "a010"), Ordering::Less);
        assert_eq!(natural_cmp("abc", "abd"), Ordering::Less);
        assert_eq!(natural_cmp("x.2", "x.2"), Ordering::Equal);
    }
}
