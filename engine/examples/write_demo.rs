//! Writes the demo model and a benchmark file: `cargo run --example write_demo -- OUT_DIR`.
fn main() {
    let dir = std::path::PathBuf::from(std::env::args().nth(1).unwrap_or_else(|| ".".into()));
    let s = cortiq_engine::synth::write_demo(&dir.join("demo.cmf")).unwrap();
    println!("{:?}", s);
}
