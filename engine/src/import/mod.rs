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

pub(crate) use crate::format::file::release_pages;
