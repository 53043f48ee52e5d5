#!/usr/bin/env python3
"""Argmax agreement and mean KL of a precision's logits against the exact path.

DESIGN.md's contract for quantized activations is argmax agreement >= 97% of positions
and mean KL <= 1e-3 nats against the exact path; tests/real_model_inference.rs checks it
on the real models' 8-bit files. This measures it for any file and precision, and for
any build or environment (an experiment with the activations), over the token ids of a
real-model reference (its `text_ids`, the fixture passage):

  scripts/precision-agreement.py FILE.cmf REFERENCE.safetensors VARIANT...

VARIANT is NAME:PRECISION[:ENV=VALUE,...], e.g. `bal:balanced` or
`probe:exact:MY_EXPERIMENT=1`. Each runs `cortiq logits FILE --precision PRECISION`
(with the environment added) and is compared with a run of `--precision exact` without
it. --tokens N takes the first N ids (default 128); --cortiq picks the binary (default
target/release/cortiq). Plain Python: no numpy.
"""
import argparse
import array
import json
import math
import os
import struct
import subprocess
import sys
import tempfile


def tensor(path, name):
    with open(path, "rb") as f:
        b = f.read()
    n = struct.unpack("<Q", b[:8])[0]
    header = json.loads(b[8 : 8 + n])
    if name not in header:
        sys.exit(f"precision-agreement: {path} has no tensor {name!r}")
    t = header[name]
    start, end = t["data_offsets"]
    codes = {"F32": "f", "I32": "i", "I64": "q", "U32": "I"}
    if t["dtype"] not in codes:
        sys.exit(f"precision-agreement: {name} in {path} is {t['dtype']}")
    a = array.array(codes[t["dtype"]])
    a.frombytes(b[8 + n + start : 8 + n + end])
    return a, t["shape"]


def logits(cortiq, model, ids, precision, env, out):
    full = dict(os.environ)
    full.update(env)
    cmd = [cortiq, "logits", model, "--no-verify", "--ids", ",".join(map(str, ids))]
    cmd += ["--precision", precision, "--out", out]
    p = subprocess.run(cmd, env=full, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"precision-agreement: {' '.join(cmd[:3])} … exited {p.returncode}:\n{p.stderr[-2000:]}")
    values, shape = tensor(out, "logits")
    return values, shape[1]


def log_softmax_row(row):
    m = max(row)
    return m + math.log(sum(math.exp(v - m) for v in row))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("reference")
    ap.add_argument("variants", nargs="+")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--cortiq", default="target/release/cortiq")
    a = ap.parse_args()
    if not os.access(a.cortiq, os.X_OK):
        sys.exit(f"precision-agreement: {a.cortiq} is not an executable (cargo build --release)")
    ids = list(tensor(a.reference, "text_ids")[0])[: a.tokens]
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "logits.safetensors")
        base, vocab = logits(a.cortiq, a.model, ids, "exact", {}, out)
        t = len(base) // vocab
        rows = [base[i * vocab : (i + 1) * vocab] for i in range(t)]
        norms = [log_softmax_row(r) for r in rows]
        for spec in a.variants:
            parts = spec.split(":", 2)
            if len(parts) < 2:
                sys.exit(f"precision-agreement: a variant is NAME:PRECISION[:ENV=V,...], not {spec!r}")
            env = dict(kv.split("=", 1) for kv in parts[2].split(",")) if len(parts) == 3 and parts[2] else {}
            other, _ = logits(a.cortiq, a.model, ids, parts[1], env, out)
            agree, kls = 0, []
            for i in range(t):
                ra, la = rows[i], norms[i]
                rb = other[i * vocab : (i + 1) * vocab]
                lb = log_softmax_row(rb)
                agree += ra.index(max(ra)) == rb.index(max(rb))
                kls.append(sum(math.exp(x - la) * ((x - la) - (y - lb)) for x, y in zip(ra, rb)))
            s = sorted(kls)
            print(
                f"{parts[0]:16s} argmax {agree / t:.4f}  mean KL {sum(kls) / t:.3e}  "
                f"(per position: median {s[t // 2]:.2e}, max {s[-1]:.2e}; {t} positions)",
                flush=True,
            )


if __name__ == "__main__":
    main()
