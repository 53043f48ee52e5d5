//! Keys → Actions. The default bindings live in `assets/keymap.toml`; the config file can
//! override any of them. The help overlay is generated from the same table, so it always
//! shows the keys that work.

use std::collections::BTreeMap;

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};

use super::chat::ChatCmd;
use super::routing::RoutingCmd;
use super::Action;

/// Every bindable command: config name, action, help text, help section.
const COMMANDS: &[(&str, &str, &str)] = &[
    ("quit", "quit", "Global"),
    ("help", "show or hide this help", "Global"),
    ("next_tab", "next view", "Global"),
    ("prev_tab", "previous view", "Global"),
    ("tab_1", "Overview", "Global"),
    ("tab_2", "Tensors", "Global"),
    ("tab_3", "Masks", "Global"),
    ("tab_4", "Skills", "Global"),
    ("tab_5", "Integrity", "Global"),
    ("tab_6", "Chat", "Global"),
    ("tab_7", "Routing", "Global"),
    ("open", "open another file (picker)", "Global"),
    ("up", "move up", "Move"),
    ("down", "move down", "Move"),
    ("page_up", "page up", "Move"),
    ("page_down", "page down", "Move"),
    ("home", "first row", "Move"),
    ("end", "last row", "Move"),
    ("left", "collapse / previous", "Move"),
    ("right", "expand / next", "Move"),
    ("enter", "open, expand, select", "Move"),
    ("back", "close, cancel, leave", "Move"),
    (
        "filter",
        "filter (type, Enter keeps, Esc clears); Skills: the probe prompt of E",
        "Views",
    ),
    ("sort", "sort by the next column", "Views"),
    ("sort_reverse", "reverse the sort", "Views"),
    ("group", "group tensors by layer", "Views"),
    ("cycle", "switch field / mode of the view", "Views"),
    ("template", "show the chat template", "Views"),
    ("verify", "run verify", "Views"),
    ("cancel", "cancel running work", "Views"),
    ("chat_send", "send the message (in the input)", "Chat"),
    ("chat_newline", "new line in the input", "Chat"),
    ("chat_focus", "type in the input (Esc leaves it)", "Chat"),
    ("chat_stop", "stop the answer (Esc too)", "Chat"),
    ("chat_regenerate", "regenerate the last answer", "Chat"),
    (
        "chat_edit",
        "edit the last question (Enter resends it)",
        "Chat",
    ),
    ("chat_clear", "clear the conversation (new session)", "Chat"),
    ("chat_sampling", "sampling panel", "Chat"),
    (
        "chat_settings",
        "system prompt and template variables",
        "Chat",
    ),
    (
        "chat_prompt",
        "prompt inspector: the rendered prompt's tokens",
        "Chat",
    ),
    (
        "chat_tokens",
        "token inspector: probabilities of the reply",
        "Chat",
    ),
    ("chat_copy", "copy the last reply (OSC 52)", "Chat"),
    (
        "chat_copy_code",
        "copy the next code block of the last reply",
        "Chat",
    ),
    ("chat_thinking", "fold or unfold thinking blocks", "Chat"),
    (
        "chat_save",
        "save the session to JSON (/save FILE, /load FILE too)",
        "Chat",
    ),
    (
        "chat_override",
        "chat with a file whose hash chain fails",
        "Chat",
    ),
    ("chat_task", "task mask picker (/task NAME|none)", "Chat"),
    (
        "chat_skill",
        "skill picker: none, a skill, auto, blend T (/skill ...)",
        "Chat",
    ),
    (
        "chat_policy",
        "at a switch: keep the cache or re-prefill (/switch keep|reprefill)",
        "Chat",
    ),
    (
        "chat_compare",
        "compare: one prompt under two choices, side by side",
        "Chat",
    ),
    (
        "routing_mass",
        "heat map: times chosen or weight mass",
        "Routing",
    ),
    (
        "routing_prev_layer",
        "previous MoE layer (↑ too)",
        "Routing",
    ),
    ("routing_next_layer", "next MoE layer (↓ too)", "Routing"),
    (
        "routing_export",
        "write the route stats JSON (<model>.route-stats.json)",
        "Routing",
    ),
];

fn action_of(name: &str) -> Option<Action> {
    Some(match name {
        "quit" => Action::Quit,
        "help" => Action::Help,
        "next_tab" => Action::NextTab,
        "prev_tab" => Action::PrevTab,
        "tab_1" => Action::GoTab(0),
        "tab_2" => Action::GoTab(1),
        "tab_3" => Action::GoTab(2),
        "tab_4" => Action::GoTab(3),
        "tab_5" => Action::GoTab(4),
        "tab_6" => Action::GoTab(5),
        "tab_7" => Action::GoTab(6),
        "open" => Action::OpenPicker,
        "up" => Action::Up,
        "down" => Action::Down,
        "page_up" => Action::PageUp,
        "page_down" => Action::PageDown,
        "home" => Action::Home,
        "end" => Action::End,
        "left" => Action::Left,
        "right" => Action::Right,
        "enter" => Action::Enter,
        "back" => Action::Back,
        "filter" => Action::Filter,
        "sort" => Action::SortNext,
        "sort_reverse" => Action::SortReverse,
        "group" => Action::Group,
        "cycle" => Action::Cycle,
        "template" => Action::Template,
        "verify" => Action::Verify,
        "cancel" => Action::Cancel,
        "chat_send" => Action::Chat(ChatCmd::Send),
        "chat_newline" => Action::Chat(ChatCmd::Newline),
        "chat_focus" => Action::Chat(ChatCmd::Focus),
        "chat_stop" => Action::Chat(ChatCmd::Stop),
        "chat_regenerate" => Action::Chat(ChatCmd::Regenerate),
        "chat_edit" => Action::Chat(ChatCmd::EditLast),
        "chat_clear" => Action::Chat(ChatCmd::Clear),
        "chat_sampling" => Action::Chat(ChatCmd::Sampling),
        "chat_settings" => Action::Chat(ChatCmd::Settings),
        "chat_prompt" => Action::Chat(ChatCmd::PromptInspector),
        "chat_tokens" => Action::Chat(ChatCmd::TokenInspector),
        "chat_copy" => Action::Chat(ChatCmd::CopyReply),
        "chat_copy_code" => Action::Chat(ChatCmd::CopyCode),
        "chat_thinking" => Action::Chat(ChatCmd::Thinking),
        "chat_save" => Action::Chat(ChatCmd::Save),
        "chat_override" => Action::Chat(ChatCmd::Override),
        "chat_task" => Action::Chat(ChatCmd::TaskPicker),
        "chat_skill" => Action::Chat(ChatCmd::SkillPicker),
        "chat_policy" => Action::Chat(ChatCmd::Policy),
        "chat_compare" => Action::Chat(ChatCmd::Compare),
        "routing_mass" => Action::Routing(RoutingCmd::Mass),
        "routing_prev_layer" => Action::Routing(RoutingCmd::PrevLayer),
        "routing_next_layer" => Action::Routing(RoutingCmd::NextLayer),
        "routing_export" => Action::Routing(RoutingCmd::Export),
        _ => return None,
    })
}

/// A key with modifiers, parsed from `Ctrl-c`, `PageUp`, `?`, ...
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Key {
    pub code: KeyCode,
    pub mods: KeyModifiers,
}

impl Key {
    pub fn parse(s: &str) -> Result<Key, String> {
        let mut mods = KeyModifiers::NONE;
        let mut rest = s;
        loop {
            if let Some(r) = rest.strip_prefix("Ctrl-") {
                mods |= KeyModifiers::CONTROL;
                rest = r;
            } else if let Some(r) = rest.strip_prefix("Alt-") {
                mods |= KeyModifiers::ALT;
                rest = r;
            } else if let Some(r) = rest.strip_prefix("Shift-") {
                mods |= KeyModifiers::SHIFT;
                rest = r;
            } else {
                break;
            }
        }
        let code = match rest {
            "Up" => KeyCode::Up,
            "Down" => KeyCode::Down,
            "Left" => KeyCode::Left,
            "Right" => KeyCode::Right,
            "PageUp" => KeyCode::PageUp,
            "PageDown" => KeyCode::PageDown,
            "Home" => KeyCode::Home,
            "End" => KeyCode::End,
            "Enter" => KeyCode::Enter,
            "Esc" => KeyCode::Esc,
            "Tab" => KeyCode::Tab,
            "BackTab" => KeyCode::BackTab,
            "Backspace" => KeyCode::Backspace,
            "Space" => KeyCode::Char(' '),
            f if f.len() >= 2 && f.starts_with('F') && f[1..].parse::<u8>().is_ok() => {
                KeyCode::F(f[1..].parse().unwrap())
            }
            c if c.chars().count() == 1 => KeyCode::Char(c.chars().next().unwrap()),
            other => return Err(format!("unknown key {other:?}")),
        };
        Ok(Key { code, mods })
    }

    /// Whether a terminal key event is this key. Shift is part of the character itself
    /// (`S`, `?`), so it is ignored for character keys.
    fn matches(&self, ev: &KeyEvent) -> bool {
        let mods = if matches!(ev.code, KeyCode::Char(_)) {
            ev.modifiers - KeyModifiers::SHIFT
        } else {
            ev.modifiers
        };
        let code = match (ev.code, ev.modifiers.contains(KeyModifiers::SHIFT)) {
            (KeyCode::Tab, true) => KeyCode::BackTab,
            (c, _) => c,
        };
        let mods = if code == KeyCode::BackTab {
            mods - KeyModifiers::SHIFT
        } else {
            mods
        };
        code == self.code && mods == self.mods
    }
}

#[derive(Clone, Debug)]
pub struct Keymap {
    /// Command name → keys, in the order of `COMMANDS`.
    pub bindings: BTreeMap<&'static str, Vec<(String, Key)>>,
}

impl Keymap {
    /// The bindings of `assets/keymap.toml`.
    pub fn default_map() -> Keymap {
        let table: BTreeMap<String, Vec<String>> =
            toml::from_str(include_str!("../../assets/keymap.toml"))
                .expect("assets/keymap.toml parses");
        Keymap::from_table(&table, None).expect("the default keymap is valid")
    }

    /// The defaults with `overrides` (command name → keys) applied.
    pub fn with_overrides(overrides: &BTreeMap<String, Vec<String>>) -> Result<Keymap, String> {
        let base = Keymap::default_map();
        Keymap::from_table(overrides, Some(base))
    }

    fn from_table(
        table: &BTreeMap<String, Vec<String>>,
        base: Option<Keymap>,
    ) -> Result<Keymap, String> {
        let mut bindings = base.map(|b| b.bindings).unwrap_or_default();
        for (name, keys) in table {
            let (cmd, _, _) = COMMANDS
                .iter()
                .find(|(n, _, _)| n == name)
                .ok_or_else(|| format!("unknown command {name:?} in keymap"))?;
            let parsed = keys
                .iter()
                .map(|k| Key::parse(k).map(|key| (k.clone(), key)))
                .collect::<Result<Vec<_>, _>>()?;
            bindings.insert(cmd, parsed);
        }
        Ok(Keymap { bindings })
    }

    /// The action bound to a key event, if any.
    pub fn action_for(&self, ev: &KeyEvent) -> Option<Action> {
        for (name, _, _) in COMMANDS {
            if let Some(keys) = self.bindings.get(name) {
                if keys.iter().any(|(_, k)| k.matches(ev)) {
                    return action_of(name);
                }
            }
        }
        None
    }

    /// The chat command bound to a key event (the chat view asks first, so that its
    /// Ctrl/Alt/F keys work while the input has focus).
    pub fn chat_action_for(&self, ev: &KeyEvent) -> Option<Action> {
        for (name, _, section) in COMMANDS {
            if *section != "Chat" {
                continue;
            }
            if let Some(keys) = self.bindings.get(name) {
                if keys.iter().any(|(_, k)| k.matches(ev)) {
                    return action_of(name);
                }
            }
        }
        None
    }

    /// Help text: sections of (keys, what they do).
    pub fn help_sections(&self) -> Vec<(String, Vec<(String, String)>)> {
        let mut out: Vec<(String, Vec<(String, String)>)> = Vec::new();
        for (name, what, section) in COMMANDS {
            let keys = self
                .bindings
                .get(name)
                .map(|k| {
                    k.iter()
                        .map(|(s, _)| s.clone())
                        .collect::<Vec<_>>()
                        .join(" ")
                })
                .unwrap_or_default();
            if keys.is_empty() {
                continue;
            }
            match out.iter_mut().find(|(s, _)| s == section) {
                Some((_, v)) => v.push((keys, what.to_string())),
                None => out.push((section.to_string(), vec![(keys, what.to_string())])),
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(c: KeyCode, m: KeyModifiers) -> KeyEvent {
        KeyEvent::new(c, m)
    }

    #[test]
    fn defaults_and_overrides() {
        let k = Keymap::default_map();
        assert_eq!(
            k.action_for(&key(KeyCode::Char('q'), KeyModifiers::NONE)),
            Some(Action::Quit)
        );
        assert_eq!(
            k.action_for(&key(KeyCode::Char('c'), KeyModifiers::CONTROL)),
            Some(Action::Quit)
        );
        assert_eq!(
            k.action_for(&key(KeyCode::Char('?'), KeyModifiers::SHIFT)),
            Some(Action::Help)
        );
        assert_eq!(
            k.action_for(&key(KeyCode::BackTab, KeyModifiers::SHIFT)),
            Some(Action::PrevTab)
        );
        assert_eq!(
            k.action_for(&key(KeyCode::Char('S'), KeyModifiers::SHIFT)),
            Some(Action::SortReverse)
        );
        let mut o = BTreeMap::new();
        o.insert("quit".to_string(), vec!["x".to_string()]);
        let k = Keymap::with_overrides(&o).unwrap();
        assert_eq!(
            k.action_for(&key(KeyCode::Char('x'), KeyModifiers::NONE)),
            Some(Action::Quit)
        );
        assert_eq!(
            k.action_for(&key(KeyCode::Char('q'), KeyModifiers::NONE)),
            None
        );
        assert!(k.help_sections()[0]
            .1
            .iter()
            .any(|(keys, what)| keys == "x" && what == "quit"));
        o.insert("fly".to_string(), vec!["y".to_string()]);
        assert!(Keymap::with_overrides(&o).is_err());
        assert!(Key::parse("Hyper-x").is_err());
    }
}
