//! The public keys a user trusts to sign model files (§8.2), from three places, merged:
//! - the trusted-keys file `<config dir>/cortiq/trusted_keys` (beside `config.toml`, so
//!   `$CORTIQ_CONFIG` moves it too): one key per line as 64 hex digits, optionally
//!   followed by a label; `#` starts a comment;
//! - `$CORTIQ_TRUSTED_KEYS`: `hex[,hex…]`;
//! - `verify --trusted-key HEX|FILE` (the CLI only).
//!
//! A trusted-keys file that others can write is refused: whoever can write it can make
//! any signature "trusted".

use std::path::{Path, PathBuf};

use cortiq_engine::format::signature;

/// The environment variable naming public keys the user trusts (comma-separated hex).
pub const TRUSTED_KEYS_ENV: &str = "CORTIQ_TRUSTED_KEYS";

/// Keys the user trusts, where they came from, and what was wrong with the rest.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TrustedKeys {
    pub keys: Vec<[u8; 32]>,
    /// Each source that gave keys, with how many ("2 from ~/.config/cortiq/trusted_keys").
    pub sources: Vec<String>,
    /// Entries or files that were ignored, and why.
    pub problems: Vec<String>,
    /// A problem that must stop a command that relies on trust (a trusted-keys file
    /// others can write).
    pub refused: Option<String>,
}

/// Where the trusted-keys file is looked for.
pub fn trusted_keys_path() -> Option<PathBuf> {
    crate::app::config::config_path().map(|c| {
        c.parent()
            .map(Path::to_path_buf)
            .unwrap_or_default()
            .join("trusted_keys")
    })
}

impl TrustedKeys {
    /// The keys of the file and the environment.
    pub fn load() -> TrustedKeys {
        let mut t = TrustedKeys::default();
        if let Some(path) = trusted_keys_path() {
            t.add_file(&path);
        }
        match std::env::var(TRUSTED_KEYS_ENV) {
            Ok(v) => t.add_list(&v),
            Err(std::env::VarError::NotPresent) => {}
            Err(std::env::VarError::NotUnicode(_)) => t
                .problems
                .push(format!("{TRUSTED_KEYS_ENV} is not valid UTF-8 (ignored)")),
        }
        t
    }

    /// The keys of a `hex,hex,...` list as `$CORTIQ_TRUSTED_KEYS` gives them.
    #[cfg(test)]
    pub fn parse(list: &str) -> TrustedKeys {
        let mut t = TrustedKeys::default();
        t.add_list(list);
        t
    }

    /// Adds `hex,hex,...` (spaces allowed around entries) from the environment variable.
    pub fn add_list(&mut self, list: &str) {
        let before = self.keys.len();
        for (i, entry) in list.split(',').map(str::trim).enumerate() {
            if entry.is_empty() {
                continue;
            }
            match signature::parse_public_key(entry) {
                Some(k) => self.push(k),
                None => self.problems.push(format!(
                    "{TRUSTED_KEYS_ENV} entry {} is not 64 hex digits (ignored)",
                    i + 1
                )),
            }
        }
        self.note_source(before, TRUSTED_KEYS_ENV.to_string());
    }

    /// Adds the keys of a trusted-keys file; a missing file adds nothing.
    pub fn add_file(&mut self, path: &Path) {
        let shown = cortiq_engine::format::escape_str(&path.display().to_string());
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
            Err(e) => {
                self.problems
                    .push(format!("{shown}: cannot be read ({e}; ignored)"));
                return;
            }
        };
        #[cfg(unix)]
        if let Ok(meta) = std::fs::metadata(path) {
            use std::os::unix::fs::PermissionsExt;
            let mode = meta.permissions().mode() & 0o777;
            if mode & 0o022 != 0 {
                let why = format!(
                    "{shown} is writable by others (mode {mode:03o}), so anyone could add a \
                     key to it: not used (chmod go-w it)"
                );
                self.problems.push(why.clone());
                self.refused = Some(why);
                return;
            }
        }
        let before = self.keys.len();
        for (n, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            let Some(key) = line.split_whitespace().next() else {
                continue;
            };
            match signature::parse_public_key(key) {
                Some(k) => self.push(k),
                None => self.problems.push(format!(
                    "{shown} line {}: not 64 hex digits (ignored)",
                    n + 1
                )),
            }
        }
        self.note_source(before, shown);
    }

    /// Adds one key given on the command line.
    pub fn add_cli(&mut self, key: [u8; 32]) {
        let before = self.keys.len();
        self.push(key);
        self.note_source(before, "--trusted-key".into());
    }

    fn push(&mut self, k: [u8; 32]) {
        if !self.keys.contains(&k) {
            self.keys.push(k);
        }
    }

    fn note_source(&mut self, before: usize, name: String) {
        let n = self.keys.len() - before;
        if n > 0 {
            self.sources.push(format!("{n} from {name}"));
        }
    }

    /// "2 from …, 1 from CORTIQ_TRUSTED_KEYS", or how to name one.
    pub fn describe(&self) -> String {
        if self.keys.is_empty() {
            // No path: it differs per machine, and `cortiq --help` names the config dir.
            format!(
                "none — name signers you trust in trusted_keys beside the config file, or \
                 {TRUSTED_KEYS_ENV}=hex[,hex…]"
            )
        } else {
            self.sources.join(", ")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(b: u8) -> String {
        format!("{b:02x}").repeat(32)
    }

    #[test]
    fn a_file_and_a_list_merge_with_labels_comments_and_problems() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("trusted_keys");
        std::fs::write(
            &path,
            format!(
                "# signers\n{} alice\n\n  {}  # bob\nnot-a-key\n",
                key(1),
                key(2)
            ),
        )
        .unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        }
        let mut t = TrustedKeys::default();
        t.add_file(&path);
        t.add_list(&format!("{}, {}", key(2), key(3)));
        assert_eq!(t.keys, vec![[1u8; 32], [2u8; 32], [3u8; 32]]);
        assert_eq!(t.problems.len(), 1, "{:?}", t.problems);
        assert!(t.problems[0].contains("line 5"), "{:?}", t.problems);
        assert!(t.refused.is_none());
        assert_eq!(t.sources.len(), 2);
        assert!(t.describe().starts_with("2 from "), "{}", t.describe());
        assert!(t.describe().ends_with("1 from CORTIQ_TRUSTED_KEYS"));
        // A missing file adds nothing and is no problem.
        let mut t = TrustedKeys::default();
        t.add_file(&dir.path().join("absent"));
        assert_eq!(t, TrustedKeys::default());
    }

    #[cfg(unix)]
    #[test]
    fn a_file_others_can_write_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("trusted_keys");
        std::fs::write(&path, key(1)).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
        let mut t = TrustedKeys::default();
        t.add_file(&path);
        assert!(t.keys.is_empty());
        assert!(t.refused.as_deref().unwrap().contains("writable by others"));
    }
}
