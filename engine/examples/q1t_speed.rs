//! Speed of the `q1t` kernels (a measurement, not a check):
//!
//! ```sh
//! cargo run --release -p cortiq-engine --example q1t_speed            # both parts
//! cargo run --release -p cortiq-engine --example q1t_speed -- kernels # matvec / matmul per shape
//! cargo run --release -p cortiq-engine --example q1t_speed -- decode  # decode-like layers
//! ```
//!
//! `kernels`: Gweights per second (best of 7; and per on-CPU second of all threads, a
//! figure that other processes on the same cores do not inflate) of `matvec` (one token)
//! and `matmul` (64 tokens) on 1 and 2 threads, per SIMD level (`CORTIQ_Q1T_KERNELS=scalar,
//! avx2,avx512`; default the SIMD ones) and precision, over 48 MiB of weights cycled
//! (beyond the caches, as in decoding; `CORTIQ_Q1T_WS=bytes`), with the encoder's default
//! overlay (`CORTIQ_Q1T_OUTLIERS=fraction`) and shapes `CORTIQ_Q1T_SHAPES=1536x576,…`.
//!
//! `decode`: the products of 30 SmolLM2-135M layers (`CORTIQ_Q1T_LAYER=896` for 24
//! Qwen2.5-0.5B layers), each matrix read once per "token" as in decoding (short streams
//! from memory, not one long one), on 1 and 2 threads: tokens per second of the products
//! alone, per precision.
use cortiq_engine::format::dtype::DType;
use cortiq_engine::quant::kernel::Kernel;
use cortiq_engine::quant::matrix::{matmul_with, matvec_with, Matrix, Precision};
use cortiq_engine::quant::{encode, EncodeOptions, DEFAULT_OUTLIER_FRACTION};
use cortiq_engine::synth::Rng;
use std::time::Instant;

/// `n` deterministic values uniform in [-1, 1) from `rng`.
fn values(rng: &mut Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| 2.0 * rng.unit() - 1.0).collect()
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).map_or(default, |v| {
        v.parse()
            .unwrap_or_else(|_| panic!("{name}: cannot parse {v:?}"))
    })
}

/// On-CPU seconds of every thread of this process so far (`/proc/self/task/*/schedstat`;
/// 0 where it is missing).
fn cpu_seconds() -> f64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0.0;
    };
    let ns: u64 = tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum();
    ns as f64 * 1e-9
}

fn pool(threads: usize) -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("a rayon pool")
}

fn encoded(shape: [u64; 2], v: &[f32], outliers: f32) -> Vec<u8> {
    let opts = EncodeOptions {
        outlier_fraction: Some(outliers),
        ..Default::default()
    };
    encode(DType::Q1t, &shape, v, &opts).expect("encode q1t")
}

fn kernels() {
    let shapes = std::env::var("CORTIQ_Q1T_SHAPES")
        .unwrap_or_else(|_| "1536x576,576x1536,4864x896,896x4864,8192x576".into());
    let want = std::env::var("CORTIQ_Q1T_KERNELS").unwrap_or_else(|_| "avx2,avx512".into());
    let outliers = env_or("CORTIQ_Q1T_OUTLIERS", DEFAULT_OUTLIER_FRACTION);
    let ws: usize = env_or("CORTIQ_Q1T_WS", 48 << 20);
    for s in shapes.split(',') {
        let (r, c) = s.split_once('x').expect("CORTIQ_Q1T_SHAPES: ROWSxCOLS,…");
        let (rows, cols): (usize, usize) = (r.parse().unwrap(), c.parse().unwrap());
        let shape = [rows as u64, cols as u64];
        let b = encoded(shape, &values(&mut Rng::new(1), rows * cols), outliers);
        let copies = ws / b.len() + 1;
        let bs: Vec<Vec<u8>> = vec![b.clone(); copies];
        let t = 64;
        let x = values(&mut Rng::new(2), t * cols);
        let mut y = vec![0f32; t * rows];
        for threads in [1, 2] {
            let pool = pool(threads);
            for k in Kernel::available() {
                if !want.split(',').any(|w| w == k.name()) {
                    continue;
                }
                let mut m = Matrix::new(DType::Q1t, &shape, &b).expect("a q1t matrix");
                m.set_kernel(k).expect("an available kernel");
                for p in Precision::ALL {
                    let mut time = |tokens: usize| {
                        let (mut best, mut best_cpu) = (f64::INFINITY, f64::INFINITY);
                        for _ in 0..7 {
                            let (c0, t0) = (cpu_seconds(), Instant::now());
                            pool.install(|| {
                                for bc in &bs {
                                    if tokens == 1 {
                                        matvec_with(&m, bc, &x[..cols], &mut y[..rows], p);
                                    } else {
                                        matmul_with(&m, bc, &x, tokens, &mut y, p);
                                    }
                                }
                            });
                            best_cpu = best_cpu.min(cpu_seconds() - c0);
                            best = best.min(t0.elapsed().as_secs_f64());
                        }
                        let w = (copies * rows * cols * tokens) as f64 / 1e9;
                        (w / best, w / best_cpu)
                    };
                    let dec = time(1);
                    let pre = time(t);
                    println!(
                        "{rows}x{cols} threads {threads} {:6} {:8}: matvec {:6.2} Gw/s \
                         ({:6.2} per cpu-s), matmul(64) {:6.2} Gw·t/s ({:6.2})",
                        k.name(),
                        p.name(),
                        dec.0,
                        dec.1,
                        pre.0,
                        pre.1
                    );
                }
            }
        }
    }
}

fn decode_like() {
    let (layers, shapes): (usize, &[(usize, usize)]) =
        match std::env::var("CORTIQ_Q1T_LAYER").as_deref() {
            Ok("896") => (
                24,
                &[
                    (896, 896),
                    (128, 896),
                    (128, 896),
                    (896, 896),
                    (4864, 896),
                    (4864, 896),
                    (896, 4864),
                ],
            ),
            _ => (
                30,
                &[
                    (576, 576),
                    (192, 576),
                    (192, 576),
                    (576, 576),
                    (1536, 576),
                    (1536, 576),
                    (576, 1536),
                ],
            ),
        };
    let mut rng = Rng::new(3);
    let mut mats = Vec::new();
    for _ in 0..layers {
        for &(rows, cols) in shapes {
            let shape = [rows as u64, cols as u64];
            let b = encoded(
                shape,
                &values(&mut rng, rows * cols),
                DEFAULT_OUTLIER_FRACTION,
            );
            let m = Matrix::new(DType::Q1t, &shape, &b).expect("a q1t matrix");
            mats.push((m, b, rows, cols));
        }
    }
    let bytes: usize = mats.iter().map(|m| m.1.len()).sum();
    let x = values(&mut Rng::new(4), 8192);
    let mut y = vec![0f32; 8192];
    for threads in [1, 2] {
        let pool = pool(threads);
        for p in Precision::ALL {
            let mut best = f64::INFINITY;
            for _ in 0..5 {
                let t0 = Instant::now();
                pool.install(|| {
                    for _ in 0..10 {
                        for (m, b, rows, cols) in &mats {
                            matvec_with(m, b, &x[..*cols], &mut y[..*rows], p);
                        }
                    }
                });
                best = best.min(t0.elapsed().as_secs_f64() / 10.0);
            }
            println!(
                "{} MiB of weights, threads {threads} {:8}: {:.1} tokens/s",
                bytes >> 20,
                p.name(),
                1.0 / best
            );
        }
    }
}

fn main() {
    match std::env::args().nth(1).as_deref() {
        Some("kernels") => kernels(),
        Some("decode") => decode_like(),
        None => {
            kernels();
            decode_like();
        }
        Some(other) => {
            eprintln!("usage: q1t_speed [kernels|decode] (not {other:?})");
            std::process::exit(2);
        }
    }
}
