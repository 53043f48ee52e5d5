//! In-process costs of the container layer: opening a ~500 MB file (target: under 5 ms),
//! hash64 throughput, and a full verify. The file is written once into target/bench-data.
use std::path::PathBuf;

use cortiq_engine::format::verify::{hash64_parallel, verify, VerifyOptions};
use cortiq_engine::format::{hash64, CmfFile};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};

fn bench_file() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/bench-data");
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("bench-2048x17.cmf");
    if !p.exists() {
        cortiq_engine::synth::write_bench_file(&p, 2048, 17).unwrap();
    }
    p
}

fn benches(c: &mut Criterion) {
    let path = bench_file();
    let size = std::fs::metadata(&path).unwrap().len();
    c.bench_function("open 500MB", |b| b.iter(|| CmfFile::open(&path).unwrap()));

    let data: Vec<u8> = (0..64u32 << 20)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    let mut g = c.benchmark_group("hash64");
    g.throughput(Throughput::Bytes(data.len() as u64));
    g.bench_function("one thread", |b| b.iter(|| hash64(&data)));
    g.bench_function("all threads", |b| b.iter(|| hash64_parallel(&data)));
    g.finish();

    let f = CmfFile::open(&path).unwrap();
    let mut g = c.benchmark_group("verify");
    g.throughput(Throughput::Bytes(size));
    g.sample_size(10);
    g.bench_function("500MB", |b| {
        b.iter(|| assert!(verify(&f, &VerifyOptions::default(), &|_| {}).ok))
    });
    g.finish();
}

criterion_group!(format, benches);
criterion_main!(format);
