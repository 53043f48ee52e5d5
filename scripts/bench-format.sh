#!/usr/bin/env bash
# Open and verify, side by side with the reference CLI on the same ~500 MB file (page cache
# warm), with hyperfine. Prints each tool's mean and the ratio reference/ours.
#   scripts/bench-format.sh [DIM] [LAYERS]      (default 2048 17 ≈ 500 MB)
set -euo pipefail
cd "$(dirname "$0")/.."
DIM="${1:-2048}"; LAYERS="${2:-17}"
PEERS="${CMF_PEERS:-$HOME/.cache/cmf-peers}"
REF="$PEERS/bin/cortiq"
[ -x "$REF" ] || { echo "the reference CLI is missing: run ../shared/bench/peers.sh" >&2; exit 2; }
command -v hyperfine >/dev/null || { echo "needs hyperfine (apt-get install -y hyperfine)" >&2; exit 2; }
cargo build --release --quiet
cargo build --release --quiet -p cortiq-engine --example bench_file
OURS="$PWD/target/release/cortiq"
DATA="${BENCH_DIR:-$PWD/target/bench-data}"; mkdir -p "$DATA"
FILE="$DATA/bench-${DIM}x${LAYERS}.cmf"
[ -f "$FILE" ] || target/release/examples/bench_file "$FILE" "$DIM" "$LAYERS"
ls -l "$FILE"
cat "$FILE" > /dev/null   # warm the page cache: we measure the tools, not the disk

run() { # name, ours-cmd, ref-cmd
  hyperfine --style basic --warmup 3 --min-runs 10 --export-json "$DATA/$1.json" -n ours "$2" -n reference "$3" >&2
  python3 - "$DATA/$1.json" "$1" "$(stat -c %s "$FILE")" <<'PY'
import json, sys
r = {x["command"]: x for x in json.load(open(sys.argv[1]))["results"]}
o, f, size = r["ours"]["mean"], r["reference"]["mean"], int(sys.argv[3])
rate = f"   ours {size/o/1e9:6.2f} GB/s" if sys.argv[2] == "verify" else ""
print(f"{sys.argv[2]:<8} ours {o*1e3:9.2f} ms   reference {f*1e3:9.2f} ms   reference/ours {f/o:6.2f}x{rate}")
PY
}
echo "== $(nproc) cores, file $(du -h "$FILE" | cut -f1)"
run open   "$OURS info $FILE --json"              "$REF info $FILE"
run verify "$OURS verify $FILE --no-signature"    "$REF verify $FILE"
# The bandwidth a single reader gets from the page cache, for scale.
hyperfine --style basic --warmup 3 --min-runs 10 --export-json "$DATA/cat.json" -n cat "cat $FILE" >&2
python3 - "$DATA/cat.json" "$(stat -c %s "$FILE")" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))["results"][0]["mean"]
print(f"cat      {m*1e3:9.2f} ms   page-cache read {int(sys.argv[2])/m/1e9:6.2f} GB/s (one reader)")
PY
