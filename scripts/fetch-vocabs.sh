#!/usr/bin/env bash
# Fetches llama.cpp's tokenizer test set — real GGUF vocabularies (models/ggml-vocab-*.gguf)
# with inputs (.inp) and the token ids Hugging Face's tokenizers give them (.out) — into
# $CMF_VOCABS (default ~/.cache/cmf-vocabs), for tests/gguf_vocabularies.rs. They come from
# the llama-cpp-python source package that ../shared/bench/peers.sh builds llama.cpp from.
# Idempotent; needs python3 -m pip and network on first use (~75 MB download).
set -euo pipefail
DEST="${CMF_VOCABS:-$HOME/.cache/cmf-vocabs}"
NAMES="llama-spm phi-3 gemma-4 gpt-2 llama-bpe qwen2 qwen35 mpt deepseek-llm falcon command-r bert-bge"
have=1
for n in $NAMES; do [ -f "$DEST/ggml-vocab-$n.gguf" ] || have=0; done
if [ "$have" = 0 ]; then
  mkdir -p "$DEST"
  tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
  echo "fetching llama.cpp's vocabulary test set into $DEST ..." >&2
  # Only the package itself as source: its build tools (cmake, ...) as wheels, so pip does
  # not compile cmake to read the metadata.
  python3 -m pip download --quiet --no-deps --no-binary llama-cpp-python -d "$tmp" llama-cpp-python==0.3.36 >&2
  tar -xzf "$tmp"/llama_cpp_python-*.tar.gz -C "$tmp" --wildcards '*/vendor/llama.cpp/models/ggml-vocab-*'
  for n in $NAMES; do
    cp "$tmp"/llama_cpp_python-*/vendor/llama.cpp/models/ggml-vocab-"$n".gguf* "$DEST/"
  done
fi
echo "$DEST"
