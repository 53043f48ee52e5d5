//! Running a model: the KV cache, sessions (prefill, decode, events, cancellation) and
//! sampling.

pub mod kv_cache;
pub mod sampler;
pub mod session;
pub mod threads;
