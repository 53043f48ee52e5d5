//! Tensors checked on first use (`run --verify-on-load`): the loader checks only the
//! small links (envelope, header, directory, sections) and the forward checks each group
//! of tensors the first time it reaches it: a decoder layer's tensors (`model.layers.N.`)
//! before that layer first runs, everything else (embedding, final norm, head, MTP,
//! skills) before the first embedding. The check is [`verify`](crate::format::verify)'s
//! own, hash64, strong digest and payload, so a damaged tensor stops the forward with an
//! error before its bytes are used, as the up-front check would have stopped the load.
//!
//! What it buys: the model is ready without hashing the whole file first, and tensors a
//! run never reaches (the layers past an early stop, for instance) are never hashed.

use std::sync::OnceLock;

use crate::format::digests::StrongDigests;
use crate::format::shards::CmfModel;
use crate::format::verify::{check_tensor, strong_digests_of, LinkStatus};

use super::ModelError;

/// One group of tensors, checked together once.
#[derive(Debug, Default)]
struct Group {
    /// `(shard, directory index)` of each tensor.
    tensors: Vec<(usize, usize)>,
    done: OnceLock<Result<(), String>>,
}

/// The groups of a model file: one per decoder layer, and the rest.
#[derive(Debug, Default)]
pub struct LazyVerify {
    layers: Vec<Group>,
    rest: Group,
    /// Each shard's strong digests, parsed once (a header may hold 10⁵ of them).
    strong: Vec<Option<StrongDigests>>,
}

impl LazyVerify {
    /// Groups the tensors of `file` for a model of `n_layers` decoder layers.
    pub fn new(file: &CmfModel, n_layers: usize) -> LazyVerify {
        let mut v = LazyVerify {
            layers: (0..n_layers).map(|_| Group::default()).collect(),
            rest: Group::default(),
            // A malformed field leaves hash64 alone here; the load's link check failed it.
            strong: file
                .shards
                .iter()
                .map(|s| strong_digests_of(s).ok().flatten())
                .collect(),
        };
        for (s, shard) in file.shards.iter().enumerate() {
            for (i, e) in shard.directory.iter().enumerate() {
                let layer = e
                    .name
                    .strip_prefix("model.layers.")
                    .and_then(|r| r.split('.').next())
                    .and_then(|n| n.parse::<usize>().ok())
                    .filter(|&l| l < n_layers);
                match layer {
                    Some(l) => v.layers[l].tensors.push((s, i)),
                    None => v.rest.tensors.push((s, i)),
                }
            }
        }
        v
    }

    /// Checks decoder layer `i`'s tensors, the first time only.
    pub fn layer(&self, file: &CmfModel, i: usize) -> Result<(), ModelError> {
        match self.layers.get(i) {
            Some(g) => self.check(file, g),
            None => Ok(()),
        }
    }

    /// Checks every tensor outside the decoder layers, the first time only.
    pub fn rest(&self, file: &CmfModel) -> Result<(), ModelError> {
        self.check(file, &self.rest)
    }

    /// Tensors checked so far, of all.
    pub fn progress(&self) -> (usize, usize) {
        let groups = || self.layers.iter().chain(std::iter::once(&self.rest));
        let all = groups().map(|g| g.tensors.len()).sum();
        let done = groups()
            .filter(|g| g.done.get().is_some())
            .map(|g| g.tensors.len())
            .sum();
        (done, all)
    }

    fn check(&self, file: &CmfModel, g: &Group) -> Result<(), ModelError> {
        let r = g.done.get_or_init(|| {
            use rayon::prelude::*;
            g.tensors
                .par_iter()
                .map(|&(s, i)| {
                    let shard = &file.shards[s];
                    let strong = self.strong[s].as_ref();
                    match check_tensor(shard, i, strong, Some(crate::quant::payload_check)) {
                        LinkStatus::Ok | LinkStatus::Unchecked { .. } => Ok(()),
                        LinkStatus::Mismatch { expected, actual } => Err(format!(
                            "tensor {} fails its check on first use (hash {actual}, recorded {expected})",
                            crate::format::escape_str(&shard.directory.entries[i].name)
                        )),
                        LinkStatus::Invalid { reason } => Err(format!(
                            "tensor {} fails its check on first use ({reason})",
                            crate::format::escape_str(&shard.directory.entries[i].name)
                        )),
                    }
                })
                .collect::<Result<(), String>>()
        });
        r.clone().map_err(ModelError::Integrity)
    }
}
