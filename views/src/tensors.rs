//! View 2, Tensors: the directory as a virtualised table (only the visible window of rows
//! reaches this module), a filter line, and a detail panel with a tensor's facts,
//! statistics and a histogram of its dequantized values.

use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Paragraph, Wrap};
use ratatui::Frame;

use crate::theme::Theme;

/// Columns of the table, in display order.
pub const COLUMNS: [&str; COLS] = [
    "name", "dtype", "shape", "elements", "bytes", "bits/w", "shard", "offset", "hash",
];
pub const COLS: usize = 9;
pub const NAME: usize = 0;
pub const DTYPE: usize = 1;
/// Which shard holds the tensor (`2/3`): shown only for a sharded model (§10), beside the
/// offset, which counts within that shard.
pub const SHARD: usize = 6;
pub const OFFSET: usize = 7;
pub const HASH: usize = 8;

const RIGHT_ALIGNED: [bool; COLS] = [false, false, false, true, true, true, true, true, false];
/// When the table is too narrow, columns are kept in this order (the sorted one first).
const KEEP_ORDER: [usize; COLS - 1] = [1, 4, SHARD, 2, 3, 5, OFFSET, HASH];
/// The name column never shrinks below this before other columns give way.
const NAME_MIN: usize = 24;
/// Selection marker (also what makes the selected row visible without colours).
const MARKER: &str = "▶ ";
const MARKER_W: usize = 2;

/// One visible row.
#[derive(Clone, Debug, PartialEq)]
pub enum RowVm {
    /// A layer's header when grouping (`layer 3 · full·dense 128 · 12 tensors · 4.1 KiB`,
    /// depth 0), or a folded run of tensors inside it (a layer's experts, depth 1).
    Group {
        label: String,
        collapsed: bool,
        depth: u8,
    },
    /// A tensor: one formatted (and escaped) cell per column of [`COLUMNS`].
    Tensor { cells: [String; COLS] },
}

#[derive(Clone, Debug, PartialEq)]
pub struct FilterVm {
    pub text: String,
    pub typing: bool,
    pub matches: usize,
    pub total: usize,
}

/// A statistic shown as `key value`; `flag` marks a value worth attention (NaN, Inf, ...).
#[derive(Clone, Debug, PartialEq)]
pub struct Stat {
    pub key: String,
    pub value: String,
    pub flag: bool,
}

#[derive(Clone, Debug, PartialEq)]
pub struct StatsReadyVm {
    /// Lines of statistics, each a few `key value` pairs.
    pub lines: Vec<Vec<Stat>>,
    /// The line above the histogram (bins, bin width, peak).
    pub caption: String,
    /// Counts per bin, from min to max.
    pub histogram: Vec<u64>,
    pub min: String,
    pub max: String,
    /// Where zero falls in [min, max] (0.0 = min, 1.0 = max), when it lies inside.
    pub zero: Option<f64>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum StatsVm {
    /// Computing, cancelled, failed, or nothing to compute: a message.
    Message {
        text: String,
        bad: bool,
    },
    Ready(StatsReadyVm),
}

#[derive(Clone, Debug, PartialEq)]
pub struct DetailVm {
    pub title: String,
    pub facts: Vec<(String, String)>,
    pub stats: StatsVm,
}

#[derive(Clone, Debug, PartialEq)]
pub struct TensorsVm {
    pub title: String,
    /// Content width of each column over the whole directory (stable while scrolling).
    pub widths: [usize; COLS],
    /// Whether the [`SHARD`] column is shown (a model of several shards).
    pub shard_column: bool,
    /// The column that carries a sort indicator and whether it is descending.
    pub sorted: Option<(usize, bool)>,
    /// Extra words after the name header (`by layer ↑` for the natural order).
    pub name_note: Option<String>,
    /// The visible window of rows only.
    pub rows: Vec<RowVm>,
    /// Index into `rows` of the selected row, when it is visible.
    pub selected: Option<usize>,
    /// All rows of the list, and the index of `rows[0]` in it (for the scrollbar).
    pub total: usize,
    pub offset: usize,
    pub filter: Option<FilterVm>,
    /// Shown instead of rows when there are none.
    pub empty: String,
    pub detail: Option<DetailVm>,
}

/// Where the parts of the view go inside `area`; the app uses it too (page size, clicks).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Areas {
    pub table: Rect,
    /// The line with the filter, when shown.
    pub filter: Option<Rect>,
    pub header: Rect,
    /// Where data rows go: one row per line.
    pub rows: Rect,
    pub panel: Option<Rect>,
}

pub fn areas(area: Rect, filter_line: bool, detail: bool) -> Areas {
    // The panel takes up to 12 lines, never leaving the table fewer than 6.
    let panel_h = if detail {
        (area.height.saturating_sub(6)).min(12)
    } else {
        0
    };
    let (table, panel) = if panel_h >= 6 {
        let [t, p] =
            Layout::vertical([Constraint::Min(1), Constraint::Length(panel_h)]).areas(area);
        (t, Some(p))
    } else {
        (area, None)
    };
    let inner = Block::bordered().inner(table);
    let mut y = inner.y;
    let filter = (filter_line && inner.height > 0).then(|| {
        y += 1;
        Rect::new(inner.x, inner.y, inner.width, 1)
    });
    let header = Rect::new(inner.x, y, inner.width, u16::from(inner.bottom() > y));
    y = (y + 1).min(inner.bottom());
    let rows = Rect::new(inner.x, y, inner.width, inner.bottom().saturating_sub(y));
    Areas {
        table,
        filter,
        header,
        rows,
        panel,
    }
}

pub fn render(f: &mut Frame, area: Rect, vm: &TensorsVm, theme: &Theme) {
    let a = areas(area, vm.filter.is_some(), vm.detail.is_some());
    f.render_widget(
        Block::bordered().title(Span::styled(vm.title.clone(), theme.title)),
        a.table,
    );
    if let (Some(r), Some(fv)) = (a.filter, &vm.filter) {
        render_filter(f, r, fv, theme);
    }
    let plan = plan_columns(a.header.width as usize, vm);
    render_header(f, a.header, &plan, vm, theme);
    render_rows(f, a.rows, &plan, vm, theme);
    if vm.total > a.rows.height as usize && a.rows.height > 0 {
        let h = a.rows.height as usize;
        let r = Rect::new(a.table.x, a.rows.y, a.table.width, a.rows.height);
        crate::util::scrollbar(f, r, vm.total - h, vm.offset, h, theme);
    }
    if let (Some(p), Some(d)) = (a.panel, &vm.detail) {
        render_detail(f, p, d, theme);
    }
}

fn render_filter(f: &mut Frame, r: Rect, fv: &FilterVm, theme: &Theme) {
    let (prompt, cursor, keys) = if fv.typing {
        ("filter › ", "▌", "Enter keeps · Esc clears")
    } else {
        ("filter: ", "", "/ edits · Esc clears")
    };
    let line = Line::from(vec![
        Span::styled(prompt, theme.key),
        Span::styled(fv.text.clone(), theme.accent),
        Span::styled(cursor, theme.accent),
        Span::raw("   "),
        Span::raw(format!("{} of {} match", fv.matches, fv.total)),
        Span::styled(format!(" · {keys}"), theme.dim),
    ]);
    f.render_widget(Paragraph::new(line), r);
}

/// The columns that fit, their widths and the gap between them.
struct Plan {
    cols: Vec<(usize, usize)>,
    gap: usize,
}

fn header_label(c: usize, vm: &TensorsVm) -> String {
    let mut s = COLUMNS[c].to_string();
    if c == NAME {
        if let Some(n) = &vm.name_note {
            s.push(' ');
            s.push_str(n);
        }
    }
    if let Some((col, desc)) = vm.sorted {
        if col == c {
            s.push_str(if desc { " ↓" } else { " ↑" });
        }
    }
    s
}

fn plan_columns(width: usize, vm: &TensorsVm) -> Plan {
    let shown = |c: usize| c != SHARD || vm.shard_column;
    let mut w = [0usize; COLS];
    for (c, wc) in w.iter_mut().enumerate() {
        *wc = vm.widths[c].max(text_width(&header_label(c, vm)));
    }
    // One column stays free beside the scrollbar on the border.
    let avail = width.saturating_sub(MARKER_W + 1);
    let n = (0..COLS).filter(|&c| shown(c)).count();
    let full: usize = (0..COLS).filter(|&c| shown(c)).map(|c| w[c]).sum::<usize>() + 2 * (n - 1);
    if full <= avail {
        return Plan {
            cols: (0..COLS).filter(|&c| shown(c)).map(|c| (c, w[c])).collect(),
            gap: 2,
        };
    }
    // Too narrow: the name keeps NAME_MIN, then columns join in KEEP_ORDER (the sorted
    // column first) while they fit; the name gets whatever is left.
    let gap = 1;
    // The name is what tells tensors apart: it keeps over half the width if it needs it.
    let name_min = w[NAME].min((avail * 11 / 20).max(NAME_MIN));
    let mut used = name_min;
    let mut keep = [false; COLS];
    keep[NAME] = true;
    let sorted = vm.sorted.map(|(c, _)| c).filter(|&c| c != NAME);
    for c in sorted.into_iter().chain(KEEP_ORDER) {
        if shown(c) && !keep[c] && used + gap + w[c] <= avail {
            keep[c] = true;
            used += gap + w[c];
        }
    }
    // The name takes what is left: room for long names, or space before the next column.
    w[NAME] = name_min + avail.saturating_sub(used);
    Plan {
        cols: (0..COLS).filter(|&c| keep[c]).map(|c| (c, w[c])).collect(),
        gap,
    }
}

fn render_header(f: &mut Frame, r: Rect, plan: &Plan, vm: &TensorsVm, theme: &Theme) {
    let mut spans = vec![Span::raw(" ".repeat(MARKER_W))];
    for (k, &(c, w)) in plan.cols.iter().enumerate() {
        if k > 0 {
            spans.push(Span::raw(" ".repeat(plan.gap)));
        }
        let style = if vm.sorted.is_some_and(|(s, _)| s == c) {
            theme.accent
        } else {
            theme.title
        };
        spans.push(Span::styled(
            fit(&header_label(c, vm), w, RIGHT_ALIGNED[c], false),
            style,
        ));
    }
    f.render_widget(Paragraph::new(Line::from(spans)), r);
}

fn render_rows(f: &mut Frame, r: Rect, plan: &Plan, vm: &TensorsVm, theme: &Theme) {
    if vm.rows.is_empty() {
        f.render_widget(
            Paragraph::new(Line::styled(format!("  {}", vm.empty), theme.dim)),
            r,
        );
        return;
    }
    let width = r.width as usize;
    let lines: Vec<Line> = vm
        .rows
        .iter()
        .take(r.height as usize)
        .enumerate()
        .map(|(i, row)| {
            let selected = vm.selected == Some(i);
            let marker = if selected { MARKER } else { "  " };
            let mut spans = vec![Span::styled(marker, theme.accent)];
            match row {
                RowVm::Group {
                    label,
                    collapsed,
                    depth,
                } => {
                    let arrow = if *collapsed { "▸ " } else { "▾ " };
                    let indent = "  ".repeat(*depth as usize);
                    // Long labels (a bank's prefix) are cut in the middle, never wrapped.
                    let room = width.saturating_sub(MARKER_W + indent.len() + 3);
                    let head = format!("{indent}{arrow}{} ", truncate_middle(label, room));
                    let rule = width.saturating_sub(MARKER_W + text_width(&head) + 1);
                    spans.push(Span::styled(head, theme.title));
                    spans.push(Span::styled("─".repeat(rule), theme.dim));
                }
                RowVm::Tensor { cells } => {
                    for (k, &(c, w)) in plan.cols.iter().enumerate() {
                        if k > 0 {
                            spans.push(Span::raw(" ".repeat(plan.gap)));
                        }
                        let text = fit(&cells[c], w, RIGHT_ALIGNED[c], c == NAME);
                        let style = match c {
                            DTYPE => dtype_style(&cells[c], theme),
                            HASH => theme.dim,
                            _ => theme.base,
                        };
                        spans.push(Span::styled(text, style));
                    }
                    let used: usize = spans.iter().map(|s| s.width()).sum();
                    spans.push(Span::raw(" ".repeat(width.saturating_sub(used))));
                }
            }
            let line = Line::from(spans);
            if selected {
                line.style(theme.selected)
            } else {
                line
            }
        })
        .collect();
    f.render_widget(Paragraph::new(lines), r);
}

/// A colour per codec family, so a mixed-precision directory reads at a glance.
pub fn dtype_style(dtype: &str, theme: &Theme) -> Style {
    if !theme.color {
        return theme.base;
    }
    let c = match dtype {
        "f32" => Color::LightRed,
        "f16" | "bf16" => Color::Yellow,
        "q8_row" | "q8_2f" => Color::Green,
        "q4_block" | "q4_tiled" | "q4tp" => Color::Cyan,
        "vbit" | "vbit_ro" => Color::LightBlue,
        "q1" | "q1s" | "q1t" => Color::Magenta,
        _ => Color::DarkGray,
    };
    Style::default().fg(c)
}

fn render_detail(f: &mut Frame, area: Rect, d: &DetailVm, theme: &Theme) {
    let block = Block::bordered()
        .title(Span::styled(d.title.clone(), theme.title))
        .border_style(theme.accent);
    let inner = block.inner(area);
    f.render_widget(block, area);
    // Facts on the left; statistics and the histogram on the right, which wants 64
    // columns (one per bin) when the terminal is wide enough.
    let facts_w = d
        .facts
        .iter()
        .map(|(_, v)| 14 + text_width(v))
        .max()
        .unwrap_or(0)
        .clamp(30, 60) as u16;
    let facts_w = facts_w.min(inner.width.saturating_sub(40).max(inner.width / 2));
    let [left, sep, right] = Layout::horizontal([
        Constraint::Length(facts_w),
        Constraint::Length(2),
        Constraint::Min(1),
    ])
    .areas(inner);
    // Values stop one column short of the separator.
    let value_w = (left.width as usize).saturating_sub(14);
    let lines: Vec<Line> = d
        .facts
        .iter()
        .map(|(k, v)| {
            Line::from(vec![
                Span::styled(format!("{k:<12} "), theme.dim),
                Span::raw(truncate_middle(v, value_w)),
            ])
        })
        .collect();
    f.render_widget(Paragraph::new(lines), left);
    let rule: Vec<Line> = (0..sep.height)
        .map(|_| Line::styled("│", theme.dim))
        .collect();
    f.render_widget(Paragraph::new(rule), sep);
    match &d.stats {
        StatsVm::Message { text, bad } => {
            let style = if *bad { theme.bad } else { theme.base };
            f.render_widget(
                Paragraph::new(Line::styled(text.clone(), style)).wrap(Wrap { trim: true }),
                right,
            );
        }
        StatsVm::Ready(s) => render_stats(f, right, s, theme),
    }
}

fn render_stats(f: &mut Frame, area: Rect, s: &StatsReadyVm, theme: &Theme) {
    let lines = flow_stats(&s.lines, area.width as usize, theme);
    let n = lines.len() as u16;
    let [text, caption, hist, labels] = Layout::vertical([
        Constraint::Length(n.min(area.height)),
        Constraint::Length(1),
        Constraint::Min(0),
        Constraint::Length(1),
    ])
    .areas(area);
    f.render_widget(
        Paragraph::new(Line::styled(s.caption.clone(), theme.dim)),
        caption,
    );
    f.render_widget(Paragraph::new(lines), text);
    let bars = resample(&s.histogram, hist.width as usize);
    let cols = bars.len();
    let bar_style = if theme.color {
        Style::default().fg(Color::Cyan)
    } else {
        theme.base
    };
    let rows = histogram_rows(&bars, hist.height as usize);
    f.render_widget(
        Paragraph::new(
            rows.into_iter()
                .map(|r| Line::styled(r, bar_style))
                .collect::<Vec<_>>(),
        ),
        hist,
    );
    f.render_widget(
        Paragraph::new(Line::styled(axis_labels(s, cols), theme.dim)),
        labels,
    );
}

/// The statistics as lines of `key value` pairs; a line too long for `width` wraps
/// between pairs.
fn flow_stats<'a>(lines: &[Vec<Stat>], width: usize, theme: &Theme) -> Vec<Line<'a>> {
    const GAP: &str = "   ";
    let mut out = Vec::new();
    for pairs in lines {
        let mut spans: Vec<Span> = Vec::new();
        let mut used = 0;
        for st in pairs {
            let w = text_width(&st.key) + 1 + text_width(&st.value);
            if used > 0 && used + GAP.len() + w > width {
                out.push(Line::from(std::mem::take(&mut spans)));
                used = 0;
            }
            if used > 0 {
                spans.push(Span::raw(GAP));
                used += GAP.len();
            }
            spans.push(Span::styled(format!("{} ", st.key), theme.dim));
            spans.push(Span::styled(
                st.value.clone(),
                if st.flag { theme.warn } else { theme.base },
            ));
            used += w;
        }
        if !spans.is_empty() {
            out.push(Line::from(spans));
        }
    }
    out
}

/// Sums adjacent bins so the histogram fits `width` columns (halving until it does, so
/// every column covers the same number of bins).
pub fn resample(bins: &[u64], width: usize) -> Vec<u64> {
    if width == 0 || bins.is_empty() {
        return Vec::new();
    }
    let per = bins.len().div_ceil(width);
    bins.chunks(per).map(|c| c.iter().sum()).collect()
}

/// Vertical bars of eighth blocks, `height` lines from top to bottom; the tallest bin
/// fills the height, and a non-empty bin always shows at least the lowest block.
pub fn histogram_rows(bars: &[u64], height: usize) -> Vec<String> {
    const BLOCKS: [char; 9] = [' ', '▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    let peak = bars.iter().copied().max().unwrap_or(0);
    let eighths: Vec<usize> = bars
        .iter()
        .map(|&b| {
            if b == 0 || peak == 0 {
                0
            } else {
                let e = (b as f64 / peak as f64 * (height * 8) as f64).round() as usize;
                e.max(1)
            }
        })
        .collect();
    (0..height)
        .map(|row| {
            let floor = (height - 1 - row) * 8;
            eighths
                .iter()
                .map(|&e| BLOCKS[e.saturating_sub(floor).min(8)])
                .collect()
        })
        .collect()
}

/// `min` under the first column, `max` ending under the last, `0` under zero's column
/// when it lies inside and there is room.
fn axis_labels(s: &StatsReadyVm, cols: usize) -> String {
    let mut cells: Vec<char> = vec![' '; cols.max(text_width(&s.min) + text_width(&s.max) + 1)];
    let put = |cells: &mut Vec<char>, at: usize, text: &str| {
        for (i, c) in text.chars().enumerate() {
            if let Some(slot) = cells.get_mut(at + i) {
                *slot = c;
            }
        }
    };
    let len = cells.len();
    let max_w = s.max.chars().count();
    put(&mut cells, 0, &s.min);
    put(&mut cells, len.saturating_sub(max_w), &s.max);
    if let Some(z) = s.zero {
        let at = ((z * cols as f64) as usize).min(cols.saturating_sub(1));
        let left_end = s.min.chars().count();
        let right_start = len.saturating_sub(max_w);
        if at > left_end + 1 && at + 2 < right_start {
            put(&mut cells, at, "0");
        }
    }
    cells.into_iter().collect()
}

fn text_width(s: &str) -> usize {
    Span::raw(s).width()
}

/// `s` cut or padded to exactly `w` display columns; `middle` cuts from the middle
/// (names end in their most telling part: `…mlp.down_proj.weight`).
fn fit(s: &str, w: usize, right: bool, middle: bool) -> String {
    let sw = text_width(s);
    let s = if sw > w {
        if middle {
            truncate_middle(s, w)
        } else {
            truncate_end(s, w)
        }
    } else {
        s.to_string()
    };
    let pad = " ".repeat(w.saturating_sub(text_width(&s)));
    if right {
        format!("{pad}{s}")
    } else {
        format!("{s}{pad}")
    }
}

fn take_width<I: Iterator<Item = char>>(chars: I, w: usize) -> Vec<char> {
    let mut out = Vec::new();
    let mut used = 0;
    for c in chars {
        let cw = text_width(c.encode_utf8(&mut [0; 4]));
        if used + cw > w {
            break;
        }
        used += cw;
        out.push(c);
    }
    out
}

fn truncate_end(s: &str, w: usize) -> String {
    if text_width(s) <= w {
        return s.to_string();
    }
    if w == 0 {
        return String::new();
    }
    let mut out: String = take_width(s.chars(), w - 1).into_iter().collect();
    out.push('…');
    out
}

/// Cuts the middle of `s` to fit `w` columns, keeping more of the end than the start.
pub fn truncate_middle(s: &str, w: usize) -> String {
    if text_width(s) <= w {
        return s.to_string();
    }
    if w < 2 {
        return truncate_end(s, w);
    }
    let head_w = (w - 1) * 2 / 5;
    let tail_w = w - 1 - head_w;
    let head: String = take_width(s.chars(), head_w).into_iter().collect();
    let mut tail = take_width(s.chars().rev(), tail_w);
    tail.reverse();
    let tail: String = tail.into_iter().collect();
    format!("{head}…{tail}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_glyphs_scale_to_the_peak() {
        let rows = histogram_rows(&[0, 1, 4, 8], 1);
        assert_eq!(rows, vec![" ▁▄█".to_string()]);
        let rows = histogram_rows(&[8, 1000], 2);
        // A tiny non-empty bin still shows.
        assert_eq!(rows, vec![" █".to_string(), "▁█".to_string()]);
        assert!(histogram_rows(&[], 3).iter().all(|r| r.is_empty()));
    }

    #[test]
    fn resampling_keeps_the_total() {
        let bins: Vec<u64> = (0..64).collect();
        assert_eq!(resample(&bins, 64).len(), 64);
        let r = resample(&bins, 40);
        assert_eq!(r.len(), 32);
        assert_eq!(r.iter().sum::<u64>(), bins.iter().sum::<u64>());
        assert!(resample(&bins, 0).is_empty());
    }

    fn vm(shard_column: bool) -> TensorsVm {
        TensorsVm {
            title: String::new(),
            widths: [20, 6, 8, 6, 8, 5, 3, 6, 16],
            shard_column,
            sorted: None,
            name_note: None,
            rows: Vec::new(),
            selected: None,
            total: 0,
            offset: 0,
            filter: None,
            empty: String::new(),
            detail: None,
        }
    }

    #[test]
    fn the_shard_column_shows_only_for_a_sharded_model() {
        let cols = |v: &TensorsVm, w: usize| -> Vec<usize> {
            plan_columns(w, v).cols.iter().map(|&(c, _)| c).collect()
        };
        assert!(!cols(&vm(false), 200).contains(&SHARD));
        assert_eq!(cols(&vm(true), 200), (0..COLS).collect::<Vec<_>>());
        // Narrow: the shard column outlasts shape, offset and hash.
        let narrow = cols(&vm(true), 60);
        assert!(narrow.contains(&SHARD), "{narrow:?}");
        assert!(!narrow.contains(&HASH), "{narrow:?}");
        assert!(!cols(&vm(false), 60).contains(&SHARD));
    }

    #[test]
    fn names_are_cut_in_the_middle() {
        let s = "model.layers.0.mlp.experts.0.down_proj.weight";
        let t = truncate_middle(s, 24);
        assert_eq!(text_width(&t), 24);
        assert!(t.ends_with("_proj.weight"), "{t}");
        assert!(t.starts_with("model."), "{t}");
        assert_eq!(truncate_middle("short", 24), "short");
        assert_eq!(fit("ab", 4, true, false), "  ab");
        assert_eq!(fit("abcdef", 4, false, false), "abc…");
    }
}
