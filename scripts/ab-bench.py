#!/usr/bin/env python3
"""Interleaved A/B timing of two or more builds, for a machine whose speed drifts.

On a shared VM the same binary's decode speed moves by ±15% within minutes, so two
builds timed one after the other compare the hours, not the code. This runs the
builds in turn, round after round (the order reversed every other round), and reports
per build the median and the median of its per-round ratios to the first build
("paired"), which the drift moves far less.

Two kinds of build:

  model runs    scripts/ab-bench.py model FILE.cmf BUILD... [--what decode|prefill]
                BUILD is LABEL=PATH[,ENV=VALUE...], a `cortiq` binary; each round runs
                `PATH bench FILE --threads N --prompt-tokens 8 --tokens 64 --repeat 1
                --no-verify` (override with --args) and reads its tok/s.
  kernel runs   scripts/ab-bench.py kernel SHAPE FILTER BUILD...
                BUILD is LABEL=PATH to a copy of the criterion `matvec` bench binary
                (`cargo bench -p cortiq-engine --bench matvec --no-run` prints its path;
                copy it aside before rebuilding); each round runs it on FILTER with
                CORTIQ_BENCH_SHAPE=SHAPE and reads its time (lower is better).

Example: cp target/release/cortiq /tmp/old; (edit, rebuild)
         scripts/ab-bench.py model ~/.cache/cortiq-bench/smollm2-135m-q1t.cmf \\
             old=/tmp/old new=target/release/cortiq --rounds 8
"""
import argparse
import os
import re
import statistics
import subprocess
import sys

UNITS = {"ns": 1e-3, "µs": 1.0, "us": 1.0, "ms": 1e3, "s": 1e6}


def parse_build(spec):
    if "=" not in spec:
        sys.exit(f"ab-bench: a build is LABEL=PATH[,ENV=VALUE...], not {spec!r}")
    label, rest = spec.split("=", 1)
    path, *envs = rest.split(",")
    env = {}
    for kv in envs:
        if "=" not in kv:
            sys.exit(f"ab-bench: {kv!r} in {spec!r} is not ENV=VALUE")
        k, v = kv.split("=", 1)
        env[k] = v
    if not os.access(path, os.X_OK):
        sys.exit(f"ab-bench: {path} is not an executable file")
    return label, path, env


def run(cmd, env):
    full = dict(os.environ)
    full.update(env)
    p = subprocess.run(cmd, env=full, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"ab-bench: {' '.join(cmd)} exited {p.returncode}:\n{p.stderr[-2000:]}")
    return p.stdout


def model_value(build, a):
    _, path, env = build
    out = run([path, "bench", a.file, "--threads", str(a.threads), *a.args.split()], env)
    m = re.search(a.what + r" ([0-9.]+) tok/s", out)
    if not m:
        sys.exit(f"ab-bench: no '{a.what} … tok/s' in the output of {path}:\n{out}")
    return float(m.group(1))


def kernel_value(build, a):
    _, path, env = build
    env = dict(env, CORTIQ_BENCH_SHAPE=a.shape)
    out = run([path, "--bench", a.filter, "--warm-up-time", "0.5",
               "--measurement-time", str(a.seconds), "--noplot"], env)
    m = re.search(r"time:\s+\[\S+ \S+ (\S+) (\S+)", out)
    if not m or m.group(2) not in UNITS:
        sys.exit(f"ab-bench: no criterion time for {a.filter!r} from {path}:\n{out}")
    return float(m.group(1)) * UNITS[m.group(2)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="kind", required=True)
    mp = sub.add_parser("model", help="cortiq bench on a model file")
    mp.add_argument("file")
    mp.add_argument("builds", nargs="+")
    mp.add_argument("--what", choices=["decode", "prefill"], default="decode")
    mp.add_argument("--threads", type=int, default=2)
    mp.add_argument("--args", default="--prompt-tokens 8 --tokens 64 --repeat 1 --no-verify")
    kp = sub.add_parser("kernel", help="the criterion matvec bench binary")
    kp.add_argument("shape", help="ROWSxCOLS, as CORTIQ_BENCH_SHAPE")
    kp.add_argument("filter", help='criterion filter, e.g. "q4tp.*matvec balanced/1T"')
    kp.add_argument("builds", nargs="+")
    kp.add_argument("--seconds", type=float, default=2.0)
    for p in (mp, kp):
        p.add_argument("--rounds", type=int, default=8)
    a = ap.parse_args()
    if a.kind == "model" and not os.path.isfile(a.file):
        sys.exit(f"ab-bench: no model file {a.file}")
    builds = [parse_build(b) for b in a.builds]
    if len({b[0] for b in builds}) != len(builds):
        sys.exit("ab-bench: two builds share a label")
    value = model_value if a.kind == "model" else kernel_value
    unit = "tok/s" if a.kind == "model" else "µs"
    res = {b[0]: [] for b in builds}
    for r in range(a.rounds):
        for b in builds if r % 2 == 0 else builds[::-1]:
            res[b[0]].append(value(b, a))
        print(f"round {r + 1}/{a.rounds}: "
              + "  ".join(f"{b[0]} {res[b[0]][-1]:.1f}" for b in builds), file=sys.stderr)
    first = res[builds[0][0]]
    for label, _, _ in builds:
        v = res[label]
        paired = statistics.median(x / y for x, y in zip(v, first))
        print(f"{label:>12}  median {statistics.median(v):9.2f} {unit}"
              f"  paired {paired:.3f}  (rounds: {' '.join(f'{x:.1f}' for x in v)})")


if __name__ == "__main__":
    main()
