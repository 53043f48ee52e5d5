#!/usr/bin/env bash
# The slow checks: the real models of ../shared/models/fetch.sh (import, verify, tokenizer;
# then inference against transformers' reference: greedy answers, logits, perplexity at f32
# and 8 bits), and interoperability with the reference implementation's CLI, used as a
# black box (files it accepts, tensors it decodes). Installs that CLI on first use, the
# way ../shared/bench/peers.sh does, into $CMF_PEERS (default ~/.cache/cmf-peers).
set -euo pipefail
cd "$(dirname "$0")/.."
# The real models (GGUF) first: fetch them (idempotent), then import, verify and tokenize;
# with them llama.cpp's vocabulary test set (real SentencePiece and BPE vocabularies).
bash ../shared/models/fetch.sh
bash scripts/fetch-vocabs.sh >/dev/null
cargo test --release --features real-models --test real_models --test real_model_inference --test tui_chat_real \
  --test gguf_vocabularies --test cli_demo
PEERS="${CMF_PEERS:-$HOME/.cache/cmf-peers}"
if [ ! -x "$PEERS/bin/cortiq" ]; then
  echo "installing the reference CLI (cortiq-cli 0.8.54) into $PEERS ..." >&2
  mkdir -p "$PEERS/bin"
  CARGO_TARGET_DIR="$PEERS/target" cargo install --quiet cortiq-cli --version 0.8.54 \
      --no-default-features --root "$PEERS" >&2
  rm -rf "$PEERS/target"
fi
export CORTIQ_REFERENCE_CLI="$PEERS/bin/cortiq"
cargo test --release --features peer-tests --test peer_interop -- --test-threads 2
