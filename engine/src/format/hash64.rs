//! `hash64` (spec §8, NOTES.md): murmur3 `fmix64` over little-endian 64-bit words with a
//! positional salt, XOR-folded. Hand-written because it is this format's own function:
//! no crate implements it. Bit-exact with the reference.

const SALT: u64 = 0x9E37_79B9_7F4A_7C15;

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
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let w = u64::from_le_bytes(c.try_into().unwrap());
            self.fold(w);
        }
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
