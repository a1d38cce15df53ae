//! The HTTPS server for conversion webhooks, served by every replica (leader
//! or not: the API server calls any of them through the Service).
//!
//! Certificates come from files mounted by the chart (`tls.crt`, `tls.key`,
//! e.g. a cert-manager Secret) and are reloaded when the files change, so a
//! rotated certificate is served without a restart. A `ca.crt` beside them
//! (cert-manager writes one) is injected into the CRDs' conversion
//! `caBundle` at start and again whenever it changes, so the API server
//! trusts a rotated CA without anyone restarting the controller.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use axum::Router;
use axum_server::Handle;
use axum_server::tls_rustls::RustlsConfig;

/// How often the mounted files are checked for a new certificate.
pub const RELOAD_INTERVAL: Duration = Duration::from_secs(10);

/// The certificate and key files in `dir`, as Kubernetes TLS Secrets name them.
pub fn cert_files(dir: &Path) -> (PathBuf, PathBuf) {
    (dir.join("tls.crt"), dir.join("tls.key"))
}

/// A running webhook server.
pub struct WebhookServer {
    /// The address it listens on (useful when asked for port 0).
    pub address: SocketAddr,
    handle: Handle<SocketAddr>,
    reloader: tokio::task::JoinHandle<()>,
}

impl WebhookServer {
    /// Stops accepting connections and lets open requests finish (at most 10 s).
    pub fn shutdown(&self) {
        self.reloader.abort();
        self.handle.graceful_shutdown(Some(Duration::from_secs(10)));
    }
}

/// Where a mounted CA goes: the conversion `caBundle` of these CRDs.
#[derive(Clone)]
pub struct CaInjection {
    pub client: kube::Client,
    pub crds: Vec<String>,
    /// This release's webhook Service (`<name>.<namespace>.svc`): a CRD
    /// converted through another Service is left alone.
    pub service: Option<String>,
}

impl CaInjection {
    /// Injects `dir/ca.crt`, if there is one; returns what it injected.
    async fn inject_from(&self, dir: &Path) -> Result<Option<String>, kube::Error> {
        let Ok(ca) = std::fs::read_to_string(dir.join("ca.crt")) else {
            return Ok(None);
        };
        let crds: Vec<&str> = self.crds.iter().map(String::as_str).collect();
        crate::certs::inject_ca_bundle(self.client.clone(), &crds, &ca, self.service.as_deref())
            .await?;
        Ok(Some(ca))
    }
}

/// Starts serving `router` over TLS on `address` with the certificate in
/// `cert_dir`, checking the files for a new certificate every `reload_every`
/// and, with `injection`, keeping the CRDs' `caBundle` on the mounted CA.
pub async fn start(
    address: SocketAddr,
    router: Router,
    cert_dir: &Path,
    reload_every: Duration,
    injection: Option<CaInjection>,
) -> std::io::Result<WebhookServer> {
    let (cert, key) = cert_files(cert_dir);
    let tls = RustlsConfig::from_pem_file(&cert, &key).await?;
    let injected = match &injection {
        Some(injection) => injection
            .inject_from(cert_dir)
            .await
            .map_err(std::io::Error::other)?,
        None => None,
    };
    let watched = Watched {
        dir: cert_dir.to_owned(),
        injection,
        injected,
    };
    let reloader = tokio::spawn(reload_on_change(tls.clone(), watched, reload_every));
    bind(address, router, tls, reloader).await
}

/// The mounted folder and what was last injected from it.
struct Watched {
    dir: PathBuf,
    injection: Option<CaInjection>,
    injected: Option<String>,
}

/// Starts serving `router` over TLS with a certificate held in memory (the
/// self-managed mode, see [`crate::certs`]).
pub async fn start_with_pem(
    address: SocketAddr,
    router: Router,
    cert: &str,
    key: &str,
) -> std::io::Result<WebhookServer> {
    let tls = RustlsConfig::from_pem(cert.as_bytes().to_vec(), key.as_bytes().to_vec()).await?;
    bind(address, router, tls, tokio::spawn(async {})).await
}

async fn bind(
    address: SocketAddr,
    router: Router,
    tls: RustlsConfig,
    reloader: tokio::task::JoinHandle<()>,
) -> std::io::Result<WebhookServer> {
    let handle = Handle::new();
    let server = axum_server::bind_rustls(address, tls.clone())
        .handle(handle.clone())
        .serve(router.into_make_service());
    tokio::spawn(async move {
        if let Err(e) = server.await {
            tracing::error!(error = %e, "the webhook server stopped");
        }
    });
    let address = handle
        .listening()
        .await
        .ok_or_else(|| std::io::Error::other("the webhook server did not start listening"))?;
    Ok(WebhookServer {
        address,
        handle,
        reloader,
    })
}

/// Reloads the certificate whenever the files' modification time changes
/// (a mounted Secret updates by swapping a symlink, which changes it too),
/// and injects a changed CA.
async fn reload_on_change(tls: RustlsConfig, mut watched: Watched, every: Duration) {
    let (cert, key) = cert_files(&watched.dir);
    let modified = |path: &Path| std::fs::metadata(path).and_then(|m| m.modified()).ok();
    let mut last: Option<SystemTime> = modified(&cert).max(modified(&key));
    loop {
        tokio::time::sleep(every).await;
        watched.inject_if_changed().await;
        let now = modified(&cert).max(modified(&key));
        if now == last {
            continue;
        }
        match tls.reload_from_pem_file(&cert, &key).await {
            Ok(()) => {
                tracing::info!(cert = %cert.display(), "reloaded the webhook certificate");
                last = now;
            }
            // A half-written pair: try again at the next tick.
            Err(e) => tracing::warn!(error = %e, "could not reload the webhook certificate"),
        }
    }
}

impl Watched {
    /// A new `ca.crt` goes into the CRDs; a failure is retried next tick.
    async fn inject_if_changed(&mut self) {
        let Some(injection) = &self.injection else {
            return;
        };
        let current = std::fs::read_to_string(self.dir.join("ca.crt")).ok();
        if current.is_none() || current == self.injected {
            return;
        }
        match injection.inject_from(&self.dir).await {
            Ok(injected) => {
                tracing::info!(crds = ?injection.crds, "injected the rotated webhook CA");
                self.injected = injected;
            }
            Err(e) => tracing::warn!(error = %e, "could not inject the rotated webhook CA"),
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn files_are_named_like_a_kubernetes_tls_secret() {
        let (cert, key) = cert_files(Path::new("/certs"));
        assert_eq!(cert, Path::new("/certs/tls.crt"));
        assert_eq!(key, Path::new("/certs/tls.key"));
    }
}
