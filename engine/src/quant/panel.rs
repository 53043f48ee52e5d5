//! Prefill's `q8`, `q4`, `q1t` and `vbit` products at the default precision as a blocked
//! matrix-matrix product on AVX-512 VNNI and on AVX2: weight rows packed into panels, 16
//! rows per vector (8 on AVX2).
//!
//! [`super::kernel::run_wide`] sums a row's codes against a token's int16 activation codes
//! `k = 256·q + q₂` with the columns in the vector lanes, and so ends every (row, token)
//! with a horizontal sum; in a 576-wide product those sums and the per-tile set-up cost as
//! much as the products. Here a task packs [`PANEL`] weight rows, four columns at a time,
//! into `[cols/4][32 rows][4]` bytes (once per product, amortised over the tokens), and one
//! `vpdpbusd` multiplies 16 rows × 4 columns by four bytes of one token broadcast to every
//! lane: the rows sit in the lanes, so a finished accumulator is 16 outputs, with no
//! horizontal sum. The register tile is 32 rows × [`TILE_TOKENS`] tokens × both levels.
//!
//! `vpdpbusd` multiplies unsigned by signed bytes: the activation levels enter as
//! `u = q + 128` (`q ^ 0x80`), the signed weight codes as they are, and
//! `Σ w·q = Σ w·u − 128·Σ w`, with `Σ w` taken per row when packing. Each level's sum is
//! exact in i32 (|Σ w·q| ≤ cols·128·127 < 2³¹ for `cols` ≤ [`MAX_COLS`]; the accumulators
//! may wrap on the way, the difference does not), the combination `256·A + B` is exact in
//! f64, and what follows — rounding to f32, times the token's scale, times the row scale —
//! is what `run_wide` does with its exact i64 sum. So the values are those of the decode
//! path bit for bit (prefill and decode agree, as everywhere in [`super::matrix`]).
//!
//! `q4` panels hold the codes `nibble − 8` as bytes in the activations' order, and per group
//! and row its scale and `Σ w`: a group's two level sums start from zero, combine into its
//! exact integer `Σ c·(256·q + q₂)` (less the unsigned offset), and one f32 multiply-add
//! with the group's scale adds it to the row ([`tile_q4`]). The matrix-vector kernel adds
//! the same exact group terms in another order, so here the values agree within the f32
//! bound rather than bit for bit; hence [`Q4_MIN_TOKENS`] (more than the two tokens of a
//! speculative verification).
//!
//! Without AVX-512 VNNI (an AVX2 CPU, or `CORTIQ_SIMD=avx2`) the `q4` and `q1t` products
//! (from [`Q4_MIN_TOKENS`] and [`Q1T_MIN_TOKENS`] tokens) run in panels of 8 rows per
//! vector that hold the codes as int16 ([`pack_i16_avx2`]), as `vbit`'s (below): one
//! `vpmaddwd` multiplies a pair of columns of 8 rows by a token's int16 codes
//! `k = 256·q + q₂`, both levels at once, four tokens per weight load
//! ([`tile_i16_avx2`]). A group's integer `Σ c·k` is exact in int32 and in its f32
//! conversion (`|Σ| ≤ 32·8·2¹⁵ < 2²⁴`), and it is the integer the AVX-512 panels form from
//! the byte levels, multiply-added with the group's scale in the same order: the same
//! values. These replaced byte panels summed by `vpmaddubsw` per level, which took the
//! multiplies twice and a widening tail per group, one token per weight load, and spilled
//! their int16 sums: in cache on one core (criterion `matvec`, 64 tokens) 0.80–0.88 of
//! the time for `q4_block` at 4864×896 and 896×4864, `q1t` 0.82, `q4tp` 0.87; 64-token
//! prefill at `avx2`, paired, Qwen2.5-Coder-0.5B 1.18–1.25× (`q4_block`, `q4_tiled`,
//! `q4tp`, `q1t`), SmolLM2-135M 0.99–1.09× (its 576-column panels gain least against
//! their doubled packing); 512 tokens, `q4_block`, 1.23× and 1.29× (Zen 4 VM). With
//! AVX-VNNI the grouped layouts but `vbit` keep byte panels ([`pack_grouped_avx2`],
//! [`tile_q4_avx_vnni`]): there one `vpdpbusd` sums four columns of a level, as many
//! instructions as the int16 panels take.
//!
//! `vbit` rows are packed the same way, their codes `L − u` (up to 8 bits, `|c| ≤ 128`)
//! unpacked once per product instead of once per 4 tokens (in the row kernels, SmolLM2's
//! 512-token prefill ran at a quarter of `q4_block`'s speed). A group integer of such
//! codes may pass 2²⁴, so its conversion to f32 rounds once (relative 2⁻²⁴), within the
//! same bound. On AVX2 a `vpmaddubsw` pair of 8-bit codes and activation bytes can pass the
//! int16 range, so there `vbit` panels hold the codes as int16, two per word, and one
//! `vpmaddwd` multiplies a pair of columns of 8 rows by the token's int16 codes
//! `k = 256·q + q₂` ([`tile_i16_avx2`]): both levels at once, the same group integers.
//! (SmolLM2-135M's 64-token `vbit` prefill at `CORTIQ_SIMD=avx2` ran 1.5× faster than in
//! the row kernels, Qwen2.5-Coder-0.5B's 1.35×.) `q8` panels on AVX2 hold int16 codes too,
//! against the same int16 `k` ([`tile_q8_avx2`]): the row's exact integer summed in int32
//! over 256 columns at a time and then in f64, so the values are the decode path's bit for
//! bit, as on AVX-512.
//!
//! With AVX-VNNI ([`Kernel::AvxVnni`]: AVX2 CPUs such as Intel's client cores since Alder
//! Lake) the same AVX2 tiles multiply-add in one instruction: `vpdpbusd` on 256 bits for
//! the byte panels (summing in int32 from the start, no `vpmaddubsw`, add and widening
//! `vpmaddwd`), `vpdpwssd` for the int16 ones. The sums are the same wrapping int32 sums,
//! so the values are the AVX2 tiles' bit for bit. 64-token prefill, 2 threads, on the
//! Intel Xeon VM of docs/bench/inference.md (`CORTIQ_SIMD=avx2` against `avxvnni`):
//! SmolLM2-135M `q4_block` 683–687 → 918–920 tok/s, `q1t` 551–574 → 684–747, `q8_row`
//! 706–726 → 821–840, `vbit` 590–595 → 601–680; Qwen2.5-Coder-0.5B `q4_block` 222–226 →
//! 305–306, `q1t` 190–198 → 248–254, `q8_row` 207–214 → 254–273, `vbit` 162–174 → 195–216.
//!
//! `q1t` is packed the same way: its ternary digits are codes `−1, 0, 1` with a scale per
//! tile of 32, so a `q1t` panel is a `q4` panel whose codes are small. Its overlay is added
//! to each panel's finished outputs, as the row kernels add it to theirs
//! ([`super::q1t_kernel::Q1tOverlay`]): per row, its entries against 16 tokens per vector
//! (8 on AVX2, [`overlay_panel_avx2`]) of the activations laid out column-major. Packing
//! decodes each tile's digits once per product instead of once per 4 tokens. (On AVX2 the
//! row kernels added the overlay one token and entry at a time, which with the digit
//! extraction made `q1t` prefill a third of `q4`'s.) The column-major activations are built
//! over the pool, once for the products of one input (q/k/v, gate/up: their quantized tokens
//! compared), and where a task's blocks of tokens are short (wide rows: Qwen2.5-Coder-0.5B's
//! `down_proj` takes 18 tokens a block) the overlay runs per window of
//! [`OVERLAY_WINDOW`] tokens, so that each entry reads its column in runs of lines, the next
//! run asked for ahead. Paired (`scripts/ab-bench.py`, Intel Xeon VM, AVX-512), with the
//! packer's prefetch of the repacked rows ([`super::q1t_planes`]): 64-token `q1t` prefill
//! 1.076× (SmolLM2-135M) and 1.061× (Qwen2.5-Coder-0.5B), 512 tokens 1.063× and 1.056×;
//! at `avx2` 1.02× / 1.05×, at `avxvnni` 1.04× / 1.08×.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;
use std::cell::RefCell;

#[cfg(target_arch = "x86_64")]
use super::kernel::IntRowsSimd;
use super::kernel::{h2f_scalar, le16, Kernel, QToken, QuantizedActs, SPLIT_SHIFT};
use super::matrix::q4tp_rows;
use super::matrix::vbit_rows;
use super::matrix::Matrix;
use super::matrix::Out;
use super::matrix::{q1t_overlay, q1t_planes};
use super::q1t_kernel::Q1tRows;
use super::q1t_kernel::{OvRow, Q1tOverlay};
use super::q1t_planes::Q1tPlaneRows;
use super::q4::Q4Rows;
use super::q8::Q8Layout;
use super::Geom;
use crate::format::dtype::DType;

/// Weight rows per packed panel: two 16-lane vectors.
pub(super) const PANEL: usize = 32;
/// Tokens per register tile: 2 row vectors × 6 tokens × 2 levels = 24 accumulators.
const TILE_TOKENS: usize = 6;
/// Widest row whose level sums are exact in i32 (see the module comment).
pub(super) const MAX_COLS: usize = 1 << 17;

thread_local! {
    /// A task's packed panels (codes, then per row `Σ w` and the scale) and (`q1t`) a
    /// panel's overlay corrections; reused.
    #[allow(clippy::type_complexity)]
    static PACKED: RefCell<(Vec<u32>, Vec<f32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
    /// A product's activations as unsigned bytes, both levels per 4 columns, each
    /// token's scale, and (`q1t`) the activations column-major for the overlay with what
    /// they were built from, so that products of one input (q/k/v, gate/up) build them
    /// once; reused.
    #[allow(clippy::type_complexity)]
    static UACTS: RefCell<(Vec<u32>, Vec<f32>, Vec<f32>, XtKey)> =
        const { RefCell::new((Vec::new(), Vec::new(), Vec::new(), XtKey::EMPTY)) };
}

/// The content [`activation_columns_par`] built its columns from.
struct XtKey {
    q: Vec<i8>,
    q2: Vec<i8>,
    d: Vec<f32>,
    /// `(avx2, t, tp, cols)`.
    shape: (bool, usize, usize, usize),
}

impl XtKey {
    const EMPTY: XtKey = XtKey {
        q: Vec::new(),
        q2: Vec::new(),
        d: Vec::new(),
        shape: (false, 0, 0, 0),
    };

    /// Whether columns built from `qa` with `shape` are those built last; if not, they
    /// are taken as built now.
    fn same_or_set(&mut self, qa: &QuantizedActs, shape: (bool, usize, usize, usize)) -> bool {
        let (q, q2, d) = qa.levels(shape.1);
        // Bit patterns: a NaN scale is equal to itself here.
        let same_d = self.d.len() == d.len()
            && self
                .d
                .iter()
                .zip(d)
                .all(|(a, b)| a.to_bits() == b.to_bits());
        if self.shape == shape && same_d && self.q == q && self.q2 == q2 {
            return true;
        }
        self.shape = shape;
        for (dst, src) in [(&mut self.q, q), (&mut self.q2, q2)] {
            dst.clear();
            dst.extend_from_slice(src);
        }
        self.d.clear();
        self.d.extend_from_slice(d);
        false
    }
}

/// The weight layouts the panels take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Family {
    /// Row-scaled codes: `q8_row`, or `q8_2f` whose column field is in the activations.
    Q8,
    /// Small codes with a scale per group of 32 (`cols % 32 == 0`): the `q4` nibbles, or
    /// `q1t`'s ternary digits (whose overlay is added after the panel).
    Grouped(Grouped),
}

/// Which layout of small codes (see [`super::q4`] and [`super::q1t_kernel`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Grouped {
    Q4Block,
    Q4Tiled,
    Q4tp,
    Q1t,
    /// `vbit` / `vbit_ro`: codes `L − u` of up to 8 bits. (On AVX2 in int16 panels of
    /// their own, [`tile_i16_avx2`]: the byte panels' `vpmaddubsw` pairs would saturate on
    /// them.)
    Vbit,
}

/// Fewest tokens a grouped product (`q4`, AVX-512 `vbit`) runs here with. Its per-group
/// terms are added in another order than the matrix-vector kernel's (within the same f32
/// bound, not bit for bit), so the two-token products of speculative decoding (the
/// verification of one drafted token, `runtime::session`) keep the decode kernel, whose
/// values greedy decoding is compared with. From 4 tokens on the panels are faster than
/// the row kernels at every level: prefill of 4 / 8 / 12 tokens, Qwen2.5-Coder-0.5B
/// `q4_block` on AVX-512, 87 / 104 / 110 → 138 / 215 / 269 tok/s (on AVX2 61 / 82 / 91 →
/// 89 / 125 / 150); at 3 tokens they were level (0.87–1.26).
pub(super) const Q4_MIN_TOKENS: usize = 4;
const _: () = assert!(
    Q4_MIN_TOKENS > 2,
    "speculative verification must stay bit for bit"
);

/// Fewest tokens a `q1t` product runs here with: its row kernels extract the digits by
/// lookup without packing, so the panels repay their packing later (at 4 / 6 / 8 / 12
/// tokens, 0.73–0.83 / 0.88–1.09 / 1.02–1.23 / 1.19–1.49 of the row kernels' speed
/// across the levels and both models).
pub(super) const Q1T_MIN_TOKENS: usize = 8;

/// Fewest tokens a `vbit` product runs in the AVX2 panels with: their int16 codes take
/// two `vpmaddwd` per four columns. Prefill, panels ÷ row kernels, 4 / 8 / 12 tokens, at
/// `avxvnni` and `avx2` (Qwen2.5-Coder-0.5B, SmolLM2-135M): 0.69–0.85 / 0.87–1.02 /
/// 1.00–1.10. On AVX-512 VNNI `vbit` takes [`Q4_MIN_TOKENS`] (1.02–1.23 at 4 tokens).
pub(super) const VBIT_AVX2_MIN_TOKENS: usize = 12;

/// Fewest tokens a `q8` product runs here with, per level: packing costs a pass over the
/// weights, which the fewest tokens do not repay. The values are the row kernels' bit for
/// bit, so any count may. Prefill, `q8_row`, panels ÷ row kernels
/// (Qwen2.5-Coder-0.5B / SmolLM2-135M): on AVX-512 at 2 / 3 / 4 / 8 / 16 / 24 tokens 0.99 /
/// 1.01 / 1.38 / 1.35 / 1.47 / 1.59 and 0.88 / 0.95 / 1.35 / 1.41 / 1.52 / 1.49; AVX-VNNI
/// at 4 / 8 / 16 0.94 / 1.10 / 1.23 and 1.08 / 1.13 / 1.27; AVX2 (int16 panels) at 8 / 12 /
/// 16 / 24 1.04 / 0.98 / 1.07 / 1.11 and 1.12 / 1.17 / 1.21 / 1.17. (This was 32 at every
/// level, from a single 768 × 2048 product timed alone.)
pub(super) const Q8_MIN_TOKENS: usize = 4;
/// [`Q8_MIN_TOKENS`] on AVX-VNNI.
pub(super) const Q8_AVXVNNI_MIN_TOKENS: usize = 8;
/// [`Q8_MIN_TOKENS`] on AVX2.
pub(super) const Q8_AVX2_MIN_TOKENS: usize = 16;

/// The panel family of `m`'s layout, if the panels take it.
fn family(m: &Matrix) -> Option<Family> {
    match m.dtype {
        DType::Q8Row | DType::Q8_2f => Some(Family::Q8),
        DType::Q4Block if m.is_fused() => Some(Family::Grouped(Grouped::Q4Block)),
        DType::Q4Tiled if m.is_fused() => Some(Family::Grouped(Grouped::Q4Tiled)),
        DType::Q4tp => Some(Family::Grouped(Grouped::Q4tp)),
        DType::Q1t => Some(Family::Grouped(Grouped::Q1t)),
        DType::Vbit | DType::VbitRo => Some(Family::Grouped(Grouped::Vbit)),
        _ => None,
    }
}

/// The family a product of `m` over `t` tokens runs here with, if it does: at the
/// two-level precision (`split`), on AVX-512 VNNI or AVX2, from the family's fewest tokens
/// at that level ([`Q8_MIN_TOKENS`] and the AVX2 levels', [`Q4_MIN_TOKENS`],
/// [`Q1T_MIN_TOKENS`], [`VBIT_AVX2_MIN_TOKENS`]).
pub(super) fn applies_to(m: &Matrix, split: bool, t: usize) -> Option<Family> {
    let fam = family(m)?;
    let vnni = m.kernel().has_vnni() && cfg!(target_arch = "x86_64");
    let min_tokens = match fam {
        Family::Q8 if vnni => Q8_MIN_TOKENS,
        Family::Q8 if m.kernel() == Kernel::AvxVnni => Q8_AVXVNNI_MIN_TOKENS,
        Family::Q8 => Q8_AVX2_MIN_TOKENS,
        Family::Grouped(Grouped::Q1t) => Q1T_MIN_TOKENS,
        Family::Grouped(Grouped::Vbit) if !vnni => VBIT_AVX2_MIN_TOKENS,
        Family::Grouped(_) => Q4_MIN_TOKENS,
    };
    let simd = vnni || avx2_takes(m);
    (simd && t >= min_tokens && split && m.cols <= MAX_COLS).then_some(fam)
}

/// Whether `m`'s products run in the AVX2 panels ([`tile_i16_avx2`], with AVX-VNNI
/// [`tile_q4_avx_vnni`] for the grouped layouts but `vbit`; for `q8` [`tile_q8_avx2`]): on
/// a CPU (or a forced level) without AVX-512 VNNI.
fn avx2_takes(m: &Matrix) -> bool {
    cfg!(target_arch = "x86_64") && m.kernel() != Kernel::Scalar && !m.kernel().has_vnni()
}

/// Whether `fam`'s panels hold int16 codes and take the tokens' int16 codes
/// (`QToken::k`, read in place): every layout on AVX2 without AVX-VNNI (see the module
/// comment), and with it `vbit` and `q8`, whose codes of up to 8 bits would saturate
/// `vpmaddubsw`'s pairs.
fn int16_panels(fam: Family, avx2: bool, vnni: bool) -> bool {
    avx2 && (!vnni || matches!(fam, Family::Q8 | Family::Grouped(Grouped::Vbit)))
}

/// Whether `m`'s panels (when they take its product) read the tokens' int16 codes.
pub(super) fn reads_int16(m: &Matrix) -> bool {
    family(m).is_some_and(|f| int16_panels(f, avx2_takes(m), m.kernel() == Kernel::AvxVnni))
}

/// `y[j, i] = post_r · d_j · Σ_c w[r, c]·k[j, c]` for the output rows `r` of `sel` (or all),
/// as [`super::kernel::run_wide`] computes each one.
///
/// # Panics
/// Unless [`applies_to`] (the CPU must have AVX-512 VNNI or AVX2) and the sizes agree.
pub(super) fn matmul(
    m: &Matrix,
    fam: Family,
    bytes: &[u8],
    qa: &QuantizedActs,
    t: usize,
    sel: Option<&[u32]>,
    y: &mut [f32],
) {
    let g = m.geom();
    let n = sel.map_or(g.rows, |s| s.len());
    assert!(y.len() == t * n && g.cols <= MAX_COLS && qa.is_split());
    let c4 = g.cols.div_ceil(4);
    UACTS.with(|cell| {
        let mut own = (Vec::new(), Vec::new(), Vec::new(), XtKey::EMPTY);
        let mut guard = cell.try_borrow_mut();
        let (u, d, xt, xt_of) = match guard.as_deref_mut() {
            Ok(ud) => ud,
            Err(_) => &mut own,
        };
        let (avx2, avx_vnni) = (avx2_takes(m), m.kernel() == Kernel::AvxVnni);
        let int16 = int16_panels(fam, avx2, avx_vnni);
        if int16 {
            // The int16 tiles read each token's codes where they are: a token's codes are
            // whole groups of 32, zero past `cols`, so they cover the `4·c4` columns.
            let (k, per) = qa.codes16();
            assert!(
                per >= 4 * c4 && k.len() >= t * per,
                "the AVX2 int16 panels take int16 codes"
            );
            u.clear();
        } else {
            unsigned_acts(qa, t, c4, u);
        }
        d.clear();
        d.extend((0..t).map(|j| qa.token(j).d.first().copied().unwrap_or(0.0)));
        let (u, d) = (&*u, &*d);
        let out = Out::new(y);
        let tasks = n.div_ceil(PANEL);
        // Tokens per pass over a task's panels: their activations stay in L2. The AVX2
        // int16 tiles take them all in one pass: they read a token's codes once per 16
        // rows, a fifth of what they read of the panel, so the panel is what must stay in
        // cache. Packing every panel of a task first and the tokens in blocks wrote the
        // packed panels out past L2 (Qwen2.5-Coder-0.5B's MLP: 1.1 MB a task) and read
        // them back per block; one pass made its 512-token `q4_block` prefill 1.075× (Zen 3).
        let tok_block = if int16 {
            t
        } else {
            ((192 << 10) / (8 * c4).max(1)).clamp(TILE_TOKENS, 240) / TILE_TOKENS * TILE_TOKENS
        };
        let parts = task_count(tasks, rayon::current_num_threads());
        // `q1t`: the activations column-major for the overlay.
        let ov = q1t_overlay(m).filter(|_| fam == Family::Grouped(Grouped::Q1t));
        let tp = t.next_multiple_of(16) + 16;
        if ov.is_some() && !xt_of.same_or_set(qa, (avx2, t, tp, g.cols)) {
            // SAFETY: `applies_to` demanded AVX2 (`avx2_takes`) or else AVX-512; a `q1t`
            // row is whole tiles of 32.
            unsafe { activation_columns_par(avx2, qa, t, tp, g.cols, xt) };
        }
        let xt = &xt[..if ov.is_some() { g.cols * tp } else { 0 }];
        let ovj = ov.map(|ov| OverlayJob {
            ov,
            bytes,
            sel,
            n,
            xt,
            tp,
        });
        let job = PanelJob {
            fam,
            avx2,
            avx_vnni,
            int16,
            c4,
            qa,
            u,
            d,
            n,
            out,
        };
        // A team loop: in place when this product is itself a task of one (a MoE expert's,
        // `matrix::matmul_each`), whose other tasks keep the threads busy.
        crate::exec::for_each_index(parts, |task| {
            let panels = task * tasks / parts..(task + 1) * tasks / parts;
            PACKED.with(|cell| {
                let mut own = (Vec::new(), Vec::new());
                let mut guard = cell.try_borrow_mut();
                let (buf, corr) = match guard.as_deref_mut() {
                    Ok(b) => b,
                    Err(_) => &mut own,
                };
                // Panel `p`'s overlay corrections for `toks` into `corr`, if it has any.
                let overlay = |p: usize, toks: std::ops::Range<usize>, corr: &mut [f32]| {
                    // SAFETY: `applies_to` demanded AVX-512, or AVX2 when `avx2`; `xt` is
                    // `cols` columns of `tp ≥ t + 16` tokens; `corr` is sized by the
                    // callers below.
                    ovj.as_ref().is_some_and(|j| unsafe {
                        overlay_panel_at(avx2, j, p * PANEL, toks, corr)
                    })
                };
                let panel_words = panel_len(fam, c4, avx2, int16);
                if t <= tok_block {
                    // One pass: pack a panel, run every token through it; while it
                    // runs, the next panel's rows are fetched from memory.
                    buf.resize(panel_words, 0);
                    if ov.is_some() {
                        corr.resize(t.next_multiple_of(16) * PANEL, 0.0);
                    }
                    for p in panels.clone() {
                        pack(m, fam, bytes, sel, p * PANEL, n, c4, avx2, int16, buf);
                        let next = (p + 1 < panels.end && fam == Family::Q8 && !avx2)
                            .then(|| panel_rows(g, bytes, sel, (p + 1) * PANEL, n));
                        let corr = overlay(p, 0..t, &mut corr[..]).then_some(&corr[..]);
                        // SAFETY: `applies_to` demanded AVX-512 VNNI, or AVX2 when
                        // `avx2`; the panel, the activations, the corrections and the
                        // outputs are sized as the kernel reads them, and this task
                        // alone writes rows `p·32 ..` of `y`.
                        unsafe { run_panel(&job, buf, 0..t, corr, p * PANEL, next.as_ref()) };
                    }
                    return;
                }
                buf.resize(panels.len() * panel_words, 0);
                for (p, chunk) in panels.clone().zip(buf.chunks_exact_mut(panel_words)) {
                    pack(m, fam, bytes, sel, p * PANEL, n, c4, avx2, int16, chunk);
                }
                // The overlay's corrections: a block's with the block (in a buffer of one
                // panel) where blocks have `16·OVERLAY_BLOCKS` tokens or more; else every
                // panel's for the `OVERLAY_WINDOW` tokens `win` from the block that first
                // needs them, so that each entry reads its column in long runs.
                let per_block = tok_block >= 16 * OVERLAY_BLOCKS;
                let stride = tok_block.max(OVERLAY_WINDOW).next_multiple_of(16) * PANEL;
                if ov.is_some() {
                    corr.resize(if per_block { 1 } else { panels.len() } * stride, 0.0);
                }
                let mut win = 0..0;
                for j0 in (0..t).step_by(tok_block) {
                    let toks = j0..(j0 + tok_block).min(t);
                    if !per_block && ov.is_some() && toks.end > win.end {
                        win = j0..(j0 + OVERLAY_WINDOW).min(t);
                        for (p, corr) in panels.clone().zip(corr.chunks_exact_mut(stride)) {
                            overlay(p, win.clone(), corr);
                        }
                    }
                    for (i, (p, chunk)) in panels
                        .clone()
                        .zip(buf.chunks_exact(panel_words))
                        .enumerate()
                    {
                        let corr = if per_block {
                            overlay(p, toks.clone(), &mut corr[..]).then_some(&corr[..])
                        } else {
                            // Whether `overlay` wrote the panel's corrections.
                            let any = ovj.as_ref().is_some_and(|j| j.any(p * PANEL));
                            any.then(|| &corr[i * stride + (j0 - win.start) * PANEL..])
                        };
                        // SAFETY: as above.
                        unsafe { run_panel(&job, chunk, toks.clone(), corr, p * PANEL, None) };
                    }
                }
            });
        });
    });
}

/// Into how many tasks a product's `panels` split over `threads`: about four per thread
/// (for balance against other work in the pool), a multiple of `threads` where there are
/// enough panels, task `i` taking panels `i·panels/count ..`, so that the threads' shares
/// differ by at most a panel. Splitting into tasks of `⌈panels / 4·threads⌉` panels left
/// Qwen2.5-0.5B's 28-panel products (`o_proj`, `down_proj`) in 7 tasks, 4 against 3 on
/// two threads; even shares made its 64-token `q4_block` prefill 8% faster.
fn task_count(panels: usize, threads: usize) -> usize {
    let threads = threads.max(1);
    let count = panels.min(4 * threads);
    if count >= threads {
        count / threads * threads
    } else {
        count.max(1)
    }
}

/// What the overlay corrections of a product's panels read: the `q1t` overlay of its
/// payload, the row selection (output `k` is row `sel[k]`, or `k`) of its `n` outputs, and
/// the activations column-major, `tp` tokens per column ([`activation_columns`]).
struct OverlayJob<'a> {
    ov: &'a Q1tOverlay,
    bytes: &'a [u8],
    sel: Option<&'a [u32]>,
    n: usize,
    xt: &'a [f32],
    tp: usize,
}

impl OverlayJob<'_> {
    /// Output `k`'s overlay entries and their corrections.
    fn row(&self, k: usize) -> OvRow<'_> {
        self.ov
            .row(self.bytes, self.sel.map_or(k, |s| s[k] as usize))
    }

    /// Whether any of outputs `k0 .. k0 + 32` (those below `n`) has entries: whether
    /// [`overlay_panel`] writes that panel's corrections.
    fn any(&self, k0: usize) -> bool {
        (k0..(k0 + PANEL).min(self.n)).any(|k| !self.row(k).is_empty())
    }
}

/// The overlay corrections of outputs `k0 .. k0 + 32` (those below `n`) for tokens `toks`,
/// into `corr` as `[token − toks.start][32 rows]` (whole blocks of 16 tokens): per row,
/// `Σ delta·x̂[j, col]` over its entries in file order (see
/// [`super::q1t_kernel::Q1tOverlay`]), 16 tokens per vector, each 16 × 16 block of rows and
/// tokens transposed into the tile's order. Whether any of the rows has entries (if none,
/// `corr` is not written).
///
/// # Safety
/// AVX-512 F, F16C; `xt` is [`activation_columns`] with `tp` tokens per column,
/// `toks.end + 15 ≤ tp`, and `corr` holds `toks.len()` rounded up to 16 tokens.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,f16c")]
unsafe fn overlay_panel(
    job: &OverlayJob,
    k0: usize,
    toks: std::ops::Range<usize>,
    corr: &mut [f32],
) -> bool {
    let &OverlayJob { n, xt, tp, .. } = job;
    let nt = toks.len().next_multiple_of(16);
    assert!(toks.start + nt <= tp && corr.len() >= nt * PANEL);
    let levels = transpose_indices();
    let mut any = false;
    for half in 0..2 {
        let rows: [OvRow; 16] = std::array::from_fn(|i| {
            let k = k0 + 16 * half + i;
            if k < n {
                job.row(k)
            } else {
                OvRow::EMPTY
            }
        });
        if rows.iter().all(|r| r.is_empty()) {
            continue;
        }
        if !any {
            corr[..nt * PANEL].fill(0.0);
            any = true;
        }
        for jc in (0..nt).step_by(16 * OVERLAY_BLOCKS) {
            let mut acc = [[_mm512_setzero_si512(); 16]; OVERLAY_BLOCKS];
            let blocks = ((nt - jc) / 16).min(OVERLAY_BLOCKS);
            let j0 = toks.start + jc;
            match blocks {
                4 => overlay_sums::<4>(&rows, xt, tp, j0, &mut acc),
                3 => overlay_sums::<3>(&rows, xt, tp, j0, &mut acc),
                2 => overlay_sums::<2>(&rows, xt, tp, j0, &mut acc),
                _ => overlay_sums::<1>(&rows, xt, tp, j0, &mut acc),
            }
            for (b, acc) in acc.iter_mut().enumerate().take(blocks) {
                transpose16(acc, &levels);
                for (q, v) in acc.iter().enumerate() {
                    let at = (jc + 16 * b + q) * PANEL + 16 * half;
                    _mm512_storeu_si512(corr[at..at + 16].as_mut_ptr() as *mut _, *v);
                }
            }
        }
    }
    any
}

/// Blocks of 16 tokens whose overlay sums a pass over a row's entries adds up
/// ([`overlay_sums`]): 4 adjacent lines of a column.
const OVERLAY_BLOCKS: usize = 4;

/// Tokens whose overlay corrections a panel takes at once where the tiles' blocks of tokens
/// are shorter than [`OVERLAY_BLOCKS`] × 16 (see `matmul`).
const OVERLAY_WINDOW: usize = 128;

/// Per row of `rows` (its entries and corrections), `Σ delta·x̂[j, col]` for the `B`
/// blocks of 16 tokens from `j0`, as `[block][row]`: each entry's `B` blocks are
/// adjacent lines of its column, read in one pass, and the column's next
/// [`OVERLAY_BLOCKS`] lines (the next pass's) are asked for into L2. One block per pass
/// over the entries waited on each entry's random column, and was 8% of a 64-token `q1t`
/// prefill.
///
/// # Safety
/// AVX-512 F and F16C; as [`overlay_panel`], with `j0 + 16·B ≤ tp`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn overlay_sums<const B: usize>(
    rows: &[OvRow; 16],
    xt: &[f32],
    tp: usize,
    j0: usize,
    acc: &mut [[__m512i; 16]; OVERLAY_BLOCKS],
) {
    for (i, row) in rows.iter().enumerate() {
        let mut sum = [_mm512_setzero_ps(); B];
        for e in 0..row.len() {
            let (col, delta) = row.get_f16c(e);
            let at = col * tp + j0;
            let x = &xt[at..at + 16 * B];
            // A hint only: past the column's end it may name any address.
            let ahead = x.as_ptr().wrapping_add(16 * OVERLAY_BLOCKS);
            for b in 0..OVERLAY_BLOCKS {
                _mm_prefetch::<_MM_HINT_T1>(ahead.wrapping_add(16 * b) as *const i8);
            }
            let delta = _mm512_set1_ps(delta);
            for (b, sum) in sum.iter_mut().enumerate() {
                *sum = _mm512_fmadd_ps(delta, _mm512_loadu_ps(x.as_ptr().add(16 * b)), *sum);
            }
        }
        for (b, sum) in sum.iter().enumerate() {
            acc[b][i] = _mm512_castps_si512(*sum);
        }
    }
}

/// The `t` tokens of `qa` as the `q1t` overlay multiplies them, `(256·q + q₂)·d` as
/// [`super::q1t_kernel`]'s row kernels do, column-major: `xt[col·tp + j]`, zero from `t` to
/// the next multiple of 16 (8 on AVX2); past that a column keeps what it held (the overlay
/// may read it, into corrections of no token); here the columns `cols` of them, a task of
/// [`activation_columns_par`].
/// Per 16 tokens × 16 columns, a token's columns are converted in one vector and the block
/// is transposed.
///
/// # Safety
/// AVX-512 F/BW; `qa` holds `t` split tokens of activations, `cols` a range of them whose
/// ends are multiples of 32, and `xt` is those columns, `tp` tokens each.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn activation_columns(
    qa: &QuantizedActs,
    t: usize,
    tp: usize,
    cols: std::ops::Range<usize>,
    xt: &mut [f32],
) {
    const _: () = assert!(SPLIT_SHIFT == 8);
    assert!(tp.is_multiple_of(16) && tp >= t && xt.len() == cols.len() * tp);
    assert!(cols.start.is_multiple_of(32) && cols.end.is_multiple_of(32));
    let levels = transpose_indices();
    let bytes16 = |s: &[i8]| _mm512_cvtepi8_epi32(_mm_loadu_si128(s[..16].as_ptr() as *const _));
    for j0 in (0..t).step_by(16) {
        let tks: [Option<QToken>; 16] =
            std::array::from_fn(|q| (j0 + q < t).then(|| qa.token(j0 + q)));
        for c0 in cols.clone().step_by(16) {
            let mut r = [_mm512_setzero_si512(); 16];
            for (v, tk) in r.iter_mut().zip(&tks) {
                if let Some(tk) = tk {
                    let k = _mm512_add_epi32(
                        _mm512_slli_epi32::<8>(bytes16(&tk.q[c0..])),
                        bytes16(&tk.q2[c0..]),
                    );
                    let d = _mm512_set1_ps(tk.d[c0 / 32]);
                    *v = _mm512_castps_si512(_mm512_mul_ps(_mm512_cvtepi32_ps(k), d));
                }
            }
            transpose16(&mut r, &levels);
            for (c, v) in r.iter().enumerate() {
                let at = (c0 - cols.start + c) * tp + j0;
                _mm512_storeu_si512(xt[at..at + 16].as_mut_ptr() as *mut _, *v);
            }
        }
    }
}

/// [`activation_columns`] on AVX2 (the AVX2 panels): per 8 tokens × 8 columns, a token's
/// columns converted in one vector and the block transposed ([`transpose8`]); the same
/// values. (One value at a time, on the calling thread while the pool waited, it took 5%
/// of SmolLM2-135M's 64-token `q1t` prefill at `avxvnni`.)
///
/// # Safety
/// AVX2 + FMA; otherwise as [`activation_columns`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn activation_columns_avx2(
    qa: &QuantizedActs,
    t: usize,
    tp: usize,
    cols: std::ops::Range<usize>,
    xt: &mut [f32],
) {
    assert!(tp.is_multiple_of(8) && tp >= t && xt.len() == cols.len() * tp);
    assert!(cols.start.is_multiple_of(32) && cols.end.is_multiple_of(32));
    let bytes8 = |s: &[i8]| _mm256_cvtepi8_epi32(_mm_loadl_epi64(s[..8].as_ptr() as *const _));
    for j0 in (0..t).step_by(8) {
        let tks: [Option<QToken>; 8] =
            std::array::from_fn(|q| (j0 + q < t).then(|| qa.token(j0 + q)));
        for c0 in cols.clone().step_by(8) {
            let r: [__m256i; 8] = std::array::from_fn(|q| match &tks[q] {
                Some(tk) => {
                    let k = _mm256_add_epi32(
                        _mm256_slli_epi32::<8>(bytes8(&tk.q[c0..])),
                        bytes8(&tk.q2[c0..]),
                    );
                    let d = _mm256_set1_ps(tk.d[c0 / 32]);
                    _mm256_castps_si256(_mm256_mul_ps(_mm256_cvtepi32_ps(k), d))
                }
                None => _mm256_setzero_si256(),
            });
            for (c, v) in transpose8(&r).iter().enumerate() {
                let at = (c0 - cols.start + c) * tp + j0;
                _mm256_storeu_si256(xt[at..at + 8].as_mut_ptr() as *mut _, *v);
            }
        }
    }
}

/// [`overlay_panel`] on AVX2: per octet of rows, each row's entries in file order against
/// [`OVERLAY_BLOCKS_AVX2`] × 8 tokens (a pass over the entries reads two lines of each
/// column and asks for the next two), the octet's sums per 8 tokens transposed into the
/// tile's order ([`transpose8`]) and stored whole, so every value of `corr` is written and
/// it needs no clearing. (Stored one by one, with `corr` cleared per panel, this took 8%
/// of SmolLM2-135M's 64-token `q1t` prefill at `avxvnni`.)
///
/// # Safety
/// AVX2 + FMA + F16C; `xt` is [`activation_columns_avx2`] with `tp` tokens per column,
/// `toks.end + 15 ≤ tp`, and `corr` holds `toks.len()` rounded up to 16 tokens.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn overlay_panel_avx2(
    job: &OverlayJob,
    k0: usize,
    toks: std::ops::Range<usize>,
    corr: &mut [f32],
) -> bool {
    const B: usize = OVERLAY_BLOCKS_AVX2;
    let &OverlayJob { n, xt, tp, .. } = job;
    let nt = toks.len().next_multiple_of(8 * B);
    assert!(toks.start + nt <= tp && corr.len() >= nt * PANEL);
    let live = PANEL.min(n.saturating_sub(k0));
    let rows: [OvRow; PANEL] = std::array::from_fn(|i| {
        if i < live {
            job.row(k0 + i)
        } else {
            OvRow::EMPTY
        }
    });
    if rows.iter().all(|r| r.is_empty()) {
        return false;
    }
    for (oct, rows) in rows.chunks_exact(8).enumerate() {
        for jb in (0..nt).step_by(8 * B) {
            let j0 = toks.start + jb;
            // Loops, not `array::from_fn`: a closure would not inherit F16C and FMA.
            let mut sums = [[_mm256_setzero_si256(); 8]; B];
            for (i, row) in rows.iter().enumerate() {
                let mut sum = [_mm256_setzero_ps(); B];
                for e in 0..row.len() {
                    let (col, delta) = row.get_f16c(e);
                    let at = col * tp + j0;
                    let x = &xt[at..at + 8 * B];
                    // A hint only: past the column's end it may name any address.
                    let ahead = x.as_ptr().wrapping_add(8 * B);
                    for b in (0..B).step_by(2) {
                        _mm_prefetch::<_MM_HINT_T1>(ahead.wrapping_add(8 * b) as *const i8);
                    }
                    let delta = _mm256_set1_ps(delta);
                    for (b, sum) in sum.iter_mut().enumerate() {
                        *sum = _mm256_fmadd_ps(delta, _mm256_loadu_ps(x.as_ptr().add(8 * b)), *sum);
                    }
                }
                for b in 0..B {
                    sums[b][i] = _mm256_castps_si256(sum[b]);
                }
            }
            for (b, sums) in sums.iter().enumerate() {
                for (q, v) in transpose8(sums).iter().enumerate() {
                    let at = (jb + 8 * b + q) * PANEL + 8 * oct;
                    _mm256_storeu_si256(corr[at..at + 8].as_mut_ptr() as *mut _, *v);
                }
            }
        }
    }
    true
}

/// Blocks of 8 tokens a pass of [`overlay_panel_avx2`] takes: two lines of a column.
const OVERLAY_BLOCKS_AVX2: usize = 2;

/// `q1t`'s activation columns for the overlay at the panels' level ([`activation_columns`]
/// on AVX-512, or [`activation_columns_avx2`]) into `xt` (grown to `cols·tp`), in tasks of
/// 32-column blocks over the pool. (On the calling thread alone, while the pool waited,
/// they took 4% of Qwen2.5-Coder-0.5B's 512-token `q1t` prefill.)
///
/// # Safety
/// AVX2 + FMA when `avx2`, else AVX-512 F/BW; `qa` holds `t` split tokens of `cols` (a
/// multiple of 32) activations, `tp` a multiple of 16 at least `t`.
unsafe fn activation_columns_par(
    avx2: bool,
    qa: &QuantizedActs,
    t: usize,
    tp: usize,
    cols: usize,
    xt: &mut Vec<f32>,
) {
    assert!(cols.is_multiple_of(32));
    if xt.len() < cols * tp {
        xt.resize(cols * tp, 0.0);
    }
    // About four tasks a thread, of whole 32-column blocks.
    let blocks = cols / 32;
    let per = 32 * blocks.div_ceil(4 * rayon::current_num_threads()).max(1);
    crate::exec::for_each_chunk_mut(&mut xt[..cols * tp], per * tp, |i, xt| {
        let c = i * per..(i * per + per).min(cols);
        #[cfg(target_arch = "x86_64")]
        if avx2 {
            activation_columns_avx2(qa, t, tp, c, xt)
        } else {
            activation_columns(qa, t, tp, c, xt)
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = (avx2, qa, t, tp, c, xt);
            unreachable!("the panels need x86-64")
        }
    });
}

/// [`overlay_panel`] (AVX-512) or [`overlay_panel_avx2`], at the panels' level.
///
/// # Safety
/// AVX2 + FMA + F16C when `avx2`, else AVX-512 F and F16C; as the two functions'.
unsafe fn overlay_panel_at(
    avx2: bool,
    job: &OverlayJob,
    k0: usize,
    toks: std::ops::Range<usize>,
    corr: &mut [f32],
) -> bool {
    #[cfg(target_arch = "x86_64")]
    if avx2 {
        overlay_panel_avx2(job, k0, toks, corr)
    } else {
        overlay_panel(job, k0, toks, corr)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (avx2, job, k0, toks, corr);
        unreachable!("the panels need x86-64")
    }
}

/// The weight rows of outputs `k0 .. k0 + 32` (those below `n`; the others empty).
fn panel_rows<'a>(
    g: Geom,
    bytes: &'a [u8],
    sel: Option<&[u32]>,
    k0: usize,
    n: usize,
) -> [&'a [u8]; PANEL] {
    std::array::from_fn(|i| {
        if k0 + i < n {
            let r = sel.map_or(k0 + i, |s| s[k0 + i] as usize);
            &bytes[r * g.cols..(r + 1) * g.cols]
        } else {
            &[]
        }
    })
}

/// Words of one packed panel. `q8`: the codes (four per word), then `Σ w` (i32) and the
/// scale (f32 bits) per row. `q4`: the codes (signed, `nibble − 8`, in the activations'
/// order; whole 64-column blocks), then per group and row `−32896·Σ w` (i32) and the
/// group's scale. `vbit` on AVX2: the codes as int16 (two per word), then per group and
/// row the scale ([`pack_i16_avx2`]); `q8` on AVX2: the codes as int16, then per row the
/// scale ([`pack_q8_avx2`]).
fn panel_len(fam: Family, c4: usize, avx2: bool, int16: bool) -> usize {
    match fam {
        Family::Q8 if avx2 => 2 * c4 * PANEL + PANEL,
        Family::Q8 => c4 * PANEL + 2 * PANEL,
        Family::Grouped(_) if int16 => 2 * c4 * PANEL + (c4 / 8) * PANEL,
        Family::Grouped(_) => c4.next_multiple_of(16) * PANEL + 2 * (c4 / 8) * PANEL,
    }
}

/// The weight rows of outputs `first .. first + N`: the first `live`, then row 0.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
fn part_rows<const N: usize>(sel: Option<&[u32]>, first: usize, live: usize) -> [usize; N] {
    std::array::from_fn(|i| {
        let k = first + i;
        if i < live {
            sel.map_or(k, |s| s[k] as usize)
        } else {
            0
        }
    })
}

/// Binds `$d` to the `$r`-row view of a grouped family's layout at rows `$rs` and runs
/// `$body` on it: the views are different types, so each packer is generic over them.
macro_rules! with_grouped_rows {
    ($kind:expr, $r:literal, $m:expr, $g:expr, $bytes:expr, $rs:expr, |$d:ident| $body:expr) => {
        match $kind {
            Grouped::Q4Block => {
                let $d = &Q4Rows::<$r, false>::new_at($g, $bytes, $rs);
                $body
            }
            Grouped::Q4Tiled => {
                let $d = &Q4Rows::<$r, true>::new_at($g, $bytes, $rs);
                $body
            }
            // The ladders from the matrix's index, not evaluated again.
            Grouped::Q4tp => {
                let $d = &q4tp_rows::<$r>($m, $bytes, $rs);
                $body
            }
            // The rows repacked at load where the products read them (the file's tiles
            // stay unread), else the tiles.
            Grouped::Q1t => match q1t_planes($m) {
                Some(p) => {
                    let $d = &Q1tPlaneRows::<$r>::new_at(p, $rs);
                    $body
                }
                None => {
                    let $d = &Q1tRows::<$r>::new_at($g, $bytes, $rs);
                    $body
                }
            },
            Grouped::Vbit => {
                let $d = &vbit_rows::<$r>($m, $bytes, $rs);
                $body
            }
        }
    };
}

/// Packs output rows `k0 .. k0 + 32` (those below `n`; the rest zero) into `dst`; `avx2`:
/// grouped layouts without AVX-512 ([`pack_grouped_avx2`]).
#[allow(clippy::too_many_arguments)]
fn pack(
    m: &Matrix,
    fam: Family,
    bytes: &[u8],
    sel: Option<&[u32]>,
    k0: usize,
    n: usize,
    c4: usize,
    avx2: bool,
    int16: bool,
    dst: &mut [u32],
) {
    let g = m.geom();
    if let (Family::Grouped(kind), true) = (fam, avx2) {
        // A whole panel writes every word its tiles read; a partial one leaves zeros in
        // the rows past `n`.
        if n - k0 < PANEL {
            dst.fill(0);
        }
        #[cfg(target_arch = "x86_64")]
        for oct in 0..PANEL / 8 {
            let live = n.saturating_sub(k0 + 8 * oct).min(8);
            if live == 0 {
                break;
            }
            // Rows past `n` read row 0's bytes (any valid row); their words are not stored.
            let rs = part_rows::<8>(sel, k0 + 8 * oct, live);
            // SAFETY: the AVX2 panels run only where AVX2 is present (`avx2_takes`).
            unsafe {
                if int16 {
                    with_grouped_rows!(kind, 8, m, g, bytes, rs, |rows| {
                        pack_i16_avx2(rows, live, oct, c4, dst)
                    });
                    continue;
                }
                with_grouped_rows!(kind, 8, m, g, bytes, rs, |rows| {
                    pack_grouped_avx2(rows, live, oct, c4, dst)
                })
            }
        }
        return;
    }
    if let Family::Grouped(kind) = fam {
        #[cfg(target_arch = "x86_64")]
        for half in 0..2 {
            let live = n.saturating_sub(k0 + 16 * half).min(16);
            // Rows past `n` read row 0's bytes (any valid row) and are zeroed.
            let rs = part_rows::<16>(sel, k0 + 16 * half, live);
            // SAFETY: the panel kernel only runs where AVX-512 VNNI is present.
            unsafe {
                with_grouped_rows!(kind, 16, m, g, bytes, rs, |rows| {
                    pack_q4(rows, live, half, c4, dst)
                })
            }
        }
        return;
    }
    let l = Q8Layout::new(g);
    let live = PANEL.min(n - k0);
    let rows = panel_rows(g, bytes, sel, k0, n);
    // Both layouts end in the rows' scales.
    let (body, scales) = dst.split_at_mut(dst.len() - PANEL);
    for (i, s) in scales.iter_mut().enumerate() {
        *s = if i < live {
            let r = sel.map_or(k0 + i, |s| s[k0 + i] as usize);
            h2f_scalar(le16(bytes, l.scales + 2 * r)).to_bits()
        } else {
            0
        };
    }
    if avx2 {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the AVX2 panels run only where AVX2 is present (`avx2_takes`).
        unsafe {
            pack_q8_avx2(&rows, live, g.cols, body)
        };
        return;
    }
    if live < PANEL {
        body.fill(0);
    }
    let (codes, sums) = body.split_at_mut(c4 * PANEL);
    // SAFETY: the panel kernel only runs where AVX-512 VNNI (hence F and BW) is present.
    #[cfg(target_arch = "x86_64")]
    let done = unsafe { pack_avx512(&rows, live, g.cols, codes, sums) };
    #[cfg(not(target_arch = "x86_64"))]
    let done = {
        sums.fill(0);
        0
    };
    for (i, row) in rows.iter().enumerate().take(live) {
        let mut sum = 0i32;
        for (c, four) in row.chunks(4).enumerate().skip(done) {
            let mut w = [0u8; 4];
            w[..four.len()].copy_from_slice(four);
            codes[c * PANEL + i] = u32::from_le_bytes(w);
            sum += four.iter().map(|&b| b as i8 as i32).sum::<i32>();
        }
        sums[i] = (sums[i] as i32).wrapping_add(sum) as u32;
    }
}

/// The whole 64-column blocks of `rows` (the first `live` of them; the others zero) into
/// the panel's code words: per block and half panel, 16 rows × 16 words transposed in
/// registers, and their rows' `Σ w` into `sums` (by `vpdpbusd` against ones). Returns the
/// words per row it wrote (a multiple of 16).
///
/// # Safety
/// AVX-512 F/BW/VNNI; `codes` holds `ceil(cols/4)·32` words.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
#[allow(clippy::needless_range_loop)]
unsafe fn pack_avx512(
    rows: &[&[u8]; PANEL],
    live: usize,
    cols: usize,
    codes: &mut [u32],
    sums: &mut [u32],
) -> usize {
    let blocks = cols / 64;
    assert!(codes.len() >= blocks * 16 * PANEL && sums.len() == PANEL);
    let ones = _mm512_set1_epi8(1);
    let mut sum = [_mm512_setzero_si512(); 2];
    let levels = transpose_indices();
    for blk in 0..blocks {
        for half in 0..2 {
            let mut r = [_mm512_setzero_si512(); 16];
            for (i, r) in r.iter_mut().enumerate() {
                let row = half * 16 + i;
                if row < live {
                    let p = rows[row].as_ptr().add(64 * blk);
                    // The rows come from DRAM, 32 streams at once: ask ahead.
                    _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(4 * 64) as *const i8);
                    *r = _mm512_loadu_si512(p as *const _);
                }
            }
            transpose16(&mut r, &levels);
            for (c, v) in r.iter().enumerate() {
                let at = (16 * blk + c) * PANEL + 16 * half;
                _mm512_storeu_si512(codes.as_mut_ptr().add(at) as *mut _, *v);
                sum[half] = _mm512_dpbusd_epi32(sum[half], ones, *v);
            }
        }
    }
    for (half, s) in sum.iter().enumerate() {
        _mm512_storeu_si512(sums.as_mut_ptr().add(16 * half) as *mut _, *s);
    }
    blocks * 16
}

/// Half `half` (16 rows, `live` of them real) of a grouped panel: per pair of groups the
/// rows' codes in the activations' order (`nibble − 8`, or `q1t`'s digits `−1, 0, 1`),
/// transposed as the `q8` panel's, each group's `Σ w` (times −32896 = −128·257: the
/// unsigned offset of both levels, see [`tile_q4`]) and scale ([`pack_scales`]). Rows of
/// `q4` nibbles take [`pack_nibbles`], which transposes the nibble bytes, the others
/// [`pack_codes`].
///
/// # Safety
/// AVX-512 F/BW/VNNI; `dst` is one panel of `c4` words per row (`cols % 32 == 0`).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
unsafe fn pack_q4<D: IntRowsSimd>(d: &D, live: usize, half: usize, c4: usize, dst: &mut [u32]) {
    let groups = c4 / 8;
    let c4p = c4.next_multiple_of(16);
    assert!(dst.len() == panel_len(Family::Grouped(Grouped::Q4Block), c4, false, false));
    let (codes, tail) = dst.split_at_mut(c4p * PANEL);
    let (corr, scales) = tail.split_at_mut(groups * PANEL);
    if D::NIBBLE_PAIRS {
        pack_nibbles(d, live, half, codes, corr);
    } else {
        pack_codes(d, live, half, codes, corr);
    }
    pack_scales(d, live, half, scales);
}

/// [`pack_q4`]'s codes and `Σ w` for layouts other than nibbles: per pair of groups, each
/// row's codes as `load_u8` gives them, transposed as bytes ([`transpose16`]).
///
/// # Safety
/// As [`pack_q4`]; `codes` and `corr` are its parts of the panel.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn pack_codes<D: IntRowsSimd>(
    d: &D,
    live: usize,
    half: usize,
    codes: &mut [u32],
    corr: &mut [u32],
) {
    let groups = corr.len() / PANEL;
    let levels = transpose_indices();
    // What `load_u8` adds to a code: 8 for nibbles, 0 for signed codes (`q1t`).
    let bias = D::CODE_OFFSET as i8;
    let (ones, eight) = (_mm512_set1_epi8(1), _mm512_set1_epi8(bias));
    for pair in 0..groups.div_ceil(2) {
        let g0 = 2 * pair;
        let two = g0 + 1 < groups;
        let mut r = [_mm512_setzero_si512(); 16];
        for (i, r) in r.iter_mut().enumerate().take(live) {
            // Row `i` of the panel after next (`2·16` rows on), which a task packs after
            // this one: the 16 rows' streams stalled the packer on every load without it.
            d.prefetch_pack(i, g0);
            d.prefetch_pack(i, g0 + 1);
            let lo = d.load_u8(i, g0);
            let hi = if two {
                d.load_u8(i, g0 + 1)
            } else {
                _mm256_set1_epi8(bias)
            };
            let u = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi);
            *r = _mm512_sub_epi8(u, eight);
        }
        transpose16(&mut r, &levels);
        let mut sums = [_mm512_setzero_si512(); 2];
        for (c, v) in r.iter().enumerate() {
            let at = (16 * pair + c) * PANEL + 16 * half;
            _mm512_storeu_si512(codes.as_mut_ptr().add(at) as *mut _, *v);
            sums[c / 8] = _mm512_dpbusd_epi32(sums[c / 8], ones, *v);
        }
        for (k, s) in sums.iter().enumerate().take(if two { 2 } else { 1 }) {
            store_group_sums(corr, g0 + k, half, *s);
        }
    }
}

/// Group `g`'s row sums `Σ w` of half `half` of a panel, as the tiles add them:
/// `−32896·Σ w` (see [`tile_q4`]).
///
/// # Safety
/// AVX-512 F; `corr` holds group `g`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn store_group_sums(corr: &mut [u32], g: usize, half: usize, sum: __m512i) {
    let scaled = _mm512_mullo_epi32(sum, _mm512_set1_epi32(-Q4_OFFSET));
    let at = g * PANEL + 16 * half;
    _mm512_storeu_si512(corr[at..at + 16].as_mut_ptr() as *mut _, scaled);
}

/// The group scales of half `half` of a grouped panel (`live` rows; the others 0), per
/// group and row: four groups of each row at a time ([`IntRowsSimd::scale_quad`], one read
/// for `q4_block` and `q4tp`, whose one-at-a-time scales were a tenth of packing a `q4tp`
/// panel), transposed as [`rows_to_words`] does.
///
/// # Safety
/// As [`pack_q4`]; `scales` holds `cols / 32` groups of [`PANEL`] words.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
unsafe fn pack_scales<D: IntRowsSimd>(d: &D, live: usize, half: usize, scales: &mut [u32]) {
    let groups = scales.len() / PANEL;
    let live_rows = ((1u32 << live) - 1) as __mmask16;
    let pairs = word_pairs();
    for blk in (0..groups / 4).map(|q| 4 * q) {
        // Rows past `live` read row 0 (see `pack`) and are zeroed here. (Loops, not
        // closures: a closure around `scale_quad` stayed a call for `q1t`.)
        let mut a = [_mm512_setzero_si512(); 4];
        for (k, a) in a.iter_mut().enumerate() {
            let mut quads = [_mm_setzero_si128(); 4];
            for (r, q) in quads.iter_mut().enumerate() {
                *q = _mm_castps_si128(d.scale_quad(4 * k + r, blk));
            }
            *a = four_rows(quads);
        }
        let words = rows_to_words(a, &pairs);
        for (w, v) in words.iter().enumerate() {
            let at = (blk + w) * PANEL + 16 * half;
            let v = _mm512_maskz_mov_epi32(live_rows, *v);
            _mm512_storeu_si512(scales.as_mut_ptr().add(at) as *mut _, v);
        }
    }
    for g in groups / 4 * 4..groups {
        let words = &mut scales[g * PANEL + 16 * half..g * PANEL + 16 * half + 16];
        for (i, w) in words.iter_mut().enumerate() {
            let s = if i < live {
                d.group_scale_simd(i, g)
            } else {
                0.0
            };
            *w = s.to_bits();
        }
    }
}

/// Four rows' 128 bits in one vector, row `r` in lane `r`.
///
/// # Safety
/// AVX-512 F.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn four_rows(r: [__m128i; 4]) -> __m512i {
    let v = _mm512_castsi128_si512(r[0]);
    let v = _mm512_inserti32x4::<1>(v, r[1]);
    let v = _mm512_inserti32x4::<2>(v, r[2]);
    _mm512_inserti32x4::<3>(v, r[3])
}

/// The index vectors of [`rows_to_words`]' first level: from vectors of rows `0..4` and
/// `4..8`, rows `0..8`'s word `2p` in the low 256 bits and word `2p + 1` in the high.
///
/// # Safety
/// AVX-512 F.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn word_pairs() -> [__m512i; 2] {
    std::array::from_fn(|p| {
        let v: [i32; 16] = std::array::from_fn(|l| {
            let (row, w) = (l % 8, 2 * p + l / 8);
            ((row / 4) << 4 | (4 * (row % 4) + w)) as i32
        });
        _mm512_loadu_si512(v.as_ptr() as *const _)
    })
}

/// 16 rows of four words, four rows to a vector (row `r` in 128-bit lane `r % 4` of
/// `a[r / 4]`), as four vectors of 16 rows: vector `w` holds word `w` of every row. Four
/// two-source permutes ([`word_pairs`]) and four 128-bit lane shuffles.
///
/// # Safety
/// AVX-512 F.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn rows_to_words(a: [__m512i; 4], pairs: &[__m512i; 2]) -> [__m512i; 4] {
    // `b[2h + p]`: rows `8h .. 8h + 8`, words `2p` and `2p + 1`.
    let b: [__m512i; 4] =
        std::array::from_fn(|x| _mm512_permutex2var_epi32(a[x & 2], pairs[x & 1], a[(x & 2) + 1]));
    [
        _mm512_shuffle_i64x2::<0x44>(b[0], b[2]),
        _mm512_shuffle_i64x2::<0xEE>(b[0], b[2]),
        _mm512_shuffle_i64x2::<0x44>(b[1], b[3]),
        _mm512_shuffle_i64x2::<0xEE>(b[1], b[3]),
    ]
}

/// [`pack_q4`] for rows of `q4` nibbles ([`IntRowsSimd::NIBBLE_PAIRS`]), whose byte `k`
/// of a group holds the codes of columns `k` and `k + 16` in the activations' order: word
/// `w` of a group holds column quads `w` (low nibbles) and `w + 4` (high nibbles). So per
/// group the 16 rows' nibble bytes, four rows to a vector, are transposed as words (four
/// two-source permutes and four lane shuffles), and each word vector's low and high
/// nibbles are two of the panel's code vectors. Unpacking each row's nibbles first and
/// transposing the bytes (16 × 16 words per pair of groups) took four times the
/// instructions: packing was 15% of a 64-token Qwen2.5-0.5B prefill.
///
/// # Safety
/// As [`pack_codes`], and `D::NIBBLE_PAIRS`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
unsafe fn pack_nibbles<D: IntRowsSimd>(
    d: &D,
    live: usize,
    half: usize,
    codes: &mut [u32],
    corr: &mut [u32],
) {
    debug_assert!(D::NIBBLE_PAIRS && D::CODE_OFFSET == 8 && live <= 16);
    let groups = corr.len() / PANEL;
    let c4p = codes.len() / PANEL;
    // The bytes of the live rows' lanes: the others' codes (and so their `Σ w`) are zero.
    let live_bytes = if live >= 16 {
        u64::MAX
    } else {
        (1u64 << (4 * live)) - 1
    };
    let (low4, eight, ones) = (
        _mm512_set1_epi8(0x0F),
        _mm512_set1_epi8(8),
        _mm512_set1_epi8(1),
    );
    let pairs = word_pairs();
    let four = |i0: usize, g: usize| four_rows([0, 1, 2, 3].map(|r| d.nibbles(i0 + r, g)));
    for g in 0..groups {
        for i in 0..live {
            d.prefetch_pack(i, g);
        }
        // Rows past `live` read row 0 (see `pack`) and are masked out below.
        let words = rows_to_words([four(0, g), four(4, g), four(8, g), four(12, g)], &pairs);
        let mut sum = _mm512_setzero_si512();
        for (w, v) in words.iter().enumerate() {
            let lo = _mm512_maskz_sub_epi8(live_bytes, _mm512_and_si512(*v, low4), eight);
            let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(*v), low4);
            let hi = _mm512_maskz_sub_epi8(live_bytes, hi, eight);
            for (q, c) in [(w, lo), (w + 4, hi)] {
                let at = (8 * g + q) * PANEL + 16 * half;
                _mm512_storeu_si512(codes.as_mut_ptr().add(at) as *mut _, c);
                sum = _mm512_dpbusd_epi32(sum, ones, c);
            }
        }
        store_group_sums(corr, g, half, sum);
    }
    // An odd last group leaves a pair's second half: zero codes, as `pack_codes` writes.
    for q in 8 * groups..c4p {
        let at = q * PANEL + 16 * half;
        _mm512_storeu_si512(codes.as_mut_ptr().add(at) as *mut _, _mm512_setzero_si512());
    }
}

/// Rows `8·oct ..` (`live` of them real) of a grouped panel, in the layout [`pack_q4`]
/// writes, with AVX2: per group, the 8 rows' code vectors (signed: `load_u8` less its
/// offset) transposed 8 × 8 words in registers, `Σw` by `vpmaddubsw` against ones. Each
/// row's group asks L2 for the rows two octets on ([`IntRowsSimd::prefetch_pack`], as
/// [`pack_q4`] does): the last two octets of a panel fetch the next panel's first two
/// while its tokens run. Without it the packer waited on its nibble loads (8% of a
/// Qwen2.5-Coder-0.5B `q4_block` 64-token prefill at `avxvnni`); with it that prefill ran
/// 1.023× and SmolLM2-135M `q1t`'s 1.017× (5 paired rounds).
///
/// # Safety
/// AVX2; `dst` is one panel of `c4` words per row (`cols % 32 == 0`), zeroed unless all
/// its 32 rows are live (then every word a tile reads is written here).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn pack_grouped_avx2<D: IntRowsSimd>(
    d: &D,
    live: usize,
    oct: usize,
    c4: usize,
    dst: &mut [u32],
) {
    let groups = c4 / 8;
    assert!(
        dst.len() == panel_len(Family::Grouped(Grouped::Q4Block), c4, true, false) && live <= 8
    );
    let (codes, tail) = dst.split_at_mut(c4.next_multiple_of(16) * PANEL);
    let (corr, scales) = tail.split_at_mut(groups * PANEL);
    let bias = _mm256_set1_epi8(D::CODE_OFFSET as i8);
    let (ones8, ones16) = (_mm256_set1_epi8(1), _mm256_set1_epi16(1));
    for g in 0..groups {
        let mut r = [_mm256_setzero_si256(); 8];
        for (i, r) in r.iter_mut().enumerate().take(live) {
            d.prefetch_pack(i, g);
            *r = _mm256_sub_epi8(d.load_u8(i, g), bias);
        }
        // Vector `k` becomes word `k` (columns 4k..4k+4) of every row.
        let mut sum = _mm256_setzero_si256();
        for v in store_transposed(codes, 8 * g, oct, &r) {
            sum = _mm256_add_epi16(sum, _mm256_maddubs_epi16(ones8, v));
        }
        let sum = _mm256_madd_epi16(sum, ones16);
        let scaled = _mm256_mullo_epi32(sum, _mm256_set1_epi32(-Q4_OFFSET));
        let at = g * PANEL + 8 * oct;
        _mm256_storeu_si256(corr[at..at + 8].as_mut_ptr() as *mut _, scaled);
        for i in 0..live {
            scales[at + i] = d.group_scale_simd(i, g).to_bits();
        }
    }
}

/// The codes of `rows` (the first `live` of them; the others zero) as int16, two per word,
/// into a `q8` panel for AVX2 ([`tile_q8_avx2`]): per 16 columns and 8 rows, the bytes
/// sign-extended and transposed 8 × 8 words in registers; the last `cols % 16` columns one
/// at a time, and the words past `cols` zero.
///
/// # Safety
/// AVX2; `codes` holds `2·ceil(cols/4)·32` words.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn pack_q8_avx2(rows: &[&[u8]; PANEL], live: usize, cols: usize, codes: &mut [u32]) {
    let words = 2 * cols.div_ceil(4);
    assert!(codes.len() == words * PANEL);
    let blocks = cols / 16;
    for oct in 0..PANEL / 8 {
        for blk in 0..blocks {
            let mut r = [_mm256_setzero_si256(); 8];
            for (i, r) in r.iter_mut().enumerate() {
                let row = 8 * oct + i;
                if row < live {
                    let p = rows[row].as_ptr().add(16 * blk);
                    if blk % 4 == 0 {
                        // The rows come from DRAM, 8 streams at once: ask ahead.
                        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(4 * 64) as *const i8);
                    }
                    *r = _mm256_cvtepi8_epi16(_mm_loadu_si128(p as *const _));
                }
            }
            store_transposed(codes, 8 * blk, oct, &r);
        }
    }
    codes[8 * blocks * PANEL..].fill(0);
    for (i, row) in rows.iter().enumerate().take(live) {
        for (c, &b) in row.iter().enumerate().skip(16 * blocks) {
            codes[(c / 2) * PANEL + i] |= (b as i8 as i16 as u16 as u32) << (16 * (c % 2));
        }
    }
}

/// `r` (8 rows' words `word0 .. word0 + 8`) transposed ([`transpose8`]) into those words
/// of rows `8·oct ..` of a panel's `codes`; the vectors stored.
///
/// # Safety
/// AVX2; `codes` holds words `word0 + 8` of the panel's 32 rows.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn store_transposed(
    codes: &mut [u32],
    word0: usize,
    oct: usize,
    r: &[__m256i; 8],
) -> [__m256i; 8] {
    let t = transpose8(r);
    for (k, v) in t.iter().enumerate() {
        let at = (word0 + k) * PANEL + 8 * oct;
        _mm256_storeu_si256(codes[at..at + 8].as_mut_ptr() as *mut _, *v);
    }
    t
}

/// 8 vectors of 8 words, transposed: word `k` of every input in output `k`.
///
/// # Safety
/// AVX2.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn transpose8(r: &[__m256i; 8]) -> [__m256i; 8] {
    let t0: [__m256i; 8] = std::array::from_fn(|i| {
        let (a, b) = (r[i & !1], r[i | 1]);
        if i % 2 == 0 {
            _mm256_unpacklo_epi32(a, b)
        } else {
            _mm256_unpackhi_epi32(a, b)
        }
    });
    let t1: [__m256i; 8] = std::array::from_fn(|i| {
        let base = (i / 4) * 4 + (i % 2);
        let (a, b) = (t0[base], t0[base + 2]);
        if (i / 2) % 2 == 0 {
            _mm256_unpacklo_epi64(a, b)
        } else {
            _mm256_unpackhi_epi64(a, b)
        }
    });
    // t1[0..4]: inputs 0–3, t1[4..8]: inputs 4–7, each a word in each 128-bit half; words
    // {0|4}, {1|5}, {2|6}, {3|7} sit in t1[0], t1[2], t1[1], t1[3].
    std::array::from_fn(|k| {
        let m = [0, 2, 1, 3][k % 4];
        let (lo, hi) = (t1[m], t1[4 + m]);
        if k < 4 {
            _mm256_permute2x128_si256::<0x20>(lo, hi)
        } else {
            _mm256_permute2x128_si256::<0x31>(lo, hi)
        }
    })
}

/// Rows `8·oct ..` (`live` of them real) of an int16 panel for AVX2 ([`tile_i16_avx2`]):
/// per group, each row's 32 codes widened to int16 ([`IntRowsSimd::load_i16`]: 16 words
/// of two codes), transposed 8 × 8 words in two halves, then per group and row the scale.
/// Each row's group asks L2 for the rows ahead ([`IntRowsSimd::prefetch_pack`], as
/// [`pack_grouped_avx2`] does): 64-token prefill 1.06–1.12× on both models and levels.
///
/// # Safety
/// AVX2; `dst` is one panel of [`panel_len`] words (`cols % 32 == 0`), zeroed unless all
/// its 32 rows are live (then every word is written here).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::needless_range_loop)]
unsafe fn pack_i16_avx2<D: IntRowsSimd>(
    d: &D,
    live: usize,
    oct: usize,
    c4: usize,
    dst: &mut [u32],
) {
    assert!(dst.len() == panel_len(Family::Grouped(Grouped::Vbit), c4, true, true) && live <= 8);
    if live == 8 {
        pack_i16_octet::<D, true>(d, live, oct, c4, dst)
    } else {
        pack_i16_octet::<D, false>(d, live, oct, c4, dst)
    }
}

/// The body of [`pack_i16_avx2`]; `FULL` (all 8 rows live, every octet but a product's
/// last) unrolls the row loops, keeps the rows in registers and converts the 8 scales at
/// once, where the loop over `live` rows went through the stack with a branch per row
/// (the packer was 9% of a SmolLM2-135M `q4_block` 64-token prefill).
///
/// # Safety
/// As [`pack_i16_avx2`], and `live == 8` with `FULL`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
#[allow(clippy::needless_range_loop)]
unsafe fn pack_i16_octet<D: IntRowsSimd, const FULL: bool>(
    d: &D,
    live: usize,
    oct: usize,
    c4: usize,
    dst: &mut [u32],
) {
    let groups = c4 / 8;
    let (codes, scales) = dst.split_at_mut(2 * c4 * PANEL);
    // Signed codes: the `q4` nibbles less their offset 8.
    let off = _mm256_set1_epi16(D::CODE_OFFSET as i16);
    for g in 0..groups {
        let mut r = [[_mm256_setzero_si256(); 8]; 2];
        for i in 0..8 {
            if FULL || i < live {
                d.prefetch_pack(i, g);
                let [lo, hi] = d.load_i16(i, g).map(|c| _mm256_sub_epi16(c, off));
                (r[0][i], r[1][i]) = (lo, hi);
            }
        }
        for (h, r) in r.iter().enumerate() {
            store_transposed(codes, 16 * g + 8 * h, oct, r);
        }
        let at = g * PANEL + 8 * oct;
        if FULL {
            let s = d.group_scales8(g);
            _mm256_storeu_ps(scales[at..at + 8].as_mut_ptr() as *mut f32, s);
        } else {
            for i in 0..live {
                scales[at + i] = d.group_scale_simd(i, g).to_bits();
            }
        }
    }
}

/// `256·128 + 128`: what the unsigned activation bytes (`q + 128`, `q₂ + 128`) add to
/// `256·Σ w·q + Σ w·q₂` per unit of `Σ w`.
const Q4_OFFSET: i32 = 32896;

/// The index vectors of the four levels of [`transpose16`].
///
/// # Safety
/// AVX-512 F.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn transpose_indices() -> [(__m512i, __m512i); 4] {
    let idx = |b: usize, hi: bool| {
        let v: [i32; 16] = std::array::from_fn(|l| {
            let (l, b) = (l as i32, b as i32);
            match (l & b == 0, hi) {
                (true, false) => l,
                (false, false) => 16 + l - b,
                (true, true) => l + b,
                (false, true) => 16 + l,
            }
        });
        _mm512_loadu_si512(v.as_ptr() as *const _)
    };
    [8usize, 4, 2, 1].map(|b| (idx(b, false), idx(b, true)))
}

/// Transposes 16 × 16 words in `r`: vector `c` becomes word `c` of every input vector.
///
/// # Safety
/// AVX-512 F.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn transpose16(r: &mut [__m512i; 16], levels: &[(__m512i, __m512i); 4]) {
    transpose_level::<8>(r, levels[0]);
    transpose_level::<4>(r, levels[1]);
    transpose_level::<2>(r, levels[2]);
    transpose_level::<1>(r, levels[3]);
}

/// One level of the 16 × 16 word transpose: rows `i` and `i + B` (`i & B == 0`) swap
/// their off-diagonal `B`-lane blocks (index vectors `lo`, `hi`).
///
/// # Safety
/// AVX-512 F.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn transpose_level<const B: usize>(r: &mut [__m512i; 16], (lo, hi): (__m512i, __m512i)) {
    for i in 0..16 {
        if i & B == 0 {
            let (a, c) = (r[i], r[i + B]);
            r[i] = _mm512_permutex2var_epi32(a, lo, c);
            r[i + B] = _mm512_permutex2var_epi32(a, hi, c);
        }
    }
}

/// Token `j`'s codes as `[c4][2]` words: four bytes `q + 128`, then four bytes `q₂ + 128`
/// (a token's codes are whole groups of 32, zero past `cols`: `c4` words always exist).
fn unsigned_acts(qa: &QuantizedActs, t: usize, c4: usize, u: &mut Vec<u32>) {
    // Every word is written below: no zeroing first (it was a pass of its own over the
    // activations, 1% of a 64-token prefill).
    u.clear();
    u.reserve(t * c4 * 2);
    let word = |b: &[i8]| {
        u32::from_le_bytes([b[0] as u8, b[1] as u8, b[2] as u8, b[3] as u8]) ^ 0x8080_8080
    };
    for (j, uj) in u.spare_capacity_mut()[..t * c4 * 2]
        .chunks_exact_mut(2 * c4)
        .enumerate()
    {
        let x = qa.token(j);
        let (q, q2) = (&x.q[..4 * c4], &x.q2[..4 * c4]);
        // Four columns of both levels at a time: interleaving 32-bit words is what SSE2's
        // unpack does (baseline on x86-64).
        #[cfg(target_arch = "x86_64")]
        let done = {
            use std::arch::x86_64::*;
            let wide = c4 / 4;
            for k in 0..wide {
                // SAFETY: SSE2 is part of x86-64; bytes `16k .. 16k + 16` of both levels
                // exist (`16·wide ≤ 4·c4`), and words `8k .. 8k + 8` of `uj` (`8·wide ≤
                // 2·c4`).
                unsafe {
                    let flip = _mm_set1_epi8(-128);
                    let a = _mm_loadu_si128(q.as_ptr().add(16 * k) as *const __m128i);
                    let b = _mm_loadu_si128(q2.as_ptr().add(16 * k) as *const __m128i);
                    let dst = uj.as_mut_ptr().add(8 * k) as *mut __m128i;
                    _mm_storeu_si128(dst, _mm_xor_si128(_mm_unpacklo_epi32(a, b), flip));
                    _mm_storeu_si128(dst.add(1), _mm_xor_si128(_mm_unpackhi_epi32(a, b), flip));
                }
            }
            4 * wide
        };
        #[cfg(not(target_arch = "x86_64"))]
        let done = 0;
        for (k, pair) in uj.chunks_exact_mut(2).enumerate().skip(done) {
            pair[0].write(word(&q[4 * k..4 * k + 4]));
            pair[1].write(word(&q2[4 * k..4 * k + 4]));
        }
    }
    // SAFETY: the loops above wrote all `t·c4·2` words.
    unsafe { u.set_len(t * c4 * 2) };
}

/// What every panel of one product shares: the family and kernel, the activations
/// (`u`: each token's `2·c4` unsigned words, empty for the int16 panels, which read `qa`'s
/// int16 codes; `d`: each token's scale), the output rows `n` and where they go.
#[derive(Clone, Copy)]
struct PanelJob<'a> {
    fam: Family,
    /// The AVX2 tiles ([`avx2_takes`]) instead of the AVX-512 ones.
    avx2: bool,
    /// ... and with AVX-VNNI ([`Kernel::AvxVnni`]).
    avx_vnni: bool,
    /// The panels hold int16 codes ([`int16_panels`]).
    int16: bool,
    c4: usize,
    qa: &'a QuantizedActs,
    u: &'a [u32],
    d: &'a [f32],
    n: usize,
    out: Out<'a>,
}

/// [`panel_tokens`], or [`panel_tokens_avx2`] when `job.avx2` (the AVX2 tiles must not be
/// compiled inside AVX-512 target features: they would run on CPUs without them).
///
/// # Safety
/// As [`panel_tokens`], with AVX2 + FMA instead of AVX-512 when `job.avx2`, and AVX-VNNI
/// when `job.avx_vnni` (set for [`Kernel::AvxVnni`] matrices, which only a CPU with it
/// gets).
unsafe fn run_panel(
    job: &PanelJob,
    panel: &[u32],
    toks: std::ops::Range<usize>,
    corr: Option<&[f32]>,
    k0: usize,
    next: Option<&[&[u8]; PANEL]>,
) {
    #[cfg(target_arch = "x86_64")]
    if job.avx_vnni {
        return panel_tokens_avx_vnni(job, panel, toks, corr, k0);
    }
    #[cfg(target_arch = "x86_64")]
    if job.avx2 {
        return panel_tokens_avx2_only(job, panel, toks, corr, k0);
    }
    panel_tokens(job, panel, toks, corr, k0, next)
}

/// [`panel_tokens_avx2`] without AVX-VNNI.
///
/// # Safety
/// AVX2 + FMA; otherwise as [`panel_tokens`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn panel_tokens_avx2_only(
    job: &PanelJob,
    panel: &[u32],
    toks: std::ops::Range<usize>,
    corr: Option<&[f32]>,
    k0: usize,
) {
    panel_tokens_avx2::<false>(job, panel, toks, corr, k0)
}

/// [`panel_tokens_avx2`] with AVX-VNNI.
///
/// # Safety
/// AVX2 + FMA + AVX-VNNI; otherwise as [`panel_tokens`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,avxvnni")]
unsafe fn panel_tokens_avx_vnni(
    job: &PanelJob,
    panel: &[u32],
    toks: std::ops::Range<usize>,
    corr: Option<&[f32]>,
    k0: usize,
) {
    panel_tokens_avx2::<true>(job, panel, toks, corr, k0)
}

/// Tokens `toks` against one packed panel on AVX2: `q8` four at a time ([`tile_q8_avx2`]),
/// the grouped layouts in int16 panels four at a time too ([`tile_i16_avx2`]), or with
/// AVX-VNNI in byte panels one at a time over the panel's 32 rows ([`tile_q4_avx_vnni`]).
/// With `VNNI`, each byte or int16 multiply-add is one AVX-VNNI instruction (compiled
/// inside [`panel_tokens_avx_vnni`]'s features).
///
/// # Safety
/// AVX2 + FMA, and AVX-VNNI with `VNNI`; otherwise as [`panel_tokens`].
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn panel_tokens_avx2<const VNNI: bool>(
    job: &PanelJob,
    panel: &[u32],
    toks: std::ops::Range<usize>,
    corr: Option<&[f32]>,
    k0: usize,
) {
    let PanelJob {
        fam,
        c4,
        qa,
        u,
        d,
        n,
        out,
        ..
    } = *job;
    if !job.int16 {
        assert!(VNNI, "without AVX-VNNI every AVX2 panel holds int16 codes");
        for j in toks.clone() {
            let c = corr.map(|c| &c[(j - toks.start) * PANEL..]);
            let at = TileAt {
                j0: j,
                half: 0,
                k0,
                n,
                out,
            };
            tile_q4_avx_vnni(panel, c4, u, d, at, c);
        }
        return;
    }
    let mut j = toks.start;
    let step = TILE_TOKENS_AVX2;
    while j < toks.end {
        let left = (toks.end - j).min(step);
        for half in 0..2 {
            let at = TileAt {
                j0: j,
                half,
                k0,
                n,
                out,
            };
            let c = corr.map(|c| &c[(j - toks.start) * PANEL..]);
            match (fam, left) {
                (Family::Q8, 4) => tile_q8_avx2::<4, VNNI>(panel, c4, qa, d, at),
                (Family::Q8, 3) => tile_q8_avx2::<3, VNNI>(panel, c4, qa, d, at),
                (Family::Q8, 2) => tile_q8_avx2::<2, VNNI>(panel, c4, qa, d, at),
                (Family::Q8, _) => tile_q8_avx2::<1, VNNI>(panel, c4, qa, d, at),
                (_, 4) => tile_i16_avx2::<4, VNNI>(panel, c4, qa, d, at, c),
                (_, 3) => tile_i16_avx2::<3, VNNI>(panel, c4, qa, d, at, c),
                (_, 2) => tile_i16_avx2::<2, VNNI>(panel, c4, qa, d, at, c),
                (_, _) => tile_i16_avx2::<1, VNNI>(panel, c4, qa, d, at, c),
            }
        }
        j += left;
    }
}

/// Tokens `toks` against one packed panel (outputs `k0 ..`), in tiles of up to 6 tokens.
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI; `panel` is one [`panel_len`]`(c4)` panel, `u` holds every token's
/// `2·c4` words, `d` every token's scale, and no other thread writes outputs `k0 .. k0+32`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
unsafe fn panel_tokens(
    job: &PanelJob,
    panel: &[u32],
    toks: std::ops::Range<usize>,
    corr: Option<&[f32]>,
    k0: usize,
    next: Option<&[&[u8]; PANEL]>,
) {
    let PanelJob {
        fam,
        c4,
        u,
        d,
        n,
        out,
        ..
    } = *job;
    let mut j = toks.start;
    if let Family::Grouped(_) = fam {
        while j < toks.end {
            let left = (toks.end - j).min(Q4_TILE_TOKENS);
            let c = corr.map(|c| &c[(j - toks.start) * PANEL..]);
            match left {
                4 => tile_q4::<4>(panel, c4, u, d, j, c, k0, n, out),
                3 => tile_q4::<3>(panel, c4, u, d, j, c, k0, n, out),
                2 => tile_q4::<2>(panel, c4, u, d, j, c, k0, n, out),
                _ => tile_q4::<1>(panel, c4, u, d, j, c, k0, n, out),
            }
            j += left;
        }
        return;
    }
    while j < toks.end {
        let left = toks.end - j;
        let pf = next.filter(|_| j == toks.start).unwrap_or(&[&[]; PANEL]);
        match left.min(TILE_TOKENS) {
            6 => tile::<6>(panel, c4, u, d, j, k0, n, out, pf),
            5 => tile::<5>(panel, c4, u, d, j, k0, n, out, pf),
            4 => tile::<4>(panel, c4, u, d, j, k0, n, out, pf),
            3 => tile::<3>(panel, c4, u, d, j, k0, n, out, pf),
            2 => tile::<2>(panel, c4, u, d, j, k0, n, out, pf),
            _ => tile::<1>(panel, c4, u, d, j, k0, n, out, pf),
        }
        j += left.min(TILE_TOKENS);
    }
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn panel_tokens(
    _: &PanelJob,
    _: &[u32],
    _: std::ops::Range<usize>,
    _: Option<&[f32]>,
    _: usize,
    _: Option<&[&[u8]; PANEL]>,
) {
    unreachable!("the panel kernel needs AVX-512 VNNI")
}

/// 32 rows × `T` tokens from token `j0`. Two cache lines of the rows `next` (the next
/// panel's; empty slices for none) are asked for per step, into L2, so that its packing
/// does not wait on memory: `2·c4` lines per pass, the whole panel.
///
/// # Safety
/// As [`panel_tokens`], with `j0 + T ≤ d.len()`.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn tile<const T: usize>(
    panel: &[u32],
    c4: usize,
    u: &[u32],
    d: &[f32],
    j0: usize,
    k0: usize,
    n: usize,
    out: Out,
    next: &[&[u8]; PANEL],
) {
    let w = panel.as_ptr();
    let up: [*const u32; T] = std::array::from_fn(|q| u.as_ptr().add((j0 + q) * 2 * c4));
    let mut a = [[_mm512_setzero_si512(); T]; 2];
    let mut b = [[_mm512_setzero_si512(); T]; 2];
    for c in 0..c4 {
        for line in [2 * c, 2 * c + 1] {
            let (i, at) = (line % PANEL, 64 * (line / PANEL));
            if at < next[i].len() {
                _mm_prefetch::<_MM_HINT_T1>(next[i].as_ptr().add(at) as *const i8);
            }
        }
        step::<T>(w, c, &up, &mut a, &mut b);
    }
    let tail = w.add(c4 * PANEL);
    for v in 0..2 {
        let rows = n.saturating_sub(k0 + 16 * v).min(16);
        if rows == 0 {
            continue;
        }
        let mask = ((1u32 << rows) - 1) as __mmask16;
        // `128·Σ w` per row, wrapping as the accumulators do.
        let corr = _mm512_slli_epi32::<7>(_mm512_loadu_si512(tail.add(16 * v) as *const _));
        let scale = _mm512_loadu_ps(tail.add(PANEL + 16 * v) as *const f32);
        for q in 0..T {
            let hi = _mm512_sub_epi32(a[v][q], corr);
            let lo = _mm512_sub_epi32(b[v][q], corr);
            let s = |half: __m256i, low: __m256i| {
                // Exact: |256·A + B| < 2⁴⁰.
                _mm512_cvtpd_ps(_mm512_fmadd_pd(
                    _mm512_cvtepi32_pd(half),
                    _mm512_set1_pd(256.0),
                    _mm512_cvtepi32_pd(low),
                ))
            };
            let s0 = s(_mm512_castsi512_si256(hi), _mm512_castsi512_si256(lo));
            let s1 = s(
                _mm512_extracti64x4_epi64::<1>(hi),
                _mm512_extracti64x4_epi64::<1>(lo),
            );
            let sf = _mm512_castpd_ps(_mm512_insertf64x4::<1>(
                _mm512_castpd256_pd512(_mm256_castps_pd(s0)),
                _mm256_castps_pd(s1),
            ));
            let r = _mm512_mul_ps(_mm512_mul_ps(sf, _mm512_set1_ps(d[j0 + q])), scale);
            let at = (j0 + q) * n + k0 + 16 * v;
            _mm512_mask_storeu_ps(out.slice_ptr(at, rows), mask, r);
        }
    }
}

/// Tokens per `q4` register tile: 2 row vectors × 4 tokens × (two level sums and the f32
/// accumulator) = 24 registers.
const Q4_TILE_TOKENS: usize = 4;

/// 32 `q4` rows × `T` tokens from token `j0`. Per group of 32 columns: both levels' sums
/// (exact in i32; `B` from `−32896·Σw`), `D = 256·A + B` — the group's exact integer
/// `Σ c·(256·q + q₂)` — converted to f32 (exact for `q4` and `q1t`: |D| < 2²⁴; `vbit`'s
/// wider codes may round once) and multiply-added with the group's scale; the token's
/// scale at the end, then (`q1t`) the overlay's corrections `overlay`
/// (`[token − j0][32 rows]`).
///
/// # Safety
/// As [`panel_tokens`], with a grouped panel and `j0 + T ≤ d.len()`.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
#[inline(always)]
unsafe fn tile_q4<const T: usize>(
    panel: &[u32],
    c4: usize,
    u: &[u32],
    d: &[f32],
    j0: usize,
    overlay: Option<&[f32]>,
    k0: usize,
    n: usize,
    out: Out,
) {
    let groups = c4 / 8;
    let w = panel.as_ptr();
    let corr = w.add(c4.next_multiple_of(16) * PANEL);
    let scales = corr.add(groups * PANEL) as *const f32;
    let up: [*const u32; T] = std::array::from_fn(|q| u.as_ptr().add((j0 + q) * 2 * c4));
    let mut acc = [[_mm512_setzero_ps(); T]; 2];
    for g in 0..groups {
        let mut a = [[_mm512_setzero_si512(); T]; 2];
        // The low level starts from the offset `−32896·Σw` (stored negated), so that the
        // group's integer needs no subtraction: the same wrapping sum, one op fewer.
        let cv: [__m512i; 2] =
            std::array::from_fn(|v| _mm512_loadu_si512(corr.add(g * PANEL + 16 * v) as *const _));
        let mut b = cv.map(|c| [c; T]);
        for c in 8 * g..8 * g + 8 {
            step::<T>(w, c, &up, &mut a, &mut b);
        }
        for v in 0..2 {
            let sv = _mm512_loadu_ps(scales.add(g * PANEL + 16 * v));
            for q in 0..T {
                let dot = _mm512_add_epi32(_mm512_slli_epi32::<8>(a[v][q]), b[v][q]);
                acc[v][q] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), sv, acc[v][q]);
            }
        }
    }
    for v in 0..2 {
        let rows = n.saturating_sub(k0 + 16 * v).min(16);
        if rows == 0 {
            continue;
        }
        let mask = ((1u32 << rows) - 1) as __mmask16;
        for q in 0..T {
            let mut r = _mm512_mul_ps(acc[v][q], _mm512_set1_ps(d[j0 + q]));
            if let Some(c) = overlay {
                let at = q * PANEL + 16 * v;
                r = _mm512_add_ps(r, _mm512_loadu_ps(c[at..at + 16].as_ptr()));
            }
            _mm512_mask_storeu_ps(out.slice_ptr((j0 + q) * n + k0 + 16 * v, rows), mask, r);
        }
    }
}

/// The AVX-VNNI form of [`tile_q4`]: one token `j0` against all 32 rows of a byte panel
/// (its four 8-row vectors): per vector and level one `vpdpbusd` on 256 bits, summing in
/// int32 from the start (the low level from the stored offset, as [`tile_q4`] does), the
/// same exact group integers converted and multiply-added with the group's scale in the
/// same order: the values equal [`tile_q4`]'s bit for bit. (Without AVX-VNNI the grouped
/// layouts run in int16 panels, [`int16_panels`].)
///
/// # Safety
/// AVX2 + FMA + AVX-VNNI; otherwise as [`tile_q4`], with `at.half == 0`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn tile_q4_avx_vnni(
    panel: &[u32],
    c4: usize,
    u: &[u32],
    d: &[f32],
    at: TileAt,
    overlay: Option<&[f32]>,
) {
    const V: usize = PANEL / 8;
    debug_assert_eq!(at.half, 0);
    let rows = at.rows_of(V);
    if rows == 0 {
        return;
    }
    let groups = c4 / 8;
    let w = panel.as_ptr();
    let corr = panel.as_ptr().add(c4.next_multiple_of(16) * PANEL);
    let scales = corr.add(groups * PANEL) as *const f32;
    let up = u.as_ptr().add(at.j0 * 2 * c4);
    let mut acc = [[_mm256_setzero_ps(); 1]; V];
    for g in 0..groups {
        // The high level from zero, the low one from the stored offset `−32896·Σw`.
        let mut a = [_mm256_setzero_si256(); V];
        let mut b: [__m256i; V] =
            std::array::from_fn(|v| _mm256_loadu_si256(corr.add(g * PANEL + 8 * v) as *const _));
        for c in 8 * g..8 * g + 8 {
            let hi = _mm256_set1_epi32(*up.add(2 * c) as i32);
            let lo = _mm256_set1_epi32(*up.add(2 * c + 1) as i32);
            for (v, (a, b)) in a.iter_mut().zip(&mut b).enumerate() {
                let wv = _mm256_loadu_si256(w.add(c * PANEL + 8 * v) as *const _);
                *a = _mm256_dpbusd_avx_epi32(*a, hi, wv);
                *b = _mm256_dpbusd_avx_epi32(*b, lo, wv);
            }
        }
        for (v, acc) in acc.iter_mut().enumerate() {
            let sv = _mm256_loadu_ps(scales.add(g * PANEL + 8 * v));
            let dot = _mm256_add_epi32(_mm256_slli_epi32::<8>(a[v]), b[v]);
            acc[0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), sv, acc[0]);
        }
    }
    store_tile_avx2(&acc, d, at, overlay, rows);
}

/// The outputs of an AVX2 tile (`rows` of them, [`TileAt::rows`]), each accumulator times
/// its token's scale, plus the overlay's corrections if any.
///
/// # Safety
/// AVX2; as the tiles'.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn store_tile_avx2<const T: usize, const V: usize>(
    acc: &[[__m256; T]; V],
    d: &[f32],
    at: TileAt,
    overlay: Option<&[f32]>,
    rows: usize,
) {
    let TileAt {
        j0,
        half,
        k0,
        n,
        out,
    } = at;
    for q in 0..T {
        let mut r = [0f32; PANEL];
        let at = (j0 + q) * n + k0 + 8 * V * half;
        // A whole tile stores straight into the outputs; a partial one through `r` (a
        // `memcpy` call per tile and token was 2–4% of a 64-token prefill).
        let whole = rows == 8 * V;
        let dst = if whole {
            out.slice_ptr(at, rows)
        } else {
            r.as_mut_ptr()
        };
        for v in 0..V {
            let mut x = _mm256_mul_ps(acc[v][q], _mm256_set1_ps(d[j0 + q]));
            if let Some(c) = overlay {
                let at = q * PANEL + 8 * V * half + 8 * v;
                x = _mm256_add_ps(x, _mm256_loadu_ps(c[at..at + 8].as_ptr()));
            }
            _mm256_storeu_ps(dst.add(8 * v), x);
        }
        if !whole {
            std::ptr::copy_nonoverlapping(r.as_ptr(), out.slice_ptr(at, rows), rows);
        }
    }
}

/// Where an AVX2 tile's outputs go: rows `16·half ..` of the panel at outputs `k0 ..` (of
/// `n`; those past `n` are not written), tokens from `j0`.
#[derive(Clone, Copy)]
struct TileAt<'a> {
    j0: usize,
    half: usize,
    k0: usize,
    n: usize,
    out: Out<'a>,
}

impl TileAt<'_> {
    /// The tile's rows that are outputs (up to 16).
    fn rows(&self) -> usize {
        self.rows_of(2)
    }

    /// The rows that are outputs of a tile of `vecs` 8-row vectors (rows `8·vecs·half ..`
    /// of the panel).
    fn rows_of(&self, vecs: usize) -> usize {
        self.n
            .saturating_sub(self.k0 + 8 * vecs * self.half)
            .min(8 * vecs)
    }
}

/// Rows `16·half ..` of a grouped int16 panel for AVX2 ([`pack_i16_avx2`]) × `T` tokens
/// from `j0`: per pair of columns one `vpmaddwd` of the rows' int16 codes by the token's
/// int16 activation codes `k = 256·q + q₂` (two of them broadcast), added in int32. A
/// group's sum `Σ c·k` is exact (|c| ≤ 128: at most 32·128·32639 < 2³¹), and it is the
/// integer the AVX-512 panels form from both byte levels; its conversion to f32 may round
/// once (above 2²⁴: `vbit`'s codes only), as there. Then one multiply-add with the group's
/// scale per group, the token's scale at the end and (`q1t`) the overlay's corrections:
/// the values of the AVX-512 panels (within their f32 bound for `vbit`).
///
/// # Safety
/// AVX2 + FMA; `panel` one [`panel_len`] panel, `qa` tokens with int16 codes over `4·c4`
/// columns, `d` every token's scale, `j0 + T ≤ d.len()`, and no other thread writes
/// outputs `k0 .. k0 + 32`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn tile_i16_avx2<const T: usize, const VNNI: bool>(
    panel: &[u32],
    c4: usize,
    qa: &QuantizedActs,
    d: &[f32],
    at: TileAt,
    overlay: Option<&[f32]>,
) {
    let Some((w, scales, kp)) = int16_tile::<T>(panel, c4, qa, &at) else {
        return;
    };
    let groups = c4 / 8;
    let mut acc = [[_mm256_setzero_ps(); T]; 2];
    for g in 0..groups {
        let mut a = [[_mm256_setzero_si256(); T]; 2];
        for c in 16 * g..16 * g + 16 {
            step_i16::<T, VNNI>(w, c, &kp, &mut a);
        }
        for (v, (acc, a)) in acc.iter_mut().zip(&a).enumerate() {
            let sv = _mm256_loadu_ps(scales.add(g * PANEL + 8 * v));
            for (acc, a) in acc.iter_mut().zip(a) {
                *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(*a), sv, *acc);
            }
        }
    }
    store_tile_avx2(&acc, d, at, overlay, at.rows());
}

/// What an int16 tile ([`tile_i16_avx2`], [`tile_q8_avx2`]) reads: its half of the panel's
/// code words, the scales after the panel's `2·c4` words, and where tokens `j0 .. j0 + T`'s
/// int16 codes start, read as words of two (a column pair per word, little-endian: the
/// int16 panels' order). `None` when none of the half's rows are outputs.
///
/// # Safety
/// `panel` one [`panel_len`] int16 panel of `c4`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
#[allow(clippy::type_complexity)]
unsafe fn int16_tile<const T: usize>(
    panel: &[u32],
    c4: usize,
    qa: &QuantizedActs,
    at: &TileAt,
) -> Option<(*const u32, *const f32, [*const u32; T])> {
    if at.rows() == 0 {
        return None;
    }
    let w = panel.as_ptr().add(16 * at.half);
    let scales = panel.as_ptr().add(2 * c4 * PANEL + 16 * at.half) as *const f32;
    // In bounds: `matmul` checked that every token has its codes.
    let (k, per) = qa.codes16();
    let kp = std::array::from_fn(|q| k.as_ptr().add((at.j0 + q) * per) as *const u32);
    Some((w, scales, kp))
}

/// Column pair `c` of an int16 panel's 16 rows (two 8-row vectors) against `T` tokens: one
/// `vpmaddwd` per row vector and token with the token's pair `k` broadcast, added to `a`
/// in int32 (with `VNNI`, one `vpdpwssd`: the same wrapping int32 sum).
///
/// # Safety
/// AVX2, and AVX-VNNI with `VNNI`; `w` is a panel's half with pair `c`, each `kp[q]` a
/// token's `c + 1` pairs.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn step_i16<const T: usize, const VNNI: bool>(
    w: *const u32,
    c: usize,
    kp: &[*const u32; T],
    a: &mut [[__m256i; T]; 2],
) {
    let w0 = _mm256_loadu_si256(w.add(c * PANEL) as *const _);
    let w1 = _mm256_loadu_si256(w.add(c * PANEL + 8) as *const _);
    for (q, kp) in kp.iter().enumerate() {
        // Unaligned: the codes are int16.
        let k = _mm256_set1_epi32(kp.add(c).read_unaligned() as i32);
        if VNNI {
            a[0][q] = _mm256_dpwssd_avx_epi32(a[0][q], w0, k);
            a[1][q] = _mm256_dpwssd_avx_epi32(a[1][q], w1, k);
        } else {
            a[0][q] = _mm256_add_epi32(a[0][q], _mm256_madd_epi16(w0, k));
            a[1][q] = _mm256_add_epi32(a[1][q], _mm256_madd_epi16(w1, k));
        }
    }
}

/// Tokens per AVX2 int16 register tile (`q8`, and `vbit`'s [`tile_i16_avx2`]): 2 row
/// vectors × 4 tokens int32 accumulators, the two weight vectors and a broadcast = 11 of
/// the 16 registers. Eight independent sums keep two multiply-adds a cycle in flight
/// (latency 5): `vbit`'s tile on 2 tokens, four sums, ran its 64-token prefill 0.90–0.95×
/// as fast (Qwen2.5-Coder-0.5B, SmolLM2-135M, at `avx2` and `avxvnni`).
const TILE_TOKENS_AVX2: usize = 4;

/// Words (column pairs) a `q8` tile sums in int32 before it adds the sums to f64: 256
/// columns of `|c| ≤ 128` against `|k| < 2¹⁵` stay below 2³¹.
const Q8_I32_WORDS: usize = 128;

/// Rows `16·half ..` of a `q8` panel for AVX2 ([`pack_q8_avx2`]) × `T` tokens from `j0`:
/// per column pair one `vpmaddwd` of the rows' int16 codes by the token's int16 codes
/// `k = 256·q + q₂` (two broadcast), summed in int32 over [`Q8_I32_WORDS`] and then in f64,
/// both exact: the row's integer `Σ c·k` that [`super::kernel::run_wide`] sums in i64. Then
/// as there: rounded to f32, times the token's scale, times the row's. The values are the
/// decode path's bit for bit.
///
/// # Safety
/// As [`tile_i16_avx2`].
#[cfg(target_arch = "x86_64")]
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn tile_q8_avx2<const T: usize, const VNNI: bool>(
    panel: &[u32],
    c4: usize,
    qa: &QuantizedActs,
    d: &[f32],
    at: TileAt,
) {
    let Some((w, scales, kp)) = int16_tile::<T>(panel, c4, qa, &at) else {
        return;
    };
    let TileAt { j0, half, .. } = at;
    let (rows, words) = (at.rows(), 2 * c4);
    // Per token and row vector, the exact sums of its 8 rows in two f64 vectors.
    let mut exact = [[[_mm256_setzero_pd(); 2]; 2]; T];
    let mut c0 = 0;
    while c0 < words {
        let end = (c0 + Q8_I32_WORDS).min(words);
        let mut a = [[_mm256_setzero_si256(); T]; 2];
        for c in c0..end {
            step_i16::<T, VNNI>(w, c, &kp, &mut a);
        }
        for v in 0..2 {
            for q in 0..T {
                let [lo, hi] = &mut exact[q][v];
                *lo = _mm256_add_pd(*lo, _mm256_cvtepi32_pd(_mm256_castsi256_si128(a[v][q])));
                *hi = _mm256_add_pd(
                    *hi,
                    _mm256_cvtepi32_pd(_mm256_extracti128_si256::<1>(a[v][q])),
                );
            }
        }
        c0 = end;
    }
    for q in 0..T {
        let mut r = [0f32; 16];
        for v in 0..2 {
            let [lo, hi] = exact[q][v];
            let s = _mm256_set_m128(_mm256_cvtpd_ps(hi), _mm256_cvtpd_ps(lo));
            let x = _mm256_mul_ps(
                _mm256_mul_ps(s, _mm256_set1_ps(d[j0 + q])),
                _mm256_loadu_ps(scales.add(8 * v)),
            );
            _mm256_storeu_ps(r[8 * v..].as_mut_ptr(), x);
        }
        let to = (j0 + q) * at.n + at.k0 + 16 * half;
        std::ptr::copy_nonoverlapping(r.as_ptr(), at.out.slice_ptr(to, rows), rows);
    }
}

/// Code word column `c` of a panel (32 rows × 4 columns) against `T` tokens: both levels'
/// bytes broadcast, one `vpdpbusd` per row vector, token and level.
///
/// # Safety
/// AVX-512 F/VNNI; `w` is a panel with column `c`, each `up[q]` a token's `2·(c + 1)` words.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
#[allow(clippy::needless_range_loop)]
unsafe fn step<const T: usize>(
    w: *const u32,
    c: usize,
    up: &[*const u32; T],
    a: &mut [[__m512i; T]; 2],
    b: &mut [[__m512i; T]; 2],
) {
    let w0 = _mm512_loadu_si512(w.add(c * PANEL) as *const _);
    let w1 = _mm512_loadu_si512(w.add(c * PANEL + 16) as *const _);
    for q in 0..T {
        let hi = _mm512_set1_epi32(*up[q].add(2 * c) as i32);
        let lo = _mm512_set1_epi32(*up[q].add(2 * c + 1) as i32);
        a[0][q] = _mm512_dpbusd_epi32(a[0][q], hi, w0);
        a[1][q] = _mm512_dpbusd_epi32(a[1][q], hi, w1);
        b[0][q] = _mm512_dpbusd_epi32(b[0][q], lo, w0);
        b[1][q] = _mm512_dpbusd_epi32(b[1][q], lo, w1);
    }
}

#[cfg(test)]
mod tests {
    use super::task_count;

    /// The tasks cover every panel once, and the threads' shares (rayon halves the task
    /// range between them) differ by at most one panel wherever there are enough panels.
    #[test]
    fn tasks_split_panels_evenly() {
        for threads in 1..=5 {
            for panels in 1..=200 {
                let parts = task_count(panels, threads);
                assert!(parts >= 1 && parts <= panels && parts <= 4 * threads);
                let sizes: Vec<usize> = (0..parts)
                    .map(|i| (i + 1) * panels / parts - i * panels / parts)
                    .collect();
                assert_eq!(sizes.iter().sum::<usize>(), panels);
                assert!(
                    sizes.iter().all(|&s| s >= 1),
                    "{panels} panels, {threads} threads"
                );
                if panels >= threads {
                    assert_eq!(parts % threads, 0, "{panels} panels, {threads} threads");
                    let per = parts / threads;
                    let shares: Vec<usize> = sizes.chunks(per).map(|c| c.iter().sum()).collect();
                    let (lo, hi) = (shares.iter().min(), shares.iter().max());
                    assert!(
                        hi.unwrap() - lo.unwrap() <= 1,
                        "{panels}/{threads}: {shares:?}"
                    );
                }
            }
        }
        assert_eq!(task_count(28, 2), 8);
    }
}
