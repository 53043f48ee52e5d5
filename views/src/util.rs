//! Small formatting helpers shared by the views.

use ratatui::layout::{Constraint, Flex, Layout, Rect};

/// Text from a file made safe for the terminal: control characters and the Unicode
/// bidirectional controls (which can make a name display as another) as escapes. The
/// engine's `format::escape_str` escapes the same set for the CLI (this crate does not
/// depend on the engine).
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        let bidi = matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{200e}' | '\u{200f}' | '\u{61c}');
        if c.is_control() || bidi {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    format!("{v:.1} {}", UNITS[u])
}

pub fn group_digits(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

pub fn shape_str(shape: &[u64]) -> String {
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    format!("[{}]", dims.join(", "))
}

/// Cuts `s` to `max` display characters with an ellipsis.
pub fn truncate(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_string()
    } else if max == 0 {
        String::new()
    } else {
        let mut t: String = s.chars().take(max - 1).collect();
        t.push('…');
        t
    }
}

/// A rectangle of `w`×`h` cells centred in `area` (clamped to it).
pub fn centered(area: Rect, w: u16, h: u16) -> Rect {
    let [r] = Layout::horizontal([Constraint::Length(w.min(area.width))])
        .flex(Flex::Center)
        .areas(area);
    let [r] = Layout::vertical([Constraint::Length(h.min(area.height))])
        .flex(Flex::Center)
        .areas(r);
    r
}

/// `s` cut or padded with spaces to exactly `w` characters, left-aligned.
pub fn pad(s: &str, w: usize) -> String {
    let t = truncate(s, w);
    let n = t.chars().count();
    format!("{t}{}", " ".repeat(w.saturating_sub(n)))
}

/// `s` cut or padded with spaces to exactly `w` characters, right-aligned.
pub fn pad_left(s: &str, w: usize) -> String {
    let t = truncate(s, w);
    let n = t.chars().count();
    format!("{}{t}", " ".repeat(w.saturating_sub(n)))
}

/// First row of the page that holds `selected` (pages of `h` rows).
pub fn page_start(selected: usize, h: usize) -> usize {
    selected.checked_div(h).map_or(0, |page| page * h)
}

/// A vertical scrollbar in the right column of `r`: `max` is the greatest first row, `top`
/// the first row shown, `h` the rows shown.
pub fn scrollbar(
    f: &mut ratatui::Frame,
    r: Rect,
    max: usize,
    top: usize,
    h: usize,
    theme: &crate::Theme,
) {
    use ratatui::widgets::{Scrollbar, ScrollbarOrientation, ScrollbarState};
    if r.width == 0 || r.height == 0 {
        return;
    }
    let mut state = ScrollbarState::new(max + 1)
        .position(top)
        .viewport_content_length(h);
    let bar = Rect::new(r.right() - 1, r.y, 1, r.height);
    f.render_stateful_widget(
        Scrollbar::new(ScrollbarOrientation::VerticalRight)
            .begin_symbol(None)
            .end_symbol(None)
            .track_symbol(Some("│"))
            .thumb_symbol("█")
            .thumb_style(theme.accent),
        bar,
        &mut state,
    );
}

/// Draws with `render_fn` on a `w × h` test terminal and returns the screen as text, one
/// line per row with trailing spaces trimmed, a wide character once (widget tests).
#[cfg(test)]
pub fn draw_text(w: u16, h: u16, render_fn: impl FnOnce(&mut ratatui::Frame)) -> String {
    use unicode_width::UnicodeWidthStr;
    let mut term =
        ratatui::Terminal::new(ratatui::backend::TestBackend::new(w, h)).expect("test terminal");
    let frame = term.draw(render_fn).expect("draw");
    let buf = frame.buffer;
    let mut out = String::new();
    for y in 0..buf.area.height {
        let mut line = String::new();
        let mut skip = 0;
        for x in 0..buf.area.width {
            if skip > 0 {
                skip -= 1;
                continue;
            }
            let sym = buf[(x, y)].symbol();
            skip = UnicodeWidthStr::width(sym).saturating_sub(1);
            line.push_str(sym);
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod esc_tests {
    use super::esc;

    #[test]
    fn bidi_controls_are_escaped_like_controls() {
        assert_eq!(
            esc("a\u{202e}b\u{2067}c\u{7}"),
            "a\\u{202e}b\\u{2067}c\\u{7}"
        );
        assert_eq!(esc("שלום 👨\u{200d}👩"), "שלום 👨\u{200d}👩");
    }
}
