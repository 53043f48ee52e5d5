//! Small self-made models of any block combination (attention with or without the output
//! gate, Gated DeltaNet, dense or MoE feed-forwards, an MTP head), written as CMF files
//! for tests and benchmarks: no real model at hand has an MTP head, and the fixtures'
//! sizes are powers of two. Weights are pseudo-random and deterministic.
//!
//! With [`TinySpec::successor`], the model is built to continue every token `t` with
//! `P(t)` for a fixed permutation `P` (the LM head's rows are the embedding's, permuted,
//! and the layers' weights are small), and its MTP head to predict the token after next
//! the same way: a draft that is usually right, as a trained head's is.

use std::path::Path;

use serde_json::json;

use crate::format::dtype::DType;
use crate::format::header::{Arch, Header, Moe, Mtp, NormStyle, TokenizerConfig};
use crate::format::writer::{StreamWriter, TensorPlan, WriteSpec, WriteSummary};
use crate::format::Result;
use crate::quant::{self, EncodeOptions};
use crate::synth::{demo_tokenizer_json, Rng};

#[derive(Clone, Debug, PartialEq)]
pub enum TinyMixer {
    Attention {
        /// `q_proj` carries an output gate (Qwen3.5's full-attention layers).
        gated: bool,
    },
    GatedDeltaNet {
        key_heads: u64,
        value_heads: u64,
        dk: u64,
        dv: u64,
        kernel: u64,
    },
}

#[derive(Clone, Debug, PartialEq)]
pub enum TinyFf {
    Dense {
        intermediate: u64,
    },
    Moe {
        experts: u64,
        top_k: u64,
        intermediate: u64,
        shared: Option<u64>,
    },
}

#[derive(Clone, Debug, PartialEq)]
pub struct TinyLayer {
    pub mixer: TinyMixer,
    pub ff: TinyFf,
}

impl TinyLayer {
    /// Attention (no output gate) and a dense FFN `intermediate` wide.
    pub fn attention_dense(intermediate: u64) -> TinyLayer {
        TinyLayer {
            mixer: TinyMixer::Attention { gated: false },
            ff: TinyFf::Dense { intermediate },
        }
    }

    /// A Gated DeltaNet of one key head of `dk` and three value heads of `dv` (kernel 2)
    /// and a dense FFN `intermediate` wide.
    pub fn deltanet_dense(dk: u64, dv: u64, intermediate: u64) -> TinyLayer {
        TinyLayer {
            mixer: TinyMixer::GatedDeltaNet {
                key_heads: 1,
                value_heads: 3,
                dk,
                dv,
                kernel: 2,
            },
            ff: TinyFf::Dense { intermediate },
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct TinySpec {
    pub hidden: u64,
    pub heads: u64,
    pub kv_heads: u64,
    pub head_dim: u64,
    pub layers: Vec<TinyLayer>,
    /// An MTP head of one attention + dense layer (§2.1).
    pub mtp: bool,
    /// The dtype of every matrix (vectors are f32).
    pub dtype: DType,
    pub norm_topk_prob: bool,
    /// `x̂·(1+w)` norms (`norm_style` gemma).
    pub zero_centred: bool,
    pub partial_rotary: f64,
    /// Build the successor structure (see the module comment).
    pub successor: bool,
    pub seed: u64,
    /// `arch.moe.num_experts` when it differs from the experts present (a §11.1
    /// defragmented file keeps the original count as nominal).
    pub nominal_experts: Option<u64>,
}

impl TinySpec {
    /// Hidden 72, 3 heads of 24 (2 KV heads), vocabulary 259: no power of two in sight.
    pub fn awkward(layers: Vec<TinyLayer>) -> TinySpec {
        TinySpec {
            hidden: 72,
            heads: 3,
            kv_heads: 1,
            head_dim: 24,
            layers,
            mtp: false,
            dtype: DType::F32,
            norm_topk_prob: true,
            zero_centred: false,
            partial_rotary: 1.0,
            successor: false,
            seed: 11,
            nominal_experts: None,
        }
    }

    /// Every kind of block in four layers: a Gated DeltaNet + MoE (shared expert), a gated
    /// attention + dense, a Gated DeltaNet + dense, a plain attention + MoE.
    pub fn hybrid() -> TinySpec {
        let gdn = TinyMixer::GatedDeltaNet {
            key_heads: 2,
            value_heads: 6,
            dk: 12,
            dv: 20,
            kernel: 3,
        };
        let moe = |shared| TinyFf::Moe {
            experts: 7,
            top_k: 3,
            intermediate: 40,
            shared,
        };
        TinySpec {
            zero_centred: true,
            partial_rotary: 0.5,
            ..TinySpec::awkward(vec![
                TinyLayer {
                    mixer: gdn.clone(),
                    ff: moe(Some(56)),
                },
                TinyLayer {
                    mixer: TinyMixer::Attention { gated: true },
                    ff: TinyFf::Dense { intermediate: 120 },
                },
                TinyLayer {
                    mixer: gdn,
                    ff: TinyFf::Dense { intermediate: 96 },
                },
                TinyLayer {
                    mixer: TinyMixer::Attention { gated: false },
                    ff: moe(None),
                },
            ])
        }
    }
}

impl TinySpec {
    /// A hybrid of `hidden` width (a multiple of 64) and `layers` layers (the 4-layer
    /// pattern of [`TinySpec::hybrid`] repeated: linear·MoE, gated full·dense,
    /// linear·dense, full·MoE), q8 weights, an MTP head and the successor structure:
    /// large enough for decode to be bound by memory, as with real models, so that
    /// speculative decoding's speed-up can be measured.
    pub fn hybrid_scaled(hidden: u64, layers: usize) -> TinySpec {
        let heads = (hidden / 64).max(1);
        let gdn = TinyMixer::GatedDeltaNet {
            key_heads: (heads / 2).max(1),
            value_heads: heads,
            dk: 64,
            dv: 64,
            kernel: 4,
        };
        let moe = |shared| TinyFf::Moe {
            experts: 16,
            top_k: 4,
            intermediate: hidden / 2,
            shared,
        };
        let pattern = [
            TinyLayer {
                mixer: gdn.clone(),
                ff: moe(Some(hidden)),
            },
            TinyLayer {
                mixer: TinyMixer::Attention { gated: true },
                ff: TinyFf::Dense {
                    intermediate: 3 * hidden,
                },
            },
            TinyLayer {
                mixer: gdn,
                ff: TinyFf::Dense {
                    intermediate: 3 * hidden,
                },
            },
            TinyLayer {
                mixer: TinyMixer::Attention { gated: false },
                ff: moe(None),
            },
        ];
        TinySpec {
            hidden,
            heads,
            kv_heads: (heads / 4).max(1),
            head_dim: 64,
            layers: (0..layers).map(|i| pattern[i % 4].clone()).collect(),
            mtp: true,
            dtype: DType::Q8Row,
            norm_topk_prob: true,
            zero_centred: true,
            partial_rotary: 0.25,
            successor: true,
            seed: 5,
            nominal_experts: None,
        }
    }
}

struct Planned {
    plan: TensorPlan,
    values: Vec<f32>,
}

/// Appends one transformer layer's tensors under `p` (ending in `.`).
fn layer_tensors(
    spec: &TinySpec,
    layer: &TinyLayer,
    p: &str,
    rng: &mut Rng,
    std: f32,
    out: &mut Vec<Planned>,
) {
    let h = spec.hidden;
    let mut add = |name: String, dtype: DType, shape: Vec<u64>, vals: Vec<f32>| {
        out.push(Planned {
            plan: TensorPlan { name, dtype, shape },
            values: vals,
        })
    };
    let normal =
        |rng: &mut Rng, n: u64, s: f32| -> Vec<f32> { (0..n).map(|_| s * rng.normal()).collect() };
    let norm_w = |rng: &mut Rng, n: u64| -> Vec<f32> {
        // Near 1 either way (zero-centred weights are stored as w − 1).
        let base = if spec.zero_centred { 0.0 } else { 1.0 };
        (0..n).map(|_| base + 0.1 * rng.normal()).collect()
    };
    let m = spec.dtype;
    let v = norm_w(rng, h);
    add(format!("{p}input_layernorm.weight"), DType::F32, vec![h], v);
    match &layer.mixer {
        TinyMixer::Attention { gated } => {
            let hd = spec.head_dim;
            let q_rows = spec.heads * hd * if *gated { 2 } else { 1 };
            let a = format!("{p}self_attn.");
            let v = normal(rng, q_rows * h, std);
            add(format!("{a}q_proj.weight"), m, vec![q_rows, h], v);
            for n in ["k_proj", "v_proj"] {
                let v = normal(rng, spec.kv_heads * hd * h, std);
                add(format!("{a}{n}.weight"), m, vec![spec.kv_heads * hd, h], v);
            }
            let v = normal(rng, h * spec.heads * hd, std);
            add(format!("{a}o_proj.weight"), m, vec![h, spec.heads * hd], v);
            for n in ["q_norm", "k_norm"] {
                let v = norm_w(rng, hd);
                add(format!("{a}{n}.weight"), DType::F32, vec![hd], v);
            }
        }
        TinyMixer::GatedDeltaNet {
            key_heads,
            value_heads,
            dk,
            dv,
            kernel,
        } => {
            let a = format!("{p}linear_attn.");
            let (kd, vd) = (key_heads * dk, value_heads * dv);
            let cd = 2 * kd + vd;
            let v = normal(rng, cd * h, std);
            add(format!("{a}in_proj_qkv.weight"), m, vec![cd, h], v);
            let v = normal(rng, vd * h, std);
            add(format!("{a}in_proj_z.weight"), m, vec![vd, h], v);
            for n in ["in_proj_a", "in_proj_b"] {
                let v = normal(rng, value_heads * h, std * 3.0);
                add(format!("{a}{n}.weight"), m, vec![*value_heads, h], v);
            }
            let v = normal(rng, cd * kernel, 0.3);
            add(
                format!("{a}conv1d.weight"),
                DType::F32,
                vec![cd, 1, *kernel],
                v,
            );
            let v = (0..*value_heads).map(|_| 0.5 + 0.5 * rng.unit()).collect();
            add(format!("{a}A_log"), DType::F32, vec![*value_heads], v);
            let v = (0..*value_heads)
                .map(|_| 1.0 + 0.2 * rng.normal())
                .collect();
            add(format!("{a}dt_bias"), DType::F32, vec![*value_heads], v);
            let v = (0..*dv).map(|_| 1.0 + 0.1 * rng.normal()).collect();
            add(format!("{a}norm.weight"), DType::F32, vec![*dv], v);
            let v = normal(rng, h * vd, std);
            add(format!("{a}out_proj.weight"), m, vec![h, vd], v);
        }
    }
    let v = norm_w(rng, h);
    add(
        format!("{p}post_attention_layernorm.weight"),
        DType::F32,
        vec![h],
        v,
    );
    let mlp = |prefix: String,
               inter: u64,
               rng: &mut Rng,
               add: &mut dyn FnMut(String, DType, Vec<u64>, Vec<f32>)| {
        for n in ["gate_proj", "up_proj"] {
            let v = normal(rng, inter * h, std);
            add(format!("{prefix}{n}.weight"), m, vec![inter, h], v);
        }
        let v = normal(rng, h * inter, std);
        add(format!("{prefix}down_proj.weight"), m, vec![h, inter], v);
    };
    match &layer.ff {
        TinyFf::Dense { intermediate } => {
            mlp(format!("{p}mlp."), *intermediate, rng, &mut add);
        }
        TinyFf::Moe {
            experts,
            intermediate,
            shared,
            ..
        } => {
            let v = normal(rng, experts * h, 0.3);
            add(
                format!("{p}mlp.gate.weight"),
                DType::F32,
                vec![*experts, h],
                v,
            );
            for e in 0..*experts {
                mlp(format!("{p}mlp.experts.{e}."), *intermediate, rng, &mut add);
            }
            if let Some(s) = shared {
                mlp(format!("{p}mlp.shared_expert."), *s, rng, &mut add);
                let v = normal(rng, h, 0.3);
                add(
                    format!("{p}mlp.shared_expert_gate.weight"),
                    DType::F32,
                    vec![1, h],
                    v,
                );
            }
        }
    }
}

/// Writes `spec` as a CMF file (with the demo's byte-level tokenizer and ChatML).
pub fn write_tiny(out: &Path, spec: &TinySpec) -> Result<WriteSummary> {
    let (tokenizer, vocab) = demo_tokenizer_json();
    let vocab = vocab as u64;
    let h = spec.hidden;
    let mut rng = Rng::new(spec.seed);
    let std = if spec.successor { 0.01 } else { 0.15 };
    let mut planned = Vec::new();
    let embed: Vec<f32> = (0..vocab * h).map(|_| rng.normal()).collect();
    // The successor permutation: t → (t·97 + 13) mod vocab (97 is prime to 259 = 7·37).
    let succ = |t: u64| (t * 97 + 13) % vocab;
    let lm_head: Vec<f32> = if spec.successor {
        let mut w = vec![0f32; (vocab * h) as usize];
        for t in 0..vocab {
            let (dst, src) = (succ(t) as usize, t as usize);
            w[dst * h as usize..(dst + 1) * h as usize]
                .copy_from_slice(&embed[src * h as usize..(src + 1) * h as usize]);
        }
        w
    } else {
        (0..vocab * h).map(|_| 0.3 * rng.normal()).collect()
    };
    planned.push(Planned {
        plan: TensorPlan {
            name: "model.embed_tokens.weight".into(),
            dtype: spec.dtype,
            shape: vec![vocab, h],
        },
        values: embed,
    });
    for (l, layer) in spec.layers.iter().enumerate() {
        layer_tensors(
            spec,
            layer,
            &format!("model.layers.{l}."),
            &mut rng,
            std,
            &mut planned,
        );
    }
    let final_norm = if spec.zero_centred { 0.0 } else { 1.0 };
    planned.push(Planned {
        plan: TensorPlan {
            name: "model.norm.weight".into(),
            dtype: DType::F32,
            shape: vec![h],
        },
        values: vec![final_norm; h as usize],
    });
    planned.push(Planned {
        plan: TensorPlan {
            name: "lm_head.weight".into(),
            dtype: spec.dtype,
            shape: vec![vocab, h],
        },
        values: lm_head,
    });
    if spec.mtp {
        let ones = vec![final_norm; h as usize];
        for n in ["enorm", "hnorm", "norm"] {
            planned.push(Planned {
                plan: TensorPlan {
                    name: format!("model.mtp.{n}.weight"),
                    dtype: DType::F32,
                    shape: vec![h],
                },
                values: ones.clone(),
            });
        }
        // eh_proj [hidden, 2·hidden]: with the successor structure it passes the
        // embedding half through (so the head continues t_{p+1} with P(t_{p+1})).
        let eh: Vec<f32> = (0..h * 2 * h)
            .map(|i| {
                let (r, c) = (i / (2 * h), i % (2 * h));
                if spec.successor {
                    if c == r {
                        1.0
                    } else {
                        0.01 * rng.normal()
                    }
                } else {
                    0.15 * rng.normal()
                }
            })
            .collect();
        planned.push(Planned {
            plan: TensorPlan {
                name: "model.mtp.eh_proj.weight".into(),
                dtype: spec.dtype,
                shape: vec![h, 2 * h],
            },
            values: eh,
        });
        let block = TinyLayer {
            mixer: TinyMixer::Attention { gated: false },
            ff: TinyFf::Dense {
                intermediate: 2 * h,
            },
        };
        layer_tensors(
            spec,
            &block,
            "model.mtp.layers.0.",
            &mut rng,
            std,
            &mut planned,
        );
    }

    let layer_types = spec
        .layers
        .iter()
        .map(|l| match l.mixer {
            TinyMixer::Attention { .. } => "FullAttention".to_string(),
            TinyMixer::GatedDeltaNet { .. } => "LinearAttention".to_string(),
        })
        .collect();
    let moe = spec.layers.iter().find_map(|l| match l.ff {
        TinyFf::Moe {
            experts,
            top_k,
            intermediate,
            shared,
        } => Some(Moe {
            num_experts: spec.nominal_experts.unwrap_or(experts),
            top_k,
            moe_intermediate_size: Some(intermediate),
            norm_topk_prob: Some(spec.norm_topk_prob),
            shared_expert_intermediate_size: shared,
            ..Default::default()
        }),
        TinyFf::Dense { .. } => None,
    });
    let gdn = spec.layers.iter().find_map(|l| match l.mixer {
        TinyMixer::GatedDeltaNet {
            key_heads,
            value_heads,
            dk,
            dv,
            kernel,
        } => Some((key_heads, value_heads, dk, dv, kernel)),
        TinyMixer::Attention { .. } => None,
    });
    let mut arch = Arch {
        arch_name: "tiny".into(),
        hidden_size: h,
        intermediate_size: None,
        num_layers: spec.layers.len() as u64,
        num_attention_heads: Some(spec.heads),
        num_kv_heads: Some(spec.kv_heads),
        head_dim: Some(spec.head_dim),
        vocab_size: vocab,
        layer_types: Some(layer_types),
        rms_norm_eps: Some(1e-6),
        norm_style: Some(if spec.zero_centred {
            NormStyle::Gemma
        } else {
            NormStyle::Qwen
        }),
        rope_theta: Some(10000.0),
        tie_word_embeddings: Some(false),
        max_position_embeddings: Some(4096),
        partial_rotary_factor: Some(spec.partial_rotary),
        moe,
        mtp: spec.mtp.then(|| Mtp {
            num_layers: 1,
            share_lm_head: Some(true),
            share_embed: Some(true),
            ..Default::default()
        }),
        ..Default::default()
    };
    if let Some((kh, vh, dk, dv, k)) = gdn {
        arch.linear_conv_kernel_dim = Some(k);
        arch.linear_num_key_heads = Some(kh);
        arch.linear_num_value_heads = Some(vh);
        arch.extra.insert("linear_key_head_dim".into(), json!(dk));
        arch.extra.insert("linear_value_head_dim".into(), json!(dv));
    }
    let header = Header {
        format: Some("cmf".into()),
        version: Some(2),
        arch: Some(arch),
        quant_type: Some(format!("{:?}", spec.dtype).to_uppercase()),
        provenance: Some(json!({
            "tool": concat!("cortiq-workbench ", env!("CARGO_PKG_VERSION"), " tiny model"),
            "source_model": "synthetic (deterministic pseudo-random weights)",
        })),
        tokenizer_config: Some(TokenizerConfig {
            chat_template: Some(crate::synth::CHATML.into()),
            eos_token_ids: vec![258],
            pad_token_id: Some(256),
            ..Default::default()
        }),
        ..Default::default()
    };
    let spec_w = WriteSpec {
        header,
        tensors: planned.iter().map(|p| p.plan.clone()).collect(),
        masks: None,
        vocab: Some(tokenizer),
        index: None,
        extra_features: 0,
    };
    let mut w = StreamWriter::create(out, spec_w)?;
    let opts = EncodeOptions::default();
    for p in &planned {
        let bytes = quant::encode(p.plan.dtype, &p.plan.shape, &p.values, &opts).map_err(|e| {
            crate::format::FormatError::Parse(format!("encode {}: {e}", p.plan.name))
        })?;
        w.write_tensor(&bytes)?;
    }
    w.finish()
}
