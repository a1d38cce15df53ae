//! The charts as a Helm user meets them. Each controller chart's schema
//! refuses bad values with the field's path; every value renders into
//! objects the API server admits under restricted Pod Security; the umbrella
//! chart `charts/cairn` installs the three controllers (each on its own,
//! their CRDs once), passes `helm test`, upgrades to a changed value, drops
//! a disabled controller, and uninstalls keeping the CRDs and the users'
//! objects; a second release of the database chart for another namespace
//! installs beside it.

use std::time::Duration;

use cairn_api::database::v1::DatabaseCluster;
use cairn_e2e::real::{cluster_spec, enforce_restricted_pod_security};
use cairn_testing::{TestNamespace, cluster, wait};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, ResourceExt};
use serde_json::Value;

type Result<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

const CONTROLLER_CHARTS: [&str; 3] = [
    "cairn-database-controller",
    "cairn-backup-controller",
    "cairn-cloud-controller",
];
const UMBRELLA: &str = "cairn";
const TIMEOUT: Duration = Duration::from_secs(120);

/// Every option a user reaches for, set at once.
const EVERY_OPTION: &[&str] = &[
    "--set",
    "nameOverride=pg",
    "--set",
    "image.registry=registry.example:5000",
    "--set",
    "image.repository=team/controller",
    "--set",
    "image.tag=1.2.3",
    "--set",
    "image.digest=sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
    "--set",
    "imagePullSecrets[0].name=registry-credentials",
    "--set",
    "serviceAccount.annotations.eks\\.amazonaws\\.com/role-arn=arn:aws:iam::1:role/cairn",
    "--set",
    "podAnnotations.team=data",
    "--set",
    "podLabels.tier=platform",
    "--set",
    "extraEnv[0].name=HTTPS_PROXY",
    "--set",
    "extraEnv[0].value=http://proxy:3128",
    "--set",
    "runtime.resyncSeconds=600",
    "--set",
    "runtime.shutdownGraceSeconds=40",
    "--set",
    "resources.limits.memory=300Mi",
    "--set",
    "topologySpreadConstraints[0].maxSkew=1",
    "--set",
    "topologySpreadConstraints[0].topologyKey=topology.kubernetes.io/zone",
    "--set",
    "topologySpreadConstraints[0].whenUnsatisfiable=ScheduleAnyway",
    "--set",
    "tolerations[0].operator=Exists",
    "--set",
    "networkPolicy.enabled=true",
    "--set",
    "networkPolicy.metricsFrom[0].namespaceSelector.matchLabels.name=monitoring",
    "--set",
    "crds.install=false",
];

/// The rendered objects of a chart, as JSON.
async fn render(chart: &str, namespace: &str, args: &[&str]) -> Result<Vec<Value>> {
    let file = cluster()
        .helm_template(chart, "render", namespace, args)
        .await?;
    let text = std::fs::read_to_string(file)?;
    let mut objects = Vec::new();
    for document in serde_yaml_ng::Deserializer::from_str(&text) {
        let value: Value = serde::Deserialize::deserialize(document)?;
        if !value.is_null() {
            objects.push(value);
        }
    }
    Ok(objects)
}

fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} rendered"))
}

fn env<'a>(container: &'a Value, name: &str) -> Option<&'a str> {
    container["env"]
        .as_array()?
        .iter()
        .find(|e| e["name"] == name)?["value"]
        .as_str()
}

#[tokio::test]
async fn each_charts_schema_refuses_bad_values_naming_the_field() -> Result {
    let bad: &[(&str, &str)] = &[
        ("image.digest=latest", "'/image/digest'"),
        ("resources.limits.memory=lots", "'/resources/limits/memory'"),
        ("replicas=0", "'/replicas'"),
        ("replica=2", "'replica' not allowed"),
        ("runtime.resyncSeconds=1", "'/runtime/resyncSeconds'"),
        ("logFormat=xml", "'/logFormat'"),
        ("imagePullSecrets[0].secret=x", "'/imagePullSecrets/0'"),
        ("nameOverride=Bad_Name", "'/nameOverride'"),
        (
            "networkPolicy.metricsFrom[0].pods=x",
            "'/networkPolicy/metricsFrom/0'",
        ),
        ("crds.install=maybe", "'/crds/install'"),
    ];
    for chart in CONTROLLER_CHARTS {
        for (value, expected) in bad {
            let refused = cluster()
                .helm_template(chart, "bad", "default", &["--set", value])
                .await
                .expect_err(&format!("{chart} accepted {value}"));
            assert!(
                refused.to_string().contains(expected),
                "{chart} refused {value} without naming {expected}: {refused}"
            );
        }
    }
    // The umbrella checks its own keys, and each controller's values with
    // that controller's schema.
    for (value, expected) in [
        ("databse.enabled=false", "'databse' not allowed"),
        ("database.replicas=0", "'/replicas'"),
        ("backup.image.digest=latest", "'/image/digest'"),
        ("cloud.enabled=no", "'/cloud/enabled'"),
    ] {
        let refused = cluster()
            .helm_template(UMBRELLA, "bad", "default", &["--set", value])
            .await
            .expect_err(&format!("the umbrella accepted {value}"));
        assert!(
            refused.to_string().contains(expected),
            "the umbrella refused {value} without naming {expected}: {refused}"
        );
    }
    Ok(())
}

#[tokio::test]
async fn every_option_renders_what_it_says_and_the_api_server_admits_it() -> Result {
    let ns = cluster().namespace("chart-options").await?;
    enforce_restricted_pod_security(&ns).await?;
    for chart in CONTROLLER_CHARTS {
        let objects = render(chart, &ns.name, EVERY_OPTION).await?;
        assert!(
            !objects
                .iter()
                .any(|o| o["kind"] == "CustomResourceDefinition"),
            "{chart}: crds.install=false renders no CRD"
        );
        let deployment = find(&objects, "Deployment", "render-pg");
        let pod = &deployment["spec"]["template"];
        let container = &pod["spec"]["containers"][0];
        assert_eq!(
            container["image"],
            "registry.example:5000/team/controller:1.2.3@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
            "{chart}"
        );
        assert_eq!(
            pod["spec"]["imagePullSecrets"][0]["name"],
            "registry-credentials"
        );
        assert_eq!(pod["metadata"]["annotations"]["team"], "data");
        assert_eq!(pod["metadata"]["labels"]["tier"], "platform");
        assert_eq!(env(container, "HTTPS_PROXY"), Some("http://proxy:3128"));
        assert_eq!(env(container, "CAIRN_RESYNC_SECONDS"), Some("600"));
        assert_eq!(env(container, "CAIRN_SHUTDOWN_GRACE_SECONDS"), Some("40"));
        assert_eq!(
            pod["spec"]["terminationGracePeriodSeconds"], 50,
            "{chart}: the kubelet waits longer than the controller's shutdown grace"
        );
        assert_eq!(container["resources"]["limits"]["memory"], "300Mi");
        let spread = &pod["spec"]["topologySpreadConstraints"][0];
        assert_eq!(
            spread["labelSelector"]["matchLabels"]["app.kubernetes.io/name"], "pg",
            "{chart}: the spread counts the controller's pods by default"
        );
        let account = find(&objects, "ServiceAccount", "render-pg");
        assert_eq!(
            account["metadata"]["annotations"]["eks.amazonaws.com/role-arn"],
            "arn:aws:iam::1:role/cairn"
        );
        let policy = find(&objects, "NetworkPolicy", "render-pg");
        let metrics_from = &policy["spec"]["ingress"][0]["from"];
        assert_eq!(
            metrics_from[0]["namespaceSelector"]["matchLabels"]["name"],
            "monitoring"
        );
        assert_eq!(
            metrics_from[1]["podSelector"]["matchLabels"]["app.kubernetes.io/component"],
            "helm-test",
            "{chart}: the chart's own helm test may still reach /readyz"
        );
        let test = find(&objects, "Pod", "render-pg-test-ready");
        assert_eq!(test["metadata"]["annotations"]["helm.sh/hook"], "test");
        assert_eq!(
            test["spec"]["containers"][0]["args"][1],
            format!("http://render-pg-metrics.{}.svc:8080/readyz", ns.name)
        );

        // The API server validates every object, and Pod Security admits
        // the test pod (the Deployment's pods are admitted when it runs:
        // the umbrella test below).
        let file = cluster()
            .helm_template(chart, "render", &ns.name, EVERY_OPTION)
            .await?;
        cluster()
            .kubectl(&[
                "apply",
                "--server-side",
                "--dry-run=server",
                "-f",
                &file.to_string_lossy(),
            ])
            .await
            .map_err(|e| format!("{chart}: {e}"))?;
    }
    Ok(())
}

/// Values written before `image.registry` existed named the registry in
/// `image.repository`: they still pull from that registry, and a chart's
/// helm test pod is no replica (not selected by the controller's PDB).
/// A controller's pods carry its chart's name (what the runbooks select
/// by: `app.kubernetes.io/name=cairn-database-controller`) whether the
/// chart is installed alone or under the umbrella chart's alias; the
/// objects' names stay the alias's (`render-database`).
#[tokio::test]
async fn a_controller_is_labelled_with_its_chart_name_alone_or_under_the_umbrella() -> Result {
    let umbrella = render(UMBRELLA, "default", &[]).await?;
    for (chart, alias) in CONTROLLER_CHARTS
        .iter()
        .zip(["database", "backup", "cloud"])
    {
        let alone = render(chart, "default", &[]).await?;
        for (install, objects, name) in [
            ("alone", &alone, format!("render-{chart}")),
            ("under the umbrella", &umbrella, format!("render-{alias}")),
        ] {
            let deployment = find(objects, "Deployment", &name);
            for labels in [
                &deployment["metadata"]["labels"],
                &deployment["spec"]["template"]["metadata"]["labels"],
            ] {
                assert_eq!(
                    labels["app.kubernetes.io/name"], *chart,
                    "{chart} {install}"
                );
                assert_eq!(
                    labels["helm.sh/chart"],
                    format!("{chart}-0.1.0"),
                    "{chart} {install}"
                );
            }
            assert_eq!(
                deployment["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"], *chart,
                "{chart} {install}"
            );
        }
    }
    Ok(())
}

#[tokio::test]
async fn a_repository_naming_its_registry_is_used_as_it_is() -> Result {
    for (repository, image) in [
        (
            "registry.example.com/cairn/db",
            "registry.example.com/cairn/db:1.2.3",
        ),
        ("localhost:5000/db", "localhost:5000/db:1.2.3"),
        ("team/db", "ghcr.io/team/db:1.2.3"),
    ] {
        let repository = format!("image.repository={repository}");
        let objects = render(
            "cairn-database-controller",
            "ops",
            &["--set", &repository, "--set", "image.tag=1.2.3"],
        )
        .await?;
        let deployment = find(&objects, "Deployment", "render-cairn-database-controller");
        assert_eq!(
            deployment["spec"]["template"]["spec"]["containers"][0]["image"], image,
            "{repository}"
        );
        let test = find(
            &objects,
            "Pod",
            "render-cairn-database-controller-test-ready",
        );
        let selector = &find(
            &objects,
            "PodDisruptionBudget",
            "render-cairn-database-controller",
        )["spec"]["selector"]["matchLabels"];
        let labels = &test["metadata"]["labels"];
        assert!(
            selector
                .as_object()
                .is_some_and(|s| s.iter().any(|(k, v)| labels[k] != *v)),
            "the test pod is not selected as a replica: {labels}"
        );
    }
    Ok(())
}

/// cert-manager (not installed here: rendered only) issues the webhook's
/// pair into the Secret the controller mounts; the controller then needs no
/// right on Secrets for its own CA.
#[tokio::test]
async fn cert_manager_issues_the_webhook_certificate_the_controller_mounts() -> Result {
    let chart = "cairn-database-controller";
    let objects = render(
        chart,
        "ops",
        &["--set", "webhook.certificates.certManager.enabled=true"],
    )
    .await?;
    let certificate = find(
        &objects,
        "Certificate",
        "render-cairn-database-controller-webhook",
    );
    assert_eq!(
        certificate["spec"]["secretName"],
        "render-cairn-database-controller-webhook-tls"
    );
    assert_eq!(
        certificate["spec"]["dnsNames"][0],
        "render-cairn-database-controller-webhook.ops.svc"
    );
    assert_eq!(
        certificate["spec"]["issuerRef"]["name"], "render-cairn-database-controller-webhook-ca",
        "without an issuerRef the chart has cert-manager make a CA"
    );
    find(
        &objects,
        "Issuer",
        "render-cairn-database-controller-webhook-ca",
    );
    let deployment = find(&objects, "Deployment", "render-cairn-database-controller");
    let spec = &deployment["spec"]["template"]["spec"];
    assert_eq!(
        spec["volumes"][0]["secret"]["secretName"],
        "render-cairn-database-controller-webhook-tls"
    );
    assert_eq!(
        env(&spec["containers"][0], "CAIRN_WEBHOOK_CERT_DIR"),
        Some("/certs")
    );
    assert!(
        !objects.iter().any(|o| o["metadata"]["name"]
            == "render-cairn-database-controller-webhook-ca"
            && o["kind"] == "Role"),
        "no Secret rights for a self-managed CA"
    );

    let with_issuer = render(
        chart,
        "ops",
        &[
            "--set",
            "webhook.certificates.certManager.enabled=true",
            "--set",
            "webhook.certificates.certManager.issuerRef.name=corporate-ca",
            "--set",
            "webhook.certificates.certManager.issuerRef.kind=ClusterIssuer",
        ],
    )
    .await?;
    let certificate = find(
        &with_issuer,
        "Certificate",
        "render-cairn-database-controller-webhook",
    );
    assert_eq!(certificate["spec"]["issuerRef"]["name"], "corporate-ca");
    assert!(
        !with_issuer.iter().any(|o| o["kind"] == "Issuer"),
        "a given issuer: the chart makes none"
    );
    Ok(())
}

#[tokio::test]
async fn the_umbrella_installs_each_controller_upgrades_and_uninstalls_keeping_the_crds() -> Result
{
    let ns = cluster().namespace_on_real_nodes("umbrella").await?;
    enforce_restricted_pod_security(&ns).await?;
    let release = format!("{}-cairn", ns.name);
    let mut values = Vec::new();
    for controller in ["database", "backup", "cloud"] {
        values.push(format!("{controller}.watchNamespace={}", ns.name));
        values.push(format!("{controller}.image.pullPolicy=Never"));
    }
    let mut args: Vec<&str> = Vec::new();
    for value in &values {
        args.extend(["--set", value]);
    }
    cluster()
        .helm_install(UMBRELLA, &release, &ns.name, &args)
        .await?;
    for controller in ["database", "backup", "cloud"] {
        available(&ns, &format!("{release}-{controller}"), 2).await?;
    }
    // One release holds every CRD, the database's converting through this
    // release's webhook.
    let crds = Api::<CustomResourceDefinition>::all(ns.client.clone());
    for crd in cairn_api::crds::all() {
        let installed = crds.get(&crd.name_any()).await?;
        assert_eq!(
            installed
                .annotations()
                .get("meta.helm.sh/release-name")
                .map(String::as_str),
            Some(release.as_str()),
            "{} belongs to the umbrella release",
            crd.name_any()
        );
    }
    let database_crd = crds.get("databaseclusters.database.cairn.dev").await?;
    let service = database_crd
        .spec
        .conversion
        .and_then(|c| c.webhook)
        .and_then(|w| w.client_config)
        .and_then(|c| c.service)
        .expect("a conversion webhook Service");
    assert_eq!(
        (service.name.as_str(), service.namespace.as_str()),
        (
            format!("{release}-database-webhook").as_str(),
            ns.name.as_str()
        )
    );

    // helm test: each controller's own image asks its Service for /readyz.
    let tested = cluster()
        .helm(&["test", &release, "--namespace", &ns.name, "--timeout", "2m"])
        .await?;
    for controller in ["database", "backup", "cloud"] {
        let test = format!("{release}-{controller}-test-ready");
        assert!(
            tested.stdout.contains(&format!("TEST SUITE:     {test}"))
                && tested.stdout.contains("Succeeded"),
            "helm test ran {test}: {}",
            tested.stdout
        );
    }

    // A user's object, which must outlive the release.
    let clusters = ns.api::<DatabaseCluster>();
    let mut spec = cluster_spec(1);
    spec.paused = true;
    clusters
        .create(
            &PostParams::default(),
            &DatabaseCluster {
                metadata: ObjectMeta {
                    name: Some("kept".into()),
                    ..ObjectMeta::default()
                },
                spec,
                status: None,
            },
        )
        .await?;

    // A second release of the database chart, for another namespace: its
    // cluster-scoped objects are its own, it leaves the CRDs to the first.
    let other = cluster().namespace_on_real_nodes("umbrella-other").await?;
    enforce_restricted_pod_security(&other).await?;
    let second = format!("{}-db", other.name);
    let watch = format!("watchNamespace={}", other.name);
    cluster()
        .helm(&[
            "install",
            &second,
            &cairn_testing::helm::chart_dir("cairn-database-controller").to_string_lossy(),
            "--namespace",
            &other.name,
            "--set",
            "crds.install=false",
            "--set",
            &watch,
            "--set",
            "image.pullPolicy=Never",
            "--wait",
            "--timeout",
            "3m",
        ])
        .await?;
    let second_deployment = format!("{second}-cairn-database-controller");
    Api::<Deployment>::namespaced(other.client.clone(), &other.name)
        .get(&second_deployment)
        .await?;
    available(&other, &second_deployment, 2).await?;
    let crd = crds.get("databaseclusters.database.cairn.dev").await?;
    assert_eq!(
        crd.annotations().get("meta.helm.sh/release-name"),
        Some(&release),
        "the second release did not take the CRD"
    );
    let tested = cluster()
        .helm(&[
            "test",
            &second,
            "--namespace",
            &other.name,
            "--timeout",
            "2m",
        ])
        .await?;
    assert!(tested.stdout.contains("Succeeded"), "{}", tested.stdout);
    cluster()
        .helm(&["uninstall", &second, "--namespace", &other.name, "--wait"])
        .await?;

    // helm upgrade to a changed value rolls the controller with it; a
    // disabled controller goes, its CRDs stay.
    let mut upgrade: Vec<&str> = vec![
        "upgrade",
        &release,
        UMBRELLA_DIR.as_str(),
        "--namespace",
        &ns.name,
        "--reuse-values",
        "--set",
        "database.logLevel=debug",
        "--set",
        "backup.enabled=false",
        "--wait",
        "--timeout",
        "3m",
    ];
    upgrade.extend(&args);
    cluster().helm(&upgrade).await?;
    let deployments = ns.api::<Deployment>();
    let database = deployments.get(&format!("{release}-database")).await?;
    let container = &database
        .spec
        .and_then(|s| s.template.spec)
        .expect("pod spec")
        .containers[0];
    let level = container
        .env
        .iter()
        .flatten()
        .find(|e| e.name == "CAIRN_LOG_LEVEL")
        .and_then(|e| e.value.clone());
    assert_eq!(level.as_deref(), Some("debug"));
    available(&ns, &format!("{release}-database"), 2).await?;
    wait::for_deletion(&deployments, &format!("{release}-backup"), TIMEOUT).await?;
    crds.get("backups.backup.cairn.dev").await?;

    cluster()
        .helm(&["uninstall", &release, "--namespace", &ns.name, "--wait"])
        .await?;
    wait::for_deletion(&deployments, &format!("{release}-database"), TIMEOUT).await?;
    for crd in cairn_api::crds::all() {
        crds.get(&crd.name_any())
            .await
            .map_err(|e| format!("{} was deleted with the release: {e}", crd.name_any()))?;
    }
    clusters
        .get("kept")
        .await
        .map_err(|e| format!("the user's DatabaseCluster went with the release: {e}"))?;
    Ok(())
}

static UMBRELLA_DIR: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    cairn_testing::helm::chart_dir(UMBRELLA)
        .to_string_lossy()
        .into_owned()
});

async fn available(ns: &TestNamespace, name: &str, replicas: i32) -> Result {
    wait::for_object(
        &Api::<Deployment>::namespaced(ns.client.clone(), &ns.name),
        name,
        "all replicas available",
        TIMEOUT,
        |d| d.status.as_ref().and_then(|s| s.available_replicas) == Some(replicas),
    )
    .await?;
    Ok(())
}
