#!/usr/bin/env bash
# Mixture-of-Experts inference side by side with llama.cpp, 2 threads, on a synthetic
# Qwen3-MoE checkpoint (128 experts, top-8, random weights):
#
#   scripts/bench-moe.sh            # full size: 24 layers, hidden 1024, experts 512 wide:
#                                   #   4.8 G parameters, ~5 GB at 8 bits (~45-60 min the first time)
#   scripts/bench-moe.sh --small    # 4 layers, hidden 512, experts 256 wide: ~200 MB at 8 bits (minutes)
#
# 1. scripts/make_moe_checkpoint.py writes the Hugging Face checkpoint (f16 safetensors);
# 2. `cortiq convert` makes CMF q8 (q8_row) and q4 (q4_block); llama.cpp's own
#    convert_hf_to_gguf.py (from the llama-cpp-python 0.3.36 sdist, with its gguf-py) makes
#    an f16 GGUF, llama-quantize (../shared/bench/peers.sh) Q8_0 and Q4_0 from it;
# 3. measures, interleaved round by round (the machine is noisy): `cortiq bench` (exact and
#    fast precision) vs `llama-bench` — prefill PROMPT tokens, decode TOKENS tokens; then
#    peak RSS after N decoded tokens (N in RSS_TOKENS) against the file size, page cache
#    dropped before every run, with the share of (layer, expert) pairs the tokens touched
#    (`cortiq run --route-stats`);
# 4. writes $CMF_BENCH/<size>/results.json and results.md and prints the table.
#
# Cache: ${CMF_BENCH:-$HOME/.cache/cmf-bench} (checkpoint, CMF, GGUF, llama.cpp converter,
# a snapshot of the cortiq binary). Idempotent: every product is reused when present.
# Knobs (environment): ROUNDS=5 (interleaved rounds; medians over them) REPEAT=3 (measurements
#   per tool call: cortiq bench --repeat, llama-bench -r) PROMPT=64 TOKENS=64 THREADS=2
#   BITS="8 4" RSS_BITS=8 RSS_TOKENS="1 16 64 256" PRECISIONS="balanced exact fast" NICE=10 CORTIQ=path/to/cortiq
#   KEEP_F16_GGUF=1 (else the f16 GGUF is deleted once quantized) SKIP_RSS=1 SKIP_SPEED=1
#   LLAMA_BENCH=path LLAMA_ARGS="--repack 0" LLAMA_ENV="OMP_WAIT_POLICY=passive" (see below)
#   TAG=name (a separate raw/results set)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"

SIZE=full
case "${1:-}" in
  --small) SIZE=small ;;
  --full | "") ;;
  *) echo "usage: scripts/bench-moe.sh [--small|--full]" >&2; exit 2 ;;
esac
CMF_BENCH="${CMF_BENCH:-$HOME/.cache/cmf-bench}"
ROUNDS="${ROUNDS:-5}"
# Three, so that cortiq's median is a warm pass as llama-bench's are (it warms up first):
# a MoE model's first prefill after load runs ~1.4x slower (page faults), and at one
# measurement the table compared that cold pass with llama.cpp's warm one.
REPEAT="${REPEAT:-3}"
PROMPT="${PROMPT:-64}"
TOKENS="${TOKENS:-64}"
THREADS="${THREADS:-2}"
BITS="${BITS:-8 4}"
RSS_TOKENS="${RSS_TOKENS:-1 16 64 256}"
RSS_BITS="${RSS_BITS:-8}"
PRECISIONS="${PRECISIONS:-balanced exact fast}"
N="nice -n ${NICE:-10}"
if [ "$SIZE" = small ]; then
  SHAPE=(--hidden 512 --layers 4 --moe-inter 256 --heads 8 --kv-heads 2 --head-dim 64)
else
  SHAPE=(--hidden 1024 --layers 24 --moe-inter 512 --heads 16 --kv-heads 4 --head-dim 64)
fi
SHAPE+=(--experts 128 --top-k 8)
W="$CMF_BENCH/moe-$SIZE"
mkdir -p "$W" "$CMF_BENCH/src" "$CMF_BENCH/bin"
log() { echo "[bench-moe $(date +%H:%M:%S)] $*" >&2; }

# ---- tools -------------------------------------------------------------------------------
pip_user() { $N python3 -m pip install --user --quiet "$@" >&2; }
[ -x /usr/bin/time ] || { apt-get update -qq && apt-get install -y -qq time; } >&2
python3 -c "import numpy, safetensors" 2>/dev/null || pip_user numpy safetensors

mapfile -t PEERS < <(bash ../shared/bench/peers.sh)
LLAMA_BENCH="${LLAMA_BENCH:-${PEERS[0]}}"; LLAMA_QUANTIZE="${PEERS[1]}"
# peers.sh builds with GGML_NATIVE=ON: on a CPU that reports AMX (Sapphire Rapids and later)
# ggml puts Q4_0/Q8_0 matrices in its AMX buffer, and where the VM does not let the process
# use the tiles llama-bench dies of SIGILL (tileloadd) at the first product. `--repack 0`
# turns the extra buffer types (AMX and the CPU repacking) off; LLAMA_ARGS="" with
# LLAMA_BENCH= a build without AMX (cmake ... -DCMAKE_C[XX]_FLAGS=-mno-amx-tile) keeps the
# repacking.
LLAMA_ARGS="${LLAMA_ARGS---repack 0}"
# llama.cpp's CPU backend is built with OpenMP here: its threads meet at a barrier after
# every graph node and spin while they wait (OMP_WAIT_POLICY=active behaviour). On a machine
# where other work holds a core, a spinning thread keeps the one it waits for off the CPU and
# decoding slows several times; LLAMA_ENV="OMP_WAIT_POLICY=passive" makes them sleep instead.
LLAMA_ENV="${LLAMA_ENV:-}"

# llama.cpp's converter: the vendor tree of the same sdist peers.sh builds from.
LCPP_VER=0.3.36
VENDOR="$CMF_BENCH/src/llama_cpp_python-$LCPP_VER/vendor/llama.cpp"
if [ ! -f "$VENDOR/convert_hf_to_gguf.py" ]; then
  [ -f "$CMF_BENCH/src/llama_cpp_python-$LCPP_VER.tar.gz" ] ||
    python3 -m pip download --quiet --no-deps --no-binary :all: -d "$CMF_BENCH/src" \
      "llama-cpp-python==$LCPP_VER" >&2
  tar -xzf "$CMF_BENCH/src/llama_cpp_python-$LCPP_VER.tar.gz" -C "$CMF_BENCH/src" \
    "llama_cpp_python-$LCPP_VER/vendor/llama.cpp/convert_hf_to_gguf.py" \
    "llama_cpp_python-$LCPP_VER/vendor/llama.cpp/conversion" \
    "llama_cpp_python-$LCPP_VER/vendor/llama.cpp/gguf-py" \
    "llama_cpp_python-$LCPP_VER/vendor/llama.cpp/requirements"
fi
need_convert_deps() { ! python3 -c "import torch, transformers, sentencepiece, google.protobuf" 2>/dev/null; }

# cortiq: built here, then snapshotted so a rebuild by someone else mid-run changes nothing.
if [ -z "${CORTIQ:-}" ]; then
  $N cargo build --release --quiet
  rev="$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- engine src Cargo.toml Cargo.lock || echo -dirty)"
  CORTIQ="$CMF_BENCH/bin/cortiq-$rev"
  cp target/release/cortiq "$CORTIQ.tmp" && mv "$CORTIQ.tmp" "$CORTIQ"
fi
CORTIQ_VERSION="$("$CORTIQ" --version 2>/dev/null || echo cortiq) ($(basename "$CORTIQ"))"

# ---- 1. checkpoint -----------------------------------------------------------------------
# Only while a conversion is missing: once every file exists the checkpoint (9.8 GB at full
# size) may be deleted; its config.json is kept beside the results.
HF="$W/hf"
need_ckpt=0
for b in $BITS; do
  case $b in 8) q=q8 g=Q8_0 ;; 4) q=q4 g=Q4_0 ;; *) echo "BITS: 8 and/or 4" >&2; exit 2 ;; esac
  [ -f "$W/moe-$q.cmf" ] && [ -f "$W/moe-$g.gguf" ] || need_ckpt=1
done
if [ "$need_ckpt" = 1 ] || [ ! -f "$W/config.json" ]; then
  log "checkpoint $HF (${SHAPE[*]})"
  $N python3 scripts/make_moe_checkpoint.py "$HF" "${SHAPE[@]}" >&2
  cp "$HF/config.json" "$W/config.json"
fi

# ---- 2. conversions ----------------------------------------------------------------------
declare -A CMF_Q=([8]=q8 [4]=q4) GGML_Q=([8]=Q8_0 [4]=Q4_0)
declare -A CMF_FILE GGUF_FILE
for b in $BITS; do
  CMF_FILE[$b]="$W/moe-${CMF_Q[$b]}.cmf"
  GGUF_FILE[$b]="$W/moe-${GGML_Q[$b]}.gguf"
  if [ ! -f "${CMF_FILE[$b]}" ]; then
    log "cortiq convert --quant ${CMF_Q[$b]}"
    /usr/bin/time -f "%e s, max RSS %M KiB" -o "$W/convert-${CMF_Q[$b]}.time" \
      $N "$CORTIQ" convert --model "$HF" --quant "${CMF_Q[$b]}" -o "${CMF_FILE[$b]}.tmp" --json \
      > "$W/convert-${CMF_Q[$b]}.json"
    mv "${CMF_FILE[$b]}.tmp" "${CMF_FILE[$b]}"
  fi
done
F16="$W/moe-f16.gguf"
missing_gguf=0
for b in $BITS; do [ -f "${GGUF_FILE[$b]}" ] || missing_gguf=1; done
if [ "$missing_gguf" = 1 ]; then
  if [ ! -f "$F16" ]; then
    if need_convert_deps; then
      # PyPI's torch wheel (the CUDA build, ~4 GB with its nvidia-* dependencies; it runs on
      # the CPU: PyTorch's own CPU-only wheel index is out of reach here); transformers for
      # the tokenizer. Versions as the vendor tree's requirements-convert_*.txt pin them.
      log "installing convert_hf_to_gguf.py's requirements (torch, transformers, sentencepiece)"
      pip_user "torch==2.11.0"
      pip_user "transformers==4.57.6" "sentencepiece>=0.1.98,<0.3.0" "protobuf>=4.21.0,<5.0.0"
    fi
    log "convert_hf_to_gguf.py --outtype f16"
    # The fixture tokenizer (plain byte-level BPE, GPT-2 split regex, vocab 512) is no model
    # the converter knows by its hash: name its pre-tokenizer "gpt-2" instead of failing.
    /usr/bin/time -f "%e s, max RSS %M KiB" -o "$W/convert-gguf-f16.time" \
    $N python3 - "$VENDOR" "$HF" "$F16.tmp" > "$W/convert-gguf-f16.log" 2>&1 <<'PY' || { tail -30 "$W/convert-gguf-f16.log" >&2; exit 1; }
import runpy, sys
vendor, hf, out = sys.argv[1:]
sys.path[:0] = [vendor, vendor + "/gguf-py"]
import conversion.base as base
orig = base.TextModel.get_vocab_base_pre
def pre(self, tokenizer):
    try:
        return orig(self, tokenizer)
    except NotImplementedError:
        return "gpt-2"
base.TextModel.get_vocab_base_pre = pre
sys.argv = ["convert_hf_to_gguf.py", hf, "--outtype", "f16", "--outfile", out]
runpy.run_path(vendor + "/convert_hf_to_gguf.py", run_name="__main__")
PY
    mv "$F16.tmp" "$F16"
  fi
  for b in $BITS; do
    if [ ! -f "${GGUF_FILE[$b]}" ]; then
      log "llama-quantize ${GGML_Q[$b]}"
      # The override also fixes an f16 GGUF written before the wrapper above said "gpt-2".
      /usr/bin/time -f "%e s, max RSS %M KiB" -o "$W/quantize-${GGML_Q[$b]}.time" \
        $N "$LLAMA_QUANTIZE" --override-kv tokenizer.ggml.pre=str:gpt-2 \
          "$F16" "${GGUF_FILE[$b]}.tmp" "${GGML_Q[$b]}" "$THREADS" \
        > "$W/quantize-${GGML_Q[$b]}.log" 2>&1
      mv "${GGUF_FILE[$b]}.tmp" "${GGUF_FILE[$b]}"
    fi
  done
  [ "${KEEP_F16_GGUF:-0}" = 1 ] || rm -f "$F16"
fi

# ---- 3. measurements ---------------------------------------------------------------------
TAG="${TAG:+-$TAG}"   # TAG=x: raw-x.jsonl, results-x.{json,md} (a second configuration beside the first)
RAW="$W/raw$TAG.jsonl"
drop_caches() { sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true; }
can_drop=false
if sync && echo 3 > /proc/sys/vm/drop_caches 2>/dev/null; then can_drop=true; fi
# One raw row: the two JSON objects merged, with the 1-minute load average at the end of the run.
rec() { python3 -c 'import json,os,sys; print(json.dumps(dict(json.loads(sys.argv[1]), **json.loads(sys.argv[2]), load1=os.getloadavg()[0])))' "$1" "$2" >> "$RAW"; }

if [ "${SKIP_SPEED:-0}" != 1 ]; then
  grep -v '"kind": "speed"' "$RAW" > "$RAW.tmp" 2>/dev/null || true; mv -f "$RAW.tmp" "$RAW" 2>/dev/null || :
  for r in $(seq 1 "$ROUNDS"); do
    for b in $BITS; do
      # Alternate who goes first from round to round.
      order="cortiq llama"; [ $((r % 2)) = 0 ] && order="llama cortiq"
      for who in $order; do
        if [ "$who" = cortiq ]; then
          for p in $PRECISIONS; do
            log "round $r/$ROUNDS ${b}-bit cortiq $p"
            out=$($N "$CORTIQ" bench "${CMF_FILE[$b]}" --threads "$THREADS" --prompt-tokens "$PROMPT" \
                  --tokens "$TOKENS" --repeat "$REPEAT" --precision "$p" --json)
            rec "{\"kind\": \"speed\", \"tool\": \"cortiq-$p\", \"bits\": $b, \"round\": $r}" \
                "$(python3 -c 'import json,sys; d=json.loads(sys.argv[1]); print(json.dumps({"prefill": d["prefill_tok_s"], "decode": d["decode_tok_s"], "rss": d["peak_rss_bytes"], "load_s": d["load_s"]}))' "$out")"
          done
        else
          log "round $r/$ROUNDS ${b}-bit llama-bench"
          out=$(env $LLAMA_ENV $N "$LLAMA_BENCH" -m "${GGUF_FILE[$b]}" -t "$THREADS" $LLAMA_ARGS -p "$PROMPT" -n "$TOKENS" -r "$REPEAT" -o json 2>/dev/null)
          rec "{\"kind\": \"speed\", \"tool\": \"llama\", \"bits\": $b, \"round\": $r}" \
              "$(python3 -c 'import json,sys; d=json.loads(sys.argv[1]); pp=next(x for x in d if x["n_prompt"]>0); tg=next(x for x in d if x["n_gen"]>0); print(json.dumps({"prefill": pp["avg_ts"], "decode": tg["avg_ts"], "build": d[0].get("build_commit"), "cpu": d[0].get("cpu_info")}))' "$out")"
        fi
      done
    done
  done
fi

# The first prompt token of `cortiq bench` (its xorshift), for the route count of the same run.
FIRST_ID=$(python3 -c 'M=(1<<64)-1; s=0x9E3779B97F4A7C15; s^=(s<<13)&M; s^=s>>7; s^=(s<<17)&M; print(s%512)')
maxrss() { awk -F': ' '/Maximum resident set size/ {printf "%.0f\n", $2 * 1024}' "$1"; }
if [ "${SKIP_RSS:-0}" != 1 ]; then
  grep -v '"kind": "rss"' "$RAW" > "$RAW.tmp" 2>/dev/null || true; mv -f "$RAW.tmp" "$RAW" 2>/dev/null || :
  for b in $RSS_BITS; do
    for n in $RSS_TOKENS; do
      # cortiq without the load-time hash check (it reads every page of the file, so the
      # peak RSS would be the file); one prompt token, n decoded, one repetition.
      drop_caches
      log "RSS ${b}-bit cortiq --tokens $n"
      out=$(/usr/bin/time -v -o "$W/time.txt" $N "$CORTIQ" bench "${CMF_FILE[$b]}" --no-verify --threads "$THREADS" \
            --prompt-tokens 1 --tokens "$n" --repeat 1 --json)
      $N "$CORTIQ" run "${CMF_FILE[$b]}" --no-verify --threads "$THREADS" --ids "$FIRST_ID" --greedy \
        --max-tokens "$((n + 1))" --route-stats "$W/routes.json" --json > /dev/null
      touched=$(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); c=[x>0 for l in d["layers"] for x in l["counts"]]; print(json.dumps({"experts_touched": sum(c)/len(c), "routed_positions": d["tokens"]}))' "$W/routes.json")
      rec "{\"kind\": \"rss\", \"tool\": \"cortiq\", \"bits\": $b, \"tokens\": $n, \"verify\": false, \"cold_cache\": $can_drop}" \
          "$(python3 -c 'import json,sys; d=json.loads(sys.argv[1]); print(json.dumps(dict(json.loads(sys.argv[3]), rss=d["peak_rss_bytes"], time_rss=int(sys.argv[2]), decode=d["decode_tok_s"], file_bytes=d["model_bytes"])))' "$out" "$(maxrss "$W/time.txt")" "$touched")"
      drop_caches
      log "RSS ${b}-bit llama-bench -n $n"
      out=$(/usr/bin/time -v -o "$W/time.txt" env $LLAMA_ENV $N "$LLAMA_BENCH" -m "${GGUF_FILE[$b]}" -t "$THREADS" $LLAMA_ARGS -p 0 -n "$n" -r 1 -o json 2>/dev/null)
      rec "{\"kind\": \"rss\", \"tool\": \"llama\", \"bits\": $b, \"tokens\": $n, \"cold_cache\": $can_drop}" \
          "$(python3 -c 'import json,os,sys; d=json.loads(sys.argv[1]); print(json.dumps({"time_rss": int(sys.argv[2]), "rss": int(sys.argv[2]), "decode": d[0]["avg_ts"], "file_bytes": os.path.getsize(sys.argv[3])}))' "$out" "$(maxrss "$W/time.txt")" "${GGUF_FILE[$b]}")"
    done
    # cortiq's default load (hash chain checked) once, for comparison.
    drop_caches
    n=$(echo $RSS_TOKENS | awk '{print $1}')
    log "RSS ${b}-bit cortiq (verified load) --tokens $n"
    out=$($N "$CORTIQ" bench "${CMF_FILE[$b]}" --threads "$THREADS" --prompt-tokens 1 --tokens "$n" --repeat 1 --json)
    rec "{\"kind\": \"rss\", \"tool\": \"cortiq\", \"bits\": $b, \"tokens\": $n, \"verify\": true, \"cold_cache\": $can_drop}" \
        "$(python3 -c 'import json,sys; d=json.loads(sys.argv[1]); print(json.dumps({"rss": d["peak_rss_bytes"], "decode": d["decode_tok_s"], "file_bytes": d["model_bytes"]}))' "$out")"
  done
fi

# ---- 4. report ---------------------------------------------------------------------------
[ -s "$RAW" ] || { log "nothing measured yet (SKIP_SPEED=1 SKIP_RSS=1): the files are ready in $W"; exit 0; }
python3 - "$RAW" "$W" "$SIZE" "$HF" "$THREADS" "$PROMPT" "$TOKENS" "$CORTIQ_VERSION" "$LCPP_VER" "$LLAMA_ENV $LLAMA_BENCH $LLAMA_ARGS" "$TAG" <<'PY'
import json, os, statistics, sys, glob, platform
raw, w, size, hf, threads, prompt, tokens, cortiq_version, lcpp, llama_cmd, tag = sys.argv[1:]
rows = [json.loads(l) for l in open(raw) if l.strip()]
cfg = json.load(open(os.path.join(w, "config.json")))
med = lambda xs: statistics.median(xs) if xs else None
files = {os.path.basename(p): os.path.getsize(p) for p in sorted(glob.glob(os.path.join(w, "moe-*.cmf")) + glob.glob(os.path.join(w, "moe-*.gguf")))}
ckpt = sum(os.path.getsize(p) for p in glob.glob(os.path.join(hf, "*.safetensors"))) or None
times = {}
for p in glob.glob(os.path.join(w, "*.time")):
    times[os.path.basename(p)[:-5]] = open(p).read().strip().splitlines()[-1]
llama_build = next((r.get("build") for r in rows if r.get("tool") == "llama" and r.get("build")), None)
cpu = next((r.get("cpu") for r in rows if r.get("tool") == "llama" and r.get("cpu")), platform.processor())

speed = {}
for r in rows:
    if r["kind"] == "speed":
        speed.setdefault((r["bits"], r["tool"]), []).append(r)
summary = []
for bits in sorted({b for b, _ in speed}, reverse=True):
    ll = speed.get((bits, "llama"), [])
    lp, ld = med([x["prefill"] for x in ll]), med([x["decode"] for x in ll])
    for tool in sorted(t for b, t in speed if b == bits and t != "llama"):
        xs = speed[(bits, tool)]
        p, d = med([x["prefill"] for x in xs]), med([x["decode"] for x in xs])
        summary.append({"bits": bits, "tool": tool, "rounds": len(xs),
                        "decode": d, "decode_min": min(x["decode"] for x in xs), "decode_max": max(x["decode"] for x in xs),
                        "prefill": p, "prefill_min": min(x["prefill"] for x in xs), "prefill_max": max(x["prefill"] for x in xs),
                        "llama_decode": ld, "llama_prefill": lp,
                        "llama_decode_min": min((x["decode"] for x in ll), default=None), "llama_decode_max": max((x["decode"] for x in ll), default=None),
                        "llama_prefill_min": min((x["prefill"] for x in ll), default=None), "llama_prefill_max": max((x["prefill"] for x in ll), default=None),
                        "decode_ratio": d / ld if ld else None, "prefill_ratio": p / lp if lp else None})
rss = [r for r in rows if r["kind"] == "rss"]
result = {
    "size": size,
    "model": {k: cfg[k] for k in ["num_hidden_layers", "hidden_size", "moe_intermediate_size", "num_experts", "num_experts_per_tok",
                                  "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size", "norm_topk_prob"]},
    "checkpoint_bytes": ckpt, "files": files, "convert_times": times,
    "threads": int(threads), "prompt_tokens": int(prompt), "decode_tokens": int(tokens),
    "cortiq": cortiq_version, "llama_cpp": f"llama-cpp-python {lcpp} vendor tree, build {llama_build}", "llama_bench": llama_cmd, "cpu": cpu,
    "speed": summary, "rss": rss,
}
json.dump(result, open(os.path.join(w, f"results{tag}.json"), "w"), indent=1)

m = result["model"]
out = []
P = out.append
P(f"MoE benchmark ({size}): qwen3_moe, {m['num_hidden_layers']} layers, hidden {m['hidden_size']}, {m['num_experts']} experts x {m['moe_intermediate_size']}, top-{m['num_experts_per_tok']}; "
  f"{threads} threads, prefill {prompt} tokens, decode {tokens} tokens")
P(f"cortiq: {cortiq_version}; llama.cpp: {result['llama_cpp']} ({llama_cmd}); CPU: {cpu}")
P("")
P("Files: " + ", ".join(f"{k} {v / 1e9:.3f} GB" for k, v in files.items()) + (f"; checkpoint (f16) {ckpt / 1e9:.3f} GB" if ckpt else ""))
if times:
    P("Conversion: " + "; ".join(f"{k} {v}" for k, v in sorted(times.items())))
P("")
P("Speed, tok/s: median over rounds [min-max]; ratio = cortiq / llama.cpp (>1: cortiq faster)")
P("")
P("| bits | cortiq | rounds | decode cortiq | decode llama.cpp | decode ratio | prefill cortiq | prefill llama.cpp | prefill ratio |")
P("|---|---|---|---|---|---|---|---|---|")
f = lambda v: "-" if v is None else f"{v:.1f}"
for s in summary:
    P(f"| {s['bits']} | {s['tool'].replace('cortiq-', '')} | {s['rounds']} | {f(s['decode'])} [{f(s['decode_min'])}-{f(s['decode_max'])}] | "
      f"{f(s['llama_decode'])} [{f(s['llama_decode_min'])}-{f(s['llama_decode_max'])}] | {s['decode_ratio']:.2f} | "
      f"{f(s['prefill'])} [{f(s['prefill_min'])}-{f(s['prefill_max'])}] | {f(s['llama_prefill'])} [{f(s['llama_prefill_min'])}-{f(s['llama_prefill_max'])}] | {s['prefill_ratio']:.2f} |")
if rss:
    P("")
    P("Peak RSS after N decoded tokens (1 prompt token; page cache dropped before each run: "
      f"{'yes' if all(r.get('cold_cache') for r in rss) else 'no'}); % = of the file; "
      "experts touched = share of (layer, expert) pairs routed to at least once (cortiq run --route-stats, same first token)")
    P("")
    P("| bits | N | cortiq MiB | % file | experts touched | llama.cpp MiB | % file |")
    P("|---|---|---|---|---|---|---|")
    for bits in sorted({r["bits"] for r in rss}, reverse=True):
        for n in sorted({r["tokens"] for r in rss if r["bits"] == bits}):
            c = next((r for r in rss if r["bits"] == bits and r["tokens"] == n and r["tool"] == "cortiq" and not r.get("verify")), None)
            l = next((r for r in rss if r["bits"] == bits and r["tokens"] == n and r["tool"] == "llama"), None)
            cells = [str(bits), str(n)]
            cells += [f"{c['rss'] / 2**20:.0f}", f"{100 * c['rss'] / c['file_bytes']:.0f}%", f"{100 * c['experts_touched']:.0f}%"] if c else ["-"] * 3
            cells += [f"{l['rss'] / 2**20:.0f}", f"{100 * l['rss'] / l['file_bytes']:.0f}%"] if l else ["-"] * 2
            P("| " + " | ".join(cells) + " |")
        for r in rss:
            if r["bits"] == bits and r.get("verify"):
                P(f"| {bits} | {r['tokens']} (verified load) | {r['rss'] / 2**20:.0f} | {100 * r['rss'] / r['file_bytes']:.0f}% | | | |")
    P("")
    P("File sizes: " + ", ".join(f"{k} {v / 2**20:.0f} MiB" for k, v in files.items()))
text = "\n".join(out) + "\n"
open(os.path.join(w, f"results{tag}.md"), "w").write(text)
print(text)
print(f"(results: {os.path.join(w, f'results{tag}.json')}, {os.path.join(w, f'results{tag}.md')})")
PY
