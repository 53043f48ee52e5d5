//! Every dtype's decoder and the matrix kernels on hostile dtypes, shapes and payloads.
//! `validate` / `payload_check` agree; `decode`, `decode_row` and `Matrix::new` accept
//! only what `validate` accepts; a `Matrix` that was accepted multiplies (matvec,
//! row-selected matvec, matmul, row decode) at every precision and every kernel this CPU
//! has without panicking, and `matmul` equals `t` matvecs bit for bit, as `quant::matrix`
//! documents.
//!
//! Input: `[dtype u8][flags u8][acts u8][dims: u16 LE each, 0xFFFF = a u64 LE follows][payload]`.
//! flags: bits 0-1 number of dims, bit 2 fit the payload to the shape's size (pad with
//! zeros or cut), bits 3-4 precision, bits 5-7 tokens - 1. acts: how activations look.
#![no_main]

use cortiq_engine::format::dtype::{DType, Size};
use cortiq_engine::quant::matrix::{
    matmul_with, matvec_rows_with, matvec_with, Kernel, Matrix, Precision,
};
use cortiq_engine::quant::{decode, decode_row, geometry, payload_check, validate};
use libfuzzer_sys::fuzz_target;

/// Largest activation or output buffer the harness builds: a caller sizes them to the
/// matrix, and a matrix with no elements may be huge in one dimension (kept small so
/// that each run stays fast).
const MAX_BUF: usize = 1 << 12;

struct Input<'a> {
    dtype: DType,
    shape: Vec<u64>,
    payload: std::borrow::Cow<'a, [u8]>,
    precision: Precision,
    tokens: usize,
    acts: u8,
}

fn parse(data: &[u8]) -> Option<Input<'_>> {
    let (&d, rest) = data.split_first()?;
    let (&flags, rest) = rest.split_first()?;
    let (&acts, mut rest) = rest.split_first()?;
    let dtype = DType::from_id(d & 15)?;
    let mut shape = Vec::new();
    for _ in 0..(flags & 3) {
        let (b, r) = rest.split_first_chunk::<2>()?;
        rest = r;
        let v = u16::from_le_bytes(*b);
        if v == 0xFFFF {
            let (b, r) = rest.split_first_chunk::<8>()?;
            rest = r;
            shape.push(u64::from_le_bytes(*b));
        } else {
            shape.push(v as u64);
        }
    }
    let mut payload = std::borrow::Cow::Borrowed(rest);
    if flags & 4 != 0 {
        // Reach the kernels with fixed-size layouts without guessing byte counts.
        let want = match dtype.size_for(&shape) {
            Ok(Size::Exact(n)) => Some(n),
            Ok(Size::AtLeast(n)) if (rest.len() as u64) < n => Some(n),
            _ => None,
        };
        if let Some(n) = want.filter(|&n| n <= 1 << 20) {
            let mut v = rest.to_vec();
            v.resize(n as usize, 0);
            payload = std::borrow::Cow::Owned(v);
        }
    }
    let precision = match (flags >> 3) & 3 {
        1 => Precision::Balanced,
        2 => Precision::Fast,
        _ => Precision::Exact,
    };
    Some(Input {
        dtype,
        shape,
        payload,
        precision,
        tokens: ((flags >> 5) & 7) as usize + 1,
        acts,
    })
}

fn activation(mode: u8, i: usize) -> f32 {
    let base = ((i * 37 % 17) as f32 - 8.0) * 0.25;
    match mode & 7 {
        0 | 1 | 2 => base,
        3 => 0.0,
        4 => base * 1e30,
        5 => base * 1e-30,
        6 if i % 5 == 3 => f32::NAN,
        7 if i % 7 == 2 => f32::INFINITY,
        _ => base,
    }
}

fn same(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

fn products(m: &Matrix, bytes: &[u8], inp: &Input) {
    let (rows, cols, t) = (m.rows, m.cols, inp.tokens);
    if cols > MAX_BUF || rows.saturating_mul(t) > MAX_BUF || cols.saturating_mul(t) > MAX_BUF {
        return;
    }
    let x: Vec<f32> = (0..t * cols).map(|i| activation(inp.acts, i)).collect();
    let mut row = vec![0f32; cols];
    for r in [0, rows / 2, rows.saturating_sub(1)] {
        if r < rows {
            m.row(bytes, r, &mut row);
        }
    }
    let mut y1 = vec![0f32; rows];
    let mut yt = vec![0f32; rows * t];
    let sel: Vec<u32> = (0..rows.min(u32::MAX as usize) as u32).step_by(3).collect();
    let mut ys = vec![0f32; sel.len()];
    for k in [Kernel::Scalar, Kernel::Avx2, Kernel::Avx512] {
        let mut m = m.clone();
        if m.set_kernel(k).is_err() {
            continue;
        }
        matvec_with(&m, bytes, &x[..cols], &mut y1, inp.precision);
        matvec_rows_with(&m, bytes, &x[..cols], &sel, &mut ys, inp.precision);
        for (i, &r) in sel.iter().enumerate() {
            assert!(
                same(ys[i], y1[r as usize]),
                "row {r}: selected {} vs {}",
                ys[i],
                y1[r as usize]
            );
        }
        matmul_with(&m, bytes, &x, t, &mut yt, inp.precision);
        for j in 0..t {
            let mut yj = vec![0f32; rows];
            matvec_with(
                &m,
                bytes,
                &x[j * cols..(j + 1) * cols],
                &mut yj,
                inp.precision,
            );
            for r in 0..rows {
                assert!(
                    same(yt[j * rows + r], yj[r]),
                    "{k:?}: matmul [{j}, {r}] = {} but matvec {}",
                    yt[j * rows + r],
                    yj[r]
                );
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some(inp) = parse(data) else { return };
    let (dtype, shape, bytes) = (inp.dtype, &inp.shape[..], &inp.payload[..]);
    let v = validate(dtype, shape, bytes);
    assert_eq!(v.is_ok(), payload_check(dtype, shape, bytes).is_ok());
    let decoded = decode(dtype, shape, bytes);
    assert_eq!(
        decoded.is_ok(),
        v.is_ok(),
        "decode vs validate: {decoded:?} {v:?}"
    );
    if let Ok(values) = &decoded {
        let g = geometry(dtype, shape).unwrap();
        assert_eq!(values.len(), g.numel);
        if g.cols <= MAX_BUF && g.rows > 0 {
            let mut out = vec![0f32; g.cols];
            for r in [0, g.rows - 1] {
                decode_row(dtype, shape, bytes, r, &mut out).unwrap();
                for (a, b) in out.iter().zip(&values[r * g.cols..(r + 1) * g.cols]) {
                    assert!(same(*a, *b), "decode_row differs from decode in row {r}");
                }
            }
        }
    }
    match Matrix::new(dtype, shape, bytes) {
        Ok(m) => {
            assert!(v.is_ok(), "Matrix::new accepted what validate refuses");
            products(&m, bytes, &inp);
        }
        Err(_) => {}
    }
});
