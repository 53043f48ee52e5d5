#!/usr/bin/env bash
# The test suite, with its one system dependency: tmux, for the end-to-end terminal test.
# Needs ../shared/fixtures beside the checkout.
set -euo pipefail
cd "$(dirname "$0")/.."
test -d ../shared/fixtures || { echo "the tests need ../shared/fixtures beside this checkout" >&2; exit 2; }
if ! command -v tmux >/dev/null; then
  echo "installing tmux (for the end-to-end terminal test) ..." >&2
  if [ "$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi
  ($SUDO apt-get update -qq && $SUDO apt-get install -y -qq tmux) >/dev/null || {
    echo "cannot install tmux: install it and run again" >&2; exit 2; }
fi
exec cargo test --workspace "$@"
