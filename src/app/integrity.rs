//! State of the Integrity view: the hash chain of spec §8.1 (envelope → header → directory
//! → sections → tensors → signature) with what the file records for each link, and a
//! verify run on a worker thread whose results fill the tree as they arrive. A sharded
//! model (§10) has one chain per shard: the tree groups them under a row per shard, the
//! run verifies them one after another and the verdict covers the whole set.
//!
//! A run is sequential: `v` while one runs is refused, and after `c` the view waits for the
//! cancelled run's last report before it starts another. Reports carry no run id, so this
//! keeps a late report of an old run from landing in a new run's tree.

use std::sync::atomic::AtomicBool;
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use cortiq_engine::format::digests::StrongDigests;
use cortiq_engine::format::signature::{self, SignatureStatus};
use cortiq_engine::format::verify::{
    english_list, verify, Link, LinkResult, LinkStatus, VerifyEvent, VerifyOptions, VerifyReport,
};
use cortiq_engine::format::{feature, CmfFile, CmfModel, SectionKind};
use cortiq_engine::quant;
use cortiq_views::integrity::{self as view, ChainRow, IntegrityVm, Mark, Note, Tone};
use cortiq_views::util::{human_bytes, shape_str};
use cortiq_views::Theme;
use ratatui::layout::Rect;
use ratatui::Frame;

use super::jobs::{JobKind, JobReport};
use super::{Action, Ctx};
use crate::trust::TrustedKeys;

/// Failing links listed one per line in the verdict; the rest are counted.
const FAILURES_LISTED: usize = 6;

/// Progress reports are sent at most once per this share of the bytes or this interval, so
/// a file with 10⁵ small tensors does not flood the channel.
const PROGRESS_STEP_PER_MILLE: u64 = 10;
const PROGRESS_INTERVAL: Duration = Duration::from_millis(30);

/// A present masks/vocab/index section and its `section_hashes` entry.
struct SectionNode {
    kind: SectionKind,
    recorded: Option<String>,
    status: Option<LinkStatus>,
}

/// One row of a file's chain, in chain order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Node {
    /// The group row of a shard (a sharded model only).
    Shard,
    Envelope,
    Header,
    Directory,
    /// Index into the chain's `sections`.
    Section(usize),
    Tensors,
    /// Index into the shard's own directory.
    Tensor(usize),
    Signature,
}

/// A row of the tree: a node of shard `shard`'s chain (0 for a single file).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct At {
    shard: usize,
    node: Node,
}

impl At {
    fn new(shard: usize, node: Node) -> At {
        At { shard, node }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Idle,
    Running,
    Done,
}

/// What a run found over the whole model: every shard's chain, one after another (§10:
/// each shard is a complete file with its own hashes).
#[derive(Debug, PartialEq)]
pub struct SetReport {
    /// One engine report per shard verified, in shard order (fewer when cancelled).
    pub shards: Vec<VerifyReport>,
    /// Every shard verified and every link held.
    pub ok: bool,
    pub cancelled: bool,
}

impl SetReport {
    pub fn tensors_checked(&self) -> usize {
        self.shards.iter().map(|r| r.tensors_checked).sum()
    }

    pub fn bytes_hashed(&self) -> u64 {
        self.shards.iter().map(|r| r.bytes_hashed).sum()
    }
}

/// What the worker leaves for the view beside its final report: how long the run took
/// (measured on the worker, so the UI's frame pacing does not count) and the report itself,
/// by which the view tells its own run's last report from a stale one.
type Finish = Mutex<Option<(Duration, Arc<SetReport>)>>;

struct Run {
    finish: Arc<Finish>,
    tensors_total: usize,
    bytes_total: u64,
    bytes_done: u64,
    /// The shard whose chain the worker is on.
    shard: usize,
    cancel_requested: bool,
    elapsed: Option<Duration>,
    report: Option<Arc<SetReport>>,
}

/// One file's chain and what a run found in it: the whole tree for a single file, one
/// group of it per shard for a sharded model.
struct Chain {
    file: Arc<CmfFile>,
    file_name: String,
    has_path: bool,
    sig_present: bool,
    /// The header carries well-formed strong digests (read once: a header may hold 10⁵).
    strong_digests: bool,
    sections: Vec<SectionNode>,
    tensor_count: usize,
    tensor_bytes: u64,
    /// Characters in the longest tensor name (the tree's name column follows it).
    widest_tensor_name: usize,
    /// Its tensors node is open.
    expanded: bool,
    header: Option<LinkStatus>,
    directory: Option<LinkStatus>,
    tensors: Vec<Option<LinkStatus>>,
    tensors_checked: usize,
    /// Failing tensors, directory order.
    failing: Vec<usize>,
    signature: Option<LinkStatus>,
    /// From the run's report of this file: the signature's meaning, and whether every
    /// link held (`None` until the run has finished this file).
    sig_status: Option<SignatureStatus>,
    verified: Option<bool>,
}

impl Chain {
    fn new(file: &Arc<CmfFile>) -> Chain {
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
        // A section the hashed header records but the envelope lacks (cut out) is a node
        // too: verify reports it as a broken link.
        let sections = [SectionKind::Masks, SectionKind::Vocab, SectionKind::Index]
            .into_iter()
            .map(|kind| SectionNode {
                kind,
                recorded: hashes.and_then(|h| match kind {
                    SectionKind::Masks => h.masks.clone(),
                    SectionKind::Vocab => h.vocab.clone(),
                    _ => h.index.clone(),
                }),
                status: None,
            })
            .filter(|s| file.envelope.section(s.kind).is_present() || file.section_cut_out(s.kind))
            .collect();
        let n = file.directory.len();
        Chain {
            file: Arc::clone(file),
            file_name,
            has_path: file.path.is_some(),
            sig_present,
            strong_digests: matches!(StrongDigests::of_header(&file.header), Some(Ok(_))),
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
            header: None,
            directory: None,
            tensors: vec![None; n],
            tensors_checked: 0,
            failing: Vec::new(),
            signature: None,
            sig_status: None,
            verified: None,
        }
    }

    fn children(&self, failing_only: bool) -> usize {
        match (self.expanded, failing_only) {
            (false, _) => 0,
            (true, true) => self.failing.len(),
            (true, false) => self.tensor_count,
        }
    }

    fn tensors_row(&self) -> usize {
        3 + self.sections.len()
    }

    fn rows(&self, failing_only: bool) -> usize {
        self.tensors_row() + 1 + self.children(failing_only) + 1
    }

    fn node_at(&self, row: usize, failing_only: bool) -> Option<Node> {
        let t = self.tensors_row();
        let kids = self.children(failing_only);
        Some(match row {
            0 => Node::Envelope,
            1 => Node::Header,
            2 => Node::Directory,
            r if r < t => Node::Section(r - 3),
            r if r == t => Node::Tensors,
            r if r <= t + kids => {
                let k = r - t - 1;
                Node::Tensor(if failing_only { self.failing[k] } else { k })
            }
            r if r == t + kids + 1 => Node::Signature,
            _ => return None,
        })
    }

    fn row_of(&self, node: Node, failing_only: bool) -> Option<usize> {
        let t = self.tensors_row();
        Some(match node {
            Node::Shard => return None,
            Node::Envelope => 0,
            Node::Header => 1,
            Node::Directory => 2,
            Node::Section(i) => 3 + i,
            Node::Tensors => t,
            Node::Tensor(i) => {
                if !self.expanded {
                    return None;
                }
                let k = if failing_only {
                    self.failing.binary_search(&i).ok()?
                } else {
                    i
                };
                t + 1 + k
            }
            Node::Signature => t + self.children(failing_only) + 1,
        })
    }

    fn node_of_link(&self, link: &Link) -> Option<Node> {
        match link {
            // The field lives in the header: its failure is the header's.
            Link::Header | Link::StrongDigests => Some(Node::Header),
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

    /// Failing links as `(what, status)`, each name after `prefix`.
    fn failing_links(&self, prefix: &str, v: &mut Vec<(String, LinkStatus)>) {
        let mut push = |name: String, s: &Option<LinkStatus>| {
            if let Some(s) = s.as_ref().filter(|s| s.is_failure()) {
                v.push((format!("{prefix}{name}"), s.clone()));
            }
        };
        push("header".into(), &self.header);
        push("directory".into(), &self.directory);
        for s in &self.sections {
            push(format!("{} section", s.kind.name()), &s.status);
        }
        for &i in &self.failing {
            let name = self
                .file
                .directory
                .entries
                .get(i)
                .map(|e| e.name.as_str())
                .unwrap_or("?");
            push(format!("tensor {name}"), &self.tensors[i]);
        }
        push("signature".into(), &self.signature);
    }

    fn failing_count(&self) -> usize {
        let f = |s: &Option<LinkStatus>| s.as_ref().is_some_and(LinkStatus::is_failure) as usize;
        f(&self.header)
            + f(&self.directory)
            + self.sections.iter().map(|s| f(&s.status)).sum::<usize>()
            + self.failing.len()
            + f(&self.signature)
    }

    /// The hash links with nothing recorded to check, described as `verify` does.
    fn unhashed_links(&self) -> Vec<String> {
        let un = |s: &Option<LinkStatus>| matches!(s, Some(LinkStatus::Unchecked { .. }));
        let mut v = Vec::new();
        if un(&self.header) {
            v.push(Link::Header.describe());
        }
        if un(&self.directory) {
            v.push(Link::Directory.describe());
        }
        for s in self.sections.iter().filter(|s| un(&s.status)) {
            v.push(Link::Section { section: s.kind }.describe());
        }
        v
    }

    fn reset(&mut self) {
        self.header = None;
        self.directory = None;
        for s in &mut self.sections {
            s.status = None;
        }
        self.tensors.iter_mut().for_each(|t| *t = None);
        self.tensors_checked = 0;
        self.failing.clear();
        self.signature = None;
        self.sig_status = None;
        self.verified = None;
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

    /// Whether the signature line can say "unsigned" without a run (no `.sig`, or the
    /// run found none).
    fn unsigned(&self) -> bool {
        match &self.sig_status {
            Some(st) => matches!(st, SignatureStatus::Unsigned),
            None => self.has_path && !self.sig_present,
        }
    }
}

pub struct IntegrityState {
    /// One per shard, in order; a single file has one.
    chains: Vec<Chain>,
    /// Which shard groups are open (a sharded model).
    open: Vec<bool>,
    pub trusted: TrustedKeys,
    /// Over every shard.
    tensor_count: usize,
    tensor_bytes: u64,
    /// Show only failing tensors under the tensors nodes.
    failing_only: bool,
    selected: usize,
    offset: usize,
    phase: Phase,
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
                "valid, but by an UNTRUSTED key {} — no trusted keys are set (see below)",
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
    pub fn new(model: &CmfModel) -> IntegrityState {
        let chains: Vec<Chain> = model.shards.iter().map(Chain::new).collect();
        IntegrityState {
            open: vec![true; chains.len()],
            trusted: TrustedKeys::load(),
            tensor_count: chains.iter().map(|c| c.tensor_count).sum(),
            tensor_bytes: chains.iter().map(|c| c.tensor_bytes).sum(),
            chains,
            failing_only: false,
            selected: 0,
            offset: 0,
            phase: Phase::Idle,
            run: None,
        }
    }

    // ---- the tree's rows -------------------------------------------------------------

    /// A sharded model: each shard's chain is a group under its own row.
    fn grouped(&self) -> bool {
        self.chains.len() > 1
    }

    /// `shard k/n`, as rows and messages name a shard.
    fn shard_label(&self, s: usize) -> String {
        format!("shard {}/{}", s + 1, self.chains.len())
    }

    /// Rows of shard `s`: its chain, under its group row when grouped.
    fn height(&self, s: usize) -> usize {
        let c = &self.chains[s];
        if !self.grouped() {
            return c.rows(self.failing_only);
        }
        1 + if self.open[s] {
            c.rows(self.failing_only)
        } else {
            0
        }
    }

    fn total_rows(&self) -> usize {
        (0..self.chains.len()).map(|s| self.height(s)).sum()
    }

    fn node_at(&self, mut row: usize) -> Option<At> {
        for (s, c) in self.chains.iter().enumerate() {
            let h = self.height(s);
            if row < h {
                if self.grouped() {
                    if row == 0 {
                        return Some(At::new(s, Node::Shard));
                    }
                    row -= 1;
                }
                return c.node_at(row, self.failing_only).map(|n| At::new(s, n));
            }
            row -= h;
        }
        None
    }

    fn row_of(&self, at: At) -> Option<usize> {
        let c = self.chains.get(at.shard)?;
        let base: usize = (0..at.shard).map(|s| self.height(s)).sum();
        if !self.grouped() {
            return c.row_of(at.node, self.failing_only).map(|r| base + r);
        }
        if at.node == Node::Shard {
            return Some(base);
        }
        if !self.open[at.shard] {
            return None;
        }
        c.row_of(at.node, self.failing_only).map(|r| base + 1 + r)
    }

    /// The first failing link in chain order (shard by shard), from what has arrived.
    fn first_broken(&self) -> Option<At> {
        self.chains
            .iter()
            .enumerate()
            .find_map(|(s, c)| c.first_broken().map(|n| At::new(s, n)))
    }

    fn failing_links(&self) -> Vec<(String, LinkStatus)> {
        let mut v = Vec::new();
        for (s, c) in self.chains.iter().enumerate() {
            let prefix = if self.grouped() {
                format!("{}: ", self.shard_label(s))
            } else {
                String::new()
            };
            c.failing_links(&prefix, &mut v);
        }
        v
    }

    fn any_failing_tensor(&self) -> bool {
        self.chains.iter().any(|c| !c.failing.is_empty())
    }

    fn tensors_checked(&self) -> usize {
        self.chains.iter().map(|c| c.tensors_checked).sum()
    }

    fn is_running(&self) -> bool {
        self.phase == Phase::Running
    }

    fn report(&self) -> Option<&Arc<SetReport>> {
        self.run.as_ref()?.report.as_ref()
    }

    fn cancelled(&self) -> bool {
        self.report().is_some_and(|r| r.cancelled)
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

    fn row(&self, at: At) -> ChainRow {
        let c = &self.chains[at.shard];
        let env = &c.file.envelope;
        // A shard's chain sits one level below its group row.
        let d = u16::from(self.grouped());
        let (depth, expand, name, (mark, detail)) = match at.node {
            Node::Shard => {
                let size = format!(
                    "{} · {} tensors · {}",
                    c.file_name,
                    c.tensor_count,
                    human_bytes(c.tensor_bytes)
                );
                let failing = c.failing_count();
                let cell = if failing > 0 {
                    (
                        Mark::Failed,
                        format!(
                            "{size} · {failing} failing link{}",
                            if failing == 1 { "" } else { "s" }
                        ),
                    )
                } else {
                    match c.verified {
                        Some(true) => (Mark::Ok, format!("{size} · every link holds")),
                        Some(false) if self.cancelled() => (
                            Mark::Skipped,
                            format!(
                                "{size} · cancelled part-way ({} checked)",
                                c.tensors_checked
                            ),
                        ),
                        Some(false) => (
                            Mark::Failed,
                            format!("{size} · the run stopped here (see the log)"),
                        ),
                        None if self.is_running()
                            && self.run.as_ref().is_some_and(|r| r.shard == at.shard) =>
                        {
                            (
                                Mark::Pending,
                                format!(
                                    "{size} · verifying… {} of {} checked",
                                    c.tensors_checked, c.tensor_count
                                ),
                            )
                        }
                        None => match self.unreached(String::new()) {
                            (Mark::Pending, _) => (Mark::Pending, size),
                            (mark, why) => (mark, format!("{size} · {why}")),
                        },
                    }
                };
                (
                    0,
                    Some(self.open[at.shard]),
                    self.shard_label(at.shard),
                    cell,
                )
            }
            Node::Envelope => (
                d,
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
                let (name, recorded, status, extra) = if at.node == Node::Header {
                    ("header", env.header_hash, &c.header, String::new())
                } else {
                    (
                        "directory",
                        env.dir_hash,
                        &c.directory,
                        format!(" · {} records", c.tensor_count),
                    )
                };
                let cell =
                    match status {
                        Some(s) => cell(s, format!("{recorded:016x} matches{extra}")),
                        None if recorded == 0 => self
                            .unreached(format!("not recorded (the envelope's hash is 0){extra}")),
                        None => self
                            .unreached(format!("recorded {recorded:016x} in the envelope{extra}")),
                    };
                (d, None, name.to_string(), cell)
            }
            Node::Section(i) => {
                let s = &c.sections[i];
                let cell = match (&s.status, &s.recorded) {
                    (Some(st), rec) => cell(
                        st,
                        format!("{} matches", rec.as_deref().unwrap_or("the hash")),
                    ),
                    (None, Some(rec)) => {
                        self.unreached(format!("recorded {rec} in the header's section_hashes"))
                    }
                    (None, None) => self.unreached("no hash recorded in section_hashes".into()),
                };
                (d, None, format!("{} section", s.kind.name()), cell)
            }
            Node::Tensors => {
                let size = format!(
                    "{} tensors · {}",
                    c.tensor_count,
                    human_bytes(c.tensor_bytes)
                );
                let cell = if !c.failing.is_empty() {
                    (
                        Mark::Failed,
                        if c.tensors_checked == c.tensor_count {
                            format!("{} of {} FAILED", c.failing.len(), c.tensor_count)
                        } else {
                            format!(
                                "{} of {} FAILED · {} checked so far",
                                c.failing.len(),
                                c.tensor_count,
                                c.tensors_checked
                            )
                        },
                    )
                } else if c.tensors_checked == c.tensor_count && self.phase != Phase::Idle {
                    (Mark::Ok, format!("all {size} match"))
                } else {
                    match self.phase {
                        Phase::Idle => (
                            Mark::Pending,
                            format!(
                                "{size}{}",
                                if c.expanded {
                                    ""
                                } else {
                                    " · Enter lists them"
                                }
                            ),
                        ),
                        Phase::Running => (
                            Mark::Pending,
                            format!("{} of {} checked", c.tensors_checked, c.tensor_count),
                        ),
                        Phase::Done => (
                            Mark::Skipped,
                            format!(
                                "{} of {} checked before the run stopped",
                                c.tensors_checked, c.tensor_count
                            ),
                        ),
                    }
                };
                (d, Some(c.expanded), "tensors".to_string(), cell)
            }
            Node::Tensor(i) => {
                let (name, recorded, nbytes) = c
                    .file
                    .directory
                    .entries
                    .get(i)
                    .map(|e| (e.name.clone(), e.hash, e.nbytes))
                    .unwrap_or_default();
                let cell = match &c.tensors[i] {
                    Some(s) => cell(
                        s,
                        format!("{recorded:016x} matches · {}", human_bytes(nbytes)),
                    ),
                    None => self.unreached(format!(
                        "recorded {recorded:016x} · {}",
                        human_bytes(nbytes)
                    )),
                };
                (d + 1, None, name, cell)
            }
            Node::Signature => {
                let sig = format!("{}.sig", c.file_name);
                let cell = match (&c.signature, &c.sig_status) {
                    (Some(_), Some(st)) => match st {
                        SignatureStatus::Unsigned => {
                            (Mark::Unchecked, format!("unsigned: no {sig}"))
                        }
                        SignatureStatus::Trusted { .. } => (Mark::Ok, "signed and trusted".into()),
                        SignatureStatus::SelfConsistent { .. } => (
                            Mark::Unchecked,
                            "valid, by an untrusted key (none set)".into(),
                        ),
                        SignatureStatus::UntrustedKey { .. } => {
                            (Mark::Failed, "signed by an UNTRUSTED key".into())
                        }
                        SignatureStatus::Invalid { reason } => {
                            (Mark::Failed, format!("INVALID: {reason}"))
                        }
                    },
                    (Some(s), None) => cell(s, "ok".into()),
                    (None, _) if !c.has_path => (
                        Mark::Unchecked,
                        "a file in memory has no .sig beside it".into(),
                    ),
                    (None, _) if c.sig_present => self.unreached(format!("{sig} present")),
                    (None, _) => self.unreached(format!("no {sig} beside the file")),
                };
                (d, None, "signature".to_string(), cell)
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

    // ---- the verdict and the details ---------------------------------------------------

    fn verdict(&self) -> Vec<Note> {
        let mut v = Vec::new();
        let run = self.run.as_ref();
        let n = self.chains.len();
        let checked = self.tensors_checked();
        match self.phase {
            Phase::Idle => v.push(Note::new(
                "verdict",
                if self.grouped() {
                    format!(
                        "not verified yet — v hashes each of the {n} shards' chains in turn \
                         ({} tensors, {})",
                        self.tensor_count,
                        human_bytes(self.tensor_bytes)
                    )
                } else {
                    format!(
                        "not verified yet — v hashes the whole chain ({} tensors, {})",
                        self.tensor_count,
                        human_bytes(self.tensor_bytes)
                    )
                },
                Tone::Plain,
            )),
            Phase::Running => {
                let r = run.map(|r| r.cancel_requested).unwrap_or(false);
                let shard = match run {
                    Some(run) if self.grouped() => format!(" · {}", self.shard_label(run.shard)),
                    _ => String::new(),
                };
                v.push(Note::new(
                    "verdict",
                    if r {
                        "cancelling… waiting for the workers to stop".to_string()
                    } else {
                        format!(
                            "verifying… {checked} of {} tensors checked{shard}",
                            self.tensor_count
                        )
                    },
                    Tone::Busy,
                ));
            }
            Phase::Done => {
                let report = self.report();
                let fails = self.failing_links();
                let first = self.first_broken();
                let all = if self.grouped() {
                    format!(" in all {n} shards")
                } else {
                    String::new()
                };
                if report.is_some_and(|r| r.ok) {
                    let mut unhashed: Vec<String> = Vec::new();
                    for c in &self.chains {
                        for l in c.unhashed_links() {
                            if !unhashed.contains(&l) {
                                unhashed.push(l);
                            }
                        }
                    }
                    if unhashed.is_empty() {
                        v.push(Note::new(
                            "verdict",
                            format!("OK — every link of the chain holds{all}"),
                            Tone::Ok,
                        ));
                    } else {
                        // Less than a full chain: say what went unchecked, as a warning.
                        v.push(Note::new(
                            "verdict",
                            format!(
                                "OK, but {} {} unhashed (nothing recorded to check) — \
                                 every recorded hash matches{all}",
                                english_list(&unhashed),
                                if unhashed.len() == 1 { "is" } else { "are" }
                            ),
                            Tone::Warn,
                        ));
                    }
                } else if self.cancelled() {
                    v.push(Note::new(
                        "verdict",
                        format!(
                            "cancelled after {checked} of {} tensors — nothing is proven; v runs again",
                            self.tensor_count
                        ),
                        Tone::Warn,
                    ));
                } else if let Some(at) = first {
                    let row = self.row(at);
                    let mut what = match at.node {
                        Node::Tensor(_) => format!("tensor {}", row.name),
                        _ => row.name.clone(),
                    };
                    // The file name goes last: on a narrow screen the shard row names it.
                    let mut file = String::new();
                    if self.grouped() {
                        what.push_str(&format!(" in {}", self.shard_label(at.shard)));
                        file = format!(" — {}", self.chains[at.shard].file_name);
                    }
                    let n = fails.len();
                    v.push(Note::new(
                        "verdict",
                        format!(
                            "FAILED: first broken link: {what} ({n} failing link{}){file}",
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
                        r.tensors_checked(),
                        self.tensor_count,
                        human_bytes(r.bytes_hashed())
                    );
                    if self.grouped() {
                        text.push_str(&format!(" · {} of {n} shards", r.shards.len()));
                    }
                    if let Some(d) = run.elapsed {
                        let secs = d.as_secs_f64();
                        text.push_str(&format!(" in {}", human_duration(d)));
                        if secs > 0.0 {
                            text.push_str(&format!(
                                " · {}/s",
                                human_bytes((r.bytes_hashed() as f64 / secs) as u64)
                            ));
                        }
                    }
                    v.push(Note::new("hashed", text, Tone::Plain));
                }
            }
        }
        if self.grouped() && self.chains.iter().all(Chain::unsigned) {
            // One line for the common case; a signed set gets a line per shard.
            v.push(Note::new(
                "signature",
                format!("unsigned — no .sig beside any of the {n} shard files"),
                Tone::Dim,
            ));
        } else {
            for (s, c) in self.chains.iter().enumerate() {
                let (text, tone) = self.signature_note(c);
                let (label, text) = if self.grouped() {
                    let label = if s == 0 { "signature" } else { "" };
                    (label, format!("{}: {text}", self.shard_label(s)))
                } else {
                    ("signature", text)
                };
                v.push(Note::new(label, text, tone));
            }
        }
        v.push(Note::new("trusted", self.trusted.describe(), Tone::Dim));
        for p in &self.trusted.problems {
            v.push(Note::new("", p.clone(), Tone::Warn));
        }
        let with = self.chains.iter().filter(|c| c.strong_digests).count();
        let (text, tone) = match (with, self.chains.len()) {
            (0, _) => (
                "none — hash64 alone cannot see two swapped 8-byte words".to_string(),
                Tone::Warn,
            ),
            (w, n) if w == n => (
                "BLAKE3 of every tensor and section, checked beside hash64".to_string(),
                Tone::Dim,
            ),
            (w, n) => (
                format!("in {w} of {n} shards; the others rely on hash64 alone"),
                Tone::Warn,
            ),
        };
        v.push(Note::new("digests", text, tone));
        v
    }

    /// What the signature of one file says.
    fn signature_note(&self, c: &Chain) -> (String, Tone) {
        let sig_name = format!("{}.sig", c.file_name);
        match &c.sig_status {
            Some(st) => trust_statement(st, &sig_name, self.trusted.keys.len()),
            None if !c.has_path => ("a file in memory has no .sig beside it".into(), Tone::Dim),
            None if c.sig_present => (
                format!("{sig_name} present — a run checks it (§8.2)"),
                Tone::Plain,
            ),
            None => (
                format!("unsigned — no {sig_name} beside the file"),
                Tone::Dim,
            ),
        }
    }

    fn status_line(&self, s: &Option<LinkStatus>) -> String {
        match s {
            Some(s) => describe_status(s),
            None if self.is_running() => "pending — the run has not reached it yet".into(),
            None => self.unreached("pending — v runs the chain".into()).1,
        }
    }

    fn detail(&self, at: At) -> (String, Vec<(String, String)>) {
        let c = &self.chains[at.shard];
        let env = &c.file.envelope;
        let range = |off: u64, len: u64| {
            format!("file 0x{off:x}..0x{:x} · {}", off + len, human_bytes(len))
        };
        let kv = |k: &str, v: String| (k.to_string(), v);
        // Inside a shard group, titles say whose link it is.
        let of = if self.grouped() {
            format!(" · {}", self.shard_label(at.shard))
        } else {
            String::new()
        };
        match at.node {
            Node::Shard => {
                let status = if c.failing_count() > 0 {
                    format!("{} failing link(s)", c.failing_count())
                } else {
                    match c.verified {
                        Some(true) => "every link holds".into(),
                        Some(false) => "the run was cancelled part-way".into(),
                        None => self.status_line(&None),
                    }
                };
                (
                    self.shard_label(at.shard),
                    vec![
                        kv("file", c.file_name.clone()),
                        kv(
                            "tensors",
                            format!("{} · {}", c.tensor_count, human_bytes(c.tensor_bytes)),
                        ),
                        kv(
                            "chain",
                            "its own envelope, header, directory and hashes: \
                             a shard verifies on its own (§10)"
                                .into(),
                        ),
                        kv("status", status),
                    ],
                )
            }
            Node::Envelope => (
                format!("envelope{of}"),
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
                let header = at.node == Node::Header;
                let (sec, recorded, where_, status) = if header {
                    (env.header, env.header_hash, "0x70..0x78", &c.header)
                } else {
                    (env.directory, env.dir_hash, "0x78..0x80", &c.directory)
                };
                let covers = if header {
                    "the header JSON, and so the section_hashes inside it".to_string()
                } else {
                    format!(
                        "{} records: names, dtypes, shapes, offsets and each tensor's hash",
                        c.tensor_count
                    )
                };
                (
                    format!("{}{of}", if header { "header" } else { "directory" }),
                    vec![
                        kv("bytes", range(sec.off, sec.len)),
                        kv(
                            "recorded",
                            if recorded == 0 {
                                format!(
                                    "nothing: the envelope's [{where_}] is 0 \
                                     (an older file passes unchecked)"
                                )
                            } else {
                                format!(
                                    "{recorded:016x} in the envelope's reserved bytes [{where_}]"
                                )
                            },
                        ),
                        kv("covers", covers),
                        kv("status", self.status_line(status)),
                    ],
                )
            }
            Node::Section(i) => {
                let s = &c.sections[i];
                let sec = env.section(s.kind);
                (
                    format!("{} section{of}", s.kind.name()),
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
                format!("tensors{of}"),
                vec![
                    kv(
                        "tensors",
                        format!(
                            "{} · {} in the data section ({})",
                            c.tensor_count,
                            human_bytes(c.tensor_bytes),
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
                            c.tensors_checked,
                            c.tensor_count,
                            c.failing.len(),
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
                let Some(e) = c.file.directory.entries.get(i) else {
                    return ("tensor".into(), Vec::new());
                };
                let start = env.data.off + e.off;
                (
                    format!("tensor {} of {}{of}", i + 1, c.tensor_count),
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
                        kv("status", self.status_line(&c.tensors[i])),
                    ],
                )
            }
            Node::Signature => {
                let sig = format!("{}.sig", c.file_name);
                let mut v = vec![
                    kv(
                        "file",
                        if !c.has_path {
                            "none: the file is in memory".into()
                        } else if c.sig_present {
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
                match &c.sig_status {
                    Some(st) => v.push(kv("result", st.describe())),
                    None => v.push(kv("result", self.status_line(&c.signature))),
                }
                (format!("signature {sig}"), v)
            }
        }
    }

    // ---- running ---------------------------------------------------------------------

    fn reset_results(&mut self) {
        self.chains.iter_mut().for_each(Chain::reset);
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
            shard: 0,
            cancel_requested: false,
            elapsed: None,
            report: None,
        });
        self.phase = Phase::Running;
        let files: Vec<Arc<CmfFile>> = self.chains.iter().map(|c| Arc::clone(&c.file)).collect();
        let trusted = self.trusted.keys.clone();
        ctx.jobs.spawn(JobKind::Verify, move |cancel, report| {
            run_verify(&files, trusted, cancel, report, &finish)
        });
    }

    fn apply(&mut self, shard: usize, l: &LinkResult) {
        if let Some(c) = self.chains.get_mut(shard) {
            c.apply(l);
        }
    }

    fn finish(&mut self, report: &Arc<SetReport>) {
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
        run.bytes_done = report.bytes_hashed();
        // The report is the whole truth: rebuild from it rather than trust what streamed in.
        let keep = self.node_at(self.selected);
        let failing_only = self.failing_only;
        self.reset_results();
        self.failing_only = failing_only;
        for (s, r) in report.shards.iter().enumerate() {
            for l in &r.links {
                self.apply(s, l);
            }
            if let Some(c) = self.chains.get_mut(s) {
                c.sig_status = r.signature.clone();
                c.verified = Some(r.ok);
            }
        }
        self.phase = Phase::Done;
        // Failing tensors show themselves, in their (opened) shard.
        for (s, c) in self.chains.iter_mut().enumerate() {
            if !c.failing.is_empty() {
                c.expanded = true;
                self.open[s] = true;
            }
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
        let verdict_lines = self.verdict().len();
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
                    let node = self.node_at(i).map(|at| at.node);
                    if i == self.selected && matches!(node, Some(Node::Tensors | Node::Shard)) {
                        self.expand_or_collapse(&Action::Enter);
                    } else {
                        self.selected = i;
                    }
                }
            }
            _ => {}
        }
        self.clamp_cursor();
        let verdict_lines = self.verdict().len();
        let page = view::tree_capacity(ctx.body, verdict_lines);
        self.offset = view::window_offset(self.offset, self.selected, self.total_rows(), page);
    }

    fn expand_or_collapse(&mut self, a: &Action) {
        let Some(at) = self.node_at(self.selected) else {
            return;
        };
        let want = |open: bool| match a {
            Action::Right => true,
            Action::Left => false,
            _ => !open,
        };
        let parent = match at.node {
            Node::Shard => {
                let open = want(self.open[at.shard]);
                if open && self.open[at.shard] && matches!(a, Action::Right) {
                    // Right on an open node steps into it.
                    self.selected += 1;
                }
                self.open[at.shard] = open;
                return;
            }
            Node::Tensors => {
                let fo = self.failing_only;
                let c = &mut self.chains[at.shard];
                let open = want(c.expanded);
                if open && c.expanded && matches!(a, Action::Right) && c.children(fo) > 0 {
                    self.selected += 1;
                    return;
                }
                if c.expanded || open {
                    c.expanded = open;
                    return;
                }
                // Left on a closed node: to its shard, as from a leaf.
                Node::Shard
            }
            Node::Tensor(_) => Node::Tensors,
            _ => Node::Shard,
        };
        if matches!(a, Action::Left) {
            if let Some(r) = self.row_of(At::new(at.shard, parent)) {
                self.selected = r;
            }
        }
    }

    fn toggle_failing_only(&mut self, ctx: &mut Ctx) {
        if !self.failing_only && !self.any_failing_tensor() {
            *ctx.flash = Some("no failing tensors to list".into());
            return;
        }
        let keep = self.node_at(self.selected);
        self.failing_only = !self.failing_only;
        for (s, c) in self.chains.iter_mut().enumerate() {
            if !c.failing.is_empty() {
                c.expanded = true;
                self.open[s] = true;
            }
        }
        let first_tensors = self
            .chains
            .iter()
            .position(|c| !c.failing.is_empty())
            .unwrap_or(0);
        self.selected = keep
            .and_then(|n| self.row_of(n))
            .or_else(|| self.row_of(At::new(first_tensors, Node::Tensors)))
            .unwrap_or(0);
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
            JobReport::VerifyLink { shard, link } => {
                if let Some(run) = &mut self.run {
                    run.shard = *shard;
                }
                self.apply(*shard, link)
            }
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
            self.tensors_checked() as f64 / run.tensors_total as f64
        } else {
            0.0
        };
        let label = if self.grouped() {
            format!("verify {}/{}", run.shard + 1, self.chains.len())
        } else {
            "verify".into()
        };
        Some((label, frac.clamp(0.0, 1.0)))
    }

    /// `_file` is the primary shard; the run covers every shard.
    pub fn status(&self, _file: &CmfFile) -> (String, String) {
        let hint = "v verify · c cancel · Enter expand · f failing only".to_string();
        let run = self.run.as_ref();
        let checked = self.tensors_checked();
        let shards = if self.grouped() {
            format!(" in {} shards", self.chains.len())
        } else {
            String::new()
        };
        let status = match self.phase {
            Phase::Idle => "not verified yet".to_string(),
            Phase::Running if run.is_some_and(|r| r.cancel_requested) => "cancelling…".into(),
            Phase::Running => format!("verifying… {checked}/{} tensors", self.tensor_count),
            Phase::Done => {
                let time = run
                    .and_then(|r| r.elapsed)
                    .map(|d| format!(" in {}", human_duration(d)))
                    .unwrap_or_default();
                if self.cancelled() {
                    format!(
                        "verify cancelled after {checked} of {} tensors",
                        self.tensor_count
                    )
                } else if self.report().is_some_and(|r| r.ok) {
                    format!("verified {checked} tensors{shards}{time} · OK")
                } else {
                    let n: usize = self.chains.iter().map(Chain::failing_count).sum();
                    format!(
                        "verified {checked} tensors{shards}{time} · FAILED ({n} failing link{})",
                        if n == 1 { "" } else { "s" }
                    )
                }
            }
        };
        (status, hint)
    }

    pub fn render(&self, f: &mut Frame, area: Rect, _file: &CmfFile, theme: &Theme) {
        let verdict = self.verdict();
        let total = self.total_rows();
        let capacity = view::tree_capacity(area, verdict.len());
        let offset = view::window_offset(self.offset, self.selected, total, capacity);
        let first = self.first_broken();
        // Only the visible window becomes rows: the tensor list may be 10⁵ long.
        let rows: Vec<ChainRow> = (offset..total.min(offset + capacity))
            .filter_map(|i| {
                let at = self.node_at(i)?;
                let mut r = self.row(at);
                r.first_broken = self.phase == Phase::Done && Some(at) == first;
                Some(r)
            })
            .collect();
        let (title, detail) = self
            .node_at(self.selected)
            .map(|n| self.detail(n))
            .unwrap_or_default();
        // Names with their indent: a shard's chain sits one level (2 columns) deeper.
        let indent = 2 * usize::from(self.grouped());
        let top = self
            .chains
            .iter()
            .flat_map(|c| c.sections.iter())
            .map(|s| s.kind.name().len() + " section".len())
            .chain(["directory".len()])
            .max()
            .unwrap_or(0)
            + indent;
        let top = if self.grouped() {
            top.max(self.shard_label(self.chains.len() - 1).len())
        } else {
            top
        };
        let listed = self
            .chains
            .iter()
            .enumerate()
            .filter(|(s, c)| self.open[*s] && c.children(self.failing_only) > 0)
            .map(|(_, c)| indent + 2 + c.widest_tensor_name)
            .max();
        let name_width = top.max(listed.unwrap_or(0));
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

/// The worker: verifies every file of the model in turn (§10: each shard has its own
/// chain). Each runs `verify` on a scoped thread (its event callback must be `Sync`, the
/// job's report function is not) and forwards events from there, links tagged with their
/// shard, progress over the whole set and throttled.
fn run_verify(
    files: &[Arc<CmfFile>],
    trusted_keys: Vec<[u8; 32]>,
    cancel: &AtomicBool,
    report: &dyn Fn(JobReport),
    finish: &Finish,
) {
    let start = Instant::now();
    let cancelled = || cancel.load(std::sync::atomic::Ordering::Relaxed);
    let bytes_total: u64 = files
        .iter()
        .flat_map(|f| f.directory.iter())
        .map(|e| e.nbytes)
        .sum();
    report(JobReport::VerifyStarted {
        tensors: files.iter().map(|f| f.directory.len()).sum(),
        bytes: bytes_total,
    });
    let mut throttle = ProgressThrottle {
        last_done: 0,
        last_at: start,
    };
    let mut reports = Vec::with_capacity(files.len());
    // Bytes hashed in the shards before the current one.
    let mut base = 0u64;
    for (shard, file) in files.iter().enumerate() {
        if shard > 0 && cancelled() {
            break;
        }
        let (tx, rx) = mpsc::channel::<VerifyEvent>();
        let trusted_keys = trusted_keys.clone();
        let outcome = std::thread::scope(|s| {
            let hashing = s.spawn(move || {
                let opts = VerifyOptions {
                    payload_check: Some(quant::payload_check),
                    signature: true,
                    trusted_keys,
                    cancel: Some(cancel),
                    strict: false,
                    skip_tensors: false,
                };
                verify(file, &opts, &|ev| {
                    // The receiver lives until this thread ends.
                    let _ = tx.send(ev);
                    // An answer streaming in the chat has the cores: hashing waits for it.
                    cortiq_engine::exec::yield_to_foreground(&cancelled);
                })
            });
            for ev in rx {
                match ev {
                    // The run announced the whole set's totals.
                    VerifyEvent::Started { .. } | VerifyEvent::Finished => {}
                    VerifyEvent::Checked(link) => report(JobReport::VerifyLink { shard, link }),
                    VerifyEvent::Progress { bytes_done, .. } => {
                        let done = base + bytes_done;
                        if throttle.admit(done, bytes_total, Instant::now()) {
                            report(JobReport::VerifyProgress {
                                done,
                                total: bytes_total,
                            });
                        }
                    }
                }
            }
            hashing.join()
        });
        let panicked = outcome.is_err();
        let result = outcome.unwrap_or_else(|_| {
            log::error!("verify worker panicked on shard {}", shard + 1);
            VerifyReport {
                ok: false,
                cancelled: false,
                first_failure: None,
                failures: Vec::new(),
                links: Vec::new(),
                signature: None,
                tensors_checked: 0,
                bytes_hashed: 0,
                unhashed: Vec::new(),
                strong_digests: false,
            }
        });
        base += result.bytes_hashed;
        // A failed shard does not stop the run (every failure is worth seeing); a
        // cancelled or broken-off one does.
        let stop = result.cancelled || panicked;
        reports.push(result);
        if stop {
            break;
        }
    }
    let was_cancelled = cancelled() || reports.iter().any(|r| r.cancelled);
    let result = Arc::new(SetReport {
        ok: !was_cancelled && reports.len() == files.len() && reports.iter().all(|r| r.ok),
        cancelled: was_cancelled,
        shards: reports,
    });
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
    use super::{At, IntegrityState, Node, Phase, TrustedKeys};
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
                "valid, but by an UNTRUSTED key dbec9ee0ff7684d0… — no trusted keys are set"
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
        let set = st.run.as_ref().unwrap().report.clone().unwrap();
        assert!(!set.ok && !set.cancelled);
        let report = &set.shards[0];
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
        assert_eq!(
            st.selected,
            st.row_of(At::new(0, Node::Section(0))).unwrap()
        );
        assert!(
            st.chains[0].expanded,
            "failing tensors expand the tensors node"
        );
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
        assert!(
            report.tensors_checked() < 56,
            "{}",
            report.tensors_checked()
        );
        let screen = h.render();
        assert!(screen.contains("cancelled after"), "{screen}");
        assert!(
            status_line(&screen).contains("verify cancelled"),
            "{screen}"
        );
        // A new run starts from a clean tree and finishes.
        h.act(Action::Verify);
        assert_eq!(state(&h.app).tensors_checked(), 0);
        assert!(
            h.render().contains("· pending"),
            "re-running resets the tree"
        );
        h.pump_until("second run done", done);
        let report = state(&h.app).run.as_ref().unwrap().report.clone().unwrap();
        assert!(report.ok, "{:?}", report.shards[0].first_failure);
        assert_eq!(report.tensors_checked(), 56);
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
                Action::Job(JobReport::VerifyLink { link, .. }) if link.link == Link::Header
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
                    JobReport::VerifyLink { .. } => links += 1,
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
        assert_eq!(last, report.bytes_hashed(), "the last report is the total");
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
        assert!(state(&h.app).chains[0].expanded);
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

    // --- a sharded model ------------------------------------------------------------

    #[test]
    fn a_sharded_model_verifies_every_shard_in_turn() {
        let dir = tempfile::tempdir().unwrap();
        let paths = super::super::testing::sharded_fixture(dir.path());
        let mut h = open(&paths[1]);
        let screen = h.render();
        assert!(
            screen.contains("v hashes each of the 3 shards' chains in turn (135 tensors"),
            "{screen}"
        );
        for k in 1..=3 {
            assert!(screen.contains(&format!("▾ shard {k}/3")), "{screen}");
        }
        run_to_end(&mut h);
        let screen = h.render();
        insta::assert_snapshot!("integrity_sharded_ok", screen);
        let report = state(&h.app).run.as_ref().unwrap().report.clone().unwrap();
        assert!(report.ok && !report.cancelled);
        assert_eq!(report.shards.len(), 3);
        assert_eq!(report.tensors_checked(), 135);
        for (k, r) in report.shards.iter().enumerate() {
            let f = CmfFile::open(&paths[k]).unwrap();
            assert_eq!(r.tensors_checked, f.directory.len(), "shard {}", k + 1);
        }
        assert!(
            screen.contains("OK — every link of the chain holds in all 3 shards"),
            "{screen}"
        );
        assert!(
            status_line(&screen).contains("verified 135 tensors in 3 shards in 2.5 ms · OK"),
            "{screen}"
        );
        let rows = screen
            .lines()
            .filter(|l| l.contains("shard ") && l.contains("every link holds"))
            .count();
        assert_eq!(rows, 3, "{screen}");
        // Left from inside a shard's chain goes to its row; Enter there folds it.
        let st = state(&h.app);
        let header2 = st.row_of(At::new(1, Node::Header)).unwrap();
        state_mut(&mut h).selected = header2;
        h.act(Action::Left);
        assert_eq!(
            state(&h.app).node_at(state(&h.app).selected),
            Some(At::new(1, Node::Shard))
        );
        let before = state(&h.app).total_rows();
        h.act(Action::Enter);
        assert!(state(&h.app).total_rows() < before);
        assert!(h.render().contains("▸ shard 2/3"));
    }

    #[test]
    fn a_corrupt_byte_in_shard_2_fails_naming_that_shards_tensor() {
        let dir = tempfile::tempdir().unwrap();
        let paths = super::super::testing::sharded_fixture(dir.path());
        let second = CmfFile::open(&paths[1]).unwrap();
        let e = second.directory.entries[7].clone();
        let mut bytes = std::fs::read(&paths[1]).unwrap();
        bytes[(second.envelope.data.off + e.off + e.nbytes / 2) as usize] ^= 0x5a;
        drop(second);
        std::fs::write(&paths[1], bytes).unwrap();
        // Opened by the name of shard 3.
        let mut h = open(&paths[2]);
        run_to_end(&mut h);
        let screen = h.render();
        insta::assert_snapshot!("integrity_sharded_failed", screen);
        let report = state(&h.app).run.as_ref().unwrap().report.clone().unwrap();
        assert!(!report.ok && !report.cancelled);
        assert_eq!(report.shards.len(), 3, "a failure does not stop the run");
        assert!(report.shards[0].ok && report.shards[2].ok);
        let failing: Vec<&Link> = report.shards[1].failures.iter().map(|l| &l.link).collect();
        assert_eq!(
            failing,
            [&Link::Tensor {
                index: 7,
                name: e.name.clone()
            }]
        );
        let what = format!("FAILED: first broken link: tensor {} in shard 2/3", e.name);
        assert!(screen.contains(&what), "{screen}");
        // Cut on this screen: the whole line ends with the file.
        let verdict = &state(&h.app).verdict()[0].text;
        assert!(
            verdict.ends_with(" (1 failing link) — moe-00002-of-00003.cmf"),
            "{verdict}"
        );
        assert!(
            screen.contains(&format!("shard 2/3: tensor {} — recorded", e.name)),
            "{screen}"
        );
        // The cursor is on the broken tensor, inside shard 2's opened chain.
        let st = state(&h.app);
        assert_eq!(st.node_at(st.selected), Some(At::new(1, Node::Tensor(7))));
        assert!(st.chains[1].expanded && !st.chains[0].expanded);
        let row = screen
            .lines()
            .find(|l| l.contains(&e.name) && l.contains("✗ FAILED"))
            .expect("the tensor's row");
        assert!(row.contains("» "), "{row}");
        assert!(
            screen.contains(&format!(
                "tensor 8 of {} · shard 2/3",
                st.chains[1].tensor_count
            )),
            "details name the shard\n{screen}"
        );
        assert!(
            status_line(&screen).contains("FAILED (1 failing link)"),
            "{screen}"
        );
        // f lists only the failing tensor, in its shard.
        h.act(Action::Cycle);
        let st = state(&h.app);
        assert_eq!(st.chains[1].children(true), 1);
        assert_eq!(st.node_at(st.selected), Some(At::new(1, Node::Tensor(7))));
    }

    /// Zeroed envelope hashes, no `section_hashes`: the verdict names what went unchecked;
    /// a section cut out of the envelope is a broken link with a row of its own.
    #[test]
    fn the_verdict_names_unhashed_links_and_a_cut_section_fails() {
        let dir = tempfile::tempdir().unwrap();
        let src = super::super::testing::fixture("qwen3_moe-masked.cmf");
        let bare = dir.path().join("bare.cmf");
        let mut b = std::fs::read(&src).unwrap();
        b[0x70..0x80].fill(0);
        let key = b"\"section_hashes\"";
        let i = b.windows(key.len()).position(|w| w == key).unwrap();
        b[i + 1] = b'x';
        std::fs::write(&bare, b).unwrap();
        let mut h = open(&bare);
        run_to_end(&mut h);
        let verdict = &state(&h.app).verdict()[0].text;
        assert!(
            verdict.starts_with(
                "OK, but header, directory, masks section, vocab section and index section \
                 are unhashed"
            ),
            "{verdict}"
        );

        let cut = dir.path().join("cut.cmf");
        let mut b = std::fs::read(&src).unwrap();
        b[0x50..0x60].fill(0);
        std::fs::write(&cut, b).unwrap();
        let mut h = open(&cut);
        run_to_end(&mut h);
        let screen = h.render();
        let verdict = &state(&h.app).verdict()[0].text;
        assert!(
            verdict.starts_with("FAILED: first broken link: vocab section"),
            "{verdict}"
        );
        assert!(
            screen
                .lines()
                .any(|l| l.contains("vocab") && l.contains("FAILED")),
            "{screen}"
        );
    }

    #[test]
    fn a_cancelled_run_over_shards_stops_before_the_next_shard() {
        let dir = tempfile::tempdir().unwrap();
        let paths = super::super::testing::sharded_fixture(dir.path());
        let mut h = open(&paths[0]);
        // Hold the worker at its start so that the cancel lands before any hashing.
        let gate = h.app.jobs.gate();
        let held = gate.write().unwrap();
        h.act(Action::Verify).act(Action::Cancel);
        drop(held);
        h.pump_until("cancelled run done", done);
        let report = state(&h.app).run.as_ref().unwrap().report.clone().unwrap();
        assert!(report.cancelled && !report.ok);
        assert_eq!(report.shards.len(), 1, "shards 2 and 3 were not started");
        let screen = h.render();
        assert!(
            screen.contains("cancelled after 0 of 135 tensors"),
            "{screen}"
        );
        let skipped = screen
            .lines()
            .filter(|l| l.contains("▾ shard ") && l.contains("○ skipped"))
            .count();
        assert_eq!(skipped, 3, "{screen}");
        assert!(
            screen.contains("moe-00002-of-00003.cmf · 66 tensors · 127.4 KiB · not checked: the run was cancelled"),
            "{screen}"
        );
    }
}
