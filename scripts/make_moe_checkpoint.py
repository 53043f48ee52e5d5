#!/usr/bin/env python3
"""Writes a synthetic Hugging Face Qwen3-MoE checkpoint (f16 safetensors shards, random
normal weights, deterministic) for the MoE inference benchmark (scripts/bench-moe.sh).

    scripts/make_moe_checkpoint.py OUT_DIR [--hidden 1024] [--layers 24] [--experts 128]
        [--top-k 8] [--moe-inter 512] [--heads 16] [--kv-heads 4] [--head-dim 64]
        [--shard-gb 2.0] [--seed 7]

Defaults: 24 layers x 128 experts x 3 x 1024 x 512 = 4.83 G expert weights, 9.7 GB of f16
(about 5.1 GB at 8 bits). Tensor names are the per-expert ones of transformers'
Qwen3MoeForCausalLM (model.layers.L.mlp.experts.E.{gate,up,down}_proj.weight, router
model.layers.L.mlp.gate.weight). The tokenizer files (vocab 512) are copied from
../shared/fixtures/hf/qwen3_moe/. Needs numpy and safetensors. Skips the work when OUT_DIR
already holds a complete checkpoint of the same shape (config.json is written last).
"""
import argparse, json, os, shutil, sys

import numpy as np
from safetensors.numpy import save_file

ap = argparse.ArgumentParser()
ap.add_argument("out")
ap.add_argument("--hidden", type=int, default=1024)
ap.add_argument("--layers", type=int, default=24)
ap.add_argument("--experts", type=int, default=128)
ap.add_argument("--top-k", type=int, default=8)
ap.add_argument("--moe-inter", type=int, default=512)
ap.add_argument("--heads", type=int, default=16)
ap.add_argument("--kv-heads", type=int, default=4)
ap.add_argument("--head-dim", type=int, default=64)
ap.add_argument("--shard-gb", type=float, default=2.0)
ap.add_argument("--seed", type=int, default=7)
ap.add_argument("--std", type=float, default=0.02)
a = ap.parse_args()

here = os.path.dirname(os.path.abspath(__file__))
tok_src = os.path.join(here, "..", "..", "shared", "fixtures", "hf", "qwen3_moe")
vocab = 512
H, I, E, L = a.hidden, a.moe_inter, a.experts, a.layers
qd, kvd = a.heads * a.head_dim, a.kv_heads * a.head_dim

config = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": None,
    "eos_token_id": 2,
    "pad_token_id": 0,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "head_dim": a.head_dim,
    "hidden_act": "silu",
    "hidden_size": H,
    "intermediate_size": 4 * I,
    "moe_intermediate_size": I,
    "num_experts": E,
    "num_experts_per_tok": a.top_k,
    "norm_topk_prob": True,
    "num_attention_heads": a.heads,
    "num_key_value_heads": a.kv_heads,
    "num_hidden_layers": L,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "rope_scaling": None,
    "router_aux_loss_coef": 0.001,
    "output_router_logits": False,
    "sliding_window": None,
    "use_sliding_window": False,
    "tie_word_embeddings": False,
    "torch_dtype": "float16",
    "use_cache": True,
    "vocab_size": vocab,
}

cfg_path = os.path.join(a.out, "config.json")
if os.path.exists(cfg_path):
    try:
        old = json.load(open(cfg_path))
    except ValueError:
        old = None
    if old == config and os.path.exists(os.path.join(a.out, "model.safetensors.index.json")):
        print(f"{a.out}: complete, kept", file=sys.stderr)
        sys.exit(0)
os.makedirs(a.out, exist_ok=True)
for f in os.listdir(a.out):
    if f.endswith(".safetensors") or f.endswith(".json"):
        os.remove(os.path.join(a.out, f))

rng = np.random.default_rng(a.seed)


def normal(shape, std=a.std):
    x = rng.standard_normal(shape, dtype=np.float32)
    x *= std
    return x.astype(np.float16)


def near_one(n):
    return (1.0 + 0.05 * rng.standard_normal(n, dtype=np.float32)).astype(np.float16)


# Tensors in the order they are written; each one a (name, factory) pair so a shard is only
# materialised when it is saved.
def layer_tensors(l):
    p = f"model.layers.{l}."
    yield p + "input_layernorm.weight", lambda: near_one(H)
    yield p + "post_attention_layernorm.weight", lambda: near_one(H)
    yield p + "self_attn.q_proj.weight", lambda: normal((qd, H))
    yield p + "self_attn.k_proj.weight", lambda: normal((kvd, H))
    yield p + "self_attn.v_proj.weight", lambda: normal((kvd, H))
    yield p + "self_attn.o_proj.weight", lambda: normal((H, qd))
    yield p + "self_attn.q_norm.weight", lambda: near_one(a.head_dim)
    yield p + "self_attn.k_norm.weight", lambda: near_one(a.head_dim)
    # Router: a larger spread than the experts so the top-k choice varies token by token.
    yield p + "mlp.gate.weight", lambda: normal((E, H), std=0.05)
    for e in range(E):
        q = f"{p}mlp.experts.{e}."
        yield q + "gate_proj.weight", lambda: normal((I, H))
        yield q + "up_proj.weight", lambda: normal((I, H))
        yield q + "down_proj.weight", lambda: normal((H, I))


def all_tensors():
    yield "model.embed_tokens.weight", lambda: normal((vocab, H))
    for l in range(L):
        yield from layer_tensors(l)
    yield "model.norm.weight", lambda: near_one(H)
    yield "lm_head.weight", lambda: normal((vocab, H))


# Plan shards by byte budget (sizes known without materialising).
def nbytes(name):
    if "experts" in name:
        return 2 * H * I
    if name.endswith("q_proj.weight") or name.endswith("o_proj.weight"):
        return 2 * qd * H
    if name.endswith("k_proj.weight") or name.endswith("v_proj.weight"):
        return 2 * kvd * H
    if name.endswith("mlp.gate.weight"):
        return 2 * E * H
    if name in ("model.embed_tokens.weight", "lm_head.weight"):
        return 2 * vocab * H
    if "_norm" in name:
        return 2 * (a.head_dim if "self_attn" in name else H)
    return 2 * H


budget = int(a.shard_gb * 1e9)
shards, cur, cur_bytes = [], [], 0
for name, make in all_tensors():
    b = nbytes(name)
    if cur and cur_bytes + b > budget:
        shards.append(cur)
        cur, cur_bytes = [], 0
    cur.append((name, make))
    cur_bytes += b
shards.append(cur)

n = len(shards)
weight_map, total = {}, 0
for i, shard in enumerate(shards):
    fname = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
    tensors = {name: make() for name, make in shard}
    total += sum(t.nbytes for t in tensors.values())
    save_file(tensors, os.path.join(a.out, fname), metadata={"format": "pt"})
    for name in tensors:
        weight_map[name] = fname
    del tensors
    print(f"  {fname} written ({total / 1e9:.2f} GB so far)", file=sys.stderr, flush=True)

json.dump({"metadata": {"total_size": total}, "weight_map": weight_map},
          open(os.path.join(a.out, "model.safetensors.index.json"), "w"), indent=1)
for f in ["tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"]:
    src = os.path.join(tok_src, f)
    if os.path.exists(src):
        shutil.copyfile(src, os.path.join(a.out, f))
json.dump(config, open(cfg_path, "w"), indent=1)
experts = L * E * 3 * H * I
print(json.dumps({"dir": a.out, "bytes": total, "expert_params": experts,
                  "params": total // 2, "shards": n}))
