#!/usr/bin/env bash
# The engine's unit tests built for AArch64 and run under qemu-user: every kernel test
# compares each SIMD level this CPU has with the scalar reference, so there the NEON
# integer kernels (engine/src/quant/neon.rs) against the scalar ones, bit for bit, and the
# portable code on a second architecture. Installs what it needs on first use: qemu-user,
# the AArch64 C cross toolchain (apt-get) and Rust's aarch64-unknown-linux-gnu target.
# Emulation says nothing about speed. ~8 min on 2 cores the first time, ~1 min of tests.
set -euo pipefail
cd "$(dirname "$0")/.."
TARGET=aarch64-unknown-linux-gnu
SYSROOT=/usr/aarch64-linux-gnu
if ! command -v qemu-aarch64 >/dev/null || ! command -v aarch64-linux-gnu-gcc >/dev/null \
    || [ ! -d "$SYSROOT/lib" ]; then
  echo "installing qemu-user and the AArch64 cross toolchain ..." >&2
  if [ "$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi
  ($SUDO apt-get update -qq && $SUDO apt-get install -y -qq qemu-user gcc-aarch64-linux-gnu \
      libc6-dev-arm64-cross) >/dev/null || {
    echo "cannot install qemu-user and gcc-aarch64-linux-gnu: install them and run again" >&2
    exit 2; }
fi
if ! rustup target list --installed | grep -qx "$TARGET"; then
  rustup target add "$TARGET" >&2
fi
export CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -L $SYSROOT"
exec cargo test --release --target "$TARGET" -p cortiq-engine --lib "$@"
