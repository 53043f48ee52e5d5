//! Writes the seeds of the fuzz targets to `fuzz/seeds/<target>/` (git-ignored; the kept
//! corpora in `fuzz/corpus/` are these seeds minimized by `cargo fuzz cmin` and grown by
//! campaigns). Small by construction: fixtures are cut down (one layer, 32 tokens),
//! never copied whole.
//!
//!     cd fuzz && cargo run --release --example make_seeds [FIXTURES]
//!
//! FIXTURES defaults to `../../shared/fixtures` (relative to this crate).

use std::path::{Path, PathBuf};

use cortiq_engine::format::masks::{build_section, MaskRecord};
use cortiq_engine::format::{CmfFile, DType, SectionKind};
use cortiq_engine::quant::{self, EncodeOptions};
use cortiq_engine::synth::{write_demo_with, DemoConfig};
use cortiq_engine::tinymodel::{write_tiny, TinyFf, TinyLayer, TinyMixer, TinySpec};
use serde_json::{json, Map, Value};

/// Deterministic values, so that seeds are reproducible.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> f32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}

fn put(dir: &Path, name: &str, bytes: &[u8]) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join(name), bytes).unwrap();
}

/// `[flags][header_len u16][header][masks section]`.
fn masks_skills(fx: &Path, out: &Path) {
    let mut n = 0;
    for name in [
        "qwen3_moe-masked.cmf",
        "qwen3-skills.cmf",
        "qwen3-skillfile.cmf",
        "qwen3-q8_2f.cmf",
    ] {
        let Ok(f) = CmfFile::open(fx.join("cmf").join(name)) else {
            continue;
        };
        let head = f.section_bytes(SectionKind::Header);
        let masks = if f.masks.is_some() {
            f.section_bytes(SectionKind::Masks)
        } else {
            &[]
        };
        let mut seed = vec![0u8];
        seed.extend_from_slice(&(head.len() as u16).to_le_bytes());
        seed.extend_from_slice(head);
        seed.extend_from_slice(masks);
        put(out, &format!("fixture-{n}"), &seed);
        n += 1;
    }
    // Synthetic masks for the fallback arch (3 layers, ffn 40, 4 heads, 6 experts),
    // with and without expert fields, and looped (2 visits per layer).
    for (i, (experts, visits, flags)) in [(false, 3, 2u8), (true, 3, 2), (true, 6, 3)]
        .into_iter()
        .enumerate()
    {
        let per_visit = 5 + 1 + if experts { 1 } else { 0 };
        let mut blob = vec![0u8; visits * per_visit + 1];
        for (k, b) in blob.iter_mut().enumerate() {
            *b = (k as u8).wrapping_mul(37) & 0x7f;
        }
        // Keep tail bits clear: ffn 40 bits = 5 bytes (no tail), heads 4 of 8, gates 3 of
        // 8, experts 6 of 8.
        for v in 0..visits {
            blob[visits * 5 + v] &= 0x0f;
        }
        blob[visits * 6] &= 0x07;
        if experts {
            for v in 0..visits {
                blob[visits * 6 + 1 + v] &= 0x3f;
            }
        }
        let rec = MaskRecord {
            task_id: 1,
            name: format!("task{i}"),
            has_expert_fields: experts,
            ..Default::default()
        };
        let section = build_section(Some("task0".into()), vec![rec], &[blob]);
        let mut seed = vec![flags, 2, 0];
        seed.extend_from_slice(b"{}");
        seed.extend_from_slice(&section);
        put(out, &format!("synthetic-{i}"), &seed);
    }
}

/// `[dtype][flags][acts][dims][payload]` for every writable dtype and several shapes.
fn quant_kernels(out: &Path) {
    let shapes: [&[u64]; 7] = [
        &[4, 64],
        &[3, 32],
        &[5, 40],
        &[70],
        &[2, 3, 32],
        &[],
        &[9, 96],
    ];
    let mut rng = Lcg(7);
    for dtype in cortiq_engine::format::dtype::WRITABLE {
        for (si, shape) in shapes.iter().enumerate() {
            let n: u64 = shape.iter().product();
            let values: Vec<f32> = (0..n)
                .map(|i| {
                    let v = rng.next();
                    if i % 29 == 5 {
                        v * 40.0 // outliers for the q1s / q1t overlays
                    } else {
                        v
                    }
                })
                .collect();
            let Ok(payload) = quant::encode(dtype, shape, &values, &EncodeOptions::default())
            else {
                continue;
            };
            let precision = (si % 3) as u8;
            let tokens = [1u8, 3, 6][si % 3] - 1;
            let flags = shape.len() as u8 | precision << 3 | tokens << 5;
            let mut seed = vec![dtype.id(), flags, (si % 8) as u8];
            for &d in *shape {
                seed.extend_from_slice(&(d as u16).to_le_bytes());
            }
            seed.extend_from_slice(&payload);
            put(out, &format!("{}-{si}", dtype.name()), &seed);
        }
    }
}

/// One fixture checkpoint cut down to one layer, 32 tokens and narrow MLPs, in bf16 (or
/// `half` f16): the importer sees every family's names and config.
fn hf_checkpoint(fx: &Path, family: &str, layer: usize, half: &str) -> Option<Vec<(u8, Vec<u8>)>> {
    let dir = fx.join("hf").join(family);
    let mut cfg: Value =
        serde_json::from_slice(&std::fs::read(dir.join("config.json")).ok()?).ok()?;
    let st = std::fs::read(dir.join("model.safetensors")).ok()?;
    let n = u64::from_le_bytes(st[..8].try_into().unwrap()) as usize;
    let head: Map<String, Value> = serde_json::from_slice(&st[8..8 + n]).ok()?;
    let c = cfg.as_object_mut()?;
    let vocab = c["vocab_size"].as_u64()?;
    let inter = c["intermediate_size"].as_u64()?;
    let shared = c
        .get("shared_expert_intermediate_size")
        .and_then(Value::as_u64);
    c.insert("num_hidden_layers".into(), json!(1));
    c.insert("vocab_size".into(), json!(32));
    c.insert("intermediate_size".into(), json!(32));
    if c.contains_key("num_experts") {
        c.insert("num_experts".into(), json!(2));
    }
    if shared.is_some() {
        c.insert("shared_expert_intermediate_size".into(), json!(16));
    }
    if c.contains_key("mlp_only_layers") {
        c.insert("mlp_only_layers".into(), json!([]));
    }
    if let Some(Value::Array(lt)) = c.get("layer_types") {
        let kept = lt[layer].clone();
        c.insert("layer_types".into(), json!([kept]));
    }
    let prefix = format!("model.layers.{layer}.");
    let mut rng = Lcg(3);
    let mut meta = Map::new();
    let mut data = Vec::new();
    let mut names: Vec<&String> = head.keys().filter(|k| *k != "__metadata__").collect();
    names.sort();
    for name in names {
        let new_name = if let Some(rest) = name.strip_prefix(&prefix) {
            format!("model.layers.0.{rest}")
        } else if name.starts_with("model.layers.") {
            continue;
        } else {
            name.clone()
        };
        if let Some(e) = new_name.split(".experts.").nth(1) {
            if e.split('.').next()?.parse::<u32>().ok()? >= 2 {
                continue;
            }
        }
        let mut shape: Vec<u64> = head[name]["shape"]
            .as_array()?
            .iter()
            .map(|d| d.as_u64().unwrap())
            .collect();
        let dense_mlp = new_name.contains(".mlp.")
            && !new_name.contains("experts")
            && !new_name.contains("shared_expert")
            && !new_name.ends_with(".mlp.gate.weight");
        for d in shape.iter_mut() {
            if *d == vocab {
                *d = 32;
            } else if dense_mlp && *d == inter {
                *d = 32;
            } else if new_name.contains(".shared_expert.") && Some(*d) == shared {
                *d = 16;
            }
        }
        if new_name.ends_with(".mlp.gate.weight") {
            shape[0] = 2;
        }
        let count: u64 = shape.iter().product();
        let start = data.len();
        for i in 0..count {
            let v = if new_name.ends_with("norm.weight") {
                1.0 + 0.1 * rng.next()
            } else if new_name.ends_with("A_log") {
                0.5 + 0.1 * (i as f32)
            } else {
                0.2 * rng.next()
            };
            let bits = if half == "F16" {
                half::f16::from_f32(v).to_bits()
            } else {
                (v.to_bits() >> 16) as u16
            };
            data.extend_from_slice(&bits.to_le_bytes());
        }
        meta.insert(
            new_name,
            json!({"dtype": half, "shape": shape, "data_offsets": [start, data.len()]}),
        );
    }
    let mut header = serde_json::to_vec(&meta).ok()?;
    header.resize(header.len().next_multiple_of(8), b' ');
    let mut file = (header.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(&header);
    file.extend_from_slice(&data);
    Some(vec![(0, serde_json::to_vec(&cfg).ok()?), (1, file)])
}

/// `[opts]` then `[file][len u32][bytes]` records.
fn import_hf(fx: &Path, out: &Path) {
    let record = |seed: &mut Vec<u8>, (file, bytes): &(u8, Vec<u8>)| {
        seed.push(*file);
        seed.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
        seed.extend_from_slice(bytes);
    };
    let cases = [
        ("llama", 0, "F16", 2u8),
        ("llama", 0, "BF16", 0),
        ("llama", 0, "BF16", 5),
        ("qwen2", 0, "BF16", 4),
        ("qwen3", 0, "BF16", 6),
        ("qwen2_moe", 0, "BF16", 3),
        ("qwen3_moe", 0, "BF16", 2 | 8),
        ("gemma3", 3, "BF16", 7),
        ("qwen3_5", 0, "BF16", 2),
        ("qwen3_5_moe", 1, "BF16", 1),
    ];
    for (i, (family, layer, half, opts)) in cases.into_iter().enumerate() {
        let Some(files) = hf_checkpoint(fx, family, layer, half) else {
            continue;
        };
        let mut seed = vec![opts];
        for f in &files {
            record(&mut seed, f);
        }
        if i == 0 {
            // The tokenizer files the bundle reads (no tokenizer.json: too large).
            for (idx, name) in [
                (5u8, "tokenizer_config.json"),
                (6, "generation_config.json"),
                (7, "chat_template.jinja"),
            ] {
                if let Ok(b) = std::fs::read(fx.join("hf/llama").join(name)) {
                    record(&mut seed, &(idx, b));
                }
            }
        }
        put(out, &format!("{family}-{i}"), &seed);
    }
}

fn chat_template(fx: &Path, out: &Path) {
    for name in ["chatml", "smollm2", "qwen25", "qwen3"] {
        if let Ok(b) = std::fs::read(fx.join("chat").join(format!("{name}.jinja"))) {
            put(out, name, &b);
        }
    }
    let snippets = [
        "{% for m in messages %}{{ m.role | upper }}: {{ m.content | tojson }}{% endfor %}",
        "{{ messages | map(attribute='content') | join('|') | replace('a', 'bb') | indent(2) }}",
        "{% set ns = namespace(n=0) %}{% for i in range(10) %}{% set ns.n = ns.n + i %}{% endfor %}{{ ns.n }}",
        "{% macro m(x) %}{{ x ~ x }}{% endmacro %}{{ m(m('ab')) | length }}{{ tools | tojson(indent=2) }}",
        "{{ messages[1].content.split('?')[0].strip().lstrip('W') }}{{ '%s-%d' % ('a', 3) }}{{ strftime_now('%Y-%m-%d') }}",
        "{% if messages[0].role != 'user' %}{{ raise_exception('first must be user') }}{% endif %}",
        "{{ (messages | selectattr('role', 'equalto', 'tool') | list | length) * 'x' }}{{ messages[2].tool_calls[0].function.arguments | items | list }}",
    ];
    for (i, s) in snippets.iter().enumerate() {
        put(out, &format!("snippet-{i}"), s.as_bytes());
    }
}

/// Small valid files: the demo's tiny model and tiny models in compact dtypes.
fn open_verify(out: &Path, tmp: &Path) {
    let p = tmp.join("demo.cmf");
    if write_demo_with(&p, &DemoConfig::tiny()).is_ok() {
        let b = std::fs::read(&p).unwrap();
        if b.len() <= 128 << 10 {
            put(out, "demo-tiny", &b);
        }
    }
    let gdn = TinyMixer::GatedDeltaNet {
        key_heads: 1,
        value_heads: 2,
        dk: 16,
        dv: 32,
        kernel: 2,
    };
    for (i, dtype) in [DType::Q4Block, DType::Q1t, DType::Vbit, DType::Q1]
        .into_iter()
        .enumerate()
    {
        let layers = vec![TinyLayer {
            mixer: if i % 2 == 0 {
                TinyMixer::Attention { gated: i == 2 }
            } else {
                gdn.clone()
            },
            ff: if i >= 2 {
                TinyFf::Moe {
                    experts: 3,
                    top_k: 2,
                    intermediate: 32,
                    shared: Some(32),
                }
            } else {
                TinyFf::Dense { intermediate: 64 }
            },
        }];
        let spec = TinySpec {
            hidden: 32,
            heads: 2,
            kv_heads: 1,
            head_dim: 16,
            dtype,
            mtp: i == 1,
            ..TinySpec::awkward(layers)
        };
        let p = tmp.join(format!("t{i}.cmf"));
        if write_tiny(&p, &spec).is_ok() {
            let b = std::fs::read(&p).unwrap();
            if b.len() <= 128 << 10 {
                put(out, &format!("tiny-{}", dtype.name()), &b);
            }
        }
    }
}

/// `[base][run]` with no patch and with one small patch in each region.
fn forward(out: &Path) {
    for base in 0u8..10 {
        put(
            out,
            &format!("base{base}"),
            &[base, (base % 3) | 4 | 8 | 16 | 32],
        );
        let mut patched = vec![base, base % 3 | 8];
        patched.extend_from_slice(&[0, 0x10, 0x02, 0, 0, 4, 0x00, 0x00, 0xc0, 0x7f]);
        put(out, &format!("base{base}-data"), &patched);
        let mut head = vec![base, 16 | 32];
        head.extend_from_slice(&[1, 40, 0, 0, 0, 1, b'9']);
        put(out, &format!("base{base}-header"), &head);
    }
}

fn main() {
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let fx = std::env::args()
        .nth(1)
        .map(PathBuf::from)
        .unwrap_or_else(|| here.join("../../shared/fixtures"));
    let seeds = here.join("seeds");
    let tmp = tempfile::tempdir().unwrap();
    masks_skills(&fx, &seeds.join("masks_skills"));
    quant_kernels(&seeds.join("quant_kernels"));
    import_hf(&fx, &seeds.join("import_hf"));
    chat_template(&fx, &seeds.join("chat_template"));
    open_verify(&seeds.join("open_verify"), tmp.path());
    forward(&seeds.join("forward"));
    for t in [
        "masks_skills",
        "quant_kernels",
        "import_hf",
        "chat_template",
        "open_verify",
        "forward",
    ] {
        let dir = seeds.join(t);
        let (n, bytes) = std::fs::read_dir(&dir).map_or((0, 0), |d| {
            d.flatten()
                .fold((0, 0), |(n, b), e| (n + 1, b + e.metadata().unwrap().len()))
        });
        println!("{}: {n} seeds, {bytes} bytes", dir.display());
    }
}
