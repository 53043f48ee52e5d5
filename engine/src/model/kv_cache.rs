//! An attention layer's KV cache, allocated once for the session's context. Per KV head:
//! keys in tiles of [`KEY_TILE`] positions, dimension-major (`[tile][head_dim][16]`: the
//! layout the score kernel of [`super::attend`] streams), and values position-major
//! (`[position][head_dim]`). The buffers are zero-initialised allocations, so the OS maps
//! their pages only as positions are written: a long context costs RSS only when used.
//!
//! Both buffers start on a page boundary ([`PageAligned`]). A key tile is `head_dim` rows
//! of 64 bytes and a store writes one slot of every row, so then every page a score
//! kernel reads holds a row already written. From the allocator's 16-byte offset, the
//! last row of a tile spilled onto the next tile's page: the scores read that untouched
//! page first, Linux mapped its shared zero page, and the next store there took a second
//! fault that copies the page and flushes the other cores' TLBs by interrupt (about 6 of a
//! SmolLM2-135M decode step's 17 faults).

use super::attend::KEY_TILE;

#[derive(Debug)]
pub struct LayerKv {
    kv_heads: usize,
    head_dim: usize,
    /// Positions of room, a multiple of [`KEY_TILE`].
    capacity: usize,
    k: PageAligned,
    v: PageAligned,
}

/// `len` zeroed `f32`s starting on a 4 KiB page boundary: a zeroed allocation one page
/// longer, entered at its first page boundary (the pages before it are never touched).
#[derive(Debug)]
struct PageAligned {
    buf: Vec<f32>,
    start: usize,
    len: usize,
}

impl PageAligned {
    const PAGE: usize = 4096;

    fn zeroed(len: usize) -> PageAligned {
        let pad = Self::PAGE / std::mem::size_of::<f32>();
        let buf = vec![0.0f32; len + pad];
        let start = buf.as_ptr().align_offset(Self::PAGE).min(pad);
        PageAligned { buf, start, len }
    }
}

impl std::ops::Deref for PageAligned {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        &self.buf[self.start..self.start + self.len]
    }
}

impl std::ops::DerefMut for PageAligned {
    fn deref_mut(&mut self) -> &mut [f32] {
        &mut self.buf[self.start..self.start + self.len]
    }
}

impl LayerKv {
    pub fn new(capacity: usize, kv_heads: usize, head_dim: usize) -> LayerKv {
        let capacity = capacity.next_multiple_of(KEY_TILE);
        let n = capacity * kv_heads * head_dim;
        LayerKv {
            kv_heads,
            head_dim,
            capacity,
            k: PageAligned::zeroed(n),
            v: PageAligned::zeroed(n),
        }
    }

    /// Writes the keys and values of positions `pos0..pos0+t` (`k`, `v` are
    /// `[t, kv_heads·head_dim]`).
    pub fn store(&mut self, pos0: usize, k: &[f32], v: &[f32]) {
        let (hd, width) = (self.head_dim, self.kv_heads * self.head_dim);
        let t = k.len() / width.max(1);
        assert!(k.len() == t * width && v.len() == t * width && pos0 + t <= self.capacity);
        let (keys, values) = (&mut *self.k, &mut *self.v);
        for (i, (kr, vr)) in k.chunks_exact(width).zip(v.chunks_exact(width)).enumerate() {
            let pos = pos0 + i;
            for h in 0..self.kv_heads {
                let head = h * self.capacity * hd;
                let tile = head + pos / KEY_TILE * hd * KEY_TILE + pos % KEY_TILE;
                for (d, &x) in kr[h * hd..(h + 1) * hd].iter().enumerate() {
                    keys[tile + d * KEY_TILE] = x;
                }
                let at = head + pos * hd;
                values[at..at + hd].copy_from_slice(&vr[h * hd..(h + 1) * hd]);
            }
        }
    }

    /// KV head `h`: its key tiles `[capacity/16, head_dim, 16]` and values
    /// `[capacity, head_dim]`.
    pub fn head(&self, h: usize) -> (&[f32], &[f32]) {
        let n = self.capacity * self.head_dim;
        (&self.k[h * n..(h + 1) * n], &self.v[h * n..(h + 1) * n])
    }

    /// The key of position `pos` in KV head `h` (the kernels read [`LayerKv::head`]).
    #[cfg(test)]
    fn key(&self, pos: usize, h: usize) -> Vec<f32> {
        let (tiles, _) = self.head(h);
        let at = pos / KEY_TILE * self.head_dim * KEY_TILE + pos % KEY_TILE;
        (0..self.head_dim)
            .map(|d| tiles[at + d * KEY_TILE])
            .collect()
    }

    /// Bytes one position costs (keys and values).
    pub fn bytes_per_position(&self) -> usize {
        self.kv_heads * self.head_dim * 2 * 4
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_start_on_a_page() {
        for (cap, heads, hd) in [(1, 1, 8), (37, 3, 40), (100, 2, 96)] {
            let kv = LayerKv::new(cap, heads, hd);
            let (k, v) = kv.head(0);
            assert_eq!(k.as_ptr() as usize % 4096, 0);
            assert_eq!(v.as_ptr() as usize % 4096, 0);
            for h in 0..heads {
                assert_eq!(kv.head(h).0.len(), kv.capacity * hd);
            }
        }
    }

    #[test]
    fn stored_keys_and_values_read_back() {
        let (heads, hd) = (3, 40);
        let mut kv = LayerKv::new(37, heads, hd);
        let width = heads * hd;
        let k: Vec<f32> = (0..5 * width).map(|i| i as f32).collect();
        let v: Vec<f32> = (0..5 * width).map(|i| -(i as f32)).collect();
        kv.store(14, &k, &v);
        for i in 0..5 {
            for h in 0..heads {
                let want = &k[i * width + h * hd..i * width + (h + 1) * hd];
                assert_eq!(kv.key(14 + i, h), want);
                let (_, values) = kv.head(h);
                assert_eq!(
                    &values[(14 + i) * hd..(15 + i) * hd],
                    &v[i * width + h * hd..i * width + (h + 1) * hd]
                );
            }
        }
    }
}
