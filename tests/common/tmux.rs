//! The workbench in a real terminal: tmux runs `cortiq`, send-keys types, capture-pane reads.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

pub fn tmux(args: &[&str]) -> std::process::Output {
    Command::new("tmux")
        .args(args)
        .output()
        .unwrap_or_else(|e| {
            panic!("tmux is needed for the end-to-end terminal test (apt-get install -y tmux): {e}")
        })
}

pub struct Session {
    name: String,
}

impl Session {
    pub fn start(name: &str, file: &Path, log: &Path) -> Session {
        Session::start_with(name, file, log, "")
    }

    pub fn start_with(name: &str, file: &Path, log: &Path, env: &str) -> Session {
        let _ = tmux(&["kill-session", "-t", &format!("={name}")]);
        let cmd = format!(
            "env {env} CORTIQ_LOG={} CORTIQ_CONFIG=/nonexistent/cortiq.toml TERM=xterm-256color {} {}",
            log.display(),
            env!("CARGO_BIN_EXE_cortiq"),
            file.display()
        );
        // The pane stays after the program exits, so what it left on the screen can be read.
        let shell = format!("{cmd}; echo EXITED $?; sleep 30");
        let args = [
            "new-session",
            "-d",
            "-s",
            name,
            "-x",
            "140",
            "-y",
            "40",
            "sh",
            "-c",
            &shell,
        ];
        let mut o = tmux(&args);
        // A test that ends the last session stops the tmux server; a session started in
        // that moment fails ("server exited unexpectedly"). Try again a few times.
        for _ in 0..10 {
            if o.status.success() {
                break;
            }
            std::thread::sleep(Duration::from_millis(200));
            o = tmux(&args);
        }
        assert!(
            o.status.success(),
            "tmux new-session: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        Session {
            name: name.to_string(),
        }
    }

    /// The session's pane, named exactly: a bare `-t name` also matches sessions whose
    /// names start with it, so one test's clean-up could kill another's session
    /// (`cortiq-e2e` killed `cortiq-e2e-panic` when the tests ran in parallel).
    fn target(&self) -> String {
        format!("={}:", self.name)
    }

    pub fn screen(&self) -> String {
        String::from_utf8_lossy(&tmux(&["capture-pane", "-p", "-t", &self.target()]).stdout)
            .into_owned()
    }

    pub fn keys(&self, keys: &[&str]) {
        for k in keys {
            let o = tmux(&["send-keys", "-t", &self.target(), k]);
            assert!(o.status.success(), "send-keys {k}");
            std::thread::sleep(Duration::from_millis(60));
        }
    }

    /// Sends `key` once every `interval` while `more()` holds, at most `max` times; the
    /// count sent.
    pub fn key_stream(
        &self,
        key: &str,
        interval: Duration,
        max: usize,
        more: impl Fn() -> bool,
    ) -> usize {
        let mut sent = 0;
        while sent < max && more() {
            let o = tmux(&["send-keys", "-t", &self.target(), key]);
            assert!(o.status.success(), "send-keys {key}");
            sent += 1;
            std::thread::sleep(interval);
        }
        sent
    }

    pub fn literal(&self, text: &str) {
        let o = tmux(&["send-keys", "-t", &self.target(), "-l", text]);
        assert!(o.status.success());
        std::thread::sleep(Duration::from_millis(60));
    }

    /// Waits until the screen contains every needle; fails with the screen.
    pub fn wait_for(&self, needles: &[&str]) -> String {
        self.wait_for_within(needles, Duration::from_secs(15))
    }

    /// [`Session::wait_for`] with its own time limit.
    pub fn wait_for_within(&self, needles: &[&str], limit: Duration) -> String {
        let start = Instant::now();
        loop {
            let s = self.screen();
            if needles.iter().all(|n| s.contains(n)) {
                return s;
            }
            assert!(
                start.elapsed() < limit,
                "waited for {needles:?}; the screen is:\n{s}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Sends `signal` (a `kill` name: TERM, HUP) to the program in the pane: the child of
    /// the pane's shell (`env` execs cortiq in its place).
    pub fn signal(&self, signal: &str) {
        let child = self.program_pid();
        let o = Command::new("kill")
            .args([&format!("-{signal}"), &child])
            .output()
            .expect("kill runs");
        assert!(o.status.success(), "kill -{signal} {child}");
    }

    /// Closes the terminal: the tmux session ends, its pane's terminal hangs up.
    pub fn close_terminal(&self) {
        let o = tmux(&["kill-session", "-t", &format!("={}", self.name)]);
        assert!(o.status.success(), "tmux kill-session");
    }

    /// The pid of the program in the pane: the child of the pane's shell (`env` execs
    /// cortiq in its place).
    pub fn program_pid(&self) -> String {
        let pid = String::from_utf8_lossy(
            &tmux(&["display-message", "-p", "-t", &self.target(), "#{pane_pid}"]).stdout,
        )
        .trim()
        .to_string();
        let children = Command::new("pgrep")
            .args(["-P", &pid])
            .output()
            .expect("pgrep runs");
        String::from_utf8_lossy(&children.stdout)
            .lines()
            .next()
            .unwrap_or_else(|| panic!("no program under the pane's shell {pid}"))
            .trim()
            .to_string()
    }

    /// Waits for cortiq to exit; returns its exit status line and the screen it left.
    pub fn wait_exit(&self) -> String {
        self.wait_for(&["EXITED"])
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let _ = tmux(&["kill-session", "-t", &format!("={}", self.name)]);
    }
}
