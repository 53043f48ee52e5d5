//! `cortiq info FILE`: everything the open file says about itself, without reading a
//! tensor byte (except the small `{prefix}.config_json` tensors of §12 pipelines).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::PathBuf;

use cortiq_engine::format::header::Header;
use cortiq_engine::format::layers::{self, Ffn, LayerBlocks, LayerMap};
use cortiq_engine::format::{feature, CmfFile, CmfModel, DType, SectionKind};
use serde_json::{json, Map, Value};

use super::common::{
    self, bpw, esc, esc_path, group_digits, human_bytes, json_brief, opt, Align, CmdResult, Status,
    Table,
};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Model file (.cmf), any shard, or a standalone skill file.
    pub file: PathBuf,
    /// Print one JSON document instead of text.
    #[arg(long)]
    pub json: bool,
}

impl Args {
    /// Text output for `file` (what `cortiq FILE` shows until the workbench exists).
    pub fn text(file: PathBuf) -> Args {
        Args { file, json: false }
    }
}

pub fn run(args: &Args) -> CmdResult {
    let file = common::open(&args.file)?;
    let info = Info::gather(&file);
    if args.json {
        common::print_json(&info.to_json(&args.file, &file))?;
    } else {
        common::emit(&info.to_text(&args.file, &file))?;
    }
    Ok(Status::Success)
}

/// Counts of one dtype across the directory.
#[derive(Default, Clone, Copy)]
struct DtypeStats {
    tensors: u64,
    params: u64,
    bytes: u64,
}

/// What the embedded tokenizer.json tells without the `tokenizers` crate.
struct TokenizerInfo {
    bytes: u64,
    model_type: Option<String>,
    /// Entries of `model.vocab`, if the file has one.
    vocab: Option<u64>,
    added: u64,
    /// Distinct token ids across `model.vocab` and `added_tokens` (added tokens usually
    /// reuse vocab ids, so the plain sum would overcount).
    tokens: u64,
    error: Option<String>,
}

/// A §12 pipeline component and its parsed config.
struct Component {
    prefix: String,
    config_bytes: u64,
    config: Option<Value>,
}

/// Everything `info` derives from the file, shared by the text and JSON views.
struct Info {
    by_dtype: BTreeMap<DType, DtypeStats>,
    total: DtypeStats,
    tokenizer: Option<TokenizerInfo>,
    components: Vec<Component>,
    unknown: Vec<(String, Value)>,
    layer_types: Option<String>,
    /// Each layer's blocks, over the whole shard set when the file is one shard of a set
    /// that opens (a layer's tensors may sit in several shards).
    layers: LayerMap,
    layers_scope: &'static str,
}

impl Info {
    fn gather(file: &CmfFile) -> Info {
        let mut by_dtype: BTreeMap<DType, DtypeStats> = BTreeMap::new();
        let mut total = DtypeStats::default();
        for e in file.directory.iter() {
            for s in [by_dtype.entry(e.dtype).or_default(), &mut total] {
                s.tensors += 1;
                s.params += e.numel();
                s.bytes += e.nbytes;
            }
        }
        let components = file
            .pipeline_components()
            .into_iter()
            .map(|prefix| {
                let entry = file.directory.get(&format!("{prefix}.config_json"));
                let (config_bytes, config) = match entry {
                    Some(e) => (e.nbytes, serde_json::from_slice(file.tensor_bytes(e)).ok()),
                    None => (0, None),
                };
                Component {
                    prefix,
                    config_bytes,
                    config,
                }
            })
            .collect();
        let layer_types = file
            .header
            .arch
            .as_ref()
            .and_then(|a| a.layer_types.as_deref())
            .map(summarize_layer_types);
        let arch = file.header.arch.as_ref();
        let set = match (file.header.shard, file.path.as_deref()) {
            (Some(s), Some(p)) if s.count > 1 => CmfModel::open(p).ok(),
            _ => None,
        };
        let (layers, layers_scope) = match &set {
            Some(m) => (
                layers::classify(m.tensors().map(|(_, e)| e), arch),
                "shard set",
            ),
            None => (layers::classify(file.directory.iter(), arch), "file"),
        };
        Info {
            by_dtype,
            total,
            tokenizer: file.vocab_bytes().map(tokenizer_info),
            components,
            unknown: unknown_fields(file),
            layer_types,
            layers,
            layers_scope,
        }
    }

    fn to_json(&self, path: &std::path::Path, file: &CmfFile) -> Value {
        let env = &file.envelope;
        let h = &file.header;
        let sections: Vec<Value> = SectionKind::ALL
            .iter()
            .map(|&k| {
                let s = env.section(k);
                json!({ "name": k.name(), "present": s.is_present(), "offset": s.off, "length": s.len })
            })
            .collect();
        let by_dtype: Vec<Value> = self
            .by_dtype
            .iter()
            .map(|(d, s)| {
                json!({
                    "dtype": d.name(), "tensors": s.tensors, "parameters": s.params,
                    "bytes": s.bytes, "bits_per_weight": bpw(s.bytes, s.params),
                })
            })
            .collect();
        let tokenizer = self.tokenizer.as_ref().map(|t| {
            json!({
                "bytes": t.bytes, "model_type": t.model_type, "vocab_entries": t.vocab,
                "added_tokens": t.added, "tokens": t.tokens, "error": t.error,
            })
        });
        let chat = h.tokenizer_config.as_ref().map(|c| {
            json!({
                "chat_template_chars": c.chat_template.as_ref().map(|t| t.chars().count()),
                "eos_token_ids": c.eos_token_ids,
                "bos_token_id": c.bos_token_id,
                "pad_token_id": c.pad_token_id,
            })
        });
        let masks = file.masks.as_ref().map(|m| {
            json!({
                "count": m.len(),
                "default_task": m.meta.default_task,
                "names": m.meta.masks.iter().map(|r| r.name.as_str()).collect::<Vec<_>>(),
            })
        });
        let skills = h.skills.as_deref().unwrap_or_default();
        let components: Vec<Value> = self
            .components
            .iter()
            .map(|c| json!({ "prefix": c.prefix, "config_bytes": c.config_bytes, "config": c.config }))
            .collect();
        let unknown: Map<String, Value> = self.unknown.iter().cloned().collect();
        json!({
            "ok": true,
            "path": path.to_string_lossy(),
            "size": file.len(),
            "version": env.version,
            "flags": env.flags,
            "required_features": { "bits": env.required_features, "names": feature::names(env.required_features) },
            "sections": sections,
            "envelope_hashes": {
                "header": nonzero_hex(env.header_hash),
                "directory": nonzero_hex(env.dir_hash),
            },
            "directory_hash": hex(file.directory_hash()),
            "arch": h.arch.as_ref().map(|a| {
                let mut v = serde_json::to_value(a).unwrap_or(Value::Null);
                if let (Value::Object(m), Some(s)) = (&mut v, &self.layer_types) {
                    m.insert("layer_types_summary".into(), json!(s));
                }
                v
            }),
            "quant_type": h.quant_type,
            "provenance": h.provenance,
            "tensors": {
                "count": self.total.tensors,
                "parameters": self.total.params,
                "bytes": self.total.bytes,
                "bits_per_weight": bpw(self.total.bytes, self.total.params),
                "by_dtype": by_dtype,
            },
            "layers": self.layers.layers.iter().map(layer_json).collect::<Vec<_>>(),
            "layers_summary": self.layers.summary(),
            "layers_scope": self.layers_scope,
            "mtp_head": self.layers.mtp.as_ref().map(|m| json!({
                "layers": m.layers.len(),
                "declared_layers": m.declared_layers,
                "tensors": m.tensors,
                "bytes": m.bytes,
                "blocks": m.layers.iter().map(layer_json).collect::<Vec<_>>(),
                "summary": self.layers.mtp_summary(),
            })),
            "tokenizer": tokenizer,
            "chat": chat,
            "masks": masks,
            "sparse_index_entries": file.index.as_ref().map(Vec::len),
            "skills": {
                "count": skills.len(),
                "ids": skills.iter().map(|s| s.id.as_str()).collect::<Vec<_>>(),
                "skill_file": file.is_skill_file(),
            },
            "shard": h.shard.map(|s| json!({ "no": s.no, "count": s.count, "set": shard_set(file.path.as_deref()) })),
            "pipeline_components": components,
            "warnings": file.warnings,
            "unknown_fields": unknown,
            "header": file.header_value,
        })
    }

    fn to_text(&self, path: &std::path::Path, file: &CmfFile) -> String {
        let env = &file.envelope;
        let h = &file.header;
        let mut out = String::new();

        let mut t = Table::kv().indent(0);
        t.pair("file", esc_path(path));
        t.pair(
            "size",
            format!(
                "{} ({} bytes)",
                human_bytes(file.len()),
                group_digits(file.len())
            ),
        );
        t.pair("version", env.version.to_string());
        let names = feature::names(env.required_features);
        t.pair(
            "features",
            format!(
                "{} (0x{:x})",
                if names.is_empty() {
                    "none".into()
                } else {
                    names.join(", ")
                },
                env.required_features
            ),
        );
        if env.flags != 0 {
            t.pair("flags", format!("0x{:x}", env.flags));
        }
        t.pair(
            "header hash",
            nonzero_hex(env.header_hash).unwrap_or_else(|| "absent".into()),
        );
        // The directory hash is the identity a standalone skill binds to (§9.1); the
        // computed value is what `skill apply` compares, so show it when the stored one is
        // missing or disagrees.
        let computed = file.directory_hash();
        t.pair(
            "dir hash",
            match env.dir_hash {
                0 => format!("absent (the directory hashes to {})", hex(computed)),
                h if h == computed => format!("{} (the identity skills bind to)", hex(h)),
                h => format!(
                    "{} stored, but the directory hashes to {}: run `cortiq verify`",
                    hex(h),
                    hex(computed)
                ),
            },
        );
        let shard = match h.shard {
            Some(s) => format!(
                "shard {} of {} · {}",
                s.no,
                s.count,
                shard_set(file.path.as_deref())
            ),
            None => "single file".into(),
        };
        t.pair("shard", shard);
        if file.is_skill_file() {
            t.pair(
                "kind",
                "standalone skill file (not runnable; see `cortiq skills`)",
            );
        }
        t.render(&mut out);

        out.push_str("\nsections\n");
        let mut t = Table::new(&[
            ("section", Align::Left),
            ("offset", Align::Right),
            ("length", Align::Right),
            ("end", Align::Right),
            ("size", Align::Right),
        ]);
        for k in SectionKind::ALL {
            let s = env.section(k);
            if s.is_present() || k == SectionKind::Data {
                t.row([
                    k.name().to_string(),
                    s.off.to_string(),
                    s.len.to_string(),
                    s.end().to_string(),
                    human_bytes(s.len),
                ]);
            } else {
                t.row([
                    k.name().to_string(),
                    "—".into(),
                    "absent".into(),
                    String::new(),
                    String::new(),
                ]);
            }
        }
        t.render(&mut out);

        out.push_str("\nheader\n");
        let mut t = Table::kv();
        match &h.arch {
            Some(a) => {
                t.pair("arch_name", esc(&a.arch_name));
                t.pair("hidden_size", a.hidden_size.to_string());
                t.pair("intermediate_size", opt(a.intermediate_size));
                t.pair("num_layers", a.num_layers.to_string());
                t.pair(
                    "attention heads",
                    format!(
                        "{} (kv {})",
                        opt(a.num_attention_heads),
                        opt(a.num_kv_heads)
                    ),
                );
                t.pair("head_dim", opt(a.head_dim));
                t.pair("vocab_size", a.vocab_size.to_string());
                if let Some(s) = &self.layer_types {
                    t.pair("layer_types", s.clone());
                }
                t.pair(
                    "norm_style",
                    match a.norm_style {
                        Some(n) => json_brief(&serde_json::to_value(n).unwrap_or(Value::Null), 20),
                        // The engine cannot guess it (spec §2): say so here rather than at run time.
                        None => "absent (the engine needs it to run this file)".into(),
                    },
                );
                t.pair("rms_norm_eps", opt(a.rms_norm_eps));
                t.pair("rope_theta", opt(a.rope_theta));
                if let Some(p) = a.partial_rotary_factor {
                    t.pair("partial_rotary", p.to_string());
                }
                t.pair("tie_embeddings", opt(a.tie_word_embeddings));
                t.pair("max_positions", opt(a.max_position_embeddings));
                if a.linear_num_key_heads.is_some() || a.linear_conv_kernel_dim.is_some() {
                    t.pair(
                        "linear attention",
                        format!(
                            "key heads {}, value heads {}, conv kernel {}",
                            opt(a.linear_num_key_heads),
                            opt(a.linear_num_value_heads),
                            opt(a.linear_conv_kernel_dim)
                        ),
                    );
                }
                let moe = match &a.moe {
                    Some(m) => {
                        let mut s = format!("{} experts, top-{}", m.num_experts, m.top_k);
                        if let Some(i) = m.moe_intermediate_size {
                            let _ = write!(s, ", expert FFN {i}");
                        }
                        if let Some(n) = m.norm_topk_prob {
                            let _ = write!(s, ", norm_topk_prob {n}");
                        }
                        if let Some(i) = m.shared_expert_intermediate_size {
                            let _ = write!(s, ", shared expert {i}");
                        }
                        s
                    }
                    None => "no".into(),
                };
                t.pair("moe", moe);
                let mtp = match &a.mtp {
                    Some(m) => format!(
                        "{} layer(s), share lm_head {}, share embed {}",
                        m.num_layers,
                        opt(m.share_lm_head),
                        opt(m.share_embed)
                    ),
                    None => "no".into(),
                };
                t.pair("mtp", mtp);
            }
            None => t.pair("arch", "absent"),
        }
        t.pair(
            "quant_type",
            h.quant_type
                .as_deref()
                .map(esc)
                .unwrap_or_else(|| "—".into()),
        );
        match &h.provenance {
            Some(Value::Object(m)) => {
                for (k, v) in m {
                    t.pair(format!("provenance.{}", esc(k)), json_brief(v, 100));
                }
            }
            Some(v) => t.pair("provenance", json_brief(v, 100)),
            None => t.pair("provenance", "—"),
        }
        t.render(&mut out);

        self.layers_text(&mut out);

        out.push_str("\ntensors\n");
        let mut t = Table::new(&[
            ("dtype", Align::Left),
            ("tensors", Align::Right),
            ("parameters", Align::Right),
            ("bytes", Align::Right),
            ("size", Align::Right),
            ("bits/weight", Align::Right),
        ]);
        let row = |name: String, s: &DtypeStats| {
            [
                name,
                s.tensors.to_string(),
                group_digits(s.params),
                group_digits(s.bytes),
                human_bytes(s.bytes),
                format!("{:.2}", bpw(s.bytes, s.params)),
            ]
        };
        for (d, s) in &self.by_dtype {
            t.row(row(d.name().to_string(), s));
        }
        t.row(row("total".into(), &self.total));
        t.render(&mut out);

        out.push_str("\ntokenizer\n");
        let mut t = Table::kv();
        match &self.tokenizer {
            Some(tok) => {
                let mut s = human_bytes(tok.bytes);
                if let Some(m) = &tok.model_type {
                    let _ = write!(s, ", {}", esc(m));
                }
                match (&tok.error, tok.vocab) {
                    (Some(e), _) => {
                        let _ = write!(s, ", does not parse: {}", esc(e));
                    }
                    (None, Some(v)) => {
                        let _ = write!(
                            s,
                            ", {} tokens ({v} in model.vocab, {} added)",
                            tok.tokens, tok.added
                        );
                    }
                    (None, None) => {
                        let _ = write!(s, ", no model.vocab; {} added tokens", tok.added);
                    }
                }
                t.pair("vocab section", s);
            }
            None => t.pair("vocab section", "absent"),
        }
        match &h.tokenizer_config {
            Some(c) => {
                t.pair(
                    "chat_template",
                    match &c.chat_template {
                        Some(tpl) => format!("{} characters", tpl.chars().count()),
                        None => "absent (ChatML fallback)".into(),
                    },
                );
                let eos: Vec<String> = c.eos_token_ids.iter().map(u32::to_string).collect();
                t.pair(
                    "eos_token_ids",
                    if eos.is_empty() {
                        "—".into()
                    } else {
                        eos.join(", ")
                    },
                );
                t.pair("bos_token_id", opt(c.bos_token_id));
                t.pair("pad_token_id", opt(c.pad_token_id));
            }
            None => t.pair("chat bundle", "absent"),
        }
        t.render(&mut out);

        out.push('\n');
        let mut t = Table::kv().indent(0);
        match &file.masks {
            Some(m) => {
                let names: Vec<String> = m.meta.masks.iter().map(|r| esc(&r.name)).collect();
                let mut s = format!("{}: {}", m.len(), names.join(", "));
                if let Some(d) = &m.meta.default_task {
                    let _ = write!(s, " (default task {})", esc(d));
                }
                t.pair("masks", s);
            }
            None => t.pair("masks", "none"),
        }
        if let Some(ix) = &file.index {
            t.pair(
                "sparse index",
                format!("{} entries (deprecated §7; see `cortiq masks`)", ix.len()),
            );
        }
        let skills = h.skills.as_deref().unwrap_or_default();
        let ids: Vec<String> = skills.iter().map(|s| esc(&s.id)).collect();
        t.pair(
            "skills",
            if ids.is_empty() {
                "none".into()
            } else {
                format!("{}: {}", ids.len(), ids.join(", "))
            },
        );
        if self.components.is_empty() {
            t.pair("pipeline", "none");
        }
        t.render(&mut out);

        if !self.components.is_empty() {
            out.push_str("\npipeline components\n");
            let mut t = Table::kv();
            for c in &self.components {
                let cfg = match &c.config {
                    Some(v) => json_brief(v, 100),
                    None => "config does not parse as JSON".into(),
                };
                t.pair(
                    esc(&c.prefix),
                    format!("config {}: {}", human_bytes(c.config_bytes), cfg),
                );
            }
            t.render(&mut out);
        }

        if !file.warnings.is_empty() {
            out.push_str("\nwarnings\n");
            for w in &file.warnings {
                let _ = writeln!(out, "  {}", esc(w));
            }
        }
        if !self.unknown.is_empty() {
            out.push_str("\nunknown header fields (kept, not interpreted)\n");
            let mut t = Table::kv();
            for (k, v) in &self.unknown {
                t.pair(esc(k), json_brief(v, 80));
            }
            t.render(&mut out);
        }
        out
    }
}

impl Info {
    /// The `layers` section: the summary, the MTP head, each run of equal layers.
    fn layers_text(&self, out: &mut String) {
        let map = &self.layers;
        let Some(summary) = map.summary() else {
            if map.mtp.is_none() {
                return;
            }
            out.push_str("\nlayers\n");
            let mut t = Table::kv();
            t.pair("summary", "no decoder layers (model.layers.N.*)");
            t.pair("mtp", map.mtp_summary().unwrap_or_default());
            t.render(out);
            return;
        };
        let scope = if self.layers_scope == "file" {
            String::new()
        } else {
            format!(" (over the {})", self.layers_scope)
        };
        let _ = writeln!(out, "\nlayers{scope}");
        let mut t = Table::kv();
        t.pair("summary", summary);
        if let Some(m) = map.mtp_summary() {
            t.pair("mtp", m);
        }
        if let Some(note) = map.contradiction() {
            t.pair("note", note);
        }
        for r in layers::runs(&map.layers) {
            t.pair(r.name(), r.label);
        }
        t.render(out);
    }
}

/// One layer of `info --json`'s `layers` (and of `mtp_head.blocks`):
///
/// ```json
/// {"index": 3, "mixer": "full_attention", "gated": true, "declared": "FullAttention",
///  "ffn": "moe", "width": null, "experts": 8, "top_k": 2, "expert_width": 32,
///  "router_rows": 8, "shared_expert": true, "shared_expert_width": 56,
///  "shared_expert_gate": true, "tensors": 33, "bytes": 65184}
/// ```
///
/// - `mixer`: `linear_attention` (Gated DeltaNet, `linear_attn.*`), `full_attention`,
///   `sliding_attention` (softmax attention that `arch.layer_types` calls sliding) or
///   `none`; decided by the tensors present, never by the model's name (§2).
/// - `gated`: attention whose `q_proj` has `2·heads·head_dim` rows (the output gate).
/// - `declared`: `arch.layer_types[index]`, or null.
/// - `ffn`: `dense`, `moe` (a router `mlp.gate` or `mlp.experts.*`) or `none`. `width`
///   is a dense layer's intermediate size; `experts` (present in the file), `top_k`
///   (`arch.moe`), `expert_width`, `router_rows`, `shared_expert_width` are null unless
///   `ffn` is `moe`; `shared_expert` and `shared_expert_gate` are false then.
/// - `tensors`, `bytes`: the layer's directory entries.
fn layer_json(l: &LayerBlocks) -> Value {
    let (ffn, width, moe) = match &l.ffn {
        Ffn::Dense { width } => ("dense", *width, None),
        Ffn::Moe(m) => ("moe", None, Some(m)),
        Ffn::None => ("none", None, None),
    };
    json!({
        "index": l.index,
        "mixer": l.mixer.key(),
        "gated": l.gated,
        "declared": l.declared,
        "ffn": ffn,
        "width": width,
        "experts": moe.map(|m| m.experts),
        "top_k": moe.and_then(|m| m.top_k),
        "expert_width": moe.and_then(|m| m.expert_width),
        "router_rows": moe.and_then(|m| m.router_rows),
        "shared_expert": moe.is_some_and(|m| m.shared_expert),
        "shared_expert_width": moe.and_then(|m| m.shared_width),
        "shared_expert_gate": moe.is_some_and(|m| m.shared_gate),
        "tensors": l.tensors,
        "bytes": l.bytes,
    })
}

fn hex(h: u64) -> String {
    format!("{h:016x}")
}

/// Envelope hashes use 0 for "absent" (§8.1).
fn nonzero_hex(h: u64) -> Option<String> {
    (h != 0).then(|| hex(h))
}

fn tokenizer_info(bytes: &[u8]) -> TokenizerInfo {
    let mut info = TokenizerInfo {
        bytes: bytes.len() as u64,
        model_type: None,
        vocab: None,
        added: 0,
        tokens: 0,
        error: None,
    };
    let v: Value = match serde_json::from_slice(bytes) {
        Ok(v) => v,
        Err(e) => {
            info.error = Some(e.to_string());
            return info;
        }
    };
    let model = v.get("model");
    info.model_type = model
        .and_then(|m| m.get("type"))
        .and_then(Value::as_str)
        .map(str::to_string);
    let mut ids: BTreeSet<u64> = BTreeSet::new();
    match model.and_then(|m| m.get("vocab")) {
        // BPE, WordPiece, WordLevel: token → id.
        Some(Value::Object(m)) => {
            info.vocab = Some(m.len() as u64);
            ids.extend(m.values().filter_map(Value::as_u64));
        }
        // Unigram: [[token, score], ...], the id is the position.
        Some(Value::Array(a)) => {
            info.vocab = Some(a.len() as u64);
            ids.extend(0..a.len() as u64);
        }
        _ => {}
    }
    if let Some(Value::Array(added)) = v.get("added_tokens") {
        info.added = added.len() as u64;
        ids.extend(
            added
                .iter()
                .filter_map(|t| t.get("id").and_then(Value::as_u64)),
        );
    }
    info.tokens = ids.len() as u64;
    info
}

/// `layer_types` in a line: `FullAttention ×4`, `(LinearAttention ×3, FullAttention) ×16`,
/// or counts per type when there is no short pattern.
pub fn summarize_layer_types(types: &[String]) -> String {
    let n = types.len();
    if n == 0 {
        return "none".into();
    }
    // The shortest period that tiles the whole list.
    let period = (1..=n)
        .find(|&p| n.is_multiple_of(p) && (p..n).all(|i| types[i] == types[i - p]))
        .unwrap_or(n);
    let unit = &types[..period];
    let mut runs: Vec<(&str, usize)> = Vec::new();
    for t in unit {
        match runs.last_mut() {
            Some((name, count)) if *name == t.as_str() => *count += 1,
            _ => runs.push((t.as_str(), 1)),
        }
    }
    let reps = n / period;
    if runs.len() <= 6 {
        let parts: Vec<String> = runs
            .iter()
            .map(|(name, c)| {
                if *c == 1 && reps > 1 {
                    esc(name)
                } else {
                    format!("{} ×{c}", esc(name))
                }
            })
            .collect();
        return match (reps, runs.len()) {
            (1, _) => parts.join(", "),
            (_, 1) => format!("{} ×{}", esc(runs[0].0), runs[0].1 * reps),
            _ => format!("({}) ×{reps}", parts.join(", ")),
        };
    }
    let mut counts: Vec<(&str, usize)> = Vec::new();
    for t in types {
        match counts.iter_mut().find(|(name, _)| *name == t.as_str()) {
            Some((_, c)) => *c += 1,
            None => counts.push((t.as_str(), 1)),
        }
    }
    let parts: Vec<String> = counts
        .iter()
        .map(|(name, c)| format!("{} ×{c}", esc(name)))
        .collect();
    format!("{} (irregular order)", parts.join(", "))
}

/// Header fields this reader keeps but does not interpret, as `path → value`.
fn unknown_fields(file: &CmfFile) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    let mut add = |prefix: &str, m: &Map<String, Value>| {
        for (k, v) in m {
            out.push((format!("{prefix}{k}"), v.clone()));
        }
    };
    let h: &Header = &file.header;
    add("", &h.extra);
    if let Some(a) = &h.arch {
        add("arch.", &a.extra);
        if let Some(m) = &a.moe {
            add("arch.moe.", &m.extra);
        }
        if let Some(m) = &a.mtp {
            add("arch.mtp.", &m.extra);
        }
    }
    if let Some(c) = &h.tokenizer_config {
        add("tokenizer_config.", &c.extra);
    }
    if let Some(s) = &h.section_hashes {
        add("section_hashes.", &s.extra);
    }
    for s in h.skills.iter().flatten() {
        add(&format!("skills[{}].", s.id), &s.extra);
        if let Some(sel) = &s.selection {
            add(&format!("skills[{}].selection.", s.id), &sel.extra);
        }
    }
    if let Some(m) = &file.masks {
        add("masks.", &m.meta.extra);
        for r in &m.meta.masks {
            add(&format!("masks[{}].", r.name), &r.extra);
        }
    }
    out
}

/// What the shard set of `path` holds, or why it does not open (a shard is valid alone).
fn shard_set(path: Option<&std::path::Path>) -> String {
    let Some(path) = path else {
        return "set unknown (not opened from a file)".into();
    };
    match cortiq_engine::format::CmfModel::open(path) {
        Ok(m) => format!(
            "set of {} files: {} tensors, {}",
            m.shards.len(),
            m.tensor_count(),
            human_bytes(m.total_bytes())
        ),
        Err(e) => format!("the set does not open: {}", e),
    }
}

#[cfg(test)]
mod tests {
    use super::summarize_layer_types;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn layer_type_summaries() {
        assert_eq!(summarize_layer_types(&s(&["F", "F", "F", "F"])), "F ×4");
        assert_eq!(
            summarize_layer_types(&s(&["L", "L", "L", "F"])),
            "L ×3, F ×1"
        );
        assert_eq!(
            summarize_layer_types(&s(&["L", "L", "F", "L", "L", "F"])),
            "(L ×2, F) ×2"
        );
        assert_eq!(summarize_layer_types(&[]), "none");
    }
}
