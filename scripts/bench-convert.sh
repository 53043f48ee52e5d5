#!/usr/bin/env bash
# Conversion side by side with the reference CLI, on the same inputs: wall time (hyperfine)
# and peak RSS (/usr/bin/time -v), with ratios.
#   - `convert` of a synthetic ~400 MB f16 llama checkpoint (scripts/make_hf_checkpoint.py), --quant q8
#   - `import-gguf` of the real models of ../shared/models/fetch.sh, when present, --quant q8
set -euo pipefail
cd "$(dirname "$0")/.."
PEERS="${CMF_PEERS:-$HOME/.cache/cmf-peers}"; REF="$PEERS/bin/cortiq"
MODELS="${CMF_MODELS:-$HOME/.cache/cmf-models}"
[ -x "$REF" ] || { echo "the reference CLI is missing: run ../shared/bench/peers.sh" >&2; exit 2; }
command -v hyperfine >/dev/null || { echo "needs hyperfine (apt-get install -y hyperfine)" >&2; exit 2; }
[ -x /usr/bin/time ] || { echo "needs GNU time (apt-get install -y time)" >&2; exit 2; }
cargo build --release --quiet
OURS="$PWD/target/release/cortiq"
DATA="${BENCH_DIR:-$PWD/target/bench-data}"; mkdir -p "$DATA"
HF="$DATA/hf-llama-1024x16"
[ -f "$HF/model.safetensors" ] || python3 scripts/make_hf_checkpoint.py "$HF" 1024 16 >&2

rss_mb() { # command... → peak RSS in MiB
  /usr/bin/time -v "$@" 2>&1 >/dev/null | awk -F: '/Maximum resident set size/ {printf "%.0f", $2/1024}'
}

compare() { # label, ours-cmd, ref-cmd, input-bytes
  hyperfine --style basic --warmup 1 --runs 3 --export-json "$DATA/$1.json" -n ours "$2" -n reference "$3" >&2
  local ro rr; ro=$(rss_mb sh -c "$2"); rr=$(rss_mb sh -c "$3")
  python3 - "$DATA/$1.json" "$1" "$ro" "$rr" "$4" <<'PY'
import json, sys
r = {x["command"]: x for x in json.load(open(sys.argv[1]))["results"]}
o, f = r["ours"]["mean"], r["reference"]["mean"]
ro, rr, size = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
print(f"{sys.argv[2]:<34} time ours {o:7.2f} s  reference {f:7.2f} s  reference/ours {f/o:5.2f}x   "
      f"peak RSS ours {ro} MiB  reference {rr} MiB  (input {size/2**20:.0f} MiB)")
PY
}

echo "== $(nproc) cores"
compare "convert llama-1024x16 f16 -> q8" \
  "$OURS convert --model $HF --quant q8 -o $DATA/ours-conv.cmf --json" \
  "$REF convert --model $HF --quant q8 --output $DATA/ref-conv.cmf" \
  "$(stat -c %s "$HF/model.safetensors")"
for g in SmolLM2-135M-Instruct.Q4_1.gguf Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf; do
  if [ -f "$MODELS/$g" ]; then
    compare "import-gguf $g -> q8" \
      "$OURS import-gguf $MODELS/$g --quant q8 -o $DATA/ours-gguf.cmf --json" \
      "$REF import-gguf $MODELS/$g --quant q8 --output $DATA/ref-gguf.cmf" \
      "$(stat -c %s "$MODELS/$g")"
  else
    echo "import-gguf $g: not fetched (../shared/models/fetch.sh)"
  fi
done
