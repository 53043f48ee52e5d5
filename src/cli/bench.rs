//! `cortiq bench FILE [--prompt-tokens N] [--tokens N] [--threads N] [--json]`: prefill
//! and decode speed, time to first token and peak RSS. Each measurement runs `--repeat`
//! times after a warm-up (weights paged in) and the median is reported, as llama-bench
//! reports averages over repetitions.
//!
//! `--mtp` also measures speculative decoding with the file's MTP head, interleaved with
//! plain decoding repetition by repetition (the machine's noise hits both alike), and
//! reports both speeds, the speed-up and the acceptance rate. The JSON also gives the
//! session state's size: KV bytes at the benchmark's context and the recurrent
//! (linear-attention) state, which does not grow with context.
//!
//! `--task NAME` / `--skill ID` also decode under that choice, interleaved with the
//! backbone, and report both speeds, the dense FFN blocks' own time per token each way
//! (what a sparse mask saves), and the time to switch between tokens (keeping the
//! cache, and re-prefilling the context). `--choice-only` runs only the choice, for its
//! peak RSS alone.
//!
//! The JSON also says what the run measured: the SIMD `kernel` the products dispatch to
//! (`CORTIQ_SIMD`/`CORTIQ_KERNEL` lower it), the `precision` of the activations, the
//! `weight_bytes_per_token` one decoded token reads ([`Model::weight_bytes_per_token`]:
//! × `decode_tok_s` it is the effective bandwidth), and `allocs_per_token`, the heap
//! allocations of the whole process (every thread, counted by the binary's global
//! allocator) during the measured decode loops, over the tokens they decoded.
//!
//! `--bandwidth` measures the machine's read bandwidth instead, with `--threads` threads
//! (see [`super::bandwidth`]); FILE is not needed then.

use std::time::Instant;

use cortiq_engine::model::select::Active;
use cortiq_engine::model::Model;
use cortiq_engine::quant::matrix::Kernel;
use cortiq_engine::runtime::choice::resolve;
use cortiq_engine::runtime::sampler::{argmax, SamplingParams};
use cortiq_engine::runtime::session::{label_of, GenerateParams, Session, Step, SwitchPolicy};
use serde_json::json;

use super::bandwidth::proc_bytes;
use super::common::{emit, print_json, CliError, CmdResult, Status};
use super::engine::{model_error, ChoiceArgs, ModelArgs};

#[derive(clap::Args, Debug)]
// FILE (ModelArgs') may be left out with --bandwidth: "-" stands for "none given".
#[command(mut_arg("file", |a| a
    .required(false)
    .default_value("-")
    .hide_default_value(true)
    .help("Model file (or one shard of a set); not needed with --bandwidth")))]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Prompt length for the prefill measurement.
    #[arg(long, default_value_t = 128, value_name = "N")]
    pub prompt_tokens: usize,
    /// Tokens to decode for the decode measurement.
    #[arg(long, default_value_t = 64, value_name = "N")]
    pub tokens: usize,
    /// Repetitions of each measurement (the median is reported).
    #[arg(long, default_value_t = 3, value_name = "N")]
    pub repeat: usize,
    /// Also measure speculative decoding with the MTP head (see the module comment).
    #[arg(long)]
    pub mtp: bool,
    /// Log every position's expert choices while measuring (what the routing view and
    /// `run --route-stats` do), to see what it costs.
    #[arg(long)]
    pub routes: bool,
    #[command(flatten)]
    pub choice: ChoiceArgs,
    /// With --task/--skill: run only under the choice (its peak RSS alone).
    #[arg(long)]
    pub choice_only: bool,
    /// Measure the machine's read bandwidth (DRAM and L3) with --threads threads instead
    /// of a model: `{"read_bandwidth_bytes_s", "l3_bandwidth_bytes_s"}` with --json.
    #[arg(long)]
    pub bandwidth: bool,
    /// With --bandwidth: the DRAM buffer's size, well above the last-level cache's.
    #[arg(long, default_value_t = 1024, value_name = "MiB")]
    pub bandwidth_mib: usize,
    #[arg(long)]
    pub json: bool,
}

/// Peak resident set size of this process (`VmHWM`), in bytes.
pub fn peak_rss_bytes() -> Option<u64> {
    status_bytes("VmHWM:")
}

/// Resident set size of this process now (`VmRSS`), in bytes.
fn rss_bytes() -> Option<u64> {
    status_bytes("VmRSS:")
}

/// How much of this process's file mappings Linux maps in 2 MiB pages
/// (`FilePmdMapped`), in bytes: the model's weights once the page cache holds them in
/// huge folios (see `CmfFile::open`). Decode walks the page tables once per page of
/// weights, so this tells two runs of the same build apart.
fn file_huge_page_bytes() -> Option<u64> {
    proc_bytes("/proc/self/smaps_rollup", "FilePmdMapped:")
}

/// Resident bytes of this process's mappings that hold any of `ranges` (the model's
/// files, each one mapping, `[start, end)` addresses): the `Rss` of each such mapping of
/// `/proc/self/smaps`. With [`status_bytes`]`("RssAnon:")` it splits the peak into the
/// weights the run touched (file pages, at most the file) and the heap (KV, buffers,
/// tokenizer); the rest of a peak is the program's own code and libraries, which a
/// decode pages in as it first runs each kernel.
fn resident_bytes_of(ranges: &[(usize, usize)]) -> Option<u64> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
    let (mut total, mut inside) = (0u64, false);
    for line in smaps.lines() {
        let mut words = line.split_whitespace();
        let first = words.next().unwrap_or("");
        if let Some((a, b)) = first.split_once('-') {
            if let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16)) {
                inside = ranges.iter().any(|&(s, e)| s < b && a < e);
                continue;
            }
        }
        if inside && first == "Rss:" {
            total += words.next()?.parse::<u64>().ok()? * 1024;
        }
    }
    Some(total)
}

/// A size field of `/proc/self/status` (given in kB), in bytes.
fn status_bytes(field: &str) -> Option<u64> {
    proc_bytes("/proc/self/status", field)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The dense FFN blocks' own time for one token (median of 9 passes over every layer),
/// under `active`'s mask and skill or the backbone's.
fn ffn_time(model: &Model, active: Option<&Active>) -> f64 {
    use cortiq_engine::model::block::FeedForward;
    use cortiq_engine::model::mlp::MlpScratch;
    let h = model.config.hidden;
    let x: Vec<f32> = (0..h).map(|i| ((i * 37) % 19) as f32 / 9.0 - 1.0).collect();
    let mut out = vec![0f32; h];
    let mut scratch = MlpScratch::new(model.config.intermediate.max(1), 1);
    let plain = Active::default();
    let active = active.unwrap_or(&plain);
    let mut times: Vec<f64> = (0..9)
        .map(|_| {
            let t = Instant::now();
            for (i, layer) in model.layers.iter().enumerate() {
                let sel = active.layer(i);
                if let (FeedForward::Dense(m), false) = (&layer.ff, sel.skip()) {
                    m.forward(&x, 1, &mut scratch, &mut out, sel.skill, sel.ffn());
                }
            }
            t.elapsed().as_secs_f64()
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

/// `--bandwidth`: the machine's read bandwidth from DRAM and from L3.
fn bandwidth(a: &Args) -> CmdResult {
    use super::bandwidth::{read_bandwidth, simd};
    let threads = match a.model.threads {
        Some(0) => return Err(CliError::usage("--threads must be at least 1")),
        Some(n) => n,
        None => cortiq_engine::exec::cores(),
    };
    if a.bandwidth_mib == 0 {
        return Err(CliError::usage("--bandwidth-mib must be at least 1"));
    }
    let dram_bytes = a.bandwidth_mib << 20;
    let l3_bytes = 8usize << 20;
    let buffer_error = |e| CliError::io(format!("allocating the probe's buffer: {e}"));
    let dram = read_bandwidth(dram_bytes, threads, 1, 7).map_err(buffer_error)?;
    let l3 = read_bandwidth(l3_bytes, threads, 32, 15).map_err(buffer_error)?;
    if a.json {
        print_json(&json!({
            "read_bandwidth_bytes_s": dram.bytes_s,
            "l3_bandwidth_bytes_s": l3.bytes_s,
            "threads": threads,
            "buffer_bytes": dram_bytes,
            "buffer_huge_page_bytes": dram.huge_page_bytes,
            "l3_buffer_bytes": l3_bytes,
            "loads": simd(),
        }))?;
    } else {
        let huge = match dram.huge_page_bytes {
            Some(b) => format!(", {} MiB in 2 MiB pages", b >> 20),
            None => String::new(),
        };
        emit(&format!(
            "read bandwidth, {threads} threads ({} loads): DRAM {:.1} GB/s ({} MiB buffer{huge}), \
             L3 {:.1} GB/s ({} MiB)\n",
            simd(),
            dram.bytes_s / 1e9,
            a.bandwidth_mib,
            l3.bytes_s / 1e9,
            l3_bytes >> 20,
        ))?;
    }
    Ok(Status::Success)
}

pub fn run(a: &Args) -> CmdResult {
    if a.bandwidth {
        return bandwidth(a);
    }
    if a.model.file.as_os_str() == "-" {
        return Err(CliError::usage("bench needs a model FILE (or --bandwidth)"));
    }
    if a.prompt_tokens == 0 || a.tokens == 0 || a.repeat == 0 {
        return Err(CliError::usage(
            "--prompt-tokens, --tokens and --repeat must be at least 1",
        ));
    }
    // What the process holds before the model (its code, libraries, runtime), so that
    // the model's own share of the peak (weights touched, KV, tokenizer, buffers) can be
    // told apart from it.
    let baseline_rss = rss_bytes();
    let load_start = Instant::now();
    let model = a.model.load()?;
    let load_s = load_start.elapsed().as_secs_f64();
    let c = &model.config;
    let need = a.prompt_tokens + a.tokens;
    if need > c.max_positions {
        return Err(CliError::usage(format!(
            "{need} positions asked; the model holds {}",
            c.max_positions
        )));
    }
    let err = |e| model_error(&a.model.file, &e);
    if a.mtp && model.mtp.is_none() {
        return Err(CliError::usage(format!(
            "--mtp: {} has no MTP head (model.mtp.*)",
            a.model.file.display()
        )));
    }
    // A fixed pseudo-random prompt (the content does not change the cost).
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let prompt: Vec<u32> = (0..a.prompt_tokens)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % c.vocab as u64) as u32
        })
        .collect();
    let mut session = Session::new(model.clone(), need);
    if a.routes {
        session.log_routes();
    }
    let chosen = if a.choice.is_set() {
        let req = a.choice.request()?;
        Some(resolve(&model, &req, &prompt).map_err(err)?)
    } else if a.choice_only {
        return Err(CliError::usage("--choice-only needs --task or --skill"));
    } else {
        None
    };
    let mut choice_session = match &chosen {
        Some(r) => {
            let mut s = Session::new(model.clone(), need);
            s.switch(r.active.clone(), SwitchPolicy::Reprefill)
                .map_err(err)?;
            s.prefill(&prompt[..prompt.len().min(8)]).map_err(err)?;
            Some(s)
        }
        None => None,
    };
    if a.choice_only {
        // Measure the choice in the main loop; nothing runs under the backbone.
        session = choice_session.take().expect("a choice was given");
    }

    // Warm-up: page the weights in and size every buffer (a few decoded tokens too:
    // the per-thread scratch of the token path), within the session's capacity.
    let warm = prompt.len().min(8);
    session.prefill(&prompt[..warm]).map_err(err)?;
    cortiq_engine::exec::pool().install(|| -> Result<(), CliError> {
        for _ in 0..3.min(need - warm) {
            let next = argmax(session.logits()) as u32;
            session.step(next).map_err(err)?;
        }
        Ok(())
    })?;

    let (mut prefill, mut decode, mut ttft) = (Vec::new(), Vec::new(), Vec::new());
    let mut decode_allocs = 0u64;
    let (mut plain_gen, mut mtp_gen) = (Vec::new(), Vec::new());
    let (mut drafted, mut accepted) = (0usize, 0usize);
    let (mut choice_decode, mut ffn_plain, mut ffn_masked) = (Vec::new(), Vec::new(), Vec::new());
    let mut spec_session = if a.mtp {
        let mut s = Session::new(model.clone(), need);
        s.set_speculative(true).map_err(CliError::usage)?;
        if a.routes {
            s.log_routes();
        }
        Some(s)
    } else {
        None
    };
    // Greedy generation through the stepper (what `run` does), stop tokens ignored.
    let params = GenerateParams {
        max_tokens: a.tokens,
        sampling: SamplingParams::greedy(),
        stop_ids: Vec::new(),
    };
    let gen_rate = |s: &mut Session| -> Result<(f64, usize, usize), CliError> {
        s.reset();
        let mut g = s.start(&prompt, &params).map_err(err)?;
        loop {
            match g.next().map_err(|e| err(e.error))? {
                Step::Done(st) => return Ok((st.decode_tok_s, st.drafted, st.accepted)),
                Step::Prefill { .. } | Step::Token(_) => {}
            }
        }
    };
    // Measured as `run` runs: the whole loop inside the engine's pool.
    cortiq_engine::exec::pool().install(|| -> Result<(), CliError> {
        for _ in 0..a.repeat {
            session.reset();
            let t0 = Instant::now();
            session.prefill(&prompt).map_err(err)?;
            let mut next = argmax(session.logits()) as u32;
            let p = t0.elapsed().as_secs_f64();
            prefill.push(prompt.len() as f64 / p);
            ttft.push(p);
            let allocs = crate::alloc_count::allocations();
            let t1 = Instant::now();
            for _ in 0..a.tokens {
                session.step(next).map_err(err)?;
                next = argmax(session.logits()) as u32;
            }
            let rate = a.tokens as f64 / t1.elapsed().as_secs_f64();
            decode_allocs += crate::alloc_count::allocations() - allocs;
            decode.push(rate);
            if let Some(cs) = choice_session.as_mut() {
                cs.reset();
                cs.prefill(&prompt).map_err(err)?;
                let mut next = argmax(cs.logits()) as u32;
                let t1 = Instant::now();
                for _ in 0..a.tokens {
                    cs.step(next).map_err(err)?;
                    next = argmax(cs.logits()) as u32;
                }
                choice_decode.push(a.tokens as f64 / t1.elapsed().as_secs_f64());
                ffn_plain.push(ffn_time(&model, None));
                ffn_masked.push(ffn_time(&model, chosen.as_ref().map(|r| &r.active)));
            }
            if let Some(spec) = spec_session.as_mut() {
                plain_gen.push(gen_rate(&mut session)?.0);
                let (rate, d, acc) = gen_rate(spec)?;
                mtp_gen.push(rate);
                drafted += d;
                accepted += acc;
            }
        }
        Ok(())
    })?;
    let mtp = a.mtp.then(|| {
        let (plain, fast) = (median(plain_gen.clone()), median(mtp_gen.clone()));
        json!({
            "plain_decode_tok_s": plain,
            "mtp_decode_tok_s": fast,
            "speedup": fast / plain,
            "drafted": drafted,
            "accepted": accepted,
            "acceptance": if drafted > 0 { accepted as f64 / drafted as f64 } else { 0.0 },
        })
    });
    let choice = match (&chosen, choice_session.as_mut()) {
        (Some(r), Some(cs)) => {
            // Switching between tokens: to the backbone and back, keeping the cache.
            let t = Instant::now();
            cs.switch(Default::default(), SwitchPolicy::KeepCache)
                .map_err(err)?;
            cs.switch(r.active.clone(), SwitchPolicy::KeepCache)
                .map_err(err)?;
            let switch_s = t.elapsed().as_secs_f64() / 2.0;
            let t = Instant::now();
            let rep = cs
                .switch(Default::default(), SwitchPolicy::Reprefill)
                .map_err(err)?;
            let reprefill_s = t.elapsed().as_secs_f64();
            let (dense, masked) = (median(decode.clone()), median(choice_decode.clone()));
            let (fp, fm) = (median(ffn_plain.clone()), median(ffn_masked.clone()));
            Some(json!({
                "label": rep.from,
                "decode_tok_s": masked,
                "backbone_decode_tok_s": dense,
                "speedup": masked / dense,
                "ffn_s_per_token": fm,
                "backbone_ffn_s_per_token": fp,
                "ffn_speedup": fp / fm,
                "ffn_live": r.active.task.as_ref().map(|t| t.ffn_live),
                "switch_keep_cache_s": switch_s,
                "switch_reprefill_s": reprefill_s,
                "reprefilled_positions": rep.recomputed,
                "token_s": 1.0 / masked,
                "blend_bytes": r.blend_bytes,
            }))
        }
        (Some(r), None) => Some(json!({"label": label_of(&model, &r.active), "choice_only": true})),
        _ => None,
    };
    let kv_bytes = session.state().kv_bytes(need);
    let recurrent_bytes = session.state().recurrent_bytes();
    let threads = cortiq_engine::exec::threads();
    let dtypes = {
        let mut counts: std::collections::BTreeMap<String, u64> = Default::default();
        for (_, e) in model.file.tensors() {
            *counts.entry(e.dtype.to_string()).or_default() += e.nbytes;
        }
        counts
    };
    let (pf, dc, tt) = (median(prefill), median(decode), median(ttft));
    let rss = peak_rss_bytes();
    let huge = file_huge_page_bytes();
    let file_ranges: Vec<(usize, usize)> = model
        .file
        .shards
        .iter()
        .map(|f| {
            (
                f.bytes().as_ptr() as usize,
                f.bytes().as_ptr() as usize + f.bytes().len(),
            )
        })
        .collect();
    let weights_resident = resident_bytes_of(&file_ranges);
    let anon = status_bytes("RssAnon:");
    let kernel = Kernel::detect().name();
    let precision = model.precision().name();
    let weight_bytes = model.weight_bytes_per_token();
    let allocs_per_token = decode_allocs as f64 / (a.tokens * a.repeat) as f64;
    if a.json {
        print_json(&json!({
            "file": a.model.file.display().to_string(),
            "prefill_tok_s": pf,
            "decode_tok_s": dc,
            "ttft_s": tt,
            "peak_rss_bytes": rss,
            "baseline_rss_bytes": baseline_rss,
            "file_huge_page_bytes": huge,
            "weights_resident_bytes": weights_resident,
            "rss_anon_bytes": anon,
            "load_s": load_s,
            "threads": threads,
            "prompt_tokens": a.prompt_tokens,
            "decode_tokens": a.tokens,
            "repeat": a.repeat,
            "model_bytes": model.file.total_bytes(),
            "weight_bytes_by_dtype": dtypes,
            "context": need,
            "routes_logged": a.routes && model.has_moe(),
            "kv_bytes": kv_bytes,
            "recurrent_state_bytes": recurrent_bytes,
            "mtp": mtp,
            "choice": choice,
            "kernel": kernel,
            "precision": precision,
            "weight_bytes_per_token": weight_bytes,
            "effective_bandwidth_bytes_s": weight_bytes as f64 * dc,
            "allocs_per_token": allocs_per_token,
            "decode_allocs": decode_allocs,
        }))?;
    } else {
        emit(&format!(
            "{}\n  threads {threads}, prompt {} tokens, decode {} tokens, median of {}\n  \
             prefill {pf:.1} tok/s   decode {dc:.1} tok/s   ttft {:.1} ms\n  \
             load {:.1} ms   peak RSS {} ({} before the model opened; at the end {} of \
             weights mapped in, {} anonymous){}\n",
            a.model.file.display(),
            a.prompt_tokens,
            a.tokens,
            a.repeat,
            tt * 1e3,
            load_s * 1e3,
            rss.map_or("?".into(), |b| format!("{:.1} MiB", b as f64 / 1048576.0)),
            baseline_rss.map_or("?".into(), |b| format!("{:.1} MiB", b as f64 / 1048576.0)),
            weights_resident.map_or("?".into(), |b| format!("{:.1} MiB", b as f64 / 1048576.0)),
            anon.map_or("?".into(), |b| format!("{:.1} MiB", b as f64 / 1048576.0)),
            huge.map_or(String::new(), |b| format!(
                "; {:.1} MiB of the file in 2 MiB pages",
                b as f64 / 1048576.0
            )),
        ))?;
        emit(&format!(
            "  kernel {kernel}, precision {precision}; {:.1} MiB of weights per token \
             ({:.1} GB/s at that decode speed); {allocs_per_token:.2} allocations per token\n",
            weight_bytes as f64 / 1048576.0,
            weight_bytes as f64 * dc / 1e9,
        ))?;
        emit(&format!(
            "  state at {need} positions: KV {:.1} KiB, recurrent {:.1} KiB\n",
            kv_bytes as f64 / 1024.0,
            recurrent_bytes as f64 / 1024.0
        ))?;
        if let Some(c) = choice.as_ref().filter(|c| c.get("speedup").is_some()) {
            let f = |k: &str| c[k].as_f64().unwrap_or(0.0);
            emit(&format!(
                "  {}: decode {:.1} tok/s vs {:.1} backbone (×{:.2}); FFN blocks {:.0} µs/token vs {:.0} (×{:.2})\n  \
                 switch: {:.1} µs keeping the cache, {:.1} ms re-prefilling {} positions; a token takes {:.1} ms\n",
                c["label"].as_str().unwrap_or("?"),
                f("decode_tok_s"),
                f("backbone_decode_tok_s"),
                f("speedup"),
                f("ffn_s_per_token") * 1e6,
                f("backbone_ffn_s_per_token") * 1e6,
                f("ffn_speedup"),
                f("switch_keep_cache_s") * 1e6,
                f("switch_reprefill_s") * 1e3,
                c["reprefilled_positions"],
                f("token_s") * 1e3,
            ))?;
        }
        if let Some(m) = &mtp {
            emit(&format!(
                "  MTP: decode {:.1} tok/s vs {:.1} plain (×{:.2}), drafts accepted {} of {} ({:.0}%)\n",
                m["mtp_decode_tok_s"].as_f64().unwrap_or(0.0),
                m["plain_decode_tok_s"].as_f64().unwrap_or(0.0),
                m["speedup"].as_f64().unwrap_or(0.0),
                accepted,
                drafted,
                100.0 * m["acceptance"].as_f64().unwrap_or(0.0),
            ))?;
        }
    }
    Ok(Status::Success)
}
