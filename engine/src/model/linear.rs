//! A weight matrix in the mmap, in its stored dtype, with an optional bias, and the
//! skills' replacements of it (§9: tensor-source indirection).
//!
//! A product reads the source a [`SkillSel`] picks: the backbone's bytes, the active
//! skill's `skill.{id}.{name}` (another pointer into the same mmap, so switching skills
//! copies nothing), or a soft blend's materialised tensor (the only owned weights).

use std::sync::Arc;

use super::ModelError;
use crate::format::shards::CmfModel;
use crate::quant::matrix::{self, Matrix, Precision};

/// Which source of every replaceable tensor a forward reads.
#[derive(Clone, Copy, Debug, Default)]
pub enum SkillSel<'a> {
    /// The backbone.
    #[default]
    Base,
    /// Skill `i` of the registry (its replacements; the backbone elsewhere).
    Skill(u16),
    /// A soft mix (claim 14): the blend's materialised tensors where it has one.
    Blend(&'a Blend),
}

/// The materialised tensors of a soft mix `Σ wᵢ·Tᵢ`, by [`Linear::slot`].
#[derive(Debug, Default)]
pub struct Blend {
    pub weights: Vec<Option<OwnedWeight>>,
}

impl Blend {
    /// Bytes the blend holds (the only weights outside the mmap).
    pub fn bytes(&self) -> usize {
        self.weights
            .iter()
            .flatten()
            .map(|w| w.bytes.len() + w.bias.as_ref().map_or(0, |b| 4 * b.len()))
            .sum()
    }
}

/// A weight matrix held in memory (a blend's mix, f32).
#[derive(Debug)]
pub struct OwnedWeight {
    pub m: Matrix,
    pub bytes: Vec<u8>,
    pub bias: Option<Vec<f32>>,
}

/// A skill's replacement of one linear: `skill.{id}.{name}` in the same mmap.
#[derive(Clone, Debug)]
pub struct SkillWeight {
    /// The skill's index in the registry.
    pub skill: u16,
    pub m: Matrix,
    shard: usize,
    range: std::ops::Range<usize>,
    /// The skill's own bias when it replaces `{name}.bias` too.
    pub bias: Option<Vec<f32>>,
}

/// The matrix, bytes and bias one product reads.
#[derive(Clone, Copy)]
pub struct LinView<'a> {
    pub m: &'a Matrix,
    pub bytes: &'a [u8],
    pub bias: Option<&'a [f32]>,
    pub precision: Precision,
}

impl LinView<'_> {
    pub fn out_dim(&self) -> usize {
        self.m.rows
    }

    /// `x` [t, in] → `y` [t, out].
    pub fn forward(&self, x: &[f32], t: usize, y: &mut [f32]) {
        if t == 1 {
            matrix::matvec_with(self.m, self.bytes, x, y, self.precision);
        } else {
            matrix::matmul_with(self.m, self.bytes, x, t, y, self.precision);
        }
        add_bias(self.bias, None, y);
    }

    /// Adds the bias (if any) to `y` [t, out].
    pub fn add_bias_to(&self, y: &mut [f32]) {
        add_bias(self.bias, None, y)
    }

    /// Only output rows `rows` (ascending): `y` [t, rows.len()]; the other rows' bytes are
    /// not read (dead FFN neurons of a task mask).
    pub fn forward_rows(&self, rows: &[u32], x: &[f32], t: usize, y: &mut [f32]) {
        if t == 1 {
            matrix::matvec_rows_with(self.m, self.bytes, x, rows, y, self.precision);
        } else {
            matrix::matmul_rows_with(self.m, self.bytes, x, t, rows, y, self.precision);
        }
        add_bias(self.bias, Some(rows), y);
    }
}

/// `y = x·Wᵀ (+ b)` with `W` [out, in] read in place from the file.
#[derive(Clone, Debug)]
pub struct Linear {
    pub name: String,
    pub m: Matrix,
    file: Arc<CmfModel>,
    shard: usize,
    range: std::ops::Range<usize>,
    pub bias: Option<Vec<f32>>,
    /// How activations enter the product (exact f32, or int8 for speed).
    pub precision: Precision,
    /// The skills that replace this matrix, by registry index (usually none).
    pub alts: Vec<SkillWeight>,
    /// This linear's slot in a [`Blend`], when some skill replaces it.
    pub slot: Option<u32>,
    /// Read a row at a time ([`Linear::load_rows`]): its mapped pages are dropped after
    /// each row read ([`Linear::row_in`]).
    rows_only: bool,
}

impl Linear {
    /// The matrix `name`, checked to be `[out, in]`: one the model multiplies
    /// ([`Matrix::new`]).
    pub fn load(
        file: &Arc<CmfModel>,
        name: &str,
        out_dim: usize,
        in_dim: usize,
    ) -> Result<Linear, ModelError> {
        Linear::load_as(file, name, (out_dim, in_dim), true)
    }

    /// The matrix `name`, checked to be `[out, in]`, of which the model only reads rows (an
    /// untied embedding): never repacked ([`Matrix::new_cold`]; a `q1t` embedding repacked
    /// was 41 of Qwen2.5-Coder-0.5B's 226 MiB resident), its pages released and advised
    /// small ([`crate::format::file::CmfFile::read_sparsely`]), and dropped again after
    /// each row read ([`Linear::row_in`]: Linux 6.18 maps a row's whole folio).
    pub fn load_rows(
        file: &Arc<CmfModel>,
        name: &str,
        out_dim: usize,
        in_dim: usize,
    ) -> Result<Linear, ModelError> {
        let mut l = Linear::load_as(file, name, (out_dim, in_dim), false)?;
        file.shards[l.shard].read_sparsely(l.range.clone());
        l.rows_only = true;
        Ok(l)
    }

    /// [`Linear::load`], of a matrix the model may never multiply (`hot` false:
    /// [`Matrix::new_cold`]).
    fn load_as(
        file: &Arc<CmfModel>,
        name: &str,
        (out_dim, in_dim): (usize, usize),
        hot: bool,
    ) -> Result<Linear, ModelError> {
        let (shard, e) = file
            .get(name)
            .ok_or_else(|| ModelError::MissingTensor(name.into()))?;
        let bytes = file.shards[shard].tensor_bytes(e);
        let m = if hot {
            Matrix::new(e.dtype, &e.shape, bytes)
        } else {
            Matrix::new_cold(e.dtype, &e.shape, bytes)
        };
        let m = m.map_err(|err| ModelError::Tensor {
            name: name.into(),
            reason: err.to_string(),
        })?;
        if m.rows != out_dim || m.cols != in_dim || e.shape.len() != 2 {
            return Err(ModelError::Shape {
                name: name.into(),
                reason: format!("is {:?}, expected [{out_dim}, {in_dim}]", e.shape),
            });
        }
        let start = bytes.as_ptr() as usize - file.shards[shard].bytes().as_ptr() as usize;
        if m.payload_unread() {
            // Now, so that a load's peak does not hold the model twice, and again after the
            // layer and the model ([`Linear::release_unread`]).
            file.shards[shard].release_pages_around(start..start + bytes.len());
        }
        Ok(Linear {
            name: name.into(),
            m,
            file: file.clone(),
            shard,
            range: start..start + bytes.len(),
            bias: None,
            precision: Precision::default(),
            alts: Vec::new(),
            slot: None,
            rows_only: false,
        })
    }

    /// Lets the OS drop the mapped pages of this matrix's payload where the matrix holds it
    /// in another form ([`Matrix::payload_unread`]): the process need not hold both. (A
    /// skill's replacements are cold, [`Matrix::new_cold`], and read in place.) The 2 MiB
    /// pages around the payload go too
    /// ([`crate::format::file::CmfFile::release_pages_around`]): the file is mapped in
    /// 2 MiB pages, so a neighbour read after this matrix (a layer's norms) maps the
    /// shared page back whole. Called at each matrix's load, after each layer and once the
    /// whole model is loaded; a neighbour's bytes map back when next read.
    pub fn release_unread(&self) {
        if self.m.payload_unread() {
            self.file.shards[self.shard].release_pages_around(self.range.clone());
        }
    }

    /// Adds skill `skill`'s replacement `name` (`skill.{id}.{this name}`), which must have
    /// this matrix's shape (§9: replacements are full-shape).
    pub fn add_alt(
        &mut self,
        skill: u16,
        name: &str,
        bias: Option<Vec<f32>>,
    ) -> Result<(), ModelError> {
        // Cold: a skill's weights cost memory only while it is selected.
        let r = Linear::load_as(&self.file, name, (self.out_dim(), self.in_dim()), false)?;
        self.alts.push(SkillWeight {
            skill,
            m: r.m,
            shard: r.shard,
            range: r.range,
            bias,
        });
        Ok(())
    }

    /// The source `sel` reads.
    pub fn view<'a>(&'a self, sel: SkillSel<'a>) -> LinView<'a> {
        let base = LinView {
            m: &self.m,
            bytes: self.bytes(),
            bias: self.bias.as_deref(),
            precision: self.precision,
        };
        match sel {
            SkillSel::Base => base,
            SkillSel::Skill(k) => match self.alts.iter().find(|a| a.skill == k) {
                Some(a) => LinView {
                    m: &a.m,
                    bytes: &self.file.shards[a.shard].bytes()[a.range.clone()],
                    bias: a.bias.as_deref().or(self.bias.as_deref()),
                    precision: self.precision,
                },
                None => base,
            },
            SkillSel::Blend(b) => match self
                .slot
                .and_then(|s| b.weights.get(s as usize))
                .and_then(|w| w.as_ref())
            {
                Some(w) => LinView {
                    m: &w.m,
                    bytes: &w.bytes,
                    bias: w.bias.as_deref().or(self.bias.as_deref()),
                    precision: self.precision,
                },
                None => base,
            },
        }
    }

    /// The bytes of skill `k`'s replacement (or the backbone's), for blending.
    pub fn source_of(&self, k: Option<u16>) -> (&Matrix, &[u8], Option<&[f32]>) {
        match k.and_then(|k| self.alts.iter().find(|a| a.skill == k)) {
            Some(a) => (
                &a.m,
                &self.file.shards[a.shard].bytes()[a.range.clone()],
                a.bias.as_deref().or(self.bias.as_deref()),
            ),
            None => (&self.m, self.bytes(), self.bias.as_deref()),
        }
    }

    pub fn out_dim(&self) -> usize {
        self.m.rows
    }

    pub fn in_dim(&self) -> usize {
        self.m.cols
    }

    pub fn bytes(&self) -> &[u8] {
        &self.file.shards[self.shard].bytes()[self.range.clone()]
    }

    /// `x` [t, in] → `y` [t, out], from the backbone.
    pub fn forward(&self, x: &[f32], t: usize, y: &mut [f32]) {
        self.view(SkillSel::Base).forward(x, t, y)
    }

    /// Several linears of the same input `x` [t, in] at once (q/k/v, gate/up), each from
    /// the source `sel` picks, optionally only rows `rows` of each (a task mask's live
    /// neurons; `ys` then hold `[t, rows.len()]`): for one token a single parallel section
    /// with one activation quantization; for a batch, one after the other (each product
    /// is already large enough).
    pub fn forward_many<const N: usize>(
        sel: SkillSel,
        lins: [&Linear; N],
        rows: Option<&[u32]>,
        x: &[f32],
        t: usize,
        ys: [&mut [f32]; N],
    ) {
        LinView::forward_many(lins.map(|l| l.view(sel)), rows, x, t, ys)
    }

    /// Adds the bias (if any) to `y` [t, out], as [`Linear::forward`] does.
    pub fn add_bias_to(&self, y: &mut [f32]) {
        add_bias(self.bias.as_deref(), None, y)
    }

    /// Row `r` of `W` decoded (an embedding lookup).
    pub fn row(&self, r: usize, out: &mut [f32]) {
        self.row_in(SkillSel::Base, r, out)
    }

    /// Row `r` of the source `sel` picks (its pages then dropped if the matrix is read a
    /// row at a time, [`Linear::load_rows`]).
    pub fn row_in(&self, sel: SkillSel, r: usize, out: &mut [f32]) {
        let v = self.view(sel);
        v.m.row(v.bytes, r, out);
        // The backbone's pages, when the row came from them (a skill's replacement is
        // mapped elsewhere, and releasing the backbone's range would only cost a syscall).
        if self.rows_only && std::ptr::eq(v.m, &self.m) {
            // Linux 6.18 maps the whole page-cache folio (up to 2 MiB) a read lies in,
            // whatever the advice: over a run most of an untied embedding would end up
            // mapped (Qwen2.5-Coder-0.5B `q1t`: 18 of its 40 MiB after 136 tokens, and a
            // 64-token prefill peaked 37 MiB higher). One `madvise` and a fault per row.
            self.file.shards[self.shard].release_pages(self.range.clone());
        }
    }
}

impl LinView<'_> {
    /// [`Linear::forward_many`] over views.
    pub fn forward_many<const N: usize>(
        views: [LinView; N],
        rows: Option<&[u32]>,
        x: &[f32],
        t: usize,
        ys: [&mut [f32]; N],
    ) {
        if t == 1 && views.iter().all(|v| v.precision == views[0].precision) {
            let mut parts: [matrix::MatvecPart; N] = {
                let mut ys = ys.into_iter();
                std::array::from_fn(|i| matrix::MatvecPart {
                    m: views[i].m,
                    bytes: views[i].bytes,
                    rows,
                    y: ys.next().expect("one output per linear"),
                })
            };
            matrix::matvec_multi(&mut parts, x, views[0].precision);
            for (v, part) in views.iter().zip(parts.iter_mut()) {
                add_bias(v.bias, rows, part.y);
            }
        } else {
            for (v, y) in views.iter().zip(ys) {
                match rows {
                    Some(r) => v.forward_rows(r, x, t, y),
                    None => v.forward(x, t, y),
                }
            }
        }
    }
}

/// Adds `bias` (all of it, or its entries `rows`) to every row of `y`.
fn add_bias(bias: Option<&[f32]>, rows: Option<&[u32]>, y: &mut [f32]) {
    let Some(b) = bias else { return };
    match rows {
        None => {
            for row in y.chunks_exact_mut(b.len()) {
                for (v, bv) in row.iter_mut().zip(b) {
                    *v += bv;
                }
            }
        }
        Some(rows) if !rows.is_empty() => {
            for row in y.chunks_exact_mut(rows.len()) {
                for (v, &r) in row.iter_mut().zip(rows) {
                    *v += b[r as usize];
                }
            }
        }
        Some(_) => {}
    }
}
