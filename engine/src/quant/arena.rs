//! Memory for weights the engine holds in another form than the file's (`q1t`'s rows
//! repacked at load, [`super::q1t_planes`]): slabs carved from anonymous mappings of at
//! least [`CHUNK`] bytes, 2 MiB-aligned and advised for transparent huge pages.
//!
//! Why: decode streams every weight once per token, and in a VM each 4 KiB page of that
//! stream costs a nested page walk; the file's mapping is advised the same way
//! (`format::file`). The global allocator gives neither 2 MiB alignment nor the advice,
//! and a model's repacked matrices are mostly a few hundred KiB each (SmolLM2-135M's
//! 576-wide projections), too small for a huge page of their own: carved side by side
//! from one chunk, they share them. (Measured with the rows in `Vec`s, SmolLM2-135M's
//! `q1t` decode at 163–200 tok/s spent its largest share on a prefetch of the rows.)
//! A bump allocator crate would allocate from the global heap, so this is written out:
//! a chunk lives while any slab of it does (`Arc`), and slabs are never reused.

use std::sync::{Arc, Mutex};

/// Smallest chunk mapped (a larger request gets a chunk of its own size). Untouched
/// pages cost no memory; a touched 2 MiB page is resident whole.
const CHUNK: usize = 32 << 20;
/// Huge page size (x86-64, and AArch64 with 4 KiB base pages).
const HUGE: usize = 2 << 20;
/// Alignment of every slab (a cache line).
const ALIGN: usize = 64;

/// One anonymous mapping; `ptr` is its first 2 MiB boundary.
struct Chunk {
    _map: memmap2::MmapMut,
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the chunk's bytes are only reached through slabs, each the sole owner of its
// disjoint range (see `Slab::bytes_mut`).
unsafe impl Send for Chunk {}
unsafe impl Sync for Chunk {}

impl Chunk {
    fn map(len: usize) -> Option<Chunk> {
        let mut map = memmap2::MmapMut::map_anon(len + HUGE).ok()?;
        #[cfg(target_os = "linux")]
        let _ = map.advise(memmap2::Advice::HugePage);
        let base = map.as_mut_ptr();
        let skip = base.align_offset(HUGE);
        Some(Chunk {
            // SAFETY: `skip < HUGE`, inside the `len + HUGE` bytes mapped.
            ptr: unsafe { base.add(skip) },
            _map: map,
            len,
        })
    }
}

enum Backing {
    Chunk(Arc<Chunk>),
    /// Where no mapping could be made: the global heap (u64s, for the alignment).
    Heap(Vec<u64>),
}

/// `len` zeroed bytes, 64-byte aligned (8 on the heap fallback), owned alone.
pub(crate) struct Slab {
    backing: Backing,
    off: usize,
    len: usize,
}

impl std::fmt::Debug for Slab {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self.backing {
            Backing::Chunk(_) => "chunk",
            Backing::Heap(_) => "heap",
        };
        write!(f, "Slab({} bytes, {kind})", self.len)
    }
}

impl Slab {
    pub(crate) fn bytes(&self) -> &[u8] {
        match &self.backing {
            // SAFETY: `off + len` lies inside the chunk (`alloc`), and no `&mut` to this
            // range exists while `&self` is borrowed.
            Backing::Chunk(c) => unsafe {
                std::slice::from_raw_parts(c.ptr.add(self.off), self.len)
            },
            // SAFETY: a `u64` buffer viewed as its bytes (any bit pattern is valid).
            Backing::Heap(v) => unsafe {
                std::slice::from_raw_parts(v.as_ptr() as *const u8, self.len)
            },
        }
    }

    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        match &mut self.backing {
            // SAFETY: as `bytes`; the slab is the only owner of its range (slabs are
            // carved once, never cloned), so this is the only reference to it.
            Backing::Chunk(c) => unsafe {
                std::slice::from_raw_parts_mut(c.ptr.add(self.off), self.len)
            },
            // SAFETY: as in `bytes` (`len ≤ 8·v.len()`, see `alloc`).
            Backing::Heap(v) => unsafe {
                std::slice::from_raw_parts_mut(v.as_mut_ptr() as *mut u8, self.len)
            },
        }
    }
}

/// The chunk slabs are carved from, and how much of it is taken.
static CURRENT: Mutex<Option<(Arc<Chunk>, usize)>> = Mutex::new(None);

/// A zeroed slab of `len` bytes.
pub(crate) fn alloc(len: usize) -> Slab {
    let want = len.next_multiple_of(ALIGN);
    let mut cur = CURRENT.lock().unwrap_or_else(|e| e.into_inner());
    let fits = matches!(&*cur, Some((c, used)) if c.len - used >= want);
    if !fits {
        match Chunk::map(want.max(CHUNK).next_multiple_of(HUGE)) {
            Some(c) => *cur = Some((Arc::new(c), 0)),
            None => {
                return Slab {
                    backing: Backing::Heap(vec![0u64; len.div_ceil(8)]),
                    off: 0,
                    len,
                }
            }
        }
    }
    let (chunk, used) = cur.as_mut().expect("a chunk was just mapped");
    let slab = Slab {
        backing: Backing::Chunk(chunk.clone()),
        off: *used,
        len,
    };
    *used += want;
    slab
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Slabs are zeroed, aligned, disjoint, and keep their bytes while others are carved
    /// (in one chunk and across chunks, a large one in a chunk of its own).
    #[test]
    fn slabs_are_disjoint_and_keep_their_bytes() {
        let sizes = [1usize, 100, 4096, 5 << 20, 3, CHUNK + 12345, 77];
        let mut slabs: Vec<Slab> = sizes.iter().map(|&n| alloc(n)).collect();
        for (i, s) in slabs.iter_mut().enumerate() {
            assert_eq!(s.bytes().len(), sizes[i]);
            assert!(s.bytes().iter().all(|&b| b == 0), "slab {i} zeroed");
            assert_eq!(s.bytes().as_ptr() as usize % 8, 0, "slab {i} aligned");
            s.bytes_mut().fill(i as u8 + 1);
        }
        for (i, s) in slabs.iter().enumerate() {
            assert!(
                s.bytes().iter().all(|&b| b == i as u8 + 1),
                "slab {i} kept its bytes"
            );
        }
        let spans: Vec<(usize, usize)> = slabs
            .iter()
            .map(|s| (s.bytes().as_ptr() as usize, s.bytes().len()))
            .collect();
        for (i, a) in spans.iter().enumerate() {
            for b in &spans[i + 1..] {
                assert!(a.0 + a.1 <= b.0 || b.0 + b.1 <= a.0, "slabs overlap");
            }
        }
    }
}
