//! Whether a role's stored SCRAM-SHA-256 verifier (`pg_authid.rolpassword`)
//! matches a password, computed as PostgreSQL does (RFC 5802, RFC 7677), so a
//! password is changed only when the Secret's differs.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, KeyInit, Mac};
use sha2::{Digest, Sha256};

const MAX_ITERATIONS: u32 = 100_000;

/// `SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>` holds
/// `password`. Anything else (MD5, plain text, malformed) does not.
pub fn verifies(password: &str, verifier: &str) -> bool {
    stored_key_of(password, verifier).unwrap_or(false)
}

fn stored_key_of(password: &str, verifier: &str) -> Option<bool> {
    let rest = verifier.strip_prefix("SCRAM-SHA-256$")?;
    let (parameters, keys) = rest.split_once('$')?;
    let (iterations, salt) = parameters.split_once(':')?;
    let (stored_key, _server_key) = keys.split_once(':')?;
    // PostgreSQL's default is 4096; a far larger count (PostgreSQL 16's
    // scram_iterations) would stall the watch loop: "no match", so the
    // password is set again with ours.
    let iterations: u32 = iterations
        .parse()
        .ok()
        .filter(|i| (1..=MAX_ITERATIONS).contains(i))?;
    let salt = STANDARD.decode(salt).ok()?;
    let stored_key = STANDARD.decode(stored_key).ok()?;
    // SASLprep when it applies; PostgreSQL falls back to the raw bytes.
    let prepared = stringprep::saslprep(password)
        .map(|p| p.into_owned())
        .unwrap_or_else(|_| password.to_owned());
    let salted = hi(prepared.as_bytes(), &salt, iterations);
    let client_key = hmac_sha256(&salted, b"Client Key");
    Some(Sha256::digest(client_key).as_slice() == stored_key.as_slice())
}

/// PBKDF2 with HMAC-SHA-256 and one block: RFC 5802's Hi().
fn hi(password: &[u8], salt: &[u8], iterations: u32) -> [u8; 32] {
    let mut first = salt.to_vec();
    first.extend_from_slice(&1u32.to_be_bytes());
    let mut previous = hmac_sha256(password, &first);
    let mut result = previous;
    for _ in 1..iterations {
        previous = hmac_sha256(password, &previous);
        for (r, p) in result.iter_mut().zip(previous) {
            *r ^= p;
        }
    }
    result
}

fn hmac_sha256(key: &[u8], message: &[u8]) -> [u8; 32] {
    // HMAC takes keys of any length: this cannot fail.
    let mut mac = match Hmac::<Sha256>::new_from_slice(key) {
        Ok(mac) => mac,
        Err(_) => return [0; 32],
    };
    mac.update(message);
    mac.finalize().into_bytes().into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_verifier_holds_its_password_only() {
        for password in ["s3cret", "päss wörd", ""] {
            let verifier = postgres_protocol::password::scram_sha_256(password.as_bytes());
            assert!(verifies(password, &verifier), "{password:?}");
            assert!(!verifies("other", &verifier), "{password:?}");
        }
    }

    #[test]
    fn anything_but_scram_does_not_verify() {
        for verifier in [
            "md5a3556571e93b0d20722ba62be61e8c2d",
            "s3cret",
            "SCRAM-SHA-256$0:AAAA$AAAA:AAAA",
            "SCRAM-SHA-256$4096:not base64$x:y",
            "SCRAM-SHA-256$4096",
            "SCRAM-SHA-256$4000000000:AAAA$AAAA:AAAA",
        ] {
            assert!(!verifies("s3cret", verifier), "{verifier}");
        }
    }
}
