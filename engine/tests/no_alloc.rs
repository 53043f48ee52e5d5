//! The decode loop allocates nothing per token: every buffer (KV cache, workspace, score
//! and activation scratch, sampler candidates) is sized before the first token. Counted
//! with a global allocator that tallies every allocation of this test binary.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use cortiq_engine::format::shards::CmfModel;
use cortiq_engine::model::{Model, Precision};
use cortiq_engine::runtime::sampler::{Sampler, SamplingParams};
use cortiq_engine::runtime::session::Session;

struct Counting;

static COUNTING: AtomicBool = AtomicBool::new(false);
static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        System.alloc(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        System.realloc(ptr, layout, new_size)
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn decode_allocations(stem: &str, precision: Precision) -> usize {
    let path = common::fixture(&format!("cmf/{stem}.cmf"));
    let mut model = Model::load(Arc::new(CmfModel::open(&path).unwrap())).unwrap();
    model.set_precision(precision);
    let mut session = Session::new(Arc::new(model), 128);
    let vocab = session.model.config.vocab;
    let mut sampler = Sampler::new(
        SamplingParams {
            temperature: 0.9,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repetition_penalty: 1.1,
            seed: 3,
        },
        vocab,
    );
    let prompt: Vec<u32> = (1..20).collect();
    cortiq_engine::exec::pool().install(|| {
        session.prefill(&prompt).unwrap();
        let mut context = prompt.clone();
        context.reserve(64);
        let mut step = |session: &mut Session, context: &mut Vec<u32>| {
            let id = sampler.sample(session.logits_mut(), context);
            context.push(id);
            session.step(id).unwrap();
        };
        // Warm-up: the first tokens size the per-thread scratch buffers.
        for _ in 0..3 {
            step(&mut session, &mut context);
        }
        ALLOCATIONS.store(0, Ordering::SeqCst);
        COUNTING.store(true, Ordering::SeqCst);
        for _ in 0..40 {
            step(&mut session, &mut context);
        }
        COUNTING.store(false, Ordering::SeqCst);
    });
    ALLOCATIONS.load(Ordering::SeqCst)
}

#[test]
fn decoding_allocates_nothing_per_token() {
    // More workers than cores: which worker decodes which row block then varies from
    // token to token, so a buffer sized only on the warm-up tokens' workers shows up.
    cortiq_engine::exec::set_threads(8).unwrap();
    for (stem, p) in [
        ("qwen3-q8", Precision::Exact),
        ("qwen3-q8", Precision::Fast),
        ("qwen3-q4", Precision::Fast),
        ("qwen3-vbit", Precision::Exact),
        ("gemma3-q8", Precision::Exact),
        ("qwen3_5-q8", Precision::Exact),
        ("qwen3_moe-q8", Precision::Fast),
    ] {
        let n = decode_allocations(stem, p);
        assert_eq!(n, 0, "{stem} ({p:?}): {n} allocations in 40 decoded tokens");
    }
    // In the same test: the counter is global, and a second test running at the same
    // time would count the harness's allocations for it.
    speculative_decoding_with_routes_allocates_nothing_per_token();
}

/// Speculative decoding and the route log allocate nothing per token either (the
/// self-made hybrid: Gated DeltaNet rollback, MoE routes, the MTP head).
fn speculative_decoding_with_routes_allocates_nothing_per_token() {
    use cortiq_engine::runtime::session::{GenerateParams, Step};
    use cortiq_engine::tinymodel::{write_tiny, TinySpec};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("hybrid.cmf");
    for successor in [true, false] {
        write_tiny(
            &path,
            &TinySpec {
                mtp: true,
                successor,
                ..TinySpec::hybrid()
            },
        )
        .unwrap();
        let model = Model::load(Arc::new(CmfModel::open(&path).unwrap())).unwrap();
        let mut session = Session::new(Arc::new(model), 256);
        session.set_speculative(true).unwrap();
        session.log_routes();
        let params = GenerateParams {
            max_tokens: 80,
            sampling: SamplingParams::greedy(),
            stop_ids: vec![],
        };
        let prompt: Vec<u32> = (1..20).collect();
        let n = cortiq_engine::exec::pool().install(|| {
            let mut g = session.start(&prompt, &params).unwrap();
            let mut tokens = 0;
            let mut counted = None;
            loop {
                if tokens == 10 {
                    ALLOCATIONS.store(0, Ordering::SeqCst);
                    COUNTING.store(true, Ordering::SeqCst);
                }
                match g.next().unwrap() {
                    Step::Token(_) => tokens += 1,
                    Step::Done(_) => break,
                    Step::Prefill { .. } => {}
                }
                if tokens == 70 && COUNTING.load(Ordering::SeqCst) {
                    COUNTING.store(false, Ordering::SeqCst);
                    counted = Some(ALLOCATIONS.load(Ordering::SeqCst));
                }
            }
            counted.expect("70 tokens were generated")
        });
        assert_eq!(n, 0, "successor {successor}: {n} allocations in 60 tokens");
    }
}
