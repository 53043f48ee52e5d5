#!/usr/bin/env bash
# llama.cpp's llama-bench for AVX2 only: `scripts/build-llama.sh avx2` (see there).
exec "$(dirname "$0")/build-llama.sh" avx2
