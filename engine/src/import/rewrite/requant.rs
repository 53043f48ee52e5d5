//! `requant` (§3.1): chosen 2-D weight tensors re-encoded into another dtype in a streamed
//! rewrite; every other tensor's bytes are copied unchanged.
//!
//! Which tensors change: those the caller's filter selects, among 2-D tensors of at least
//! 32 elements (1-D and smaller tensors stay as they are, §3.2's f16 rule) whose shape the
//! target dtype can hold. The router, the shared-expert gate and Gated DeltaNet's `a`/`b`
//! projections are kept at their precision unless the filter names tensors explicitly
//! (as `convert` keeps them). A tensor already in the target dtype is copied — except for
//! `vbit` with a new budget or a B-field, where the widths are the point.
//!
//! `vbit` allocation follows `convert`: the routed experts of one layer and projection
//! share a budget (joint water-filling, §3.2), and with a B-field each expert's row
//! magnitudes are multiplied by its selection frequency first.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use serde::Serialize;
use serde_json::{json, Value};

use super::{
    base_name, check_source, record_provenance, reencode, refused, rewrite_err_at, source_identity,
    tool, write_streamed, Result, StoredRows,
};
use crate::format::directory::TensorEntry;
use crate::format::dtype::{numel, DType};
use crate::format::writer::{spec_of, TensorPlan, WriteSummary};
use crate::format::{escape_str, CmfFile};
use crate::import::bfield::{routed_expert, BField};
use crate::import::hf::precision_sensitive;
use crate::quant::{self, rows::Decision, EncodeOptions};

pub struct RequantOptions<'a> {
    /// The target dtype.
    pub quant: DType,
    /// The caller's choice of tensors (by name, layer, ...).
    pub select: &'a (dyn Fn(&TensorEntry) -> bool + Sync),
    /// The filter names tensors explicitly: routers and gates it selects are re-encoded too.
    pub explicit: bool,
    pub encode: EncodeOptions,
    /// `vbit` only: the routed experts' selection frequencies (§3.2 B-field).
    pub b_field: Option<BField>,
    /// How the tensors were chosen, for `provenance.requant`.
    pub selection: Value,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Requanted {
    pub name: String,
    pub from: DType,
    pub to: DType,
    pub bytes_before: u64,
    pub bytes_after: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Skipped {
    pub name: String,
    pub dtype: DType,
    pub reason: String,
}

#[derive(Clone, Debug, Serialize)]
pub struct RequantSummary {
    pub write: WriteSummary,
    pub changed: Vec<Requanted>,
    /// Selected tensors left as they were, and why (1-D and small tensors only when the
    /// filter was explicit: otherwise every norm would be listed).
    pub skipped: Vec<Skipped>,
    /// `vbit` expert families that shared a budget.
    pub vbit_families: usize,
}

/// Why a selected tensor stays as it is, `None` when it is re-encoded.
fn reason_to_keep(file: &CmfFile, e: &TensorEntry, opts: &RequantOptions<'_>) -> Option<String> {
    let q = opts.quant;
    if e.shape.len() != 2 {
        return Some(format!("{}-D tensors stay as they are", e.shape.len()));
    }
    if numel(&e.shape).is_some_and(|n| n < 32) {
        return Some("tensors of fewer than 32 elements stay as they are (§3.2)".into());
    }
    if !opts.explicit && precision_sensitive(base_name(file, &e.name)) {
        return Some(
            "router/gate kept at its precision (name it with --only to requant it)".into(),
        );
    }
    let vbit = matches!(q, DType::Vbit | DType::VbitRo);
    let new_widths = vbit && (opts.b_field.is_some() || opts.encode.mean_bits.is_some());
    if e.dtype == q && !new_widths {
        return Some(format!("already {q}"));
    }
    q.size_for(&e.shape).err()
}

/// Re-encodes the tensors `opts` selects of `file` into `out`.
pub fn requant(file: &CmfFile, out: &Path, opts: &RequantOptions<'_>) -> Result<RequantSummary> {
    check_source(file)?;
    let q = opts.quant;
    if q.is_reserved() {
        return Err(refused(format!(
            "dtype {q} is reserved and cannot be written"
        )));
    }
    let vbit = matches!(q, DType::Vbit | DType::VbitRo);
    if !vbit && (opts.b_field.is_some() || opts.encode.mean_bits.is_some()) {
        return Err(refused(
            "--route-stats and --mean-bits apply to --quant vbit only",
        ));
    }
    let budget =
        quant::vbit_budget(DType::VbitRo, &opts.encode).map_err(|e| refused(e.to_string()))?;

    let entries: Vec<&TensorEntry> = file.directory.iter().collect();
    let mut chosen = vec![false; entries.len()];
    let mut skipped = Vec::new();
    for (i, e) in entries.iter().enumerate() {
        if !(opts.select)(e) {
            continue;
        }
        match reason_to_keep(file, e, opts) {
            None => chosen[i] = true,
            Some(reason) => {
                let small = e.shape.len() != 2 || numel(&e.shape).is_some_and(|n| n < 32);
                if opts.explicit || !small {
                    skipped.push(Skipped {
                        name: e.name.clone(),
                        dtype: e.dtype,
                        reason,
                    });
                }
            }
        }
    }

    // vbit: the routed experts of a layer and projection share one budget (§3.2).
    let mut families: BTreeMap<(&str, &str), Vec<usize>> = BTreeMap::new();
    if vbit {
        for (i, e) in entries.iter().enumerate().filter(|(i, _)| chosen[*i]) {
            if let Some((_, _, role)) = routed_expert(&e.name) {
                let at = e.name.find(".mlp.experts.").unwrap_or(0);
                families.entry((&e.name[..at], role)).or_default().push(i);
            }
        }
    }
    let mut decisions: HashMap<usize, Decision> = HashMap::new();
    for members in families.values() {
        let magnitudes = members
            .iter()
            .map(|&i| row_magnitudes(file, entries[i], q))
            .collect::<Result<Vec<_>>>()?;
        let factors = match &opts.b_field {
            Some(b) => b
                .family_factors(members.iter().map(|&i| entries[i].name.as_str()))
                .map_err(refused)?,
            None => None,
        };
        let bits = quant::vbit::allocate_family(&magnitudes, factors.as_deref(), budget);
        for (&i, b) in members.iter().zip(bits) {
            decisions.insert(i, Decision::Bits(b));
        }
    }

    let mut spec = spec_of(file);
    for (p, &c) in spec.tensors.iter_mut().zip(&chosen) {
        if c {
            p.dtype = q;
        }
    }
    let changed_count = chosen.iter().filter(|&&c| c).count();
    record_provenance(
        &mut spec.header,
        "requant",
        json!({
            "tool": tool("requant"),
            "source": source_identity(file),
            "quant": q.name(),
            "selection": opts.selection,
            "tensors": changed_count,
            "mean_bits": opts.encode.mean_bits,
            "vbit_b_field": opts.b_field.as_ref().map(|b| json!({"source": "route stats", "tokens": b.tokens})),
        }),
    );
    let plans: Vec<TensorPlan> = spec.tensors.clone();
    let mut changed = Vec::new();
    let write = write_streamed(out, spec, |i| {
        let e = entries[i];
        let bytes = file.tensor_bytes(e);
        if !chosen[i] {
            return Ok(Cow::Borrowed(bytes));
        }
        let payload = reencode(e, bytes, &plans[i], &opts.encode, decisions.remove(&i))?;
        changed.push(Requanted {
            name: e.name.clone(),
            from: e.dtype,
            to: q,
            bytes_before: e.nbytes,
            bytes_after: payload.len() as u64,
        });
        Ok(Cow::Owned(payload))
    })?;
    Ok(RequantSummary {
        write,
        changed,
        skipped,
        vbit_families: families.len(),
    })
}

/// The `vbit` row magnitudes of stored tensor `e` (one streamed pass).
fn row_magnitudes(file: &CmfFile, e: &TensorEntry, q: DType) -> Result<Vec<f64>> {
    let src = StoredRows::new(e, file.tensor_bytes(e))?;
    let stats = quant::rows::first_pass(
        q,
        &e.shape,
        |rows, out| src.read_rows(rows, out),
        |x| x.to_string(),
    )
    .map_err(rewrite_err_at(e))?;
    match stats {
        Some(quant::rows::Stats::RowMagnitudes(m)) => Ok(m),
        _ => Err(refused(format!(
            "{}: no row magnitudes for {q}",
            escape_str(&e.name)
        ))),
    }
}
