//! An attention layer's KV cache: keys and values of every position `[capacity, kv_heads·head_dim]`,
//! allocated once for the session's context. The buffers are zero-initialised
//! allocations, so the OS maps their pages only as positions are written: a long context
//! costs RSS only when it is used.

#[derive(Debug)]
pub struct LayerKv {
    width: usize,
    head_dim: usize,
    k: Vec<f32>,
    v: Vec<f32>,
}

impl LayerKv {
    pub fn new(capacity: usize, kv_heads: usize, head_dim: usize) -> LayerKv {
        let width = kv_heads * head_dim;
        LayerKv {
            width,
            head_dim,
            k: vec![0.0; capacity * width],
            v: vec![0.0; capacity * width],
        }
    }

    /// Writes the keys and values of positions `pos0..pos0+t` (`k`, `v` are [t, width]).
    pub fn store(&mut self, pos0: usize, k: &[f32], v: &[f32]) {
        let a = pos0 * self.width;
        self.k[a..a + k.len()].copy_from_slice(k);
        self.v[a..a + v.len()].copy_from_slice(v);
    }

    pub fn key(&self, pos: usize, kv_head: usize) -> &[f32] {
        let a = pos * self.width + kv_head * self.head_dim;
        &self.k[a..a + self.head_dim]
    }

    /// Bytes one position costs (keys and values).
    pub fn bytes_per_position(&self) -> usize {
        self.width * 2 * 4
    }

    pub fn value(&self, pos: usize, kv_head: usize) -> &[f32] {
        let a = pos * self.width + kv_head * self.head_dim;
        &self.v[a..a + self.head_dim]
    }
}
