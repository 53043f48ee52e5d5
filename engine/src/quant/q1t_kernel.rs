//! Products over `q1t` weights (ternary, 1.58 bits): the matrix-vector (decode) and
//! matrix-matrix (prefill) kernels [`super::matrix`] runs for this dtype.
//!
//! ```text
//! row r: cols/32 tiles [f16 s][7 bytes]; weight k of a tile: code (byte[k/5] / 3^(k%5)) % 3
//!        → 0, +s, −s (byte 6 holds codes 30 and 31; bytes 243..=255 decode by the formula)
//! then   u32 row_ptr[rows+1], entries [u16 col][f16 value]: the value replaces the element
//! ```
//!
//! # How
//!
//! Base weights are decoded from the tiles in registers, never into a scratch row, by
//! base-3 digit extraction; the overlay is applied afterwards per row as the correction
//! `(value − base)·x[col]` (an entry shadowed by a later one of the same element is
//! skipped: later wins, as in [`super::decode`]).
//!
//! - [`Precision::Exact`](super::matrix::Precision::Exact) (f32 activations): [`Q1tRows`]
//!   decodes a tile to its 32 f32 weights and runs the shared f32 loops of
//!   [`super::kernel`]. The digit of weight `k` is `((b·⌈2¹⁶/3^(a+1)⌉) mod 2¹⁶)·3 >> 16`
//!   for `b = byte[k/5]`, `a = k%5` — two 16-bit multiplies per 32 codes, exact for all
//!   256 byte values — and `vpermps` turns the digits into `{0, s, −s}` with a 3-entry
//!   table built per tile.
//! - [`Precision::Fast`](super::matrix::Precision::Fast) and
//!   [`Precision::Balanced`](super::matrix::Precision::Balanced) (activations int8 per
//!   group of 32, one level or two, as for `q8`/`q4`): on AVX-512 with VBMI and VNNI, a
//!   *digit-major* kernel. Eight tiles at a time, the 7 code bytes of each tile are
//!   gathered into one 64-byte vector (a lane per byte, 8 per tile), and each of the 5
//!   digit positions is looked up for all 64 bytes at once: `b = 81·q + r` by two byte
//!   compares and masked subtracts, digits 0..3 from a 128-entry byte table of `r` each
//!   (one `vpermi2b`), digit 4 from `q`: 4 permutes per 256 weights, against 16
//!   multiplies + 8 byte permutes by arithmetic (a 256-entry table per digit, two
//!   `vpermi2b` each, measured 25 % slower). The tables give `code + 1 ∈ {0,1,2}`, which
//!   `vpdpbusd` multiplies with the activations laid out in the same digit-major order
//!   ([`DmActs`], built once per thread from the quantized activations); the
//!   activations' `−Σx` per 4-byte lane starts each dot, so `Σ(code + 1)·x − Σx = Σ code·x`.
//!   Two rows whose last step holds at most 4 tiles run that step in one vector.
//!   Prefetches run 3 KiB ahead in the tiles and 4 KiB in the overlay.
//!   `Balanced` lays out the residual codes `q₂` the same way and runs the same five
//!   `vpdpbusd` over them with the same digit vectors, combining the two lane sums as the
//!   shared kernels do, `(dot << SPLIT_SHIFT) + dot₂`, exact in integers (a lane sums 20
//!   codes: below 2²⁰). The digit lookups, the loads of the weights and the scales are
//!   shared, so the second level costs five multiply-adds and loads per token and step.
//!   At the AVX2 level the same layout runs in halves: 4 tiles per 32-byte vector (two
//!   16-byte loads, one `vpshufb`), the digits found without a multiply or a 128-entry
//!   table (`vpshufb` looks up 16): `r = b mod 81`, `r mod 27`, `r mod 9` by pairs of
//!   unsigned `min(x, x − k)`, each digit looked up from the low nibble of the multiple
//!   subtracted (`dm2_digits`, 21 operations per 160 digits), then five `vpmaddubsw` per
//!   level into int16 and one `vpmaddwd`. Balanced tokens have one scale, applied per
//!   row at the end, and the two levels' `−Σx` come combined. Measured against the
//!   shared integer kernel it replaced (paired, `CORTIQ_SIMD=avx2` on the Zen 5 VM):
//!   Qwen2.5-0.5B decode 1.18×, SmolLM2 1.10×; two rows sharing the activation loads
//!   ran 0.95 and 0.90 (16 vector registers: the second row's digits spill).
//!   Elsewhere (scalar, AVX-512 without VBMI/VNNI) the codes are extracted as
//!   int8 by the multiplies above and run through the shared integer kernel, which
//!   handles both levels itself. Its AVX2 two-level loop takes int16 codes, which come
//!   from one multiply and two compares per 16 (`codes_i16`): Zen 2 has one vector
//!   multiplier, and the second multiply of the digit took it from the dot.
//!
//! A matrix repacked at load into 2-bit codes ([`super::q1t_planes`]: by default at the
//! AVX2 and AVX-512 VBMI + VNNI levels) runs the same row loop with a *planes* step
//! instead of
//! the digit-major one (`pl_step`: one 64-byte load per row and 8 tiles, a shift and a
//! mask per plane, four `vpdpbusd` per level against the activations in the same four
//! planes, [`DmLevel::push_planes`]); the overlay's index and entries are then copied
//! too, and every other path (exact, the prefill panels, row decode) reads the repacked
//! rows, so the file's payload stays unread. Measured on the Zen 4 VM (2 threads, paired
//! against the digit-major build, `scripts/ab-bench.py`): Qwen2.5-Coder-0.5B decode
//! 1.185×, SmolLM2-135M 1.034× (its 576-column rows spend most of their time outside the
//! steps: overlay, reduction, row set-up); in cache, one core, 1536×576 1.09–1.25× and
//! 576×1536 1.23–1.52×. Other matrices keep the digit-major kernel.
//! On AVX2 the planes step (`pl2_rows`) takes half a step (4 tiles, one 32-byte load of
//! words per row) with `vpmaddubsw` for `vpdpbusd`, two rows at a time (independent
//! chains; their last half steps of at most 2 tiles share one vector, SmolLM2's 576
//! columns ending so), and the AVX2 rows' overlays run 8 entries per gather
//! (`overlay_avx2`): the scalar loop over 8 padded slots had been a fifth of a SmolLM2
//! decode's kernel time. Zen 3 VM, paired: decode 1.52× (SmolLM2) and 1.64× (Qwen2.5) the
//! digit-major build before; in cache, one core, 1536×576 0.74× the time of the
//! one-row version.
//!
//! Why not lookup tables of partial sums (T-MAC / bitnet.cpp)? They were measured (one
//! core of the 2-core AVX-512 VM this was written on, SPR, busy with other builds, so
//! the ratios matter more than the values; Gweights/s, 48 MiB of weights cycled):
//!
//! | kernel (`rows × cols`)                          | 1536×576 | 576×1536 | 4864×896 | 896×4864 |
//! |-------------------------------------------------|---------:|---------:|---------:|---------:|
//! | f32 table `LUT[chunk][byte]`, AVX-512 gather     |  6.7     |  4.3     |  3.5     |  5.3     |
//! | same, 64 rows per table block (L1 reuse)         |  6.5     |  4.2     |  3.1     |  4.0     |
//! | digits by multiplies → f32 FMA (this `Exact`)    |  8.8     |  8.2     |  4.7–6.7 |  7.9     |
//! | digits by multiplies → int8 `vpdpbusd`           |  5.9     |  7.8     |  6.7     |  9.1     |
//! | digit-major byte tables → `vpdpbusd` (`Fast`)    |  6.6     | 10.7     |  8.8     | 12.9     |
//!
//! With the tile layout the bytes of one row sit side by side, so every lane of a vector
//! needs its own table (the tables of a row's 5-weight chunks): only a gather can look
//! them up, at 16 loads per 16 bytes, and the tables (7 KiB per 32 columns in f32, built
//! per token) outgrow L1 from 224 columns on. T-MAC avoids both by interleaving rows so
//! that one in-register table serves all lanes; that needs a repacked copy of the
//! weights. Digit extraction reads each byte once and keeps everything in registers.
//!
//! Numerics: `Exact` uses each base weight exactly as decoded (`±s` or 0), so it equals
//! dequantize-then-f32-dot up to f32 rounding (the overlay correction adds two roundings
//! per entry). `Fast` sums exact integer group dots (`|Σ| ≤ 32·127`) times `s·d` in f32;
//! its overlay correction uses the dequantized activations `q·d`, like the base.
//! `Balanced` is the same over `x̂ = (256·q + q₂)·d'` (`d' = d/256`, exact in f32), so it
//! equals `Σ w·x̂` up to the same f32 rounding. For a
//! given [`Kernel`], a (row, token) value does not depend on how many rows or tokens
//! share a block, so `matmul` equals `t` `matvec`s bit for bit — except where a
//! `Balanced` product of [`super::panel::Q1T_MIN_TOKENS`] tokens or more runs in the packed
//! panels of [`super::panel`] (AVX-512 VNNI or AVX2, prefill): they decode each tile's digits once per product and add the
//! same exact group terms, and the overlay's, in another order, within the same bound.
//!
//! Threads and memory: rows are split over the rayon pool like the other dtypes; `Exact`
//! needs no buffer, and the integer paths' digit-major activations live in a per-thread buffer
//! (grown once, see [`reserve_thread`]) rebuilt only when the quantized activations
//! change (compared by content), so the parts of a fused product (q/k/v) share it.
//! A scale of ±∞ is the one place the correction differs from decoding: `∞ − ∞`.

use std::cell::RefCell;
use std::ops::Range;

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use rayon::prelude::*;

use super::kernel::{
    self, array_of, h2f_scalar, le16, IntRowsScalar, Kernel, QToken, QuantizedActs,
};
use super::kernel::{RowsScalar, SPLIT_SHIFT, STEP};
// Rows and tokens per register tile, as in `matrix`.
use super::arena::Slab;
use super::matrix::{consecutive_rows, matmul_split, matvec_chunk, Out, BLOCK_ROWS, BLOCK_TOKENS};
use super::q1::{validate_q1t, Q1T_ENTRY, Q1T_TILE};
use super::q1t_planes::{Q1tPlaneRows, Q1tPlanes};
use super::Geom;

/// Bytes a SIMD load may read past a row's last tile (16 bytes from a 9-byte tile's
/// start). Every payload has them: `row_ptr` (at least 8 bytes) follows the tiles.
const SLACK: usize = 7;
/// How far ahead of each row's current step the digit-major kernel prefetches its tiles
/// (3 KiB, a dozen 896-column rows). DRAM latency needs it: at 768 bytes, Qwen2.5-0.5B's
/// decode ran 20% slower, half the speed of the same kernel on warm caches. Two lines per
/// step (the step reads 72 bytes), so that no line of the stream goes unprefetched.
const TILES_AHEAD: usize = 3072;
/// How far ahead the digit-major kernel prefetches the overlay's entries (and their
/// corrections, a quarter as far in f32), a couple of hundred rows: each row reads a few
/// of them, so the streams move slowly and cross pages the hardware does not prefetch
/// across (measured +2%).
const OVERLAY_AHEAD: usize = 4096;
/// Rows of a task prefetched before it starts (the kernels then prefetch two blocks of
/// rows ahead).
const PREFETCH_ROWS: usize = 2 * BLOCK_ROWS;
/// Powers of 3, the digit weights of a byte.
const POW3: [usize; 5] = [1, 3, 9, 27, 81];

/// `⌈2¹⁶ / 3^(a+1)⌉`: for every byte `b`, `((b·DIV[a]) mod 2¹⁶)·3 >> 16` is its digit `a`,
/// `(b / 3^a) % 3`. (`b·DIV[a] = 2¹⁶·b/3^(a+1) + b·δ` with `b·δ < 2¹⁶/3⁵`, so the low
/// 16 bits are `2¹⁶·frac(b/3^(a+1))` plus less than `3·255/2¹⁶` of a digit; checked for
/// all 256 bytes by the tests.)
pub(super) const DIV: [u16; 5] = [21846, 7282, 2428, 810, 270];

/// The little-endian `u32` at `bytes[at..]`.
#[inline(always)]
fn le32(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap())
}

/// Digit `a` of byte `b`: the spec's formula.
#[inline(always)]
fn trit(b: u8, a: usize) -> usize {
    (b as usize / POW3[a]) % 3
}

// ---- the overlay ---------------------------------------------------------------------------

/// What a `q1t` matrix's overlay needs at product time, computed once at load
/// ([`super::matrix::Matrix::new`]): where it lies, and per entry the correction factor
/// `value − base`, so that a product adds `Σ delta·x[col]` per row without decoding the
/// base weights under the entries again (that decoding, per token, doubled the
/// instructions of a decode step at the default 0.5 % of entries). 4 bytes per entry,
/// about 0.02 bytes per weight at that density (the file holds 0.3). A matrix repacked at
/// load needs no corrections ([`Q1tOverlay::own`]): there the base under an entry is 0.
#[derive(Clone, Debug)]
pub(crate) struct Q1tOverlay {
    /// The matrix's geometry.
    g: Geom,
    /// Byte offset of `row_ptr`.
    row_ptr: usize,
    /// Byte offset of the entries.
    entries: usize,
    /// Entries in the overlay.
    count: usize,
    /// Per entry: `value − base` in f32, or 0 when a later entry of the same row and
    /// column overrides it (the spec allows repeats, the later wins, as for `q1s`).
    /// Computed at load for a matrix the model multiplies, at its first product for a cold
    /// one (a skill's replacement, an untied embedding: computing them reads every page
    /// of the tiles with entries, and their 4 bytes an entry stay), never with `owned`.
    /// Shared by clones (a tied head).
    delta: std::sync::Arc<std::sync::OnceLock<Vec<f32>>>,
    /// With repacked rows ([`Q1tPlanes`], the codes under the entries cleared): `row_ptr`
    /// and the entries copied into huge pages ([`super::arena`]), so that nothing reads the
    /// payload after load (its pages can go, see `Matrix::payload_unread`) and the
    /// overlay's streams do not walk 4 KiB pages; `delta` is then not computed
    /// ([`OvRow`]).
    owned: Option<std::sync::Arc<OwnedOverlay>>,
}

/// [`Q1tOverlay`]'s copy: `[u32 row_ptr; rows + 1]` (indexing the copy's entries from 0),
/// then the entries (`4·count` bytes, the shadowed ones' values 0), in one slab.
#[derive(Debug)]
struct OwnedOverlay {
    mem: Slab,
    rows: usize,
    count: usize,
}

impl OwnedOverlay {
    #[inline(always)]
    fn ptr(&self) -> &[u32] {
        let b = &self.mem.bytes()[..4 * (self.rows + 1)];
        // SAFETY: a slab is 8-aligned; these are `rows + 1` words of it.
        unsafe { std::slice::from_raw_parts(b.as_ptr() as *const u32, self.rows + 1) }
    }

    #[inline(always)]
    fn entries(&self) -> &[u8] {
        let at = 4 * (self.rows + 1);
        &self.mem.bytes()[at..at + Q1T_ENTRY * self.count]
    }
}

impl Q1tOverlay {
    /// Validates a `q1t` payload, and with `eager` computes its entries' corrections now
    /// (else at first use): O(entries + cols).
    pub(crate) fn new(g: Geom, bytes: &[u8], eager: bool) -> Result<Q1tOverlay, String> {
        let l = validate_q1t(g, bytes)?;
        let ov = Q1tOverlay {
            g,
            row_ptr: l.row_ptr,
            entries: l.entries,
            count: l.count,
            delta: Default::default(),
            owned: None,
        };
        if eager {
            ov.deltas(bytes);
        }
        Ok(ov)
    }

    /// Whether the entries' corrections have been computed (tests).
    #[cfg(test)]
    pub(crate) fn deltas_computed(&self) -> bool {
        self.delta.get().is_some()
    }

    /// The entries' corrections, computed on first use.
    #[inline(always)]
    fn deltas(&self, bytes: &[u8]) -> &[f32] {
        self.delta.get_or_init(|| self.compute_deltas(bytes))
    }

    #[cold]
    fn compute_deltas(&self, bytes: &[u8]) -> Vec<f32> {
        let g = self.g;
        let mut delta = vec![0.0; self.count];
        let ents = &bytes[self.entries..self.entries + Q1T_ENTRY * self.count];
        // The row's view, made once per row that has entries.
        let mut row: Option<(usize, Q1tRows<1>)> = None;
        self.walk(bytes, ents, |r, e, col, shadowed| {
            let at = e * Q1T_ENTRY;
            let d = match &row {
                Some((at_row, d)) if *at_row == r => d,
                _ => &row.insert((r, Q1tRows::<1>::new_at(g, bytes, [r]))).1,
            };
            // The one base weight under the entry (decoding its whole tile, per entry, took
            // 0.4 s of Qwen2.5-0.5B's load).
            let base = base_weight(d.tile(0, col / STEP), col % STEP);
            delta[e] = h2f_scalar(le16(ents, at + 2)) - base;
            if let Some(s) = shadowed {
                delta[s] = 0.0;
            }
        });
        delta
    }

    /// Walks the entries `ents` (the payload's, or a copy of them) row by row in file
    /// order: `f(row, entry, col, shadowed)`, `shadowed` the earlier entry of the same row
    /// and column that this one overrides (the spec's later wins). O(entries + cols).
    fn walk(
        &self,
        bytes: &[u8],
        ents: &[u8],
        mut f: impl FnMut(usize, usize, usize, Option<usize>),
    ) {
        // Per column: (row + 1, entry) of the last entry seen in that column.
        let mut last = vec![(0usize, 0usize); if self.count > 1 { self.g.cols } else { 0 }];
        for r in 0..self.g.rows {
            for e in self.range(bytes, r) {
                let col = le16(ents, e * Q1T_ENTRY) as usize;
                let mut shadowed = None;
                if let Some(seen) = last.get_mut(col) {
                    if seen.0 == r + 1 {
                        shadowed = Some(seen.1);
                    }
                    *seen = (r + 1, e);
                }
                f(r, e, col, shadowed);
            }
        }
    }

    /// Copies `row_ptr` and the entries into huge pages for a matrix whose rows are
    /// repacked into `planes` (then nothing reads the payload again), and sets the base
    /// code under every entry to 0 in `planes`: each entry then adds its own value, and a
    /// shadowed entry (a later one of its row and column wins) has its value set to 0 in
    /// the copy. The f32 corrections go: 4 bytes an entry less in memory and in each
    /// token's stream (Qwen2.5-Coder-0.5B: 12 MiB of 3.2 M entries).
    pub(crate) fn own(&mut self, bytes: &[u8], planes: &mut Q1tPlanes) {
        let (rows, count) = (self.g.rows, self.count);
        let (np, ne) = (4 * (rows + 1), Q1T_ENTRY * count);
        let mut mem = super::arena::alloc(np + ne);
        let b = mem.bytes_mut();
        b[..np].copy_from_slice(&bytes[self.row_ptr..self.row_ptr + np]);
        // `row_ptr` counts entries from the first (validated: `row_ptr[0] = 0`).
        let ents = &mut b[np..np + ne];
        ents.copy_from_slice(&bytes[self.entries..self.entries + ne]);
        let mut shadows = Vec::new();
        self.walk(bytes, ents, |r, _, col, shadowed| {
            planes.clear_code(r, col);
            shadows.extend(shadowed);
        });
        for s in shadows {
            ents[s * Q1T_ENTRY + 2..(s + 1) * Q1T_ENTRY].fill(0);
        }
        self.owned = Some(std::sync::Arc::new(OwnedOverlay { mem, rows, count }));
    }

    /// Bytes of the copy of `row_ptr` and the entries that a repacked matrix's products
    /// read ([`Q1tOverlay::own`]), or `None` while they read the payload's.
    pub(crate) fn owned_bytes(&self) -> Option<usize> {
        self.owned.as_ref().map(|o| o.mem.bytes().len())
    }

    /// Entries of row `r` (a validated payload).
    #[inline(always)]
    fn range(&self, bytes: &[u8], r: usize) -> Range<usize> {
        if let Some(o) = &self.owned {
            let ptr = o.ptr();
            return ptr[r] as usize..ptr[r + 1] as usize;
        }
        let at = self.row_ptr + 4 * r;
        le32(bytes, at) as usize..le32(bytes, at + 4) as usize
    }

    /// Row `r`'s entries and what each adds ([`OvRow`]).
    #[inline(always)]
    pub(super) fn row<'b>(&'b self, bytes: &'b [u8], r: usize) -> OvRow<'b> {
        let es = self.range(bytes, r);
        match &self.owned {
            Some(o) => OvRow {
                ent: &o.entries()[es.start * Q1T_ENTRY..es.end * Q1T_ENTRY],
                delta: None,
            },
            None => OvRow {
                ent: &bytes[self.entries + es.start * Q1T_ENTRY..self.entries + es.end * Q1T_ENTRY],
                delta: Some(&self.deltas(bytes)[es]),
            },
        }
    }

    /// Writes row `r`'s entries over its decoded base weights `out` (later entries win).
    pub(super) fn write_row(&self, bytes: &[u8], r: usize, out: &mut [f32]) {
        for e in self.row(bytes, r).ent.chunks_exact(Q1T_ENTRY) {
            out[le16(e, 0) as usize] = h2f_scalar(le16(e, 2));
        }
    }

    /// Adds row `r`'s overlay corrections `delta·x[col]` to `out[j]` for each activation
    /// `xs[j]`, entries in file order.
    #[inline(always)]
    fn correct<A: ActAt, const T: usize>(
        &self,
        bytes: &[u8],
        r: usize,
        xs: &[A; T],
        out: &mut [f32; T],
    ) {
        let row = self.row(bytes, r);
        for i in 0..row.len() {
            let (col, delta) = row.get(i);
            for (o, x) in out.iter_mut().zip(xs) {
                *o += delta * x.at(col);
            }
        }
    }
}

/// One row's overlay as the products read it: per entry a column and what the entry adds
/// per unit of the activation there (`delta`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct OvRow<'a> {
    /// The entries, `[u16 col][f16 value]` each.
    pub ent: &'a [u8],
    /// Per entry `value − base` (the base weight under it, as the file's tiles hold it);
    /// `None` where the base is 0 (rows repacked with those codes cleared,
    /// [`Q1tOverlay::own`]): then the entry's own value is what it adds (0 for a shadowed
    /// one).
    pub delta: Option<&'a [f32]>,
}

impl<'a> OvRow<'a> {
    /// No entries.
    pub const EMPTY: OvRow<'static> = OvRow {
        ent: &[],
        delta: Some(&[]),
    };

    /// Entries in the row.
    #[inline(always)]
    pub fn len(&self) -> usize {
        self.ent.len() / Q1T_ENTRY
    }

    /// Whether the row has no entries.
    #[inline(always)]
    pub fn is_empty(&self) -> bool {
        self.ent.is_empty()
    }

    /// Entry `i`'s column and `delta`.
    #[inline(always)]
    pub fn get(&self, i: usize) -> (usize, f32) {
        let e = &self.ent[i * Q1T_ENTRY..(i + 1) * Q1T_ENTRY];
        let delta = match self.delta {
            Some(d) => d[i],
            None => h2f_scalar(le16(e, 2)),
        };
        (le16(e, 0) as usize, delta)
    }
}

/// Activation `col` of one token, as the overlay correction multiplies it.
trait ActAt {
    fn at(&self, col: usize) -> f32;
}

impl ActAt for &[f32] {
    #[inline(always)]
    fn at(&self, col: usize) -> f32 {
        self[col]
    }
}

impl ActAt for QToken<'_> {
    /// The dequantized activation `q·d`, or `(256·q + q₂)·d` with the residual level (`d`
    /// is then the scale over 256): what the integer base product multiplies.
    #[inline(always)]
    fn at(&self, col: usize) -> f32 {
        let q = self.q[col] as i32;
        let v = if self.split() {
            (q << SPLIT_SHIFT) + self.q2[col] as i32
        } else {
            q
        };
        v as f32 * self.d[col / STEP]
    }
}

// ---- a block of rows, for the shared loops ------------------------------------------------

/// `R` rows of a validated `q1t` payload as the shared f32 and integer loops of
/// [`super::kernel`] read them: each row's `cols/32` tiles of 9 bytes, contiguous, and
/// the [`SLACK`] bytes after them (which SIMD loads may read, never use).
pub(crate) struct Q1tRows<'a, const R: usize> {
    tiles: [&'a [u8]; R],
    cols: usize,
}

impl<'a, const R: usize> Q1tRows<'a, R> {
    /// Rows `rs` (any `R` rows) of a validated payload.
    #[inline(always)]
    pub fn new_at(g: Geom, bytes: &'a [u8], rs: [usize; R]) -> Self {
        let rb = g.cols / STEP * Q1T_TILE;
        Q1tRows {
            tiles: std::array::from_fn(|i| &bytes[rs[i] * rb..(rs[i] + 1) * rb + SLACK]),
            cols: g.cols,
        }
    }

    /// Tile `blk` of row `i`.
    #[inline(always)]
    fn tile(&self, i: usize, blk: usize) -> &[u8] {
        &self.tiles[i][blk * Q1T_TILE..(blk + 1) * Q1T_TILE]
    }
}

/// Base weight `k` of tile `t`: `0`, `+s` or `−s` by its digit.
#[inline(always)]
fn base_weight(t: &[u8], k: usize) -> f32 {
    let s = h2f_scalar(le16(t, 0));
    [0.0, s, -s][trit(t[2 + k / 5], k % 5)]
}

impl<const R: usize> RowsScalar for Q1tRows<'_, R> {
    fn cols(&self) -> usize {
        self.cols
    }

    fn decode32(&self, i: usize, blk: usize, out: &mut [f32; STEP]) {
        let t = self.tile(i, blk);
        for (k, o) in out.iter_mut().enumerate() {
            *o = base_weight(t, k);
        }
    }
}

impl<const R: usize> IntRowsScalar for Q1tRows<'_, R> {
    const GROUP_SCALES: bool = true;

    fn cols(&self) -> usize {
        self.cols
    }

    fn codes32(&self, i: usize, blk: usize, out: &mut [i8; STEP]) {
        let t = self.tile(i, blk);
        for (k, o) in out.iter_mut().enumerate() {
            *o = [0, 1, -1][trit(t[2 + k / 5], k % 5)];
        }
    }

    fn group_scale(&self, i: usize, blk: usize) -> f32 {
        h2f_scalar(le16(self.tile(i, blk), 0))
    }

    fn int_post(&self, _i: usize) -> f32 {
        1.0
    }
}

#[cfg(target_arch = "x86_64")]
mod simd {
    //! Digit extraction by multiplies (AVX2, AVX-512 BW), and the digit-major integer kernel
    //! (AVX-512 VBMI + VNNI).

    use super::*;
    use crate::quant::kernel::{h2f, h2f8, IntRowsSimd, RowsAvx2, RowsAvx512};

    /// Byte shuffles and multipliers that put the code byte of element `σ(q)` in 16-bit
    /// word `q` (a 128-bit lane holds a copy of the tile, so word `q` of lane `q / 8` reads
    /// byte `2 + σ(q)/5` of it) and extract its digit `σ(q) % 5`.
    const fn words<const B: usize, const W: usize>(sigma: [usize; W]) -> ([u8; B], [u16; W]) {
        let mut shuf = [0x80u8; B];
        let mut mul = [0u16; W];
        let mut q = 0;
        while q < W {
            let e = sigma[q];
            shuf[(q / 8) * 16 + 2 * (q % 8)] = (2 + e / 5) as u8;
            mul[q] = DIV[e % 5];
            q += 1;
        }
        (shuf, mul)
    }

    /// `σ` for a 32-word vector whose low words give elements 0..16 and high words 16..32
    /// (`vpermps` on the dwords, and on the dwords shifted by 16).
    const fn sigma_512() -> [usize; 32] {
        let mut s = [0; 32];
        let mut q = 0;
        while q < 32 {
            s[q] = if q % 2 == 0 { q / 2 } else { 16 + q / 2 };
            q += 1;
        }
        s
    }

    /// `σ` for two 16-word vectors A, B: A's low words give elements 0..8, its high words
    /// 8..16; B's 16..24 and 24..32 (`OFF = 0` for A, 16 for B).
    const fn sigma_256_f32<const OFF: usize>() -> [usize; 16] {
        let mut s = [0; 16];
        let mut q = 0;
        while q < 16 {
            s[q] = OFF + if q % 2 == 0 { q / 2 } else { 8 + q / 2 };
            q += 1;
        }
        s
    }

    /// `σ` for two 16-word vectors A, B whose `vpackuswb` is elements 0..32 in order (it
    /// interleaves 8 words of A and 8 of B per 128-bit lane).
    const fn sigma_256_int<const OFF: usize>() -> [usize; 16] {
        let mut s = [0; 16];
        let mut q = 0;
        while q < 16 {
            s[q] = OFF + if q < 8 { q } else { q + 8 };
            q += 1;
        }
        s
    }

    /// `σ` for two 16-word vectors in element order: elements `OFF..OFF + 16`.
    const fn sigma_256_i16<const OFF: usize>() -> [usize; 16] {
        let mut s = [0; 16];
        let mut q = 0;
        while q < 16 {
            s[q] = OFF + q;
            q += 1;
        }
        s
    }

    static W512: ([u8; 64], [u16; 32]) = words::<64, 32>(sigma_512());
    static WA_F: ([u8; 32], [u16; 16]) = words::<32, 16>(sigma_256_f32::<0>());
    static WB_F: ([u8; 32], [u16; 16]) = words::<32, 16>(sigma_256_f32::<16>());
    static WA_I: ([u8; 32], [u16; 16]) = words::<32, 16>(sigma_256_int::<0>());
    static WB_I: ([u8; 32], [u16; 16]) = words::<32, 16>(sigma_256_int::<8>());
    static WA_W: ([u8; 32], [u16; 16]) = words::<32, 16>(sigma_256_i16::<0>());
    static WB_W: ([u8; 32], [u16; 16]) = words::<32, 16>(sigma_256_i16::<16>());
    /// f16 words `[0, s, s]` from a tile (bytes 0, 1 are `s`).
    static SCALE_WORDS: [u8; 16] = [
        0x80, 0x80, 0, 1, 0, 1, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80,
    ];
    /// Digit → signed code (`0, +1, −1`) in each 128-bit lane.
    static CODE: [i8; 32] = [
        0, 1, -1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, -1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
        0, 0,
    ];

    #[inline(always)]
    unsafe fn ld256<T>(p: &T) -> __m256i {
        _mm256_loadu_si256(p as *const T as *const __m256i)
    }

    #[inline(always)]
    unsafe fn ld512<T>(p: &T) -> __m512i {
        _mm512_loadu_si512(p as *const T as *const __m512i)
    }

    /// f16 words `[0, s, −s, …]` of the tile whose first 16 bytes are `t`.
    #[inline(always)]
    unsafe fn scale_words(t: __m128i) -> __m128i {
        let w = _mm_shuffle_epi8(t, _mm_loadu_si128(SCALE_WORDS.as_ptr() as *const __m128i));
        _mm_xor_si128(w, _mm_setr_epi16(0, 0, i16::MIN, 0, 0, 0, 0, 0))
    }

    /// The digits (0..=2, in 16-bit words) of the two 16-word halves `(A, B)` of a tile.
    #[inline(always)]
    unsafe fn digits_256(
        p: *const u8,
        a: &([u8; 32], [u16; 16]),
        b: &([u8; 32], [u16; 16]),
    ) -> (__m128i, __m256i, __m256i) {
        let t = _mm_loadu_si128(p as *const __m128i);
        let z = _mm256_broadcastsi128_si256(t);
        let three = _mm256_set1_epi16(3);
        let da = _mm256_shuffle_epi8(z, ld256(&a.0));
        let db = _mm256_shuffle_epi8(z, ld256(&b.0));
        let da = _mm256_mulhi_epu16(_mm256_mullo_epi16(da, ld256(&a.1)), three);
        let db = _mm256_mulhi_epu16(_mm256_mullo_epi16(db, ld256(&b.1)), three);
        (t, da, db)
    }

    /// The signed codes (`0, +1, −1` in 16-bit words) of the 16 words of a tile that
    /// `w` selects, without a multiply for the digit: the digit of `x = (b·DIV) mod 2¹⁶`
    /// is `⌊3x / 2¹⁶⌋`, i.e. whether `x` reaches `⌈2¹⁶/3⌉` and `⌈2·2¹⁶/3⌉`: two compares
    /// (signed, after flipping the top bit), whose masks `c₁, c₂ ∈ {0, −1}` give the code
    /// as `2·c₂ − c₁`. (`vpmulhuw` by 3 ran on the one vector multiplier of Zen 2, as do
    /// the `vpmullw` and the dot's `vpmaddwd`.)
    #[inline(always)]
    unsafe fn codes_i16(z: __m256i, w: &([u8; 32], [u16; 16])) -> __m256i {
        let x = _mm256_mullo_epi16(_mm256_shuffle_epi8(z, ld256(&w.0)), ld256(&w.1));
        let x = _mm256_xor_si256(x, _mm256_set1_epi16(i16::MIN));
        let c1 = _mm256_cmpgt_epi16(x, _mm256_set1_epi16((21846 - 32768 - 1) as i16));
        let c2 = _mm256_cmpgt_epi16(x, _mm256_set1_epi16((43691 - 32768 - 1) as i16));
        _mm256_sub_epi16(_mm256_add_epi16(c2, c2), c1)
    }

    impl<const R: usize> RowsAvx2 for Q1tRows<'_, R> {
        #[inline(always)]
        unsafe fn prefetch_next_f(&self, i: usize, blk: usize) {
            self.prefetch_ahead(i, blk)
        }

        #[inline(always)]
        unsafe fn load_avx2(&self, i: usize, blk: usize) -> [__m256; 4] {
            // In bounds: `blk < cols/32`, and the row slice has `SLACK` bytes after its
            // last tile for the 16-byte load.
            let p = self.tiles.get_unchecked(i).as_ptr().add(blk * Q1T_TILE);
            let (t, da, db) = digits_256(p, &WA_F, &WB_F);
            let tbl = _mm256_cvtph_ps(scale_words(t));
            [
                _mm256_permutevar8x32_ps(tbl, da),
                _mm256_permutevar8x32_ps(tbl, _mm256_srli_epi32::<16>(da)),
                _mm256_permutevar8x32_ps(tbl, db),
                _mm256_permutevar8x32_ps(tbl, _mm256_srli_epi32::<16>(db)),
            ]
        }
    }

    impl<const R: usize> RowsAvx512 for Q1tRows<'_, R> {
        #[inline(always)]
        unsafe fn load_avx512(&self, i: usize, blk: usize) -> [__m512; 2] {
            // In bounds: as in `load_avx2`.
            let p = self.tiles.get_unchecked(i).as_ptr().add(blk * Q1T_TILE);
            let t = _mm_loadu_si128(p as *const __m128i);
            let w = _mm512_shuffle_epi8(_mm512_broadcast_i32x4(t), ld512(&W512.0));
            let d = _mm512_mulhi_epu16(_mm512_mullo_epi16(w, ld512(&W512.1)), _mm512_set1_epi16(3));
            // Lanes 8..16 of the table are never indexed (digits ≤ 2).
            let tbl = _mm512_cvtph_ps(_mm256_castsi128_si256(scale_words(t)));
            [
                _mm512_permutexvar_ps(d, tbl),
                _mm512_permutexvar_ps(_mm512_srli_epi32::<16>(d), tbl),
            ]
        }
    }

    impl<const R: usize> IntRowsSimd for Q1tRows<'_, R> {
        #[inline(always)]
        unsafe fn load_u8(&self, i: usize, blk: usize) -> __m256i {
            // In bounds: as in `load_avx2`.
            let p = self.tiles.get_unchecked(i).as_ptr().add(blk * Q1T_TILE);
            let (_, da, db) = digits_256(p, &WA_I, &WB_I);
            _mm256_shuffle_epi8(ld256(&CODE), _mm256_packus_epi16(da, db))
        }

        #[inline(always)]
        unsafe fn load_i16(&self, i: usize, blk: usize) -> [__m256i; 2] {
            // In bounds: as in `load_avx2`.
            let p = self.tiles.get_unchecked(i).as_ptr().add(blk * Q1T_TILE);
            let z = _mm256_broadcastsi128_si256(_mm_loadu_si128(p as *const __m128i));
            [codes_i16(z, &WA_W), codes_i16(z, &WB_W)]
        }

        #[inline(always)]
        unsafe fn group_scale_simd(&self, i: usize, blk: usize) -> f32 {
            h2f(le16(self.tile(i, blk), 0))
        }

        /// The eight tiles' f16 scales gathered into one vector, one conversion.
        #[inline(always)]
        unsafe fn group_scales8(&self, blk: usize) -> __m256 {
            debug_assert!(R >= 8);
            h2f8(std::array::from_fn(|i| le16(self.tile(i, blk), 0)))
        }

        #[inline(always)]
        unsafe fn prefetch_next(&self, i: usize, blk: usize) {
            self.prefetch_ahead(i, blk)
        }
    }

    impl<const R: usize> Q1tRows<'_, R> {
        /// Both kernels' prefetch: row `i` two blocks on is `2·R` rows further (rows are
        /// contiguous within a task), asked for once per pair of tiles. Pairs are 18 bytes
        /// apart, so no line is skipped, and the paired kernels drop the test at compile
        /// time; a test for the first tile in each line (`blk·9 mod 64 < 9`) is a
        /// multiply, a compare and an irregular branch per row and group.
        ///
        /// # Safety
        /// AVX2 (a prefetch never faults); `i < R`.
        #[inline(always)]
        unsafe fn prefetch_ahead(&self, i: usize, blk: usize) {
            if blk % 2 == 1 {
                return;
            }
            // The row without its `SLACK`: rows are that far apart.
            let tiles = self.tiles.get_unchecked(i);
            let row = tiles.get_unchecked(..tiles.len() - SLACK);
            kernel::prefetch_ahead::<R>(row, blk * Q1T_TILE, 1);
        }
    }

    // ---- the `Exact` kernel with shared scale tables ---------------------------------------

    /// Whether this CPU runs [`exact_rows`] (AVX-512 VBMI on top of [`Kernel::Avx512`]).
    pub(super) fn exact_available() -> bool {
        super::kernel::avx512_vbmi()
    }

    /// f16 word `l` ← the scale of tile `l % 8` of a step (words 8..16 are negated after
    /// the conversion: `[s₀…s₇, −s₀…−s₇]`).
    static EX_SCALE: [u8; 64] = {
        let mut t = [0u8; 64];
        let mut l = 0;
        while l < 16 {
            t[2 * l] = (9 * (l % 8)) as u8;
            t[2 * l + 1] = (9 * (l % 8) + 1) as u8;
            l += 1;
        }
        t
    };

    /// For tile `i` of a step: the `vpermps` index giving `[0, sᵢ, −sᵢ]` (lane 0 masked).
    static EX_TABLE: [[i32; 16]; 8] = {
        let mut t = [[0i32; 16]; 8];
        let mut i = 0;
        while i < 8 {
            t[i][1] = i as i32;
            t[i][2] = 8 + i as i32;
            i += 1;
        }
        t
    };

    /// Where the overlay reads a token's activations. (A trait with `#[inline(always)]`
    /// methods, not a closure: a closure body is a function of its own, without the
    /// caller's target features, and its intrinsics would become calls if it were not
    /// inlined.)
    trait ColAt {
        /// The activation at column `col`.
        unsafe fn at(&self, col: usize) -> f32;
    }

    /// [`ColAt`] 16 columns at a time (AVX-512).
    trait Gather: ColAt {
        /// The activations at columns `cols` (lanes of `k`; the others 0).
        unsafe fn gather(&self, cols: __m512i, k: __mmask16) -> __m512;
    }

    impl ColAt for &[f32] {
        #[inline(always)]
        unsafe fn at(&self, col: usize) -> f32 {
            *self.get_unchecked(col)
        }
    }

    impl Gather for &[f32] {
        #[inline(always)]
        unsafe fn gather(&self, cols: __m512i, k: __mmask16) -> __m512 {
            _mm512_mask_i32gather_ps::<4>(_mm512_setzero_ps(), k, cols, self.as_ptr())
        }
    }

    /// The dequantized activations (`q·d`, `(256·q + q₂)·d` with the residual level), as
    /// [`ActAt`] computes them, built once per token in [`DmActs::refresh`]: one gather
    /// per 16 entries instead of three (codes, residuals, scales).
    impl ColAt for DmTok {
        #[inline(always)]
        unsafe fn at(&self, col: usize) -> f32 {
            *self.xf.add(col)
        }
    }

    impl Gather for DmTok {
        #[inline(always)]
        unsafe fn gather(&self, cols: __m512i, k: __mmask16) -> __m512 {
            _mm512_mask_i32gather_ps::<4>(_mm512_setzero_ps(), k, cols, self.xf)
        }
    }

    impl OvRow<'_> {
        /// Entry `i`'s column and `delta` ([`OvRow::get`] with F16C for an entry's own
        /// value: the portable conversion in the prefill panels' overlay, once per entry
        /// and block of tokens, cost Qwen2.5-Coder-0.5B's 64-token `q1t` prefill 6%).
        ///
        /// # Safety
        /// F16C; `i < len()`.
        #[inline(always)]
        pub(crate) unsafe fn get_f16c(&self, i: usize) -> (usize, f32) {
            let col = u16::from_le_bytes([
                *self.ent.get_unchecked(Q1T_ENTRY * i),
                *self.ent.get_unchecked(Q1T_ENTRY * i + 1),
            ]);
            (col as usize, self.delta_at(i))
        }

        /// Entry `i`'s `delta` (`i < len()`); F16C for an entry's own value.
        #[inline(always)]
        unsafe fn delta_at(&self, i: usize) -> f32 {
            match self.delta {
                Some(d) => *d.get_unchecked(i),
                None => h2f(u16::from_le_bytes([
                    *self.ent.get_unchecked(Q1T_ENTRY * i + 2),
                    *self.ent.get_unchecked(Q1T_ENTRY * i + 3),
                ])),
            }
        }

        /// The `delta`s of the 8 entries from `e` whose words are `ev` (the lanes of
        /// `keep`; the others 0). AVX2 + F16C.
        #[inline(always)]
        unsafe fn deltas8(&self, e: usize, ev: __m256i, keep: __m256i) -> __m256 {
            match self.delta {
                Some(d) => _mm256_maskload_ps(d.as_ptr().add(e), keep),
                None => {
                    // The words' upper halves packed per 128-bit lane, the two lanes' four
                    // joined: the 8 values in entry order.
                    let hi = _mm256_srli_epi32::<16>(ev);
                    let packed = _mm256_packus_epi32(hi, hi);
                    let joined = _mm256_permute4x64_epi64::<0b1000>(packed);
                    _mm256_cvtph_ps(_mm256_castsi256_si128(joined))
                }
            }
        }

        /// The `delta`s of the 16 entries from `e` whose words are `ev` (the lanes of `k`;
        /// the others 0). AVX-512 F.
        #[inline(always)]
        unsafe fn deltas16(&self, e: usize, ev: __m512i, k: __mmask16) -> __m512 {
            match self.delta {
                Some(d) => _mm512_maskz_loadu_ps(k, d.as_ptr().add(e)),
                None => _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(ev))),
            }
        }
    }

    /// One row's overlay `ov`, `Σ delta·x[col]` over its entries, for each token `xs[j]`,
    /// one entry at a time in file order. Up to 8 entries run in 8 fixed slots, those past
    /// `n` re-reading entry `n − 1` with a correction of 0: the loop no longer ends at the
    /// row's entry count, which varies from row to row and was mispredicted at nearly every
    /// row's end (Qwen2.5-0.5B decode +3.5%). A padding slot adds `0·x` to a sum that
    /// already holds `delta·x` of the same `x`: only a non-finite `x` tells, ±∞ becoming
    /// NaN. (Written as `e.min(n − 1)` the index compiled to slower code: −4%.)
    #[inline(always)]
    unsafe fn overlay_sums<X: ColAt, const T: usize>(ov: OvRow, xs: &[X; T]) -> [f32; T] {
        let n = ov.len();
        let mut c = [0f32; T];
        if n == 0 {
            return c;
        }
        let slots = if n <= 8 { 8 } else { n };
        for e in 0..slots {
            let i = if e < n { e } else { n - 1 };
            let (col, dl) = ov.get_f16c(i);
            let dl = if e < n { dl } else { 0.0 };
            for (c, x) in c.iter_mut().zip(xs) {
                *c += dl * x.at(col);
            }
        }
        c
    }

    /// Adds one row's overlay `ov`, `Σ delta·x[col]` over its entries, into the
    /// accumulators `acc[j]` of the tokens `xs[j]` (before their horizontal sum): up to 8
    /// entries (most rows at the encoder's default density) one by one into lane 0, more
    /// as [`overlay_gathered`]. The exact kernel's f32 rows ran 7% slower with every
    /// entry gathered (1536×576, one core).
    #[inline(always)]
    unsafe fn overlay<X: Gather, const T: usize>(ov: OvRow, acc: &mut [__m512; T], xs: &[X; T]) {
        let n = ov.len();
        if n == 0 {
            return;
        }
        if n <= 8 {
            let c = overlay_sums(ov, xs);
            for (a, c) in acc.iter_mut().zip(c) {
                *a = _mm512_mask_add_ps(*a, 1, *a, _mm512_set1_ps(c));
            }
            return;
        }
        overlay_gathered(ov, acc, xs);
    }

    /// [`overlay`] with every entry gathered, 16 at a time into the lanes of the
    /// accumulators (lanes past the row's count add nothing): the integer kernels, whose
    /// rows finish in a few steps, so that the scalar slots of a short overlay were a
    /// large share of them (the planes kernel 1536×576, one core: 1.29× faster; the
    /// digit-major one 1.17×).
    #[inline(always)]
    unsafe fn overlay_gathered<X: Gather, const T: usize>(
        ov: OvRow,
        acc: &mut [__m512; T],
        xs: &[X; T],
    ) {
        let n = ov.len();
        let mut e = 0;
        while e < n {
            let k: __mmask16 = if n - e >= 16 { !0 } else { (1 << (n - e)) - 1 };
            let ev = _mm512_maskz_loadu_epi32(k, ov.ent.as_ptr().add(Q1T_ENTRY * e) as *const i32);
            let cols = _mm512_and_si512(ev, _mm512_set1_epi32(0xFFFF));
            let dl = ov.deltas16(e, ev, k);
            for (acc, x) in acc.iter_mut().zip(xs) {
                *acc = _mm512_fmadd_ps(x.gather(cols, k), dl, *acc);
            }
            e += 16;
        }
    }

    /// `Σ w·x` of `R` rows (their tiles, `groups` each; their overlays `ov`) and `T`
    /// activations: the weights exactly as [`Q1tRows::load_avx512`] decodes them (same
    /// digits, same `[0, s, −s]` lookup), but each row's scale tables come from one
    /// `vpermt2b` + one conversion per 8 tiles instead of per tile, and the overlay goes
    /// into the accumulators by gathers. Every (row, token) pair sees the same operations
    /// whatever `R` and `T`.
    ///
    /// # Safety
    /// [`exact_available`]; each `tiles[i]` holds `groups` tiles and [`SLACK`] bytes; each
    /// `xs[j]` holds `32·groups` values.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2,fma,f16c")]
    pub(super) unsafe fn exact_rows<const R: usize, const T: usize>(
        tiles: &[&[u8]; R],
        groups: usize,
        xs: &[&[f32]; T],
        ov: &[OvRow; R],
    ) -> [[f32; T]; R] {
        let shuf = ld512(&W512.0);
        let mul = ld512(&W512.1);
        let three = _mm512_set1_epi16(3);
        let sidx = ld512(&EX_SCALE);
        let neg = _mm512_mask_set1_epi32(_mm512_setzero_si512(), 0xFF00, i32::MIN);
        let row_bytes = groups * Q1T_TILE;
        let mut acc = [[_mm512_setzero_ps(); T]; R];
        let mut s2 = [_mm512_setzero_ps(); R];
        for st in 0..groups.div_ceil(DM_TILES) {
            let first = st * DM_TILES;
            let n = DM_TILES.min(groups - first);
            let m = step_masks(n);
            for (i, s2) in s2.iter_mut().enumerate() {
                let p = tiles[i].as_ptr().add(first * Q1T_TILE);
                let z0 = _mm512_maskz_loadu_epi8(m.0, p as *const i8);
                let z1 = _mm512_maskz_loadu_epi8(m.1, p.add(64) as *const i8);
                let w = _mm512_castsi512_si256(_mm512_permutex2var_epi8(z0, sidx, z1));
                let sc = _mm512_castps_si512(_mm512_cvtph_ps(w));
                *s2 = _mm512_castsi512_ps(_mm512_xor_si512(sc, neg));
                // Row `i` two blocks on (rows are contiguous within a task), in every
                // tile as the shared kernels ask (`IntRowsSimd::prefetch_next`).
                _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(2 * R * row_bytes) as *const i8);
            }
            for (t, tix) in EX_TABLE.iter().enumerate().take(n) {
                let g = first + t;
                let tix = _mm512_loadu_si512(tix.as_ptr() as *const __m512i);
                let mut xv = [[_mm512_setzero_ps(); 2]; T];
                for (v, x) in xv.iter_mut().zip(xs) {
                    let p = x.as_ptr().add(g * STEP);
                    *v = [_mm512_loadu_ps(p), _mm512_loadu_ps(p.add(16))];
                }
                for (i, acc) in acc.iter_mut().enumerate() {
                    let p = tiles[i].as_ptr().add(g * Q1T_TILE);
                    let t16 = _mm_loadu_si128(p as *const __m128i);
                    let w = _mm512_shuffle_epi8(_mm512_broadcast_i32x4(t16), shuf);
                    let d = _mm512_mulhi_epu16(_mm512_mullo_epi16(w, mul), three);
                    let tbl = _mm512_maskz_permutexvar_ps(0b110, tix, s2[i]);
                    let wl = _mm512_permutexvar_ps(d, tbl);
                    let wh = _mm512_permutexvar_ps(_mm512_srli_epi32::<16>(d), tbl);
                    for (a, v) in acc.iter_mut().zip(&xv) {
                        *a = _mm512_fmadd_ps(wl, v[0], *a);
                        *a = _mm512_fmadd_ps(wh, v[1], *a);
                    }
                }
            }
        }
        let mut out = [[0f32; T]; R];
        for ((o, a), &ov) in out.iter_mut().zip(acc.iter_mut()).zip(ov) {
            overlay(ov, a, xs);
            for (o, a) in o.iter_mut().zip(a.iter()) {
                *o = _mm512_reduce_add_ps(*a);
            }
        }
        out
    }

    // ---- the digit-major integer kernel ---------------------------------------------------

    /// Per digit plane `a`, the byte of a step's codes each lane `8·i + j` takes (within
    /// the 128 bytes of tiles `i & !3 .. (i & !3) + 4`: `32·(i % 4) + 5·j + a`), and which
    /// lanes take one (`5·j + a < 32`); the others are zero.
    static DM_PLANES: ([[u8; 64]; 5], [u64; 5]) = {
        let mut idx = [[0u8; 64]; 5];
        let mut valid = [0u64; 5];
        let mut a = 0;
        while a < 5 {
            let mut lane = 0;
            while lane < 64 {
                let (i, j) = (lane / 8, lane % 8);
                if 5 * j + a < 32 {
                    idx[a][lane] = (32 * (i % 4) + 5 * j + a) as u8;
                    valid[a] |= 1 << lane;
                }
                lane += 1;
            }
            a += 1;
        }
        (idx, valid)
    };

    /// [`super::DmLevel::push_scalar`]'s layout of one token's codes by byte permutes: per
    /// step, 4 loads, two `vpermi2b` per digit plane (tiles 0–3 and 4–7) and the planes'
    /// byte sums by `vpdpbusd` against ones for `c`.
    ///
    /// # Safety
    /// AVX-512 F/BW/VBMI/VNNI; `x` and `c` hold `s` steps (`DM_X`, `DM_LANES` each) with
    /// `8·s ≥ groups`, `codes.len() = 32·groups`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vbmi,avx512vnni")]
    pub(super) unsafe fn dm_push(x: &mut [i8], c: &mut [i32], groups: usize, codes: &[i8]) {
        let steps = groups.div_ceil(DM_TILES);
        assert!(x.len() >= steps * DM_X && c.len() >= steps * DM_LANES);
        assert_eq!(codes.len(), groups * STEP);
        let (idx, valid) = &DM_PLANES;
        let ones = _mm512_set1_epi8(1);
        for s in 0..steps {
            let at = s * DM_TILES * STEP;
            let v: [__m512i; 4] = std::array::from_fn(|k| {
                let from = at + 64 * k;
                let n = codes.len().saturating_sub(from).min(64);
                let m = if n == 64 { u64::MAX } else { (1u64 << n) - 1 };
                // Masked: nothing past `codes` is read.
                _mm512_maskz_loadu_epi8(m, codes.as_ptr().wrapping_add(from))
            });
            let mut sum = _mm512_setzero_si512();
            for a in 0..5 {
                let ix = _mm512_loadu_si512(idx[a].as_ptr() as *const _);
                let lo = _mm512_maskz_permutex2var_epi8(valid[a] & 0xFFFF_FFFF, v[0], ix, v[1]);
                let hi = _mm512_maskz_permutex2var_epi8(valid[a] & !0xFFFF_FFFF, v[2], ix, v[3]);
                let plane = _mm512_or_si512(lo, hi);
                _mm512_storeu_si512(x.as_mut_ptr().add(s * DM_X + 64 * a) as *mut _, plane);
                sum = _mm512_dpbusd_epi32(sum, ones, plane);
            }
            let neg = _mm512_sub_epi32(_mm512_setzero_si512(), sum);
            _mm512_storeu_si512(c.as_mut_ptr().add(s * DM_LANES) as *mut _, neg);
        }
    }

    /// Tiles per step of the digit-major kernel: 8 × 7 code bytes in a 64-byte vector.
    pub(super) const DM_TILES: usize = 8;
    /// Activation bytes per step and token: 5 digit planes of 64 lanes.
    pub(super) const DM_X: usize = 5 * 64;
    /// 32-bit lanes per step (2 per tile).
    pub(super) const DM_LANES: usize = 16;

    /// `code + 1` (0 for −1, 1 for 0, 2 for +1) of digit `a < 4` of `r < 128`.
    static DM_TABLE: [[u8; 128]; 4] = {
        let mut t = [[0u8; 128]; 4];
        let mut a = 0;
        while a < 4 {
            let mut r = 0;
            while r < 128 {
                let d = (r / [1, 3, 9, 27][a]) % 3;
                t[a][r] = [1, 2, 0][d] as u8;
                r += 1;
            }
            a += 1;
        }
        t
    };

    /// Byte `8·i + j` ← code byte `j` of tile `i` (byte `9i + 2 + j`; lane 7 repeats
    /// byte 0 and meets a zero activation).
    static DM_CODE: [u8; 64] = {
        let mut t = [0u8; 64];
        let mut i = 0;
        while i < 64 {
            let (tile, j) = (i / 8, i % 8);
            t[i] = (9 * tile + 2 + if j < 7 { j } else { 0 }) as u8;
            i += 1;
        }
        t
    };

    /// f16 word `l` ← the scale of tile `l / 2` (the tile of 32-bit lane `l`).
    static DM_SCALE: [u8; 64] = {
        let mut t = [0u8; 64];
        let mut l = 0;
        while l < 16 {
            t[2 * l] = (9 * (l / 2)) as u8;
            t[2 * l + 1] = (9 * (l / 2) + 1) as u8;
            l += 1;
        }
        t
    };

    /// A `vpermt2b` index over a pair of rows' tails of at most 4 tiles: the first `n`
    /// bytes of `one` (a one-row index) read the first row (the first source), the next
    /// `n` the second (the second source, indices `64..`); the rest 0.
    const fn paired(one: &[u8; 64], n: usize) -> [u8; 64] {
        let mut t = [0u8; 64];
        let mut i = 0;
        while i < 2 * n {
            t[i] = one[i % n] + if i < n { 0 } else { 64 };
            i += 1;
        }
        t
    }

    /// [`DM_CODE`] for a pair of tails: lanes 0..32 the first row's, 32..64 the second's.
    static DM_PAIR_CODE: [u8; 64] = paired(&DM_CODE, 32);

    /// [`DM_SCALE`] for a pair of tails: f16 words 0..8 the first row's tiles 0..4, words
    /// 8..16 the second's.
    static DM_PAIR_SCALE: [u8; 64] = paired(&DM_SCALE, 16);

    /// Whether this CPU runs the digit-major kernel (AVX-512 VBMI and VNNI on top of
    /// [`Kernel::Avx512`]): [`Kernel::has_vbmi`], as the `vbit` kernels ask.
    pub(in crate::quant) fn dm_available() -> bool {
        Kernel::Avx512.has_vbmi()
    }

    /// One token's digit-major activations (the first step's; step `c` is `c` strides on),
    /// per level: `[0]` the codes, `[1]` their residual when `split` (else `[0]` again,
    /// never read).
    #[derive(Clone, Copy)]
    pub(super) struct DmTok {
        pub x: [*const i8; 2],
        pub c: [*const i32; 2],
        /// With the residual level, the lanes' `(c₀ << SPLIT_SHIFT) + c₁` (the AVX2
        /// kernel's start; else `c[0]` again, never read).
        pub cs: *const i32,
        pub d: *const f32,
        /// The token's dequantized activations, which the overlay multiplies.
        pub xf: *const f32,
    }

    /// The kernel's constants, loaded once per call.
    struct DmConst {
        code: __m512i,
        scale: __m512i,
        /// Digit `a`'s table (`a < 4`): bytes 0..64, 64..128.
        digit: [[__m512i; 2]; 4],
    }

    #[inline(always)]
    unsafe fn dm_const() -> DmConst {
        let mut k = DmConst {
            code: ld512(&DM_CODE),
            scale: ld512(&DM_SCALE),
            digit: [[_mm512_setzero_si512(); 2]; 4],
        };
        for (a, d) in k.digit.iter_mut().enumerate() {
            let t = DM_TABLE[a].as_ptr() as *const __m512i;
            *d = [_mm512_loadu_si512(t), _mm512_loadu_si512(t.add(1))];
        }
        k
    }

    /// One step (8 tiles at each `ps[r]`, the first `9·n` bytes valid) of `N` rows against
    /// `T` tokens; with the residual level when `SPLIT`. The rows' digits are looked up
    /// first, then each token's activation planes are loaded once for all `N` rows (two
    /// rows per call: the planes are 10–13 loads per token and step, as many as the digit
    /// work of one row). Each row sees the operations of a one-row step, in that order.
    #[inline(always)]
    unsafe fn dm_step<const N: usize, const T: usize, const SPLIT: bool>(
        k: &DmConst,
        ps: [*const u8; N],
        masks: (u64, u64),
        step: usize,
        toks: &[DmTok; T],
        acc: &mut [[__m512; T]; N],
    ) {
        let mut us = [[_mm512_setzero_si512(); 5]; N];
        let mut scales = [_mm512_setzero_ps(); N];
        for r in 0..N {
            let p = ps[r];
            let z0 = _mm512_maskz_loadu_epi8(masks.0, p as *const i8);
            let z1 = _mm512_maskz_loadu_epi8(masks.1, p.add(64) as *const i8);
            let code = _mm512_permutex2var_epi8(z0, k.code, z1);
            let scale = _mm512_permutex2var_epi8(z0, k.scale, z1);
            scales[r] = _mm512_cvtph_ps(_mm512_castsi512_si256(scale));
            us[r] = dm_digits(k, code);
        }
        for (q, tk) in toks.iter().enumerate() {
            let planes = dm_planes::<5>(tk, 0, step);
            let planes2 = if SPLIT {
                dm_planes::<5>(tk, 1, step)
            } else {
                planes
            };
            let d = _mm512_loadu_ps(tk.d.add(step * DM_LANES));
            for r in 0..N {
                let dot = split_dot::<_, SPLIT>(&us[r], &planes, &planes2);
                acc[r][q] = _mm512_fmadd_ps(
                    _mm512_cvtepi32_ps(dot),
                    _mm512_mul_ps(scales[r], d),
                    acc[r][q],
                );
            }
        }
    }

    /// The five digit vectors `code + 1 ∈ {0, 1, 2}` of the 64 code bytes `code`.
    #[inline(always)]
    unsafe fn dm_digits(k: &DmConst, code: __m512i) -> [__m512i; 5] {
        let mut us = [_mm512_setzero_si512(); 5];
        // b = 81·q + r: digits 0..3 of b are those of r = b mod 81 (also for the
        // non-canonical b ≥ 243: b − 243 < 81), digit 4 is q mod 3. Two compares and
        // masked subtracts find r (b ≥ 162: −162, then ≥ 81: −81; 243.. → 0..12) and q.
        let k2 = _mm512_cmpge_epu8_mask(code, _mm512_set1_epi8(162u8 as i8));
        let rem = _mm512_mask_sub_epi8(code, k2, code, _mm512_set1_epi8(162u8 as i8));
        let k1 = _mm512_cmpge_epu8_mask(rem, _mm512_set1_epi8(81));
        let rem = _mm512_mask_sub_epi8(rem, k1, rem, _mm512_set1_epi8(81));
        // (No closures around intrinsics here: a closure body is a function of its own,
        // without this function's target features, and may not be inlined.)
        for (a, u) in us.iter_mut().take(4).enumerate() {
            *u = _mm512_permutex2var_epi8(k.digit[a][0], rem, k.digit[a][1]);
        }
        // Digit 4 + 1: q = 0 → 1, q = 1 (k1 only) → 2, q = 2 (k2 only) → 0, q = 3 → 1.
        let u4 = _mm512_mask_mov_epi8(_mm512_set1_epi8(1), k1 & !k2, _mm512_set1_epi8(2));
        us[4] = _mm512_mask_mov_epi8(u4, k2 & !k1, _mm512_setzero_si512());
        us
    }

    /// The last, partial step of two rows (`ps`, `n ≤ 4` tiles each) in one: their tiles
    /// share one vector (the first row's in lanes 0..32, the second's in 32..64), so the
    /// digits are looked up once and each token's planes are dotted once, with the tail's
    /// planes copied into the upper half. Each row's sums then go into lanes 0..8 of its
    /// accumulators, by the same operations as a one-row partial step (whose lanes 8..16
    /// add zeros), so the values do not depend on the pairing. Qwen2.5's 896 columns are
    /// 3½ steps a row, SmolLM2's 576 2¼: a partial step cost a whole one.
    #[inline(always)]
    unsafe fn dm_tail_pair<const N: usize, const T: usize, const SPLIT: bool>(
        k: &DmConst,
        ps: [*const u8; N],
        n: usize,
        step: usize,
        toks: &[DmTok; T],
        acc: &mut [[__m512; T]; N],
    ) {
        debug_assert!(N == 2 && n <= DM_TILES / 2);
        let m = (1u64 << (Q1T_TILE * n)) - 1;
        let za = _mm512_maskz_loadu_epi8(m, ps[0] as *const i8);
        let zb = _mm512_maskz_loadu_epi8(m, ps[1] as *const i8);
        let code = _mm512_permutex2var_epi8(za, ld512(&DM_PAIR_CODE), zb);
        let scale = _mm512_permutex2var_epi8(za, ld512(&DM_PAIR_SCALE), zb);
        let scales = _mm512_cvtph_ps(_mm512_castsi512_si256(scale));
        let us = dm_digits(k, code);
        let [a, b] = &mut acc[..] else {
            unreachable!("two rows")
        };
        pair_tokens::<5, T, SPLIT>(&us, scales, step, toks, [a, b]);
    }

    /// Both rows' units `us` of a paired tail step (the first row's in lanes 0..8 of each
    /// dot, the second's in 8..16) against every token, its planes copied into both halves,
    /// into the rows' accumulators ([`pair_accumulate`]).
    #[inline(always)]
    unsafe fn pair_tokens<const P: usize, const T: usize, const SPLIT: bool>(
        us: &[__m512i; P],
        scales: __m512,
        step: usize,
        toks: &[DmTok; T],
        [a, b]: [&mut [__m512; T]; 2],
    ) {
        for (q, tk) in toks.iter().enumerate() {
            let planes = dup_planes(dm_planes::<P>(tk, 0, step));
            let planes2 = if SPLIT {
                dup_planes(dm_planes::<P>(tk, 1, step))
            } else {
                planes
            };
            let d = _mm512_loadu_ps(tk.d.add(step * DM_LANES));
            let d = _mm512_shuffle_f32x4::<0b01_00_01_00>(d, d);
            let dot = split_dot::<P, SPLIT>(us, &planes, &planes2);
            pair_accumulate(dot, scales, d, (&mut a[q], &mut b[q]));
        }
    }

    /// A paired tail step's sums `dot` (the first row's tiles in lanes 0..8, the second's
    /// in 8..16) times the tiles' `scales` and the token's group scales `d` (both halves
    /// alike), into lanes 0..8 of each row's accumulator: the operations of a one-row
    /// partial step on those lanes.
    #[inline(always)]
    unsafe fn pair_accumulate(
        dot: __m512i,
        scales: __m512,
        d: __m512,
        (a, b): (&mut __m512, &mut __m512),
    ) {
        let v = _mm512_cvtepi32_ps(dot);
        let sd = _mm512_mul_ps(scales, d);
        *a = _mm512_mask3_fmadd_ps(v, sd, *a, 0x00FF);
        // The second row's lanes 8..16 down to 0..8.
        let (v, sd) = (
            _mm512_shuffle_f32x4::<0b01_00_11_10>(v, v),
            _mm512_shuffle_f32x4::<0b01_00_11_10>(sd, sd),
        );
        *b = _mm512_mask3_fmadd_ps(v, sd, *b, 0x00FF);
    }

    /// Planes ([`dm_planes`]) with their low halves copied into the high
    /// halves.
    #[inline(always)]
    unsafe fn dup_planes<const P: usize>(
        (c, xs): (__m512i, [__m512i; P]),
    ) -> (__m512i, [__m512i; P]) {
        let mut out = (dup_low(c), xs);
        for x in &mut out.1 {
            *x = dup_low(*x);
        }
        out
    }

    /// The low 256 bits twice (128-bit lanes 0, 1, 0, 1).
    #[inline(always)]
    unsafe fn dup_low(v: __m512i) -> __m512i {
        _mm512_shuffle_i64x2::<0b01_00_01_00>(v, v)
    }

    /// Level `l` of token `tk` at step `step`: the lanes' `−Σx` and the first `P` planes
    /// (the five digit planes, or the planes layout's four).
    #[inline(always)]
    unsafe fn dm_planes<const P: usize>(
        tk: &DmTok,
        l: usize,
        step: usize,
    ) -> (__m512i, [__m512i; P]) {
        let x = tk.x[l].add(step * DM_X);
        let c = _mm512_loadu_si512(tk.c[l].add(step * DM_LANES) as *const __m512i);
        let mut xs = [_mm512_setzero_si512(); P];
        for (a, v) in xs.iter_mut().enumerate() {
            *v = _mm512_loadu_si512(x.add(64 * a) as *const __m512i);
        }
        (c, xs)
    }

    /// `Σ code·x` per 32-bit lane of one step: the lanes' `−Σx` plus the planes'
    /// `Σ (code + 1)·x`, for one level of one token ([`dm_planes`]).
    #[inline(always)]
    unsafe fn dm_dot<const P: usize>(
        u: &[__m512i; P],
        planes: &(__m512i, [__m512i; P]),
    ) -> __m512i {
        let mut dot = planes.0;
        for (u, xa) in u.iter().zip(&planes.1) {
            dot = _mm512_dpbusd_epi32(dot, *u, *xa);
        }
        dot
    }

    /// `Σ code·x` per lane of one step against a token's level `planes`, and with the
    /// residual level `planes2` when `SPLIT`: `256·Σc·q + Σc·q₂`, as the shared integer
    /// kernels combine them. A lane sums at most 20 codes, so `|Σc·q| ≤ 20·127` and the
    /// lane stays below 2²⁰, exact in the f32 conversion.
    #[inline(always)]
    unsafe fn split_dot<const P: usize, const SPLIT: bool>(
        u: &[__m512i; P],
        planes: &(__m512i, [__m512i; P]),
        planes2: &(__m512i, [__m512i; P]),
    ) -> __m512i {
        let dot = dm_dot(u, planes);
        if !SPLIT {
            return dot;
        }
        _mm512_add_epi32(
            _mm512_slli_epi32::<{ SPLIT_SHIFT as u32 }>(dot),
            dm_dot(u, planes2),
        )
    }

    /// Masks of the two loads of a step holding `n ≤ 8` tiles.
    #[inline(always)]
    fn step_masks(n: usize) -> (u64, u64) {
        let nb = Q1T_TILE * n;
        if nb >= 64 {
            (!0, (1u64 << (nb - 64)) - 1)
        } else {
            ((1u64 << nb) - 1, 0)
        }
    }

    /// Asks L2 for step `s`'s tiles of the row at `p` [`TILES_AHEAD`] bytes on (rows are
    /// contiguous within a task, so that is the stream some rows on): two lines per
    /// 72-byte step, so that none is skipped.
    #[inline(always)]
    unsafe fn prefetch_step(p: *const u8, s: usize) {
        let step_bytes = DM_TILES * Q1T_TILE;
        let ahead = p.wrapping_add(s * step_bytes + TILES_AHEAD);
        _mm_prefetch::<_MM_HINT_T1>(ahead as *const i8);
        _mm_prefetch::<_MM_HINT_T1>(ahead.wrapping_add(step_bytes - 1) as *const i8);
    }

    /// Asks for the rows' overlay entries and corrections [`OVERLAY_AHEAD`] on, as each
    /// kernel starts its rows.
    #[inline(always)]
    unsafe fn prefetch_overlays<const N: usize>(ov: &[OvRow; N]) {
        for o in ov {
            // A prefetch never faults: the addresses may lie past the payload.
            let ent = o.ent.as_ptr().wrapping_add(OVERLAY_AHEAD);
            _mm_prefetch::<_MM_HINT_T0>(ent as *const i8);
            if let Some(delta) = o.delta {
                let delta = delta.as_ptr().wrapping_add(OVERLAY_AHEAD / 4);
                _mm_prefetch::<_MM_HINT_T0>(delta as *const i8);
            }
        }
    }

    /// The rows' first tiles, with their overlays' entries and corrections prefetched
    /// [`OVERLAY_AHEAD`] on (both digit-major kernels start a row so).
    #[inline(always)]
    unsafe fn row_starts<const N: usize>(
        tiles: [&[u8]; N],
        groups: usize,
        ov: &[OvRow; N],
    ) -> [*const u8; N] {
        prefetch_overlays(ov);
        std::array::from_fn(|r| {
            debug_assert!(tiles[r].len() >= groups * Q1T_TILE);
            tiles[r].as_ptr()
        })
    }

    /// `Σ code·x` over `N` rows' tiles (`groups` of them each), plus their overlays `ov`,
    /// for `T` tokens.
    #[inline(always)]
    unsafe fn dm_row<const N: usize, const T: usize, const SPLIT: bool>(
        k: &DmConst,
        tiles: [&[u8]; N],
        groups: usize,
        toks: &[DmTok; T],
        ov: [OvRow; N],
    ) -> [[f32; T]; N] {
        let ps = row_starts(tiles, groups, &ov);
        let mut acc = [[_mm512_setzero_ps(); T]; N];
        let full = groups / DM_TILES;
        let step_bytes = DM_TILES * Q1T_TILE;
        for s in 0..full {
            for p in ps {
                prefetch_step(p, s);
            }
            let at = ps.map(|p| p.add(s * step_bytes));
            dm_step::<N, T, SPLIT>(k, at, (!0, 0xFF), s, toks, &mut acc);
        }
        let tail = groups % DM_TILES;
        if tail > 0 {
            let at = ps.map(|p| p.add(full * step_bytes));
            if N == 2 && tail <= DM_TILES / 2 {
                dm_tail_pair::<N, T, SPLIT>(k, at, tail, full, toks, &mut acc);
            } else {
                dm_step::<N, T, SPLIT>(k, at, step_masks(tail), full, toks, &mut acc);
            }
        }
        let mut out = [[0f32; T]; N];
        for r in 0..N {
            overlay_gathered(ov[r], &mut acc[r], toks);
            for (o, a) in out[r].iter_mut().zip(&acc[r]) {
                *o = _mm512_reduce_add_ps(*a);
            }
        }
        out
    }

    /// The digit-major kernel's tiles: each row of a tile against its tokens, with its
    /// overlay. Built only by [`dm_block`].
    struct DmTile<'a> {
        k: DmConst,
        dm: &'a DmActs,
        /// The repacked rows, which the planes kernel reads instead of the tiles.
        planes: Option<&'a Q1tPlanes>,
    }

    impl DmTile<'_> {
        /// Rows `rs` (each a whole row of tiles, with its overlay) against tokens `ts`.
        ///
        /// # Safety
        /// As [`dm_block`]: `dm_available()`, `ts` laid out in `self.dm`.
        #[inline(always)]
        unsafe fn rows<const N: usize, const T: usize>(
            &self,
            cx: &Q1tProduct,
            rs: [usize; N],
            groups: usize,
            ts: &[DmTok; T],
        ) -> [[f32; T]; N] {
            let ov = array_of(|i| cx.ov.row(cx.bytes, rs[i]));
            if let Some(p) = self.planes {
                let rows = array_of(|i| (p.codes(rs[i]), p.scales(rs[i])));
                return if self.dm.split {
                    pl_row::<N, T, true>(rows, groups, ts, ov)
                } else {
                    pl_row::<N, T, false>(rows, groups, ts, ov)
                };
            }
            let rb = groups * Q1T_TILE;
            let tiles = array_of(|i| &cx.bytes[rs[i] * rb..(rs[i] + 1) * rb]);
            if self.dm.split {
                dm_row::<N, T, true>(&self.k, tiles, groups, ts, ov)
            } else {
                dm_row::<N, T, false>(&self.k, tiles, groups, ts, ov)
            }
        }
    }

    impl Tile for DmTile<'_> {
        #[inline(always)]
        fn tile<P: FnMut(usize, usize, f32), const R: usize, const T: usize>(
            &self,
            cx: &Q1tProduct,
            o: usize,
            j: usize,
            put: &mut P,
        ) {
            let ts: [DmTok; T] = array_of(|q| self.dm.token(j + q));
            let groups = cx.g.cols / STEP;
            let rows = cx.rows::<R>(o);
            let mut out = [[0f32; T]; R];
            // Two rows at a time (they share the activation loads), then an odd one.
            for (i, pair) in rows.chunks(2).enumerate() {
                // SAFETY: a `DmTile` exists only inside `dm_block`, whose caller checked
                // `dm_available()` and built `dm` from all tokens.
                unsafe {
                    if let [a, b] = *pair {
                        let v = self.rows::<2, T>(cx, [a, b], groups, &ts);
                        out[2 * i] = v[0];
                        out[2 * i + 1] = v[1];
                    } else {
                        out[2 * i] = self.rows::<1, T>(cx, [pair[0]], groups, &ts)[0];
                    }
                }
            }
            put_tile(o, j, &out, put);
        }
    }

    /// Outputs `outs` of `cx` against tokens `toks` (laid out in `dm`) in the tiles of
    /// [`Q1tProduct::tiles`], each row with its overlay; `put(output, token, value)`. The loops
    /// inline here, inside the target features. With `cx.planes`, the planes kernel over
    /// the repacked rows (`dm` then in its planes layout), else the digit-major one.
    ///
    /// # Safety
    /// [`dm_available`]; `dm` holds all `cx.t` tokens, in the planes layout exactly when
    /// `cx.planes` is set; the payload is validated.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
    pub(super) unsafe fn dm_block<P: FnMut(usize, usize, f32)>(
        cx: &Q1tProduct,
        dm: &DmActs,
        outs: Range<usize>,
        toks: Range<usize>,
        put: &mut P,
    ) {
        debug_assert_eq!(dm.planes, cx.planes.is_some());
        let tile = DmTile {
            k: dm_const(),
            dm,
            planes: cx.planes,
        };
        cx.tiles(&tile, outs, toks, put);
    }

    // ---- the planes kernel: AVX-512 VNNI over the repacked rows ----------------------------

    /// `vpermps` index spreading a step's 8 tile scales to their two 32-bit lanes each.
    static PL_DUP: [i32; 16] = [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7];

    /// How far ahead of each row's step the planes kernel prefetches its tile words (as
    /// [`TILES_AHEAD`] for the file's tiles), and a quarter as far its scales.
    const PLANES_AHEAD: usize = 3072;

    /// One step (tiles `8·step .. 8·step + n` of each row: their words and scales at
    /// `ps[r]`) of `N` rows against `T` tokens; with the residual level when `SPLIT`. A
    /// word's byte `m` holds `u = code + 1` of weights `m, m + 8, m + 16, m + 24` in bits
    /// 0, 2, 4, 6: one masked load per row and step, a shift and a mask per plane give the
    /// four byte vectors that `vpdpbusd` multiplies with the token's four planes
    /// ([`DmLevel::push_planes`]), from the lanes' `−Σx`, so `Σ u·x − Σx = Σ code·x` (a
    /// lane sums 16 codes: `(dot << SPLIT_SHIFT) + dot₂` stays below 2²⁰, exact in f32).
    /// Tiles past `n` load as zero words and zero scales; their activations are zero.
    #[inline(always)]
    unsafe fn pl_step<const N: usize, const T: usize, const SPLIT: bool>(
        ps: [(*const u64, *const u16); N],
        n: usize,
        step: usize,
        toks: &[DmTok; T],
        acc: &mut [[__m512; T]; N],
    ) {
        let (mc, ms) = if n >= DM_TILES {
            (!0u64, 0xFFu8)
        } else {
            ((1u64 << (8 * n)) - 1, ((1u32 << n) - 1) as u8)
        };
        let dup = ld512(&PL_DUP);
        let mut scales = [_mm512_setzero_ps(); N];
        for r in 0..N {
            let s = _mm256_cvtph_ps(_mm_maskz_loadu_epi16(ms, ps[r].1 as *const i16));
            scales[r] = _mm512_permutexvar_ps(dup, _mm512_castps256_ps512(s));
        }
        // Tokens outside, rows inside: each row's digits are split again per token (a
        // load and seven operations, from L1; decode has one token), which keeps the
        // registers for the rows' independent chains.
        for (q, tk) in toks.iter().enumerate() {
            let planes = dm_planes::<4>(tk, 0, step);
            let planes2 = if SPLIT {
                dm_planes::<4>(tk, 1, step)
            } else {
                planes
            };
            let d = _mm512_loadu_ps(tk.d.add(step * DM_LANES));
            for r in 0..N {
                let us = pl_units(_mm512_maskz_loadu_epi8(mc, ps[r].0 as *const i8));
                let dot = split_dot::<_, SPLIT>(&us, &planes, &planes2);
                acc[r][q] = _mm512_fmadd_ps(
                    _mm512_cvtepi32_ps(dot),
                    _mm512_mul_ps(scales[r], d),
                    acc[r][q],
                );
            }
        }
    }

    /// The four byte planes `u` of 64 bytes of tile words.
    #[inline(always)]
    unsafe fn pl_units(w: __m512i) -> [__m512i; 4] {
        let m3 = _mm512_set1_epi8(3);
        [
            _mm512_and_si512(w, m3),
            _mm512_and_si512(_mm512_srli_epi16::<2>(w), m3),
            _mm512_and_si512(_mm512_srli_epi16::<4>(w), m3),
            _mm512_and_si512(_mm512_srli_epi16::<6>(w), m3),
        ]
    }

    /// The last, partial step of two rows (`n ≤ 4` tiles each) in one vector, as
    /// [`dm_tail_pair`] does with the file's tiles: the first row's words in bytes 0..32,
    /// the second's in 32..64, the token's planes copied into both halves. Each row's lanes
    /// see the operations of a one-row partial step ([`pl_step`], whose lanes past `2·n`
    /// add zeros), so the values do not depend on the pairing. SmolLM2's 576 columns are
    /// 2¼ steps a row, Qwen2.5's 896 3½.
    #[inline(always)]
    unsafe fn pl_tail_pair<const T: usize, const SPLIT: bool>(
        ps: [(*const u64, *const u16); 2],
        n: usize,
        step: usize,
        toks: &[DmTok; T],
        [a0, a1]: [&mut [__m512; T]; 2],
    ) {
        debug_assert!(n <= DM_TILES / 2);
        let (mc, ms) = (
            ((1u64 << (8 * n)) - 1) as __mmask32,
            ((1u32 << n) - 1) as u8,
        );
        let a = _mm256_maskz_loadu_epi8(mc, ps[0].0 as *const i8);
        let b = _mm256_maskz_loadu_epi8(mc, ps[1].0 as *const i8);
        let us = pl_units(_mm512_inserti64x4::<1>(_mm512_castsi256_si512(a), b));
        // f16 words 0..4 the first row's scales, 4..8 the second's: `PL_DUP` spreads them
        // to lanes 0..8 and 8..16.
        let sa = _mm_maskz_loadu_epi16(ms, ps[0].1 as *const i16);
        let sb = _mm_maskz_loadu_epi16(ms, ps[1].1 as *const i16);
        let s8 = _mm256_cvtph_ps(_mm_unpacklo_epi64(sa, sb));
        let scales = _mm512_permutexvar_ps(ld512(&PL_DUP), _mm512_castps256_ps512(s8));
        pair_tokens::<4, T, SPLIT>(&us, scales, step, toks, [a0, a1]);
    }

    /// Row `(words, scales)` at step `s`, its stream prefetched [`PLANES_AHEAD`] on.
    #[inline(always)]
    unsafe fn pl_at((w, sc): (&[u64], &[u16]), s: usize) -> (*const u64, *const u16) {
        let (w, sc) = (w.as_ptr().add(DM_TILES * s), sc.as_ptr().add(DM_TILES * s));
        // A prefetch never faults: the addresses may lie past the rows.
        _mm_prefetch::<_MM_HINT_T1>((w as *const u8).wrapping_add(PLANES_AHEAD) as *const i8);
        _mm_prefetch::<_MM_HINT_T1>((sc as *const u8).wrapping_add(PLANES_AHEAD / 4) as *const i8);
        (w, sc)
    }

    /// `Σ code·x` over `N` repacked rows (their words and scales, `groups` tiles each),
    /// plus their overlays `ov`, for `T` tokens: [`dm_row`] over the planes.
    #[inline(always)]
    unsafe fn pl_row<const N: usize, const T: usize, const SPLIT: bool>(
        rows: [(&[u64], &[u16]); N],
        groups: usize,
        toks: &[DmTok; T],
        ov: [OvRow; N],
    ) -> [[f32; T]; N] {
        prefetch_overlays(&ov);
        let mut acc = [[_mm512_setzero_ps(); T]; N];
        for (w, sc) in rows {
            debug_assert!(w.len() == groups && sc.len() == groups);
        }
        let (full, tail) = (groups / DM_TILES, groups % DM_TILES);
        for s in 0..full {
            let at = array_of(|r| pl_at(rows[r], s));
            pl_step::<N, T, SPLIT>(at, DM_TILES, s, toks, &mut acc);
        }
        let at: [_; N] = array_of(|r| pl_at(rows[r], full));
        if N == 2 && 0 < tail && tail <= DM_TILES / 2 {
            let [a, b] = &mut acc[..] else {
                unreachable!("two rows")
            };
            pl_tail_pair::<T, SPLIT>([at[0], at[1]], tail, full, toks, [a, b]);
        } else if tail > 0 {
            pl_step::<N, T, SPLIT>(at, tail, full, toks, &mut acc);
        }
        let mut out = [[0f32; T]; N];
        for r in 0..N {
            overlay_gathered(ov[r], &mut acc[r], toks);
            for (o, a) in out[r].iter_mut().zip(&acc[r]) {
                *o = _mm512_reduce_add_ps(*a);
            }
        }
        out
    }

    // ---- the digit-major kernel on AVX2 ----------------------------------------------------

    /// Tiles per AVX2 half step: 4 × 7 code bytes in a 32-byte vector (half a
    /// [`DM_TILES`] step of [`DmActs`], whose planes' lanes `0..32` or `32..64` it reads).
    const DM2_TILES: usize = DM_TILES / 2;
    /// Code bytes of a half step: a tile's 7 in bytes `8·i..8·i + 7` of its 128-bit lane
    /// (two tiles a lane, loaded 16 bytes from the first tile's codes: its 7, the second's
    /// scale, the second's 7); byte `8·i + 7` repeats the first and meets a zero activation.
    static DM2_CODE: [u8; 32] = {
        let mut t = [0u8; 32];
        let mut i = 0;
        while i < 32 {
            let (tile, j) = ((i % 16) / 8, i % 8);
            t[i] = (9 * tile + if j < 7 { j } else { 0 }) as u8;
            i += 1;
        }
        t
    };
    /// f16 words `[s₀ s₀ s₁ s₁]` in 128-bit lane 0 and `[s₂ s₂ s₃ s₃]` in lane 1 of the
    /// 32 bytes from a half step's start (scales at bytes 0, 9 | 18, 27, i.e. lane 1's 2, 11).
    static DM2_SCALE: [u8; 32] = {
        let mut t = [0x80u8; 32];
        let mut w = 0;
        while w < 8 {
            let (lane, tile) = (w / 4, (w % 4) / 2);
            let at = 9 * tile + 2 * lane;
            t[16 * lane + 2 * (w % 4)] = at as u8;
            t[16 * lane + 2 * (w % 4) + 1] = (at + 1) as u8;
            w += 1;
        }
        t
    };

    /// `code + 1` of a digit `d` (0 → 1, 1 → 2, 2 → 0).
    const fn u_of(d: usize) -> u8 {
        [1, 2, 0][d % 3]
    }

    /// `vpshufb` tables (both 128-bit lanes) from index `i < 16` to `code + 1`: of digits 0
    /// and 1 of `r₉ = i`, and of the digit whose multiple `t` has low nibble `i` (`t` =
    /// digit·3ᵃ for digit 2 (`t ∈ {0, 9, 18}`) and 3 (`{0, 27, 54}`); for digit 4,
    /// `⌈t/2⌉` of `t ∈ {0, 81, 162, 243}`, the last the non-canonical bytes, digit 0).
    static DM2_TABLE: [[u8; 32]; 5] = {
        let mut t = [[0u8; 32]; 5];
        let mut i = 0;
        while i < 32 {
            let r = i % 16;
            t[0][i] = u_of(r % 3);
            t[1][i] = u_of((r / 3) % 3);
            i += 1;
        }
        let mut l = 0;
        while l < 2 {
            let b = 16 * l;
            t[2][b] = u_of(0);
            t[2][b + 9] = u_of(1);
            t[2][b + 18 % 16] = u_of(2);
            t[3][b] = u_of(0);
            t[3][b + 27 % 16] = u_of(1);
            t[3][b + 54 % 16] = u_of(2);
            t[4][b] = u_of(0);
            t[4][b + 41 % 16] = u_of(1);
            t[4][b + 81 % 16] = u_of(2);
            t[4][b + 122 % 16] = u_of(3);
            l += 1;
        }
        t
    };

    /// The AVX2 kernel's constants, loaded once per call.
    struct Dm2Const {
        code: __m256i,
        scale: __m256i,
        table: [__m256i; 5],
    }

    #[inline(always)]
    unsafe fn dm2_const() -> Dm2Const {
        Dm2Const {
            code: ld256(&DM2_CODE),
            scale: ld256(&DM2_SCALE),
            table: std::array::from_fn(|a| ld256(&DM2_TABLE[a])),
        }
    }

    /// `x mod k` for `x < 2k` (bytes): `min(x, x − k)` unsigned, as `x − k` wraps above
    /// `x` when `x < k`.
    #[inline(always)]
    unsafe fn mod_step(x: __m256i, k: i8) -> __m256i {
        _mm256_min_epu8(x, _mm256_sub_epi8(x, _mm256_set1_epi8(k)))
    }

    /// The five digit vectors `code + 1 ∈ {0, 1, 2}` of the 32 code bytes `b`, by byte
    /// compares and 16-entry lookups only (no multiplier: [`codes_i16`] spent two
    /// multiplies and two compares per 16 codes, this 21 operations per 160 digits).
    /// `r = b mod 81` by subtracting 162 then 81 where they fit (the non-canonical
    /// `b ≥ 243` end at `b − 243`), and digit 4 from `t = b − r ∈ {0, 81, 162, 243}`;
    /// likewise `r₃ = r mod 27` (digit 3), `r₉ = r₃ mod 9` (digit 2), and digits 0 and 1
    /// from `r₉` directly. Each multiple `t` is looked up by its low nibble (`vpshufb`
    /// reads 4 bits and zeroes on bit 7), distinct for `{0, 27, 54}` and `{0, 9, 18}`;
    /// for digit 4 by `⌈t/2⌉ ∈ {0, 41, 81, 122}`, whose bit 7 is clear.
    #[inline(always)]
    unsafe fn dm2_digits(k: &Dm2Const, b: __m256i) -> [__m256i; 5] {
        let r = mod_step(mod_step(b, 162u8 as i8), 81);
        let t4 = _mm256_avg_epu8(_mm256_sub_epi8(b, r), _mm256_setzero_si256());
        let r3 = mod_step(mod_step(r, 54), 27);
        let r9 = mod_step(mod_step(r3, 18), 9);
        [
            _mm256_shuffle_epi8(k.table[0], r9),
            _mm256_shuffle_epi8(k.table[1], r9),
            _mm256_shuffle_epi8(k.table[2], _mm256_sub_epi8(r3, r9)),
            _mm256_shuffle_epi8(k.table[3], _mm256_sub_epi8(r, r3)),
            _mm256_shuffle_epi8(k.table[4], t4),
        ]
    }

    /// `Σ (code + 1)·x` per 32-bit lane of half `half` of step `step`, for level `l` of
    /// token `tk` (without the lanes' `−Σx`). `vpmaddubsw` pairs are at most `2·2·128` and
    /// five of them `2560`: the int16 sums before `vpmaddwd` are exact.
    #[inline(always)]
    unsafe fn dm2_dot(
        u: &[__m256i; 5],
        tk: &DmTok,
        l: usize,
        (step, half): (usize, usize),
    ) -> __m256i {
        let x = tk.x[l].add(step * DM_X + 32 * half);
        let mut s = _mm256_maddubs_epi16(u[0], _mm256_loadu_si256(x as *const __m256i));
        for (a, u) in u.iter().enumerate().skip(1) {
            let xa = _mm256_loadu_si256(x.add(64 * a) as *const __m256i);
            s = _mm256_add_epi16(s, _mm256_maddubs_epi16(*u, xa));
        }
        _mm256_madd_epi16(s, _mm256_set1_epi16(1))
    }

    /// Half `half` of step `step` (`n ≤ 4` tiles at `p`, whose next 36 bytes may all be
    /// read) of one row against `T` tokens; with the residual level when `SPLIT`. The
    /// scales of tiles past `n` are zeroed: whatever bytes lie there, they add
    /// `0·Σ code·0`. Split tokens have one scale, applied at the end (`dm2_row`), and their
    /// lanes' `−Σx` of both levels come combined ([`DmTok::cs`]); else each lane takes its
    /// group's scale here. (One row per call: two, sharing the activation loads as
    /// [`dm_step`] does, spilled the 16 registers and ran 0.90–0.95.)
    #[inline(always)]
    unsafe fn dm2_step<const T: usize, const SPLIT: bool>(
        k: &Dm2Const,
        p: *const u8,
        (step, half, n): (usize, usize, usize),
        toks: &[DmTok; T],
        acc: &mut [__m256; T],
    ) {
        let lo = _mm_loadu_si128(p.add(2) as *const __m128i);
        let hi = _mm_loadu_si128(p.add(2 + 2 * Q1T_TILE) as *const __m128i);
        let u = dm2_digits(k, _mm256_shuffle_epi8(_mm256_set_m128i(hi, lo), k.code));
        let s = _mm256_shuffle_epi8(_mm256_loadu_si256(p as *const __m256i), k.scale);
        let s = _mm256_permute4x64_epi64::<0b11_01_10_00>(s);
        let mut scale = _mm256_cvtph_ps(_mm256_castsi256_si128(s));
        if n < DM2_TILES {
            let lanes = _mm256_set1_epi32(2 * n as i32);
            let keep = _mm256_cmpgt_epi32(lanes, _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
            scale = _mm256_and_ps(scale, _mm256_castsi256_ps(keep));
        }
        let lanes = step * DM_LANES + 8 * half;
        for (acc, tk) in acc.iter_mut().zip(toks) {
            let (dot, f) = if SPLIT {
                // As `dm_step`: a lane sums 20 codes, below 2²⁰ after the shift.
                let hi = dm2_dot(&u, tk, 0, (step, half));
                let lo = dm2_dot(&u, tk, 1, (step, half));
                let c = _mm256_loadu_si256(tk.cs.add(lanes) as *const __m256i);
                let dot = _mm256_add_epi32(_mm256_slli_epi32::<{ SPLIT_SHIFT }>(hi), lo);
                (_mm256_add_epi32(dot, c), scale)
            } else {
                let c = _mm256_loadu_si256(tk.c[0].add(lanes) as *const __m256i);
                let dot = _mm256_add_epi32(dm2_dot(&u, tk, 0, (step, half)), c);
                (dot, _mm256_mul_ps(scale, _mm256_loadu_ps(tk.d.add(lanes))))
            };
            *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), f, *acc);
        }
    }

    /// `Σ code·x` over one row's tiles (`groups` of them, at the start of `tiles`), plus
    /// its overlay `ov`, for `T` tokens ([`dm_row`] on AVX2), a step's two halves in turn.
    /// A last half step of fewer than 4 tiles reads on into what follows the row in
    /// `tiles` (the next row, or `row_ptr`) with those tiles' scales zeroed; where fewer
    /// than 36 bytes follow (a matrix of a few rows), it runs from a zeroed copy. (A copy
    /// per row cost SmolLM2, whose 576 columns end in a half step of 2 tiles, 11% of its
    /// decode.)
    #[inline(always)]
    unsafe fn dm2_row<const T: usize, const SPLIT: bool>(
        k: &Dm2Const,
        tiles: &[u8],
        groups: usize,
        toks: &[DmTok; T],
        ov: OvRow,
    ) -> [f32; T] {
        let [p] = row_starts([tiles], groups, &[ov]);
        let mut acc = [_mm256_setzero_ps(); T];
        let half = DM2_TILES * Q1T_TILE;
        let full = groups / DM_TILES;
        for s in 0..full {
            prefetch_step(p, s);
            let at = p.add(s * 2 * half);
            dm2_step::<T, SPLIT>(k, at, (s, 0, DM2_TILES), toks, &mut acc);
            dm2_step::<T, SPLIT>(k, at.add(half), (s, 1, DM2_TILES), toks, &mut acc);
        }
        // What is left: up to 7 tiles, a whole half step and a partial one.
        let mut left = groups % DM_TILES;
        let mut h = 0;
        while left > 0 {
            let n = left.min(DM2_TILES);
            let from = (2 * full + h) * half;
            if tiles.len() >= from + half {
                dm2_step::<T, SPLIT>(k, p.add(from), (full, h, n), toks, &mut acc);
            } else {
                let mut copy = [0u8; DM2_TILES * Q1T_TILE];
                copy[..n * Q1T_TILE].copy_from_slice(&tiles[from..from + n * Q1T_TILE]);
                dm2_step::<T, SPLIT>(k, copy.as_ptr(), (full, h, n), toks, &mut acc);
            }
            left -= n;
            h += 1;
        }
        finish_avx2::<T, SPLIT>(&acc, toks, ov)
    }

    /// One row's overlay `ov` on AVX2, `delta·x[col]` over its entries, for each token
    /// `xs[j]`: 8 entries per gather into the lanes of one vector per token (lanes past the
    /// row's count gather and add nothing).
    #[inline(always)]
    unsafe fn overlay_avx2<const T: usize>(ov: OvRow, xs: &[DmTok; T]) -> [__m256; T] {
        let n = ov.len();
        let mut v = [_mm256_setzero_ps(); T];
        let iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        let mut e = 0;
        while e < n {
            let keep = _mm256_cmpgt_epi32(_mm256_set1_epi32((n - e).min(8) as i32), iota);
            let at = ov.ent.as_ptr().add(Q1T_ENTRY * e);
            let ev = _mm256_maskload_epi32(at as *const i32, keep);
            let cols = _mm256_and_si256(ev, _mm256_set1_epi32(0xFFFF));
            let dl = ov.deltas8(e, ev, keep);
            for (v, x) in v.iter_mut().zip(xs) {
                let z = _mm256_setzero_ps();
                let xv = _mm256_mask_i32gather_ps::<4>(z, x.xf, cols, _mm256_castsi256_ps(keep));
                *v = _mm256_fmadd_ps(xv, dl, *v);
            }
            e += 8;
        }
        v
    }

    /// The AVX2 rows' values: each token's accumulator (times its one scale when `SPLIT`)
    /// plus its overlay lanes ([`overlay_avx2`]), summed across lanes.
    #[inline(always)]
    unsafe fn finish_avx2<const T: usize, const SPLIT: bool>(
        acc: &[__m256; T],
        toks: &[DmTok; T],
        ov: OvRow,
    ) -> [f32; T] {
        // Loops, not closures: a closure would not inherit the caller's target features,
        // and its intrinsics would not inline.
        let over = overlay_avx2(ov, toks);
        let mut out = [0f32; T];
        for j in 0..T {
            let v = if SPLIT {
                _mm256_fmadd_ps(acc[j], _mm256_set1_ps(*toks[j].d), over[j])
            } else {
                _mm256_add_ps(acc[j], over[j])
            };
            out[j] = hsum256(v);
        }
        out
    }

    /// The sum of 8 lanes, in a fixed order.
    #[inline(always)]
    unsafe fn hsum256(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
    }

    /// Lays out one level's codes digit-major ([`DmLevel::push_scalar`]'s layout) on AVX2:
    /// per group, two planes per 128-bit lane by byte shuffles of its low and high 16
    /// codes, and the lanes' `−Σx`.
    ///
    /// # Safety
    /// AVX2; as [`dm_push`].
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn dm_push_avx2(x: &mut [i8], c: &mut [i32], groups: usize, codes: &[i8]) {
        let steps = groups.div_ceil(DM_TILES);
        assert!(x.len() >= steps * DM_X && c.len() >= steps * DM_LANES);
        assert_eq!(codes.len(), groups * STEP);
        let ctl: [[__m256i; 2]; 2] =
            std::array::from_fn(|v| std::array::from_fn(|h| ld256(&DM2_PUSH[v][h])));
        for (g, q) in codes.chunks_exact(STEP).enumerate() {
            let v = _mm256_loadu_si256(q.as_ptr() as *const __m256i);
            let lo = _mm256_permute2x128_si256::<0x00>(v, v);
            let hi = _mm256_permute2x128_si256::<0x11>(v, v);
            let planes: [__m256i; 2] = std::array::from_fn(|w| {
                _mm256_or_si256(
                    _mm256_shuffle_epi8(lo, ctl[w][0]),
                    _mm256_shuffle_epi8(hi, ctl[w][1]),
                )
            });
            let at = x
                .as_mut_ptr()
                .add((g / DM_TILES) * DM_X + 8 * (g % DM_TILES));
            let (p01, p23) = (
                _mm256_castsi256_si128(planes[0]),
                _mm256_extracti128_si256::<1>(planes[0]),
            );
            _mm_storel_epi64(at as *mut __m128i, p01);
            _mm_storel_epi64(at.add(64) as *mut __m128i, _mm_unpackhi_epi64(p01, p01));
            _mm_storel_epi64(at.add(128) as *mut __m128i, p23);
            _mm_storel_epi64(at.add(192) as *mut __m128i, _mm_unpackhi_epi64(p23, p23));
            _mm_storel_epi64(
                at.add(256) as *mut __m128i,
                _mm256_castsi256_si128(planes[1]),
            );
            let lanes = (g / DM_TILES) * DM_LANES + 2 * (g % DM_TILES);
            let sum = |r: Range<usize>| -q[r].iter().map(|&v| i32::from(v)).sum::<i32>();
            c[lanes] = sum(0..20);
            c[lanes + 1] = sum(20..STEP);
        }
    }

    /// [`dm_push_avx2`]'s shuffles: `[v][h]` reads the low (`h = 0`) or high 16 codes of a
    /// group into vector `v` (`v = 0`: planes 0, 1 | 2, 3 by 128-bit lane; `v = 1`: plane
    /// 4 in lane 0). Byte `8·p + j` of a lane takes code `5j + a` (`a` the plane) when it
    /// is one of the group's 32 and in that half; else `0x80` (zero).
    static DM2_PUSH: [[[u8; 32]; 2]; 2] = {
        let mut t = [[[0x80u8; 32]; 2]; 2];
        let mut v = 0;
        while v < 2 {
            let mut h = 0;
            while h < 2 {
                let mut i = 0;
                while i < 32 {
                    let a = 4 * v + 2 * (i / 16) + (i % 16) / 8;
                    let code = 5 * (i % 8) + a;
                    if a < 5 && i % 8 < 7 && code < STEP && code / 16 == h {
                        t[v][h][i] = (code % 16) as u8;
                    }
                    i += 1;
                }
                h += 1;
            }
            v += 1;
        }
        t
    };

    // ---- the planes kernel on AVX2 ----------------------------------------------------------

    /// `vpermps` index spreading a half step's 4 tile scales to their two 32-bit lanes each.
    static PL2_DUP: [i32; 8] = [0, 0, 1, 1, 2, 2, 3, 3];

    /// The four byte planes `u = code + 1` of 32 bytes of tile words (4 tiles).
    #[inline(always)]
    unsafe fn pl2_units(w: __m256i) -> [__m256i; 4] {
        let m3 = _mm256_set1_epi8(3);
        [
            _mm256_and_si256(w, m3),
            _mm256_and_si256(_mm256_srli_epi16::<2>(w), m3),
            _mm256_and_si256(_mm256_srli_epi16::<4>(w), m3),
            _mm256_and_si256(_mm256_srli_epi16::<6>(w), m3),
        ]
    }

    /// A token's view of one half step for the AVX2 planes kernel: its level planes
    /// (`x[l] + 64·p` for plane `p`) and its lanes' `−Σx` (both levels combined when split)
    /// and group scales; `pair` copies the first two tiles' bytes and lanes into the upper
    /// half (the paired tail of [`pl2_rows`]).
    struct Pl2Acts {
        x: [*const i8; 2],
        c: __m256i,
        d: __m256,
        pair: bool,
    }

    impl Pl2Acts {
        #[inline(always)]
        unsafe fn new<const SPLIT: bool>(
            tk: &DmTok,
            (step, half): (usize, usize),
            pair: bool,
        ) -> Self {
            let off = step * DM_X + 32 * half;
            let lanes = step * DM_LANES + 8 * half;
            let c = if SPLIT { tk.cs } else { tk.c[0] };
            let mut c = _mm256_loadu_si256(c.add(lanes) as *const __m256i);
            let mut d = _mm256_loadu_ps(tk.d.add(lanes));
            if pair {
                c = _mm256_permute2x128_si256::<0x00>(c, c);
                d = _mm256_permute2f128_ps::<0x00>(d, d);
            }
            Pl2Acts {
                x: [tk.x[0].add(off), tk.x[1].add(off)],
                c,
                d,
                pair,
            }
        }

        /// Plane `p` of level `l`.
        #[inline(always)]
        unsafe fn plane(&self, l: usize, p: usize) -> __m256i {
            let v = _mm256_loadu_si256(self.x[l].add(64 * p) as *const __m256i);
            if self.pair {
                _mm256_permute2x128_si256::<0x00>(v, v)
            } else {
                v
            }
        }

        /// `Σ u·x` per int16 lane for level `l` over the four planes `us`: `vpmaddubsw`
        /// pairs are at most `2·2·128` and four of them `2048`, exact in int16.
        #[inline(always)]
        unsafe fn dot16(&self, us: &[__m256i; 4], l: usize) -> __m256i {
            let mut s = _mm256_maddubs_epi16(us[0], self.plane(l, 0));
            for (p, u) in us.iter().enumerate().skip(1) {
                s = _mm256_add_epi16(s, _mm256_maddubs_epi16(*u, self.plane(l, p)));
            }
            s
        }

        /// `Σ code·x` per 32-bit lane (16 codes) of tile words `w`: from the lanes' `−Σx`,
        /// `Σ u·x − Σx`; with `SPLIT` the two levels as `(dot << SPLIT_SHIFT) + dot₂`, the
        /// shift folded into the `vpmaddwd` that widens the first (below 2²⁰).
        #[inline(always)]
        unsafe fn dot<const SPLIT: bool>(&self, w: __m256i) -> __m256i {
            let us = pl2_units(w);
            let hi = self.dot16(&us, 0);
            let dot = if SPLIT {
                let hi = _mm256_madd_epi16(hi, _mm256_set1_epi16(1 << SPLIT_SHIFT));
                let lo = _mm256_madd_epi16(self.dot16(&us, 1), _mm256_set1_epi16(1));
                _mm256_add_epi32(hi, lo)
            } else {
                _mm256_madd_epi16(hi, _mm256_set1_epi16(1))
            };
            _mm256_add_epi32(dot, self.c)
        }
    }

    /// One half step (4 tiles) of `N` repacked rows (their words `w`, their scales spread to
    /// two lanes each in `scale`) against `T` tokens; with the residual level when `SPLIT`
    /// ([`pl_step`] on AVX2, with `vpmaddubsw` for `vpdpbusd`). Split tokens have one
    /// scale, applied at the end; else each lane takes its group's here. Tiles past a row's
    /// end have zero words and zero activations: they add nothing.
    #[inline(always)]
    unsafe fn pl2_step<const N: usize, const T: usize, const SPLIT: bool>(
        w: &[__m256i; N],
        scale: &[__m256; N],
        at: (usize, usize),
        toks: &[DmTok; T],
        acc: &mut [[__m256; T]; N],
    ) {
        // Tokens outside, rows inside: a row's planes are split again per token (decode
        // has one), which keeps the registers for the rows' independent chains.
        for (q, tk) in toks.iter().enumerate() {
            let xs = Pl2Acts::new::<SPLIT>(tk, at, false);
            for r in 0..N {
                let f = if SPLIT {
                    scale[r]
                } else {
                    _mm256_mul_ps(scale[r], xs.d)
                };
                let dot = _mm256_cvtepi32_ps(xs.dot::<SPLIT>(w[r]));
                acc[r][q] = _mm256_fmadd_ps(dot, f, acc[r][q]);
            }
        }
    }

    /// The 4 f16 scales `s` of a half step spread to their tiles' two lanes each.
    #[inline(always)]
    unsafe fn pl2_scales(s: __m128i) -> __m256 {
        let dup = _mm256_loadu_si256(PL2_DUP.as_ptr() as *const __m256i);
        _mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_cvtph_ps(s)), dup)
    }

    /// The first `n < 4` of 4 tile words at `w` (masked: past them lies the next row, or
    /// the end of the rows) and their scales at `s` (one by one), the others zero.
    #[inline(always)]
    unsafe fn pl2_part(w: *const u64, s: *const u16, n: usize) -> (__m256i, __m128i) {
        let iota = _mm256_setr_epi64x(0, 1, 2, 3);
        let keep = _mm256_cmpgt_epi64(_mm256_set1_epi64x(n as i64), iota);
        let words = _mm256_maskload_epi64(w as *const i64, keep);
        let s = |i: usize| if i < n { *s.add(i) as i16 } else { 0 };
        (words, _mm_setr_epi16(s(0), s(1), s(2), 0, 0, 0, 0, 0))
    }

    /// `Σ code·x` over `N` repacked rows (their tile words and scales, `groups` tiles
    /// each), plus their overlays `ov`, for `T` tokens: [`pl_row`] on AVX2, in half steps
    /// of 4 tiles. The rows' last half step of `n < 4` tiles loads only their own words and
    /// scales ([`pl2_part`]); for two rows with `n ≤ 2` (SmolLM2's 576 columns are 4½ half
    /// steps) it runs as one, the first row's tiles in lanes 0..4 and the second's in 4..8
    /// against the token's planes copied into both halves, each row's accumulator taking
    /// its own lanes (the other's scales zeroed): each lane sees the operations of a
    /// one-row tail, so the values do not depend on the pairing.
    #[inline(always)]
    unsafe fn pl2_rows<const N: usize, const T: usize, const SPLIT: bool>(
        rows: [(&[u64], &[u16]); N],
        groups: usize,
        toks: &[DmTok; T],
        ov: [OvRow; N],
    ) -> [[f32; T]; N] {
        prefetch_overlays(&ov);
        for (w, sc) in &rows {
            debug_assert!(w.len() == groups && sc.len() == groups);
        }
        let mut acc = [[_mm256_setzero_ps(); T]; N];
        let full = groups / DM2_TILES;
        for h in 0..full {
            let at = DM2_TILES * h;
            let mut w = [_mm256_setzero_si256(); N];
            let mut scale = [_mm256_setzero_ps(); N];
            for r in 0..N {
                if h % 2 == 0 {
                    pl_at(rows[r], h / 2);
                }
                w[r] = _mm256_loadu_si256(rows[r].0.as_ptr().add(at) as *const __m256i);
                scale[r] =
                    pl2_scales(_mm_loadl_epi64(rows[r].1.as_ptr().add(at) as *const __m128i));
            }
            pl2_step::<N, T, SPLIT>(&w, &scale, (h / 2, h % 2), toks, &mut acc);
        }
        let n = groups % DM2_TILES;
        let at = DM2_TILES * full;
        if N == 2 && 0 < n && n <= DM2_TILES / 2 {
            let (wa, sa) = pl2_part(rows[0].0.as_ptr().add(at), rows[0].1.as_ptr().add(at), n);
            let (wb, sb) = pl2_part(rows[1].0.as_ptr().add(at), rows[1].1.as_ptr().add(at), n);
            let w = _mm256_permute2x128_si256::<0x20>(wa, wb);
            let scale = pl2_scales(_mm_unpacklo_epi32(sa, sb));
            let low = _mm256_castsi256_ps(_mm256_setr_epi32(-1, -1, -1, -1, 0, 0, 0, 0));
            let swapped = _mm256_permute2f128_ps::<0x01>(scale, scale);
            let sides = [_mm256_and_ps(scale, low), _mm256_and_ps(swapped, low)];
            for (q, tk) in toks.iter().enumerate() {
                let xs = Pl2Acts::new::<SPLIT>(tk, (full / 2, full % 2), true);
                let dot = _mm256_cvtepi32_ps(xs.dot::<SPLIT>(w));
                // The second row's lanes moved down to where its one-row tail has them.
                let dots = [dot, _mm256_permute2f128_ps::<0x01>(dot, dot)];
                for r in 0..N {
                    let f = if SPLIT {
                        sides[r]
                    } else {
                        _mm256_mul_ps(sides[r], xs.d)
                    };
                    acc[r][q] = _mm256_fmadd_ps(dots[r], f, acc[r][q]);
                }
            }
        } else if n > 0 {
            let mut w = [_mm256_setzero_si256(); N];
            let mut scale = [_mm256_setzero_ps(); N];
            for r in 0..N {
                let (wr, sr) = pl2_part(rows[r].0.as_ptr().add(at), rows[r].1.as_ptr().add(at), n);
                (w[r], scale[r]) = (wr, pl2_scales(sr));
            }
            pl2_step::<N, T, SPLIT>(&w, &scale, (full / 2, full % 2), toks, &mut acc);
        }
        let mut out = [[0f32; T]; N];
        for r in 0..N {
            out[r] = finish_avx2::<T, SPLIT>(&acc[r], toks, ov[r]);
        }
        out
    }

    /// The AVX2 digit-major kernel's tiles ([`DmTile`] on AVX2), or with `planes` its
    /// planes kernel over the repacked rows. Built only by [`dm2_block`].
    struct Dm2Tile<'a> {
        k: Dm2Const,
        dm: &'a DmActs,
        /// The repacked rows, which the planes kernel reads instead of the tiles.
        planes: Option<&'a Q1tPlanes>,
    }

    impl Tile for Dm2Tile<'_> {
        #[inline(always)]
        fn tile<P: FnMut(usize, usize, f32), const R: usize, const T: usize>(
            &self,
            cx: &Q1tProduct,
            o: usize,
            j: usize,
            put: &mut P,
        ) {
            let ts: [DmTok; T] = array_of(|q| self.dm.token(j + q));
            let groups = cx.g.cols / STEP;
            let rb = groups * Q1T_TILE;
            let rows = cx.rows::<R>(o);
            let mut out = [[0f32; T]; R];
            if let Some(p) = self.planes {
                // Two rows at a time (independent chains, a shared tail), then an odd one.
                for (i, pair) in rows.chunks(2).enumerate() {
                    let row = |r: usize| (p.codes(r), p.scales(r));
                    let ov = |r: usize| cx.ov.row(cx.bytes, r);
                    // SAFETY: as below; `dm` is in the planes layout (`dm2_block`).
                    unsafe {
                        if let [a, b] = *pair {
                            let (rs, os) = ([row(a), row(b)], [ov(a), ov(b)]);
                            let v = if self.dm.split {
                                pl2_rows::<2, T, true>(rs, groups, &ts, os)
                            } else {
                                pl2_rows::<2, T, false>(rs, groups, &ts, os)
                            };
                            out[2 * i] = v[0];
                            out[2 * i + 1] = v[1];
                        } else {
                            let (rs, os) = ([row(pair[0])], [ov(pair[0])]);
                            out[2 * i] = if self.dm.split {
                                pl2_rows::<1, T, true>(rs, groups, &ts, os)[0]
                            } else {
                                pl2_rows::<1, T, false>(rs, groups, &ts, os)[0]
                            };
                        }
                    }
                }
                put_tile(o, j, &out, put);
                return;
            }
            for (out, &r) in out.iter_mut().zip(&rows) {
                // The row and all that follows it (see `dm2_row`'s tail).
                let tiles = &cx.bytes[r * rb..];
                let ov = cx.ov.row(cx.bytes, r);
                // SAFETY: a `Dm2Tile` exists only inside `dm2_block`, whose caller checked
                // AVX2 and built `dm` from all tokens (in the planes layout with `planes`).
                *out = unsafe {
                    if self.dm.split {
                        dm2_row::<T, true>(&self.k, tiles, groups, &ts, ov)
                    } else {
                        dm2_row::<T, false>(&self.k, tiles, groups, &ts, ov)
                    }
                };
            }
            put_tile(o, j, &out, put);
        }
    }

    /// [`dm_block`] on AVX2 ([`Kernel::Avx2`]).
    ///
    /// # Safety
    /// AVX2, FMA, F16C; `dm` holds all `cx.t` tokens; the payload is validated.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dm2_block<P: FnMut(usize, usize, f32)>(
        cx: &Q1tProduct,
        dm: &DmActs,
        outs: Range<usize>,
        toks: Range<usize>,
        put: &mut P,
    ) {
        debug_assert_eq!(dm.planes, cx.planes.is_some());
        let tile = Dm2Tile {
            k: dm2_const(),
            dm,
            planes: cx.planes,
        };
        cx.tiles(&tile, outs, toks, put);
    }
}

#[cfg(target_arch = "x86_64")]
pub(in crate::quant) use simd::dm_available;
#[cfg(target_arch = "x86_64")]
use simd::{DmTok, DM_LANES, DM_TILES, DM_X};

#[cfg(not(target_arch = "x86_64"))]
pub(super) fn dm_available() -> bool {
    false
}
#[cfg(not(target_arch = "x86_64"))]
const DM_TILES: usize = 8;
#[cfg(not(target_arch = "x86_64"))]
const DM_X: usize = 5 * 64;
#[cfg(not(target_arch = "x86_64"))]
const DM_LANES: usize = 16;

// ---- digit-major activations -------------------------------------------------------------

/// Quantized activations in the digit-major order of the integer kernels (AVX-512, AVX2), with the
/// activations they were built from (the key: a product over the same activations reuses
/// them) and those dequantized, which the overlay reads. Per level ([`DmLevel`]: the codes, and
/// under `Balanced` their residual) and per token and step of 8 groups: `x[5][64]` and
/// `c[16]`; per token and step `d[16]` (lane `l`: the scale of group `l / 2`).
#[derive(Default)]
struct DmActs {
    key_d: Vec<f32>,
    /// Per token, the dequantized activations ([`ActAt`] for [`QToken`]), `groups·32`.
    xf: Vec<f32>,
    /// Groups and steps per token.
    groups: usize,
    steps: usize,
    /// Whether level 1 (the residual codes) is filled.
    split: bool,
    /// Whether the levels are in the planes layout of [`super::q1t_planes`] (else
    /// digit-major).
    planes: bool,
    levels: [DmLevel; 2],
    /// Under `Balanced`, per token and step the lanes' `c` of both levels combined,
    /// `(c₀ << SPLIT_SHIFT) + c₁`, for the AVX2 kernel.
    cs: Vec<i32>,
    d: Vec<f32>,
}

/// One level of [`DmActs`]: `x` (plane `a`, lane `8·i + j` = code `5j + a` of group `i`,
/// zero where no weight is) and `c` (`−Σ` of the `x` of each 4-byte lane over the planes).
#[derive(Default)]
struct DmLevel {
    /// The codes of every token.
    key: Vec<i8>,
    x: Vec<i8>,
    c: Vec<i32>,
}

impl DmLevel {
    fn reserve(&mut self, t: usize, groups: usize, steps: usize) {
        let grow = |v: usize, n: usize| n.saturating_sub(v);
        self.key.reserve(grow(self.key.len(), t * groups * STEP));
        self.x.reserve(grow(self.x.len(), t * steps * DM_X));
        self.c.reserve(grow(self.c.len(), t * steps * DM_LANES));
    }

    /// Empties the level and zeroes room for `t` tokens of `steps` steps.
    fn reset(&mut self, t: usize, steps: usize) {
        self.key.clear();
        self.x.clear();
        self.x.resize(t * steps * DM_X, 0);
        self.c.clear();
        self.c.resize(t * steps * DM_LANES, 0);
    }

    /// Whether token `j`'s key (of `n` codes) is `codes`.
    fn holds(&self, j: usize, n: usize, codes: &[i8]) -> bool {
        let at = j * n;
        self.key.get(at..at + n) == Some(codes)
    }

    /// Appends token `j`'s codes (`groups` groups) and lays them out digit-major, with the
    /// byte permutes of kernel `k`'s level (scalar: [`DmLevel::push_scalar`]).
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))]
    fn push(&mut self, k: Kernel, j: usize, groups: usize, steps: usize, codes: &[i8]) {
        self.key.extend_from_slice(codes);
        #[cfg(target_arch = "x86_64")]
        if k != Kernel::Scalar {
            let x = &mut self.x[j * steps * DM_X..(j + 1) * steps * DM_X];
            let c = &mut self.c[j * steps * DM_LANES..(j + 1) * steps * DM_LANES];
            let codes = &codes[..groups * STEP];
            // SAFETY: `dm_available()` (AVX-512 VBMI, VNNI, F/BW), else AVX2 (every level
            // above scalar has it); the slices are one token's `steps` steps, and `codes`
            // holds `groups ≤ 8·steps` groups.
            return unsafe {
                if k == Kernel::Avx512 && dm_available() {
                    simd::dm_push(x, c, groups, codes)
                } else {
                    simd::dm_push_avx2(x, c, groups, codes)
                }
            };
        }
        self.push_scalar(j, groups, steps, codes);
    }

    /// Appends token `j`'s codes (`groups` groups) in the planes layout of the kernel over
    /// [`super::q1t_planes::Q1tPlanes`]: plane `p` (bytes `64·p ..` of a step's `DM_X`),
    /// lane `8·i + m` = code `8·p + m` of group `i`, the layout of the tile words' bytes;
    /// `c` lane `2·i + h` (the 32-bit lane of bytes `8·i + 4·h ..`) is `−Σ` of its bytes
    /// over the four planes. Eight-byte copies and sums: O(cols), no SIMD needed.
    fn push_planes(&mut self, j: usize, groups: usize, steps: usize, codes: &[i8]) {
        self.key.extend_from_slice(codes);
        for g in 0..groups {
            let (s, i) = (j * steps + g / DM_TILES, g % DM_TILES);
            let x = &mut self.x[s * DM_X..(s + 1) * DM_X];
            let c = &mut self.c[s * DM_LANES..(s + 1) * DM_LANES];
            let q = &codes[g * STEP..(g + 1) * STEP];
            for (p, q) in q.chunks_exact(8).enumerate() {
                x[64 * p + 8 * i..64 * p + 8 * i + 8].copy_from_slice(q);
                for (h, half) in q.chunks_exact(4).enumerate() {
                    c[2 * i + h] -= half.iter().map(|&v| v as i32).sum::<i32>();
                }
            }
        }
    }

    /// [`DmLevel::push`]'s layout, one code at a time (the reference), without the key.
    fn push_scalar(&mut self, j: usize, groups: usize, steps: usize, codes: &[i8]) {
        for g in 0..groups {
            let (s, i) = (j * steps + g / DM_TILES, g % DM_TILES);
            let x = &mut self.x[s * DM_X..(s + 1) * DM_X];
            let c = &mut self.c[s * DM_LANES..(s + 1) * DM_LANES];
            for (e, &q) in codes[g * STEP..(g + 1) * STEP].iter().enumerate() {
                let lane = 8 * i + e / 5;
                x[64 * (e % 5) + lane] = q;
                c[lane / 4] -= q as i32;
            }
        }
    }
}

impl DmActs {
    /// Makes room for `t` tokens of `cols` activations with both levels.
    fn reserve(&mut self, cols: usize, t: usize) {
        let groups = cols.div_ceil(STEP);
        let steps = groups.div_ceil(DM_TILES);
        for l in &mut self.levels {
            l.reserve(t, groups, steps);
        }
        self.key_d
            .reserve((t * groups).saturating_sub(self.key_d.len()));
        self.xf
            .reserve((t * groups * STEP).saturating_sub(self.xf.len()));
        self.d
            .reserve((t * steps * DM_LANES).saturating_sub(self.d.len()));
        self.cs
            .reserve((t * steps * DM_LANES).saturating_sub(self.cs.len()));
    }

    /// Rebuilds from tokens `0..t` of `qa` (`groups` groups each), digit-major or in
    /// `planes` layout, unless they are what it holds; `k` dequantizes them for the
    /// overlay.
    fn refresh(&mut self, k: Kernel, qa: &QuantizedActs, t: usize, groups: usize, planes: bool) {
        let steps = groups.div_ceil(DM_TILES);
        let split = t > 0 && qa.token(0).split();
        let n = groups * STEP;
        let same = self.steps == steps
            && self.groups == groups
            && self.split == split
            && self.planes == planes
            && self.key_d.len() == t * groups
            && self.levels[0].key.len() == t * n
            && (0..t).all(|j| {
                let tk = qa.token(j);
                tk.d == &self.key_d[j * groups..(j + 1) * groups]
                    && self.levels[0].holds(j, n, tk.q)
                    && (!split || self.levels[1].holds(j, n, tk.q2))
            });
        if same {
            return;
        }
        self.steps = steps;
        self.groups = groups;
        self.split = split;
        self.planes = planes;
        self.key_d.clear();
        self.xf.clear();
        self.xf.resize(t * n, 0.0);
        self.d.clear();
        self.d.resize(t * steps * DM_LANES, 0.0);
        self.levels[0].reset(t, steps);
        self.levels[1].reset(if split { t } else { 0 }, steps);
        for j in 0..t {
            let tk = qa.token(j);
            self.key_d.extend_from_slice(tk.d);
            if planes {
                self.levels[0].push_planes(j, groups, steps, tk.q);
            } else {
                self.levels[0].push(k, j, groups, steps, tk.q);
            }
            if split && planes {
                self.levels[1].push_planes(j, groups, steps, tk.q2);
            } else if split {
                self.levels[1].push(k, j, groups, steps, tk.q2);
            }
            for (g, &d) in tk.d.iter().enumerate() {
                let at = (j * steps + g / DM_TILES) * DM_LANES + 2 * (g % DM_TILES);
                self.d[at..at + 2].fill(d);
            }
            dequantize(k, &tk, &mut self.xf[j * n..(j + 1) * n]);
        }
        // Built at every level, though only the AVX2 kernel reads it: 16 lanes per token
        // and step, and the key above would otherwise have to hold the kernel too.
        self.cs.clear();
        if split {
            let (c0, c1) = (&self.levels[0].c, &self.levels[1].c);
            let combined = c0.iter().zip(c1).map(|(&a, &b)| (a << SPLIT_SHIFT) + b);
            self.cs.extend(combined);
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn token(&self, j: usize) -> DmTok {
        let s = j * self.steps;
        let (l0, l1) = (&self.levels[0], &self.levels[usize::from(self.split)]);
        DmTok {
            x: [l0.x[s * DM_X..].as_ptr(), l1.x[s * DM_X..].as_ptr()],
            c: [l0.c[s * DM_LANES..].as_ptr(), l1.c[s * DM_LANES..].as_ptr()],
            cs: if self.split {
                self.cs[s * DM_LANES..].as_ptr()
            } else {
                l0.c[s * DM_LANES..].as_ptr()
            },
            d: self.d[s * DM_LANES..].as_ptr(),
            xf: self.xf[j * self.groups * STEP..].as_ptr(),
        }
    }
}

thread_local! {
    /// The calling thread's digit-major activations; borrowed only inside one task of a
    /// product (no parallel call in between), so products never contend for it.
    static DM: RefCell<DmActs> = RefCell::new(DmActs::default());
    /// The calling thread's dequantized token of a one-token product ([`dequantize`]),
    /// held by [`matvec`] for its parallel section.
    static DEQ: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Sizes the calling thread's buffer for products of up to `cols` columns over up to `t`
/// tokens, so that products do not allocate (see `matrix::reserve_thread_buffers`). A
/// thread inside a product holds its buffer; it then grows when next refreshed.
pub(crate) fn reserve_thread(cols: usize, t: usize) {
    DM.with(|d| {
        if let Ok(mut d) = d.try_borrow_mut() {
            d.reserve(cols, t)
        }
    });
    DEQ.with(|d| {
        if let Ok(mut d) = d.try_borrow_mut() {
            let more = cols.saturating_sub(d.len());
            d.reserve(more)
        }
    });
}

// ---- products ------------------------------------------------------------------------------

/// The activations of a product as `matrix` hands them over: f32 (`Exact`) or quantized
/// per group of 32 in element order (`Fast`, or `Balanced` with the residual level).
#[derive(Clone, Copy)]
pub(crate) enum Q1tActs<'a> {
    F32(&'a [f32]),
    Int(&'a QuantizedActs),
}

/// One product, as `matrix` hands it over: the matrix (geometry, kernel, overlay), its
/// bytes, activations (`t` tokens) and row selection (output `o` is row `sel[o]`, or `o`).
pub(crate) struct Q1tProduct<'a> {
    pub g: Geom,
    pub k: Kernel,
    pub ov: &'a Q1tOverlay,
    pub bytes: &'a [u8],
    pub acts: Q1tActs<'a>,
    pub t: usize,
    pub sel: Option<&'a [u32]>,
    /// The rows repacked at load ([`Q1tPlanes`]), which every product reads instead of
    /// the tiles: at the levels of the digit-major kernels (AVX-512 VBMI + VNNI, AVX2).
    pub planes: Option<&'a Q1tPlanes>,
}

impl Q1tProduct<'_> {
    #[inline]
    fn row(&self, o: usize) -> usize {
        self.sel.map_or(o, |s| s[o] as usize)
    }

    /// Whether quantized activations go to a digit-major kernel: on AVX-512 with VBMI and
    /// VNNI, and at the AVX2 level. (AVX-512 without them keeps the shared integer
    /// kernels, not measured against the AVX2 one.)
    fn uses_dm(&self) -> bool {
        (self.k == Kernel::Avx512 && dm_available()) || self.k.is_avx2()
    }

    /// Outputs `outs` × tokens `toks`; `put(output, token, value)`. `deq`: the one token's
    /// [`dequantize`]d activations for the overlay of the integer tiles, or empty.
    fn block<P: FnMut(usize, usize, f32)>(
        &self,
        outs: Range<usize>,
        toks: Range<usize>,
        deq: &[f32],
        put: &mut P,
    ) {
        self.prefetch_start(&outs);
        match self.acts {
            Q1tActs::F32(x) => self.tiles(&ExactTile(x), outs, toks, put),
            Q1tActs::Int(qa) if self.uses_dm() => self.dm(qa, outs, toks, put),
            Q1tActs::Int(qa) => self.tiles(&IntTile::new(qa, &toks, deq), outs, toks, put),
        }
    }

    /// Asks for the first [`PREFETCH_ROWS`] rows of a task before it starts: a task's
    /// rows are one short stream from memory (a decode step reads each matrix once), and
    /// the kernels' own prefetches reach only rows two blocks ahead.
    fn prefetch_start(&self, outs: &Range<usize>) {
        #[cfg(target_arch = "x86_64")]
        {
            let rb = self.g.cols / STEP * Q1T_TILE;
            for o in outs.start..outs.end.min(outs.start + PREFETCH_ROWS) {
                let (row, len) = match self.planes {
                    Some(p) => (p.codes(self.row(o)).as_ptr() as *const u8, 8 * p.groups()),
                    None => (self.bytes[self.row(o) * rb..].as_ptr(), rb),
                };
                for line in (0..len).step_by(64) {
                    // SAFETY: a prefetch never faults; the address is inside the payload.
                    unsafe { _mm_prefetch::<_MM_HINT_T1>(row.wrapping_add(line) as *const i8) };
                }
            }
        }
    }

    /// Rows `o..o + R` (their payload rows).
    #[inline(always)]
    fn rows<const R: usize>(&self, o: usize) -> [usize; R] {
        match self.sel {
            None => consecutive_rows(o),
            Some(s) => array_of(|i| s[o + i] as usize),
        }
    }

    /// Row blocks of 4 (then single rows) × token blocks of 4, 2, 1, each through `kern`.
    #[inline(always)]
    fn tiles<K: Tile, P: FnMut(usize, usize, f32)>(
        &self,
        kern: &K,
        outs: Range<usize>,
        toks: Range<usize>,
        put: &mut P,
    ) {
        let mut o = outs.start;
        while o < outs.end {
            if outs.end - o >= BLOCK_ROWS {
                self.row_tiles::<K, P, BLOCK_ROWS>(kern, o, toks.clone(), put);
                o += BLOCK_ROWS;
            } else {
                self.row_tiles::<K, P, 1>(kern, o, toks.clone(), put);
                o += 1;
            }
        }
    }

    /// Outputs `o..o + R` against tokens `toks`, 4, 2, then 1 at a time.
    #[inline(always)]
    fn row_tiles<K: Tile, P: FnMut(usize, usize, f32), const R: usize>(
        &self,
        kern: &K,
        o: usize,
        toks: Range<usize>,
        put: &mut P,
    ) {
        let mut j = toks.start;
        while toks.end - j >= BLOCK_TOKENS {
            kern.tile::<P, R, BLOCK_TOKENS>(self, o, j, put);
            j += BLOCK_TOKENS;
        }
        if toks.end - j >= 2 {
            kern.tile::<P, R, 2>(self, o, j, put);
            j += 2;
        }
        if toks.end > j {
            kern.tile::<P, R, 1>(self, o, j, put);
        }
    }

    /// Stores the base products `out` of rows `rs` (outputs from `o`) and tokens `xs`
    /// (from `j`) with each row's overlay correction added.
    #[inline(always)]
    fn finish<A: ActAt, P: FnMut(usize, usize, f32), const R: usize, const T: usize>(
        &self,
        (o, j): (usize, usize),
        rs: &[usize; R],
        xs: &[A; T],
        mut out: [[f32; T]; R],
        put: &mut P,
    ) {
        for (out, &r) in out.iter_mut().zip(rs) {
            self.ov.correct(self.bytes, r, xs, out);
        }
        put_tile(o, j, &out, put);
    }

    /// `Fast` and `Balanced` on AVX-512 VBMI + VNNI: the digit-major kernel over this
    /// thread's [`DmActs`], rebuilt first if they are not of `qa`.
    #[cfg(target_arch = "x86_64")]
    fn dm<P: FnMut(usize, usize, f32)>(
        &self,
        qa: &QuantizedActs,
        outs: Range<usize>,
        toks: Range<usize>,
        put: &mut P,
    ) {
        let groups = self.g.cols / STEP;
        let mut run = |dm: &mut DmActs| {
            dm.refresh(self.k, qa, self.t, groups, self.planes.is_some());
            // SAFETY: `uses_dm()` (checked by `block`): AVX-512 VBMI + VNNI for
            // `Kernel::Avx512`, else AVX2 (`Kernel::Avx2` is detected); `dm` was just
            // built from all `t` tokens of `qa`; rows come from a validated payload.
            unsafe {
                if self.k == Kernel::Avx512 {
                    simd::dm_block(self, dm, outs.clone(), toks.clone(), put)
                } else {
                    simd::dm2_block(self, dm, outs.clone(), toks.clone(), put)
                }
            }
        };
        DM.with(|cell| match cell.try_borrow_mut() {
            Ok(mut dm) => run(&mut dm),
            // Not reached (no task runs inside another on one thread while it holds the
            // buffer); kept so that a surprise costs an allocation, not a panic.
            Err(_) => run(&mut DmActs::default()),
        })
    }

    #[cfg(not(target_arch = "x86_64"))]
    fn dm<P: FnMut(usize, usize, f32)>(
        &self,
        qa: &QuantizedActs,
        outs: Range<usize>,
        toks: Range<usize>,
        put: &mut P,
    ) {
        self.tiles(&IntTile::new(qa, &toks, &[]), outs, toks, put)
    }
}

/// One register tile of a product: outputs `o..o + R` × tokens `j..j + T`, stored by
/// `put(output, token, value)`. (A trait, not a closure, for the const parameters, and so
/// that the digit-major kernel's tiles inline into its target-feature function.)
trait Tile {
    fn tile<P: FnMut(usize, usize, f32), const R: usize, const T: usize>(
        &self,
        cx: &Q1tProduct,
        o: usize,
        j: usize,
        put: &mut P,
    );
}

/// Stores a tile's values.
#[inline(always)]
fn put_tile<P: FnMut(usize, usize, f32), const R: usize, const T: usize>(
    o: usize,
    j: usize,
    out: &[[f32; T]; R],
    put: &mut P,
) {
    for (i, out) in out.iter().enumerate() {
        for (q, v) in out.iter().enumerate() {
            put(o + i, j + q, *v);
        }
    }
}

/// `Exact`: the shared f32 loops over [`Q1tRows`], then the overlay (on AVX-512 VBMI,
/// [`simd::exact_rows`] with the overlay inside); `[t, cols]` activations.
struct ExactTile<'a>(&'a [f32]);

impl Tile for ExactTile<'_> {
    #[inline(always)]
    fn tile<P: FnMut(usize, usize, f32), const R: usize, const T: usize>(
        &self,
        cx: &Q1tProduct,
        o: usize,
        j: usize,
        put: &mut P,
    ) {
        let cols = cx.g.cols;
        let rs = cx.rows::<R>(o);
        let xs: [&[f32]; T] = array_of(|q| &self.0[(j + q) * cols..(j + q + 1) * cols]);
        if let Some(p) = cx.planes {
            // The shared f32 loops over the repacked rows: the same weights as the tiles'.
            let mut out = [[0f32; T]; R];
            kernel::run::<_, R, T>(cx.k, &Q1tPlaneRows::<R>::new_at(p, rs), &xs, &mut out);
            return cx.finish((o, j), &rs, &xs, out, put);
        }
        let d = Q1tRows::<R>::new_at(cx.g, cx.bytes, rs);
        #[cfg(target_arch = "x86_64")]
        if cx.k == Kernel::Avx512 && simd::exact_available() {
            // SAFETY: checked just above; `new_at` gives each row its tiles and `SLACK`,
            // and each activation slice is `cols` long.
            let ov: [_; R] = array_of(|i| cx.ov.row(cx.bytes, rs[i]));
            let out = unsafe { simd::exact_rows::<R, T>(&d.tiles, cols / STEP, &xs, &ov) };
            return put_tile(o, j, &out, put);
        }
        let mut out = [[0f32; T]; R];
        kernel::run::<_, R, T>(cx.k, &d, &xs, &mut out);
        cx.finish((o, j), &rs, &xs, out, put);
    }
}

/// `Fast` and `Balanced` without the digit-major kernel: int8 codes into the shared
/// integer loops (which handle both levels), then the overlay.
struct IntTile<'a> {
    qa: &'a QuantizedActs,
    /// The token of a one-token range (decode), resolved once per task (slicing the
    /// quantized buffers per block of rows was 4% of a SmolLM2 `q1t` decode) and handed
    /// to the kernels in place (copying its slices per block into a new array stalled on
    /// store forwarding, another 4%); with it, when given, its [`dequantize`]d activations
    /// for the overlay.
    one: Option<OneToken<'a>>,
}

/// Token `j` of a one-token range, as [`IntTile`] hands it over: arrays of one, which the
/// kernels take in place.
struct OneToken<'a> {
    j: usize,
    x: [QToken<'a>; 1],
    deq: [&'a [f32]; 1],
}

impl<'a> IntTile<'a> {
    /// `deq`: the token's [`dequantize`]d activations when `toks` is one token, or empty.
    fn new(qa: &'a QuantizedActs, toks: &Range<usize>, deq: &'a [f32]) -> Self {
        let one = (toks.len() == 1).then(|| OneToken {
            j: toks.start,
            x: [qa.token(toks.start)],
            deq: [deq],
        });
        IntTile { qa, one }
    }
}

/// Token `x`'s activations as the overlay multiplies them ([`ActAt::at`] of each column,
/// the same f32 values), into `out` (one per column). Once per one-token product of the
/// integer tiles, and per token into the digit-major kernel's buffer: from these the
/// overlay's per-entry work is a load and a multiply-add instead of `at` (two code loads,
/// the level test, the group's scale). The overlay was 16% of a SmolLM2 `q1t` decode on
/// AVX2; a masked-gather step per row instead of the entry loop was slower (Zen 2).
fn dequantize(k: Kernel, x: &QToken, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if k != Kernel::Scalar {
        // SAFETY: every level above scalar has AVX2 (`Kernel::detect`).
        return unsafe { dequantize_avx2(x, out) };
    }
    dequantize_body(x, out)
}

/// [`dequantize`] on AVX2: 8 codes widened, converted and scaled per step (the scalar
/// loops did not vectorize). The same values: the integer code is exact in f32 and the
/// product is one rounding, as in [`ActAt::at`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn dequantize_avx2(x: &QToken, out: &mut [f32]) {
    let (outs, _) = out.as_chunks_mut::<STEP>();
    let (qs, _) = x.q.as_chunks::<STEP>();
    // A function, not a closure: closures do not inherit AVX2.
    #[inline(always)]
    unsafe fn bytes8(q: &[i8; STEP], i: usize) -> __m256i {
        _mm256_cvtepi8_epi32(_mm_loadl_epi64(q[8 * i..].as_ptr() as *const __m128i))
    }
    let split = x.split();
    for (g, ((o, q), &d)) in outs.iter_mut().zip(qs).zip(x.d).enumerate() {
        let d = _mm256_set1_ps(d);
        for i in 0..STEP / 8 {
            let mut v = bytes8(q, i);
            if split {
                let q2 = &x.q2[g * STEP..(g + 1) * STEP];
                let q2: &[i8; STEP] = q2.try_into().unwrap();
                v = _mm256_add_epi32(_mm256_slli_epi32::<SPLIT_SHIFT>(v), bytes8(q2, i));
            }
            let f = _mm256_mul_ps(_mm256_cvtepi32_ps(v), d);
            _mm256_storeu_ps(o[8 * i..].as_mut_ptr(), f);
        }
    }
}

/// [`dequantize`] without SIMD: [`ActAt::at`] column by column.
fn dequantize_body(x: &QToken, out: &mut [f32]) {
    for (col, o) in out.iter_mut().enumerate() {
        *o = x.at(col);
    }
}

impl Tile for IntTile<'_> {
    #[inline(always)]
    fn tile<P: FnMut(usize, usize, f32), const R: usize, const T: usize>(
        &self,
        cx: &Q1tProduct,
        o: usize,
        j: usize,
        put: &mut P,
    ) {
        let rs = cx.rows::<R>(o);
        match cx.planes {
            Some(p) => {
                let d = Q1tPlaneRows::<R>::new_at(p, rs);
                self.run::<_, P, R, T>(cx, &d, (o, j), &rs, put)
            }
            None => {
                let d = Q1tRows::<R>::new_at(cx.g, cx.bytes, rs);
                self.run::<_, P, R, T>(cx, &d, (o, j), &rs, put)
            }
        }
    }
}

impl IntTile<'_> {
    /// [`Tile::tile`] over rows `d` (the file's tiles or the repacked rows).
    #[inline(always)]
    fn run<D: kernel::IntRows, P: FnMut(usize, usize, f32), const R: usize, const T: usize>(
        &self,
        cx: &Q1tProduct,
        d: &D,
        (o, j): (usize, usize),
        rs: &[usize; R],
        put: &mut P,
    ) {
        let rs = *rs;
        let mut out = [[0f32; T]; R];
        if let Some(one) = &self.one {
            // `T == 1` exactly when the conversions succeed.
            if let (true, Ok(xs), Ok(xf)) =
                (one.j == j, one.x[..].try_into(), one.deq[..].try_into())
            {
                kernel::run_int::<_, R, T>(cx.k, d, xs, &mut out);
                let xf: &[&[f32]; T] = xf;
                return if xf[0].is_empty() {
                    cx.finish((o, j), &rs, xs, out, put)
                } else {
                    cx.finish((o, j), &rs, xf, out, put)
                };
            }
        }
        let xs: [QToken; T] = array_of(|q| self.qa.token(j + q));
        kernel::run_int::<_, R, T>(cx.k, d, &xs, &mut out);
        cx.finish((o, j), &rs, &xs, out, put);
    }
}

/// `y[o] = Σ_c W[row(o), c]·x[c]` for the one token of `cx`; `y.len()` outputs. Rows are
/// split over the rayon pool as `matrix::matvec` splits them.
pub(crate) fn matvec(cx: &Q1tProduct, y: &mut [f32]) {
    let chunk = matvec_chunk(y.len(), cx.g.cols);
    let mut run = |deq: &[f32]| {
        crate::exec::for_each_chunk_mut(y, chunk, |c, ys| {
            let o0 = c * chunk;
            cx.block(o0..o0 + ys.len(), 0..1, deq, &mut |o, _, v| ys[o - o0] = v);
        })
    };
    match cx.acts {
        // The integer tiles' overlay reads the token dequantized, once for every task.
        Q1tActs::Int(qa) if !cx.uses_dm() => DEQ.with(|cell| match cell.try_borrow_mut() {
            Ok(mut deq) => {
                deq.clear();
                deq.resize(cx.g.cols, 0.0);
                dequantize(cx.k, &qa.token(0), &mut deq);
                run(&deq)
            }
            // Another product of this thread holds it (this one started from inside its
            // parallel section): the overlay computes each activation from its codes.
            Err(_) => run(&[]),
        }),
        _ => run(&[]),
    }
}

/// `y[j, o] = Σ_c W[row(o), c]·x[j, c]` for the `t` tokens of `cx`; `y` is `[t, n]`. Tasks
/// own row chunks that fit L2, and take the tokens in blocks that fit it too (as
/// `matrix::matmul`).
pub(crate) fn matmul(cx: &Q1tProduct, y: &mut [f32]) {
    let (t, cols) = (cx.t, cx.g.cols);
    let n = y.len() / t;
    let (chunk, tok_block) = matmul_split(n, cols, cols / STEP * Q1T_TILE);
    let out = Out::new(y);
    (0..n.div_ceil(chunk)).into_par_iter().for_each(|c| {
        let outs = c * chunk..((c + 1) * chunk).min(n);
        for j0 in (0..t).step_by(tok_block) {
            let toks = j0..(j0 + tok_block).min(t);
            // SAFETY: `j < t` and output `o` belongs to this task only, so entry
            // `j·n + o < y.len()` is written by this task alone.
            cx.block(outs.clone(), toks, &[], &mut |o, j, v| unsafe {
                out.write(j * n + o, v)
            });
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The permuted digit-major layouts (AVX-512 VBMI, AVX2) equal the one-code-at-a-time
    /// one, for whole and partial steps, codes over the whole i8 range, two tokens in a row.
    #[test]
    fn digit_major_push_equals_the_scalar_layout() {
        let levels: Vec<Kernel> = Kernel::available()
            .into_iter()
            .filter(|&k| k != Kernel::Scalar && (k != Kernel::Avx512 || dm_available()))
            .collect();
        assert!(
            levels.contains(&Kernel::Avx2) || !cfg!(target_arch = "x86_64"),
            "the tests need an x86-64 CPU with AVX2"
        );
        let mut rng = crate::synth::Rng::new(7);
        for k in levels {
            for groups in [1usize, 3, 7, 8, 9, 17, 28, 152] {
                let steps = groups.div_ceil(DM_TILES);
                let (mut fast, mut slow) = (DmLevel::default(), DmLevel::default());
                fast.reset(2, steps);
                slow.reset(2, steps);
                for j in 0..2 {
                    let codes: Vec<i8> = (0..groups * STEP).map(|_| rng.next_u64() as i8).collect();
                    fast.push(k, j, groups, steps, &codes);
                    slow.key.extend_from_slice(&codes);
                    slow.push_scalar(j, groups, steps, &codes);
                }
                assert_eq!(fast.x, slow.x, "{k:?} {groups} groups: codes");
                assert_eq!(fast.c, slow.c, "{k:?} {groups} groups: lane sums");
                assert_eq!(fast.key, slow.key, "{k:?} {groups} groups: key");
            }
        }
    }
}
