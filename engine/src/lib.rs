pub mod format;
pub mod quant;
pub mod stats;
pub mod synth;
pub mod import;
