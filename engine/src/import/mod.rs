//! Importers: Hugging Face safetensors checkpoints and GGUF files into tensors + arch,
//! written as CMF by `format::writer`.

pub mod ggml;
pub mod gguf;
pub mod gguf_import;
pub mod gguf_tokenizer;
pub mod hf;
#[cfg(test)]
mod hf_tests;
