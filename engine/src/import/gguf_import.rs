//! GGUF → CMF: tensor names and architecture from GGUF metadata, llama.cpp's storage
//! conventions undone, and the streaming conversion itself.
//!
//! Conventions of llama.cpp's converter that this module reverses:
//! - dims are innermost-first: the Hugging Face shape is the reversed dims, and the data
//!   is already row-major for it;
//! - for `llama`, the rows of `attn_q` / `attn_k` are permuted per head so that the two
//!   rotary halves interleave (HF row `h·hd + i·hd/2 + j` is stored at `h·hd + 2j + i`);
//! - for Gemma, every `*norm.weight` is stored as `1 + w` (HF's Gemma RMSNorm computes
//!   `x̂·(1 + w)`). We subtract 1 again and write `norm_style: "gemma"`, so that a GGUF
//!   import and a Hugging Face conversion of the same model carry the same values. The
//!   subtraction is exact for stored values in [0.5, 2] (Sterbenz), so `1 + (w − 1)`
//!   reproduces llama.cpp's weight exactly there and within one f32 ulp elsewhere.

use std::borrow::Cow;
use std::ops::Range;
use std::path::{Path, PathBuf};

use rayon::prelude::*;

use serde_json::json;

use super::ggml::{self, GgmlType};
use super::gguf::{Gguf, GgufError, GgufFile, TensorInfo};
use crate::format::header::{Arch, Header, NormStyle, TokenizerConfig};
use crate::format::writer::{StreamWriter, TensorPlan, WriteSpec, WriteSummary};
use crate::format::{DType, FormatError};
use crate::quant::matrix::Matrix;
use crate::quant::rows::MaxF32;
use crate::quant::{self, EncodeOptions, QuantError};

/// Why an import failed.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    /// The GGUF file itself is invalid.
    #[error(transparent)]
    Gguf(#[from] GgufError),
    /// The file is valid GGUF but describes something this importer cannot map
    /// (unknown architecture, unknown tensor name, missing metadata, odd shapes).
    #[error("{0}")]
    Unsupported(String),
    /// A tensor's payload could not be dequantized.
    #[error(transparent)]
    Dequant(#[from] ggml::DequantError),
    /// Re-encoding a tensor failed.
    #[error("tensor {tensor:?}: {source}")]
    Encode {
        tensor: String,
        #[source]
        source: QuantError,
    },
    /// The vocabulary could not be turned into a `tokenizer.json`.
    #[error(transparent)]
    Tokenizer(#[from] super::gguf_tokenizer::TokenizerError),
    /// Writing the CMF file failed.
    #[error(transparent)]
    Write(#[from] FormatError),
}

pub type Result<T> = std::result::Result<T, ImportError>;

fn unsupported(msg: impl Into<String>) -> ImportError {
    ImportError::Unsupported(msg.into())
}

/// Architectures with a name mapping, and the `arch_name` each becomes (HF `model_type`).
pub const SUPPORTED_ARCHS: [(&str, &str); 4] = [
    ("llama", "llama"),
    ("qwen2", "qwen2"),
    ("qwen3", "qwen3"),
    ("gemma3", "gemma3_text"),
];

/// Maps a GGUF tensor name to its Hugging Face name for architecture `arch`.
pub fn hf_name(arch: &str, name: &str) -> Option<String> {
    let gemma = arch.starts_with("gemma");
    match name {
        "token_embd.weight" => return Some("model.embed_tokens.weight".into()),
        "output_norm.weight" => return Some("model.norm.weight".into()),
        "output.weight" => return Some("lm_head.weight".into()),
        _ => {}
    }
    let rest = name.strip_prefix("blk.")?;
    let (layer, rest) = rest.split_once('.')?;
    let layer: u64 = layer.parse().ok()?;
    let (part, suffix) = rest.rsplit_once('.')?;
    if suffix != "weight" && suffix != "bias" {
        return None;
    }
    let hf = match part {
        "attn_q" => "self_attn.q_proj",
        "attn_k" => "self_attn.k_proj",
        "attn_v" => "self_attn.v_proj",
        "attn_output" => "self_attn.o_proj",
        "attn_q_norm" => "self_attn.q_norm",
        "attn_k_norm" => "self_attn.k_norm",
        "attn_norm" => "input_layernorm",
        "ffn_gate" => "mlp.gate_proj",
        "ffn_up" => "mlp.up_proj",
        "ffn_down" => "mlp.down_proj",
        // Gemma's sandwich norms: `ffn_norm` is the pre-FFN norm there, while llama-like
        // models call their only second norm `post_attention_layernorm`.
        "ffn_norm" if gemma => "pre_feedforward_layernorm",
        "ffn_norm" => "post_attention_layernorm",
        "post_attention_norm" => "post_attention_layernorm",
        "post_ffw_norm" => "post_feedforward_layernorm",
        _ => return None,
    };
    Some(format!("model.layers.{layer}.{hf}.{suffix}"))
}

/// More layers than any model has; a larger `block_count` is refused.
const MAX_LAYERS: u64 = 4096;

/// The `arch` header object from GGUF metadata.
pub fn arch_from_metadata(g: &Gguf) -> Result<Arch> {
    let a = g
        .architecture()
        .ok_or_else(|| unsupported("general.architecture is missing"))?;
    let arch_name = SUPPORTED_ARCHS
        .iter()
        .find(|(k, _)| *k == a)
        .map(|(_, v)| v.to_string())
        .ok_or_else(|| {
            unsupported(format!(
                "architecture {a:?} is not supported (llama, qwen2, qwen3, gemma3 are)"
            ))
        })?;
    let key = |k: &str| format!("{a}.{k}");
    let need = |k: &str| {
        g.get_u64(&key(k))
            .ok_or_else(|| unsupported(format!("metadata {} is missing", key(k))))
    };
    let hidden = need("embedding_length")?;
    let layers = need("block_count")?;
    // Checked before anything is sized by it (a hostile count would exhaust memory).
    if layers > MAX_LAYERS {
        return Err(unsupported(format!(
            "{} = {layers} exceeds {MAX_LAYERS} layers",
            key("block_count")
        )));
    }
    let heads = need("attention.head_count")?;
    let kv_heads = g.get_u64(&key("attention.head_count_kv")).unwrap_or(heads);
    if heads == 0 || kv_heads == 0 {
        return Err(unsupported("head counts must be positive"));
    }
    let head_dim = g
        .get_u64(&key("attention.key_length"))
        .unwrap_or(hidden / heads);
    let vocab = match g.get("tokenizer.ggml.tokens").and_then(|v| v.as_array()) {
        Some(t) => t.len() as u64,
        None => g
            .tensor("token_embd.weight")
            .and_then(|t| t.dims.get(1).copied())
            .ok_or_else(|| unsupported("no tokenizer.ggml.tokens and no token_embd.weight"))?,
    };
    let gemma = a.starts_with("gemma");
    let mut arch = Arch {
        arch_name,
        hidden_size: hidden,
        intermediate_size: g.get_u64(&key("feed_forward_length")),
        num_layers: layers,
        num_attention_heads: Some(heads),
        num_kv_heads: Some(kv_heads),
        head_dim: Some(head_dim),
        vocab_size: vocab,
        layer_types: None,
        rms_norm_eps: g.get_f64(&key("attention.layer_norm_rms_epsilon")),
        norm_style: Some(if gemma {
            NormStyle::Gemma
        } else {
            NormStyle::Qwen
        }),
        rope_theta: Some(g.get_f64(&key("rope.freq_base")).unwrap_or(if gemma {
            1_000_000.0
        } else {
            10_000.0
        })),
        tie_word_embeddings: Some(g.tensor("output.weight").is_none()),
        partial_rotary_factor: Some(1.0),
        max_position_embeddings: g.get_u64(&key("context_length")),
        ..Arch::default()
    };
    let layer_types: Vec<String> = (0..layers)
        .map(|l| {
            // Gemma 3 interleaves five sliding-window layers with one global layer;
            // llama.cpp does not store the pattern, it hard-codes the same rule.
            if gemma && g.get_u64(&key("attention.sliding_window")).is_some() && (l + 1) % 6 != 0 {
                "SlidingAttention".to_string()
            } else {
                "FullAttention".to_string()
            }
        })
        .collect();
    arch.layer_types = Some(layer_types);
    if gemma {
        arch.extra.insert("hidden_act".into(), json!("gelu_tanh"));
        // The f32 √hidden llama.cpp scales by; `convert` writes the same value.
        arch.extra.insert(
            "embed_multiplier".into(),
            json!(super::hf::embed_scale(hidden)),
        );
        arch.extra
            .insert("query_pre_attn_scalar".into(), json!(head_dim as f64));
        if let Some(w) = g.get_u64(&key("attention.sliding_window")) {
            arch.extra.insert("sliding_window".into(), json!(w));
        }
        // Gemma 3's sliding layers rotate with their own base; GGUF files rarely carry it
        // (llama.cpp hard-codes 10000 for gemma3), and without it the engine would use the
        // global `rope.freq_base` (10^6) for every layer.
        let local = g
            .get_f64(&key("rope.freq_base_swa"))
            .or((a == "gemma3").then_some(10_000.0));
        if let Some(local) = local {
            arch.extra
                .insert("rope_local_base_freq".into(), json!(local));
        }
    }
    Ok(arch)
}

/// The chat bundle from `tokenizer.*` metadata (chat template, BOS/EOS/PAD ids).
pub fn tokenizer_config(g: &Gguf) -> Option<TokenizerConfig> {
    let id = |k: &str| g.get_u64(k).and_then(|v| u32::try_from(v).ok());
    let cfg = TokenizerConfig {
        chat_template: g.get_str("tokenizer.chat_template").map(str::to_string),
        eos_token_ids: eos_ids(g),
        bos_token_id: id("tokenizer.ggml.bos_token_id"),
        pad_token_id: id("tokenizer.ggml.padding_token_id"),
        ..TokenizerConfig::default()
    };
    (cfg != TokenizerConfig::default()).then_some(cfg)
}

/// Generation stops at EOS and at the end-of-turn / end-of-message tokens llama.cpp
/// records separately (chat models end a turn with `<|im_end|>` or `<end_of_turn>`).
fn eos_ids(g: &Gguf) -> Vec<u32> {
    let mut ids: Vec<u32> = Vec::new();
    for k in [
        "tokenizer.ggml.eos_token_id",
        "tokenizer.ggml.eot_token_id",
        "tokenizer.ggml.eom_token_id",
    ] {
        if let Some(v) = g.get_u64(k).and_then(|v| u32::try_from(v).ok()) {
            if !ids.contains(&v) {
                ids.push(v);
            }
        }
    }
    ids
}

/// One tensor of the import: where it comes from and what it becomes.
#[derive(Clone, Debug)]
pub struct MappedTensor {
    pub gguf_name: String,
    pub hf_name: String,
    /// Row-major shape (reversed ggml dims).
    pub shape: Vec<u64>,
    pub ggml_type: GgmlType,
    /// `Some(n_heads)`: rows were permuted per head by llama.cpp and are restored.
    pub unpermute_heads: Option<u64>,
    /// Gemma norm weights stored as `1 + w`.
    pub minus_one: bool,
}

/// Maps every tensor of `g`; an unknown name is an error (an import that silently drops
/// a tensor would not run like the original).
pub fn map_tensors(g: &Gguf) -> Result<Vec<MappedTensor>> {
    let a = g.architecture().unwrap_or_default();
    let heads = g.get_u64(&format!("{a}.attention.head_count"));
    let kv_heads = g.get_u64(&format!("{a}.attention.head_count_kv")).or(heads);
    g.tensors
        .iter()
        .map(|t| {
            // An empty tensor has no data to bound the work on it: every pass over its rows
            // (encoding, un-permuting heads, measuring the error) would run as long as the
            // file's dims say, from a source of no bytes (fuzzed 1-2 KB files wrote
            // gigabytes or looped for a billion rows). No model has one.
            if t.dims.contains(&0) {
                return Err(unsupported(format!(
                    "tensor {:?} is empty (ggml dims {:?})",
                    t.name, t.dims
                )));
            }
            let hf = hf_name(a, &t.name).ok_or_else(|| {
                unsupported(format!("tensor {:?} has no mapping for {a}", t.name))
            })?;
            let unpermute_heads = if a == "llama" {
                if t.name.contains(".attn_q.") {
                    heads
                } else if t.name.contains(".attn_k.") {
                    kv_heads
                } else {
                    None
                }
            } else {
                None
            };
            Ok(MappedTensor {
                gguf_name: t.name.clone(),
                hf_name: hf,
                shape: t.shape_row_major(),
                ggml_type: t.ggml_type,
                unpermute_heads,
                minus_one: a.starts_with("gemma") && t.name.ends_with("norm.weight"),
            })
        })
        .collect()
}

/// Undoes llama.cpp's per-head row interleave on raw bytes (any ggml type: rows are whole
/// blocks). `units` rows of `data.len() / units` bytes; a 1-D tensor (a bias) permutes
/// its elements.
pub fn unpermute_rows(t: &TensorInfo, data: &[u8], n_heads: u64) -> Result<Vec<u8>> {
    let units = if t.dims.len() <= 1 {
        if t.ggml_type.block().0 != 1 {
            return Err(unsupported(format!(
                "{}: cannot permute elements of a block-quantized 1-D tensor",
                t.name
            )));
        }
        t.dims.first().copied().unwrap_or(1)
    } else {
        // Checked: with a zero innermost dim the parser's element count cannot bound this.
        t.dims[1..]
            .iter()
            .try_fold(1u64, |a, &d| a.checked_mul(d))
            .ok_or_else(|| unsupported(format!("{}: row count overflows", t.name)))?
    };
    let bad = || {
        unsupported(format!(
            "{}: {units} rows do not split into {n_heads} heads of an even size",
            t.name
        ))
    };
    if n_heads == 0 || !units.is_multiple_of(n_heads) || !(units / n_heads).is_multiple_of(2) {
        return Err(bad());
    }
    let units = usize::try_from(units).map_err(|_| bad())?;
    if units == 0 || !data.len().is_multiple_of(units) {
        return Err(bad());
    }
    let row = data.len() / units;
    if row == 0 {
        // No data, nothing to move (the importer refuses empty tensors before this; here
        // the loop over rows would be bounded by the dims alone).
        return Ok(Vec::new());
    }
    let hd = units / n_heads as usize;
    let half = hd / 2;
    let mut out = vec![0u8; data.len()];
    for h in 0..n_heads as usize {
        for i in 0..2 {
            for j in 0..half {
                let dst = h * hd + i * half + j;
                let src = h * hd + 2 * j + i;
                out[dst * row..(dst + 1) * row].copy_from_slice(&data[src * row..(src + 1) * row]);
            }
        }
    }
    Ok(out)
}

/// `--quant`: keep the source where a CMF dtype holds it exactly, or one codec for all.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QuantMode {
    /// F32/F16/BF16 as they are, Q4_0 as `q4_tiled`; everything else re-encoded with the
    /// fallback: `q8_row` for 2-D tensors with `cols % 32 == 0`, else `f16`.
    Keep,
    /// Every 2-D tensor re-encoded with this codec (where its shape allows; otherwise the
    /// fallback); 1-D float tensors kept, other 1-D tensors as `f16`.
    Codec(DType),
}

impl QuantMode {
    pub fn parse(s: &str) -> Option<QuantMode> {
        if s.eq_ignore_ascii_case("keep") {
            return Some(QuantMode::Keep);
        }
        DType::from_name(s)
            .filter(|d| crate::format::dtype::WRITABLE.contains(d))
            .map(QuantMode::Codec)
    }

    pub fn name(self) -> String {
        match self {
            QuantMode::Keep => "keep".into(),
            QuantMode::Codec(d) => d.name().into(),
        }
    }
}

fn float_dtype(t: GgmlType) -> Option<DType> {
    match t {
        GgmlType::F32 => Some(DType::F32),
        GgmlType::F16 => Some(DType::F16),
        GgmlType::BF16 => Some(DType::Bf16),
        _ => None,
    }
}

fn fallback(shape: &[u64]) -> DType {
    if shape.len() == 2 && shape[1].is_multiple_of(32) {
        DType::Q8Row
    } else {
        DType::F16
    }
}

/// The dtype a tensor is written as, and whether its source bytes are stored unchanged
/// (after row un-permutation, which moves whole rows).
pub fn target_dtype(mode: QuantMode, m: &MappedTensor) -> (DType, bool) {
    let exact = !m.minus_one;
    if crate::format::dtype::always_float(&m.shape) {
        return match float_dtype(m.ggml_type) {
            Some(f) if exact => (f, true),
            Some(_) => (DType::F32, false),
            None => (DType::F16, false),
        };
    }
    match mode {
        QuantMode::Keep => match (float_dtype(m.ggml_type), m.ggml_type) {
            (Some(d), _) if exact => (d, true),
            (Some(_), _) => (DType::F32, false),
            (None, GgmlType::Q4_0) => (DType::Q4Tiled, true),
            _ => (fallback(&m.shape), false),
        },
        QuantMode::Codec(d) => {
            if d == DType::Q4Tiled && m.ggml_type == GgmlType::Q4_0 && exact {
                return (d, true);
            }
            if float_dtype(m.ggml_type) == Some(d) && exact {
                return (d, true);
            }
            if d.size_for(&m.shape).is_ok() {
                (d, false)
            } else {
                (fallback(&m.shape), false)
            }
        }
    }
}

/// A per-tensor exception to the import's quant mode (`import-gguf --quant-layer`): the
/// tensors of `layers` whose name within the layer contains `part` are written as `mode`
/// writes them ([`target_dtype`] with that mode, so norms stay float and a shape the codec
/// cannot hold takes the fallback). Rules apply in order and the last match wins, so a
/// broad rule can be refined by a narrower one after it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DTypeOverride {
    /// Inclusive layer ranges (`model.layers.N.`); `None` (`*`) matches every tensor,
    /// inside a layer or not (`*:lm_head=f16`).
    pub layers: Option<Vec<std::ops::RangeInclusive<u64>>>,
    /// A substring of the Hugging Face name after `model.layers.N.` (`mlp`, `self_attn`,
    /// `down_proj`; the whole name for `*`); empty: every tensor of those layers.
    pub part: String,
    pub mode: QuantMode,
}

impl DTypeOverride {
    /// `LAYERS[:PART]=DTYPE`, LAYERS a list of numbers and ranges or `*`:
    /// `28,29=q8`, `28-29:mlp=q4`, `0-3,10=keep`, `*:lm_head=f16`.
    pub fn parse(s: &str) -> std::result::Result<DTypeOverride, String> {
        let bad =
            |why: &str| format!("{s:?}: {why} (expected LAYERS[:PART]=DTYPE, e.g. 28-29:mlp=q4)");
        let (lhs, dtype) = s.rsplit_once('=').ok_or_else(|| bad("no '='"))?;
        let mode = QuantMode::parse(dtype.trim())
            .ok_or_else(|| bad(&format!("{dtype:?} is not keep or a writable dtype")))?;
        let (layers, part) = lhs.split_once(':').unwrap_or((lhs, ""));
        let layers = match layers.trim() {
            "*" => None,
            list => {
                let num = |t: &str| {
                    t.trim()
                        .parse::<u64>()
                        .map_err(|_| bad(&format!("{t:?} is not a layer number")))
                };
                let ranges = list
                    .split(',')
                    .map(|item| match item.split_once('-') {
                        Some((a, b)) => {
                            let (a, b) = (num(a)?, num(b)?);
                            if a > b {
                                return Err(bad(&format!("empty range {a}-{b}")));
                            }
                            Ok(a..=b)
                        }
                        None => num(item).map(|l| l..=l),
                    })
                    .collect::<std::result::Result<Vec<_>, _>>()?;
                Some(ranges)
            }
        };
        Ok(DTypeOverride {
            layers,
            part: part.trim().to_string(),
            mode,
        })
    }

    /// Whether the tensor named `hf_name` (a Hugging Face name) falls under this rule.
    pub fn matches(&self, hf_name: &str) -> bool {
        match &self.layers {
            None => hf_name.contains(&self.part),
            Some(ranges) => layer_of(hf_name).is_some_and(|(l, rest)| {
                ranges.iter().any(|r| r.contains(&l)) && rest.contains(&self.part)
            }),
        }
    }
}

/// The canonical form [`DTypeOverride::parse`] reads back (provenance records it).
impl std::fmt::Display for DTypeOverride {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.layers {
            None => f.write_str("*")?,
            Some(ranges) => {
                let items: Vec<String> = ranges
                    .iter()
                    .map(|r| match r.start() == r.end() {
                        true => r.start().to_string(),
                        false => format!("{}-{}", r.start(), r.end()),
                    })
                    .collect();
                f.write_str(&items.join(","))?;
            }
        }
        if !self.part.is_empty() {
            write!(f, ":{}", self.part)?;
        }
        write!(f, "={}", self.mode.name())
    }
}

/// `model.layers.N.rest` → `(N, rest)`.
fn layer_of(hf_name: &str) -> Option<(u64, &str)> {
    let (n, rest) = hf_name.strip_prefix("model.layers.")?.split_once('.')?;
    Some((n.parse().ok()?, rest))
}

/// [`target_dtype`] after the overrides: the last rule matching `m` decides, as if its
/// mode were the import's for that tensor alone.
pub fn target_dtype_with(
    mode: QuantMode,
    overrides: &[DTypeOverride],
    m: &MappedTensor,
) -> (DType, bool) {
    let mode = overrides
        .iter()
        .rev()
        .find(|o| o.matches(&m.hf_name))
        .map_or(mode, |o| o.mode);
    target_dtype(mode, m)
}

/// What an import can be told beyond its quant mode.
#[derive(Clone, Debug, Default)]
pub struct ImportOptions {
    /// Encoder knobs for the re-encoded tensors (`--mean-bits`).
    pub encode: EncodeOptions,
    /// Per-tensor dtype exceptions ([`DTypeOverride`]); a rule that matches no tensor is
    /// an error (a typo in a layer number would otherwise pass unnoticed).
    pub overrides: Vec<DTypeOverride>,
    /// Fields added to the header's `provenance` object (who asked for the file, the
    /// source's checksum); a key the importer writes too is replaced.
    pub provenance: serde_json::Map<String, serde_json::Value>,
}

/// What happened to one tensor.
#[derive(Clone, Debug, serde::Serialize)]
pub struct TensorReport {
    pub gguf_name: String,
    pub name: String,
    pub ggml_type: &'static str,
    pub dtype: DType,
    pub shape: Vec<u64>,
    /// Stored without a second quantization.
    pub exact: bool,
    /// max |decoded − GGUF dequantization| (0 when exact).
    pub max_abs_err: f32,
}

/// The result of an import.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ImportReport {
    pub source: PathBuf,
    pub arch: String,
    pub quant: String,
    pub tensors: Vec<TensorReport>,
    pub summary: WriteSummary,
    /// What the output may do differently from the source (e.g. a tokenizer rebuilt
    /// approximately), for the user to see.
    pub warnings: Vec<String>,
}

/// The payload of `m` written as `dtype` (`exact`: its source bytes, see
/// [`target_dtype`]) and the largest |decoded − GGUF dequantization| over its elements.
///
/// The GGUF values (permutation undone, Gemma's `+1` removed) are produced a block of rows
/// at a time: a row-separable codec encodes block by block ([`quant::rows`]) and the error
/// is measured on the same blocks, so a large tensor never exists as f32 in memory. Only
/// the codecs with a tensor-wide field or budget see the whole tensor's values.
fn encode_tensor(
    m: &MappedTensor,
    t: &TensorInfo,
    data: &[u8],
    dtype: DType,
    exact: bool,
    opts: &EncodeOptions,
    release: &(dyn Fn(Range<usize>) + Sync),
) -> Result<(Vec<u8>, f32)> {
    let enc = |e| ImportError::Encode {
        tensor: m.hf_name.clone(),
        source: e,
    };
    let raw: Cow<[u8]> = match m.unpermute_heads {
        Some(h) => Cow::Owned(unpermute_rows(t, data, h)?),
        None => Cow::Borrowed(data),
    };
    let geom = quant::geometry(dtype, &m.shape).map_err(enc)?;
    let (block, block_bytes) = t.ggml_type.block();
    let whole_blocks = (geom.numel as u64).is_multiple_of(block)
        && (geom.numel as u64 / block).checked_mul(block_bytes) == Some(raw.len() as u64);
    if !whole_blocks {
        return Err(ggml::DequantError {
            ty: t.ggml_type,
            reason: format!(
                "{:?}: {} elements do not fill the {}-byte payload",
                t.name,
                geom.numel,
                raw.len()
            ),
        }
        .into());
    }
    let cols = geom.cols;
    let row_bytes = |rows: &Range<usize>| {
        let at = |r: usize| (r * cols) as u64 / block * block_bytes;
        at(rows.start) as usize..at(rows.end) as usize
    };
    let source = |rows: Range<usize>, out: &mut [f32]| -> Result<()> {
        ggml::dequantize_range(t.ggml_type, &raw, rows.start * cols, out)?;
        // Read once per pass; a second pass faults the pages back in.
        if matches!(raw, Cow::Borrowed(_)) {
            release(row_bytes(&rows));
        }
        if m.minus_one {
            for v in out.iter_mut() {
                *v -= 1.0;
            }
        }
        Ok(())
    };
    let max_err = MaxF32::default();
    let observe = |decoded: &[f32], values: &[f32]| {
        let e = decoded
            .iter()
            .zip(values)
            .fold(0f32, |e, (a, b)| e.max((a - b).abs()));
        max_err.observe(e);
    };
    if !exact {
        let streamed = quant::rows::encode_row_blocks(
            dtype,
            &m.shape,
            opts,
            None,
            source,
            |rows, values, block| {
                let shape = [rows.len() as u64, cols as u64];
                let mx = Matrix::new(dtype, &shape, block).map_err(enc)?;
                let mut row = vec![0f32; cols];
                for (r, v) in values.chunks_exact(cols.max(1)).enumerate() {
                    mx.row(block, r, &mut row);
                    observe(&row, v);
                }
                Ok(())
            },
            enc,
        )?;
        if let Some(payload) = streamed {
            return Ok((payload, max_err.get()));
        }
    }
    let (payload, values) = if exact {
        let payload = match t.ggml_type {
            GgmlType::Q4_0 => ggml::q4_0_to_q4_tiled(&raw)
                .ok_or_else(|| unsupported(format!("{}: ragged Q4_0 payload", t.name)))?,
            _ => raw.to_vec(),
        };
        (payload, None)
    } else {
        let mut values = Vec::new();
        values
            .try_reserve_exact(geom.numel)
            .map_err(|_| unsupported(format!("{}: cannot allocate its values", t.name)))?;
        values.resize(geom.numel, 0f32);
        source(0..geom.rows, &mut values)?;
        let payload = quant::encode(dtype, &m.shape, &values, opts).map_err(enc)?;
        (payload, Some(values))
    };
    // The error, in parallel blocks of rows decoded in O(row) each (the matrix indexes
    // variable-length rows once).
    let mx = Matrix::new(dtype, &m.shape, &payload).map_err(enc)?;
    quant::rows::blocks(geom.rows, cols).try_for_each(|rows| -> Result<()> {
        let mut own = Vec::new();
        let values: &[f32] = match &values {
            Some(v) => &v[rows.start * cols..rows.end * cols],
            None => {
                own.resize(rows.len() * cols, 0f32);
                source(rows.clone(), &mut own)?;
                &own
            }
        };
        let mut row = vec![0f32; cols];
        for (r, v) in rows.zip(values.chunks_exact(cols.max(1))) {
            mx.row(&payload, r, &mut row);
            observe(&row, v);
        }
        Ok(())
    })?;
    Ok((payload, max_err.get()))
}

/// Imports the GGUF file `src` into the CMF file `out`, one tensor at a time.
/// `on_tensor` sees each tensor's report as soon as it is written.
pub fn import_gguf(
    src: &Path,
    out: &Path,
    mode: QuantMode,
    on_tensor: &mut dyn FnMut(&TensorReport),
) -> Result<ImportReport> {
    import_gguf_with(src, out, mode, &EncodeOptions::default(), on_tensor)
}

/// [`import_gguf`] with encoder options for the re-encoded tensors (`--mean-bits`).
pub fn import_gguf_with(
    src: &Path,
    out: &Path,
    mode: QuantMode,
    encode: &EncodeOptions,
    on_tensor: &mut dyn FnMut(&TensorReport),
) -> Result<ImportReport> {
    let opts = ImportOptions {
        encode: *encode,
        ..ImportOptions::default()
    };
    import_gguf_opts(src, out, mode, &opts, on_tensor)
}

/// [`import_gguf`] with every option: encoder knobs, per-tensor dtype overrides, and
/// provenance fields of the caller.
pub fn import_gguf_opts(
    src: &Path,
    out: &Path,
    mode: QuantMode,
    opts: &ImportOptions,
    on_tensor: &mut dyn FnMut(&TensorReport),
) -> Result<ImportReport> {
    let encode = &opts.encode;
    let file = GgufFile::open(src)?;
    let g = &file.gguf;
    let arch = arch_from_metadata(g)?;
    let mapped = map_tensors(g)?;
    if let Some(o) = opts
        .overrides
        .iter()
        .find(|o| !mapped.iter().any(|m| o.matches(&m.hf_name)))
    {
        return Err(unsupported(format!("dtype override {o} matches no tensor")));
    }
    let targets: Vec<(DType, bool)> = mapped
        .iter()
        .map(|m| target_dtype_with(mode, &opts.overrides, m))
        .collect();
    let file_type = g.get_u64("general.file_type");
    let header = Header {
        format: Some("cmf".into()),
        version: Some(2),
        arch: Some(arch.clone()),
        // Informational; `keep` re-encodes what it cannot hold exactly as q8_row.
        quant_type: Some(
            match mode {
                QuantMode::Keep => DType::Q8Row,
                QuantMode::Codec(d) => d,
            }
            .quant_type_label()
            .into(),
        ),
        provenance: Some({
            let mut p = json!({
                "tool": "cortiq import-gguf",
                "tool_version": env!("CARGO_PKG_VERSION"),
                "source_file": src.file_name().map(|n| n.to_string_lossy().into_owned()),
                "source_format": format!("gguf v{}", g.version),
                "source_name": g.get_str("general.name"),
                "source_file_type": file_type,
                "options": {"quant": mode.name()},
            });
            if !opts.overrides.is_empty() {
                p["options"]["overrides"] = json!(opts
                    .overrides
                    .iter()
                    .map(|o| o.to_string())
                    .collect::<Vec<_>>());
            }
            if let Some(obj) = p.as_object_mut() {
                obj.extend(opts.provenance.clone());
            }
            p
        }),
        tokenizer_config: tokenizer_config(g),
        ..Header::default()
    };
    let spec = WriteSpec {
        header,
        tensors: mapped
            .iter()
            .zip(&targets)
            .map(|(m, &(dtype, _))| TensorPlan {
                name: m.hf_name.clone(),
                dtype,
                shape: m.shape.clone(),
            })
            .collect(),
        vocab: super::gguf_tokenizer::tokenizer_json(g)?,
        ..WriteSpec::default()
    };
    let mut w = StreamWriter::create(out, spec)?;
    let mut reports = Vec::with_capacity(mapped.len());
    // Dequantizing and re-encoding are the expensive part and tensors are independent:
    // a batch (bounded to ~256 MiB of f32 values) is processed on all threads, then
    // written in order. Source pages are released once read, so resident memory stays
    // near one batch rather than growing with the model.
    let process = |k: usize| -> Result<(Vec<u8>, TensorReport)> {
        let (m, t, (dtype, exact)) = (&mapped[k], &g.tensors[k], targets[k]);
        let data = file.tensor_data(t)?;
        let release = |bytes: Range<usize>| file.release_part(t, bytes);
        let encoded = encode_tensor(m, t, data, dtype, exact, encode, &release);
        file.release(t);
        let (payload, max_abs_err) = encoded?;
        let r = TensorReport {
            gguf_name: m.gguf_name.clone(),
            name: m.hf_name.clone(),
            ggml_type: t.ggml_type.name(),
            dtype,
            shape: m.shape.clone(),
            exact,
            max_abs_err,
        };
        Ok((payload, r))
    };
    // What a tensor holds in memory while it is processed: its source pages, and its
    // payload (plus f32 values for a codec that needs the whole tensor).
    let working_set = |k: usize| -> u64 {
        let (m, (dtype, exact)) = (&mapped[k], targets[k]);
        g.tensors[k].nbytes
            + if exact {
                g.tensors[k].nbytes
            } else {
                quant::rows::encoding_bytes(dtype, &m.shape)
            }
    };
    const BATCH_BYTES: u64 = 32 << 20;
    let mut start = 0;
    while start < mapped.len() {
        let end = super::batch_end(start, mapped.len(), BATCH_BYTES, working_set);
        let batch: Vec<Result<(Vec<u8>, TensorReport)>> =
            (start..end).into_par_iter().map(process).collect();
        for item in batch {
            let (payload, r) = item?;
            w.write_tensor(&payload)?;
            on_tensor(&r);
            reports.push(r);
        }
        start = end;
    }
    let summary = w.finish()?;
    Ok(ImportReport {
        source: src.to_path_buf(),
        arch: arch.arch_name,
        quant: mode.name(),
        tensors: reports,
        summary,
        warnings: super::gguf_tokenizer::tokenizer_warnings(g),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::CmfFile;

    fn fixture_path(name: &str) -> PathBuf {
        let p = PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../shared/fixtures/"
        ))
        .join(name);
        assert!(p.exists(), "fixture {} is missing", p.display());
        p
    }

    const TYPES: [&str; 14] = [
        "BF16", "F16", "IQ4_NL", "IQ4_XS", "Q2_K", "Q3_K_M", "Q4_0", "Q4_1", "Q4_K_M", "Q5_0",
        "Q5_1", "Q5_K_M", "Q6_K", "Q8_0",
    ];

    #[test]
    fn names_map_to_hugging_face() {
        assert_eq!(
            hf_name("llama", "blk.3.attn_q.weight").unwrap(),
            "model.layers.3.self_attn.q_proj.weight"
        );
        assert_eq!(
            hf_name("qwen2", "blk.0.attn_k.bias").unwrap(),
            "model.layers.0.self_attn.k_proj.bias"
        );
        assert_eq!(
            hf_name("llama", "blk.1.ffn_norm.weight").unwrap(),
            "model.layers.1.post_attention_layernorm.weight"
        );
        assert_eq!(
            hf_name("gemma3", "blk.1.ffn_norm.weight").unwrap(),
            "model.layers.1.pre_feedforward_layernorm.weight"
        );
        assert_eq!(
            hf_name("gemma3", "blk.1.post_ffw_norm.weight").unwrap(),
            "model.layers.1.post_feedforward_layernorm.weight"
        );
        assert_eq!(
            hf_name("qwen3", "blk.2.attn_k_norm.weight").unwrap(),
            "model.layers.2.self_attn.k_norm.weight"
        );
        assert_eq!(hf_name("llama", "output.weight").unwrap(), "lm_head.weight");
        assert!(hf_name("llama", "blk.x.attn_q.weight").is_none());
        assert!(hf_name("llama", "rope_freqs.weight").is_none());
    }

    #[test]
    fn arch_from_the_fixture_matches_the_hf_config() {
        let b = std::fs::read(fixture_path("gguf/tiny-F16.gguf")).unwrap();
        let g = Gguf::parse(&b).unwrap();
        let a = arch_from_metadata(&g).unwrap();
        let cfg: serde_json::Value = serde_json::from_slice(
            &std::fs::read(fixture_path("hf/llama_gguf/config.json")).unwrap(),
        )
        .unwrap();
        assert_eq!(a.arch_name, "llama");
        assert_eq!(a.hidden_size, cfg["hidden_size"].as_u64().unwrap());
        assert_eq!(a.intermediate_size, cfg["intermediate_size"].as_u64());
        assert_eq!(a.num_layers, cfg["num_hidden_layers"].as_u64().unwrap());
        assert_eq!(a.num_attention_heads, cfg["num_attention_heads"].as_u64());
        assert_eq!(a.num_kv_heads, cfg["num_key_value_heads"].as_u64());
        assert_eq!(a.head_dim, cfg["head_dim"].as_u64());
        assert_eq!(a.vocab_size, cfg["vocab_size"].as_u64().unwrap());
        assert_eq!(a.tie_word_embeddings, Some(false));
        assert_eq!(a.norm_style, Some(NormStyle::Qwen));
        let eps = a.rms_norm_eps.unwrap();
        assert!((eps - 1e-6).abs() < 1e-12);
        assert_eq!(a.rope_theta, Some(10000.0));
    }

    /// The F32/F16 weights of the GGUF, un-permuted, equal the original checkpoint's
    /// (within f16 rounding): the q/k permutation is undone correctly.
    #[test]
    fn unpermuted_weights_equal_the_source_checkpoint() {
        let st = std::fs::read(fixture_path("hf/llama_gguf/model.safetensors")).unwrap();
        let st = safetensors::SafeTensors::deserialize(&st).unwrap();
        let b = std::fs::read(fixture_path("gguf/tiny-F16.gguf")).unwrap();
        let g = Gguf::parse(&b).unwrap();
        let mapped = map_tensors(&g).unwrap();
        let mut permuted = 0;
        for (m, t) in mapped.iter().zip(&g.tensors) {
            let vals = source_values(t, g.tensor_data(&b, t).unwrap(), m);
            let view = st.tensor(&m.hf_name).unwrap();
            assert_eq!(
                view.shape().iter().map(|&d| d as u64).collect::<Vec<_>>(),
                m.shape,
                "{}",
                m.hf_name
            );
            let want: Vec<f32> = view
                .data()
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            for (i, (a, w)) in vals.iter().zip(&want).enumerate() {
                assert!(
                    (a - w).abs() <= w.abs() * 1e-3 + 1e-7,
                    "{} [{i}]: {a} vs {w}",
                    m.hf_name
                );
            }
            permuted += m.unpermute_heads.is_some() as usize;
        }
        assert_eq!(permuted, 4);
    }

    /// Every fixture imports; the output verifies; every tensor decodes within its
    /// codec's bound of the GGUF dequantization (exactly where stored as is).
    #[test]
    fn every_fixture_imports_and_verifies() {
        let dir = tempfile::tempdir().unwrap();
        for ty in TYPES {
            let src = fixture_path(&format!("gguf/tiny-{ty}.gguf"));
            let out = dir.path().join(format!("{ty}.cmf"));
            let rep = import_gguf(&src, &out, QuantMode::Keep, &mut |_| {}).unwrap();
            let f = CmfFile::open(&out).unwrap();
            let v = crate::format::verify::verify(&f, &Default::default(), &|_| {});
            assert!(v.ok, "{ty}: {:?}", v.failures);
            let b = std::fs::read(&src).unwrap();
            let g = Gguf::parse(&b).unwrap();
            let mapped = map_tensors(&g).unwrap();
            for ((m, t), r) in mapped.iter().zip(&g.tensors).zip(&rep.tensors) {
                let want = source_values(t, g.tensor_data(&b, t).unwrap(), m);
                let (e, bytes) = f.tensor(&m.hf_name).unwrap();
                assert_eq!(e.dtype, r.dtype);
                let got = quant::decode(e.dtype, &e.shape, bytes).unwrap();
                if r.exact {
                    assert!(got
                        .iter()
                        .zip(&want)
                        .all(|(a, b)| a.to_bits() == b.to_bits()));
                    assert_eq!(r.max_abs_err, 0.0);
                } else {
                    let bound = quant::error_bounds(e.dtype, &e.shape, bytes).unwrap();
                    for i in 0..got.len() {
                        assert!(
                            (got[i] - want[i]).abs() <= bound[i],
                            "{ty} {} [{i}]",
                            m.hf_name
                        );
                    }
                }
                if ty == "Q4_0" && t.ggml_type == GgmlType::Q4_0 {
                    assert_eq!(e.dtype, DType::Q4Tiled);
                    assert!(r.exact);
                }
            }
            let h = &f.header;
            let tc = h.tokenizer_config.as_ref().unwrap();
            assert_eq!(tc.eos_token_ids, vec![2]);
            assert!(tc
                .chat_template
                .as_deref()
                .unwrap()
                .contains("<|im_start|>"));
            let vocab: serde_json::Value =
                serde_json::from_slice(f.vocab_bytes().unwrap()).unwrap();
            assert_eq!(vocab["model"]["vocab"].as_object().unwrap().len(), 512);
            assert_eq!(h.provenance.as_ref().unwrap()["tool"], "cortiq import-gguf");
        }
    }

    /// The whole tensor's GGUF values, dequantized in one piece (the import streams them a
    /// block of rows at a time; this is the independent reading the tests compare with).
    fn source_values(t: &TensorInfo, data: &[u8], m: &MappedTensor) -> Vec<f32> {
        let raw = match m.unpermute_heads {
            Some(h) => unpermute_rows(t, data, h).unwrap(),
            None => data.to_vec(),
        };
        let mut values = ggml::dequantize(t.ggml_type, &raw, t.numel()).unwrap();
        if m.minus_one {
            for v in &mut values {
                *v -= 1.0;
            }
        }
        values
    }

    /// Every codec, streamed by rows or not, writes exactly what encoding the whole
    /// tensor's values writes, and reports the largest error it really has.
    #[test]
    fn streamed_import_equals_whole_tensor_encoding() {
        let dir = tempfile::tempdir().unwrap();
        let src = fixture_path("gguf/tiny-Q4_K_M.gguf");
        let b = std::fs::read(&src).unwrap();
        let g = Gguf::parse(&b).unwrap();
        let mapped = map_tensors(&g).unwrap();
        for dtype in [
            DType::Q8Row,
            DType::Q8_2f,
            DType::Q4Block,
            DType::Q4Tiled,
            DType::Q4tp,
            DType::Vbit,
            DType::Q1,
            DType::Q1t,
            DType::F16,
            DType::Bf16,
        ] {
            let out = dir.path().join(format!("{dtype}.cmf"));
            let rep = import_gguf(&src, &out, QuantMode::Codec(dtype), &mut |_| {}).unwrap();
            let f = CmfFile::open(&out).unwrap();
            let mut streamed = 0;
            for ((m, t), r) in mapped.iter().zip(&g.tensors).zip(&rep.tensors) {
                let want = source_values(t, g.tensor_data(&b, t).unwrap(), m);
                let (e, bytes) = f.tensor(&m.hf_name).unwrap();
                if !r.exact {
                    let whole =
                        quant::encode(e.dtype, &e.shape, &want, &EncodeOptions::default()).unwrap();
                    assert!(whole == bytes, "{dtype} {}: payload differs", m.hf_name);
                }
                streamed += quant::rows::row_planes(e.dtype, &e.shape).is_some() as usize;
                let got = quant::decode(e.dtype, &e.shape, bytes).unwrap();
                let err = got
                    .iter()
                    .zip(&want)
                    .fold(0f32, |a, (x, y)| a.max((x - y).abs()));
                assert_eq!(r.max_abs_err, err, "{dtype} {}", m.hf_name);
            }
            assert!(streamed > 0, "{dtype}: no tensor took the streamed path");
        }
    }

    #[test]
    fn codec_mode_requantizes() {
        let dir = tempfile::tempdir().unwrap();
        let src = fixture_path("gguf/tiny-Q8_0.gguf");
        let out = dir.path().join("q4.cmf");
        let rep = import_gguf(&src, &out, QuantMode::Codec(DType::Q4Block), &mut |_| {}).unwrap();
        assert!(rep
            .tensors
            .iter()
            .filter(|t| t.shape.len() == 2)
            .all(|t| t.dtype == DType::Q4Block && !t.exact));
        assert_eq!(QuantMode::parse("q8"), Some(QuantMode::Codec(DType::Q8Row)));
        assert_eq!(QuantMode::parse("KEEP"), Some(QuantMode::Keep));
        assert_eq!(QuantMode::parse("u8"), None);
    }

    /// `--quant-layer` rules: parsed and printed back, matched by layer and part, the last
    /// match winning, norms kept float; the import writes exactly those dtypes, records the
    /// rules and the caller's provenance, and refuses a rule that matches nothing.
    #[test]
    fn dtype_overrides_choose_per_tensor_dtypes() {
        let o = |s: &str| DTypeOverride::parse(s).unwrap();
        assert_eq!(o("28,29=q8").to_string(), "28,29=q8_row");
        assert_eq!(o("28-29:mlp=q4").to_string(), "28-29:mlp=q4_block");
        assert_eq!(o("*:lm_head=f16").layers, None);
        assert_eq!(
            o(" 0-3,7 : down_proj = keep").to_string(),
            "0-3,7:down_proj=keep"
        );
        for bad in ["28", "28=u8", "x=q8", "3-1=q8", "=q8", "1-=q4"] {
            assert!(DTypeOverride::parse(bad).is_err(), "{bad}");
        }
        let r = o("1:mlp=q4");
        assert!(r.matches("model.layers.1.mlp.up_proj.weight"));
        assert!(!r.matches("model.layers.1.self_attn.q_proj.weight"));
        assert!(!r.matches("model.layers.11.mlp.up_proj.weight"));
        assert!(!r.matches("lm_head.weight"));
        assert!(o("*:lm_head=f16").matches("lm_head.weight"));

        let dir = tempfile::tempdir().unwrap();
        let src = fixture_path("gguf/tiny-Q8_0.gguf");
        let out = dir.path().join("o.cmf");
        let opts = ImportOptions {
            overrides: vec![o("1=q4"), o("1:down_proj=keep"), o("*:lm_head=f16")],
            provenance: serde_json::Map::from_iter([("demo".to_string(), json!({"x": 1}))]),
            ..ImportOptions::default()
        };
        let rep = import_gguf_opts(
            &src,
            &out,
            QuantMode::Codec(DType::Q8_2f),
            &opts,
            &mut |_| {},
        )
        .unwrap();
        let f = CmfFile::open(&out).unwrap();
        assert!(crate::format::verify::verify(&f, &Default::default(), &|_| {}).ok);
        for t in &rep.tensors {
            let want = if t.shape.len() == 1 {
                DType::F32
            } else if t.name == "lm_head.weight" {
                DType::F16
            } else if t.name == "model.layers.1.mlp.down_proj.weight" {
                DType::Q8Row // keep: Q8_0 has no exact CMF form, so its fallback
            } else if t.name.starts_with("model.layers.1.") {
                DType::Q4Block
            } else {
                DType::Q8_2f
            };
            assert_eq!(t.dtype, want, "{}", t.name);
            assert_eq!(f.tensor(&t.name).unwrap().0.dtype, want, "{}", t.name);
        }
        let p = f.header.provenance.as_ref().unwrap();
        assert_eq!(
            p["options"]["overrides"],
            json!(["1=q4_block", "1:down_proj=keep", "*:lm_head=f16"])
        );
        assert_eq!(p["demo"]["x"], 1);
        assert_eq!(p["tool"], "cortiq import-gguf");

        let none = ImportOptions {
            overrides: vec![o("2:mlp=q4")],
            ..ImportOptions::default()
        };
        let e = import_gguf_opts(&src, &out, QuantMode::Keep, &none, &mut |_| {}).unwrap_err();
        assert!(
            e.to_string().contains("2:mlp=q4_block matches no tensor"),
            "{e}"
        );
    }

    /// A GGUF image written in the test: metadata key/values and F32 tensors.
    #[derive(Default)]
    struct Builder {
        kvs: Vec<u8>,
        nkv: u64,
        tensors: Vec<(String, Vec<u64>, Vec<f32>)>,
    }

    fn gstr(v: &mut Vec<u8>, s: &str) {
        v.extend((s.len() as u64).to_le_bytes());
        v.extend(s.as_bytes());
    }

    impl Builder {
        fn kv(&mut self, k: &str, ty: u32, payload: &[u8]) -> &mut Self {
            gstr(&mut self.kvs, k);
            self.kvs.extend(ty.to_le_bytes());
            self.kvs.extend(payload);
            self.nkv += 1;
            self
        }
        fn s(&mut self, k: &str, val: &str) -> &mut Self {
            let mut p = Vec::new();
            gstr(&mut p, val);
            self.kv(k, 8, &p)
        }
        fn u32(&mut self, k: &str, val: u32) -> &mut Self {
            self.kv(k, 4, &val.to_le_bytes())
        }
        fn f32(&mut self, k: &str, val: f32) -> &mut Self {
            self.kv(k, 6, &val.to_le_bytes())
        }
        fn arr(&mut self, k: &str, et: u32, items: &[Vec<u8>]) -> &mut Self {
            let mut p = et.to_le_bytes().to_vec();
            p.extend((items.len() as u64).to_le_bytes());
            for it in items {
                p.extend(it);
            }
            self.kv(k, 9, &p)
        }
        fn tensor(&mut self, name: &str, dims: &[u64], seed: u64) -> &mut Self {
            let n: u64 = dims.iter().product();
            let mut rng = crate::synth::Rng::new(seed);
            let vals = (0..n).map(|_| 1.0 + 0.25 * rng.normal()).collect();
            self.tensors.push((name.into(), dims.to_vec(), vals));
            self
        }
        fn build(&self) -> Vec<u8> {
            let mut v = b"GGUF".to_vec();
            v.extend(3u32.to_le_bytes());
            v.extend((self.tensors.len() as u64).to_le_bytes());
            v.extend(self.nkv.to_le_bytes());
            v.extend(&self.kvs);
            let mut off = 0u64;
            for (name, dims, vals) in &self.tensors {
                gstr(&mut v, name);
                v.extend((dims.len() as u32).to_le_bytes());
                for d in dims {
                    v.extend(d.to_le_bytes());
                }
                v.extend(0u32.to_le_bytes());
                v.extend(off.to_le_bytes());
                off = (off + 4 * vals.len() as u64).next_multiple_of(32);
            }
            for (_, _, vals) in &self.tensors {
                while !v.len().is_multiple_of(32) {
                    v.push(0);
                }
                for x in vals {
                    v.extend(x.to_le_bytes());
                }
            }
            v
        }
    }

    /// A synthetic Gemma 3: sandwich norms mapped, `1 + w` undone, tied embeddings,
    /// sliding layers, SentencePiece tokenizer without a space prefix, EOT among the EOS.
    #[test]
    fn synthetic_gemma3_imports() {
        let toks = [
            "<pad>",
            "<eos>",
            "<bos>",
            "<unk>",
            "\u{2581}",
            "a",
            "b",
            "ab",
            "\u{2581}a",
            "<start_of_turn>",
            "<end_of_turn>",
        ];
        let types = [3i32, 3, 3, 2, 1, 1, 1, 1, 1, 4, 3];
        let scores = [0f32, 0., 0., 0., -1., -2., -3., -0.5, -0.7, 0., 0.];
        let mut b = Builder::default();
        b.s("general.architecture", "gemma3")
            .u32("gemma3.embedding_length", 32)
            .u32("gemma3.block_count", 1)
            .u32("gemma3.feed_forward_length", 64)
            .u32("gemma3.attention.head_count", 2)
            .u32("gemma3.attention.head_count_kv", 1)
            .u32("gemma3.attention.key_length", 16)
            .u32("gemma3.attention.sliding_window", 4)
            .u32("gemma3.context_length", 128)
            .f32("gemma3.attention.layer_norm_rms_epsilon", 1e-6)
            .s("tokenizer.ggml.model", "llama")
            .arr(
                "tokenizer.ggml.tokens",
                8,
                &toks
                    .iter()
                    .map(|t| {
                        let mut p = Vec::new();
                        gstr(&mut p, t);
                        p
                    })
                    .collect::<Vec<_>>(),
            )
            .arr(
                "tokenizer.ggml.token_type",
                5,
                &types
                    .iter()
                    .map(|t| t.to_le_bytes().to_vec())
                    .collect::<Vec<_>>(),
            )
            .arr(
                "tokenizer.ggml.scores",
                6,
                &scores
                    .iter()
                    .map(|t| t.to_le_bytes().to_vec())
                    .collect::<Vec<_>>(),
            )
            .kv("tokenizer.ggml.add_space_prefix", 7, &[0])
            .kv("tokenizer.ggml.add_bos_token", 7, &[1])
            .u32("tokenizer.ggml.bos_token_id", 2)
            .u32("tokenizer.ggml.eos_token_id", 1)
            .u32("tokenizer.ggml.eot_token_id", 10)
            .s("tokenizer.chat_template", "{{ bos_token }}<start_of_turn>");
        let mut seed = 0;
        let mut t = |b: &mut Builder, name: &str, dims: &[u64]| {
            seed += 1;
            b.tensor(name, dims, seed);
        };
        t(&mut b, "token_embd.weight", &[32, 11]);
        for (n, d) in [
            ("attn_norm", vec![32]),
            ("attn_q", vec![32, 32]),
            ("attn_k", vec![32, 16]),
            ("attn_v", vec![32, 16]),
            ("attn_output", vec![32, 32]),
            ("attn_q_norm", vec![16]),
            ("attn_k_norm", vec![16]),
            ("post_attention_norm", vec![32]),
            ("ffn_norm", vec![32]),
            ("ffn_gate", vec![32, 64]),
            ("ffn_up", vec![32, 64]),
            ("ffn_down", vec![64, 32]),
            ("post_ffw_norm", vec![32]),
        ] {
            t(&mut b, &format!("blk.0.{n}.weight"), &d);
        }
        t(&mut b, "output_norm.weight", &[32]);
        let bytes = b.build();
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("g.gguf");
        std::fs::write(&src, &bytes).unwrap();
        let out = dir.path().join("g.cmf");
        import_gguf(&src, &out, QuantMode::Keep, &mut |_| {}).unwrap();
        let f = CmfFile::open(&out).unwrap();
        assert!(crate::format::verify::verify(&f, &Default::default(), &|_| {}).ok);
        let a = f.header.arch.as_ref().unwrap();
        assert_eq!(a.arch_name, "gemma3_text");
        assert_eq!(a.norm_style, Some(NormStyle::Gemma));
        assert_eq!(a.tie_word_embeddings, Some(true));
        assert_eq!(a.layer_types.as_ref().unwrap()[0], "SlidingAttention");
        assert_eq!(a.vocab_size, 11);
        let g = Gguf::parse(&bytes).unwrap();
        for (gn, hn) in [
            (
                "blk.0.ffn_norm.weight",
                "model.layers.0.pre_feedforward_layernorm.weight",
            ),
            (
                "blk.0.post_ffw_norm.weight",
                "model.layers.0.post_feedforward_layernorm.weight",
            ),
            (
                "blk.0.attn_q_norm.weight",
                "model.layers.0.self_attn.q_norm.weight",
            ),
            ("output_norm.weight", "model.norm.weight"),
        ] {
            let ti = g.tensor(gn).unwrap();
            let src =
                ggml::dequantize(ti.ggml_type, g.tensor_data(&bytes, ti).unwrap(), ti.numel())
                    .unwrap();
            let (e, b) = f.tensor(hn).unwrap();
            let got = quant::decode(e.dtype, &e.shape, b).unwrap();
            // x̂·(1 + stored) reproduces llama.cpp's x̂·w exactly.
            assert!(src.iter().zip(&got).all(|(s, g)| 1.0 + g == *s), "{hn}");
        }
        let (e, _) = f.tensor("model.layers.0.self_attn.q_proj.weight").unwrap();
        assert_eq!(e.shape, vec![32, 32]);
        assert!(f.tensor("lm_head.weight").is_none());
        let tc = f.header.tokenizer_config.as_ref().unwrap();
        assert_eq!(tc.eos_token_ids, vec![1, 10]);
        assert_eq!(tc.bos_token_id, Some(2));
        let tok: serde_json::Value = serde_json::from_slice(f.vocab_bytes().unwrap()).unwrap();
        assert_eq!(tok["normalizer"]["type"], "Replace");
        assert_eq!(tok["model"]["byte_fallback"], true);
        assert_eq!(tok["model"]["unk_token"], "<unk>");
        assert_eq!(tok["post_processor"]["type"], "TemplateProcessing");
        // "ab" (score −0.5) merges before "▁a" (−0.7).
        assert_eq!(tok["model"]["merges"][0], json!(["a", "b"]));
        assert_eq!(tok["model"]["merges"][1], json!(["\u{2581}", "a"]));
        let added = tok["added_tokens"].as_array().unwrap();
        assert!(added
            .iter()
            .any(|t| t["content"] == "<start_of_turn>" && t["special"] == false));
    }

    /// Gemma 3 GGUF metadata: the global base from `rope.freq_base`, the sliding layers'
    /// base 10000 as llama.cpp uses it, or the file's `rope.freq_base_swa` when present.
    #[test]
    fn gemma3_sliding_layers_get_their_own_rope_base() {
        let gemma = |swa: Option<f32>| {
            let mut b = Builder::default();
            b.s("general.architecture", "gemma3")
                .u32("gemma3.embedding_length", 32)
                .u32("gemma3.block_count", 6)
                .u32("gemma3.attention.head_count", 2)
                .u32("gemma3.attention.head_count_kv", 1)
                .u32("gemma3.attention.key_length", 16)
                .u32("gemma3.attention.sliding_window", 512)
                .f32("gemma3.rope.freq_base", 1_000_000.0);
            if let Some(v) = swa {
                b.f32("gemma3.rope.freq_base_swa", v);
            }
            b.tensor("token_embd.weight", &[32, 8], 1);
            let g = Gguf::parse(&b.build()).unwrap();
            arch_from_metadata(&g).unwrap()
        };
        let a = gemma(None);
        assert_eq!(a.rope_theta, Some(1_000_000.0));
        assert_eq!(a.extra["rope_local_base_freq"].as_f64(), Some(10_000.0));
        let c = crate::model::config::ModelConfig::from_arch(&a).unwrap();
        assert_eq!(c.rope_theta, 1_000_000.0);
        assert_eq!(c.rope_local_theta, Some(10_000.0));
        let lt = a.layer_types.as_ref().unwrap();
        assert_eq!(lt[0], "SlidingAttention");
        assert_eq!(lt[5], "FullAttention");

        let a = gemma(Some(20_000.0));
        assert_eq!(a.rope_theta, Some(1_000_000.0));
        assert_eq!(a.extra["rope_local_base_freq"].as_f64(), Some(20_000.0));
    }

    /// Gemma's embedding scale: import-gguf and convert write the same value, the f32 √hidden
    /// llama.cpp scales by, also where bf16 cannot hold it (√96).
    #[test]
    fn gemma3_embed_scale_agrees_with_convert() {
        let hidden = 96u32;
        let mut b = Builder::default();
        b.s("general.architecture", "gemma3")
            .u32("gemma3.embedding_length", hidden)
            .u32("gemma3.block_count", 1)
            .u32("gemma3.attention.head_count", 2)
            .u32("gemma3.attention.key_length", 16);
        b.tensor("token_embd.weight", &[hidden as u64, 8], 1);
        let g = Gguf::parse(&b.build()).unwrap();
        let from_gguf = arch_from_metadata(&g).unwrap();
        let cfg = json!({
            "model_type": "gemma3_text", "hidden_size": hidden, "num_hidden_layers": 1,
            "num_attention_heads": 2, "head_dim": 16, "vocab_size": 8
        });
        let from_hf = super::super::hf::build_arch(&cfg, &["model.embed_tokens.weight"]).unwrap();
        let exact = (hidden as f32).sqrt() as f64;
        assert_eq!(from_gguf.extra["embed_multiplier"].as_f64(), Some(exact));
        assert_eq!(from_hf.extra["embed_multiplier"].as_f64(), Some(exact));
    }

    /// Damaged metadata (single-byte flips in the key/values and tensor infos) makes the
    /// whole import fail with an error or succeed, never panic.
    #[test]
    fn an_absurd_block_count_is_refused_before_anything_is_sized_by_it() {
        let mut b = Builder::default();
        b.s("general.architecture", "llama")
            .u32("llama.embedding_length", 32)
            .u32("llama.block_count", u32::MAX)
            .u32("llama.attention.head_count", 2);
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.gguf");
        std::fs::write(&p, b.build()).unwrap();
        let e =
            import_gguf(&p, &dir.path().join("x.cmf"), QuantMode::Keep, &mut |_| {}).unwrap_err();
        assert!(e.to_string().contains("exceeds 4096 layers"), "{e}");
    }

    #[test]
    fn damaged_files_import_without_panics() {
        let src = fixture_path("gguf/tiny-Q4_0.gguf");
        let bytes = std::fs::read(&src).unwrap();
        let head = Gguf::parse(&bytes).unwrap().data_start as usize;
        let dir = tempfile::tempdir().unwrap();
        let (p, out) = (dir.path().join("x.gguf"), dir.path().join("x.cmf"));
        let mut rng = crate::synth::Rng::new(7);
        let mut ok = 0;
        for _ in 0..150 {
            let mut m = bytes.clone();
            let pos = (rng.next_u64() % head as u64) as usize;
            m[pos] ^= 1 << (rng.next_u64() % 8);
            std::fs::write(&p, &m).unwrap();
            ok += import_gguf(&p, &out, QuantMode::Keep, &mut |_| {}).is_ok() as usize;
        }
        // Most flips land in token strings and still import.
        assert!(ok > 0);
    }
}
