//! Weight-streaming speed of the products of `quant::matrix`, per hot dtype (`vbit` and `q1t`
//! included): `matvec` of a 2048×2048 matrix (decode of one token) on 1 and 2 threads, and
//! `matmul` of 64 tokens (prefill) on 2 threads, all at `Precision::Exact`; for the dtypes
//! with an integer kernel, the same at `Precision::Balanced` (the default) and
//! `Precision::Fast` (quantized activations), their `matmul` on 1 thread too. Throughput is in bytes of stored weights per second, the figure that
//! bounds decode speed (a matvec reads every weight byte once).
//! The matrix stays in the last-level cache between iterations (a warm-cache figure).
//!
//! `CORTIQ_BENCH_SHAPE=4864x896` benchmarks another shape (e.g. Qwen2.5-0.5B's MLP).
use cortiq_engine::format::dtype::DType;
use cortiq_engine::quant::matrix::{matmul, matmul_with, matvec, matvec_with, Matrix, Precision};
use cortiq_engine::quant::{encode, EncodeOptions};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use std::hint::black_box;

const HOT: [DType; 10] = [
    DType::Q8Row,
    DType::Q4Block,
    DType::Q4Tiled,
    DType::F32,
    DType::F16,
    DType::Bf16,
    DType::Q8_2f,
    DType::Q4tp,
    DType::Vbit,
    DType::Q1t,
];

/// Dtypes with an integer kernel for `Precision::Balanced` and `Precision::Fast`.
const FAST: [DType; 7] = [
    DType::Q8Row,
    DType::Q4Block,
    DType::Q4Tiled,
    DType::Q8_2f,
    DType::Q4tp,
    DType::Vbit,
    DType::Q1t,
];

fn shape() -> (usize, usize) {
    let s = std::env::var("CORTIQ_BENCH_SHAPE").unwrap_or_else(|_| "2048x2048".into());
    let (r, c) = s.split_once('x').expect("CORTIQ_BENCH_SHAPE is ROWSxCOLS");
    (r.parse().unwrap(), c.parse().unwrap())
}

/// Deterministic, roughly normal weights (xorshift).
fn values(n: usize) -> Vec<f32> {
    let mut s = 0x9E37_79B9_7F4A_7C15u64;
    (0..n)
        .map(|_| {
            let mut u = 0.0;
            for _ in 0..4 {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                u += (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
            }
            u * 0.05
        })
        .collect()
}

fn benches(c: &mut Criterion) {
    let (rows, cols) = shape();
    let w = values(rows * cols);
    let pools: Vec<(usize, rayon::ThreadPool)> = [1, 2]
        .into_iter()
        .map(|n| {
            let p = rayon::ThreadPoolBuilder::new()
                .num_threads(n)
                .build()
                .unwrap();
            (n, p)
        })
        .collect();
    let t = 64;
    let x = values(t * cols);
    for dtype in HOT {
        let shape = [rows as u64, cols as u64];
        let bytes = encode(dtype, &shape, &w, &EncodeOptions::default()).unwrap();
        let m = Matrix::new(dtype, &shape, &bytes).unwrap();
        let mut g = c.benchmark_group(format!("{dtype} {rows}x{cols}"));
        g.throughput(Throughput::Bytes(bytes.len() as u64));
        let mut y = vec![0f32; t * rows];
        for (n, pool) in &pools {
            g.bench_function(BenchmarkId::new("matvec", format!("{n}T")), |b| {
                pool.install(|| {
                    b.iter(|| matvec(&m, black_box(&bytes), &x[..cols], &mut y[..rows]))
                })
            });
        }
        let (n, pool) = &pools[1];
        g.bench_function(
            BenchmarkId::new(format!("matmul t={t}"), format!("{n}T")),
            |b| pool.install(|| b.iter(|| matmul(&m, black_box(&bytes), &x, t, &mut y))),
        );
        if FAST.contains(&dtype) {
            for p in [Precision::Balanced, Precision::Fast] {
                let name = p.name();
                for (n, pool) in &pools {
                    g.bench_function(
                        BenchmarkId::new(format!("matvec {name}"), format!("{n}T")),
                        |b| {
                            pool.install(|| {
                                b.iter(|| {
                                    let (x, y) = (&x[..cols], &mut y[..rows]);
                                    matvec_with(&m, black_box(&bytes), x, y, p)
                                })
                            })
                        },
                    );
                }
                for (n, pool) in &pools {
                    let id = BenchmarkId::new(format!("matmul {name} t={t}"), format!("{n}T"));
                    g.bench_function(id, |b| {
                        pool.install(|| {
                            b.iter(|| matmul_with(&m, black_box(&bytes), &x, t, &mut y, p))
                        })
                    });
                }
            }
        }
        g.finish();
    }
}

criterion_group!(matvec_benches, benches);
criterion_main!(matvec_benches);
