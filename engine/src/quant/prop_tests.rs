//! Property tests: round trips within the documented bounds, exact sizes, idempotence,
//! and robustness of the readers against arbitrary bytes.

use super::*;
use crate::format::dtype::ALL_DTYPES;
use proptest::prelude::*;

use crate::format::dtype::WRITABLE;

/// Tensor-wide magnitudes: zero, tiny (f16-subnormal and f32-subnormal scales), ordinary,
/// large, and huge-but-finite (beyond what f16 scales store).
const MAGNITUDES: [f32; 9] = [0.0, 1e-38, 1e-9, 1e-5, 1e-2, 1.0, 50.0, 5e3, 1e30];

/// A shape the dtype accepts.
fn shape_for(dtype: DType) -> BoxedStrategy<Vec<u64>> {
    if dtype.requires_cols_multiple_of_group() {
        (1u64..6, 1u64..4)
            .prop_map(|(r, g)| vec![r, 32 * g])
            .boxed()
    } else if dtype.requires_2d() {
        (1u64..6, 1u64..80).prop_map(|(r, c)| vec![r, c]).boxed()
    } else {
        prop_oneof![
            (1u64..150).prop_map(|n| vec![n]),
            (1u64..5, 1u64..70).prop_map(|(r, c)| vec![r, c]),
            (1u64..3, 1u64..4, 1u64..20).prop_map(|(a, b, c)| vec![a, b, c]),
            Just(vec![]),
        ]
        .boxed()
    }
}

/// Values: per row a magnitude class, per element a sign, a spread, or zero.
fn values_for(shape: &[u64]) -> impl Strategy<Value = Vec<f32>> {
    let n = numel(shape).unwrap() as usize;
    let rows = if shape.len() >= 2 {
        shape[0] as usize
    } else {
        1
    };
    (
        proptest::collection::vec(0..MAGNITUDES.len(), rows),
        proptest::collection::vec((-1.0f32..1.0, 0u8..10), n),
    )
        .prop_map(move |(mags, elems)| {
            let cols = n / rows.max(1);
            elems
                .iter()
                .enumerate()
                .map(|(i, &(u, z))| {
                    if z == 0 {
                        0.0
                    } else {
                        MAGNITUDES[mags[(i / cols.max(1)).min(rows - 1)]] * u
                    }
                })
                .collect()
        })
}

fn case() -> impl Strategy<Value = (DType, Vec<u64>, Vec<f32>)> {
    proptest::sample::select(WRITABLE.to_vec())
        .prop_flat_map(|d| (Just(d), shape_for(d)))
        .prop_flat_map(|(d, s)| {
            let v = values_for(&s);
            (Just(d), Just(s), v)
        })
}

fn check_len(dtype: DType, shape: &[u64], bytes: &[u8]) {
    match dtype.size_for(shape).unwrap() {
        Size::Exact(n) => assert_eq!(bytes.len() as u64, n),
        Size::AtLeast(n) => assert!(bytes.len() as u64 >= n),
        Size::Opaque => unreachable!(),
    }
}

/// The q1 family's contract, element by element (they have no scale-relative bound).
fn check_q1_family(dtype: DType, values: &[f32], dec: &[f32], bytes: &[u8], bounds: &[f32]) {
    let tile = if dtype == DType::Q1t { 9 } else { 6 };
    for (gi, grp) in values.chunks(32).enumerate() {
        let s = f16::from_le_bytes([bytes[tile * gi], bytes[tile * gi + 1]]).to_f32();
        if dtype == DType::Q1 {
            let mean = grp.iter().map(|w| w.abs() as f64).sum::<f64>() / grp.len() as f64;
            let tol = (mean / 2048.0).max(1.0 / 33_554_432.0) * (1.0 + 1e-6);
            assert!(
                (s as f64 - mean).abs() <= tol,
                "group {gi}: q1 scale {s} is not the mean |w| {mean}"
            );
        }
        for (k, &w) in grp.iter().enumerate() {
            let i = gi * 32 + k;
            let d = dec[i];
            if bounds[i].is_finite() {
                assert!((d - w).abs() <= bounds[i], "overlay {i}: {d} vs {w}");
            } else if dtype == DType::Q1t {
                let want = if s > 0.0 && w.abs() > 0.5 * s {
                    s.copysign(w)
                } else {
                    0.0
                };
                assert_eq!(d, want, "q1t element {i}: w {w}, s {s}");
            } else {
                let want = if w >= 0.0 || s == 0.0 { s } else { -s };
                assert_eq!(d, want, "q1 element {i}: w {w}, s {s}");
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 768, ..ProptestConfig::default() })]

    #[test]
    fn round_trip_within_bounds((dtype, shape, values) in case()) {
        let amax = values.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let bytes = match encode(dtype, &shape, &values, &EncodeOptions::default()) {
            Ok(b) => b,
            Err(QuantError::OutOfRange { .. }) => {
                // Only f16-bound codecs may refuse, and only for values an f16 scale (or
                // f16 value) cannot carry.
                prop_assert!(amax > 30000.0, "{dtype} refused amax {amax}");
                prop_assert!(!matches!(dtype, DType::F32 | DType::Bf16 | DType::Q4tp));
                return Ok(());
            }
            Err(e) => panic!("{dtype} {shape:?}: {e}"),
        };
        check_len(dtype, &shape, &bytes);
        validate(dtype, &shape, &bytes).unwrap();
        let dec = decode(dtype, &shape, &bytes).unwrap();
        let bounds = error_bounds(dtype, &shape, &bytes).unwrap();
        prop_assert_eq!(dec.len(), values.len());
        if matches!(dtype, DType::Q1 | DType::Q1s | DType::Q1t) {
            check_q1_family(dtype, &values, &dec, &bytes, &bounds);
            if dtype != DType::Q1 {
                // Overlays only ever lower the error of the base they sit on.
                let g = geometry(dtype, &shape).unwrap();
                let mut base = bytes.clone();
                if dtype == DType::Q1s {
                    base.truncate(values.len().div_ceil(32) * 6);
                    base.extend_from_slice(&0u32.to_le_bytes());
                } else {
                    base.truncate(values.len().div_ceil(32) * 9);
                    base.extend(std::iter::repeat_n(0u8, 4 * (g.rows + 1)));
                }
                let bdec = decode(dtype, &shape, &base).unwrap();
                let sse = |d: &[f32]| d.iter().zip(&values).map(|(a, b)| ((a - b) as f64).powi(2)).sum::<f64>();
                prop_assert!(sse(&dec) <= sse(&bdec));
            }
        } else {
            for i in 0..values.len() {
                prop_assert!((dec[i] - values[i]).abs() <= bounds[i],
                    "{} {:?} [{}]: {} → {} (bound {})", dtype, shape, i, values[i], dec[i], bounds[i]);
            }
        }
        let g = geometry(dtype, &shape).unwrap();
        let mut row = vec![0.0f32; g.cols];
        for r in 0..g.rows {
            decode_row(dtype, &shape, &bytes, r, &mut row).unwrap();
            prop_assert_eq!(&row[..], &dec[r * g.cols..(r + 1) * g.cols]);
        }
        prop_assert!(decode_row(dtype, &shape, &bytes, g.rows, &mut row).is_err());
        // Deterministic.
        prop_assert_eq!(encode(dtype, &shape, &values, &EncodeOptions::default()).unwrap(), bytes);
    }

    /// Re-encoding decoded values is byte-identical for q8_row, q4_block, q4_tiled and q1.
    /// For the first three this needs every scale in the f16 normal range (the largest
    /// element then decodes to exactly ±qmax·s, and qmax·s / qmax = s); with f16-subnormal
    /// scales (row absmax below ~5e-4 for q8, ~4e-6 for q4) the rounded scale can move the
    /// largest code off ±qmax and re-encoding picks a different scale. q1 holds always:
    /// the mean of ±s is exactly s.
    #[test]
    fn reencoding_is_idempotent(
        dtype in proptest::sample::select(vec![DType::Q8Row, DType::Q4Block, DType::Q4Tiled, DType::Q1]),
        rows in 1usize..5, cols in 1usize..100,
        mags in proptest::collection::vec(prop_oneof![Just(0.0f32), 0.01f32..1000.0, 1e-30f32..1e-3], 1..5),
        seed in proptest::collection::vec(-1.0f32..1.0, 500),
    ) {
        let shape = [rows as u64, cols as u64];
        let n = rows * cols;
        let mut v: Vec<f32> = (0..n).map(|i| seed[i % seed.len()] * mags[(i / cols) % mags.len()]).collect();
        if dtype != DType::Q1 {
            // Keep scales normal: every group / row has one element at its full magnitude
            // ≥ 0.01 (or is zero).
            for (i, x) in v.iter_mut().enumerate() {
                let m = mags[(i / cols) % mags.len()];
                if m < 0.01 { *x = 0.0 } else if i % 32 == 0 || (dtype == DType::Q8Row && i % cols == 0) { *x = m }
            }
        }
        let opts = EncodeOptions::default();
        let a = encode(dtype, &shape, &v, &opts).unwrap();
        let d = decode(dtype, &shape, &a).unwrap();
        let b = encode(dtype, &shape, &d, &opts).unwrap();
        prop_assert_eq!(a, b);
    }

}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4096, ..ProptestConfig::default() })]

    /// Readers never panic, whatever the bytes; whatever validates decodes, and every row
    /// decodes to its slice of the whole.
    #[test]
    fn readers_survive_arbitrary_bytes(
        id in 0u8..16,
        dims in proptest::collection::vec(0u64..70, 0..4),
        mode in 0u8..4,
        noise in proptest::collection::vec(any::<u8>(), 0..600),
        cut in any::<usize>(),
    ) {
        let dtype = DType::from_id(id).unwrap();
        let mut shape = dims;
        if dtype.requires_cols_multiple_of_group() && shape.len() == 2 {
            shape[1] = shape[1] / 16 * 32;
        }
        let size = match dtype.size_for(&shape) {
            Ok(Size::Exact(n)) | Ok(Size::AtLeast(n)) => n as usize,
            _ => 0,
        };
        let bytes: Vec<u8> = match mode {
            // Random bytes of the right minimum length (exercises fixed-size decoders).
            0 => noise.iter().cycle().take(size).copied().collect(),
            // A valid encoding, truncated.
            1 | 2 => {
                let n = numel(&shape).unwrap_or(0) as usize;
                let vals: Vec<f32> = (0..n).map(|i| noise.get(i % noise.len().max(1)).map_or(0.0, |&b| b as f32 - 128.0)).collect();
                let opts = EncodeOptions { outlier_fraction: Some(0.05), ..Default::default() };
                let mut b = encode(dtype, &shape, &vals, &opts).unwrap_or_default();
                if mode == 1 { b.truncate(cut % (b.len() + 1)); } else if !b.is_empty() {
                    let at = cut % b.len();
                    b[at] ^= noise.first().copied().unwrap_or(0x5a) | 1;
                }
                b
            }
            _ => noise.clone(),
        };
        let _ = bits_per_weight(dtype, &shape, &bytes);
        let ok = validate(dtype, &shape, &bytes).is_ok();
        let whole = decode(dtype, &shape, &bytes);
        prop_assert_eq!(ok, whole.is_ok());
        prop_assert_eq!(ok, error_bounds(dtype, &shape, &bytes).is_ok());
        if let Ok(g) = geometry(dtype, &shape) {
            let mut row = vec![0.0f32; g.cols.min(4096)];
            for r in 0..g.rows.min(80) + 1 {
                let res = decode_row(dtype, &shape, &bytes, r, &mut row);
                if let (Ok(()), Ok(w)) = (&res, &whole) {
                    let want = &w[r * g.cols..(r + 1) * g.cols];
                    // Bit for bit, but any NaN for a NaN: a product of two NaNs keeps
                    // either payload (the compiler may commute it; on AArch64 it did).
                    let same = |(a, b): (&f32, &f32)| {
                        a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
                    };
                    prop_assert!(row.iter().zip(want).all(same));
                } else if ok && r < g.rows && row.len() == g.cols {
                    prop_assert!(res.is_ok(), "{}: row {} of a valid payload failed: {:?}", dtype, r, res);
                }
            }
        }
    }
}

#[test]
fn reserved_dtypes_refuse_with_a_clear_message() {
    for d in ALL_DTYPES.into_iter().filter(|d| d.is_reserved()) {
        let e = decode(d, &[4], &[0; 4]).unwrap_err();
        assert!(matches!(e, QuantError::Reserved { .. }));
        let msg = e.to_string();
        assert!(msg.contains(d.name()) && msg.contains("reserved"), "{msg}");
        assert!(encode(d, &[4], &[0.0; 4], &EncodeOptions::default()).is_err());
        assert!(validate(d, &[4], &[]).is_err());
    }
}

#[test]
fn unsupported_shapes_and_bad_inputs_are_errors() {
    let o = EncodeOptions::default();
    let e = encode(DType::Vbit, &[2, 33], &[0.0; 66], &o).unwrap_err();
    assert!(matches!(e, QuantError::UnsupportedShape { .. }), "{e}");
    assert!(e.to_string().contains("32"), "{e}");
    assert!(matches!(
        encode(DType::Q8Row, &[8], &[0.0; 8], &o),
        Err(QuantError::UnsupportedShape { .. })
    ));
    assert!(matches!(
        encode(DType::Q4tp, &[1, 2, 32], &[0.0; 64], &o),
        Err(QuantError::UnsupportedShape { .. })
    ));
    let e = encode(DType::Q4Block, &[3], &[1.0, f32::NAN, 0.0], &o).unwrap_err();
    assert!(matches!(e, QuantError::NonFinite { index: 1, .. }), "{e}");
    assert!(e.to_string().contains("not finite"), "{e}");
    assert!(matches!(
        encode(DType::F16, &[1], &[1e6], &o),
        Err(QuantError::OutOfRange { .. })
    ));
    assert!(matches!(
        encode(DType::F16, &[2], &[1.0], &o),
        Err(QuantError::InvalidArgument { .. })
    ));
    let bad = EncodeOptions {
        mean_bits: Some(9.0),
        ..o
    };
    assert!(encode(DType::Vbit, &[1, 32], &[0.0; 32], &bad).is_err());
    let mut out = [0.0f32; 3];
    assert!(
        decode_row(DType::F32, &[2, 4], &[0; 32], 0, &mut out).is_err(),
        "wrong output length"
    );
}

#[test]
fn empty_and_degenerate_shapes() {
    let o = EncodeOptions::default();
    for d in WRITABLE {
        for shape in [vec![0u64, 32], vec![3, 0], vec![0]] {
            let Ok(b) = encode(d, &shape, &[], &o) else {
                continue;
            };
            check_len(d, &shape, &b);
            validate(d, &shape, &b).unwrap();
            assert!(decode(d, &shape, &b).unwrap().is_empty());
        }
    }
}

#[test]
fn bits_per_weight_is_measured() {
    let v = vec![0.5f32; 64 * 64];
    let o = EncodeOptions::default();
    let b = encode(DType::Q4Block, &[64, 64], &v, &o).unwrap();
    assert_eq!(bits_per_weight(DType::Q4Block, &[64, 64], &b), 4.5);
    let b = encode(DType::Q1t, &[64, 64], &v, &o).unwrap();
    let bpw = bits_per_weight(DType::Q1t, &[64, 64], &b);
    // 2.25 for the tiles + the row_ptr table (65 u32), no overlay for a constant tensor.
    assert_eq!(bpw, 2.25 + 65.0 * 32.0 / 4096.0);
    let b = encode(DType::VbitRo, &[64, 64], &v, &o).unwrap();
    let bpw = bits_per_weight(DType::VbitRo, &[64, 64], &b);
    assert!(
        bpw <= 4.0 + 0.5 + 8.0 * (64.0 + 65.0 * 4.0) / 4096.0 + 1e-9,
        "{bpw}"
    );
}
