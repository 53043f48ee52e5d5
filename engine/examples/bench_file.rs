//! Writes a benchmark file of q8_row matrices: `bench_file OUT [DIM] [LAYERS]`
//! (default 2048 × 2048, 17 layers: about 500 MB).
fn main() {
    let mut a = std::env::args().skip(1);
    let out = std::path::PathBuf::from(a.next().expect("usage: bench_file OUT [DIM] [LAYERS]"));
    let dim: u64 = a.next().map(|s| s.parse().expect("DIM")).unwrap_or(2048);
    let layers: u64 = a.next().map(|s| s.parse().expect("LAYERS")).unwrap_or(17);
    let s =
        cortiq_engine::synth::write_bench_file(&out, dim, layers).expect("write the bench file");
    println!(
        "{} {} bytes, {} tensors",
        s.path.display(),
        s.bytes,
        s.tensors
    );
}
