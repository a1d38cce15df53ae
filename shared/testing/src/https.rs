//! An HTTPS server on loopback for webhook tests: the local API server calls
//! it over TLS with a CA made for the test.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use axum::Router;
use axum_server::Handle;
use axum_server::tls_rustls::RustlsConfig;
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair, SanType};

use crate::Error;

/// A running HTTPS server; stopped when dropped.
pub struct TestHttpsServer {
    /// `https://127.0.0.1:<port>`.
    pub url: String,
    /// PEM of the CA that signed the server's certificate (a webhook's `caBundle`).
    pub ca_pem: String,
    handle: Handle<SocketAddr>,
}

impl Drop for TestHttpsServer {
    fn drop(&mut self) {
        self.handle.shutdown();
    }
}

/// Serves `router` over TLS on a free loopback port, with a certificate for
/// 127.0.0.1 signed by a fresh CA.
pub async fn serve(router: Router) -> Result<TestHttpsServer, Error> {
    let setup = |e: &dyn std::fmt::Display| Error::Setup(format!("test HTTPS server: {e}"));
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).map_err(|e| setup(&e))?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().map_err(|e| setup(&e))?)
        .map_err(|e| setup(&e))?;
    let mut params = CertificateParams::new(vec!["localhost".to_owned()]).map_err(|e| setup(&e))?;
    params
        .subject_alt_names
        .push(SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)));
    let key = KeyPair::generate().map_err(|e| setup(&e))?;
    let certificate = params.signed_by(&key, &ca).map_err(|e| setup(&e))?;

    let tls = RustlsConfig::from_pem(
        certificate.pem().into_bytes(),
        key.serialize_pem().into_bytes(),
    )
    .await
    .map_err(|e| setup(&e))?;
    let handle = Handle::new();
    let server = axum_server::bind_rustls(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)), tls)
        .handle(handle.clone())
        .serve(router.into_make_service());
    tokio::spawn(server);
    let address = handle
        .listening()
        .await
        .ok_or_else(|| setup(&"the server did not start listening"))?;
    Ok(TestHttpsServer {
        url: format!("https://{address}"),
        ca_pem: ca.pem(),
        handle,
    })
}
