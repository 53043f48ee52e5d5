//! Gated MLP: `down(act(gate(x)) ⊙ up(x))`, SwiGLU or GeLU-tanh.

use super::config::Activation;
use super::linear::{LinView, Linear, OwnedWeight, SkillSel};
use super::scope::Scope;
use super::select::FfnSel;
use super::ModelError;
use crate::quant::kernel::Kernel;

#[derive(Clone, Debug)]
pub struct Mlp {
    pub gate: Linear,
    pub up: Linear,
    pub down: Linear,
    pub act: Activation,
    /// SIMD level of the activation.
    pub kernel: Kernel,
}

#[derive(Debug)]
pub struct MlpScratch {
    g: Vec<f32>,
    u: Vec<f32>,
    /// The live neurons' activations scattered to the full width (masked forwards).
    wide: Vec<f32>,
}

impl MlpScratch {
    /// The last forward's down_proj inputs `act(gate)·up`: `[t, width]`, `width` the live
    /// neurons' count under a mask.
    pub fn acts(&self, n: usize) -> &[f32] {
        &self.g[..n]
    }

    pub fn new(intermediate: usize, t_max: usize) -> MlpScratch {
        MlpScratch {
            g: vec![0.0; intermediate * t_max],
            u: vec![0.0; intermediate * t_max],
            wide: vec![0.0; intermediate * t_max],
        }
    }
}

impl Mlp {
    /// `gate_proj`, `up_proj`, `down_proj` from `s`; the width comes from `gate_proj`'s
    /// rows (§11: a defragmented file's layers each have their own).
    pub fn load(s: &Scope, hidden: usize, act: Activation) -> Result<Mlp, ModelError> {
        let inter = s.rows("gate_proj.weight")?;
        Ok(Mlp {
            gate: s.linear("gate_proj", inter, hidden, true)?,
            up: s.linear("up_proj", inter, hidden, true)?,
            down: s.linear("down_proj", hidden, inter, true)?,
            act,
            kernel: Kernel::detect(),
        })
    }

    pub fn intermediate(&self) -> usize {
        self.gate.out_dim()
    }

    pub fn linears_mut(&mut self) -> [&mut Linear; 3] {
        [&mut self.gate, &mut self.up, &mut self.down]
    }

    /// `h` [t, hidden] → `out` [t, hidden], with the weights `sel` picks. With `ffn` (a
    /// task mask's live neurons, ascending), only those rows of gate/up are computed and
    /// the dead neurons contribute nothing: exactly the model whose dead neurons' weights
    /// are zero. down_proj reads only the live columns when the mask packed them (and no
    /// skill replaces down_proj), else the whole matrix with zero inputs.
    pub fn forward<'a>(
        &'a self,
        h: &[f32],
        t: usize,
        s: &mut MlpScratch,
        out: &mut [f32],
        sel: SkillSel<'a>,
        ffn: Option<FfnSel<'a>>,
    ) {
        let live = ffn.map(|f| f.live);
        let width = live.map_or(self.gate.out_dim(), |l| l.len());
        let n = width * t;
        let (g, u) = (&mut s.g[..n], &mut s.u[..n]);
        let (gv, uv) = (self.gate.view(sel), self.up.view(sel));
        match ffn.and_then(|f| f.gate_up) {
            // The packed live rows, unless a skill replaces gate or up.
            Some((pg, pu)) if is_base(&gv, &self.gate) && is_base(&uv, &self.up) => {
                let packed = |w: &'a OwnedWeight, v: &LinView<'a>| LinView {
                    m: &w.m,
                    bytes: &w.bytes,
                    bias: w.bias.as_deref(),
                    precision: v.precision,
                };
                LinView::forward_many([packed(pg, &gv), packed(pu, &uv)], None, h, t, [g, u]);
            }
            _ => LinView::forward_many([gv, uv], live, h, t, [g, u]),
        }
        self.gated(g, u);
        let Some(live) = live else {
            return self.down.view(sel).forward(g, t, out);
        };
        let down = self.down.view(sel);
        if let Some(p) = ffn.and_then(|f| f.down) {
            if is_base(&down, &self.down) {
                let packed = LinView {
                    m: &p.m,
                    bytes: &p.bytes,
                    bias: down.bias,
                    precision: down.precision,
                };
                return packed.forward(g, t, out);
            }
        }
        // The dead neurons' inputs to down_proj are zero.
        let inter = self.gate.out_dim();
        let wide = &mut s.wide[..inter * t];
        wide.fill(0.0);
        for (row, acts) in wide
            .chunks_exact_mut(inter)
            .zip(g.chunks_exact(width.max(1)))
        {
            for (&j, &a) in live.iter().zip(acts) {
                row[j as usize] = a;
            }
        }
        down.forward(wide, t, out);
    }

    /// `g[i] = act(g[i])·u[i]`, the gated activation of gate and up outputs; SiLU
    /// vectorised ([`super::vmath::silu_mul`]). The MoE experts' too: their scalar `exp`
    /// per neuron was 6% of a 64-token prefill of a 128-expert layer.
    pub fn gated(&self, g: &mut [f32], u: &[f32]) {
        if self.act == Activation::Silu {
            super::vmath::silu_mul(self.kernel, g, u);
        } else {
            for (gv, &uv) in g.iter_mut().zip(u.iter()) {
                *gv = activate(self.act, *gv) * uv;
            }
        }
    }
}

/// Whether `v` reads `lin`'s own (backbone) bytes, not a skill's.
fn is_base(v: &LinView, lin: &Linear) -> bool {
    std::ptr::eq(v.bytes.as_ptr(), lin.bytes().as_ptr())
}

pub fn activate(act: Activation, x: f32) -> f32 {
    match act {
        Activation::Silu => x / (1.0 + (-x).exp()),
        Activation::GeluTanh => {
            const C: f32 = 0.797_884_6; // √(2/π)
            0.5 * x * (1.0 + (C * (x + 0.044715 * x * x * x)).tanh())
        }
        Activation::Gelu => 0.5 * x * (1.0 + erf(x as f64 / std::f64::consts::SQRT_2) as f32),
    }
}

/// erf to ~1e-7 (Abramowitz–Stegun 7.1.26 is too coarse for parity; this is the
/// complementary-error-function series of Numerical Recipes' `erfc`, accurate to 1.2e-7).
fn erf(x: f64) -> f64 {
    let z = x.abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let r = t
        * (-z * z - 1.265_512_23
            + t * (1.000_023_68
                + t * (0.374_091_96
                    + t * (0.096_784_18
                        + t * (-0.186_288_06
                            + t * (0.278_868_07
                                + t * (-1.135_203_98
                                    + t * (1.488_515_87
                                        + t * (-0.822_152_23 + t * 0.170_872_77)))))))))
            .exp();
    if x >= 0.0 {
        1.0 - r
    } else {
        r - 1.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn activations() {
        assert!((activate(Activation::Silu, 1.0) - 0.731_058_6).abs() < 1e-6);
        assert!((activate(Activation::GeluTanh, 1.0) - 0.841_192).abs() < 1e-5);
        assert!((activate(Activation::Gelu, 1.0) - 0.841_344_7).abs() < 1e-6);
        assert!((activate(Activation::Gelu, -2.0) - -0.045_500_26).abs() < 1e-6);
    }
}
