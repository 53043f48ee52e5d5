#!/usr/bin/env bash
# Builds llama.cpp's llama-bench from the same llama-cpp-python source package as
# ../shared/bench/peers.sh, for one of two instruction sets, and prints the binary's path:
#
#   scripts/build-llama.sh avx2     AVX2 only (no AVX-512, no VNNI) into $CMF_PEERS_AVX2
#                                   (~/.cache/cmf-peers-avx2): the peer of our
#                                   `CORTIQ_SIMD=avx2` level on a machine that has AVX-512,
#                                   for scripts/bench-inference.sh's LLAMA_BENCH_AVX2.
#   scripts/build-llama.sh avxvnni  AVX2 with AVX-VNNI (no AVX-512) into $CMF_PEERS_AVXVNNI
#                                   (~/.cache/cmf-peers-avxvnni): the peer of our
#                                   `CORTIQ_SIMD=avxvnni` level (an Alder Lake-class CPU),
#                                   for bench-inference.sh's LLAMA_BENCH_AVXVNNI.
#   scripts/build-llama.sh noamx    AVX-512 with VNNI, VBMI and BF16 but no AMX, into
#                                   $CMF_PEERS_NOAMX (~/.cache/cmf-peers-noamx): for a VM
#                                   whose CPU reports AMX but whose llama.cpp dies in its
#                                   AMX kernels; bench-inference.sh's LLAMA_BENCH_NOAMX. (Its
#                                   other way out, `--repack 0`, also turns off the repacked
#                                   kernels llama.cpp decodes with: half its decode speed on
#                                   such a VM.)
#
# Idempotent; the first run takes ~15 minutes on 2 cores. Needs cmake.
set -euo pipefail
case "${1:-}" in
  avx2)
    OUT="${CMF_PEERS_AVX2:-$HOME/.cache/cmf-peers-avx2}"
    ISA=(-DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF
         -DGGML_AVX_VNNI=OFF) ;;
  avxvnni)
    OUT="${CMF_PEERS_AVXVNNI:-$HOME/.cache/cmf-peers-avxvnni}"
    ISA=(-DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF
         -DGGML_AVX_VNNI=ON) ;;
  noamx)
    OUT="${CMF_PEERS_NOAMX:-$HOME/.cache/cmf-peers-noamx}"
    ISA=(-DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON
         -DGGML_AVX_VNNI=ON) ;;
  *) echo "usage: scripts/build-llama.sh avx2|avxvnni|noamx" >&2; exit 2 ;;
esac
mkdir -p "$OUT/bin"
if [ ! -x "$OUT/bin/llama-bench" ]; then
  command -v cmake >/dev/null || { echo "build-llama.sh: needs cmake (apt-get install -y cmake)" >&2; exit 2; }
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  python3 -m pip download --quiet --no-deps --no-binary :all: -d "$tmp" llama-cpp-python==0.3.36 >&2
  tar -xzf "$tmp"/llama_cpp_python-*.tar.gz -C "$tmp"
  src="$(echo "$tmp"/llama_cpp_python-*/vendor/llama.cpp)"
  cmake -S "$src" -B "$tmp/build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DGGML_NATIVE=OFF \
        -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON "${ISA[@]}" \
        -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF \
        -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TESTS=OFF -DBUILD_SHARED_LIBS=OFF >&2
  cmake --build "$tmp/build" -j"$(nproc)" --target llama-bench >&2
  cp "$tmp/build/bin/llama-bench" "$OUT/bin/llama-bench.tmp"
  mv "$OUT/bin/llama-bench.tmp" "$OUT/bin/llama-bench"
fi
echo "$OUT/bin/llama-bench"
