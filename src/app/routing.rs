//! State of the Routing view (7): a mirror of the chat session's route log (which experts
//! each position chose in each MoE layer), filled from the chat worker's reports, with a
//! token cursor, a selected layer and the heat map's measure. Rendering is a pure function
//! of this state through `cortiq_views::routing`.
//!
//! The mirror is an engine [`RouteLog`], so its statistics and the exported JSON are the
//! engine's own (`--route-stats`), not a second implementation.

use std::io::Write;
use std::path::{Path, PathBuf};

use cortiq_engine::format::CmfFile;
use cortiq_engine::runtime::routes::{LayerLog, RouteLog, RouteStats};
use cortiq_views::routing::{
    self as widget, LayerVm, Measure, NoticeVm, RoutingVm, TokenRoutesVm, TokenVm,
};
use cortiq_views::Theme;
use ratatui::layout::Rect;
use ratatui::Frame;

use super::chat_worker::{ChatReport, RouteRows};
use super::jobs::JobReport;
use super::view::View;
use super::{Action, Ctx};

/// Routing commands (keys of the keymap's Routing section).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RoutingCmd {
    /// Heat map: times chosen or weight mass.
    Mass,
    PrevLayer,
    NextLayer,
    /// Write the route stats JSON.
    Export,
}

/// Where the model stands, as the chat worker said.
#[derive(Clone, Debug, PartialEq)]
pub enum Phase {
    /// The chat worker checks and loads the model (or has not been started).
    Loading,
    /// A dense model: no router, no routes.
    NoMoe,
    Unavailable {
        title: String,
        message: String,
        bad: bool,
    },
    Ready,
}

/// Tokens a page key moves the cursor by.
const PAGE_TOKENS: usize = 32;

pub struct RoutingState {
    pub phase: Phase,
    /// The chat session's routes, position by position.
    log: RouteLog,
    /// Per position: the token id and its text.
    tokens: Vec<(u32, String)>,
    /// Counts and mass over every position, kept up to date row by row so that a frame
    /// never sums the whole log.
    totals: RouteStats,
    /// The token under the cursor; `None` follows the newest one.
    cursor: Option<usize>,
    /// The selected MoE layer (an index into the log's layers).
    pub layer: usize,
    pub measure: Measure,
    /// The active task mask's expert fields, per MoE layer (in the log's order) and
    /// expert: whether it may route. `None` when the chat's task restricts no expert.
    pub mask_experts: Option<Vec<Vec<bool>>>,
    /// The task they come from.
    pub mask_task: Option<String>,
    /// The chat's task mask, kept to rebuild `mask_experts` for a new layout.
    task: Option<std::sync::Arc<cortiq_engine::model::select::TaskMask>>,
}

impl Default for RoutingState {
    fn default() -> Self {
        RoutingState::new()
    }
}

fn empty_stats() -> RouteStats {
    RouteStats {
        format: RouteStats::FORMAT.into(),
        version: 1,
        model: None,
        tokens: 0,
        layers: Vec::new(),
    }
}

impl RoutingState {
    pub fn new() -> RoutingState {
        RoutingState {
            phase: Phase::Loading,
            log: RouteLog {
                layers: Vec::new(),
                len: 0,
            },
            tokens: Vec::new(),
            totals: empty_stats(),
            cursor: None,
            layer: 0,
            measure: Measure::Counts,
            mask_experts: None,
            mask_task: None,
            task: None,
        }
    }

    /// The expert fields of the chat's task for the log's MoE layers (`None` when it
    /// restricts none).
    fn fill_mask(&mut self) {
        let Some(task) = &self.task else {
            self.mask_experts = None;
            self.mask_task = None;
            return;
        };
        let rows: Vec<Vec<bool>> = self
            .log
            .layers
            .iter()
            .map(|l| {
                let mut open = task
                    .layers
                    .get(l.layer)
                    .and_then(|m| m.experts.clone())
                    .unwrap_or_default();
                open.resize(l.experts, true);
                open
            })
            .collect();
        let restricts = rows.iter().flatten().any(|&o| !o);
        self.mask_experts = restricts.then_some(rows);
        self.mask_task = restricts.then(|| task.name.clone());
    }

    /// The mirrored route log.
    #[cfg(test)]
    pub fn log(&self) -> &RouteLog {
        &self.log
    }

    /// The positions' token ids and texts.
    #[cfg(test)]
    pub fn tokens(&self) -> &[(u32, String)] {
        &self.tokens
    }

    /// The position under the cursor (the newest one when following).
    pub fn cursor(&self) -> Option<usize> {
        self.cursor.or(self.log.len.checked_sub(1))
    }

    pub fn on_report(&mut self, r: &ChatReport) {
        match r {
            ChatReport::Verifying { .. } => self.phase = Phase::Loading,
            ChatReport::Unavailable {
                title,
                message,
                bad,
                ..
            } => {
                self.phase = Phase::Unavailable {
                    title: title.clone(),
                    message: message.clone(),
                    bad: *bad,
                }
            }
            ChatReport::RouteLayout { layers } => {
                self.phase = if layers.is_empty() {
                    Phase::NoMoe
                } else {
                    Phase::Ready
                };
                self.log = RouteLog {
                    layers: layers
                        .iter()
                        .map(|l| LayerLog {
                            layer: l.layer,
                            experts: l.experts,
                            k: l.k,
                            chosen: Vec::new(),
                            weights: Vec::new(),
                        })
                        .collect(),
                    len: 0,
                };
                self.tokens.clear();
                self.totals = self.log.stats(0..0);
                self.cursor = None;
                self.layer = 0;
                self.fill_mask();
            }
            ChatReport::Choice(c) => {
                self.task = c.active.task.clone();
                self.fill_mask();
            }
            // Every rows report applies, whatever its job: they describe the worker's
            // session in order, and dropping one would leave a gap in the mirror.
            ChatReport::Routes { rows, .. } => self.apply(rows),
            _ => {}
        }
    }

    /// Cuts the mirror to `rows.from` positions, then appends the rows.
    fn apply(&mut self, rows: &RouteRows) {
        if rows.layers.len() != self.log.layers.len() {
            log::warn!(
                "route rows for {} layers, the layout has {}",
                rows.layers.len(),
                self.log.layers.len()
            );
            return;
        }
        if rows.from > self.log.len {
            log::warn!(
                "route rows from {} but the mirror holds {}",
                rows.from,
                self.log.len
            );
            return;
        }
        if rows.from < self.log.len {
            self.log.truncate(rows.from);
            self.tokens.truncate(rows.from);
            // Rare (a new prompt, a reset): recount from the log.
            self.totals = self.log.stats(0..self.log.len);
        }
        let n = rows.tokens.len();
        for ((l, s), (chosen, weights)) in self
            .log
            .layers
            .iter_mut()
            .zip(self.totals.layers.iter_mut())
            .zip(&rows.layers)
        {
            for (&e, &w) in chosen.iter().zip(weights) {
                if let Some(c) = s.counts.get_mut(e as usize) {
                    *c += 1;
                    s.mass[e as usize] += f64::from(w);
                }
            }
            l.chosen.extend_from_slice(chosen);
            l.weights.extend_from_slice(weights);
        }
        self.log.len += n;
        self.totals.tokens = self.log.len as u64;
        self.tokens.extend(rows.tokens.iter().cloned());
        if self.cursor.is_some_and(|c| c >= self.log.len) {
            self.cursor = None;
        }
    }

    pub fn update(&mut self, a: &Action, ctx: &mut Ctx) {
        let len = self.log.len;
        let layers = self.log.layers.len();
        let at = self.cursor();
        // A cursor on the newest token follows the ones to come.
        let to = |p: usize| (p + 1 < len).then_some(p);
        match a {
            Action::Left => self.cursor = at.map(|p| p.saturating_sub(1)).and_then(to),
            Action::Right => self.cursor = at.map(|p| p + 1).and_then(to),
            Action::PageUp => self.cursor = at.map(|p| p.saturating_sub(PAGE_TOKENS)).and_then(to),
            Action::PageDown => self.cursor = at.map(|p| p + PAGE_TOKENS).and_then(to),
            Action::Home => self.cursor = to(0),
            Action::End => self.cursor = None,
            Action::Up | Action::ScrollUp | Action::Routing(RoutingCmd::PrevLayer) => {
                self.layer = self.layer.saturating_sub(1)
            }
            Action::Down | Action::ScrollDown | Action::Routing(RoutingCmd::NextLayer) => {
                self.layer = (self.layer + 1).min(layers.saturating_sub(1))
            }
            Action::Routing(RoutingCmd::Mass) | Action::Cycle => {
                self.measure = match self.measure {
                    Measure::Counts => Measure::Mass,
                    Measure::Mass => Measure::Counts,
                }
            }
            Action::Routing(RoutingCmd::Export) => {
                *ctx.flash = Some(match self.export(ctx.file) {
                    Ok((path, tokens)) => {
                        format!(
                            "route stats of {tokens} tokens written to {}",
                            path.display()
                        )
                    }
                    Err(e) => e,
                })
            }
            _ => {}
        }
    }

    /// The route stats of every position, as `run --route-stats` writes them (the model
    /// named by its path).
    pub fn stats(&self, file: &CmfFile) -> RouteStats {
        let mut s = self.log.stats(0..self.log.len);
        s.model = file.path.as_ref().map(|p| p.display().to_string());
        s
    }

    /// Writes the route stats to `<model stem>.route-stats.json` beside the model (or in
    /// the current directory when that fails); returns the path and the token count.
    fn export(&self, file: &CmfFile) -> Result<(PathBuf, u64), String> {
        if self.phase != Phase::Ready {
            return Err("no routes to export: the model has no MoE layers running".into());
        }
        if self.log.len == 0 {
            return Err("no routes yet: ask something in the Chat view (6) first".into());
        }
        let stats = self.stats(file);
        let json = serde_json::to_string_pretty(&stats).map_err(|e| e.to_string())?;
        let (dir, stem) = match &file.path {
            Some(p) => (
                p.parent()
                    .filter(|d| !d.as_os_str().is_empty())
                    .map(Path::to_path_buf)
                    .unwrap_or_else(|| PathBuf::from(".")),
                p.file_stem()
                    .map(|s| s.to_string_lossy().into_owned())
                    .unwrap_or_else(|| "model".into()),
            ),
            None => (PathBuf::from("."), "model".into()),
        };
        let written = write_new(&dir, &stem, json.as_bytes()).or_else(|e| {
            log::warn!("route stats beside the model ({}): {e}", dir.display());
            let cwd = std::env::current_dir().map_err(|e| e.to_string())?;
            write_new(&cwd, &stem, json.as_bytes())
                .map_err(|e| format!("cannot write the route stats: {e}"))
        })?;
        Ok((written, stats.tokens))
    }

    /// The view model's layer rows for the current measure.
    pub fn layer_rows(&self) -> Vec<LayerVm> {
        self.totals
            .layers
            .iter()
            .map(|s| LayerVm {
                layer: s.layer,
                experts: s.experts,
                top_k: s.top_k,
                values: match self.measure {
                    Measure::Counts => s.counts.iter().map(|&c| c as f64).collect(),
                    Measure::Mass => s.mass.clone(),
                },
                entropy: s.balance_entropy(),
                max_over_mean: s.max_over_mean(),
                for_90: s.experts_for_mass(0.9),
                unused: s.unused(),
            })
            .collect()
    }

    pub fn status(&self, _file: &CmfFile) -> (String, String) {
        let status = match &self.phase {
            Phase::Loading => "loading the model…".to_string(),
            Phase::NoMoe => "this model has no MoE layers".to_string(),
            Phase::Unavailable { title, .. } => title.clone(),
            Phase::Ready => {
                let layer = self.log.layers.get(self.layer).map_or(0, |l| l.layer);
                format!(
                    "{} tokens routed · layer {layer} · {}",
                    self.log.len,
                    self.measure.title()
                )
            }
        };
        (status, "←→ token · ↑↓ layer · m mass · x export".into())
    }

    pub fn render(&self, f: &mut Frame, area: Rect, theme: &Theme) {
        let notice = match &self.phase {
            Phase::Loading => Some(NoticeVm {
                title: "routing",
                text: "Loading the model for the chat… The routes of every token the chat \
                       runs appear here once it is ready.",
                bad: false,
            }),
            Phase::NoMoe => Some(NoticeVm {
                title: "no Mixture-of-Experts layers",
                text: "Every layer of this model runs one dense feed-forward block: there is \
                       no router, so there are no routes to show.\nFor MoE models this view \
                       shows which experts each token of the chat chose, layer by layer.",
                bad: false,
            }),
            Phase::Unavailable {
                title,
                message,
                bad,
            } => Some(NoticeVm {
                title,
                text: message,
                bad: *bad,
            }),
            Phase::Ready => None,
        };
        if let Some(n) = notice {
            widget::render_notice(f, area, &n, theme);
            return;
        }
        let layers = self.layer_rows();
        let at = self.log.layers.get(self.layer);
        let transcript: Vec<TokenVm> = self
            .tokens
            .iter()
            .enumerate()
            .map(|(p, (_, text))| TokenVm {
                text,
                expert: at.and_then(|l| l.chosen.get(p * l.k).copied()),
            })
            .collect();
        let cursor = self.cursor();
        let selected = cursor.and_then(|p| {
            let (id, text) = self.tokens.get(p)?;
            Some(TokenRoutesVm {
                position: p,
                id: *id,
                text,
                layers: self.log.at(p).collect(),
            })
        });
        let vm = RoutingVm {
            measure: self.measure,
            tokens: self.log.len,
            layers: &layers,
            layer: self.layer,
            transcript: &transcript,
            cursor,
            follow: self.cursor.is_none(),
            selected,
            mask_experts: self.mask_experts.as_deref(),
            mask_task: self.mask_task.as_deref(),
        };
        widget::render(f, area, &vm, theme);
    }
}

/// Writes `bytes` to a new `dir/<stem>.route-stats.json` (or `-2`, `-3`, … when taken)
/// through a temporary file renamed into place without replacing anything.
fn write_new(dir: &Path, stem: &str, bytes: &[u8]) -> std::io::Result<PathBuf> {
    let mut tmp = tempfile::Builder::new()
        .prefix(&format!(".{stem}.route-stats"))
        .tempfile_in(dir)?;
    tmp.write_all(bytes)?;
    tmp.as_file().sync_all()?;
    for n in 1..=999 {
        let name = match n {
            1 => format!("{stem}.route-stats.json"),
            n => format!("{stem}.route-stats-{n}.json"),
        };
        let target = dir.join(name);
        match tmp.persist_noclobber(&target) {
            Ok(_) => return Ok(target),
            Err(e) if e.error.kind() == std::io::ErrorKind::AlreadyExists => tmp = e.file,
            Err(e) => return Err(e.error),
        }
    }
    Err(std::io::Error::new(
        std::io::ErrorKind::AlreadyExists,
        format!("{stem}.route-stats-999.json and every name before it exist"),
    ))
}

impl View for RoutingState {
    fn update(&mut self, a: &Action, ctx: &mut Ctx) {
        RoutingState::update(self, a, ctx)
    }
    fn on_job(&mut self, r: &JobReport, _ctx: &mut Ctx) {
        if let JobReport::Chat(r) = r {
            self.on_report(r);
        }
    }
    fn status(&self, file: &CmfFile) -> (String, String) {
        RoutingState::status(self, file)
    }
    fn render(&self, f: &mut Frame, area: Rect, _file: &CmfFile, theme: &Theme) {
        RoutingState::render(self, f, area, theme)
    }
}
