//! Inputs the fuzz targets of `fuzz/` found to crash, kept as tests once fixed (each with
//! the target, the raw input and what it decodes to).

use cortiq_engine::chat::{ChatError, ChatTemplate, RenderOptions};
use cortiq_engine::format::DType;
use cortiq_engine::import::gguf::{Gguf, TensorInfo};
use cortiq_engine::import::gguf_import::{
    import_gguf, unpermute_rows, ImportError, ImportReport, QuantMode,
};
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

/// `import_gguf`, slow-unit-2a9b6c44…: a 1,066-byte llama GGUF whose `token_embd.weight`
/// is F32 of dims `[0, 352321536]` (no elements, so no data). Re-encoded as `vbit` or
/// `q1t`, its 352 million empty rows each got their row fields: gigabytes written and
/// 25-30 s per run, from a source of none. Empty and small tensors now stay float.
#[test]
fn gguf_tensor_with_a_zero_dimension_writes_no_row_fields() {
    let (raw, _) = empty_tensor_of(
        &[
        "474755460300000001000000000000000f00000000000000140000000000000067656e6572616c2e61726368",
        "69746563747572650800000005000000000000006c6c616d6111000000000000006c6c616d612e626c6f636b",
        "5f636f756e74040000000100000014000000000000006c6c616d612e636f6e746578745f6c656e6774680400",
        "00004000000016000000000000006c6c616d612e656d62656464696e675f6c656e6774680400000020000000",
        "19000000000000006c6c616d692e666565645f666f72776172645f6c656e67746804000000400000001a0000",
        "00000000006c6c616d612e617474656e74696f6e2e686561645f636f756e7404000000020000001d00000000",
        "0000006c6c616d612e617474656e74696f6e2e686561645f636f756e745f6b76040000000100000026000000",
        "000000006c6c616d612e617474656e74696f6e2e6c617965725f6e6f726d5f726d735f706573696c6f6e0600",
        "0000acc5273814000000000000006c6c616d612e726f70652e667265715f6261736506000000004014461400",
        "000000000000746f6b656e697a65722e67676d6c256d6f64656c080000000400000000000000677074321200",
        "000000000000746f6b656e697a65722e67676d6c2e7072650800000005000000000000007177656e32150000",
        "0000000000746f6b656e697a65722e67676d322e746f6b656e73090000000800000008000000000000000100",
        "00000000000061010000000000000062010000000000000063020000000000000061620200000000000000c4",
        "a00300000000000000c4a06103000000000000003c733e04000000000000003c2f733e190000000000000074",
        "6f6b656e697a65722e67676f757470745f7774752e7970650900000005000000080000000000000001000000",
        "010000000100000001000000010000000100000003000000030000001500000000000000746f6b656e697a65",
        "722e67676d6c2e6d657267657309000000080000000200000000000000030000000000000061206204000000",
        "00000000c4a020611b00000000000000746f6b656e697a65722e63676d6c2e656f735f746f6b656e5f696404",
        "000000070000001100000000000000746f6b656e5f656d62642e776569676874020000000000000000000000",
        "0000001500000000000000000000000000000000000000000000000000000000000000000000000000000000",
        "00000000000000000000000000000000000033f4ad08b03c2a03a43d303f32762cec2040a242b35ba463a8dd",
        "b34031afa047ae5d2bc230d428232e291d7c2cc0a9d72d6b20fd2f18b36f3371080c359c0ad558855a170b60",
        "60583db8189e381f21556e00197757d578bfeef5fd0360aa6233ab1f3a21ee175f857ce5dd415814a0f79882",
        "8ec07d72af9d8da3c2857c2afd54be5129e21f21f4baa2266e714ab5af575462686910d460ebd2a90ea15b40",
        "76d6f9583c3f32081f21",
        ],
        "token_embd.weight",
        352_321_536,
    );
    let modes = [
        QuantMode::Keep,
        QuantMode::Codec(DType::Vbit),
        QuantMode::Codec(DType::Q1t),
        QuantMode::Codec(DType::Q8Row),
    ];
    for (mode, r) in import_every_way(&raw, &modes) {
        if let Ok(report) = r {
            for t in report.tensors.iter().filter(|t| t.shape.contains(&0)) {
                assert!(
                    matches!(t.dtype, DType::F32 | DType::F16 | DType::Bf16),
                    "{mode:?}: {} as {}",
                    t.name,
                    t.dtype
                );
            }
        }
    }
    // Empty tensors are refused up front, naming them, at any row count (here the most a
    // CMF dimension holds), rather than each pass over their rows having to stay cheap.
    let mut wide = raw.clone();
    let dims_at = 807 + "token_embd.weight".len() + 4;
    assert_eq!(
        wide[dims_at + 8..dims_at + 16],
        352_321_536u64.to_le_bytes()
    );
    wide[dims_at + 8..dims_at + 16].copy_from_slice(&u64::from(u32::MAX).to_le_bytes());
    for (mode, r) in within_a_minute(move || import_every_way(&wide, &modes)) {
        let e = r.expect_err("an empty tensor imports");
        assert!(
            e.to_string().contains("\"token_embd.weight\" is empty"),
            "{mode:?}: {e}"
        );
    }
}

/// A fuzzed GGUF file from its hex `lines`, and its tensor `name`, which the parser must
/// read as empty: ggml dims `[0, rows]` and no data bytes.
fn empty_tensor_of(lines: &[&str], name: &str, rows: u64) -> (Vec<u8>, TensorInfo) {
    let raw = hex::decode(lines.concat()).unwrap();
    let t = Gguf::parse(&raw).unwrap().tensor(name).unwrap().clone();
    assert_eq!((t.dims.as_slice(), t.nbytes), ([0u64, rows].as_slice(), 0));
    (raw, t)
}

/// Imports `raw` as a GGUF file in each of `modes`; every file written is under 1 MiB (the
/// inputs are a few KB).
fn import_every_way(
    raw: &[u8],
    modes: &[QuantMode],
) -> Vec<(QuantMode, Result<ImportReport, ImportError>)> {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("in.gguf");
    std::fs::write(&src, raw).unwrap();
    let out = dir.path().join("out.cmf");
    modes
        .iter()
        .map(|&mode| {
            let _ = std::fs::remove_file(&out);
            let r = import_gguf(&src, &out, mode, &mut |_| {});
            if r.is_ok() {
                let len = std::fs::metadata(&out).unwrap().len();
                assert!(
                    len < 1 << 20,
                    "{mode:?}: a {len}-byte file from {} bytes",
                    raw.len()
                );
            }
            (mode, r)
        })
        .collect()
}

/// `f`'s result, or a failure if it takes more than a minute: a hang fails the test
/// instead of stalling the suite.
fn within_a_minute<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(std::time::Duration::from_secs(60))
        .expect("did not finish in 60 s")
}

/// `import_gguf`, slow-unit-52e22ddb…: a 1,950-byte llama GGUF whose `blk.0.attn_q.weight`
/// is Q8_0 of dims `[0, 1023410208]`: no data, but undoing llama.cpp's per-head row
/// interleave stepped through its billion empty rows, 29 s a run. Empty data now moves
/// nothing.
#[test]
fn gguf_head_unpermutation_of_no_data_is_immediate() {
    let (raw, t) = empty_tensor_of(
        &[
        "474755460300000005000000000000000f00000000000000140000000000000067656e6572616c2e61726368",
        "69746563747572650800000005000000000000006c6c616d6111000000000000006c6c616d612e626c6f636b",
        "5f636f756e74040000000000000014000000000000006c6c616d612e636f6e746578745f6c656e6774680400",
        "00004000000016000000000000006c6c616d612e656d62656464696e675f6c656e6774680400000020000000",
        "19000000000000006c6c616d612e6f6565645f666f72776172645f6c656e67746804000000400000001a0000",
        "00000000006c6c616d612e617474656e74696f6e2e686561645f636f756e7404000000020000001d00000000",
        "0000006c6c616d612e617474656e74696f6e2e686561645f636f756e745f6b76040000000100000026000000",
        "000000006c6c616d612e617474656e74696f6e2e6c617965725f6e6f726d5f726d735f657073696c6f6e0600",
        "0000acc5273714000000000000006c6c616d612e726f70652e667265715f626173650600000000401c461400",
        "000000000000746f6b656e697a65722e67676d6c2e6d6f645d6c080000000400000000000000677074321200",
        "000000000000746f6b656e697a65722e67676d6c2e7072650800000005000000000000007177656e32150000",
        "0000000000746f6b656e697a65722e67676d6c2e746f6b656e73090000000800000008000000000000000100",
        "00000000000061010000000000000062010000000000000063020000000000000061620200000000000000c4",
        "a00300000000000000c4a06103000000000000003c733e04000000000000003c2f733e190000000000000074",
        "6f6b656e697a65722e67676d6c2e746f6b656e5f747970650900000005000000080000000000000001000000",
        "010000000100000001000000010000000100000003000000030000001500000000000000746f6b656e697a65",
        "722e67676d6c2e6d657267657309000000080000000200000000000000030000000000000061206204000000",
        "00000000c4a020611b00000000000000746f6b656e697a65722e67676d6c2e656f735f746f6b656e5f696404",
        "000000070000001100000000000000746f6b656e5f656d62642e776569676874020000002000000000000000",
        "080000000000000008000000000000000000000012000000000000006f75747075745f6e6f726d2e77656967",
        "68740100000020000000000000000000000020010000000000001600000000000000626c6b2e302e6174746e",
        "5f6e6f726d2e77656967687401000000200000000000000000000000a0010000000000001500000000000000",
        "626c6b2e302e66666e5f6e6f726d2e7765696768740100000020000000000000000300000020020000000000",
        "001300000000000000626c6b2e302e6174746e5f712e7765696768740200000000000000000000002000003d",
        "0000000008000000a00200000000000000000000006f75747075745f6e6f726d2e7765696768740100000020",
        "00000000000000000000002001000000000000166d6f64656c2e6c61796572732e302e73656c665f6174746e",
        "2e6f5f70726f6a2e77656900000000000000000000a0010000000000001500000000000000626c6b2e302e66",
        "666e5f6e6f726d2e776569676874010000002000000000000000030000002002000000000000130000000000",
        "0000626c6b2e302e6174746e5f712e7765696768740200000000000000000000002000000000000000080000",
        "00a0020000000000001300000000000000726c6b2e302e61747400130000803f0000803f0000803f0009803f",
        "0000803f0000803f0000803f0000803f0000803f0000803f0000803f0000803f0000803f0000803f0000803f",
        "0000803f0000803f0000803f0000803f0000803f0000803f0000803f0000803f0000803f0000803f0000803f",
        "0000803f0000803f0000803f0000803f0000803f0000803f0000803f0000803f0000803f0000803f0000803f",
        "0000803f0000803f0000803f0000803f0000803f0000803f0000803f0000803f0000803f0000803f0000803f",
        "0000803f0000803f0000803f0000803f0000803f0000803f0000803f0000803f0000803f0000803fd5ef2e9d",
        "f91fdb98c8140e8df4e07089a4f4e21c89581f21e0e9975da4cbd3cbf4709c08204bfc3bb8849e9b463646e9",
        "13e4f0a6be400739671f218921ec9106880bcd3932a4e52effaf1660561c3b153c9c66524c746f2db4de881f",
        "2144927f23871d0bdd90f3d800000000000000000000000000000000000000000000ea0c4376fc3297df66aa",
        "327f7cfb3b5bfeb71f21ddccd70ccc48d9411f95c6dc30678af5d88736a64e840c31bde8873091472bd01f21",
        "c20ef542c8fb770ec01fd22b7f14e82a9614b1152225179db59d2ef0b7a757b51f217fa7777f6f9f9ca59a02",
        "f681754b7b522b84cc67465425a1c56c5113e46ecd391f219f7094e4ac2a2324763dedea0555eadd3862077c",
        "9d6d969d87b28893180e05e11f21156927a1e79b3a7e38620f63450de10e74f358047246200846a42b8563cb",
        "04fc1f21b484c5ceee8e2d5cf5c9446a0d1aa24a70a3cb14d1c3ddcb54a6e0404c8e21b8d4c80c3a120733aa",
        "acbc1f2111bd25f82ae4ab0152474755460300f3211143d2c78b166f639b1f21c2f5541ace90074d32140000",
        "0cdcf3596fef37cf72200041adf3",
        ],
        "blk.0.attn_q.weight",
        1_023_410_208,
    );
    // At 2^60 rows the old loop never ends: a watchdog turns that hang into a failure.
    let mut huge = t.clone();
    huge.dims[1] = 1 << 60;
    let moved = within_a_minute(move || unpermute_rows(&huge, &[], 2).map(|v| v.len()));
    assert_eq!(moved.unwrap(), 0);
    // The file itself imports or fails, in every mode.
    import_every_way(
        &raw,
        &[
            QuantMode::Keep,
            QuantMode::Codec(DType::Vbit),
            QuantMode::Codec(DType::Q1t),
        ],
    );
}
