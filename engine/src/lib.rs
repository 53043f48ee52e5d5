pub mod chat;
pub mod format;
pub mod import;
pub mod model;
pub mod quant;
pub mod runtime;
pub mod stats;
pub mod synth;
