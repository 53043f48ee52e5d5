#!/usr/bin/env bash
# Inference speed side by side, in one run (issue 11, "The benchmark"): this project's
# `cortiq bench`, the reference implementation's `cortiq bench --core` and llama.cpp's
# `llama-bench`, on SmolLM2-135M and Qwen2.5-Coder-0.5B, each CMF format against its
# llama.cpp peer. Prints two markdown tables — speeds, ratios, bandwidth, TTFT, RSS,
# allocations, perplexity; then decode and prefill per SIMD level — with the medians of
# REPS interleaved rounds, and keeps every raw JSON line in $BENCH_DIR/results.jsonl.
#
#   scripts/bench-inference.sh                        # everything: ~15 min on 2 cores
#   REPS=1 MODELS=smollm2-135m FORMATS="q8_row q4_block" scripts/bench-inference.sh
#
# Knobs (environment):
#   MODELS="smollm2-135m qwen2.5-coder-0.5b"
#   FORMATS="q8_row q8_2f q4_block q4_tiled q4tp vbit q1t"
#       our dtypes, each imported once with `cortiq import-gguf SRC -o F --quant Q` (vbit
#       at a 4.5-bit budget). Peers: q8_row, q8_2f vs Q8_0; q4_block, q4_tiled, q4tp vs
#       Q4_0 and Q4_K_M; vbit vs Q4_K_M; q1t vs TQ2_0 and TQ1_0, all made from the same
#       source GGUF with `llama-quantize --allow-requantize` (a type it cannot make, or
#       makes mostly from fallback types, is said so in the table).
#   LEVELS="scalar avx2 avxvnni avx512"   SIMD levels of the second table (CORTIQ_SIMD, and the
#       older CORTIQ_KERNEL, set to each); default: every level the CPU has, detected
#       by asking `cortiq bench` which kernel it ran.
#   SCALAR_MODELS="smollm2-135m"  SCALAR_FORMATS="q8_row q4_block"   the scalar level is
#       ~10-20x slower than SIMD: it runs only on these ("all" for every one).
#   REPS=3          rounds; each round runs every configuration once, in turn; medians.
#   THREADS=2       threads of every engine (CMF_THREADS/RAYON_NUM_THREADS for the reference).
#   TOKENS=64       decoded tokens after a 64-token prompt; prefill is measured at 64 and 512.
#   DECODE_S=4      a configuration that decodes slower than TOKENS/DECODE_S tok/s (from a
#                   short probe) decodes fewer tokens (at least 8), to bound the run.
#   SLOW_S=15       a configuration whose run is estimated longer than this runs in the
#                   first round only (its cells marked ¹).
#   TIMEOUT=300     seconds per command.
#   LLAMA_ARGS=     extra llama-bench arguments (e.g. "--poll 0": its threads spin while
#                   waiting, which costs it most when other processes load the CPUs).
#   BENCH_DIR=$HOME/.cache/cortiq-bench   imports, llama.cpp quantizations, results.jsonl.
#   LLAMA_BENCH_NOAMX=  a llama-bench built for AVX-512 without AMX (scripts/build-llama.sh
#                   noamx prints its path), used where the main one dies in its AMX kernels.
#   LLAMA_BENCH_AVX2=   a llama-bench built for AVX2 only (scripts/build-llama.sh avx2 prints
#                   its path): the per-level table then sets our avx2 level beside it
#                   (decode and 64-token prefill), since the main llama-bench is built for
#                   this CPU's best level.
#   LLAMA_BENCH_AVXVNNI=  the same for our avxvnni level: llama-bench built for AVX2 with
#                   AVX-VNNI (scripts/build-llama.sh avxvnni).
#
# Our runs: `cortiq bench F --threads T --prompt-tokens 64 --tokens N --repeat 1 --json
# --no-verify` (each file is verified once first) at the default precision (its name as
# the run reports it), `--precision exact`, `balanced` and `fast`, and `--prompt-tokens 512`
# for the long prefill. The reference: `bench F --core --ignore-eos --ctx 64 --tokens N
# --json`. llama.cpp: `llama-bench -m G -t T -p 64,512 -n TOKENS -r 1 -o json`; on a
# machine where it dies of SIGILL or SIGSEGV (rc 132 / 139: llama.cpp's AMX kernels on a VM
# whose CPU reports AMX) it is rerun with `--repack 0` or LLAMA_BENCH_NOAMX, for its prefill
# only when its decode runs as built, and the output says so. The measured read
# bandwidth (`cortiq bench --bandwidth`) is the roofline: effective bandwidth =
# weight_bytes_per_token × decode tok/s, and its "% DRAM" takes each default decode run
# against a probe run just before it (the median over rounds). Perplexity: `cortiq ppl` on the passage the
# fixtures carry (../shared/fixtures/*/reference.safetensors, metadata "text").
set -euo pipefail
cd "$(dirname "$0")/.."

export MODELS="${MODELS:-smollm2-135m qwen2.5-coder-0.5b}"
export FORMATS="${FORMATS:-q8_row q8_2f q4_block q4_tiled q4tp vbit q1t}"
export LEVELS="${LEVELS:-}"
export SCALAR_MODELS="${SCALAR_MODELS:-smollm2-135m}"
export SCALAR_FORMATS="${SCALAR_FORMATS:-q8_row q4_block}"
export REPS="${REPS:-3}" THREADS="${THREADS:-2}" TOKENS="${TOKENS:-64}"
export DECODE_S="${DECODE_S:-4}" SLOW_S="${SLOW_S:-15}" TIMEOUT="${TIMEOUT:-300}"
export LLAMA_ARGS="${LLAMA_ARGS:-}"
export BENCH_DIR="${BENCH_DIR:-$HOME/.cache/cortiq-bench}"
mkdir -p "$BENCH_DIR"

mapfile -t PEERS < <(../shared/bench/peers.sh)
export LLAMA_BENCH="${PEERS[0]}" LLAMA_QUANTIZE="${PEERS[1]}" REF="${PEERS[2]}"
bash ../shared/models/fetch.sh >/dev/null
export CMF_MODELS="${CMF_MODELS:-$HOME/.cache/cmf-models}"
cargo build --release --quiet
export OURS="$PWD/target/release/cortiq" FIXTURES="$PWD/../shared/fixtures"

exec python3 - <<'PY'
import json, os, re, statistics, struct, subprocess, sys, time

E = os.environ
OURS, REF, LB, LQ = E["OURS"], E["REF"], E["LLAMA_BENCH"], E["LLAMA_QUANTIZE"]
# llama-bench builds for our lower SIMD levels: level -> binary.
LEVEL_PEERS = {level: E[var] for level, var in (("avx2", "LLAMA_BENCH_AVX2"),
                                               ("avxvnni", "LLAMA_BENCH_AVXVNNI")) if E.get(var)}
LB_NOAMX = E.get("LLAMA_BENCH_NOAMX") or None
DIR, CACHE, FIX = E["BENCH_DIR"], E["CMF_MODELS"], E["FIXTURES"]
REPS, THREADS, TOKENS = int(E["REPS"]), int(E["THREADS"]), int(E["TOKENS"])
DECODE_S, SLOW_S, TIMEOUT = float(E["DECODE_S"]), float(E["SLOW_S"]), float(E["TIMEOUT"])
PROMPT, LONG = 64, 512

SOURCES = {
    "smollm2-135m": ("SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2"),
    "qwen2.5-coder-0.5b": ("Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf", "qwen25coder"),
}
PEERS = {
    "q8_row": ["Q8_0"], "q8_2f": ["Q8_0"],
    "q4_block": ["Q4_0", "Q4_K_M"], "q4_tiled": ["Q4_0", "Q4_K_M"], "q4tp": ["Q4_0", "Q4_K_M"],
    "vbit": ["Q4_K_M"], "q1t": ["TQ2_0", "TQ1_0"],
}
ALL_LEVELS = ["scalar", "avx2", "avxvnni", "avx512"]


def die(msg):
    print(f"bench-inference: {msg}", file=sys.stderr)
    sys.exit(2)


MODELS, FORMATS = E["MODELS"].split(), E["FORMATS"].split()
for m in MODELS:
    if m not in SOURCES:
        die(f"MODELS: unknown {m!r} (known: {' '.join(SOURCES)})")
for f in FORMATS:
    if f not in PEERS:
        die(f"FORMATS: unknown {f!r} (known: {' '.join(PEERS)})")
SCALAR_MODELS, SCALAR_FORMATS = E["SCALAR_MODELS"].split(), E["SCALAR_FORMATS"].split()


def log(msg):
    print(msg, file=sys.stderr, flush=True)


results = open(os.path.join(DIR, "results.jsonl"), "w")


def record(**fields):
    results.write(json.dumps(fields) + "\n")
    results.flush()


def run(cmd, env=None, timeout=TIMEOUT):
    """(returncode or None on timeout, stdout, stderr, seconds)."""
    e = dict(os.environ)
    e.update(env or {})
    t = time.time()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, env=e, timeout=timeout)
        return p.returncode, p.stdout, p.stderr, time.time() - t
    except subprocess.TimeoutExpired as x:
        return None, x.stdout or "", x.stderr or "", time.time() - t


def first_json(text):
    i = min([j for j in (text.find("{"), text.find("[")) if j >= 0], default=-1)
    if i < 0:
        raise ValueError("no JSON in the output")
    return json.JSONDecoder().raw_decode(text[i:])[0]


def why(rc, err):
    if rc is None:
        return f"timeout ({TIMEOUT:.0f} s)"
    lines = [l for l in err.strip().splitlines() if l.strip() and " INFO " not in l]
    return f"rc {rc}: {lines[-1][:160] if lines else ''}"


# ---------------------------------------------------------------- files
def cmf_path(model, fmt):
    return os.path.join(DIR, f"{model}-{fmt}.cmf")


def gguf_path(model, t):
    return os.path.join(DIR, f"{model}-{t}.gguf")


for model in MODELS:
    src = os.path.join(CACHE, SOURCES[model][0])
    for fmt in FORMATS:
        out = cmf_path(model, fmt)
        if os.path.exists(out):
            rc, _, err, _ = run([OURS, "verify", out, "--json"])
            if rc == 0:
                continue
            log(f"{out} fails verification ({why(rc, err)}): importing it again")
            os.remove(out)
        args = ["--quant", fmt] + (["--mean-bits", "4.5"] if fmt == "vbit" else [])
        log(f"import {model} {fmt}")
        tmp = out + ".part"
        rc, _, err, s = run([OURS, "import-gguf", src, "-o", tmp] + args, timeout=3600)
        if rc != 0:
            die(f"import-gguf {src} {' '.join(args)}: {why(rc, err)}")
        os.replace(tmp, out)
        log(f"  {s:.0f} s")

# llama.cpp's quantizations: None when llama-quantize cannot make one; notes on fallbacks.
ggufs, gguf_notes = {}, {}
for model in MODELS:
    src = os.path.join(CACHE, SOURCES[model][0])
    for t in sorted({t for f in FORMATS for t in PEERS[f]}):
        out, logf = gguf_path(model, t), gguf_path(model, t) + ".log"
        if not os.path.exists(out):
            log(f"llama-quantize {model} {t}")
            rc, o, err, _ = run([LQ, "--allow-requantize", src, out + ".part", t], timeout=3600)
            open(logf, "w").write(o + err)
            if rc != 0:
                gguf_notes[(model, t)] = f"llama-quantize failed ({why(rc, err)})"
                ggufs[(model, t)] = None
                continue
            os.replace(out + ".part", out)
        ggufs[(model, t)] = out
        text = open(logf).read() if os.path.exists(logf) else ""
        fb = re.search(r"(\d+) of (\d+) tensor\(s\) required fallback", text)
        bpw = re.search(r"quant size\s*=\s*[\d.]+ MiB \(([\d.]+) BPW\)", text)
        if fb:
            gguf_notes[(model, t)] = f"{fb.group(1)}/{fb.group(2)} tensors fell back" + (
                f", {bpw.group(1)} bpw" if bpw else "")

# The passage of each model's fixture (safetensors metadata), for perplexity.
passages, ref_ppl = {}, {}
for model in MODELS:
    st = os.path.join(FIX, SOURCES[model][1], "reference.safetensors")
    with open(st, "rb") as fh:
        n = struct.unpack("<Q", fh.read(8))[0]
        meta = json.loads(fh.read(n)).get("__metadata__", {})
    path = os.path.join(DIR, f"passage-{model}.txt")
    open(path, "w").write(json.loads(meta["text"]))
    passages[model] = path
    ref_ppl[model] = json.loads(meta["text_ppl"]) if "text_ppl" in meta else None


def llama_cmd(lb, gguf, flags, prompt, gen):
    """`llama-bench` `lb` on `gguf`: `prompt` (one size, or "64,512") and `gen` tokens, one
    repetition, JSON out, with `flags`."""
    return [lb, "-m", gguf, "-t", str(THREADS), "-p", str(prompt), "-n", str(gen), "-r", "1",
            "-o", "json"] + flags


# ---------------------------------------------------------------- what this machine runs
notes = []
LLAMA_FLAGS = E["LLAMA_ARGS"].split()
# Where llama.cpp's prefill needs another build or flags than its decode: (binary, flags).
LLAMA_PREFILL = None
probe_gguf = next((g for g in ggufs.values() if g), None)
if probe_gguf:
    def llama_probe(lb, flags, prompt, gen):
        return run(llama_cmd(lb, probe_gguf, flags, prompt, gen))
    rc, _, err, _ = llama_probe(LB, LLAMA_FLAGS, 8, 1)
    # SIGILL (132) or SIGSEGV (139) in llama.cpp's AMX kernels: seen on two VMs whose CPU
    # reports AMX (one died of each; on the second gdb showed `ggml_backend_amx_mul_mat`,
    # in a prefill: its decode, through the same backend's matrix-vector kernels, ran, and
    # twice as fast as with `--repack 0` or a build without AMX).
    if rc in (132, -4, 139, -11) and "--repack" not in LLAMA_FLAGS:
        sig = "Illegal instruction" if rc in (132, -4) else "a segmentation fault"
        fallback = (LB_NOAMX, LLAMA_FLAGS) if LB_NOAMX else (LB, LLAMA_FLAGS + ["--repack", "0"])
        how = ("LLAMA_BENCH_NOAMX, llama.cpp built for AVX-512 without AMX "
               "(`scripts/build-llama.sh noamx`)" if LB_NOAMX else "`--repack 0`")
        rc_d = llama_probe(LB, LLAMA_FLAGS, 0, 1)[0]
        rc2, _, err2, _ = llama_probe(*fallback, 8, 1)
        if rc2 != 0:
            notes.append(f"llama-bench fails, also with {how} ({why(rc2, err2)})")
        elif rc_d == 0:
            LLAMA_PREFILL = fallback
            notes.append(f"llama-bench dies of {sig} ({why(rc, err)}) in a prefill on this machine "
                         "(its AMX kernels, on a VM whose CPU reports AMX): its decode is measured "
                         f"as built, its prefill with {how}")
        else:
            LB, LLAMA_FLAGS = fallback
            notes.append(f"llama-bench dies of {sig} ({why(rc, err)}) on this machine (its AMX "
                         f"kernels, on a VM whose CPU reports AMX): measured with {how}")
    elif rc != 0:
        notes.append(f"llama-bench fails ({why(rc, err)})")
    log(f"llama-bench: {LB} " + (" ".join(LLAMA_FLAGS) or "default flags") +
        (f"; prefill: {LLAMA_PREFILL[0]} {' '.join(LLAMA_PREFILL[1])}" if LLAMA_PREFILL else ""))

def ours_cmd(model, fmt, prompt, tokens, precision=None):
    cmd = [OURS, "bench", cmf_path(model, fmt), "--threads", str(THREADS), "--prompt-tokens",
           str(prompt), "--tokens", str(tokens), "--repeat", "1", "--json", "--no-verify"]
    return cmd + (["--precision", precision] if precision else [])


def simd_env(level):
    return {"CORTIQ_SIMD": level, "CORTIQ_KERNEL": level} if level else {}


first = (MODELS[0], FORMATS[0])
rc, out, err, _ = run(ours_cmd(*first, 4, 2))
if rc != 0:
    die(f"cortiq bench fails: {why(rc, err)}")
DEFAULT_KERNEL = first_json(out)["kernel"]
have = []
for level in ALL_LEVELS:
    rc, out, _, _ = run(ours_cmd(*first, 4, 2), simd_env(level))
    if rc == 0 and first_json(out)["kernel"] == level:
        have.append(level)
LEVELS = E["LEVELS"].split() or have
for level in LEVELS:
    if level not in have:
        notes.append(f"level {level}: not available on this CPU (it has {', '.join(have)}): skipped")
LEVELS = [l for l in LEVELS if l in have]
log(f"SIMD levels: {' '.join(have)}; the default dispatch: {DEFAULT_KERNEL}")

bandwidths = []


def measure_bandwidth(rnd, keep=True, **at):
    """The probe's JSON (kept in `bandwidths` when `keep`), or None."""
    rc, out, err, _ = run([OURS, "bench", "--bandwidth", "--threads", str(THREADS), "--json"])
    if rc == 0:
        j = first_json(out)
        if keep:
            bandwidths.append(j)
        record(kind="bandwidth", round=rnd, json=j, **at)
        return j
    return None


measure_bandwidth(0)

# ---------------------------------------------------------------- configurations
class Config:
    def __init__(self, kind, model, fmt, label, cmd, env=None, peer=None):
        self.kind, self.model, self.fmt, self.label = kind, model, fmt, label
        self.cmd, self.env, self.peer = cmd, env or {}, peer
        self.slow, self.runs, self.failed = False, [], None
        # The DRAM bandwidth probed just before each of `runs` (default decode runs only):
        # the machine's bandwidth drifts by a fifth within minutes, so each run's share of
        # it is taken against the probe next to it, not against the run's median.
        self.adjacent_bw = []
        # A second command whose JSON list joins the first's (llama.cpp's prefill, where it
        # needs another build or flags than its decode).
        self.cmd_prefill = None

    def key(self):
        return (self.kind, self.model, self.fmt or self.peer, self.label)


def probe(model, fmt, precision=None, level=None):
    """(precision, decode tok/s, prefill tok/s) of a short run, or None."""
    rc, out, err, _ = run(ours_cmd(model, fmt, 8, 2, precision), simd_env(level))
    if rc != 0:
        log(f"  probe {model} {fmt} {precision or ''} {level or ''}: {why(rc, err)}")
        return None
    j = first_json(out)
    return j["precision"], j["decode_tok_s"], j["prefill_tok_s"]


def plan(d, p, prompt):
    """Decoded tokens and whether the run is slow, from probe speeds."""
    n = max(8, min(TOKENS, int(d * DECODE_S)))
    est = 0.5 + prompt / max(p, 1e-3) + n / max(d, 1e-3)
    return n, est > SLOW_S


configs, default_precision, tokens_of = [], {}, {}
for model in MODELS:
    for fmt in FORMATS:
        log(f"probe {model} {fmt}")
        pr = probe(model, fmt)
        if pr is None:
            continue
        prec, d, p = pr
        default_precision[(model, fmt)] = prec
        n, slow = plan(d, p, PROMPT)
        tokens_of[(model, fmt)] = n
        c = Config("ours", model, fmt, "default", ours_cmd(model, fmt, PROMPT, n))
        c.slow = slow
        configs.append(c)
        c = Config("ours", model, fmt, "long", ours_cmd(model, fmt, LONG, 1))
        c.slow = 0.5 + LONG / max(p, 1e-3) > SLOW_S
        configs.append(c)
        for other in ("exact", "balanced", "fast"):
            if other == prec:
                continue
            pr = probe(model, fmt, other)
            if pr is None:
                continue
            n2, slow2 = plan(pr[1], pr[2], PROMPT)
            c = Config("ours", model, fmt, other, ours_cmd(model, fmt, PROMPT, n2, other))
            c.slow = slow2
            configs.append(c)
        for level in LEVELS:
            if level == DEFAULT_KERNEL:
                continue
            if level == "scalar" and not (
                    ("all" in SCALAR_MODELS or model in SCALAR_MODELS)
                    and ("all" in SCALAR_FORMATS or fmt in SCALAR_FORMATS)):
                continue
            pr = probe(model, fmt, None, level)
            if pr is None:
                continue
            n2, slow2 = plan(pr[1], pr[2], PROMPT)
            c = Config("ours", model, fmt, "level:" + level, ours_cmd(model, fmt, PROMPT, n2),
                       simd_env(level))
            c.slow = slow2
            configs.append(c)
        c = Config("ref", model, fmt, "ref",
                   [REF, "bench", cmf_path(model, fmt), "--core", "--ignore-eos", "--ctx",
                    str(PROMPT), "--tokens", str(n), "--json"],
                   {"CMF_THREADS": str(THREADS), "RAYON_NUM_THREADS": str(THREADS)})
        c.slow = slow
        configs.append(c)
    for t in sorted({t for f in FORMATS for t in PEERS[f]}):
        g = ggufs.get((model, t))
        if g and probe_gguf and not any(n.startswith("llama-bench fails") for n in notes):
            if LLAMA_PREFILL:
                c = Config("llama", model, None, "llama",
                           llama_cmd(LB, g, LLAMA_FLAGS, 0, TOKENS), peer=t)
                lb, flags = LLAMA_PREFILL
                c.cmd_prefill = llama_cmd(lb, g, flags, f"{PROMPT},{LONG}", 0)
            else:
                c = Config("llama", model, None, "llama",
                           llama_cmd(LB, g, LLAMA_FLAGS, f"{PROMPT},{LONG}", TOKENS), peer=t)
            configs.append(c)
        # These builds have no AMX kernels: only the user's flags, whatever the main one needed.
        for level, lb in LEVEL_PEERS.items():
            if g and level in LEVELS:
                configs.append(Config("llama", model, None, "llama:" + level,
                                      llama_cmd(lb, g, E["LLAMA_ARGS"].split(), PROMPT, TOKENS),
                                      peer=t))


def parse(c, out):
    j = first_json(out)
    if c.kind == "llama":
        get = lambda pp, tg: next(r["avg_ts"] for r in j if r["n_prompt"] == pp and r["n_gen"] == tg)
        long = next((r["avg_ts"] for r in j if r["n_prompt"] == LONG and r["n_gen"] == 0), None)
        return {"decode": get(0, TOKENS), "prefill": get(PROMPT, 0), "prefill_long": long}, j
    if c.kind == "ref":
        return {"decode": j.get("decode_tok_s_steady") or j["decode_tok_s"],
                "prefill": j["prefill_tok_s"]}, j
    v = {"decode": j["decode_tok_s"], "prefill": j["prefill_tok_s"], "ttft": j["ttft_s"],
         "rss": j["peak_rss_bytes"], "rss_base": j.get("baseline_rss_bytes"), "allocs": j["allocs_per_token"],
         "wbpt": j["weight_bytes_per_token"], "bound": j["model_bytes"] + j["kv_bytes"],
         "weights_rss": j.get("weights_resident_bytes"), "anon_rss": j.get("rss_anon_bytes"),
         "precision": j["precision"], "kernel": j["kernel"], "tokens": j["decode_tokens"]}
    return v, j


t_start, loads = time.time(), []
for rnd in range(REPS):
    todo = [c for c in configs if not c.failed and (rnd == 0 or not c.slow)]
    log(f"round {rnd + 1}/{REPS}: {len(todo)} runs")
    for c in todo:
        load = os.getloadavg()[0]
        loads.append(load)
        bw = None
        if c.kind == "ours" and c.label == "default":
            bw = measure_bandwidth(rnd, keep=False, model=c.model, format=c.fmt, adjacent=True)
        rc, out, err, s = run(c.cmd, c.env)
        if rc == 0 and c.cmd_prefill:
            rc, out2, err, s2 = run(c.cmd_prefill, c.env)
            s += s2
            if rc == 0:
                out = json.dumps(first_json(out) + first_json(out2))
        cmd = c.cmd + (["&&"] + c.cmd_prefill if c.cmd_prefill else [])
        entry = dict(kind=c.kind, round=rnd, model=c.model, format=c.fmt, peer=c.peer,
                     config=c.label, cmd=cmd, env=c.env, seconds=round(s, 2), loadavg=load)
        try:
            if rc != 0:
                raise RuntimeError(why(rc, err))
            v, j = parse(c, out)
            c.runs.append(v)
            if c.kind == "ours" and c.label == "default":
                c.adjacent_bw.append(bw["read_bandwidth_bytes_s"] if bw else None)
            record(ok=True, json=j, **entry)
        except Exception as x:  # a refusal or a crash: the cell says so
            c.failed = str(x)
            record(ok=False, error=str(x), **entry)
            log(f"  {c.kind} {c.model} {c.fmt or c.peer} {c.label}: {x}")
    measure_bandwidth(rnd + 1)
log(f"rounds done in {time.time() - t_start:.0f} s")

ppl = {}
for model in MODELS:
    for fmt in FORMATS:
        if (model, fmt) not in default_precision:
            continue
        rc, out, err, _ = run([OURS, "ppl", cmf_path(model, fmt), "--text-file", passages[model],
                               "--threads", str(THREADS), "--json", "--no-verify"])
        if rc == 0:
            ppl[(model, fmt)] = first_json(out)["ppl"]
            record(kind="ppl", model=model, format=fmt, ppl=ppl[(model, fmt)])

# ---------------------------------------------------------------- tables
by = {c.key(): c for c in configs}


def adjacent_share(model, fmt):
    """Median over rounds of a default decode run's effective bandwidth against the DRAM
    probe run just before it (None without a probe)."""
    c = by.get(("ours", model, fmt, "default"))
    if c is None:
        return None
    shares = [r["wbpt"] * r["decode"] / bw for r, bw in zip(c.runs, c.adjacent_bw) if bw]
    return statistics.median(shares) if shares else None


def med(kind, model, what, label, field):
    c = by.get((kind, model, what, label))
    if c is None or not c.runs:
        return None, c.failed if c else None, False
    vals = [r[field] for r in c.runs if r.get(field) is not None]
    if not vals:
        return None, None, False
    return statistics.median(vals), None, len(c.runs) == 1 and REPS > 1


def cell(v, fmt="{:.1f}", one=False, failed=None):
    if v is None:
        return "—"
    return fmt.format(v) + ("¹" if one else "")


dram = statistics.median([b["read_bandwidth_bytes_s"] for b in bandwidths]) if bandwidths else None
l3 = statistics.median([b["l3_bandwidth_bytes_s"] for b in bandwidths]) if bandwidths else None
refused = []

print(f"threads {THREADS}; decode: up to {TOKENS} tokens after a {PROMPT}-token prompt "
      f"(fewer where a probe found it slow: the `tok` column); prefill of {PROMPT} and {LONG} "
      f"tokens; tok/s, medians of {REPS} interleaved rounds (¹ = one run: a slow "
      f"configuration, measured in the first round only); ratio = ours (default) / peer")
if dram:
    print(f"read bandwidth (`cortiq bench --bandwidth --threads {THREADS}`, median of "
          f"{len(bandwidths)}): DRAM {dram / 1e9:.1f} GB/s, L3 {l3 / 1e9:.1f} GB/s; "
          f"eff. GB/s = weight bytes per token × decode tok/s (% of DRAM: each run against the "
          f"DRAM probe run just before it, median over rounds)")
if loads:
    print(f"load average (1 min) before each run: median {statistics.median(loads):.1f}, max "
          f"{max(loads):.1f} on {os.cpu_count()} CPUs" + (
              " — other processes shared the CPUs: every figure is noisy, llama-bench's "
              "spinning threads suffer most (LLAMA_ARGS=\"--poll 0\" softens it)"
              if statistics.median(loads) > (os.cpu_count() or 1) + 0.5 else ""))
if LLAMA_FLAGS:
    print(f"llama-bench flags: {' '.join(LLAMA_FLAGS)}")
precs = sorted(set(default_precision.values()))
print(f"default: SIMD {DEFAULT_KERNEL}, precision {', '.join(precs)} (as `cortiq bench` reports "
      f"it); exact/balanced/fast \"=\" when that is the default")
for model in MODELS:
    if ref_ppl.get(model):
        print(f"{model}: perplexity of the fixture's passage by transformers (f32): {ref_ppl[model]}")
for n in notes:
    print(f"note: {n}")
for (model, t), n in sorted(gguf_notes.items()):
    print(f"note: llama.cpp {t} of {model}: {n}")
print()
print("| model | format | peer | tok | decode default | exact | balanced | fast | ref | llama.cpp | ÷llama | ÷ref "
      "| eff. GB/s (% DRAM) | prefill 64 | llama | ÷ | prefill 512 | llama | ÷ | TTFT ms 64/512 "
      "| peak RSS − before model = model's MiB (file+KV); of the peak, weights mapped in + heap | allocs/tok | ppl |")
print("|" + "---|" * 23)
for model in MODELS:
    for fmt in FORMATS:
        if (model, fmt) not in default_precision:
            print(f"| {model} | {fmt} | | | (our bench failed) |" + " |" * 18)
            continue
        prec = default_precision[(model, fmt)]
        d, _, d1 = med("ours", model, fmt, "default", "decode")
        p, _, p1 = med("ours", model, fmt, "default", "prefill")
        pl, _, pl1 = med("ours", model, fmt, "long", "prefill")
        tt, _, _ = med("ours", model, fmt, "default", "ttft")
        ttl, _, _ = med("ours", model, fmt, "long", "ttft")
        rss, _, _ = med("ours", model, fmt, "default", "rss")
        bound, _, _ = med("ours", model, fmt, "default", "bound")
        allocs, _, _ = med("ours", model, fmt, "default", "allocs")
        wbpt, _, _ = med("ours", model, fmt, "default", "wbpt")
        cols = {}
        for other in ("exact", "balanced", "fast"):
            if other == prec:
                cols[other] = "="
            else:
                v, _, one = med("ours", model, fmt, other, "decode")
                cols[other] = cell(v, one=one)
        rd, rfail, r1 = med("ref", model, fmt, "ref", "decode")
        if rfail:
            refused.append(f"reference CLI on {model} {fmt}: {rfail}")
        peers = PEERS[fmt]
        ld = [med("llama", model, t, "llama", "decode")[0] for t in peers]
        lp = [med("llama", model, t, "llama", "prefill")[0] for t in peers]
        lpl = [med("llama", model, t, "llama", "prefill_long")[0] for t in peers]
        slash = lambda xs: " / ".join(xs)
        ratio = lambda a, bs: slash(["—" if a is None or b is None else f"{a / b:.2f}" for b in bs])
        peer_names = slash([t + ("" if ggufs.get((model, t)) else " (none)") for t in peers])
        share = adjacent_share(model, fmt)
        eff = "—" if d is None or wbpt is None else (
            f"{wbpt * d / 1e9:.1f}" + (f" ({100 * share:.0f}%)" if share is not None else ""))
        base, _, _ = med("ours", model, fmt, "default", "rss_base")
        wrss, _, _ = med("ours", model, fmt, "default", "weights_rss")
        arss, _, _ = med("ours", model, fmt, "default", "anon_rss")
        if rss is None:
            rss_cell = "—"
        else:
            # The model's share: the peak less what the process held before it opened the
            # model (code, libraries), against the file plus the KV cache.
            own = rss - (base or 0)
            rss_cell = f"{rss / 2**20:.0f} − {(base or 0) / 2**20:.0f} = {own / 2**20:.0f} ({bound / 2**20:.0f})" + (
                " over" if own > bound else "")
            if wrss is not None and arss is not None:
                # What the peak holds: the weights mapped in (at most the file) and the
                # heap (KV, buffers, tokenizer); the rest is code and libraries.
                rss_cell += f"; weights {wrss / 2**20:.0f} + heap {arss / 2**20:.0f}"
        print(f"| {model} | {fmt} | {peer_names} | {tokens_of[(model, fmt)]} | "
              f"{cell(d, one=d1)} {prec} | {cols['exact']} | {cols['balanced']} | {cols['fast']} | {cell(rd, one=r1)} | "
              f"{slash([cell(x) for x in ld])} | {ratio(d, ld)} | {ratio(d, [rd])} | {eff} | "
              f"{cell(p, one=p1)} | {slash([cell(x) for x in lp])} | {ratio(p, lp)} | "
              f"{cell(pl, one=pl1)} | {slash([cell(x) for x in lpl])} | {ratio(pl, lpl)} | "
              f"{cell(tt and tt * 1e3, '{:.0f}')} / {cell(ttl and ttl * 1e3, '{:.0f}')} | {rss_cell} | "
              f"{cell(allocs, '{:.2f}')} | {cell(ppl.get((model, fmt)), '{:.3f}')} |")
for r in refused:
    print(f"note: {r}")

print()
print(f"Per SIMD level (CORTIQ_SIMD), default precision: decode tok/s / prefill {PROMPT} tok/s"
      + (f"; scalar only on {' '.join(SCALAR_MODELS)} × {' '.join(SCALAR_FORMATS)} (slow; "
         f"SCALAR_MODELS/SCALAR_FORMATS=all for every one)" if "scalar" in LEVELS else ""))
print()
peered = [l for l in LEVELS if l in LEVEL_PEERS]
print("| model | format | " + " | ".join(LEVELS) + " |" + (" peer |" if peered else "")
      + "".join(f" llama.cpp {l} decode | {l} ÷ | llama.cpp {l} prefill | {l} ÷ |" for l in peered))
print("|---|---|" + "---|" * (len(LEVELS) + (1 if peered else 0) + 4 * len(peered)))
for model in MODELS:
    for fmt in FORMATS:
        if (model, fmt) not in default_precision:
            continue
        cells = []
        for level in LEVELS:
            label = "default" if level == DEFAULT_KERNEL else "level:" + level
            d, failed, d1 = med("ours", model, fmt, label, "decode")
            p, _, _ = med("ours", model, fmt, label, "prefill")
            cells.append("—" if d is None else f"{cell(d, one=d1)} / {cell(p)}")
        row = f"| {model} | {fmt} | " + " | ".join(cells) + " |"
        peers = PEERS[fmt]
        if peered:
            row += f" {' / '.join(peers)} |"
        for level in peered:
            label = "default" if level == DEFAULT_KERNEL else "level:" + level
            d, _, _ = med("ours", model, fmt, label, "decode")
            p, _, _ = med("ours", model, fmt, label, "prefill")
            ld = [med("llama", model, t, "llama:" + level, "decode")[0] for t in peers]
            lp = [med("llama", model, t, "llama:" + level, "prefill")[0] for t in peers]
            rat = lambda a, bs: " / ".join("—" if a is None or b is None else f"{a / b:.2f}" for b in bs)
            row += (f" {' / '.join(cell(x) for x in ld)} | {rat(d, ld)} | "
                    f"{' / '.join(cell(x) for x in lp)} | {rat(p, lp)} |")
        print(row)
print()
print(f"raw JSON lines: {os.path.join(DIR, 'results.jsonl')}")
PY
