//! State of the Overview: the header tree's expansion and cursor, the template popup, and
//! the facts computed once when the file opens (directory totals over every shard of a
//! sharded model; no tensor byte read). The header, layout, tokenizer and masks are shard
//! 1's, where §10 puts them.

use std::collections::{BTreeMap, HashSet};

use cortiq_engine::format::directory::layer_of;
use cortiq_engine::format::layers::{self, LayerMap, MTP_PREFIX};
use cortiq_engine::format::{feature, CmfFile, CmfModel, SectionKind, TensorEntry};
use cortiq_views::overview::{self, DtypeRow, OverviewVm, Segment, ShardRow, TreeRow};
use cortiq_views::util::{group_digits, human_bytes};
use cortiq_views::Theme;
use ratatui::layout::Rect;
use ratatui::Frame;
use serde_json::Value;

use super::{Action, Ctx};

/// Keys the spec names at each level of the header; anything else is flagged as unknown.
const KNOWN_TOP: &[&str] = &[
    "format",
    "version",
    "arch",
    "quant_type",
    "provenance",
    "tokenizer_config",
    "section_hashes",
    "skills",
    "shard",
];
const KNOWN_ARCH: &[&str] = &[
    "arch_name",
    "hidden_size",
    "intermediate_size",
    "num_layers",
    "num_attention_heads",
    "num_kv_heads",
    "head_dim",
    "vocab_size",
    "layer_types",
    "rms_norm_eps",
    "norm_style",
    "rope_theta",
    "tie_word_embeddings",
    "partial_rotary_factor",
    "max_position_embeddings",
    "linear_conv_kernel_dim",
    "linear_num_key_heads",
    "linear_num_value_heads",
    "mtp",
    "moe",
];

pub struct OverviewState {
    expanded: HashSet<String>,
    rows: Vec<(String, TreeRow)>,
    pub selected: usize,
    offset: usize,
    template_scroll: Option<u16>,
    facts: Vec<(String, String)>,
    segments: Vec<Segment>,
    /// Empty for a single file.
    shards: Vec<ShardRow>,
    /// Over the merged set (the status line).
    tensor_count: usize,
    total_bytes: u64,
    /// Every shard's, each named after the first.
    warnings: Vec<String>,
    dtypes: Vec<DtypeRow>,
    per_layer: Vec<(String, u64)>,
    /// The layers' kinds (over the merged set), summarised and per run of equal layers.
    layer_summary: Vec<String>,
    layer_kinds: Vec<(String, String)>,
    tokenizer: Vec<(String, String)>,
    extra: Vec<(String, String)>,
}

fn summary(v: &Value) -> String {
    match v {
        Value::Object(m) => format!("{{{} keys}}", m.len()),
        Value::Array(a) => {
            if a.iter().all(|x| !x.is_object() && !x.is_array()) && a.len() <= 8 {
                let items: Vec<String> = a.iter().map(scalar).collect();
                format!("[{}]", items.join(", "))
            } else {
                format!("[{} items]", a.len())
            }
        }
        other => scalar(other),
    }
}

fn scalar(v: &Value) -> String {
    match v {
        Value::String(s) if s.len() > 120 => format!(
            "\"{}…\" ({} chars)",
            s.chars().take(100).collect::<String>(),
            s.chars().count()
        ),
        Value::String(s) => format!("\"{s}\""),
        other => other.to_string(),
    }
}

fn is_container(v: &Value) -> bool {
    match v {
        Value::Object(m) => !m.is_empty(),
        Value::Array(a) => a.iter().any(|x| x.is_object() || x.is_array()) || a.len() > 8,
        _ => false,
    }
}

impl OverviewState {
    pub fn new(model: &CmfModel) -> OverviewState {
        let file = model.primary();
        let mut expanded = HashSet::new();
        expanded.insert("arch".to_string());
        let tensors = || model.tensors().map(|(_, e)| e);
        let map = layers::classify(tensors(), file.header.arch.as_ref());
        let mut s = OverviewState {
            expanded,
            rows: Vec::new(),
            selected: 0,
            offset: 0,
            template_scroll: None,
            facts: facts(file, tensors()),
            segments: segments(file),
            shards: shards(model),
            tensor_count: model.tensor_count(),
            total_bytes: model.total_bytes(),
            warnings: warnings(model),
            dtypes: dtypes(tensors()),
            per_layer: per_layer(tensors()),
            layer_summary: layer_summary(&map),
            layer_kinds: layers::runs(&map.layers)
                .into_iter()
                .map(|r| (r.name(), r.label))
                .collect(),
            tokenizer: tokenizer(file),
            extra: extra(model),
        };
        s.rebuild(file);
        s
    }

    fn rebuild(&mut self, file: &CmfFile) {
        let mut rows = Vec::new();
        fn walk(
            v: &Value,
            path: &str,
            depth: u16,
            parent: &str,
            exp: &HashSet<String>,
            rows: &mut Vec<(String, TreeRow)>,
        ) {
            let entries: Vec<(String, &Value)> = match v {
                Value::Object(m) => m.iter().map(|(k, v)| (k.clone(), v)).collect(),
                Value::Array(a) => a
                    .iter()
                    .enumerate()
                    .map(|(i, v)| (format!("[{i}]"), v))
                    .collect(),
                _ => return,
            };
            for (k, child) in entries {
                let p = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                let unknown = match (depth, parent) {
                    (0, _) => !KNOWN_TOP.contains(&k.as_str()),
                    (1, "arch") => !KNOWN_ARCH.contains(&k.as_str()),
                    _ => false,
                };
                let container = is_container(child);
                let open = container && exp.contains(&p);
                rows.push((
                    p.clone(),
                    TreeRow {
                        depth,
                        key: k.clone(),
                        value: summary(child),
                        expandable: container,
                        expanded: open,
                        unknown,
                    },
                ));
                if open {
                    walk(child, &p, depth + 1, &k, exp, rows);
                }
            }
        }
        walk(&file.header_value, "", 0, "", &self.expanded, &mut rows);
        self.rows = rows;
        self.selected = self.selected.min(self.rows.len().saturating_sub(1));
    }

    pub fn update(&mut self, a: &Action, ctx: &mut Ctx) {
        if let Some(scroll) = self.template_scroll {
            let lines = ctx
                .file
                .header
                .tokenizer_config
                .as_ref()
                .and_then(|t| t.chat_template.as_ref())
                .map_or(0, |t| t.lines().count());
            let max = lines.saturating_sub(ctx.page).min(u16::MAX as usize) as u16;
            self.template_scroll = match a {
                Action::Back | Action::Template | Action::Enter => None,
                a => Some(super::scrolled(a, scroll, ctx.page as u16, max).unwrap_or(scroll)),
            };
            return;
        }
        let n = self.rows.len();
        let last = n.saturating_sub(1);
        match a {
            Action::Up | Action::ScrollUp => self.selected = self.selected.saturating_sub(1),
            Action::Down | Action::ScrollDown => self.selected = (self.selected + 1).min(last),
            Action::PageUp => self.selected = self.selected.saturating_sub(ctx.page),
            Action::PageDown => self.selected = (self.selected + ctx.page).min(last),
            Action::Home => self.selected = 0,
            Action::End => self.selected = last,
            Action::Enter | Action::Right | Action::Left => {
                if let Some((path, row)) = self.rows.get(self.selected) {
                    let path = path.clone();
                    let want_open = match a {
                        Action::Right => true,
                        Action::Left => false,
                        _ => !row.expanded,
                    };
                    if row.expandable && want_open {
                        self.expanded.insert(path);
                    } else if row.expanded {
                        self.expanded.remove(&path);
                    } else if matches!(a, Action::Left) {
                        // Left on a leaf: go to its parent.
                        if let Some((parent, _)) = path.rsplit_once('.') {
                            if let Some(i) = self.rows.iter().position(|(p, _)| p == parent) {
                                self.selected = i;
                            }
                        }
                    }
                    self.rebuild(ctx.file);
                }
            }
            Action::Template => {
                if ctx
                    .file
                    .header
                    .tokenizer_config
                    .as_ref()
                    .and_then(|t| t.chat_template.as_ref())
                    .is_some()
                {
                    self.template_scroll = Some(0);
                } else {
                    *ctx.flash = Some(
                        "this file carries no chat template (the runtime falls back to ChatML)"
                            .into(),
                    );
                }
            }
            Action::Click(x, y) => {
                let b = ctx.body;
                let left_w = b.width * overview::TREE_PERCENT / 100;
                if *x < b.x + left_w && *y > b.y && *y < b.y + b.height.saturating_sub(1) {
                    let i = self.offset + (*y - b.y - 1) as usize;
                    if i < n {
                        self.selected = i;
                    }
                }
            }
            _ => {}
        }
        // Keep the cursor visible.
        let h = ctx.page.max(1);
        if self.selected < self.offset {
            self.offset = self.selected;
        } else if self.selected >= self.offset + h {
            self.offset = self.selected + 1 - h;
        }
    }

    pub fn status(&self, _file: &CmfFile) -> (String, String) {
        let path = self
            .rows
            .get(self.selected)
            .map(|(p, _)| p.clone())
            .unwrap_or_default();
        (
            format!(
                "{} tensors · {} · header {}",
                self.tensor_count,
                human_bytes(self.total_bytes),
                cortiq_views::util::esc(&path)
            ),
            "Enter expand · t template".into(),
        )
    }

    pub fn render(&self, f: &mut Frame, area: Rect, file: &CmfFile, theme: &Theme) {
        let rows: Vec<TreeRow> = self.rows.iter().map(|(_, r)| r.clone()).collect();
        let template = self.template_scroll.and_then(|s| {
            file.header
                .tokenizer_config
                .as_ref()
                .and_then(|t| t.chat_template.as_deref())
                .map(|t| (t, s))
        });
        let vm = OverviewVm {
            tree: &rows,
            selected: self.selected,
            offset: self.offset,
            facts: &self.facts,
            segments: &self.segments,
            file_len: file.len(),
            shards: &self.shards,
            dtypes: &self.dtypes,
            per_layer: &self.per_layer,
            layer_summary: &self.layer_summary,
            layer_kinds: &self.layer_kinds,
            tokenizer: &self.tokenizer,
            extra: &self.extra,
            warnings: &self.warnings,
            template,
        };
        overview::render(f, area, &vm, theme);
    }
}

/// `tensors`: the merged directory; everything else comes from the primary `file`.
fn facts<'a>(
    file: &CmfFile,
    tensors: impl Iterator<Item = &'a TensorEntry>,
) -> Vec<(String, String)> {
    let e = &file.envelope;
    let (mut count, mut params, mut bytes) = (0u64, 0u64, 0u64);
    for t in tensors {
        count += 1;
        params += t.numel();
        bytes += t.nbytes;
    }
    let arch = file.header.arch.as_ref();
    let mut v = vec![
        (
            "arch".into(),
            arch.map(|a| a.arch_name.clone())
                .unwrap_or_else(|| "—".into()),
        ),
        (
            "format".into(),
            format!(
                "CMF v{} · {}",
                e.version,
                feature::names(e.required_features).join(" ")
            ),
        ),
        (
            "tensors".into(),
            format!(
                "{} · {} parameters",
                group_digits(count),
                group_digits(params)
            ),
        ),
        (
            "weights".into(),
            format!(
                "{} · {:.2} bits/weight",
                human_bytes(bytes),
                if params > 0 {
                    bytes as f64 * 8.0 / params as f64
                } else {
                    0.0
                }
            ),
        ),
    ];
    if let Some(a) = arch {
        v.push((
            "shape".into(),
            format!(
                "{} layers · hidden {} · ffn {} · heads {}/{} · vocab {}",
                a.num_layers,
                a.hidden_size,
                a.intermediate_size
                    .map(|x| x.to_string())
                    .unwrap_or_else(|| "—".into()),
                a.num_attention_heads
                    .map(|x| x.to_string())
                    .unwrap_or_else(|| "—".into()),
                a.num_kv_heads
                    .map(|x| x.to_string())
                    .unwrap_or_else(|| "—".into()),
                a.vocab_size
            ),
        ));
        if let Some(m) = &a.moe {
            v.push((
                "moe".into(),
                format!("{} experts, top-{}", m.num_experts, m.top_k),
            ));
        }
        if let Some(n) = a.norm_style {
            v.push(("norm_style".into(), format!("{n:?}").to_lowercase()));
        }
    }
    v
}

fn segments(file: &CmfFile) -> Vec<Segment> {
    let mut v = vec![Segment {
        name: "envelope".into(),
        off: 0,
        len: 128,
    }];
    for k in SectionKind::ALL {
        let s = file.envelope.section(k);
        if s.is_present() {
            v.push(Segment {
                name: k.name().into(),
                off: s.off,
                len: s.len,
            });
        }
    }
    v
}

fn shards(model: &CmfModel) -> Vec<ShardRow> {
    if model.shards.len() < 2 {
        return Vec::new();
    }
    let count = model.shards.len() as u32;
    model
        .shards
        .iter()
        .enumerate()
        .map(|(k, f)| ShardRow {
            no: f.header.shard.map_or(k as u32 + 1, |s| s.no),
            count: f.header.shard.map_or(count, |s| s.count),
            file: f
                .path
                .as_ref()
                .and_then(|p| p.file_name())
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| "(in memory)".into()),
            tensors: f.directory.len() as u64,
            bytes: f.directory.iter().map(|t| t.nbytes).sum(),
            file_len: f.len(),
        })
        .collect()
}

fn warnings(model: &CmfModel) -> Vec<String> {
    let mut v = model.primary().warnings.clone();
    for (k, f) in model.shards.iter().enumerate().skip(1) {
        v.extend(f.warnings.iter().map(|w| format!("shard {}: {w}", k + 1)));
    }
    v
}

fn dtypes<'a>(tensors: impl Iterator<Item = &'a TensorEntry>) -> Vec<DtypeRow> {
    let mut m: BTreeMap<u8, DtypeRow> = BTreeMap::new();
    for t in tensors {
        let r = m.entry(t.dtype.id()).or_insert_with(|| DtypeRow {
            dtype: t.dtype.name().into(),
            tensors: 0,
            params: 0,
            bytes: 0,
        });
        r.tensors += 1;
        r.params += t.numel();
        r.bytes += t.nbytes;
    }
    m.into_values().collect()
}

/// The summary line, the MTP head's, and where `arch.layer_types` contradicts the tensors.
fn layer_summary(map: &LayerMap) -> Vec<String> {
    let mut v = vec![map
        .summary()
        .unwrap_or_else(|| "no decoder layers (model.layers.N.*) in the directory".into())];
    v.extend(map.mtp_summary());
    v.extend(map.contradiction());
    v
}

fn per_layer<'a>(tensors: impl Iterator<Item = &'a TensorEntry>) -> Vec<(String, u64)> {
    let mut m: BTreeMap<u64, u64> = BTreeMap::new();
    for t in tensors {
        // `model.mtp.layers.0.*` is the MTP head's, not decoder layer 0's.
        if t.name.starts_with(MTP_PREFIX) {
            continue;
        }
        if let Some(l) = layer_of(&t.name) {
            *m.entry(l).or_default() += t.nbytes;
        }
    }
    m.into_iter().map(|(l, b)| (format!("L{l}"), b)).collect()
}

fn tokenizer(file: &CmfFile) -> Vec<(String, String)> {
    let mut v = Vec::new();
    match file.vocab_bytes() {
        Some(b) => {
            #[derive(serde::Deserialize)]
            struct Model {
                #[serde(rename = "type")]
                kind: Option<String>,
                #[serde(default)]
                vocab: Option<serde_json::Map<String, Value>>,
            }
            #[derive(serde::Deserialize)]
            struct Tok {
                model: Option<Model>,
                #[serde(default)]
                added_tokens: Vec<serde::de::IgnoredAny>,
            }
            match serde_json::from_slice::<Tok>(b) {
                Ok(t) => {
                    let kind = t
                        .model
                        .as_ref()
                        .and_then(|m| m.kind.clone())
                        .unwrap_or_else(|| "?".into());
                    let n = t
                        .model
                        .as_ref()
                        .and_then(|m| m.vocab.as_ref())
                        .map(|v| v.len())
                        .unwrap_or(0);
                    v.push((
                        "tokenizer".into(),
                        format!(
                            "{kind}, {n} tokens + {} added · {}",
                            t.added_tokens.len(),
                            human_bytes(b.len() as u64)
                        ),
                    ));
                }
                Err(e) => v.push((
                    "tokenizer".into(),
                    format!("{} that does not parse: {e}", human_bytes(b.len() as u64)),
                )),
            }
        }
        None => v.push(("tokenizer".into(), "none embedded".into())),
    }
    match &file.header.tokenizer_config {
        Some(tc) => {
            v.push((
                "template".into(),
                tc.chat_template
                    .as_ref()
                    .map(|t| format!("{} chars (t shows it)", t.chars().count()))
                    .unwrap_or_else(|| "none (ChatML fallback)".into()),
            ));
            v.push(("eos ids".into(), format!("{:?}", tc.eos_token_ids)));
            v.push((
                "bos / pad".into(),
                format!(
                    "{} / {}",
                    tc.bos_token_id
                        .map(|x| x.to_string())
                        .unwrap_or_else(|| "—".into()),
                    tc.pad_token_id
                        .map(|x| x.to_string())
                        .unwrap_or_else(|| "—".into())
                ),
            ));
        }
        None => v.push(("chat bundle".into(), "none (ChatML fallback)".into())),
    }
    v
}

fn extra(model: &CmfModel) -> Vec<(String, String)> {
    let file = model.primary();
    let mut v = Vec::new();
    // A set of several has its own panel.
    if model.shards.len() < 2 {
        v.push((
            "shards".into(),
            match file.header.shard {
                Some(s) => format!("shard {} of {}", s.no, s.count),
                None => "single file".into(),
            },
        ));
    }
    let comps = file.pipeline_components();
    if !comps.is_empty() {
        v.push(("pipeline".into(), comps.join(", ")));
    }
    if let Some(p) = &file.header.provenance {
        v.push(("provenance".into(), p.to_string()));
    }
    if let Some(m) = &file.masks {
        v.push((
            "masks".into(),
            m.meta
                .masks
                .iter()
                .map(|r| r.name.clone())
                .collect::<Vec<_>>()
                .join(", "),
        ));
    }
    if let Some(s) = &file.header.skills {
        v.push((
            "skills".into(),
            s.iter()
                .map(|r| r.id.clone())
                .collect::<Vec<_>>()
                .join(", "),
        ));
    }
    if file.is_skill_file() {
        v.push((
            "skill file".into(),
            "standalone skill file (not runnable; apply to its base)".into(),
        ));
    }
    v
}

#[cfg(test)]
mod tests {
    use super::super::testing::Harness;
    use super::super::Screen;
    use super::OverviewState;

    /// The screen without its first line (the tab bar belongs to the app, not this view).
    fn body(screen: &str) -> String {
        screen.lines().skip(1).collect::<Vec<_>>().join("\n")
    }

    fn state(h: &Harness) -> &OverviewState {
        match &h.app.screen {
            Screen::Model(m) => &m.overview,
            _ => panic!("no model open"),
        }
    }

    #[test]
    fn a_hybrid_shows_each_layers_mixer_and_feed_forward() {
        let mut h = Harness::fixture("qwen3_5-q8.cmf");
        let screen = h.render();
        insta::assert_snapshot!("overview_qwen3_5_hybrid", body(&screen));
        // 3 Gated DeltaNet layers, then one full-attention layer whose q_proj carries
        // the output gate (128 rows = 2 · 4 heads · 16).
        assert!(
            screen.contains("hybrid: 3 linear-attention + 1 full-attention layers (output"),
            "{screen}"
        );
        assert!(screen.contains("4 dense layers (width 128)"), "{screen}");
        assert!(
            screen.contains("L0–2 linear·dense 128  L3 full(gated)·dense 128"),
            "{screen}"
        );
        assert!(!screen.contains("MTP head"), "{screen}");
        assert_eq!(state(&h).layer_kinds.len(), 2);
    }

    #[test]
    fn a_moe_model_shows_its_experts_per_layer() {
        let mut h = Harness::fixture("qwen3_moe-q8.cmf");
        let screen = h.render();
        insta::assert_snapshot!("overview_qwen3_moe", body(&screen));
        assert!(
            screen.contains("4 full-attention layers; 4 MoE layers of 8 experts (top-2)"),
            "{screen}"
        );
        assert!(screen.contains("L0–3 full·MoE 8e"), "{screen}");
        // The synthetic demo: MoE on odd layers only.
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("demo.cmf");
        cortiq_engine::synth::write_demo(&p).unwrap();
        let mut h = Harness::open(&p);
        h.height = 50;
        let screen = h.render();
        assert!(
            screen.contains("3 MoE layers of 8 experts (top-2) + 3 dense"),
            "{screen}"
        );
        for want in ["L0 full·dense 256", "L1 full·MoE 8e", "L5 full·MoE 8e"] {
            assert!(screen.contains(want), "{want}\n{screen}");
        }
        assert!(!screen.contains("+3 more"), "all kinds fit: {screen}");
    }

    #[test]
    fn every_block_kind_and_the_mtp_head_in_awkward_sizes() {
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
        h.height = 44;
        let screen = h.render();
        for want in [
            "hybrid: 2 linear-attention + 2 full-attention layers (output gate on",
            "2 MoE layers of 7 experts (top-3, shared expert in 1) + 2 dense",
            "MTP head: 1 layer (full·dense 144)",
            "L0 linear·MoE 7e+shared",
            "L1 full(gated)·dense 120",
            "L2 linear·dense 96",
            "L3 full·MoE 7e",
        ] {
            assert!(screen.contains(want), "{want}\n{screen}");
        }
        // The head's `model.mtp.layers.0.*` counts for no decoder layer.
        let s = state(&h);
        let m = match &h.app.screen {
            Screen::Model(m) => m.model.clone(),
            _ => unreachable!(),
        };
        let layer0: u64 = m
            .tensors()
            .filter(|(_, e)| e.name.starts_with("model.layers.0."))
            .map(|(_, e)| e.nbytes)
            .sum();
        let labels: Vec<&str> = s.per_layer.iter().map(|(l, _)| l.as_str()).collect();
        assert_eq!(labels, ["L0", "L1", "L2", "L3"]);
        assert_eq!(s.per_layer[0].1, layer0);
    }

    #[test]
    fn narrow_terminals_cut_the_layers_panel_gracefully() {
        let mut h = Harness::fixture("qwen3_5-q8.cmf");
        for (w, ht) in [(100, 30), (80, 24), (60, 20), (40, 14)] {
            h.width = w;
            h.height = ht;
            let screen = h.render();
            for line in screen.lines() {
                assert!(line.chars().count() <= w as usize, "{w}: {line}");
            }
            if ht >= 24 {
                let summary = screen
                    .lines()
                    .find(|l| l.contains("hybrid: "))
                    .unwrap_or_else(|| panic!("{w}×{ht}: the summary\n{screen}"));
                assert!(summary.contains("hybrid: 3 linear-attention"), "{summary}");
            }
        }
        // 80×24: the summary is cut with an ellipsis inside the panel.
        h.width = 80;
        h.height = 24;
        let screen = h.render();
        let summary = screen.lines().find(|l| l.contains("hybrid: ")).unwrap();
        assert!(summary.ends_with("…│"), "{screen}");
    }
}
