//! Loading a model to run it: open the file (or shard set), check its hash chain, build
//! the blocks. One function for the CLI and the workbench, so both refuse a damaged file
//! the same way.

use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use serde_json::{Map, Value};

use crate::format::shards::CmfModel;
use crate::format::verify::{verify, LinkStatus, VerifyEvent, VerifyOptions};
use crate::format::FormatError;
use crate::model::{Model, ModelError, Precision};

/// How [`load_verified`] loads.
#[derive(Clone, Debug, Default)]
pub struct LoadOptions {
    /// Check the §8.1 hash chain of every shard before loading (the default; a flipped
    /// weight byte must not silently change answers).
    pub skip_verify: bool,
    /// Check only the small links at load and each tensor group on first use instead
    /// (`--verify-on-load`, see [`crate::model::lazy_verify`]).
    pub verify_on_first_use: bool,
    /// Arch fields replaced or added before the blocks are built (`--arch k=v`).
    pub overrides: Map<String, Value>,
    pub precision: Precision,
}

/// Why a model could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The file (or a shard) does not open: §1.2 validation or I/O.
    #[error(transparent)]
    Format(#[from] FormatError),
    /// A link of the hash chain fails: `link` names it, `why` says how.
    #[error("the {link} fails its check ({why})")]
    Integrity { link: String, why: String },
    /// The check was cancelled before it finished.
    #[error("the check was cancelled")]
    Cancelled,
    /// The file opens and verifies but the engine cannot run it.
    #[error(transparent)]
    Model(#[from] ModelError),
}

/// Checks every shard's hash chain (signatures are `verify`'s business, not loading's).
pub fn verify_model(
    file: &CmfModel,
    cancel: Option<&AtomicBool>,
    progress: &(dyn Fn(VerifyEvent) + Sync),
) -> Result<(), LoadError> {
    verify_links(file, cancel, progress, false)
}

/// [`verify_model`], or with `skip_tensors` only the envelope, header, directory and
/// sections of every shard.
fn verify_links(
    file: &CmfModel,
    cancel: Option<&AtomicBool>,
    progress: &(dyn Fn(VerifyEvent) + Sync),
    skip_tensors: bool,
) -> Result<(), LoadError> {
    for shard in &file.shards {
        let report = verify(
            shard,
            &VerifyOptions {
                payload_check: Some(crate::quant::payload_check),
                signature: false,
                trusted_keys: Vec::new(),
                cancel,
                strict: false,
                skip_tensors,
            },
            progress,
        );
        if report.cancelled {
            return Err(LoadError::Cancelled);
        }
        if let Some(f) = report.first_failure {
            let why = match &f.status {
                LinkStatus::Mismatch { expected, actual } => {
                    format!("hash {actual}, recorded {expected}")
                }
                LinkStatus::Invalid { reason } => reason.clone(),
                other => format!("{other:?}"),
            };
            return Err(LoadError::Integrity {
                link: f.link.describe(),
                why,
            });
        }
    }
    Ok(())
}

/// Opens `path` (any shard of a set), checks it unless told not to, and builds the model.
pub fn load_verified(path: &Path, opts: &LoadOptions) -> Result<Model, LoadError> {
    let file = CmfModel::open(path)?;
    if opts.skip_verify {
        return load_unverified(Arc::new(file), opts);
    }
    verify_links(&file, None, &|_| {}, opts.verify_on_first_use)?;
    let mut model = load_unverified(Arc::new(file), opts)?;
    if opts.verify_on_first_use {
        model.verify_on_first_use();
    }
    Ok(model)
}

/// Builds the model of an open file without checking it (the caller did, or was told not
/// to).
pub fn load_unverified(file: Arc<CmfModel>, opts: &LoadOptions) -> Result<Model, LoadError> {
    let mut model = Model::load_with(file, &opts.overrides)?;
    model.set_precision(opts.precision);
    Ok(model)
}
