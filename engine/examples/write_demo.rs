//! Writes the demo model: `cargo run --example write_demo -- OUT [tiny]`.
use cortiq_engine::synth::{write_demo_with, DemoConfig};

fn main() {
    let mut a = std::env::args().skip(1);
    let out = std::path::PathBuf::from(a.next().expect("usage: write_demo OUT [tiny]"));
    let cfg = if a.next().as_deref() == Some("tiny") {
        DemoConfig::tiny()
    } else {
        DemoConfig::default()
    };
    let s = write_demo_with(&out, &cfg).expect("write the demo");
    println!(
        "{} {} bytes, {} tensors",
        s.path.display(),
        s.bytes,
        s.tensors
    );
}
