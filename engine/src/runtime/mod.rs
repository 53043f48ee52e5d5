//! Running a model: the KV cache, sessions (prefill, decode, sampling, events,
//! cancellation).

pub mod kv_cache;
