//! Inputs the fuzz targets of `fuzz/` found to crash, kept as tests once fixed (each with
//! the target, the raw input and what it decodes to).

use cortiq_engine::format::DType;
use cortiq_engine::quant::matrix::{matvec, Matrix};
use cortiq_engine::quant::{decode, validate};

/// `quant_kernels`, crash-299f6aec…: a `q1s` tensor of shape `[0x262DEBFFFFFFFFFF, 0]`
/// has no elements, so its 4-byte payload (an overlay count of 0) is valid; indexing its
/// overlay by row allocated `rows + 1` counters: a capacity-overflow panic here, and an
/// out-of-memory abort for rows around 2^33. A zero-width matrix now indexes no rows.
#[test]
fn q1s_with_a_huge_row_count_and_no_columns() {
    let raw: [u8; 15] = [
        0x2d, 0x26, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xeb, 0x2d, 0x26, 0x00, 0x00,
    ];
    // [dtype 13 = q1s][flags: 2 dims, fit the payload][acts][0xFFFF: u64 dim][dim 0]
    assert_eq!(DType::from_id(raw[0] & 15), Some(DType::Q1s));
    let rows = u64::from_le_bytes(raw[5..13].try_into().unwrap());
    let shape = [rows, 0];
    let payload = 0u32.to_le_bytes();
    validate(DType::Q1s, &shape, &payload).unwrap();
    assert!(decode(DType::Q1s, &shape, &payload).unwrap().is_empty());
    let m = Matrix::new(DType::Q1s, &shape, &payload).unwrap();
    for r in [0, 1, m.rows / 2, m.rows - 1] {
        m.row(&payload, r, &mut []);
    }
    // Rows past a smaller tensor's width behave the same, and products still run.
    for rows in [1u64, 5, 1 << 33] {
        let m = Matrix::new(DType::Q1s, &[rows, 0], &payload).unwrap();
        m.row(&payload, m.rows - 1, &mut []);
        if rows < 1000 {
            let mut y = vec![1f32; m.rows];
            matvec(&m, &payload, &[], &mut y);
            assert!(y.iter().all(|&v| v == 0.0));
        }
    }
}
