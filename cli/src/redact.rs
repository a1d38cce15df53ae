//! Secret values kept out of support bundles: Secrets appear by name, type
//! and keys only, and any of their values found verbatim (or base64-encoded)
//! in an object or a log is replaced by `<redacted>`.

use base64::Engine as _;
use cairn_api::database::instance::{DATABASE_KEY, OWNER_KEY, REPLICATION_USER_KEY};
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use serde::Serialize;

pub const REDACTED: &str = "<redacted>";

/// Keys whose values are not secret (names, public certificates): left
/// readable, as a user name like `app` redacted everywhere would make a
/// bundle unreadable.
const PUBLIC_KEYS: &[&str] = &[
    DATABASE_KEY,
    OWNER_KEY,
    REPLICATION_USER_KEY,
    "ca.crt",
    "tls.crt",
];

/// Values shorter than this are not searched for: too likely to be part of
/// unrelated text (`on`, `5432`); generated passwords are far longer.
pub const MIN_LENGTH: usize = 6;

/// What a bundle says of a Secret.
#[derive(Serialize, Debug, Clone, PartialEq)]
pub struct SecretSummary {
    pub name: String,
    #[serde(rename = "type")]
    pub type_: Option<String>,
    pub keys: Vec<String>,
}

pub fn summary(secret: &Secret) -> SecretSummary {
    let mut keys: Vec<String> = secret
        .data
        .iter()
        .flat_map(|d| d.keys().cloned())
        .chain(secret.string_data.iter().flat_map(|d| d.keys().cloned()))
        .collect();
    keys.sort();
    keys.dedup();
    SecretSummary {
        name: secret.name_any(),
        type_: secret.type_.clone(),
        keys,
    }
}

/// Replaces every secret value in text.
#[derive(Debug, Default, Clone)]
pub struct Redactor {
    /// Longest first, so a value containing another is replaced whole.
    needles: Vec<String>,
}

impl Redactor {
    pub fn new(secrets: &[Secret]) -> Self {
        let mut needles = Vec::new();
        for secret in secrets {
            let values = secret
                .data
                .iter()
                .flatten()
                .map(|(k, v)| (k, String::from_utf8_lossy(&v.0).into_owned()))
                .chain(
                    secret
                        .string_data
                        .iter()
                        .flatten()
                        .map(|(k, v)| (k, v.clone())),
                );
            for (key, value) in values {
                if PUBLIC_KEYS.contains(&key.as_str()) {
                    continue;
                }
                let mut forms = vec![
                    value.clone(),
                    base64::engine::general_purpose::STANDARD.encode(value.as_bytes()),
                ];
                // A multi-line value (a private key) may be logged line by line.
                if value.contains('\n') {
                    forms.extend(value.lines().map(|l| l.trim().to_owned()));
                }
                needles.extend(forms.into_iter().filter(|f| f.len() >= MIN_LENGTH));
            }
        }
        needles.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        needles.dedup();
        Self { needles }
    }

    /// How many values it looks for.
    pub fn len(&self) -> usize {
        self.needles.len()
    }

    pub fn scrub(&self, text: &str) -> String {
        let mut text = text.to_owned();
        for needle in &self.needles {
            if text.contains(needle.as_str()) {
                text = text.replace(needle.as_str(), REDACTED);
            }
        }
        text
    }

    /// Bytes as text (invalid UTF-8 replaced), scrubbed.
    pub fn scrub_bytes(&self, bytes: &[u8]) -> Vec<u8> {
        self.scrub(&String::from_utf8_lossy(bytes)).into_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;
    use std::collections::BTreeMap;

    fn secret(name: &str, data: &[(&str, &str)]) -> Secret {
        let mut secret = Secret::default();
        secret.metadata.name = Some(name.to_owned());
        secret.type_ = Some("Opaque".to_owned());
        secret.data = Some(
            data.iter()
                .map(|(k, v)| ((*k).to_owned(), ByteString(v.as_bytes().to_vec())))
                .collect::<BTreeMap<_, _>>(),
        );
        secret
    }

    #[test]
    fn passwords_are_scrubbed_verbatim_and_base64_and_names_are_kept() {
        let credentials = secret(
            "web-credentials",
            &[
                ("username", "app"),
                ("database", "shop"),
                ("password", "S3cr3tPassw0rd"),
                ("superuser-password", "AnotherSecretOne"),
            ],
        );
        let redactor = Redactor::new(std::slice::from_ref(&credentials));
        let log = "connecting as app to shop with S3cr3tPassw0rd; env \
                   UzNjcjN0UGFzc3cwcmQ= and AnotherSecretOne";
        let scrubbed = redactor.scrub(log);
        assert!(!scrubbed.contains("S3cr3tPassw0rd"), "{scrubbed}");
        assert!(!scrubbed.contains("UzNjcjN0UGFzc3cwcmQ="), "{scrubbed}");
        assert!(!scrubbed.contains("AnotherSecretOne"), "{scrubbed}");
        assert!(
            scrubbed.contains("as app to shop"),
            "names stay: {scrubbed}"
        );
        assert_eq!(scrubbed.matches(REDACTED).count(), 3);

        let summary = summary(&credentials);
        assert_eq!(summary.name, "web-credentials");
        assert_eq!(
            summary.keys,
            ["database", "password", "superuser-password", "username"]
        );
        let yaml = serde_yaml_ng::to_string(&summary).expect("yaml");
        assert!(!yaml.contains("S3cr3t"), "{yaml}");
    }

    #[test]
    fn a_private_key_is_scrubbed_whole_and_by_line_and_short_values_are_left() {
        let key = "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\nBKcwggSjAgEAAoIBAQC7\n-----END PRIVATE KEY-----\n";
        let tls = secret(
            "web-tls",
            &[
                ("tls.key", key),
                ("tls.crt", "PUBLIC CERT BODY"),
                ("pin", "1234"),
            ],
        );
        let redactor = Redactor::new(&[tls]);
        assert_eq!(redactor.scrub(key), REDACTED);
        let scrubbed =
            redactor.scrub("line MIIEvQIBADANBgkqhkiG9w0BAQEFAASC logged; PUBLIC CERT BODY; 1234");
        assert!(
            !scrubbed.contains("MIIEvQIBADANBgkqhkiG9w0BAQEFAASC"),
            "{scrubbed}"
        );
        assert!(
            scrubbed.contains("PUBLIC CERT BODY"),
            "certificates are public"
        );
        assert!(scrubbed.contains("1234"), "too short to search for");
        assert_eq!(Redactor::new(&[]).scrub("x"), "x");
        assert_eq!(
            redactor.scrub_bytes(b"a \xff MIIEvQIBADANBgkqhkiG9w0BAQEFAASC"),
            "a \u{fffd} <redacted>".as_bytes()
        );
    }
}
