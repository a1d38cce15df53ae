//! A fresh namespace per test, removed afterwards.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::json;

use crate::{Error, LocalCluster};

/// Label on every namespace the harness creates, so leftovers are easy to find:
/// `kubectl get ns -l cairn.dev/test`.
pub const TEST_LABEL: &str = "cairn.dev/test";

/// Which nodes a namespace's pods run on. The API server's PodNodeSelector and
/// PodTolerationRestriction admission plugins apply it to every pod created
/// there, whatever made the pod (a StatefulSet, a Deployment, a test).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Nodes {
    /// kwok's nodes: pods are Running and Ready at once and run nothing.
    Kwok,
    /// The real nodes: kubelet, containerd and runc run the containers.
    Real,
}

impl Nodes {
    fn annotations(self) -> serde_json::Value {
        match self {
            Nodes::Kwok => json!({
                "scheduler.alpha.kubernetes.io/node-selector": "type=kwok",
                "scheduler.alpha.kubernetes.io/defaultTolerations":
                    r#"[{"key":"kwok.x-k8s.io/node","operator":"Exists","effect":"NoSchedule"}]"#,
            }),
            Nodes::Real => json!({ "scheduler.alpha.kubernetes.io/node-selector": "type=real" }),
        }
    }
}

/// A namespace created for one test, with an admin client.
///
/// Dropping it deletes the namespace (without waiting), unless the thread is
/// panicking (a failed `assert!` or `expect`: it stays for inspection, its
/// name printed and its Deployments, the controllers a test installed,
/// scaled to 0) or `CAIRN_KEEP_NAMESPACES` is set (it stays as it is). A test that
/// fails by returning `Err` has dropped its namespace by then; run it with
/// `CAIRN_KEEP_NAMESPACES=1` to inspect it. A namespace on the real nodes
/// first copies its pods' logs to `logs/pods/` of the cluster's folder.
pub struct TestNamespace {
    pub name: String,
    pub client: Client,
    cluster: &'static LocalCluster,
    nodes: Nodes,
}

impl TestNamespace {
    pub(crate) async fn create(
        cluster: &'static LocalCluster,
        prefix: &str,
        nodes: Nodes,
    ) -> Result<Self, Error> {
        let client = cluster.admin_client().await?;
        let name = format!("{prefix}-{}", unique_suffix());
        let namespace: Namespace = serde_json::from_value(json!({
            "metadata": {
                "name": name,
                "labels": { TEST_LABEL: "true" },
                "annotations": nodes.annotations(),
            }
        }))
        .map_err(|e| Error::Setup(e.to_string()))?;
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &namespace)
            .await?;
        Ok(Self {
            name,
            client,
            cluster,
            nodes,
        })
    }

    /// An `Api` for namespaced objects of kind `K` in this namespace.
    pub fn api<K>(&self) -> Api<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        <K as Resource>::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), &self.name)
    }

    /// Creates ServiceAccount `name` in this namespace.
    pub async fn create_service_account(&self, name: &str) -> Result<(), Error> {
        let account: ServiceAccount =
            serde_json::from_value(json!({ "metadata": { "name": name } }))
                .map_err(|e| Error::Setup(e.to_string()))?;
        self.api::<ServiceAccount>()
            .create(&PostParams::default(), &account)
            .await?;
        Ok(())
    }

    /// Lets ServiceAccount `account` of this namespace use `verbs` on the core
    /// `resource` here, through a Role and RoleBinding named `<account>-<resource>`.
    pub async fn grant(&self, account: &str, resource: &str, verbs: &[&str]) -> Result<(), Error> {
        let name = format!("{account}-{resource}");
        let role: Role = manifest(json!({
            "metadata": { "name": name },
            "rules": [{ "apiGroups": [""], "resources": [resource], "verbs": verbs }]
        }))?;
        let binding: RoleBinding = manifest(json!({
            "metadata": { "name": name },
            "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name },
            "subjects": [{ "kind": "ServiceAccount", "name": account, "namespace": self.name }]
        }))?;
        self.api::<Role>()
            .create(&PostParams::default(), &role)
            .await?;
        self.api::<RoleBinding>()
            .create(&PostParams::default(), &binding)
            .await?;
        Ok(())
    }

    /// A client impersonating ServiceAccount `name` of this namespace.
    pub async fn client_as_service_account(&self, name: &str) -> Result<Client, Error> {
        self.cluster
            .client_as_service_account(&self.name, name)
            .await
    }
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        if self.nodes == Nodes::Real {
            self.keep_pod_logs();
        }
        let (cluster, name) = (self.cluster, self.name.clone());
        let done = if std::thread::panicking() {
            eprintln!("keeping namespace {name} for inspection, its Deployments scaled to 0");
            // Its controllers would go on acting beside the next tests' ones
            // (a cluster-wide controller reconciles this namespace too).
            in_a_thread(cluster, move |client| async move {
                let deployments = Api::<Deployment>::namespaced(client, &name);
                let scale = Patch::Merge(json!({"spec": {"replicas": 0}}));
                for deployment in deployments.list(&ListParams::default()).await? {
                    deployments
                        .patch_scale(&deployment.name_any(), &PatchParams::default(), &scale)
                        .await?;
                }
                Ok(())
            })
        } else if std::env::var_os("CAIRN_KEEP_NAMESPACES").is_some() {
            eprintln!("keeping namespace {name}");
            Ok(())
        } else {
            in_a_thread(cluster, move |client| async move {
                match Api::<Namespace>::all(client)
                    .delete(&name, &DeleteParams::background())
                    .await
                {
                    // The test deleted it itself.
                    Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
                    other => other.map(drop),
                }
            })
        };
        if let Err(e) = done {
            eprintln!("namespace {}: {e}", self.name);
        }
    }
}

/// Runs `work` with an admin client on a thread and runtime of its own: Drop
/// cannot await, and the test's runtime may be single-threaded.
fn in_a_thread<F, Fut>(cluster: &'static LocalCluster, work: F) -> Result<(), String>
where
    F: FnOnce(Client) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<(), kube::Error>>,
{
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        runtime.block_on(async {
            let client = cluster.admin_client().await.map_err(|e| e.to_string())?;
            work(client).await.map_err(|e| e.to_string())
        })
    })
    .join()
    .map_err(|_| "the thread panicked".to_owned())?
}

impl TestNamespace {
    /// Copies the logs of this namespace's pods from the real nodes into the
    /// cluster's log folder (kept when a test run fails): the kubelet removes
    /// them with the pods.
    /// Called when the namespace is dropped, and by long tests as they go
    /// (a pod deleted meanwhile takes its logs with it).
    pub fn keep_pod_logs(&self) {
        let target = self.cluster.state_dir().join("logs/pods");
        let nodes = self.cluster.state_dir().join("nodes");
        let prefix = format!("{}_", self.name);
        let Ok(nodes) = std::fs::read_dir(nodes) else {
            return;
        };
        for pod in nodes
            .flatten()
            .filter_map(|node| std::fs::read_dir(node.path().join("pod-logs")).ok())
            .flatten()
            .flatten()
            .filter(|pod| pod.file_name().to_string_lossy().starts_with(&prefix))
        {
            if let Err(e) = copy_tree(&pod.path(), &target.join(pod.file_name())) {
                eprintln!("could not keep the logs of {}: {e}", pod.path().display());
            }
        }
    }
}

fn copy_tree(from: &std::path::Path, to: &std::path::Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_tree(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), target)?;
        }
    }
    Ok(())
}

fn manifest<T: serde::de::DeserializeOwned>(value: serde_json::Value) -> Result<T, Error> {
    serde_json::from_value(value).map_err(|e| Error::Setup(format!("bad manifest: {e}")))
}

/// A short suffix unique within this machine for the life of a test run:
/// process id, clock and a counter, in base 36.
fn unique_suffix() -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default();
    let mixed = (u64::from(std::process::id()) << 32 | u64::from(nanos))
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(u64::from(COUNTER.fetch_add(1, Ordering::Relaxed)));
    let mut n = mixed;
    let mut out = String::new();
    for _ in 0..6 {
        out.push(char::from_digit((n % 36) as u32, 36).unwrap_or('0'));
        n /= 36;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::unique_suffix;

    #[test]
    fn suffixes_are_dns_labels_and_differ() {
        let a = unique_suffix();
        let b = unique_suffix();
        assert_ne!(a, b);
        assert!(
            a.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        );
        assert_eq!(a.len(), 6);
    }
}
