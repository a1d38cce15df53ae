//! The server certificate and the CA: read from the Secret volume, copied
//! into the run folder (postgres refuses a key file others may read, and the
//! volume's files belong to root), copied again when the Secret changes so
//! postgres reloads them without a restart; and the CA this instance
//! verifies its primary with (`verify-full`: the primary must prove it is
//! `<cluster>-rw`).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use cairn_api::database::instance as contract;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::error::{Context, Error};

const CERT: &str = "tls.crt";
const KEY: &str = "tls.key";
const CA: &str = "ca.crt";

/// Where the certificate comes from and where postgres reads it.
#[derive(Clone, Debug)]
pub struct Tls {
    mounted: PathBuf,
    installed: PathBuf,
}

/// The three files' contents.
#[derive(Clone, PartialEq, Eq)]
pub struct Files {
    cert: String,
    key: String,
    ca: String,
}

impl std::fmt::Debug for Files {
    // The key never reaches a log.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Files").finish_non_exhaustive()
    }
}

impl Tls {
    /// Files mounted in `mounted`, installed into `<run_dir>/tls`.
    pub fn new(mounted: &Path, run_dir: &Path) -> Self {
        Self {
            mounted: mounted.to_owned(),
            installed: run_dir.join("tls"),
        }
    }

    pub fn cert_file(&self) -> PathBuf {
        self.installed.join(CERT)
    }

    pub fn key_file(&self) -> PathBuf {
        self.installed.join(KEY)
    }

    pub fn ca_file(&self) -> PathBuf {
        self.installed.join(CA)
    }

    /// The files as mounted now.
    pub fn read(&self) -> Result<Files, Error> {
        let read = |name: &str| {
            let path = self.mounted.join(name);
            match std::fs::read_to_string(&path) {
                Ok(text) if !text.trim().is_empty() => Ok(text),
                Ok(_) => Err(Error::Setup(format!("{} is empty", path.display()))),
                Err(e) => Err(Error::Setup(format!(
                    "no server certificate: {}: {e} (the pod mounts the cluster's `-server` Secret at {})",
                    path.display(),
                    contract::TLS_DIR
                ))),
            }
        };
        Ok(Files {
            cert: read(CERT)?,
            key: read(KEY)?,
            ca: read(CA)?,
        })
    }

    /// Copies `files` where postgres reads them, readable by this user only.
    pub fn install(&self, files: &Files) -> Result<(), Error> {
        std::fs::create_dir_all(&self.installed)
            .context(|| self.installed.display().to_string())?;
        for (path, text) in [
            (self.ca_file(), &files.ca),
            (self.cert_file(), &files.cert),
            (self.key_file(), &files.key),
        ] {
            crate::files::write_atomically(&path, text, 0o600)?;
        }
        Ok(())
    }

    /// libpq settings for a connection to another instance: TLS, and the
    /// server must prove with the cluster's CA that it is the host dialled.
    pub fn client_settings(&self) -> [(&'static str, String); 2] {
        [
            ("sslmode", "verify-full".to_owned()),
            ("sslrootcert", self.ca_file().display().to_string()),
        ]
    }

    /// The same for this process's own sessions to another instance.
    pub fn connector(&self) -> Result<MakeRustlsConnect, Error> {
        verifying(&self.ca_file())
    }
}

/// TLS for tokio-postgres that trusts only the CAs in `path` (PEM) and
/// checks that the server's certificate names the host dialled.
pub fn verifying(path: &Path) -> Result<MakeRustlsConnect, Error> {
    let pem = std::fs::read(path).context(|| path.display().to_string())?;
    verifying_pem(&pem, &path.display().to_string())
}

/// The same for CAs held in memory (`source` names them in errors).
pub fn verifying_pem(pem: &[u8], source: &str) -> Result<MakeRustlsConnect, Error> {
    let mut roots = rustls::RootCertStore::empty();
    let invalid = |e: &dyn std::fmt::Display| Error::Setup(format!("{source}: {e}"));
    for cert in CertificateDer::pem_slice_iter(pem) {
        let cert = cert.map_err(|e| invalid(&e))?;
        roots.add(cert).map_err(|e| invalid(&e))?;
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Setup(format!("TLS settings: {e}")))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(MakeRustlsConnect::new(config))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn installed_files_are_private_and_follow_the_secret() {
        use std::os::unix::fs::PermissionsExt;
        let root = std::env::temp_dir().join(format!("cairn-tls-{}", std::process::id()));
        let mounted = root.join("mounted");
        std::fs::create_dir_all(&mounted).expect("folder");
        let tls = Tls::new(&mounted, &root.join("run"));
        assert!(
            tls.read()
                .expect_err("nothing mounted")
                .to_string()
                .contains("tls.crt")
        );
        for (name, text) in [(CERT, "cert"), (KEY, "key"), (CA, "ca")] {
            std::fs::write(mounted.join(name), text).expect("write");
        }
        let files = tls.read().expect("mounted");
        tls.install(&files).expect("installed");
        let mode = std::fs::metadata(tls.key_file())
            .expect("key")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        assert!(!format!("{files:?}").contains("key"));
        std::fs::write(mounted.join(CERT), "renewed").expect("write");
        assert_ne!(tls.read().expect("mounted"), files);
        assert_eq!(
            tls.client_settings()[1].1,
            root.join("run/tls/ca.crt").display().to_string()
        );
        let _ = std::fs::remove_dir_all(&root);
    }
}
