//! Inputs the fuzz targets of `fuzz/` found to crash, kept as tests once fixed (each with
//! the target, the raw input and what it decodes to).

use cortiq_engine::chat::{ChatError, ChatTemplate, RenderOptions};
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

/// `chat_template`, crash-f1e8ac04…: the template calls `str.format` on a string whose
/// replacement field `{Yrevmeos_t[ken-anools…` has a key holding U+FFFD (the lossy UTF-8
/// of a 0xEE byte); minijinja 3.1's format parser stepped through the key a byte at a
/// time and panicked inside the character. Such keys are now an error of the rendering.
#[test]
fn str_format_with_a_key_that_is_not_ascii() {
    let raw: [u8; 159] = [
        0x7b, 0x7b, 0x20, 0x6d, 0x69, 0x7e, 0x28, 0x27, 0x7c, 0x6e, 0x20, 0x77, 0x69, 0x74, 0x68,
        0x20, 0x66, 0x75, 0x65, 0x75, 0x66, 0x20, 0x6e, 0x30, 0xff, 0xff, 0xff, 0x31, 0xff, 0xfe,
        0xff, 0x00, 0x61, 0x6c, 0x6c, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x98, 0x6f, 0x26,
        0x6e, 0x69, 0x74, 0x68, 0x20, 0x74, 0x69, 0x65, 0x20, 0x73, 0xff, 0xff, 0x59, 0x59, 0x59,
        0x59, 0x59, 0x59, 0x59, 0x59, 0x7b, 0x59, 0x72, 0x65, 0x76, 0x6d, 0x65, 0x6f, 0x73, 0x5f,
        0x74, 0x5b, 0x6b, 0x65, 0x6e, 0x2d, 0x61, 0x6e, 0x6f, 0x6f, 0x6c, 0x73, 0x00, 0x00, 0x00,
        0x72, 0x5c, 0xee, 0x5c, 0x62, 0x27, 0x29, 0x20, 0x20, 0x2e, 0x66, 0x6f, 0x72, 0x6d, 0x61,
        0x74, 0x28, 0x32, 0x29, 0x20, 0x7d, 0x7d, 0xff, 0xff, 0x6c, 0x69, 0x61, 0x64, 0x69, 0x27,
        0x74, 0x28, 0x32, 0x29, 0x20, 0x7d, 0x7d, 0xff, 0xff, 0x6c, 0x69, 0x61, 0x64, 0x69, 0x27,
        0x7c, 0x32, 0x32, 0x64, 0x65, 0x6e, 0x74, 0x28, 0x33, 0xec, 0xec, 0xec, 0xec, 0xec, 0x37,
        0xec, 0x00, 0xec, 0xec, 0xec, 0xec, 0xec, 0xec, 0x7d,
    ];
    // As the target reads it.
    let source = String::from_utf8_lossy(&raw);
    let t = ChatTemplate::new(&source).expect("the template compiles");
    let opts = RenderOptions {
        add_generation_prompt: true,
        ..Default::default()
    };
    let messages = serde_json::json!([{"role": "user", "content": "hi"}]);
    match t.render(&messages, &opts) {
        Err(ChatError::Render(m)) => assert!(m.contains("not ASCII"), "{m}"),
        other => panic!("expected a render error naming the key, got {other:?}"),
    }
}
