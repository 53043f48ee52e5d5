//! The B-field of §3.2: the router's selection frequency of each routed expert, gathered
//! from route stats (`cortiq-route-stats` v1, [`RouteStats`]). `convert --route-stats` and
//! `requant --route-stats` multiply an expert's row magnitudes by it when they allocate
//! `vbit` widths over a layer's experts (`b ∝ log2(A·B)`), so the experts a workload
//! actually uses get the bits.

use std::collections::BTreeMap;

use crate::format::layers::LAYER_PREFIX;
use crate::runtime::routes::RouteStats;

/// Per MoE layer, each expert's selection frequency (`counts[e] / tokens`).
#[derive(Clone, Debug, PartialEq)]
pub struct BField {
    layers: BTreeMap<u64, Vec<f64>>,
    /// Tokens the stats were gathered over (recorded in provenance).
    pub tokens: u64,
}

/// `model.layers.{l}.mlp.experts.{e}.{role}` (also behind a `skill.{id}.` prefix) →
/// `(l, e, role)`; the MTP head's blocks (`model.mtp.layers.*`) are not decoder layers.
pub fn routed_expert(name: &str) -> Option<(u64, u64, &str)> {
    const EXPERTS: &str = ".mlp.experts.";
    let at = name.find(EXPERTS)?;
    let (head, tail) = (&name[..at], &name[at + EXPERTS.len()..]);
    let layers = LAYER_PREFIX.trim_end_matches('.');
    let (before, layer) = head.rsplit_once('.')?;
    if !(before == layers || before.ends_with(&format!(".{layers}"))) {
        return None;
    }
    let (expert, role) = tail.split_once('.')?;
    Some((layer.parse().ok()?, expert.parse().ok()?, role))
}

impl BField {
    /// The selection frequencies of `stats`. Refuses counts that exceed the tokens routed
    /// (`counts[e] ≤ tokens`: an expert is chosen at most once per position).
    pub fn from_stats(stats: &RouteStats) -> Result<BField, String> {
        let mut layers = BTreeMap::new();
        for l in &stats.layers {
            if let Some(&c) = l.counts.iter().find(|&&c| c > stats.tokens) {
                return Err(format!(
                    "route stats layer {}: an expert chosen {c} times over {} tokens",
                    l.layer, stats.tokens
                ));
            }
            let f = l
                .counts
                .iter()
                .map(|&c| c as f64 / stats.tokens.max(1) as f64)
                .collect();
            if layers.insert(l.layer as u64, f).is_some() {
                return Err(format!("route stats list layer {} twice", l.layer));
            }
        }
        Ok(BField {
            layers,
            tokens: stats.tokens,
        })
    }

    /// The factor of a routed expert's tensor: `Ok(None)` for a tensor that is not a
    /// routed expert, and for the experts of a layer whose stats saw no routing at all
    /// (no information: the magnitudes decide alone). An expert the stats do not cover is
    /// an error: the stats belong to another model.
    pub fn factor(&self, name: &str) -> Result<Option<f64>, String> {
        let Some((layer, expert, _)) = routed_expert(name) else {
            return Ok(None);
        };
        let f = self.layers.get(&layer).ok_or_else(|| {
            format!(
                "the route stats have no layer {layer} (tensor {name}): stats of another model?"
            )
        })?;
        if f.iter().all(|&x| x == 0.0) {
            return Ok(None);
        }
        f.get(expert as usize).copied().map(Some).ok_or_else(|| {
            format!(
                "the route stats of layer {layer} list {} experts, {name} is expert {expert}",
                f.len()
            )
        })
    }

    /// Factors for a family's members (by tensor name), `None` when none applies.
    pub fn family_factors<'a>(
        &self,
        names: impl IntoIterator<Item = &'a str>,
    ) -> Result<Option<Vec<f64>>, String> {
        let f: Vec<Option<f64>> = names
            .into_iter()
            .map(|n| self.factor(n))
            .collect::<Result<_, _>>()?;
        Ok(f.iter()
            .any(Option::is_some)
            .then(|| f.iter().map(|x| x.unwrap_or(1.0)).collect()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::routes::LayerStats;

    #[test]
    fn expert_names() {
        assert_eq!(
            routed_expert("model.layers.3.mlp.experts.7.up_proj.weight"),
            Some((3, 7, "up_proj.weight"))
        );
        assert_eq!(
            routed_expert("skill.sql.model.layers.12.mlp.experts.0.down_proj.weight"),
            Some((12, 0, "down_proj.weight"))
        );
        assert_eq!(
            routed_expert("model.mtp.layers.0.mlp.experts.1.up_proj.weight"),
            None
        );
        assert_eq!(
            routed_expert("model.layers.3.mlp.shared_expert.up_proj.weight"),
            None
        );
        assert_eq!(routed_expert("model.layers.x.mlp.experts.1.a"), None);
    }

    #[test]
    fn frequencies_and_refusals() {
        let stats = |counts: Vec<u64>, tokens| RouteStats {
            format: RouteStats::FORMAT.into(),
            version: 1,
            model: None,
            tokens,
            layers: vec![LayerStats {
                layer: 2,
                experts: counts.len(),
                top_k: 1,
                mass: vec![0.0; counts.len()],
                counts,
            }],
        };
        let b = BField::from_stats(&stats(vec![3, 1, 0], 4)).unwrap();
        let f = |n: &str| b.factor(n);
        assert_eq!(
            f("model.layers.2.mlp.experts.0.up_proj.weight"),
            Ok(Some(0.75))
        );
        assert_eq!(
            f("model.layers.2.mlp.experts.2.up_proj.weight"),
            Ok(Some(0.0))
        );
        assert_eq!(f("model.layers.2.self_attn.q_proj.weight"), Ok(None));
        assert!(f("model.layers.2.mlp.experts.3.up_proj.weight").is_err());
        assert!(f("model.layers.1.mlp.experts.0.up_proj.weight").is_err());
        assert!(BField::from_stats(&stats(vec![5], 4)).is_err());
        let idle = BField::from_stats(&stats(vec![0, 0], 4)).unwrap();
        assert_eq!(
            idle.factor("model.layers.2.mlp.experts.1.up_proj.weight"),
            Ok(None)
        );
    }
}
