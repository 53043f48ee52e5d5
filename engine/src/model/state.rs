//! A session's per-layer state: keys and values for attention layers ([`LayerKv`]), the
//! O(1) recurrent state for Gated DeltaNet layers ([`RecurrentState`]), and how many
//! positions it covers.
//!
//! KV state rolls back by forgetting positions; recurrent state cannot, so it is saved:
//! - [`ModelState::snapshot_into`] / [`ModelState::restore`]: a copy of every recurrent
//!   layer at one position (a session keeps one at the end of each prompt, so a
//!   regenerated answer reuses the prompt);
//! - [`ModelState::keep_history`]: the next forward of at most `n` tokens also records each
//!   recurrent layer's state after every token, so that [`ModelState::rollback`] can return
//!   to any of those positions (speculative decoding's rejected drafts).

pub use super::kv_cache::LayerKv;

/// A Gated DeltaNet layer's state: the causal conv's last `kernel − 1` inputs and the
/// delta rule's per-head `dk × dv` matrix.
#[derive(Clone, Debug)]
pub struct RecurrentState {
    /// `[kernel − 1, conv_dim]`, oldest first.
    pub conv: Vec<f32>,
    /// `[v_heads, dk, dv]`.
    pub s: Vec<f32>,
    /// States after each token of the last forward, while history is kept (the buffers
    /// stay allocated between uses).
    history: Vec<(Vec<f32>, Vec<f32>)>,
    history_len: usize,
    recording: bool,
}

impl RecurrentState {
    pub fn new(conv_len: usize, s_len: usize) -> RecurrentState {
        RecurrentState {
            conv: vec![0.0; conv_len],
            s: vec![0.0; s_len],
            history: Vec::new(),
            history_len: 0,
            recording: false,
        }
    }

    pub fn bytes(&self) -> usize {
        (self.conv.len() + self.s.len()) * 4
    }

    fn clear(&mut self) {
        self.conv.fill(0.0);
        self.s.fill(0.0);
        self.history_len = 0;
        self.recording = false;
    }

    /// Whether the layer should record its state after each token of this forward.
    pub fn recording(&self) -> bool {
        self.recording
    }

    /// Records the current state as "after token `i` of this forward" (`i` from 0).
    pub fn record(&mut self, i: usize) {
        if !self.recording {
            return;
        }
        if let Some((c, s)) = self.history.get_mut(i) {
            c.copy_from_slice(&self.conv);
            s.copy_from_slice(&self.s);
            self.history_len = i + 1;
        }
    }
}

#[derive(Debug)]
pub enum LayerState {
    Kv(LayerKv),
    Recurrent(RecurrentState),
}

impl LayerState {
    pub fn kv(&mut self) -> &mut LayerKv {
        match self {
            LayerState::Kv(kv) => kv,
            LayerState::Recurrent(_) => panic!("an attention layer was given recurrent state"),
        }
    }

    pub fn recurrent(&mut self) -> &mut RecurrentState {
        match self {
            LayerState::Recurrent(r) => r,
            LayerState::Kv(_) => panic!("a linear-attention layer was given a KV cache"),
        }
    }
}

/// Every layer's state, and how many positions it covers.
#[derive(Debug)]
pub struct ModelState {
    pub layers: Vec<LayerState>,
    /// Positions the KV layers have room for (the context limit concerns KV only).
    pub capacity: usize,
    /// Positions `0..len` are in the state.
    pub len: usize,
    /// Where the recorded history starts (the `len` before the recorded forward).
    history_from: Option<usize>,
}

/// Recurrent layers' state at one position (see [`ModelState::snapshot_into`]).
#[derive(Clone, Debug, Default)]
pub struct StateSnapshot {
    pub len: usize,
    layers: Vec<Option<(Vec<f32>, Vec<f32>)>>,
}

impl ModelState {
    pub fn new(layers: Vec<LayerState>, capacity: usize) -> ModelState {
        ModelState {
            layers,
            capacity,
            len: 0,
            history_from: None,
        }
    }

    /// Whether any layer has recurrent state (it can only roll back to saved positions).
    pub fn has_recurrent(&self) -> bool {
        self.layers
            .iter()
            .any(|l| matches!(l, LayerState::Recurrent(_)))
    }

    /// Bytes of the recurrent layers' state (constant in context length).
    pub fn recurrent_bytes(&self) -> usize {
        self.layers
            .iter()
            .map(|l| match l {
                LayerState::Recurrent(r) => r.bytes(),
                LayerState::Kv(_) => 0,
            })
            .sum()
    }

    /// Bytes the KV layers hold for `positions` positions.
    pub fn kv_bytes(&self, positions: usize) -> usize {
        self.layers
            .iter()
            .map(|l| match l {
                LayerState::Kv(kv) => kv.bytes_per_position() * positions,
                LayerState::Recurrent(_) => 0,
            })
            .sum()
    }

    /// Forgets positions from `len` on. With recurrent layers only `len == self.len` (a
    /// no-op) and `len == 0` (a fresh state) are possible; anything else needs a
    /// snapshot or history, so it returns false and changes nothing.
    pub fn truncate(&mut self, len: usize) -> bool {
        if len >= self.len {
            return true;
        }
        if len == 0 {
            for l in &mut self.layers {
                if let LayerState::Recurrent(r) = l {
                    r.clear();
                }
            }
            self.len = 0;
            self.history_from = None;
            return true;
        }
        if self.has_recurrent() {
            return false;
        }
        self.len = len;
        true
    }

    /// Copies the recurrent layers' state at the current position into `snap` (its
    /// buffers are reused).
    pub fn snapshot_into(&self, snap: &mut StateSnapshot) {
        snap.len = self.len;
        snap.layers.resize(self.layers.len(), None);
        for (dst, l) in snap.layers.iter_mut().zip(&self.layers) {
            match l {
                LayerState::Recurrent(r) => match dst {
                    Some((c, s)) => {
                        c.clone_from(&r.conv);
                        s.clone_from(&r.s);
                    }
                    None => *dst = Some((r.conv.clone(), r.s.clone())),
                },
                LayerState::Kv(_) => *dst = None,
            }
        }
    }

    /// Returns to a snapshot taken earlier in this state's life. The KV positions up to
    /// `snap.len` must not have changed since (the session guarantees it: they hold the
    /// same tokens).
    pub fn restore(&mut self, snap: &StateSnapshot) {
        assert!(snap.len <= self.capacity, "snapshot beyond the capacity");
        for (l, src) in self.layers.iter_mut().zip(&snap.layers) {
            if let (LayerState::Recurrent(r), Some((c, s))) = (l, src) {
                r.conv.copy_from_slice(c);
                r.s.copy_from_slice(s);
                r.history_len = 0;
            }
        }
        self.len = snap.len;
        self.history_from = None;
    }

    /// The next forward (of at most `n` tokens) records every recurrent layer's state
    /// after each of its tokens, for [`ModelState::rollback`]. Buffers are allocated on
    /// the first call and reused.
    pub fn keep_history(&mut self, n: usize) {
        for l in &mut self.layers {
            if let LayerState::Recurrent(r) = l {
                while r.history.len() < n {
                    r.history
                        .push((vec![0.0; r.conv.len()], vec![0.0; r.s.len()]));
                }
                r.history_len = 0;
                r.recording = true;
            }
        }
        self.history_from = Some(self.len);
    }

    /// Stops recording history (the forwards after it run at full speed); the buffers
    /// stay for the next [`ModelState::keep_history`].
    pub fn drop_history(&mut self) {
        for l in &mut self.layers {
            if let LayerState::Recurrent(r) = l {
                r.recording = false;
                r.history_len = 0;
            }
        }
        self.history_from = None;
    }

    /// Goes back to `len` positions, within the forward recorded since
    /// [`ModelState::keep_history`] (or anywhere, without recurrent layers). Returns false
    /// if that position was not recorded.
    pub fn rollback(&mut self, len: usize) -> bool {
        if len >= self.len {
            return len == self.len;
        }
        if !self.has_recurrent() {
            self.len = len;
            return true;
        }
        let Some(from) = self.history_from else {
            return false;
        };
        if len < from {
            return false;
        }
        if len == from {
            // Nothing of the recorded forward stays: back to before it, which was recorded
            // only if the caller took a snapshot; the history holds states after tokens.
            return false;
        }
        let i = len - from - 1;
        for l in &mut self.layers {
            if let LayerState::Recurrent(r) = l {
                if i >= r.history_len {
                    return false;
                }
            }
        }
        for l in &mut self.layers {
            if let LayerState::Recurrent(r) = l {
                let (c, s) = &r.history[i];
                r.conv.copy_from_slice(c);
                r.s.copy_from_slice(s);
            }
        }
        self.len = len;
        true
    }
}
