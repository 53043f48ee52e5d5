//! Loading a block from a name scope (as candle's `VarBuilder::pp`): a block asks for
//! `q_proj` under `model.layers.3.self_attn` and gets a checked [`Linear`], norm or vector,
//! so that [`super::Model::load`] composes blocks without spelling every tensor name.

use std::sync::Arc;

use super::linear::Linear;
use super::norm::RmsNorm;
use super::ModelError;
use crate::format::shards::CmfModel;

#[derive(Clone)]
pub struct Scope<'a> {
    pub file: &'a Arc<CmfModel>,
    prefix: String,
    /// RMSNorm style for [`Scope::norm`] (the arch's `norm_style`).
    pub eps: f32,
    pub zero_centred: bool,
}

impl<'a> Scope<'a> {
    pub fn root(file: &'a Arc<CmfModel>, eps: f32, zero_centred: bool) -> Scope<'a> {
        Scope {
            file,
            prefix: String::new(),
            eps,
            zero_centred,
        }
    }

    /// The scope `prefix.sub`.
    pub fn pp(&self, sub: impl AsRef<str>) -> Scope<'a> {
        let sub = sub.as_ref();
        Scope {
            prefix: if self.prefix.is_empty() {
                sub.to_string()
            } else {
                format!("{}.{sub}", self.prefix)
            },
            ..self.clone()
        }
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The full tensor name of `name` in this scope.
    pub fn name(&self, name: &str) -> String {
        if self.prefix.is_empty() {
            name.to_string()
        } else {
            format!("{}.{name}", self.prefix)
        }
    }

    pub fn has(&self, name: &str) -> bool {
        self.file.get(&self.name(name)).is_some()
    }

    /// The stored shape of `name`, if present.
    pub fn shape(&self, name: &str) -> Option<Vec<u64>> {
        self.file
            .get(&self.name(name))
            .map(|(_, e)| e.shape.clone())
    }

    /// Rows (the first dimension) of `name`, required.
    pub fn rows(&self, name: &str) -> Result<usize, ModelError> {
        let full = self.name(name);
        let shape = self
            .shape(name)
            .ok_or_else(|| ModelError::MissingTensor(full.clone()))?;
        match shape.first() {
            Some(&r) if r > 0 && r <= 1 << 24 => Ok(r as usize),
            _ => Err(ModelError::Shape {
                name: full,
                reason: format!("is {shape:?}: no usable first dimension"),
            }),
        }
    }

    /// The matrix `{name}.weight` `[out, in]`, with `{name}.bias` when `bias` allows and
    /// it is present.
    pub fn linear(
        &self,
        name: &str,
        out: usize,
        inp: usize,
        bias: bool,
    ) -> Result<Linear, ModelError> {
        let mut l = Linear::load(self.file, &self.name(&format!("{name}.weight")), out, inp)?;
        let bias_name = format!("{name}.bias");
        if bias && self.has(&bias_name) {
            l.bias = Some(self.vector(&bias_name, out)?);
        }
        Ok(l)
    }

    /// A small tensor of exactly `len` values, decoded to f32 (norms, biases, decays).
    pub fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>, ModelError> {
        let full = self.name(name);
        let (shard, e) = self
            .file
            .get(&full)
            .ok_or_else(|| ModelError::MissingTensor(full.clone()))?;
        let v = crate::quant::decode(e.dtype, &e.shape, self.file.shards[shard].tensor_bytes(e))
            .map_err(|err| ModelError::Tensor {
                name: full.clone(),
                reason: err.to_string(),
            })?;
        if v.len() != len {
            return Err(ModelError::Shape {
                name: full,
                reason: format!("has {} values, expected {len}", v.len()),
            });
        }
        if let Some(bad) = v.iter().position(|x| !x.is_finite()) {
            return Err(ModelError::Tensor {
                name: full,
                reason: format!("value {bad} is not finite"),
            });
        }
        Ok(v)
    }

    /// The RMSNorm `{name}.weight` over `len` values, in the arch's style.
    pub fn norm(&self, name: &str, len: usize) -> Result<RmsNorm, ModelError> {
        Ok(RmsNorm::new(
            self.vector(&format!("{name}.weight"), len)?,
            self.eps,
            self.zero_centred,
        ))
    }

    /// [`Scope::norm`] if `{name}.weight` is present.
    pub fn norm_opt(&self, name: &str, len: usize) -> Result<Option<RmsNorm>, ModelError> {
        if self.has(&format!("{name}.weight")) {
            self.norm(name, len).map(Some)
        } else {
            Ok(None)
        }
    }
}
