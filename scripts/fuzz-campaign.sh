#!/usr/bin/env bash
# Fuzz campaigns: runs the cargo-fuzz targets of fuzz/ one after another (each on one core,
# RAYON_NUM_THREADS=1) from their kept corpora and prints a table of executions, speed and
# crashes per target, with the command that reproduces each row. A crash stops its target
# (libFuzzer's default): its input is in fuzz/artifacts/<target>/ and becomes a test in
# engine/tests/fuzz_regressions.rs. A unit slower than 10 s counts as a crash too (libFuzzer
# writes it as slow-unit-* and goes on; the verdict names it).
#
# Every run is appended to the ledger fuzz/campaigns.tsv (date, commit, target, sanitizer,
# executions, seconds, executions/s, crashes, inputs replayed under ASan), so that a campaign
# of 10^7 executions can be run in parts across machines and sessions; `TOTALS=1` prints each
# target's sum and stops. A crash restarts the count: what the goal counts is the executions
# since a target's last crash (the runs after its fix).
#
# Knobs (environment):
#   TARGETS    the targets (default: all seven)
#   RUNS       executions per target (default 10000000)
#   SECS       stop a target after this many seconds as well (default: no limit)
#   SANITIZER  address (default) or none: none skips ASan's shadow memory and allocator
#              (3-9x faster here); panics, hangs and memory limits are caught the same, but
#              an out-of-bounds access inside `unsafe` code (the SIMD kernels) only by ASan,
#              so after a run without it every input that run found (each reached new
#              coverage) is replayed under ASan. Built into fuzz/target-none, beside the
#              ASan build in fuzz/target.
#   MERGE=1    merge what a campaign found into fuzz/corpus/<target>, minimized (default:
#              the new inputs stay in a scratch directory, printed)
#   TOTALS=1   print the ledger's sums per target and sanitizer, and the executions since
#              each target's last crash, run nothing
# Needs cargo-fuzz (`cargo install cargo-fuzz`); RUSTC_BOOTSTRAP=1 gives it the nightly
# features on the stable toolchain.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
LEDGER=campaigns.tsv
ALL="open_verify masks_skills quant_kernels import_gguf import_hf chat_template forward"

if [ "${TOTALS:-0}" = 1 ]; then
  echo "| target | executions (address) | executions (none) | executions in all | crashes | since the last crash | to 10^7 |"
  echo "|---|---|---|---|---|---|---|"
  awk -F'\t' -v all="$ALL" '
    NR > 1 {
      sum[$3] += $5; by[$3, $4] += $5; crashes[$3] += $8
      # Rows are in the order they ran; a run that crashed counts for nothing after it.
      since[$3] = $8 > 0 ? 0 : since[$3] + $5
    }
    END {
      n = split(all, ts, " ")
      for (i = 1; i <= n; i++) {
        t = ts[i]; left = 10000000 - since[t]
        printf "| %s | %d | %d | %d | %d | %d | %s |\n", t, by[t, "address"], by[t, "none"],
          sum[t], crashes[t], since[t], left <= 0 ? "done" : sprintf("%d left", left)
      }
    }' "$LEDGER"
  exit 0
fi

export RUSTC_BOOTSTRAP=1 RAYON_NUM_THREADS=1
TARGETS="${TARGETS:-$ALL}"
RUNS="${RUNS:-10000000}"
SANITIZER="${SANITIZER:-address}"
# The importers write through temporary files: on tmpfs an fsync costs nothing.
if [ -d /dev/shm ] && [ -w /dev/shm ]; then export TMPDIR=/dev/shm; fi

declare -A MAX_LEN=(
  [open_verify]=131072 [masks_skills]=65536 [quant_kernels]=8192 [import_gguf]=16384
  [import_hf]=131072 [chat_template]=8192 [forward]=4096
)

command -v cargo-fuzz >/dev/null || { echo "cargo-fuzz is missing: cargo install cargo-fuzz" >&2; exit 2; }
case "$SANITIZER" in
  address) TARGET_DIR=target ;;
  none) TARGET_DIR=target-none ;;
  *) echo "SANITIZER must be address or none, not $SANITIZER" >&2; exit 2 ;;
esac
# Only the targets asked for: a campaign on one target need not wait for the others' builds.
for t in $TARGETS; do
  cargo fuzz build -O -s "$SANITIZER" --target-dir "$TARGET_DIR" "$t" >&2
  [ "$SANITIZER" = address ] || cargo fuzz build -O "$t" >&2
done
BIN=$TARGET_DIR/x86_64-unknown-linux-gnu/release
ASAN_BIN=target/x86_64-unknown-linux-gnu/release
commit="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
[ -f "$LEDGER" ] ||
  printf 'date\tcommit\ttarget\tsanitizer\texecutions\tseconds\texec_per_s\tcrashes\treplayed_asan\n' >"$LEDGER"

rows=()
for t in $TARGETS; do
  [ -n "${MAX_LEN[$t]:-}" ] || { echo "unknown target $t" >&2; exit 2; }
  scratch="$(mktemp -d "${TMPDIR:-/tmp}/fuzz-$t.XXXXXX")"
  log="$scratch.log"
  mkdir -p "artifacts/$t"
  args=("$scratch" "corpus/$t" "-runs=$RUNS" "-max_len=${MAX_LEN[$t]}" -rss_limit_mb=2048
        -timeout=30 -report_slow_units=10 -print_final_stats=1 "-artifact_prefix=artifacts/$t/")
  [ -n "${SECS:-}" ] && args+=("-max_total_time=$SECS")
  echo "== $t: $BIN/$t ${args[*]}" >&2
  start=$(date +%s)
  crashes=0
  if "$BIN/$t" "${args[@]}" >"$log" 2>&1; then verdict="0 crashes"; else
    crashes=1
    verdict="CRASH: $(ls -t "artifacts/$t" | head -1) (see $log)"
  fi
  # A unit slower than 10 s does not stop libFuzzer, but from inputs this small it is a
  # finding (a 1 KB GGUF once wrote gigabytes for 30 s a run): counted as a crash.
  slow=$(sed -n "s|.*Test unit written to \(artifacts/$t/slow-unit-[0-9a-f]*\).*|\1|p" "$log" | tail -1)
  if [ -n "$slow" ] && [ "$crashes" = 0 ]; then
    crashes=1
    verdict="SLOW UNIT: $slow ($(sed -n 's/^Slowest unit: //p' "$log" | tail -1); see $log)"
  fi
  secs=$(( $(date +%s) - start ))
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  replayed=-
  if [ "$SANITIZER" = none ] && [ "$crashes" = 0 ]; then
    replayed=$(ls "$scratch" | wc -l)
    echo "== $t: the $replayed new inputs under ASan" >&2
    if ! "$ASAN_BIN/$t" -runs=0 "-max_len=${MAX_LEN[$t]}" -rss_limit_mb=2048 -timeout=30 \
        "-artifact_prefix=artifacts/$t/" "$scratch" >>"$log" 2>&1; then
      crashes=1
      verdict="CRASH under ASan on replay: $(ls -t "artifacts/$t" | head -1) (see $log)"
    else
      verdict="$verdict; $replayed new inputs replayed under ASan"
    fi
  fi
  rows+=("| $t | ${execs:-?} | ${rate:-?}/s | ${secs}s | $SANITIZER | $verdict |")
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$(date -u +%F)" "$commit" "$t" "$SANITIZER" \
    "${execs:-0}" "$secs" "${rate:-0}" "$crashes" "$replayed" >>"$LEDGER"
  if [ "${MERGE:-0}" = 1 ]; then
    "$BIN/$t" -merge=1 "corpus/$t" "$scratch" "-max_len=${MAX_LEN[$t]}" >>"$log" 2>&1
    rm -rf "$scratch"
  else
    echo "new inputs of $t: $scratch ($(ls "$scratch" | wc -l) files)" >&2
  fi
done
echo "| target | executions | speed | time | sanitizer | result |"
echo "|---|---|---|---|---|---|"
printf '%s\n' "${rows[@]}"
