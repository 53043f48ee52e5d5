//! `cortiq sign FILE --key KEY`: a detached `<FILE>.sig` (§8.2). The key file holds a
//! 32-byte seed in hex and is created (mode 0600) when it does not exist. A file that
//! fails verification is not signed.

use std::path::PathBuf;

use cortiq_engine::format::signature;
use cortiq_engine::format::verify::{verify, VerifyOptions};
use serde_json::json;

use super::common::{emit, esc_path, open, print_json, CliError, CmdResult, Status};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Model file to sign.
    pub file: PathBuf,
    /// Signing key: a file with a 32-byte seed as 64 hex digits (created 0600 if missing).
    #[arg(long, value_name = "FILE")]
    pub key: PathBuf,
    /// One JSON document on stdout.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: &Args) -> CmdResult {
    let file = open(&args.file)?;
    // Signing vouches for the bytes: check the hash chain first.
    let report = verify(&file, &VerifyOptions::default(), &|_| {});
    if !report.ok {
        let first = report
            .first_failure
            .map(|f| f.link.describe())
            .unwrap_or_default();
        return Err(CliError {
            kind: "HashMismatch".into(),
            message: format!(
                "{} fails verification ({first}); refusing to sign it",
                args.file.display()
            ),
            code: 1,
        });
    }
    let (key, created) =
        signature::load_or_create_key(&args.key).map_err(|e| CliError::format(&args.key, &e))?;
    let sig = signature::sign_bytes(&key, file.bytes());
    let path = signature::write_sig(&args.file, &sig).map_err(|e| CliError::io(e.to_string()))?;
    if args.json {
        print_json(&json!({
            "ok": true,
            "signature": path,
            "pubkey": sig.pubkey,
            "sha256": sig.sha256,
            "key_created": created,
        }))?;
    } else {
        let mut out = String::new();
        if created {
            out.push_str(&format!(
                "created key {} (mode 0600)\n",
                esc_path(&args.key)
            ));
        }
        out.push_str(&format!(
            "signed {}\n  sha256 {}\n  pubkey {}\n  wrote  {}\n",
            esc_path(&args.file),
            sig.sha256,
            sig.pubkey,
            esc_path(&path)
        ));
        out.push_str("Others check it with: cortiq verify FILE --trusted-key <pubkey>\n");
        emit(&out)?;
    }
    Ok(Status::Success)
}
