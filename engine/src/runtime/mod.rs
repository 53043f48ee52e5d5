//! Running a model: loading it verified, the KV cache, sessions (prefill, decode, events,
//! cancellation) and sampling, and measures over logits. The thread pool is `crate::exec`.

pub mod calibrate;
pub mod choice;
pub mod load;
pub mod metrics;
pub mod routes;
pub mod sampler;
pub mod session;
pub mod skill_author;
pub mod skill_route;
