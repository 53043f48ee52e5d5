//! Detached signatures (spec §8.2): `<model>.sig` holds JSON
//! `{alg: "ed25519-sha256", pubkey, sha256, sig}` — an Ed25519 signature over the file's
//! SHA-256 digest. The container is never rewritten.
//!
//! Trust is the user's: a signature is only "trusted" when its key is one the user named.
//! A signature that merely matches the key stored beside it proves nothing about who
//! signed (anyone can re-sign), and is reported as such.

use std::io::Write;
use std::path::{Path, PathBuf};

use ed25519_dalek::{Signature, Signer, SigningKey, Verifier, VerifyingKey};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::error::{FormatError, Result};
use super::verify::LinkStatus;

pub const ALG: &str = "ed25519-sha256";

/// The `.sig` document.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SigFile {
    pub alg: String,
    /// 32-byte public key, hex.
    pub pubkey: String,
    /// SHA-256 of the whole model file, hex.
    pub sha256: String,
    /// 64-byte Ed25519 signature over the 32 raw digest bytes, hex.
    pub sig: String,
}

/// The outcome of checking a detached signature.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum SignatureStatus {
    /// No `.sig` beside the file: not an error (§8.2).
    Unsigned,
    /// The signature is valid and its key is one the user trusts.
    Trusted { pubkey: String },
    /// Valid for the key stored in the `.sig`, and no trusted keys were given: it shows the
    /// file is unchanged since that key signed it, not who holds the key.
    SelfConsistent { pubkey: String },
    /// Valid, but by a key that is not among the trusted keys given.
    UntrustedKey { pubkey: String },
    /// Wrong digest, bad signature, malformed `.sig`.
    Invalid { reason: String },
}

impl SignatureStatus {
    pub fn link_status(&self) -> LinkStatus {
        match self {
            SignatureStatus::Unsigned => LinkStatus::Unchecked { reason: "no .sig beside the file".into() },
            SignatureStatus::Trusted { .. } => LinkStatus::Ok,
            SignatureStatus::SelfConsistent { pubkey } => LinkStatus::Unchecked {
                reason: format!(
                    "signature valid for its own key {pubkey}, which is untrusted (no trusted keys are set): it proves integrity, not authorship"
                ),
            },
            SignatureStatus::UntrustedKey { pubkey } => LinkStatus::Invalid {
                reason: format!("signed by {pubkey}, which is not among the trusted keys"),
            },
            SignatureStatus::Invalid { reason } => LinkStatus::Invalid { reason: reason.clone() },
        }
    }

    /// One line for people.
    pub fn describe(&self) -> String {
        match self {
            SignatureStatus::Unsigned => "unsigned (no .sig)".into(),
            SignatureStatus::Trusted { pubkey } => format!("valid, signed by trusted key {pubkey}"),
            SignatureStatus::SelfConsistent { pubkey } => format!(
                "valid, but by an UNTRUSTED key {pubkey}: no trusted keys are set (the trusted_keys file in the config directory, CORTIQ_TRUSTED_KEYS or --trusted-key name signers you trust)"
            ),
            SignatureStatus::UntrustedKey { pubkey } => format!("signed by UNTRUSTED key {pubkey}"),
            SignatureStatus::Invalid { reason } => format!("INVALID: {reason}"),
        }
    }
}

/// `<model>.sig` beside `model`.
pub fn sig_path(model: &Path) -> PathBuf {
    let mut s = model.as_os_str().to_owned();
    s.push(".sig");
    PathBuf::from(s)
}

fn hex32(s: &str) -> Option<[u8; 32]> {
    hex::decode(s.trim()).ok()?.try_into().ok()
}

/// Checks `<path>.sig` against the file's bytes.
pub fn check_detached(path: &Path, bytes: &[u8], trusted: &[[u8; 32]]) -> SignatureStatus {
    let sp = sig_path(path);
    let text = match std::fs::read(&sp) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return SignatureStatus::Unsigned,
        Err(e) => {
            return SignatureStatus::Invalid {
                reason: format!("cannot read {}: {e}", sp.display()),
            }
        }
    };
    check_sig_bytes(&text, bytes, trusted)
}

/// Checks a `.sig` document against the model bytes.
pub fn check_sig_bytes(sig_json: &[u8], bytes: &[u8], trusted: &[[u8; 32]]) -> SignatureStatus {
    let invalid = |reason: String| SignatureStatus::Invalid { reason };
    let sig: SigFile = match serde_json::from_slice(sig_json) {
        Ok(s) => s,
        Err(e) => return invalid(format!("the .sig is not valid JSON of the §8.2 shape: {e}")),
    };
    if sig.alg != ALG {
        return invalid(format!(
            "algorithm {:?} is not {ALG}",
            super::escape_str(&sig.alg)
        ));
    }
    let Some(pk) = hex32(&sig.pubkey) else {
        return invalid("pubkey is not 32 bytes of hex".into());
    };
    let Ok(vk) = VerifyingKey::from_bytes(&pk) else {
        return invalid("pubkey is not a valid Ed25519 point".into());
    };
    let Some(sig_bytes) = hex::decode(sig.sig.trim())
        .ok()
        .and_then(|b| <[u8; 64]>::try_from(b).ok())
    else {
        return invalid("sig is not 64 bytes of hex".into());
    };
    let digest: [u8; 32] = Sha256::digest(bytes).into();
    if hex::encode(digest) != sig.sha256.trim().to_ascii_lowercase() {
        return invalid(format!(
            "the file's SHA-256 is {} but the .sig was made for {}",
            hex::encode(digest),
            super::escape_str(&sig.sha256)
        ));
    }
    if vk
        .verify(&digest, &Signature::from_bytes(&sig_bytes))
        .is_err()
    {
        return invalid("the Ed25519 signature does not verify for its public key".into());
    }
    let pubkey = hex::encode(pk);
    if trusted.is_empty() {
        SignatureStatus::SelfConsistent { pubkey }
    } else if trusted.contains(&pk) {
        SignatureStatus::Trusted { pubkey }
    } else {
        SignatureStatus::UntrustedKey { pubkey }
    }
}

/// Loads a signing key seed (32 bytes as hex) from `key_path`, creating it with mode 0600
/// when it does not exist. Returns the key and whether it was created. A key file that
/// others can read or write is refused (as ssh refuses such a private key): the key may
/// already be known to them, and a signature by it proves nothing.
pub fn load_or_create_key(key_path: &Path) -> Result<(SigningKey, bool)> {
    #[cfg(unix)]
    if let Ok(meta) = std::fs::metadata(key_path) {
        use std::os::unix::fs::PermissionsExt;
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(FormatError::io(
                format!("key file {}", key_path.display()),
                std::io::Error::new(
                    std::io::ErrorKind::PermissionDenied,
                    format!(
                        "others can read or write it (mode {mode:03o}); a signing key must be \
                         private: chmod 600 it, or make a new one"
                    ),
                ),
            ));
        }
    }
    match std::fs::read_to_string(key_path) {
        Ok(text) => {
            let seed = hex32(&text).ok_or_else(|| {
                FormatError::Parse(format!(
                    "{}: a key file holds a 32-byte seed as 64 hex digits",
                    key_path.display()
                ))
            })?;
            Ok((SigningKey::from_bytes(&seed), false))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let mut seed = [0u8; 32];
            getrandom::fill(&mut seed).map_err(|e| {
                FormatError::io("random seed", std::io::Error::other(e.to_string()))
            })?;
            let mut opts = std::fs::OpenOptions::new();
            opts.write(true).create_new(true);
            #[cfg(unix)]
            {
                use std::os::unix::fs::OpenOptionsExt;
                opts.mode(0o600);
            }
            let mut f = opts
                .open(key_path)
                .map_err(|e| FormatError::io(format!("create {}", key_path.display()), e))?;
            f.write_all(format!("{}\n", hex::encode(seed)).as_bytes())
                .and_then(|_| f.sync_all())
                .map_err(|e| FormatError::io(format!("write {}", key_path.display()), e))?;
            Ok((SigningKey::from_bytes(&seed), true))
        }
        Err(e) => Err(FormatError::io(format!("read {}", key_path.display()), e)),
    }
}

/// Public key of a key file, or a key given as 64 hex digits.
pub fn parse_public_key(s: &str) -> Option<[u8; 32]> {
    hex32(s)
}

/// Signs `bytes` and returns the `.sig` document.
pub fn sign_bytes(key: &SigningKey, bytes: &[u8]) -> SigFile {
    let digest: [u8; 32] = Sha256::digest(bytes).into();
    let sig = key.sign(&digest);
    SigFile {
        alg: ALG.into(),
        pubkey: hex::encode(key.verifying_key().to_bytes()),
        sha256: hex::encode(digest),
        sig: hex::encode(sig.to_bytes()),
    }
}

/// Writes `<model>.sig` (to a temporary file renamed into place). Returns its path.
pub fn write_sig(model: &Path, sig: &SigFile) -> Result<PathBuf> {
    let path = sig_path(model);
    let mut text = serde_json::to_string_pretty(sig).expect("SigFile serializes");
    text.push('\n');
    super::writer::write_atomic(&path, text.as_bytes())?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sign_then_check_and_trust() {
        let key = SigningKey::from_bytes(&[7u8; 32]);
        let data = b"model bytes".to_vec();
        let sig = serde_json::to_vec(&sign_bytes(&key, &data)).unwrap();
        let pk = key.verifying_key().to_bytes();
        assert!(matches!(
            check_sig_bytes(&sig, &data, &[]),
            SignatureStatus::SelfConsistent { .. }
        ));
        assert!(matches!(
            check_sig_bytes(&sig, &data, &[pk]),
            SignatureStatus::Trusted { .. }
        ));
        assert!(matches!(
            check_sig_bytes(&sig, &data, &[[1u8; 32]]),
            SignatureStatus::UntrustedKey { .. }
        ));
        assert!(matches!(
            check_sig_bytes(&sig, b"model byteS", &[]),
            SignatureStatus::Invalid { .. }
        ));
        assert!(matches!(
            check_sig_bytes(b"{", &data, &[]),
            SignatureStatus::Invalid { .. }
        ));
    }
}
