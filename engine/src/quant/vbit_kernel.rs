//! `vbit` / `vbit_ro` rows for the shared kernels of [`super::kernel`]: the integer kernels
//! ([`Precision::Balanced`](super::matrix::Precision::Balanced) and `Fast`) and the f32 one
//! (`Exact`), decoding each group of 32 codes in registers from the packed bits.
//!
//! ```text
//! row r: b_r ∈ {3,4,5,6,8} bits per code, MSB-first, codes u; w = (u − L)·scale[r, g]
//! group g of a row: 32·b bits = 4·b bytes at byte 4·b·g of the row (rows are whole groups)
//! ```
//!
//! # How
//!
//! A group is two halves of 16 codes in `2·b` bytes each, and each half is two runs of 8
//! codes in exactly `b` bytes: the bit position of code `k` inside its run, and so the two
//! bytes that hold it, depend only on `b` and `k % 8`. One 16-byte load of a half,
//! broadcast to both 128-bit lanes, then per width one table ([`WidthTable`]):
//! - `vpshufb` puts byte `j` (high) and `j + 1` (low) of code `k` into its 16-bit lane, a
//!   big-endian window `w` holding the code at bits `16 − s − b .. 16 − s`;
//! - `vpmulhuw` by `2^(s + b)` is `w >> (16 − s − b)` (`s + b ≤ 15`), and `vpand` keeps `b`
//!   bits;
//! - the two halves pack to bytes (`vpackuswb`, values ≤ 255) and `vpermq` restores the
//!   element order.
//!
//! That is about 12 instructions per group whatever the width, with no branch on it: a
//! row's table is picked once per block.
//!
//! With AVX-512 VBMI (and VNNI), the integer kernel's pairs of groups take three
//! instructions per 64 codes instead ([`VbitRowsVbmi`], [`PairTable`]): a `vpermb` moves
//! each run of 8 codes into its own 64-bit lane, first byte highest, `vpmultishiftqb`
//! takes every code's bits from its fixed offset there, and a mask keeps them; a masked
//! load reads the pair's bytes and nothing past them. Prefill of
//! [`super::panel::Q4_MIN_TOKENS`] tokens or more runs in the packed panels of
//! [`super::panel`] instead.
//!
//! Without VNNI (AVX2), the two-level activations' products of fewer than
//! [`super::panel::VBIT_AVX2_MIN_TOKENS`] tokens run a
//! row at a time in [`VbitRows::row_dot_i16_b`], against the tokens' int16 codes
//! `k = 256·q + q₂`, 8 groups per step:
//! - the codes come as `u` (no zero point): the window shifted left by `s` with a
//!   `vpmullw` by `2^s` and right by `16 − b` (`b` a constant: a row's width picks its
//!   instantiation once per row); 4-bit rows instead widen their bytes and split the
//!   nibbles (a shuffle, a shift and a mask per group), against the tokens' codes in
//!   nibble-pair order ([`QuantizedActs::fill_pairs16`](super::kernel::QuantizedActs));
//! - two `vpmaddwd` per group, then the 8 groups' lanes summed by `vphaddd` into one
//!   vector of exact group integers, less `L·Σ k` (the tokens' per-group sums), converted
//!   once and multiplied by the 8 scales of one `vcvtph2ps`;
//! - a row's last partial step runs only its groups, with the scales past them masked.
//!
//! With AVX-512 VNNI the same products run a row at a time too
//! ([`VbitRows::row_dot_vnni_with`]): a pair of groups per masked load (VBMI) or by the AVX2
//! extraction (VNNI alone), a `vpdpbusd` per activation level on the unsigned codes, and the
//! same 8-group sums, conversion and scales. (Without a software prefetch of the row ahead
//! the masked loads waited on memory: a SmolLM2-135M decode ran at a third of the speed.)
//!
//! Each token sees the same operations whatever the number of tokens, so `matmul` equals
//! its `matvec`s bit for bit.
//!
//! The codes handed to the kernels are `L − u` with the scale negated: `(L − u)·(−s)` is
//! `(u − L)·s` exactly, and `L − u` lies in `−128..=127` for every width, where `u − L`
//! reaches +128 at 8 bits (`u = 255`, which the encoder never writes but a file may
//! hold), one more than an i8 holds. The integer kernels take signed codes, `|−128|`
//! included.
//!
//! A half's 16-byte load may read past the row: harmless inside the payload, so only the
//! groups near the payload's end ([`VbitRows::loads_in_payload`]) copy their bytes to the
//! stack first.
//!
//! Numerics are the shared kernels': `Exact` multiplies each weight exactly as
//! [`super::decode`] yields it, the integer paths sum exact integer group dots times
//! `s·d` (see [`super::kernel`]).

use super::kernel::{h2f_scalar, le16, IntRowsScalar, RowsScalar, STEP};
use super::vbit::{zero_point, MsbCodes, VbitLayout};
use super::Geom;

/// The bit widths a row may have, in [`WIDTHS`] order.
const BITS: [u8; 5] = [3, 4, 5, 6, 8];

/// Per bit width, what the SIMD extraction of 16 codes of a half group needs (see the
/// module comment): 32-byte aligned for loads.
#[repr(C, align(32))]
pub(crate) struct WidthTable {
    /// Per 16-bit lane (`k` in the low 128 bits, `k − 8`… in the high), the byte indices
    /// `[j + 1 or 0x80 (zero), j]` of the big-endian window of code `k`.
    shuffle: [u8; 32],
    /// `2^(s + b)`, `s` the code's bit offset in byte `j`.
    mult: [u16; 16],
    /// `2^b − 1`.
    mask: [u16; 16],
    /// The zero point `L` in every byte.
    zero: [i8; 32],
    /// `2^s`: the multiply that shifts code `k`'s window left to its top bit (the int16
    /// row kernel's extraction, [`VbitRows::row_dot_i16_b`]).
    left: [u16; 16],
}

const fn width_table(b: u8) -> WidthTable {
    let mut t = WidthTable {
        shuffle: [0; 32],
        mult: [0; 16],
        mask: [0; 16],
        zero: [0; 32],
        left: [0; 16],
    };
    let mut k = 0;
    while k < 16 {
        let o = k * b as usize;
        let (j, s) = (o / 8, o % 8);
        t.shuffle[2 * k] = if s + b as usize > 8 {
            (j + 1) as u8
        } else {
            0x80
        };
        t.shuffle[2 * k + 1] = j as u8;
        t.mult[k] = 1 << (s + b as usize);
        t.mask[k] = (1 << b) - 1;
        t.left[k] = 1 << s;
        k += 1;
    }
    let mut i = 0;
    while i < 32 {
        t.zero[i] = zero_point(b) as i8;
        i += 1;
    }
    t
}

/// The tables of [`BITS`], in that order.
static WIDTHS: [WidthTable; 5] = [
    width_table(3),
    width_table(4),
    width_table(5),
    width_table(6),
    width_table(8),
];

/// Per bit width, what the AVX-512 VBMI extraction of a pair of groups (64 codes in
/// `8·b` bytes, [`VbitRowsVbmi`]) needs: 64-byte aligned for loads.
///
/// A pair is 8 runs of 8 codes, run `m` in bytes `b·m .. b·m + b`. `vpermb` puts run `m`
/// into 64-bit lane `m` with its first byte highest, so that the lane, read as an
/// integer, is the run's MSB-first bit stream from bit 63 down; code `k` of the run then
/// ends at bit `64 − (k + 1)·b`, where `vpmultishiftqb` takes 8 bits from, and a mask
/// keeps `b` of them. Three instructions per 64 codes whatever the width.
#[repr(C, align(64))]
pub(crate) struct PairTable {
    /// Byte `8·m + j` ← byte `b·m + 7 − j` of the pair (`j ≥ 8 − b`; below, bits no code
    /// keeps: byte `b·m`).
    perm: [u8; 64],
    /// Byte `8·m + k`: `64 − (k + 1)·b`, the low bit of code `k` in lane `m`.
    shift: [u8; 64],
    /// `2^b − 1`.
    mask: [u8; 64],
    /// `L + 128`: the codes come as `L − u + 128`, unsigned.
    top: [u8; 64],
}

const fn pair_table(b: u8) -> PairTable {
    let mut t = PairTable {
        perm: [0; 64],
        shift: [0; 64],
        mask: [0; 64],
        top: [0; 64],
    };
    let b = b as usize;
    let mut p = 0;
    while p < 64 {
        let (m, j) = (p / 8, p % 8);
        t.perm[p] = (b * m + if j + b >= 8 { 7 - j } else { 0 }) as u8;
        t.shift[p] = (64 - (j + 1) * b) as u8;
        t.mask[p] = ((1 << b) - 1) as u8;
        t.top[p] = (zero_point(b as u8) + 128) as u8;
        p += 1;
    }
    t
}

/// The tables of [`BITS`], in that order.
static PAIRS: [PairTable; 5] = [
    pair_table(3),
    pair_table(4),
    pair_table(5),
    pair_table(6),
    pair_table(8),
];

/// The index of a validated width in [`BITS`].
fn width_index(b: u8) -> usize {
    debug_assert!(BITS.contains(&b));
    match b {
        3 => 0,
        4 => 1,
        5 => 2,
        6 => 3,
        _ => 4,
    }
}

/// `R` rows of a validated `vbit` / `vbit_ro` payload (any rows: a task mask's live
/// neurons too).
pub(crate) struct VbitRows<'a, const R: usize> {
    /// Each row's packed codes, exactly `cols·b/8` bytes.
    data: [&'a [u8]; R],
    /// Each row's f16 scales, `2·cols/32` bytes.
    scales: [&'a [u8]; R],
    /// Each row's width.
    bits: [u8; R],
    /// Each row's width's index in [`BITS`] (and so in [`WIDTHS`] and [`PAIRS`]): a byte
    /// where the tables' addresses and the pair load's mask took 24 bytes a row. Built
    /// per block of 8 rows, those stores were a tenth of a SmolLM2-135M `vbit` decode
    /// (`perf record`); without them a cache-warm 1536×576 matvec runs 4% faster (33.6 →
    /// 32.2 µs, `CORTIQ_BENCH_SHAPE=1536x576 cargo bench -p cortiq-engine --bench matvec
    /// -- "vbit.*matvec balanced/1T"`), and the kernels look the tables up by the index.
    width: [u8; R],
    /// Address one past the payload: a 16-byte load must end by it.
    payload_end: usize,
    cols: usize,
    /// Per row, how far the packed codes of the row `2·R` on start from this row's (0
    /// past the last row): rows have their own widths, so the kernels' prefetch cannot
    /// use a fixed distance as for `q4` and `q8`.
    ahead: [usize; R],
    /// How far the scales of the row `2·R` on are from this row's (a fixed `2·R` rows of
    /// `2·cols/32` bytes).
    scales_ahead: usize,
}

impl<'a, const R: usize> VbitRows<'a, R> {
    /// Rows `rs` of a payload that [`super::vbit::validate`] accepted, with layout `l`;
    /// `starts` is the start of every packed row relative to the packed area
    /// ([`super::vbit::row_starts`]). Both come from the matrix's index, computed at load:
    /// a product builds one of these per block of rows.
    #[inline]
    pub fn new_at(
        l: VbitLayout,
        g: Geom,
        bytes: &'a [u8],
        starts: &[usize],
        rs: [usize; R],
    ) -> Self {
        // The widths are a stream of their own, a byte a row: ask for them 128 rows on.
        super::kernel::prefetch_l2(bytes, rs[0] + 128);
        // One pass over the rows, each row's fields together: built per block of rows in
        // every product, the per-field passes (array maps with their own checks) were
        // about 850 instructions for 8 rows, a tenth of a cache-warm matrix-vector product.
        let packed = &bytes[l.packed..];
        let sb = 2 * l.gpr;
        let mut v = VbitRows {
            data: [&bytes[..0]; R],
            scales: [&bytes[..0]; R],
            bits: [0; R],
            width: [0; R],
            payload_end: bytes.as_ptr() as usize + bytes.len(),
            cols: g.cols,
            ahead: [0; R],
            scales_ahead: 2 * R * sb,
        };
        for (i, &r) in rs.iter().enumerate() {
            let (b, from, to) = (bytes[r], starts[r], starts[r + 1]);
            let w = width_index(b);
            v.data[i] = &packed[from..to];
            v.scales[i] = &bytes[l.scales + sb * r..l.scales + sb * (r + 1)];
            v.bits[i] = b;
            v.width[i] = w as u8;
            v.ahead[i] = starts.get(r + 2 * R).map_or(0, |&n| n.saturating_sub(from));
        }
        v
    }

    /// Whether both 16-byte half loads of the `b`-bit group starting at `p` (the second
    /// reads bytes `2b .. 2b + 16` of it) stay inside the payload.
    #[inline(always)]
    fn loads_in_payload(&self, p: *const u8, b: usize) -> bool {
        p as usize + 2 * b + 16 <= self.payload_end
    }

    /// The f16 scale bits of group `blk` of row `i`.
    #[inline(always)]
    fn scale_bits(&self, i: usize, blk: usize) -> u16 {
        le16(self.scales[i], 2 * blk)
    }
}

impl<const R: usize> IntRowsScalar for VbitRows<'_, R> {
    const GROUP_SCALES: bool = true;
    fn cols(&self) -> usize {
        self.cols
    }
    /// `L − u` of each code (see the module comment).
    fn codes32(&self, i: usize, blk: usize, out: &mut [i8; STEP]) {
        let b = self.bits[i];
        let l = zero_point(b);
        let group = &self.data[i][4 * b as usize * blk..4 * b as usize * (blk + 1)];
        for (o, u) in out.iter_mut().zip(MsbCodes::new(group, b)) {
            *o = (l - u as i32) as i8;
        }
    }
    /// The negated scale (the codes are negated).
    fn group_scale(&self, i: usize, blk: usize) -> f32 {
        -h2f_scalar(self.scale_bits(i, blk))
    }
    fn int_post(&self, _i: usize) -> f32 {
        1.0
    }
}

impl<const R: usize> RowsScalar for VbitRows<'_, R> {
    fn cols(&self) -> usize {
        self.cols
    }
    /// `(u − L)·s`, the codes negated back as integers: `(L − u)·(−s)` is the same value
    /// but `−0` where `u = L`.
    fn decode32(&self, i: usize, blk: usize, out: &mut [f32; STEP]) {
        let mut c = [0i8; STEP];
        self.codes32(i, blk, &mut c);
        let s = h2f_scalar(self.scale_bits(i, blk));
        for (o, c) in out.iter_mut().zip(c) {
            *o = -(c as i32) as f32 * s;
        }
    }
}

/// [`VbitRows`] whose integer kernel unpacks a pair of groups at a time with AVX-512 VBMI
/// ([`PairTable`]: 3 instructions per 64 codes, where the AVX2 unpacking takes about 11
/// per 32). Built only where [`Kernel::has_vbmi`](super::kernel::Kernel::has_vbmi) holds:
/// its loads run in the kernel instantiation compiled with VBMI
/// ([`IntRowsSimd::VBMI`](super::kernel::IntRowsSimd::VBMI)). Same codes as [`VbitRows`].
pub(crate) struct VbitRowsVbmi<'a, const R: usize>(pub VbitRows<'a, R>);

impl<const R: usize> IntRowsScalar for VbitRowsVbmi<'_, R> {
    const GROUP_SCALES: bool = true;
    fn cols(&self) -> usize {
        self.0.cols
    }
    fn codes32(&self, i: usize, blk: usize, out: &mut [i8; STEP]) {
        self.0.codes32(i, blk, out)
    }
    fn group_scale(&self, i: usize, blk: usize) -> f32 {
        self.0.group_scale(i, blk)
    }
    fn int_post(&self, i: usize) -> f32 {
        self.0.int_post(i)
    }
}

#[cfg(target_arch = "x86_64")]
mod simd {
    use super::super::kernel::{
        dpwssd256, h2f, hsum256, IntRowsSimd, QToken, RowsAvx2, RowsAvx512,
    };
    use super::{VbitRows, VbitRowsVbmi, WidthTable};
    use std::arch::x86_64::*;

    /// The 16 codes `u` of the half group whose bytes start at `p`, in 16-bit lanes.
    ///
    /// # Safety
    /// AVX2; 16 bytes are readable at `p`.
    #[inline(always)]
    unsafe fn half(p: *const u8, t: &WidthTable) -> __m256i {
        let v = _mm256_broadcastsi128_si256(_mm_loadu_si128(p as *const __m128i));
        let w = _mm256_shuffle_epi8(v, _mm256_load_si256(t.shuffle.as_ptr() as *const __m256i));
        let u = _mm256_mulhi_epu16(w, _mm256_load_si256(t.mult.as_ptr() as *const __m256i));
        _mm256_and_si256(u, _mm256_load_si256(t.mask.as_ptr() as *const __m256i))
    }

    /// The 32 codes `u` of the group whose `4·b` bytes start at `p`, in element order.
    ///
    /// # Safety
    /// AVX2; `2·b + 16` bytes are readable at `p`.
    #[inline(always)]
    unsafe fn group_u(p: *const u8, b: usize, t: &WidthTable) -> __m256i {
        let u = _mm256_packus_epi16(half(p, t), half(p.add(2 * b), t));
        _mm256_permute4x64_epi64::<0b11_01_10_00>(u)
    }

    /// The `4·b` bytes of a group at `p`, zero padded to the 48 its half loads may read.
    ///
    /// # Safety
    /// `4·b` bytes are readable at `p`, `b ≤ 8`.
    #[inline(always)]
    unsafe fn copied(p: *const u8, b: usize) -> [u8; 48] {
        let mut copy = [0u8; 48];
        std::ptr::copy_nonoverlapping(p, copy.as_mut_ptr(), 4 * b);
        copy
    }

    impl<const R: usize> VbitRows<'_, R> {
        /// Where group `blk` of row `i` starts, with its width and table.
        ///
        /// # Safety
        /// `i < R`, `blk < cols / 32`.
        #[inline(always)]
        unsafe fn group_at(&self, i: usize, blk: usize) -> (*const u8, usize, &'static WidthTable) {
            let b = *self.bits.get_unchecked(i) as usize;
            let t = super::WIDTHS.get_unchecked(*self.width.get_unchecked(i) as usize);
            (self.data.get_unchecked(i).as_ptr().add(4 * b * blk), b, t)
        }

        /// The 32 codes `L − u` of group `blk` of row `i`, in element order.
        ///
        /// # Safety
        /// AVX2; `i < R`, `blk < cols / 32`.
        #[inline(always)]
        unsafe fn codes_simd(&self, i: usize, blk: usize) -> __m256i {
            let t = super::WIDTHS.get_unchecked(*self.width.get_unchecked(i) as usize);
            _mm256_sub_epi8(
                _mm256_load_si256(t.zero.as_ptr() as *const __m256i),
                self.codes_u_simd(i, blk),
            )
        }

        /// [`group_u`] of group `blk` of row `i`, through a stack copy near the payload's
        /// end.
        ///
        /// # Safety
        /// As [`VbitRows::codes_simd`].
        #[inline(always)]
        unsafe fn codes_u_simd(&self, i: usize, blk: usize) -> __m256i {
            let (p, b, t) = self.group_at(i, blk);
            if self.loads_in_payload(p, b) {
                group_u(p, b, t)
            } else {
                group_u(copied(p, b).as_ptr(), b, t)
            }
        }

        /// The f16 scale bits of group `blk` of row `i`.
        ///
        /// # Safety
        /// `i < R`, `blk < cols / 32`.
        #[inline(always)]
        unsafe fn scale_bits_unchecked(&self, i: usize, blk: usize) -> u16 {
            let s = self.scales.get_unchecked(i).as_ptr().add(2 * blk);
            u16::from_le_bytes([*s, *s.add(1)])
        }
    }

    /// The low 8 codes `L − u` of `v` negated (as integers, so that `u = L` is `+0`), as
    /// f32, times `s`: `(u − L)·s`, exactly the decoded weights.
    ///
    /// # Safety
    /// AVX2.
    #[inline(always)]
    unsafe fn scaled8(v: __m128i, s: __m256) -> __m256 {
        let u = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_cvtepi8_epi32(v));
        _mm256_mul_ps(_mm256_cvtepi32_ps(u), s)
    }

    /// [`scaled8`] of the 16 codes of `v`.
    ///
    /// # Safety
    /// AVX-512 F.
    #[inline(always)]
    unsafe fn scaled16(v: __m128i, s: __m512) -> __m512 {
        let u = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_cvtepi8_epi32(v));
        _mm512_mul_ps(_mm512_cvtepi32_ps(u), s)
    }

    /// What [`half_codes`] needs of a width's [`WidthTable`], in registers for a row.
    struct WidthRegs {
        shuffle: __m256i,
        /// `2^s`: the multiply shifts each code's window left to its top bit.
        left: __m256i,
    }

    /// The 16 codes `u` of the `B`-bit half group at `p` in 16-bit lanes: the window
    /// shifted left by `s` (a `vpmullw` by `2^s`) then right by `16 − B`. (The table's
    /// `vpmulhuw` and mask, with the table in registers, compiled to a widening 32-bit
    /// multiply and a pack: twice the instructions.)
    ///
    /// # Safety
    /// AVX2; 16 bytes are readable at `p`.
    #[inline(always)]
    unsafe fn half_codes<const B: i32>(p: *const u8, t: &WidthRegs) -> __m256i {
        let v = _mm256_broadcastsi128_si256(_mm_loadu_si128(p as *const __m128i));
        let w = _mm256_mullo_epi16(_mm256_shuffle_epi8(v, t.shuffle), t.left);
        _mm256_srl_epi16(w, _mm_cvtsi32_si128(16 - B))
    }

    /// All ones in lanes `0..n` and zeros above (`n ≤ 8`), as a mask of f32 lanes.
    ///
    /// # Safety
    /// AVX.
    #[inline(always)]
    unsafe fn lanes_below(n: usize) -> __m256 {
        const ONES_THEN_ZEROS: [i32; 16] = [-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0];
        _mm256_loadu_ps(ONES_THEN_ZEROS.as_ptr().add(8 - n.min(8)) as *const f32)
    }

    /// The 32 codes `u` of the 4-bit group at `p` as int16, in nibble-pair order: the
    /// high nibbles (codes `0, 2, …, 30`), then the low ones (`1, 3, …, 31`). A broadcast
    /// load, a shuffle, a shift and a mask, where the general extraction takes two
    /// broadcasts, two shuffles, two multiplies and two shifts.
    ///
    /// # Safety
    /// AVX2; 16 bytes are readable at `p`.
    #[inline(always)]
    unsafe fn nibble_group(p: *const u8) -> [__m256i; 2] {
        // Byte `j` into word `j` by a shuffle of the bytes broadcast to both halves, not by
        // `vpmovzxbw`: LLVM narrows a shift and mask after a widening load to byte
        // operations on both nibbles and widens each (6 instructions where these take 4).
        const WIDEN: [i8; 32] = [
            0, -1, 1, -1, 2, -1, 3, -1, 4, -1, 5, -1, 6, -1, 7, -1, 8, -1, 9, -1, 10, -1, 11, -1,
            12, -1, 13, -1, 14, -1, 15, -1,
        ];
        let v = _mm256_broadcastsi128_si256(_mm_loadu_si128(p as *const __m128i));
        let w = _mm256_shuffle_epi8(v, _mm256_loadu_si256(WIDEN.as_ptr() as *const __m256i));
        [
            _mm256_srli_epi16::<4>(w),
            _mm256_and_si256(w, _mm256_set1_epi16(0x0F)),
        ]
    }

    /// Each token's finished sum: [`hsum256`] of its accumulator.
    ///
    /// # Safety
    /// AVX.
    #[inline(always)]
    unsafe fn acc_sums<const T: usize>(acc: [__m256; T]) -> [f32; T] {
        let mut out = [0f32; T];
        for (o, a) in out.iter_mut().zip(acc) {
            *o = hsum256(a);
        }
        out
    }

    /// Adds a step to a token's accumulator: the 8 groups' exact `Σ (u − L)·k = Σ u·k −
    /// L·Σ k` ([`lane_sums8`] of the pairwise sums `h`, less `zero` = `L` times the token's
    /// per-group sums at `ks`, zero padded to whole steps; a missing group's dot is 0),
    /// converted and multiplied by the step's scales `s`.
    ///
    /// # Safety
    /// AVX2 and FMA; 8 sums are readable at `ks`.
    #[inline(always)]
    unsafe fn add_step(
        acc: &mut __m256,
        h: [__m256i; 4],
        ks: *const i32,
        zero: __m256i,
        s: __m256,
    ) {
        let ks = _mm256_loadu_si256(ks as *const __m256i);
        let dots = _mm256_sub_epi32(lane_sums8(h), _mm256_mullo_epi32(ks, zero));
        *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dots), s, *acc);
    }

    /// Lane `j` of the result is the sum of group `j`'s lanes, from the four pairwise sums
    /// `h[m] = vphaddd(d[2m], d[2m + 1])` of 8 group dots `d` (taken as soon as a pair of
    /// dots is ready, so that fewer stay live): two more rounds of `vphaddd` give each
    /// group's low and high 128-bit halves' sums, and the halves are added.
    ///
    /// # Safety
    /// AVX2.
    #[inline(always)]
    unsafe fn lane_sums8(h: [__m256i; 4]) -> __m256i {
        // [d0 d1 d2 d3 | d0 d1 d2 d3] (low halves' sums, then high halves'), and d4..d7.
        let ab = _mm256_hadd_epi32(h[0], h[1]);
        let ce = _mm256_hadd_epi32(h[2], h[3]);
        _mm256_add_epi32(
            _mm256_permute2x128_si256::<0x20>(ab, ce),
            _mm256_permute2x128_si256::<0x31>(ab, ce),
        )
    }

    /// The four halves (codes `u`, int16) of the `B`-bit groups at `p` and `p + 4·B`.
    ///
    /// # Safety
    /// AVX2; `6·B + 16` bytes are readable at `p`.
    #[inline(always)]
    unsafe fn group_pair<const B: i32>(p: *const u8, t: &WidthRegs) -> [__m256i; 4] {
        let b = B as usize;
        [
            half_codes::<B>(p, t),
            half_codes::<B>(p.add(2 * b), t),
            half_codes::<B>(p.add(4 * b), t),
            half_codes::<B>(p.add(6 * b), t),
        ]
    }

    /// `vphaddd` of the integer dots of [`group_pair`]'s two groups against the 64 int16
    /// codes at `k`; with `VNNI`, each group's second multiply-add folded into its sum
    /// (`vpdpwssd`).
    ///
    /// # Safety
    /// AVX2, and AVX-VNNI when `VNNI`; 64 codes at `k`.
    #[inline(always)]
    unsafe fn pair_dot<const VNNI: bool>(c: &[__m256i; 4], k: *const i16) -> __m256i {
        let k = k as *const __m256i;
        if VNNI {
            let (k0, k1) = (_mm256_loadu_si256(k), _mm256_loadu_si256(k.add(1)));
            let (k2, k3) = (_mm256_loadu_si256(k.add(2)), _mm256_loadu_si256(k.add(3)));
            return _mm256_hadd_epi32(
                dpwssd256(_mm256_madd_epi16(c[0], k0), c[1], k1),
                dpwssd256(_mm256_madd_epi16(c[2], k2), c[3], k3),
            );
        }
        _mm256_hadd_epi32(
            _mm256_add_epi32(
                _mm256_madd_epi16(c[0], _mm256_loadu_si256(k)),
                _mm256_madd_epi16(c[1], _mm256_loadu_si256(k.add(1))),
            ),
            _mm256_add_epi32(
                _mm256_madd_epi16(c[2], _mm256_loadu_si256(k.add(2))),
                _mm256_madd_epi16(c[3], _mm256_loadu_si256(k.add(3))),
            ),
        )
    }

    impl<const R: usize> VbitRows<'_, R> {
        /// The codes of groups `g + 2m` and `g + 2m + 1` of row `i` (width `B`, starting at
        /// `p`), each from a zero-padded copy where its loads would leave the payload; a
        /// group at or past `g + n` is zero.
        ///
        /// # Safety
        /// AVX2; `i < R`, `g + n ≤ cols / 32`.
        #[inline(always)]
        unsafe fn pair_checked<const B: i32>(
            &self,
            p: *const u8,
            g: usize,
            m: usize,
            n: usize,
            regs: &WidthRegs,
        ) -> [__m256i; 4] {
            let b = B as usize;
            let mut c = [_mm256_setzero_si256(); 4];
            for (h, c) in c.chunks_exact_mut(2).enumerate() {
                if 2 * m + h >= n {
                    break;
                }
                let q = p.add(4 * b * (g + 2 * m + h));
                let copy;
                let q = if self.loads_in_payload(q, b) {
                    q
                } else {
                    copy = copied(q, b);
                    copy.as_ptr()
                };
                c[0] = half_codes::<B>(q, regs);
                c[1] = half_codes::<B>(q.add(2 * b), regs);
            }
            c
        }

        /// One step of [`VbitRows::row_dot_i16_b`]: the `n ≤ 8` groups of row `i` from
        /// group `g` on against the tokens `xs`, into their accumulators. `FAST`: `n = 8`
        /// and every load stays in the payload.
        ///
        /// # Safety
        /// As [`IntRowsSimd::row_dot_i16`], `g + n ≤ cols / 32`, row `i` is `B` bits wide.
        #[inline(always)]
        unsafe fn step_i16<
            const B: i32,
            const T: usize,
            const FAST: bool,
            const NIB: bool,
            const VNNI: bool,
        >(
            &self,
            i: usize,
            g: usize,
            n: usize,
            regs: &WidthRegs,
            xs: &[QToken; T],
            acc: &mut [__m256; T],
        ) {
            // (No closures here: they would not inherit the caller's target features.)
            let p = self.data.get_unchecked(i).as_ptr();
            let gb = 4 * B as usize;
            let mut h = [[_mm256_setzero_si256(); 4]; T];
            // A partial step's pairs past its groups stay 0.
            let pairs = if FAST { 4 } else { n.div_ceil(2) };
            for m in 0..pairs {
                let c = if NIB {
                    // A 4-bit group's 16 bytes are its own: no load leaves the payload.
                    let q = p.add(gb * (g + 2 * m));
                    // (`m < ⌈n/2⌉`: the pair's first group is always there.)
                    let mut c = [_mm256_setzero_si256(); 4];
                    [c[0], c[1]] = nibble_group(q);
                    if FAST || 2 * m + 1 < n {
                        [c[2], c[3]] = nibble_group(q.add(16));
                    }
                    c
                } else if FAST {
                    group_pair::<B>(p.add(gb * (g + 2 * m)), regs)
                } else {
                    self.pair_checked::<B>(p, g, m, n, regs)
                };
                for (h, x) in h.iter_mut().zip(xs) {
                    let k = if NIB { x.kp } else { x.k };
                    h[m] = pair_dot::<VNNI>(&c, k.as_ptr().add(32 * (g + 2 * m)));
                }
            }
            let s = self.step_scales::<FAST>(i, g, n);
            let zero = _mm256_set1_epi32(super::zero_point(B as u8));
            for ((a, h), x) in acc.iter_mut().zip(h).zip(xs) {
                add_step(a, h, x.ks.as_ptr().add(g), zero, s);
            }
        }

        /// [`IntRowsSimd::row_dot_i16`] for a row of width `B`.
        ///
        /// # Safety
        /// As there, and row `i` is `B` bits wide.
        #[inline(always)]
        unsafe fn row_dot_i16_b<const B: i32, const T: usize, const NIB: bool, const VNNI: bool>(
            &self,
            i: usize,
            xs: &[QToken; T],
        ) -> [f32; T] {
            let (p, _, t) = self.group_at(i, 0);
            let regs = WidthRegs {
                shuffle: _mm256_load_si256(t.shuffle.as_ptr() as *const __m256i),
                left: _mm256_load_si256(t.left.as_ptr() as *const __m256i),
            };
            let gb = 4 * B as usize;
            let gpr = self.cols / 32;
            let mut acc = [_mm256_setzero_ps(); T];
            let mut g = 0;
            // Whole steps whose loads stay in the payload, then the rest (the last rows of
            // the payload, a row's last partial step) checked.
            if NIB {
                while g + 8 <= gpr {
                    self.step_i16::<B, T, true, true, VNNI>(i, g, 8, &regs, xs, &mut acc);
                    g += 8;
                }
            }
            while g + 8 <= gpr && self.loads_in_payload(p.add(gb * (g + 7)), B as usize) {
                self.step_i16::<B, T, true, NIB, VNNI>(i, g, 8, &regs, xs, &mut acc);
                g += 8;
            }
            while g < gpr {
                self.step_i16::<B, T, false, NIB, VNNI>(
                    i,
                    g,
                    (gpr - g).min(8),
                    &regs,
                    xs,
                    &mut acc,
                );
                g += 8;
            }
            acc_sums(acc)
        }
    }

    impl<const R: usize> IntRowsSimd for VbitRows<'_, R> {
        #[inline(always)]
        unsafe fn load_u8(&self, i: usize, blk: usize) -> __m256i {
            self.codes_simd(i, blk)
        }
        #[inline(always)]
        unsafe fn group_scale_simd(&self, i: usize, blk: usize) -> f32 {
            h2f(self.scale_bits_unchecked(i, blk) ^ 0x8000)
        }

        const ROW_DOT_I16: bool = true;

        const ROW_DOT_VNNI: bool = true;

        /// See [`VbitRows::row_dot_vnni_with`] (CPUs with VNNI but no VBMI).
        #[inline(always)]
        unsafe fn row_dot_vnni<const T: usize>(&self, i: usize, xs: &[QToken; T]) -> [f32; T] {
            self.row_dot_vnni_with::<T, false>(i, xs)
        }

        /// A row at a time, 8 groups per step: each group's exact `Σ (u − L)·k` in 8 lanes
        /// (two `vpmaddwd`), the 8 groups' lanes summed into one vector ([`lane_sums8`]),
        /// converted once and multiplied by the 8 scales of one `vcvtph2ps`. The loop over
        /// groups and rows spent a conversion, an FMA and a scalar scale conversion and
        /// broadcast on every group, and reloaded the width's tables for every row and
        /// group. Each group's integer dot is the scalar reference's, converted alike.
        #[inline(always)]
        unsafe fn row_dot_i16<const T: usize, const VNNI: bool>(
            &self,
            i: usize,
            xs: &[QToken; T],
        ) -> [f32; T] {
            match *self.bits.get_unchecked(i) {
                3 => self.row_dot_i16_b::<3, T, false, VNNI>(i, xs),
                4 if xs.iter().all(|x| !x.kp.is_empty()) => {
                    self.row_dot_i16_b::<4, T, true, VNNI>(i, xs)
                }
                4 => self.row_dot_i16_b::<4, T, false, VNNI>(i, xs),
                5 => self.row_dot_i16_b::<5, T, false, VNNI>(i, xs),
                6 => self.row_dot_i16_b::<6, T, false, VNNI>(i, xs),
                _ => self.row_dot_i16_b::<8, T, false, VNNI>(i, xs),
            }
        }

        /// The row `2·R` on, at the same four groups, by its start from the matrix's row
        /// index (its width taken as this row's: only the cache lines matter), and its
        /// scales once per 32 groups. Without it a decode waited on every load (Qwen2.5's
        /// vbit decode streamed at 5 GB/s where `q4` streams at 20). The first and last
        /// byte of every four groups (`16·bits` bytes, at most 128: a middle line of the
        /// widest rows may be left to the hardware prefetcher), with no test per line: the
        /// kernel is compute-bound enough that a line test per group and row cost more
        /// than it saved on SmolLM2. Every pair's first and last byte (4 prefetches per line
        /// at 4 bits) decoded 4–6% (SmolLM2-135M) and 5–7% (Qwen2.5-Coder-0.5B) slower,
        /// interleaved; every 8 groups with a loop over their lines, 25–29% slower.
        #[inline(always)]
        unsafe fn prefetch_next(&self, i: usize, blk: usize) {
            if !blk.is_multiple_of(4) {
                return;
            }
            let b = 4 * *self.bits.get_unchecked(i) as usize;
            let data = self.data.get_unchecked(i).as_ptr();
            let at = data.wrapping_add(*self.ahead.get_unchecked(i) + b * blk);
            _mm_prefetch::<_MM_HINT_T1>(at as *const i8);
            _mm_prefetch::<_MM_HINT_T1>(at.wrapping_add(4 * b - 1) as *const i8);
            if blk.is_multiple_of(32) {
                let s = self.scales.get_unchecked(i).as_ptr();
                _mm_prefetch::<_MM_HINT_T1>(
                    s.wrapping_add(self.scales_ahead + 2 * blk) as *const i8
                );
            }
        }
    }

    /// What [`VbitRows::step_vnni`] needs of a row's width, in registers.
    struct PairRegs {
        perm: __m512i,
        shift: __m512i,
        mask: __m512i,
        /// The load masks of a pair's `8·b` bytes and of one group's `4·b`.
        two: u64,
        one: u64,
        /// The zero point `L` in every 32-bit lane.
        zero: __m256i,
        b: usize,
    }

    impl<const R: usize> VbitRows<'_, R> {
        /// The scales of the `n ≤ 8` groups of row `i` from group `g` on, for a step of the
        /// row kernels. Past the row's last group (a partial step, not `FAST`) they are the
        /// next bytes of the payload, masked to 0 (they may be f16 NaNs).
        ///
        /// # Safety
        /// F16C and AVX; `i < R`, `g + n ≤ cols / 32`, and `n = 8` when `FAST`.
        #[inline(always)]
        unsafe fn step_scales<const FAST: bool>(&self, i: usize, g: usize, n: usize) -> __m256 {
            let at = self.scales.get_unchecked(i).as_ptr().add(2 * g);
            let s = if FAST || at as usize + 16 <= self.payload_end {
                _mm_loadu_si128(at as *const __m128i)
            } else {
                let mut bits = [0u16; 8];
                std::ptr::copy_nonoverlapping(at, bits.as_mut_ptr() as *mut u8, 2 * n);
                _mm_loadu_si128(bits.as_ptr() as *const __m128i)
            };
            let s = _mm256_cvtph_ps(s);
            if FAST {
                s
            } else {
                _mm256_and_ps(s, lanes_below(n))
            }
        }

        /// The codes `u` of groups `g` and `g + 1` of row `i` in the low and high 256 bits
        /// (the second 0 unless `two`), by the AVX2 extraction ([`VbitRows::codes_u_simd`]).
        ///
        /// # Safety
        /// AVX-512 F and AVX2; `i < R`, `g + two < cols / 32`.
        #[inline(always)]
        unsafe fn pair_u(&self, i: usize, g: usize, two: bool) -> __m512i {
            let hi = if two {
                self.codes_u_simd(i, g + 1)
            } else {
                _mm256_setzero_si256()
            };
            _mm512_inserti64x4::<1>(_mm512_castsi256_si512(self.codes_u_simd(i, g)), hi)
        }

        /// One step of [`IntRowsSimd::row_dot_vnni`]: the `n ≤ 8` groups of row `i` from
        /// group `g` on against the tokens `xs`, into their accumulators. `FAST`: `n = 8`.
        /// Each pair of groups is one masked load (its `8·b` bytes and nothing past them)
        /// and [`super::PairTable`]'s three instructions to the codes `u` with `VBMI`, else
        /// [`VbitRows::pair_u`]; then per token a `vpdpbusd` per level; the 8 groups'
        /// lanes are summed as in the AVX2 kernel.
        ///
        /// # Safety
        /// As [`IntRowsSimd::row_dot_vnni`], with VBMI when `VBMI`; `g + n ≤ cols / 32`.
        #[inline(always)]
        unsafe fn step_vnni<const T: usize, const FAST: bool, const VBMI: bool>(
            &self,
            i: usize,
            g: usize,
            n: usize,
            t: &PairRegs,
            xs: &[QToken; T],
            acc: &mut [__m256; T],
        ) {
            // (No closures here: they would not inherit the caller's target features.)
            let p = self.data.get_unchecked(i).as_ptr().add(4 * t.b * g);
            // The masked loads wait on memory without it (a third of the speed).
            self.prefetch_next(i, g);
            self.prefetch_next(i, g + 4);
            let mut d = [[_mm256_setzero_si256(); 8]; T];
            // A partial step's pairs past its groups stay 0.
            let pairs = if FAST { 4 } else { n.div_ceil(2) };
            for m in 0..pairs {
                let two = FAST || 2 * m + 1 < n;
                let u = if VBMI {
                    let mask = if two { t.two } else { t.one };
                    let v = _mm512_maskz_loadu_epi8(mask, p.add(8 * t.b * m) as *const i8);
                    let w = _mm512_permutexvar_epi8(t.perm, v);
                    _mm512_and_si512(_mm512_multishift_epi64_epi8(t.shift, w), t.mask)
                } else {
                    self.pair_u(i, g + 2 * m, two)
                };
                let at = 32 * (g + 2 * m);
                // A lone last group reads only its own 32 activations of each level.
                let lanes: u64 = if two { u64::MAX } else { u32::MAX as u64 };
                for (d, x) in d.iter_mut().zip(xs) {
                    let q = _mm512_maskz_loadu_epi8(lanes, x.q.as_ptr().add(at));
                    let q2 = _mm512_maskz_loadu_epi8(lanes, x.q2.as_ptr().add(at));
                    let hi = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, q);
                    let lo = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, q2);
                    let s = _mm512_add_epi32(_mm512_slli_epi32::<8>(hi), lo);
                    d[2 * m] = _mm512_castsi512_si256(s);
                    d[2 * m + 1] = _mm512_extracti64x4_epi64::<1>(s);
                }
            }
            let s = self.step_scales::<FAST>(i, g, n);
            for ((a, d), x) in acc.iter_mut().zip(d).zip(xs) {
                let h = [
                    _mm256_hadd_epi32(d[0], d[1]),
                    _mm256_hadd_epi32(d[2], d[3]),
                    _mm256_hadd_epi32(d[4], d[5]),
                    _mm256_hadd_epi32(d[6], d[7]),
                ];
                add_step(a, h, x.ks.as_ptr().add(g), t.zero, s);
            }
        }

        /// A row at a time, 8 groups per step ([`VbitRows::step_vnni`]): the codes `u`
        /// unsigned as stored, `Σ (u − L)·k = Σ u·k − L·Σ k` from the tokens' per-group
        /// sums, one conversion and one `vcvtph2ps` of 8 scales per step. The loop over 8
        /// rows at once spilled its registers and spent a conversion, a multiply-add and a
        /// scale spread on every pair of groups.
        ///
        /// The codes come from [`super::PairTable`]'s permutes with `VBMI`, else from the
        /// AVX2 extraction: the same integers either way, so the same values bit for bit.
        ///
        /// # Safety
        /// As [`IntRowsSimd::row_dot_vnni`], with VBMI when `VBMI`.
        #[inline(always)]
        unsafe fn row_dot_vnni_with<const T: usize, const VBMI: bool>(
            &self,
            i: usize,
            xs: &[QToken; T],
        ) -> [f32; T] {
            let b = *self.bits.get_unchecked(i) as usize;
            let pt = super::PAIRS.get_unchecked(*self.width.get_unchecked(i) as usize);
            let t = PairRegs {
                perm: _mm512_load_si512(pt.perm.as_ptr() as *const _),
                shift: _mm512_load_si512(pt.shift.as_ptr() as *const _),
                mask: _mm512_load_si512(pt.mask.as_ptr() as *const _),
                two: u64::MAX >> (64 - 8 * b),
                one: u64::MAX >> (64 - 4 * b),
                zero: _mm256_set1_epi32(super::zero_point(b as u8)),
                b,
            };
            let gpr = self.cols / 32;
            let mut acc = [_mm256_setzero_ps(); T];
            let mut g = 0;
            while g + 8 <= gpr {
                self.step_vnni::<T, true, VBMI>(i, g, 8, &t, xs, &mut acc);
                g += 8;
            }
            if g < gpr {
                self.step_vnni::<T, false, VBMI>(i, g, gpr - g, &t, xs, &mut acc);
            }
            acc_sums(acc)
        }
    }

    impl<const R: usize> IntRowsSimd for VbitRowsVbmi<'_, R> {
        const VBMI: bool = true;
        /// The codes `L − u` come as `L − u + 128`, unsigned: the dot starts from the
        /// activations' `−128·Σx` lanes ([`super::super::kernel::ActOrder::NaturalOffset`])
        /// instead of moving every code's sign onto the activations (per row and pair an
        /// absolute value and a sign mask, per token two blends).
        const CODE_OFFSET: u8 = 128;

        const ROW_DOT_VNNI: bool = true;

        /// See [`VbitRows::row_dot_vnni_with`].
        #[inline(always)]
        unsafe fn row_dot_vnni<const T: usize>(&self, i: usize, xs: &[QToken; T]) -> [f32; T] {
            self.0.row_dot_vnni_with::<T, true>(i, xs)
        }

        /// [`VbitRows`]'s codes plus 128 (the top bit flipped).
        #[inline(always)]
        unsafe fn load_u8(&self, i: usize, blk: usize) -> __m256i {
            _mm256_xor_si256(self.0.codes_simd(i, blk), _mm256_set1_epi8(-128))
        }

        /// The 64 codes `L − u + 128` of groups `blk` and `blk + 1` of row `i` (see
        /// [`super::PairTable`]).
        ///
        /// # Safety
        /// As [`IntRowsSimd::load_pair_u8`], and the CPU has AVX-512 VBMI.
        #[inline(always)]
        unsafe fn load_pair_u8(&self, i: usize, blk: usize) -> __m512i {
            let r = &self.0;
            let b = *r.bits.get_unchecked(i) as usize;
            let t = super::PAIRS.get_unchecked(*r.width.get_unchecked(i) as usize);
            let p = r.data.get_unchecked(i).as_ptr().add(4 * b * blk);
            // The pair's `8·b` bytes only: a masked load neither reads nor faults on the
            // rest, so the row's end needs no copy.
            let v = _mm512_maskz_loadu_epi8(u64::MAX >> (64 - 8 * b), p as *const i8);
            let w = _mm512_permutexvar_epi8(_mm512_load_si512(t.perm.as_ptr() as *const _), v);
            let u =
                _mm512_multishift_epi64_epi8(_mm512_load_si512(t.shift.as_ptr() as *const _), w);
            let u = _mm512_and_si512(u, _mm512_load_si512(t.mask.as_ptr() as *const _));
            _mm512_sub_epi8(_mm512_load_si512(t.top.as_ptr() as *const _), u)
        }

        #[inline(always)]
        unsafe fn group_scale_simd(&self, i: usize, blk: usize) -> f32 {
            self.0.group_scale_simd(i, blk)
        }

        /// Both f16 scales in one load and one conversion, negated by their sign bits
        /// (as [`IntRowsSimd::group_scale_simd`]), then spread: 5 instructions where two
        /// scalar conversions and broadcasts took 12.
        #[inline(always)]
        unsafe fn pair_scales(&self, i: usize, blk: usize) -> __m512 {
            let p = self.0.scales.get_unchecked(i).as_ptr().add(2 * blk) as *const u32;
            let two = p.read_unaligned() ^ 0x8000_8000;
            let f = _mm_cvtph_ps(_mm_cvtsi32_si128(two as i32));
            let spread = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
            _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(f))
        }

        #[inline(always)]
        unsafe fn prefetch_next(&self, i: usize, blk: usize) {
            self.0.prefetch_next(i, blk)
        }
    }

    impl<const R: usize> RowsAvx2 for VbitRows<'_, R> {
        #[inline(always)]
        unsafe fn prefetch_next_f(&self, i: usize, blk: usize) {
            self.prefetch_next(i, blk)
        }

        #[inline(always)]
        unsafe fn load_avx2(&self, i: usize, blk: usize) -> [__m256; 4] {
            let c = self.codes_simd(i, blk);
            let s = _mm256_set1_ps(h2f(self.scale_bits_unchecked(i, blk)));
            let (lo, hi) = (_mm256_castsi256_si128(c), _mm256_extracti128_si256::<1>(c));
            [
                scaled8(lo, s),
                scaled8(_mm_unpackhi_epi64(lo, lo), s),
                scaled8(hi, s),
                scaled8(_mm_unpackhi_epi64(hi, hi), s),
            ]
        }
    }

    impl<const R: usize> RowsAvx512 for VbitRows<'_, R> {
        #[inline(always)]
        unsafe fn load_avx512(&self, i: usize, blk: usize) -> [__m512; 2] {
            let c = self.codes_simd(i, blk);
            let s = _mm512_set1_ps(h2f(self.scale_bits_unchecked(i, blk)));
            [
                scaled16(_mm256_castsi256_si128(c), s),
                scaled16(_mm256_extracti128_si256::<1>(c), s),
            ]
        }
    }
}

/// A `vbit` / `vbit_ro` payload of `rows × cols` built by hand, not by the encoder: every
/// width in turn (then at random), codes drawn over the whole `0 .. 2^b` (the encoder
/// never writes `2^b − 1`; a file may), scales of both signs. For the kernel tests.
#[cfg(test)]
pub(super) fn hostile_payload(
    dtype: crate::format::dtype::DType,
    rows: usize,
    cols: usize,
    seed: u64,
) -> Vec<u8> {
    assert_eq!(cols % STEP, 0);
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    let bits: Vec<u8> = (0..rows)
        .map(|r| {
            BITS[if r < BITS.len() {
                r
            } else {
                next() as usize % BITS.len()
            }]
        })
        .collect();
    let mut out = bits.clone();
    for _ in 0..rows * cols / STEP {
        let m = (next() % 2000) as f32 / 1000.0 - 1.0;
        out.extend_from_slice(&half::f16::from_f32(m).to_le_bytes());
    }
    let mut packed = Vec::new();
    let mut offsets = vec![0u32];
    for &b in &bits {
        let mut row = vec![0u8; cols * b as usize / 8];
        for k in 0..cols {
            let u = next() % (1 << b);
            for j in 0..b as usize {
                let bit = (u >> (b as usize - 1 - j)) & 1;
                let p = k * b as usize + j;
                row[p / 8] |= (bit as u8) << (7 - p % 8);
            }
        }
        packed.extend_from_slice(&row);
        offsets.push(packed.len() as u32);
    }
    if dtype == crate::format::dtype::DType::VbitRo {
        out.extend(offsets.iter().flat_map(|o| o.to_le_bytes()));
    }
    out.extend_from_slice(&packed);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::dtype::DType;
    use crate::quant::{decode, geometry, validate, vbit};

    /// Rows × cols of the tests: one group, odd group counts, a long row.
    const SHAPES: [(usize, usize); 5] = [(5, 32), (7, 96), (11, 160), (6, 2080), (9, 32 * 37)];

    /// Every row of `bytes` through [`VbitRows`] one row at a time, with `f(rows, i, blk)`.
    fn each_group(
        dtype: DType,
        rows: usize,
        cols: usize,
        bytes: &[u8],
        mut f: impl FnMut(&VbitRows<1>, usize, usize),
    ) {
        let shape = [rows as u64, cols as u64];
        let g = geometry(dtype, &shape).unwrap();
        let starts = vbit::row_starts(g, bytes).unwrap();
        for r in 0..rows {
            let l = vbit::VbitLayout::new(dtype, g).unwrap();
            let v = VbitRows::<1>::new_at(l, g, bytes, &starts, [r]);
            for blk in 0..cols / STEP {
                f(&v, r, blk);
            }
        }
    }

    #[test]
    fn the_scalar_codes_and_scales_decode_like_decode() {
        for dtype in [DType::Vbit, DType::VbitRo] {
            for (si, &(rows, cols)) in SHAPES.iter().enumerate() {
                let bytes = hostile_payload(dtype, rows, cols, si as u64);
                let shape = [rows as u64, cols as u64];
                validate(dtype, &shape, &bytes).unwrap();
                let want = decode(dtype, &shape, &bytes).unwrap();
                each_group(dtype, rows, cols, &bytes, |v, r, blk| {
                    let mut c = [0i8; STEP];
                    v.codes32(0, blk, &mut c);
                    let s = v.group_scale(0, blk);
                    let mut w = [0f32; STEP];
                    v.decode32(0, blk, &mut w);
                    for k in 0..STEP {
                        let e = want[r * cols + blk * STEP + k];
                        // Equal values; `(L − u)·(−s)` is `−0` where `decode` has `+0`.
                        assert_eq!(
                            c[k] as f32 * s,
                            e,
                            "{dtype} {shape:?} row {r} group {blk} code {k}"
                        );
                        assert_eq!(w[k].to_bits(), e.to_bits());
                    }
                });
            }
        }
    }

    #[test]
    fn every_width_reaches_its_extreme_codes() {
        // 8-bit u = 255 is the code L − u = −128, which u − L (+128) could not be.
        let bytes = hostile_payload(DType::Vbit, 5, 2080, 3);
        let mut seen = std::collections::HashSet::new();
        each_group(DType::Vbit, 5, 2080, &bytes, |v, _, blk| {
            let mut c = [0i8; STEP];
            v.codes32(0, blk, &mut c);
            let b = v.bits[0];
            let l = zero_point(b) as i8;
            for x in c {
                if x == l || x as i32 == l as i32 - ((1 << b) - 1) {
                    seen.insert((b, x));
                }
            }
        });
        assert_eq!(seen.len(), 2 * BITS.len(), "{seen:?}");
        assert!(seen.contains(&(8, -128)));
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn simd_codes_equal_the_scalar_codes() {
        use super::super::kernel::{IntRowsSimd, Kernel, RowsAvx2};
        use std::arch::x86_64::*;
        if !Kernel::Avx2.is_available() {
            eprintln!("no AVX2 on this CPU: the scalar path is the only one");
            return;
        }
        for dtype in [DType::Vbit, DType::VbitRo] {
            let mut copied = 0;
            for (si, &(rows, cols)) in SHAPES.iter().enumerate() {
                let bytes = hostile_payload(dtype, rows, cols, 10 + si as u64);
                each_group(dtype, rows, cols, &bytes, |v, r, blk| {
                    let b = v.bits[0] as usize;
                    let p = v.data[0][4 * b * blk..].as_ptr();
                    copied += usize::from(!v.loads_in_payload(p, b));
                    let mut c = [0i8; STEP];
                    v.codes32(0, blk, &mut c);
                    let mut w = [0f32; STEP];
                    v.decode32(0, blk, &mut w);
                    // SAFETY: AVX2 (with FMA and F16C, which `Kernel::Avx2` includes) is
                    // present; `blk < cols / 32`.
                    let (simd, f, s) = unsafe {
                        let mut simd = [0i8; STEP];
                        _mm256_storeu_si256(simd.as_mut_ptr() as *mut __m256i, v.load_u8(0, blk));
                        let mut f = [0f32; STEP];
                        for (q, x) in v.load_avx2(0, blk).iter().enumerate() {
                            _mm256_storeu_ps(f[8 * q..].as_mut_ptr(), *x);
                        }
                        (simd, f, v.group_scale_simd(0, blk))
                    };
                    assert_eq!(
                        simd, c,
                        "{dtype} {rows}×{cols} row {r} ({} bits) group {blk}",
                        v.bits[0]
                    );
                    assert_eq!(s.to_bits(), v.group_scale(0, blk).to_bits());
                    assert_eq!(f.map(f32::to_bits), w.map(f32::to_bits));
                });
            }
            // Some groups at a payload's end took the stack copy.
            assert!(copied > 0, "{dtype}");
        }
    }

    /// Groups `blk` and `blk + 1` of `v`'s row through the VBMI pair load, and their scales.
    ///
    /// # Safety
    /// The CPU has AVX-512 F/BW/VL/VBMI; `blk + 1 < cols / 32`.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2")]
    unsafe fn vbmi_pair(v: VbitRowsVbmi<1>, blk: usize) -> ([i8; 2 * STEP], [f32; 16]) {
        use super::super::kernel::IntRowsSimd;
        use std::arch::x86_64::*;
        let mut out = [0i8; 2 * STEP];
        _mm512_storeu_si512(out.as_mut_ptr() as *mut _, v.load_pair_u8(0, blk));
        let mut scales = [0f32; 16];
        _mm512_storeu_ps(scales.as_mut_ptr(), v.pair_scales(0, blk));
        (out, scales)
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn vbmi_pair_codes_equal_the_scalar_codes() {
        use super::super::kernel::Kernel;
        if !Kernel::Avx512.has_vbmi() {
            eprintln!("no AVX-512 VBMI on this CPU: the pair load never runs here");
            return;
        }
        let mut last_pairs = 0;
        for dtype in [DType::Vbit, DType::VbitRo] {
            for (si, &(rows, cols)) in SHAPES.iter().enumerate() {
                let bytes = hostile_payload(dtype, rows, cols, 20 + si as u64);
                let shape = [rows as u64, cols as u64];
                let g = geometry(dtype, &shape).unwrap();
                let starts = vbit::row_starts(g, &bytes).unwrap();
                let l = vbit::VbitLayout::new(dtype, g).unwrap();
                for r in 0..rows {
                    for blk in 0..(cols / STEP).saturating_sub(1) {
                        let v = VbitRows::<1>::new_at(l, g, &bytes, &starts, [r]);
                        let b = v.bits[0] as usize;
                        // The pair ending at the payload's last byte: the masked load
                        // reads nothing past it.
                        let end = v.data[0][4 * b * blk..].as_ptr() as usize + 8 * b;
                        last_pairs += usize::from(end == bytes.as_ptr() as usize + bytes.len());
                        let mut want = [0i8; 2 * STEP];
                        let (w0, w1) = want.split_at_mut(STEP);
                        v.codes32(0, blk, w0.try_into().unwrap());
                        v.codes32(0, blk + 1, w1.try_into().unwrap());
                        let scales = [v.group_scale(0, blk), v.group_scale(0, blk + 1)];
                        // SAFETY: VBMI (and F/BW/VL) present; `blk + 1 < cols / 32`.
                        let (got, got_scales) = unsafe { vbmi_pair(VbitRowsVbmi(v), blk) };
                        let what = format!("{dtype} {rows}×{cols} row {r} ({b} bits) pair {blk}");
                        // The codes come offset by 128.
                        assert_eq!(got.map(|c| c ^ -128), want, "{what}");
                        for (l, s) in got_scales.iter().enumerate() {
                            assert_eq!(s.to_bits(), scales[l / 8].to_bits(), "{what} lane {l}");
                        }
                    }
                }
            }
        }
        // Some pairs ended exactly where the payload does.
        assert!(last_pairs > 0);
    }

    /// `out = rows · tokens` of `d` through the integer kernel of `k`, the activations
    /// quantized in `order`.
    #[cfg(target_arch = "x86_64")]
    fn product<D: super::super::kernel::IntRows, const T: usize>(
        d: &D,
        x: &[f32],
        cols: usize,
        order: super::super::kernel::ActOrder,
        split: bool,
    ) -> [[f32; T]; 8] {
        use super::super::kernel::{run_int, Kernel, QuantizedActs};
        let mut qa = QuantizedActs::default();
        qa.fill(
            x,
            T,
            cols,
            None,
            order,
            split,
            order == super::super::kernel::ActOrder::Natural,
        );
        qa.fill_group_sums();
        let xs = std::array::from_fn(|j| qa.token(j));
        let mut out = [[0f32; T]; 8];
        run_int::<D, 8, T>(Kernel::Avx512, d, &xs, &mut out);
        out
    }

    /// The VBMI rows (codes offset by 128, pairs unpacked by permutes) against the plain
    /// rows in the same AVX-512 VNNI kernel, bit for bit: a CPU with VNNI but without VBMI
    /// runs the plain ones, which this CPU's dispatch otherwise never reaches.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn vbmi_rows_equal_the_plain_rows_in_the_vnni_kernel() {
        use super::super::kernel::{ActOrder, Kernel};
        if !Kernel::Avx512.has_vbmi() {
            eprintln!("no AVX-512 VBMI on this CPU: only the plain rows run here");
            return;
        }
        let mut rng = crate::synth::Rng::new(9);
        let mut x = |n: usize| -> Vec<f32> {
            (0..n)
                .map(|k| {
                    // An outlier now and then, as real activations have.
                    let v = rng.unit() - 0.5;
                    if k % 97 == 5 {
                        40.0 * v
                    } else {
                        v
                    }
                })
                .collect()
        };
        for dtype in [DType::Vbit, DType::VbitRo] {
            for (si, &(rows, cols)) in SHAPES.iter().enumerate() {
                let bytes = hostile_payload(dtype, rows, cols, 40 + si as u64);
                let shape = [rows as u64, cols as u64];
                let g = geometry(dtype, &shape).unwrap();
                let starts = vbit::row_starts(g, &bytes).unwrap();
                let l = vbit::VbitLayout::new(dtype, g).unwrap();
                // Any 8 rows, repeats and the last row included.
                let rs: [usize; 8] = std::array::from_fn(|i| (3 * i + si) % rows);
                let plain = VbitRows::<8>::new_at(l, g, &bytes, &starts, rs);
                let vbmi = VbitRowsVbmi(VbitRows::<8>::new_at(l, g, &bytes, &starts, rs));
                for split in [false, true] {
                    let what = format!("{dtype} {rows}×{cols} split {split}");
                    let x1 = x(cols);
                    let a = product::<_, 1>(&plain, &x1, cols, ActOrder::Natural, split);
                    let b = product::<_, 1>(&vbmi, &x1, cols, ActOrder::NaturalOffset, split);
                    assert_eq!(
                        a.map(|r| r.map(f32::to_bits)),
                        b.map(|r| r.map(f32::to_bits)),
                        "{what}, 1 token"
                    );
                    let x3 = x(3 * cols);
                    let a = product::<_, 3>(&plain, &x3, cols, ActOrder::Natural, split);
                    let b = product::<_, 3>(&vbmi, &x3, cols, ActOrder::NaturalOffset, split);
                    assert_eq!(
                        a.map(|r| r.map(f32::to_bits)),
                        b.map(|r| r.map(f32::to_bits)),
                        "{what}, 3 tokens"
                    );
                }
            }
        }
    }
}
