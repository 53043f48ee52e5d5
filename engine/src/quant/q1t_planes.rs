//! `q1t` rows repacked at load into 2-bit codes: by default at the levels of the planes
//! kernels, AVX2 and AVX-512 VBMI + VNNI (`Matrix::new`; `CORTIQ_Q1T_REPACK=0` turns it off
//! everywhere), or where a caller does
//! (`Matrix::new_repacked`): the one place where this engine may keep a weight in another
//! form than the file's (the performance issue allows a repack "where it pays, without a
//! second copy of the model in memory"; DESIGN.md keeps weights in the mmap, so it is on
//! only where it was measured to pay, and the file's pages are released as it goes).
//!
//! # What it gains and costs at AVX2 (Zen 3 VM, 2 threads, paired with `scripts/ab-bench.py`)
//! - Decode against the digit-major kernel of the same build: SmolLM2-135M 1.24×,
//!   Qwen2.5-Coder-0.5B 1.45× (against the build before, whose overlay was a scalar loop:
//!   1.52× and 1.64×). The AVX2 planes step (`pl2_rows` in [`super::q1t_kernel`]) is a
//!   shift and a mask per plane and four `vpmaddubsw` per level per 4 tiles, against the
//!   digit-major step's 21 operations of digit lookups per 4 tiles before its five.
//! - Peak RSS: SmolLM2 58–63 → 63.5 MiB, Qwen2.5 212 → 236 MiB, once the loader released
//!   the 2 MiB pages around each repacked matrix and again after each layer (the layer's
//!   norms and biases, read after its matrices, had mapped their shared pages back: the
//!   peak had been 88 and 290 MiB). Then the codes under the overlay's entries were
//!   cleared, so that the copied entries need no f32 corrections (4 bytes an entry), and
//!   an untied embedding (of which a model reads only rows) stopped being repacked, and
//!   a cold matrix's overlay computing its corrections before its first product:
//!   SmolLM2 59.6–65 MiB, Qwen2.5 183–188 MiB (169–175 MiB anonymous, for a 188.8 MiB
//!   file), and SmolLM2's decode 1.21× faster in one paired set, its rows' second stream
//!   gone.
//!
//! # What it gains and costs at AVX-512 (Zen 4 VM, 2 threads, paired with `scripts/ab-bench.py`)
//! - Qwen2.5-Coder-0.5B `q1t` decode 1.15× and 1.185× in two sets of 6 rounds; prefill
//!   unchanged (0.998); load 64–78 → 228–498 ms; peak RSS 222 → 296 MiB (the file is
//!   189): the repacked rows 147 MiB against the tiles' 132.5, and the overlay's copy
//!   (its 14 M entries, 54 MiB, beside the 54 MiB of corrections that both forms hold).
//! - SmolLM2-135M: decode 1.034× and 0.997×, prefill 0.983×; peak RSS 63 → 88 MiB. Its
//!   576-column rows spend most of their time outside the steps (in cache, 1536×576: the
//!   overlay 11%, the reduction 8%, and row set-up), which the repack does not shorten.
//! - Next: the overlay's entries left in the file with the tiles' pages released under
//!   `MADV_NOHUGEPAGE` (so that reading an entry maps 4 KiB, not the 2 MiB around it),
//!   which would bring the cost to the rows' 11%.
//!
//! # At AVX-512 on an Intel Xeon VM (2 vCPUs, AVX-512 VNNI/VBMI, AMX), 2026-12-07
//! With the memory work of the AVX2 section above, paired (`scripts/ab-bench.py`, 4–5
//! rounds, 8-token prompt and 128 decoded) against the digit-major kernel of the same
//! build: SmolLM2-135M 1.17–1.19×, Qwen2.5-Coder-0.5B 1.22–1.25×; peak RSS 67.9 → 69.4 and
//! 185 → 194 MiB (`cortiq bench`); load 33 → 96 and 64 → 434 ms. So the repack became the
//! default at this level too. Then the planes kernel's overlays were gathered 16 entries
//! at a time, as the AVX2 kernel's are (a scalar loop of 8 slots had been a large share
//! of a 576-column row): together 1.36× and 1.46× the digit-major decode.
//!
//! ```text
//! codes:  u64 per tile (rows × cols/32): weight k of the tile at bits 8·(k mod 8) + 2·(k div 8),
//!         as u = code + 1 ∈ {0, 1, 2} (code −1 → 0, 0 → 1, +1 → 2)
//! scales: u16 per tile, the tile's f16 scale as stored
//! ```
//!
//! # Why
//! The file packs five ternary digits per byte (base 3, 1.6 bits a weight). Getting the
//! digits back costs more than multiplying them: the digit-major kernel of
//! [`super::q1t_kernel`] spends about 55 instructions per row and 256 weights, half of
//! them on the digits, and ran at 37–53 cycles per 256 weights on Zen 4 (in cache, one
//! core: 1536×576 in 50.5 µs, against 28.7 µs for the same shape in `q4_block`). With two
//! bits a weight, byte `m` of a tile word holds weights `m, m + 8, m + 16, m + 24`, so one
//! 64-byte load holds a step of 8 tiles and a shift and a mask per plane give the byte
//! vectors `vpdpbusd` multiplies, against activations laid out in the same four planes
//! ([`super::q1t_kernel`]'s `DmActs` in its planes layout). A C prototype of that step ran
//! the same shapes 2.1× faster (23.9 µs; 576×1536 16.6 against 35.1 µs).
//!
//! # Memory
//! 10 bytes per tile against the file's 9: the repacked rows take 1.11× the file's tiles.
//! The matrix also copies its overlay's `row_ptr` and entries (4 bytes an entry), so that
//! nothing reads the payload after load, and the model loader drops the mapping's pages
//! of it as it goes (`MADV_DONTNEED`, see `format::file::CmfFile::release_pages_around`):
//! the process does not hold both forms. Only matrices the model multiplies are repacked
//! (not a skill's replacements, nor an untied embedding). The rows live in huge pages
//! ([`super::arena`]).
//!
//! The repack is exact: [`Q1tPlaneRows`] gives the same codes, scales and decoded weights
//! as [`super::q1t_kernel::Q1tRows`] over the file's tiles (tested for every byte value,
//! the non-canonical 243..=255 included). A matrix then clears the code under each overlay
//! entry ([`Q1tPlanes::clear_code`], `Q1tOverlay::own`): the entry adds its whole value
//! where the file's form adds `value − base`, the same weight, so every path computes the
//! same product within the f32 bound (decoded rows bit for bit), and every product of the
//! matrix, at every level, reads the repacked rows.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use super::arena::{self, Slab};
use super::kernel::{h2f_scalar, IntRowsScalar, RowsScalar, STEP};
use super::q1::Q1T_TILE;
use super::Geom;

/// Code bytes of a tile (after its 2-byte scale).
const CODE_BYTES: usize = Q1T_TILE - 2;
/// Tiles per part of a parallel repack (about 300 KiB of the file's bytes).
const REPACK_TILES: usize = 1 << 15;

/// Bit position of weight `k` (0..32) in its tile word.
const fn position(k: usize) -> usize {
    8 * (k % 8) + 2 * (k / 8)
}

/// For code byte `i` of a tile and its value `b`: the tile word bits of its digits
/// (weights `5i .. 5i + 5` below 32), each as `u = code + 1`. A tile's word is the OR of
/// its seven bytes' entries. Digit `a` of `b` is the spec's `(b / 3^a) mod 3`, so a
/// non-canonical byte (243..=255) decodes as the file's readers decode it.
static PLACE: [[u64; 256]; CODE_BYTES] = {
    // Digit 0 → code 0 → u 1; 1 → +1 → 2; 2 → −1 → 0.
    const U: [u64; 3] = [1, 2, 0];
    let mut t = [[0u64; 256]; CODE_BYTES];
    let mut i = 0;
    while i < CODE_BYTES {
        let mut b = 0;
        while b < 256 {
            let (mut v, mut a, mut word) = (b, 0, 0u64);
            while a < 5 && 5 * i + a < STEP {
                word |= U[v % 3] << position(5 * i + a);
                v /= 3;
                a += 1;
            }
            t[i][b] = word;
            b += 1;
        }
        i += 1;
    }
    t
};

/// A `q1t` matrix's tiles as 2-bit codes and scales (see the module comment): one
/// [`arena`] slab, the tile words (`8·n` bytes) then the scales (`2·n`).
#[derive(Debug)]
pub(crate) struct Q1tPlanes {
    /// Tiles per row.
    groups: usize,
    /// Tiles of the matrix.
    n: usize,
    mem: Slab,
}

/// Repacks `tiles` (whole tiles of the file) into their `codes` and `scales`.
fn repack_part(tiles: &[u8], codes: &mut [u8], scales: &mut [u8]) {
    for ((tile, code), scale) in tiles
        .chunks_exact(Q1T_TILE)
        .zip(codes.chunks_exact_mut(8))
        .zip(scales.chunks_exact_mut(2))
    {
        scale.copy_from_slice(&tile[..2]);
        let mut word = 0;
        for (place, &b) in PLACE.iter().zip(&tile[2..]) {
            word |= place[b as usize];
        }
        code.copy_from_slice(&word.to_le_bytes());
    }
}

impl Q1tPlanes {
    /// Repacks the tiles of a validated `q1t` payload: O(tiles), about 7 table lookups a
    /// tile, in parts of [`REPACK_TILES`] tiles over the thread pool: a load's time is
    /// mostly this (Qwen2.5-Coder-0.5B: 130 MiB of tiles, and the fresh pages' zeroing).
    pub(crate) fn new(g: Geom, bytes: &[u8]) -> Q1tPlanes {
        use rayon::prelude::*;
        let groups = g.cols / STEP;
        let n = g.rows * groups;
        let mut mem = arena::alloc(10 * n);
        let (codes, scales) = mem.bytes_mut().split_at_mut(8 * n);
        let parts = bytes[..n * Q1T_TILE]
            .par_chunks(REPACK_TILES * Q1T_TILE)
            .zip(codes.par_chunks_mut(REPACK_TILES * 8))
            .zip(scales.par_chunks_mut(REPACK_TILES * 2));
        crate::exec::pool().install(|| {
            parts.for_each(|((tiles, codes), scales)| repack_part(tiles, codes, scales))
        });
        Q1tPlanes { groups, n, mem }
    }

    /// Sets weight `col` of row `r` to code 0 (`u = 1`): the matrix's overlay then adds
    /// its entry's whole value there ([`super::q1t_kernel::Q1tOverlay::own`]).
    pub(crate) fn clear_code(&mut self, r: usize, col: usize) {
        let at = 8 * (r * self.groups + col / STEP);
        let word = &mut self.mem.bytes_mut()[at..at + 8];
        let p = position(col % STEP);
        let w = u64::from_le_bytes((&*word).try_into().expect("8 bytes")) & !(3 << p) | 1 << p;
        word.copy_from_slice(&w.to_le_bytes());
    }

    /// All tile words (little-endian `u64`s, which x86-64 and AArch64 are).
    #[inline(always)]
    fn all_codes(&self) -> &[u64] {
        let b = &self.mem.bytes()[..8 * self.n];
        // SAFETY: a slab is at least 8-byte aligned and these are `8·n` of its bytes; any
        // bit pattern is a `u64`.
        unsafe { std::slice::from_raw_parts(b.as_ptr() as *const u64, self.n) }
    }

    /// All tile scales (f16 bits).
    #[inline(always)]
    fn all_scales(&self) -> &[u16] {
        let b = &self.mem.bytes()[8 * self.n..10 * self.n];
        // SAFETY: as `all_codes`: `8·n` bytes on from an 8-aligned start is 2-aligned.
        unsafe { std::slice::from_raw_parts(b.as_ptr() as *const u16, self.n) }
    }

    /// Bytes of the repacked rows: per tile its code word and its scale.
    pub(crate) fn bytes(&self) -> usize {
        self.mem.bytes().len()
    }

    /// Tiles per row.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    #[inline(always)]
    pub(crate) fn groups(&self) -> usize {
        self.groups
    }

    /// Row `r`'s tile words.
    #[inline(always)]
    pub(crate) fn codes(&self, r: usize) -> &[u64] {
        &self.all_codes()[r * self.groups..(r + 1) * self.groups]
    }

    /// Row `r`'s tile scales (f16 bits).
    #[inline(always)]
    pub(crate) fn scales(&self, r: usize) -> &[u16] {
        &self.all_scales()[r * self.groups..(r + 1) * self.groups]
    }

    /// Row `r`'s base weights (without the overlay), as [`RowsScalar::decode32`] gives them.
    pub(crate) fn decode_base(&self, r: usize, out: &mut [f32]) {
        let d = Q1tPlaneRows::<1>::new_at(self, [r]);
        let mut tile = [0f32; STEP];
        for (blk, o) in out.chunks_exact_mut(STEP).enumerate() {
            d.decode32(0, blk, &mut tile);
            o.copy_from_slice(&tile);
        }
    }
}

/// `u` (`code + 1`) of weight `k` of tile word `w`.
#[inline(always)]
fn unit(w: u64, k: usize) -> usize {
    ((w >> position(k)) & 3) as usize
}

/// `R` rows of [`Q1tPlanes`] as the shared f32 and integer loops of [`super::kernel`]
/// (and the prefill panels) read them: the same values as `Q1tRows` over the file.
pub(crate) struct Q1tPlaneRows<'a, const R: usize> {
    codes: [&'a [u64]; R],
    scales: [&'a [u16]; R],
    cols: usize,
}

impl<'a, const R: usize> Q1tPlaneRows<'a, R> {
    /// Rows `rs` (any `R` rows) of `p`.
    #[inline(always)]
    pub(crate) fn new_at(p: &'a Q1tPlanes, rs: [usize; R]) -> Self {
        Q1tPlaneRows {
            codes: std::array::from_fn(|i| p.codes(rs[i])),
            scales: std::array::from_fn(|i| p.scales(rs[i])),
            cols: p.groups * STEP,
        }
    }

    #[inline(always)]
    fn word(&self, i: usize, blk: usize) -> u64 {
        self.codes[i][blk]
    }

    #[inline(always)]
    fn scale(&self, i: usize, blk: usize) -> f32 {
        h2f_scalar(self.scales[i][blk])
    }
}

impl<const R: usize> RowsScalar for Q1tPlaneRows<'_, R> {
    fn cols(&self) -> usize {
        self.cols
    }

    fn decode32(&self, i: usize, blk: usize, out: &mut [f32; STEP]) {
        let (w, s) = (self.word(i, blk), self.scale(i, blk));
        // The file's `[0, s, −s]` by digit, here by `u`.
        let vals = [-s, 0.0, s];
        for (k, o) in out.iter_mut().enumerate() {
            *o = vals[unit(w, k)];
        }
    }
}

impl<const R: usize> IntRowsScalar for Q1tPlaneRows<'_, R> {
    const GROUP_SCALES: bool = true;

    fn cols(&self) -> usize {
        self.cols
    }

    fn codes32(&self, i: usize, blk: usize, out: &mut [i8; STEP]) {
        let w = self.word(i, blk);
        for (k, o) in out.iter_mut().enumerate() {
            *o = unit(w, k) as i8 - 1;
        }
    }

    fn group_scale(&self, i: usize, blk: usize) -> f32 {
        self.scale(i, blk)
    }

    fn int_post(&self, _i: usize) -> f32 {
        1.0
    }
}

#[cfg(target_arch = "x86_64")]
mod simd {
    use super::*;
    use crate::quant::kernel::{h2f, prefetch_ahead, IntRowsSimd, RowsAvx2, RowsAvx512};

    /// The 32 `u` of tile word `w` in weight order (byte `k` = weight `k`): the word in
    /// each 64-bit lane, shifted by `2·lane` and masked, puts weights `8p .. 8p + 8` in
    /// lane `p`.
    ///
    /// # Safety
    /// AVX2.
    #[inline(always)]
    unsafe fn units(w: u64) -> __m256i {
        let v = _mm256_srlv_epi64(_mm256_set1_epi64x(w as i64), _mm256_setr_epi64x(0, 2, 4, 6));
        _mm256_and_si256(v, _mm256_set1_epi8(3))
    }

    impl<const R: usize> Q1tPlaneRows<'_, R> {
        /// `[−s, 0, s]` in lanes 0..3 of tile `blk` of row `i`.
        #[inline(always)]
        unsafe fn table(&self, i: usize, blk: usize) -> __m256 {
            let s = h2f(*self.scales.get_unchecked(i).get_unchecked(blk));
            _mm256_setr_ps(-s, 0.0, s, 0.0, 0.0, 0.0, 0.0, 0.0)
        }

        #[inline(always)]
        unsafe fn word_unchecked(&self, i: usize, blk: usize) -> u64 {
            *self.codes.get_unchecked(i).get_unchecked(blk)
        }
    }

    impl<const R: usize> RowsAvx2 for Q1tPlaneRows<'_, R> {
        #[inline(always)]
        unsafe fn load_avx2(&self, i: usize, blk: usize) -> [__m256; 4] {
            let u = units(self.word_unchecked(i, blk));
            let tbl = self.table(i, blk);
            let (lo, hi) = (_mm256_castsi256_si128(u), _mm256_extracti128_si256::<1>(u));
            let idx = [lo, _mm_srli_si128::<8>(lo), hi, _mm_srli_si128::<8>(hi)];
            idx.map(|b| _mm256_permutevar8x32_ps(tbl, _mm256_cvtepu8_epi32(b)))
        }
    }

    impl<const R: usize> RowsAvx512 for Q1tPlaneRows<'_, R> {
        #[inline(always)]
        unsafe fn load_avx512(&self, i: usize, blk: usize) -> [__m512; 2] {
            let u = units(self.word_unchecked(i, blk));
            let tbl = _mm512_castps256_ps512(self.table(i, blk));
            let (lo, hi) = (_mm256_castsi256_si128(u), _mm256_extracti128_si256::<1>(u));
            [lo, hi].map(|b| _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(b), tbl))
        }
    }

    impl<const R: usize> IntRowsSimd for Q1tPlaneRows<'_, R> {
        #[inline(always)]
        unsafe fn load_u8(&self, i: usize, blk: usize) -> __m256i {
            _mm256_sub_epi8(units(self.word_unchecked(i, blk)), _mm256_set1_epi8(1))
        }

        #[inline(always)]
        unsafe fn group_scale_simd(&self, i: usize, blk: usize) -> f32 {
            h2f(*self.scales.get_unchecked(i).get_unchecked(blk))
        }

        #[inline(always)]
        unsafe fn scale_quad(&self, i: usize, blk: usize) -> __m128 {
            // Four f16 side by side: one load, one conversion.
            let p = self.scales.get_unchecked(i).as_ptr().add(blk);
            _mm_cvtph_ps(_mm_loadl_epi64(p as *const __m128i))
        }

        /// The prefill packers' prefetch: row `i` of the panel after this one (`2·R` rows
        /// on; a product's rows are contiguous, and with a row selection the hint is only
        /// wasted), a line per 8 words and the row's last, and its scales a line per 32.
        /// Without it the packer waited on each row's words: 42% of `pack_q4`'s samples in
        /// a 64-token Qwen2.5-Coder-0.5B prefill sat on those loads.
        #[inline(always)]
        unsafe fn prefetch_pack(&self, i: usize, blk: usize) {
            let (codes, scales) = (*self.codes.get_unchecked(i), *self.scales.get_unchecked(i));
            if blk.is_multiple_of(8) || blk + 1 == codes.len() {
                prefetch_ahead::<R>(codes, 8 * blk, 1);
            }
            if blk.is_multiple_of(32) || blk + 1 == scales.len() {
                prefetch_ahead::<R>(scales, 2 * blk, 1);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::q1t_kernel::Q1tRows;

    /// `rows × groups` tiles (a multiple of 256 of them) whose code bytes take every value
    /// 0..=255 (the non-canonical 243.. too) at every position, with varied scales, and
    /// the bytes the file's rows are followed by.
    fn all_byte_tiles(rows: usize, groups: usize) -> Vec<u8> {
        let mut bytes = Vec::new();
        for t in 0..rows * groups {
            let s = half::f16::from_f32(0.01 + (t % 97) as f32 * 0.37 - 3.0);
            bytes.extend_from_slice(&s.to_le_bytes());
            for i in 0..CODE_BYTES {
                bytes.push(((t + 37 * i) % 256) as u8);
            }
        }
        // `row_ptr` follows the tiles in a payload: the file view may read into it.
        bytes.extend_from_slice(&[0; 16]);
        bytes
    }

    /// [`all_byte_tiles`], their geometry and their repacked rows.
    fn planes_of(rows: usize, groups: usize) -> (Vec<u8>, Geom, Q1tPlanes) {
        let bytes = all_byte_tiles(rows, groups);
        let g = Geom {
            numel: rows * groups * STEP,
            rows,
            cols: groups * STEP,
        };
        let p = Q1tPlanes::new(g, &bytes);
        (bytes, g, p)
    }

    /// The repacked rows decode, as codes, scales and weights, what the file's tiles do:
    /// 256 tiles, so that every code byte takes every value.
    #[test]
    fn planes_equal_the_file_tiles() {
        let (rows, groups) = (8usize, 32usize);
        let (bytes, g, p) = planes_of(rows, groups);
        assert_eq!(p.groups(), groups);
        for r in 0..rows {
            let file = Q1tRows::<1>::new_at(g, &bytes, [r]);
            let planes = Q1tPlaneRows::<1>::new_at(&p, [r]);
            for blk in 0..groups {
                let (mut a, mut b) = ([0i8; STEP], [0i8; STEP]);
                IntRowsScalar::codes32(&file, 0, blk, &mut a);
                IntRowsScalar::codes32(&planes, 0, blk, &mut b);
                assert_eq!(a, b, "row {r} tile {blk}: codes");
                assert_eq!(
                    IntRowsScalar::group_scale(&file, 0, blk).to_bits(),
                    IntRowsScalar::group_scale(&planes, 0, blk).to_bits()
                );
                let (mut fa, mut fb) = ([0f32; STEP], [0f32; STEP]);
                file.decode32(0, blk, &mut fa);
                planes.decode32(0, blk, &mut fb);
                assert_eq!(
                    fa.map(f32::to_bits),
                    fb.map(f32::to_bits),
                    "row {r} tile {blk}"
                );
            }
            let mut row = vec![0f32; g.cols];
            p.decode_base(r, &mut row);
            for (blk, want) in row.chunks_exact(STEP).enumerate() {
                let mut fa = [0f32; STEP];
                file.decode32(0, blk, &mut fa);
                assert_eq!(want, &fa[..]);
            }
        }
    }

    /// The SIMD loads of the repacked rows equal their scalar decode.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn plane_loads_equal_the_scalar_decode() {
        use crate::quant::kernel::Kernel;
        let (rows, groups) = (8usize, 32usize);
        let (_, _, p) = planes_of(rows, groups);
        assert!(
            Kernel::Avx2.is_available(),
            "the tests need an x86-64 CPU with AVX2"
        );
        for r in 0..rows {
            let d = Q1tPlaneRows::<1>::new_at(&p, [r]);
            for blk in 0..groups {
                let mut want = [0f32; STEP];
                d.decode32(0, blk, &mut want);
                let mut codes = [0i8; STEP];
                IntRowsScalar::codes32(&d, 0, blk, &mut codes);
                // SAFETY: AVX2 checked above, AVX-512 just below; `blk < groups`.
                let (got, u, quad) = unsafe { loads_avx2(&d, blk) };
                assert_eq!(got.map(f32::to_bits), want.map(f32::to_bits));
                assert_eq!(u, codes);
                if blk + 3 < groups {
                    for (k, q) in quad.iter().enumerate() {
                        assert_eq!(q.to_bits(), d.group_scale(0, blk + k).to_bits());
                    }
                }
                if Kernel::Avx512.is_available() {
                    // SAFETY: as above.
                    let got = unsafe { load_avx512(&d, blk) };
                    assert_eq!(got.map(f32::to_bits), want.map(f32::to_bits));
                }
            }
        }

        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn loads_avx2(
            d: &Q1tPlaneRows<1>,
            blk: usize,
        ) -> ([f32; STEP], [i8; STEP], [f32; 4]) {
            use crate::quant::kernel::{IntRowsSimd, RowsAvx2};
            let quad = if blk + 3 < d.cols / STEP {
                std::mem::transmute::<__m128, [f32; 4]>(d.scale_quad(0, blk))
            } else {
                [0.0; 4]
            };
            (
                std::mem::transmute::<[__m256; 4], [f32; STEP]>(d.load_avx2(0, blk)),
                std::mem::transmute::<__m256i, [i8; STEP]>(d.load_u8(0, blk)),
                quad,
            )
        }

        #[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
        unsafe fn load_avx512(d: &Q1tPlaneRows<1>, blk: usize) -> [f32; STEP] {
            use crate::quant::kernel::RowsAvx512;
            std::mem::transmute::<[__m512; 2], [f32; STEP]>(d.load_avx512(0, blk))
        }
    }
}
