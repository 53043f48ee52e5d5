//! Gated DeltaNet, the linear-attention token mixer of Qwen3-Next and Qwen3.5
//! (`model.layers.{i}.linear_attn`), as transformers computes it:
//!
//! 1. `qkv = in_proj_qkv·h`, `z = in_proj_z·h`, `b = in_proj_b·h`, `a = in_proj_a·h`
//!    (the converter splits Qwen3-Next's fused `in_proj_qkvz` / `in_proj_ba` into these);
//! 2. a causal depthwise conv1d over `qkv` (kernel `K`, its last `K−1` inputs carried in
//!    the layer's state), then SiLU; split into q, k (`key_heads × dk`) and v
//!    (`value_heads × dv`); value head `h` reads key head `h / (value_heads / key_heads)`;
//! 3. q and k L2-normalised per head (`x·rsqrt(Σx² + 1e-6)`), q scaled by `dk^-½`;
//! 4. decay `g = −exp(A_log)·softplus(a + dt_bias)` and `β = σ(b)`;
//! 5. the gated delta rule on a per-head `dk × dv` state `S`, token by token:
//!    `S ← e^g·S;  S ← S + k ⊗ β(v − Sᵀk);  o = Sᵀq`;
//! 6. a gated RMSNorm per head, `rms(o)·w·silu(z)` (plain `x̂·w`, whatever the arch's
//!    `norm_style`: transformers' `RMSNormGated` is not zero-centred), then `out_proj`.
//!
//! Step 5 has two forms that give the same numbers up to f32 rounding: the recurrent one
//! above (decode, and any forward that records per-token history for rollback), and the
//! chunked one for prefill (transformers' `torch_chunk_gated_delta_rule`: within a chunk of
//! up to 64 tokens the delta rule's triangular system is solved once, so the state is
//! touched once per chunk instead of once per token).

use rayon::prelude::*;

use super::linear::{Linear, SkillSel};
use super::scope::Scope;
use super::state::RecurrentState;
use super::ModelError;

/// Tokens per chunk of the chunked form (transformers' `chunk_size`).
pub const CHUNK: usize = 64;

/// Forwards of at most this many tokens use the recurrent form.
pub const RECURRENT_MAX_TOKENS: usize = 2;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GdnConfig {
    pub key_heads: usize,
    pub value_heads: usize,
    /// Key (and query) head dimension.
    pub dk: usize,
    /// Value head dimension.
    pub dv: usize,
    /// The conv1d's kernel size.
    pub kernel: usize,
}

impl GdnConfig {
    pub fn key_dim(&self) -> usize {
        self.key_heads * self.dk
    }

    pub fn value_dim(&self) -> usize {
        self.value_heads * self.dv
    }

    /// Channels of the conv1d: q, k and v.
    pub fn conv_dim(&self) -> usize {
        2 * self.key_dim() + self.value_dim()
    }

    /// The layer's state: (conv inputs, delta-rule matrices), in f32 values.
    pub fn state_len(&self) -> (usize, usize) {
        (
            (self.kernel - 1) * self.conv_dim(),
            self.value_heads * self.dk * self.dv,
        )
    }
}

/// Which form of the delta rule a forward uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Form {
    /// By the number of tokens (and whether history is recorded).
    Auto,
    Recurrent,
    Chunked,
}

#[derive(Clone, Debug)]
pub struct GatedDeltaNet {
    pub cfg: GdnConfig,
    pub in_qkv: Linear,
    pub in_z: Linear,
    pub in_b: Linear,
    pub in_a: Linear,
    pub out_proj: Linear,
    /// `[conv_dim, K]`.
    conv_w: Vec<f32>,
    /// `−exp(A_log)` per value head.
    neg_a: Vec<f32>,
    dt_bias: Vec<f32>,
    /// The gated norm's weight `[dv]` and epsilon.
    norm_w: Vec<f32>,
    eps: f32,
}

/// One value head's buffers for a chunk.
#[derive(Debug, Clone)]
struct HeadScratch {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    beta: Vec<f32>,
    g: Vec<f32>,
    /// The chunk's `C × C` triangular system.
    a: Vec<f32>,
    u: Vec<f32>,
    w: Vec<f32>,
    out: Vec<f32>,
    row: Vec<f32>,
}

impl HeadScratch {
    fn new(dk: usize, dv: usize, chunk: usize) -> HeadScratch {
        HeadScratch {
            q: vec![0.0; chunk * dk],
            k: vec![0.0; chunk * dk],
            v: vec![0.0; chunk * dv],
            beta: vec![0.0; chunk],
            g: vec![0.0; chunk],
            a: vec![0.0; chunk * chunk],
            u: vec![0.0; chunk * dv],
            w: vec![0.0; chunk * dk],
            out: vec![0.0; chunk * dv],
            row: vec![0.0; chunk.max(dv)],
        }
    }
}

/// Buffers for one forward of up to `t_max` tokens.
#[derive(Debug)]
pub struct GdnScratch {
    qkv: Vec<f32>,
    conv: Vec<f32>,
    z: Vec<f32>,
    b: Vec<f32>,
    a: Vec<f32>,
    core: Vec<f32>,
    heads: Vec<HeadScratch>,
}

impl GdnScratch {
    /// Buffers for the layers `cfgs` (each size the largest any layer needs), `None`
    /// without Gated DeltaNet layers.
    pub fn for_layers<'a>(
        cfgs: impl Iterator<Item = &'a GdnConfig>,
        t_max: usize,
    ) -> Option<GdnScratch> {
        let chunk = t_max.clamp(1, CHUNK);
        let mut any = false;
        let (mut cd, mut vd, mut nv, mut dk, mut dv) = (0, 0, 0, 0, 0);
        for c in cfgs {
            any = true;
            cd = cd.max(c.conv_dim());
            vd = vd.max(c.value_dim());
            nv = nv.max(c.value_heads);
            dk = dk.max(c.dk);
            dv = dv.max(c.dv);
        }
        let head = HeadScratch::new(dk, dv, chunk);
        any.then(|| GdnScratch {
            qkv: vec![0.0; t_max * cd],
            conv: vec![0.0; t_max * cd],
            z: vec![0.0; t_max * vd],
            b: vec![0.0; t_max * nv],
            a: vec![0.0; t_max * nv],
            core: vec![0.0; t_max * vd],
            heads: vec![head; nv],
        })
    }
}

fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

fn softplus(x: f32) -> f32 {
    // torch's threshold: above 20 it is the identity.
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

fn l2norm_into(x: &[f32], out: &mut [f32], scale: f32) {
    let ss: f32 = x.iter().map(|v| v * v).sum();
    let inv = 1.0 / (ss + 1e-6).sqrt() * scale;
    for (o, &v) in out.iter_mut().zip(x) {
        *o = v * inv;
    }
}

impl GatedDeltaNet {
    /// Loads the layer from `s` (`model.layers.{i}.linear_attn`). The head counts and
    /// dimensions come from the tensors' shapes; `key_heads` (the arch's
    /// `linear_num_key_heads`) splits the key width, `key_head_dim` checks it.
    pub fn load(
        s: &Scope,
        hidden: usize,
        key_heads: Option<usize>,
        key_head_dim: Option<usize>,
        eps: f32,
    ) -> Result<GatedDeltaNet, ModelError> {
        let scope = s.prefix().to_string();
        let bad = |reason: String| ModelError::Shape {
            name: scope.clone(),
            reason,
        };
        let value_heads = s.rows("in_proj_b.weight")?;
        let value_dim = s.rows("in_proj_z.weight")?;
        if value_dim % value_heads != 0 {
            return Err(bad(format!(
                "in_proj_z has {value_dim} rows, not a multiple of the {value_heads} value heads"
            )));
        }
        let dv = value_dim / value_heads;
        let conv_dim = s.rows("in_proj_qkv.weight")?;
        if conv_dim <= value_dim || (conv_dim - value_dim) % 2 != 0 {
            return Err(bad(format!(
                "in_proj_qkv has {conv_dim} rows: not 2·key_dim + {value_dim}"
            )));
        }
        let key_dim = (conv_dim - value_dim) / 2;
        let (key_heads, dk) = match (key_heads, key_head_dim) {
            (Some(n), _) if n > 0 && key_dim % n == 0 => (n, key_dim / n),
            (None, Some(d)) if d > 0 && key_dim % d == 0 => (key_dim / d, d),
            _ => {
                return Err(ModelError::Config {
                    field: "linear_num_key_heads".into(),
                    reason: format!(
                        "missing or does not divide the key width {key_dim} of {scope}"
                    ),
                })
            }
        };
        if key_head_dim.is_some_and(|d| d != dk) {
            return Err(bad(format!(
                "key heads of {dk} dims, but linear_key_head_dim is {}",
                key_head_dim.unwrap_or(0)
            )));
        }
        if value_heads % key_heads != 0 {
            return Err(bad(format!(
                "{value_heads} value heads are not a multiple of {key_heads} key heads"
            )));
        }
        let conv_shape = s
            .shape("conv1d.weight")
            .ok_or_else(|| ModelError::MissingTensor(s.name("conv1d.weight")))?;
        let kernel = match conv_shape.as_slice() {
            [c, 1, k] | [c, k] if *c as usize == conv_dim && (1..=64).contains(k) => *k as usize,
            other => {
                return Err(ModelError::Shape {
                    name: s.name("conv1d.weight"),
                    reason: format!("is {other:?}, expected [{conv_dim}, 1, K] with K ≤ 64"),
                })
            }
        };
        let cfg = GdnConfig {
            key_heads,
            value_heads,
            dk,
            dv,
            kernel,
        };
        let a_log = s.vector("A_log", value_heads)?;
        Ok(GatedDeltaNet {
            in_qkv: s.linear("in_proj_qkv", conv_dim, hidden, false)?,
            in_z: s.linear("in_proj_z", value_dim, hidden, false)?,
            in_b: s.linear("in_proj_b", value_heads, hidden, false)?,
            in_a: s.linear("in_proj_a", value_heads, hidden, false)?,
            out_proj: s.linear("out_proj", hidden, value_dim, false)?,
            conv_w: s.vector("conv1d.weight", conv_dim * kernel)?,
            neg_a: a_log.iter().map(|a| -a.exp()).collect(),
            dt_bias: s.vector("dt_bias", value_heads)?,
            norm_w: s.vector("norm.weight", dv)?,
            eps,
            cfg,
        })
    }

    pub fn linears_mut(&mut self) -> [&mut Linear; 5] {
        [
            &mut self.in_qkv,
            &mut self.in_z,
            &mut self.in_b,
            &mut self.in_a,
            &mut self.out_proj,
        ]
    }

    pub fn new_state(&self) -> RecurrentState {
        let (c, s) = self.cfg.state_len();
        RecurrentState::new(c, s)
    }

    /// `h` [t, hidden] (normed input) → `out` [t, hidden], advancing `state` by `t` tokens.
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        h: &[f32],
        t: usize,
        state: &mut RecurrentState,
        s: &mut GdnScratch,
        out: &mut [f32],
        form: Form,
        sel: SkillSel,
    ) {
        let c = &self.cfg;
        let (cd, vd, nv) = (c.conv_dim(), c.value_dim(), c.value_heads);
        {
            let qkv = &mut s.qkv[..t * cd];
            let z = &mut s.z[..t * vd];
            let b = &mut s.b[..t * nv];
            let a = &mut s.a[..t * nv];
            Linear::forward_many(
                sel,
                [&self.in_qkv, &self.in_z, &self.in_b, &self.in_a],
                None,
                h,
                t,
                [qkv, z, b, a],
            );
        }
        // β = σ(b) in place of b, g = −exp(A_log)·softplus(a + dt_bias) in place of a.
        for i in 0..t {
            for hv in 0..nv {
                let j = i * nv + hv;
                s.b[j] = 1.0 / (1.0 + (-s.b[j]).exp());
                s.a[j] = self.neg_a[hv] * softplus(s.a[j] + self.dt_bias[hv]);
            }
        }
        let form = match form {
            Form::Auto if t <= RECURRENT_MAX_TOKENS || state.recording() => Form::Recurrent,
            Form::Auto => Form::Chunked,
            f => f,
        };
        match form {
            Form::Recurrent => {
                for i in 0..t {
                    self.conv_tokens(
                        &s.qkv[i * cd..(i + 1) * cd],
                        1,
                        state,
                        &mut s.conv[i * cd..(i + 1) * cd],
                    );
                    self.recurrent_token(i, state, s);
                    state.record(i);
                }
            }
            _ => {
                let (qkv, conv) = (&s.qkv[..t * cd], &mut s.conv[..t * cd]);
                self.conv_tokens(qkv, t, state, conv);
                let mut i0 = 0;
                while i0 < t {
                    let n = (t - i0).min(CHUNK);
                    self.chunk(i0, n, state, s);
                    i0 += n;
                }
            }
        }
        // Gated RMSNorm per (token, value head), then the output projection.
        let dv = c.dv;
        let core = &mut s.core[..t * vd];
        for (o, z) in core
            .chunks_exact_mut(dv)
            .zip(s.z[..t * vd].chunks_exact(dv))
        {
            let ss: f32 = o.iter().map(|v| v * v).sum::<f32>() / dv as f32;
            let inv = 1.0 / (ss + self.eps).sqrt();
            for ((ov, &w), &zv) in o.iter_mut().zip(&self.norm_w).zip(z) {
                *ov = w * (*ov * inv) * silu(zv);
            }
        }
        self.out_proj.view(sel).forward(core, t, out);
    }

    /// The causal conv + SiLU of `t` tokens `x` [t, conv_dim] into `y`, after the inputs
    /// the state holds; the state then holds the last `K−1` inputs.
    fn conv_tokens(&self, x: &[f32], t: usize, state: &mut RecurrentState, y: &mut [f32]) {
        let cd = self.cfg.conv_dim();
        let k = self.cfg.kernel;
        let past = k - 1;
        // Input j of the extended sequence [state rows; x rows].
        let at = |st: &[f32], j: usize, ch: usize| {
            if j < past {
                st[j * cd + ch]
            } else {
                x[(j - past) * cd + ch]
            }
        };
        for i in 0..t {
            for ch in 0..cd {
                let w = &self.conv_w[ch * k..(ch + 1) * k];
                let mut acc = 0.0f32;
                for (j, &wj) in w.iter().enumerate() {
                    acc += wj * at(&state.conv, i + j, ch);
                }
                y[i * cd + ch] = silu(acc);
            }
        }
        if past == 0 {
            return;
        }
        // Shift: the new state is rows t..t+past of the extended sequence.
        if t >= past {
            state.conv.copy_from_slice(&x[(t - past) * cd..t * cd]);
        } else {
            state.conv.copy_within(t * cd.., 0);
            let keep = (past - t) * cd;
            state.conv[keep..].copy_from_slice(&x[..t * cd]);
        }
    }

    /// Copies the q, k, v of value head `hv` for `n` tokens from `i0` out of the conv
    /// output into `hs` (q, k normalised, q scaled), with β and g.
    #[allow(clippy::too_many_arguments)]
    fn gather(
        &self,
        conv: &[f32],
        b: &[f32],
        a: &[f32],
        i0: usize,
        n: usize,
        hv: usize,
        hs: &mut HeadScratch,
    ) {
        let c = &self.cfg;
        let (cd, dk, dv, nv) = (c.conv_dim(), c.dk, c.dv, c.value_heads);
        let hk = hv / (nv / c.key_heads);
        let scale = 1.0 / (dk as f32).sqrt();
        for i in 0..n {
            let row = &conv[(i0 + i) * cd..(i0 + i + 1) * cd];
            let q = &row[hk * dk..(hk + 1) * dk];
            let k = &row[c.key_dim() + hk * dk..c.key_dim() + (hk + 1) * dk];
            let v = &row[2 * c.key_dim() + hv * dv..2 * c.key_dim() + (hv + 1) * dv];
            l2norm_into(q, &mut hs.q[i * dk..(i + 1) * dk], scale);
            l2norm_into(k, &mut hs.k[i * dk..(i + 1) * dk], 1.0);
            hs.v[i * dv..(i + 1) * dv].copy_from_slice(v);
            hs.beta[i] = b[(i0 + i) * nv + hv];
            hs.g[i] = a[(i0 + i) * nv + hv];
        }
    }

    /// The recurrent delta rule for token `i` of the forward, every head.
    fn recurrent_token(&self, i: usize, state: &mut RecurrentState, s: &mut GdnScratch) {
        let c = &self.cfg;
        let (dk, dv, nv) = (c.dk, c.dv, c.value_heads);
        let vd = c.value_dim();
        let (conv, b, a) = (&s.conv, &s.b, &s.a);
        let run = |(hv, (st, hs)): (usize, (&mut [f32], &mut HeadScratch))| {
            self.gather(conv, b, a, i, 1, hv, hs);
            let decay = hs.g[0].exp();
            st.iter_mut().for_each(|x| *x *= decay);
            // kv_mem = Sᵀk, then δ = β(v − kv_mem).
            let delta = &mut hs.row[..dv];
            delta.fill(0.0);
            for (r, &kr) in st.chunks_exact(dv).zip(&hs.k[..dk]) {
                for (d, &sv) in delta.iter_mut().zip(r) {
                    *d += sv * kr;
                }
            }
            for (d, &v) in delta.iter_mut().zip(&hs.v[..dv]) {
                *d = (v - *d) * hs.beta[0];
            }
            // S += k ⊗ δ, o = Sᵀq.
            let o = &mut hs.out[..dv];
            o.fill(0.0);
            for ((r, &kr), &qr) in st.chunks_exact_mut(dv).zip(&hs.k[..dk]).zip(&hs.q[..dk]) {
                for ((sv, &d), ov) in r.iter_mut().zip(delta.iter()).zip(o.iter_mut()) {
                    *sv += kr * d;
                    *ov += *sv * qr;
                }
            }
        };
        // A small state is less work than waking the pool for it.
        if nv * dk * dv >= 1 << 15 {
            state
                .s
                .par_chunks_mut(dk * dv)
                .zip(s.heads[..nv].par_iter_mut())
                .enumerate()
                .for_each(run);
        } else {
            state
                .s
                .chunks_exact_mut(dk * dv)
                .zip(s.heads[..nv].iter_mut())
                .enumerate()
                .for_each(run);
        }
        for (hv, hs) in s.heads[..nv].iter().enumerate() {
            s.core[i * vd + hv * dv..i * vd + (hv + 1) * dv].copy_from_slice(&hs.out[..dv]);
        }
    }

    /// The chunked delta rule over tokens `i0..i0+n` (n ≤ CHUNK), every head.
    fn chunk(&self, i0: usize, n: usize, state: &mut RecurrentState, s: &mut GdnScratch) {
        let c = &self.cfg;
        let (dk, dv, nv) = (c.dk, c.dv, c.value_heads);
        let vd = c.value_dim();
        let (conv, b, a) = (&s.conv, &s.b, &s.a);
        let run = |(hv, (st, hs)): (usize, (&mut [f32], &mut HeadScratch))| {
            self.gather(conv, b, a, i0, n, hv, hs);
            chunk_head(hs, st, n, dk, dv);
        };
        state
            .s
            .par_chunks_mut(dk * dv)
            .zip(s.heads[..nv].par_iter_mut())
            .enumerate()
            .for_each(run);
        for (hv, hs) in s.heads[..nv].iter().enumerate() {
            for i in 0..n {
                s.core[(i0 + i) * vd + hv * dv..(i0 + i) * vd + (hv + 1) * dv]
                    .copy_from_slice(&hs.out[i * dv..(i + 1) * dv]);
            }
        }
    }
}

use super::attention::dot;

/// One head's chunk of `n` tokens (q, k, v, β, g gathered in `hs`) against its state
/// `st` [dk, dv]; the outputs go to `hs.out` [n, dv] and `st` advances by the chunk.
fn chunk_head(hs: &mut HeadScratch, st: &mut [f32], n: usize, dk: usize, dv: usize) {
    // G = cumsum(g), in place.
    let mut acc = 0.0f32;
    for g in &mut hs.g[..n] {
        acc += *g;
        *g = acc;
    }
    let g = &hs.g[..n];
    // A[i][j] = −(β_i k_i · k_j)·e^(G_i − G_j) for j < i.
    let a = &mut hs.a[..n * n];
    a.fill(0.0);
    for i in 0..n {
        let ki = &hs.k[i * dk..(i + 1) * dk];
        for j in 0..i {
            let kj = &hs.k[j * dk..(j + 1) * dk];
            a[i * n + j] = -(dot(ki, kj) * hs.beta[i]) * (g[i] - g[j]).exp();
        }
    }
    // Forward substitution, row by row over the rows already solved (as transformers
    // does: each row's update reads its original values).
    for i in 1..n {
        let row = &mut hs.row[..i];
        row.copy_from_slice(&a[i * n..i * n + i]);
        for j in 0..i {
            let mut sum = 0.0f32;
            for (m, &rm) in row.iter().enumerate().take(i).skip(j + 1) {
                sum += rm * a[m * n + j];
            }
            a[i * n + j] = row[j] + sum;
        }
    }
    // T = A + I;  U = T·(β v);  W = T·(β k e^G).
    let (u, w) = (&mut hs.u[..n * dv], &mut hs.w[..n * dk]);
    u.fill(0.0);
    w.fill(0.0);
    for i in 0..n {
        for j in 0..=i {
            let tij = if j == i { 1.0 } else { a[i * n + j] };
            if tij == 0.0 {
                continue;
            }
            let bj = hs.beta[j];
            let eg = g[j].exp();
            for (uv, &vv) in u[i * dv..(i + 1) * dv]
                .iter_mut()
                .zip(&hs.v[j * dv..(j + 1) * dv])
            {
                *uv += tij * (vv * bj);
            }
            for (wv, &kv) in w[i * dk..(i + 1) * dk]
                .iter_mut()
                .zip(&hs.k[j * dk..(j + 1) * dk])
            {
                *wv += tij * (kv * bj * eg);
            }
        }
    }
    // v_new = U − W·S (into u).
    for i in 0..n {
        let ui = &mut u[i * dv..(i + 1) * dv];
        for (r, &wr) in st.chunks_exact(dv).zip(&w[i * dk..(i + 1) * dk]) {
            for (uv, &sv) in ui.iter_mut().zip(r) {
                *uv -= wr * sv;
            }
        }
    }
    // o_i = e^(G_i)·(q_i·S) + Σ_{j≤i} (q_i·k_j)·e^(G_i − G_j)·v_new_j.
    let out = &mut hs.out[..n * dv];
    out.fill(0.0);
    for i in 0..n {
        let qi = &hs.q[i * dk..(i + 1) * dk];
        let oi = &mut out[i * dv..(i + 1) * dv];
        let eg = g[i].exp();
        for (r, &qr) in st.chunks_exact(dv).zip(qi) {
            let f = qr * eg;
            for (ov, &sv) in oi.iter_mut().zip(r) {
                *ov += f * sv;
            }
        }
        for j in 0..=i {
            let f = dot(qi, &hs.k[j * dk..(j + 1) * dk]) * (g[i] - g[j]).exp();
            for (ov, &vv) in oi.iter_mut().zip(&u[j * dv..(j + 1) * dv]) {
                *ov += f * vv;
            }
        }
    }
    // S ← S·e^(G_last) + Σ_j (k_j e^(G_last − G_j)) ⊗ v_new_j.
    let last = g[n - 1];
    let el = last.exp();
    st.iter_mut().for_each(|x| *x *= el);
    for j in 0..n {
        let f = (last - g[j]).exp();
        let kj = &hs.k[j * dk..(j + 1) * dk];
        let vj = &u[j * dv..(j + 1) * dv];
        for (r, &kr) in st.chunks_exact_mut(dv).zip(kj) {
            let kf = kr * f;
            for (sv, &vv) in r.iter_mut().zip(vj) {
                *sv += kf * vv;
            }
        }
    }
}
