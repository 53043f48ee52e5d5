//! Importers: Hugging Face safetensors checkpoints and GGUF files into tensors + arch,
//! written as CMF by `format::writer`.

pub mod gguf;
pub mod hf;
