#!/usr/bin/env python3
"""Prefill of short prompts (a chat's follow-up turn, a MoE expert's share of a prompt):
cortiq builds side by side with llama-bench, interleaved round by round.

  scripts/bench-short-prompts.py [--rounds 3] [--sizes 2,4,8,16]
      [--pairs q8_row:Q8_0,q4_block:Q4_0,q1t:TQ2_0] [--models smollm2-135m,qwen2.5-coder-0.5b]
      [--llama-bench PATH] [--threads 2] [--simd LEVEL] LABEL=PATH [LABEL=PATH ...]

Reads the models that scripts/bench-inference.sh prepares in $CORTIQ_BENCH
(~/.cache/cortiq-bench: MODEL-FORMAT.cmf and MODEL-PEER.gguf). Each round runs, for every
model, pair and size, `PATH bench F.cmf --prompt-tokens N --tokens 1 --repeat 3
--no-verify --json` for every build and `llama-bench -m F.gguf -p N -n 0 -r 3 -o json`, the
order reversed every other round; prints medians (tok/s), each build's ratio to the first
build and to llama.cpp, as a markdown table. On a VM whose llama.cpp dies in AMX prefill,
pass the no-AMX build (scripts/build-llama.sh noamx). `--simd avx2` (or `avxvnni`) runs the
builds at that level (CORTIQ_SIMD); pass the llama.cpp built for it beside them
(scripts/build-llama.sh avx2 / avxvnni).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("builds", nargs="+", help="LABEL=PATH to a cortiq binary")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sizes", default="2,4,8,16")
    ap.add_argument("--pairs", default="q8_row:Q8_0,q4_block:Q4_0,q1t:TQ2_0")
    ap.add_argument("--models", default="smollm2-135m,qwen2.5-coder-0.5b")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--simd", help="CORTIQ_SIMD for the builds (default: the best level)")
    ap.add_argument(
        "--llama-bench",
        default=os.path.expanduser("~/.cache/cmf-peers/bin/llama-bench"),
    )
    a = ap.parse_args()
    cache = os.environ.get("CORTIQ_BENCH", os.path.expanduser("~/.cache/cortiq-bench"))
    builds = []
    for spec in a.builds:
        if "=" not in spec:
            sys.exit(f"bench-short-prompts: a build is LABEL=PATH, not {spec!r}")
        label, path = spec.split("=", 1)
        if not os.access(path, os.X_OK):
            sys.exit(f"bench-short-prompts: {path} is not an executable")
        builds.append((label, path))
    if not os.access(a.llama_bench, os.X_OK):
        sys.exit(f"bench-short-prompts: no llama-bench at {a.llama_bench} (../shared/bench/peers.sh)")
    sizes = [int(s) for s in a.sizes.split(",")]
    pairs = [p.split(":") for p in a.pairs.split(",")]
    models = a.models.split(",")
    for m in models:
        for fmt, peer in pairs:
            for f in (f"{cache}/{m}-{fmt}.cmf", f"{cache}/{m}-{peer}.gguf"):
                if not os.path.exists(f):
                    sys.exit(f"bench-short-prompts: missing {f} (scripts/bench-inference.sh makes it)")

    env = dict(os.environ)
    if a.simd:
        env["CORTIQ_SIMD"] = a.simd

    def run(cmd, env=None):
        # A failed run ends the script with its command and last stderr line, not a
        # traceback (llama-bench's AMX build, for one, dies in prefill on some VMs).
        r = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if r.returncode != 0:
            last = (r.stderr.strip().splitlines() or [""])[-1]
            sys.exit(f"bench-short-prompts: {' '.join(cmd)}: rc {r.returncode}: {last}")
        return r.stdout

    def ours(path, f, n):
        out = run([path, "bench", f, "--threads", str(a.threads), "--prompt-tokens", str(n),
                   "--tokens", "1", "--repeat", "3", "--no-verify", "--json"], env)
        return json.loads(out)["prefill_tok_s"]

    def llama(f, n):
        out = run([a.llama_bench, "-m", f, "-p", str(n), "-n", "0", "-t", str(a.threads),
                   "-r", "3", "-o", "json"])
        return json.loads(out)[0]["avg_ts"]

    res = {}
    who = [b[0] for b in builds] + ["llama.cpp"]
    for r in range(a.rounds):
        for m in models:
            for fmt, peer in pairs:
                for n in sizes:
                    for w in (who if r % 2 == 0 else who[::-1]):
                        if w == "llama.cpp":
                            v = llama(f"{cache}/{m}-{peer}.gguf", n)
                        else:
                            v = ours(dict(builds)[w], f"{cache}/{m}-{fmt}.cmf", n)
                        res.setdefault((m, fmt, n, w), []).append(v)
        print(f"round {r + 1}/{a.rounds} done", file=sys.stderr)

    labels = [b[0] for b in builds]
    head = ["model", "format", "peer", "prompt"] + labels
    head += [f"{l} ÷ {labels[0]}" for l in labels[1:]] + ["llama.cpp"]
    head += [f"{l} ÷ llama.cpp" for l in labels]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for m in models:
        for fmt, peer in pairs:
            for n in sizes:
                med = {w: statistics.median(res[(m, fmt, n, w)]) for w in who}
                row = [m, fmt, peer, str(n)] + [f"{med[l]:.1f}" for l in labels]
                row += [f"{med[l] / med[labels[0]]:.2f}" for l in labels[1:]]
                row += [f"{med['llama.cpp']:.1f}"]
                row += [f"{med[l] / med['llama.cpp']:.2f}" for l in labels]
                print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
