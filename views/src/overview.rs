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
    let spare = right
        .height
        .saturating_sub(facts_h + 4 + 4 + tok_h + extra_min);
    // What is left goes to a few dtypes first, then the shards (a long list folds its
    // middle), then the other dtypes; the `more` panel takes the rest.
    let dtypes_n = vm.dtypes.len() as u16;
    let shards_n = (vm.shards.len() as u16).min(SHARDS_SHOWN);
    let shards_frame = if shards_n > 0 { 2 } else { 0 };
    let mut room = spare.saturating_sub(4 + shards_frame);
    let first = dtypes_n.min(3).min(room);
    room -= first;
    let shard_rows = shards_n.min(room).max(shards_n.min(1));
    room = room.saturating_sub(shard_rows);
    let dtype_rows = (first + (dtypes_n - first).min(room)).max(dtypes_n.min(1));
    let shards_h = if shards_n > 0 { shard_rows + 2 } else { 0 };
    let [facts, layout, shards, dtypes, layers, tok, extra] = Layout::vertical([
        Constraint::Length(facts_h),
        Constraint::Length(4),
        Constraint::Length(shards_h),
        Constraint::Length(dtype_rows + 4),
        Constraint::Length(4),
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
    render_layers(f, layers, vm, theme);
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

fn render_layers(f: &mut Frame, area: Rect, vm: &OverviewVm, theme: &Theme) {
    const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    let max = vm
        .per_layer
        .iter()
        .map(|(_, b)| *b)
        .max()
        .unwrap_or(0)
        .max(1);
    let w = area.width.saturating_sub(2) as usize;
    let layers: Vec<&(String, u64)> = vm.per_layer.iter().collect();
    let spark: String = layers
        .iter()
        .take(w)
        .map(|(_, b)| BARS[((*b as f64 / max as f64) * 7.0).round() as usize])
        .collect();
    let first = layers.first().map(|(l, _)| l.as_str()).unwrap_or("");
    let last = layers.last().map(|(l, _)| l.as_str()).unwrap_or("");
    let lines = vec![
        Line::styled(spark, theme.accent),
        Line::styled(
            format!(
                "{first} … {last}   max {} per layer{}",
                human_bytes(max),
                if layers.len() > w { " (cut)" } else { "" }
            ),
            theme.dim,
        ),
    ];
    f.render_widget(
        Paragraph::new(lines).block(Block::bordered().title(" bytes per layer ")),
        area,
    );
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
