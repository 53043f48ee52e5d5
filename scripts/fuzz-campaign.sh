#!/usr/bin/env bash
# Fuzz campaigns: runs the cargo-fuzz targets of fuzz/ one after another (each on one core,
# RAYON_NUM_THREADS=1) from their kept corpora and prints a table of executions, speed and
# crashes per target, with the command that reproduces each row. A crash stops its target
# (libFuzzer's default): its input is in fuzz/artifacts/<target>/ and becomes a test in
# engine/tests/fuzz_regressions.rs.
#
# Knobs (environment):
#   TARGETS  the targets (default: all seven)
#   RUNS     executions per target (default 10000000)
#   SECS     stop a target after this many seconds as well (default: no limit)
#   MERGE=1  merge what a campaign found into fuzz/corpus/<target>, minimized (default: the
#            new inputs stay in a scratch directory, printed)
# Needs cargo-fuzz (`cargo install cargo-fuzz`); RUSTC_BOOTSTRAP=1 gives it the nightly
# features on the stable toolchain.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
export RUSTC_BOOTSTRAP=1 RAYON_NUM_THREADS=1
TARGETS="${TARGETS:-open_verify masks_skills quant_kernels import_gguf import_hf chat_template forward}"
RUNS="${RUNS:-10000000}"
# The importers write through temporary files: on tmpfs an fsync costs nothing.
if [ -d /dev/shm ] && [ -w /dev/shm ]; then export TMPDIR=/dev/shm; fi

declare -A MAX_LEN=(
  [open_verify]=131072 [masks_skills]=65536 [quant_kernels]=8192 [import_gguf]=16384
  [import_hf]=131072 [chat_template]=8192 [forward]=4096
)

command -v cargo-fuzz >/dev/null || { echo "cargo-fuzz is missing: cargo install cargo-fuzz" >&2; exit 2; }
cargo fuzz build -O >&2
BIN=target/x86_64-unknown-linux-gnu/release

rows=()
for t in $TARGETS; do
  [ -n "${MAX_LEN[$t]:-}" ] || { echo "unknown target $t" >&2; exit 2; }
  scratch="$(mktemp -d "${TMPDIR:-/tmp}/fuzz-$t.XXXXXX")"
  log="$scratch.log"
  mkdir -p "artifacts/$t"
  args=("$scratch" "corpus/$t" "-runs=$RUNS" "-max_len=${MAX_LEN[$t]}" -rss_limit_mb=2048
        -timeout=30 -print_final_stats=1 "-artifact_prefix=artifacts/$t/")
  [ -n "${SECS:-}" ] && args+=("-max_total_time=$SECS")
  echo "== $t: $BIN/$t ${args[*]}" >&2
  start=$(date +%s)
  if "$BIN/$t" "${args[@]}" >"$log" 2>&1; then verdict="0 crashes"; else
    verdict="CRASH: $(ls -t "artifacts/$t" | head -1) (see $log)"
  fi
  secs=$(( $(date +%s) - start ))
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  rows+=("| $t | ${execs:-?} | ${rate:-?}/s | ${secs}s | $verdict |")
  if [ "${MERGE:-0}" = 1 ]; then
    "$BIN/$t" -merge=1 "corpus/$t" "$scratch" "-max_len=${MAX_LEN[$t]}" >>"$log" 2>&1
    rm -rf "$scratch"
  else
    echo "new inputs of $t: $scratch ($(ls "$scratch" | wc -l) files)" >&2
  fi
done
echo "| target | executions | speed | time | result |"
echo "|---|---|---|---|---|"
printf '%s\n' "${rows[@]}"
