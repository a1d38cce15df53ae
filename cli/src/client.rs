//! The connection: a client from the kubeconfig (or the pod's account) and
//! the namespace the commands work in, and errors that say what to do.

use anyhow::{Context, Result, bail};
use cairn_api::database::v1::DatabaseCluster;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};

use crate::args::Global;

/// Where the commands act.
pub struct Target {
    pub client: Client,
    pub namespace: String,
}

impl Target {
    pub fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        <K as kube::Resource>::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    /// DatabaseCluster `name`, or an error saying how to find the right one.
    pub async fn cluster(&self, name: &str) -> Result<DatabaseCluster> {
        match self.api::<DatabaseCluster>().get(name).await {
            Ok(cluster) => Ok(cluster),
            Err(kube::Error::Api(status)) if status.code == 404 => bail!(
                "DatabaseCluster {name} not found in namespace {}; list them with \
                 kubectl get databaseclusters -A (and pass -n NAMESPACE)",
                self.namespace
            ),
            Err(e) => Err(explain(e)).with_context(|| {
                format!(
                    "cannot read DatabaseCluster {name} in namespace {}",
                    self.namespace
                )
            }),
        }
    }
}

/// Connects with the kubeconfig flags, like kubectl: `--kubeconfig`, else
/// $KUBECONFIG or ~/.kube/config, else the pod's service account.
pub async fn connect(global: &Global) -> Result<Target> {
    let options = KubeConfigOptions {
        context: global.context.clone(),
        cluster: global.kube_cluster.clone(),
        user: global.user.clone(),
    };
    let chosen = options.context.is_some() || options.cluster.is_some() || options.user.is_some();
    let config = match &global.kubeconfig {
        Some(path) => {
            let kubeconfig = Kubeconfig::read_from(path)
                .with_context(|| format!("cannot read the kubeconfig {}", path.display()))?;
            Config::from_custom_kubeconfig(kubeconfig, &options)
                .await
                .with_context(|| format!("cannot use the kubeconfig {}", path.display()))?
        }
        None if chosen => Config::from_kubeconfig(&options)
            .await
            .context("cannot use the kubeconfig ($KUBECONFIG or ~/.kube/config)")?,
        None => Config::infer().await.context(
            "no Kubernetes configuration found: set KUBECONFIG, pass --kubeconfig FILE, or run \
             inside a cluster",
        )?,
    };
    let namespace = global
        .namespace
        .clone()
        .unwrap_or_else(|| config.default_namespace.clone());
    let client = Client::try_from(config).context("cannot build a Kubernetes client")?;
    Ok(Target { client, namespace })
}

/// An API error with a hint for the usual causes.
pub fn explain(error: kube::Error) -> anyhow::Error {
    match &error {
        kube::Error::Api(status) if status.code == 403 => anyhow::anyhow!(
            "{}: your account may not do this (check with kubectl auth can-i)",
            status.message
        ),
        kube::Error::Api(status)
            if status.code == 404
                && status
                    .message
                    .contains("the server could not find the requested resource") =>
        {
            anyhow::anyhow!(
                "{}: Cairn's CRDs are not installed in this cluster (install the charts)",
                status.message
            )
        }
        _ => anyhow::Error::new(error),
    }
}

/// Whether an API error is a 403.
pub fn is_forbidden(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if status.code == 403)
}

/// Now, as an API time.
pub fn now() -> k8s_openapi::jiff::Timestamp {
    k8s_openapi::jiff::Timestamp::now()
}
