//! The charts' Grafana dashboards and alerts against a real Prometheus.
//!
//! The three controller charts are installed on the real nodes, a
//! DatabaseCluster runs PostgreSQL there with WAL archiving to moto, a
//! BackupSchedule takes and verifies Backups, a Backup is deleted with its
//! files, and the cloud controller makes a bucket, corrects its drift and
//! fails on a bucket whose ProviderConfig does not exist. The pinned
//! `prometheus` then runs on this machine with a scrape configuration
//! derived from the ServiceMonitors and the PodMonitor the charts render,
//! as prometheus-operator derives it (Kubernetes service discovery against
//! the local API server, `keep` rules from the monitors' selectors, port
//! names and namespaces): every target of every monitor is up, so the
//! monitors select the Services and pods the charts make. Every panel query
//! of every dashboard, its variables replaced by test values, parses and
//! returns at least one series, and every variable offers a value. Every
//! alert expression of `charts/*/rules/alerts.yaml` parses, and every
//! metric an alert names was scraped (or is listed below with the reason it
//! may be absent). `helm template --set grafanaDashboards.enabled=true`
//! renders one ConfigMap per dashboard, which the API server accepts.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use aws_sdk_s3::types::{BucketVersioningStatus, VersioningConfiguration};
use cairn_api::backup::v1::{Backup, BackupPhase, BackupSchedule};
use cairn_api::cloud::v1alpha1::{EXTERNAL_NAME_ANNOTATION, ObjectBucket, ProviderConfig};
use cairn_api::database::v1::DatabaseCluster;
use cairn_e2e::real::{
    READY_TIMEOUT, as_superuser, backup_destination, cluster_spec, current_primary, install_chart,
};
use cairn_testing::process::{free_address, http_get};
use cairn_testing::{TestNamespace, cluster, repo_root, wait};
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::{DeleteParams, PostParams};
use serde_json::{Value, json};

type Result<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

const CHARTS: [&str; 3] = [
    "cairn-database-controller",
    "cairn-backup-controller",
    "cairn-cloud-controller",
];
const CLUSTER: &str = "gauges";
const SCHEDULE: &str = "every-minute";
/// The monitors' intervals (30 s) shortened, so that rates have samples
/// within a minute.
const SCRAPE_INTERVAL: &str = "5s";

/// Metrics the alerts name that may be absent from a healthy system, with
/// why: an alert on them must still parse, and the test says which were
/// absent. Every other metric an alert names must have been scraped.
const ABSENT_UNTIL_A_FAILURE: &[(&str, &str)] = &[];

/// The values the dashboards' variables take in the test, and Grafana's
/// built-in variables (`$__rate_interval` is at least four scrape
/// intervals; one minute leaves room).
fn variable_values(ns: &str) -> BTreeMap<&'static str, String> {
    BTreeMap::from([
        ("namespace", ns.to_owned()),
        ("controller", "database|backup|cloud".to_owned()),
        ("cluster", CLUSTER.to_owned()),
        ("schedule", SCHEDULE.to_owned()),
        ("__rate_interval", "1m".to_owned()),
        ("__interval", "15s".to_owned()),
        ("__range", "1h".to_owned()),
    ])
}

#[tokio::test]
async fn every_dashboard_panel_and_alert_answers_from_a_real_prometheus() -> Result {
    let started = Instant::now();
    let dashboards = dashboards()?;
    check_dashboard_structure(&dashboards)?;
    let ns = cluster().namespace_on_real_nodes("dashboards").await?;
    dashboards_render_as_config_maps(&ns, &dashboards).await?;
    for chart in CHARTS {
        install_chart(&ns, chart).await?;
    }
    let monitors = rendered_monitors(&ns).await?;
    let prometheus = Prometheus::start(&scrape_configs(&monitors)?).await?;
    eprintln!(
        "charts installed, prometheus on {} ({:.0} s)",
        prometheus.address,
        started.elapsed().as_secs_f64()
    );

    // PostgreSQL on the real nodes, archiving to moto; Backups on a
    // schedule, each verified; one Backup taken and deleted with its files.
    let bucket = format!("dash-{}", ns.name);
    let mut spec = cluster_spec(2);
    spec.backup = Some(backup_destination(&ns, &bucket, "e2e").await?);
    let clusters = ns.api::<DatabaseCluster>();
    clusters
        .create(&PostParams::default(), &DatabaseCluster::new(CLUSTER, spec))
        .await?;
    let schedule: BackupSchedule = serde_json::from_value(json!({
        "apiVersion": "backup.cairn.dev/v1", "kind": "BackupSchedule",
        "metadata": { "name": SCHEDULE },
        "spec": { "schedule": "* * * * *", "verifyEvery": 1,
                  "template": { "spec": { "cluster": { "name": CLUSTER }, "method": "physical",
                                          "deadlineSeconds": 300,
                                          "verification": { "sql": "SELECT true" } } } },
    }))?;
    ns.api::<BackupSchedule>()
        .create(&PostParams::default(), &schedule)
        .await?;
    cloud_resources(&ns).await?;
    wait::for_object(&clusters, CLUSTER, "Ready", READY_TIMEOUT, |c| {
        wait::condition_status(c, "Ready").as_deref() == Some("True")
    })
    .await?;
    eprintln!(
        "DatabaseCluster Ready ({:.0} s)",
        started.elapsed().as_secs_f64()
    );
    let backup: Backup = serde_json::from_value(json!({
        "apiVersion": "backup.cairn.dev/v1", "kind": "Backup",
        "metadata": { "name": "deleted" },
        "spec": { "cluster": { "name": CLUSTER }, "method": "physical", "deadlineSeconds": 300,
                  "deletionPolicy": "Delete" },
    }))?;
    let backups = ns.api::<Backup>();
    backups.create(&PostParams::default(), &backup).await?;
    let done = wait::for_object(
        &backups,
        "deleted",
        "final",
        Duration::from_secs(180),
        |b| {
            b.status
                .as_ref()
                .and_then(|s| s.phase)
                .is_some_and(|p| matches!(p, BackupPhase::Completed | BackupPhase::Failed))
        },
    )
    .await?;
    assert_eq!(
        done.status.as_ref().and_then(|s| s.phase),
        Some(BackupPhase::Completed),
        "{:?}",
        done.status
    );
    backups.delete("deleted", &DeleteParams::default()).await?;

    prometheus.until_targets_up(&monitors, &ns.name).await?;
    eprintln!("every target up ({:.0} s)", started.elapsed().as_secs_f64());

    // Every panel, until each returns a series (the schedule's first slot,
    // its verification and the recoverability window take a few minutes).
    // Meanwhile the application writes and the primary switches WAL files:
    // a standby's backup ends in the primary's current WAL file, which an
    // idle primary never completes, so its verification (a restore to the
    // end of the backup, from the archive) would fail.
    let values = variable_values(&ns.name);
    let queries = panel_queries(&dashboards, &values)?;
    let polling = Instant::now();
    let mut empty = Vec::new();
    while polling.elapsed() < Duration::from_secs(420) {
        let primary = current_primary(&clusters, CLUSTER).await?;
        as_superuser(
            &ns,
            &primary,
            "CREATE TABLE IF NOT EXISTS ticks (at timestamptz); \
             INSERT INTO ticks VALUES (now()); SELECT pg_switch_wal();",
        )
        .await?;
        empty.clear();
        for query in &queries {
            if prometheus.query(&query.expr).await?.is_empty() {
                empty.push(query);
            }
        }
        if empty.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
    assert!(
        empty.is_empty(),
        "{} of {} panel queries returned no series after {:.0} s:\n{}",
        empty.len(),
        queries.len(),
        polling.elapsed().as_secs_f64(),
        empty
            .iter()
            .map(|q| q.to_string())
            .collect::<Vec<_>>()
            .join("\n")
    );
    eprintln!(
        "{} panel queries of {} dashboards each returned series ({:.0} s)",
        queries.len(),
        dashboards.len(),
        started.elapsed().as_secs_f64()
    );
    for query in &queries {
        eprintln!(
            "  {:>4} series  {}",
            prometheus.query(&query.expr).await?.len(),
            query.place
        );
    }
    variables_offer_values(&prometheus, &dashboards, &values).await?;

    let scraped = prometheus.metric_names().await?;
    for query in &queries {
        for name in prometheus.metrics_named(&query.expr).await? {
            assert!(
                scraped.contains(&name),
                "{}: metric {name} was never scraped",
                query.place
            );
        }
    }
    alerts_parse_and_name_scraped_metrics(&prometheus, &scraped).await?;
    schedule_labels(&prometheus, &ns.name).await?;
    eprintln!("done in {:.0} s", started.elapsed().as_secs_f64());
    // The cloud controller runs in this namespace: its finalizers are done
    // before the namespace goes, or it would stay Terminating.
    wait::for_all_deleted(&ns.api::<ObjectBucket>(), Duration::from_secs(120)).await?;
    wait::for_all_deleted(&ns.api::<ProviderConfig>(), Duration::from_secs(60)).await?;
    Ok(())
}

// ------------------------------------------------------------ the dashboards

struct Dashboard {
    chart: &'static str,
    file: PathBuf,
    json: Value,
}

impl Dashboard {
    fn title(&self) -> &str {
        self.json["title"].as_str().unwrap_or("?")
    }
}

/// Every `charts/<chart>/dashboards/*.json`.
fn dashboards() -> Result<Vec<Dashboard>> {
    let mut all = Vec::new();
    for chart in CHARTS {
        let dir = repo_root().join("charts").join(chart).join("dashboards");
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        let mut files: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "json"))
            .collect();
        files.sort();
        for file in files {
            let text = std::fs::read_to_string(&file)?;
            let json = serde_json::from_str(&text)
                .map_err(|e| format!("{}: not JSON: {e}", file.display()))?;
            all.push(Dashboard { chart, file, json });
        }
    }
    assert!(
        all.len() >= 3,
        "dashboards for the controllers, the database clusters and the backups"
    );
    Ok(all)
}

/// Panels, rows' collapsed panels included.
fn panels(dashboard: &Value) -> Vec<&Value> {
    let mut all = Vec::new();
    for panel in dashboard["panels"].as_array().into_iter().flatten() {
        all.push(panel);
        all.extend(panel["panels"].as_array().into_iter().flatten());
    }
    all
}

/// What Grafana needs to import them as the sidecar does: a unique uid,
/// the schema version, a `datasource` variable every panel and target uses.
fn check_dashboard_structure(dashboards: &[Dashboard]) -> Result {
    let mut uids = BTreeSet::new();
    for dashboard in dashboards {
        let d = &dashboard.json;
        let name = dashboard.file.display();
        let uid = d["uid"].as_str().unwrap_or_default();
        assert!(
            !uid.is_empty() && uids.insert(uid.to_owned()),
            "{name}: uid {uid:?} missing or not unique"
        );
        assert!(
            d["schemaVersion"].as_u64().is_some_and(|v| v >= 36),
            "{name}: schemaVersion"
        );
        let variables = d["templating"]["list"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        assert!(
            variables.iter().any(|v| v["name"] == "datasource"
                && v["type"] == "datasource"
                && v["query"] == "prometheus"),
            "{name}: a datasource variable of type prometheus"
        );
        let mut ids = BTreeSet::new();
        for panel in panels(d) {
            let title = panel["title"].as_str().unwrap_or("?");
            assert!(ids.insert(panel["id"].to_string()), "{name}: id of {title}");
            let grid = &panel["gridPos"];
            assert!(
                grid["x"].as_u64().unwrap_or(99) + grid["w"].as_u64().unwrap_or(99) <= 24,
                "{name}: {title} is wider than the dashboard"
            );
            if panel["type"] == "row" {
                continue;
            }
            assert_eq!(
                panel["datasource"]["uid"], "${datasource}",
                "{name}: {title}"
            );
            let targets = panel["targets"].as_array().cloned().unwrap_or_default();
            assert!(!targets.is_empty(), "{name}: {title} has no query");
            for target in targets {
                assert_eq!(
                    target["datasource"]["uid"], "${datasource}",
                    "{name}: {title}"
                );
            }
        }
    }
    Ok(())
}

/// One panel target, its variables replaced.
struct PanelQuery {
    place: String,
    expr: String,
}

impl std::fmt::Display for PanelQuery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "  {}:\n    {}", self.place, self.expr)
    }
}

fn panel_queries(
    dashboards: &[Dashboard],
    values: &BTreeMap<&'static str, String>,
) -> Result<Vec<PanelQuery>> {
    let mut queries = Vec::new();
    for dashboard in dashboards {
        for panel in panels(&dashboard.json) {
            for target in panel["targets"].as_array().into_iter().flatten() {
                let raw = target["expr"].as_str().unwrap_or_default();
                let place = format!(
                    "{} ({}) / panel {:?} / {}",
                    dashboard.title(),
                    dashboard.chart,
                    panel["title"].as_str().unwrap_or("?"),
                    target["refId"].as_str().unwrap_or("?")
                );
                assert!(!raw.trim().is_empty(), "{place}: empty query");
                queries.push(PanelQuery {
                    expr: substitute(raw, values).map_err(|e| format!("{place}: {e}"))?,
                    place,
                });
            }
        }
    }
    Ok(queries)
}

/// `$name`, `${name}` and `${name:format}` replaced by the test's value;
/// an unknown variable is an error.
fn substitute(expr: &str, values: &BTreeMap<&'static str, String>) -> Result<String> {
    let mut out = expr.to_owned();
    for (name, value) in values {
        out = out.replace(&format!("${{{name}}}"), value);
        while let Some(start) = out.find(&format!("${{{name}:")) {
            let end = out[start..].find('}').ok_or("unclosed ${")? + start;
            out.replace_range(start..=end, value);
        }
    }
    // Longest first: `$__interval` must not eat `$__interval_ms`.
    let mut names: Vec<_> = values.keys().collect();
    names.sort_by_key(|n| std::cmp::Reverse(n.len()));
    for name in names {
        out = out.replace(&format!("${name}"), &values[name]);
    }
    if let Some(at) = out.find('$') {
        let next = out[at + 1..].chars().next().unwrap_or(' ');
        if next.is_ascii_alphabetic() || next == '_' || next == '{' {
            return Err(format!("unknown variable at {:?}", &out[at..]).into());
        }
    }
    Ok(out)
}

/// Every query variable (`label_values(selector, label)`) offers the value
/// the test substitutes for it.
async fn variables_offer_values(
    prometheus: &Prometheus,
    dashboards: &[Dashboard],
    values: &BTreeMap<&'static str, String>,
) -> Result {
    for dashboard in dashboards {
        for variable in dashboard.json["templating"]["list"]
            .as_array()
            .into_iter()
            .flatten()
        {
            if variable["type"] != "query" {
                continue;
            }
            let name = variable["name"].as_str().unwrap_or_default();
            let place = format!("{} / variable {name}", dashboard.title());
            let definition = variable["query"]["query"]
                .as_str()
                .or(variable["query"].as_str())
                .unwrap_or_default();
            let inner = definition
                .strip_prefix("label_values(")
                .and_then(|s| s.strip_suffix(')'))
                .ok_or_else(|| format!("{place}: not label_values(...): {definition}"))?;
            let (selector, label) = inner
                .rsplit_once(',')
                .ok_or_else(|| format!("{place}: label_values without a selector"))?;
            let selector = substitute(selector.trim(), values)?;
            let offered = prometheus.label_values(&selector, label.trim()).await?;
            let wanted = values
                .get(name)
                .ok_or_else(|| format!("{place}: no test value"))?;
            let regex = variable["regex"].as_str().unwrap_or_default();
            let offers = |want: &str| match regex {
                "" => offered.contains(want),
                // A pod's name is <cluster>-<ordinal>.
                "/^(.+)-[0-9]+$/" => offered.iter().any(|v| {
                    v.strip_prefix(want)
                        .and_then(|rest| rest.strip_prefix('-'))
                        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
                }),
                other => panic!("{place}: the test does not know regex {other}"),
            };
            for want in wanted.split('|') {
                assert!(
                    offers(want),
                    "{place}: {definition} offers {offered:?}, not {want}"
                );
            }
            eprintln!("  {place}: {offered:?}");
        }
    }
    Ok(())
}

/// `helm template --set grafanaDashboards.enabled=true` of each chart: one
/// ConfigMap per dashboard file with the sidecar's label and the file as
/// is; none without the value. The API server takes them.
async fn dashboards_render_as_config_maps(ns: &TestNamespace, dashboards: &[Dashboard]) -> Result {
    for chart in CHARTS {
        let off = cluster()
            .helm_template(chart, "dash", &ns.name, &[])
            .await?;
        let text = std::fs::read_to_string(&off)?;
        assert!(
            !text.contains("grafana_dashboard"),
            "{chart}: no dashboard unless grafanaDashboards.enabled"
        );
        let file = cluster()
            .helm_template(
                chart,
                "dash",
                &ns.name,
                &[
                    "--set",
                    "grafanaDashboards.enabled=true",
                    "--set",
                    "grafanaDashboards.annotations.grafana_folder=Cairn",
                ],
            )
            .await?;
        let mut rendered = BTreeMap::new();
        for document in yaml_documents(&std::fs::read_to_string(&file)?)? {
            let labels = &document["metadata"]["labels"];
            if document["kind"] != "ConfigMap" || labels["grafana_dashboard"].is_null() {
                continue;
            }
            let name = document["metadata"]["name"].as_str().unwrap_or("?");
            assert_eq!(labels["grafana_dashboard"], "1", "{chart}: {name}");
            assert_eq!(
                document["metadata"]["annotations"]["grafana_folder"], "Cairn",
                "{chart}: {name}"
            );
            assert_eq!(document["metadata"]["namespace"], ns.name.as_str());
            let data = document["data"].as_object().ok_or("no data")?;
            assert_eq!(data.len(), 1, "{chart}: {name}: one dashboard each");
            for (key, value) in data {
                let json: Value = serde_json::from_str(value.as_str().unwrap_or_default())?;
                rendered.insert(key.clone(), json);
            }
        }
        let shipped: BTreeMap<String, &Value> = dashboards
            .iter()
            .filter(|d| d.chart == chart)
            .map(|d| {
                let key = d.file.file_name().unwrap_or_default().to_string_lossy();
                (key.into_owned(), &d.json)
            })
            .collect();
        assert_eq!(
            rendered.keys().collect::<Vec<_>>(),
            shipped.keys().collect::<Vec<_>>(),
            "{chart}: one ConfigMap per dashboards/*.json"
        );
        for (key, json) in &rendered {
            assert_eq!(
                Some(json),
                shipped.get(key).copied(),
                "{chart}: {key} as shipped"
            );
        }
        let only = cluster()
            .helm_template(
                chart,
                "dash",
                &ns.name,
                &[
                    "--set",
                    "grafanaDashboards.enabled=true",
                    "--show-only",
                    "templates/grafana-dashboards.yaml",
                ],
            )
            .await?;
        cluster().apply_file(&only).await?;
        eprintln!("{chart}: {} dashboard ConfigMaps applied", rendered.len());
    }
    Ok(())
}

fn yaml_documents(text: &str) -> Result<Vec<Value>> {
    let mut documents = Vec::new();
    for document in serde_yaml_ng::Deserializer::from_str(text) {
        let value: Value = serde::Deserialize::deserialize(document)?;
        if !value.is_null() {
            documents.push(value);
        }
    }
    Ok(documents)
}

// ----------------------------------------------------- what makes the metrics

/// A ProviderConfig and a bucket on moto whose versioning is switched off
/// behind the controller's back (a drift it corrects), and a bucket whose
/// ProviderConfig does not exist (reconcile errors, dependency_not_ready).
async fn cloud_resources(ns: &TestNamespace) -> Result {
    let secret: Secret = serde_json::from_value(json!({
        "metadata": { "name": "moto-credentials" },
        "stringData": { "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing" },
    }))?;
    ns.api::<Secret>()
        .create(&PostParams::default(), &secret)
        .await?;
    let config: ProviderConfig = serde_json::from_value(json!({
        "apiVersion": "cloud.cairn.dev/v1alpha1", "kind": "ProviderConfig",
        "metadata": { "name": "moto" },
        "spec": { "type": "aws", "region": "us-east-1", "endpoint": cluster().s3_endpoint(),
                  "credentialsSecretRef": { "name": "moto-credentials" } },
    }))?;
    ns.api::<ProviderConfig>()
        .create(&PostParams::default(), &config)
        .await?;
    let buckets = ns.api::<ObjectBucket>();
    for (name, provider) in [("assets", "moto"), ("orphan", "absent")] {
        let bucket: ObjectBucket = serde_json::from_value(json!({
            "apiVersion": "cloud.cairn.dev/v1alpha1", "kind": "ObjectBucket",
            "metadata": { "name": name, "annotations": { "cloud.cairn.dev/poll-seconds": "10" } },
            "spec": { "providerConfigRef": { "name": provider }, "versioning": true,
                      "deletionPolicy": "Delete" },
        }))?;
        buckets.create(&PostParams::default(), &bucket).await?;
    }
    let ready = wait::for_object(
        &buckets,
        "assets",
        "Ready=True",
        Duration::from_secs(90),
        |b| wait::condition_status(b, "Ready").as_deref() == Some("True"),
    )
    .await?;
    let external = ready
        .annotations()
        .get(EXTERNAL_NAME_ANNOTATION)
        .cloned()
        .ok_or("no external name")?;
    cairn_testing::s3::client(cluster().s3_endpoint())
        .put_bucket_versioning()
        .bucket(&external)
        .versioning_configuration(
            VersioningConfiguration::builder()
                .status(BucketVersioningStatus::Suspended)
                .build(),
        )
        .send()
        .await?;
    Ok(())
}

// ------------------------------------------------------------- the monitors

/// A ServiceMonitor or PodMonitor the charts render.
struct Monitor {
    kind: String,
    namespace: String,
    name: String,
    spec: Value,
}

impl Monitor {
    fn endpoints(&self) -> Vec<Value> {
        let key = if self.kind == "PodMonitor" {
            "podMetricsEndpoints"
        } else {
            "endpoints"
        };
        self.spec[key].as_array().cloned().unwrap_or_default()
    }

    /// prometheus-operator's scrape pool name of endpoint `index`.
    fn pool(&self, index: usize) -> String {
        let kind = if self.kind == "PodMonitor" {
            "podMonitor"
        } else {
            "serviceMonitor"
        };
        format!("{kind}/{}/{}/{index}", self.namespace, self.name)
    }
}

/// The monitors of the three charts, for the releases `install_chart` made.
async fn rendered_monitors(ns: &TestNamespace) -> Result<Vec<Monitor>> {
    let mut monitors = Vec::new();
    let watch = format!("watchNamespace={}", ns.name);
    for chart in CHARTS {
        let mut args = vec![
            "--set",
            watch.as_str(),
            "--set",
            "image.pullPolicy=Never",
            "--set",
            "serviceMonitor.enabled=true",
        ];
        if chart == "cairn-database-controller" {
            args.extend(["--set", "podMonitor.enabled=true"]);
        }
        let release = format!("{}-{chart}", ns.name);
        let file = cluster()
            .helm_template(chart, &release, &ns.name, &args)
            .await?;
        for document in yaml_documents(&std::fs::read_to_string(&file)?)? {
            let kind = document["kind"].as_str().unwrap_or_default();
            if kind == "ServiceMonitor" || kind == "PodMonitor" {
                monitors.push(Monitor {
                    kind: kind.to_owned(),
                    namespace: document["metadata"]["namespace"]
                        .as_str()
                        .unwrap_or(&ns.name)
                        .to_owned(),
                    name: document["metadata"]["name"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned(),
                    spec: document["spec"].clone(),
                });
            }
        }
    }
    let kinds: Vec<_> = monitors.iter().map(|m| m.kind.as_str()).collect();
    assert_eq!(
        kinds.iter().filter(|k| **k == "ServiceMonitor").count(),
        3,
        "a ServiceMonitor per chart: {kinds:?}"
    );
    assert!(kinds.contains(&"PodMonitor"), "the instances' PodMonitor");
    Ok(monitors)
}

/// Prometheus's label name for Kubernetes label `key`.
fn sanitize(key: &str) -> String {
    key.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

fn regex_escape(value: &str) -> String {
    let mut out = String::new();
    for c in value.chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// The scrape configurations prometheus-operator generates for `monitors`
/// (role endpointslice for a ServiceMonitor, pod for a PodMonitor), with the
/// interval shortened. What the operator supports and these monitors do not
/// use (matchExpressions, targetPort, TLS, relabelings) is refused, so a
/// monitor that starts using it fails here instead of passing untested.
fn scrape_configs(monitors: &[Monitor]) -> Result<Vec<Value>> {
    let mut configs = Vec::new();
    for monitor in monitors {
        let pod_monitor = monitor.kind == "PodMonitor";
        let selector = &monitor.spec["selector"];
        if !selector["matchExpressions"].is_null() {
            return Err(format!("{}: matchExpressions unsupported here", monitor.name).into());
        }
        let meta = if pod_monitor {
            "__meta_kubernetes_pod"
        } else {
            "__meta_kubernetes_service"
        };
        let mut keep = Vec::new();
        for (key, value) in selector["matchLabels"]
            .as_object()
            .ok_or_else(|| format!("{}: no matchLabels", monitor.name))?
        {
            let key = sanitize(key);
            keep.push(json!({
                "action": "keep",
                "source_labels": [format!("{meta}_label_{key}"), format!("{meta}_labelpresent_{key}")],
                "regex": format!("({});true", regex_escape(value.as_str().unwrap_or_default())),
            }));
        }
        let namespaces = &monitor.spec["namespaceSelector"];
        let mut discovery = json!({ "role": if pod_monitor { "pod" } else { "endpointslice" } });
        if namespaces["any"] != true {
            let names = match namespaces["matchNames"].as_array() {
                Some(names) => names.clone(),
                None => vec![json!(monitor.namespace)],
            };
            discovery["namespaces"] = json!({ "names": names });
        }
        for (index, endpoint) in monitor.endpoints().into_iter().enumerate() {
            for unsupported in [
                "targetPort",
                "tlsConfig",
                "relabelings",
                "metricRelabelings",
            ] {
                if !endpoint[unsupported].is_null() {
                    return Err(format!("{}: {unsupported} unsupported here", monitor.name).into());
                }
            }
            if !matches!(endpoint["scheme"].as_str(), None | Some("http")) {
                return Err(format!("{}: scheme {}", monitor.name, endpoint["scheme"]).into());
            }
            let port = endpoint["port"]
                .as_str()
                .ok_or_else(|| format!("{}: an endpoint without a port name", monitor.name))?;
            let mut relabel = keep.clone();
            let port_label = if pod_monitor {
                "__meta_kubernetes_pod_container_port_name"
            } else {
                "__meta_kubernetes_endpointslice_port_name"
            };
            relabel.push(json!({ "action": "keep", "source_labels": [port_label], "regex": port }));
            relabel.push(
                json!({ "action": "drop", "source_labels": ["__meta_kubernetes_pod_phase"],
                                 "regex": "(Failed|Succeeded)" }),
            );
            relabel.push(json!({ "source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace" }));
            relabel.push(
                json!({ "source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod" }),
            );
            relabel.push(json!({ "source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container" }));
            if pod_monitor {
                relabel.push(json!({ "target_label": "job",
                                     "replacement": format!("{}/{}", monitor.namespace, monitor.name) }));
            } else {
                relabel.push(json!({ "source_labels": ["__meta_kubernetes_service_name"], "target_label": "service" }));
                relabel.push(json!({ "source_labels": ["__meta_kubernetes_service_name"], "target_label": "job" }));
            }
            relabel.push(json!({ "target_label": "endpoint", "replacement": port }));
            eprintln!(
                "{} {}/{}: port {port}, interval {} (scraped every {SCRAPE_INTERVAL} here)",
                monitor.kind, monitor.namespace, monitor.name, endpoint["interval"]
            );
            configs.push(json!({
                "job_name": monitor.pool(index),
                "honor_labels": endpoint["honorLabels"] == true,
                "scrape_interval": SCRAPE_INTERVAL,
                "scrape_timeout": SCRAPE_INTERVAL,
                "metrics_path": endpoint["path"].as_str().unwrap_or("/metrics"),
                "kubernetes_sd_configs": [discovery.clone()],
                "relabel_configs": relabel,
            }));
        }
    }
    Ok(configs)
}

// ---------------------------------------------------------------- prometheus

/// The pinned `prometheus` server, a local process with its data in a
/// folder of its own; killed (and the folder removed, unless the test
/// failed) when dropped.
struct Prometheus {
    child: Child,
    address: SocketAddr,
    dir: PathBuf,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            // Its configuration, log and data kept; not the credentials.
            for file in ["ca.crt", "admin.crt", "admin.key"] {
                let _ = std::fs::remove_file(self.dir.join(file));
            }
            eprintln!("prometheus's folder kept: {}", self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

impl Prometheus {
    async fn start(scrape_configs: &[Value]) -> Result<Self> {
        let binary = cluster().bin_dir().join("prometheus");
        if !binary.exists() {
            return Err(format!(
                "{} missing: hack/build-tools.sh builds it",
                binary.display()
            )
            .into());
        }
        let dir = std::env::temp_dir().join(format!(
            "cairn-prometheus-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)?
                .as_millis()
        ));
        std::fs::create_dir_all(dir.join("data"))?;
        let admin = admin_tls(&dir)?;
        let api_server = cluster().admin_config().await?.cluster_url.to_string();
        let configs: Vec<Value> = scrape_configs
            .iter()
            .map(|config| {
                let mut config = config.clone();
                for discovery in config["kubernetes_sd_configs"]
                    .as_array_mut()
                    .into_iter()
                    .flatten()
                {
                    discovery["api_server"] = json!(api_server);
                    discovery["tls_config"] = admin.clone();
                }
                config
            })
            .collect();
        // JSON is YAML: Prometheus reads it as its configuration file.
        let config = json!({
            "global": { "scrape_interval": SCRAPE_INTERVAL, "evaluation_interval": SCRAPE_INTERVAL },
            "scrape_configs": configs,
        });
        let config_file = dir.join("prometheus.yml");
        std::fs::write(&config_file, serde_json::to_string_pretty(&config)?)?;
        let log = std::fs::File::create(dir.join("prometheus.log"))?;
        let address = free_address()?;
        let child = Command::new(&binary)
            .arg(format!("--config.file={}", config_file.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address={address}"))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()?;
        let prometheus = Self {
            child,
            address,
            dir,
        };
        wait::until("prometheus ready", Duration::from_secs(60), || async {
            match http_get(address, "/-/ready").await {
                Ok((200, _)) => Ok(Some(())),
                Ok((status, body)) => Err(format!("{status} {body}")),
                Err(e) => Err(e.to_string()),
            }
        })
        .await
        .map_err(|e| format!("{e}; log: {}", prometheus.log_tail()))?;
        Ok(prometheus)
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.dir.join("prometheus.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// GET `path` of the HTTP API; its `data`, or the error it answered.
    async fn api(&self, path: &str) -> Result<Value> {
        let (status, body) = http_get(self.address, path).await?;
        let answer: Value = serde_json::from_str(&body)
            .map_err(|e| format!("GET {path}: {status}, not JSON ({e}): {body:.300}"))?;
        if answer["status"] != "success" {
            return Err(format!(
                "{}: {}",
                answer["errorType"].as_str().unwrap_or("error"),
                answer["error"].as_str().unwrap_or(&body)
            )
            .into());
        }
        Ok(answer["data"].clone())
    }

    /// The series an instant query returns now; an error if it does not
    /// parse.
    async fn query(&self, expr: &str) -> Result<Vec<Value>> {
        let data = self
            .api(&format!("/api/v1/query?query={}", encode(expr)))
            .await
            .map_err(|e| format!("query {expr}: {e}"))?;
        Ok(match &data["result"] {
            Value::Array(series) => series.clone(),
            // A scalar or a string: one value.
            _ => vec![data["result"].clone()],
        })
    }

    /// The metric names `expr` selects, from the parsed expression.
    async fn metrics_named(&self, expr: &str) -> Result<BTreeSet<String>> {
        fn walk(node: &Value, names: &mut BTreeSet<String>) {
            match node {
                Value::Object(map) => {
                    if matches!(
                        map.get("type").and_then(Value::as_str),
                        Some("vectorSelector" | "matrixSelector")
                    ) && let Some(name) = map.get("name").and_then(Value::as_str)
                        && !name.is_empty()
                    {
                        names.insert(name.to_owned());
                    }
                    map.values().for_each(|v| walk(v, names));
                }
                Value::Array(items) => items.iter().for_each(|v| walk(v, names)),
                _ => {}
            }
        }
        let tree = self
            .api(&format!("/api/v1/parse_query?query={}", encode(expr)))
            .await
            .map_err(|e| format!("parse {expr}: {e}"))?;
        let mut names = BTreeSet::new();
        walk(&tree, &mut names);
        Ok(names)
    }

    /// Every metric name scraped so far.
    async fn metric_names(&self) -> Result<BTreeSet<String>> {
        let data = self.api("/api/v1/label/__name__/values").await?;
        Ok(data
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect())
    }

    /// The values of `label` among the series `selector` matched in the
    /// last hour (Grafana's `label_values(selector, label)`).
    async fn label_values(&self, selector: &str, label: &str) -> Result<BTreeSet<String>> {
        let start = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_secs()
            - 3600;
        let data = self
            .api(&format!(
                "/api/v1/series?match[]={}&start={start}",
                encode(selector)
            ))
            .await
            .map_err(|e| format!("series {selector}: {e}"))?;
        Ok(data
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| s[label].as_str().map(str::to_owned))
            .collect())
    }

    /// Waits until every scrape pool has its targets up: two controller
    /// replicas behind each ServiceMonitor (the Services' other ports, the
    /// database controller's webhook among them, are not scraped), and both
    /// instances of the cluster behind the PodMonitor.
    async fn until_targets_up(&self, monitors: &[Monitor], namespace: &str) -> Result {
        let pools: Vec<(String, bool)> = monitors
            .iter()
            .map(|m| (m.pool(0), m.kind == "PodMonitor"))
            .collect();
        let instances: BTreeSet<String> = (0..2).map(|i| format!("{CLUSTER}-{i}")).collect();
        let observed = wait::until("every target up", Duration::from_secs(120), || async {
            let data = self
                .api("/api/v1/targets?state=active")
                .await
                .map_err(|e| e.to_string())?;
            let targets = data["activeTargets"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let mut summary = Vec::new();
            let mut all_up = true;
            for (pool, pod_monitor) in &pools {
                let mine: Vec<&Value> = targets
                    .iter()
                    .filter(|t| t["scrapePool"] == *pool)
                    .collect();
                let up: BTreeSet<String> = mine
                    .iter()
                    .filter(|t| t["health"] == "up")
                    .filter(|t| t["labels"]["namespace"] == namespace)
                    .filter_map(|t| t["labels"]["pod"].as_str().map(str::to_owned))
                    .collect();
                let ok = if *pod_monitor {
                    instances.is_subset(&up)
                } else {
                    mine.len() == 2 && up.len() == 2
                };
                all_up &= ok;
                let errors: Vec<&str> = mine
                    .iter()
                    .filter_map(|t| t["lastError"].as_str())
                    .filter(|e| !e.is_empty())
                    .collect();
                summary.push(format!(
                    "{pool}: {} targets, up {up:?} {errors:?}",
                    mine.len()
                ));
            }
            if all_up {
                Ok(Some(summary))
            } else {
                Err(summary.join("; "))
            }
        })
        .await
        .map_err(|e| format!("{e}; prometheus log: {}", self.log_tail()))?;
        for line in observed {
            eprintln!("  {line}");
        }
        Ok(())
    }
}

/// The admin's client certificate and the cluster's CA, as the kubeconfig
/// of the test cluster holds them, in files for Prometheus's `tls_config`.
fn admin_tls(dir: &Path) -> Result<Value> {
    let kubeconfig: Value = serde_yaml_ng::from_str(&std::fs::read_to_string(
        cluster().state_dir().join("kubeconfig"),
    )?)?;
    let decode = |value: &Value, what: &str| -> Result<Vec<u8>> {
        let text = value
            .as_str()
            .ok_or_else(|| format!("kubeconfig: no {what}"))?;
        Ok(base64_decode(text).ok_or_else(|| format!("kubeconfig: {what} not base64"))?)
    };
    let cluster = &kubeconfig["clusters"][0]["cluster"];
    let user = &kubeconfig["users"][0]["user"];
    let files = [
        (
            "ca_file",
            "ca.crt",
            decode(&cluster["certificate-authority-data"], "CA")?,
        ),
        (
            "cert_file",
            "admin.crt",
            decode(&user["client-certificate-data"], "certificate")?,
        ),
        (
            "key_file",
            "admin.key",
            decode(&user["client-key-data"], "key")?,
        ),
    ];
    let mut tls = json!({});
    for (key, name, bytes) in files {
        let path = dir.join(name);
        std::fs::write(&path, bytes)?;
        tls[key] = json!(path.display().to_string());
    }
    Ok(tls)
}

fn base64_decode(text: &str) -> Option<Vec<u8>> {
    let value = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    };
    let clean: Vec<u8> = text
        .bytes()
        .filter(|c| !c.is_ascii_whitespace() && *c != b'=')
        .collect();
    let mut out = Vec::with_capacity(clean.len() * 3 / 4);
    for chunk in clean.chunks(4) {
        let mut n = 0u32;
        for (i, c) in chunk.iter().enumerate() {
            n |= value(*c)? << (18 - 6 * i);
        }
        out.extend(&n.to_be_bytes()[1..chunk.len()]);
    }
    Some(out)
}

/// Percent-encoding of a query parameter.
fn encode(text: &str) -> String {
    let mut out = String::new();
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-_.~".contains(&byte) {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

// -------------------------------------------------------------------- alerts

/// Every alert expression of every chart parses and runs; every metric it
/// names was scraped, or is allowed to be absent (with why).
async fn alerts_parse_and_name_scraped_metrics(
    prometheus: &Prometheus,
    scraped: &BTreeSet<String>,
) -> Result {
    let allowed: BTreeMap<&str, &str> = ABSENT_UNTIL_A_FAILURE.iter().copied().collect();
    let mut missing = BTreeMap::<String, Vec<String>>::new();
    let mut count = 0;
    for chart in CHARTS {
        let path = repo_root()
            .join("charts")
            .join(chart)
            .join("rules/alerts.yaml");
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        let rules: Value = serde_yaml_ng::from_str(&text)?;
        for group in rules["groups"].as_array().into_iter().flatten() {
            for rule in group["rules"].as_array().into_iter().flatten() {
                let (Some(alert), Some(expr)) = (rule["alert"].as_str(), rule["expr"].as_str())
                else {
                    continue;
                };
                count += 1;
                let firing = prometheus
                    .query(expr)
                    .await
                    .map_err(|e| format!("{chart}: alert {alert}: {e}"))?;
                for name in prometheus.metrics_named(expr).await? {
                    if !scraped.contains(&name) {
                        missing.entry(name).or_default().push(alert.to_owned());
                    }
                }
                if !firing.is_empty() {
                    eprintln!("  alert {alert} would fire (before its `for`): {firing:?}");
                }
            }
        }
    }
    assert!(count > 0, "no alert rules found");
    eprintln!("{count} alert expressions parsed and ran");
    for (name, alerts) in &missing {
        match allowed.get(name.as_str()) {
            Some(why) => eprintln!("  {name} (alerts {alerts:?}) not scraped: {why}"),
            None => panic!(
                "alerts {alerts:?} name {name}, which no target exposed (add it to \
                 ABSENT_UNTIL_A_FAILURE with the reason if it is absent until a failure)"
            ),
        }
    }
    Ok(())
}

/// What the backup controller's per-schedule series look like once the
/// chart's ServiceMonitor scraped them: with honorLabels the schedule's own
/// namespace label is kept (the alerts and the backups dashboard read it),
/// not renamed `exported_namespace` beside the target's.
async fn schedule_labels(prometheus: &Prometheus, namespace: &str) -> Result {
    let series = prometheus
        .query(&format!(
            "cairn_backup_schedule_healthy{{schedule=\"{SCHEDULE}\"}}"
        ))
        .await?;
    assert!(!series.is_empty(), "the schedule's health is scraped");
    for s in &series {
        eprintln!("  {}", s["metric"]);
        assert_eq!(
            s["metric"]["namespace"], namespace,
            "the schedule's namespace: {s}"
        );
        assert!(
            s["metric"]["exported_namespace"].is_null(),
            "no exported_namespace: {s}"
        );
    }
    Ok(())
}
