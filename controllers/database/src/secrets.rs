//! The Secrets a cluster's instances need before they start, made here
//! rather than applied: the credentials and the CA are created once (their
//! contents are random and in use from the first start), the server
//! certificate is issued again when due.

use std::time::SystemTime;

use cairn_api::database::v1::DatabaseCluster;
use cairn_runtime::certs::{self, Authority};
use k8s_openapi::api::core::v1::Secret;
use kube::api::PostParams;
use kube::runtime::events::EventType;
use kube::{Api, ResourceExt};

use crate::build::{self, Names};
use crate::context::{Context, cached_named};
use crate::error::Error;
use crate::tls;

/// What the Secrets step hands on: the CA the build publishes, and when the
/// server certificate is due for renewal (a reconcile is due then).
pub struct Secrets {
    pub authority: Authority,
    pub renew_at: SystemTime,
}

/// The credentials, the CA and the server certificate (see the module).
pub async fn ensure(ctx: &Context, cluster: &DatabaseCluster) -> Result<Secrets, Error> {
    ensure_credentials(ctx, cluster).await?;
    ensure_tls(ctx, cluster).await
}

/// The cluster's CA (made once) and its server certificate (issued again
/// when due).
async fn ensure_tls(ctx: &Context, cluster: &DatabaseCluster) -> Result<Secrets, Error> {
    let names = Names::of(cluster);
    let namespace = cluster.namespace().unwrap_or_default();
    let cached = |name: &str| cached_named(&ctx.caches.secrets, cluster, name);
    let authority = match cached(&names.ca) {
        Some(secret) => tls::authority_of(&secret).ok_or_else(|| {
            Error::DependencyNotReady(format!(
                "Secret {} to hold the cluster's CA (ca.crt and ca.key): delete it to make a new CA",
                names.ca
            ))
        })?,
        None => create_authority(ctx, cluster).await?,
    };
    let hosts = tls::server_hosts(cluster);
    let server = cached(&names.server_tls);
    let now = SystemTime::now();
    let renew_at = match tls::renewal(server.as_deref(), &authority, &hosts, now) {
        tls::Renewal::At(due) => due,
        tls::Renewal::Now(why) => {
            let issued = certs::issue(&authority, &hosts, tls::SERVER_VALIDITY)
                .map_err(|e| Error::Certificate(e.to_string()))?;
            let mut desired = tls::server_secret(cluster, &authority, &issued);
            let api = Api::<Secret>::namespaced(ctx.client.clone(), &namespace);
            match server {
                // Replaced only as the cache saw it: a concurrent change wins.
                Some(current) => {
                    desired.metadata.resource_version = current.resource_version();
                    api.replace(&names.server_tls, &PostParams::default(), &desired)
                        .await?;
                    ctx.publish(
                        cluster,
                        EventType::Normal,
                        "IssuedServerCertificate",
                        format!("Issued a new server certificate ({why}); the instances reload it without a restart"),
                    )
                    .await;
                }
                // A new cluster's first certificate is no news.
                None => create_once(&api, &desired).await?,
            }
            now + (tls::SERVER_VALIDITY - tls::RENEW_BEFORE)
        }
    };
    Ok(Secrets {
        authority,
        renew_at,
    })
}

/// A new CA in Secret `<name>-ca`; the one already there if an earlier
/// reconcile made it and the cache has not shown it yet.
async fn create_authority(ctx: &Context, cluster: &DatabaseCluster) -> Result<Authority, Error> {
    let name = Names::of(cluster).ca;
    let common_name = format!(
        "{}/{} CA",
        cluster.namespace().unwrap_or_default(),
        cluster.name_any()
    );
    let authority = certs::new_authority(&common_name, tls::CA_VALIDITY)
        .map_err(|e| Error::Certificate(e.to_string()))?;
    let api =
        Api::<Secret>::namespaced(ctx.client.clone(), &cluster.namespace().unwrap_or_default());
    match api
        .create(&PostParams::default(), &tls::ca_secret(cluster, &authority))
        .await
    {
        Ok(_) => Ok(authority),
        Err(kube::Error::Api(status)) if status.code == 409 => {
            let existing = api.get(&name).await?;
            tls::authority_of(&existing).ok_or_else(|| {
                Error::DependencyNotReady(format!("Secret {name} to hold the cluster's CA"))
            })
        }
        Err(e) => Err(e.into()),
    }
}

/// Creates `secret`; one that exists already (an earlier reconcile made it
/// and the cache has not shown it yet) is left as it is.
async fn create_once(api: &Api<Secret>, secret: &Secret) -> Result<(), Error> {
    match api.create(&PostParams::default(), secret).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Creates the credentials Secret once. It is never updated: the passwords
/// are in use from the moment the first instance starts.
async fn ensure_credentials(ctx: &Context, cluster: &DatabaseCluster) -> Result<(), Error> {
    let namespace = cluster.namespace().unwrap_or_default();
    let name = Names::of(cluster).credentials;
    if cached_named(&ctx.caches.secrets, cluster, &name).is_some() {
        return Ok(());
    }
    let secret = build::credentials(cluster, &mut build::random_password);
    create_once(&Api::namespaced(ctx.client.clone(), &namespace), &secret).await
}
