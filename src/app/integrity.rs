//! State of the Integrity view: the hash chain of spec §8.1 (envelope → header → directory
//! → sections → tensors → signature) with what the file records for each link, and a
//! verify run on a worker thread whose results fill the tree as they arrive.
//!
//! A run is sequential: `v` while one runs is refused, and after `c` the view waits for the
//! cancelled run's last report before it starts another. Reports carry no run id, so this
//! keeps a late report of an old run from landing in a new run's tree.

use std::sync::atomic::AtomicBool;
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use cortiq_engine::format::signature::{self, SignatureStatus};
use cortiq_engine::format::verify::{
    verify, Link, LinkResult, LinkStatus, VerifyEvent, VerifyOptions, VerifyReport,
};
use cortiq_engine::format::{feature, CmfFile, SectionKind};
use cortiq_engine::quant;
use cortiq_views::integrity::{self as view, ChainRow, IntegrityVm, Mark, Note, Tone};
use cortiq_views::util::{human_bytes, shape_str};
use cortiq_views::Theme;
use ratatui::layout::Rect;
use ratatui::Frame;

use super::jobs::{JobKind, JobReport};
use super::{Action, Ctx};

/// The environment variable naming public keys the user trusts (comma-separated hex).
pub const TRUSTED_KEYS_ENV: &str = "CORTIQ_TRUSTED_KEYS";

/// Failing links listed one per line in the verdict; the rest are counted.
const FAILURES_LISTED: usize = 6;

/// Progress reports are sent at most once per this share of the bytes or this interval, so
/// a file with 10⁵ small tensors does not flood the channel.
const PROGRESS_STEP_PER_MILLE: u64 = 10;
const PROGRESS_INTERVAL: Duration = Duration::from_millis(30);

/// Keys the user trusts, and what was wrong with the ones that did not parse.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TrustedKeys {
    pub keys: Vec<[u8; 32]>,
    pub problems: Vec<String>,
}

impl TrustedKeys {
    /// Parses `hex,hex,...` (spaces allowed around entries).
    pub fn parse(list: &str) -> TrustedKeys {
        let mut t = TrustedKeys::default();
        for (i, entry) in list.split(',').map(str::trim).enumerate() {
            if entry.is_empty() {
                continue;
            }
            match signature::parse_public_key(entry) {
                Some(k) => t.keys.push(k),
                None => t.problems.push(format!(
                    "{TRUSTED_KEYS_ENV} entry {} is not 64 hex digits (ignored)",
                    i + 1
                )),
            }
        }
        t
    }

    fn from_env() -> TrustedKeys {
        match std::env::var(TRUSTED_KEYS_ENV) {
            Ok(v) => TrustedKeys::parse(&v),
            Err(std::env::VarError::NotPresent) => TrustedKeys::default(),
            Err(std::env::VarError::NotUnicode(_)) => TrustedKeys {
                keys: Vec::new(),
                problems: vec![format!("{TRUSTED_KEYS_ENV} is not valid UTF-8 (ignored)")],
            },
        }
    }
}

/// A present masks/vocab/index section and its `section_hashes` entry.
struct SectionNode {
    kind: SectionKind,
    recorded: Option<String>,
    status: Option<LinkStatus>,
}

/// One row of the tree, in chain order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Node {
    Envelope,
    Header,
    Directory,
    /// Index into `sections`.
    Section(usize),
    Tensors,
    /// Index into the directory.
    Tensor(usize),
    Signature,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Idle,
    Running,
    Done,
}

/// What the worker leaves for the view beside its final report: how long `verify` took
/// (measured on the worker, so the UI's frame pacing does not count) and the report itself,
/// by which the view tells its own run's last report from a stale one.
type Finish = Mutex<Option<(Duration, Arc<VerifyReport>)>>;

struct Run {
    finish: Arc<Finish>,
    tensors_total: usize,
    bytes_total: u64,
    bytes_done: u64,
    cancel_requested: bool,
    elapsed: Option<Duration>,
    report: Option<Arc<VerifyReport>>,
}

pub struct IntegrityState {
    file_name: String,
    has_path: bool,
    sig_present: bool,
    pub trusted: TrustedKeys,
    sections: Vec<SectionNode>,
    tensor_count: usize,
    tensor_bytes: u64,
    /// Characters in the longest tensor name (the tree's name column follows it).
    widest_tensor_name: usize,
    expanded: bool,
    /// Show only failing tensors under the tensors node.
    failing_only: bool,
    selected: usize,
    offset: usize,
    phase: Phase,
    header: Option<LinkStatus>,
    directory: Option<LinkStatus>,
    tensors: Vec<Option<LinkStatus>>,
    tensors_checked: usize,
    /// Failing tensors, directory order.
    failing: Vec<usize>,
    signature: Option<LinkStatus>,
    run: Option<Run>,
}

fn human_duration(d: Duration) -> String {
    let ms = d.as_secs_f64() * 1e3;
    if ms < 10.0 {
        format!("{ms:.1} ms")
    } else if ms < 1000.0 {
        format!("{ms:.0} ms")
    } else {
        format!("{:.2} s", ms / 1e3)
    }
}

/// A public key shortened for a one-line statement (the details show it whole).
fn short_key(k: &str) -> String {
    if k.chars().count() > 16 {
        format!("{}…", k.chars().take(16).collect::<String>())
    } else {
        k.to_string()
    }
}

fn describe_status(s: &LinkStatus) -> String {
    match s {
        LinkStatus::Ok => "ok — the recorded hash matches the bytes".into(),
        LinkStatus::Unchecked { reason } => format!("unchecked: {reason}"),
        LinkStatus::Mismatch { expected, actual } => {
            format!("FAILED: recorded {expected}, computed {actual}")
        }
        LinkStatus::Invalid { reason } => format!("FAILED: {reason}"),
    }
}

/// The one-line cell of a checked link; `ok` is what an ok link says.
fn cell(status: &LinkStatus, ok: String) -> (Mark, String) {
    match status {
        LinkStatus::Ok => (Mark::Ok, ok),
        LinkStatus::Unchecked { reason } => (Mark::Unchecked, reason.clone()),
        LinkStatus::Mismatch { expected, actual } => (
            Mark::Failed,
            format!("recorded {expected}, computed {actual}"),
        ),
        LinkStatus::Invalid { reason } => (Mark::Failed, reason.clone()),
    }
}

/// What a signature status means, said plainly, and how it should read.
fn trust_statement(s: &SignatureStatus, sig_name: &str, trusted: usize) -> (String, Tone) {
    match s {
        SignatureStatus::Unsigned => {
            let text = format!("unsigned — no {sig_name} beside the file");
            (text, Tone::Dim)
        }
        SignatureStatus::Trusted { pubkey } => (
            format!(
                "signed and trusted — key {} is one you trust",
                short_key(pubkey)
            ),
            Tone::Ok,
        ),
        SignatureStatus::SelfConsistent { pubkey } => (
            format!(
                "valid for its own key {} — not checked against trusted keys \
                 (pass --trusted-key on the CLI)",
                short_key(pubkey)
            ),
            Tone::Warn,
        ),
        SignatureStatus::UntrustedKey { pubkey } => (
            format!(
                "signed by an UNTRUSTED key {} — not among your {trusted} trusted key(s)",
                short_key(pubkey)
            ),
            Tone::Bad,
        ),
        SignatureStatus::Invalid { reason } => (format!("INVALID: {reason}"), Tone::Bad),
    }
}

impl IntegrityState {
    pub fn new(file: &CmfFile) -> IntegrityState {
        let file_name = file
            .path
            .as_ref()
            .and_then(|p| p.file_name())
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "(in memory)".into());
        let sig_present = file
            .path
            .as_ref()
            .is_some_and(|p| signature::sig_path(p).is_file());
        let hashes = file.header.section_hashes.as_ref();
        let sections = [SectionKind::Masks, SectionKind::Vocab, SectionKind::Index]
            .into_iter()
            .filter(|&k| file.envelope.section(k).is_present())
            .map(|kind| SectionNode {
                kind,
                recorded: hashes.and_then(|h| match kind {
                    SectionKind::Masks => h.masks.clone(),
                    SectionKind::Vocab => h.vocab.clone(),
                    _ => h.index.clone(),
                }),
                status: None,
            })
            .collect();
        let n = file.directory.len();
        IntegrityState {
            file_name,
            has_path: file.path.is_some(),
            sig_present,
            trusted: TrustedKeys::from_env(),
            sections,
            tensor_count: n,
            tensor_bytes: file.directory.iter().map(|e| e.nbytes).sum(),
            widest_tensor_name: file
                .directory
                .iter()
                .map(|e| cortiq_views::util::esc(&e.name).chars().count())
                .max()
                .unwrap_or(0),
            expanded: false,
            failing_only: false,
            selected: 0,
            offset: 0,
            phase: Phase::Idle,
            header: None,
            directory: None,
            tensors: vec![None; n],
            tensors_checked: 0,
            failing: Vec::new(),
            signature: None,
            run: None,
        }
    }

    // ---- the tree's rows -------------------------------------------------------------

    fn children(&self) -> usize {
        match (self.expanded, self.failing_only) {
            (false, _) => 0,
            (true, true) => self.failing.len(),
            (true, false) => self.tensor_count,
        }
    }

    fn tensors_row(&self) -> usize {
        3 + self.sections.len()
    }

    fn total_rows(&self) -> usize {
        self.tensors_row() + 1 + self.children() + 1
    }

    fn node_at(&self, row: usize) -> Option<Node> {
        let t = self.tensors_row();
        let kids = self.children();
        Some(match row {
            0 => Node::Envelope,
            1 => Node::Header,
            2 => Node::Directory,
            r if r < t => Node::Section(r - 3),
            r if r == t => Node::Tensors,
            r if r <= t + kids => {
                let k = r - t - 1;
                Node::Tensor(if self.failing_only {
                    self.failing[k]
                } else {
                    k
                })
            }
            r if r == t + kids + 1 => Node::Signature,
            _ => return None,
        })
    }

    fn row_of(&self, node: Node) -> Option<usize> {
        let t = self.tensors_row();
        Some(match node {
            Node::Envelope => 0,
            Node::Header => 1,
            Node::Directory => 2,
            Node::Section(i) => 3 + i,
            Node::Tensors => t,
            Node::Tensor(i) => {
                if !self.expanded {
                    return None;
                }
                let k = if self.failing_only {
                    self.failing.binary_search(&i).ok()?
                } else {
                    i
                };
                t + 1 + k
            }
            Node::Signature => t + self.children() + 1,
        })
    }

    fn node_of_link(&self, link: &Link) -> Option<Node> {
        match link {
            Link::Header => Some(Node::Header),
            Link::Directory => Some(Node::Directory),
            Link::Section { section } => self
                .sections
                .iter()
                .position(|s| s.kind == *section)
                .map(Node::Section),
            Link::Tensor { index, .. } => {
                (*index < self.tensor_count).then_some(Node::Tensor(*index))
            }
            Link::Signature => Some(Node::Signature),
        }
    }

    /// The first failing link in chain order, from what has arrived so far.
    fn first_broken(&self) -> Option<Node> {
        let fails = |s: &Option<LinkStatus>| s.as_ref().is_some_and(LinkStatus::is_failure);
        if fails(&self.header) {
            return Some(Node::Header);
        }
        if fails(&self.directory) {
            return Some(Node::Directory);
        }
        if let Some(i) = self.sections.iter().position(|s| fails(&s.status)) {
            return Some(Node::Section(i));
        }
        if let Some(&i) = self.failing.first() {
            return Some(Node::Tensor(i));
        }
        fails(&self.signature).then_some(Node::Signature)
    }

    fn failing_links(&self, file: &CmfFile) -> Vec<(String, LinkStatus)> {
        let mut v = Vec::new();
        let mut push = |name: String, s: &Option<LinkStatus>| {
            if let Some(s) = s.as_ref().filter(|s| s.is_failure()) {
                v.push((name, s.clone()));
            }
        };
        push("header".into(), &self.header);
        push("directory".into(), &self.directory);
        for s in &self.sections {
            push(format!("{} section", s.kind.name()), &s.status);
        }
        for &i in &self.failing {
            let name = file
                .directory
                .entries
                .get(i)
                .map(|e| e.name.as_str())
                .unwrap_or("?");
            push(format!("tensor {name}"), &self.tensors[i]);
        }
        push("signature".into(), &self.signature);
        v
    }

    fn is_running(&self) -> bool {
        self.phase == Phase::Running
    }

    fn cancelled(&self) -> bool {
        self.run
            .as_ref()
            .and_then(|r| r.report.as_ref())
            .is_some_and(|r| r.cancelled)
    }

    /// The cell of a link that has no result: waiting for a run, or not reached by one.
    fn unreached(&self, pending: String) -> (Mark, String) {
        match self.phase {
            Phase::Done if self.cancelled() => (
                Mark::Skipped,
                "not checked: the run was cancelled first".into(),
            ),
            Phase::Done => (Mark::Skipped, "not checked by the run".into()),
            _ => (Mark::Pending, pending),
        }
    }

    fn row(&self, node: Node, file: &CmfFile) -> ChainRow {
        let env = &file.envelope;
        let (depth, expand, name, (mark, detail)) = match node {
            Node::Envelope => (
                0,
                None,
                "envelope".to_string(),
                (
                    Mark::Ok,
                    format!(
                        "CMF v{} · {} · checked at open; not hashed (§8.1)",
                        env.version,
                        feature::names(env.required_features).join("|")
                    ),
                ),
            ),
            Node::Header | Node::Directory => {
                let (name, recorded, status, extra) = if node == Node::Header {
                    ("header", env.header_hash, &self.header, String::new())
                } else {
                    (
                        "directory",
                        env.dir_hash,
                        &self.directory,
                        format!(" · {} records", self.tensor_count),
                    )
                };
                let c =
                    match status {
                        Some(s) => cell(s, format!("{recorded:016x} matches{extra}")),
                        None if recorded == 0 => self
                            .unreached(format!("not recorded (the envelope's hash is 0){extra}")),
                        None => self
                            .unreached(format!("recorded {recorded:016x} in the envelope{extra}")),
                    };
                (0, None, name.to_string(), c)
            }
            Node::Section(i) => {
                let s = &self.sections[i];
                let c = match (&s.status, &s.recorded) {
                    (Some(st), rec) => cell(
                        st,
                        format!("{} matches", rec.as_deref().unwrap_or("the hash")),
                    ),
                    (None, Some(rec)) => {
                        self.unreached(format!("recorded {rec} in the header's section_hashes"))
                    }
                    (None, None) => self.unreached("no hash recorded in section_hashes".into()),
                };
                (0, None, format!("{} section", s.kind.name()), c)
            }
            Node::Tensors => {
                let size = format!(
                    "{} tensors · {}",
                    self.tensor_count,
                    human_bytes(self.tensor_bytes)
                );
                let c = if !self.failing.is_empty() {
                    (
                        Mark::Failed,
                        if self.tensors_checked == self.tensor_count {
                            format!("{} of {} FAILED", self.failing.len(), self.tensor_count)
                        } else {
                            format!(
                                "{} of {} FAILED · {} checked so far",
                                self.failing.len(),
                                self.tensor_count,
                                self.tensors_checked
                            )
                        },
                    )
                } else if self.tensors_checked == self.tensor_count && self.phase != Phase::Idle {
                    (Mark::Ok, format!("all {size} match"))
                } else {
                    match self.phase {
                        Phase::Idle => (
                            Mark::Pending,
                            format!(
                                "{size}{}",
                                if self.expanded {
                                    ""
                                } else {
                                    " · Enter lists them"
                                }
                            ),
                        ),
                        Phase::Running => (
                            Mark::Pending,
                            format!("{} of {} checked", self.tensors_checked, self.tensor_count),
                        ),
                        Phase::Done => (
                            Mark::Skipped,
                            format!(
                                "{} of {} checked before the run stopped",
                                self.tensors_checked, self.tensor_count
                            ),
                        ),
                    }
                };
                (0, Some(self.expanded), "tensors".to_string(), c)
            }
            Node::Tensor(i) => {
                let (name, recorded, nbytes) = file
                    .directory
                    .entries
                    .get(i)
                    .map(|e| (e.name.clone(), e.hash, e.nbytes))
                    .unwrap_or_default();
                let c = match &self.tensors[i] {
                    Some(s) => cell(
                        s,
                        format!("{recorded:016x} matches · {}", human_bytes(nbytes)),
                    ),
                    None => self.unreached(format!(
                        "recorded {recorded:016x} · {}",
                        human_bytes(nbytes)
                    )),
                };
                (1, None, name, c)
            }
            Node::Signature => {
                let sig = format!("{}.sig", self.file_name);
                let c = match (&self.signature, self.sig_status()) {
                    (Some(_), Some(st)) => match st {
                        SignatureStatus::Unsigned => {
                            (Mark::Unchecked, format!("unsigned: no {sig}"))
                        }
                        SignatureStatus::Trusted { .. } => (Mark::Ok, "signed and trusted".into()),
                        SignatureStatus::SelfConsistent { .. } => (
                            Mark::Unchecked,
                            "valid for its own key; trust not checked".into(),
                        ),
                        SignatureStatus::UntrustedKey { .. } => {
                            (Mark::Failed, "signed by an UNTRUSTED key".into())
                        }
                        SignatureStatus::Invalid { reason } => {
                            (Mark::Failed, format!("INVALID: {reason}"))
                        }
                    },
                    (Some(s), None) => cell(s, "ok".into()),
                    (None, _) if !self.has_path => (
                        Mark::Unchecked,
                        "a file in memory has no .sig beside it".into(),
                    ),
                    (None, _) if self.sig_present => self.unreached(format!("{sig} present")),
                    (None, _) => self.unreached(format!("no {sig} beside the file")),
                };
                (0, None, "signature".to_string(), c)
            }
        };
        ChainRow {
            depth,
            expand,
            name,
            mark,
            detail,
            first_broken: false,
        }
    }

    fn sig_status(&self) -> Option<&SignatureStatus> {
        self.run.as_ref()?.report.as_ref()?.signature.as_ref()
    }

    // ---- the verdict and the details ---------------------------------------------------

    fn verdict(&self, file: &CmfFile) -> Vec<Note> {
        let mut v = Vec::new();
        let run = self.run.as_ref();
        match self.phase {
            Phase::Idle => v.push(Note::new(
                "verdict",
                format!(
                    "not verified yet — v hashes the whole chain ({} tensors, {})",
                    self.tensor_count,
                    human_bytes(self.tensor_bytes)
                ),
                Tone::Plain,
            )),
            Phase::Running => {
                let r = run.map(|r| r.cancel_requested).unwrap_or(false);
                v.push(Note::new(
                    "verdict",
                    if r {
                        "cancelling… waiting for the workers to stop".to_string()
                    } else {
                        format!(
                            "verifying… {} of {} tensors checked",
                            self.tensors_checked, self.tensor_count
                        )
                    },
                    Tone::Busy,
                ));
            }
            Phase::Done => {
                let report = run.and_then(|r| r.report.as_ref());
                let fails = self.failing_links(file);
                let first = self.first_broken().map(|n| self.row(n, file));
                if report.is_some_and(|r| r.ok) {
                    let unchecked = self.unchecked_links();
                    v.push(Note::new(
                        "verdict",
                        if unchecked == 0 {
                            "OK — every link of the chain holds".to_string()
                        } else {
                            format!(
                                "OK — every recorded hash matches \
                                 ({unchecked} link(s) unchecked: nothing recorded)"
                            )
                        },
                        Tone::Ok,
                    ));
                } else if self.cancelled() {
                    v.push(Note::new(
                        "verdict",
                        format!(
                            "cancelled after {} of {} tensors — nothing is proven; v runs again",
                            self.tensors_checked, self.tensor_count
                        ),
                        Tone::Warn,
                    ));
                } else if let Some(row) = first {
                    let what = match self.first_broken() {
                        Some(Node::Tensor(_)) => format!("tensor {}", row.name),
                        _ => row.name.clone(),
                    };
                    let n = fails.len();
                    v.push(Note::new(
                        "verdict",
                        format!(
                            "FAILED: first broken link: {what} ({n} failing link{})",
                            if n == 1 { "" } else { "s" }
                        ),
                        Tone::Bad,
                    ));
                } else {
                    v.push(Note::new(
                        "verdict",
                        "FAILED: the verify run stopped before it finished (see the log)",
                        Tone::Bad,
                    ));
                }
                for (k, (name, status)) in fails.iter().take(FAILURES_LISTED).enumerate() {
                    let label = if k == 0 {
                        format!("failing {}", fails.len())
                    } else {
                        String::new()
                    };
                    let (_, detail) = cell(status, String::new());
                    v.push(Note::new(label, format!("{name} — {detail}"), Tone::Bad));
                }
                if fails.len() > FAILURES_LISTED {
                    v.push(Note::new(
                        "",
                        format!(
                            "… and {} more (f lists failing tensors only)",
                            fails.len() - FAILURES_LISTED
                        ),
                        Tone::Bad,
                    ));
                }
                if let (Some(r), Some(run)) = (report, run) {
                    let mut text = format!(
                        "{} of {} tensors · {}",
                        r.tensors_checked,
                        self.tensor_count,
                        human_bytes(r.bytes_hashed)
                    );
                    if let Some(d) = run.elapsed {
                        let secs = d.as_secs_f64();
                        text.push_str(&format!(" in {}", human_duration(d)));
                        if secs > 0.0 {
                            text.push_str(&format!(
                                " · {}/s",
                                human_bytes((r.bytes_hashed as f64 / secs) as u64)
                            ));
                        }
                    }
                    v.push(Note::new("hashed", text, Tone::Plain));
                }
            }
        }
        let sig_name = format!("{}.sig", self.file_name);
        let (text, tone) = match self.sig_status() {
            Some(st) => trust_statement(st, &sig_name, self.trusted.keys.len()),
            None if !self.has_path => ("a file in memory has no .sig beside it".into(), Tone::Dim),
            None if self.sig_present => (
                format!("{sig_name} present — a run checks it (§8.2)"),
                Tone::Plain,
            ),
            None => (
                format!("unsigned — no {sig_name} beside the file"),
                Tone::Dim,
            ),
        };
        v.push(Note::new("signature", text, tone));
        let keys = match self.trusted.keys.len() {
            0 => format!("none — set {TRUSTED_KEYS_ENV}=hex[,hex…] to name signers you trust"),
            n => format!("{n} from {TRUSTED_KEYS_ENV}"),
        };
        v.push(Note::new("trusted", keys, Tone::Dim));
        for p in &self.trusted.problems {
            v.push(Note::new("", p.clone(), Tone::Warn));
        }
        v
    }

    fn unchecked_links(&self) -> usize {
        let un = |s: &Option<LinkStatus>| matches!(s, Some(LinkStatus::Unchecked { .. }));
        let mut n = un(&self.header) as usize + un(&self.directory) as usize;
        n += self.sections.iter().filter(|s| un(&s.status)).count();
        n
    }

    fn status_line(&self, s: &Option<LinkStatus>) -> String {
        match s {
            Some(s) => describe_status(s),
            None if self.is_running() => "pending — the run has not reached it yet".into(),
            None => self.unreached("pending — v runs the chain".into()).1,
        }
    }

    fn detail(&self, node: Node, file: &CmfFile) -> (String, Vec<(String, String)>) {
        let env = &file.envelope;
        let range = |off: u64, len: u64| {
            format!("file 0x{off:x}..0x{:x} · {}", off + len, human_bytes(len))
        };
        let kv = |k: &str, v: String| (k.to_string(), v);
        match node {
            Node::Envelope => (
                "envelope".into(),
                vec![
                    kv(
                        "format",
                        format!(
                            "CMF v{} · flags {} · required_features 0x{:x} ({})",
                            env.version,
                            env.flags,
                            env.required_features,
                            feature::names(env.required_features).join(" ")
                        ),
                    ),
                    kv(
                        "checked",
                        "when the file opened: magic, version, feature bits, section bounds \
                         (§1.2)"
                            .into(),
                    ),
                    kv(
                        "hash",
                        "none: a hash cannot protect itself; a corrupt offset is caught \
                         downstream by bounds and hashes (§8.1)"
                            .into(),
                    ),
                ],
            ),
            Node::Header | Node::Directory => {
                let header = node == Node::Header;
                let (sec, recorded, at, status) = if header {
                    (env.header, env.header_hash, "0x70..0x78", &self.header)
                } else {
                    (env.directory, env.dir_hash, "0x78..0x80", &self.directory)
                };
                let covers = if header {
                    "the header JSON, and so the section_hashes inside it".to_string()
                } else {
                    format!(
                        "{} records: names, dtypes, shapes, offsets and each tensor's hash",
                        self.tensor_count
                    )
                };
                (
                    if header { "header" } else { "directory" }.into(),
                    vec![
                        kv("bytes", range(sec.off, sec.len)),
                        kv(
                            "recorded",
                            if recorded == 0 {
                                format!(
                                    "nothing: the envelope's [{at}] is 0 \
                                     (an older file passes unchecked)"
                                )
                            } else {
                                format!("{recorded:016x} in the envelope's reserved bytes [{at}]")
                            },
                        ),
                        kv("covers", covers),
                        kv("status", self.status_line(status)),
                    ],
                )
            }
            Node::Section(i) => {
                let s = &self.sections[i];
                let sec = env.section(s.kind);
                (
                    format!("{} section", s.kind.name()),
                    vec![
                        kv("bytes", range(sec.off, sec.len)),
                        kv(
                            "recorded",
                            match &s.recorded {
                                Some(h) => format!(
                                    "{h} in the header's section_hashes.{} \
                                     (covered by the header hash)",
                                    s.kind.name()
                                ),
                                None => format!(
                                    "no hash: section_hashes has no {} entry",
                                    s.kind.name()
                                ),
                            },
                        ),
                        kv("status", self.status_line(&s.status)),
                    ],
                )
            }
            Node::Tensors => (
                "tensors".into(),
                vec![
                    kv(
                        "tensors",
                        format!(
                            "{} · {} in the data section ({})",
                            self.tensor_count,
                            human_bytes(self.tensor_bytes),
                            range(env.data.off, env.data.len)
                        ),
                    ),
                    kv(
                        "recorded",
                        "one hash64 per tensor, in its directory record \
                         (covered by the directory hash)"
                            .into(),
                    ),
                    kv(
                        "checked",
                        format!(
                            "{} of {} · {} failing{}",
                            self.tensors_checked,
                            self.tensor_count,
                            self.failing.len(),
                            if self.failing_only {
                                " · showing failing only (f)"
                            } else {
                                ""
                            }
                        ),
                    ),
                ],
            ),
            Node::Tensor(i) => {
                let Some(e) = file.directory.entries.get(i) else {
                    return ("tensor".into(), Vec::new());
                };
                let start = env.data.off + e.off;
                (
                    format!("tensor {} of {}", i + 1, self.tensor_count),
                    vec![
                        kv(
                            "tensor",
                            format!("{} · {} {}", e.name, e.dtype.name(), shape_str(&e.shape)),
                        ),
                        kv(
                            "bytes",
                            format!("data + 0x{:x} · {}", e.off, range(start, e.nbytes)),
                        ),
                        kv(
                            "recorded",
                            format!("{:016x} in its directory record", e.hash),
                        ),
                        kv("status", self.status_line(&self.tensors[i])),
                    ],
                )
            }
            Node::Signature => {
                let sig = format!("{}.sig", self.file_name);
                let mut v = vec![
                    kv(
                        "file",
                        if !self.has_path {
                            "none: the file is in memory".into()
                        } else if self.sig_present {
                            format!("{sig} beside the model")
                        } else {
                            format!("no {sig} beside the model (not an error, §8.2)")
                        },
                    ),
                    kv(
                        "proves",
                        "Ed25519 over the file's SHA-256: who signed, if you trust the key".into(),
                    ),
                ];
                match self.sig_status() {
                    Some(st) => v.push(kv("result", st.describe())),
                    None => v.push(kv("result", self.status_line(&self.signature))),
                }
                (format!("signature {sig}"), v)
            }
        }
    }

    // ---- running ---------------------------------------------------------------------

    fn reset_results(&mut self) {
        self.header = None;
        self.directory = None;
        for s in &mut self.sections {
            s.status = None;
        }
        self.tensors.iter_mut().for_each(|t| *t = None);
        self.tensors_checked = 0;
        self.failing.clear();
        self.signature = None;
        self.failing_only = false;
        self.clamp_cursor();
    }

    fn start(&mut self, ctx: &mut Ctx) {
        if self.is_running() {
            *ctx.flash = Some(
                "a verify run is already in progress — c cancels it, then v runs again".into(),
            );
            return;
        }
        let keep = self.node_at(self.selected);
        self.reset_results();
        if let Some(i) = keep.and_then(|n| self.row_of(n)) {
            self.selected = i;
        }
        let finish: Arc<Finish> = Arc::new(Mutex::new(None));
        self.run = Some(Run {
            finish: finish.clone(),
            tensors_total: self.tensor_count,
            bytes_total: self.tensor_bytes,
            bytes_done: 0,
            cancel_requested: false,
            elapsed: None,
            report: None,
        });
        self.phase = Phase::Running;
        let file = Arc::clone(ctx.file);
        let trusted = self.trusted.keys.clone();
        ctx.jobs.spawn(JobKind::Verify, move |cancel, report| {
            run_verify(&file, trusted, cancel, report, &finish)
        });
    }

    fn apply(&mut self, l: &LinkResult) {
        let status = Some(l.status.clone());
        match self.node_of_link(&l.link) {
            Some(Node::Header) => self.header = status,
            Some(Node::Directory) => self.directory = status,
            Some(Node::Section(i)) => self.sections[i].status = status,
            Some(Node::Tensor(i)) => {
                if self.tensors[i].is_none() {
                    self.tensors_checked += 1;
                }
                if l.status.is_failure() {
                    if let Err(at) = self.failing.binary_search(&i) {
                        self.failing.insert(at, i);
                    }
                }
                self.tensors[i] = status;
            }
            Some(Node::Signature) => self.signature = status,
            _ => {}
        }
    }

    fn finish(&mut self, report: &Arc<VerifyReport>) {
        let Some(run) = &mut self.run else { return };
        let mine = run
            .finish
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .filter(|(_, r)| Arc::ptr_eq(r, report))
            .map(|(d, _)| *d);
        let Some(elapsed) = mine else {
            // The last report of a run this view no longer waits for.
            return;
        };
        run.elapsed = Some(elapsed);
        run.report = Some(report.clone());
        run.bytes_done = report.bytes_hashed;
        // The report is the whole truth: rebuild from it rather than trust what streamed in.
        let keep = self.node_at(self.selected);
        let failing_only = self.failing_only;
        self.reset_results();
        self.failing_only = failing_only;
        for l in &report.links {
            self.apply(l);
        }
        self.phase = Phase::Done;
        if !self.failing.is_empty() {
            self.expanded = true;
        }
        self.selected = match self.first_broken() {
            Some(n) => self.row_of(n).unwrap_or(0),
            None => keep.and_then(|n| self.row_of(n)).unwrap_or(self.selected),
        };
        self.clamp_cursor();
    }

    fn clamp_cursor(&mut self) {
        self.selected = self.selected.min(self.total_rows().saturating_sub(1));
    }

    // ---- the app's interface ---------------------------------------------------------

    pub fn update(&mut self, a: &Action, ctx: &mut Ctx) {
        if !self.is_running() && ctx.jobs.is_running(JobKind::Verify) {
            // Our run sent its last report: the job is over.
            ctx.jobs.finished(JobKind::Verify);
        }
        let verdict_lines = self.verdict(ctx.file).len();
        let page = view::tree_capacity(ctx.body, verdict_lines);
        let last = self.total_rows().saturating_sub(1);
        match a {
            Action::Verify => self.start(ctx),
            Action::Cancel => match &mut self.run {
                Some(run) if self.phase == Phase::Running => {
                    ctx.jobs.cancel(JobKind::Verify);
                    run.cancel_requested = true;
                }
                _ => *ctx.flash = Some("no verify run to cancel".into()),
            },
            Action::Up | Action::ScrollUp => self.selected = self.selected.saturating_sub(1),
            Action::Down | Action::ScrollDown => self.selected = (self.selected + 1).min(last),
            Action::PageUp => self.selected = self.selected.saturating_sub(page),
            Action::PageDown => self.selected = (self.selected + page).min(last),
            Action::Home => self.selected = 0,
            Action::End => self.selected = last,
            Action::Enter | Action::Right | Action::Left => self.expand_or_collapse(a),
            Action::Cycle => self.toggle_failing_only(ctx),
            Action::Click(x, y) => {
                let offset = view::window_offset(self.offset, self.selected, last + 1, page);
                if let Some(i) = view::row_at(ctx.body, verdict_lines, offset, last + 1, *x, *y) {
                    if i == self.selected && self.node_at(i) == Some(Node::Tensors) {
                        self.expand_or_collapse(&Action::Enter);
                    } else {
                        self.selected = i;
                    }
                }
            }
            _ => {}
        }
        self.clamp_cursor();
        let verdict_lines = self.verdict(ctx.file).len();
        let page = view::tree_capacity(ctx.body, verdict_lines);
        self.offset = view::window_offset(self.offset, self.selected, self.total_rows(), page);
    }

    fn expand_or_collapse(&mut self, a: &Action) {
        match self.node_at(self.selected) {
            Some(Node::Tensors) => {
                let open = match a {
                    Action::Right => true,
                    Action::Left => false,
                    _ => !self.expanded,
                };
                if open && self.expanded && matches!(a, Action::Right) && self.children() > 0 {
                    // Right on an open node steps into it.
                    self.selected += 1;
                }
                self.expanded = open;
            }
            Some(Node::Tensor(_)) if matches!(a, Action::Left) => {
                self.selected = self.tensors_row();
            }
            _ => {}
        }
    }

    fn toggle_failing_only(&mut self, ctx: &mut Ctx) {
        if !self.failing_only && self.failing.is_empty() {
            *ctx.flash = Some("no failing tensors to list".into());
            return;
        }
        let keep = self.node_at(self.selected);
        self.failing_only = !self.failing_only;
        self.expanded = true;
        self.selected = keep
            .and_then(|n| self.row_of(n))
            .unwrap_or_else(|| self.tensors_row());
    }

    pub fn on_job(&mut self, r: &JobReport) {
        if !self.is_running() {
            return;
        }
        match r {
            JobReport::VerifyStarted { tensors, bytes } => {
                if let Some(run) = &mut self.run {
                    run.tensors_total = *tensors;
                    run.bytes_total = *bytes;
                }
            }
            JobReport::VerifyLink(l) => self.apply(l),
            JobReport::VerifyProgress { done, total } => {
                if let Some(run) = &mut self.run {
                    run.bytes_done = (*done).min(*total);
                    run.bytes_total = *total;
                }
            }
            JobReport::VerifyDone(report) => self.finish(report),
            // Other views' reports.
            _ => {}
        }
    }

    pub fn job_progress(&self) -> Option<(String, f64)> {
        if !self.is_running() {
            return None;
        }
        let run = self.run.as_ref()?;
        let frac = if run.bytes_total > 0 {
            run.bytes_done as f64 / run.bytes_total as f64
        } else if run.tensors_total > 0 {
            self.tensors_checked as f64 / run.tensors_total as f64
        } else {
            0.0
        };
        Some(("verify".into(), frac.clamp(0.0, 1.0)))
    }

    pub fn status(&self, _file: &CmfFile) -> (String, String) {
        let hint = "v verify · c cancel · Enter expand · f failing only".to_string();
        let run = self.run.as_ref();
        let status = match self.phase {
            Phase::Idle => "not verified yet".to_string(),
            Phase::Running if run.is_some_and(|r| r.cancel_requested) => "cancelling…".into(),
            Phase::Running => format!(
                "verifying… {}/{} tensors",
                self.tensors_checked, self.tensor_count
            ),
            Phase::Done => {
                let time = run
                    .and_then(|r| r.elapsed)
                    .map(|d| format!(" in {}", human_duration(d)))
                    .unwrap_or_default();
                if self.cancelled() {
                    format!(
                        "verify cancelled after {} of {} tensors",
                        self.tensors_checked, self.tensor_count
                    )
                } else if run.and_then(|r| r.report.as_ref()).is_some_and(|r| r.ok) {
                    format!("verified {} tensors{time} · OK", self.tensors_checked)
                } else {
                    let n = self.failing_links_count();
                    format!(
                        "verified {} tensors{time} · FAILED ({n} failing link{})",
                        self.tensors_checked,
                        if n == 1 { "" } else { "s" }
                    )
                }
            }
        };
        (status, hint)
    }

    fn failing_links_count(&self) -> usize {
        let f = |s: &Option<LinkStatus>| s.as_ref().is_some_and(LinkStatus::is_failure) as usize;
        f(&self.header)
            + f(&self.directory)
            + self.sections.iter().map(|s| f(&s.status)).sum::<usize>()
            + self.failing.len()
            + f(&self.signature)
    }

    pub fn render(&self, f: &mut Frame, area: Rect, file: &CmfFile, theme: &Theme) {
        let verdict = self.verdict(file);
        let total = self.total_rows();
        let capacity = view::tree_capacity(area, verdict.len());
        let offset = view::window_offset(self.offset, self.selected, total, capacity);
        let first = self.first_broken();
        // Only the visible window becomes rows: the tensor list may be 10⁵ long.
        let rows: Vec<ChainRow> = (offset..total.min(offset + capacity))
            .filter_map(|i| {
                let node = self.node_at(i)?;
                let mut r = self.row(node, file);
                r.first_broken = self.phase == Phase::Done && Some(node) == first;
                Some(r)
            })
            .collect();
        let (title, detail) = self
            .node_at(self.selected)
            .map(|n| self.detail(n, file))
            .unwrap_or_default();
        let top = self
            .sections
            .iter()
            .map(|s| s.kind.name().len() + " section".len())
            .chain(["directory".len()])
            .max()
            .unwrap_or(0);
        let name_width = if self.expanded && self.children() > 0 {
            top.max(2 + self.widest_tensor_name)
        } else {
            top
        };
        let vm = IntegrityVm {
            verdict: &verdict,
            rows: &rows,
            offset,
            name_width,
            total,
            selected: self.selected,
            detail_title: &title,
            detail: &detail,
        };
        view::render(f, area, &vm, theme);
    }
}

/// Decides which progress reports are worth sending.
struct ProgressThrottle {
    last_done: u64,
    last_at: Instant,
}

impl ProgressThrottle {
    fn admit(&mut self, done: u64, total: u64, now: Instant) -> bool {
        // Events come from several hashing threads and may arrive out of order.
        if done <= self.last_done || done > total {
            return false;
        }
        let step = (total / 1000 * PROGRESS_STEP_PER_MILLE).max(1);
        let send = done == total
            || done - self.last_done >= step
            || now.duration_since(self.last_at) >= PROGRESS_INTERVAL;
        if send {
            self.last_done = done;
            self.last_at = now;
        }
        send
    }
}

/// The worker: runs `verify` on a scoped thread (its event callback must be `Sync`, the
/// job's report function is not) and forwards events from there, progress throttled.
fn run_verify(
    file: &CmfFile,
    trusted_keys: Vec<[u8; 32]>,
    cancel: &AtomicBool,
    report: &dyn Fn(JobReport),
    finish: &Finish,
) {
    let start = Instant::now();
    let (tx, rx) = mpsc::channel::<VerifyEvent>();
    let outcome = std::thread::scope(|s| {
        let hashing = s.spawn(move || {
            let opts = VerifyOptions {
                payload_check: Some(quant::payload_check),
                signature: true,
                trusted_keys,
                cancel: Some(cancel),
            };
            verify(file, &opts, &|ev| {
                // The receiver lives until this thread ends.
                let _ = tx.send(ev);
                // An answer streaming in the chat has the cores: hashing waits for it.
                cortiq_engine::exec::yield_to_foreground(&|| {
                    cancel.load(std::sync::atomic::Ordering::Relaxed)
                });
            })
        });
        let mut throttle = ProgressThrottle {
            last_done: 0,
            last_at: start,
        };
        for ev in rx {
            match ev {
                VerifyEvent::Started {
                    tensors,
                    tensor_bytes,
                } => report(JobReport::VerifyStarted {
                    tensors,
                    bytes: tensor_bytes,
                }),
                VerifyEvent::Checked(l) => report(JobReport::VerifyLink(l)),
                VerifyEvent::Progress {
                    bytes_done,
                    bytes_total,
                } => {
                    if throttle.admit(bytes_done, bytes_total, Instant::now()) {
                        report(JobReport::VerifyProgress {
                            done: bytes_done,
                            total: bytes_total,
                        });
                    }
                }
                VerifyEvent::Finished => {}
            }
        }
        hashing.join()
    });
    let result = outcome.unwrap_or_else(|_| {
        log::error!("verify worker panicked");
        VerifyReport {
            ok: false,
            cancelled: false,
            first_failure: None,
            failures: Vec::new(),
            links: Vec::new(),
            signature: None,
            tensors_checked: 0,
            bytes_hashed: 0,
        }
    });
    let result = Arc::new(result);
    *finish.lock().unwrap_or_else(|e| e.into_inner()) = Some((start.elapsed(), result.clone()));
    report(JobReport::VerifyDone(result));
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::time::Duration;

    use cortiq_engine::format::verify::Link;
    use cortiq_engine::format::{CmfFile, SectionKind};

    use super::super::jobs::JobReport;
    use super::super::testing::{fixture, Harness};
    use super::super::{Action, App, Screen};
    use super::{IntegrityState, Phase, TrustedKeys};

    fn state(app: &App) -> &IntegrityState {
        match &app.screen {
            Screen::Model(m) => &m.integrity,
            _ => panic!("no model open"),
        }
    }

    fn state_mut(h: &mut Harness) -> &mut IntegrityState {
        match &mut h.app.screen {
            Screen::Model(m) => &mut m.integrity,
            _ => panic!("no model open"),
        }
    }

    fn done(app: &App) -> bool {
        state(app).phase == Phase::Done
    }

    /// The Integrity tab of `path`.
    fn open(path: &Path) -> Harness {
        let mut h = Harness::open(path);
        h.act(Action::GoTab(4));
        h
    }

    /// Runs verify to the end and pins the measured time, so screens are reproducible.
    fn run_to_end(h: &mut Harness) {
        h.act(Action::Verify);
        h.pump_until("verify done", done);
        let run = state_mut(h).run.as_mut().expect("a run");
        assert!(run.elapsed.is_some(), "the worker measures the run");
        run.elapsed = Some(Duration::from_micros(2500));
    }

    fn status_line(screen: &str) -> &str {
        screen.lines().last().unwrap_or("")
    }

    /// A copy of qwen3-q4.cmf with one byte flipped in the vocab section and in the data of
    /// two tensors; returns the names of those tensors.
    fn corrupt_copy(dir: &Path) -> (std::path::PathBuf, [String; 2]) {
        let src = fixture("qwen3-q4.cmf");
        let file = CmfFile::open(&src).expect("fixture opens");
        let mut bytes = std::fs::read(&src).unwrap();
        let mut names = [String::new(), String::new()];
        for (k, i) in [5usize, 30].into_iter().enumerate() {
            let e = &file.directory.entries[i];
            let at = (file.envelope.data.off + e.off + e.nbytes / 2) as usize;
            bytes[at] ^= 0x5a;
            names[k] = e.name.clone();
        }
        // An upper-case letter in a JSON key: the tokenizer still parses, the hash does not.
        let vocab = file.envelope.section(SectionKind::Vocab);
        let text = &bytes[vocab.off as usize..vocab.end() as usize];
        let at = vocab.off as usize
            + text
                .windows(7)
                .position(|w| w == b"version")
                .expect("the vocab has a version key");
        bytes[at] ^= 0x20;
        let out = dir.join("qwen3-q4-corrupt.cmf");
        std::fs::write(&out, bytes).unwrap();
        (out, names)
    }

    #[test]
    fn before_a_run_the_tree_shows_what_is_recorded() {
        let mut h = open(&fixture("qwen3-signed.cmf"));
        let screen = h.render();
        insta::assert_snapshot!("integrity_before_run", screen);
        assert!(screen.contains("not verified yet"), "{screen}");
        assert!(screen.contains("qwen3-signed.cmf.sig present"), "{screen}");
        assert!(
            status_line(&screen).contains("not verified yet"),
            "{screen}"
        );
        assert!(
            status_line(&screen).contains("v verify · c cancel · Enter expand"),
            "{screen}"
        );
        assert!(!h.app.jobs.is_running(super::JobKind::Verify));
        // Expanding the tensors node lists each tensor with its recorded hash.
        let file = CmfFile::open(fixture("qwen3-signed.cmf")).unwrap();
        let e = &file.directory.entries[0];
        h.acts([Action::End, Action::Up, Action::Enter]);
        let screen = h.render();
        assert!(screen.contains("▾ tensors"), "{screen}");
        assert!(screen.contains(&e.name), "{screen}");
        assert!(
            screen.contains(&format!("recorded {:016x}", e.hash)),
            "{screen}"
        );
    }

    #[test]
    fn an_ok_run_on_a_signed_file_says_ok_and_that_trust_was_not_checked() {
        let mut h = open(&fixture("qwen3-signed.cmf"));
        h.act(Action::Verify);
        assert!(h.render().contains("verifying"), "the run shows as running");
        h.pump_until("verify done", done);
        let run = state_mut(&mut h).run.as_mut().unwrap();
        run.elapsed = Some(Duration::from_micros(2500));
        let screen = h.render();
        insta::assert_snapshot!("integrity_ok_signed", screen);
        assert!(
            screen.contains("OK — every link of the chain holds"),
            "{screen}"
        );
        assert!(
            screen.contains(
                "valid for its own key dbec9ee0ff7684d0… — not checked against trusted keys"
            ),
            "{screen}"
        );
        assert!(
            status_line(&screen).contains("verified 47 tensors in 2.5 ms · OK"),
            "{screen}"
        );
        assert!(
            state(&h.app).job_progress().is_none(),
            "no gauge after the run"
        );
        assert!(!screen.contains("FAILED"), "{screen}");
    }

    #[test]
    fn a_corrupt_file_fails_at_the_vocab_section_and_lists_both_tensors() {
        let dir = tempfile::tempdir().unwrap();
        let (path, names) = corrupt_copy(dir.path());
        let mut h = open(&path);
        run_to_end(&mut h);
        let screen = h.render();
        insta::assert_snapshot!("integrity_failed", screen);
        let st = state(&h.app);
        let report = st.run.as_ref().unwrap().report.clone().unwrap();
        assert!(!report.ok && !report.cancelled);
        assert_eq!(
            report.first_failure.as_ref().map(|f| &f.link),
            Some(&Link::Section {
                section: SectionKind::Vocab
            })
        );
        let failing: Vec<&str> = report
            .failures
            .iter()
            .filter_map(|l| match &l.link {
                Link::Tensor { name, .. } => Some(name.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(failing, [names[0].as_str(), names[1].as_str()]);
        for n in &failing {
            assert!(screen.contains(n), "{n} listed\n{screen}");
        }
        assert!(
            screen.contains("FAILED: first broken link: vocab section"),
            "{screen}"
        );
        // The cursor is on the first broken link, marked in the tree.
        let vocab_row = screen
            .lines()
            .find(|l| l.contains("vocab section") && l.contains("✗ FAILED"))
            .expect("vocab row");
        assert!(vocab_row.contains("» "), "{vocab_row}");
        assert_eq!(st.selected, st.row_of(super::Node::Section(0)).unwrap());
        assert!(st.expanded, "failing tensors expand the tensors node");
        assert!(
            screen.contains(" vocab section "),
            "details of the selection\n{screen}"
        );
        assert!(
            status_line(&screen).contains("FAILED (3 failing links)"),
            "{screen}"
        );
        // f lists only the failing tensors under the tensors node.
        h.act(Action::Cycle);
        let screen = h.render();
        let tensor_rows: Vec<&str> = screen
            .lines()
            .filter(|l| l.starts_with("│      model."))
            .collect();
        assert_eq!(tensor_rows.len(), 2, "{screen}");
        assert!(
            tensor_rows.iter().all(|l| l.contains("✗ FAILED")),
            "{screen}"
        );
        h.act(Action::Cycle);
        assert_eq!(state(&h.app).total_rows(), 4 + 1 + 47 + 1);
    }

    #[test]
    fn cancel_stops_a_run_on_a_large_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bench.cmf");
        cortiq_engine::synth::write_bench_file(&path, 1024, 8).unwrap();
        let mut h = open(&path);
        // Hold the worker at its start so that the cancel lands before any hashing.
        let gate = h.app.jobs.gate();
        let held = gate.write().unwrap();
        h.act(Action::Verify).act(Action::Cancel);
        assert!(h.render().contains("cancelling"), "{}", h.render());
        drop(held);
        h.pump_until("cancelled run done", done);
        let st = state(&h.app);
        let report = st.run.as_ref().unwrap().report.clone().unwrap();
        assert!(report.cancelled && !report.ok);
        assert!(report.tensors_checked < 56, "{}", report.tensors_checked);
        let screen = h.render();
        assert!(screen.contains("cancelled after"), "{screen}");
        assert!(
            status_line(&screen).contains("verify cancelled"),
            "{screen}"
        );
        // A new run starts from a clean tree and finishes.
        h.act(Action::Verify);
        assert_eq!(state(&h.app).tensors_checked, 0);
        assert!(
            h.render().contains("· pending"),
            "re-running resets the tree"
        );
        h.pump_until("second run done", done);
        let report = state(&h.app).run.as_ref().unwrap().report.clone().unwrap();
        assert!(report.ok, "{:?}", report.first_failure);
        assert_eq!(report.tensors_checked, 56);
    }

    #[test]
    fn links_fill_the_tree_while_the_run_goes_on() {
        let mut h = open(&fixture("qwen3-q8.cmf"));
        h.act(Action::Verify);
        let mut seen_live = false;
        while !done(&h.app) {
            let a =
                h.rx.recv_timeout(Duration::from_secs(20))
                    .expect("a report within 20 s");
            let header_link = matches!(
                &a,
                Action::Job(JobReport::VerifyLink(l)) if l.link == Link::Header
            );
            h.app.update(a);
            if header_link {
                let screen = h.render();
                let header = screen.lines().find(|l| l.contains(" header ")).unwrap();
                assert!(header.contains("✓ ok"), "{screen}");
                assert!(screen.contains("verifying…"), "{screen}");
                assert_eq!(
                    state(&h.app).job_progress().map(|(l, _)| l),
                    Some("verify".to_string())
                );
                // The chrome's gauge replaces the hint while the run goes on.
                assert!(status_line(&screen).contains("verify"), "{screen}");
                assert!(!status_line(&screen).contains("Enter expand"), "{screen}");
                seen_live = true;
            }
        }
        assert!(seen_live, "the header link arrived before the end");
        assert!(status_line(&h.render()).contains("· OK"));
    }

    #[test]
    fn progress_reports_are_throttled_and_never_exceed_the_total() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("many.cmf");
        // 14,000 small tensors: one progress event each from the engine.
        cortiq_engine::synth::write_bench_file(&path, 16, 2000).unwrap();
        let mut h = open(&path);
        h.act(Action::Verify);
        let (mut progress, mut links, mut last) = (0usize, 0usize, 0u64);
        let start = std::time::Instant::now();
        while !done(&h.app) {
            let a =
                h.rx.recv_timeout(Duration::from_secs(20))
                    .expect("a report within 20 s");
            if let Action::Job(r) = &a {
                match r {
                    JobReport::VerifyProgress { done, total } => {
                        assert!(done <= total, "{done} > {total}");
                        assert!(*done > last, "progress goes forward");
                        last = *done;
                        progress += 1;
                        if let Some((label, frac)) = state(&h.app).job_progress() {
                            assert_eq!(label, "verify");
                            assert!((0.0..=1.0).contains(&frac));
                        }
                    }
                    JobReport::VerifyLink(_) => links += 1,
                    _ => {}
                }
            }
            h.app.update(a);
        }
        let ms = start.elapsed().as_millis() as usize;
        assert_eq!(links, 14_000 + 3, "header, directory, tensors, signature");
        assert!(
            progress <= 101 + ms / 30,
            "{progress} progress reports in {ms} ms"
        );
        let report = state(&h.app).run.as_ref().unwrap().report.clone().unwrap();
        assert_eq!(last, report.bytes_hashed, "the last report is the total");
    }

    #[test]
    fn navigation_moves_expands_and_stays_virtual_on_many_tensors() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("many.cmf");
        cortiq_engine::synth::write_bench_file(&path, 16, 15_000).unwrap();
        let mut h = open(&path);
        let n = 105_000;
        // envelope, header, directory, tensors, signature
        assert_eq!(state(&h.app).total_rows(), 5);
        h.acts([Action::Down, Action::Down, Action::Down, Action::Right]);
        assert_eq!(state(&h.app).total_rows(), 5 + n);
        h.act(Action::Right); // into the first tensor
        assert_eq!(state(&h.app).selected, 4);
        h.act(Action::End);
        let screen = h.render();
        assert!(screen.contains("signature"), "{screen}");
        assert!(
            screen.contains("model.layers.14999.down_proj.weight"),
            "{screen}"
        );
        assert!(screen.contains(&format!("of {}", n + 5)), "{screen}");
        h.act(Action::PageUp);
        let page = state(&h.app).selected;
        assert!(page < n + 4 && page > n - 40, "{page}");
        h.act(Action::PageDown);
        assert_eq!(state(&h.app).selected, n + 4);
        h.act(Action::Home);
        assert_eq!(state(&h.app).selected, 0);
        h.act(Action::ScrollDown).act(Action::ScrollDown);
        assert_eq!(state(&h.app).selected, 2);
        h.act(Action::ScrollUp);
        assert_eq!(state(&h.app).selected, 1);
        // Rendering builds only the visible window of rows: many frames stay fast.
        h.acts([Action::End, Action::Up, Action::Up]);
        let t = std::time::Instant::now();
        for _ in 0..20 {
            h.act(Action::Up);
            h.render();
        }
        let per_frame = t.elapsed() / 20;
        assert!(
            per_frame < Duration::from_millis(100),
            "{per_frame:?} per frame"
        );
        // Left on a tensor goes to its parent; Left there collapses.
        h.act(Action::Left);
        assert_eq!(state(&h.app).selected, 3);
        h.act(Action::Left);
        assert_eq!(state(&h.app).total_rows(), 5);
        // Click selects the row under the pointer.
        let screen = h.render();
        let y = screen
            .lines()
            .position(|l| l.contains("directory") && l.contains("pending"))
            .expect("directory row") as u16;
        h.act(Action::Click(10, y));
        assert_eq!(state(&h.app).selected, 2);
        // Clicking the selected tensors node toggles it.
        let y = screen
            .lines()
            .position(|l| l.contains("▸ tensors"))
            .expect("tensors row") as u16;
        h.act(Action::Click(10, y)).act(Action::Click(10, y));
        assert!(state(&h.app).expanded);
        // f with nothing failing says so instead of emptying the list.
        h.act(Action::Cycle);
        assert!(h.render().contains("no failing tensors"), "{}", h.render());
    }

    #[test]
    fn verify_while_running_is_refused_and_cancel_when_idle_says_so() {
        let mut h = open(&fixture("qwen3-q8.cmf"));
        h.act(Action::Cancel);
        assert!(h.render().contains("no verify run to cancel"));
        h.act(Action::Verify).act(Action::Verify);
        let screen = h.render();
        assert!(
            screen.contains("already in progress") || done(&h.app),
            "{screen}"
        );
        h.pump_until("verify done", done);
        assert!(
            state(&h.app)
                .run
                .as_ref()
                .unwrap()
                .report
                .as_ref()
                .unwrap()
                .ok
        );
    }

    #[test]
    fn trusted_keys_decide_what_the_signature_says() {
        let key = "dbec9ee0ff7684d058a71d71a4d8093a9463763bed813aa32761b473411ad3f5";
        let t = TrustedKeys::parse(&format!(" {key} ,, nothex"));
        assert_eq!(t.keys.len(), 1);
        assert_eq!(t.problems.len(), 1);
        assert!(t.problems[0].contains("entry 3"), "{:?}", t.problems);

        let mut h = open(&fixture("qwen3-signed.cmf"));
        state_mut(&mut h).trusted = TrustedKeys::parse(key);
        run_to_end(&mut h);
        let screen = h.render();
        assert!(screen.contains("signed and trusted"), "{screen}");
        assert!(screen.contains("1 from CORTIQ_TRUSTED_KEYS"), "{screen}");

        let mut h = open(&fixture("qwen3-signed.cmf"));
        state_mut(&mut h).trusted = TrustedKeys::parse(&"11".repeat(32));
        run_to_end(&mut h);
        let screen = h.render();
        assert!(screen.contains("signed by an UNTRUSTED key"), "{screen}");
        assert!(
            screen.contains("FAILED: first broken link: signature"),
            "{screen}"
        );

        let mut h = open(&fixture("qwen3-q4.cmf"));
        run_to_end(&mut h);
        let screen = h.render();
        assert!(
            screen.contains("unsigned — no qwen3-q4.cmf.sig"),
            "{screen}"
        );
        assert!(screen.contains("OK"), "{screen}");
    }

    #[test]
    fn names_from_the_file_are_escaped_everywhere() {
        use cortiq_engine::format::writer::{StreamWriter, TensorPlan, WriteSpec};
        use cortiq_engine::format::{DType, Header};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("evil.cmf");
        let name = "evil\u{1b}[2J\u{7}.weight";
        let spec = WriteSpec {
            header: Header {
                format: Some("cmf".into()),
                version: Some(2),
                ..Default::default()
            },
            tensors: vec![TensorPlan {
                name: name.into(),
                dtype: DType::F32,
                shape: vec![4],
            }],
            ..Default::default()
        };
        let mut w = StreamWriter::create(&path, spec).unwrap();
        w.write_tensor(&[0u8; 16]).unwrap();
        w.finish().unwrap();
        // Break the tensor so its name also reaches the verdict and the details.
        let file = CmfFile::open(&path).unwrap();
        let at = (file.envelope.data.off + file.directory.entries[0].off) as usize;
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[at] ^= 1;
        std::fs::write(&path, bytes).unwrap();
        let mut h = open(&path);
        run_to_end(&mut h);
        let screen = h.render();
        assert!(
            screen.contains("FAILED: first broken link: tensor evil"),
            "{screen}"
        );
        assert!(
            !screen.contains('\u{1b}') && !screen.contains('\u{7}'),
            "{screen}"
        );
        assert!(screen.contains("evil\\u{1b}[2J\\u{7}.weight"), "{screen}");
    }
}
