//! The engine's thread pool, at the bottom of the engine (quant, model and runtime use
//! it). A forward pass runs *inside* it ([`step`]), so the hundreds of parallel products
//! of one token are started from a pool worker, with the other workers polling for them:
//! no cross-thread injection and no sleep/wake per product, which costs more than a
//! small product itself.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, OnceLock};

/// Fewest tokens whose per-token work (quantizing the activations, the rotary embedding)
/// a step splits over the pool: a prefill's. A decode step's token, and short draft
/// verifications, stay on the calling thread.
pub const PARALLEL_TOKENS: usize = 16;

/// Fewest elements of a row-wise pass (the norms) that a step splits over the pool, rows
/// whole: a prefill's. A decode step's rows (one hidden state, or its heads' per-head
/// norms) stay on the calling thread, where a split costs more than the pass.
pub const PARALLEL_ELEMENTS: usize = 1 << 14;

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

/// Set while a [`spinning`] section runs, so that a nested one runs plainly.
static SPINNING: AtomicBool = AtomicBool::new(false);

/// Runs one inference step `f` (a forward pass, or a generation step with its sampling
/// and drafts) inside the engine's pool, in a [`spinning`] section: the one entry point
/// of the model and the session into the pool.
pub fn step<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    pool().install(|| spinning(f))
}

/// Runs `f` on the calling pool worker while the pool's other workers poll for its
/// parallel work instead of sleeping between products. A decode step is hundreds of
/// products of a few microseconds each; an idle rayon worker spins with `sched_yield`
/// and then sleeps, and waking it (a futex) or catching it between yields costs up to a
/// product's worth of time (on a 2-core Zen 5, SmolLM2-135M `q4_block` decoded only
/// 1.3–1.5× faster on 2 threads than on 1). Here one job per other worker loops on
/// `rayon::yield_now` (which steals and runs pending work, broadcasts included, without
/// any system call) until `f` returns. A spinner that lands on the caller's own thread
/// (its deque is popped while it waits) returns at once, so nothing waits for itself.
/// Outside a pool, with one thread, with more threads than cores (spinning would take
/// cores from the workers) or inside another such section, it is just `f()`.
///
/// Measured there, interleaved with the build before it (3 rounds): Qwen2.5-Coder-0.5B
/// `q4_block` 64-token prefill 695–724 → 726–797 tok/s, 512-token 719–739 → 729–749;
/// decode within the noise (SmolLM2 `q4_block` 315–371 → 311–342, `q8_row` 205–225 →
/// 220–240).
fn spinning<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    let Some(me) = rayon::current_thread_index() else {
        return f();
    };
    let n = rayon::current_num_threads();
    if n < 2 || n > cores() || SPINNING.swap(true, Ordering::AcqRel) {
        return f();
    }
    /// Ends the section, on return or unwind (a spinner must not outlive a panic in `f`).
    struct Done<'a>(&'a AtomicBool);
    impl Drop for Done<'_> {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Release);
            SPINNING.store(false, Ordering::Release);
        }
    }
    let done = AtomicBool::new(false);
    let spin = || {
        if rayon::current_thread_index() == Some(me) {
            return;
        }
        while !done.load(Ordering::Acquire) {
            if rayon::yield_now() != Some(rayon::Yield::Executed) {
                std::hint::spin_loop();
            }
        }
    };
    // `join`'s second half waits on the caller's deque without a heap allocation (a
    // scope's spawn allocates one per token); a chain of `k` joins gives each of the
    // other workers a spinner to steal.
    fn spinners(k: usize, spin: &(impl Fn() + Sync)) {
        if k > 1 {
            rayon::join(spin, || spinners(k - 1, spin));
        } else {
            spin()
        }
    }
    rayon::join(
        || {
            let _done = Done(&done);
            f()
        },
        || spinners(n - 1, &spin),
    )
    .0
}

/// Cores this process may run on (1 when unknown).
pub fn cores() -> usize {
    static CORES: OnceLock<usize> = OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
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
    use std::sync::Arc;

    /// A 2-thread pool, as the tests of `spinning` need one (the engine's may be built
    /// with another size by another test).
    fn pool2() -> rayon::ThreadPool {
        rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap()
    }

    #[test]
    fn spinning_returns_what_f_returns_and_runs_its_parallel_work() {
        use rayon::prelude::*;
        let pool = pool2();
        for round in 0..200u64 {
            let (sum, nested) = pool.install(|| {
                spinning(|| {
                    let sum: u64 = (0..10_000u64).into_par_iter().map(|i| i * round).sum();
                    // A nested section runs plainly and still gives its result.
                    let nested = spinning(|| (0..100u64).into_par_iter().sum::<u64>());
                    (sum, nested)
                })
            });
            assert_eq!(sum, round * 10_000 * 9_999 / 2);
            assert_eq!(nested, 4950);
        }
        // Outside a pool it is just a call.
        assert_eq!(spinning(|| 7), 7);
    }

    #[test]
    fn a_panic_in_a_spinning_section_ends_it() {
        use rayon::prelude::*;
        // On a thread of its own, so that spinners left running fail the test by the
        // deadline instead of hanging it.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let pool = pool2();
            for _ in 0..20 {
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    pool.install(|| {
                        spinning(|| {
                            (0..64u32)
                                .into_par_iter()
                                .for_each(|i| assert!(i != 40, "boom"));
                        })
                    })
                }));
                // The panic reached the caller, and the next section runs.
                let next = pool.install(|| spinning(|| 5));
                tx.send((r.is_err(), next)).unwrap();
            }
        });
        for _ in 0..20 {
            let got = rx.recv_timeout(std::time::Duration::from_secs(60));
            assert_eq!(got, Ok((true, 5)), "a section that panicked did not end");
        }
    }

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
