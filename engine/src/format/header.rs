//! The header JSON (spec §2, §2.1, §2.2, §5.1 via masks, §6.1, §8.1, §9, §10).
//!
//! Everything the spec names is a typed field; every struct keeps the fields it does not
//! know in `extra` (in file order), so they can be shown and are written back unchanged.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::error::{parse, Result};

fn is_empty_map(m: &Map<String, Value>) -> bool {
    m.is_empty()
}

/// The whole header object.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Header {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arch: Option<Arch>,
    /// Informational default; the directory's per-tensor dtype is the truth.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quant_type: Option<String>,
    /// Free-form origin information (tool, source, options, `defrag`, `pipeline`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provenance: Option<Value>,
    /// The chat bundle (§6.1); `null` in shards other than the first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokenizer_config: Option<TokenizerConfig>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub section_hashes: Option<SectionHashes>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skills: Option<Vec<SkillRecord>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<ShardInfo>,
    #[serde(flatten, skip_serializing_if = "is_empty_map")]
    pub extra: Map<String, Value>,
}

/// `arch` (§2). Dimensions a reader needs for masks are required; the rest are optional
/// because families differ in what they carry.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Arch {
    pub arch_name: String,
    pub hidden_size: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub intermediate_size: Option<u64>,
    pub num_layers: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_attention_heads: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_kv_heads: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_dim: Option<u64>,
    pub vocab_size: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layer_types: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rms_norm_eps: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub norm_style: Option<NormStyle>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_theta: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tie_word_embeddings: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partial_rotary_factor: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_position_embeddings: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub linear_conv_kernel_dim: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub linear_num_key_heads: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub linear_num_value_heads: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtp: Option<Mtp>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moe: Option<Moe>,
    #[serde(flatten, skip_serializing_if = "is_empty_map")]
    pub extra: Map<String, Value>,
}

/// `norm_style`: how RMSNorm applies its weight. Mandatory for the engine (§2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NormStyle {
    /// `x̂·w`
    Qwen,
    /// `x̂·(1+w)`
    Gemma,
}

/// `arch.mtp` (§2.1).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Mtp {
    pub num_layers: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share_lm_head: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share_embed: Option<bool>,
    #[serde(flatten, skip_serializing_if = "is_empty_map")]
    pub extra: Map<String, Value>,
}

/// `arch.moe` (§2.2).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Moe {
    pub num_experts: u64,
    pub top_k: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moe_intermediate_size: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub norm_topk_prob: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared_expert_intermediate_size: Option<u64>,
    #[serde(flatten, skip_serializing_if = "is_empty_map")]
    pub extra: Map<String, Value>,
}

/// `tokenizer_config` — the chat bundle (§6.1).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TokenizerConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chat_template: Option<String>,
    #[serde(default)]
    pub eos_token_ids: Vec<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bos_token_id: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pad_token_id: Option<u32>,
    #[serde(flatten, skip_serializing_if = "is_empty_map")]
    pub extra: Map<String, Value>,
}

/// `section_hashes` (§8.1): lowercase hex hash64 of each present section.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SectionHashes {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub masks: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vocab: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index: Option<String>,
    #[serde(flatten, skip_serializing_if = "is_empty_map")]
    pub extra: Map<String, Value>,
}

/// `shard` (§10).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardInfo {
    pub no: u32,
    pub count: u32,
}

/// One skill of the registry (§9), or the identity record of a standalone skill file (§9.1).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SkillRecord {
    pub id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default)]
    pub layers: Vec<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selection: Option<Selection>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_mask_task: Option<String>,
    /// Held-out quality contract; `None`/null = not measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quality: Option<Value>,
    /// §9.1: hex hash64 of the base file's directory this skill was cut from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_dir_hash: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_arch: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provenance: Option<Value>,
    #[serde(flatten, skip_serializing_if = "is_empty_map")]
    pub extra: Map<String, Value>,
}

/// `selection`: the affine subspace for recon-argmin routing (§9).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Selection {
    pub metric: String,
    pub phi_layer: u64,
    /// f16 little-endian values, base64.
    pub mean: String,
    /// f16 little-endian values, base64; `rank` rows of `hidden` (row-major).
    pub basis: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank: Option<u64>,
    #[serde(flatten, skip_serializing_if = "is_empty_map")]
    pub extra: Map<String, Value>,
}

impl Selection {
    /// The little-endian f16 bytes of a base64 field (`mean`, `basis`); padding optional.
    fn f16_bytes(b64: &str) -> Result<Vec<u8>, String> {
        use base64::Engine as _;
        let bytes = base64::engine::general_purpose::STANDARD_PAD_INDIFFERENT
            .decode(b64.trim())
            .map_err(|e| format!("invalid base64: {e}"))?;
        if bytes.len() % 2 != 0 {
            return Err(format!(
                "{} bytes, not a whole number of f16 values",
                bytes.len()
            ));
        }
        Ok(bytes)
    }

    /// The f16 values of a base64 field, as f32.
    pub fn decode_f16(b64: &str) -> Result<Vec<f32>, String> {
        Ok(Self::f16_bytes(b64)?
            .chunks_exact(2)
            .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect())
    }

    /// Number of f16 values a base64 field holds.
    pub fn f16_count(b64: &str) -> Result<u64, String> {
        Ok(Self::f16_bytes(b64)?.len() as u64 / 2)
    }
}

impl Header {
    /// Parses header bytes: UTF-8, a JSON object, the typed fields, and the cross-field rules
    /// (format/version, `layer_types` length, shard numbering, skill hashes).
    pub fn parse(bytes: &[u8]) -> Result<(Header, Value)> {
        let text =
            std::str::from_utf8(bytes).map_err(|e| parse(format!("header is not UTF-8: {e}")))?;
        let value: Value =
            serde_json::from_str(text).map_err(|e| parse(format!("header JSON: {e}")))?;
        if !value.is_object() {
            return Err(parse("header JSON is not an object"));
        }
        let header: Header = serde_json::from_value(value.clone())
            .map_err(|e| parse(format!("header JSON: {e}")))?;
        header.check()?;
        Ok((header, value))
    }

    fn check(&self) -> Result<()> {
        if let Some(f) = &self.format {
            if f != "cmf" {
                return Err(parse(format!("header format is {f:?}, expected \"cmf\"")));
            }
        }
        if let Some(v) = self.version {
            if v != 2 {
                return Err(parse(format!("header version is {v}, the envelope says 2")));
            }
        }
        if let Some(arch) = &self.arch {
            if let Some(lt) = &arch.layer_types {
                if lt.len() as u64 != arch.num_layers {
                    return Err(parse(format!(
                        "arch.layer_types has {} entries but num_layers is {}",
                        lt.len(),
                        arch.num_layers
                    )));
                }
            }
            if let Some(moe) = &arch.moe {
                if moe.top_k > moe.num_experts {
                    return Err(parse(format!(
                        "arch.moe.top_k {} exceeds num_experts {}",
                        moe.top_k, moe.num_experts
                    )));
                }
            }
        }
        if let Some(s) = self.shard {
            if s.count == 0 || s.no == 0 || s.no > s.count {
                return Err(parse(format!(
                    "shard {{no: {}, count: {}}} is not a valid position",
                    s.no, s.count
                )));
            }
        }
        if let Some(h) = &self.section_hashes {
            for (k, v) in [
                ("masks", &h.masks),
                ("vocab", &h.vocab),
                ("index", &h.index),
            ] {
                if let Some(v) = v {
                    if super::hash64::parse_hex16(v).is_none() {
                        return Err(parse(format!(
                            "section_hashes.{k} {v:?} is not 16 hex digits"
                        )));
                    }
                }
            }
        }
        if let Some(skills) = &self.skills {
            let mut ids = std::collections::HashSet::new();
            for s in skills {
                if !ids.insert(s.id.as_str()) {
                    return Err(parse(format!(
                        "skill id {:?} appears twice in the registry",
                        s.id
                    )));
                }
                if let Some(h) = &s.base_dir_hash {
                    if super::hash64::parse_hex16(h).is_none() {
                        return Err(parse(format!(
                            "skill {:?}: base_dir_hash {h:?} is not 16 hex digits",
                            s.id
                        )));
                    }
                }
            }
        }
        Ok(())
    }

    /// The header as compact JSON bytes (the writer's form).
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a Header always serializes")
    }
}

impl Arch {
    /// Number of mask "layers" rows: `num_layers`.
    pub fn n_layers(&self) -> u64 {
        self.num_layers
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_fields_survive_a_round_trip_in_order() {
        let src = br#"{"format":"cmf","version":2,"arch":{"arch_name":"x","hidden_size":8,"num_layers":1,"vocab_size":4,"zeta":1,"alpha":[2]},"new_thing":{"b":1,"a":2}}"#;
        let (h, _) = Header::parse(src).unwrap();
        assert_eq!(
            h.arch.as_ref().unwrap().extra.keys().collect::<Vec<_>>(),
            ["zeta", "alpha"]
        );
        assert!(h.extra.contains_key("new_thing"));
        let again = h.to_bytes();
        let (h2, _) = Header::parse(&again).unwrap();
        assert_eq!(h, h2);
        assert_eq!(h2.to_bytes(), again);
    }

    #[test]
    fn cross_field_rules() {
        let bad_layers = br#"{"arch":{"arch_name":"x","hidden_size":8,"num_layers":2,"vocab_size":4,"layer_types":["FullAttention"]}}"#;
        assert!(Header::parse(bad_layers).is_err());
        assert!(Header::parse(br#"[1]"#).is_err());
        assert!(Header::parse(b"{\"format\":\"gguf\"}").is_err());
        assert!(Header::parse(b"\xff").is_err());
        assert!(Header::parse(br#"{"arch":{"arch_name":"x","hidden_size":8,"num_layers":1,"vocab_size":4,"norm_style":"weird"}}"#).is_err());
        assert!(Header::parse(br#"{"shard":{"no":3,"count":2}}"#).is_err());
    }
}
