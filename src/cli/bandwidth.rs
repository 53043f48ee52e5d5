//! `cortiq bench --bandwidth`: the machine's read bandwidth, the roofline a decode is
//! measured against (issue 11: bytes of weights per token × tokens/s over this figure).
//!
//! Each of `threads` threads reads its own slice of one buffer, every byte of every cache
//! line, with the widest loads the CPU has (AVX-512 or AVX2, chosen at run time: the
//! binary is built for baseline x86-64; elsewhere a portable loop of u64 lanes that the
//! compiler vectorises), folding them into a value that goes through `black_box`, so the
//! reads cannot be optimised away. The threads start each pass together (a barrier) and
//! the pass's time runs from that start to the last thread's end; the median pass is
//! reported, as bytes read / time:
//! - DRAM: a buffer much larger than any last-level cache (1 GiB by default), one read
//!   per pass;
//! - L3: 8 MiB (larger than the L2 of the cores), read 32 times per pass.
//!
//! The buffers are filled with non-zero bytes first, so that every page is backed (an
//! untouched page reads the shared zero page, from cache). They ask Linux for 2 MiB pages
//! (`MADV_HUGEPAGE`), as the model's mapping does (`CmfFile::open`): from 4 KiB pages the
//! probe walked the page tables where a decode did not, and on a Zen 4 VM it read less
//! than a decode streamed (Qwen2.5-Coder-0.5B `q8_2f` at 116% of it). How much of the
//! buffer Linux mapped that way is reported beside the figure.

use std::hint::black_box;
use std::sync::Barrier;
use std::time::Instant;

/// One cache line, so that a `Vec<Line>` is 64-byte aligned.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u64; 8]);

/// What [`read_bandwidth`] measured.
pub struct Reading {
    /// Bytes read per second.
    pub bytes_s: f64,
    /// How much of the buffer Linux mapped in 2 MiB pages (`AnonHugePages` of this
    /// process while it was alive), where the system says.
    pub huge_page_bytes: Option<u64>,
}

/// `n` lines of anonymous memory that ask for 2 MiB pages, line `i`'s words set to
/// `i | 1`.
struct Buffer(memmap2::MmapMut, usize);

impl Buffer {
    fn new(n: usize) -> std::io::Result<Buffer> {
        let len = n.checked_mul(64).ok_or(std::io::ErrorKind::OutOfMemory)?;
        let map = memmap2::MmapMut::map_anon(len)?;
        #[cfg(target_os = "linux")]
        let _ = map.advise(memmap2::Advice::HugePage);
        let mut b = Buffer(map, n);
        // SAFETY: the mapping is `64·n` bytes, writable and page-aligned (so aligned for
        // `Line`), and any bytes are a valid `Line`.
        let lines = unsafe { std::slice::from_raw_parts_mut(b.0.as_mut_ptr() as *mut Line, n) };
        for (i, l) in lines.iter_mut().enumerate() {
            *l = Line([i as u64 | 1; 8]);
        }
        Ok(b)
    }

    fn lines(&self) -> &[Line] {
        // SAFETY: as in `new`; the mapping lives as long as `self`.
        unsafe { std::slice::from_raw_parts(self.0.as_ptr() as *const Line, self.1) }
    }
}

/// A size field (given in kB) of a `/proc` file, in bytes.
pub(super) fn proc_bytes(path: &str, field: &str) -> Option<u64> {
    let s = std::fs::read_to_string(path).ok()?;
    let line = s.lines().find(|l| l.starts_with(field))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Read bandwidth: `threads` threads each reading their slice of a buffer of `bytes`
/// bytes `reps` times per pass, the median of `passes` passes.
pub fn read_bandwidth(
    bytes: usize,
    threads: usize,
    reps: usize,
    passes: usize,
) -> std::io::Result<Reading> {
    let threads = threads.max(1);
    let per_thread = (bytes / 64 / threads).max(1);
    let buffer = Buffer::new(per_thread * threads)?;
    let buf = buffer.lines();
    let huge_page_bytes = proc_bytes("/proc/self/smaps_rollup", "AnonHugePages:");
    let start = Barrier::new(threads + 1);
    let end = Barrier::new(threads + 1);
    let mut times = Vec::with_capacity(passes);
    std::thread::scope(|s| {
        for slice in buf.chunks(per_thread) {
            let (start, end) = (&start, &end);
            s.spawn(move || {
                // Once unmeasured: the slice's pages and TLB entries warmed.
                black_box(fold(slice));
                for _ in 0..passes {
                    start.wait();
                    for _ in 0..reps {
                        black_box(fold(black_box(slice)));
                    }
                    end.wait();
                }
            });
        }
        for _ in 0..passes {
            start.wait();
            let t = Instant::now();
            end.wait();
            times.push(t.elapsed().as_secs_f64());
        }
    });
    times.sort_by(f64::total_cmp);
    let read = (per_thread * threads * 64 * reps) as f64;
    Ok(Reading {
        bytes_s: read / times[times.len() / 2],
        huge_page_bytes,
    })
}

/// The load width the read loop uses on this CPU.
pub fn simd() -> &'static str {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            return "avx512";
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            return "avx2";
        }
    }
    "portable"
}

/// Every byte of `lines` folded into one value (xor), with the widest loads available.
fn fold(lines: &[Line]) -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512 F (checked just above).
            return unsafe { x86::fold_avx512(lines) };
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2 (checked just above).
            return unsafe { x86::fold_avx2(lines) };
        }
    }
    fold_portable(lines)
}

fn fold_portable(lines: &[Line]) -> u64 {
    let mut acc = [0u64; 8];
    for l in lines {
        for (a, v) in acc.iter_mut().zip(l.0) {
            *a ^= v;
        }
    }
    acc.iter().fold(0, |x, y| x ^ y)
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::Line;
    use std::arch::x86_64::*;

    /// Two lines per step into two accumulators: two 64-byte loads per line pair.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn fold_avx512(lines: &[Line]) -> u64 {
        let p = lines.as_ptr() as *const __m512i;
        let (mut a0, mut a1, mut a2, mut a3) = (
            _mm512_setzero_si512(),
            _mm512_setzero_si512(),
            _mm512_setzero_si512(),
            _mm512_setzero_si512(),
        );
        let n = lines.len();
        let mut i = 0;
        while i + 4 <= n {
            a0 = _mm512_xor_si512(a0, _mm512_load_si512(p.add(i)));
            a1 = _mm512_xor_si512(a1, _mm512_load_si512(p.add(i + 1)));
            a2 = _mm512_xor_si512(a2, _mm512_load_si512(p.add(i + 2)));
            a3 = _mm512_xor_si512(a3, _mm512_load_si512(p.add(i + 3)));
            i += 4;
        }
        while i < n {
            a0 = _mm512_xor_si512(a0, _mm512_load_si512(p.add(i)));
            i += 1;
        }
        let a = _mm512_xor_si512(_mm512_xor_si512(a0, a1), _mm512_xor_si512(a2, a3));
        let mut out = [0u64; 8];
        _mm512_storeu_si512(out.as_mut_ptr() as *mut __m512i, a);
        out.iter().fold(0, |x, y| x ^ y)
    }

    /// Two 32-byte loads per line, two lines per step into four accumulators.
    #[target_feature(enable = "avx2")]
    pub unsafe fn fold_avx2(lines: &[Line]) -> u64 {
        let p = lines.as_ptr() as *const __m256i;
        let (mut a0, mut a1, mut a2, mut a3) = (
            _mm256_setzero_si256(),
            _mm256_setzero_si256(),
            _mm256_setzero_si256(),
            _mm256_setzero_si256(),
        );
        let n = 2 * lines.len();
        let mut i = 0;
        while i + 4 <= n {
            a0 = _mm256_xor_si256(a0, _mm256_load_si256(p.add(i)));
            a1 = _mm256_xor_si256(a1, _mm256_load_si256(p.add(i + 1)));
            a2 = _mm256_xor_si256(a2, _mm256_load_si256(p.add(i + 2)));
            a3 = _mm256_xor_si256(a3, _mm256_load_si256(p.add(i + 3)));
            i += 4;
        }
        while i < n {
            a0 = _mm256_xor_si256(a0, _mm256_load_si256(p.add(i)));
            i += 1;
        }
        let a = _mm256_xor_si256(_mm256_xor_si256(a0, a1), _mm256_xor_si256(a2, a3));
        let mut out = [0u64; 4];
        _mm256_storeu_si256(out.as_mut_ptr() as *mut __m256i, a);
        out.iter().fold(0, |x, y| x ^ y)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every load width folds every byte: the same value as the portable loop, on line
    /// counts that are not a multiple of the unrolling.
    #[test]
    fn every_width_reads_every_line() {
        for n in [1usize, 3, 4, 5, 17] {
            let lines: Vec<Line> = (0..n)
                .map(|i| Line(std::array::from_fn(|j| (i * 8 + j + 1) as u64 * 0x9E37)))
                .collect();
            let want = fold_portable(&lines);
            assert_ne!(want, 0);
            assert_eq!(fold(&lines), want, "{n} lines");
            #[cfg(target_arch = "x86_64")]
            {
                if std::arch::is_x86_feature_detected!("avx2") {
                    // SAFETY: checked just above.
                    assert_eq!(unsafe { x86::fold_avx2(&lines) }, want, "avx2, {n} lines");
                }
                if std::arch::is_x86_feature_detected!("avx512f") {
                    // SAFETY: checked just above.
                    assert_eq!(
                        unsafe { x86::fold_avx512(&lines) },
                        want,
                        "avx512, {n} lines"
                    );
                }
            }
            // Flipping any one word changes the fold: no line is skipped.
            for k in 0..n * 8 {
                let mut l = lines.clone();
                l[k / 8].0[k % 8] ^= 1 << 7;
                assert_ne!(fold(&l), want, "word {k} of {n} lines");
            }
        }
    }
}
