//! The backup controller's chart. Without the controller: its objects are
//! accepted by the API server, its pods admitted under restricted Pod
//! Security (on kwok's nodes, which run no container), and its RBAC grants
//! every verb the controller needs and none of those it must not have, in
//! the watched namespace or in all of them. With the controller: two replicas in pods on the real nodes, ready
//! (their caches synced under the chart's RBAC), serving metrics, one of them
//! holding the leader-election Lease.

use std::time::Duration;

use cairn_e2e::real::{
    controller_serves_metrics_from_its_pods, enforce_restricted_pod_security, install_chart,
};
use cairn_testing::{cluster, wait};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::authorization::v1::SubjectAccessReview;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{ListParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};

type Result<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

const CHART: &str = "cairn-backup-controller";
/// The leader-election Lease: `cairn-<controller>` in the release's namespace.
const LEASE: &str = "cairn-backup";
const TIMEOUT: Duration = Duration::from_secs(60);

/// (API group, resource or resource/subresource, verbs).
type Rules = &'static [(&'static str, &'static str, &'static [&'static str])];

/// What the controller does in a namespace it watches.
const GRANTED: Rules = &[
    (
        "backup.cairn.dev",
        "backups",
        &["list", "watch", "create", "delete", "patch"],
    ),
    ("backup.cairn.dev", "backups/status", &["patch"]),
    ("", "secrets", &["get"]),
    ("backup.cairn.dev", "backupschedules", &["list", "watch"]),
    ("backup.cairn.dev", "backupschedules/status", &["patch"]),
    ("database.cairn.dev", "databaseclusters", &["list", "watch"]),
    ("coordination.k8s.io", "leases", &["list", "watch"]),
    // Verification pods: created and deleted.
    ("", "pods", &["list", "watch", "create", "delete"]),
    ("events.k8s.io", "events", &["create", "patch"]),
];

/// What it must not do there: replace a Backup (it patches finalizers and
/// status only), write any schedule, cluster, membership Lease or Secret,
/// change a pod or exec into one, list or watch Secrets, or touch anything
/// else.
const REFUSED: Rules = &[
    ("backup.cairn.dev", "backups", &["get", "update"]),
    (
        "backup.cairn.dev",
        "backupschedules",
        &["get", "create", "update", "patch", "delete"],
    ),
    (
        "database.cairn.dev",
        "databaseclusters",
        &["get", "create", "update", "patch", "delete"],
    ),
    (
        "database.cairn.dev",
        "databaseclusters/status",
        &["update", "patch"],
    ),
    (
        "coordination.k8s.io",
        "leases",
        &["get", "create", "update", "patch", "delete"],
    ),
    ("", "pods", &["get", "update", "patch"]),
    ("", "pods/exec", &["get", "create"]),
    (
        "",
        "secrets",
        &["list", "watch", "create", "update", "patch", "delete"],
    ),
    ("", "configmaps", &["get", "list"]),
    ("", "persistentvolumeclaims", &["get", "list"]),
    ("apps", "statefulsets", &["get", "list"]),
    ("cloud.cairn.dev", "objectbuckets", &["get", "list"]),
];

#[tokio::test]
async fn the_chart_installs_under_the_restricted_pod_security_level() -> Result {
    let ns = cluster().namespace("backup-chart").await?;
    enforce_restricted_pod_security(&ns).await?;
    // Every optional object on, so the server validates them all (but the
    // ServiceMonitor: the test cluster has no prometheus-operator CRDs).
    let all_on = cluster()
        .helm_template(
            CHART,
            "chart-test",
            &ns.name,
            &[
                "--set",
                "networkPolicy.enabled=true",
                "--set",
                "watchNamespace=default",
            ],
        )
        .await?;
    cluster()
        .kubectl(&[
            "apply",
            "--server-side",
            "--force-conflicts",
            "--dry-run=server",
            "-f",
            &all_on.to_string_lossy(),
        ])
        .await?;

    // Everything but the CRDs (the shared test cluster keeps the ones the
    // tests install), watching this namespace only.
    let watch = format!("watchNamespace={}", ns.name);
    let mut args = vec!["--set", watch.as_str()];
    for template in [
        "templates/serviceaccount.yaml",
        "templates/rbac.yaml",
        "templates/service.yaml",
        "templates/poddisruptionbudget.yaml",
        "templates/deployment.yaml",
    ] {
        args.extend(["--show-only", template]);
    }
    let file = cluster()
        .helm_template(CHART, "chart-test", &ns.name, &args)
        .await?;
    cluster().apply_file(&file).await?;
    wait::for_object(
        &ns.api::<Deployment>(),
        &format!("chart-test-{CHART}"),
        "2 available replicas",
        TIMEOUT,
        |d| d.status.as_ref().and_then(|s| s.available_replicas) == Some(2),
    )
    .await?;
    Ok(())
}

/// The chart's rules name every group, resource and verb: no wildcard.
#[tokio::test]
async fn the_chart_grants_no_wildcard() -> Result {
    for watch in ["", "watched"] {
        let watch = format!("watchNamespace={watch}");
        let file = cluster()
            .helm_template(
                CHART,
                "no-wildcard",
                "cairn-system",
                &["--set", &watch, "--show-only", "templates/rbac.yaml"],
            )
            .await?;
        let text = std::fs::read_to_string(&file)?;
        let mut roles = 0;
        for document in serde_yaml_ng::Deserializer::from_str(&text) {
            let object: Value = serde::Deserialize::deserialize(document)?;
            let Some(rules) = object.get("rules").and_then(Value::as_array) else {
                continue;
            };
            roles += 1;
            for rule in rules {
                for field in ["apiGroups", "resources", "verbs"] {
                    let values = rule[field]
                        .as_array()
                        .ok_or_else(|| format!("a rule without {field}: {rule}"))?;
                    assert!(
                        !values.is_empty() && values.iter().all(|v| v.as_str() != Some("*")),
                        "{watch}: a wildcard or empty {field}: {rule}"
                    );
                }
            }
        }
        assert_eq!(
            roles, 2,
            "{watch}: the ClusterRole and the own-namespace Role"
        );
    }
    Ok(())
}

/// `watchNamespace` set: the rules hold in that namespace, and nowhere else
/// but for the leader-election Lease in the controller's own namespace.
#[tokio::test]
async fn the_chart_grants_what_the_controller_needs_in_the_watched_namespace() -> Result {
    let home = cluster().namespace("backup-home").await?;
    let watched = cluster().namespace("backup-watched").await?;
    let other = cluster().namespace("backup-other").await?;
    let name = cluster()
        .install_controller_rbac_watching(CHART, &home.name, &home.name, &watched.name)
        .await?;
    let account = Account {
        client: home.client.clone(),
        namespace: &home.name,
        name: &name,
    };
    let lease: Rules = &[(
        "coordination.k8s.io",
        "leases",
        &["get", "create", "update"],
    )];
    account.until_allowed(&watched.name, GRANTED).await?;
    account.until_allowed(&home.name, lease).await?;

    account.refused(&watched.name, REFUSED).await?;
    // Nothing in a namespace it does not watch, or in all of them at once.
    account.refused(&other.name, GRANTED).await?;
    account.refused("", GRANTED).await?;
    // Its own namespace: the leader-election Lease only.
    account
        .refused(
            &home.name,
            &[
                ("coordination.k8s.io", "leases", &["patch", "delete"]),
                ("backup.cairn.dev", "backups", &["get", "list"]),
                ("", "secrets", &["get"]),
            ],
        )
        .await?;
    Ok(())
}

/// `watchNamespace` empty (the default): the same rules in every namespace,
/// through a ClusterRoleBinding (left behind, like the release's ClusterRole).
#[tokio::test]
async fn the_chart_grants_what_the_controller_needs_in_every_namespace() -> Result {
    let home = cluster().namespace("backup-all").await?;
    let some = cluster().namespace("backup-some").await?;
    let name = cluster()
        .install_controller_rbac_watching(CHART, &home.name, &home.name, "")
        .await?;
    let account = Account {
        client: home.client.clone(),
        namespace: &home.name,
        name: &name,
    };
    for namespace in [some.name.as_str(), "default"] {
        account.until_allowed(namespace, GRANTED).await?;
        account.refused(namespace, REFUSED).await?;
    }
    // Its caches list and watch across namespaces; a Secret is read by name
    // (a destination's credentials), never listed or watched.
    let caches: Rules = &[
        ("backup.cairn.dev", "backups", &["list", "watch"]),
        ("backup.cairn.dev", "backupschedules", &["list", "watch"]),
        ("database.cairn.dev", "databaseclusters", &["list", "watch"]),
        ("coordination.k8s.io", "leases", &["list", "watch"]),
        ("", "pods", &["list", "watch"]),
        ("", "secrets", &["get"]),
    ];
    account.until_allowed("", caches).await?;
    account
        .refused("", &[("", "secrets", &["list", "watch"])])
        .await?;
    Ok(())
}

#[tokio::test]
async fn the_chart_runs_the_backup_controller_in_pods() -> Result {
    let ns = cluster().namespace_on_real_nodes("backup").await?;
    enforce_restricted_pod_security(&ns).await?;
    // It reads DatabaseClusters: their CRD (the database chart's) must be
    // there for its caches to sync.
    cairn_testing::crds::install(
        &ns.client,
        &cairn_api::crds::for_chart("cairn-database-controller"),
    )
    .await?;
    // Both replicas available: each passed /readyz, so each synced its
    // caches with the chart's RBAC.
    install_chart(&ns, CHART).await?;
    controller_serves_metrics_from_its_pods(&ns, CHART).await?;

    // One of them leads: it holds the Lease in its own namespace.
    let pods: Vec<String> = ns
        .api::<Pod>()
        .list(&ListParams::default().labels(&format!("app.kubernetes.io/name={CHART}")))
        .await?
        .items
        .iter()
        .map(ResourceExt::name_any)
        .collect();
    wait::for_object(
        &ns.api::<Lease>(),
        LEASE,
        "a controller pod holding the Lease",
        TIMEOUT,
        |l| {
            l.spec
                .as_ref()
                .and_then(|s| s.holder_identity.as_ref())
                .is_some_and(|holder| pods.contains(holder))
        },
    )
    .await?;
    Ok(())
}

/// The controller's ServiceAccount, as the API server authorizes it.
struct Account<'a> {
    /// The admin's client, which asks the authorizer.
    client: Client,
    namespace: &'a str,
    name: &'a str,
}

impl Account<'_> {
    /// Whether it may `verb` `resource` (`kind` or `kind/subresource`) of
    /// `group` in `namespace` (all namespaces if empty): a
    /// SubjectAccessReview, answered by the API server's authorizer.
    async fn can(
        &self,
        namespace: &str,
        group: &str,
        resource: &str,
        verb: &str,
    ) -> std::result::Result<bool, String> {
        let (resource, subresource) = resource.split_once('/').unwrap_or((resource, ""));
        let review: SubjectAccessReview = serde_json::from_value(json!({
            "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
            "spec": {
                "user": format!("system:serviceaccount:{}:{}", self.namespace, self.name),
                "groups": [
                    "system:serviceaccounts",
                    format!("system:serviceaccounts:{}", self.namespace),
                    "system:authenticated",
                ],
                "resourceAttributes": {
                    "namespace": namespace, "group": group, "resource": resource,
                    "subresource": subresource, "verb": verb,
                },
            },
        }))
        .map_err(|e| e.to_string())?;
        let answer = Api::<SubjectAccessReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| e.to_string())?;
        Ok(answer.status.is_some_and(|s| s.allowed))
    }

    /// The verbs of `rules` in `namespace` whose answer is not `allowed`.
    async fn answered_otherwise(
        &self,
        namespace: &str,
        rules: Rules,
        allowed: bool,
    ) -> std::result::Result<Vec<String>, String> {
        let mut wrong = Vec::new();
        for (group, resource, verbs) in rules {
            for verb in *verbs {
                if self.can(namespace, group, resource, verb).await? != allowed {
                    wrong.push(format!("{verb} {group}/{resource}"));
                }
            }
        }
        Ok(wrong)
    }

    /// Waits until every verb of `rules` is allowed in `namespace`: the
    /// authorizer sees new bindings after a moment.
    async fn until_allowed(&self, namespace: &str, rules: Rules) -> Result {
        wait::until(
            &format!("the chart's RBAC in namespace {namespace:?}"),
            Duration::from_secs(10),
            || async {
                let refused = self.answered_otherwise(namespace, rules, true).await?;
                if refused.is_empty() {
                    Ok(Some(()))
                } else {
                    Err(format!("refused, but the controller needs: {refused:?}"))
                }
            },
        )
        .await?;
        Ok(())
    }

    /// Every verb of `rules` is refused in `namespace` (asked once the
    /// bindings are seen: after [`Account::until_allowed`]).
    async fn refused(&self, namespace: &str, rules: Rules) -> Result {
        let allowed = self.answered_otherwise(namespace, rules, false).await?;
        assert!(
            allowed.is_empty(),
            "in namespace {namespace:?}, allowed but the controller must not: {allowed:?}"
        );
        Ok(())
    }
}
