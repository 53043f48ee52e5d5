//! View 7, Routing: which experts a Mixture-of-Experts model's router chose for the
//! conversation's tokens.
//!
//! On top, a heat map of MoE layers (rows) × experts (columns): how often each expert was
//! chosen, or the weight mass it received, with each layer's load balance beside it. Below,
//! left, the selected token's experts and weights layer by layer; right, the transcript
//! (the session's tokens as text) coloured by the expert each token chose first at the
//! selected layer, as in the Mixtral paper's Figure 8.
//!
//! Cells are shade glyphs (`·░▒▓█`) in the heat colour, so the map reads the same under
//! NO_COLOR; without colours the transcript writes each token's expert as a subscript.
//! When a layer has more experts than the map has columns, neighbouring experts share a
//! column (summed), and the legend says how many.

use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Paragraph};
use ratatui::Frame;
use unicode_width::UnicodeWidthStr;

use crate::skills::wrap_words;
use crate::theme::Theme;
use crate::util::{centered, esc, pad, page_start, truncate};

/// What the heat map counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Measure {
    /// Times each expert was among a token's top-k.
    Counts,
    /// The sum of the routing weights each expert received.
    Mass,
}

impl Measure {
    pub fn title(self) -> &'static str {
        match self {
            Measure::Counts => "times chosen",
            Measure::Mass => "weight mass",
        }
    }
}

/// One MoE layer: its heat-map row and its balance summary.
#[derive(Clone, Debug, PartialEq)]
pub struct LayerVm {
    /// The model's layer index.
    pub layer: usize,
    pub experts: usize,
    pub top_k: usize,
    /// Per expert, as [`RoutingVm::measure`] says.
    pub values: Vec<f64>,
    /// Normalised entropy of the counts (1 = balanced).
    pub entropy: f64,
    /// The busiest expert's count over the mean.
    pub max_over_mean: f64,
    /// Experts (heaviest first) carrying 90 % of the weight mass.
    pub for_90: usize,
    /// Experts never chosen.
    pub unused: Vec<usize>,
}

/// One token of the transcript.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TokenVm<'a> {
    /// The token decoded alone (escaped here).
    pub text: &'a str,
    /// Its first expert at the selected layer.
    pub expert: Option<u32>,
}

/// The selected token's routes.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenRoutesVm<'a> {
    pub position: usize,
    pub id: u32,
    pub text: &'a str,
    /// Per MoE layer: the layer index, the experts best first and their weights.
    pub layers: Vec<(usize, &'a [u32], &'a [f32])>,
}

pub struct RoutingVm<'a> {
    pub measure: Measure,
    /// Positions routed.
    pub tokens: usize,
    pub layers: &'a [LayerVm],
    /// The selected layer (an index into `layers`): highlighted, and the one the
    /// transcript is coloured by.
    pub layer: usize,
    pub transcript: &'a [TokenVm<'a>],
    /// The token under the cursor (an index into `transcript`).
    pub cursor: Option<usize>,
    /// The cursor follows the newest token.
    pub follow: bool,
    pub selected: Option<TokenRoutesVm<'a>>,
    /// The active task mask's expert fields (per layer as `layers`, per expert: whether
    /// the mask lets it route): masked-out experts are drawn `×` on the grid, with a
    /// legend line naming the task.
    pub mask_experts: Option<&'a [Vec<bool>]>,
    /// The task whose expert fields `mask_experts` holds (escaped here).
    pub mask_task: Option<&'a str>,
}

/// The glyph of an expert the active task masks out.
pub const MASKED: char = '×';

/// Instead of the map: why there is nothing to show.
pub struct NoticeVm<'a> {
    pub title: &'a str,
    /// Paragraphs separated by newlines.
    pub text: &'a str,
    pub bad: bool,
}

pub fn render_notice(f: &mut Frame, area: Rect, n: &NoticeVm, theme: &Theme) {
    let w = area.width.saturating_sub(4).min(76);
    let text_w = w.saturating_sub(4) as usize;
    let mut lines = Vec::new();
    for (i, para) in n.text.split('\n').enumerate() {
        if i > 0 {
            lines.push(Line::raw(""));
        }
        lines.extend(wrap_words(&esc(para), text_w).into_iter().map(Line::raw));
    }
    let h = (lines.len() as u16).saturating_add(4);
    let r = centered(area, w, h);
    let border = if n.bad { theme.bad } else { theme.accent };
    let block = Block::bordered()
        .title(Span::styled(format!(" {} ", esc(n.title)), border))
        .border_style(border)
        .padding(ratatui::widgets::Padding::new(1, 1, 1, 1));
    f.render_widget(Paragraph::new(lines).block(block), r);
}

/// Where the panels go.
struct Panels {
    heat: Rect,
    token: Rect,
    transcript: Rect,
}

fn panels(area: Rect, vm: &RoutingVm) -> Panels {
    // The map takes what its layers need, at most about half the height; header and
    // legend take two rows, the border two more.
    let most = (area.height / 2).saturating_sub(4).max(1);
    let rows = (vm.layers.len().max(1) as u16).min(most);
    let legend = u16::from(vm.mask_experts.is_some());
    let [heat, bottom] =
        Layout::vertical([Constraint::Length(rows + 4 + legend), Constraint::Min(3)]).areas(area);
    let left_w = (area.width * 2 / 5).clamp(28.min(area.width), 48);
    let [token, transcript] =
        Layout::horizontal([Constraint::Length(left_w), Constraint::Min(10)]).areas(bottom);
    Panels {
        heat,
        token,
        transcript,
    }
}

pub fn render(f: &mut Frame, area: Rect, vm: &RoutingVm, theme: &Theme) {
    let p = panels(area, vm);
    render_heat(f, p.heat, vm, theme);
    render_token(f, p.token, vm, theme);
    render_transcript(f, p.transcript, vm, theme);
}

/// Columns of the heat map for `experts` in `avail` cells: experts per column, columns,
/// and the width of each column.
fn heat_columns(experts: usize, avail: usize) -> (usize, usize, usize) {
    let avail = avail.max(1);
    if experts == 0 {
        return (1, 0, 1);
    }
    if experts > avail {
        let per = experts.div_ceil(avail);
        return (per, experts.div_ceil(per), 1);
    }
    (1, experts, (avail / experts).min(4))
}

/// The summary columns right of the map.
const SUMMARY_HEAD: &str = "  balance max/mean 90% mass  unused";
const LABEL_W: usize = 7;

fn glyph(x: f64) -> char {
    const G: [char; 4] = ['░', '▒', '▓', '█'];
    // Anything chosen at all shows: the faintest shade starts above zero.
    G[((x.clamp(0.0, 1.0) * 4.0).ceil() as usize).clamp(1, 4) - 1]
}

/// `0-2,5,7-9`: experts as ranges.
pub fn ranges(ids: &[usize]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < ids.len() {
        let mut j = i;
        while j + 1 < ids.len() && ids[j + 1] == ids[j] + 1 {
            j += 1;
        }
        out.push(if j > i {
            format!("{}-{}", ids[i], ids[j])
        } else {
            ids[i].to_string()
        });
        i = j + 1;
    }
    out.join(",")
}

fn number(x: f64, measure: Measure) -> String {
    match measure {
        Measure::Counts => format!("{}", x.round() as u64),
        Measure::Mass => format!("{x:.1}"),
    }
}

fn render_heat(f: &mut Frame, area: Rect, vm: &RoutingVm, theme: &Theme) {
    let inner_w = area.width.saturating_sub(2) as usize;
    let inner_h = area.height.saturating_sub(2) as usize;
    let experts = vm.layers.iter().map(|l| l.experts).max().unwrap_or(0);
    let summary_w = SUMMARY_HEAD.chars().count() + 4;
    let avail = inner_w.saturating_sub(LABEL_W + summary_w);
    let (per, cols, cw) = heat_columns(experts, avail);
    // Every layer's values summed per column; shades relative to the busiest column.
    let binned: Vec<Vec<f64>> = vm
        .layers
        .iter()
        .map(|l| {
            (0..cols)
                .map(|c| l.values.iter().skip(c * per).take(per).sum())
                .collect()
        })
        .collect();
    let max = binned.iter().flatten().copied().fold(0.0f64, f64::max);

    let mut lines = Vec::new();
    // Header: expert numbers where they fit, then the summary's column names.
    let mut head = pad("layer", LABEL_W);
    let mut next_free = 0;
    let mut axis = String::new();
    for c in 0..cols {
        let x = c * cw;
        let label = (c * per).to_string();
        if x >= next_free && x + label.len() <= cols * cw {
            axis.push_str(&" ".repeat(x - axis.chars().count()));
            axis.push_str(&label);
            next_free = x + label.len() + 1;
        }
    }
    head.push_str(&pad(&axis, cols * cw));
    head.push_str(SUMMARY_HEAD);
    lines.push(Line::styled(head, theme.dim));

    let legend_h = 1 + usize::from(vm.mask_experts.is_some());
    let rows_h = inner_h.saturating_sub(1 + legend_h).max(1);
    let first = page_start(vm.layer, rows_h);
    // Per layer and column: whether the task masks out every expert of the column.
    let masked_out = |layer: usize, c: usize| -> bool {
        let Some(row) = vm.mask_experts.and_then(|m| m.get(layer)) else {
            return false;
        };
        let experts = vm.layers[layer].experts;
        let span = (c * per).min(experts)..((c + 1) * per).min(experts);
        !span.is_empty() && span.into_iter().all(|e| row.get(e) == Some(&false))
    };
    for (i, l) in vm.layers.iter().enumerate().skip(first).take(rows_h) {
        let sel = i == vm.layer;
        let label = format!("{}{}", if sel { "▶ " } else { "  " }, l.layer);
        let mut spans = vec![Span::styled(
            pad(&label, LABEL_W),
            if sel { theme.accent } else { theme.base },
        )];
        for (c, &v) in binned[i].iter().enumerate() {
            let masked = masked_out(i, c);
            let (g, style) = if masked && (v <= 0.0 || max <= 0.0) {
                (MASKED, theme.dim)
            } else if masked {
                // Chosen before the switch to the task (a kept cache): dim, crossed out.
                (
                    glyph(v / max),
                    theme.dim.add_modifier(Modifier::CROSSED_OUT),
                )
            } else if v <= 0.0 || max <= 0.0 {
                ('·', theme.dim)
            } else {
                let x = v / max;
                let style = match theme.heat.is_empty() {
                    true => theme.base,
                    false => match theme.heat(x).bg {
                        Some(c) => Style::default().fg(c),
                        None => theme.base,
                    },
                };
                (glyph(x), style)
            };
            // Never chosen: one dot, so that empty cells stay quiet.
            let reps = if g == '·' || g == MASKED {
                1
            } else {
                cw.saturating_sub(1).max(1)
            };
            let mut text = g.to_string().repeat(reps);
            // Masked out but chosen before the switch: the shade ends in ×.
            if masked && g != MASKED {
                text.pop();
                text.push(MASKED);
            }
            text.push_str(&" ".repeat(cw - text.chars().count()));
            spans.push(Span::styled(text, style));
        }
        spans.push(Span::raw(" ".repeat(cols * cw - binned[i].len() * cw)));
        let summary = if vm.tokens == 0 {
            format!("  {:>7} {:>8} {:>8}  {}", "—", "—", "—", "—")
        } else {
            let unused = if l.unused.is_empty() {
                "none".to_string()
            } else {
                ranges(&l.unused)
            };
            format!(
                "  {:>7.2} {:>8.2} {:>8}  {}",
                l.entropy,
                l.max_over_mean,
                format!("{}/{}", l.for_90, l.experts),
                unused
            )
        };
        let room = inner_w.saturating_sub(LABEL_W + cols * cw);
        spans.push(Span::styled(
            truncate(&summary, room),
            if sel { theme.accent } else { theme.base },
        ));
        lines.push(Line::from(spans));
    }

    let mut legend = format!(
        "·░▒▓█ share of the busiest cell ({})",
        number(max, vm.measure)
    );
    if per > 1 {
        legend.push_str(&format!(" · one column = {per} experts, summed"));
    }
    legend.push_str(" · balance: entropy, 1 = even");
    lines.push(Line::styled(truncate(&legend, inner_w), theme.dim));
    if let Some(m) = vm.mask_experts {
        let closed: usize = m.iter().map(|r| r.iter().filter(|&&o| !o).count()).sum();
        let all: usize = m.iter().map(Vec::len).sum();
        let mut text = format!(
            "{MASKED} masked out by task {} ({closed} of {all} experts may not route) · ▓{MASKED} chosen before the switch",
            esc(vm.mask_task.unwrap_or("?"))
        );
        if per > 1 {
            text.push_str(" · a column is × when all its experts are");
        }
        lines.push(Line::styled(truncate(&text, inner_w), theme.accent));
    }

    let k = vm.layers.first().map_or(0, |l| l.top_k);
    let rows = if vm.layers.len() > rows_h {
        format!(
            " · layers {}–{} of {}",
            first + 1,
            (first + rows_h).min(vm.layers.len()),
            vm.layers.len()
        )
    } else {
        String::new()
    };
    let other = match vm.measure {
        Measure::Counts => Measure::Mass,
        Measure::Mass => Measure::Counts,
    };
    let title = format!(
        " experts per layer — {} · {} tokens × top-{k} of {experts}{rows} · m: {} ",
        vm.measure.title(),
        vm.tokens,
        other.title()
    );
    f.render_widget(
        Paragraph::new(lines).block(Block::bordered().title(title)),
        area,
    );
}

/// A token's text for one line: control characters escaped, a newline as `↵`.
fn shown(text: &str) -> String {
    esc(&text.replace('\n', "↵"))
}

fn render_token(f: &mut Frame, area: Rect, vm: &RoutingVm, theme: &Theme) {
    let inner_w = area.width.saturating_sub(2) as usize;
    let inner_h = area.height.saturating_sub(2) as usize;
    let Some(t) = &vm.selected else {
        f.render_widget(
            Paragraph::new(Line::styled("no token yet", theme.dim))
                .block(Block::bordered().title(" token ")),
            area,
        );
        return;
    };
    let mut lines = Vec::new();
    let first = page_start(vm.layer, inner_h.max(1));
    for (i, (layer, experts, weights)) in t.layers.iter().enumerate().skip(first).take(inner_h) {
        let sel = i == vm.layer;
        let mut text = format!("{}{:<4}", if sel { "▶ " } else { "  " }, layer);
        for (e, w) in experts.iter().zip(weights.iter()) {
            text.push_str(&format!(" e{e} {w:.2}"));
        }
        lines.push(Line::styled(
            truncate(&text, inner_w),
            if sel { theme.accent } else { theme.base },
        ));
    }
    let title = format!(
        " token {} of {}{} · “{}” id {} ",
        t.position + 1,
        vm.tokens,
        if vm.follow { " (newest)" } else { "" },
        truncate(&shown(t.text), 12),
        t.id
    );
    f.render_widget(
        Paragraph::new(lines).block(Block::bordered().title(title)),
        area,
    );
}

const SUBSCRIPTS: [char; 10] = ['₀', '₁', '₂', '₃', '₄', '₅', '₆', '₇', '₈', '₉'];

fn subscript(n: u32) -> String {
    n.to_string()
        .chars()
        .map(|d| SUBSCRIPTS[d.to_digit(10).unwrap_or(0) as usize])
        .collect()
}

/// The style of a token whose first expert is `e`.
fn expert_style(e: Option<u32>, theme: &Theme) -> Style {
    match e {
        Some(e) if !theme.series.is_empty() => Style::default()
            .bg(theme.series[e as usize % theme.series.len()])
            .fg(Color::Black),
        _ => theme.base,
    }
}

/// The transcript wrapped at `width`: lines of (text, token index) pieces, and the line
/// each token starts on.
fn wrap_tokens(
    vm: &RoutingVm,
    width: usize,
    marks: bool,
) -> (Vec<Vec<(String, usize)>>, Vec<usize>) {
    let width = width.max(1);
    let mut lines: Vec<Vec<(String, usize)>> = vec![Vec::new()];
    let mut used = 0;
    let mut starts = Vec::with_capacity(vm.transcript.len());
    for (i, t) in vm.transcript.iter().enumerate() {
        let mut text = shown(t.text);
        if marks {
            if let Some(e) = t.expert {
                text.push_str(&subscript(e));
            }
        }
        let w = UnicodeWidthStr::width(text.as_str());
        if used > 0 && used + w > width {
            lines.push(Vec::new());
            used = 0;
        }
        starts.push(lines.len() - 1);
        // A token wider than the line is cut into line-sized parts.
        let mut rest = text.as_str();
        while !rest.is_empty() {
            let mut part_w = 0;
            let mut end = rest.len();
            for (b, c) in rest.char_indices() {
                let cw = unicode_width::UnicodeWidthChar::width(c).unwrap_or(0);
                if used + part_w + cw > width && (used + part_w) > 0 {
                    end = b;
                    break;
                }
                part_w += cw;
            }
            let (part, tail) = rest.split_at(end);
            if !part.is_empty() {
                lines
                    .last_mut()
                    .expect("a line")
                    .push((part.to_string(), i));
                used += part_w;
            }
            rest = tail;
            if !rest.is_empty() {
                lines.push(Vec::new());
                used = 0;
            }
        }
        if t.text.ends_with('\n') {
            lines.push(Vec::new());
            used = 0;
        }
    }
    (lines, starts)
}

fn render_transcript(f: &mut Frame, area: Rect, vm: &RoutingVm, theme: &Theme) {
    let inner_w = area.width.saturating_sub(2) as usize;
    let inner_h = area.height.saturating_sub(2) as usize;
    let layer = vm.layers.get(vm.layer).map_or(0, |l| l.layer);
    let marks = theme.series.is_empty();
    let title = format!(" transcript · first expert at layer {layer} · [ ] layer ");
    if vm.transcript.is_empty() {
        let text = "Ask something in the Chat view (6): every token the model runs, prompt \
                    and answer, shows here with the experts it chose.";
        let lines: Vec<Line> = wrap_words(text, inner_w.max(1))
            .into_iter()
            .map(|l| Line::styled(l, theme.dim))
            .collect();
        f.render_widget(
            Paragraph::new(lines).block(Block::bordered().title(title)),
            area,
        );
        return;
    }
    // The last row is the legend.
    let text_h = inner_h.saturating_sub(1).max(1);
    let (lines, starts) = wrap_tokens(vm, inner_w, marks);
    let cursor_line = vm.cursor.and_then(|c| starts.get(c).copied());
    let top = match cursor_line {
        Some(l) if !vm.follow => page_start(l, text_h),
        _ => lines.len().saturating_sub(text_h),
    };
    let mut out: Vec<Line> = lines
        .iter()
        .skip(top)
        .take(text_h)
        .map(|pieces| {
            Line::from(
                pieces
                    .iter()
                    .map(|(text, i)| {
                        let mut style = expert_style(vm.transcript[*i].expert, theme);
                        if Some(*i) == vm.cursor {
                            style = theme.selected.add_modifier(Modifier::BOLD);
                        }
                        Span::styled(text.clone(), style)
                    })
                    .collect::<Vec<_>>(),
            )
        })
        .collect();
    while out.len() < text_h {
        out.push(Line::raw(""));
    }
    let experts = vm.layers.get(vm.layer).map_or(0, |l| l.experts);
    let legend = if marks {
        Line::styled(
            truncate("subscript: the token's first expert", inner_w),
            theme.dim,
        )
    } else {
        let mut spans = vec![Span::styled("experts ", theme.dim)];
        let mut used = 8;
        for e in 0..experts as u32 {
            let label = format!(" {e} ");
            used += label.len();
            if used > inner_w {
                break;
            }
            spans.push(Span::styled(label, expert_style(Some(e), theme)));
        }
        if experts > theme.series.len() && used + 24 <= inner_w {
            spans.push(Span::styled(
                format!(" colours repeat every {}", theme.series.len()),
                theme.dim,
            ));
        }
        Line::from(spans)
    };
    out.push(legend);
    f.render_widget(
        Paragraph::new(out).block(Block::bordered().title(title)),
        area,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn draw(w: u16, h: u16, render_fn: impl FnOnce(&mut Frame)) -> String {
        crate::util::draw_text(w, h, render_fn)
    }

    /// 3 MoE layers of 7 experts, top-2, over a fixed little transcript.
    struct Fixture {
        layers: Vec<LayerVm>,
        texts: Vec<String>,
        chosen: Vec<Vec<u32>>,
        weights: Vec<Vec<f32>>,
    }

    fn fixture() -> Fixture {
        let words = [
            "<|im_start|>",
            "user",
            "\n",
            "Why",
            " is",
            " the",
            " sky",
            " blue",
            "?",
            "<|im_end|>",
            "\n",
            "<|im_start|>",
            "assistant",
            "\n",
            "Light",
            " scatters",
            " off",
            " air",
            " molecules",
            ",",
            " and",
            " blue",
            " scatters",
            " most",
            ".",
        ];
        let n = words.len();
        let (e, k) = (7usize, 2usize);
        let mut chosen = Vec::new();
        let mut weights = Vec::new();
        let mut layers = Vec::new();
        for (li, layer) in [1usize, 3, 5].into_iter().enumerate() {
            let mut c = Vec::new();
            let mut w = Vec::new();
            let mut counts = vec![0u64; e];
            for p in 0..n {
                // Expert 6 is never chosen at layer 5; layer 1 leans on expert 0.
                let a = if li == 0 && p % 3 == 0 {
                    0
                } else {
                    (p * (li + 2)) % 6
                };
                let b = (a + 1 + li) % 6;
                let wa = 0.5 + (p % 5) as f32 * 0.1;
                c.extend([a as u32, b as u32]);
                w.extend([wa, 1.0 - wa]);
                counts[a] += 1;
                counts[b] += 1;
            }
            let total: u64 = counts.iter().sum();
            let mean = total as f64 / e as f64;
            let max = *counts.iter().max().unwrap() as f64;
            let h: f64 = counts
                .iter()
                .filter(|&&x| x > 0)
                .map(|&x| {
                    let p = x as f64 / total as f64;
                    -p * p.ln()
                })
                .sum();
            layers.push(LayerVm {
                layer,
                experts: e,
                top_k: k,
                values: counts.iter().map(|&x| x as f64).collect(),
                entropy: h / (e as f64).ln(),
                max_over_mean: max / mean,
                for_90: 5,
                unused: (0..e).filter(|&x| counts[x] == 0).collect(),
            });
            chosen.push(c);
            weights.push(w);
        }
        Fixture {
            layers,
            texts: words.iter().map(|s| s.to_string()).collect(),
            chosen,
            weights,
        }
    }

    fn render_fixture(fx: &Fixture, layer: usize, cursor: usize, theme: &Theme) -> String {
        let transcript: Vec<TokenVm> = fx
            .texts
            .iter()
            .enumerate()
            .map(|(p, t)| TokenVm {
                text: t,
                expert: Some(fx.chosen[layer][p * 2]),
            })
            .collect();
        let selected = TokenRoutesVm {
            position: cursor,
            id: 1000 + cursor as u32,
            text: &fx.texts[cursor],
            layers: (0..3)
                .map(|l| {
                    (
                        fx.layers[l].layer,
                        &fx.chosen[l][cursor * 2..cursor * 2 + 2],
                        &fx.weights[l][cursor * 2..cursor * 2 + 2],
                    )
                })
                .collect(),
        };
        let vm = RoutingVm {
            measure: Measure::Counts,
            tokens: fx.texts.len(),
            layers: &fx.layers,
            layer,
            transcript: &transcript,
            cursor: Some(cursor),
            follow: false,
            selected: Some(selected),
            mask_experts: None,
            mask_task: None,
        };
        draw(97, 31, |f| render(f, f.area(), &vm, theme))
    }

    #[test]
    fn snapshot_seven_experts_three_layers() {
        let fx = fixture();
        insta::assert_snapshot!(
            "routing_7_experts_97x31",
            render_fixture(&fx, 1, 6, &Theme::plain())
        );
    }

    #[test]
    fn snapshot_expert_mask_on_the_grid() {
        let fx = fixture();
        // Layer 1: experts 2, 5, 6 masked out; layer 3: all open; layer 5: 0 and 6 out
        // (expert 0 was chosen before the switch: dim, not ×).
        let mask: Vec<Vec<bool>> = vec![
            (0..7).map(|e| ![2, 5, 6].contains(&e)).collect(),
            vec![true; 7],
            (0..7).map(|e| e != 0 && e != 6).collect(),
        ];
        let vm = RoutingVm {
            measure: Measure::Counts,
            tokens: fx.texts.len(),
            layers: &fx.layers,
            layer: 0,
            transcript: &[],
            cursor: None,
            follow: true,
            selected: None,
            mask_experts: Some(&mask),
            mask_task: Some("co\u{1b}de"),
        };
        let screen = draw(97, 16, |f| render(f, f.area(), &vm, &Theme::plain()));
        insta::assert_snapshot!("routing_expert_mask_97x16", screen);
        assert!(
            screen.contains("× masked out by task co"),
            "the legend names the task:\n{screen}"
        );
        assert!(!screen.contains('\u{1b}'));
        // Layer 1's row: the masked experts' columns are ×.
        let row = screen.lines().find(|l| l.contains("▶ 1")).unwrap();
        assert_eq!(row.matches('×').count(), 3, "{row}");
        let row5 = screen.lines().find(|l| l.starts_with("│  5 ")).unwrap();
        assert_eq!(row5.matches('×').count(), 2, "{row5}");
        assert!(row5.contains("▓▓×"), "chosen before the switch: {row5}");
        // Without a mask nothing is ×.
        let plain = RoutingVm {
            mask_experts: None,
            mask_task: None,
            ..vm
        };
        let screen = draw(97, 16, |f| render(f, f.area(), &plain, &Theme::plain()));
        // (The title's `× top-2` aside.)
        assert!(!screen.lines().skip(1).any(|l| l.contains('×')), "{screen}");
    }

    #[test]
    fn colours_do_not_change_the_text_but_drop_the_subscripts() {
        let fx = fixture();
        let plain = render_fixture(&fx, 1, 6, &Theme::plain());
        let dark = render_fixture(&fx, 1, 6, &Theme::dark());
        // The map and the token panel read the same; only the transcript's marks go.
        let top = |s: &str| s.lines().take(8).collect::<Vec<_>>().join("\n");
        assert_eq!(top(&plain), top(&dark));
        assert!(plain.contains(" sky₀ blue₃"), "{plain}");
        assert!(!dark.contains('₀') && !dark.contains('₁'), "{dark}");
    }

    #[test]
    fn many_experts_share_columns() {
        let layers = vec![LayerVm {
            layer: 0,
            experts: 128,
            top_k: 8,
            values: (0..128).map(|e| (e % 7) as f64).collect(),
            entropy: 0.9,
            max_over_mean: 1.5,
            for_90: 100,
            unused: (0..128).step_by(7).collect(),
        }];
        let vm = RoutingVm {
            measure: Measure::Mass,
            tokens: 10,
            layers: &layers,
            layer: 0,
            transcript: &[],
            cursor: None,
            follow: true,
            selected: None,
            mask_experts: None,
            mask_task: None,
        };
        let screen = draw(80, 20, |f| render(f, f.area(), &vm, &Theme::plain()));
        assert!(screen.contains("one column = 4 experts"), "{screen}");
        assert!(screen.contains("weight mass"), "{screen}");
        // Every row fits the width: nothing is cut by the border.
        assert!(screen.lines().all(|l| l.chars().count() <= 80));
    }

    #[test]
    fn snapshot_notice() {
        let n = NoticeVm {
            title: "no Mixture-of-Experts layers",
            text: "Every layer of this model runs one dense feed-forward block: there is no \
                   router, so there are no routes to show.\nThe routing view shows, for MoE \
                   models, which experts each token of the chat chose.",
            bad: false,
        };
        insta::assert_snapshot!(
            "routing_no_moe_notice",
            draw(80, 14, |f| render_notice(f, f.area(), &n, &Theme::plain()))
        );
    }

    #[test]
    fn ranges_are_compact() {
        assert_eq!(ranges(&[0, 1, 2, 5, 7, 8]), "0-2,5,7-8");
        assert_eq!(ranges(&[]), "");
        assert_eq!(ranges(&[3]), "3");
    }
}
