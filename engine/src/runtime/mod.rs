//! Running a model: the KV cache, sessions (prefill, decode, events, cancellation) and
//! sampling, and measures over logits.

pub mod kv_cache;
pub mod load;
pub mod metrics;
pub mod sampler;
pub mod session;
pub mod threads;
