//! Encoding a tensor a block of rows at a time, so that a converter never holds a large
//! tensor's f32 values: only its encoded payload and one block of values per thread.
//!
//! A payload is a concatenation of planes. For most codecs every plane holds a fixed
//! number of bytes per row, in row order, and each row is encoded without looking at the
//! others: encoding rows `r0 .. r1` as a tensor `[r1 − r0, cols]` gives exactly those
//! rows' share of every plane, so the payload is assembled plane by plane from the blocks.
//!
//! Two codecs decide something from all rows first (a [`Decision`]): `q8_2f` its column
//! field (from the columns' largest magnitudes), `vbit`/`vbit_ro` the row widths (water-
//! filled on the rows' magnitudes, possibly jointly over a layer's experts, §3.2). A first
//! streamed pass gathers those statistics; with the decision made, their rows too encode
//! independently (the packed rows of `vbit` have lengths known from the widths, and the
//! column field and `vbit_ro` offsets are written once for the whole tensor).
//!
//! `q1s`/`q1t` choose their overlay entries over the whole tensor; they run three streamed
//! passes (see [`encode_overlay_blocks`]).
//!
//! Either way the payload is bit-identical to [`encode`] on the whole tensor (tested for
//! every streamable codec). Not streamable: the flattened group codecs when a group of 32
//! straddles two rows (`cols % 32 != 0`).

use std::ops::Range;
use std::sync::atomic::{AtomicU32, Ordering};

use half::f16;
use rayon::prelude::*;

use super::q1::{self, Outliers};
use super::{encode, geometry, layout::Q4tpLayout, q8, vbit, EncodeOptions, Geom, QuantError};
use crate::format::dtype::DType;

/// Bytes per row of each plane of a `dtype` payload of `shape`, in payload order, when
/// every plane has a fixed size per row and rows encode independently; `None` otherwise.
pub fn row_planes(dtype: DType, shape: &[u64]) -> Option<Vec<usize>> {
    let g = geometry(dtype, shape).ok()?;
    let grouped = g.cols.is_multiple_of(32);
    let groups = g.cols / 32;
    match dtype {
        DType::F32 => Some(vec![4 * g.cols]),
        DType::F16 | DType::Bf16 => Some(vec![2 * g.cols]),
        DType::Q8Row => Some(vec![g.cols, 2]),
        DType::Q4Block if grouped => Some(vec![16 * groups, 2 * groups]),
        DType::Q4Tiled if grouped => Some(vec![18 * groups]),
        DType::Q4tp => {
            let l = Q4tpLayout::new(Geom { rows: 1, ..g });
            Some(vec![16 * l.gpr, 4, l.code_bytes])
        }
        DType::Q1 if grouped => Some(vec![6 * groups]),
        _ => None,
    }
}

/// Whether [`encode_row_blocks`] can encode `dtype` at `shape` a block of rows at a time.
pub fn streamable(dtype: DType, shape: &[u64]) -> bool {
    row_planes(dtype, shape).is_some()
        || (needs_first_pass(dtype) && geometry(dtype, shape).is_ok())
        || overlay_streamable(dtype, shape)
}

/// `q1s`/`q1t` with whole groups per row: streamed in three passes (see
/// [`encode_overlay_blocks`]).
fn overlay_streamable(dtype: DType, shape: &[u64]) -> bool {
    matches!(dtype, DType::Q1s | DType::Q1t)
        && geometry(dtype, shape).is_ok_and(|g| g.cols > 0 && g.cols.is_multiple_of(32))
}

/// Bytes an encoding of `dtype` at `shape` holds: the payload (its minimum for variable
/// layouts, the element count for a shape the dtype cannot hold), plus the f32 values when
/// the codec is not [`streamable`]. What converters bound their batches by.
pub fn encoding_bytes(dtype: DType, shape: &[u64]) -> u64 {
    use crate::format::dtype::{numel, Size};
    let numel = numel(shape).unwrap_or(0);
    let payload = match dtype.size_for(shape) {
        Ok(Size::Exact(n) | Size::AtLeast(n)) => n,
        _ => numel,
    };
    let values = if streamable(dtype, shape) {
        0
    } else {
        numel.saturating_mul(4)
    };
    payload.saturating_add(values)
}

/// Whether `dtype` decides something from all rows before encoding any (see the module
/// comment).
pub fn needs_first_pass(dtype: DType) -> bool {
    matches!(dtype, DType::Vbit | DType::VbitRo | DType::Q8_2f)
}

/// What the first pass over all rows gathers.
#[derive(Clone, Debug, PartialEq)]
pub enum Stats {
    /// `vbit`: each row's magnitude ([`vbit::row_magnitudes`]).
    RowMagnitudes(Vec<f64>),
    /// `q8_2f`: each column's largest |w|.
    ColumnAbsmax(Vec<f32>),
}

/// What a tensor-wide codec decided before encoding any row.
#[derive(Clone, Debug, PartialEq)]
pub enum Decision {
    /// `vbit`/`vbit_ro`: one width per row.
    Bits(Vec<u8>),
    /// `q8_2f`: the column field.
    Field(Vec<f16>),
}

/// `n` zero bytes, or an error when they cannot be allocated.
fn zeroed(dtype: DType, n: usize) -> Result<Vec<u8>, QuantError> {
    let mut v = super::alloc_bytes(dtype, n)?;
    v.resize(n, 0);
    Ok(v)
}

/// Rows per block: about 64 Ki values (256 KiB of f32), at least one row.
fn block_rows(cols: usize) -> usize {
    (65_536 / cols.max(1)).max(1)
}

/// The row blocks of a tensor of `rows` rows of `cols`, as every streamed pass visits
/// them.
pub(crate) fn blocks(
    rows: usize,
    cols: usize,
) -> impl IndexedParallelIterator<Item = Range<usize>> {
    let br = block_rows(cols);
    (0..rows.div_ceil(br))
        .into_par_iter()
        .map(move |k| k * br..((k + 1) * br).min(rows))
}

fn not_finite_check(
    dtype: DType,
    r0: usize,
    cols: usize,
    values: &[f32],
) -> Result<(), QuantError> {
    match values.iter().position(|v| !v.is_finite()) {
        Some(i) => Err(QuantError::NonFinite {
            dtype,
            index: r0 * cols + i,
            value: values[i],
        }),
        None => Ok(()),
    }
}

/// The first pass of a codec that [`needs_first_pass`]: streams every row block of the
/// tensor through `source` (as in [`encode_row_blocks`]) and gathers its [`Stats`].
/// `Ok(None)` for the other codecs.
pub fn first_pass<E: Send>(
    dtype: DType,
    shape: &[u64],
    source: impl Fn(Range<usize>, &mut [f32]) -> Result<(), E> + Sync,
    quant_err: impl Fn(QuantError) -> E + Sync,
) -> Result<Option<Stats>, E> {
    if !needs_first_pass(dtype) {
        return Ok(None);
    }
    let g = geometry(dtype, shape).map_err(&quant_err)?;
    let per_block = blocks(g.rows, g.cols)
        .map(|rows| -> Result<Stats, E> {
            let mut values = vec![0f32; rows.len() * g.cols];
            source(rows.clone(), &mut values)?;
            not_finite_check(dtype, rows.start, g.cols, &values).map_err(&quant_err)?;
            Ok(if dtype == DType::Q8_2f {
                let mut colmax = vec![0f32; g.cols];
                q8::column_absmax(&values, &mut colmax);
                Stats::ColumnAbsmax(colmax)
            } else {
                Stats::RowMagnitudes(vbit::row_magnitudes(&values, g.cols))
            })
        })
        .collect::<Result<Vec<Stats>, E>>()?;
    let mut all = if dtype == DType::Q8_2f {
        Stats::ColumnAbsmax(vec![0f32; g.cols])
    } else {
        Stats::RowMagnitudes(Vec::with_capacity(g.rows))
    };
    for b in per_block {
        match (&mut all, b) {
            (Stats::ColumnAbsmax(all), Stats::ColumnAbsmax(b)) => {
                for (m, v) in all.iter_mut().zip(b) {
                    *m = m.max(v);
                }
            }
            (Stats::RowMagnitudes(all), Stats::RowMagnitudes(b)) => all.extend(b),
            _ => unreachable!("one kind of statistics per codec"),
        }
    }
    Ok(Some(all))
}

/// The decision our encoder takes from `stats` (what [`encode`] on the whole tensor
/// does): row widths water-filled to `opts`' mean budget, or the column field.
pub fn decide(dtype: DType, stats: &Stats, opts: &EncodeOptions) -> Result<Decision, QuantError> {
    match stats {
        Stats::RowMagnitudes(m) => {
            let budget = super::vbit_budget(dtype, opts)?;
            Ok(Decision::Bits(vbit::allocate_bits(m, budget)))
        }
        Stats::ColumnAbsmax(c) => Ok(Decision::Field(q8::field_from_absmax(c))),
    }
}

/// One plane of a payload as the whole tensor's payload lays it out.
enum Plane {
    /// `b` bytes per row (also in a block's payload).
    Rows(usize),
    /// Rows of varying length: row r at `starts[r] .. starts[r + 1]` (also in a block's
    /// payload, relative to the block's first row).
    VarRows(Vec<usize>),
    /// Bytes for the whole tensor, written once; a block's payload holds its own version
    /// there, `per_row · n + fixed` bytes long, which is skipped.
    Whole {
        bytes: Vec<u8>,
        per_row: usize,
        fixed: usize,
    },
}

impl Plane {
    fn len(&self, rows: usize) -> usize {
        match self {
            Plane::Rows(b) => b * rows,
            Plane::VarRows(s) => s[rows],
            Plane::Whole { bytes, .. } => bytes.len(),
        }
    }

    /// Bytes of rows `rows` of this plane in the whole payload (`None`: written once).
    fn span(&self, rows: &Range<usize>) -> Option<Range<usize>> {
        match self {
            Plane::Rows(b) => Some(b * rows.start..b * rows.end),
            Plane::VarRows(s) => Some(s[rows.start]..s[rows.end]),
            Plane::Whole { .. } => None,
        }
    }

    /// Bytes of this plane in the payload of a block of `n` rows.
    fn block_len(&self, rows: &Range<usize>) -> usize {
        match self {
            Plane::Whole { per_row, fixed, .. } => per_row * rows.len() + fixed,
            _ => self.span(rows).map_or(0, |s| s.len()),
        }
    }
}

/// The planes of `dtype` at geometry `g` once `decision` is taken.
fn planes_of(
    dtype: DType,
    shape: &[u64],
    g: Geom,
    decision: Option<&Decision>,
) -> Result<Option<Vec<Plane>>, QuantError> {
    let bad = |reason: String| QuantError::InvalidArgument { dtype, reason };
    if let Some(p) = row_planes(dtype, shape) {
        return Ok(Some(p.into_iter().map(Plane::Rows).collect()));
    }
    Ok(Some(match (dtype, decision) {
        (DType::Vbit | DType::VbitRo, Some(Decision::Bits(bits))) => {
            if bits.len() != g.rows {
                return Err(bad(format!(
                    "{} row widths for {} rows",
                    bits.len(),
                    g.rows
                )));
            }
            let mut starts = Vec::with_capacity(g.rows + 1);
            let mut at = 0usize;
            starts.push(0);
            for &b in bits {
                at = g
                    .cols
                    .checked_mul(b as usize)
                    .and_then(|bits| bits.div_ceil(8).checked_add(at))
                    .ok_or_else(|| bad("packed rows overflow".into()))?;
                starts.push(at);
            }
            let mut p = vec![Plane::Rows(1), Plane::Rows(2 * (g.cols / 32))];
            if dtype == DType::VbitRo {
                let mut bytes = Vec::with_capacity(4 * starts.len());
                for &s in &starts {
                    let s = u32::try_from(s).map_err(|_| QuantError::OutOfRange {
                        dtype,
                        reason: "packed rows exceed the 4 GiB reach of u32 offsets".into(),
                    })?;
                    bytes.extend_from_slice(&s.to_le_bytes());
                }
                p.push(Plane::Whole {
                    bytes,
                    per_row: 4,
                    fixed: 4,
                });
            }
            p.push(Plane::VarRows(starts));
            p
        }
        (DType::Q8_2f, Some(Decision::Field(field))) => {
            let bytes: Vec<u8> = field.iter().flat_map(|c| c.to_le_bytes()).collect();
            vec![
                Plane::Rows(g.cols),
                Plane::Rows(2),
                Plane::Whole {
                    bytes,
                    per_row: 0,
                    fixed: 2 * g.cols,
                },
            ]
        }
        (DType::Vbit | DType::VbitRo | DType::Q8_2f, _) => {
            return Err(bad("the decision does not match the codec".into()))
        }
        _ => return Ok(None),
    }))
}

/// Encodes rows `rows` (`values`) as a payload of `[rows.len(), cols]` under `decision`.
fn encode_block(
    dtype: DType,
    cols: usize,
    rows: &Range<usize>,
    values: &[f32],
    opts: &EncodeOptions,
    decision: Option<&Decision>,
) -> Result<Vec<u8>, QuantError> {
    let n = rows.len();
    let g = Geom {
        numel: n * cols,
        rows: n,
        cols,
    };
    let mut out = Vec::new();
    match decision {
        None => return encode(dtype, &[n as u64, cols as u64], values, opts),
        Some(Decision::Bits(bits)) => {
            not_finite_check(dtype, rows.start, cols, values)?;
            vbit::encode_with_bits(dtype, g, values, &bits[rows.clone()], &mut out)?
        }
        Some(Decision::Field(field)) => {
            not_finite_check(dtype, rows.start, cols, values)?;
            q8::encode_q8_2f_with(g, values, field, &mut out)?
        }
    }
    Ok(out)
}

/// Encodes a `dtype` tensor of `shape` in blocks of rows on all threads, or returns
/// `Ok(None)` when the codec is not [`streamable`] (encode the whole tensor instead).
///
/// `source(rows, values)` fills `values` (`rows.len() · cols` of them) with the tensor's
/// rows `rows`; `inspect(rows, values, block)` then sees those values beside their
/// encoding `block` (a payload of shape `[rows.len(), cols]`), e.g. to measure the error.
/// A codec that [`needs_first_pass`] takes `decision` when given (e.g. widths shared by a
/// layer's experts), else runs [`first_pass`] (a second read of every row) and
/// [`decide`]s. Codec errors reach the caller through `quant_err`.
/// Memory: the payload plus one block of values and one block payload per thread.
pub fn encode_row_blocks<E: Send>(
    dtype: DType,
    shape: &[u64],
    opts: &EncodeOptions,
    decision: Option<Decision>,
    source: impl Fn(Range<usize>, &mut [f32]) -> Result<(), E> + Sync,
    inspect: impl Fn(Range<usize>, &[f32], &[u8]) -> Result<(), E> + Sync,
    quant_err: impl Fn(QuantError) -> E + Sync,
) -> Result<Option<Vec<u8>>, E> {
    if !streamable(dtype, shape) {
        return Ok(None);
    }
    let g = geometry(dtype, shape).map_err(&quant_err)?;
    if overlay_streamable(dtype, shape) {
        return encode_overlay_blocks(dtype, g, opts, source, inspect, quant_err).map(Some);
    }
    let decision = match (decision, needs_first_pass(dtype)) {
        (d @ Some(_), true) => d,
        (_, true) => match first_pass(dtype, shape, &source, &quant_err)? {
            Some(stats) => Some(decide(dtype, &stats, opts).map_err(&quant_err)?),
            None => None,
        },
        (_, false) => None,
    };
    let Some(planes) = planes_of(dtype, shape, g, decision.as_ref()).map_err(&quant_err)? else {
        return Ok(None);
    };
    let total = planes
        .iter()
        .try_fold(0usize, |a, p| a.checked_add(p.len(g.rows)));
    let total = total.ok_or_else(|| {
        quant_err(QuantError::InvalidArgument {
            dtype,
            reason: format!("a payload of shape {shape:?} does not fit in memory"),
        })
    })?;
    let mut payload = zeroed(dtype, total).map_err(&quant_err)?;

    // Per block, its share of every plane, so the blocks write disjoint bytes; the
    // tensor-wide planes are written now.
    let ranges: Vec<Range<usize>> = blocks(g.rows, g.cols).collect();
    let mut per_block: Vec<Vec<&mut [u8]>> = ranges.iter().map(|_| Vec::new()).collect();
    let mut rest: &mut [u8] = &mut payload;
    for p in &planes {
        let (mut plane, tail) = std::mem::take(&mut rest).split_at_mut(p.len(g.rows));
        rest = tail;
        if let Plane::Whole { bytes, .. } = p {
            plane.copy_from_slice(bytes);
            continue;
        }
        for (k, rows) in ranges.iter().enumerate() {
            let len = p.span(rows).map_or(0, |s| s.len());
            let (chunk, more) = std::mem::take(&mut plane).split_at_mut(len);
            plane = more;
            per_block[k].push(chunk);
        }
    }
    let decision = decision.as_ref();
    ranges
        .into_par_iter()
        .zip(per_block)
        .try_for_each(|(rows, mut dest)| -> Result<(), E> {
            let mut values = vec![0f32; rows.len() * g.cols];
            source(rows.clone(), &mut values)?;
            let block =
                encode_block(dtype, g.cols, &rows, &values, opts, decision).map_err(&quant_err)?;
            let mut at = 0;
            let mut dest = dest.iter_mut();
            for p in &planes {
                let len = p.block_len(&rows);
                if !matches!(p, Plane::Whole { .. }) {
                    if let Some(d) = dest.next() {
                        d.copy_from_slice(&block[at..at + len]);
                    }
                }
                at += len;
            }
            inspect(rows, &values, &block)
        })?;
    Ok(Some(payload))
}

/// `q1s`/`q1t` a block of rows at a time, in three streamed passes, as the whole-tensor
/// encoder does them in one: (1) the provisional outliers, the `k` largest relative to
/// their group, selected per task and merged; (2) the base tiles fitted without them,
/// written in place, and the `k` largest base errors selected; (3) the chosen elements'
/// values read again, blocks handed to `inspect`, and the overlay written. The selections
/// are top-`k` under a total order, so merging per-task selections gives exactly the
/// whole-tensor set. Memory: the payload and O(k) per task, no f32 copy of the tensor.
fn encode_overlay_blocks<E: Send>(
    dtype: DType,
    g: Geom,
    opts: &EncodeOptions,
    source: impl Fn(Range<usize>, &mut [f32]) -> Result<(), E> + Sync,
    inspect: impl Fn(Range<usize>, &[f32], &[u8]) -> Result<(), E> + Sync,
    quant_err: impl Fn(QuantError) -> E + Sync,
) -> Result<Vec<u8>, E> {
    let fraction = super::outlier_fraction(dtype, opts).map_err(&quant_err)?;
    let k = q1::outlier_count(fraction, g.numel);
    let cols = g.cols;
    let ranges: Vec<Range<usize>> = blocks(g.rows, cols).collect();
    let read = |rows: &Range<usize>| -> Result<Vec<f32>, E> {
        let mut v = vec![0f32; rows.len() * cols];
        source(rows.clone(), &mut v)?;
        not_finite_check(dtype, rows.start, cols, &v).map_err(&quant_err)?;
        Ok(v)
    };
    let merge = |a: Outliers, b: Outliers| -> Result<Outliers, E> { Ok(a.merge(b)) };
    // Few, long tasks: each holds a selection of up to `k` and merging costs O(k log k).
    let per_task = ranges
        .len()
        .div_ceil(2 * rayon::current_num_threads())
        .max(1);

    // Pass 1: provisional outliers.
    let provisional = ranges
        .par_iter()
        .with_min_len(per_task)
        .try_fold(
            || Outliers::new(k),
            |mut sel, rows| -> Result<Outliers, E> {
                let v = read(rows)?;
                q1::provisional_block(dtype, g, &v, rows.start * cols, &mut sel);
                Ok(sel)
            },
        )
        .try_reduce(|| Outliers::new(k), merge)?
        .into_sorted();

    // Pass 2: the tiles, in place, and the final selection.
    let tile = if dtype == DType::Q1t {
        q1::Q1T_TILE
    } else {
        q1::Q1_TILE
    };
    let row_bytes = tile * (cols / 32);
    let tiles = g.rows * row_bytes;
    let mut payload = zeroed(dtype, tiles).map_err(&quant_err)?;
    let chosen = ranges
        .par_iter()
        .zip(payload.par_chunks_mut(row_bytes * block_rows(cols)))
        .with_min_len(per_task)
        .try_fold(
            || Outliers::new(k),
            |mut sel, (rows, dest)| -> Result<Outliers, E> {
                let v = read(rows)?;
                let mut out = Vec::with_capacity(dest.len());
                q1::tiles_block(
                    dtype,
                    g,
                    &v,
                    rows.start * cols,
                    &provisional,
                    &mut out,
                    &mut sel,
                )
                .map_err(&quant_err)?;
                dest.copy_from_slice(&out);
                Ok(sel)
            },
        )
        .try_reduce(|| Outliers::new(k), merge)?
        .into_sorted();

    // Pass 3: the chosen values; each block checked as a payload of its own.
    let per_block: Vec<Vec<f32>> = ranges
        .par_iter()
        .map(|rows| -> Result<Vec<f32>, E> {
            let v = read(rows)?;
            let (e0, e1) = (rows.start * cols, rows.end * cols);
            let mine =
                &chosen[chosen.partition_point(|&i| i < e0)..chosen.partition_point(|&i| i < e1)];
            let value: Vec<f32> = mine.iter().map(|&i| v[i - e0]).collect();
            let local: Vec<usize> = mine.iter().map(|&i| i - e0).collect();
            let bg = Geom {
                numel: e1 - e0,
                rows: rows.len(),
                cols,
            };
            let mut block = payload[rows.start * row_bytes..rows.end * row_bytes].to_vec();
            q1::write_overlay(dtype, bg, &local, &value, &mut block);
            inspect(rows.clone(), &v, &block)?;
            Ok(value)
        })
        .collect::<Result<_, E>>()?;
    let value: Vec<f32> = per_block.into_iter().flatten().collect();
    q1::write_overlay(dtype, g, &chosen, &value, &mut payload);
    Ok(payload)
}

/// The largest of non-negative floats seen by several threads (`f32` bits order like the
/// values for non-negative floats, so an integer `fetch_max` does it).
#[derive(Debug, Default)]
pub struct MaxF32(AtomicU32);

impl MaxF32 {
    pub fn observe(&self, v: f32) {
        if v > 0.0 {
            self.0.fetch_max(v.to_bits(), Ordering::Relaxed);
        }
    }

    pub fn get(&self) -> f32 {
        f32::from_bits(self.0.load(Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| {
                let x = (i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed);
                // A spread of magnitudes, some rows near zero.
                ((x >> 8) as f32 / (1u32 << 24) as f32 - 0.5) * if i % 97 < 3 { 8.0 } else { 1.0 }
            })
            .collect()
    }

    #[test]
    fn blocks_assemble_the_whole_tensor_payload() {
        let opts = EncodeOptions::default();
        for dtype in [
            DType::F32,
            DType::F16,
            DType::Bf16,
            DType::Q8Row,
            DType::Q4Block,
            DType::Q4Tiled,
            DType::Q4tp,
            DType::Q1,
            DType::Q8_2f,
            DType::Vbit,
            DType::VbitRo,
            DType::Q1s,
            DType::Q1t,
        ] {
            // More rows than one block holds, and a ragged last block.
            for shape in [[700u64, 256], [3, 64], [1, 32], [2100, 64]] {
                let all = values((shape[0] * shape[1]) as usize, 7);
                let whole = encode(dtype, &shape, &all, &opts).unwrap();
                let cols = shape[1] as usize;
                let seen = std::sync::atomic::AtomicUsize::new(0);
                let streamed = encode_row_blocks::<QuantError>(
                    dtype,
                    &shape,
                    &opts,
                    None,
                    |rows, out| {
                        out.copy_from_slice(&all[rows.start * cols..rows.end * cols]);
                        Ok(())
                    },
                    |rows, v, _| {
                        assert_eq!(v.len(), rows.len() * cols);
                        seen.fetch_add(rows.len(), Ordering::Relaxed);
                        Ok(())
                    },
                    |e| e,
                )
                .unwrap()
                .unwrap_or_else(|| panic!("{dtype} is row-separable"));
                assert!(whole == streamed, "{dtype} {shape:?}: payloads differ");
                assert_eq!(seen.into_inner(), shape[0] as usize);
            }
        }
    }

    /// Empty tensors stream to what the whole-tensor encoder writes (or fail alike).
    #[test]
    fn empty_shapes_match_the_whole_tensor_encoder() {
        let opts = EncodeOptions::default();
        for dtype in crate::format::dtype::WRITABLE {
            for shape in [[0u64, 64], [3, 0], [0, 0]] {
                let whole = encode(dtype, &shape, &[], &opts);
                let streamed = encode_row_blocks::<QuantError>(
                    dtype,
                    &shape,
                    &opts,
                    None,
                    |_, _| Ok(()),
                    |_, _, _| Ok(()),
                    |e| e,
                );
                match (whole, streamed) {
                    (Ok(w), Ok(Some(s))) => assert_eq!(w, s, "{dtype} {shape:?}"),
                    (_, Ok(None)) | (Err(_), Err(_)) => {}
                    (w, s) => panic!("{dtype} {shape:?}: whole {w:?}, streamed {s:?}"),
                }
            }
        }
    }

    #[test]
    fn tensor_wide_codecs_are_not_separable() {
        for dtype in [
            DType::Q8_2f,
            DType::Vbit,
            DType::VbitRo,
            DType::Q1s,
            DType::Q1t,
        ] {
            assert_eq!(row_planes(dtype, &[64, 64]), None, "{dtype}");
        }
        assert!(streamable(DType::Q1s, &[64, 64]));
        assert!(!streamable(DType::Q1s, &[64, 40]));
        assert!(!streamable(DType::Q1s, &[64, 0]));
        assert!(streamable(DType::Vbit, &[64, 64]));
        // A q1 group of 32 straddling rows.
        assert_eq!(row_planes(DType::Q1, &[4, 40]), None);
        assert!(row_planes(DType::F16, &[4, 40]).is_some());
    }

    #[test]
    fn source_errors_stop_the_encoding() {
        let r = encode_row_blocks::<QuantError>(
            DType::Q8Row,
            &[5000, 64],
            &EncodeOptions::default(),
            None,
            |rows, _| {
                if rows.start > 0 {
                    Err(QuantError::InvalidArgument {
                        dtype: DType::Q8Row,
                        reason: "source broke".into(),
                    })
                } else {
                    Ok(())
                }
            },
            |_, _, _| Ok(()),
            |e| e,
        );
        assert!(matches!(r, Err(QuantError::InvalidArgument { .. })));
    }

    #[test]
    fn max_of_floats_across_threads() {
        let m = MaxF32::default();
        (0..1000)
            .into_par_iter()
            .for_each(|i| m.observe(i as f32 * 0.5));
        assert_eq!(m.get(), 499.5);
    }
}
