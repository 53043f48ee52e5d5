//! A conversation with a model: the KV cache, prefill in chunks, decode one token at a
//! time, stop conditions, cancellation between tokens, timings.
//!
//! The session keeps the tokens its cache holds; [`Session::prefill`] reuses the longest
//! common prefix with the new prompt, so a chat re-rendered each turn only computes the
//! new part.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::kv_cache::KvCache;
use super::sampler::{Sampler, SamplingParams};
use crate::model::{Logits, Model, ModelError, Workspace};

/// Tokens per prefill forward: large enough for the matrix products to reuse each weight
/// row across many tokens, small enough to keep the workspace in the megabytes.
pub const PREFILL_CHUNK: usize = 64;

#[derive(Clone, Debug, PartialEq)]
pub struct GenerateParams {
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    /// Generation stops after any of these (the chat bundle's EOS ids).
    pub stop_ids: Vec<u32>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// A stop id was generated (it is part of the output ids).
    Eos,
    MaxTokens,
    /// The context is full.
    ContextFull,
    Cancelled,
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
    cache: KvCache,
    ws: Workspace,
    /// The tokens whose keys and values the cache holds, in order.
    tokens: Vec<u32>,
}

impl Session {
    /// A session with room for `context` positions (clamped to the model's maximum).
    pub fn new(model: Arc<Model>, context: usize) -> Session {
        let cap = context.clamp(1, model.config.max_positions.max(1));
        crate::model::attention::reserve_scores(cap);
        let c = &model.config;
        let widest = c.hidden.max(c.intermediate).max(c.n_heads * c.head_dim);
        crate::quant::matrix::reserve_thread_buffers(widest, PREFILL_CHUNK);
        Session {
            cache: model.new_cache(cap),
            ws: model.new_workspace(PREFILL_CHUNK),
            tokens: Vec::with_capacity(cap),
            model,
        }
    }

    pub fn capacity(&self) -> usize {
        self.cache.capacity
    }

    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    pub fn reset(&mut self) {
        self.tokens.clear();
        self.cache.truncate(0);
    }

    /// Puts `prompt` in the cache, reusing the common prefix with what it holds, and
    /// leaves the last position's logits in the workspace. Returns the reused count.
    pub fn prefill(&mut self, prompt: &[u32]) -> Result<usize, ModelError> {
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
        let mut common = self
            .tokens
            .iter()
            .zip(prompt)
            .take_while(|(a, b)| a == b)
            .count();
        // The last prompt token must be run to get its logits.
        common = common.min(prompt.len() - 1);
        self.tokens.truncate(common);
        self.cache.truncate(common);
        let rest = &prompt[common..];
        let n = rest.len().div_ceil(PREFILL_CHUNK);
        for (i, chunk) in rest.chunks(PREFILL_CHUNK).enumerate() {
            let want = if i + 1 == n {
                Logits::Last
            } else {
                Logits::None
            };
            self.model
                .forward(chunk, &mut self.cache, &mut self.ws, want, None)?;
            self.tokens.extend_from_slice(chunk);
        }
        Ok(common)
    }

    /// Runs one more token; its logits replace the workspace's.
    pub fn step(&mut self, id: u32) -> Result<(), ModelError> {
        self.model
            .forward(&[id], &mut self.cache, &mut self.ws, Logits::Last, None)?;
        self.tokens.push(id);
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

    /// Prefills `prompt`, then samples up to `max_tokens`, reporting each token. Stops at a
    /// stop id, the token budget, a full context or `cancel` (checked between tokens).
    /// The whole loop runs inside the engine's pool, so that no token pays for handing
    /// work to it.
    pub fn generate(
        &mut self,
        prompt: &[u32],
        params: &GenerateParams,
        cancel: Option<&AtomicBool>,
        on_event: &mut (dyn FnMut(&Event) + Send),
    ) -> Result<(Vec<u32>, GenerationStats), ModelError> {
        crate::runtime::threads::pool()
            .install(|| self.generate_in_pool(prompt, params, cancel, on_event))
    }

    fn generate_in_pool(
        &mut self,
        prompt: &[u32],
        params: &GenerateParams,
        cancel: Option<&AtomicBool>,
        on_event: &mut (dyn FnMut(&Event) + Send),
    ) -> Result<(Vec<u32>, GenerationStats), ModelError> {
        let started = Instant::now();
        let reused = self.prefill(prompt)?;
        let prefill_time = started.elapsed();
        on_event(&Event::Prefilled {
            tokens: prompt.len(),
            elapsed: prefill_time,
        });
        let mut sampler = Sampler::new(params.sampling.clone(), self.model.config.vocab);
        let mut out = Vec::with_capacity(params.max_tokens.min(self.cache.capacity));
        let mut ttft = None;
        let decode_start = Instant::now();
        let stop = loop {
            if cancel.is_some_and(|c| c.load(Ordering::Relaxed)) {
                break StopReason::Cancelled;
            }
            if out.len() >= params.max_tokens {
                break StopReason::MaxTokens;
            }
            let v = self.model.config.vocab;
            let id = sampler.sample(&mut self.ws.logits[..v], &self.tokens);
            out.push(id);
            ttft.get_or_insert_with(|| started.elapsed());
            on_event(&Event::Token {
                id,
                index: out.len() - 1,
            });
            if params.stop_ids.contains(&id) {
                break StopReason::Eos;
            }
            if out.len() >= params.max_tokens {
                break StopReason::MaxTokens;
            }
            if self.tokens.len() >= self.cache.capacity {
                break StopReason::ContextFull;
            }
            self.step(id)?;
        };
        let decode_time = decode_start.elapsed();
        let new = prompt.len() - reused;
        // Tokens decoded through the model: every generated token but the last.
        let decoded = out.len().saturating_sub(1);
        let rate = |n: usize, d: Duration| {
            if d.as_secs_f64() > 0.0 {
                n as f64 / d.as_secs_f64()
            } else {
                0.0
            }
        };
        let stats = GenerationStats {
            prompt_tokens: prompt.len(),
            reused_tokens: reused,
            generated_tokens: out.len(),
            prefill_s: prefill_time.as_secs_f64(),
            decode_s: decode_time.as_secs_f64(),
            ttft_s: ttft.unwrap_or(prefill_time).as_secs_f64(),
            prefill_tok_s: rate(new, prefill_time),
            decode_tok_s: rate(decoded, decode_time),
            stop,
            context_used: self.tokens.len(),
            context_capacity: self.cache.capacity,
        };
        Ok((out, stats))
    }
}
