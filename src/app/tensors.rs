//! State of the Tensors view: the model's merged directory (every shard's tensors, §10) as
//! a list of row references (an index vector into the merged order, which names each
//! tensor's shard; rebuilt only when the filter, sort or grouping changes), the cursor, the
//! detail panel, and statistics computed by background jobs and cached by tensor hash. Only
//! the visible window of rows is formatted for the widget.

use std::cmp::Ordering;
use std::collections::{HashMap, HashSet};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use cortiq_engine::format::layers::{self, MTP_PREFIX};
use cortiq_engine::format::{CmfFile, CmfModel, TensorEntry};
use cortiq_engine::stats::{tensor_stats, StatsError, TensorStats, OUTLIER_SIGMAS};
use cortiq_views::tensors::{
    self as widget, DetailVm, FilterVm, RowVm, Stat, StatsReadyVm, StatsVm, TensorsVm,
};
use cortiq_views::util::{esc, group_digits, human_bytes, shape_str};
use cortiq_views::Theme;
use ratatui::layout::Rect;
use ratatui::text::Span;
use ratatui::Frame;

use super::jobs::{JobKind, JobReport};
use super::{Action, Ctx};
use crate::cli::tensors::natural_cmp;

/// What a stats job reports when its cancel flag stopped it.
const CANCELLED: &str = "cancelled";

/// Orders of the table. `Layer` (layer number, then the name with numbers compared as
/// numbers) is the default; with a filter it ranks the best matches first instead.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SortKey {
    Layer,
    Name,
    Dtype,
    Elements,
    Bytes,
    Bits,
    Offset,
    Hash,
}

impl SortKey {
    const CYCLE: [SortKey; 8] = [
        SortKey::Layer,
        SortKey::Name,
        SortKey::Dtype,
        SortKey::Elements,
        SortKey::Bytes,
        SortKey::Bits,
        SortKey::Offset,
        SortKey::Hash,
    ];

    fn next(self) -> SortKey {
        let i = SortKey::CYCLE.iter().position(|&k| k == self).unwrap_or(0);
        SortKey::CYCLE[(i + 1) % SortKey::CYCLE.len()]
    }

    fn label(self) -> &'static str {
        match self {
            SortKey::Layer => "layer order",
            SortKey::Name => "name",
            SortKey::Dtype => "dtype",
            SortKey::Elements => "elements",
            SortKey::Bytes => "bytes",
            SortKey::Bits => "bits/weight",
            SortKey::Offset => "offset",
            SortKey::Hash => "hash",
        }
    }

    /// Sizes read best largest first; names, ids and positions in ascending order.
    fn descending_by_default(self) -> bool {
        matches!(self, SortKey::Elements | SortKey::Bytes | SortKey::Bits)
    }

    /// The table column that carries the sort indicator.
    fn column(self) -> usize {
        match self {
            SortKey::Layer | SortKey::Name => 0,
            SortKey::Dtype => 1,
            SortKey::Elements => 3,
            SortKey::Bytes => 4,
            SortKey::Bits => 5,
            SortKey::Offset => widget::OFFSET,
            SortKey::Hash => widget::HASH,
        }
    }
}

// ---------------------------------------------------------------------------------------
// Fuzzy matching

const NONE: i32 = i32::MIN / 2;
const MATCH: i32 = 16;
/// A match right after a separator (the start of a name component).
const BOUNDARY: i32 = 12;
/// A match right after the previous one.
const CONSECUTIVE: i32 = 16;
/// The last matched character ends a component (`experts.7` prefers `experts.7.` to
/// `experts.70`).
const END_BOUNDARY: i32 = 8;
const GAP_OPEN: i32 = 3;
const GAP: i32 = 1;
/// Longer names are scored without alignment: a hostile name must not make typing slow.
const ALIGN_MAX: usize = 512;

fn is_separator(c: char) -> bool {
    matches!(c, '.' | '_' | '-' | '/' | ':' | ' ')
}

/// Case-insensitive subsequence matching. Whitespace separates terms that must all
/// match; each term scores its best alignment in the name, so contiguous runs and
/// matches at component boundaries rank first.
pub struct Fuzzy {
    terms: Vec<Term>,
    text: Vec<char>,
    prev: Vec<i32>,
    cur: Vec<i32>,
}

struct Term {
    chars: Vec<char>,
    text: String,
    /// Score of the term matched as one run, without the bonuses at its two ends.
    run: i32,
}

impl Term {
    fn new(text: &str) -> Term {
        let chars: Vec<char> = text.chars().collect();
        let m = chars.len() as i32;
        let inner_boundaries = chars.windows(2).filter(|w| is_separator(w[0])).count() as i32;
        Term {
            run: MATCH * m + CONSECUTIVE * (m - 1).max(0) + BOUNDARY * inner_boundaries,
            text: text.to_string(),
            chars,
        }
    }

    /// The best score of the term where it occurs as a run (the common case, found by a
    /// substring search instead of the alignment).
    fn run_score(&self, lower: &str) -> Option<i32> {
        lower
            .match_indices(self.text.as_str())
            .map(|(at, s)| {
                let starts = lower[..at].chars().next_back().is_none_or(is_separator);
                let ends = lower[at + s.len()..]
                    .chars()
                    .next()
                    .is_none_or(is_separator);
                self.run + if starts { BOUNDARY } else { 0 } + if ends { END_BOUNDARY } else { 0 }
            })
            .max()
    }
}

impl Fuzzy {
    pub fn new(pattern: &str) -> Fuzzy {
        Fuzzy {
            terms: pattern
                .to_lowercase()
                .split_whitespace()
                .map(Term::new)
                .collect(),
            text: Vec::new(),
            prev: Vec::new(),
            cur: Vec::new(),
        }
    }

    /// The score of a lowercase name, `None` when some term is not a subsequence of it.
    /// An empty pattern matches everything with score 0.
    pub fn score(&mut self, lower: &str) -> Option<i32> {
        let mut total = 0i32;
        let mut text_ready = false;
        for t in &self.terms {
            let s = match t.run_score(lower) {
                Some(s) => s,
                // Rejecting needs no alignment.
                None if !is_subsequence(&t.chars, lower) => return None,
                None => {
                    if !text_ready {
                        self.text.clear();
                        self.text.extend(lower.chars());
                        text_ready = true;
                    }
                    align_score(&t.chars, &self.text, &mut self.prev, &mut self.cur)
                }
            };
            total = total.saturating_add(s);
        }
        Some(total)
    }
}

fn is_subsequence(term: &[char], text: &str) -> bool {
    let mut want = term.iter();
    let mut next = want.next();
    for c in text.chars() {
        match next {
            None => return true,
            Some(&w) if w == c => next = want.next(),
            _ => {}
        }
    }
    next.is_none()
}

/// Best alignment of `term` (known to be a subsequence) in `text`: dynamic programming
/// over (term position, text position) with linear gap costs.
fn align_score(term: &[char], text: &[char], prev: &mut Vec<i32>, cur: &mut Vec<i32>) -> i32 {
    let (n, m) = (text.len(), term.len());
    if m == 0 {
        return 0;
    }
    if n > ALIGN_MAX {
        return MATCH.saturating_mul(m as i32);
    }
    let bonus = |j: usize| {
        if j == 0 || is_separator(text[j - 1]) {
            BOUNDARY
        } else {
            0
        }
    };
    prev.clear();
    prev.resize(n, NONE);
    cur.clear();
    cur.resize(n, NONE);
    for j in 0..n {
        if text[j] == term[0] {
            prev[j] = MATCH + bonus(j);
        }
    }
    for &want in &term[1..] {
        // gap = best over k <= j-2 of prev[k] minus the cost of skipping text[k+1..j].
        let mut gap = NONE;
        for j in 0..n {
            if j >= 2 {
                gap = (gap - GAP).max(prev[j - 2] - GAP_OPEN - GAP);
            }
            cur[j] = NONE;
            if j >= 1 && text[j] == want {
                let best = (prev[j - 1] + CONSECUTIVE).max(gap);
                if best > NONE / 2 {
                    cur[j] = best + MATCH + bonus(j);
                }
            }
        }
        std::mem::swap(prev, cur);
    }
    (0..n)
        .filter(|&j| prev[j] > NONE / 2)
        .map(|j| {
            let ends = j + 1 == n || text.get(j + 1).copied().is_some_and(is_separator);
            prev[j] + if ends { END_BOUNDARY } else { 0 }
        })
        .max()
        .unwrap_or(0)
}

// ---------------------------------------------------------------------------------------
// Rows

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RowRef {
    /// Index into `groups`.
    Group(u32),
    /// Index into `bank_rows`: one layer's experts, folded.
    Bank(u32),
    /// Index into the merged directory (`CmfModel::tensor_at`).
    Tensor(u32),
}

/// What identifies a row across rebuilds (group indices change, layers do not).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RowKey {
    Group(GroupKey),
    /// Index into `banks`.
    Bank(u32),
    Tensor(u32),
}

/// The group of a tensor when grouping: in this order, tensors outside layers, the
/// decoder layers, the MTP head (whose `model.mtp.layers.0.*` is not layer 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum GroupKey {
    Outside,
    Layer(u64),
    Mtp,
}

impl GroupKey {
    fn of(name: &str) -> GroupKey {
        if name.starts_with(MTP_PREFIX) {
            GroupKey::Mtp
        } else {
            cortiq_engine::format::directory::layer_of(name)
                .map_or(GroupKey::Outside, GroupKey::Layer)
        }
    }
}

struct GroupInfo {
    key: GroupKey,
    /// Tensors of the layer that pass the filter.
    count: usize,
    bytes: u64,
}

/// A layer's expert tensors (`…mlp.experts.*`): one collapsible row inside its layer's
/// group, so 3·N expert tensors do not bury the layer's other tensors.
struct Bank {
    /// `model.layers.1.mlp.experts.`
    prefix: String,
}

/// A bank's row as the filter leaves it.
struct BankRow {
    bank: u32,
    count: usize,
    experts: usize,
    bytes: u64,
    /// Names of the dtypes among its tensors, in id order.
    dtypes: Vec<&'static str>,
}

pub struct TensorsState {
    /// The whole set: render and the stats workers read through it.
    model: Arc<CmfModel>,
    /// Lowercase names, computed once for the filter.
    lower: Vec<Box<str>>,
    /// Each tensor's group.
    keys: Vec<GroupKey>,
    /// Each expert tensor's bank and expert number.
    expert_of: Vec<Option<(u32, u32)>>,
    banks: Vec<Bank>,
    /// Kind of each decoder layer (`linear·MoE 8e`) and of the MTP head's blocks.
    kinds: HashMap<u64, String>,
    mtp_kind: Option<String>,
    /// Position of each tensor in the natural layer order (the default and the tie-break).
    layer_rank: Vec<u32>,
    /// Position in natural name order, computed when first sorted by name.
    name_rank: Option<Vec<u32>>,
    /// Content width of each column over the whole directory.
    widths: [usize; widget::COLS],

    filter: String,
    typing: bool,
    /// Tensors passing `matched_for`, with their scores; a filter that extends it only
    /// needs to look at these.
    matched: Vec<(u32, i32)>,
    matched_for: String,
    sort: SortKey,
    reversed: bool,
    grouped: bool,
    collapsed: HashSet<GroupKey>,
    groups: Vec<GroupInfo>,
    /// Banks opened without a filter, and banks closed with one: without a filter a
    /// bank starts folded, with one it starts open (the matches are what is wanted).
    banks_open: HashSet<u32>,
    banks_shut: HashSet<u32>,
    bank_rows: Vec<BankRow>,
    rows: Vec<RowRef>,
    selected: usize,
    offset: usize,

    detail: bool,
    cache: HashMap<u64, Arc<TensorStats>>,
    /// Decode errors, by tensor hash (they would fail again).
    errors: HashMap<u64, String>,
    /// The stats job in flight: tensor hash and name.
    running: Option<(u64, String)>,
    /// The tensor whose job the user cancelled.
    cancelled: Option<u64>,
    /// Stats jobs started (the cache's effect is observable in tests).
    jobs_started: usize,
}

impl TensorsState {
    pub fn new(model: &Arc<CmfModel>) -> TensorsState {
        // Borrowed once for the whole index: sorting 10⁵ entries wants plain slices.
        let entries: Vec<&TensorEntry> = model.tensors().map(|(_, e)| e).collect();
        let lower: Vec<Box<str>> = entries
            .iter()
            .map(|e| e.name.to_lowercase().into_boxed_str())
            .collect();
        let keys: Vec<GroupKey> = entries.iter().map(|e| GroupKey::of(&e.name)).collect();
        let (expert_of, banks) = expert_banks(&entries);
        let map = layers::classify(
            entries.iter().copied(),
            model.primary().header.arch.as_ref(),
        );
        let kinds = map.layers.iter().map(|l| (l.index, l.label())).collect();
        let mtp_kind = map.mtp.as_ref().and_then(|m| {
            let labels: Vec<String> = layers::runs(&m.layers)
                .into_iter()
                .map(|r| r.label)
                .collect();
            (!labels.is_empty()).then(|| labels.join(", "))
        });
        let mut order: Vec<u32> = (0..entries.len() as u32).collect();
        order.sort_unstable_by(|&a, &b| {
            let (ea, eb) = (entries[a as usize], entries[b as usize]);
            keys[a as usize]
                .cmp(&keys[b as usize])
                .then_with(|| natural_cmp(&ea.name, &eb.name))
                .then_with(|| a.cmp(&b))
        });
        let layer_rank = ranks(&order);
        let mut s = TensorsState {
            widths: column_widths(model.tensors(), model.shards.len()),
            matched: (0..entries.len() as u32).map(|i| (i, 0)).collect(),
            model: Arc::clone(model),
            matched_for: String::new(),
            lower,
            keys,
            expert_of,
            banks,
            kinds,
            mtp_kind,
            layer_rank,
            name_rank: None,
            filter: String::new(),
            typing: false,
            sort: SortKey::Layer,
            reversed: false,
            grouped: false,
            collapsed: HashSet::new(),
            groups: Vec::new(),
            banks_open: HashSet::new(),
            banks_shut: HashSet::new(),
            bank_rows: Vec::new(),
            rows: Vec::new(),
            selected: 0,
            offset: 0,
            detail: false,
            cache: HashMap::new(),
            errors: HashMap::new(),
            running: None,
            cancelled: None,
            jobs_started: 0,
        };
        s.rebuild(false);
        s
    }

    /// Tensor `i` of the merged directory and its shard.
    fn entry(&self, i: usize) -> Option<(usize, &TensorEntry)> {
        self.model.tensor_at(i)
    }

    fn sharded(&self) -> bool {
        self.model.shards.len() > 1
    }

    fn descending(&self) -> bool {
        self.sort.descending_by_default() != self.reversed
    }

    fn by_match(&self) -> bool {
        self.sort == SortKey::Layer && !self.filter.trim().is_empty()
    }

    fn key_of(&self, r: RowRef) -> RowKey {
        match r {
            RowRef::Tensor(i) => RowKey::Tensor(i),
            RowRef::Group(g) => RowKey::Group(
                self.groups
                    .get(g as usize)
                    .map_or(GroupKey::Outside, |g| g.key),
            ),
            RowRef::Bank(b) => {
                RowKey::Bank(self.bank_rows.get(b as usize).map_or(u32::MAX, |b| b.bank))
            }
        }
    }

    fn selected_tensor(&self) -> Option<usize> {
        match self.rows.get(self.selected) {
            Some(RowRef::Tensor(i)) => Some(*i as usize),
            _ => None,
        }
    }

    /// Filters, sorts and groups into `rows`. With `to_top` the cursor goes to the first
    /// tensor (the best match while typing); otherwise it stays on the same row.
    fn rebuild(&mut self, to_top: bool) {
        let keep = self.rows.get(self.selected).map(|&r| self.key_of(r));
        self.refilter();
        let mut order = self.matched.clone();
        let model = Arc::clone(&self.model);
        let entries: Vec<&TensorEntry> = model.tensors().map(|(_, e)| e).collect();
        self.sort_order(&model, &entries, &mut order);

        self.groups.clear();
        self.bank_rows.clear();
        self.rows.clear();
        self.rows.reserve(order.len());
        if self.grouped {
            // Stable: the chosen order holds inside each layer; layers in numeric order,
            // tensors outside layers first, the MTP head last.
            order.sort_by_key(|&(i, _)| self.keys[i as usize]);
            let mut k = 0;
            while k < order.len() {
                let key = self.keys[order[k].0 as usize];
                let start = k;
                let mut bytes = 0u64;
                while k < order.len() && self.keys[order[k].0 as usize] == key {
                    bytes = bytes.saturating_add(entries[order[k].0 as usize].nbytes);
                    k += 1;
                }
                self.rows.push(RowRef::Group(self.groups.len() as u32));
                self.groups.push(GroupInfo {
                    key,
                    count: k - start,
                    bytes,
                });
                if !self.collapsed.contains(&key) {
                    self.push_group(&entries, &order[start..k]);
                }
            }
        } else {
            self.rows
                .extend(order.iter().map(|&(i, _)| RowRef::Tensor(i)));
        }

        let found = if to_top {
            self.rows
                .iter()
                .position(|r| matches!(r, RowRef::Tensor(_)))
        } else {
            keep.and_then(|k| {
                self.rows
                    .iter()
                    .position(|&r| self.key_of(r) == k)
                    .or_else(|| match k {
                        // Hidden in a folded bank or a collapsed group: select that.
                        RowKey::Tensor(i) => {
                            let bank = self.expert_of.get(i as usize).copied().flatten();
                            let key = self.keys.get(i as usize).copied()?;
                            bank.and_then(|(b, _)| {
                                self.rows
                                    .iter()
                                    .position(|&r| self.key_of(r) == RowKey::Bank(b))
                            })
                            .or_else(|| {
                                self.rows
                                    .iter()
                                    .position(|&r| self.key_of(r) == RowKey::Group(key))
                            })
                        }
                        RowKey::Bank(b) => {
                            let key = self
                                .banks
                                .get(b as usize)
                                .map(|bk| GroupKey::of(&bk.prefix))?;
                            self.rows
                                .iter()
                                .position(|&r| self.key_of(r) == RowKey::Group(key))
                        }
                        RowKey::Group(_) => None,
                    })
            })
        };
        self.selected = found.unwrap_or(self.selected.min(self.rows.len().saturating_sub(1)));
        if to_top {
            self.offset = 0;
        }
    }

    /// The rows of one expanded group (`members` in the chosen order): each bank of
    /// experts becomes one row where its first member would be, followed by its members
    /// when it is open; the other tensors stay in place.
    fn push_group(&mut self, entries: &[&TensorEntry], members: &[(u32, i32)]) {
        // Members of each bank, in order; banks in order of first appearance.
        let mut of_bank: Vec<(u32, Vec<u32>)> = Vec::new();
        let mut slot: HashMap<u32, usize> = HashMap::new();
        for &(i, _) in members {
            if let Some((b, _)) = self.expert_of[i as usize] {
                let at = *slot.entry(b).or_insert_with(|| {
                    of_bank.push((b, Vec::new()));
                    of_bank.len() - 1
                });
                of_bank[at].1.push(i);
            }
        }
        if of_bank.is_empty() {
            self.rows
                .extend(members.iter().map(|&(i, _)| RowRef::Tensor(i)));
            return;
        }
        let filtering = !self.filter.trim().is_empty();
        let mut emitted = vec![false; of_bank.len()];
        for &(i, _) in members {
            let Some((b, _)) = self.expert_of[i as usize] else {
                self.rows.push(RowRef::Tensor(i));
                continue;
            };
            let at = slot[&b];
            if emitted[at] {
                continue;
            }
            emitted[at] = true;
            let tensors = &of_bank[at].1;
            // A fused tensor (no expert number) holds every expert: it counts none.
            let mut experts: Vec<u32> = tensors
                .iter()
                .filter_map(|&t| self.expert_of[t as usize].map(|(_, e)| e))
                .filter(|&e| e != u32::MAX)
                .collect();
            experts.sort_unstable();
            experts.dedup();
            let mut dtypes: Vec<u8> = tensors
                .iter()
                .map(|&t| entries[t as usize].dtype.id())
                .collect();
            dtypes.sort_unstable();
            dtypes.dedup();
            self.rows.push(RowRef::Bank(self.bank_rows.len() as u32));
            self.bank_rows.push(BankRow {
                bank: b,
                count: tensors.len(),
                experts: experts.len(),
                bytes: tensors
                    .iter()
                    .fold(0u64, |a, &t| a.saturating_add(entries[t as usize].nbytes)),
                dtypes: dtypes
                    .iter()
                    .filter_map(|&id| {
                        tensors
                            .iter()
                            .map(|&t| entries[t as usize].dtype)
                            .find(|d| d.id() == id)
                            .map(|d| d.name())
                    })
                    .collect(),
            });
            if self.bank_open(b, filtering) {
                self.rows.extend(tensors.iter().map(|&t| RowRef::Tensor(t)));
            }
        }
    }

    fn bank_open(&self, bank: u32, filtering: bool) -> bool {
        if filtering {
            !self.banks_shut.contains(&bank)
        } else {
            self.banks_open.contains(&bank)
        }
    }

    /// Opens (`Some(true)`), folds (`Some(false)`) or toggles (`None`) a bank.
    fn set_bank(&mut self, bank: u32, open: Option<bool>) {
        let filtering = !self.filter.trim().is_empty();
        let open = open.unwrap_or(!self.bank_open(bank, filtering));
        let (set, member) = if filtering {
            (&mut self.banks_shut, !open)
        } else {
            (&mut self.banks_open, open)
        };
        if member {
            set.insert(bank);
        } else {
            set.remove(&bank);
        }
    }

    fn refilter(&mut self) {
        if self.filter == self.matched_for {
            return;
        }
        let mut fuzzy = Fuzzy::new(&self.filter);
        // A longer filter matches a subset of what its prefix matched.
        let narrowing = self.filter.starts_with(&self.matched_for);
        let lower = &self.lower;
        let mut score = |i: u32| lower.get(i as usize).and_then(|n| fuzzy.score(n));
        self.matched = if narrowing {
            self.matched
                .iter()
                .filter_map(|&(i, _)| score(i).map(|s| (i, s)))
                .collect()
        } else {
            (0..lower.len() as u32)
                .filter_map(|i| score(i).map(|s| (i, s)))
                .collect()
        };
        self.matched_for = self.filter.clone();
    }

    /// `entries`: the merged directory in order (borrowed from `model`).
    fn sort_order(&mut self, model: &CmfModel, entries: &[&TensorEntry], order: &mut [(u32, i32)]) {
        if self.sort == SortKey::Name && self.name_rank.is_none() {
            let mut by_name: Vec<u32> = (0..entries.len() as u32).collect();
            by_name.sort_unstable_by(|&a, &b| {
                natural_cmp(&entries[a as usize].name, &entries[b as usize].name)
                    .then_with(|| a.cmp(&b))
            });
            self.name_rank = Some(ranks(&by_name));
        }
        let rank = &self.layer_rank;
        let name_rank = self.name_rank.as_deref().unwrap_or(rank);
        let by_match = self.by_match();
        let desc = self.descending();
        let e = |i: u32| entries[i as usize];
        // Offsets count within a shard: the shard comes first.
        let shard = |i: u32| model.tensor_at(i as usize).map_or(0, |(s, _)| s);
        let primary = |a: &(u32, i32), b: &(u32, i32)| -> Ordering {
            let (x, y) = (e(a.0), e(b.0));
            match self.sort {
                SortKey::Layer if by_match => b.1.cmp(&a.1),
                SortKey::Layer => rank[a.0 as usize].cmp(&rank[b.0 as usize]),
                SortKey::Name => name_rank[a.0 as usize].cmp(&name_rank[b.0 as usize]),
                SortKey::Dtype => x.dtype.id().cmp(&y.dtype.id()),
                SortKey::Elements => x.numel().cmp(&y.numel()),
                SortKey::Bytes => x.nbytes.cmp(&y.nbytes),
                SortKey::Bits => x.bits_per_weight().total_cmp(&y.bits_per_weight()),
                SortKey::Offset => (shard(a.0), x.off).cmp(&(shard(b.0), y.off)),
                SortKey::Hash => x.hash.cmp(&y.hash),
            }
        };
        // Ties always fall back to the natural order, whichever way the key runs.
        order.sort_unstable_by(|a, b| {
            let p = primary(a, b);
            let p = if desc { p.reverse() } else { p };
            p.then_with(|| rank[a.0 as usize].cmp(&rank[b.0 as usize]))
        });
    }

    /// Rows of the table on screen for a body of `body`.
    fn page(&self, body: Rect) -> usize {
        widget::areas(body, self.filter_shown(), self.detail)
            .rows
            .height
            .max(1) as usize
    }

    fn filter_shown(&self) -> bool {
        self.typing || !self.filter.is_empty()
    }

    pub fn update(&mut self, a: &Action, ctx: &mut Ctx) {
        let before = self.selected_tensor();
        let page = self.page(ctx.body);
        let last = self.rows.len().saturating_sub(1);
        if self.typing {
            match a {
                Action::Input(c) => {
                    self.filter.push(*c);
                    self.rebuild(true);
                }
                Action::Erase => {
                    self.filter.pop();
                    self.rebuild(true);
                }
                Action::Enter => self.typing = false,
                Action::Back => {
                    self.typing = false;
                    self.filter.clear();
                    self.rebuild(false);
                }
                _ => self.command(a, ctx, page, last),
            }
        } else {
            self.command(a, ctx, page, last);
        }
        if self.detail {
            if let Some(i) = self.selected_tensor() {
                if before != Some(i) {
                    self.start_stats(i, ctx);
                }
            }
        }
        // Keep the cursor on screen (the page changes with the panel and the filter line).
        let h = self.page(ctx.body);
        self.offset = visible_offset(self.offset, self.selected, h, self.rows.len());
    }

    fn command(&mut self, a: &Action, ctx: &mut Ctx, page: usize, last: usize) {
        let row = self.rows.get(self.selected).copied();
        match a {
            Action::Up | Action::ScrollUp => self.selected = self.selected.saturating_sub(1),
            Action::Down | Action::ScrollDown => self.selected = (self.selected + 1).min(last),
            Action::PageUp => self.selected = self.selected.saturating_sub(page),
            Action::PageDown => self.selected = (self.selected + page).min(last),
            Action::Home => self.selected = 0,
            Action::End => self.selected = last,
            Action::Filter => self.typing = true,
            Action::SortNext => {
                self.sort = self.sort.next();
                self.reversed = false;
                self.rebuild(false);
            }
            Action::SortReverse => {
                self.reversed = !self.reversed;
                self.rebuild(false);
            }
            Action::Group => {
                self.grouped = !self.grouped;
                self.rebuild(false);
            }
            Action::Enter | Action::Right | Action::Left => match row {
                Some(RowRef::Bank(b)) => {
                    if let Some(bank) = self.bank_rows.get(b as usize).map(|r| r.bank) {
                        let open = match a {
                            Action::Right => Some(true),
                            Action::Left => Some(false),
                            _ => None,
                        };
                        self.set_bank(bank, open);
                        self.rebuild(false);
                    }
                }
                Some(RowRef::Group(g)) => {
                    let layer = self.groups.get(g as usize).map(|g| g.key);
                    if let Some(layer) = layer {
                        let collapse = match a {
                            Action::Right => false,
                            Action::Left => true,
                            _ => !self.collapsed.contains(&layer),
                        };
                        if collapse {
                            self.collapsed.insert(layer);
                        } else {
                            self.collapsed.remove(&layer);
                        }
                        self.rebuild(false);
                    }
                }
                Some(RowRef::Tensor(i)) => {
                    let open = match a {
                        Action::Right => true,
                        Action::Left => false,
                        _ => !self.detail,
                    };
                    self.detail = open;
                    if open {
                        // Also a retry after a cancel.
                        self.start_stats(i as usize, ctx);
                    }
                }
                None => {}
            },
            Action::Back => {
                if self.detail {
                    self.detail = false;
                } else if !self.filter.is_empty() {
                    self.filter.clear();
                    self.rebuild(false);
                }
            }
            Action::Cancel => {
                if let Some((hash, _)) = self.running.take() {
                    ctx.jobs.cancel(JobKind::Stats);
                    self.cancelled = Some(hash);
                }
            }
            Action::Click(x, y) => {
                let areas = widget::areas(ctx.body, self.filter_shown(), self.detail);
                let r = areas.rows;
                if *x >= areas.table.x && *x < areas.table.right() && *y >= r.y && *y < r.bottom() {
                    let i = self.offset + (*y - r.y) as usize;
                    if i < self.rows.len() {
                        self.selected = i;
                    }
                }
            }
            _ => {}
        }
    }

    /// Starts the stats job of entry `i` unless its result is known or being computed.
    fn start_stats(&mut self, i: usize, ctx: &mut Ctx) {
        let Some((shard, e)) = self.entry(i) else {
            return;
        };
        if self.cache.contains_key(&e.hash)
            || self.errors.contains_key(&e.hash)
            || self.running.as_ref().is_some_and(|(h, _)| *h == e.hash)
        {
            return;
        }
        // The worker owns what it reads: the shard holding the tensor (shared) and the
        // entry (copied).
        let file = Arc::clone(&self.model.shards[shard]);
        let entry = e.clone();
        self.cancelled = None;
        self.running = Some((entry.hash, entry.name.clone()));
        self.jobs_started += 1;
        ctx.jobs.spawn(JobKind::Stats, move |cancel, report| {
            report(stats_report(&file, &entry, cancel))
        });
    }

    pub fn typing(&self) -> bool {
        self.typing
    }

    pub fn on_job(&mut self, r: &JobReport) {
        let JobReport::Stats { hash, result, .. } = r else {
            return;
        };
        let current = self.running.as_ref().is_some_and(|(h, _)| h == hash);
        match result {
            Ok(s) => {
                self.cache.insert(*hash, s.clone());
            }
            // A cancelled job was either superseded (its report is stale) or cancelled by
            // the user (already recorded when `Cancel` arrived).
            Err(e) if e == CANCELLED => return,
            Err(e) => {
                self.errors.insert(*hash, e.clone());
            }
        }
        if current {
            self.running = None;
        }
    }

    pub fn job_progress(&self) -> Option<(String, f64)> {
        // tensor_stats reports no progress: a half-full gauge says "working".
        self.running
            .as_ref()
            .map(|(_, name)| (format!("stats {}", esc(name)), 0.5))
    }

    /// `_file` is the primary shard (the app's); the count is the merged set's.
    pub fn status(&self, _file: &CmfFile) -> (String, String) {
        let total = self.model.tensor_count();
        let mut parts = vec![if self.filter.is_empty() {
            format!("{} tensors", group_digits(total as u64))
        } else {
            format!(
                "{} of {} tensors",
                group_digits(self.matched.len() as u64),
                group_digits(total as u64)
            )
        }];
        parts.push(self.sort_description());
        if self.grouped {
            parts.push("grouped by layer".into());
        }
        if !self.filter.is_empty() {
            parts.push(format!("filter: {}", esc(&self.filter)));
        }
        let hint = if self.typing {
            "type to filter · ↑↓ move · Enter keep · Esc clear"
        } else if self.running.is_some() {
            "c cancel · Enter close · / filter · s sort"
        } else if self.detail {
            "Enter/Esc close · ↑↓ next tensor · / filter · s sort"
        } else if matches!(
            self.rows.get(self.selected),
            Some(RowRef::Group(_) | RowRef::Bank(_))
        ) {
            "Enter folds/unfolds · / filter · s/S sort · g group"
        } else {
            "/ filter · s/S sort · g group · Enter details"
        };
        (parts.join(" · "), hint.into())
    }

    fn sort_description(&self) -> String {
        if self.by_match() {
            return if self.reversed {
                "worst matches first".into()
            } else {
                "best matches first".into()
            };
        }
        let arrow = if self.descending() { "↓" } else { "↑" };
        match self.sort {
            SortKey::Layer => format!("layer order {arrow}"),
            k => format!("sorted by {} {arrow}", k.label()),
        }
    }

    pub fn render(&self, f: &mut Frame, area: Rect, _file: &CmfFile, theme: &Theme) {
        let areas = widget::areas(area, self.filter_shown(), self.detail);
        let h = areas.rows.height as usize;
        let len = self.rows.len();
        let offset = visible_offset(self.offset, self.selected, h, len);
        let end = offset.saturating_add(h).min(len);
        let rows: Vec<RowVm> = self
            .rows
            .get(offset..end)
            .unwrap_or_default()
            .iter()
            .map(|&r| self.row_vm(r))
            .collect();
        let (sorted, name_note) = if self.by_match() {
            let note = if self.reversed {
                "· worst matches first"
            } else {
                "· best matches first"
            };
            (None, Some(note.to_string()))
        } else {
            let note = (self.sort == SortKey::Layer).then(|| "· layer order".to_string());
            (Some((self.sort.column(), self.descending())), note)
        };
        let title = if len == 0 {
            " tensors ".to_string()
        } else {
            format!(
                " tensors — row {} of {} ",
                group_digits(self.selected as u64 + 1),
                group_digits(len as u64)
            )
        };
        let vm = TensorsVm {
            title,
            widths: self.widths,
            shard_column: self.sharded(),
            sorted,
            name_note,
            selected: (self.selected >= offset && self.selected < end)
                .then(|| self.selected - offset),
            rows,
            total: len,
            offset,
            filter: self.filter_shown().then(|| FilterVm {
                text: esc(&self.filter),
                typing: self.typing,
                matches: self.matched.len(),
                total: self.model.tensor_count(),
            }),
            empty: if self.model.tensor_count() == 0 {
                "this file has no tensors".into()
            } else {
                format!("no tensor name matches “{}”", esc(&self.filter))
            },
            detail: self.detail.then(|| self.detail_vm()),
        };
        widget::render(f, area, &vm, theme);
    }

    fn row_vm(&self, r: RowRef) -> RowVm {
        match r {
            RowRef::Group(g) => {
                let (label, collapsed) = match self.groups.get(g as usize) {
                    Some(g) => (self.group_label(g), self.collapsed.contains(&g.key)),
                    None => (String::new(), false),
                };
                RowVm::Group {
                    label,
                    collapsed,
                    depth: 0,
                }
            }
            RowRef::Bank(b) => {
                let (label, collapsed) = match self.bank_rows.get(b as usize) {
                    Some(r) => (
                        self.bank_label(r),
                        !self.bank_open(r.bank, !self.filter.trim().is_empty()),
                    ),
                    None => (String::new(), false),
                };
                RowVm::Group {
                    label,
                    collapsed,
                    depth: 1,
                }
            }
            RowRef::Tensor(i) => match self.entry(i as usize) {
                Some((s, e)) => RowVm::Tensor {
                    cells: cells(e, s, self.model.shards.len()),
                },
                None => RowVm::Tensor {
                    cells: Default::default(),
                },
            },
        }
    }

    fn detail_vm(&self) -> DetailVm {
        match self.rows.get(self.selected) {
            Some(&RowRef::Tensor(i)) => match self.entry(i as usize) {
                Some((s, e)) => DetailVm {
                    title: format!(" {} ", esc(&e.name)),
                    facts: self.facts(i as usize, s, e),
                    stats: self.stats_vm(e),
                },
                None => message_panel(" details ", "no tensor selected"),
            },
            Some(&RowRef::Bank(b)) => match self.bank_rows.get(b as usize) {
                Some(r) => DetailVm {
                    title: format!(" {}* ", esc(&self.banks[r.bank as usize].prefix)),
                    facts: vec![
                        ("tensors".into(), group_digits(r.count as u64)),
                        ("experts".into(), group_digits(r.experts as u64)),
                        (
                            "bytes".into(),
                            format!("{} ({} B)", human_bytes(r.bytes), group_digits(r.bytes)),
                        ),
                        ("dtypes".into(), r.dtypes.join(", ")),
                    ],
                    stats: StatsVm::Message {
                        text: "a layer's experts: Enter expands or folds them; select a tensor for its statistics".into(),
                        bad: false,
                    },
                },
                None => message_panel(" details ", "no tensor selected"),
            },
            Some(&RowRef::Group(g)) => match self.groups.get(g as usize) {
                Some(gi) => DetailVm {
                    title: format!(" {} ", group_name(gi.key)),
                    facts: {
                        let mut v = Vec::new();
                        if let Some(k) = self.kind_of(gi.key) {
                            v.push(("kind".into(), k.to_string()));
                        }
                        v.push(("tensors".into(), group_digits(gi.count as u64)));
                        v.push((
                            "bytes".into(),
                            format!("{} ({} B)", human_bytes(gi.bytes), group_digits(gi.bytes)),
                        ));
                        v
                    },
                    stats: StatsVm::Message {
                        text: "a layer: Enter collapses or expands it; select a tensor for its statistics".into(),
                        bad: false,
                    },
                },
                None => message_panel(" details ", "no tensor selected"),
            },
            None => message_panel(" details ", "no tensor selected"),
        }
    }

    /// `i`: the merged index; `shard`: the shard holding the tensor.
    fn facts(&self, i: usize, shard: usize, e: &TensorEntry) -> Vec<(String, String)> {
        let mut dtype = e.dtype.name().to_string();
        if e.dtype.is_reserved() {
            dtype.push_str(" (reserved id: stored, not decodable)");
        }
        let file = &self.model.shards[shard];
        let absolute = file
            .envelope
            .data
            .off
            .checked_add(e.off)
            .map(group_digits)
            .unwrap_or_else(|| "overflows".into());
        let mut v = vec![
            ("dtype".into(), dtype),
            ("shape".into(), shape_str(&e.shape)),
            ("elements".into(), group_digits(e.numel())),
            (
                "bytes".into(),
                format!("{} ({} B)", human_bytes(e.nbytes), group_digits(e.nbytes)),
            ),
            ("bits/weight".into(), format!("{:.2}", e.bits_per_weight())),
            (
                "offset".into(),
                format!("{} in data · {} in file", group_digits(e.off), absolute),
            ),
            ("hash".into(), format!("{:016x}", e.hash)),
            (
                "layer".into(),
                match GroupKey::of(&e.name) {
                    GroupKey::Layer(l) => match self.kinds.get(&l) {
                        Some(k) => format!("{l} · {k}"),
                        None => l.to_string(),
                    },
                    GroupKey::Mtp => match e.layer() {
                        Some(b) => format!("MTP head · block {b}"),
                        None => "MTP head".into(),
                    },
                    GroupKey::Outside => "—".into(),
                },
            ),
        ];
        if self.sharded() {
            // Offsets and records count within the shard: name it first.
            let first = self.model.merged_index(shard, 0).unwrap_or(0);
            v.insert(
                0,
                (
                    "shard".into(),
                    format!(
                        "{} of {} · {}",
                        shard + 1,
                        self.model.shards.len(),
                        esc(&file_name(file))
                    ),
                ),
            );
            v.push((
                "record".into(),
                format!(
                    "{} of {} in the shard's directory",
                    group_digits((i - first) as u64 + 1),
                    group_digits(file.directory.len() as u64)
                ),
            ));
        } else {
            v.push((
                "record".into(),
                format!(
                    "{} of {} in the directory",
                    group_digits(i as u64 + 1),
                    group_digits(self.model.tensor_count() as u64)
                ),
            ));
        }
        v
    }

    fn stats_vm(&self, e: &TensorEntry) -> StatsVm {
        if let Some(s) = self.cache.get(&e.hash) {
            return StatsVm::Ready(ready_vm(s));
        }
        let message = |text: String, bad: bool| StatsVm::Message { text, bad };
        if self.running.as_ref().is_some_and(|(h, _)| *h == e.hash) {
            return message(
                format!(
                    "computing statistics of {} values… (c cancels)",
                    group_digits(e.numel())
                ),
                false,
            );
        }
        if let Some(err) = self.errors.get(&e.hash) {
            return message(format!("cannot compute statistics: {}", esc(err)), true);
        }
        if self.cancelled == Some(e.hash) {
            return message(
                "statistics cancelled — → (Right) computes them again".into(),
                true,
            );
        }
        message(
            "statistics not computed — → (Right) computes them".into(),
            false,
        )
    }
}

/// What the worker thread does: decode and summarise one tensor, or say why not.
fn stats_report(file: &CmfFile, e: &TensorEntry, cancel: &AtomicBool) -> JobReport {
    // A decoder bug must not leave the panel saying "computing" forever.
    let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| {
        // An answer streaming in the chat has the cores: statistics wait for it.
        cortiq_engine::exec::yield_to_foreground(&|| {
            cancel.load(std::sync::atomic::Ordering::Relaxed)
        });
        tensor_stats(e.dtype, &e.shape, file.tensor_bytes(e), cancel)
    }));
    let result = match outcome {
        Ok(Ok(s)) => Ok(Arc::new(s)),
        Ok(Err(StatsError::Cancelled)) => Err(CANCELLED.to_string()),
        Ok(Err(err)) => Err(err.to_string()),
        Err(_) => Err("the decoder failed on this tensor (see the log)".to_string()),
    };
    JobReport::Stats {
        hash: e.hash,
        name: e.name.clone(),
        result,
    }
}

fn message_panel(title: &str, text: &str) -> DetailVm {
    DetailVm {
        title: title.into(),
        facts: Vec::new(),
        stats: StatsVm::Message {
            text: text.into(),
            bad: false,
        },
    }
}

fn ready_vm(s: &TensorStats) -> StatsReadyVm {
    let stat = |key: &str, value: String, flag: bool| Stat {
        key: key.into(),
        value,
        flag,
    };
    let finite = s.count.saturating_sub(s.nan).saturating_sub(s.inf);
    let zero_pct = if s.count > 0 {
        s.zeros as f64 * 100.0 / s.count as f64
    } else {
        0.0
    };
    let (min, max) = (s.min as f64, s.max as f64);
    StatsReadyVm {
        lines: vec![
            vec![
                stat("min", fmt_value(min), false),
                stat("max", fmt_value(max), false),
                stat("mean", fmt_value(s.mean), false),
                stat("std", fmt_value(s.std), false),
            ],
            vec![
                stat(
                    "zeros",
                    format!("{} ({zero_pct:.2}%)", group_digits(s.zeros)),
                    false,
                ),
                stat("NaN", group_digits(s.nan), s.nan > 0),
                stat("Inf", group_digits(s.inf), s.inf > 0),
                stat(
                    &format!("outliers >{OUTLIER_SIGMAS}σ"),
                    group_digits(s.outliers),
                    s.outliers > 0,
                ),
            ],
        ],
        caption: format!(
            "histogram of {} finite values · {} bins of {} · peak {}",
            group_digits(finite),
            s.histogram.len(),
            fmt_value((max - min) / s.histogram.len().max(1) as f64),
            group_digits(s.histogram.iter().copied().max().unwrap_or(0))
        ),
        histogram: s.histogram.clone(),
        min: fmt_value(min),
        max: fmt_value(max),
        zero: (min < 0.0 && max > 0.0).then(|| -min / (max - min)),
    }
}

/// Four significant digits, scientific notation outside [0.001, 100000).
fn fmt_value(x: f64) -> String {
    if !x.is_finite() {
        return x.to_string();
    }
    if x == 0.0 {
        return "0".into();
    }
    let a = x.abs();
    if (1e-3..1e5).contains(&a) {
        let decimals = (3 - a.log10().floor() as i32).clamp(0, 6) as usize;
        format!("{x:.decimals$}")
    } else {
        format!("{x:.3e}")
    }
}

fn group_name(key: GroupKey) -> String {
    match key {
        GroupKey::Layer(l) => format!("layer {l}"),
        GroupKey::Outside => "outside layers".into(),
        GroupKey::Mtp => "MTP head".into(),
    }
}

fn plural(n: usize, one: &str, many: &str) -> String {
    format!(
        "{} {}",
        group_digits(n as u64),
        if n == 1 { one } else { many }
    )
}

impl TensorsState {
    /// What the group's layer is made of (`linear·MoE 8e`).
    fn kind_of(&self, key: GroupKey) -> Option<&str> {
        match key {
            GroupKey::Layer(l) => self.kinds.get(&l).map(String::as_str),
            GroupKey::Mtp => self.mtp_kind.as_deref(),
            GroupKey::Outside => None,
        }
    }

    /// `layer 1 · full·MoE 8e · 29 tensors · 60.0 KiB`.
    fn group_label(&self, g: &GroupInfo) -> String {
        let mut s = group_name(g.key);
        if let Some(k) = self.kind_of(g.key) {
            s.push_str(" · ");
            s.push_str(k);
        }
        format!(
            "{s} · {} · {}",
            plural(g.count, "tensor", "tensors"),
            human_bytes(g.bytes)
        )
    }

    /// `model.layers.1.mlp.experts.* — 24 tensors, 8 experts, 48.0 KiB, q8_row`.
    fn bank_label(&self, r: &BankRow) -> String {
        format!(
            "{}* — {}, {}, {}, {}",
            esc(&self.banks[r.bank as usize].prefix),
            plural(r.count, "tensor", "tensors"),
            if r.experts == 0 {
                "fused".to_string()
            } else {
                plural(r.experts, "expert", "experts")
            },
            human_bytes(r.bytes),
            r.dtypes.join(" ")
        )
    }
}

/// Each tensor's bank of experts and expert number (`…mlp.experts.{e}.…`), and the banks.
fn expert_banks(entries: &[&TensorEntry]) -> (Vec<Option<(u32, u32)>>, Vec<Bank>) {
    const MARK: &str = ".mlp.experts.";
    let mut banks: Vec<Bank> = Vec::new();
    let mut by_prefix: HashMap<&str, u32> = HashMap::new();
    let of = entries
        .iter()
        .map(|e| {
            let at = e.name.find(MARK)? + MARK.len();
            let (prefix, rest) = e.name.split_at(at);
            // A fused bank (`experts.gate_up_proj`) is one tensor of every expert.
            let expert = rest
                .split('.')
                .next()
                .and_then(|d| d.parse::<u32>().ok())
                .unwrap_or(u32::MAX);
            let b = *by_prefix.entry(prefix).or_insert_with(|| {
                banks.push(Bank {
                    prefix: prefix.to_string(),
                });
                banks.len() as u32 - 1
            });
            Some((b, expert))
        })
        .collect();
    (of, banks)
}

/// The name of a shard's file, as the detail panel shows it.
fn file_name(file: &CmfFile) -> String {
    file.path
        .as_ref()
        .and_then(|p| p.file_name())
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "(in memory)".into())
}

/// `shard` of `count` shards: the cell reads `2/3`, empty for a single file.
fn cells(e: &TensorEntry, shard: usize, count: usize) -> [String; widget::COLS] {
    [
        esc(&e.name),
        e.dtype.name().to_string(),
        shape_str(&e.shape),
        group_digits(e.numel()),
        human_bytes(e.nbytes),
        format!("{:.2}", e.bits_per_weight()),
        if count > 1 {
            format!("{}/{count}", shard + 1)
        } else {
            String::new()
        },
        group_digits(e.off),
        format!("{:016x}", e.hash),
    ]
}

/// Widths of the columns over the whole directory (`(shard, entry)` pairs of `shards`
/// shards), so they do not jump while scrolling. Measured without formatting every entry
/// (10⁵ names open in a blink): a number's width grows with its value, so only maxima are
/// formatted.
fn column_widths<'a>(
    entries: impl Iterator<Item = (usize, &'a TensorEntry)> + Clone,
    shards: usize,
) -> [usize; widget::COLS] {
    let digits = |n: u64| n.checked_ilog10().map_or(1, |d| d as usize + 1);
    let mut w = [0usize; widget::COLS];
    // Largest size per unit of `human_bytes` (B, KiB, MiB, GiB, TiB and beyond).
    let mut largest_in_unit = [None::<u64>; 5];
    let mut max_bits = 0f64;
    for (_, e) in entries.clone() {
        let plain = e.name.bytes().all(|b| (0x20..0x7f).contains(&b));
        let name_w = if plain {
            e.name.len()
        } else {
            Span::raw(esc(&e.name)).width()
        };
        w[0] = w[0].max(name_w);
        w[1] = w[1].max(e.dtype.name().len());
        let shape_w = 2 + e.shape.iter().map(|&d| digits(d) + 2).sum::<usize>()
            - 2 * usize::from(!e.shape.is_empty());
        w[2] = w[2].max(shape_w);
        let unit = (e.nbytes.max(1).ilog2() / 10).min(4) as usize;
        let slot = &mut largest_in_unit[unit];
        *slot = Some(slot.map_or(e.nbytes, |m| m.max(e.nbytes)));
        max_bits = max_bits.max(e.bits_per_weight());
    }
    let max = |f: fn(&TensorEntry) -> u64| entries.clone().map(|(_, e)| f(e)).max().unwrap_or(0);
    w[3] = group_digits(max(|e| e.numel())).len();
    w[4] = largest_in_unit
        .iter()
        .flatten()
        .map(|&n| human_bytes(n).len())
        .max()
        .unwrap_or(0);
    w[5] = format!("{max_bits:.2}").len();
    w[widget::SHARD] = if shards > 1 {
        2 * digits(shards as u64) + 1
    } else {
        0
    };
    w[widget::OFFSET] = group_digits(max(|e| e.off)).len();
    w[widget::HASH] = 16;
    w
}

/// `ranks[order[k]] = k`.
fn ranks(order: &[u32]) -> Vec<u32> {
    let mut r = vec![0u32; order.len()];
    for (k, &i) in order.iter().enumerate() {
        r[i as usize] = k as u32;
    }
    r
}

/// The first row shown so that `selected` is visible in `h` rows, moving as little as
/// possible from `offset` and never leaving blank lines at the bottom.
fn visible_offset(offset: usize, selected: usize, h: usize, len: usize) -> usize {
    let h = h.max(1);
    let mut off = offset;
    if selected < off {
        off = selected;
    } else if selected >= off + h {
        off = selected + 1 - h;
    }
    off.min(len.saturating_sub(h))
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};
    use std::sync::atomic::AtomicBool;
    use std::time::Instant;

    use cortiq_engine::format::writer::{self, TensorPlan, WriteSpec};
    use cortiq_engine::format::{CmfFile, DType, SectionKind};

    use super::super::jobs::{JobKind, JobReport};
    use super::super::testing::Harness;
    use super::super::{Action, App, Screen};
    use super::*;

    fn state(app: &App) -> &TensorsState {
        match &app.screen {
            Screen::Model(m) => m.tensors.as_ref().expect("the Tensors view was visited"),
            _ => panic!("no model open"),
        }
    }

    fn file(app: &App) -> &CmfFile {
        match &app.screen {
            Screen::Model(m) => &m.file,
            _ => panic!("no model open"),
        }
    }

    fn model(app: &App) -> &Arc<CmfModel> {
        match &app.screen {
            Screen::Model(m) => &m.model,
            _ => panic!("no model open"),
        }
    }

    /// Names of the tensor rows, in display order.
    fn names(app: &App) -> Vec<String> {
        entries_in_order(app)
            .into_iter()
            .map(|e| e.name.clone())
            .collect()
    }

    fn entries_in_order(app: &App) -> Vec<&TensorEntry> {
        shards_and_entries(app)
            .into_iter()
            .map(|(_, e)| e)
            .collect()
    }

    /// The tensor rows in display order, with the shard of each.
    fn shards_and_entries(app: &App) -> Vec<(usize, &TensorEntry)> {
        let s = state(app);
        s.rows
            .iter()
            .filter_map(|r| match r {
                RowRef::Tensor(i) => s.model.tensor_at(*i as usize),
                RowRef::Group(_) | RowRef::Bank(_) => None,
            })
            .collect()
    }

    fn group_keys(app: &App) -> Vec<GroupKey> {
        let s = state(app);
        s.rows
            .iter()
            .filter_map(|r| match r {
                RowRef::Group(g) => Some(s.groups[*g as usize].key),
                RowRef::Tensor(_) | RowRef::Bank(_) => None,
            })
            .collect()
    }

    /// Labels of the expert banks' rows, in display order.
    fn bank_labels(app: &App) -> Vec<String> {
        let s = state(app);
        s.rows
            .iter()
            .filter_map(|r| match r {
                RowRef::Bank(b) => Some(s.bank_label(&s.bank_rows[*b as usize])),
                _ => None,
            })
            .collect()
    }

    fn names_at(app: &App, i: usize) -> String {
        model(app).tensor_at(i).unwrap().1.name.clone()
    }

    /// The decoder layer of each group (`None` outside layers); no MTP head expected.
    fn group_layers(app: &App) -> Vec<Option<u64>> {
        group_keys(app)
            .into_iter()
            .map(|k| match k {
                GroupKey::Layer(l) => Some(l),
                GroupKey::Outside => None,
                GroupKey::Mtp => panic!("an MTP group"),
            })
            .collect()
    }

    fn moe() -> Harness {
        let mut h = Harness::fixture("qwen3_moe-masked.cmf");
        h.act(Action::GoTab(1));
        h
    }

    /// Writes `tensors` (name, dtype, shape) with `payload(k)` bytes into `dir`.
    fn write_synthetic(
        dir: &Path,
        tensors: Vec<(String, DType, Vec<u64>)>,
        payload: impl Fn(usize, &TensorPlan) -> Vec<u8>,
    ) -> PathBuf {
        let path = dir.join("synthetic.cmf");
        let plans: Vec<TensorPlan> = tensors
            .into_iter()
            .map(|(name, dtype, shape)| TensorPlan { name, dtype, shape })
            .collect();
        let payloads: Vec<Vec<u8>> = plans
            .iter()
            .enumerate()
            .map(|(k, p)| payload(k, p))
            .collect();
        let spec = WriteSpec {
            tensors: plans,
            ..Default::default()
        };
        writer::write_file(&path, spec, payloads.iter().map(|p| p.as_slice()))
            .expect("write the synthetic file");
        path
    }

    // --- fuzzy matching ---------------------------------------------------------------

    fn score(pattern: &str, name: &str) -> Option<i32> {
        Fuzzy::new(pattern).score(&name.to_lowercase())
    }

    #[test]
    fn fuzzy_matches_subsequences_case_insensitively() {
        assert!(score("qproj", "model.layers.0.self_attn.q_proj.weight").is_some());
        assert!(score("Q_PROJ", "model.layers.0.self_attn.q_proj.weight").is_some());
        assert!(score("jorp_q", "model.layers.0.self_attn.q_proj.weight").is_none());
        assert!(score("zz", "lm_head.weight").is_none());
        assert_eq!(score("", "anything"), Some(0));
        assert_eq!(score("   ", "anything"), Some(0));
        // Every whitespace-separated term must match.
        assert!(score("q_proj 3", "model.layers.3.self_attn.q_proj.weight").is_some());
        assert!(score("q_proj x", "model.layers.3.self_attn.q_proj.weight").is_none());
    }

    #[test]
    fn fuzzy_ranks_contiguous_and_boundary_matches_first() {
        let contiguous = score("proj", "a.q_proj.w").unwrap();
        let scattered = score("proj", "a.p_r_o_j.w").unwrap();
        assert!(contiguous > scattered, "{contiguous} vs {scattered}");
        let at_boundary = score("proj", "a.proj").unwrap();
        let inside = score("proj", "a.xproj").unwrap();
        assert!(at_boundary > inside, "{at_boundary} vs {inside}");
        // A whole component beats a prefix of a longer one.
        let whole = score("experts.7", "mlp.experts.7.up_proj").unwrap();
        let prefix = score("experts.7", "mlp.experts.70.up_proj").unwrap();
        let gapped = score("experts.7", "mlp.experts.17.up_proj").unwrap();
        assert!(
            whole > prefix && prefix > gapped,
            "{whole} {prefix} {gapped}"
        );
        // The best alignment wins over the first greedy one: `q_proj` matches the
        // component, not the q of `q_norm` followed by a far `_proj`.
        let best = score("q_proj", "layers.0.q_norm.x.q_proj").unwrap();
        assert_eq!(best, score("q_proj", "q_proj").unwrap());
        // Hostile lengths stay cheap and still match.
        let long = format!("{}q_proj", "x".repeat(10_000));
        assert!(score("q_proj", &long).is_some());
    }

    #[test]
    fn column_widths_equal_the_widest_formatted_cells() {
        for name in ["qwen3_moe-masked.cmf", "qwen3-vbit.cmf", "gemma3-q8.cmf"] {
            let f = CmfFile::open(super::super::testing::fixture(name)).unwrap();
            let mut want = [0usize; widget::COLS];
            for e in f.directory.iter() {
                for (c, cell) in cells(e, 0, 1).iter().enumerate() {
                    want[c] = want[c].max(Span::raw(cell.as_str()).width());
                }
            }
            let es = f.directory.iter().map(|e| (0, e));
            assert_eq!(column_widths(es, 1), want, "{name}");
        }
        let e = |name: &str, nbytes: u64| TensorEntry {
            name: name.into(),
            dtype: DType::U8,
            shape: vec![nbytes],
            off: 0,
            nbytes,
            hash: 0,
        };
        let es = [
            e("a\u{1}b", 1023),
            e("é", 1024 * 1023 + 1000),
            e("x", 5 << 30),
        ];
        // Spread over 10 shards: the shard cell is as wide as `10/10`.
        let mut want = [0usize; widget::COLS];
        for (k, x) in es.iter().enumerate() {
            for (c, cell) in cells(x, k * 9 / 2, 10).iter().enumerate() {
                want[c] = want[c].max(Span::raw(cell.as_str()).width());
            }
        }
        let spread = es.iter().enumerate().map(|(k, e)| (k * 9 / 2, e));
        assert_eq!(column_widths(spread, 10), want);
    }

    // --- the table ----------------------------------------------------------------------

    #[test]
    fn table_snapshot_and_navigation() {
        let mut h = moe();
        insta::assert_snapshot!("tensors_table_moe_masked", h.render());
        let n = file(&h.app).directory.len();
        assert_eq!(names(&h.app).len(), n);
        // Natural layer order: outside layers first, then layer by layer.
        let first = names(&h.app);
        assert_eq!(
            &first[..4],
            &[
                "lm_head.weight",
                "model.embed_tokens.weight",
                "model.norm.weight",
                "model.layers.0.input_layernorm.weight"
            ]
        );
        h.act(Action::End);
        assert_eq!(state(&h.app).selected, n - 1);
        let screen = h.render();
        assert!(screen.contains(&format!("row {n} of {n}")), "{screen}");
        assert!(screen.contains(&format!("▶ {}", first[n - 1])), "{screen}");
        h.act(Action::Home).act(Action::PageDown);
        assert!(state(&h.app).selected > 10);
        h.act(Action::PageUp);
        assert_eq!(state(&h.app).selected, 0);
        // A click on the fourth data row selects it; the wheel moves.
        let screen = h.render();
        let y = screen
            .lines()
            .position(|l| l.contains("model.layers.0.input_layernorm.weight"))
            .expect("row on screen") as u16;
        h.act(Action::Click(10, y));
        assert_eq!(state(&h.app).selected, 3);
        h.act(Action::ScrollDown)
            .act(Action::ScrollDown)
            .act(Action::ScrollUp);
        assert_eq!(state(&h.app).selected, 4);
        let (status, hint) = state(&h.app).status(file(&h.app));
        assert_eq!(status, format!("{n} tensors · layer order ↑"));
        assert!(hint.contains("/ filter"), "{hint}");
    }

    #[test]
    fn filter_narrows_to_matching_names() {
        let mut h = moe();
        h.act(Action::Filter);
        assert!(h.app.typing());
        h.type_text("experts.7");
        insta::assert_snapshot!("tensors_filtered_experts7", h.render());
        let got = names(&h.app);
        assert_eq!(got.len(), 4 * 3, "{got:?}");
        assert!(got.iter().all(|n| n.contains(".experts.7.")), "{got:?}");
        // Layers in natural order among equal matches.
        assert!(got[0].starts_with("model.layers.0.") && got[11].starts_with("model.layers.3."));
        // Erase widens again, Enter keeps the filter and stops typing.
        h.act(Action::Erase);
        assert_eq!(names(&h.app).len(), 8 * 4 * 3);
        h.type_text("7").act(Action::Enter);
        assert!(!h.app.typing());
        assert_eq!(names(&h.app).len(), 12);
        let (status, _) = state(&h.app).status(file(&h.app));
        assert!(
            status.starts_with("12 of 135 tensors · best matches first"),
            "{status}"
        );
        assert!(status.ends_with("filter: experts.7"), "{status}");
        // Keys command again; Esc clears the filter.
        h.act(Action::Down);
        assert_eq!(state(&h.app).selected, 1);
        h.act(Action::Back);
        assert_eq!(names(&h.app).len(), 135);
        // Esc while typing clears too; a filter that matches nothing says so.
        h.act(Action::Filter).type_text("zzz");
        assert!(names(&h.app).is_empty());
        assert!(h.render().contains("no tensor name matches “zzz”"));
        h.act(Action::Back);
        assert!(!h.app.typing());
        assert_eq!(names(&h.app).len(), 135);
        // Subsequences match, ranked after contiguous matches.
        h.act(Action::Filter).type_text("lmhead");
        assert_eq!(names(&h.app), vec!["lm_head.weight"]);
    }

    #[test]
    fn sort_cycles_columns_and_reverse_flips() {
        let mut h = moe();
        let largest = |h: &Harness| {
            let es = entries_in_order(&h.app);
            es.windows(2).all(|w| w[0].nbytes >= w[1].nbytes)
        };
        // layer → name → dtype → elements → bytes
        h.act(Action::SortNext);
        assert_eq!(state(&h.app).sort, SortKey::Name);
        let n = names(&h.app);
        let mut sorted = n.clone();
        sorted.sort_by(|a, b| natural_cmp(a, b));
        assert_eq!(n, sorted);
        h.acts([Action::SortNext, Action::SortNext, Action::SortNext]);
        assert_eq!(state(&h.app).sort, SortKey::Bytes);
        assert!(largest(&h));
        let es = entries_in_order(&h.app);
        let max = es.iter().map(|e| e.nbytes).max().unwrap();
        assert_eq!(es[0].nbytes, max);
        // Ties keep the natural order: lm_head before embed_tokens (same size).
        assert_eq!(es[0].name, "lm_head.weight");
        let screen = h.render();
        assert!(screen.contains("bytes ↓"), "{screen}");
        let (status, _) = state(&h.app).status(file(&h.app));
        assert_eq!(status, "135 tensors · sorted by bytes ↓");
        h.act(Action::SortReverse);
        let es = entries_in_order(&h.app);
        assert!(es.windows(2).all(|w| w[0].nbytes <= w[1].nbytes));
        assert!(h.render().contains("bytes ↑"));
        // The cursor stays on the same tensor through re-sorting.
        let before = names(&h.app)[state(&h.app).selected].clone();
        h.act(Action::SortNext);
        assert_eq!(state(&h.app).sort, SortKey::Bits);
        assert_eq!(names(&h.app)[state(&h.app).selected], before);
        h.act(Action::SortNext);
        let es = entries_in_order(&h.app);
        assert!(es.windows(2).all(|w| w[0].off < w[1].off));
        h.act(Action::SortNext);
        let es = entries_in_order(&h.app);
        assert!(es.windows(2).all(|w| w[0].hash <= w[1].hash));
        h.act(Action::SortNext);
        assert_eq!(state(&h.app).sort, SortKey::Layer);
        assert_eq!(names(&h.app)[0], "lm_head.weight");
    }

    #[test]
    fn grouping_by_layer() {
        let mut h = moe();
        h.act(Action::Group);
        insta::assert_snapshot!("tensors_grouped", h.render());
        assert_eq!(
            group_layers(&h.app),
            vec![None, Some(0), Some(1), Some(2), Some(3)]
        );
        // Each layer's 24 expert tensors fold into one row beside the layer's kind.
        assert_eq!(names(&h.app).len(), 135 - 4 * 24);
        assert_eq!(bank_labels(&h.app).len(), 4);
        let screen = h.render();
        assert!(
            screen.contains("▾ layer 2 · full·MoE 8e · 33 tensors · 63.7 KiB"),
            "{screen}"
        );
        assert!(
            screen.contains(
                "  ▸ model.layers.0.mlp.experts.* — 24 tensors, 8 experts, 50.0 KiB, q8_row"
            ),
            "{screen}"
        );
        // Enter on a header collapses the layer; the cursor stays on it.
        h.act(Action::Down); // first tensor outside layers
        h.act(Action::Home);
        h.act(Action::Enter);
        assert_eq!(names(&h.app).len(), 36);
        assert!(h.render().contains("▸ outside layers · 3 tensors"));
        h.act(Action::Right);
        assert_eq!(names(&h.app).len(), 39);
        // Grouping keeps the chosen order inside each layer.
        h.acts(std::iter::repeat_n(Action::SortNext, 4)); // bytes
        let es = entries_in_order(&h.app);
        let layer0: Vec<_> = es.iter().filter(|e| e.layer() == Some(0)).collect();
        assert!(layer0.windows(2).all(|w| w[0].nbytes >= w[1].nbytes));
        assert_eq!(
            group_layers(&h.app),
            vec![None, Some(0), Some(1), Some(2), Some(3)]
        );
        h.act(Action::Group);
        assert!(group_layers(&h.app).is_empty());
        assert!(bank_labels(&h.app).is_empty());
        assert_eq!(names(&h.app).len(), 135);
    }

    #[test]
    fn a_layers_experts_expand_fold_and_follow_the_filter() {
        let mut h = moe();
        h.act(Action::Group);
        let bank_row = |h: &Harness, layer: u64| {
            let s = state(&h.app);
            s.rows
                .iter()
                .position(|r| match r {
                    RowRef::Bank(b) => {
                        s.banks[s.bank_rows[*b as usize].bank as usize].prefix
                            == format!("model.layers.{layer}.mlp.experts.")
                    }
                    _ => false,
                })
                .expect("the bank row")
        };
        // Enter on layer 1's bank opens it: its 24 tensors right below, in layer order.
        let at = bank_row(&h, 1);
        h.act(Action::Home)
            .acts(std::iter::repeat_n(Action::Down, at));
        let (_, hint) = state(&h.app).status(file(&h.app));
        assert!(hint.contains("Enter folds/unfolds"), "{hint}");
        h.act(Action::Enter);
        assert_eq!(names(&h.app).len(), 39 + 24);
        let s = state(&h.app);
        let below: Vec<String> = s.rows[at + 1..at + 25]
            .iter()
            .map(|r| match r {
                RowRef::Tensor(i) => s.model.tensor_at(*i as usize).unwrap().1.name.clone(),
                _ => panic!("a tensor row"),
            })
            .collect();
        assert_eq!(below[0], "model.layers.1.mlp.experts.0.down_proj.weight");
        assert_eq!(below[23], "model.layers.1.mlp.experts.7.up_proj.weight");
        assert!(matches!(s.rows[at + 25], RowRef::Tensor(_)));
        // The panel says what the bank holds.
        h.act(Action::Enter).act(Action::Left);
        assert_eq!(names(&h.app).len(), 39);
        h.act(Action::Right);
        assert_eq!(names(&h.app).len(), 63);
        // A tensor inside, then folding from a neighbour: the cursor lands on the bank.
        h.act(Action::Down);
        assert_eq!(
            state(&h.app).selected_tensor().map(|i| names_at(&h.app, i)),
            Some("model.layers.1.mlp.experts.0.down_proj.weight".into())
        );
        h.act(Action::Up).act(Action::Left);
        assert_eq!(state(&h.app).selected, at);
        // The detail panel of a bank: its facts, no statistics.
        let screen = {
            let st = state(&h.app);
            let d = st.detail_vm();
            assert_eq!(d.title, " model.layers.1.mlp.experts.* ");
            d.facts
        };
        assert!(
            screen.contains(&("experts".into(), "8".into())),
            "{screen:?}"
        );
        assert!(
            screen.contains(&("dtypes".into(), "q8_row".into())),
            "{screen:?}"
        );
        h.act(Action::Right);
        assert_eq!(names(&h.app).len(), 63);
        // With a filter, banks start open (the matches are the point) and fold on Enter.
        h.act(Action::Filter)
            .type_text("experts.7")
            .act(Action::Enter);
        assert_eq!(names(&h.app).len(), 12);
        assert!(
            bank_labels(&h.app)
                .iter()
                .all(|l| l.contains("— 3 tensors, 1 expert, ")),
            "{:?}",
            bank_labels(&h.app)
        );
        let at = bank_row(&h, 2);
        h.act(Action::Home)
            .acts(std::iter::repeat_n(Action::Down, at));
        h.act(Action::Enter);
        assert_eq!(names(&h.app).len(), 9);
        // Clearing the filter brings back the unfiltered choices: only layer 1 open.
        h.act(Action::Back);
        assert_eq!(names(&h.app).len(), 63);
        h.act(Action::Filter)
            .type_text("experts.7")
            .act(Action::Enter);
        assert_eq!(names(&h.app).len(), 9);
        // Sorting keeps each bank together, its members in the chosen order.
        h.act(Action::Back);
        h.acts(std::iter::repeat_n(Action::SortNext, 4)); // bytes
        let s = state(&h.app);
        let at = bank_row(&h, 1);
        let members: Vec<&TensorEntry> = s.rows[at + 1..at + 25]
            .iter()
            .map(|r| match r {
                RowRef::Tensor(i) => s.model.tensor_at(*i as usize).unwrap().1,
                _ => panic!("a tensor row"),
            })
            .collect();
        assert!(members.iter().all(|e| e.name.contains(".experts.")));
        assert!(members.windows(2).all(|w| w[0].nbytes >= w[1].nbytes));
    }

    /// The screen without its first line (the tab bar belongs to the app, not this view).
    fn body(screen: &str) -> String {
        screen.lines().skip(1).collect::<Vec<_>>().join("\n")
    }

    #[test]
    fn grouped_hybrid_and_moe_files_show_layer_kinds_and_expert_banks() {
        // Qwen3.5: three Gated DeltaNet layers and a gated full-attention layer; no experts.
        let mut h = Harness::fixture("qwen3_5-q8.cmf");
        h.height = 64;
        h.act(Action::GoTab(1)).act(Action::Group);
        let screen = h.render();
        insta::assert_snapshot!("tensors_grouped_qwen3_5", body(&screen));
        for want in [
            "▾ layer 0 · linear·dense 128 · 14 tensors",
            "▾ layer 2 · linear·dense 128 · 14 tensors",
            "▾ layer 3 · full(gated)·dense 128 · 11 tensors",
        ] {
            assert!(screen.contains(want), "{want}\n{screen}");
        }
        assert!(bank_labels(&h.app).is_empty());
        assert_eq!(names(&h.app).len(), 56);

        // Qwen3-MoE: layer 2's bank opened, the others folded.
        let mut h = Harness::fixture("qwen3_moe-q8.cmf");
        h.height = 48;
        h.act(Action::GoTab(1)).act(Action::Group);
        let at = {
            let s = state(&h.app);
            s.rows
                .iter()
                .filter(|r| matches!(r, RowRef::Bank(_)))
                .nth(2)
                .and_then(|b| s.rows.iter().position(|r| r == b))
                .unwrap()
        };
        h.act(Action::Home)
            .acts(std::iter::repeat_n(Action::Down, at))
            .act(Action::Enter);
        let screen = h.render();
        insta::assert_snapshot!("tensors_grouped_qwen3_moe_bank_open", body(&screen));
        assert!(
            screen.contains(
                "▾ model.layers.2.mlp.experts.* — 24 tensors, 8 experts, 50.0 KiB, q8_row"
            ),
            "{screen}"
        );
        assert!(
            screen.contains("▸ model.layers.1.mlp.experts.* — 24 tensors"),
            "{screen}"
        );
        assert_eq!(bank_labels(&h.app).len(), 4);
        assert_eq!(names(&h.app).len(), 135 - 3 * 24);
    }

    #[test]
    fn a_fused_expert_bank_folds_too() {
        let dir = tempfile::tempdir().unwrap();
        let path = write_synthetic(
            dir.path(),
            vec![
                (
                    "model.layers.0.mlp.gate.weight".into(),
                    DType::F16,
                    vec![5, 9],
                ),
                (
                    "model.layers.0.mlp.experts.gate_up_proj".into(),
                    DType::F16,
                    vec![5, 6, 9],
                ),
                (
                    "model.layers.0.mlp.experts.down_proj".into(),
                    DType::F16,
                    vec![5, 9, 3],
                ),
            ],
            |_, p| vec![0; 2 * p.shape.iter().product::<u64>() as usize],
        );
        let mut h = Harness::open(&path);
        h.act(Action::GoTab(1)).act(Action::Group);
        assert_eq!(
            bank_labels(&h.app),
            ["model.layers.0.mlp.experts.* — 2 tensors, fused, 810 B, f16"]
        );
        let screen = h.render();
        assert!(
            screen.contains("▾ layer 0 · no mixer·MoE 5e · 3 tensors"),
            "{screen}"
        );
        assert_eq!(names(&h.app), ["model.layers.0.mlp.gate.weight"]);
    }

    #[test]
    fn hybrid_layers_and_the_mtp_head_group_by_kind() {
        use cortiq_engine::tinymodel::{write_tiny, TinySpec};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hybrid.cmf");
        write_tiny(
            &path,
            &TinySpec {
                mtp: true,
                ..TinySpec::hybrid()
            },
        )
        .unwrap();
        let mut h = Harness::open(&path);
        h.act(Action::GoTab(1)).act(Action::Group);
        assert_eq!(
            group_keys(&h.app),
            vec![
                GroupKey::Outside,
                GroupKey::Layer(0),
                GroupKey::Layer(1),
                GroupKey::Layer(2),
                GroupKey::Layer(3),
                GroupKey::Mtp
            ]
        );
        h.height = 60;
        let screen = h.render();
        for want in [
            "▾ layer 0 · linear·MoE 7e+shared · ",
            "▾ layer 1 · full(gated)·dense 120 · ",
            "▾ layer 2 · linear·dense 96 · ",
            "▾ layer 3 · full·MoE 7e · ",
            "▸ model.layers.0.mlp.experts.* — 21 tensors, 7 experts,",
            "▸ model.layers.3.mlp.experts.* — 21 tensors, 7 experts,",
        ] {
            assert!(screen.contains(want), "{want}\n{screen}");
        }
        let s = state(&h.app);
        let mtp = s.groups.iter().find(|g| g.key == GroupKey::Mtp).unwrap();
        let in_mtp = s
            .model
            .tensors()
            .filter(|(_, e)| e.name.starts_with("model.mtp."))
            .count();
        assert_eq!(
            s.group_label(mtp),
            format!(
                "MTP head · full·dense 144 · {in_mtp} tensors · {}",
                human_bytes(mtp.bytes)
            )
        );
        h.act(Action::End);
        assert!(h.render().contains("▾ MTP head · full·dense 144 · "));
        // The shared expert is not one of the routed experts: it stays in the layer.
        assert!(
            screen.contains("model.layers.0.mlp.shared_expert.up_proj.weight"),
            "{screen}"
        );
        // model.mtp.layers.0.* belongs to the head, not to layer 0.
        let s = state(&h.app);
        let l0 = s
            .groups
            .iter()
            .find(|g| g.key == GroupKey::Layer(0))
            .unwrap();
        let in_l0 = s
            .model
            .tensors()
            .filter(|(_, e)| e.name.starts_with("model.layers.0."))
            .count();
        assert_eq!(l0.count, in_l0);
        // Flat layer order puts the head last.
        h.act(Action::Group);
        let all = names(&h.app);
        assert!(all.last().unwrap().starts_with("model.mtp."), "{all:?}");
        let head = all.iter().filter(|n| n.starts_with("model.mtp.")).count();
        assert!(head > 10, "{all:?}");
        assert!(all[all.len() - head..]
            .iter()
            .all(|n| n.starts_with("model.mtp.")));
    }

    #[test]
    fn detail_panel_shows_statistics_computed_in_the_background() {
        let mut h = moe();
        assert_eq!(names(&h.app)[0], "lm_head.weight");
        h.act(Action::Enter);
        assert!(state(&h.app).detail);
        let progress = state(&h.app).job_progress();
        assert!(
            progress.is_none() || progress.as_ref().unwrap().0 == "stats lm_head.weight",
            "{progress:?}"
        );
        let hash = file(&h.app).directory.get("lm_head.weight").unwrap().hash;
        h.pump_until("stats", |app| state(app).cache.contains_key(&hash));
        assert!(state(&h.app).job_progress().is_none());
        let screen = h.render();
        insta::assert_snapshot!("tensors_detail_lm_head", screen);
        let s = state(&h.app).cache[&hash].clone();
        assert_eq!(s.count, 512 * 64);
        assert_eq!(s.histogram.iter().sum::<u64>() + s.nan + s.inf, s.count);
        for want in [
            "min ",
            "max ",
            "mean ",
            "std ",
            "zeros ",
            "NaN ",
            "Inf ",
            "outliers >6σ",
        ] {
            assert!(screen.contains(want), "{want} missing:\n{screen}");
        }
        assert!(screen.contains(&format!("{:016x}", hash)), "{screen}");
        // Enter closes; Esc too.
        h.act(Action::Enter);
        assert!(!state(&h.app).detail);
        assert!(!h.render().contains("outliers"));
    }

    #[test]
    fn statistics_are_cached_by_tensor_hash() {
        let mut h = moe();
        h.act(Action::Enter);
        let hash = file(&h.app).directory.get("lm_head.weight").unwrap().hash;
        h.pump_until("stats", |app| state(app).cache.contains_key(&hash));
        assert_eq!(state(&h.app).jobs_started, 1);
        h.act(Action::Back); // close
        h.act(Action::Enter); // open again: cached
        assert!(state(&h.app).detail);
        assert_eq!(state(&h.app).jobs_started, 1);
        assert!(state(&h.app).running.is_none());
        assert!(state(&h.app).job_progress().is_none());
        // Moving with the panel open starts the next tensor's job; back is cached.
        h.act(Action::Down);
        assert_eq!(state(&h.app).jobs_started, 2);
        let next = file(&h.app)
            .directory
            .get("model.embed_tokens.weight")
            .unwrap()
            .hash;
        h.pump_until("stats", |app| state(app).cache.contains_key(&next));
        h.act(Action::Up);
        assert_eq!(state(&h.app).jobs_started, 2);
        assert!(h.render().contains("outliers"));
    }

    #[test]
    fn cancel_stops_a_running_job() {
        let dir = tempfile::tempdir().unwrap();
        // 4096 × 4096 f32 = 64 MiB: seconds of decoding, far longer than one Action.
        let path = write_synthetic(
            dir.path(),
            vec![("big.weight".into(), DType::F32, vec![4096, 4096])],
            |_, _| {
                (0..4096 * 4096u32)
                    .flat_map(|i| ((i % 1000) as f32 / 1000.0).to_le_bytes())
                    .collect()
            },
        );
        let mut h = Harness::open(&path);
        h.act(Action::GoTab(1)).act(Action::Enter);
        assert!(h.app.jobs.is_running(JobKind::Stats));
        assert!(state(&h.app).job_progress().is_some());
        assert!(h
            .render()
            .contains("computing statistics of 16,777,216 values"));
        h.act(Action::Cancel);
        assert!(!h.app.jobs.is_running(JobKind::Stats));
        assert!(state(&h.app).job_progress().is_none());
        let screen = h.render();
        assert!(screen.contains("statistics cancelled"), "{screen}");
        // The worker's own report (cancelled, or done if it won the race) keeps the
        // panel consistent.
        let report =
            h.rx.recv_timeout(std::time::Duration::from_secs(20))
                .unwrap();
        h.act(report);
        let screen = h.render();
        assert!(
            screen.contains("statistics cancelled") || screen.contains("outliers"),
            "{screen}"
        );
        // The cancel flag path itself, deterministically: a raised flag reports
        // "cancelled", and that report does not disturb a newer job's state.
        let f = file(&h.app);
        let e = f.directory.get("big.weight").unwrap().clone();
        let r = stats_report(f, &e, &AtomicBool::new(true));
        assert_eq!(
            r,
            JobReport::Stats {
                hash: e.hash,
                name: e.name.clone(),
                result: Err(CANCELLED.into())
            }
        );
        h.act(Action::Right); // retry
        assert_eq!(state(&h.app).running.as_ref().map(|r| r.0), Some(e.hash));
        h.act(Action::Job(r));
        assert_eq!(state(&h.app).running.as_ref().map(|r| r.0), Some(e.hash));
        h.act(Action::Cancel);
    }

    #[test]
    fn reserved_dtypes_show_the_decode_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = write_synthetic(
            dir.path(),
            vec![
                ("a.config_json".into(), DType::F16, vec![8]),
                ("b.weight".into(), DType::F16, vec![4]),
            ],
            |k, p| vec![k as u8 + 1; 2 * p.shape[0] as usize],
        );
        // Turn the first record's dtype into u8 (id 6: reserved, any length accepted).
        let dir_off = CmfFile::open(&path)
            .unwrap()
            .envelope
            .section(SectionKind::Directory)
            .off as usize;
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[dir_off + 16 + 6] = DType::U8.id();
        std::fs::write(&path, bytes).unwrap();
        let mut h = Harness::open(&path);
        h.act(Action::GoTab(1)).act(Action::Enter);
        let hash = file(&h.app).directory.get("a.config_json").unwrap().hash;
        h.pump_until("stats error", |app| state(app).errors.contains_key(&hash));
        let screen = h.render();
        assert!(screen.contains("cannot compute statistics"), "{screen}");
        assert!(screen.contains("reserved"), "{screen}");
    }

    #[test]
    fn control_characters_in_names_are_escaped() {
        let dir = tempfile::tempdir().unwrap();
        let path = write_synthetic(
            dir.path(),
            vec![("evil\u{1b}[31m.weight".into(), DType::F16, vec![4])],
            |_, _| vec![0; 8],
        );
        let mut h = Harness::open(&path);
        h.act(Action::GoTab(1)).act(Action::Enter);
        let screen = h.render();
        assert!(!screen.contains('\u{1b}'), "{screen}");
        assert!(screen.contains("evil\\u{1b}[31m.weight"), "{screen}");
    }

    #[test]
    fn narrow_terminals_drop_columns_but_keep_the_sorted_one() {
        let mut h = moe();
        h.width = 80;
        h.height = 24;
        h.acts(std::iter::repeat_n(Action::SortNext, 6)); // offset
        h.act(Action::Enter);
        let hash = file(&h.app).directory.get("lm_head.weight").unwrap().hash;
        h.pump_until("stats", |app| state(app).cache.contains_key(&hash));
        let screen = h.render();
        eprintln!("{screen}");
        assert!(screen.contains("offset ↑"), "{screen}");
        let header = screen.lines().nth(2).unwrap();
        assert!(
            header.contains("name") && !header.contains("hash"),
            "{header}"
        );
        assert!(screen.contains("lm_head.weight"), "{screen}");
        assert!(screen.contains("min "), "{screen}");
        for line in screen.lines() {
            assert!(line.chars().count() <= 80, "{line}");
        }
        // Tiny terminals still render (the panel gives way to the table).
        h.width = 30;
        h.height = 8;
        let screen = h.render();
        eprintln!("{screen}");
        assert!(screen.contains("tensors"), "{screen}");
        h.acts([Action::Down, Action::PageDown, Action::End]);
        h.width = 120;
        h.height = 36;
        let screen = h.render();
        assert!(screen.contains("row 135 of 135"), "{screen}");
    }

    #[test]
    fn the_dark_theme_renders() {
        let mut h = moe();
        h.app.theme = Theme::dark();
        h.act(Action::Group).act(Action::Down).act(Action::Enter);
        let screen = h.render();
        assert!(screen.contains("lm_head.weight"), "{screen}");
    }

    // --- a sharded model ------------------------------------------------------------

    #[test]
    fn a_sharded_model_lists_every_shard_with_a_shard_column() {
        let dir = tempfile::tempdir().unwrap();
        let paths = super::super::testing::sharded_fixture(dir.path());
        assert_eq!(paths.len(), 3, "{paths:?}");
        // Opened by the name of shard 2: the whole set.
        let mut h = Harness::open(&paths[1]);
        h.act(Action::GoTab(1));
        let screen = h.render();
        insta::assert_snapshot!("tensors_table_sharded", screen);
        let src = CmfFile::open(super::super::testing::fixture("qwen3_moe-masked.cmf")).unwrap();
        let mut got = names(&h.app);
        got.sort();
        let mut want: Vec<String> = src.directory.iter().map(|e| e.name.clone()).collect();
        want.sort();
        assert_eq!(got, want, "the union of the shards' directories");
        // Layer order over the merged set, as for the single file.
        let single = {
            let mut s = Harness::fixture("qwen3_moe-masked.cmf");
            s.act(Action::GoTab(1));
            names(&s.app)
        };
        assert_eq!(names(&h.app), single);
        let header = screen.lines().nth(2).unwrap();
        assert!(
            header.contains("shard") && header.contains("offset"),
            "{header}"
        );
        let m = Arc::clone(model(&h.app));
        for (s, e) in shards_and_entries(&h.app) {
            assert_eq!(m.get(&e.name).map(|(k, _)| k), Some(s), "{}", e.name);
        }
        // Every shard holds some of the rows on screen or below; each row names its own.
        for k in 1..=3 {
            let in_shard = m.shards[k - 1].directory.entries[0].name.clone();
            let row = screen.lines().find(|l| l.contains(&format!("{in_shard} ")));
            if let Some(row) = row {
                assert!(row.contains(&format!(" {k}/3 ")), "{row}");
            }
        }
        let (status, _) = state(&h.app).status(file(&h.app));
        assert_eq!(status, "135 tensors · layer order ↑");

        // Sorted by offset: shard by shard, offsets ascending inside each.
        h.acts(std::iter::repeat_n(Action::SortNext, 6));
        assert_eq!(state(&h.app).sort, SortKey::Offset);
        let order: Vec<(usize, u64)> = shards_and_entries(&h.app)
            .iter()
            .map(|(s, e)| (*s, e.off))
            .collect();
        assert!(order.windows(2).all(|w| w[0] < w[1]), "{order:?}");
        assert_eq!(order.first().map(|o| o.0), Some(0));
        assert_eq!(order.last().map(|o| o.0), Some(2));
        h.acts(std::iter::repeat_n(Action::SortNext, 2)); // hash, layer
                                                          // Grouping and filtering work over the merged set.
        h.act(Action::Group);
        assert_eq!(
            group_layers(&h.app),
            vec![None, Some(0), Some(1), Some(2), Some(3)]
        );
        h.act(Action::Group);
        h.act(Action::Filter)
            .type_text("experts.7")
            .act(Action::Enter);
        assert_eq!(names(&h.app).len(), 12);
        h.act(Action::Back);

        // The detail panel names the shard file; statistics read the bytes from it.
        let last = &m.shards[2];
        let e = last.directory.entries.last().unwrap().clone();
        h.act(Action::Filter).type_text(&e.name).act(Action::Enter);
        assert_eq!(names(&h.app)[0], e.name);
        h.act(Action::Enter);
        h.pump_until("stats", |app| state(app).cache.contains_key(&e.hash));
        let screen = h.render();
        assert!(
            screen.contains("shard        3 of 3 · moe-00003-of-00003.cmf"),
            "{screen}"
        );
        let record = format!(
            "{} of {} in the shard's directory",
            last.directory.len(),
            last.directory.len()
        );
        assert!(screen.contains(&record), "{screen}");
        let want = tensor_stats(
            e.dtype,
            &e.shape,
            last.tensor_bytes(&e),
            &AtomicBool::new(false),
        )
        .unwrap();
        assert_eq!(*state(&h.app).cache[&e.hash], want);
    }

    // --- 10⁵ tensors ------------------------------------------------------------------

    #[test]
    fn a_hundred_thousand_tensors_stay_fast() {
        const LAYERS: usize = 100;
        const EXPERTS: usize = 333;
        let mut tensors = Vec::new();
        for l in 0..LAYERS {
            tensors.push((
                format!("model.layers.{l}.input_layernorm.weight"),
                DType::F16,
                vec![8],
            ));
            for e in 0..EXPERTS {
                for p in ["gate_proj", "up_proj", "down_proj"] {
                    let k = tensors.len() as u64;
                    tensors.push((
                        format!("model.layers.{l}.mlp.experts.{e}.{p}.weight"),
                        DType::F16,
                        vec![1 + k % 8],
                    ));
                }
            }
        }
        assert_eq!(tensors.len(), 100_000);
        let dir = tempfile::tempdir().unwrap();
        let t = Instant::now();
        let path = write_synthetic(dir.path(), tensors, |k, p| {
            (0..p.shape[0] as usize)
                .flat_map(|j| ((k + j) as u16).to_le_bytes())
                .collect()
        });
        let write = t.elapsed();

        let t = Instant::now();
        let mut h = Harness::open(&path);
        let open = t.elapsed();
        let t = Instant::now();
        let fresh = TensorsState::new(model(&h.app));
        let state_new = t.elapsed();
        assert_eq!(fresh.rows.len(), 100_000);
        h.act(Action::GoTab(1));
        let t = Instant::now();
        let screen = h.render();
        let render = t.elapsed();
        assert!(screen.contains("row 1 of 100,000"), "{screen}");
        assert_eq!(names(&h.app).len(), 100_000);

        // Typing a filter: one rebuild per key.
        let t = Instant::now();
        h.act(Action::Filter);
        let mut per_key = Vec::new();
        for c in "experts.7".chars() {
            let k = Instant::now();
            h.act(Action::Input(c));
            per_key.push(format!("{c}:{:.1?}", k.elapsed()));
        }
        let filter = t.elapsed();
        let got = names(&h.app);
        // An independent check of the subsequence rule.
        let subsequence = |name: &str| {
            let mut want = "experts.7".chars().peekable();
            for c in name.chars() {
                if want.peek() == Some(&c) {
                    want.next();
                }
            }
            want.peek().is_none()
        };
        let expected: HashSet<String> = file(&h.app)
            .directory
            .iter()
            .filter(|e| subsequence(&e.name))
            .map(|e| e.name.clone())
            .collect();
        assert_eq!(got.len(), expected.len());
        assert!(got.iter().all(|n| expected.contains(n)));
        // Whole components first, then contiguous prefixes, then gapped matches.
        assert!(
            got[..300].iter().all(|n| n.contains(".experts.7.")),
            "{:?}",
            &got[..5]
        );
        let contiguous = got.iter().filter(|n| n.contains("experts.7")).count();
        assert!(got[..contiguous].iter().all(|n| n.contains("experts.7")));
        assert!(got[contiguous..].iter().all(|n| !n.contains("experts.7")));
        assert!(got[0].starts_with("model.layers.0.") && got[1].starts_with("model.layers.0."));
        h.act(Action::Enter);

        // Sorting the matches by bytes, then reversing.
        let t = Instant::now();
        h.acts(std::iter::repeat_n(Action::SortNext, 4));
        let sort = t.elapsed();
        let es = entries_in_order(&h.app);
        assert!(es.windows(2).all(|w| w[0].nbytes >= w[1].nbytes));
        assert_eq!(es[0].nbytes, 16);
        let t = Instant::now();
        h.act(Action::SortReverse);
        let reverse = t.elapsed();
        assert!(entries_in_order(&h.app)
            .windows(2)
            .all(|w| w[0].nbytes <= w[1].nbytes));

        // Grouping: layers in natural order (2 before 10).
        let t = Instant::now();
        h.act(Action::Group);
        let group = t.elapsed();
        let layers = group_layers(&h.app);
        assert_eq!(layers, (0..LAYERS as u64).map(Some).collect::<Vec<_>>());
        let screen = h.render();
        assert!(screen.contains("▾ layer 0 ·"), "{screen}");

        // The whole directory: clear the filter, sort by name, group.
        let t = Instant::now();
        h.act(Action::Back);
        let clear = t.elapsed();
        // Unfiltered, each layer's 999 expert tensors fold into one row.
        assert_eq!(names(&h.app).len(), LAYERS);
        assert_eq!(bank_labels(&h.app).len(), LAYERS);
        assert!(
            bank_labels(&h.app)[0].contains("— 999 tensors, 333 experts,"),
            "{:?}",
            bank_labels(&h.app)[0]
        );
        let t = Instant::now();
        h.acts(std::iter::repeat_n(Action::SortNext, 5)); // bits, offset, hash, layer, name
        let to_name = t.elapsed();
        assert_eq!(state(&h.app).sort, SortKey::Name);
        let layers = group_layers(&h.app);
        let p2 = layers.iter().position(|&l| l == Some(2)).unwrap();
        let p10 = layers.iter().position(|&l| l == Some(10)).unwrap();
        assert!(p2 < p10);
        let t = Instant::now();
        h.acts([Action::End, Action::PageUp, Action::Home]);
        let moves = t.elapsed();
        let t = Instant::now();
        h.render();
        let render_grouped = t.elapsed();

        eprintln!(
            "10^5 tensors: write {write:.1?}, open {open:.1?} (of which the view's index {state_new:.1?}), first render {render:.1?}, \
             filter 'experts.7' (9 keys) {filter:.1?} [{}], sort to bytes (4 sorts) {sort:.1?}, \
             reverse {reverse:.1?}, group {group:.1?}, clear filter {clear:.1?}, \
             5 sorts to name {to_name:.1?}, 3 moves {moves:.1?}, grouped render {render_grouped:.1?}",
            per_key.join(" ")
        );
    }
}
