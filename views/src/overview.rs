//! View 1, Overview: the header as a browsable tree beside the file's facts — layout of
//! sections, the shards of a sharded model, parameters and bytes per dtype and per layer,
//! tokenizer and chat bundle, pipeline components, provenance, warnings.

use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Clear, Paragraph, Row, Table, Wrap};
use ratatui::Frame;

use crate::theme::Theme;
use crate::util::{centered, esc, group_digits, human_bytes, truncate};

/// One visible row of the header tree.
#[derive(Clone, Debug, PartialEq)]
pub struct TreeRow {
    pub depth: u16,
    pub key: String,
    /// Scalar value, or a summary (`{12 keys}`, `[4 items]`) for containers.
    pub value: String,
    pub expandable: bool,
    pub expanded: bool,
    /// A field the spec does not name (shown so unknown fields are visible).
    pub unknown: bool,
}

/// One section of the file for the layout bar.
#[derive(Clone, Debug, PartialEq)]
pub struct Segment {
    pub name: String,
    pub off: u64,
    pub len: u64,
}

/// One file of a sharded model (§10).
#[derive(Clone, Debug, PartialEq)]
pub struct ShardRow {
    /// 1-based, as in the file name.
    pub no: u32,
    pub count: u32,
    pub file: String,
    pub tensors: u64,
    /// Bytes of its tensors' data.
    pub bytes: u64,
    /// Size of the file.
    pub file_len: u64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct DtypeRow {
    pub dtype: String,
    pub tensors: u64,
    pub params: u64,
    pub bytes: u64,
}

pub struct OverviewVm<'a> {
    pub tree: &'a [TreeRow],
    pub selected: usize,
    pub offset: usize,
    pub facts: &'a [(String, String)],
    /// Sections of the (primary) file and its size.
    pub segments: &'a [Segment],
    pub file_len: u64,
    /// Every shard of a sharded model; empty for a single file (no panel then).
    pub shards: &'a [ShardRow],
    pub dtypes: &'a [DtypeRow],
    /// Bytes per layer, in layer order; `None` label for tensors outside layers.
    pub per_layer: &'a [(String, u64)],
    /// What the layers are, in a line or two each: the mixers and feed-forwards, the MTP
    /// head (wrapped at words when there is room, else cut).
    pub layer_summary: &'a [String],
    /// Each layer's kind, runs of equal layers folded: (`L0–2`, `linear·MoE 8e`).
    pub layer_kinds: &'a [(String, String)],
    pub tokenizer: &'a [(String, String)],
    pub extra: &'a [(String, String)],
    pub warnings: &'a [String],
    /// The chat template popup, when open.
    pub template: Option<(&'a str, u16)>,
}

const SEGMENT_GLYPHS: [(&str, char, Color); 7] = [
    ("envelope", 'E', Color::White),
    ("header", 'H', Color::Cyan),
    ("directory", 'D', Color::Magenta),
    ("data", '█', Color::Blue),
    ("masks", 'M', Color::Green),
    ("vocab", 'V', Color::Yellow),
    ("index", 'I', Color::Red),
];

fn glyph(name: &str) -> (char, Color) {
    SEGMENT_GLYPHS
        .iter()
        .find(|(n, _, _)| *n == name)
        .map(|(_, g, c)| (*g, *c))
        .unwrap_or(('·', Color::DarkGray))
}

/// Share of the width the header tree takes (the app hit-tests clicks with it).
pub const TREE_PERCENT: u16 = 42;

pub fn render(f: &mut Frame, area: Rect, vm: &OverviewVm, theme: &Theme) {
    let [left, right] = Layout::horizontal([
        Constraint::Percentage(TREE_PERCENT),
        Constraint::Percentage(100 - TREE_PERCENT),
    ])
    .areas(area);
    render_tree(f, left, vm, theme);

    // Stacked panels; when the terminal is short, the per-dtype table keeps the dtypes
    // with the most bytes and folds the rest into one line rather than being cut.
    let facts_h = vm.facts.len() as u16 + 2;
    let tok_h = vm.tokenizer.len().max(1) as u16 + 2;
    // Warnings must stay visible: keep room for them in the last panel.
    let extra_min = if vm.warnings.is_empty() {
        0
    } else {
        vm.warnings.len() as u16 + 2
    };
    // The layers panel: one line per summary and the bytes sparkline at least (its
    // caption is the title); the kinds of the layers and wrapped summaries when there is
    // room.
    let inner_w = right.width.saturating_sub(2) as usize;
    let summary_want: Vec<u16> = vm
        .layer_summary
        .iter()
        .map(|s| (wrap_words(s, inner_w).len() as u16).clamp(1, SUMMARY_LINES))
        .collect();
    let kinds_want = (flow_kinds(vm.layer_kinds, inner_w, usize::MAX).len() as u16).min(KIND_LINES);
    let layers_min = 2 + summary_want.len() as u16 + 1;
    let spare = right
        .height
        .saturating_sub(facts_h + 4 + layers_min + tok_h + extra_min);
    // What is left goes to a few dtypes first, then the shards (a long list folds its
    // middle), then a line of layer kinds and the wrapped summaries, then the other
    // dtypes, then more layer kinds; the `more` panel takes the rest.
    let dtypes_n = vm.dtypes.len() as u16;
    let shards_n = (vm.shards.len() as u16).min(SHARDS_SHOWN);
    let shards_frame = if shards_n > 0 { 2 } else { 0 };
    let mut room = spare.saturating_sub(4 + shards_frame);
    let first = dtypes_n.min(3).min(room);
    room -= first;
    let shard_rows = shards_n.min(room).max(shards_n.min(1));
    room = room.saturating_sub(shard_rows);
    let mut kind_rows = kinds_want.min(1).min(room);
    room -= kind_rows;
    let mut summary_rows = Vec::with_capacity(summary_want.len());
    for &w in &summary_want {
        let extra = (w - 1).min(room);
        room -= extra;
        summary_rows.push(1 + extra);
    }
    let rest = (dtypes_n - first).min(room);
    room -= rest;
    let dtype_rows = (first + rest).max(dtypes_n.min(1));
    if kind_rows > 0 {
        let more = (kinds_want - kind_rows).min(room);
        kind_rows += more;
    }
    let shards_h = if shards_n > 0 { shard_rows + 2 } else { 0 };
    let layers_h = 2 + summary_rows.iter().sum::<u16>() + kind_rows + 1;
    let [facts, layout, shards, dtypes, layers, tok, extra] = Layout::vertical([
        Constraint::Length(facts_h),
        Constraint::Length(4),
        Constraint::Length(shards_h),
        Constraint::Length(dtype_rows + 4),
        Constraint::Length(layers_h),
        Constraint::Length(tok_h),
        Constraint::Min(extra_min),
    ])
    .areas(right);
    render_kv(f, facts, " file ", vm.facts, theme);
    render_layout(f, layout, vm, theme);
    if !vm.shards.is_empty() {
        render_shards(f, shards, vm.shards, shard_rows as usize, theme);
    }
    render_dtypes(f, dtypes, vm, dtype_rows as usize, theme);
    render_layers(f, layers, vm, &summary_rows, kind_rows as usize, theme);
    render_kv(
        f,
        tok,
        " tokenizer & chat (t: template) ",
        vm.tokenizer,
        theme,
    );
    let mut lines: Vec<Line> = vm
        .extra
        .iter()
        .map(|(k, v)| {
            Line::from(vec![
                Span::styled(format!("{k:<12} "), theme.dim),
                Span::raw(esc(v)),
            ])
        })
        .collect();
    for w in vm.warnings {
        lines.push(Line::styled(format!("warning: {}", esc(w)), theme.warn));
    }
    f.render_widget(
        Paragraph::new(lines)
            .wrap(Wrap { trim: true })
            .block(Block::bordered().title(" more ")),
        extra,
    );

    if let Some((text, scroll)) = vm.template {
        let r = centered(
            area,
            area.width.saturating_sub(6),
            area.height.saturating_sub(2),
        );
        f.render_widget(Clear, r);
        // Shown verbatim but escaped: line breaks kept, other control characters visible.
        let lines: Vec<Line> = text.split('\n').map(|l| Line::raw(esc(l))).collect();
        f.render_widget(
            Paragraph::new(lines).scroll((scroll, 0)).block(
                Block::bordered()
                    .title(" chat template — ↑↓ scroll, Esc closes ")
                    .border_style(theme.accent),
            ),
            r,
        );
    }
}

fn render_tree(f: &mut Frame, area: Rect, vm: &OverviewVm, theme: &Theme) {
    let h = area.height.saturating_sub(2) as usize;
    let lines: Vec<Line> = vm
        .tree
        .iter()
        .enumerate()
        .skip(vm.offset)
        .take(h)
        .map(|(i, r)| {
            let marker = if !r.expandable {
                "  "
            } else if r.expanded {
                "▾ "
            } else {
                "▸ "
            };
            let key_style = if r.unknown { theme.warn } else { theme.accent };
            let indent = "  ".repeat(r.depth as usize);
            let budget = (area.width as usize).saturating_sub(indent.len() + r.key.len() + 8);
            let line = Line::from(vec![
                Span::raw(indent),
                Span::raw(marker),
                Span::styled(esc(&r.key), key_style),
                Span::styled(": ", theme.dim),
                Span::raw(truncate(&esc(&r.value), budget)),
            ]);
            if i == vm.selected {
                line.style(theme.selected)
            } else {
                line
            }
        })
        .collect();
    f.render_widget(
        Paragraph::new(lines)
            .block(Block::bordered().title(" header (Enter expands; yellow = not in the spec) ")),
        area,
    );
}

fn render_kv(f: &mut Frame, area: Rect, title: &str, kv: &[(String, String)], theme: &Theme) {
    let lines: Vec<Line> = kv
        .iter()
        .map(|(k, v)| {
            Line::from(vec![
                Span::styled(format!("{k:<14} "), theme.dim),
                Span::raw(esc(v)),
            ])
        })
        .collect();
    f.render_widget(
        Paragraph::new(lines).block(Block::bordered().title(title.to_string())),
        area,
    );
}

fn render_layout(f: &mut Frame, area: Rect, vm: &OverviewVm, theme: &Theme) {
    let inner_w = area.width.saturating_sub(2) as usize;
    let mut bar = vec![(' ', Color::Reset); inner_w];
    if vm.file_len > 0 && inner_w > 0 {
        for s in vm.segments {
            let a = (s.off as u128 * inner_w as u128 / vm.file_len as u128) as usize;
            let b = (((s.off + s.len) as u128 * inner_w as u128).div_ceil(vm.file_len as u128)
                as usize)
                .max(a + 1);
            for c in bar.iter_mut().take(b.min(inner_w)).skip(a) {
                *c = glyph(&s.name);
            }
        }
    }
    let bar_line = Line::from(
        bar.iter()
            .map(|&(g, c)| {
                let style = if theme.color {
                    Style::default().fg(c)
                } else {
                    Style::default()
                };
                Span::styled(g.to_string(), style)
            })
            .collect::<Vec<_>>(),
    );
    let legend: Vec<Span> = vm
        .segments
        .iter()
        .filter(|s| s.name != "envelope")
        .flat_map(|s| {
            let (g, c) = glyph(&s.name);
            let style = if theme.color {
                Style::default().fg(c)
            } else {
                Style::default()
            };
            [
                Span::styled(format!("{g}"), style),
                Span::raw(format!(" {} {}  ", s.name, human_bytes(s.len))),
            ]
        })
        .collect();
    // A sharded model's sections live in shard 1 (§10): say whose layout this is.
    let of = if vm.shards.is_empty() {
        ""
    } else {
        " of shard 1"
    };
    f.render_widget(
        Paragraph::new(vec![bar_line, Line::from(legend)])
            .block(Block::bordered().title(format!(" layout{of} — {} ", human_bytes(vm.file_len)))),
        area,
    );
}

/// Shards listed before the rest fold into one line.
const SHARDS_SHOWN: u16 = 8;

fn render_shards(f: &mut Frame, area: Rect, shards: &[ShardRow], max_rows: usize, theme: &Theme) {
    const FIXED: [u16; 4] = [5, 14, 10, 10];
    // The file column takes what the numbers leave; names keep their shard number (the
    // end), cut in the middle.
    let gaps = FIXED.len() as u16;
    let file_w = area
        .width
        .saturating_sub(2 + FIXED.iter().sum::<u16>() + gaps)
        .max(8);
    let row = |no: String, file: &str, t: u64, b: u64, len: u64| {
        Row::new(vec![
            no,
            crate::tensors::truncate_middle(&esc(file), file_w as usize),
            format!("{} tensors", group_digits(t)),
            human_bytes(b),
            human_bytes(len),
        ])
    };
    let listed = |s: &ShardRow| {
        row(
            format!("{}/{}", s.no, s.count),
            &s.file,
            s.tensors,
            s.bytes,
            s.file_len,
        )
    };
    let folded = |rest: &[ShardRow]| {
        let sum = |f: fn(&ShardRow) -> u64| rest.iter().map(f).sum::<u64>();
        row(
            String::new(),
            &format!("+{} more", rest.len()),
            sum(|s| s.tensors),
            sum(|s| s.bytes),
            sum(|s| s.file_len),
        )
        .style(theme.dim)
    };
    let rows: Vec<Row> = if shards.len() <= max_rows {
        shards.iter().map(listed).collect()
    } else if max_rows < 2 {
        vec![folded(shards)]
    } else {
        // The first shards and the last one; the middle folds.
        let keep = max_rows - 2;
        let mut rows: Vec<Row> = shards[..keep].iter().map(listed).collect();
        rows.push(folded(&shards[keep..shards.len() - 1]));
        rows.extend(shards.last().map(listed));
        rows
    };
    let widths = [
        Constraint::Length(FIXED[0]),
        Constraint::Length(file_w),
        Constraint::Length(FIXED[1]),
        Constraint::Length(FIXED[2]),
        Constraint::Length(FIXED[3]),
    ];
    // No header row (room is short): the title names the columns.
    f.render_widget(
        Table::new(rows, widths).block(Block::bordered().title(format!(
            " shards — one model in {} files (§10): tensors · weights · file size ",
            shards.len()
        ))),
        area,
    );
}

fn render_dtypes(f: &mut Frame, area: Rect, vm: &OverviewVm, max_rows: usize, theme: &Theme) {
    let total_p: u64 = vm.dtypes.iter().map(|d| d.params).sum();
    let total_b: u64 = vm.dtypes.iter().map(|d| d.bytes).sum();
    let bpw = |b: u64, p: u64| {
        if p == 0 {
            "—".to_string()
        } else {
            format!("{:.2}", b as f64 * 8.0 / p as f64)
        }
    };
    let mut shown: Vec<&DtypeRow> = vm.dtypes.iter().collect();
    let folded = if shown.len() > max_rows {
        shown.sort_by_key(|r| std::cmp::Reverse(r.bytes));
        let rest: Vec<&DtypeRow> = shown.split_off(max_rows.saturating_sub(1));
        Some(rest)
    } else {
        None
    };
    let mut rows: Vec<Row> = shown
        .iter()
        .map(|d| {
            Row::new(vec![
                d.dtype.clone(),
                d.tensors.to_string(),
                group_digits(d.params),
                human_bytes(d.bytes),
                bpw(d.bytes, d.params),
            ])
        })
        .collect();
    if let Some(rest) = folded {
        let (t, p, b) = rest.iter().fold((0, 0, 0), |(t, p, b), d| {
            (t + d.tensors, p + d.params, b + d.bytes)
        });
        rows.push(
            Row::new(vec![
                format!("+{} more", rest.len()),
                t.to_string(),
                group_digits(p),
                human_bytes(b),
                bpw(b, p),
            ])
            .style(theme.dim),
        );
    }
    rows.push(
        Row::new(vec![
            "total".to_string(),
            vm.dtypes.iter().map(|d| d.tensors).sum::<u64>().to_string(),
            group_digits(total_p),
            human_bytes(total_b),
            bpw(total_b, total_p),
        ])
        .style(theme.title),
    );
    let widths = [
        Constraint::Length(10),
        Constraint::Length(8),
        Constraint::Length(16),
        Constraint::Length(11),
        Constraint::Length(6),
    ];
    f.render_widget(
        Table::new(rows, widths)
            .header(
                Row::new(vec!["dtype", "tensors", "parameters", "bytes", "bits/w"])
                    .style(theme.dim),
            )
            .block(Block::bordered().title(" parameters per dtype ")),
        area,
    );
}

/// Lines a summary may wrap to, and lines of layer kinds, before they are cut.
const SUMMARY_LINES: u16 = 3;
const KIND_LINES: u16 = 4;

/// `summary_rows`: lines for each summary; `kind_rows`: lines for the kinds.
fn render_layers(
    f: &mut Frame,
    area: Rect,
    vm: &OverviewVm,
    summary_rows: &[u16],
    kind_rows: usize,
    theme: &Theme,
) {
    const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    let max = vm
        .per_layer
        .iter()
        .map(|(_, b)| *b)
        .max()
        .unwrap_or(0)
        .max(1);
    let w = area.width.saturating_sub(2) as usize;
    let mut lines = Vec::new();
    for (s, &rows) in vm.layer_summary.iter().zip(summary_rows) {
        lines.extend(
            fit_lines(wrap_words(&esc(s), w), w, rows as usize)
                .into_iter()
                .map(|l| Line::styled(l, theme.title)),
        );
    }
    for fl in flow_kinds(vm.layer_kinds, w, kind_rows) {
        let mut spans = Vec::new();
        for (k, &i) in fl.items.iter().enumerate() {
            if k > 0 {
                spans.push(Span::raw(KIND_GAP));
            }
            let (name, label) = &vm.layer_kinds[i];
            let item = truncate(&format!("{} {}", esc(name), esc(label)), w);
            // The layer name dim, its kind plain: the eye finds the kinds.
            let cut = item.chars().count().min(esc(name).chars().count());
            let (head, tail): (String, String) = (
                item.chars().take(cut).collect(),
                item.chars().skip(cut).collect(),
            );
            spans.push(Span::styled(head, theme.dim));
            spans.push(Span::raw(tail));
        }
        if let Some(n) = fl.more {
            spans.push(Span::styled(more_note(n, fl.items.is_empty()), theme.dim));
        }
        lines.push(Line::from(spans));
    }
    let layers: Vec<&(String, u64)> = vm.per_layer.iter().collect();
    let spark: String = layers
        .iter()
        .take(w)
        .map(|(_, b)| BARS[((*b as f64 / max as f64) * 7.0).round() as usize])
        .collect();
    let title = match (layers.first(), layers.last()) {
        (Some((first, _)), Some((last, _))) => format!(
            " layers — bytes per layer {first} … {last}: max {}{} ",
            human_bytes(max),
            if layers.len() > w { " (cut)" } else { "" }
        ),
        _ => " layers ".to_string(),
    };
    lines.push(Line::styled(spark, theme.accent));
    f.render_widget(
        Paragraph::new(lines).block(Block::bordered().title(title)),
        area,
    );
}

/// Between two layer kinds on a line.
const KIND_GAP: &str = "  ";

/// One line of layer kinds: indices into the kinds, and how many did not fit when this is
/// the last line.
#[derive(Clone, Debug, PartialEq)]
struct FlowLine {
    items: Vec<usize>,
    more: Option<usize>,
}

fn more_note(n: usize, alone: bool) -> String {
    format!("{}+{n} more", if alone { "" } else { KIND_GAP })
}

/// Layer kinds (`L0 linear·MoE 8e`) flowed into at most `max_lines` lines of `width`
/// columns, never splitting one; what does not fit ends the last line as `+N more`.
fn flow_kinds(kinds: &[(String, String)], width: usize, max_lines: usize) -> Vec<FlowLine> {
    let item_w = |i: usize| {
        let (n, l) = &kinds[i];
        (esc(n).chars().count() + 1 + esc(l).chars().count()).min(width.max(1))
    };
    let gap = KIND_GAP.chars().count();
    let mut lines: Vec<(Vec<usize>, usize)> = Vec::new();
    for i in 0..kinds.len() {
        let w = item_w(i);
        match lines.last_mut() {
            Some((items, used)) if *used + gap + w <= width => {
                items.push(i);
                *used += gap + w;
            }
            _ => lines.push((vec![i], w)),
        }
    }
    if lines.len() <= max_lines {
        return lines
            .into_iter()
            .map(|(items, _)| FlowLine { items, more: None })
            .collect();
    }
    if max_lines == 0 {
        return Vec::new();
    }
    lines.truncate(max_lines);
    let shown: usize = lines.iter().map(|(items, _)| items.len()).sum();
    let mut more = kinds.len() - shown;
    let (items, used) = lines.last_mut().expect("max_lines > 0");
    // Make room for the note on the last line.
    while !items.is_empty() && *used + more_note(more, false).chars().count() > width {
        let i = items.pop().expect("not empty");
        *used -= item_w(i) + if items.is_empty() { 0 } else { gap };
        more += 1;
    }
    let n = lines.len();
    lines
        .into_iter()
        .enumerate()
        .map(|(k, (items, _))| FlowLine {
            items,
            more: (k + 1 == n).then_some(more),
        })
        .collect()
}

/// `s` broken at spaces into lines of at most `width` columns (a longer word is cut).
fn wrap_words(s: &str, width: usize) -> Vec<String> {
    let width = width.max(1);
    let mut lines: Vec<String> = Vec::new();
    let mut cur = String::new();
    for word in s.split(' ').filter(|w| !w.is_empty()) {
        let (cw, ww) = (cur.chars().count(), word.chars().count());
        if cur.is_empty() {
            cur = truncate(word, width);
        } else if cw + 1 + ww <= width {
            cur.push(' ');
            cur.push_str(word);
        } else {
            lines.push(std::mem::take(&mut cur));
            cur = truncate(word, width);
        }
    }
    if !cur.is_empty() || lines.is_empty() {
        lines.push(cur);
    }
    lines
}

/// At most `rows` of `lines`; the last one kept takes what is left out, cut with `…`.
fn fit_lines(mut lines: Vec<String>, width: usize, rows: usize) -> Vec<String> {
    if rows == 0 {
        lines.clear();
    } else if lines.len() > rows {
        let rest = lines.split_off(rows - 1).join(" ");
        lines.push(truncate(&rest, width));
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;
    use ratatui::backend::TestBackend;
    use ratatui::Terminal;

    fn shard(no: u32, count: u32) -> ShardRow {
        ShardRow {
            no,
            count,
            file: format!("big-{no:05}-of-{count:05}.cmf"),
            tensors: 10,
            bytes: 1000,
            file_len: 2000,
        }
    }

    fn draw_shards(shards: &[ShardRow], max_rows: usize, h: u16) -> Vec<String> {
        let mut term = Terminal::new(TestBackend::new(70, h)).expect("test terminal");
        let frame = term
            .draw(|f| render_shards(f, f.area(), shards, max_rows, &Theme::plain()))
            .expect("draw");
        let buf = frame.buffer;
        (0..buf.area.height)
            .map(|y| {
                (0..buf.area.width)
                    .map(|x| buf[(x, y)].symbol())
                    .collect::<String>()
            })
            .collect()
    }

    fn kinds(n: usize) -> Vec<(String, String)> {
        (0..n)
            .map(|i| {
                let label = if i % 4 == 3 {
                    "full(gated)·MoE 256e+shared"
                } else {
                    "linear·MoE 256e+shared"
                };
                (format!("L{i}"), label.to_string())
            })
            .collect()
    }

    fn flowed(k: &[(String, String)], width: usize, max: usize) -> Vec<String> {
        flow_kinds(k, width, max)
            .iter()
            .map(|l| {
                let mut s = l
                    .items
                    .iter()
                    .map(|&i| truncate(&format!("{} {}", k[i].0, k[i].1), width))
                    .collect::<Vec<_>>()
                    .join(KIND_GAP);
                if let Some(n) = l.more {
                    s.push_str(&more_note(n, l.items.is_empty()));
                }
                s
            })
            .collect()
    }

    #[test]
    fn layer_kinds_flow_whole_and_fold_what_does_not_fit() {
        let k = kinds(48);
        // Unbounded: every kind once, in order, no line too wide.
        let all = flow_kinds(&k, 61, usize::MAX);
        let order: Vec<usize> = all.iter().flat_map(|l| l.items.clone()).collect();
        assert_eq!(order, (0..48).collect::<Vec<_>>());
        assert!(all.iter().all(|l| l.more.is_none()));
        for line in flowed(&k, 61, usize::MAX) {
            assert!(line.chars().count() <= 61, "{line}");
        }
        // Two lines: the last ends with the count of the rest, within the width.
        let two = flowed(&k, 61, 2);
        assert_eq!(two.len(), 2);
        let shown: usize = flow_kinds(&k, 61, 2).iter().map(|l| l.items.len()).sum();
        assert!(
            two[1].ends_with(&format!("+{} more", 48 - shown)),
            "{two:?}"
        );
        assert!(two.iter().all(|l| l.chars().count() <= 61), "{two:?}");
        assert!(
            two[0].starts_with("L0 linear·MoE 256e+shared  L1 "),
            "{two:?}"
        );
        // Narrower than one kind: cut, never wider; one line of just the note at worst.
        for line in flowed(&k, 12, 3) {
            assert!(line.chars().count() <= 12, "{line}");
        }
        let one = flowed(&k, 9, 1);
        assert_eq!(one, vec!["+48 more".to_string()]);
        assert!(flow_kinds(&k, 40, 0).is_empty());
        assert!(flow_kinds(&[], 40, 3).is_empty());
    }

    #[test]
    fn summaries_wrap_at_words_and_cut_with_an_ellipsis() {
        let s = "hybrid: 3 linear-attention + 1 full-attention layers (output gate on 1); 4 dense layers (width 128)";
        let lines = wrap_words(s, 40);
        assert_eq!(lines.join(" "), s);
        assert!(lines.iter().all(|l| l.chars().count() <= 40), "{lines:?}");
        let cut = fit_lines(lines.clone(), 40, 2);
        assert_eq!(cut.len(), 2);
        assert_eq!(cut[0], lines[0]);
        assert!(
            cut[1].ends_with('…') && cut[1].chars().count() == 40,
            "{cut:?}"
        );
        // One row: the whole text cut at the width, not at the first wrap.
        let one = fit_lines(lines.clone(), 40, 1);
        assert_eq!(one, vec![truncate(s, 40)]);
        assert!(fit_lines(lines.clone(), 40, 0).is_empty());
        assert_eq!(fit_lines(lines.clone(), 40, 9), lines);
        assert_eq!(wrap_words("", 10), vec![String::new()]);
        assert_eq!(wrap_words("abcdefghijkl", 5), vec!["abcd…".to_string()]);
    }

    #[test]
    fn a_long_shard_list_folds_its_middle_and_keeps_the_last() {
        let shards: Vec<ShardRow> = (1..=20).map(|no| shard(no, 20)).collect();
        let lines = draw_shards(&shards, 8, 10);
        let text = lines.join("\n");
        assert!(text.contains("one model in 20 files"), "{text}");
        for no in 1..=6 {
            assert!(text.contains(&format!("{no}/20")), "{text}");
        }
        assert!(!text.contains("7/20 "), "{text}");
        assert!(
            text.contains("+13 more") && text.contains("130 tensors"),
            "{text}"
        );
        assert!(
            text.contains("20/20") && text.contains("big-00020-of-00020.cmf"),
            "{text}"
        );
        // One row left: everything folds into it.
        let text = draw_shards(&shards, 1, 3).join("\n");
        assert!(
            text.contains("+20 more") && text.contains("200 tensors"),
            "{text}"
        );
        // A short list is listed whole.
        let few: Vec<ShardRow> = (1..=3).map(|no| shard(no, 3)).collect();
        let text = draw_shards(&few, 8, 5).join("\n");
        assert!(
            text.contains("1/3") && text.contains("3/3") && !text.contains("more"),
            "{text}"
        );
    }
}
