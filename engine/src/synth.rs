//! Self-made models: the demo file `cortiq demo` writes (small, with every writable dtype,
//! task masks with expert fields, a skill and MoE layers) and large files for benchmarks.
//! Weights are pseudo-random but deterministic (a seeded xorshift), so two runs produce
//! byte-identical files.

use std::path::Path;

use serde_json::json;

use crate::format::header::{Arch, Header, Moe, NormStyle, SkillRecord, TokenizerConfig};
use crate::format::masks::{build_section, MaskRecord, Priority};
use crate::format::writer::{StreamWriter, TensorPlan, WriteSpec, WriteSummary};
use crate::format::{DType, Result};
use crate::quant::{self, EncodeOptions};

/// xorshift64*: tiny, deterministic, good enough for synthetic weights.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }
    /// Approximately normal (sum of four uniforms, centred and scaled).
    pub fn normal(&mut self) -> f32 {
        let s: f32 = (0..4).map(|_| self.unit()).sum();
        (s - 2.0) * 1.732
    }
}

/// The demo's dimensions.
pub struct DemoConfig {
    pub hidden: u64,
    pub intermediate: u64,
    pub layers: u64,
    pub heads: u64,
    pub kv_heads: u64,
    pub experts: u64,
    pub top_k: u64,
    pub expert_intermediate: u64,
}

impl Default for DemoConfig {
    fn default() -> Self {
        DemoConfig {
            hidden: 128,
            intermediate: 256,
            layers: 6,
            heads: 4,
            kv_heads: 2,
            experts: 8,
            top_k: 2,
            expert_intermediate: 64,
        }
    }
}

/// GPT-2's byte-to-unicode table: printable stand-ins for the 256 byte values, the
/// alphabet of a byte-level BPE vocabulary.
fn byte_chars() -> Vec<char> {
    let mut printable: Vec<u32> = (33..=126).chain(161..=172).chain(174..=255).collect();
    let mut chars = vec!['\0'; 256];
    for &b in &printable {
        chars[b as usize] = char::from_u32(b).unwrap();
    }
    let mut extra = 0;
    for b in 0..256u32 {
        if !printable.contains(&b) {
            chars[b as usize] = char::from_u32(256 + extra).unwrap();
            extra += 1;
        }
    }
    printable.clear();
    chars
}

/// A byte-level BPE `tokenizer.json` with the 256 byte tokens and ChatML specials.
pub fn demo_tokenizer_json() -> (Vec<u8>, u32) {
    let mut vocab = serde_json::Map::new();
    for (i, c) in byte_chars().into_iter().enumerate() {
        vocab.insert(c.to_string(), json!(i));
    }
    let specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];
    let added: Vec<_> = specials
        .iter()
        .enumerate()
        .map(|(k, s)| {
            vocab.insert(s.to_string(), json!(256 + k));
            json!({"id": 256 + k, "content": s, "single_word": false, "lstrip": false,
                   "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    let tok = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                  "ignore_merges": false, "vocab": vocab, "merges": []}
    });
    (
        serde_json::to_vec(&tok).expect("tokenizer serializes"),
        256 + specials.len() as u32,
    )
}

pub const CHATML: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

struct Planned {
    plan: TensorPlan,
    std: f32,
    /// Norm weights: near 1.
    norm: bool,
}

fn moe_layer(l: u64) -> bool {
    l % 2 == 1
}

/// Plans the demo's tensors: layers alternate dense and MoE; dtypes rotate over every
/// writable codec so the file shows each of them.
fn plan(cfg: &DemoConfig, vocab: u64) -> Vec<Planned> {
    let h = cfg.hidden;
    let hd = h / cfg.heads;
    let mut v = Vec::new();
    let mut add = |name: String, dtype: DType, shape: Vec<u64>, std: f32| {
        let norm = name.ends_with("norm.weight");
        v.push(Planned {
            plan: TensorPlan { name, dtype, shape },
            std,
            norm,
        })
    };
    add(
        "model.embed_tokens.weight".into(),
        DType::Q8Row,
        vec![vocab, h],
        0.05,
    );
    let rot = [
        DType::Q4Tiled,
        DType::Q4tp,
        DType::VbitRo,
        DType::Q8_2f,
        DType::Vbit,
        DType::Q4Block,
    ];
    let ffn_rot = [
        DType::Q8Row,
        DType::Q1t,
        DType::Q4Block,
        DType::Q1s,
        DType::Bf16,
        DType::Q1,
    ];
    for l in 0..cfg.layers {
        let p = format!("model.layers.{l}.");
        let a = rot[l as usize % rot.len()];
        add(
            format!("{p}input_layernorm.weight"),
            DType::F16,
            vec![h],
            0.0,
        );
        add(
            format!("{p}self_attn.q_proj.weight"),
            a,
            vec![cfg.heads * hd, h],
            0.08,
        );
        add(
            format!("{p}self_attn.k_proj.weight"),
            a,
            vec![cfg.kv_heads * hd, h],
            0.08,
        );
        add(
            format!("{p}self_attn.v_proj.weight"),
            a,
            vec![cfg.kv_heads * hd, h],
            0.08,
        );
        add(
            format!("{p}self_attn.o_proj.weight"),
            a,
            vec![h, cfg.heads * hd],
            0.08,
        );
        add(
            format!("{p}self_attn.q_norm.weight"),
            DType::F16,
            vec![hd],
            0.0,
        );
        add(
            format!("{p}self_attn.k_norm.weight"),
            DType::F16,
            vec![hd],
            0.0,
        );
        add(
            format!("{p}post_attention_layernorm.weight"),
            DType::F16,
            vec![h],
            0.0,
        );
        let f = ffn_rot[l as usize % ffn_rot.len()];
        if moe_layer(l) {
            add(
                format!("{p}mlp.gate.weight"),
                DType::F32,
                vec![cfg.experts, h],
                0.1,
            );
            // Experts contiguous by role (§2.2): all gate_proj, then all up_proj, then down_proj.
            for role in ["gate_proj", "up_proj", "down_proj"] {
                for e in 0..cfg.experts {
                    let shape = if role == "down_proj" {
                        vec![h, cfg.expert_intermediate]
                    } else {
                        vec![cfg.expert_intermediate, h]
                    };
                    add(format!("{p}mlp.experts.{e}.{role}.weight"), f, shape, 0.08);
                }
            }
        } else {
            add(
                format!("{p}mlp.gate_proj.weight"),
                f,
                vec![cfg.intermediate, h],
                0.08,
            );
            add(
                format!("{p}mlp.up_proj.weight"),
                f,
                vec![cfg.intermediate, h],
                0.08,
            );
            add(
                format!("{p}mlp.down_proj.weight"),
                f,
                vec![h, cfg.intermediate],
                0.08,
            );
        }
    }
    add("model.norm.weight".into(), DType::F16, vec![h], 0.0);
    add("lm_head.weight".into(), DType::Q8_2f, vec![vocab, h], 0.05);
    v
}

fn values(rng: &mut Rng, p: &Planned) -> Vec<f32> {
    let n: u64 = p.plan.shape.iter().product();
    (0..n)
        .map(|_| {
            if p.norm {
                1.0 + 0.1 * rng.normal()
            } else {
                p.std * rng.normal()
            }
        })
        .collect()
}

fn mask_blob(cfg: &DemoConfig, rng: &mut Rng, ffn_keep: f32, experts_keep: Option<u64>) -> Vec<u8> {
    let ffn_bytes = cfg.intermediate.div_ceil(8) as usize;
    let head_bytes = cfg.heads.div_ceil(8) as usize;
    let mut blob = Vec::new();
    for _ in 0..cfg.layers {
        let mut row = vec![0u8; ffn_bytes];
        for i in 0..cfg.intermediate as usize {
            if rng.unit() < ffn_keep {
                row[i / 8] |= 1 << (i % 8);
            }
        }
        blob.extend(row);
    }
    for _ in 0..cfg.layers {
        let mut row = vec![0u8; head_bytes];
        for i in 0..cfg.heads as usize {
            row[i / 8] |= 1 << (i % 8);
        }
        blob.extend(row);
    }
    let mut gates = vec![0u8; cfg.layers.div_ceil(8) as usize];
    for l in 0..cfg.layers as usize {
        gates[l / 8] |= 1 << (l % 8);
    }
    blob.extend(gates);
    if let Some(keep) = experts_keep {
        let eb = cfg.experts.div_ceil(8) as usize;
        for l in 0..cfg.layers {
            let mut row = vec![0u8; eb];
            // Dense layers keep every bit (a row of ones does not restrict, §5).
            let n = if moe_layer(l) { keep } else { cfg.experts };
            let first = if moe_layer(l) {
                (l * 3) % cfg.experts
            } else {
                0
            };
            for k in 0..n {
                let e = ((first + k) % cfg.experts) as usize;
                row[e / 8] |= 1 << (e % 8);
            }
            blob.extend(row);
        }
    }
    blob
}

impl DemoConfig {
    /// The smallest shape that still has every feature (fuzzing seeds, quick tests).
    pub fn tiny() -> DemoConfig {
        DemoConfig {
            hidden: 32,
            intermediate: 32,
            layers: 6,
            heads: 2,
            kv_heads: 1,
            experts: 4,
            top_k: 2,
            expert_intermediate: 32,
        }
    }
}

/// Writes the demo model to `out`.
pub fn write_demo(out: &Path) -> Result<WriteSummary> {
    write_demo_with(out, &DemoConfig::default())
}

/// Writes a demo-shaped model of the given dimensions to `out`.
pub fn write_demo_with(out: &Path, cfg: &DemoConfig) -> Result<WriteSummary> {
    let (tokenizer, vocab) = demo_tokenizer_json();
    let mut planned = plan(cfg, vocab as u64);
    // A skill "sql" replacing the dense MLP of the last two dense layers.
    let skill_layers: Vec<u64> = (0..cfg.layers)
        .filter(|&l| !moe_layer(l))
        .rev()
        .take(2)
        .collect();
    let mut skill_tensors = Vec::new();
    for &l in skill_layers.iter().rev() {
        for role in ["gate_proj", "up_proj", "down_proj"] {
            let base = format!("model.layers.{l}.mlp.{role}.weight");
            let p = planned
                .iter()
                .find(|p| p.plan.name == base)
                .expect("dense layer tensor");
            skill_tensors.push(Planned {
                plan: TensorPlan {
                    name: format!("skill.sql.{base}"),
                    dtype: DType::Q8_2f,
                    shape: p.plan.shape.clone(),
                },
                std: 0.08,
                norm: false,
            });
        }
    }
    planned.extend(skill_tensors);

    let arch = Arch {
        arch_name: "qwen3_moe".into(),
        hidden_size: cfg.hidden,
        intermediate_size: Some(cfg.intermediate),
        num_layers: cfg.layers,
        num_attention_heads: Some(cfg.heads),
        num_kv_heads: Some(cfg.kv_heads),
        head_dim: Some(cfg.hidden / cfg.heads),
        vocab_size: vocab as u64,
        layer_types: Some(vec!["FullAttention".into(); cfg.layers as usize]),
        rms_norm_eps: Some(1e-6),
        norm_style: Some(NormStyle::Qwen),
        rope_theta: Some(1_000_000.0),
        tie_word_embeddings: Some(false),
        max_position_embeddings: Some(2048),
        moe: Some(Moe {
            num_experts: cfg.experts,
            top_k: cfg.top_k,
            moe_intermediate_size: Some(cfg.expert_intermediate),
            norm_topk_prob: Some(true),
            ..Default::default()
        }),
        ..Default::default()
    };
    let header = Header {
        format: Some("cmf".into()),
        version: Some(2),
        arch: Some(arch),
        // Informational; the reference reader accepts only its own names here.
        quant_type: Some("Q8_ROW".into()),
        provenance: Some(json!({
            "tool": concat!("cortiq-workbench ", env!("CARGO_PKG_VERSION"), " demo"),
            "source_model": "synthetic (deterministic pseudo-random weights)",
            "note": "a demonstration file: every writable dtype, masks with expert fields, a skill, MoE layers"
        })),
        tokenizer_config: Some(TokenizerConfig {
            chat_template: Some(CHATML.into()),
            eos_token_ids: vec![258, 256],
            bos_token_id: None,
            pad_token_id: Some(256),
            ..Default::default()
        }),
        skills: Some(vec![SkillRecord {
            id: "sql".into(),
            name: Some("SQL assistant (demo)".into()),
            layers: skill_layers.iter().rev().copied().collect(),
            input_mask_task: Some("code".into()),
            quality: None,
            ..Default::default()
        }]),
        ..Default::default()
    };
    let mut rng = Rng::new(2026);
    let masks = vec![
        (
            MaskRecord {
                task_id: 0,
                name: "general".into(),
                description: Some("every neuron active".into()),
                sparsity: Some(0.0),
                priority: Some(Priority::Fallback),
                ..Default::default()
            },
            mask_blob(cfg, &mut rng, 1.0, None),
        ),
        (
            MaskRecord {
                task_id: 1,
                name: "code".into(),
                description: Some("half the FFN neurons, 3 of 8 experts per MoE layer".into()),
                sparsity: Some(0.5),
                priority: Some(Priority::Normal),
                has_expert_fields: true,
                ..Default::default()
            },
            mask_blob(cfg, &mut rng, 0.5, Some(3)),
        ),
        (
            MaskRecord {
                task_id: 2,
                name: "chat".into(),
                description: Some("three quarters of the FFN neurons".into()),
                sparsity: Some(0.25),
                priority: Some(Priority::Primary),
                ..Default::default()
            },
            mask_blob(cfg, &mut rng, 0.75, None),
        ),
    ];
    let (records, blobs): (Vec<_>, Vec<_>) = masks.into_iter().unzip();
    let spec = WriteSpec {
        header,
        tensors: planned.iter().map(|p| p.plan.clone()).collect(),
        masks: Some(build_section(Some("general".into()), records, &blobs)),
        vocab: Some(tokenizer),
        index: None,
        extra_features: 0,
    };
    let mut w = StreamWriter::create(out, spec)?;
    let opts = EncodeOptions {
        mean_bits: Some(4.5),
        outlier_fraction: Some(0.01),
    };
    for p in &planned {
        let vals = values(&mut rng, p);
        let bytes = quant::encode(p.plan.dtype, &p.plan.shape, &vals, &opts).map_err(|e| {
            crate::format::FormatError::Parse(format!("encode {}: {e}", p.plan.name))
        })?;
        w.write_tensor(&bytes)?;
    }
    w.finish()
}

/// A large file for benchmarks: `layers` layers of q8_row matrices `[dim, dim]` (random
/// bytes, valid payloads), about `layers · 7 · dim²` bytes.
pub fn write_bench_file(out: &Path, dim: u64, layers: u64) -> Result<WriteSummary> {
    let header = Header {
        format: Some("cmf".into()),
        version: Some(2),
        // A complete llama-like arch, so that readers which require every field open it.
        arch: Some(Arch {
            arch_name: "llama".into(),
            hidden_size: dim,
            intermediate_size: Some(dim),
            num_layers: layers,
            num_attention_heads: Some(16),
            num_kv_heads: Some(16),
            head_dim: Some(dim / 16),
            vocab_size: dim,
            layer_types: Some(vec!["FullAttention".into(); layers as usize]),
            rms_norm_eps: Some(1e-6),
            norm_style: Some(NormStyle::Qwen),
            rope_theta: Some(10000.0),
            tie_word_embeddings: Some(false),
            max_position_embeddings: Some(4096),
            ..Default::default()
        }),
        quant_type: Some("Q8_ROW".into()),
        provenance: Some(
            json!({"tool": "cortiq-workbench bench file", "source_model": "random bytes"}),
        ),
        ..Default::default()
    };
    let names = [
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    ];
    let mut tensors = Vec::new();
    for l in 0..layers {
        for n in names {
            tensors.push(TensorPlan {
                name: format!("model.layers.{l}.{n}.weight"),
                dtype: DType::Q8Row,
                shape: vec![dim, dim],
            });
        }
    }
    let spec = WriteSpec {
        header,
        tensors,
        ..Default::default()
    };
    let mut w = StreamWriter::create(out, spec)?;
    let mut rng = Rng::new(7);
    let mut buf = vec![0u8; (dim * dim + 2 * dim) as usize];
    let half_scale = half::f16::from_f32(0.001).to_le_bytes();
    while w.next_plan().is_some() {
        for c in buf[..(dim * dim) as usize].chunks_mut(8) {
            let r = rng.next_u64().to_le_bytes();
            c.copy_from_slice(&r[..c.len()]);
        }
        for s in buf[(dim * dim) as usize..].chunks_mut(2) {
            s.copy_from_slice(&half_scale);
        }
        w.write_tensor(&buf)?;
    }
    w.finish()
}
