//! `cortiq verify FILE`: the whole integrity chain of §8.1 and the detached signature of
//! §8.2. Exit 0 when every link holds, 1 when any fails (or the file does not open).

use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use cortiq_engine::format::signature;
use cortiq_engine::format::verify::{
    english_list, verify, LinkStatus, VerifyEvent, VerifyOptions, VerifyReport,
};
use cortiq_engine::quant;
use serde_json::json;

use super::common::{
    emit, esc, esc_path, human_bytes, open, print_json, CliError, CmdResult, Status,
};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Model file (or one shard).
    pub file: PathBuf,
    /// A public key you trust: 64 hex digits, or a file holding them (a `.sig` or key
    /// file's `pubkey`). Repeatable. Added to the keys of the trusted-keys file
    /// (`<config dir>/cortiq/trusted_keys`, one hex key per line) and of
    /// $CORTIQ_TRUSTED_KEYS. With no trusted key at all, a valid signature is reported as
    /// by an untrusted key: anyone can re-sign a file with their own key.
    #[arg(long = "trusted-key", value_name = "HEX|FILE")]
    pub trusted_key: Vec<String>,
    /// Do not look for `<FILE>.sig`.
    #[arg(long)]
    pub no_signature: bool,
    /// Fail when a hash link has nothing recorded to check against (§8.1 lets old files
    /// zero their hashes: without this such a file verifies "OK, but … unhashed").
    #[arg(long)]
    pub strict: bool,
    /// One JSON document on stdout.
    #[arg(long)]
    pub json: bool,
}

/// A trusted key from hex or from a file that holds hex (a bare key, or JSON with `pubkey`).
fn parse_trusted(s: &str) -> Result<[u8; 32], CliError> {
    if let Some(k) = signature::parse_public_key(s) {
        return Ok(k);
    }
    let text = std::fs::read_to_string(s).map_err(|e| {
        CliError::usage(format!(
            "--trusted-key {s:?}: not 64 hex digits, and not a readable file ({e})"
        ))
    })?;
    if let Some(k) = signature::parse_public_key(&text) {
        return Ok(k);
    }
    serde_json::from_str::<serde_json::Value>(&text)
        .ok()
        .and_then(|v| {
            v.get("pubkey")
                .and_then(|p| p.as_str())
                .and_then(signature::parse_public_key)
        })
        .ok_or_else(|| {
            CliError::usage(format!(
                "--trusted-key {s:?}: the file holds no 32-byte public key in hex"
            ))
        })
}

pub fn run(args: &Args) -> CmdResult {
    // The trusted-keys file and $CORTIQ_TRUSTED_KEYS, then --trusted-key.
    let mut trust = crate::trust::TrustedKeys::load();
    if let Some(why) = &trust.refused {
        return Err(CliError::usage(why.clone()));
    }
    for s in &args.trusted_key {
        trust.add_cli(parse_trusted(s)?);
    }
    for p in &trust.problems {
        eprintln!("cortiq: warning: {}", esc(p));
    }
    let trusted = trust.keys.clone();
    let file = match open(&args.file) {
        Ok(f) => f,
        Err(e) if args.json && e.code == 1 => {
            // The contract's shape, with the §1.2 kind of why the file does not open.
            print_json(&json!({
                "ok": false,
                "error": {"kind": e.kind, "message": e.message},
                "failures": [],
            }))?;
            eprintln!("cortiq: {}: {}", e.kind, esc(&e.message));
            return Ok(Status::Failure);
        }
        Err(e) => return Err(e),
    };
    let opts = VerifyOptions {
        payload_check: Some(quant::payload_check),
        signature: !args.no_signature,
        trusted_keys: trusted,
        cancel: None,
        strict: args.strict,
        skip_tensors: false,
    };
    let show_progress = !args.json && std::io::stderr().is_terminal();
    let last_pct = AtomicU64::new(u64::MAX);
    let start = Instant::now();
    let report = verify(&file, &opts, &|ev| {
        if let (
            true,
            VerifyEvent::Progress {
                bytes_done,
                bytes_total,
            },
        ) = (show_progress, &ev)
        {
            let pct = if *bytes_total == 0 {
                100
            } else {
                bytes_done * 100 / bytes_total
            };
            if last_pct.swap(pct, Ordering::Relaxed) != pct {
                eprint!("\rhashing tensors {pct:3}%");
            }
        }
    });
    if show_progress {
        eprint!("\r                      \r");
    }
    let secs = start.elapsed().as_secs_f64();
    if args.json {
        print_json(&json_report(&report, args.strict, secs))?;
    } else {
        emit(&text_report(&args.file, &file, &report, secs))?;
    }
    Ok(if report.ok {
        Status::Success
    } else {
        Status::Failure
    })
}

fn json_report(r: &VerifyReport, strict: bool, secs: f64) -> serde_json::Value {
    let tensors_failed: Vec<&str> = r
        .failures
        .iter()
        .filter_map(|l| match &l.link {
            cortiq_engine::format::verify::Link::Tensor { name, .. } => Some(name.as_str()),
            _ => None,
        })
        .collect();
    json!({
        "ok": r.ok,
        "error": r.first_failure.as_ref().map(|f| json!({
            "kind": failure_kind(f),
            "message": format!("{}: {}", f.link.describe(), describe_status(&f.status)),
        })),
        "first_failure": r.first_failure,
        "failures": r.failures,
        "failed_tensors": tensors_failed,
        "links": r.links,
        "signature": r.signature,
        "unhashed": r.unhashed,
        "strong_digests": r.strong_digests,
        "strict": strict,
        "tensors_checked": r.tensors_checked,
        "bytes_hashed": r.bytes_hashed,
        "seconds": secs,
        "cancelled": r.cancelled,
    })
}

/// The kind a script can switch on: a hash that disagrees, a payload or `.sig` that does
/// not parse, a signature that fails or is by an untrusted key.
fn failure_kind(f: &cortiq_engine::format::verify::LinkResult) -> &'static str {
    match (&f.link, &f.status) {
        (cortiq_engine::format::verify::Link::Signature, _) => "Signature",
        (_, LinkStatus::Mismatch { .. }) => "HashMismatch",
        (_, LinkStatus::Unchecked { .. }) => "Unhashed",
        _ => "Parse",
    }
}

fn describe_status(s: &LinkStatus) -> String {
    match s {
        LinkStatus::Ok => "ok".into(),
        LinkStatus::Unchecked { reason } => format!("unchecked ({})", esc(reason)),
        LinkStatus::Mismatch { expected, actual } => {
            format!("hash mismatch: recorded {expected}, computed {actual}")
        }
        LinkStatus::Invalid { reason } => format!("invalid: {}", esc(reason)),
    }
}

fn text_report(
    path: &std::path::Path,
    file: &cortiq_engine::format::CmfFile,
    r: &VerifyReport,
    secs: f64,
) -> String {
    use cortiq_engine::format::verify::Link;
    let mut out = String::new();
    let mark = |s: &LinkStatus| match s {
        LinkStatus::Ok => "ok  ",
        LinkStatus::Unchecked { .. } => "--  ",
        _ => "FAIL",
    };
    out.push_str(&format!("verify {}\n", esc_path(path)));
    out.push_str(&format!(
        "  ok    envelope      (CMF v{}, features {})\n",
        file.envelope.version,
        cortiq_engine::format::feature::names(file.envelope.required_features).join("|")
    ));
    let mut tensor_ok = 0usize;
    let mut tensor_failed = Vec::new();
    for l in &r.links {
        match &l.link {
            Link::Tensor { .. } => {
                if l.status.is_failure() {
                    tensor_failed.push(l);
                } else {
                    tensor_ok += 1;
                }
            }
            Link::Signature => {}
            other => out.push_str(&format!(
                "  {}  {:<13} {}\n",
                mark(&l.status),
                other.describe(),
                if l.status == LinkStatus::Ok {
                    String::new()
                } else {
                    describe_status(&l.status)
                }
            )),
        }
    }
    let rate = if secs > 0.0 {
        r.bytes_hashed as f64 / secs / 1e9
    } else {
        0.0
    };
    out.push_str(&format!(
        "  {}  tensors       {}/{} match ({} in {:.3} s, {:.2} GB/s)\n",
        if tensor_failed.is_empty() {
            "ok  "
        } else {
            "FAIL"
        },
        tensor_ok,
        r.tensors_checked,
        human_bytes(r.bytes_hashed),
        secs,
        rate
    ));
    if r.strong_digests {
        out.push_str("  ok    strong digests BLAKE3 of every tensor and section, beside hash64\n");
    } else if !r.links.iter().any(|l| l.link == Link::StrongDigests) {
        out.push_str(
            "  --    strong digests none present: hash64 alone cannot see two swapped 8-byte \
             words (files this tool writes carry them)\n",
        );
    }
    for l in &tensor_failed {
        out.push_str(&format!(
            "                {}: {}\n",
            l.link.describe(),
            describe_status(&l.status)
        ));
    }
    if let Some(sig) = &r.signature {
        let st = sig.link_status();
        out.push_str(&format!(
            "  {}  signature     {}\n",
            mark(&st),
            esc(&sig.describe())
        ));
    }
    for w in &file.warnings {
        out.push_str(&format!("  warning: {}\n", esc(w)));
    }
    if r.ok && !r.unhashed.is_empty() {
        out.push_str(&format!(
            "OK, but {} {} unhashed: nothing recorded to check against (--strict fails this)\n",
            english_list(&r.unhashed),
            if r.unhashed.len() == 1 { "is" } else { "are" }
        ));
    } else if r.ok {
        out.push_str("OK\n");
    } else if let Some(f) = &r.first_failure {
        out.push_str(&format!(
            "FAILED: first broken link: {} ({}); {} failing link(s)\n",
            f.link.describe(),
            describe_status(&f.status),
            r.failures.len()
        ));
    } else {
        out.push_str("FAILED: cancelled\n");
    }
    out
}
