//! `hash64` (spec §8, NOTES.md): murmur3 `fmix64` over little-endian 64-bit words with a
//! positional salt, XOR-folded. Hand-written because it is this format's own function:
//! no crate implements it. Bit-exact with the reference.

const SALT: u64 = 0x9E37_79B9_7F4A_7C15;

/// Folds the whole 8-byte words of `words` (its length a multiple of 8), the first at word
/// index `first`, into `acc`; returns the new accumulator and the next word index. The salt
/// `i·SALT` is kept as a running sum (an add instead of a multiply per word) and four words
/// are mixed per step, so the loop runs at the multipliers' throughput.
#[inline]
pub fn fold_words(acc: u64, first: u64, words: &[u8]) -> (u64, u64) {
    #[cfg(target_arch = "x86_64")]
    {
        if words.len() >= 256 && std::arch::is_x86_feature_detected!("avx512dq") {
            // SAFETY: the CPU has AVX-512F/DQ (checked just above).
            return unsafe { avx512::fold_words(acc, first, words) };
        }
    }
    fold_words_scalar(acc, first, words)
}

/// The scalar reference of [`fold_words`].
pub fn fold_words_scalar(mut acc: u64, first: u64, words: &[u8]) -> (u64, u64) {
    debug_assert_eq!(words.len() % 8, 0);
    let mut salt = first.wrapping_mul(SALT);
    let mut quads = words.chunks_exact(32);
    for q in &mut quads {
        let w = |k: usize| u64::from_le_bytes(q[8 * k..8 * k + 8].try_into().unwrap());
        let s1 = salt.wrapping_add(SALT);
        let s2 = s1.wrapping_add(SALT);
        let s3 = s2.wrapping_add(SALT);
        acc ^=
            (fmix64(w(0)) ^ salt) ^ (fmix64(w(1)) ^ s1) ^ (fmix64(w(2)) ^ s2) ^ (fmix64(w(3)) ^ s3);
        salt = s3.wrapping_add(SALT);
    }
    for c in quads.remainder().chunks_exact(8) {
        acc ^= fmix64(u64::from_le_bytes(c.try_into().unwrap())) ^ salt;
        salt = salt.wrapping_add(SALT);
    }
    (acc, first + (words.len() / 8) as u64)
}

/// Eight words at a time in 512-bit lanes: the multiplies are 64-bit lane products
/// (`vpmullq`), which scalar code can only do one at a time.
#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::{fold_words_scalar, SALT};
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx512f,avx512dq")]
    pub unsafe fn fold_words(acc: u64, first: u64, words: &[u8]) -> (u64, u64) {
        let c1 = _mm512_set1_epi64(0xFF51_AFD7_ED55_8CCDu64 as i64);
        let c2 = _mm512_set1_epi64(0xC4CE_B9FE_1A85_EC53u64 as i64);
        let step = _mm512_set1_epi64(SALT.wrapping_mul(8) as i64);
        let base = first.wrapping_mul(SALT);
        let lanes: [i64; 8] =
            std::array::from_fn(|k| base.wrapping_add(SALT.wrapping_mul(k as u64)) as i64);
        let mut salt = _mm512_loadu_si512(lanes.as_ptr() as *const _);
        let mut vacc = _mm512_setzero_si512();
        let mut blocks = words.chunks_exact(64);
        for b in &mut blocks {
            let mut x = _mm512_loadu_si512(b.as_ptr() as *const _);
            x = _mm512_xor_si512(x, _mm512_srli_epi64::<33>(x));
            x = _mm512_mullo_epi64(x, c1);
            x = _mm512_xor_si512(x, _mm512_srli_epi64::<33>(x));
            x = _mm512_mullo_epi64(x, c2);
            x = _mm512_xor_si512(x, _mm512_srli_epi64::<33>(x));
            vacc = _mm512_xor_si512(vacc, _mm512_xor_si512(x, salt));
            salt = _mm512_add_epi64(salt, step);
        }
        let mut out = [0u64; 8];
        _mm512_storeu_si512(out.as_mut_ptr() as *mut _, vacc);
        let acc = out.iter().fold(acc, |a, &l| a ^ l);
        let done = (words.len() - blocks.remainder().len()) as u64 / 8;
        fold_words_scalar(acc, first + done, blocks.remainder())
    }
}

#[inline(always)]
pub fn fmix64(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xFF51_AFD7_ED55_8CCD);
    x ^= x >> 33;
    x = x.wrapping_mul(0xC4CE_B9FE_1A85_EC53);
    x ^= x >> 33;
    x
}

/// hash64 of `bytes`.
pub fn hash64(bytes: &[u8]) -> u64 {
    let mut h = Hash64::new();
    h.update_aligned(bytes);
    h.finish()
}

/// Incremental hash64 for data that arrives in pieces (the writer streams tensors).
/// Words are positional, so pieces may have any length; a partial word is buffered.
#[derive(Clone, Debug, Default)]
pub struct Hash64 {
    acc: u64,
    words: u64,
    len: u64,
    tail: [u8; 8],
    tail_len: usize,
}

impl Hash64 {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn update(&mut self, mut bytes: &[u8]) {
        if self.tail_len > 0 {
            let take = (8 - self.tail_len).min(bytes.len());
            self.tail[self.tail_len..self.tail_len + take].copy_from_slice(&bytes[..take]);
            self.tail_len += take;
            self.len += take as u64;
            bytes = &bytes[take..];
            if self.tail_len < 8 {
                return;
            }
            let w = u64::from_le_bytes(self.tail);
            self.fold(w);
            self.tail_len = 0;
        }
        self.update_aligned(bytes);
    }

    /// Precondition: no buffered partial word.
    fn update_aligned(&mut self, bytes: &[u8]) {
        debug_assert_eq!(self.tail_len, 0);
        let whole = bytes.len() / 8 * 8;
        let (acc, words) = fold_words(self.acc, self.words, &bytes[..whole]);
        self.acc = acc;
        self.words = words;
        let chunks = bytes.chunks_exact(8);
        self.len += (bytes.len() - chunks.remainder().len()) as u64;
        let rem = chunks.remainder();
        self.tail[..rem.len()].copy_from_slice(rem);
        self.tail_len = rem.len();
        self.len += rem.len() as u64;
    }

    #[inline(always)]
    fn fold(&mut self, w: u64) {
        self.acc ^= fmix64(w) ^ self.words.wrapping_mul(SALT);
        self.words += 1;
    }

    pub fn finish(&self) -> u64 {
        let mut acc = self.acc;
        if self.tail_len > 0 {
            let mut t = [0u8; 8];
            t[..self.tail_len].copy_from_slice(&self.tail[..self.tail_len]);
            acc ^= fmix64(u64::from_le_bytes(t)) ^ self.words.wrapping_mul(SALT);
        }
        fmix64(acc ^ self.len)
    }
}

/// Lowercase 16-digit hex, as the header and the CLI print hashes.
pub fn hex16(h: u64) -> String {
    format!("{h:016x}")
}

/// Parses 16 hex digits (case-insensitive) into a hash.
pub fn parse_hex16(s: &str) -> Option<u64> {
    if s.len() != 16 {
        return None;
    }
    u64::from_str_radix(s, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reference_vectors() {
        assert_eq!(hash64(b""), 0);
        assert_eq!(hash64(b"CMF"), 0xb59aa39a074033ec);
        assert_eq!(hash64(b"0123456789abcdef"), 0x30d401310062ea9f);
        let all: Vec<u8> = (0..=255u8).collect();
        assert_eq!(hash64(&all), 0x9955bb876c0706bf);
    }

    #[test]
    fn simd_and_scalar_folds_agree() {
        let data: Vec<u8> = (0..4096u32 + 40)
            .map(|i| (i.wrapping_mul(2654435761) >> 11) as u8)
            .collect();
        for (first, len) in [
            (0u64, 4096usize),
            (7, 4096 + 40),
            (1 << 40, 256),
            (3, 264),
            (0, 0),
            (5, 8),
        ] {
            let w = &data[..len];
            assert_eq!(
                fold_words(0x1234, first, w),
                fold_words_scalar(0x1234, first, w),
                "first {first} len {len}"
            );
        }
    }

    #[test]
    fn incremental_equals_one_shot_for_any_split() {
        let data: Vec<u8> = (0..203u32).map(|i| (i * 7 + 3) as u8).collect();
        let want = hash64(&data);
        for a in 0..data.len() {
            for b in a..data.len().min(a + 17) {
                let mut h = Hash64::new();
                h.update(&data[..a]);
                h.update(&data[a..b]);
                h.update(&data[b..]);
                assert_eq!(h.finish(), want, "split {a}/{b}");
            }
        }
    }
}
