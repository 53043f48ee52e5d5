//! Binary and ternary codecs: `q1` (id 12), `q1s` (id 13), `q1t` (id 14).
//!
//! ```text
//! q1 : G × [f16 s][4 bytes]                  G = ceil(numel/32), flattened, any shape
//!      bit k of byte j (LSB first) is weight 8j+k: 1 → +s, 0 → −s
//! q1s: q1 tiles, [u32 count], count × [u32 flat row-major index][f16 value]
//! q1t: G × [f16 s][7 bytes]                  2-D, cols % 32 == 0 (tiles never cross rows)
//!      weight k's code is (byte[k/5] / 3^(k%5)) % 3: 0 → 0, 1 → +s, 2 → −s
//!      then [u32 row_ptr: rows+1], then E × [u16 col][f16 value]
//!      row r owns entries row_ptr[r] .. row_ptr[r+1]
//! ```
//!
//! An overlay value replaces the base value of its element. When a `q1s` index appears
//! twice the later entry wins (our encoder never writes duplicates; the spec does not
//! require sorted or unique indices, so the reader accepts them).

use super::{rd_f16, rd_u16, rd_u32, round_scale, Geom, QuantError};
use crate::format::dtype::DType;
use half::f16;
use std::cmp::Reverse;
use std::collections::BinaryHeap;

const GROUP: usize = crate::format::dtype::GROUP as usize;
/// Bytes per `q1` tile.
pub const Q1_TILE: usize = 6;
/// Bytes per `q1t` tile: f16 scale + ceil(32/5) = 7 base-3 bytes (the last holds 2 codes).
pub const Q1T_TILE: usize = 9;
/// Bytes per `q1s` overlay entry.
pub const Q1S_ENTRY: usize = 6;
/// Bytes per `q1t` overlay entry.
pub const Q1T_ENTRY: usize = 4;
/// `q1t` encoder: elements with `|w| ≤ TWN_DELTA · mean|w|` are left out of the support
/// when the scale is measured (Ternary Weight Networks' near-optimal threshold for
/// bell-shaped weights).
pub const TWN_DELTA: f32 = 0.7;

/// The base-3 digits of every byte value, `TRITS[b][k] = (b / 3^k) % 3`, exactly the
/// spec's formula (also for the non-canonical bytes 243..=255).
static TRITS: [[u8; 5]; 256] = {
    let mut t = [[0u8; 5]; 256];
    let mut b = 0;
    while b < 256 {
        let mut v = b;
        let mut k = 0;
        while k < 5 {
            t[b][k] = (v % 3) as u8;
            v /= 3;
            k += 1;
        }
        b += 1;
    }
    t
};

fn decode_q1_tile(tile: &[u8], out: &mut [f32; GROUP]) {
    let s = f16::from_le_bytes([tile[0], tile[1]]).to_f32();
    for (k, o) in out.iter_mut().enumerate() {
        *o = if (tile[2 + k / 8] >> (k % 8)) & 1 == 1 {
            s
        } else {
            -s
        };
    }
}

fn decode_q1t_tile(tile: &[u8], out: &mut [f32; GROUP]) {
    let s = f16::from_le_bytes([tile[0], tile[1]]).to_f32();
    let vals = [0.0, s, -s];
    for (k, o) in out.iter_mut().enumerate() {
        *o = vals[TRITS[tile[2 + k / 5] as usize][k % 5] as usize];
    }
}

/// Decodes flat base elements `start .. start + out.len()` from tiles of `tile` bytes.
fn decode_tiles(
    bytes: &[u8],
    tile: usize,
    start: usize,
    out: &mut [f32],
    f: fn(&[u8], &mut [f32; GROUP]),
) -> Result<(), String> {
    let mut tmp = [0.0f32; GROUP];
    let (mut pos, mut done) = (start, 0);
    while done < out.len() {
        let gi = pos / GROUP;
        let at = gi.checked_mul(tile).ok_or("tile offset overflows")?;
        let t = bytes
            .get(at..at + tile)
            .ok_or_else(|| format!("tile {gi} lies outside the payload"))?;
        f(t, &mut tmp);
        let from = pos % GROUP;
        let take = (GROUP - from).min(out.len() - done);
        out[done..done + take].copy_from_slice(&tmp[from..from + take]);
        done += take;
        pos += take;
    }
    Ok(())
}

pub(super) fn decode_q1_range(bytes: &[u8], start: usize, out: &mut [f32]) -> Result<(), String> {
    decode_tiles(bytes, Q1_TILE, start, out, decode_q1_tile)
}

// ---- layouts and validation --------------------------------------------------------------

/// Parsed `q1s` tail.
#[derive(Clone, Copy, Debug)]
pub struct Q1sLayout {
    /// Start of `count` (= 6·G).
    pub count_at: usize,
    pub count: usize,
    /// Start of the entries (= `count_at + 4`).
    pub entries: usize,
}

/// Checks `nbytes == 6·G + 4 + 6·count` and that every index is `< numel`.
pub(super) fn validate_q1s(g: Geom, bytes: &[u8]) -> Result<Q1sLayout, String> {
    let count_at = g
        .numel
        .div_ceil(GROUP)
        .checked_mul(Q1_TILE)
        .ok_or("base size overflows")?;
    let count = rd_u32(bytes, count_at).ok_or("the u32 count lies outside the payload")? as usize;
    let entries = count_at + 4;
    let expected = (count as u64)
        .checked_mul(Q1S_ENTRY as u64)
        .and_then(|e| e.checked_add(entries as u64))
        .ok_or("entry table size overflows")?;
    if bytes.len() as u64 != expected {
        return Err(format!("count = {count} implies {expected} bytes"));
    }
    for e in 0..count {
        let idx = rd_u32(bytes, entries + e * Q1S_ENTRY).ok_or("entry outside the payload")? as u64;
        if idx >= g.numel as u64 {
            return Err(format!(
                "entry {e} has flat index {idx}, the tensor has {} elements",
                g.numel
            ));
        }
    }
    Ok(Q1sLayout {
        count_at,
        count,
        entries,
    })
}

/// Parsed `q1t` tail.
#[derive(Clone, Copy, Debug)]
pub struct Q1tLayout {
    /// Start of `row_ptr` (= 9·G).
    pub row_ptr: usize,
    /// Start of the entries (= `row_ptr + 4·(rows+1)`).
    pub entries: usize,
    /// Number of entries, from the byte count.
    pub count: usize,
}

fn q1t_layout(g: Geom, bytes: &[u8]) -> Result<Q1tLayout, String> {
    let row_ptr = g
        .numel
        .div_ceil(GROUP)
        .checked_mul(Q1T_TILE)
        .ok_or("base size overflows")?;
    let entries = g
        .rows
        .checked_add(1)
        .and_then(|n| n.checked_mul(4))
        .and_then(|n| n.checked_add(row_ptr))
        .ok_or("row_ptr size overflows")?;
    let rest = bytes
        .len()
        .checked_sub(entries)
        .ok_or("row_ptr lies outside the payload")?;
    if rest % Q1T_ENTRY != 0 {
        return Err(format!(
            "{rest} bytes after row_ptr are not whole 4-byte entries"
        ));
    }
    Ok(Q1tLayout {
        row_ptr,
        entries,
        count: rest / Q1T_ENTRY,
    })
}

/// Entry range of row `r`, checked against the entry count; columns checked `< cols`.
fn q1t_row_entries(
    g: Geom,
    bytes: &[u8],
    l: Q1tLayout,
    r: usize,
) -> Result<(usize, usize), String> {
    let a = rd_u32(bytes, l.row_ptr + 4 * r).ok_or("row_ptr outside the payload")? as usize;
    let b = rd_u32(bytes, l.row_ptr + 4 * r + 4).ok_or("row_ptr outside the payload")? as usize;
    if a > b || b > l.count {
        return Err(format!(
            "row_ptr[{r}..={}] = {a}..{b} is not a range within the {} entries",
            r + 1,
            l.count
        ));
    }
    for e in a..b {
        let col =
            rd_u16(bytes, l.entries + e * Q1T_ENTRY).ok_or("entry outside the payload")? as usize;
        if col >= g.cols {
            return Err(format!(
                "entry {e} (row {r}) has column {col}, rows have {}",
                g.cols
            ));
        }
    }
    Ok((a, b))
}

/// Checks `row_ptr[0] = 0`, non-decreasing, `row_ptr[rows]` = the number of entries the
/// byte count implies, and every column `< cols`.
pub(super) fn validate_q1t(g: Geom, bytes: &[u8]) -> Result<Q1tLayout, String> {
    let l = q1t_layout(g, bytes)?;
    if rd_u32(bytes, l.row_ptr) != Some(0) {
        return Err("row_ptr[0] must be 0".into());
    }
    for r in 0..g.rows {
        q1t_row_entries(g, bytes, l, r)?;
    }
    let last = rd_u32(bytes, l.row_ptr + 4 * g.rows).ok_or("row_ptr outside the payload")? as usize;
    if last != l.count {
        return Err(format!(
            "row_ptr[rows] = {last}, the payload holds {} entries",
            l.count
        ));
    }
    Ok(l)
}

// ---- decoding ----------------------------------------------------------------------------

fn overlay_value(bytes: &[u8], at: usize) -> Result<f32, String> {
    rd_f16(bytes, at).ok_or_else(|| "overlay value lies outside the payload".into())
}

pub(super) fn decode_q1_family(
    dtype: DType,
    g: Geom,
    bytes: &[u8],
    out: &mut [f32],
) -> Result<(), String> {
    decode_q1_range(bytes, 0, out)?;
    if dtype == DType::Q1s {
        let l = validate_q1s(g, bytes)?;
        for e in 0..l.count {
            let at = l.entries + e * Q1S_ENTRY;
            let idx = rd_u32(bytes, at).ok_or("entry outside the payload")? as usize;
            *out.get_mut(idx).ok_or("index out of range")? = overlay_value(bytes, at + 4)?;
        }
    }
    Ok(())
}

/// O(count): the overlay is one flat list, so every entry is looked at.
pub(super) fn decode_q1s_row(
    g: Geom,
    bytes: &[u8],
    r: usize,
    out: &mut [f32],
) -> Result<(), String> {
    let start = r * g.cols;
    decode_q1_range(bytes, start, out)?;
    let count_at = g.numel.div_ceil(GROUP) * Q1_TILE;
    let count = rd_u32(bytes, count_at).ok_or("count outside the payload")? as u64;
    if bytes.len() as u64 != count_at as u64 + 4 + count * Q1S_ENTRY as u64 {
        return Err(format!("count = {count} disagrees with the payload length"));
    }
    for e in 0..count as usize {
        let at = count_at + 4 + e * Q1S_ENTRY;
        let idx = rd_u32(bytes, at).ok_or("entry outside the payload")? as usize;
        if idx >= g.numel {
            return Err(format!("entry {e} has flat index {idx} ≥ {}", g.numel));
        }
        if idx >= start && idx - start < g.cols {
            out[idx - start] = overlay_value(bytes, at + 4)?;
        }
    }
    Ok(())
}

/// `q1s` overlay entries grouped by row, built once per matrix (the payload's overlay is
/// one flat list, so without it a row would cost O(count)): row `r`'s entries are
/// `entries[ptr[r] .. ptr[r + 1]]`, indices into the payload's entry table in file order,
/// so that applying them in turn keeps "a later duplicate wins".
#[derive(Clone, Debug, Default)]
pub struct Q1sRowIndex {
    ptr: Vec<u32>,
    entries: Vec<u32>,
}

impl Q1sRowIndex {
    /// Counting sort of a validated payload's entries by row (stable).
    pub(crate) fn new(g: Geom, bytes: &[u8]) -> Result<Q1sRowIndex, String> {
        let l = validate_q1s(g, bytes)?;
        let cols = g.cols.max(1);
        let row_of = |e: usize| -> Result<usize, String> {
            Ok(
                rd_u32(bytes, l.entries + e * Q1S_ENTRY).ok_or("entry outside the payload")?
                    as usize
                    / cols,
            )
        };
        // Only rows with elements can hold entries: a zero-width tensor may claim any
        // number of rows (numel 0), and indexing them all would allocate without bound.
        let indexed = g.rows.min(g.numel);
        let mut ptr = vec![0u32; indexed + 1];
        for e in 0..l.count {
            ptr[row_of(e)? + 1] += 1;
        }
        for r in 0..indexed {
            ptr[r + 1] += ptr[r];
        }
        let mut fill = ptr.clone();
        let mut entries = vec![0u32; l.count];
        for e in 0..l.count {
            let r = row_of(e)?;
            entries[fill[r] as usize] = e as u32;
            fill[r] += 1;
        }
        Ok(Q1sRowIndex { ptr, entries })
    }
}

/// Decodes row `r` of a validated `q1s` payload in O(row + its entries).
pub(crate) fn decode_q1s_row_indexed(
    g: Geom,
    bytes: &[u8],
    index: &Q1sRowIndex,
    r: usize,
    out: &mut [f32],
) -> Result<(), String> {
    let start = r * g.cols;
    decode_q1_range(bytes, start, out)?;
    let entries = g.numel.div_ceil(GROUP) * Q1_TILE + 4;
    // Rows past the index (see `Q1sRowIndex::new`) hold no entries.
    let (a, b) = match index.ptr.get(r..r + 2) {
        Some(p) => (p[0] as usize, p[1] as usize),
        None => (0, 0),
    };
    for &e in &index.entries[a..b] {
        let at = entries + e as usize * Q1S_ENTRY;
        let idx = rd_u32(bytes, at).ok_or("entry outside the payload")? as usize;
        *out.get_mut(idx.wrapping_sub(start))
            .ok_or("entry outside its row")? = overlay_value(bytes, at + 4)?;
    }
    Ok(())
}

fn apply_q1t_row(
    g: Geom,
    bytes: &[u8],
    l: Q1tLayout,
    r: usize,
    out: &mut [f32],
) -> Result<(), String> {
    let (a, b) = q1t_row_entries(g, bytes, l, r)?;
    for e in a..b {
        let at = l.entries + e * Q1T_ENTRY;
        let col = rd_u16(bytes, at).ok_or("entry outside the payload")? as usize;
        *out.get_mut(col).ok_or("column out of range")? = overlay_value(bytes, at + 2)?;
    }
    Ok(())
}

pub(super) fn decode_q1t(g: Geom, bytes: &[u8], out: &mut [f32]) -> Result<(), String> {
    let l = validate_q1t(g, bytes)?;
    decode_tiles(bytes, Q1T_TILE, 0, out, decode_q1t_tile)?;
    for r in 0..g.rows {
        apply_q1t_row(g, bytes, l, r, &mut out[r * g.cols..(r + 1) * g.cols])?;
    }
    Ok(())
}

/// O(row + its entries): checks only this row's `row_ptr` pair and columns.
pub(super) fn decode_q1t_row(
    g: Geom,
    bytes: &[u8],
    r: usize,
    out: &mut [f32],
) -> Result<(), String> {
    let l = q1t_layout(g, bytes)?;
    decode_tiles(bytes, Q1T_TILE, r * g.cols, out, decode_q1t_tile)?;
    apply_q1t_row(g, bytes, l, r, out)
}

/// Per-element bounds: `+∞` on base values, the f16 rounding bound on overlay values.
pub(super) fn bounds(dtype: DType, g: Geom, bytes: &[u8], out: &mut [f32]) -> Result<(), String> {
    out.fill(f32::INFINITY);
    let f16_bound = |v: f32| super::f16s::rounding_bound(DType::F16, v);
    match dtype {
        DType::Q1s => {
            let l = validate_q1s(g, bytes)?;
            for e in 0..l.count {
                let at = l.entries + e * Q1S_ENTRY;
                let idx = rd_u32(bytes, at).ok_or("entry outside the payload")? as usize;
                *out.get_mut(idx).ok_or("index out of range")? =
                    f16_bound(overlay_value(bytes, at + 4)?);
            }
        }
        DType::Q1t => {
            let l = validate_q1t(g, bytes)?;
            for r in 0..g.rows {
                let (a, b) = q1t_row_entries(g, bytes, l, r)?;
                for e in a..b {
                    let at = l.entries + e * Q1T_ENTRY;
                    let col = rd_u16(bytes, at).ok_or("entry outside the payload")? as usize;
                    out[r * g.cols + col] = f16_bound(overlay_value(bytes, at + 2)?);
                }
            }
        }
        _ => {}
    }
    Ok(())
}

// ---- encoding ----------------------------------------------------------------------------

/// Keeps the `k` elements with the largest base error (ties: lower index first) in a
/// bounded heap, so memory is O(k) rather than O(numel).
pub(super) struct Outliers {
    k: usize,
    heap: BinaryHeap<Reverse<(u32, Reverse<usize>)>>,
}

impl Outliers {
    pub(super) fn new(k: usize) -> Outliers {
        Outliers {
            k,
            // Grows as needed: a streamed encoding holds one selection per rayon task.
            heap: BinaryHeap::with_capacity(k.saturating_add(1).min(1 << 16)),
        }
    }

    /// Offers element `idx` with source `w` and base reconstruction `base`. Only values an
    /// f16 overlay represents (finite) and improves on are candidates.
    fn offer(&mut self, idx: usize, w: f32, base: f32) {
        let err = (w - base).abs();
        if overlay_ok(w) && (w - f16::from_f32(w).to_f32()).abs() < err {
            self.offer_score(idx, err);
        }
    }

    /// Offers element `idx` with a non-negative finite `score`; the `k` largest win.
    fn offer_score(&mut self, idx: usize, score: f32) {
        if self.k == 0 {
            return;
        }
        // Non-negative finite floats order like their bit patterns.
        let key = (score.to_bits(), Reverse(idx));
        if self.heap.len() < self.k {
            self.heap.push(Reverse(key));
        } else if let Some(Reverse(min)) = self.heap.peek() {
            if key > *min {
                self.heap.pop();
                self.heap.push(Reverse(key));
            }
        }
    }

    /// The `k` best of both selections (the same set as offering everything to one, since
    /// the keys are totally ordered).
    pub(super) fn merge(mut self, other: Outliers) -> Outliers {
        for Reverse((bits, Reverse(idx))) in other.heap {
            self.offer_score(idx, f32::from_bits(bits));
        }
        self
    }

    /// Selected flat indices, ascending.
    pub(super) fn into_sorted(self) -> Vec<usize> {
        let mut v: Vec<usize> = self
            .heap
            .into_iter()
            .map(|Reverse((_, Reverse(i)))| i)
            .collect();
        v.sort_unstable();
        v
    }
}

/// Whether `w` can be stored as an overlay (its f16 is finite).
fn overlay_ok(w: f32) -> bool {
    f16::from_f32(w).is_finite()
}

/// Overlay entries a tensor of `numel` elements gets at `fraction`.
pub(super) fn outlier_count(fraction: f64, numel: usize) -> usize {
    ((fraction * numel as f64).floor() as usize)
        .min(numel)
        .min(u32::MAX as usize)
}

/// Pass 1 of the overlay codecs over `values`, elements `first ..` of the tensor (`first`
/// on a group boundary): offers each eligible element by its size relative to its group's
/// mean |w|. The `k` largest are left out of the base fit, so an outlier does not inflate
/// its group's scale; the final choice (pass 2) is by actual base error.
pub(super) fn provisional_block(
    dtype: DType,
    g: Geom,
    values: &[f32],
    first: usize,
    sel: &mut Outliers,
) {
    if sel.k == 0 {
        return;
    }
    for (gi, grp) in values.chunks(GROUP).enumerate() {
        let mean = grp.iter().map(|w| w.abs()).sum::<f32>() / grp.len() as f32;
        if mean > 0.0 {
            for (j, &w) in grp.iter().enumerate() {
                let idx = first + gi * GROUP + j;
                let score = w.abs() / mean;
                if eligible(dtype, g, idx) && overlay_ok(w) && score > 0.0 {
                    sel.offer_score(idx, score);
                }
            }
        }
    }
}

/// Whether element `idx` may become an overlay entry: its index fits the entry's field
/// (`q1s`: a u32 flat index; `q1t`: a u16 column).
fn eligible(dtype: DType, g: Geom, idx: usize) -> bool {
    if dtype == DType::Q1t {
        idx % g.cols.max(1) <= u16::MAX as usize
    } else {
        idx <= u32::MAX as usize
    }
}

/// Pass 2 over `values`, elements `first ..` of the tensor: the base tiles of its groups
/// fitted without the provisional outliers `provisional` (sorted flat indices of the
/// whole tensor) appended to `out`, and every eligible element offered to `sel` by its
/// base error.
pub(super) fn tiles_block(
    dtype: DType,
    g: Geom,
    values: &[f32],
    first: usize,
    provisional: &[usize],
    out: &mut Vec<u8>,
    sel: &mut Outliers,
) -> Result<(), QuantError> {
    let mut mask = vec![
        false;
        if provisional.is_empty() {
            0
        } else {
            values.len()
        }
    ];
    let lo = provisional.partition_point(|&i| i < first);
    let hi = provisional.partition_point(|&i| i < first + values.len());
    for &i in &provisional[lo..hi] {
        mask[i - first] = true;
    }
    let mut base = [0.0f32; GROUP];
    for (gi, grp) in values.chunks(GROUP).enumerate() {
        let m = mask_of(&mask, gi, grp.len());
        if dtype == DType::Q1t {
            encode_q1t_tile(grp, m, out, &mut base)?;
        } else {
            let s = encode_q1_tile(DType::Q1s, grp, m, out)?;
            for (b, &w) in base.iter_mut().zip(grp) {
                *b = if w >= 0.0 || s == 0.0 { s } else { -s };
            }
        }
        for (j, (&w, &b)) in grp.iter().zip(&base).enumerate() {
            let idx = first + gi * GROUP + j;
            if eligible(dtype, g, idx) {
                sel.offer(idx, w, b);
            }
        }
    }
    Ok(())
}

/// The payload after the tiles: `q1s` the entry count and `(u32 index, f16 value)`
/// entries; `q1t` the row pointers and `(u16 column, f16 value)` entries. `chosen` are
/// flat indices, ascending; `value[n]` is element `chosen[n]`.
pub(super) fn write_overlay(
    dtype: DType,
    g: Geom,
    chosen: &[usize],
    value: &[f32],
    out: &mut Vec<u8>,
) {
    if dtype == DType::Q1t {
        // row_ptr[r] = entries of the rows before r.
        let mut ptr = 0u32;
        let mut it = chosen.iter().peekable();
        for r in 0..g.rows {
            out.extend_from_slice(&ptr.to_le_bytes());
            while it.next_if(|&&i| i / g.cols == r).is_some() {
                ptr += 1;
            }
        }
        out.extend_from_slice(&ptr.to_le_bytes());
        for (&i, &v) in chosen.iter().zip(value) {
            out.extend_from_slice(&((i % g.cols) as u16).to_le_bytes());
            out.extend_from_slice(&f16::from_f32(v).to_le_bytes());
        }
    } else {
        out.extend_from_slice(&(chosen.len() as u32).to_le_bytes());
        for (&i, &v) in chosen.iter().zip(value) {
            out.extend_from_slice(&(i as u32).to_le_bytes());
            out.extend_from_slice(&f16::from_f32(v).to_le_bytes());
        }
    }
}

/// The elements of `grp` that take part in the base fit (all when every one is masked).
fn fit_set<'a>(grp: &'a [f32], mask: &'a [bool]) -> impl Iterator<Item = f32> + 'a {
    let all = mask.is_empty() || mask.iter().all(|&m| m);
    grp.iter()
        .enumerate()
        .filter(move |(j, _)| all || !mask[*j])
        .map(|(_, w)| w.abs())
}

fn mask_of(mask: &[bool], gi: usize, len: usize) -> &[bool] {
    mask.get(gi * GROUP..gi * GROUP + len).unwrap_or(&[])
}

/// The q1 tile of a group (≤ 32 values): `s = f16(mean |w|)` over the fitted elements —
/// for fixed signs the L2-optimal binary scale — and bit = `w ≥ 0`. A group whose scale
/// rounds to 0 stores all bits 1 (+0), so re-encoding its decoded values reproduces it.
/// Padding bits are 0. Returns the scale.
fn encode_q1_tile(
    dtype: DType,
    grp: &[f32],
    mask: &[bool],
    out: &mut Vec<u8>,
) -> Result<f32, QuantError> {
    let (sum, n) = fit_set(grp, mask).fold((0.0f64, 0usize), |(s, n), a| (s + a as f64, n + 1));
    let s = round_scale(dtype, (sum / n.max(1) as f64) as f32, 1.0)?;
    out.extend_from_slice(&s.to_le_bytes());
    let mut bits = [0u8; 4];
    for (k, &w) in grp.iter().enumerate() {
        if w >= 0.0 || s.to_f32() == 0.0 {
            bits[k / 8] |= 1 << (k % 8);
        }
    }
    out.extend_from_slice(&bits);
    Ok(s.to_f32())
}

pub(super) fn encode_q1(_g: Geom, values: &[f32], out: &mut Vec<u8>) -> Result<(), QuantError> {
    for grp in values.chunks(GROUP) {
        encode_q1_tile(DType::Q1, grp, &[], out)?;
    }
    Ok(())
}

/// `q1` base fitted without the provisional outliers, then the `floor(fraction·numel)`
/// elements with the largest base error (restricted to values an f16 represents, indices
/// < 2³²) as overlays, ascending index.
pub(super) fn encode_q1s(
    g: Geom,
    values: &[f32],
    fraction: f64,
    out: &mut Vec<u8>,
) -> Result<(), QuantError> {
    encode_overlay(DType::Q1s, g, values, fraction, out)
}

/// Both overlay codecs on a whole tensor: the passes of [`provisional_block`] and
/// [`tiles_block`] over it as one block, then [`write_overlay`]. (`quant::rows` runs the
/// same passes a block of rows at a time.)
fn encode_overlay(
    dtype: DType,
    g: Geom,
    values: &[f32],
    fraction: f64,
    out: &mut Vec<u8>,
) -> Result<(), QuantError> {
    let k = outlier_count(fraction, g.numel);
    let mut prov = Outliers::new(k);
    provisional_block(dtype, g, values, 0, &mut prov);
    let provisional = prov.into_sorted();
    let mut sel = Outliers::new(k);
    tiles_block(dtype, g, values, 0, &provisional, out, &mut sel)?;
    let chosen = sel.into_sorted();
    let value: Vec<f32> = chosen.iter().map(|&i| values[i]).collect();
    write_overlay(dtype, g, &chosen, &value, out);
    Ok(())
}

/// The q1t tile of a full group, Ternary-Weight-Networks style, over the fitted elements:
/// support `|w| > 0.7·mean|w|`, `s = f16(mean |w| over the support)` (the L2-optimal scale
/// for that support); then every code is the nearest of {−s, 0, +s} with the rounded `s`
/// (ties → 0), which can only lower the error further. Writes the decoded base to `base`.
fn encode_q1t_tile(
    grp: &[f32],
    mask: &[bool],
    out: &mut Vec<u8>,
    base: &mut [f32; GROUP],
) -> Result<(), QuantError> {
    let (sum, n) = fit_set(grp, mask).fold((0.0f64, 0usize), |(s, n), a| (s + a as f64, n + 1));
    let delta = TWN_DELTA as f64 * sum / n.max(1) as f64;
    let (sum, n) = fit_set(grp, mask)
        .map(|a| a as f64)
        .filter(|&a| a > delta)
        .fold((0.0, 0usize), |(s, n), a| (s + a, n + 1));
    let s = round_scale(
        DType::Q1t,
        if n > 0 { (sum / n as f64) as f32 } else { 0.0 },
        1.0,
    )?;
    let sf = s.to_f32();
    out.extend_from_slice(&s.to_le_bytes());
    const POW: [u8; 5] = [1, 3, 9, 27, 81];
    let mut bytes = [0u8; 7];
    for (k, &w) in grp.iter().enumerate() {
        let code = match (sf > 0.0 && w.abs() > 0.5 * sf, w > 0.0) {
            (false, _) => 0,
            (true, true) => 1,
            (true, false) => 2,
        };
        base[k] = [0.0, sf, -sf][code as usize];
        bytes[k / 5] += code * POW[k % 5];
    }
    out.extend_from_slice(&bytes);
    Ok(())
}

/// Ternary base fitted without the provisional outliers, then the `floor(fraction·numel)`
/// elements with the largest base error across the whole tensor (columns < 65536,
/// f16-representable values), stored per row, columns ascending.
pub(super) fn encode_q1t(
    g: Geom,
    values: &[f32],
    fraction: f64,
    out: &mut Vec<u8>,
) -> Result<(), QuantError> {
    encode_overlay(DType::Q1t, g, values, fraction, out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::{decode, decode_row, encode, validate, EncodeOptions};

    #[test]
    fn trit_digits_follow_the_formula() {
        for (b, digits) in TRITS.iter().enumerate() {
            for (k, &d) in digits.iter().enumerate() {
                assert_eq!(d as usize, (b / 3usize.pow(k as u32)) % 3);
            }
        }
    }

    #[test]
    fn q1_bit_order_and_scale() {
        let mut v = [-1.0f32; 32];
        v[0] = 1.0;
        v[9] = 3.0; // byte 1, bit 1
        let b = encode(DType::Q1, &[32], &v, &EncodeOptions::default()).unwrap();
        assert_eq!(b.len(), 6);
        assert_eq!(
            f16::from_le_bytes([b[0], b[1]]).to_f32(),
            f16::from_f32(34.0 / 32.0).to_f32()
        );
        assert_eq!(&b[2..], &[0b1, 0b10, 0, 0]);
    }

    #[test]
    fn q1t_layout_by_hand() {
        // One [1, 32] row: s = 2, codes +,−,0,0,0, then zeros, last weight (k = 31) −.
        let mut t = vec![];
        t.extend_from_slice(&f16::from_f32(2.0).to_le_bytes());
        let mut bytes = [0u8; 7];
        bytes[0] = 1 + 2 * 3;
        bytes[6] = 2 * 3; // k = 31 → byte 6, digit 1
        t.extend_from_slice(&bytes);
        t.extend_from_slice(&0u32.to_le_bytes());
        t.extend_from_slice(&1u32.to_le_bytes());
        t.extend_from_slice(&4u16.to_le_bytes()); // overlay col 4
        t.extend_from_slice(&f16::from_f32(0.25).to_le_bytes());
        let d = decode(DType::Q1t, &[1, 32], &t).unwrap();
        assert_eq!(&d[..5], &[2.0, -2.0, 0.0, 0.0, 0.25]);
        assert_eq!(d[31], -2.0);
        assert!(d[5..31].iter().all(|&x| x == 0.0));
        let mut bad = t.clone();
        bad[17..19].copy_from_slice(&32u16.to_le_bytes()); // col 32 ≥ cols
        assert!(validate(DType::Q1t, &[1, 32], &bad).is_err());
    }

    #[test]
    fn q1s_overlay_replaces_base() {
        let mut v: Vec<f32> = (0..64)
            .map(|i| if i % 2 == 0 { 0.1 } else { -0.1 })
            .collect();
        v[37] = 9.0;
        let opts = EncodeOptions {
            outlier_fraction: Some(1.0 / 64.0),
            ..Default::default()
        };
        let b = encode(DType::Q1s, &[2, 32], &v, &opts).unwrap();
        assert_eq!(b.len(), 12 + 4 + 6);
        assert_eq!(u32::from_le_bytes(b[16..20].try_into().unwrap()), 37);
        let d = decode(DType::Q1s, &[2, 32], &b).unwrap();
        assert_eq!(d[37], 9.0);
        let mut row = vec![0.0; 32];
        decode_row(DType::Q1s, &[2, 32], &b, 1, &mut row).unwrap();
        assert_eq!(row, d[32..]);
        let mut bad = b.clone();
        bad[16..20].copy_from_slice(&64u32.to_le_bytes());
        assert!(validate(DType::Q1s, &[2, 32], &bad).is_err());
    }

    #[test]
    fn q1t_outliers_sorted_per_row() {
        let mut v: Vec<f32> = (0..128)
            .map(|i| ((i * 7 % 13) as f32 - 6.0) * 0.1)
            .collect();
        v[100] = 50.0;
        v[3] = -40.0;
        v[70] = 30.0;
        let opts = EncodeOptions {
            outlier_fraction: Some(3.0 / 128.0),
            ..Default::default()
        };
        let b = encode(DType::Q1t, &[2, 64], &v, &opts).unwrap();
        validate(DType::Q1t, &[2, 64], &b).unwrap();
        let rp = 4 * 9;
        let ptr: Vec<u32> = (0..3)
            .map(|r| u32::from_le_bytes(b[rp + 4 * r..rp + 4 * r + 4].try_into().unwrap()))
            .collect();
        assert_eq!(ptr, vec![0, 1, 3]);
        let cols: Vec<u16> = (0..3)
            .map(|e| u16::from_le_bytes(b[rp + 12 + 4 * e..rp + 14 + 4 * e].try_into().unwrap()))
            .collect();
        assert_eq!(cols, vec![3, 6, 36]);
        let d = decode(DType::Q1t, &[2, 64], &b).unwrap();
        assert_eq!((d[3], d[70], d[100]), (-40.0, 30.0, 50.0));
    }
}
