//! A conversation with a model: the KV cache, prefill in chunks, decode one token at a
//! time, stop conditions, cancellation between tokens, timings.
//!
//! The session keeps the tokens its state holds; [`Session::prefill`] reuses the longest
//! common prefix with the new prompt, so a chat re-rendered each turn only computes the
//! new part. Recurrent (Gated DeltaNet) state cannot be cut at any position: it is reused
//! when the new prompt extends everything the state holds, or from the snapshot the
//! session keeps just before each prompt's last token (a regenerated or edited answer).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::routes::RouteLog;
use super::sampler::{Sampler, SamplingParams};
use crate::model::mtp::MtpScratch;
use crate::model::select::Active;
use crate::model::state::{ModelState, StateSnapshot};
use crate::model::{Logits, Model, ModelError, Workspace};

/// Tokens per prefill forward: large enough for the matrix products to reuse each weight
/// row across many tokens, small enough to keep the workspace in the megabytes.
pub const PREFILL_CHUNK: usize = 128;

#[derive(Clone, Debug, PartialEq)]
pub struct GenerateParams {
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    /// Generation stops after any of these (the chat bundle's EOS ids).
    pub stop_ids: Vec<u32>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// A stop id was generated (it is part of the output ids).
    Eos,
    MaxTokens,
    /// The context is full.
    ContextFull,
    Cancelled,
    /// A step failed (see [`GenerationError`]).
    Error,
    /// Not stopped yet (the stats of a generation in progress).
    Running,
}

#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct GenerationStats {
    pub prompt_tokens: usize,
    /// Prompt tokens found in the cache from an earlier turn.
    pub reused_tokens: usize,
    pub generated_tokens: usize,
    pub prefill_s: f64,
    pub decode_s: f64,
    /// Time from the call to the first generated token.
    pub ttft_s: f64,
    pub prefill_tok_s: f64,
    pub decode_tok_s: f64,
    pub stop: StopReason,
    pub context_used: usize,
    pub context_capacity: usize,
    /// Speculative decoding (`--mtp`): drafts proposed and accepted.
    pub drafted: usize,
    pub accepted: usize,
}

/// What the session reports while generating.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// The prompt is in the cache.
    Prefilled { tokens: usize, elapsed: Duration },
    /// A new token (also for the stop token).
    Token { id: u32, index: usize },
}

pub struct Session {
    pub model: Arc<Model>,
    cache: ModelState,
    ws: Workspace,
    /// The tokens whose keys and values the cache holds, in order.
    tokens: Vec<u32>,
    /// Recurrent state just before the last prompt's last token (models with linear
    /// attention only).
    checkpoint: Option<StateSnapshot>,
    /// Every position's expert choices, when asked for ([`Session::log_routes`]).
    routes: Option<RouteLog>,
    /// Speculative decoding with the MTP head, when on.
    spec: Option<Speculative>,
    /// Per cached position, the choice (task mask + skill) it was computed under: an
    /// index into `labels`.
    tags: Vec<u32>,
    /// The choices seen, by tag (their labels; the same label is the same tag).
    labels: Vec<String>,
    /// The current choice's tag.
    tag: u32,
    /// Positions below this were kept at the last switch ("keep the cache"): the next
    /// prompt reuses them although they were computed under another choice.
    kept: usize,
}

/// What a switch of task mask or skill does to the positions already cached.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SwitchPolicy {
    /// Keep them: fast, approximate (they were computed under the old choice).
    KeepCache,
    /// Recompute them under the new choice: exact.
    Reprefill,
}

/// What [`Session::switch`] did.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct SwitchReport {
    pub from: String,
    pub to: String,
    pub policy: SwitchPolicy,
    /// Cached positions computed under another choice that stay (keep the cache).
    pub kept: usize,
    /// Positions recomputed (re-prefill).
    pub recomputed: usize,
    pub elapsed_s: f64,
}

/// What speculative decoding keeps beside the main state.
struct Speculative {
    /// The MTP head's own KV.
    state: ModelState,
    scratch: MtpScratch,
    /// `[capacity, hidden]`: the final-normed hidden state of every position, which the
    /// head reads (zeroed pages: RSS only as positions are used).
    hist: Vec<f32>,
    /// The next tokens of one head forward.
    next: Vec<u32>,
    /// Dense draft and target distributions (sampling's acceptance rule).
    q: Vec<f32>,
    p: Vec<f32>,
}

impl Session {
    /// A session with room for `context` positions (clamped to the model's maximum).
    pub fn new(model: Arc<Model>, context: usize) -> Session {
        let cap = context.clamp(1, model.config.max_positions.max(1));
        crate::model::attention::reserve_scores(cap);
        crate::quant::matrix::reserve_thread_buffers(model.widest_input(), PREFILL_CHUNK);
        Session {
            cache: model.new_state(cap),
            ws: model.new_workspace(PREFILL_CHUNK),
            tokens: Vec::with_capacity(cap),
            checkpoint: None,
            routes: None,
            spec: None,
            tags: Vec::with_capacity(cap),
            labels: vec!["backbone".into()],
            tag: 0,
            kept: 0,
            model,
        }
    }

    /// The task mask and skill the forwards run under.
    pub fn active(&self) -> &Active {
        &self.ws.active
    }

    /// The label of the current choice (`backbone`, `task code`, `skill sql`, ...).
    pub fn active_label(&self) -> &str {
        &self.labels[self.tag as usize]
    }

    /// Per cached position, the label of the choice it was computed under.
    pub fn position_labels(&self) -> impl Iterator<Item = &str> + '_ {
        self.tags.iter().map(|&t| self.labels[t as usize].as_str())
    }

    /// Switches task mask and skill between steps. With [`SwitchPolicy::Reprefill`] the
    /// cached positions are computed again under the new choice (the last position's
    /// logits are then the new choice's); with [`SwitchPolicy::KeepCache`] they stay as
    /// they are and the next prompt reuses them.
    pub fn switch(
        &mut self,
        active: Active,
        policy: SwitchPolicy,
    ) -> Result<SwitchReport, ModelError> {
        let t0 = Instant::now();
        let from = self.active_label().to_string();
        let to = label_of(&self.model, &active);
        self.tag = match self.labels.iter().position(|l| *l == to) {
            Some(i) => i as u32,
            None => {
                self.labels.push(to.clone());
                (self.labels.len() - 1) as u32
            }
        };
        self.ws.active = active;
        let foreign = self.tags.iter().filter(|&&t| t != self.tag).count();
        let mut report = SwitchReport {
            from,
            to,
            policy,
            kept: 0,
            recomputed: 0,
            elapsed_s: 0.0,
        };
        match policy {
            SwitchPolicy::KeepCache => {
                self.kept = self.tokens.len();
                report.kept = foreign;
            }
            SwitchPolicy::Reprefill => {
                self.kept = 0;
                if foreign > 0 {
                    let tokens = self.tokens.clone();
                    let reused = self.prefill(&tokens)?;
                    report.recomputed = tokens.len() - reused;
                }
            }
        }
        report.elapsed_s = t0.elapsed().as_secs_f64();
        Ok(report)
    }

    /// Appends `ids` to the tokens the state holds, tagged with the current choice.
    fn push_tokens(&mut self, ids: &[u32]) {
        self.tokens.extend_from_slice(ids);
        self.tags.resize(self.tokens.len(), self.tag);
    }

    fn truncate_tokens(&mut self, len: usize) {
        self.tokens.truncate(len);
        self.tags.truncate(len);
        self.kept = self.kept.min(len);
    }

    pub fn capacity(&self) -> usize {
        self.cache.capacity
    }

    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    pub fn reset(&mut self) {
        self.truncate_tokens(0);
        self.cache.truncate(0);
        self.checkpoint = None;
        if let Some(r) = &mut self.routes {
            r.truncate(0);
        }
    }

    /// Starts keeping every position's expert choices (MoE models; a no-op for dense
    /// ones). Positions already in the state have none: the log starts empty, after a
    /// reset.
    pub fn log_routes(&mut self) {
        if self.routes.is_none() && self.model.has_moe() {
            self.reset();
            self.routes = Some(RouteLog::new(&self.model, self.cache.capacity));
        }
    }

    /// Turns speculative decoding with the file's MTP head on or off. The output stays
    /// exactly that of plain decoding when greedy, and has the same distribution when
    /// sampling. Turning it on restarts the state (the head needs the hidden state of
    /// every position). Fails when the model has no MTP head.
    pub fn set_speculative(&mut self, on: bool) -> Result<(), String> {
        if !on {
            self.spec = None;
            self.ws.keep_hidden = false;
            return Ok(());
        }
        if self.spec.is_some() {
            return Ok(());
        }
        let model = self.model.clone();
        let Some(head) = &model.mtp else {
            return Err("the model has no MTP head (model.mtp.*)".into());
        };
        let c = &model.config;
        self.reset();
        self.spec = Some(Speculative {
            state: head.new_state(self.cache.capacity),
            scratch: head.new_scratch(c, PREFILL_CHUNK),
            hist: vec![0.0; self.cache.capacity * c.hidden],
            next: vec![0; PREFILL_CHUNK],
            q: vec![0.0; c.vocab],
            p: vec![0.0; c.vocab],
        });
        self.ws.keep_hidden = true;
        Ok(())
    }

    pub fn speculative(&self) -> bool {
        self.spec.is_some()
    }

    /// Keeps the final hidden states of rows `rows` of the last forward, which ran from
    /// position `pos0` (the MTP head reads them).
    fn keep_hidden(&mut self, pos0: usize, rows: std::ops::Range<usize>) {
        if let Some(spec) = &mut self.spec {
            let h = self.model.config.hidden;
            for r in rows {
                let at = (pos0 + r) * h;
                spec.hist[at..at + h].copy_from_slice(self.ws.final_hidden(r, h));
            }
        }
    }

    /// The route log, position by position (see [`Session::log_routes`]).
    pub fn routes(&self) -> Option<&RouteLog> {
        self.routes.as_ref()
    }

    /// Logs rows `rows` of the last forward's routes.
    fn log_forward(&mut self, rows: std::ops::Range<usize>) {
        if let Some(r) = &mut self.routes {
            r.push(&self.ws.routes, rows);
        }
    }

    /// The per-layer state (KV and recurrent).
    pub fn state(&self) -> &ModelState {
        &self.cache
    }

    /// The workspace of the last forward (its logits and routes).
    pub fn workspace(&self) -> &Workspace {
        &self.ws
    }

    /// Puts `prompt` in the cache, reusing the common prefix with what it holds, and
    /// leaves the last position's logits in the workspace. Returns the reused count.
    pub fn prefill(&mut self, prompt: &[u32]) -> Result<usize, ModelError> {
        let reused = self.begin_prefill(prompt)?;
        let total = prompt.len() - reused;
        let mut done = 0;
        while done < total {
            let end = self.chunk_end(done, total);
            self.prefill_chunk(&prompt[reused + done..reused + end], end == total)?;
            done = end;
        }
        Ok(reused)
    }

    /// Where the prefill chunk starting at `done` of `total` new tokens ends. With
    /// recurrent state the last token runs alone, after a snapshot of the state before
    /// it, so that the same prompt again (a regenerated answer) reuses all but that token.
    fn chunk_end(&mut self, done: usize, total: usize) -> usize {
        let end = (done + PREFILL_CHUNK).min(total);
        if !self.cache.has_recurrent() || end < total {
            return end;
        }
        if end - done > 1 {
            return total - 1;
        }
        let mut snap = self.checkpoint.take().unwrap_or_default();
        self.cache.snapshot_into(&mut snap);
        self.checkpoint = Some(snap);
        end
    }

    /// Checks `prompt` and drops the cached positions past its common prefix with the
    /// tokens the cache holds; returns how many positions stay (at most `len - 1`: the
    /// last prompt token must run to give its logits).
    fn begin_prefill(&mut self, prompt: &[u32]) -> Result<usize, ModelError> {
        if prompt.is_empty() {
            return Err(ModelError::Config {
                field: "prompt".into(),
                reason: "no tokens to run".into(),
            });
        }
        if prompt.len() > self.cache.capacity {
            return Err(ModelError::ContextFull {
                needed: prompt.len(),
                capacity: self.cache.capacity,
            });
        }
        // A failed forward leaves the state shorter than the tokens: trust the state.
        self.truncate_tokens(self.cache.len);
        // Reuse never silently mixes choices: a position computed under another task or
        // skill is reused only when the user kept the cache at the switch.
        let (tag, kept) = (self.tag, self.kept);
        let mut common = self
            .tokens
            .iter()
            .zip(prompt)
            .zip(&self.tags)
            .enumerate()
            .take_while(|(p, ((a, b), &t))| a == b && (t == tag || *p < kept))
            .count()
            .min(prompt.len() - 1);
        if self.checkpoint.as_ref().is_some_and(|c| c.len > common) {
            // The checkpoint's tokens are about to change: it is stale.
            self.checkpoint = None;
        }
        if !self.cache.truncate(common) {
            match &self.checkpoint {
                Some(snap) => {
                    self.cache.restore(snap);
                    common = snap.len;
                }
                None => {
                    self.cache.truncate(0);
                    common = 0;
                }
            }
        }
        self.truncate_tokens(common);
        if let Some(r) = &mut self.routes {
            r.truncate(common);
        }
        if let Some(spec) = &mut self.spec {
            // Head row j reads t_{j+1}: rows below common − 1 stay valid.
            if !spec
                .state
                .truncate(spec.state.len.min(common.saturating_sub(1)))
            {
                spec.state.truncate(0);
            }
        }
        Ok(common)
    }

    /// Runs one chunk of prompt tokens after those the cache holds; `last` asks for the
    /// logits of its final position.
    fn prefill_chunk(&mut self, chunk: &[u32], last: bool) -> Result<(), ModelError> {
        let want = if last { Logits::Last } else { Logits::None };
        let pos0 = self.cache.len;
        self.model
            .forward(chunk, &mut self.cache, &mut self.ws, want, None)?;
        self.log_forward(0..chunk.len());
        self.keep_hidden(pos0, 0..chunk.len());
        self.push_tokens(chunk);
        Ok(())
    }

    /// Runs one more token; its logits replace the workspace's.
    pub fn step(&mut self, id: u32) -> Result<(), ModelError> {
        let pos0 = self.cache.len;
        self.model
            .forward(&[id], &mut self.cache, &mut self.ws, Logits::Last, None)?;
        self.log_forward(0..1);
        self.keep_hidden(pos0, 0..1);
        self.push_tokens(&[id]);
        Ok(())
    }

    /// The logits of the last position run.
    pub fn logits(&self) -> &[f32] {
        &self.ws.logits[..self.model.config.vocab]
    }

    pub fn logits_mut(&mut self) -> &mut [f32] {
        let v = self.model.config.vocab;
        &mut self.ws.logits[..v]
    }

    /// Starts generating after `prompt`: nothing runs until [`Generation::next`], which
    /// advances one prefill chunk or one token per call, so the owner can cancel, change
    /// the sampler or look at each token between calls.
    pub fn start(
        &mut self,
        prompt: &[u32],
        params: &GenerateParams,
    ) -> Result<Generation<'_>, ModelError> {
        let started = Instant::now();
        let reused = self.begin_prefill(prompt)?;
        let vocab = self.model.config.vocab;
        Ok(Generation {
            sampler: Sampler::new(params.sampling.clone(), vocab),
            params: params.clone(),
            pending: prompt[reused..].to_vec(),
            prompt_len: prompt.len(),
            reused,
            prefilled: 0,
            out: Vec::with_capacity(params.max_tokens.min(self.cache.capacity)),
            to_run: None,
            stop: None,
            started,
            prefill_time: Duration::ZERO,
            decode_start: None,
            decode_time: Duration::ZERO,
            ttft: None,
            raw: Vec::with_capacity(vocab),
            draft: None,
            ready: false,
            drafted: 0,
            accepted: 0,
            session: self,
        })
    }

    /// Prefills `prompt`, then samples up to `max_tokens`, reporting each token. Stops at a
    /// stop id, the token budget, a full context or `cancel` (checked between prefill
    /// chunks and between tokens). The whole loop runs inside the engine's pool, so that
    /// no token pays for handing work to it.
    pub fn generate(
        &mut self,
        prompt: &[u32],
        params: &GenerateParams,
        cancel: Option<&AtomicBool>,
        on_event: &mut (dyn FnMut(&Event) + Send),
    ) -> Result<(Vec<u32>, GenerationStats), ModelError> {
        crate::exec::pool().install(|| {
            let mut g = self.start(prompt, params)?;
            loop {
                if cancel.is_some_and(|c| c.load(Ordering::Relaxed)) {
                    g.cancel();
                }
                match g.next().map_err(|e| e.error)? {
                    Step::Prefill { done, total } if done == total => on_event(&Event::Prefilled {
                        tokens: g.prompt_len,
                        elapsed: g.prefill_time,
                    }),
                    Step::Prefill { .. } => {}
                    Step::Token(t) => on_event(&Event::Token {
                        id: t.id,
                        index: t.index,
                    }),
                    Step::Done(stats) => return Ok((g.out, stats)),
                }
            }
        })
    }
}

/// A short human label of a choice: `backbone`, `task code`, `skill sql`,
/// `task code + skill sql`, `blend(sql 0.70, chat 0.30)`.
pub fn label_of(model: &Model, a: &Active) -> String {
    use crate::model::select::SkillChoice;
    let task = a.task.as_ref().map(|t| format!("task {}", t.name));
    let skill = match &a.skill {
        SkillChoice::None => None,
        SkillChoice::One(k) => Some(format!("skill {}", skill_id(model, *k))),
        SkillChoice::Blend { weights, .. } => Some(format!(
            "blend({})",
            weights
                .iter()
                .enumerate()
                .map(|(i, w)| format!("{} {w:.2}", skill_id(model, i as u16)))
                .collect::<Vec<_>>()
                .join(", ")
        )),
    };
    match (task, skill) {
        (None, None) => "backbone".into(),
        (Some(t), None) => t,
        (None, Some(s)) => s,
        (Some(t), Some(s)) => format!("{t} + {s}"),
    }
}

fn skill_id(model: &Model, k: u16) -> &str {
    model.skills.get(k as usize).map_or("?", |s| s.id.as_str())
}

/// How many alternatives each generated token reports.
pub const TOP_ALTERNATIVES: usize = 10;

/// The most likely tokens at one position, most likely first, with their probabilities
/// under the model's own softmax (temperature 1, before any penalty or truncation).
/// A fixed array, so that reporting them allocates nothing per token.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TopTokens {
    pub ids: [u32; TOP_ALTERNATIVES],
    pub probs: [f32; TOP_ALTERNATIVES],
    pub len: usize,
}

impl TopTokens {
    pub fn iter(&self) -> impl Iterator<Item = (u32, f32)> + '_ {
        self.ids[..self.len]
            .iter()
            .copied()
            .zip(self.probs[..self.len].iter().copied())
    }
}

/// The probability of `chosen` and the top alternatives under softmax(`logits`).
/// NaN logits count as impossible.
pub fn token_probs(logits: &[f32], chosen: u32) -> (f32, TopTokens) {
    let mut top = TopTokens {
        ids: [0; TOP_ALTERNATIVES],
        probs: [f32::NEG_INFINITY; TOP_ALTERNATIVES],
        len: 0,
    };
    let max = logits
        .iter()
        .copied()
        .filter(|l| !l.is_nan())
        .fold(f32::NEG_INFINITY, f32::max);
    if !max.is_finite() {
        return (0.0, top);
    }
    let mut sum = 0.0f64;
    for (i, &l) in logits.iter().enumerate() {
        if l.is_nan() {
            continue;
        }
        sum += f64::from((l - max).exp());
        // Keep the best logits in descending order (ties: the lower id first).
        if top.len < TOP_ALTERNATIVES || l > top.probs[top.len - 1] {
            let mut j = top.len.min(TOP_ALTERNATIVES - 1);
            while j > 0 && top.probs[j - 1] < l {
                top.probs[j] = top.probs[j - 1];
                top.ids[j] = top.ids[j - 1];
                j -= 1;
            }
            top.probs[j] = l;
            top.ids[j] = i as u32;
            top.len = (top.len + 1).min(TOP_ALTERNATIVES);
        }
    }
    let p = |l: f32| ((f64::from(l - max).exp()) / sum) as f32;
    for k in 0..top.len {
        top.probs[k] = p(top.probs[k]);
    }
    let chosen_p = logits
        .get(chosen as usize)
        .filter(|l| !l.is_nan())
        .map_or(0.0, |&l| p(l));
    (chosen_p, top)
}

/// One generated token as [`Generation::next`] reports it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TokenStep {
    pub id: u32,
    /// Position among the generated tokens (0 = first).
    pub index: usize,
    /// Its probability under the model's softmax at that position.
    pub prob: f32,
    pub top: TopTokens,
}

/// What one [`Generation::next`] call did.
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// A prefill chunk ran: `done` of the `total` prompt tokens not found in the cache
    /// are in it now.
    Prefill { done: usize, total: usize },
    /// A token was chosen (the stop token too).
    Token(TokenStep),
    /// Generation is over; every later call says so again.
    Done(GenerationStats),
}

/// A failed step, with what had been generated before it.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{error}")]
pub struct GenerationError {
    pub error: ModelError,
    pub partial: Vec<u32>,
}

/// A generation in progress: the session stepped by its owner (see [`Session::start`]).
pub struct Generation<'s> {
    session: &'s mut Session,
    params: GenerateParams,
    sampler: Sampler,
    /// Prompt tokens still to prefill.
    pending: Vec<u32>,
    prompt_len: usize,
    reused: usize,
    prefilled: usize,
    out: Vec<u32>,
    /// The last generated token, not yet run through the model.
    to_run: Option<u32>,
    stop: Option<StopReason>,
    started: Instant,
    prefill_time: Duration,
    decode_start: Option<Instant>,
    decode_time: Duration,
    ttft: Option<Duration>,
    /// The last position's logits before sampling (vocab-sized, allocated at start).
    raw: Vec<f32>,
    /// The draft the last verify forward checked (speculative decoding).
    draft: Option<u32>,
    /// An accepted draft's forward already gave the next position's logits (row 1).
    ready: bool,
    drafted: usize,
    accepted: usize,
}

impl Generation<'_> {
    /// Advances by one prefill chunk or one token. Runs inside the engine's pool.
    // Not an Iterator: every call says what happened (Done included) or why it failed.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> Result<Step, GenerationError> {
        // One section per step: the forward, its sampling and any draft.
        crate::exec::step(|| self.advance())
    }

    fn advance(&mut self) -> Result<Step, GenerationError> {
        if self.stop.is_some() {
            return Ok(Step::Done(self.stats()));
        }
        let fail = |g: &mut Self, error: ModelError| {
            g.stop = Some(StopReason::Error);
            GenerationError {
                error,
                partial: g.out.clone(),
            }
        };
        let total = self.pending.len();
        if self.prefilled < total {
            let t = Instant::now();
            let end = self.session.chunk_end(self.prefilled, total);
            let chunk = &self.pending[self.prefilled..end];
            let r = self.session.prefill_chunk(chunk, end == total);
            self.prefill_time += t.elapsed();
            if let Err(e) = r {
                return Err(fail(self, e));
            }
            self.prefilled = end;
            return Ok(Step::Prefill { done: end, total });
        }
        let t = Instant::now();
        self.decode_start.get_or_insert(t);
        if self.out.len() >= self.params.max_tokens {
            self.stop = Some(StopReason::MaxTokens);
            return Ok(Step::Done(self.stats()));
        }
        let v = self.session.model.config.vocab;
        if let Some(id) = self.to_run.take() {
            let room = self.session.tokens.len() + 2 <= self.session.cache.capacity;
            let r = if self.session.spec.is_some() && room {
                self.speculate(id)
            } else {
                self.session.step(id)
            };
            if let Err(e) = r {
                self.decode_time += t.elapsed();
                return Err(fail(self, e));
            }
        } else if self.ready {
            // The accepted draft's forward gave this position's logits as its second row.
            self.session.ws.logits.copy_within(v..2 * v, 0);
            self.ready = false;
        }
        let logits = &mut self.session.ws.logits[..v];
        // The sampler rewrites logits (penalty): the probabilities are the model's own.
        self.raw.clear();
        self.raw.extend_from_slice(logits);
        let id = match self.draft.take() {
            None => self.sampler.sample(logits, &self.session.tokens),
            Some(d) => match self.judge(d) {
                Ok(id) => id,
                Err(e) => {
                    self.decode_time += t.elapsed();
                    return Err(fail(self, e));
                }
            },
        };
        let (prob, top) = token_probs(&self.raw, id);
        self.out.push(id);
        self.ttft.get_or_insert_with(|| self.started.elapsed());
        let step = TokenStep {
            id,
            index: self.out.len() - 1,
            prob,
            top,
        };
        if self.params.stop_ids.contains(&id) {
            self.stop = Some(StopReason::Eos);
        } else if self.out.len() >= self.params.max_tokens {
            self.stop = Some(StopReason::MaxTokens);
        } else if self.session.tokens.len() >= self.session.cache.capacity {
            self.stop = Some(StopReason::ContextFull);
        } else if !self.ready {
            self.to_run = Some(id);
        }
        self.decode_time += t.elapsed();
        Ok(Step::Token(step))
    }

    /// Stops the generation: the next [`Generation::next`] says `Done` with
    /// [`StopReason::Cancelled`]. The cache keeps what was computed (a cancelled prefill
    /// leaves a prefix the next prompt can reuse).
    pub fn cancel(&mut self) {
        if self.stop.is_none() {
            self.stop = Some(StopReason::Cancelled);
        }
    }

    /// Sampling from the next token on (a new sampler: its random stream restarts from
    /// the new seed).
    pub fn set_sampling(&mut self, sampling: SamplingParams) {
        let vocab = self.session.model.config.vocab;
        self.sampler = Sampler::new(sampling.clone(), vocab);
        self.params.sampling = sampling;
    }

    /// The tokens generated so far.
    pub fn output(&self) -> &[u32] {
        &self.out
    }

    /// The session being stepped (its tokens and route log between steps).
    pub fn session(&self) -> &Session {
        self.session
    }

    pub fn is_done(&self) -> bool {
        self.stop.is_some()
    }

    /// Prompt tokens: (new ones to prefill, found in the cache).
    pub fn prompt_split(&self) -> (usize, usize) {
        (self.pending.len(), self.reused)
    }

    /// Where the generation stands (final once done).
    pub fn stats(&self) -> GenerationStats {
        let rate = |n: usize, d: Duration| {
            if d.as_secs_f64() > 0.0 {
                n as f64 / d.as_secs_f64()
            } else {
                0.0
            }
        };
        // Tokens decoded through the model: every generated token but the last.
        let decoded = self.out.len().saturating_sub(1);
        GenerationStats {
            prompt_tokens: self.prompt_len,
            reused_tokens: self.reused,
            generated_tokens: self.out.len(),
            prefill_s: self.prefill_time.as_secs_f64(),
            decode_s: self.decode_time.as_secs_f64(),
            ttft_s: self.ttft.unwrap_or(self.prefill_time).as_secs_f64(),
            prefill_tok_s: rate(self.prefilled, self.prefill_time),
            decode_tok_s: rate(decoded, self.decode_time),
            stop: self.stop.unwrap_or(StopReason::Running),
            context_used: self.session.tokens.len(),
            context_capacity: self.session.cache.capacity,
            drafted: self.drafted,
            accepted: self.accepted,
        }
    }
}

/// Speculative decoding with the MTP head (§2.1), one draft token per step:
/// 1. the head catches up on the positions it has not seen and drafts `d` for the token
///    after the one about to run (`id`);
/// 2. one forward runs `[id, d]`, recording the recurrent layers' state after `id`;
/// 3. [`Generation::judge`] chooses the token at `d`'s place from the first row's
///    logits exactly as plain decoding would (greedy: the same argmax; sampling: the
///    speculative-sampling rule, which leaves the distribution unchanged). If it is `d`,
///    the second row's logits are the next position's and cost nothing more; if not, the
///    state rolls back to just after `id` (KV forgets `d`, recurrent layers return to the
///    recorded state).
///
/// A batch forward computes every row bit for bit as a one-token forward would (matrix
/// products equal their matrix-vector products; Gated DeltaNet runs its recurrent form
/// while recording), so greedy output is identical to plain decoding.
impl Generation<'_> {
    fn speculate(&mut self, id: u32) -> Result<(), ModelError> {
        let sess = &mut *self.session;
        let model = sess.model.clone();
        let head = model.mtp.as_ref().expect("speculation needs the MTP head");
        let spec = sess.spec.as_mut().expect("speculation is on");
        let h = model.config.hidden;
        let len = sess.tokens.len();
        // 1. The head's rows spec.state.len .. len: row j reads h_j and t_{j+1} (the last
        //    one is `id`, not in the state yet).
        let mut j = spec.state.len;
        while j < len {
            let n = (len - j).min(spec.next.len());
            for i in 0..n {
                let at = j + i + 1;
                spec.next[i] = if at < len { sess.tokens[at] } else { id };
            }
            head.forward(
                &model,
                &spec.next[..n],
                &spec.hist[j * h..(j + n) * h],
                &mut spec.state,
                &mut spec.scratch,
            )?;
            j += n;
        }
        let draft_logits = &mut spec.scratch.ws.logits[..model.config.vocab];
        let d = if self.sampler.params.is_greedy() {
            crate::runtime::sampler::argmax(draft_logits) as u32
        } else {
            // The draft is drawn from q, the sampler's distribution over the head's
            // logits (any q keeps the output distribution; a closer one accepts more).
            spec.q.fill(0.0);
            for &(pr, t) in self.sampler.distribution(draft_logits, &sess.tokens) {
                spec.q[t as usize] = pr;
            }
            self.sampler.draw()
        };
        // 2. Verify: [id, d] in one forward.
        let pos0 = sess.cache.len;
        sess.cache.keep_history(2);
        let r = model.forward(&[id, d], &mut sess.cache, &mut sess.ws, Logits::All, None);
        if let Err(e) = r {
            sess.cache.drop_history();
            return Err(e);
        }
        sess.push_tokens(&[id]);
        sess.log_forward(0..1);
        sess.keep_hidden(pos0, 0..2);
        self.draft = Some(d);
        Ok(())
    }

    /// The token at the draft's place, chosen from the first row's logits (in the
    /// workspace's first `vocab` entries); keeps or rolls back the draft.
    fn judge(&mut self, d: u32) -> Result<u32, ModelError> {
        self.drafted += 1;
        let sess = &mut *self.session;
        let v = sess.model.config.vocab;
        let logits = &mut sess.ws.logits[..v];
        let x = if self.sampler.params.is_greedy() {
            self.sampler.sample(logits, &sess.tokens)
        } else {
            let spec = sess.spec.as_mut().expect("speculation is on");
            spec.p.fill(0.0);
            for &(pr, t) in self.sampler.distribution(logits, &sess.tokens) {
                spec.p[t as usize] = pr;
            }
            let (p, q) = (spec.p[d as usize], spec.q[d as usize]);
            if q > 0.0 && self.sampler.uniform() < p / q {
                d
            } else {
                // The residual max(0, p − q), normalised (p itself if it is empty).
                for (pv, &qv) in spec.p.iter_mut().zip(spec.q.iter()) {
                    *pv = (*pv - qv).max(0.0);
                }
                match self.sampler.draw_from(&spec.p) {
                    Some(x) => x,
                    None => self.sampler.draw(),
                }
            }
        };
        let len = sess.tokens.len();
        if x == d {
            self.accepted += 1;
            sess.push_tokens(&[d]);
            sess.log_forward(1..2);
            sess.cache.drop_history();
            self.ready = true;
        } else {
            let ok = sess.cache.rollback(len);
            sess.cache.drop_history();
            if !ok {
                return Err(ModelError::Rollback(len));
            }
        }
        Ok(x)
    }
}
