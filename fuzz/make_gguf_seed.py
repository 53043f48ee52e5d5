#!/usr/bin/env python3
"""Writes the seed of the `import_gguf` fuzz target: a 12 KB llama GGUF (one layer, hidden
32, Q8_0 / F32 / F16 tensors, a byte-level BPE vocabulary of 8 tokens) to
fuzz/seeds/gguf/tiny-llama.gguf. Standard library only.

    python3 fuzz/make_gguf_seed.py && cargo +nightly fuzz run import_gguf corpus/import_gguf seeds/gguf -- -max_len=16384
"""
import os
import random
import struct

random.seed(1)


def s(x):
    b = x.encode()
    return struct.pack("<Q", len(b)) + b


kv = []


def add(k, t, payload):
    kv.append(s(k) + struct.pack("<I", t) + payload)


def u32(k, v):
    add(k, 4, struct.pack("<I", v))


def f32(k, v):
    add(k, 6, struct.pack("<f", v))


def st(k, v):
    add(k, 8, s(v))


def arr_s(k, items):
    add(k, 9, struct.pack("<IQ", 8, len(items)) + b"".join(s(i) for i in items))


def arr_i(k, items):
    add(k, 9, struct.pack("<IQ", 5, len(items)) + b"".join(struct.pack("<i", i) for i in items))


st("general.architecture", "llama")
u32("llama.block_count", 1)
u32("llama.context_length", 64)
u32("llama.embedding_length", 32)
u32("llama.feed_forward_length", 64)
u32("llama.attention.head_count", 2)
u32("llama.attention.head_count_kv", 1)
f32("llama.attention.layer_norm_rms_epsilon", 1e-5)
f32("llama.rope.freq_base", 10000.0)
st("tokenizer.ggml.model", "gpt2")
st("tokenizer.ggml.pre", "qwen2")
arr_s("tokenizer.ggml.tokens", ["a", "b", "c", "ab", "Ġ", "Ġa", "<s>", "</s>"])
arr_i("tokenizer.ggml.token_type", [1, 1, 1, 1, 1, 1, 3, 3])
arr_s("tokenizer.ggml.merges", ["a b", "Ġ a"])
u32("tokenizer.ggml.eos_token_id", 7)


def q8_0(rows, cols):
    out = b""
    for _ in range(rows * cols // 32):
        out += struct.pack("<e", 0.01) + bytes(random.randrange(256) for _ in range(32))
    return out


ones = struct.pack("<32f", *([1.0] * 32))
F32, F16, Q8_0 = 0, 1, 8
tensors = [
    ("token_embd.weight", [32, 8], Q8_0, q8_0(8, 32)),
    ("output_norm.weight", [32], F32, ones),
    ("blk.0.attn_norm.weight", [32], F32, ones),
    ("blk.0.ffn_norm.weight", [32], F32, ones),
    ("blk.0.attn_q.weight", [32, 32], Q8_0, q8_0(32, 32)),
    ("blk.0.attn_k.weight", [32, 16], Q8_0, q8_0(16, 32)),
    ("blk.0.attn_v.weight", [32, 16], Q8_0, q8_0(16, 32)),
    ("blk.0.attn_output.weight", [32, 32], Q8_0, q8_0(32, 32)),
    ("blk.0.ffn_gate.weight", [32, 64], Q8_0, q8_0(64, 32)),
    ("blk.0.ffn_up.weight", [32, 64], Q8_0, q8_0(64, 32)),
    ("blk.0.ffn_down.weight", [64, 32], Q8_0, q8_0(32, 64)),
    ("output.weight", [32, 8], F16, struct.pack("<256e", *[random.gauss(0, 0.1) for _ in range(256)])),
]
info, data = b"", b""
for name, dims, ty, payload in tensors:
    data += b"\0" * (-len(data) % 32)
    info += s(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
    info += struct.pack("<IQ", ty, len(data))
    data += payload
head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kv)) + b"".join(kv) + info
head += b"\0" * (-len(head) % 32)
out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "seeds", "gguf", "tiny-llama.gguf")
os.makedirs(os.path.dirname(out), exist_ok=True)
with open(out, "wb") as f:
    f.write(head + data)
print(out, len(head + data))
