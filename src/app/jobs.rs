//! Background work: each job runs on its own thread, reports through the app's channel as
//! [`Action::Job`], and stops early when its cancel flag is raised. A newer job of the
//! same kind cancels the older one.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, RwLock};

use cortiq_engine::format::verify::LinkResult;
use cortiq_engine::stats::TensorStats;

use super::Action;

/// A worker's report.
#[derive(Clone, Debug, PartialEq)]
pub enum JobReport {
    /// Statistics of the tensor whose directory hash is `hash` (the cache key).
    Stats {
        hash: u64,
        name: String,
        result: Result<Arc<TensorStats>, String>,
    },
    VerifyStarted {
        tensors: usize,
        bytes: u64,
    },
    /// A link of shard `shard`'s chain (0 for a single file).
    VerifyLink {
        shard: usize,
        link: LinkResult,
    },
    VerifyProgress {
        done: u64,
        total: u64,
    },
    /// The whole run: every shard verified, in order.
    VerifyDone(Arc<super::integrity::SetReport>),
    /// The chat worker's reports.
    Chat(super::chat_worker::ChatReport),
    /// Every skill's routing score for `prompt` (the Skills view's E column).
    Route {
        prompt: String,
        result: Result<Arc<cortiq_engine::runtime::skill_route::Routing>, String>,
    },
    /// A step of a compare run (the chat's compare mode).
    Compare(super::compare::CompareReport),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum JobKind {
    Stats,
    Verify,
    Route,
    Compare,
}

pub struct Jobs {
    tx: Sender<Action>,
    running: HashMap<JobKind, Arc<AtomicBool>>,
    /// Workers take a read lock before they start; a test holds the write lock to keep
    /// them from starting, so that "cancel before the work finishes" is deterministic.
    gate: Arc<RwLock<()>>,
}

impl Jobs {
    pub fn new(tx: Sender<Action>) -> Jobs {
        Jobs {
            tx,
            running: HashMap::new(),
            gate: Arc::new(RwLock::new(())),
        }
    }

    /// Runs `work` on a new thread; it gets its cancel flag and a way to report.
    pub fn spawn<F>(&mut self, kind: JobKind, work: F)
    where
        F: FnOnce(&AtomicBool, &dyn Fn(JobReport)) + Send + 'static,
    {
        self.cancel(kind);
        let cancel = Arc::new(AtomicBool::new(false));
        self.running.insert(kind, cancel.clone());
        let tx = self.tx.clone();
        let gate = self.gate.clone();
        std::thread::Builder::new()
            .name(format!("cortiq-{kind:?}").to_lowercase())
            .spawn(move || {
                let report = |r: JobReport| {
                    // The app may be gone (quitting): nothing to tell then.
                    let _ = tx.send(Action::Job(r));
                };
                // A poisoned gate only means a test panicked while holding it.
                let _open = gate.read().unwrap_or_else(|e| e.into_inner());
                work(&cancel, &report);
            })
            .expect("spawn a worker thread");
    }

    pub fn cancel(&mut self, kind: JobKind) {
        if let Some(c) = self.running.remove(&kind) {
            c.store(true, Ordering::Relaxed);
        }
    }

    pub fn cancel_all(&mut self) {
        for (_, c) in self.running.drain() {
            c.store(true, Ordering::Relaxed);
        }
    }

    /// Marks a job kind finished (its final report arrived).
    pub fn finished(&mut self, kind: JobKind) {
        self.running.remove(&kind);
    }

    pub fn is_running(&self, kind: JobKind) -> bool {
        self.running.contains_key(&kind)
    }

    /// The gate workers pass before they start (see the field); tests hold its write lock.
    #[cfg(test)]
    pub fn gate(&self) -> Arc<RwLock<()>> {
        self.gate.clone()
    }
}
