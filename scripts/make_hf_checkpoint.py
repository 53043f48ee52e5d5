#!/usr/bin/env python3
"""Writes a synthetic llama-shaped Hugging Face checkpoint (f16 safetensors, ~400 MB by
default) for conversion benchmarks. Standard library only; deterministic.

    scripts/make_hf_checkpoint.py OUT_DIR [HIDDEN] [LAYERS]
"""
import json, os, random, shutil, struct, sys

out = sys.argv[1]
hidden = int(sys.argv[2]) if len(sys.argv) > 2 else 1024
layers = int(sys.argv[3]) if len(sys.argv) > 3 else 16
inter = hidden * 11 // 4 // 32 * 32
heads = hidden // 64
vocab = 512
here = os.path.dirname(os.path.abspath(__file__))
tok_src = os.path.join(here, "..", "..", "shared", "fixtures", "hf", "llama")
os.makedirs(out, exist_ok=True)

tensors = [("model.embed_tokens.weight", (vocab, hidden)), ("model.norm.weight", (hidden,)), ("lm_head.weight", (vocab, hidden))]
for l in range(layers):
    p = f"model.layers.{l}."
    tensors += [
        (p + "input_layernorm.weight", (hidden,)),
        (p + "post_attention_layernorm.weight", (hidden,)),
        (p + "self_attn.q_proj.weight", (hidden, hidden)),
        (p + "self_attn.k_proj.weight", (hidden, hidden)),
        (p + "self_attn.v_proj.weight", (hidden, hidden)),
        (p + "self_attn.o_proj.weight", (hidden, hidden)),
        (p + "mlp.gate_proj.weight", (inter, hidden)),
        (p + "mlp.up_proj.weight", (inter, hidden)),
        (p + "mlp.down_proj.weight", (hidden, inter)),
    ]

header, off = {}, 0
for name, shape in tensors:
    n = 1
    for d in shape:
        n *= d
    header[name] = {"dtype": "F16", "shape": list(shape), "data_offsets": [off, off + 2 * n]}
    off += 2 * n
hbytes = json.dumps(header).encode()
hbytes += b" " * ((8 - len(hbytes) % 8) % 8)

# A pool of f16 values ~N(0, 0.02) (norm weights near 1), repeated with a shifting start so
# tensors differ without generating hundreds of millions of random numbers in Python.
rng = random.Random(7)
pool = struct.pack("<65536e", *[rng.gauss(0.0, 0.02) for _ in range(65536)])
ones = struct.pack("<4096e", *[1.0 + rng.gauss(0.0, 0.05) for _ in range(4096)])
with open(os.path.join(out, "model.safetensors"), "wb") as f:
    f.write(struct.pack("<Q", len(hbytes)))
    f.write(hbytes)
    for i, (name, shape) in enumerate(tensors):
        nbytes = header[name]["data_offsets"][1] - header[name]["data_offsets"][0]
        src = ones if len(shape) == 1 else pool
        start = (i * 2 * 977) % len(src)
        rot = src[start:] + src[:start]
        while nbytes > 0:
            k = min(nbytes, len(rot))
            f.write(rot[:k])
            nbytes -= k

config = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
    "intermediate_size": inter, "num_hidden_layers": layers, "num_attention_heads": heads,
    "num_key_value_heads": heads, "head_dim": 64, "vocab_size": vocab, "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0, "max_position_embeddings": 2048, "tie_word_embeddings": False,
    "torch_dtype": "float16", "hidden_act": "silu", "bos_token_id": 1, "eos_token_id": 2,
}
json.dump(config, open(os.path.join(out, "config.json"), "w"), indent=1)
for f in ["tokenizer.json", "tokenizer_config.json", "chat_template.jinja"]:
    if os.path.exists(os.path.join(tok_src, f)):
        shutil.copyfile(os.path.join(tok_src, f), os.path.join(out, f))
print(out, off, "bytes of weights")
