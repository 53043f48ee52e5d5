//! Prefill's `q8` products at the default precision as a blocked matrix-matrix product on
//! AVX-512 VNNI: weight rows packed into panels, 16 rows per vector.
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

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;
use std::cell::RefCell;

use rayon::prelude::*;

use super::kernel::{h2f_scalar, le16, QuantizedActs};
use super::matrix::Out;
use super::q8::Q8Layout;
use super::Geom;

/// Weight rows per packed panel: two 16-lane vectors.
pub(super) const PANEL: usize = 32;
/// Tokens per register tile: 2 row vectors × 6 tokens × 2 levels = 24 accumulators.
const TILE_TOKENS: usize = 6;
/// Widest row whose level sums are exact in i32 (see the module comment).
pub(super) const MAX_COLS: usize = 1 << 17;

thread_local! {
    /// A task's packed panels (codes, then per row `Σ w` and the scale), reused.
    static PACKED: RefCell<Vec<u32>> = const { RefCell::new(Vec::new()) };
    /// A product's activations as unsigned bytes, both levels per 4 columns, and each
    /// token's scale; reused.
    static UACTS: RefCell<(Vec<u32>, Vec<f32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// Whether this product runs here: `q8` codes (row-scaled: `q8_row`, or `q8_2f` whose
/// column field is in the activations) at the two-level precision, on AVX-512 VNNI.
pub(super) fn applies(qa: &QuantizedActs, cols: usize, vnni: bool) -> bool {
    vnni && qa.is_split() && cols <= MAX_COLS && cfg!(target_arch = "x86_64")
}

/// `y[j, i] = post_r · d_j · Σ_c w[r, c]·k[j, c]` for the output rows `r` of `sel` (or all),
/// as [`super::kernel::run_wide`] computes each one.
///
/// # Panics
/// Unless [`applies`] (the CPU must have AVX-512 VNNI) and the sizes agree.
pub(super) fn matmul(
    g: Geom,
    bytes: &[u8],
    qa: &QuantizedActs,
    t: usize,
    sel: Option<&[u32]>,
    y: &mut [f32],
) {
    let n = sel.map_or(g.rows, |s| s.len());
    assert!(y.len() == t * n && g.cols <= MAX_COLS && qa.is_split());
    let c4 = g.cols.div_ceil(4);
    UACTS.with(|cell| {
        let mut own = (Vec::new(), Vec::new());
        let mut guard = cell.try_borrow_mut();
        let (u, d) = match guard.as_deref_mut() {
            Ok(ud) => ud,
            Err(_) => &mut own,
        };
        unsigned_acts(qa, t, c4, u);
        d.clear();
        d.extend((0..t).map(|j| qa.token(j).d.first().copied().unwrap_or(0.0)));
        let (u, d) = (&*u, &*d);
        let out = Out::new(y);
        let tasks = n.div_ceil(PANEL);
        // Tokens per pass over a task's panels: their activations stay in L2.
        let tok_block =
            ((192 << 10) / (8 * c4).max(1)).clamp(TILE_TOKENS, 240) / TILE_TOKENS * TILE_TOKENS;
        let per_task = tasks.div_ceil(4 * rayon::current_num_threads()).max(1);
        (0..tasks.div_ceil(per_task))
            .into_par_iter()
            .for_each(|task| {
                let panels = task * per_task..((task + 1) * per_task).min(tasks);
                PACKED.with(|cell| {
                    let mut own = Vec::new();
                    let mut guard = cell.try_borrow_mut();
                    let buf = match guard.as_deref_mut() {
                        Ok(b) => b,
                        Err(_) => &mut own,
                    };
                    let panel_words = panel_len(c4);
                    if t <= tok_block {
                        // One pass: pack a panel, run every token through it; while it
                        // runs, the next panel's rows are fetched from memory.
                        buf.resize(panel_words, 0);
                        for p in panels.clone() {
                            pack(g, bytes, sel, p * PANEL, n, c4, buf);
                            let next = (p + 1 < panels.end)
                                .then(|| panel_rows(g, bytes, sel, (p + 1) * PANEL, n));
                            // SAFETY: `applies` demanded AVX-512 VNNI; the panel, the
                            // activations and the outputs are sized as the kernel reads
                            // them, and this task alone writes rows `p·32 ..` of `y`.
                            unsafe {
                                panel_tokens(buf, c4, u, d, 0..t, p * PANEL, n, out, next.as_ref())
                            };
                        }
                        return;
                    }
                    buf.resize(panels.len() * panel_words, 0);
                    for (p, chunk) in panels.clone().zip(buf.chunks_exact_mut(panel_words)) {
                        pack(g, bytes, sel, p * PANEL, n, c4, chunk);
                    }
                    for j0 in (0..t).step_by(tok_block) {
                        let toks = j0..(j0 + tok_block).min(t);
                        for (p, chunk) in panels.clone().zip(buf.chunks_exact(panel_words)) {
                            // SAFETY: as above.
                            unsafe {
                                panel_tokens(chunk, c4, u, d, toks.clone(), p * PANEL, n, out, None)
                            };
                        }
                    }
                });
            });
    });
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

/// Words of one packed panel: the codes (four per word), then `Σ w` (i32) and the scale
/// (f32 bits) per row.
fn panel_len(c4: usize) -> usize {
    c4 * PANEL + 2 * PANEL
}

/// Packs output rows `k0 .. k0 + 32` (those below `n`; the rest zero) into `dst`.
fn pack(
    g: Geom,
    bytes: &[u8],
    sel: Option<&[u32]>,
    k0: usize,
    n: usize,
    c4: usize,
    dst: &mut [u32],
) {
    let l = Q8Layout::new(g);
    let live = PANEL.min(n - k0);
    if live < PANEL {
        dst.fill(0);
    }
    let rows = panel_rows(g, bytes, sel, k0, n);
    let (codes, tail) = dst.split_at_mut(c4 * PANEL);
    let (sums, scales) = tail.split_at_mut(PANEL);
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
        let r = sel.map_or(k0 + i, |s| s[k0 + i] as usize);
        scales[i] = h2f_scalar(le16(bytes, l.scales + 2 * r)).to_bits();
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
    let idx = |b: usize, hi: bool| {
        let v: [i32; 16] = std::array::from_fn(|l| {
            let l = l as i32;
            let b = b as i32;
            match (l & b == 0, hi) {
                (true, false) => l,
                (false, false) => 16 + l - b,
                (true, true) => l + b,
                (false, true) => 16 + l,
            }
        });
        _mm512_loadu_si512(v.as_ptr() as *const _)
    };
    let levels = [8usize, 4, 2, 1].map(|b| (idx(b, false), idx(b, true)));
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
            transpose_level::<8>(&mut r, levels[0]);
            transpose_level::<4>(&mut r, levels[1]);
            transpose_level::<2>(&mut r, levels[2]);
            transpose_level::<1>(&mut r, levels[3]);
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
    u.clear();
    u.resize(t * c4 * 2, 0);
    let word = |b: &[i8]| {
        u32::from_le_bytes([b[0] as u8, b[1] as u8, b[2] as u8, b[3] as u8]) ^ 0x8080_8080
    };
    for (j, uj) in u.chunks_exact_mut(2 * c4).enumerate() {
        let x = qa.token(j);
        for ((pair, q), q2) in uj
            .chunks_exact_mut(2)
            .zip(x.q.chunks_exact(4))
            .zip(x.q2.chunks_exact(4))
        {
            pair[0] = word(q);
            pair[1] = word(q2);
        }
    }
}

/// Tokens `toks` against one packed panel (outputs `k0 ..`), in tiles of up to 6 tokens.
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI; `panel` is one [`panel_len`]`(c4)` panel, `u` holds every token's
/// `2·c4` words, `d` every token's scale, and no other thread writes outputs `k0 .. k0+32`.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
unsafe fn panel_tokens(
    panel: &[u32],
    c4: usize,
    u: &[u32],
    d: &[f32],
    toks: std::ops::Range<usize>,
    k0: usize,
    n: usize,
    out: Out,
    next: Option<&[&[u8]; PANEL]>,
) {
    let mut j = toks.start;
    while j < toks.end {
        let left = toks.end - j;
        let pf = next.filter(|_| j == toks.start);
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
#[allow(clippy::too_many_arguments)]
unsafe fn panel_tokens(
    _: &[u32],
    _: usize,
    _: &[u32],
    _: &[f32],
    _: std::ops::Range<usize>,
    _: usize,
    _: usize,
    _: Out,
    _: Option<&[&[u8]; PANEL]>,
) {
    unreachable!("the panel kernel needs AVX-512 VNNI")
}

/// 32 rows × `T` tokens from token `j0`; with `next`, two cache lines of those rows
/// (the next panel's) are asked for per step, into L2, so that its packing does not wait
/// on memory: `2·c4` lines per pass, the whole panel.
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
    next: Option<&[&[u8]; PANEL]>,
) {
    if let Some(rows) = next {
        return tile_body::<T, true>(panel, c4, u, d, j0, k0, n, out, rows);
    }
    tile_body::<T, false>(panel, c4, u, d, j0, k0, n, out, &[&[]; PANEL])
}

/// The body of [`tile`], with or without the prefetches.
///
/// # Safety
/// As [`tile`].
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn tile_body<const T: usize, const PREFETCH: bool>(
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
        if PREFETCH {
            for line in [2 * c, 2 * c + 1] {
                let (i, at) = (line % PANEL, 64 * (line / PANEL));
                if at < next[i].len() {
                    _mm_prefetch::<_MM_HINT_T1>(next[i].as_ptr().add(at) as *const i8);
                }
            }
        }
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
