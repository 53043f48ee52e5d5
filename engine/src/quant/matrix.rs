//! Matrix products over weights in their stored dtype: the inference engine's only way to
//! touch a weight matrix. A [`Matrix`] is checked once (at model load) and then multiplies
//! straight from the mmapped bytes; nothing here makes a dequantized copy of a tensor.
//!
//! - [`matvec`]: `y = W·x` (decode, one token), rows split over the rayon pool;
//! - [`matmul`]: `Y = X·Wᵀ` for `t` activation rows (prefill), in register blocks of 4
//!   weight rows × 4 activations: each weight row is decoded once per 4 activations, each
//!   activation loaded once per 4 rows; at the default precision on AVX-512 VNNI, `q8` and
//!   `q4` products run as packed panels instead ([`super::panel`]: 32 rows in the vector
//!   lanes, no horizontal sums);
//! - [`Matrix::row`]: one row decoded (embedding lookup).
//!
//! `W` is `[rows = out, cols = in]` as everywhere in CMF.
//!
//! How: the fused kernels of the family modules (`f32`, `f16`, `bf16`, `q8_row`, `q8_2f`,
//! `q4_block`, `q4_tiled`, `q4tp`, `vbit`, `vbit_ro`; see [`super::kernel`]) decode 32
//! weights at a time in registers; `q1t` has kernels of its own ([`super::q1t_kernel`]).
//! The other layouts (`q1`, `q1s`, and `q4_block` / `q4_tiled` when `cols % 32 != 0`)
//! decode a row into a per-thread scratch buffer (grown once, never per call) and run the
//! `f32` kernel over it; `vbit` row starts and the `q1s` overlay rows are indexed once by
//! [`Matrix::new`], so every row costs O(row).
//!
//! Numerics: the exact path ([`Precision::Exact`]) computes `Σ w·x` in f32 with the
//! weights exactly as [`super::decode`] yields them (a per-row `q8` scale is applied after
//! the sum); only the summation order differs from a naive dot. [`Precision::Balanced`]
//! and [`Precision::Fast`] ([`matvec_with`], [`matmul_with`]) quantize the
//! activations per group of 32 to int8 — two levels, the codes and their residual, or
//! one — and use integer dot products for the `q8`, `q4`, `vbit` and `q1t` dtypes. For one [`Kernel`]
//! and precision, `matmul` gives bit for bit the values of `t` separate `matvec`s
//! (prefill and decode agree exactly), with one exception: at the two-level precision on
//! AVX-512 VNNI and AVX2, a `q4`, `vbit` or `q1t` product of at least
//! [`super::panel`]'s fewest tokens (4 for `q4`, more than a speculative verification's 2)
//! adds its exact per-group terms in another f32 order (within the same bound), the price
//! of the packed panels that make prefill several times faster there. `q8` panels stay
//! bit for bit.
//!
//! Threads: rows are split over the current rayon pool; each task writes its own part of
//! `y`, and nothing is allocated per call (the per-thread scratch rows and quantized
//! activations are grown once and reused).

use std::cell::RefCell;
use std::ops::Range;

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::{
    __m128i, _mm_add_epi64, _mm_set1_epi64x, _mm_set_epi64x, _mm_storeu_si128,
};

use rayon::prelude::*;
use smallvec::SmallVec;

use super::f16s::{DecodedRows, F32Rows, HalfRows};
use super::kernel::{
    h2f_scalar, le16, run, run_int, ActOrder, IntRows, QToken, QuantizedActs, Rows,
};
use super::panel;
use super::q1::{self, Q1sRowIndex};
use super::q1t_kernel::{self, Q1tActs, Q1tOverlay, Q1tProduct};
use super::q1t_planes::Q1tPlanes;
use super::q4::{self, Q4Rows, Q4tpRows, GROUP};
use super::q8::{Q8Layout, Q8Rows};
use super::vbit::VbitLayout;
use super::vbit_kernel::{VbitRows, VbitRowsVbmi};
use super::{decode_row, geometry, validate, vbit, Geom, QuantError};
use crate::format::dtype::DType;
use std::sync::Arc;

pub use super::kernel::Kernel;

/// Owned description of a weight matrix, checked against its bytes once. It holds no
/// bytes itself: the caller passes the same bytes to every product.
#[derive(Clone, Debug)]
pub struct Matrix {
    pub dtype: DType,
    pub shape: Vec<u64>,
    pub rows: usize,
    pub cols: usize,
    /// Byte length the matrix was validated with (guards against mixing up tensors).
    nbytes: usize,
    geom: Geom,
    kernel: Kernel,
    index: RowIndex,
}

/// Per-row data of the layouts whose rows cannot be located in O(1) from the bytes.
#[derive(Clone, Debug)]
enum RowIndex {
    None,
    /// `vbit` / `vbit_ro`: the layout's offsets, and the start of each packed row
    /// (relative to the packed area), + end.
    Vbit {
        layout: VbitLayout,
        starts: Vec<usize>,
    },
    /// `q1s`: overlay entries by row.
    Q1s(Q1sRowIndex),
    /// `q1t`: where the overlay lies, its shadowed entries; at the level of the
    /// digit-major kernel, the rows repacked ([`Q1tPlanes`], shared by clones: a tied
    /// head is the embedding's matrix cloned).
    Q1t(Q1tOverlay, Option<Arc<Q1tPlanes>>),
    /// `q8_2f`: the column field in f32, which every quantized product multiplies into
    /// its activations (converting it from f16 per token and element cost more than the
    /// quantization). `cols` floats beside `rows·cols` weight bytes.
    ColField(Vec<f32>),
    /// `q4tp`: each row's ladder start and factor ([`q4::q4tp_ladder_base`]).
    Q4tp(q4::Q4tpBases),
}

impl Matrix {
    /// Validates `bytes` as a payload of `dtype` / `shape` (every offset of variable-length
    /// layouts included), so that the products below cannot fail, and indexes the rows of
    /// `vbit` and the overlay of `q1s` (O(rows + overlay), once). Picks the fastest
    /// [`Kernel`] of this CPU.
    ///
    /// A `q1t` matrix is repacked here ([`Matrix::new_repacked`]) at the levels of the
    /// planes kernels (AVX2, AVX-512 VBMI + VNNI) unless `CORTIQ_Q1T_REPACK=0`; see
    /// [`super::q1t_planes`] for what it gains and costs.
    pub fn new(dtype: DType, shape: &[u64], bytes: &[u8]) -> Result<Matrix, QuantError> {
        Matrix::build(
            dtype,
            shape,
            bytes,
            Use::Hot {
                repack: repack_q1t(Kernel::detect()),
            },
        )
    }

    /// [`Matrix::new`] that repacks a `q1t` matrix where the digit-major kernel runs
    /// ([`Q1tPlanes`]: 1.11× its tiles in memory, its overlay's entries copied,
    /// [`Matrix::payload_unread`]).
    pub fn new_repacked(dtype: DType, shape: &[u64], bytes: &[u8]) -> Result<Matrix, QuantError> {
        Matrix::build(dtype, shape, bytes, Use::Hot { repack: true })
    }

    /// [`Matrix::new`] for a matrix that may never be multiplied (a skill's replacement,
    /// selected or not): never repacked, so that while it is unused it costs no memory
    /// (DESIGN.md: cold weights cost no RSS).
    pub fn new_cold(dtype: DType, shape: &[u64], bytes: &[u8]) -> Result<Matrix, QuantError> {
        Matrix::build(dtype, shape, bytes, Use::Cold)
    }

    fn build(dtype: DType, shape: &[u64], bytes: &[u8], using: Use) -> Result<Matrix, QuantError> {
        validate(dtype, shape, bytes)?;
        let g = geometry(dtype, shape)?;
        let kernel = Kernel::detect();
        let bad = |reason: String| QuantError::Inconsistent {
            dtype,
            shape: shape.to_vec(),
            nbytes: bytes.len(),
            reason,
        };
        let index = match dtype {
            DType::Vbit | DType::VbitRo => RowIndex::Vbit {
                layout: VbitLayout::new(dtype, g).expect("validated"),
                starts: vbit::row_starts(g, bytes).map_err(bad)?,
            },
            DType::Q1s => RowIndex::Q1s(Q1sRowIndex::new(g, bytes).map_err(bad)?),
            DType::Q1t => {
                let hot = matches!(using, Use::Hot { .. });
                let repack = matches!(using, Use::Hot { repack: true }) && planes_run_on(kernel);
                let mut ov = Q1tOverlay::new(g, bytes, hot && !repack).map_err(bad)?;
                let planes = repack.then(|| {
                    let mut p = Q1tPlanes::new(g, bytes);
                    ov.own(bytes, &mut p);
                    Arc::new(p)
                });
                RowIndex::Q1t(ov, planes)
            }
            DType::Q4tp => RowIndex::Q4tp(q4::Q4tpBases::new(g, bytes)),
            DType::Q8_2f => {
                let l = Q8Layout::new(g);
                let field = &bytes[l.col_field..l.col_field + 2 * g.cols];
                RowIndex::ColField(
                    field
                        .chunks_exact(2)
                        .map(|h| h2f_scalar(le16(h, 0)))
                        .collect(),
                )
            }
            _ => RowIndex::None,
        };
        Ok(Matrix {
            dtype,
            shape: shape.to_vec(),
            rows: g.rows,
            cols: g.cols,
            nbytes: bytes.len(),
            geom: g,
            kernel,
            index,
        })
    }

    /// Bytes a product over every row streams: the payload's, or for a `q1t` matrix
    /// repacked at load its repacked rows (1.11× the file's tiles) and the copy of its
    /// overlay, which its products read instead.
    pub fn streamed_bytes(&self) -> usize {
        match &self.index {
            RowIndex::Q1t(ov, Some(p)) => p.bytes() + ov.owned_bytes().unwrap_or(0),
            _ => self.nbytes,
        }
    }

    /// The row geometry the matrix was validated with.
    pub(super) fn geom(&self) -> Geom {
        self.geom
    }

    /// Whether nothing reads the payload after load, because the matrix holds it in
    /// another form: a `q1t` matrix repacked ([`Q1tPlanes`], its overlay copied), which
    /// every product and row decode reads at every kernel level. The loader then lets the
    /// OS drop the payload's mapped pages.
    pub fn payload_unread(&self) -> bool {
        matches!(&self.index, RowIndex::Q1t(_, Some(_)))
    }

    /// The instruction set the products use.
    pub fn kernel(&self) -> Kernel {
        self.kernel
    }

    /// Forces kernel `k` (tests, benchmarks); refuses one this CPU cannot run.
    pub fn set_kernel(&mut self, k: Kernel) -> Result<(), QuantError> {
        if !k.is_available() {
            return Err(QuantError::InvalidArgument {
                dtype: self.dtype,
                reason: format!("kernel {k:?} is not supported by this CPU"),
            });
        }
        self.kernel = k;
        Ok(())
    }

    /// Whether the products decode in registers (a fused kernel) rather than through a
    /// decoded scratch row.
    pub fn is_fused(&self) -> bool {
        match self.dtype {
            DType::F32
            | DType::F16
            | DType::Bf16
            | DType::Q8Row
            | DType::Q8_2f
            | DType::Q4tp
            | DType::Q1t
            | DType::Vbit
            | DType::VbitRo => true,
            DType::Q4Block | DType::Q4Tiled => self.cols.is_multiple_of(GROUP),
            _ => false,
        }
    }

    /// Decodes row `r` into `out` (`cols` values) in O(row).
    pub fn row(&self, bytes: &[u8], r: usize, out: &mut [f32]) {
        assert_eq!(bytes.len(), self.nbytes, "bytes of another tensor");
        assert!(r < self.rows, "row {r} out of range ({} rows)", self.rows);
        assert_eq!(out.len(), self.cols, "output must hold one row");
        let g = self.geom;
        match &self.index {
            RowIndex::Vbit { starts, .. } => {
                vbit::decode_row_from(self.dtype, g, bytes, r, starts[r], out)
            }
            RowIndex::Q1s(index) => q1::decode_q1s_row_indexed(g, bytes, index, r, out),
            // The repacked rows, so that the file's tiles stay unread.
            RowIndex::Q1t(ov, Some(planes)) => {
                planes.decode_base(r, out);
                ov.write_row(bytes, r, out);
                Ok(())
            }
            RowIndex::None | RowIndex::Q1t(..) | RowIndex::Q4tp(_) | RowIndex::ColField(_) => {
                decode_row(self.dtype, &self.shape, bytes, r, out).map_err(|e| e.to_string())
            }
        }
        .expect("a validated matrix decodes every row");
    }
}

/// How activations enter a product.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Precision {
    /// f32 activations and the weights exactly as [`super::decode`] yields them: equal to
    /// dequantize-then-f32-dot up to f32 rounding. The parity path.
    Exact,
    /// The default. Activations quantized per token in two int8 levels, the codes and
    /// their rounding residual (`x ≈ d·(q + q₂/256)`, `d = absmax/127` of the token: each
    /// element within about `absmax/65000` of its value, an int16 code), integer dot
    /// products on the stored weight bytes (AVX-512 VNNI, AVX2) summed exactly in
    /// integers: a `q8` row in one integer sum, a `q4`, `vbit` or `q1t` group at a time (`q1t`'s
    /// kernels dot both levels against the ternary codes, see [`super::q1t_kernel`]).
    /// Within DESIGN.md's contract for quantized activations on the real models (see
    /// [`super::kernel::QuantizedActs`]). For the dtypes of [`Precision::Fast`]; the
    /// others compute [`Precision::Exact`].
    #[default]
    Balanced,
    /// One int8 level per group of 32 (`d = absmax/127`, so each moves by at most `d/2`),
    /// integer dot products, one f32 multiply-add per group: the least integer work, and
    /// the accuracy that a group's outlier leaves. For `q8_row`, `q8_2f`, `q4_tiled`,
    /// `q4_block` (`cols % 32 == 0`), `q4tp`, `vbit`, `vbit_ro` and `q1t`; other dtypes compute
    /// [`Precision::Exact`].
    Fast,
}

impl Precision {
    /// Every precision, in the order the CLI lists them.
    pub const ALL: [Precision; 3] = [Precision::Exact, Precision::Balanced, Precision::Fast];

    /// The name the CLI and the transcripts use.
    pub fn name(self) -> &'static str {
        match self {
            Precision::Exact => "exact",
            Precision::Balanced => "balanced",
            Precision::Fast => "fast",
        }
    }

    /// The precision called `name` ([`Precision::name`]).
    pub fn parse(name: &str) -> Option<Precision> {
        Precision::ALL.into_iter().find(|p| p.name() == name)
    }

    /// Whether products quantize their activations (where the dtype has integer kernels).
    pub fn is_int(self) -> bool {
        self != Precision::Exact
    }

    /// Whether quantized activations carry the residual level.
    fn split(self) -> bool {
        self == Precision::Balanced
    }
}

/// Activations of a product, `[t, cols]`.
#[derive(Clone, Copy)]
enum Acts<'a> {
    F32(&'a [f32]),
    Int(&'a QuantizedActs),
}

impl<'a> Acts<'a> {
    fn f32_token(self, j: usize, cols: usize) -> &'a [f32] {
        match self {
            Acts::F32(x) => &x[j * cols..(j + 1) * cols],
            Acts::Int(_) => unreachable!("f32 kernel given quantized activations"),
        }
    }
    fn int_token(self, j: usize) -> QToken<'a> {
        match self {
            Acts::Int(q) => q.token(j),
            Acts::F32(_) => unreachable!("integer kernel given f32 activations"),
        }
    }
    fn is_int(self) -> bool {
        matches!(self, Acts::Int(_))
    }
}

/// Receives the kernel-ready form of a block of `R` weight rows.
trait WithRows<const R: usize> {
    fn with<D: Rows>(&mut self, k: Kernel, d: &D);
    fn with_int<D: IntRows>(&mut self, k: Kernel, d: &D);
}

/// The activation order of `m`'s integer kernel, if it has one.
fn int_order(m: &Matrix) -> Option<ActOrder> {
    match m.dtype {
        // `vbit` on VBMI: codes offset by 128 ([`VbitRowsVbmi`]).
        DType::Vbit | DType::VbitRo if m.kernel.has_vbmi() => Some(ActOrder::NaturalOffset),
        DType::Q8Row | DType::Q8_2f | DType::Q1t | DType::Vbit | DType::VbitRo => {
            Some(ActOrder::Natural)
        }
        DType::Q4Block | DType::Q4Tiled if m.is_fused() => Some(ActOrder::NibblePairs),
        DType::Q4tp => Some(ActOrder::NibblePairs),
        _ => None,
    }
}

/// Whether the integer kernel in `order` sums the int16 codes [`QuantizedActs::fill`] then
/// fills: the row-scaled kernels always (`q8`, natural order), and the `q4` row kernels
/// (nibble-pair order) when the product runs in them (`rows`), not in the panels
/// (`nibble_pairs_avx2`, and with AVX-512 VNNI `nibble_pairs_avx512`: one `vpdpwssd` per
/// 32 nibbles where the byte levels took two `vpdpbusd`, a shift and an add; decode
/// 1.07–1.09× on both models, 2026-12-06). (`vbit` on VBMI, the one offset order, implies
/// VNNI, whose grouped kernels dot the byte levels.)
fn int16_codes(order: ActOrder, rows: bool) -> bool {
    order == ActOrder::Natural || (rows && order == ActOrder::NibblePairs)
}

/// Quantizes `x` (`[t, cols]`) for `m`'s integer kernel in `order` into `qa`, with the int16
/// codes where that kernel sums them, and for `vbit` the per-group sums of its row kernels
/// and the codes' nibble-pair copy (its 4-bit rows' int16 kernel, [`VbitRows`]).
fn fill_for(
    qa: &mut QuantizedActs,
    m: &Matrix,
    x: &[f32],
    t: usize,
    order: ActOrder,
    p: Precision,
) {
    let rows = panel::applies_to(m, p.split(), t).is_none();
    // The AVX2 panels read them too (every layout without AVX-VNNI).
    let int16 = int16_codes(order, rows) || (!rows && panel::reads_int16(m));
    qa.fill(x, t, m.cols, col_field(m), order, p.split(), int16);
    if matches!(m.dtype, DType::Vbit | DType::VbitRo) {
        qa.fill_group_sums();
        // Only the row kernels read them.
        if int16 && rows {
            qa.fill_pairs16();
        }
    }
}

thread_local! {
    /// Quantized activations of the calling thread's `Fast` products, reused.
    static QACTS: RefCell<QuantizedActs> = RefCell::new(QuantizedActs::default());
}

/// Runs `f` on the activations `x` (`[t, cols]`) quantized for `m`. The buffers are the
/// calling thread's, reused; a product started while they are in use (a rayon worker
/// stealing another product's task) quantizes into a one-off buffer instead.
fn with_quantized<Out>(
    m: &Matrix,
    x: &[f32],
    t: usize,
    order: ActOrder,
    p: Precision,
    f: impl FnOnce(Acts) -> Out,
) -> Out {
    let fill = |qa: &mut QuantizedActs| fill_for(qa, m, x, t, order, p);
    QACTS.with(|cell| match cell.try_borrow_mut() {
        Ok(mut qa) => {
            fill(&mut qa);
            f(Acts::Int(&qa))
        }
        Err(_) => {
            let mut qa = QuantizedActs::default();
            fill(&mut qa);
            f(Acts::Int(&qa))
        }
    })
}

thread_local! {
    /// Decoded rows of the dtypes without a fused kernel; grows to the largest block seen
    /// by this thread and is then reused, so products do not allocate.
    static SCRATCH: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Sizes every engine thread's decode scratch and quantized-activation buffers for
/// products of up to `max_cols` columns over up to `max_tokens` activations. Which worker
/// runs which row block is up to rayon, so warming up on a few tokens does not reach
/// every thread; reserving on all of them keeps decoding free of allocations.
pub fn reserve_thread_buffers(max_cols: usize, max_tokens: usize) {
    crate::exec::pool().broadcast(|_| {
        SCRATCH.with(|s| {
            let Ok(mut s) = s.try_borrow_mut() else {
                return;
            };
            let n = BLOCK_ROWS * max_cols;
            if s.len() < n {
                s.resize(n, 0.0);
            }
        });
        // A thread inside a quantized product (this call made from within one, e.g. a
        // model built while another runs) holds its buffers: they grow when next filled.
        QACTS.with(|qa| {
            if let Ok(mut qa) = qa.try_borrow_mut() {
                qa.reserve(max_cols, max_tokens)
            }
        });
        q1t_kernel::reserve_thread(max_cols, max_tokens);
    });
}

/// Hands rows `rs` of `m` (any `R` rows) to `v`: to its integer kernel when `int` (the dtype
/// has one, see [`int_order`]), else in place for the fused dtypes, else decoded into this
/// thread's scratch.
fn block<const R: usize, V: WithRows<R>>(
    m: &Matrix,
    bytes: &[u8],
    rs: [usize; R],
    int: bool,
    v: &mut V,
) {
    let (g, k) = (m.geom, m.kernel);
    if int {
        // A `q8_2f` payload has the codes and row scales of a `q8_row` one where the
        // integer kernel reads them (its column field is in the activations).
        return match m.dtype {
            DType::Q8Row | DType::Q8_2f => v.with_int(k, &Q8Rows::<R, false>::new_at(g, bytes, rs)),
            DType::Q4Block => v.with_int(k, &Q4Rows::<R, false>::new_at(g, bytes, rs)),
            DType::Q4Tiled => v.with_int(k, &Q4Rows::<R, true>::new_at(g, bytes, rs)),
            DType::Q4tp => v.with_int(k, &q4tp_rows(m, bytes, rs)),
            DType::Vbit | DType::VbitRo if k.has_vbmi() => {
                v.with_int(k, &VbitRowsVbmi(vbit_rows(m, bytes, rs)))
            }
            DType::Vbit | DType::VbitRo => v.with_int(k, &vbit_rows(m, bytes, rs)),
            _ => unreachable!("no integer kernel for {}", m.dtype),
        };
    }
    match m.dtype {
        DType::F32 => v.with(k, &F32Rows::<R>::new_at(bytes, g.cols, rs)),
        DType::F16 => v.with(k, &HalfRows::<R, false>::new_at(bytes, g.cols, rs)),
        DType::Bf16 => v.with(k, &HalfRows::<R, true>::new_at(bytes, g.cols, rs)),
        DType::Q8Row => v.with(k, &Q8Rows::<R, false>::new_at(g, bytes, rs)),
        DType::Q8_2f => v.with(k, &Q8Rows::<R, true>::new_at(g, bytes, rs)),
        DType::Q4Block if m.is_fused() => v.with(k, &Q4Rows::<R, false>::new_at(g, bytes, rs)),
        DType::Q4Tiled if m.is_fused() => v.with(k, &Q4Rows::<R, true>::new_at(g, bytes, rs)),
        DType::Q4tp => v.with(k, &q4tp_rows(m, bytes, rs)),
        DType::Vbit | DType::VbitRo => v.with(k, &vbit_rows(m, bytes, rs)),
        _ => SCRATCH.with(|s| {
            let mut s = s.borrow_mut();
            let n = R * g.cols;
            if s.len() < n {
                s.resize(n, 0.0);
            }
            for (i, row) in s[..n].chunks_exact_mut(g.cols.max(1)).enumerate() {
                m.row(bytes, rs[i], row);
            }
            let d = DecodedRows::<R> {
                rows: std::array::from_fn(|i| &s[i * g.cols..(i + 1) * g.cols]),
                cols: g.cols,
            };
            v.with(k, &d)
        }),
    }
}

/// Rows `rs` of the `q4tp` matrix `m`, their ladders from `m`'s index.
#[inline]
pub(super) fn q4tp_rows<'a, const R: usize>(
    m: &Matrix,
    bytes: &'a [u8],
    rs: [usize; R],
) -> Q4tpRows<'a, R> {
    match &m.index {
        RowIndex::Q4tp(bases) => {
            let [lo, mult] = bases.pick(rs);
            Q4tpRows::with_bases(m.geom, bytes, rs, lo, mult)
        }
        _ => Q4tpRows::new_at(m.geom, bytes, rs),
    }
}

/// Rows `rs` of the `vbit` / `vbit_ro` matrix `m`, located by `m`'s row index.
#[inline]
pub(super) fn vbit_rows<'a, const R: usize>(
    m: &Matrix,
    bytes: &'a [u8],
    rs: [usize; R],
) -> VbitRows<'a, R> {
    match &m.index {
        RowIndex::Vbit { layout, starts } => VbitRows::new_at(*layout, m.geom, bytes, starts, rs),
        _ => unreachable!("a vbit matrix has its row index"),
    }
}

/// The column field of the `q8_2f` matrix `m` in f32 (converted at load).
fn col_field(m: &Matrix) -> Option<&[f32]> {
    match &m.index {
        RowIndex::ColField(col) => Some(col),
        _ => None,
    }
}

/// How a matrix will be used, as [`Matrix::build`] prepares it.
#[derive(Clone, Copy)]
enum Use {
    /// Multiplied by the model; a `q1t` matrix repacked when `repack` (and the level runs
    /// the planes kernel).
    Hot { repack: bool },
    /// Perhaps never multiplied (a skill's replacement, an untied embedding): nothing
    /// prepared that reads the payload or holds memory.
    Cold,
}

/// Whether [`Matrix::new`] repacks `q1t` matrices at kernel level `k`:
/// `CORTIQ_Q1T_REPACK=1` or `0` (read once) where set, else wherever the planes kernel runs
/// ([`planes_run_on`]). At AVX2 it decoded 1.5–1.6× faster than the digit-major kernel
/// (Zen 3 VM, SmolLM2-135M and Qwen2.5-Coder-0.5B, paired), for a peak RSS 2–11% higher;
/// at AVX-512 on the Intel Xeon VM 1.19× and 1.25×, and more once its overlays were
/// gathered (see `super::q1t_planes`).
fn repack_q1t(k: Kernel) -> bool {
    static ENV: std::sync::OnceLock<Option<bool>> = std::sync::OnceLock::new();
    let env = ENV.get_or_init(|| match std::env::var("CORTIQ_Q1T_REPACK").as_deref() {
        Ok("1") => Some(true),
        Ok("0") => Some(false),
        _ => None,
    });
    env.unwrap_or(planes_run_on(k))
}

/// The overlay of the `q1t` matrix `m` (computed at load).
pub(super) fn q1t_overlay(m: &Matrix) -> Option<&Q1tOverlay> {
    match &m.index {
        RowIndex::Q1t(ov, _) => Some(ov),
        _ => None,
    }
}

/// The repacked rows of the `q1t` matrix `m`, which all its products read, at every level
/// (a matrix forced to another level after load too): the codes under its overlay's
/// entries are cleared there, and its overlay holds the entries' values, not their
/// corrections to the file's base weights ([`Q1tOverlay::own`]).
pub(super) fn q1t_planes(m: &Matrix) -> Option<&Q1tPlanes> {
    match &m.index {
        RowIndex::Q1t(_, Some(p)) => Some(p),
        _ => None,
    }
}

/// Whether kernel level `k` runs the planes kernel over repacked `q1t` rows: those of the
/// digit-major kernels (AVX-512 VBMI + VNNI, AVX2); the only levels that repack.
pub(super) fn planes_run_on(k: Kernel) -> bool {
    (k == Kernel::Avx512 && q1t_kernel::dm_available()) || k.is_avx2()
}

/// Weight rows per block: four independent accumulators per activation hide the FMA
/// latency, and an activation vector, once loaded, serves four rows.
pub(super) const BLOCK_ROWS: usize = 4;
/// Weight rows per block of an integer matrix-vector product: the per-block set-up
/// (row slices, the token's views) is shared by twice the rows, and more rows' loads are
/// in flight.
const INT_MATVEC_ROWS: usize = 8;
/// Activations per block in `matmul`: a weight row is decoded once per 4 tokens.
pub(super) const BLOCK_TOKENS: usize = 4;
/// Most tokens of integer activations a row-kernel task runs over at a time (and
/// resolves up front, [`Mm::ints`]); longer products run their rows again, from L2.
const RESOLVED_TOKENS: usize = 32;

/// `y[r] = Σ_c W[r, c]·x[c]`; `x.len() == cols`, `y.len() == rows`.
pub fn matvec(m: &Matrix, bytes: &[u8], x: &[f32], y: &mut [f32]) {
    matvec_with(m, bytes, x, y, Precision::Exact)
}

/// [`matvec`] with the given [`Precision`].
pub fn matvec_with(m: &Matrix, bytes: &[u8], x: &[f32], y: &mut [f32], p: Precision) {
    matvec_sel(m, bytes, x, None, y, p)
}

/// Only rows `rows` (ascending, each `< m.rows`) of `W·x`, into `y` [rows.len()]: the
/// other rows' bytes are not read (a task mask's dead FFN neurons). Equal, bit for bit,
/// to the same entries of [`matvec_with`].
pub fn matvec_rows_with(
    m: &Matrix,
    bytes: &[u8],
    x: &[f32],
    rows: &[u32],
    y: &mut [f32],
    p: Precision,
) {
    matvec_sel(m, bytes, x, Some(rows), y, p)
}

fn check_rows(m: &Matrix, rows: Option<&[u32]>) -> usize {
    match rows {
        None => m.rows,
        Some(r) => {
            assert!(
                r.windows(2).all(|w| w[0] < w[1])
                    && r.last().is_none_or(|&l| (l as usize) < m.rows),
                "row selection must be ascending and inside the matrix"
            );
            r.len()
        }
    }
}

fn matvec_sel(
    m: &Matrix,
    bytes: &[u8],
    x: &[f32],
    rows: Option<&[u32]>,
    y: &mut [f32],
    p: Precision,
) {
    assert_eq!(x.len(), m.cols, "activations must be [cols]");
    assert_eq!(y.len(), check_rows(m, rows), "output must be [rows]");
    assert_eq!(bytes.len(), m.nbytes, "bytes of another tensor");
    if y.is_empty() {
        return;
    }
    match int_order(m) {
        Some(order) if p.is_int() => with_quantized(m, x, 1, order, p, |acts| {
            matvec_impl(m, bytes, acts, rows, y)
        }),
        _ => matvec_impl(m, bytes, Acts::F32(x), rows, y),
    }
}

/// One product of [`matvec_multi`]: a matrix, its bytes and its output (all rows, or only
/// `rows`, as [`matvec_rows_with`]).
pub struct MatvecPart<'a> {
    pub m: &'a Matrix,
    pub bytes: &'a [u8],
    pub rows: Option<&'a [u32]>,
    pub y: &'a mut [f32],
}

/// Several matrix-vector products of the same input (q/k/v, gate/up) as one parallel
/// section: the pool's threads stay busy from one matrix to the next instead of going
/// to sleep and being woken per product, and the input is quantized once for all. The
/// results are those of [`matvec_with`] on each part.
pub fn matvec_multi(parts: &mut [MatvecPart], x: &[f32], p: Precision) {
    let Some(first) = parts.first() else {
        return;
    };
    for part in parts.iter() {
        assert_eq!(x.len(), part.m.cols, "activations must be [cols]");
        assert_eq!(
            part.y.len(),
            check_rows(part.m, part.rows),
            "output must be [rows]"
        );
        assert_eq!(part.bytes.len(), part.m.nbytes, "bytes of another tensor");
    }
    let m0 = first.m;
    let order = int_order(m0);
    // One quantization serves all parts only when they read activations alike; `q8_2f`
    // folds its own column field into them.
    let shared = parts
        .iter()
        .all(|q| int_order(q.m) == order && q.m.dtype != DType::Q8_2f && q.m.cols == m0.cols);
    fn run_all(parts: &mut [MatvecPart], acts: Acts) {
        if !flat_ok(parts.iter().map(|p| p.m)) {
            return parts.par_iter_mut().for_each(|part| {
                if !part.y.is_empty() {
                    matvec_impl(part.m, part.bytes, acts, part.rows, part.y)
                }
            });
        }
        matvecs_flat(
            parts
                .iter_mut()
                .map(|p| (p.m, p.bytes, p.rows, acts, &mut *p.y)),
            false,
        )
    }
    match order {
        Some(order) if p.is_int() && shared => {
            with_quantized(m0, x, 1, order, p, |acts| run_all(parts, acts))
        }
        _ if p == Precision::Exact => run_all(parts, Acts::F32(x)),
        // Each part quantizes for itself (`q8_2f`: with its own column field) into a buffer
        // of its own, then all run in one parallel section, as [`matmul_each`]'s jobs: one
        // after the other, each product woke the pool again (SmolLM2-135M's `q8_2f` decode
        // ran 7–14% behind `q8_row`'s, the same bytes).
        _ => {
            let run = |part: &mut MatvecPart, acts: Acts| {
                if !part.y.is_empty() {
                    matvec_impl(part.m, part.bytes, acts, part.rows, part.y)
                }
            };
            // The parts in parallel, each product split again over the pool: a few parts
            // of unequal sizes (q/k/v) would leave a thread idle as tasks of their own.
            let run_all = |parts: &mut [MatvecPart], qas: &[QuantizedActs], of: &[usize]| {
                parts
                    .par_iter_mut()
                    .enumerate()
                    .for_each(|(i, part)| run(part, acts_for(part.m, x, Some(&qas[of[i]]))))
            };
            if !with_each_quantized(parts, p, |part| (part.m, x, 1), run_all) {
                // Called from inside a `matmul_each` or another of these: one at a time.
                for part in parts.iter_mut() {
                    matvec_sel(part.m, part.bytes, x, part.rows, part.y, p)
                }
            }
        }
    }
}

/// One product of [`matmul_each`]: a matrix, its bytes, its own activations `x`
/// `[t, cols]` and its output `y` `[t, rows]`.
pub struct MatmulJob<'a> {
    pub m: &'a Matrix,
    pub bytes: &'a [u8],
    pub x: &'a [f32],
    pub t: usize,
    pub y: &'a mut [f32],
}

thread_local! {
    /// Quantized activations of [`matmul_each`]'s jobs, one buffer per job, reused.
    static EACH_QACTS: RefCell<Vec<QuantizedActs>> = const { RefCell::new(Vec::new()) };
}

/// Products with activations of their own (the experts of a MoE layer, each over the
/// tokens routed to it) as one parallel section, so that many small products do not
/// each wake the pool. The results are those of [`matmul_with`] on each job.
pub fn matmul_each(jobs: &mut [MatmulJob], p: Precision) {
    for j in jobs.iter() {
        assert_eq!(j.x.len(), j.t * j.m.cols, "activations must be [t, cols]");
        assert_eq!(j.y.len(), j.t * j.m.rows, "output must be [t, rows]");
        assert_eq!(j.bytes.len(), j.m.nbytes, "bytes of another tensor");
    }
    fn one(j: &mut MatmulJob, acts: Acts) {
        if j.m.rows == 0 || j.t == 0 {
            return;
        }
        if j.t == 1 {
            matvec_impl(j.m, j.bytes, acts, None, j.y)
        } else {
            matmul_impl(j.m, j.bytes, acts, j.t, None, j.y)
        }
    }
    // A decode step's experts (one token each, or none: an empty output is no task) as
    // one loop of whole products.
    let flat = jobs.iter().all(|j| j.t <= 1) && flat_ok(jobs.iter().map(|j| j.m));
    let flat_all = |jobs: &mut [MatmulJob], qas: Option<(&[QuantizedActs], &[usize])>| {
        matvecs_flat(
            jobs.iter_mut().enumerate().map(|(i, j)| {
                let acts = acts_for(j.m, j.x, qas.map(|(q, of)| &q[of[i]]));
                (j.m, j.bytes, None, acts, &mut *j.y)
            }),
            true,
        )
    };
    if p == Precision::Exact || jobs.iter().all(|j| int_order(j.m).is_none()) {
        if flat {
            return flat_all(jobs, None);
        }
        return jobs.par_iter_mut().for_each(|j| one(j, Acts::F32(j.x)));
    }
    let done = if flat {
        with_each_quantized(
            jobs,
            p,
            |j| (j.m, j.x, j.t),
            |jobs, qas, of| flat_all(jobs, Some((qas, of))),
        )
    } else {
        each_quantized(jobs, p, |j| (j.m, j.x, j.t), one)
    };
    if !done {
        // Called from inside another `matmul_each` (a stolen task): one at a time.
        for j in jobs.iter_mut() {
            matmul_with(j.m, j.bytes, j.x, j.t, j.y, p);
        }
    }
}

/// Whether two products read the same quantized activations: the same input slice and
/// token count, quantized alike (dtype, level, width, and no `q8_2f` column field folded
/// in). A MoE expert's gate and up products are such a pair, and so are all the products
/// of a decode step's experts.
fn same_input(a: (&Matrix, &[f32], usize), b: (&Matrix, &[f32], usize)) -> bool {
    std::ptr::eq(a.1, b.1)
        && a.2 == b.2
        && a.0.dtype == b.0.dtype
        && a.0.kernel == b.0.kernel
        && a.0.cols == b.0.cols
        && a.0.is_fused() == b.0.is_fused()
        && col_field(a.0).is_none()
        && col_field(b.0).is_none()
}

/// The starts of the runs of consecutive items with the same input ([`same_input`]),
/// then `items.len()`.
fn input_runs<'a, J>(
    items: &[J],
    input: impl Fn(&J) -> (&'a Matrix, &'a [f32], usize),
) -> SmallVec<[usize; 256]> {
    let mut starts = SmallVec::new();
    for (i, j) in items.iter().enumerate() {
        if i == 0 || !same_input(input(&items[i - 1]), input(j)) {
            starts.push(i);
        }
    }
    starts.push(items.len());
    starts
}

/// Runs `run` on every item in one parallel section, each with its activations (`input`:
/// its matrix, `x` `[t, cols]`, `t`) quantized for its matrix into a buffer of this
/// thread's ([`EACH_QACTS`], reused), or as f32 where the matrix has no integer kernel.
/// Each run of items with the same input is one task, which quantizes that input once and
/// then runs its items in turn: a MoE prefill's experts quantized their tokens twice (gate
/// and up), all on the calling thread before the section, while the other threads waited.
/// A task's own products run in place ([`crate::exec::for_each_index`]): with a task per
/// expert there is parallel work enough, and splitting each expert's few-token product
/// again cost more in the pool than it gained. False, with nothing run, when the buffers
/// are in use (called from inside another such section on this thread).
fn each_quantized<'a, J: Send>(
    items: &mut [J],
    p: Precision,
    input: impl Fn(&J) -> (&'a Matrix, &'a [f32], usize) + Sync,
    run: impl Fn(&mut J, Acts) + Sync,
) -> bool {
    with_run_buffers(items, &input, |items, qas, starts| {
        let runs = qas.len();
        let (items, qas) = (
            crate::exec::Pieces::new(items),
            crate::exec::Pieces::new(qas),
        );
        crate::exec::for_each_index(runs, |r| {
            // SAFETY: `for_each_index` runs each `r` once; run `r`'s items and buffer are
            // its own.
            let (its, qa) = unsafe {
                (
                    items.get(starts[r], starts[r + 1] - starts[r]),
                    &mut qas.get(r, 1)[0],
                )
            };
            let (m, x, t) = input(&its[0]);
            let quantized = int_order(m).map(|order| {
                fill_for(qa, m, x, t, order, p);
                &*qa
            });
            for j in its {
                let (m, x, _) = input(j);
                run(j, acts_for(m, x, quantized))
            }
        });
    })
}

/// Hands `body` the items, this thread's buffers of [`EACH_QACTS`] (one per run of items
/// with the same input) and the runs' starts ([`input_runs`]); `false`, with nothing run,
/// when the buffers are in use (called from inside another such section on this thread).
fn with_run_buffers<'a, J>(
    items: &mut [J],
    input: impl Fn(&J) -> (&'a Matrix, &'a [f32], usize),
    body: impl FnOnce(&mut [J], &mut [QuantizedActs], &[usize]),
) -> bool {
    EACH_QACTS.with(|cell| {
        let Ok(mut qas) = cell.try_borrow_mut() else {
            return false;
        };
        let starts = input_runs(items, &input);
        let runs = starts.len() - 1;
        while qas.len() < runs {
            qas.push(QuantizedActs::default());
        }
        body(items, &mut qas[..runs], &starts);
        true
    })
}

/// The activations a product of `m` reads: its quantized ones (`qa`, filled by
/// [`with_each_quantized`]) where `m` has an integer kernel and they exist, else `x`.
fn acts_for<'a>(m: &Matrix, x: &'a [f32], qa: Option<&'a QuantizedActs>) -> Acts<'a> {
    match qa {
        Some(qa) if int_order(m).is_some() => Acts::Int(qa),
        _ => Acts::F32(x),
    }
}

/// Quantizes the items' activations as [`each_quantized`] does (once per run of items with
/// the same input), then hands the items, the buffers and each item's buffer index to
/// `body`. False, with nothing run, when the buffers are in use.
fn with_each_quantized<'a, J>(
    items: &mut [J],
    p: Precision,
    input: impl Fn(&J) -> (&'a Matrix, &'a [f32], usize),
    body: impl FnOnce(&mut [J], &[QuantizedActs], &[usize]),
) -> bool {
    with_run_buffers(items, &input, |items, qas, starts| {
        let mut of: SmallVec<[usize; 64]> = SmallVec::new();
        for (r, qa) in qas.iter_mut().enumerate() {
            let (m, x, t) = input(&items[starts[r]]);
            if let Some(order) = int_order(m) {
                fill_for(qa, m, x, t, order, p);
            }
            of.extend(std::iter::repeat_n(r, starts[r + 1] - starts[r]));
        }
        body(items, qas, &of);
    })
}

/// Most products [`matvecs_flat`] runs as one loop.
const MAX_FLAT: usize = 32;

/// Whether [`matvecs_flat`] takes these matrices: not too many, and no `q1t` (whose
/// `matvec` prepares its token once per product).
fn flat_ok<'a>(ms: impl ExactSizeIterator<Item = &'a Matrix>) -> bool {
    ms.len() <= MAX_FLAT
        && ms
            .into_iter()
            .all(|m| !matches!(m.index, RowIndex::Q1t(..)))
}

/// Matrix-vector products (each a matrix, its bytes, its selected rows if any, its
/// activations and its output, as [`matvec_rows_with`]) as one parallel loop over all
/// their row chunks ([`matvec_chunk`] each), with no wait between one product and the
/// next: q/k/v or gate/up of one input, a decode step's experts. The callers check
/// [`flat_ok`] first.
#[allow(clippy::type_complexity)]
fn matvecs_flat<'a>(
    parts: impl Iterator<
        Item = (
            &'a Matrix,
            &'a [u8],
            Option<&'a [u32]>,
            Acts<'a>,
            &'a mut [f32],
        ),
    >,
    whole: bool,
) {
    let mut ends = [0usize; MAX_FLAT];
    let mut chunks = [1usize; MAX_FLAT];
    let mut outs: [Option<(
        &Matrix,
        &[u8],
        Option<&[u32]>,
        Acts,
        crate::exec::Pieces<f32>,
    )>; MAX_FLAT] = std::array::from_fn(|_| None);
    let (mut tasks, mut k) = (0, 0);
    for (m, bytes, rows, acts, y) in parts {
        assert!(k < MAX_FLAT, "more products than a flat loop takes");
        chunks[k] = if whole {
            y.len()
        } else {
            matvec_chunk(y.len(), m.cols)
        }
        .max(1);
        tasks += y.len().div_ceil(chunks[k]);
        ends[k] = tasks;
        outs[k] = Some((m, bytes, rows, acts, crate::exec::Pieces::new(y)));
        k += 1;
    }
    let ends = &ends[..k];
    crate::exec::for_each_index(tasks, |task| {
        let i = ends.partition_point(|&e| e <= task);
        let c = task - if i == 0 { 0 } else { ends[i - 1] };
        let &(m, bytes, rows, acts, y) = outs[i].as_ref().expect("a product of every task");
        // SAFETY: task `c` of product `i` runs once, and its chunk of `y` is its own.
        let ys = unsafe { y.get(c * chunks[i], chunks[i]) };
        matvec_rows(m, bytes, acts, rows, c * chunks[i], ys)
    })
}

/// The weight rows of outputs `k .. k + R`: themselves, or the selected rows there (a
/// block of any `R` rows computes each row as a block of consecutive rows would).
#[inline]
fn rows_of<const R: usize>(rows: Option<&[u32]>, k: usize) -> [usize; R] {
    match rows {
        None => consecutive_rows(k),
        Some(sel) => std::array::from_fn(|i| sel[k + i] as usize),
    }
}

/// `[k, k + 1, .., k + R − 1]`, stored 16 bytes at a time on x86-64. The row types copy
/// their index arrays in 16-byte pieces, and from the 8-byte stores the compiler otherwise
/// emits each such copy stalled on store forwarding (3% of a SmolLM2 `q8_row` decode).
#[inline(always)]
pub(super) fn consecutive_rows<const R: usize>(k: usize) -> [usize; R] {
    let mut rs = [0; R];
    #[cfg(target_arch = "x86_64")]
    if R.is_multiple_of(2) {
        // SAFETY: SSE2 is part of x86-64; each `pair` is 16 writable bytes.
        unsafe {
            let two = _mm_set1_epi64x(2);
            let mut v = _mm_set_epi64x(k as i64 + 1, k as i64);
            for pair in rs.chunks_exact_mut(2) {
                _mm_storeu_si128(pair.as_mut_ptr() as *mut __m128i, v);
                v = _mm_add_epi64(v, two);
            }
        }
        return rs;
    }
    rs.iter_mut().enumerate().for_each(|(i, r)| *r = k + i);
    rs
}

fn matvec_impl(m: &Matrix, bytes: &[u8], acts: Acts, rows: Option<&[u32]>, y: &mut [f32]) {
    if let Some(cx) = q1t_product(m, bytes, acts, 1, rows) {
        return q1t_kernel::matvec(&cx, y);
    }
    let chunk = matvec_chunk(y.len(), m.cols);
    crate::exec::for_each_chunk_mut(y, chunk, |c, ys| {
        matvec_rows(m, bytes, acts, rows, c * chunk, ys)
    });
}

/// Outputs per task of a matvec with `n` outputs of `cols` columns (a multiple of 4): enough
/// work per chunk to amortise a task (~32k weights), and otherwise as few chunks as keep
/// every thread busy (two per thread, for balance): a chunk is one sequential stream
/// through memory, and each new stream costs prefetcher warm-up.
pub(super) fn matvec_chunk(n: usize, cols: usize) -> usize {
    let balanced = n.div_ceil(2 * rayon::current_num_threads().max(1));
    32768usize
        .div_ceil(cols.max(1))
        .max(balanced)
        .next_multiple_of(BLOCK_ROWS)
        .min(n.next_multiple_of(BLOCK_ROWS))
}

/// How a matmul with `n` outputs of `cols` columns (`row_bytes` bytes of weights each)
/// splits: outputs per task (a multiple of 4; their rows fit L2, and there are four
/// tasks per thread) and tokens per block (that fit L2 too).
pub(super) fn matmul_split(n: usize, cols: usize, row_bytes: usize) -> (usize, usize) {
    let by_cache = (256 << 10) / row_bytes.max(1);
    let by_balance = n.div_ceil(4 * rayon::current_num_threads());
    let chunk = by_cache.min(by_balance).max(1).next_multiple_of(BLOCK_ROWS);
    let tok_block = ((256 << 10) / (4 * cols.max(1)))
        .max(1)
        .next_multiple_of(BLOCK_TOKENS);
    (chunk, tok_block)
}

/// The product of `m` over `acts` (`t` tokens, outputs `sel`) for the `q1t` kernels, if
/// `m` is `q1t`.
fn q1t_product<'a>(
    m: &'a Matrix,
    bytes: &'a [u8],
    acts: Acts<'a>,
    t: usize,
    sel: Option<&'a [u32]>,
) -> Option<Q1tProduct<'a>> {
    let RowIndex::Q1t(ov, _) = &m.index else {
        return None;
    };
    let acts = match acts {
        Acts::F32(x) => Q1tActs::F32(&x[..t * m.cols]),
        Acts::Int(q) => Q1tActs::Int(q),
    };
    Some(Q1tProduct {
        g: m.geom,
        k: m.kernel,
        ov,
        bytes,
        acts,
        t,
        sel,
        planes: q1t_planes(m),
    })
}

/// Outputs `k0 .. k0 + ys.len()` of a matvec (rows `row_of(rows, k)`).
fn matvec_rows(
    m: &Matrix,
    bytes: &[u8],
    acts: Acts,
    rows: Option<&[u32]>,
    k0: usize,
    ys: &mut [f32],
) {
    /// The token, resolved once per task rather than per block of rows (slicing the
    /// quantized buffers per block was 2% of a SmolLM2 decode), as arrays of one that the
    /// kernels take in place (copying its slices into a new array per block stalled on
    /// store forwarding).
    enum Tok<'a> {
        F32([&'a [f32]; 1]),
        Int([QToken<'a>; 1]),
    }
    struct Mv<'t, 'a, 'o> {
        tok: &'t Tok<'a>,
        out: &'o mut [f32],
    }
    impl Mv<'_, '_, '_> {
        /// The block's `R` outputs as the kernels take them, written in place: through an
        /// array on the stack, the copy's wide loads waited on the kernel's narrow stores
        /// (no store forwarding; `perf` put about 3% of a `q4` decode there, and writing in
        /// place measured +0.5–1%).
        fn block_out<const R: usize>(&mut self) -> &mut [[f32; 1]; R] {
            let (o, _) = self.out.as_chunks_mut::<1>();
            o.try_into().expect("a block of R outputs")
        }
    }
    impl<const R: usize> WithRows<R> for Mv<'_, '_, '_> {
        fn with<D: Rows>(&mut self, k: Kernel, d: &D) {
            let Tok::F32(x) = self.tok else {
                unreachable!("f32 kernel given quantized activations")
            };
            run::<D, R, 1>(k, d, x, self.block_out());
        }
        fn with_int<D: IntRows>(&mut self, k: Kernel, d: &D) {
            let Tok::Int(x) = self.tok else {
                unreachable!("integer kernel given f32 activations")
            };
            run_int::<D, R, 1>(k, d, x, self.block_out());
        }
    }
    let int = acts.is_int();
    let tok = if int {
        &Tok::Int([acts.int_token(0)])
    } else {
        &Tok::F32([acts.f32_token(0, m.cols)])
    };
    let n = k0 + ys.len();
    let mut at = 0;
    while at < ys.len() {
        let k = k0 + at;
        let out = &mut ys[at..];
        if int && n - k >= INT_MATVEC_ROWS {
            let out = &mut out[..INT_MATVEC_ROWS];
            let rs = rows_of::<INT_MATVEC_ROWS>(rows, k);
            block::<INT_MATVEC_ROWS, _>(m, bytes, rs, int, &mut Mv { tok, out });
            at += INT_MATVEC_ROWS;
        } else if n - k >= BLOCK_ROWS {
            let out = &mut out[..BLOCK_ROWS];
            let rs = rows_of::<BLOCK_ROWS>(rows, k);
            block::<BLOCK_ROWS, _>(m, bytes, rs, int, &mut Mv { tok, out });
            at += BLOCK_ROWS;
        } else {
            let out = &mut out[..1];
            block::<1, _>(m, bytes, rows_of(rows, k), int, &mut Mv { tok, out });
            at += 1;
        }
    }
}

/// `y` of a `matmul`, shared by its tasks: each task owns a disjoint set of weight rows
/// and writes only their entries `y[i, r]`, so no entry is written twice or read.
pub(super) type Out<'a> = crate::exec::Pieces<'a, f32>;

/// `y[i, r] = Σ_c W[r, c]·x[i, c]` for `i < t`; `x` is `[t, cols]`, `y` is `[t, rows]`.
///
/// Tasks own blocks of weight rows; within a task, activations are taken in blocks that
/// fit in L2 (so the task's weight rows, re-read per block, and the block stay cached),
/// and the products run in register blocks of 4 rows × 4 activations.
pub fn matmul(m: &Matrix, bytes: &[u8], x: &[f32], t: usize, y: &mut [f32]) {
    matmul_with(m, bytes, x, t, y, Precision::Exact)
}

/// [`matmul`] with the given [`Precision`].
pub fn matmul_with(m: &Matrix, bytes: &[u8], x: &[f32], t: usize, y: &mut [f32], p: Precision) {
    matmul_sel(m, bytes, x, t, None, y, p)
}

/// Only rows `rows` of `X·Wᵀ`: `y` is `[t, rows.len()]` (see [`matvec_rows_with`]).
pub fn matmul_rows_with(
    m: &Matrix,
    bytes: &[u8],
    x: &[f32],
    t: usize,
    rows: &[u32],
    y: &mut [f32],
    p: Precision,
) {
    matmul_sel(m, bytes, x, t, Some(rows), y, p)
}

fn matmul_sel(
    m: &Matrix,
    bytes: &[u8],
    x: &[f32],
    t: usize,
    rows: Option<&[u32]>,
    y: &mut [f32],
    p: Precision,
) {
    assert_eq!(x.len(), t * m.cols, "activations must be [t, cols]");
    let n = check_rows(m, rows);
    assert_eq!(y.len(), t * n, "output must be [t, rows]");
    assert_eq!(bytes.len(), m.nbytes, "bytes of another tensor");
    if t == 1 {
        return matvec_sel(m, bytes, x, rows, y, p);
    }
    if t == 0 || n == 0 {
        return;
    }
    match int_order(m) {
        Some(order) if p.is_int() => with_quantized(m, x, t, order, p, |acts| {
            matmul_impl(m, bytes, acts, t, rows, y)
        }),
        _ => matmul_impl(m, bytes, Acts::F32(x), t, rows, y),
    }
}

fn matmul_impl(m: &Matrix, bytes: &[u8], acts: Acts, t: usize, sel: Option<&[u32]>, y: &mut [f32]) {
    if let Acts::Int(qa) = acts {
        if let Some(fam) = panel::applies_to(m, qa.is_split(), t) {
            return panel::matmul(m, fam, bytes, qa, t, sel, y);
        }
    }
    if let Some(cx) = q1t_product(m, bytes, acts, t, sel) {
        return q1t_kernel::matmul(&cx, y);
    }
    let n = y.len() / t;
    let (chunk, mut tok_block) = matmul_split(n, m.cols, m.nbytes / m.rows);
    if acts.is_int() {
        tok_block = tok_block.min(RESOLVED_TOKENS);
    }
    let out = Out::new(y);
    // A team loop, in place inside a task of another (a MoE expert of [`matmul_each`]).
    crate::exec::for_each_index(n.div_ceil(chunk), move |c| {
        let outs = c * chunk..((c + 1) * chunk).min(n);
        for j0 in (0..t).step_by(tok_block) {
            let toks = j0..(j0 + tok_block).min(t);
            let ints = if acts.is_int() { toks.len() } else { 0 };
            let mut resolved = [QToken::default(); RESOLVED_TOKENS];
            for (r, j) in resolved[..ints].iter_mut().zip(toks.clone()) {
                *r = acts.int_token(j);
            }
            let mut k = outs.start;
            while k < outs.end {
                let mut v = Mm {
                    acts,
                    ints: &resolved[..ints],
                    cols: m.cols,
                    toks: toks.clone(),
                    put: |i: usize, j: usize, v: f32| {
                        // SAFETY: `j < t` and output `k + i` belongs to this task only, so
                        // entry `j·n + k + i < y.len()` is written by this task alone.
                        unsafe { out.write(j * n + k + i, v) }
                    },
                };
                if outs.end - k >= BLOCK_ROWS {
                    let rs = rows_of::<BLOCK_ROWS>(sel, k);
                    block::<BLOCK_ROWS, _>(m, bytes, rs, acts.is_int(), &mut v);
                    k += BLOCK_ROWS;
                } else {
                    block::<1, _>(m, bytes, rows_of(sel, k), acts.is_int(), &mut v);
                    k += 1;
                }
            }
        }
    });
}

/// A block of weight rows against the activations `toks`, 4, 2, 1 at a time;
/// `put(i, j, v)` stores the value of block row `i` and token `j`.
struct Mm<'a, 'r, P: FnMut(usize, usize, f32)> {
    acts: Acts<'a>,
    /// The tokens `toks` of integer activations, resolved once per task: rebuilding
    /// each tile's tokens (8 checked slices each) per block of rows cost as much as the
    /// kernel in the few-token products of small MoE experts.
    ints: &'r [QToken<'a>],
    cols: usize,
    toks: Range<usize>,
    put: P,
}

impl<P: FnMut(usize, usize, f32)> Mm<'_, '_, P> {
    fn store<const R: usize, const T: usize>(&mut self, j: usize, o: &[[f32; T]; R]) {
        for (i, o) in o.iter().enumerate() {
            for (q, v) in o.iter().enumerate() {
                (self.put)(i, j + q, *v);
            }
        }
    }

    fn tile<D: Rows, const R: usize, const T: usize>(&mut self, k: Kernel, d: &D, j: usize) {
        let xs: [&[f32]; T] = std::array::from_fn(|q| self.acts.f32_token(j + q, self.cols));
        let mut o = [[0f32; T]; R];
        run::<D, R, T>(k, d, &xs, &mut o);
        self.store(j, &o);
    }

    fn tile_int<D: IntRows, const R: usize, const T: usize>(&mut self, k: Kernel, d: &D, j: usize) {
        let xs: &[QToken; T] = self.ints[j - self.toks.start..][..T]
            .try_into()
            .expect("a tile of T tokens");
        let mut o = [[0f32; T]; R];
        run_int::<D, R, T>(k, d, xs, &mut o);
        self.store(j, &o);
    }
}

impl<const R: usize, P: FnMut(usize, usize, f32)> WithRows<R> for Mm<'_, '_, P> {
    fn with<D: Rows>(&mut self, k: Kernel, d: &D) {
        let mut j = self.toks.start;
        while self.toks.end - j >= BLOCK_TOKENS {
            self.tile::<D, R, BLOCK_TOKENS>(k, d, j);
            j += BLOCK_TOKENS;
        }
        if self.toks.end - j >= 2 {
            self.tile::<D, R, 2>(k, d, j);
            j += 2;
        }
        if self.toks.end > j {
            self.tile::<D, R, 1>(k, d, j);
        }
    }

    fn with_int<D: IntRows>(&mut self, k: Kernel, d: &D) {
        let mut j = self.toks.start;
        while self.toks.end - j >= BLOCK_TOKENS {
            self.tile_int::<D, R, BLOCK_TOKENS>(k, d, j);
            j += BLOCK_TOKENS;
        }
        if self.toks.end - j >= 2 {
            self.tile_int::<D, R, 2>(k, d, j);
            j += 2;
        }
        if self.toks.end > j {
            self.tile_int::<D, R, 1>(k, d, j);
        }
    }
}
