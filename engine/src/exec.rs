//! The engine's thread pool, at the bottom of the engine (quant, model and runtime use
//! it). A forward pass runs *inside* it (`pool().install`), so the
//! hundreds of parallel products of one token are started from a pool worker: no
//! cross-thread injection and no sleep/wake of the calling thread per product, which
//! costs more than a small product itself.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, OnceLock};

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

/// Foreground work (a streaming answer) in progress; background work (verify, tensor
/// statistics) waits in [`yield_to_foreground`] meanwhile, so that the two never
/// oversubscribe the cores and the answer keeps its speed.
static FOREGROUND: Mutex<usize> = Mutex::new(0);
static FOREGROUND_DONE: Condvar = Condvar::new();

/// Marks foreground work until dropped.
pub struct Foreground(());

impl Foreground {
    pub fn begin() -> Foreground {
        *FOREGROUND.lock().unwrap_or_else(|e| e.into_inner()) += 1;
        Foreground(())
    }
}

impl Drop for Foreground {
    fn drop(&mut self) {
        let mut n = FOREGROUND.lock().unwrap_or_else(|e| e.into_inner());
        *n = n.saturating_sub(1);
        if *n == 0 {
            FOREGROUND_DONE.notify_all();
        }
    }
}

/// Whether foreground work is running.
pub fn foreground_busy() -> bool {
    *FOREGROUND.lock().unwrap_or_else(|e| e.into_inner()) > 0
}

/// Background work calls this between its pieces: it returns at once when no foreground
/// work runs, else when it ends or `cancelled()` says so (checked every 50 ms).
pub fn yield_to_foreground(cancelled: &dyn Fn() -> bool) {
    let mut n = FOREGROUND.lock().unwrap_or_else(|e| e.into_inner());
    while *n > 0 && !cancelled() {
        n = FOREGROUND_DONE
            .wait_timeout(n, std::time::Duration::from_millis(50))
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    #[test]
    fn background_waits_for_the_foreground() {
        let fg = Foreground::begin();
        assert!(foreground_busy());
        let passed = Arc::new(AtomicBool::new(false));
        let p = passed.clone();
        let t = std::thread::spawn(move || {
            yield_to_foreground(&|| false);
            p.store(true, Ordering::SeqCst);
        });
        std::thread::sleep(std::time::Duration::from_millis(120));
        assert!(
            !passed.load(Ordering::SeqCst),
            "background ran during foreground"
        );
        drop(fg);
        t.join().unwrap();
        assert!(passed.load(Ordering::SeqCst));
        // Cancellation ends the wait too.
        let _fg = Foreground::begin();
        yield_to_foreground(&|| true);
    }
}
