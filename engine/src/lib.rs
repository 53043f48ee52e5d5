pub mod chat;
pub mod format;
pub mod import;
pub mod quant;
pub mod stats;
pub mod synth;
