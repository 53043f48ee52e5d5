//! The inner loops of softmax attention over the KV cache, one query head at a time:
//! the scores of a query against a span of keys (or of the query heads sharing a KV head,
//! which then load each key once), the softmax's exponentials and sum, and the
//! probability-weighted sum of values, for each SIMD level of [`Kernel`].
//!
//! Keys are stored in tiles of [`KEY_TILE`] positions, dimension-major
//! (`[tile][head_dim][16]`, see [`super::kv_cache::LayerKv`]): sixteen scores are then
//! `head_dim` multiply-adds of a broadcast query element against one vector of the tile,
//! with no horizontal sums, and prefill (a query per token) and decode read the cache the
//! same way.
//!
//! Every level computes the same operations in the same order, so they agree bit for bit
//! (the tests check it), and so do prefill and decode:
//! - a score is `Σ_d q[d]·k[d]`, one fused multiply-add per `d` in order, times the scale;
//! - `exp` is [`exp_poly`] (Cephes' range reduction and polynomial, fused multiply-adds),
//!   within 2 ulp of `f32::exp` over the softmax's range;
//! - the softmax's sum takes 16 lanes (`lane = index mod 16`) and adds them in the fixed
//!   tree of [`reduce16`];
//! - the value sum keeps two accumulators per dimension, over even and odd keys, added at
//!   the end and then scaled by `1/sum`.
//!
//! Hand-written rather than a BLAS call: these are short, ragged (causal) spans in a cache
//! layout of our own, interleaved with a softmax, and they must match across levels.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

#[cfg(target_arch = "x86_64")]
use super::vmath::{exp256, exp512};
use super::vmath::{exp_poly, reduce16, simd_dispatch};
use crate::quant::kernel::Kernel;

/// Positions per key tile.
pub const KEY_TILE: usize = 16;

/// `out[p − 16·b0] = q · key_p` for every position `p` of tiles `b0 .. b1` of one KV head
/// (`tiles` is that head's `[tiles, head_dim, 16]`); `out.len() ≥ 16·(b1 − b0)`. Positions
/// of those tiles past the written ones get whatever the tile holds there.
pub fn scores(
    k: Kernel,
    tiles: &[f32],
    hd: usize,
    q: &[f32],
    b0: usize,
    b1: usize,
    out: &mut [f32],
) {
    let n = b1.saturating_sub(b0);
    assert!(q.len() == hd && tiles.len() >= b1 * hd * KEY_TILE && out.len() >= n * KEY_TILE);
    let tiles = &tiles[b0 * hd * KEY_TILE..b1 * hd * KEY_TILE];
    simd_dispatch!(
        k,
        scores_avx512(tiles, hd, q, n, out),
        scores_avx2(tiles, hd, q, n, out),
        scores_scalar(tiles, hd, q, n, out)
    )
}

/// [`scores`] of `g` query heads that share this KV head (GQA), `qs` their queries side
/// by side (`[g, head_dim]`), head `h`'s scores into `out[h·stride ..]`: the same values,
/// bit for bit, but on AVX-512 and AVX2 each key vector, once loaded, meets every head (a
/// 512-token prefill spent 14% of its time on scores, loading each key once per head).
#[allow(clippy::too_many_arguments)]
pub fn scores_group(
    k: Kernel,
    tiles: &[f32],
    hd: usize,
    qs: &[f32],
    g: usize,
    b0: usize,
    b1: usize,
    out: &mut [f32],
    stride: usize,
) {
    let n = b1.saturating_sub(b0);
    assert!(qs.len() == g * hd && tiles.len() >= b1 * hd * KEY_TILE);
    assert!(stride >= n * KEY_TILE && out.len() >= g.saturating_sub(1) * stride + n * KEY_TILE);
    #[cfg(target_arch = "x86_64")]
    if matches!(super::vmath::level(k), super::vmath::Level::Avx512) {
        let t = &tiles[b0 * hd * KEY_TILE..b1 * hd * KEY_TILE];
        // SAFETY: AVX-512 F is present (`level` checked it); the lengths are checked above.
        let mut run = |f: GroupScores| unsafe { f(t, hd, qs, n, out, stride) };
        match g {
            2 => return run(scores_group_avx512::<2>),
            3 => return run(scores_group_avx512::<3>),
            4 => return run(scores_group_avx512::<4>),
            5 => return run(scores_group_avx512::<5>),
            6 => return run(scores_group_avx512::<6>),
            7 => return run(scores_group_avx512::<7>),
            8 => return run(scores_group_avx512::<8>),
            _ => {}
        }
    }
    #[cfg(target_arch = "x86_64")]
    if matches!(super::vmath::level(k), super::vmath::Level::Avx2) && g >= 2 {
        let t = &tiles[b0 * hd * KEY_TILE..b1 * hd * KEY_TILE];
        for (h0, c) in avx2_head_chunks(g) {
            let f: GroupScores = match c {
                2 => scores_group_avx2::<2>,
                3 => scores_group_avx2::<3>,
                4 => scores_group_avx2::<4>,
                _ => scores_group_avx2::<1>,
            };
            let (q, o) = (&qs[h0 * hd..(h0 + c) * hd], &mut out[h0 * stride..]);
            // SAFETY: AVX2 and FMA are present (`level` checked them); `q` holds `c`
            // queries and `o` `c` rows of `stride ≥ 16·n` (the lengths checked above).
            unsafe { f(t, hd, q, n, o, stride) };
        }
        return;
    }
    for (h, q) in qs.chunks_exact(hd.max(1)).enumerate().take(g) {
        scores(
            k,
            tiles,
            hd,
            q,
            b0,
            b1,
            &mut out[h * stride..h * stride + n * KEY_TILE],
        );
    }
}

/// The signature of [`scores_group_avx512`] and [`scores_group_avx2`]: tiles, head size,
/// queries, tiles, out, stride.
#[cfg(target_arch = "x86_64")]
type GroupScores = unsafe fn(&[f32], usize, &[f32], usize, &mut [f32], usize);

/// The AVX2 group kernels' heads in chunks `(first, count)` of at most 4: their `2·G`
/// accumulators, two key or value vectors and the broadcasts stay within AVX2's 16
/// registers.
#[cfg(target_arch = "x86_64")]
fn avx2_head_chunks(g: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..g).step_by(4).map(move |h0| (h0, (g - h0).min(4)))
}

/// Two tiles at a time for `G` heads: `2·G` independent chains of multiply-adds, each
/// the chain of [`scores_avx512`] for its (head, tile).
///
/// # Safety
/// AVX-512 F; `tiles.len() == n·hd·16`, `qs.len() == G·hd`, `out` holds `G` rows of
/// `stride ≥ 16·n`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn scores_group_avx512<const G: usize>(
    tiles: &[f32],
    hd: usize,
    qs: &[f32],
    n: usize,
    out: &mut [f32],
    stride: usize,
) {
    let tile = hd * KEY_TILE;
    let (t, q, o) = (tiles.as_ptr(), qs.as_ptr(), out.as_mut_ptr());
    let mut b = 0;
    while b < n {
        let pair = (n - b).min(2);
        let mut acc = [[_mm512_setzero_ps(); 2]; G];
        for d in 0..hd {
            let k0 = _mm512_loadu_ps(t.add(b * tile + d * KEY_TILE));
            let k1 = if pair == 2 {
                _mm512_loadu_ps(t.add((b + 1) * tile + d * KEY_TILE))
            } else {
                k0
            };
            for (h, a) in acc.iter_mut().enumerate() {
                let qd = _mm512_set1_ps(*q.add(h * hd + d));
                a[0] = _mm512_fmadd_ps(qd, k0, a[0]);
                a[1] = _mm512_fmadd_ps(qd, k1, a[1]);
            }
        }
        for (h, a) in acc.iter().enumerate() {
            for (i, v) in a.iter().enumerate().take(pair) {
                _mm512_storeu_ps(o.add(h * stride + (b + i) * KEY_TILE), *v);
            }
        }
        b += pair;
    }
}

/// [`scores_group_avx512`] on AVX2, one tile (two 8-lane halves) at a time for `G` heads:
/// each key vector, once loaded, meets every head, where [`scores_avx2`] per head loaded
/// it `G` times (the scores were 3% of a Qwen2.5-Coder-0.5B 512-token prefill on Zen 3).
/// Each (head, key) is the chain of [`scores_avx2`]: `Σ_d q[d]·k[d]` in order.
///
/// # Safety
/// AVX2 and FMA; `tiles.len() == n·hd·16`, `qs.len() == G·hd`, `out` holds `G` rows of
/// `stride ≥ 16·n`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn scores_group_avx2<const G: usize>(
    tiles: &[f32],
    hd: usize,
    qs: &[f32],
    n: usize,
    out: &mut [f32],
    stride: usize,
) {
    debug_assert!(tiles.len() == n * hd * KEY_TILE && qs.len() == G * hd);
    debug_assert!(out.len() >= (G - 1) * stride + n * KEY_TILE);
    let tile = hd * KEY_TILE;
    let (t, q, o) = (tiles.as_ptr(), qs.as_ptr(), out.as_mut_ptr());
    for b in 0..n {
        let mut acc = [[_mm256_setzero_ps(); 2]; G];
        for d in 0..hd {
            let k0 = _mm256_loadu_ps(t.add(b * tile + d * KEY_TILE));
            let k1 = _mm256_loadu_ps(t.add(b * tile + d * KEY_TILE + 8));
            for (h, a) in acc.iter_mut().enumerate() {
                let qd = _mm256_set1_ps(*q.add(h * hd + d));
                a[0] = _mm256_fmadd_ps(qd, k0, a[0]);
                a[1] = _mm256_fmadd_ps(qd, k1, a[1]);
            }
        }
        for (h, a) in acc.iter().enumerate() {
            _mm256_storeu_ps(o.add(h * stride + b * KEY_TILE), a[0]);
            _mm256_storeu_ps(o.add(h * stride + b * KEY_TILE + 8), a[1]);
        }
    }
}

fn scores_scalar(tiles: &[f32], hd: usize, q: &[f32], n: usize, out: &mut [f32]) {
    for (tile, o) in tiles
        .chunks_exact(hd * KEY_TILE)
        .zip(out.chunks_exact_mut(KEY_TILE))
        .take(n)
    {
        let mut acc = [0f32; KEY_TILE];
        for (&qd, kd) in q.iter().zip(tile.chunks_exact(KEY_TILE)) {
            for (a, &kv) in acc.iter_mut().zip(kd) {
                *a = qd.mul_add(kv, *a);
            }
        }
        o.copy_from_slice(&acc);
    }
}

/// Four tiles at a time: four independent chains of multiply-adds hide their latency.
///
/// # Safety
/// AVX-512 F; `tiles.len() == n·hd·16`, `q.len() == hd`, `out.len() ≥ 16·n`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn scores_avx512(tiles: &[f32], hd: usize, q: &[f32], n: usize, out: &mut [f32]) {
    let stride = hd * KEY_TILE;
    let (t, o) = (tiles.as_ptr(), out.as_mut_ptr());
    let mut b = 0;
    while b + 4 <= n {
        let mut acc = [_mm512_setzero_ps(); 4];
        for d in 0..hd {
            let qd = _mm512_set1_ps(*q.get_unchecked(d));
            for (i, a) in acc.iter_mut().enumerate() {
                let kv = _mm512_loadu_ps(t.add((b + i) * stride + d * KEY_TILE));
                *a = _mm512_fmadd_ps(qd, kv, *a);
            }
        }
        for (i, a) in acc.iter().enumerate() {
            _mm512_storeu_ps(o.add((b + i) * KEY_TILE), *a);
        }
        b += 4;
    }
    while b < n {
        let mut acc = _mm512_setzero_ps();
        for d in 0..hd {
            let kv = _mm512_loadu_ps(t.add(b * stride + d * KEY_TILE));
            acc = _mm512_fmadd_ps(_mm512_set1_ps(*q.get_unchecked(d)), kv, acc);
        }
        _mm512_storeu_ps(o.add(b * KEY_TILE), acc);
        b += 1;
    }
}

/// Two tiles (four 8-lane halves) at a time.
///
/// # Safety
/// AVX2 and FMA; lengths as [`scores_avx512`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::needless_range_loop)]
unsafe fn scores_avx2(tiles: &[f32], hd: usize, q: &[f32], n: usize, out: &mut [f32]) {
    let stride = hd * KEY_TILE;
    let (t, o) = (tiles.as_ptr(), out.as_mut_ptr());
    let mut b = 0;
    while b < n {
        let pair = if b + 2 <= n { 2 } else { 1 };
        let mut acc = [_mm256_setzero_ps(); 4];
        for d in 0..hd {
            let qd = _mm256_set1_ps(*q.get_unchecked(d));
            for i in 0..2 * pair {
                let kv = _mm256_loadu_ps(t.add((b + i / 2) * stride + d * KEY_TILE + 8 * (i % 2)));
                acc[i] = _mm256_fmadd_ps(qd, kv, acc[i]);
            }
        }
        for (i, a) in acc.iter().enumerate().take(2 * pair) {
            _mm256_storeu_ps(o.add((b + i / 2) * KEY_TILE + 8 * (i % 2)), *a);
        }
        b += pair;
    }
}

/// Replaces `s` by `e^(s − max)` and returns their sum (16 lanes, [`reduce16`]).
pub fn softmax_exp(k: Kernel, s: &mut [f32], max: f32) -> f32 {
    simd_dispatch!(
        k,
        softmax_exp_avx512(s, max),
        softmax_exp_avx2(s, max),
        softmax_exp_scalar(s, max)
    )
}

fn softmax_exp_scalar(s: &mut [f32], max: f32) -> f32 {
    let mut lanes = [0f32; 16];
    for chunk in s.chunks_mut(16) {
        for (l, v) in lanes.iter_mut().zip(chunk.iter_mut()) {
            *v = exp_poly(*v - max);
            *l += *v;
        }
    }
    reduce16(&lanes)
}

/// # Safety
/// AVX-512 F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn softmax_exp_avx512(s: &mut [f32], max: f32) -> f32 {
    let m = _mm512_set1_ps(max);
    let mut sum = _mm512_setzero_ps();
    for chunk in s.chunks_mut(16) {
        let mask: __mmask16 = ((1u32 << chunk.len()) - 1) as u16;
        let v = _mm512_maskz_loadu_ps(mask, chunk.as_ptr());
        let e = exp512(_mm512_sub_ps(v, m));
        _mm512_mask_storeu_ps(chunk.as_mut_ptr(), mask, e);
        sum = _mm512_add_ps(sum, _mm512_maskz_mov_ps(mask, e));
    }
    let mut lanes = [0f32; 16];
    _mm512_storeu_ps(lanes.as_mut_ptr(), sum);
    reduce16(&lanes)
}

/// # Safety
/// AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn softmax_exp_avx2(s: &mut [f32], max: f32) -> f32 {
    let m = _mm256_set1_ps(max);
    let mut sum = [_mm256_setzero_ps(); 2];
    let mut chunks = s.chunks_exact_mut(16);
    for chunk in &mut chunks {
        for (h, sum) in sum.iter_mut().enumerate() {
            let p = chunk.as_mut_ptr().add(8 * h);
            let e = exp256(_mm256_sub_ps(_mm256_loadu_ps(p), m));
            _mm256_storeu_ps(p, e);
            *sum = _mm256_add_ps(*sum, e);
        }
    }
    let mut lanes = [0f32; 16];
    _mm256_storeu_ps(lanes.as_mut_ptr(), sum[0]);
    _mm256_storeu_ps(lanes.as_mut_ptr().add(8), sum[1]);
    // The ragged tail in scalar: the same operations lane by lane.
    for (l, v) in lanes.iter_mut().zip(chunks.into_remainder()) {
        *v = exp_poly(*v - max);
        *l += *v;
    }
    reduce16(&lanes)
}

/// `o = (Σ_j p[j]·values[j]) · inv` over the rows of `values` (`[p.len(), hd]`), with one
/// accumulator per dimension for even keys and one for odd keys.
pub fn weighted_values(k: Kernel, values: &[f32], hd: usize, p: &[f32], inv: f32, o: &mut [f32]) {
    assert!(values.len() >= p.len() * hd && o.len() == hd);
    simd_dispatch!(
        k,
        weighted_avx512(values, hd, p, inv, o),
        weighted_avx2(values, hd, p, inv, o),
        weighted_scalar(values, hd, p, inv, o)
    )
}

/// The softmax weights of `invs.len()` heads over the same keys: head `h`'s are
/// `p[h·stride ..][..n]`, to be scaled by `invs[h]` (one over their sum).
pub struct GroupProbs<'a> {
    pub p: &'a [f32],
    pub stride: usize,
    pub n: usize,
    pub invs: &'a [f32],
}

/// [`weighted_values`] of the heads of `w` sharing this KV head, head `h`'s output into
/// `outs[h·hd ..][..hd]`. The same values, bit for bit; on AVX-512 (for 2 to 6 heads) and
/// AVX2 (in chunks of up to 4 heads), each value vector once loaded meets every head (in
/// dimension chunks that keep all heads' accumulators in registers).
pub fn weighted_values_group(
    k: Kernel,
    values: &[f32],
    hd: usize,
    w: &GroupProbs,
    outs: &mut [f32],
) {
    let (g, n) = (w.invs.len(), w.n);
    assert!(values.len() >= n * hd && outs.len() == g * hd && w.stride >= n);
    assert!(w.p.len() >= g.saturating_sub(1) * w.stride + n);
    #[cfg(target_arch = "x86_64")]
    if matches!(super::vmath::level(k), super::vmath::Level::Avx512) {
        let mut run = |f: GroupWeighted| {
            // SAFETY: AVX-512 F is present (`level` checked it); lengths checked above.
            unsafe { f(values, hd, w, outs) }
        };
        match g {
            2 => return run(weighted_group_avx512::<2, 4>),
            3 => return run(weighted_group_avx512::<3, 4>),
            4 => return run(weighted_group_avx512::<4, 2>),
            5 => return run(weighted_group_avx512::<5, 2>),
            6 => return run(weighted_group_avx512::<6, 2>),
            _ => {}
        }
    }
    #[cfg(target_arch = "x86_64")]
    if matches!(super::vmath::level(k), super::vmath::Level::Avx2) && g >= 2 {
        for (h0, c) in avx2_head_chunks(g) {
            let f: GroupWeighted = match c {
                2 => weighted_group_avx2::<2>,
                3 => weighted_group_avx2::<3>,
                4 => weighted_group_avx2::<4>,
                _ => weighted_group_avx2::<1>,
            };
            let part = GroupProbs {
                p: &w.p[h0 * w.stride..],
                stride: w.stride,
                n,
                invs: &w.invs[h0..h0 + c],
            };
            // SAFETY: AVX2 and FMA are present (`level` checked them); the lengths hold
            // as checked above for the whole group.
            unsafe { f(values, hd, &part, &mut outs[h0 * hd..(h0 + c) * hd]) };
        }
        return;
    }
    for (h, o) in outs.chunks_exact_mut(hd.max(1)).enumerate().take(g) {
        let ph = &w.p[h * w.stride..h * w.stride + n];
        weighted_values(k, values, hd, ph, w.invs[h], o);
    }
}

/// The signature of [`weighted_group_avx512`] and [`weighted_group_avx2`].
#[cfg(target_arch = "x86_64")]
type GroupWeighted = unsafe fn(&[f32], usize, &GroupProbs, &mut [f32]);

/// `G` heads over dimension chunks of `16·V`: for every lane the operations of
/// [`weighted_avx512`] (even and odd keys in their own accumulators, in key order, then
/// `(even + odd)·inv`).
///
/// # Safety
/// AVX-512 F; lengths as [`weighted_values_group`] checked, `w.invs.len() == G`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
#[allow(clippy::needless_range_loop)]
unsafe fn weighted_group_avx512<const G: usize, const V: usize>(
    values: &[f32],
    hd: usize,
    w: &GroupProbs,
    outs: &mut [f32],
) {
    let (n, pstride, invs) = (w.n, w.stride, w.invs);
    let (vp, pp, op) = (values.as_ptr(), w.p.as_ptr(), outs.as_mut_ptr());
    for d0 in (0..hd).step_by(16 * V) {
        let masks: [__mmask16; V] = std::array::from_fn(|i| {
            let len = hd.saturating_sub(d0 + 16 * i).min(16);
            ((1u32 << len) - 1) as u16
        });
        let mut even = [[_mm512_setzero_ps(); V]; G];
        let mut odd = [[_mm512_setzero_ps(); V]; G];
        let mut j = 0;
        while j + 2 <= n {
            let v0: [__m512; V] = std::array::from_fn(|i| {
                _mm512_maskz_loadu_ps(masks[i], vp.add(j * hd + d0 + 16 * i))
            });
            let v1: [__m512; V] = std::array::from_fn(|i| {
                _mm512_maskz_loadu_ps(masks[i], vp.add((j + 1) * hd + d0 + 16 * i))
            });
            for h in 0..G {
                let w0 = _mm512_set1_ps(*pp.add(h * pstride + j));
                let w1 = _mm512_set1_ps(*pp.add(h * pstride + j + 1));
                for i in 0..V {
                    even[h][i] = _mm512_fmadd_ps(w0, v0[i], even[h][i]);
                    odd[h][i] = _mm512_fmadd_ps(w1, v1[i], odd[h][i]);
                }
            }
            j += 2;
        }
        if j < n {
            let v0: [__m512; V] = std::array::from_fn(|i| {
                _mm512_maskz_loadu_ps(masks[i], vp.add(j * hd + d0 + 16 * i))
            });
            for h in 0..G {
                let w0 = _mm512_set1_ps(*pp.add(h * pstride + j));
                for i in 0..V {
                    even[h][i] = _mm512_fmadd_ps(w0, v0[i], even[h][i]);
                }
            }
        }
        for h in 0..G {
            let s = _mm512_set1_ps(*invs.get_unchecked(h));
            for i in 0..V {
                let r = _mm512_mul_ps(_mm512_add_ps(even[h][i], odd[h][i]), s);
                _mm512_mask_storeu_ps(op.add(h * hd + d0 + 16 * i), masks[i], r);
            }
        }
    }
}

/// [`weighted_avx2`] for `G` heads over the same keys, 8 dimensions at a time: each value
/// vector, once loaded, meets every head. For every lane the operations of
/// [`weighted_avx2`] (even and odd keys in their own accumulators, in key order, then
/// `(even + odd)·inv`), and its scalar tail of fewer than 8 dimensions.
///
/// # Safety
/// AVX2 and FMA; lengths as [`weighted_values_group`] checked, `w.invs.len() == G`,
/// `outs.len() == G·hd`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::needless_range_loop)]
unsafe fn weighted_group_avx2<const G: usize>(
    values: &[f32],
    hd: usize,
    w: &GroupProbs,
    outs: &mut [f32],
) {
    debug_assert!(w.invs.len() == G && outs.len() == G * hd);
    let (n, pstride) = (w.n, w.stride);
    let (vp, pp) = (values.as_ptr(), w.p.as_ptr());
    let vec_dims = hd / 8 * 8;
    for d0 in (0..vec_dims).step_by(8) {
        let mut even = [_mm256_setzero_ps(); G];
        let mut odd = [_mm256_setzero_ps(); G];
        let mut j = 0;
        while j + 2 <= n {
            let v0 = _mm256_loadu_ps(vp.add(j * hd + d0));
            let v1 = _mm256_loadu_ps(vp.add((j + 1) * hd + d0));
            for h in 0..G {
                let w0 = _mm256_set1_ps(*pp.add(h * pstride + j));
                let w1 = _mm256_set1_ps(*pp.add(h * pstride + j + 1));
                even[h] = _mm256_fmadd_ps(w0, v0, even[h]);
                odd[h] = _mm256_fmadd_ps(w1, v1, odd[h]);
            }
            j += 2;
        }
        if j < n {
            let v0 = _mm256_loadu_ps(vp.add(j * hd + d0));
            for h in 0..G {
                let w0 = _mm256_set1_ps(*pp.add(h * pstride + j));
                even[h] = _mm256_fmadd_ps(w0, v0, even[h]);
            }
        }
        for h in 0..G {
            let r = _mm256_mul_ps(_mm256_add_ps(even[h], odd[h]), _mm256_set1_ps(w.invs[h]));
            _mm256_storeu_ps(outs.as_mut_ptr().add(h * hd + d0), r);
        }
    }
    for h in 0..G {
        let ph = &w.p[h * pstride..h * pstride + n];
        for d in vec_dims..hd {
            outs[h * hd + d] = weighted_dim(values, hd, ph, w.invs[h], d);
        }
    }
}

fn weighted_scalar(values: &[f32], hd: usize, p: &[f32], inv: f32, o: &mut [f32]) {
    for (d, o) in o.iter_mut().enumerate() {
        *o = weighted_dim(values, hd, p, inv, d);
    }
}

/// Dimension `d` of [`weighted_values`], in scalar code.
fn weighted_dim(values: &[f32], hd: usize, p: &[f32], inv: f32, d: usize) -> f32 {
    let (mut even, mut odd) = (0f32, 0f32);
    for (j, &w) in p.iter().enumerate() {
        let v = values[j * hd + d];
        if j % 2 == 0 {
            even = w.mul_add(v, even);
        } else {
            odd = w.mul_add(v, odd);
        }
    }
    (even + odd) * inv
}

/// Dimensions in chunks of 64 (four vectors, the last masked), keys two at a time.
///
/// # Safety
/// AVX-512 F; lengths as [`weighted_values`] checked.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
#[allow(clippy::needless_range_loop)]
unsafe fn weighted_avx512(values: &[f32], hd: usize, p: &[f32], inv: f32, o: &mut [f32]) {
    let vp = values.as_ptr();
    let n = p.len();
    for d0 in (0..hd).step_by(64) {
        let masks: [__mmask16; 4] = std::array::from_fn(|i| {
            let lo = d0 + 16 * i;
            let len = hd.saturating_sub(lo).min(16);
            ((1u32 << len) - 1) as u16
        });
        let mut even = [_mm512_setzero_ps(); 4];
        let mut odd = [_mm512_setzero_ps(); 4];
        let mut j = 0;
        while j + 2 <= n {
            let (w0, w1) = (_mm512_set1_ps(p[j]), _mm512_set1_ps(p[j + 1]));
            for i in 0..4 {
                let at = d0 + 16 * i;
                let v0 = _mm512_maskz_loadu_ps(masks[i], vp.add(j * hd + at));
                let v1 = _mm512_maskz_loadu_ps(masks[i], vp.add((j + 1) * hd + at));
                even[i] = _mm512_fmadd_ps(w0, v0, even[i]);
                odd[i] = _mm512_fmadd_ps(w1, v1, odd[i]);
            }
            j += 2;
        }
        if j < n {
            let w0 = _mm512_set1_ps(p[j]);
            for i in 0..4 {
                let v0 = _mm512_maskz_loadu_ps(masks[i], vp.add(j * hd + d0 + 16 * i));
                even[i] = _mm512_fmadd_ps(w0, v0, even[i]);
            }
        }
        let s = _mm512_set1_ps(inv);
        for i in 0..4 {
            let r = _mm512_mul_ps(_mm512_add_ps(even[i], odd[i]), s);
            _mm512_mask_storeu_ps(o.as_mut_ptr().add(d0 + 16 * i), masks[i], r);
        }
    }
}

/// Dimensions in chunks of 32 (four 8-lane vectors), keys two at a time; a tail of fewer
/// than 8 dimensions in scalar code with the same operations.
///
/// # Safety
/// AVX2 and FMA; lengths as [`weighted_values`] checked.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::needless_range_loop)]
unsafe fn weighted_avx2(values: &[f32], hd: usize, p: &[f32], inv: f32, o: &mut [f32]) {
    let vp = values.as_ptr();
    let n = p.len();
    let vec_dims = hd / 8 * 8;
    for d0 in (0..vec_dims).step_by(32) {
        let lanes = ((vec_dims - d0) / 8).min(4);
        let mut even = [_mm256_setzero_ps(); 4];
        let mut odd = [_mm256_setzero_ps(); 4];
        let mut j = 0;
        while j + 2 <= n {
            let (w0, w1) = (_mm256_set1_ps(p[j]), _mm256_set1_ps(p[j + 1]));
            for i in 0..lanes {
                let at = d0 + 8 * i;
                even[i] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(vp.add(j * hd + at)), even[i]);
                odd[i] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(vp.add((j + 1) * hd + at)), odd[i]);
            }
            j += 2;
        }
        if j < n {
            let w0 = _mm256_set1_ps(p[j]);
            for i in 0..lanes {
                let at = d0 + 8 * i;
                even[i] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(vp.add(j * hd + at)), even[i]);
            }
        }
        let s = _mm256_set1_ps(inv);
        for i in 0..lanes {
            let r = _mm256_mul_ps(_mm256_add_ps(even[i], odd[i]), s);
            _mm256_storeu_ps(o.as_mut_ptr().add(d0 + 8 * i), r);
        }
    }
    for d in vec_dims..hd {
        o[d] = weighted_dim(values, hd, p, inv, d);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rng(seed: u64) -> impl FnMut() -> f32 {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        }
    }

    /// The scores of a group of heads equal each head's own, bit for bit, at every level,
    /// group size (the AVX-512 path takes 2..=8, others fall back) and odd tile count.
    #[test]
    fn grouped_scores_equal_each_heads() {
        for hd in [24usize, 40, 64, 96] {
            let mut r = rng(7 * hd as u64);
            let tiles_n = 6;
            let tiles: Vec<f32> = (0..tiles_n * hd * KEY_TILE).map(|_| r() * 3.0).collect();
            for g in 1..=9 {
                let qs: Vec<f32> = (0..g * hd).map(|_| r()).collect();
                for (b0, b1) in [(0, tiles_n), (1, tiles_n), (2, 5), (3, 4), (2, 2)] {
                    let n = b1 - b0;
                    let stride = n * KEY_TILE + 16;
                    for k in Kernel::available() {
                        let mut got = vec![f32::NAN; g * stride];
                        scores_group(k, &tiles, hd, &qs, g, b0, b1, &mut got, stride);
                        for (h, q) in qs.chunks_exact(hd).enumerate() {
                            let mut want = vec![f32::NAN; n * KEY_TILE];
                            scores(k, &tiles, hd, q, b0, b1, &mut want);
                            let row = &got[h * stride..h * stride + n * KEY_TILE];
                            let bits =
                                |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                            assert_eq!(bits(row), bits(&want), "hd {hd} g {g} {b0}..{b1} {k:?}");
                        }
                    }
                }
            }
        }
    }

    /// The weighted values of a group of heads equal each head's own, bit for bit, at every
    /// level, group size and odd or even key count.
    #[test]
    fn grouped_weighted_values_equal_each_heads() {
        for hd in [24usize, 40, 64, 96, 200] {
            let mut r = rng(11 * hd as u64);
            let keys = 37;
            let values: Vec<f32> = (0..keys * hd).map(|_| r()).collect();
            for g in 1..=8 {
                let pstride = keys + 5;
                let p: Vec<f32> = (0..g * pstride).map(|_| r().abs()).collect();
                let invs: Vec<f32> = (0..g).map(|_| 0.5 + r().abs()).collect();
                for n in [1, 2, 17, 36, 37] {
                    for k in Kernel::available() {
                        let mut got = vec![f32::NAN; g * hd];
                        let w = GroupProbs {
                            p: &p,
                            stride: pstride,
                            n,
                            invs: &invs,
                        };
                        weighted_values_group(k, &values, hd, &w, &mut got);
                        for (h, o) in got.chunks_exact(hd).enumerate() {
                            let mut want = vec![f32::NAN; hd];
                            let ph = &p[h * pstride..h * pstride + n];
                            weighted_values(k, &values, hd, ph, invs[h], &mut want);
                            let bits =
                                |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                            assert_eq!(bits(o), bits(&want), "hd {hd} g {g} n {n} {k:?}");
                        }
                    }
                }
            }
        }
    }

    /// Every level against the scalar one, bit for bit, at head sizes that are not powers
    /// of two and spans that start and end inside tiles.
    #[test]
    fn every_level_agrees_with_scalar_bit_for_bit() {
        for hd in [24usize, 40, 64, 72, 80, 128, 200] {
            let mut r = rng(hd as u64);
            let tiles_n = 7;
            let tiles: Vec<f32> = (0..tiles_n * hd * KEY_TILE).map(|_| r() * 3.0).collect();
            let q: Vec<f32> = (0..hd).map(|_| r()).collect();
            let values: Vec<f32> = (0..tiles_n * KEY_TILE * hd).map(|_| r()).collect();
            let mut want = None;
            for k in Kernel::available() {
                let mut out = vec![f32::NAN; tiles_n * KEY_TILE];
                scores(k, &tiles, hd, &q, 1, tiles_n, &mut out);
                let n = (tiles_n - 1) * KEY_TILE - 5;
                let s = &mut out[3..3 + n];
                let max = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let sum = softmax_exp(k, s, max);
                let mut o = vec![f32::NAN; hd];
                weighted_values(k, &values[hd..], hd, s, 1.0 / sum, &mut o);
                let got: Vec<u32> = out.iter().chain(&o).map(|v| v.to_bits()).collect();
                match &want {
                    None => want = Some(got),
                    Some(w) => assert_eq!(&got, w, "hd {hd}: {k:?} differs from scalar"),
                }
            }
        }
    }

    /// The kernels against a plain f64 attention.
    #[test]
    fn attention_matches_f64() {
        for hd in [40usize, 64] {
            let mut r = rng(7 + hd as u64);
            let n = 37;
            let keys: Vec<Vec<f32>> = (0..n)
                .map(|_| (0..hd).map(|_| r() * 2.0).collect())
                .collect();
            let vals: Vec<f32> = (0..n * hd).map(|_| r()).collect();
            let q: Vec<f32> = (0..hd).map(|_| r()).collect();
            let tn = n.div_ceil(KEY_TILE);
            let mut tiles = vec![0f32; tn * hd * KEY_TILE];
            for (p, key) in keys.iter().enumerate() {
                for (d, &v) in key.iter().enumerate() {
                    tiles[(p / KEY_TILE * hd + d) * KEY_TILE + p % KEY_TILE] = v;
                }
            }
            let s: Vec<f64> = keys
                .iter()
                .map(|key| key.iter().zip(&q).map(|(&a, &b)| a as f64 * b as f64).sum())
                .collect();
            let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = s.iter().map(|v| (v - m).exp()).collect();
            let z: f64 = e.iter().sum();
            for k in Kernel::available() {
                let mut out = vec![0f32; tn * KEY_TILE];
                scores(k, &tiles, hd, &q, 0, tn, &mut out);
                let sc = &mut out[..n];
                for (a, b) in sc.iter().zip(&s) {
                    assert!((*a as f64 - b).abs() < 1e-4, "{k:?} score {a} vs {b}");
                }
                let max = sc.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let sum = softmax_exp(k, sc, max);
                let mut o = vec![0f32; hd];
                weighted_values(k, &vals, hd, sc, 1.0 / sum, &mut o);
                for d in 0..hd {
                    let want: f64 = (0..n).map(|j| e[j] / z * vals[j * hd + d] as f64).sum();
                    assert!(
                        (o[d] as f64 - want).abs() < 1e-5,
                        "{k:?} hd {hd} dim {d}: {} vs {want}",
                        o[d]
                    );
                }
            }
        }
    }
}
