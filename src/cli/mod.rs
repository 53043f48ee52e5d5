//! One module per subcommand. Each has an `Args` struct (clap derive) and
//! `pub fn run(args: &Args) -> CmdResult`; shared plumbing lives in [`common`].

pub mod bandwidth;
pub mod bench;
pub mod common;
pub mod compact;
pub mod convert;
pub mod defrag;
pub mod demo;
pub mod diff;
pub mod engine;
pub mod import_gguf;
pub mod info;
pub mod logits;
pub mod mask;
pub mod masks;
pub mod moe_defrag;
pub mod moe_mask;
pub mod ppl;
pub mod prompt;
pub mod requant;
pub mod route;
pub mod run;
pub mod sign;
pub mod skill;
pub mod skills;
pub mod tensors;
pub mod verify;
