//! The model: per-layer blocks chosen by which tensors are present (§2), over weights that
//! stay in the mmap in their stored dtype.
//!
//! [`Model::forward`] is the whole computation, top to bottom: embed → layers → final norm
//! → LM head. Sessions (`runtime`) own the per-layer state ([`state::ModelState`]: KV
//! cache and recurrent state) and the [`Workspace`]; the model itself is immutable and
//! shared between threads.

pub mod attend;
pub mod attention;
pub mod block;
pub mod config;
pub mod gated_deltanet;
pub mod kv_cache;
pub mod lazy_verify;
pub mod linear;
pub mod mlp;
pub mod moe;
pub mod mtp;
pub mod norm;
pub mod probe;
pub mod rope;
pub mod scope;
pub mod select;
pub mod state;
pub mod vmath;

use std::sync::Arc;

use self::attention::{AttentionConfig, AttentionScratch};
use self::block::{DecoderLayer, LayerScratch, TokenMixer};
use self::config::{LayerKind, ModelConfig};
use self::gated_deltanet::{Form, GdnScratch};
use self::linear::Linear;
use self::mlp::MlpScratch;
use self::moe::{LayerRoutes, MoeScratch};
use self::norm::RmsNorm;
use self::scope::Scope;
use self::select::Active;
use self::state::ModelState;
use crate::format::shards::CmfModel;
pub use crate::quant::matrix::Precision;

/// Why a file cannot be run, or a forward refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ModelError {
    /// The file has no `arch` block.
    #[error("the file has no arch block: nothing to run")]
    NoArch,
    /// An arch field is missing or out of range.
    #[error("arch.{field}: {reason}")]
    Config { field: String, reason: String },
    /// A tensor the layer layout needs is absent.
    #[error("tensor {0} is missing")]
    MissingTensor(String),
    /// A tensor has the wrong shape for the arch.
    #[error("tensor {name} {reason}")]
    Shape { name: String, reason: String },
    /// A tensor's payload cannot be used (reserved dtype, inconsistent bytes).
    #[error("tensor {name}: {reason}")]
    Tensor { name: String, reason: String },
    /// The file needs a block this engine does not have yet.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// A token id outside the vocabulary.
    #[error("token id {id} is outside the vocabulary (size {vocab})")]
    TokenOutOfRange { id: u32, vocab: usize },
    /// The context is full.
    #[error("context limit reached: {needed} positions needed, the session holds {capacity}")]
    ContextFull { needed: usize, capacity: usize },
    /// A tensor failed its hash check on first use (`--verify-on-load`).
    #[error("integrity: {0}")]
    Integrity(String),
    /// A forward met a value it cannot go on from (a NaN router logit), naming where.
    #[error("numerical failure: {0}")]
    Numeric(String),
    /// The state cannot return to a position (recurrent state that was not saved there).
    #[error("cannot roll the state back to position {0}")]
    Rollback(usize),
    /// A task mask that does not fit the model it is in (a field wider than its layer, a
    /// layer with no routable expert).
    #[error("{0}")]
    Task(String),
    /// A task or skill the file does not have (the user's request; the message lists
    /// what the file has).
    #[error("{0}")]
    UnknownChoice(String),
}

pub struct Model {
    pub config: ModelConfig,
    pub file: Arc<CmfModel>,
    pub embed: Linear,
    pub layers: Vec<DecoderLayer>,
    pub norm: RmsNorm,
    /// `lm_head.weight`, or the embedding when tied.
    pub lm_head: Linear,
    pub tied: bool,
    /// What the loader had to assume (shown to the user, never silently).
    pub warnings: Vec<String>,
    /// The multi-token-prediction head (§2.1), when the file has a usable one.
    pub mtp: Option<mtp::MtpHead>,
    /// The skills of the registry, in its order (§9).
    pub skills: Vec<SkillInfo>,
    /// Task masks resolved so far, by name ([`Model::task`]): resolving packs the live
    /// neurons, which a chat choosing per message must not redo each turn.
    tasks: std::sync::Mutex<std::collections::HashMap<String, Arc<select::TaskMask>>>,
    /// Tensors checked on first use instead of at load ([`Model::verify_on_first_use`]).
    lazy: Option<lazy_verify::LazyVerify>,
}

/// What the engine made of one skill of the registry.
#[derive(Clone, Debug, PartialEq)]
pub struct SkillInfo {
    pub id: String,
    /// The backbone tensors it replaces (matrices the forward reads from it).
    pub replaced: Vec<String>,
    /// Why it cannot be selected, if it cannot.
    pub problem: Option<String>,
}

/// Which positions' logits a forward computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    /// Only the last position's (generation).
    Last,
    /// Every position's (parity, perplexity).
    All,
    /// None (prefill of a chunk that is not the last).
    None,
}

/// Every buffer one forward of up to `t_max` tokens needs, allocated once.
#[derive(Debug)]
pub struct Workspace {
    pub t_max: usize,
    x: Vec<f32>,
    layer: LayerScratch,
    /// Logits of the last forward: [1, vocab] or [t, vocab].
    pub logits: Vec<f32>,
    /// Per layer, the experts the last forward's tokens chose (empty for dense layers).
    pub routes: Vec<LayerRoutes>,
    /// How Gated DeltaNet layers compute (tests force one form).
    pub form: Form,
    /// Compute the final norm of every row even without logits (the MTP head reads it).
    pub keep_hidden: bool,
    /// The task mask and skill the forwards run under (the session sets it between steps).
    pub active: Active,
    /// Statistics a calibration collects from every forward (`mask calibrate`).
    pub probe: Option<probe::Probe>,
}

impl Workspace {
    pub fn new(model: &Model, t_max: usize) -> Workspace {
        Workspace::for_layers(&model.config, &model.layers, t_max)
    }

    /// Buffers for a forward of up to `t_max` tokens through `layers` (the model's, or an
    /// MTP head's).
    pub fn for_layers(c: &ModelConfig, layers: &[DecoderLayer], t_max: usize) -> Workspace {
        let t_max = t_max.max(1);
        let attn = AttentionConfig {
            n_heads: c.n_heads,
            n_kv_heads: c.n_kv_heads,
            head_dim: c.head_dim,
            scale: 0.0,
            window: None,
            softcap: None,
        };
        let gated = layers
            .iter()
            .any(|l| matches!(&l.mixer, TokenMixer::Attention(a) if a.output_gate));
        let gdn = GdnScratch::for_layers(
            layers.iter().filter_map(|l| match &l.mixer {
                TokenMixer::GatedDeltaNet(g) => Some(&g.cfg),
                _ => None,
            }),
            t_max,
        );
        let moes: Vec<_> = layers.iter().filter_map(|l| l.moe()).collect();
        let widest_mlp = layers.iter().map(|l| l.ff_width()).max().unwrap_or(0);
        let moe = (!moes.is_empty()).then(|| {
            MoeScratch::new(
                moes.iter().map(|m| m.num_experts()).max().unwrap_or(0),
                moes.iter().map(|m| m.top_k).max().unwrap_or(0),
                moes.iter().map(|m| m.widest()).max().unwrap_or(0),
                c.hidden,
                t_max,
            )
        });
        Workspace {
            t_max,
            x: vec![0.0; t_max * c.hidden],
            layer: LayerScratch {
                h: vec![0.0; t_max * c.hidden],
                o: vec![0.0; t_max * c.hidden],
                attn: AttentionScratch::new(&attn, t_max, gated),
                gdn,
                mlp: MlpScratch::new(widest_mlp, t_max),
                moe,
            },
            logits: vec![0.0; c.vocab],
            routes: layers
                .iter()
                .enumerate()
                .map(|(i, l)| match l.moe() {
                    Some(m) => LayerRoutes::new(i, m.top_k, t_max),
                    None => LayerRoutes {
                        layer: i,
                        ..LayerRoutes::default()
                    },
                })
                .collect(),
            form: Form::Auto,
            keep_hidden: false,
            active: Active::default(),
            probe: None,
        }
    }

    /// The final-normed hidden state of row `i` of the last forward (valid after a
    /// forward that computed logits or hidden states).
    pub fn final_hidden(&self, i: usize, hidden: usize) -> &[f32] {
        &self.layer.h[i * hidden..(i + 1) * hidden]
    }
}

impl Model {
    /// Builds the blocks of every layer from the tensors present. Reads only the small
    /// vectors (norms, biases); weight matrices stay in the mmap.
    pub fn load(file: Arc<CmfModel>) -> Result<Model, ModelError> {
        Model::load_with(file, &serde_json::Map::new())
    }

    /// [`Model::load`] with arch fields replaced or added first (`--arch key=value`): the
    /// way to run a file whose converter left out a field, such as the reference
    /// converter's Gemma 3 files, which carry no `sliding_window`.
    pub fn load_with(
        file: Arc<CmfModel>,
        overrides: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<Model, ModelError> {
        if file.primary().is_skill_file() {
            return Err(ModelError::Unsupported(
                "this is a standalone skill file (§9.1, SKILL_FILE): a partial tensor set, not \
                 a model. Apply it to the base it was cut from: `cortiq skill apply BASE.cmf \
                 SKILL.cmf -o OUT.cmf`, then run OUT.cmf"
                    .into(),
            ));
        }
        let arch = file.header().arch.as_ref().ok_or(ModelError::NoArch)?;
        let arch = if overrides.is_empty() {
            arch.clone()
        } else {
            let mut v = serde_json::to_value(arch).expect("an arch serialises");
            let obj = v.as_object_mut().expect("an arch is an object");
            for (k, val) in overrides {
                obj.insert(k.clone(), val.clone());
            }
            serde_json::from_value(v).map_err(|e| ModelError::Config {
                field: "(override)".into(),
                reason: e.to_string(),
            })?
        };
        let c = ModelConfig::from_arch(&arch)?;
        let mut warnings = Vec::new();
        if c.layer_kinds.contains(&LayerKind::SlidingAttention) && c.sliding_window.is_none() {
            warnings.push(
                "the arch has sliding-window layers but no sliding_window: they attend to the \
                 whole context (set it with --arch sliding_window=N)"
                    .to_string(),
            );
        }
        let root = Scope::root(&file, c.eps, c.zero_centred_norm);
        let h = c.hidden;
        let tied = !root.has("lm_head.weight");
        let (embed, lm_head) = if tied {
            let embed = Linear::load(&file, "model.embed_tokens.weight", c.vocab, h)?;
            (embed.clone(), embed)
        } else {
            (
                Linear::load_rows(&file, "model.embed_tokens.weight", c.vocab, h)?,
                Linear::load(&file, "lm_head.weight", c.vocab, h)?,
            )
        };
        let layers = c
            .layer_kinds
            .iter()
            .enumerate()
            .map(|(i, &kind)| {
                let layer = DecoderLayer::load(&root.pp(format!("model.layers.{i}")), i, kind, &c)?;
                // Reading the layer's small tensors (norms, biases) after its matrices mapped
                // back the 2 MiB pages they share with them: a load's peak would hold each
                // layer's share until the end.
                for l in layer.linears() {
                    l.release_unread();
                }
                Ok(layer)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let final_norm = root.norm("model.norm", h)?;
        let mut c = c;
        // The widest MLP decides the scratch size (intermediate_size may be absent, and
        // §11 shrinks each layer to its own).
        c.intermediate = layers.iter().map(|l| l.ff_width()).max().unwrap_or(0);
        let mtp = match mtp::MtpHead::load(&root, &c) {
            Ok(head) => head,
            Err(e) => {
                warnings.push(format!(
                    "the MTP head is not usable ({e}): decoding without it"
                ));
                None
            }
        };
        if mtp.is_none() && c.mtp_layers.is_some() && !warnings.iter().any(|w| w.contains("MTP")) {
            warnings.push("arch.mtp is declared but the file has no model.mtp tensors".into());
        }
        let mut model = Model {
            mtp,
            warnings,
            norm: final_norm,
            embed,
            lm_head,
            tied,
            layers,
            file,
            config: c,
            skills: Vec::new(),
            tasks: Default::default(),
            lazy: None,
        };
        model.skills = model.attach_skills();
        for l in model.linears() {
            l.release_unread();
        }
        Ok(model)
    }

    /// Every skill of the registry (§9) becomes a second source of the linears it
    /// replaces: `skill.{id}.{name}` in the same mmap, checked to have `{name}`'s shape.
    /// A skill that replaces a tensor the engine does not read as a matrix (a norm) is
    /// listed with that problem and refused when selected.
    fn attach_skills(&mut self) -> Vec<SkillInfo> {
        let records = self.file.header().skills.clone().unwrap_or_default();
        let mut infos = Vec::new();
        let mut slots = 0u32;
        let names: Vec<(usize, String)> = self
            .file
            .tensors()
            .map(|(_, e)| e.name.clone())
            .enumerate()
            .collect();
        for (k, rec) in records.iter().enumerate().take(u16::MAX as usize) {
            let prefix = format!("skill.{}.", rec.id);
            let mut info = SkillInfo {
                id: rec.id.clone(),
                replaced: Vec::new(),
                problem: None,
            };
            let replaced: Vec<String> = names
                .iter()
                .filter_map(|(_, n)| n.strip_prefix(&prefix).map(str::to_string))
                .collect();
            for base in &replaced {
                if base.ends_with(".bias") {
                    continue; // taken with its matrix below
                }
                let bias_name = format!("{}.bias", base.strip_suffix(".weight").unwrap_or(base));
                let full = format!("{prefix}{base}");
                let mut found = false;
                let file = self.file.clone();
                let scope = Scope::root(&file, 0.0, false);
                for lin in self.linears_mut() {
                    if lin.name != *base {
                        continue;
                    }
                    found = true;
                    let attached = if replaced.contains(&bias_name) {
                        scope
                            .vector(&format!("{prefix}{bias_name}"), lin.out_dim())
                            .map(Some)
                    } else {
                        Ok(None)
                    }
                    .and_then(|bias| lin.add_alt(k as u16, &full, bias));
                    match attached {
                        Ok(()) if lin.slot.is_none() => {
                            lin.slot = Some(slots);
                            slots += 1;
                        }
                        Ok(()) => {}
                        Err(e) => {
                            info.problem.get_or_insert(e.to_string());
                        }
                    }
                }
                if found {
                    info.replaced.push(base.clone());
                } else if info.problem.is_none() {
                    info.problem = Some(format!(
                        "it replaces {base}, which this engine reads only at load (norms and                          vectors cannot be switched) or does not read at all"
                    ));
                }
            }
            infos.push(info);
        }
        // A tied head is a copy of the embedding: give it the embedding's sources.
        if self.tied {
            self.lm_head = self.embed.clone();
        }
        infos
    }

    /// Every weight matrix of the model (the embedding and head, each layer's, the MTP
    /// head's).
    pub fn linears(&self) -> impl Iterator<Item = &Linear> + '_ {
        let mtp = self.mtp.iter().flat_map(|m| {
            std::iter::once(&m.eh_proj).chain(m.layers.iter().flat_map(|l| l.linears()))
        });
        [&self.embed, &self.lm_head]
            .into_iter()
            .chain(self.layers.iter().flat_map(|l| l.linears()))
            .chain(mtp)
    }

    fn linears_mut(&mut self) -> Vec<&mut Linear> {
        let mut v: Vec<&mut Linear> = vec![&mut self.embed];
        if !self.tied {
            v.push(&mut self.lm_head);
        }
        for l in self.layers.iter_mut() {
            v.extend(l.linears_mut());
        }
        v
    }

    /// The task mask `name` of the model's file, resolved once and then shared (its packed
    /// neurons stay for the model's lifetime).
    pub fn task(&self, name: &str) -> Result<Arc<select::TaskMask>, ModelError> {
        let mut cache = self.tasks.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(t) = cache.get(name) {
            return Ok(t.clone());
        }
        let t = Arc::new(select::TaskMask::by_name(self, name)?);
        cache.insert(name.to_string(), t.clone());
        Ok(t)
    }

    /// The registry index of skill `id`.
    pub fn skill_index(&self, id: &str) -> Option<u16> {
        self.skills
            .iter()
            .position(|s| s.id == id)
            .map(|i| i as u16)
    }

    /// Sets how every weight product takes its activations: [`Precision::Balanced`] (the
    /// default; two int8 levels for the integer kernels of q8/q4/vbit/q1t dtypes),
    /// [`Precision::Exact`] (f32, the parity path) or [`Precision::Fast`] (one int8
    /// level).
    /// The precision set by [`Model::set_precision`].
    pub fn precision(&self) -> Precision {
        self.embed.precision
    }

    pub fn set_precision(&mut self, p: Precision) {
        self.embed.precision = p;
        self.lm_head.precision = p;
        let mtp_layers = self.mtp.iter_mut().flat_map(|m| m.layers.iter_mut());
        for l in self.layers.iter_mut().chain(mtp_layers) {
            for lin in l.linears_mut() {
                lin.precision = p;
            }
        }
        if let Some(m) = &mut self.mtp {
            m.eh_proj.precision = p;
        }
    }

    /// A fresh state for a context of `capacity` positions: KV for attention layers
    /// (zeroed pages, so unused positions cost no RSS), O(1) state for linear layers.
    pub fn new_state(&self, capacity: usize) -> ModelState {
        ModelState::new(
            self.layers.iter().map(|l| l.new_state(capacity)).collect(),
            capacity,
        )
    }

    pub fn new_workspace(&self, t_max: usize) -> Workspace {
        Workspace::new(self, t_max)
    }

    /// The widest input of any weight product (the per-thread activation buffers are
    /// sized for it): hidden, MLP widths, attention heads, Gated DeltaNet values, and the
    /// MTP head's `2·hidden`.
    pub fn widest_input(&self) -> usize {
        let c = &self.config;
        let mut w = c.hidden.max(c.intermediate).max(c.n_heads * c.head_dim);
        for l in self
            .layers
            .iter()
            .chain(self.mtp.iter().flat_map(|m| m.layers.iter()))
        {
            if let TokenMixer::GatedDeltaNet(g) = &l.mixer {
                w = w.max(g.cfg.value_dim());
            }
        }
        if self.mtp.is_some() {
            w = w.max(2 * c.hidden);
        }
        w
    }

    /// Bytes of weights one decoded token reads (plain decoding from the backbone, no
    /// task mask, no skill): every matrix the layers multiply, the LM head (the embedding
    /// matrix itself when tied) and one embedding row. The bytes the kernels stream: the
    /// stored ones, from the mmap, or for a `q1t` matrix repacked at load its repacked rows
    /// and overlay ([`crate::quant::matrix::Matrix::streamed_bytes`]).
    ///
    /// Approximations: a MoE layer counts its router, its shared expert (and gate) and
    /// `top_k` routed experts of the layer's mean expert size (the experts differ in size
    /// only in a §11 defragmented file, and which ones a token picks is known only at run
    /// time); an embedding row is the embedding's bytes over the vocabulary; the MTP head
    /// (speculative decoding) is not counted.
    pub fn weight_bytes_per_token(&self) -> u64 {
        let bytes = |l: &Linear| l.m.streamed_bytes() as u64;
        let vocab = self.config.vocab.max(1) as u64;
        let mut total = bytes(&self.lm_head) + bytes(&self.embed) / vocab;
        for layer in &self.layers {
            let all: u64 = layer.linears().into_iter().map(bytes).sum();
            total += match layer.moe() {
                None => all,
                Some(m) => {
                    let experts: u64 = m
                        .experts
                        .iter()
                        .map(|e| bytes(&e.gate) + bytes(&e.up) + bytes(&e.down))
                        .sum();
                    let n = m.experts.len().max(1) as u64;
                    all - experts + experts * m.top_k as u64 / n
                }
            };
        }
        total
    }

    /// Whether any layer is a mixture of experts.
    pub fn has_moe(&self) -> bool {
        self.layers.iter().any(|l| l.moe().is_some())
    }

    /// Runs `tokens` (at most `ws.t_max`) at positions `cache.len..`, appends them to the
    /// cache and leaves the requested logits in `ws.logits`. With `hidden`, pushes the
    /// hidden states as transformers reports them: the embedding output, each layer's
    /// output but the last, and the final norm's output ([L+1] × [t, hidden]).
    pub fn forward(
        &self,
        tokens: &[u32],
        cache: &mut ModelState,
        ws: &mut Workspace,
        logits: Logits,
        hidden: Option<&mut Vec<f32>>,
    ) -> Result<(), ModelError> {
        crate::exec::step(|| self.forward_in_pool(tokens, cache, ws, logits, hidden))
    }

    fn forward_in_pool(
        &self,
        tokens: &[u32],
        cache: &mut ModelState,
        ws: &mut Workspace,
        logits: Logits,
        mut hidden: Option<&mut Vec<f32>>,
    ) -> Result<(), ModelError> {
        let c = &self.config;
        let t = tokens.len();
        assert!(
            t <= ws.t_max,
            "forward of {t} tokens with a workspace for {}",
            ws.t_max
        );
        let pos0 = cache.len;
        if pos0 + t > cache.capacity {
            return Err(ModelError::ContextFull {
                needed: pos0 + t,
                capacity: cache.capacity,
            });
        }
        if let Some(&id) = tokens.iter().find(|&&id| id as usize >= c.vocab) {
            return Err(ModelError::TokenOutOfRange { id, vocab: c.vocab });
        }
        let h = c.hidden;
        let x = &mut ws.x[..t * h];
        if let Some(lazy) = &self.lazy {
            lazy.rest(&self.file)?;
        }

        let sk = ws.active.skill_sel();
        for (i, &id) in tokens.iter().enumerate() {
            self.embed_token_in(sk, id, &mut x[i * h..(i + 1) * h]);
        }
        // NaN or Inf weights would otherwise flow through to logits that sample token 0
        // forever; each stage's output is checked (a few µs a layer) so the error names
        // the first one that broke.
        if let Some(j) = x.chunks(h).position(|r| !all_finite(r)) {
            return Err(ModelError::Numeric(format!(
                "the embedding of token {} is not finite (NaN or Inf in the embedding weights)",
                tokens[j]
            )));
        }
        if let Some(hs) = hidden.as_deref_mut() {
            hs.extend_from_slice(x);
        }

        // Decoder layers.
        for (i, layer) in self.layers.iter().enumerate() {
            let sel = ws.active.layer(i);
            // A layer a task mask gates off is not used: not checked either.
            if let Some(lazy) = self.lazy.as_ref().filter(|_| !sel.skip()) {
                if let Err(e) = lazy.layer(&self.file, i) {
                    cache.truncate(0);
                    return Err(e);
                }
            }
            let r = if sel.skip() {
                // A gated-off layer: the residual passes through; its state keeps nothing
                // for these positions (what a later task with the layer on reads there is
                // the approximation "keep the cache" accepts).
                Ok(())
            } else {
                layer.forward(
                    x,
                    t,
                    pos0,
                    &mut cache.layers[i],
                    &mut ws.layer,
                    &mut ws.routes[i],
                    ws.form,
                    sel,
                )
            };
            let r = r.and_then(|()| {
                if all_finite(x) {
                    Ok(())
                } else {
                    Err(ModelError::Numeric(format!(
                        "the output of layer {i} is not finite (NaN or Inf): a weight of \
                         model.layers.{i} is corrupt, or its values overflow"
                    )))
                }
            });
            if let Err(e) = r {
                // The layers before this one have advanced: the state is unusable.
                cache.truncate(0);
                return Err(e);
            }
            if let Some(p) = ws.probe.as_mut().filter(|_| !sel.skip()) {
                p.observe(i, layer, &ws.layer, t, sel.ffn().map(|f| f.live));
            }
            if i + 1 < self.layers.len() {
                if let Some(hs) = hidden.as_deref_mut() {
                    hs.extend_from_slice(x);
                }
            }
        }
        cache.len = pos0 + t;

        // Final norm and LM head.
        let rows = match logits {
            Logits::None => {
                if hidden.is_some() || ws.keep_hidden {
                    let normed = &mut ws.layer.h[..t * h];
                    self.norm.forward(x, normed);
                    if let Some(hs) = hidden.as_deref_mut() {
                        hs.extend_from_slice(normed);
                    }
                }
                return Ok(());
            }
            Logits::Last => t - 1..t,
            Logits::All => 0..t,
        };
        let normed = &mut ws.layer.h[..t * h];
        self.norm.forward(x, normed);
        if let Some(hs) = hidden {
            hs.extend_from_slice(normed);
        }
        let sk = ws.active.skill_sel();
        self.logits_in(sk, &normed[rows.start * h..rows.end * h], &mut ws.logits);
        if !all_finite(&ws.logits) {
            return Err(ModelError::Numeric(
                "the logits are not finite (NaN or Inf) while every layer's output is: the \
                 final norm or the LM head holds a corrupt weight"
                    .into(),
            ));
        }
        Ok(())
    }

    /// Checks the tensors on first use instead of up front: each decoder layer's before it
    /// first runs, the rest before the first embedding (see [`lazy_verify`]). The caller
    /// has checked the file's small links (`VerifyOptions::skip_tensors`).
    pub fn verify_on_first_use(&mut self) {
        self.lazy = Some(lazy_verify::LazyVerify::new(&self.file, self.layers.len()));
    }

    /// With [`Model::verify_on_first_use`]: tensors checked so far, of all.
    pub fn first_use_checks(&self) -> Option<(usize, usize)> {
        self.lazy.as_ref().map(|l| l.progress())
    }

    /// Token `id`'s embedding into `out` [hidden] (Gemma scales it by √hidden).
    pub fn embed_token(&self, id: u32, out: &mut [f32]) {
        self.embed_token_in(linear::SkillSel::Base, id, out)
    }

    /// [`Model::embed_token`] from the embedding `sel` picks.
    pub fn embed_token_in(&self, sel: linear::SkillSel, id: u32, out: &mut [f32]) {
        self.embed.row_in(sel, id as usize, out);
        if let Some(m) = self.config.embed_multiplier {
            out.iter_mut().for_each(|v| *v *= m);
        }
    }

    /// The LM head over final-normed rows `normed` [n, hidden] into `logits` [n, vocab]
    /// (resized if needed), soft-capped where the arch says so.
    pub fn logits_of(&self, normed: &[f32], logits: &mut Vec<f32>) {
        self.logits_in(linear::SkillSel::Base, normed, logits)
    }

    /// [`Model::logits_of`] with the head `sel` picks.
    pub fn logits_in(&self, sel: linear::SkillSel, normed: &[f32], logits: &mut Vec<f32>) {
        let c = &self.config;
        let n = normed.len() / c.hidden;
        if logits.len() != n * c.vocab {
            logits.resize(n * c.vocab, 0.0);
        }
        self.lm_head.view(sel).forward(normed, n, logits);
        if let Some(cap) = c.final_softcap {
            logits.iter_mut().for_each(|v| *v = (*v / cap).tanh() * cap);
        }
    }
}

/// Whether every value is finite. Branch-free over the exponent bits, so it vectorises:
/// it runs on every layer's output.
fn all_finite(v: &[f32]) -> bool {
    v.iter().fold(0u32, |acc, x| {
        acc | ((x.to_bits() & 0x7f80_0000 == 0x7f80_0000) as u32)
    }) == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::dtype::DType;
    use crate::tinymodel::{write_tiny, TinyLayer, TinySpec};

    /// A dense tiny model of three layers (awkward sizes), written to `dir/m.cmf`.
    fn three_layer_model(dir: &std::path::Path) -> std::path::PathBuf {
        let path = dir.join("m.cmf");
        let spec = TinySpec::awkward(vec![
            TinyLayer::attention_dense(96),
            TinyLayer::attention_dense(80),
            TinyLayer::attention_dense(96),
        ]);
        write_tiny(&path, &spec).unwrap();
        path
    }

    /// Where tensor `name`'s bytes start in the file at `path`.
    fn tensor_offset(path: &std::path::Path, name: &str) -> usize {
        let f = crate::format::CmfFile::open(path).unwrap();
        let e = f.directory.iter().find(|e| e.name == name).unwrap();
        (f.envelope.data.off + e.off) as usize
    }

    /// `verify_on_first_use`: a clean model runs as the checked one and ends with every
    /// tensor checked; a flipped byte in layer 2 stops the forward when layer 2 first runs,
    /// naming the tensor, after layers 0 and 1 were checked and run.
    #[test]
    fn tensors_checked_on_first_use() {
        let dir = tempfile::tempdir().unwrap();
        let path = three_layer_model(dir.path());
        let run = |p: &std::path::Path| {
            let mut model = Model::load(Arc::new(CmfModel::open(p).unwrap())).unwrap();
            model.verify_on_first_use();
            assert_eq!(
                model.first_use_checks().unwrap().0,
                0,
                "nothing hashed at load"
            );
            let (mut st, mut ws) = (model.new_state(8), model.new_workspace(4));
            let r = model.forward(&[0, 5, 7], &mut st, &mut ws, Logits::All, None);
            (
                r.map(|()| ws.logits.clone()),
                model.first_use_checks().unwrap(),
            )
        };
        let (logits, (done, all)) = run(&path);
        assert_eq!(done, all);
        let plain = Model::load(Arc::new(CmfModel::open(&path).unwrap())).unwrap();
        let (mut st, mut ws) = (plain.new_state(8), plain.new_workspace(4));
        plain
            .forward(&[0, 5, 7], &mut st, &mut ws, Logits::All, None)
            .unwrap();
        assert_eq!(logits.unwrap(), ws.logits);

        let at = tensor_offset(&path, "model.layers.2.mlp.up_proj.weight") + 5;
        let mut b = std::fs::read(&path).unwrap();
        b[at] ^= 0x20;
        let bad = dir.path().join("bad.cmf");
        std::fs::write(&bad, &b).unwrap();
        match run(&bad).0 {
            Err(ModelError::Integrity(m)) => {
                assert!(m.contains("model.layers.2.mlp.up_proj.weight"), "{m}")
            }
            other => panic!("{:?}", other.map(|_| ())),
        }
    }

    /// A NaN or an Inf in a weight stops the forward with an error naming where the values
    /// first broke: the embedding, a layer, or the head (never logits that sample token 0).
    #[test]
    fn non_finite_weights_are_an_error_naming_the_first_broken_stage() {
        let dir = tempfile::tempdir().unwrap();
        let path = three_layer_model(dir.path());
        let clean = std::fs::read(&path).unwrap();
        let at = |name: &str| tensor_offset(&path, name);
        let cases = [
            // (Vectors such as norms are checked at load.)
            ("model.layers.1.mlp.down_proj.weight", f32::NAN, "layer 1"),
            (
                "model.layers.2.self_attn.o_proj.weight",
                f32::INFINITY,
                "layer 2",
            ),
            ("lm_head.weight", f32::NAN, "the logits"),
            (
                "model.embed_tokens.weight",
                f32::NAN,
                "embedding of token 0",
            ),
        ]
        .map(|(name, v, want)| (at(name), v, want));
        for (off, v, want) in cases {
            let mut b = clean.clone();
            b[off..off + 4].copy_from_slice(&v.to_le_bytes());
            let bad = dir.path().join("bad.cmf");
            std::fs::write(&bad, &b).unwrap();
            let model = Model::load(Arc::new(CmfModel::open(&bad).unwrap())).unwrap();
            let mut st = model.new_state(8);
            let mut ws = model.new_workspace(4);
            let r = model.forward(&[0, 5, 7], &mut st, &mut ws, Logits::All, None);
            match r {
                Err(ModelError::Numeric(m)) => assert!(m.contains(want), "{want}: {m}"),
                other => panic!("{want}: {other:?}"),
            }
        }
        // The clean file runs.
        let model = Model::load(Arc::new(CmfModel::open(&path).unwrap())).unwrap();
        let (mut st, mut ws) = (model.new_state(8), model.new_workspace(4));
        model
            .forward(&[0, 5, 7], &mut st, &mut ws, Logits::All, None)
            .unwrap();
    }

    /// `weight_bytes_per_token` against the tensor directory, by name: every 2-D matrix,
    /// the routed experts scaled by top-k / experts, one embedding row; norms, the conv
    /// kernel and other vectors excluded.
    #[test]
    fn weight_bytes_per_token_counts_what_a_token_reads() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.cmf");
        let spec = TinySpec {
            dtype: DType::Q8Row,
            ..TinySpec::hybrid()
        };
        write_tiny(&path, &spec).unwrap();
        let model = Model::load(Arc::new(CmfModel::open(&path).unwrap())).unwrap();
        assert!(!model.tied && model.has_moe());
        // Per MoE layer, its routed experts' bytes.
        let mut routed = std::collections::BTreeMap::<String, u64>::new();
        let mut want = 0u64;
        for (_, e) in model.file.tensors() {
            if e.shape.len() != 2 || e.name.starts_with("model.mtp") {
                continue;
            }
            if e.name == "model.embed_tokens.weight" {
                want += e.nbytes / model.config.vocab as u64;
            } else if let Some((layer, _)) = e.name.split_once(".mlp.experts.") {
                *routed.entry(layer.to_string()).or_default() += e.nbytes;
            } else {
                want += e.nbytes;
            }
        }
        // TinySpec::hybrid: two MoE layers of 7 experts, top-3.
        assert_eq!(routed.len(), 2);
        want += routed.values().map(|b| b * 3 / 7).sum::<u64>();
        assert_eq!(model.weight_bytes_per_token(), want);
    }

    /// An untied embedding is read a row per token, so it stays in the file: never
    /// repacked, even as `q1t` where the model's other matrices are (the head here), and
    /// its rows are the file's rows. The model runs.
    #[test]
    fn an_untied_q1t_embedding_stays_in_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("q1t.cmf");
        let spec = TinySpec {
            hidden: 96,
            heads: 4,
            kv_heads: 2,
            head_dim: 24,
            dtype: DType::Q1t,
            ..TinySpec::awkward(vec![TinyLayer::attention_dense(160)])
        };
        write_tiny(&path, &spec).unwrap();
        let model = Model::load(Arc::new(CmfModel::open(&path).unwrap())).unwrap();
        assert!(!model.tied);
        assert!(
            !model.embed.m.payload_unread(),
            "the embedding was repacked"
        );
        let f = crate::format::CmfFile::open(&path).unwrap();
        let (e, head) = f.tensor("lm_head.weight").unwrap();
        let repacks = crate::quant::matrix::Matrix::new(e.dtype, &e.shape, head)
            .unwrap()
            .payload_unread();
        assert_eq!(model.lm_head.m.payload_unread(), repacks, "the head");
        // A token streams the head's repacked rows (10 bytes a tile for the file's 9) where
        // it was repacked, and the per-token figure counts them.
        let streamed = model.lm_head.m.streamed_bytes();
        assert_eq!(streamed > head.len(), repacks, "the head's streamed bytes");
        assert!(model.weight_bytes_per_token() > streamed as u64);
        let (e, embed) = f.tensor("model.embed_tokens.weight").unwrap();
        let (mut got, mut want) = (vec![0f32; 96], vec![0f32; 96]);
        for id in [0u32, 1, 130, 258] {
            model.embed_token(id, &mut got);
            crate::quant::decode_row(e.dtype, &e.shape, embed, id as usize, &mut want).unwrap();
            assert_eq!(got, want, "row {id}");
        }
        let (mut st, mut ws) = (model.new_state(8), model.new_workspace(4));
        model
            .forward(&[3, 77, 200], &mut st, &mut ws, Logits::All, None)
            .unwrap();
        assert!(ws.logits.iter().all(|v| v.is_finite()));
    }
}
