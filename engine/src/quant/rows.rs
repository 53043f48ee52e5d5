//! Encoding a tensor a block of rows at a time, so that a converter never holds a large
//! tensor's f32 values: only its encoded payload and one block of values per thread.
//!
//! This works for the codecs whose payload is *row-separable*: a concatenation of planes,
//! plane `i` holding `b_i` bytes per row in row order, and each row encoded without
//! looking at the others. Encoding rows `r0 .. r1` as a tensor `[r1 − r0, cols]` then
//! gives exactly those rows' share of every plane of the whole tensor's payload, so the
//! payload is assembled plane by plane from the blocks, bit-identical to [`encode`] on
//! the whole tensor (a test checks this for every separable codec).
//!
//! Not separable: `q8_2f` (a column field over all rows), `vbit`/`vbit_ro` (a bit budget
//! over all rows), `q1s`/`q1t` (outliers chosen over the whole tensor), and the flattened
//! group codecs when a group of 32 straddles two rows (`cols % 32 != 0`).

use std::ops::Range;
use std::sync::atomic::{AtomicU32, Ordering};

use rayon::prelude::*;

use super::{encode, geometry, layout::Q4tpLayout, EncodeOptions, Geom, QuantError};
use crate::format::dtype::DType;

/// Bytes per row of each plane of a `dtype` payload of `shape`, in payload order, when
/// the payload is row-separable (see the module comment); `None` otherwise.
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

/// Rows per block: about 64 Ki values (256 KiB of f32), at least one row.
fn block_rows(cols: usize) -> usize {
    (65_536 / cols.max(1)).max(1)
}

/// Encodes a `dtype` tensor of `shape` in blocks of rows on all threads, or returns
/// `Ok(None)` when the codec is not row-separable (encode the whole tensor instead).
///
/// `source(rows, values)` fills `values` (`rows.len() · cols` of them) with the tensor's
/// rows `rows`; `inspect(rows, values, block)` then sees those values beside their
/// encoding `block` (a payload of shape `[rows.len(), cols]`), e.g. to measure the error.
/// Codec errors reach the caller through `quant_err`.
/// Memory: the payload plus one block of values and one block payload per thread.
pub fn encode_row_blocks<E: Send>(
    dtype: DType,
    shape: &[u64],
    opts: &EncodeOptions,
    source: impl Fn(Range<usize>, &mut [f32]) -> Result<(), E> + Sync,
    inspect: impl Fn(Range<usize>, &[f32], &[u8]) -> Result<(), E> + Sync,
    quant_err: impl Fn(QuantError) -> E + Sync,
) -> Result<Option<Vec<u8>>, E> {
    let Some(planes) = row_planes(dtype, shape) else {
        return Ok(None);
    };
    let g = geometry(dtype, shape).map_err(&quant_err)?;
    // Checked: the plane sizes of a shape `geometry` accepted fit in memory only if the
    // payload does.
    let total = planes
        .iter()
        .try_fold(0usize, |a, b| a.checked_add(b.checked_mul(g.rows)?));
    let mut payload = Vec::new();
    match total {
        Some(t) if payload.try_reserve_exact(t).is_ok() => payload.resize(t, 0u8),
        _ => {
            return Err(quant_err(QuantError::InvalidArgument {
                dtype,
                reason: format!("a payload of shape {shape:?} does not fit in memory"),
            }))
        }
    }

    // Per block, its share of every plane: block k gets rows k·br .. and the matching
    // chunk of each plane, so the blocks write disjoint bytes.
    let br = block_rows(g.cols);
    let mut per_block: Vec<Vec<&mut [u8]>> = (0..g.rows.div_ceil(br)).map(|_| Vec::new()).collect();
    let mut rest: &mut [u8] = &mut payload;
    for &b in &planes {
        let (plane, tail) = rest.split_at_mut(b * g.rows);
        rest = tail;
        if b == 0 {
            continue;
        }
        for (k, chunk) in plane.chunks_mut(b * br).enumerate() {
            per_block[k].push(chunk);
        }
    }
    per_block
        .into_par_iter()
        .enumerate()
        .try_for_each(|(k, mut dest)| -> Result<(), E> {
            let r0 = k * br;
            let rows = r0..(r0 + br).min(g.rows);
            let n = rows.len();
            let mut values = vec![0f32; n * g.cols];
            source(rows.clone(), &mut values)?;
            let block =
                encode(dtype, &[n as u64, g.cols as u64], &values, opts).map_err(&quant_err)?;
            let mut at = 0;
            for (d, &b) in dest.iter_mut().zip(planes.iter().filter(|&&b| b > 0)) {
                d.copy_from_slice(&block[at..at + b * n]);
                at += b * n;
            }
            inspect(rows, &values, &block)
        })?;
    Ok(Some(payload))
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

    #[test]
    fn tensor_wide_codecs_are_not_separable() {
        for dtype in [DType::Q8_2f, DType::Vbit, DType::VbitRo, DType::Q1s, DType::Q1t] {
            assert_eq!(row_planes(dtype, &[64, 64]), None, "{dtype}");
        }
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
        (0..1000).into_par_iter().for_each(|i| m.observe(i as f32 * 0.5));
        assert_eq!(m.get(), 499.5);
    }
}
