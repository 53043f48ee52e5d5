//! The config file: `<platform config dir>/cortiq/config.toml` (or `$CORTIQ_CONFIG`).
//!
//! ```toml
//! theme = "dark"            # or "plain"; NO_COLOR in the environment forces "plain"
//! [colors]                  # override single styles of the dark theme
//! accent = "yellow"         # a colour name or "#rrggbb"
//! [keys]                    # override bindings of assets/keymap.toml
//! quit = ["q", "Ctrl-c"]
//! ```

use std::collections::BTreeMap;
use std::path::PathBuf;

use cortiq_views::Theme;
use ratatui::style::{Color, Style};
use serde::Deserialize;

use super::keymap::Keymap;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub theme: Option<String>,
    #[serde(default)]
    pub colors: BTreeMap<String, String>,
    #[serde(default)]
    pub keys: BTreeMap<String, Vec<String>>,
}

/// Where the config file is looked for.
pub fn config_path() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("CORTIQ_CONFIG") {
        return Some(PathBuf::from(p));
    }
    dirs::config_dir().map(|d| d.join("cortiq").join("config.toml"))
}

/// Reads the config (a missing file is the default config; a broken one is an error that
/// names the file and the problem).
pub fn load() -> Result<Config, String> {
    let Some(path) = config_path() else {
        return Ok(Config::default());
    };
    match std::fs::read_to_string(&path) {
        Ok(text) => toml::from_str(&text).map_err(|e| format!("{}: {e}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Config::default()),
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

fn parse_color(s: &str) -> Result<Color, String> {
    s.parse::<Color>()
        .map_err(|_| format!("unknown colour {s:?}"))
}

impl Config {
    /// The theme: NO_COLOR (any non-empty value) wins over everything.
    pub fn theme(&self, no_color: bool) -> Result<Theme, String> {
        if no_color || self.theme.as_deref() == Some("plain") {
            return Ok(Theme::plain());
        }
        let mut t = match self.theme.as_deref() {
            None | Some("dark") => Theme::dark(),
            Some(other) => return Err(format!("unknown theme {other:?} (dark, plain)")),
        };
        for (name, value) in &self.colors {
            let c = parse_color(value)?;
            let slot: &mut Style = match name.as_str() {
                "title" => &mut t.title,
                "accent" => &mut t.accent,
                "dim" => &mut t.dim,
                "ok" => &mut t.ok,
                "warn" => &mut t.warn,
                "bad" => &mut t.bad,
                "key" => &mut t.key,
                "tab_inactive" => &mut t.tab_inactive,
                "selected" => {
                    t.selected = t.selected.bg(c);
                    continue;
                }
                "tab_active" => {
                    t.tab_active = t.tab_active.bg(c);
                    continue;
                }
                other => return Err(format!("unknown colour slot {other:?}")),
            };
            *slot = slot.fg(c);
        }
        Ok(t)
    }

    pub fn keymap(&self) -> Result<Keymap, String> {
        Keymap::with_overrides(&self.keys)
    }
}

/// NO_COLOR convention: set and non-empty means no colours.
pub fn no_color_env() -> bool {
    std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_rejects() {
        let c: Config = toml::from_str(
            "theme = \"dark\"\n[colors]\naccent = \"#ff0000\"\n[keys]\nquit = [\"x\"]\n",
        )
        .unwrap();
        let t = c.theme(false).unwrap();
        assert_eq!(t.accent.fg, Some(Color::Rgb(255, 0, 0)));
        assert!(!c.theme(true).unwrap().color, "NO_COLOR wins");
        assert!(c.keymap().is_ok());
        assert!(toml::from_str::<Config>("colour = 1").is_err());
        let bad: Config = toml::from_str("[colors]\naccent = \"blurple\"").unwrap();
        assert!(bad.theme(false).is_err());
    }
}
