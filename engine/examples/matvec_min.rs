//! The fastest of many calls of one matrix-vector product, 1 thread (a measurement, not a
//! check):
//!
//! ```sh
//! cargo run --release -p cortiq-engine --example matvec_min -- 576x2048 q4_block [balanced] [tokens=64]
//! ```
//!
//! With `tokens=T` (T > 1) each call is the matrix-matrix product of T tokens (prefill's
//! `matmul_with`), and the cycle figure is per 128 weights and token.
//!
//! Prints the minimum, 10th percentile and median microseconds of up to 20 000 calls
//! (about 3 s), and the minimum as core cycles per 128 weights at `CORTIQ_GHZ` (default
//! 3.2). On a VM whose speed drifts by ±15% between runs (other guests), the fastest call
//! moves by about 1%: that is the figure to compare two builds of a kernel by, where
//! criterion's means (`benches/matvec.rs`) and interleaved medians
//! (`scripts/ab-bench.py`) need many rounds. Each call includes quantizing the input
//! (about 0.75 ns a column on Zen 3): compare shapes by differences of rows.
use cortiq_engine::format::dtype::DType;
use cortiq_engine::quant::matrix::{matmul_with, matvec_with, Matrix, Precision};
use cortiq_engine::quant::{encode, EncodeOptions};
use cortiq_engine::synth::Rng;
use std::time::Instant;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: matvec_min ROWSxCOLS DTYPE [exact|balanced|fast] [tokens=T]";
    let (shape, dtype) = match args.as_slice() {
        [s, d, ..] => (s, d),
        _ => panic!("{usage}"),
    };
    let (rows, cols) = shape
        .split_once('x')
        .and_then(|(r, c)| Some((r.parse::<usize>().ok()?, c.parse::<usize>().ok()?)))
        .unwrap_or_else(|| panic!("{usage}"));
    let dtype = DType::from_name(dtype).unwrap_or_else(|| panic!("unknown dtype {dtype}"));
    let mut precision = Precision::Balanced;
    let mut tokens = 1usize;
    for a in &args[2..] {
        match a.as_str() {
            "balanced" => precision = Precision::Balanced,
            "exact" => precision = Precision::Exact,
            "fast" => precision = Precision::Fast,
            t if t.starts_with("tokens=") => {
                tokens = t["tokens=".len()..]
                    .parse()
                    .unwrap_or_else(|_| panic!("{usage}"));
                assert!(tokens >= 1, "{usage}");
            }
            p => panic!("unknown argument {p}; {usage}"),
        }
    }
    let ghz: f64 = std::env::var("CORTIQ_GHZ").map_or(3.2, |v| v.parse().expect("CORTIQ_GHZ"));
    let mut rng = Rng::new(7);
    let w: Vec<f32> = (0..rows * cols).map(|_| 0.1 * (rng.unit() - 0.5)).collect();
    let x: Vec<f32> = (0..cols * tokens).map(|_| 2.0 * rng.unit() - 1.0).collect();
    let dims = [rows as u64, cols as u64];
    let bytes = encode(dtype, &dims, &w, &EncodeOptions::default()).expect("encode");
    let m = Matrix::new(dtype, &dims, &bytes).expect("matrix");
    let mut y = vec![0f32; rows * tokens];
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .expect("pool");
    let mut us = Vec::new();
    pool.install(|| {
        while us.len() < 20_000 && (us.len() < 200 || us.iter().sum::<f64>() < 3e6) {
            let t = Instant::now();
            if tokens == 1 {
                matvec_with(&m, &bytes, &x, &mut y, precision);
            } else {
                matmul_with(&m, &bytes, &x, tokens, &mut y, precision);
            }
            us.push(t.elapsed().as_secs_f64() * 1e6);
        }
    });
    us.sort_by(f64::total_cmp);
    let n = us.len();
    let per_128 = us[0] * 1e-6 * ghz * 1e9 / (rows * cols * tokens) as f64 * 128.0;
    println!(
        "{dtype} {rows}x{cols} x{tokens} {}: {n} calls, min {:.2} p10 {:.2} median {:.2} us; min {per_128:.2} cycles per 128 weights at {ghz} GHz",
        precision.name(),
        us[0],
        us[n / 10],
        us[n / 2]
    );
}
