//! Colours and emphasis. `Theme::plain()` is what NO_COLOR gets: modifiers only.

use ratatui::style::{Color, Modifier, Style};

/// Named styles the views use; the app may override any of them from the config file.
#[derive(Clone, Debug, PartialEq)]
pub struct Theme {
    pub color: bool,
    pub base: Style,
    pub title: Style,
    pub accent: Style,
    pub dim: Style,
    pub ok: Style,
    pub warn: Style,
    pub bad: Style,
    pub selected: Style,
    pub tab_active: Style,
    pub tab_inactive: Style,
    pub key: Style,
    /// Heat-map ramp from cold (0.0) to hot (1.0).
    pub heat: Vec<Color>,
    /// Distinct colours for categories (the routing view's experts), used in turn; empty
    /// without colours (the views then mark categories with text).
    pub series: Vec<Color>,
}

impl Theme {
    pub fn dark() -> Theme {
        Theme {
            color: true,
            base: Style::default(),
            title: Style::default()
                .fg(Color::Cyan)
                .add_modifier(Modifier::BOLD),
            accent: Style::default().fg(Color::Yellow),
            dim: Style::default().fg(Color::DarkGray),
            ok: Style::default().fg(Color::Green),
            warn: Style::default().fg(Color::Yellow),
            bad: Style::default().fg(Color::Red).add_modifier(Modifier::BOLD),
            selected: Style::default()
                .bg(Color::Blue)
                .fg(Color::White)
                .add_modifier(Modifier::BOLD),
            tab_active: Style::default()
                .fg(Color::Black)
                .bg(Color::Cyan)
                .add_modifier(Modifier::BOLD),
            tab_inactive: Style::default().fg(Color::Gray),
            key: Style::default()
                .fg(Color::Magenta)
                .add_modifier(Modifier::BOLD),
            heat: vec![
                Color::Rgb(20, 20, 60),
                Color::Rgb(40, 40, 140),
                Color::Rgb(30, 100, 200),
                Color::Rgb(20, 160, 180),
                Color::Rgb(40, 190, 90),
                Color::Rgb(180, 200, 40),
                Color::Rgb(240, 160, 30),
                Color::Rgb(240, 80, 30),
            ],
            series: vec![
                Color::Rgb(230, 159, 0),
                Color::Rgb(86, 180, 233),
                Color::Rgb(0, 158, 115),
                Color::Rgb(240, 228, 66),
                Color::Rgb(0, 114, 178),
                Color::Rgb(213, 94, 0),
                Color::Rgb(204, 121, 167),
                Color::Rgb(170, 170, 170),
                Color::Rgb(140, 210, 120),
                Color::Rgb(250, 140, 140),
            ],
        }
    }

    /// No colours at all (NO_COLOR): structure shown by bold, reverse and underline.
    pub fn plain() -> Theme {
        let s = Style::default();
        Theme {
            color: false,
            base: s,
            title: s.add_modifier(Modifier::BOLD),
            accent: s.add_modifier(Modifier::UNDERLINED),
            dim: s,
            ok: s,
            warn: s.add_modifier(Modifier::BOLD),
            bad: s.add_modifier(Modifier::BOLD | Modifier::UNDERLINED),
            selected: s.add_modifier(Modifier::REVERSED),
            tab_active: s.add_modifier(Modifier::REVERSED | Modifier::BOLD),
            tab_inactive: s,
            key: s.add_modifier(Modifier::BOLD),
            heat: vec![],
            series: vec![],
        }
    }

    /// A cell style for a value in [0, 1] of a heat map; without colours, the caller shows
    /// the value with [`heat_glyph`] instead.
    pub fn heat(&self, x: f64) -> Style {
        if self.heat.is_empty() || !x.is_finite() {
            return self.base;
        }
        let i = ((x.clamp(0.0, 1.0) * (self.heat.len() - 1) as f64).round()) as usize;
        Style::default().bg(self.heat[i])
    }
}

/// A density as a shade glyph (for plain themes and legends).
pub fn heat_glyph(x: f64) -> char {
    const G: [char; 5] = [' ', '░', '▒', '▓', '█'];
    if !x.is_finite() {
        return '?';
    }
    G[((x.clamp(0.0, 1.0) * 4.0).round()) as usize]
}
