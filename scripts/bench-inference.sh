#!/usr/bin/env bash
# Inference speed side by side, in one run, 2 threads: this project's `cortiq bench`, the
# reference implementation's `cortiq bench --core` and llama.cpp's `llama-bench`, on
# SmolLM2-135M and Qwen2.5-Coder-0.5B at 8 and 4 bits. Prints one table with ratios.
#
#   scripts/bench-inference.sh            # PROMPT=128 TOKENS=64 THREADS=2 by default
#
# 8-bit = our/reference `q8_row` vs llama.cpp Q8_0; 4-bit = `q4_block` vs Q4_0 (both are
# 32-element groups with one f16 scale). Models are imported once into $BENCH_DIR.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
PROMPT="${PROMPT:-128}"
TOKENS="${TOKENS:-64}"
THREADS="${THREADS:-2}"
BENCH_DIR="${BENCH_DIR:-$HOME/.cache/cortiq-bench}"
mkdir -p "$BENCH_DIR"

mapfile -t PEERS < <(../shared/bench/peers.sh)
LLAMA_BENCH="${PEERS[0]}"; LLAMA_QUANTIZE="${PEERS[1]}"; REF="${PEERS[2]}"
bash ../shared/models/fetch.sh >/dev/null
MODELS="${CMF_MODELS:-$HOME/.cache/cmf-models}"
cargo build --release --quiet
OURS="$ROOT/target/release/cortiq"

declare -A SRC=(
  [smollm2-135m]="$MODELS/SmolLM2-135M-Instruct.Q4_1.gguf"
  [qwen2.5-coder-0.5b]="$MODELS/Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf"
)
declare -A CMF_Q=([8]=q8_row [4]=q4_block)
declare -A GGML_Q=([8]=Q8_0 [4]=Q4_0)

results="$BENCH_DIR/results.jsonl"
: > "$results"
for name in smollm2-135m qwen2.5-coder-0.5b; do
  for bits in 8 4; do
    cmf="$BENCH_DIR/$name-${CMF_Q[$bits]}.cmf"
    gguf="$BENCH_DIR/$name-${GGML_Q[$bits]}.gguf"
    [ -f "$cmf" ] || "$OURS" import-gguf "${SRC[$name]}" -o "$cmf" --quant "${CMF_Q[$bits]}" >/dev/null
    [ -f "$gguf" ] || "$LLAMA_QUANTIZE" --allow-requantize "${SRC[$name]}" "$gguf" "${GGML_Q[$bits]}" >/dev/null 2>&1
    echo "== $name ${bits}-bit" >&2
    ours=$("$OURS" bench "$cmf" --threads "$THREADS" --prompt-tokens "$PROMPT" --tokens "$TOKENS" --json)
    fast=$("$OURS" bench "$cmf" --threads "$THREADS" --prompt-tokens "$PROMPT" --tokens "$TOKENS" --json --precision fast)
    ref=$(CMF_THREADS="$THREADS" RAYON_NUM_THREADS="$THREADS" "$REF" bench "$cmf" --core --ignore-eos \
          --ctx "$PROMPT" --tokens "$TOKENS" --json 2>/dev/null)
    llama=$("$LLAMA_BENCH" -m "$gguf" -t "$THREADS" -p "$PROMPT" -n "$TOKENS" -r 3 -o json 2>/dev/null)
    python3 - "$name" "$bits" "$ours" "$ref" "$llama" "$fast" >> "$results" <<'PY'
import json, sys
name, bits, ours, ref, llama, fast = sys.argv[1], int(sys.argv[2]), *map(json.loads, sys.argv[3:])
pp = next(r for r in llama if r["n_prompt"] > 0)
tg = next(r for r in llama if r["n_gen"] > 0)
print(json.dumps({
    "model": name, "bits": bits,
    "ours_prefill": ours["prefill_tok_s"], "ours_decode": ours["decode_tok_s"],
    "ours_rss_mib": (ours["peak_rss_bytes"] or 0) / 2**20,
    "fast_prefill": fast["prefill_tok_s"], "fast_decode": fast["decode_tok_s"],
    "ref_prefill": ref["prefill_tok_s"],
    "ref_decode": ref.get("decode_tok_s_steady") or ref["decode_tok_s"],
    "llama_prefill": pp["avg_ts"], "llama_decode": tg["avg_ts"],
}))
PY
  done
done

python3 - "$results" "$THREADS" "$PROMPT" "$TOKENS" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print(f"threads {sys.argv[2]}, prompt {sys.argv[3]} tokens, decode {sys.argv[4]} tokens (tok/s; ratio = ours / peer)")
print()
print("ours = --precision exact (the default); fast = --precision fast (int8 activations)")
print()
print("| model | bits | decode ours | fast | ref | llama.cpp | ours/ref | fast/ref | ours/llama | fast/llama | prefill ours | fast | ref | llama.cpp | ours/ref | fast/ref | ours/llama | peak RSS MiB |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for r in rows:
    print(f"| {r['model']} | {r['bits']} | {r['ours_decode']:.1f} | {r['fast_decode']:.1f} | {r['ref_decode']:.1f} | {r['llama_decode']:.1f} | "
          f"{r['ours_decode']/r['ref_decode']:.2f} | {r['fast_decode']/r['ref_decode']:.2f} | "
          f"{r['ours_decode']/r['llama_decode']:.2f} | {r['fast_decode']/r['llama_decode']:.2f} | "
          f"{r['ours_prefill']:.1f} | {r['fast_prefill']:.1f} | {r['ref_prefill']:.1f} | {r['llama_prefill']:.1f} | "
          f"{r['ours_prefill']/r['ref_prefill']:.2f} | {r['fast_prefill']/r['ref_prefill']:.2f} | {r['ours_prefill']/r['llama_prefill']:.2f} | {r['ours_rss_mib']:.0f} |")
PY
