//! The engine's thread pool, at the bottom of the engine (quant, model and runtime use
//! it). A forward pass runs *inside* it ([`step`]), so the hundreds of parallel products
//! of one token are started from a pool worker, with the other workers polling for them:
//! no cross-thread injection and no sleep/wake per product, which costs more than a
//! small product itself.

use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering};
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
            OWNS_SECTION.set(false);
            SPINNING.store(false, Ordering::Release);
        }
    }
    let done = AtomicBool::new(false);
    let spin = || {
        if rayon::current_thread_index() == Some(me) {
            return;
        }
        while !done.load(Ordering::Acquire) {
            if !help_team() && rayon::yield_now() != Some(rayon::Yield::Executed) {
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
            OWNS_SECTION.set(true);
            f()
        },
        || spinners(n - 1, &spin),
    )
    .0
}

/// One parallel loop of [`for_each_index`] that the spinners of a [`spinning`] section
/// take tasks of.
struct TeamJob<'a> {
    task: &'a (dyn Fn(usize) + Sync),
    n: usize,
    /// The next task to take (past `n`: none left).
    next: AtomicUsize,
    /// Tasks finished (or panicked), on a cache line of its own: the owner polls it
    /// while the helpers still take tasks.
    done: CacheLine<AtomicUsize>,
    /// The first panic of a task, resumed on the loop's thread.
    panic: Mutex<Option<Box<dyn std::any::Any + Send>>>,
}

/// A value alone on its cache line (two lines: the adjacent-line prefetcher pairs them).
#[repr(align(128))]
struct CacheLine<T>(T);

impl<T> std::ops::Deref for CacheLine<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

/// The loop the spinners help with (null when none): a [`TeamJob`] on its owner's stack.
static TEAM: AtomicPtr<()> = AtomicPtr::new(std::ptr::null_mut());
/// Spinners between reading [`TEAM`] and leaving its job: the owner waits for none before
/// its job goes out of scope.
static HELPERS: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// Set while this thread runs a task of a [`TeamJob`]: a loop inside one runs in place.
    static IN_TASK: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// Set on the thread running a [`spinning`] section's `f`: the one thread whose loops
    /// the section's spinners help with ([`for_each_index`]).
    static OWNS_SECTION: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

impl TeamJob<'_> {
    /// Takes and runs tasks until none is left; whether it ran any.
    fn work(&self) -> bool {
        let mut ran = 0;
        loop {
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            if i >= self.n {
                // Counted once, not per task: each count is a cache line taken from the
                // thread that waits on it.
                if ran > 0 {
                    self.done.fetch_add(ran, Ordering::Release);
                }
                return ran > 0;
            }
            ran += 1;
            IN_TASK.set(true);
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (self.task)(i)));
            IN_TASK.set(false);
            if let Err(p) = r {
                self.panic
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .get_or_insert(p);
            }
        }
    }
}

/// A spinner's turn: runs tasks of the published loop, if any; whether it ran one.
fn help_team() -> bool {
    if TEAM.load(Ordering::Relaxed).is_null() {
        return false;
    }
    // Counted before the second read, both sequentially consistent: either the owner's
    // wait sees this helper, or this read sees the owner's null (Dekker's handshake).
    HELPERS.fetch_add(1, Ordering::SeqCst);
    let job = TEAM.load(Ordering::SeqCst) as *const TeamJob<'static>;
    // SAFETY: a non-null `TEAM` points to a live job, and its owner does not leave
    // `for_each_index` (where it lives) until `HELPERS` is back to zero.
    let ran = !job.is_null() && unsafe { &*job }.work();
    HELPERS.fetch_sub(1, Ordering::SeqCst);
    ran
}

/// Runs `task(i)` for every `i < n`, in parallel. Inside a [`spinning`] section (a forward
/// pass) its thread publishes the loop and the section's spinners take its tasks
/// one at a time from a shared counter, as they come: no deque, no steal, no allocation,
/// where a rayon loop of a few tasks cost the waiting worker more time in its stealing
/// than the owner's tasks took to split. Elsewhere (outside a section, on another thread,
/// inside a task of another such loop) it is a rayon loop or a plain one. A panic in a
/// task reaches the caller once every task is done.
pub fn for_each_index(n: usize, task: impl Fn(usize) + Sync) {
    if n <= 1 || IN_TASK.get() {
        return (0..n).for_each(task);
    }
    let job = TeamJob {
        task: &task,
        n,
        next: AtomicUsize::new(0),
        done: CacheLine(AtomicUsize::new(0)),
        panic: Mutex::new(None),
    };
    // Only the section's own thread publishes: a spinner busy with a rayon task of the
    // section (one expert of a MoE layer, say) would leave its loop to itself, the owner
    // being in rayon's wait and not among the helpers. And one loop at a time.
    let at = &job as *const TeamJob as *mut ();
    if !OWNS_SECTION.get()
        || TEAM
            .compare_exchange(
                std::ptr::null_mut(),
                at,
                Ordering::SeqCst,
                Ordering::Relaxed,
            )
            .is_err()
    {
        use rayon::prelude::*;
        return (0..n).into_par_iter().for_each(&task);
    }
    // `work` catches the tasks' panics, so nothing unwinds before the job is withdrawn.
    job.work();
    while job.done.load(Ordering::Acquire) < n {
        std::hint::spin_loop();
    }
    TEAM.store(std::ptr::null_mut(), Ordering::SeqCst);
    while HELPERS.load(Ordering::SeqCst) != 0 {
        std::hint::spin_loop();
    }
    if let Some(p) = job.panic.into_inner().unwrap_or_else(|e| e.into_inner()) {
        std::panic::resume_unwind(p);
    }
}

/// `task(i, chunk)` for each `chunk`-long piece of `y` (the last may be shorter), `i` its
/// index, as [`for_each_index`] runs tasks.
pub fn for_each_chunk_mut<T: Send>(
    y: &mut [T],
    chunk: usize,
    task: impl Fn(usize, &mut [T]) + Sync,
) {
    let chunk = chunk.max(1);
    let n = y.len().div_ceil(chunk);
    let pieces = Pieces::new(y);
    for_each_index(n, |i| {
        // SAFETY: `for_each_index` runs each `i` once, and the pieces of distinct `i` are
        // disjoint parts of `y`, borrowed mutably for the whole loop.
        task(i, unsafe { pieces.get(i * chunk, chunk) })
    })
}

/// A mutable slice shared by the tasks of a parallel loop, each of which reads and writes
/// only entries of its own (a chunk of outputs, a matmul's rows of every token): the `&mut`
/// is taken once for the whole loop, and each access is checked against the slice's bounds.
pub struct Pieces<'a, T> {
    ptr: *mut T,
    len: usize,
    _y: std::marker::PhantomData<&'a mut [T]>,
}

impl<T> Clone for Pieces<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for Pieces<'_, T> {}

// SAFETY: the tasks access disjoint entries (the callers of the accessors promise it), so
// sharing the handle across threads is sharing `&mut` to disjoint parts of a `T: Send`
// slice.
unsafe impl<T: Send> Send for Pieces<'_, T> {}
unsafe impl<T: Send> Sync for Pieces<'_, T> {}

impl<'a, T> Pieces<'a, T> {
    /// The handle of `y`, which it borrows mutably while it lives.
    pub fn new(y: &'a mut [T]) -> Pieces<'a, T> {
        Pieces {
            ptr: y.as_mut_ptr(),
            len: y.len(),
            _y: std::marker::PhantomData,
        }
    }

    /// Entries `from .. from + len`, cut to the slice's end.
    ///
    /// # Safety
    /// No other thread accesses these entries while the piece is in use.
    pub unsafe fn get(self, from: usize, len: usize) -> &'a mut [T] {
        let from = from.min(self.len);
        std::slice::from_raw_parts_mut(self.ptr.add(from), len.min(self.len - from))
    }

    /// A pointer to entries `i .. i + len`, checked to lie in the slice.
    ///
    /// # Safety
    /// No other thread accesses those entries while the pointer is used.
    #[inline]
    pub unsafe fn slice_ptr(self, i: usize, len: usize) -> *mut T {
        assert!(i + len <= self.len);
        self.ptr.add(i)
    }

    /// # Safety
    /// No other thread accesses entry `i` during the write.
    #[inline]
    pub unsafe fn write(self, i: usize, v: T) {
        assert!(i < self.len);
        *self.ptr.add(i) = v;
    }
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
    fn a_team_loop_runs_every_task_once_in_a_section_and_out_of_one() {
        use std::sync::atomic::AtomicU32;
        let pool = pool2();
        for n in [0usize, 1, 2, 3, 7, 64, 1000] {
            let hits: Vec<AtomicU32> = (0..n).map(|_| AtomicU32::new(0)).collect();
            let body = || {
                for_each_index(n, |i| {
                    hits[i].fetch_add(1, Ordering::Relaxed);
                    // A loop inside a task runs in place, each of its tasks once too.
                    let inner = AtomicU32::new(0);
                    for_each_index(5, |_| {
                        inner.fetch_add(1, Ordering::Relaxed);
                    });
                    assert_eq!(inner.load(Ordering::Relaxed), 5);
                    std::hint::black_box((0..2000u64).sum::<u64>());
                })
            };
            pool.install(|| spinning(body));
            body();
            assert!(
                hits.iter().all(|h| h.load(Ordering::Relaxed) == 2),
                "n = {n}"
            );
        }
        // Chunks cover the slice once, the last one short.
        let mut y = vec![0u32; 103];
        pool.install(|| {
            spinning(|| {
                for_each_chunk_mut(&mut y, 10, |c, ys| {
                    assert_eq!(ys.len(), if c == 10 { 3 } else { 10 });
                    ys.iter_mut().for_each(|v| *v += 1 + c as u32);
                })
            })
        });
        assert!(y.iter().enumerate().all(|(i, &v)| v == 1 + (i / 10) as u32));
    }

    #[test]
    fn a_panic_in_a_team_task_reaches_the_caller_and_the_team_goes_on() {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let pool = pool2();
            for _ in 0..20 {
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    pool.install(|| spinning(|| for_each_index(64, |i| assert!(i != 40, "boom"))))
                }));
                let sum = AtomicUsize::new(0);
                pool.install(|| {
                    spinning(|| {
                        for_each_index(64, |i| {
                            sum.fetch_add(i, Ordering::Relaxed);
                        })
                    })
                });
                tx.send((r.is_err(), sum.load(Ordering::Relaxed))).unwrap();
            }
        });
        for _ in 0..20 {
            let got = rx.recv_timeout(std::time::Duration::from_secs(60));
            assert_eq!(
                got,
                Ok((true, 64 * 63 / 2)),
                "a team loop that panicked did not end"
            );
        }
    }

    #[test]
    fn team_loops_from_two_threads_at_once_both_finish() {
        // One thread holds the team; the other's loops run as rayon loops meanwhile.
        let pool = pool2();
        let total = AtomicUsize::new(0);
        pool.install(|| {
            spinning(|| {
                rayon::join(
                    || {
                        for _ in 0..200 {
                            for_each_index(9, |_| {
                                total.fetch_add(1, Ordering::Relaxed);
                            })
                        }
                    },
                    || {
                        for _ in 0..200 {
                            for_each_index(7, |_| {
                                total.fetch_add(1, Ordering::Relaxed);
                            })
                        }
                    },
                )
            })
        });
        assert_eq!(total.load(Ordering::Relaxed), 200 * 16);
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
