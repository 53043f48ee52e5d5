//! The engine's thread pool. A forward pass runs *inside* it (`pool().install`), so the
//! hundreds of parallel products of one token are started from a pool worker: no
//! cross-thread injection and no sleep/wake of the calling thread per product, which
//! costs more than a small product itself.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

static POOL: OnceLock<rayon::ThreadPool> = OnceLock::new();
/// Threads asked for before the pool was built; 0 = one per core.
static THREADS: AtomicUsize = AtomicUsize::new(0);

/// Sets the pool's size; call before the first forward. Refused (with the size in use)
/// once the pool exists with another size.
pub fn set_threads(n: usize) -> Result<(), String> {
    if n == 0 {
        return Err("at least one thread is needed".into());
    }
    THREADS.store(n, Ordering::SeqCst);
    match POOL.get() {
        Some(p) if p.current_num_threads() != n => Err(format!(
            "the engine's pool already runs {} threads",
            p.current_num_threads()
        )),
        _ => Ok(()),
    }
}

pub fn pool() -> &'static rayon::ThreadPool {
    POOL.get_or_init(|| {
        let n = THREADS.load(Ordering::SeqCst);
        rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .thread_name(|i| format!("cortiq-engine-{i}"))
            .build()
            .expect("the engine's thread pool starts")
    })
}

/// Threads of the engine's pool.
pub fn threads() -> usize {
    pool().current_num_threads()
}
