//! The file picker shown when `cortiq` starts without a file: `.cmf` files and folders of
//! a directory, newest first among files.

use std::path::PathBuf;

use super::Action;

pub struct Picker {
    pub dir: PathBuf,
    /// (name, is_dir, size)
    items: Vec<(String, bool, u64)>,
    pub selected: usize,
    pub message: Option<String>,
}

impl Picker {
    pub fn new(dir: PathBuf) -> Picker {
        let mut p = Picker {
            dir,
            items: Vec::new(),
            selected: 0,
            message: None,
        };
        p.scan();
        p
    }

    fn scan(&mut self) {
        self.items.clear();
        self.selected = 0;
        let rd = match std::fs::read_dir(&self.dir) {
            Ok(rd) => rd,
            Err(e) => {
                self.message = Some(format!("cannot read {}: {e}", self.dir.display()));
                return;
            }
        };
        let mut dirs = Vec::new();
        let mut files = Vec::new();
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') {
                continue;
            }
            let Ok(md) = e.metadata() else { continue };
            if md.is_dir() {
                dirs.push((name, true, 0));
            } else if name.ends_with(".cmf") {
                files.push((name, false, md.len()));
            }
        }
        dirs.sort();
        files.sort();
        self.items.extend(files);
        self.items.extend(dirs);
    }

    /// Rows for the view: name, size text, whether it is a directory.
    pub fn entries(&self) -> Vec<(String, String, bool)> {
        self.items
            .iter()
            .map(|(n, d, s)| {
                if *d {
                    (format!("{n}/"), String::new(), true)
                } else {
                    (n.clone(), cortiq_views::util::human_bytes(*s), false)
                }
            })
            .collect()
    }

    /// Handles an action; returns a file to open when one was chosen.
    pub fn update(&mut self, a: &Action) -> Option<PathBuf> {
        let n = self.items.len();
        match a {
            Action::Up => self.selected = self.selected.saturating_sub(1),
            Action::Down if n > 0 => self.selected = (self.selected + 1).min(n - 1),
            Action::Home => self.selected = 0,
            Action::End if n > 0 => self.selected = n - 1,
            Action::Left | Action::Back | Action::Erase => {
                if let Some(parent) = self.dir.parent() {
                    self.dir = parent.to_path_buf();
                    self.scan();
                }
            }
            Action::Enter | Action::Right => {
                let (name, is_dir, _) = self.items.get(self.selected)?.clone();
                let path = self.dir.join(name);
                if is_dir {
                    self.dir = path;
                    self.scan();
                } else {
                    return Some(path);
                }
            }
            _ => {}
        }
        None
    }
}
