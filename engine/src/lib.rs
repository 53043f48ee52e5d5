pub mod format;
pub mod quant;
pub mod synth;
