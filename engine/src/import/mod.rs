//! Importers: Hugging Face safetensors checkpoints and GGUF files into tensors + arch,
//! written as CMF by `format::writer`; and [`rewrite`], CMF files rewritten into new ones
//! (defrag, moe-defrag, moe-mask, requant).

pub mod bfield;
pub mod ggml;
pub mod gguf;
pub mod gguf_import;
pub mod gguf_tokenizer;
pub mod hf;
#[cfg(test)]
mod hf_tests;
pub mod rewrite;

/// The end of the batch of tensors starting at `start` (of `total`): as many as fit in
/// `budget` bytes by `cost`, at least one. Converters encode a batch on all threads and
/// write it in order, so this bounds what is held at once.
pub(crate) fn batch_end(
    start: usize,
    total: usize,
    budget: u64,
    cost: impl Fn(usize) -> u64,
) -> usize {
    let (mut end, mut bytes) = (start, 0u64);
    while end < total && (end == start || bytes.saturating_add(cost(end)) <= budget) {
        bytes = bytes.saturating_add(cost(end));
        end += 1;
    }
    end
}

/// Lets the kernel drop the mapped pages of `map[start..end]` once their contents were
/// copied out, so an importer's resident memory stays near the tensors in flight rather
/// than growing with the model. Only whole pages inside the range are released; the pages
/// are clean and file-backed, so a later read faults them back in.
pub(crate) fn release_pages(map: &memmap2::Mmap, start: u64, end: u64) {
    #[cfg(unix)]
    {
        const PAGE: u64 = 4096;
        let (a, b) = (start.next_multiple_of(PAGE), end / PAGE * PAGE);
        if b > a && b <= map.len() as u64 {
            // SAFETY: MADV_DONTNEED on a private read-only file mapping only discards
            // page-table entries; the data stays in the file and reads see the same bytes.
            let _ = unsafe {
                map.unchecked_advise_range(
                    memmap2::UncheckedAdvice::DontNeed,
                    a as usize,
                    (b - a) as usize,
                )
            };
        }
    }
    #[cfg(not(unix))]
    let _ = (map, start, end);
}
