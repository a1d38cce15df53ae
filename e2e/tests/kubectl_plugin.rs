//! `kubectl cairn`, the plugin, on the real nodes: built from the workspace,
//! put on PATH alone and run through the pinned kubectl (which proves
//! kubectl discovers it), against a 2-instance cluster with a backup
//! destination, the database and backup controllers installed by their
//! charts. `status -o json` agrees with the DatabaseCluster; `backup --wait`
//! makes a Completed Backup; `switchover --wait` moves the primary to a
//! server out of recovery; `restart --wait` replaces every pod and the
//! cluster is Ready again; `pause` and `resume` flip `spec.paused`; `report`
//! writes a bundle with the cluster and the logs and without the app
//! Secret's passwords anywhere.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use cairn_api::backup::v1::{Backup, BackupPhase};
use cairn_api::database::instance::{OWNER_PASSWORD_KEY, SUPERUSER_PASSWORD_KEY};
use cairn_api::database::v1::DatabaseCluster;
use cairn_e2e::real::{
    READY_TIMEOUT, as_superuser, backup_destination, cluster_spec, current_primary,
    enforce_restricted_pod_security, install_chart, install_controller,
};
use cairn_testing::{Error, TestNamespace, cluster, repo_root, wait};
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::Api;
use kube::ResourceExt;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use serde_json::Value;

type Result<T = ()> = std::result::Result<T, Error>;

const CLUSTER: &str = "shelf";

fn setup(what: impl std::fmt::Display) -> Error {
    Error::Setup(what.to_string())
}

/// Builds the plugin (the same target folder as this test) and copies it
/// alone into a folder for PATH.
fn plugin_dir() -> Result<PathBuf> {
    let exe = std::env::current_exe().map_err(setup)?;
    // <target>/<profile>/deps/kubectl_plugin-<hash>
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .ok_or_else(|| setup(format!("{} is not in a target folder", exe.display())))?;
    let target_dir = profile_dir
        .parent()
        .ok_or_else(|| setup("no target folder"))?;
    let dir = std::env::temp_dir().join(format!("kubectl-cairn-e2e-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(setup)?;
    // The test command's build made it already (cli/tests gives the
    // package a binary to build): building it here again would resolve
    // the workspace's features anew and compile dozens of crates.
    if let Some(built) = std::env::var_os("CAIRN_KUBECTL_CAIRN") {
        std::fs::copy(&built, dir.join("kubectl-cairn")).map_err(setup)?;
        return Ok(dir);
    }
    let started = Instant::now();
    let output = Command::new(env!("CARGO"))
        .current_dir(repo_root())
        .args(["build", "--locked", "-p", "kubectl-cairn", "--target-dir"])
        .arg(target_dir)
        .output()
        .map_err(|e| setup(format!("cannot run cargo: {e}")))?;
    if !output.status.success() {
        return Err(setup(format!(
            "cargo build -p kubectl-cairn failed: {}",
            String::from_utf8_lossy(&output.stderr)
        )));
    }
    eprintln!(
        "kubectl-cairn built in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    std::fs::copy(profile_dir.join("kubectl-cairn"), dir.join("kubectl-cairn")).map_err(setup)?;
    Ok(dir)
}

/// What one `kubectl cairn` run did.
struct Run {
    success: bool,
    stdout: String,
    stderr: String,
}

/// `kubectl cairn ARGS -n <ns>`, the plugin found on PATH by kubectl.
fn kubectl_cairn(plugins: &Path, ns: &TestNamespace, args: &[&str]) -> Result<Run> {
    let path = std::env::join_paths(std::iter::once(plugins.to_path_buf()).chain(
        std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()),
    ))
    .map_err(setup)?;
    let started = Instant::now();
    let output = Command::new(cluster().bin_dir().join("kubectl"))
        .env("PATH", path)
        .env("KUBECONFIG", cluster().state_dir().join("kubeconfig"))
        .arg("cairn")
        .args(args)
        .args(["-n", &ns.name])
        .output()
        .map_err(|e| setup(format!("cannot run kubectl: {e}")))?;
    let run = Run {
        success: output.status.success(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    };
    eprintln!(
        "kubectl cairn {} ({:.1} s, {}):\n{}{}",
        args.join(" "),
        started.elapsed().as_secs_f64(),
        if run.success { "ok" } else { "failed" },
        run.stdout,
        run.stderr
    );
    Ok(run)
}

/// The same, which must succeed; its stdout.
fn ok(plugins: &Path, ns: &TestNamespace, args: &[&str]) -> Result<String> {
    let run = kubectl_cairn(plugins, ns, args)?;
    if !run.success {
        return Err(setup(format!(
            "kubectl cairn {} failed: {}",
            args.join(" "),
            run.stderr
        )));
    }
    Ok(run.stdout)
}

async fn until_ready(clusters: &Api<DatabaseCluster>) -> Result<DatabaseCluster> {
    wait::for_object(clusters, CLUSTER, "Ready", READY_TIMEOUT, |c| {
        wait::condition_status(c, "Ready").as_deref() == Some("True")
            && c.status.as_ref().and_then(|s| s.ready_instances) == Some(2)
    })
    .await
}

async fn pod_uids(ns: &TestNamespace) -> Result<BTreeMap<String, String>> {
    Ok(ns
        .api::<Pod>()
        .list(&ListParams::default().labels(&format!(
            "app.kubernetes.io/name=postgresql,app.kubernetes.io/instance={CLUSTER}"
        )))
        .await?
        .items
        .iter()
        .map(|p| (p.name_any(), p.uid().unwrap_or_default()))
        .collect())
}

#[tokio::test]
async fn kubectl_cairn_operates_a_cluster_on_the_real_nodes() -> Result {
    let plugins = plugin_dir()?;
    let ns = cluster().namespace_on_real_nodes("plugin").await?;
    let version = ok(&plugins, &ns, &["version"])?;
    assert!(version.starts_with("kubectl-cairn "), "{version}");
    enforce_restricted_pod_security(&ns).await?;
    install_controller(&ns).await?;
    install_chart(&ns, "cairn-backup-controller").await?;
    let mut spec = cluster_spec(2);
    spec.backup = Some(backup_destination(&ns, &format!("plugin-{}", ns.name), "e2e").await?);
    let clusters = ns.api::<DatabaseCluster>();
    clusters
        .create(&PostParams::default(), &DatabaseCluster::new(CLUSTER, spec))
        .await?;
    let ready = until_ready(&clusters).await?;

    // A wrong name: a non-zero exit and what to do.
    let missing = kubectl_cairn(&plugins, &ns, &["status", "nosuch"])?;
    assert!(!missing.success, "a missing cluster fails");
    assert!(
        missing
            .stderr
            .contains("DatabaseCluster nosuch not found in namespace")
            && missing.stderr.contains("kubectl get databaseclusters -A")
            && !missing.stderr.contains("panicked"),
        "{}",
        missing.stderr
    );

    // status: the same facts as the DatabaseCluster's status.
    let text = ok(&plugins, &ns, &["status", CLUSTER])?;
    let status = ready.status.clone().unwrap_or_default();
    let primary = status.current_primary.clone().unwrap_or_default();
    assert!(text.contains(&format!("primary {primary}")), "{text}");
    let conditions_of = |c: DatabaseCluster| -> Vec<(String, String)> {
        c.status
            .unwrap_or_default()
            .conditions
            .iter()
            .map(|c| (c.type_.clone(), c.status.clone()))
            .collect()
    };
    let before = conditions_of(clusters.get(CLUSTER).await?);
    let json: Value = serde_json::from_str(&ok(&plugins, &ns, &["status", CLUSTER, "-o", "json"])?)
        .map_err(setup)?;
    let after = conditions_of(clusters.get(CLUSTER).await?);
    assert_eq!(json["currentPrimary"], primary.as_str());
    assert_eq!(json["readyInstances"], 2);
    assert_eq!(json["desiredInstances"], 2);
    assert_eq!(json["paused"], false);
    let pods: Vec<&str> = json["instances"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|i| i["pod"].as_str())
        .collect();
    assert_eq!(pods, [format!("{CLUSTER}-0"), format!("{CLUSTER}-1")]);
    for instance in json["instances"].as_array().into_iter().flatten() {
        let role = if instance["pod"] == primary.as_str() {
            "primary"
        } else {
            "replica"
        };
        assert_eq!(instance["role"], role, "{instance}");
        assert_eq!(instance["serverRole"], role, "{instance}");
        assert_eq!(instance["ready"], true, "{instance}");
        assert!(
            instance["node"]
                .as_str()
                .is_some_and(|n| n.starts_with("cairn-node-")),
            "{instance}"
        );
        assert!(
            instance["walPosition"].is_string() && instance["timeline"].is_number(),
            "{instance}"
        );
    }
    let conditions: Vec<(String, String)> = json["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            (
                c["type"].as_str().unwrap_or_default().to_owned(),
                c["status"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    // The status read just before or just after (a condition may move between).
    assert!(
        conditions == before || conditions == after,
        "{conditions:?} is neither {before:?} nor {after:?}"
    );
    let yaml = ok(&plugins, &ns, &["status", CLUSTER, "-o", "yaml"])?;
    assert!(
        yaml.contains(&format!("currentPrimary: {primary}")),
        "{yaml}"
    );

    // backup: a Backup of the cluster, Completed.
    let started = Instant::now();
    let out = ok(
        &plugins,
        &ns,
        &["backup", CLUSTER, "--wait", "--timeout", "4m"],
    )?;
    let name = out.lines().next().unwrap_or_default().trim().to_owned();
    let backup = ns.api::<Backup>().get(&name).await?;
    assert_eq!(backup.spec.cluster.name, CLUSTER);
    assert_eq!(
        backup.status.as_ref().and_then(|s| s.phase),
        Some(BackupPhase::Completed)
    );
    eprintln!(
        "backup {name} Completed {:.1} s after the command",
        started.elapsed().as_secs_f64()
    );
    let json: Value = serde_json::from_str(&ok(&plugins, &ns, &["status", CLUSTER, "-o", "json"])?)
        .map_err(setup)?;
    assert_eq!(json["lastBackup"]["name"], name.as_str());

    // switchover: the other pod becomes the primary, out of recovery.
    let old_primary = current_primary(&clusters, CLUSTER).await?;
    ok(&plugins, &ns, &["switchover", CLUSTER, "--wait"])?;
    let new_primary = current_primary(&clusters, CLUSTER).await?;
    assert_ne!(new_primary, old_primary);
    assert_eq!(
        as_superuser(&ns, &new_primary, "SELECT pg_is_in_recovery()").await?,
        "f"
    );
    let refused = kubectl_cairn(
        &plugins,
        &ns,
        &["switchover", CLUSTER, "--to", &new_primary],
    )?;
    assert!(
        !refused.success && refused.stderr.contains("already the primary"),
        "{}",
        refused.stderr
    );
    until_ready(&clusters).await?;

    // restart: every pod replaced, the cluster Ready again, the way a
    // rollout goes: the replica first, then a switchover, the old primary
    // last (so with two instances the primary moves).
    let primary_before = current_primary(&clusters, CLUSTER).await?;
    let before = pod_uids(&ns).await?;
    let started = Instant::now();
    ok(
        &plugins,
        &ns,
        &["restart", CLUSTER, "--wait", "--timeout", "8m"],
    )?;
    let after = pod_uids(&ns).await?;
    assert_eq!(before.len(), 2);
    for (pod, uid) in &before {
        assert_ne!(after.get(pod), Some(uid), "{pod} was restarted");
    }
    let restarted = until_ready(&clusters).await?;
    let status = restarted.status.clone().unwrap_or_default();
    assert_ne!(
        status.current_primary.as_deref(),
        Some(primary_before.as_str()),
        "the primary was not restarted in place"
    );
    let record = status.last_switchover.clone();
    assert!(
        record
            .as_ref()
            .is_some_and(|r| r.from == primary_before && r.completed_at.is_some()),
        "the restart switched over from {primary_before}: {record:?}"
    );
    assert_eq!(
        wait::condition_status(&restarted, "Degraded").as_deref(),
        Some("False")
    );
    eprintln!(
        "restart: every pod replaced and Ready in {:.1} s; primary {:?}",
        started.elapsed().as_secs_f64(),
        restarted
            .status
            .as_ref()
            .and_then(|s| s.current_primary.as_deref())
    );
    let template = cluster()
        .kubectl(&[
            "-n",
            &ns.name,
            "get",
            "statefulset",
            CLUSTER,
            "-o",
            "jsonpath={.spec.template.metadata.annotations}",
        ])
        .await?
        .stdout;
    assert!(
        template.contains("database.cairn.dev/restartedAt"),
        "{template}"
    );

    // pause and resume.
    ok(&plugins, &ns, &["pause", CLUSTER])?;
    assert!(clusters.get(CLUSTER).await?.spec.paused);
    let json: Value = serde_json::from_str(&ok(&plugins, &ns, &["status", CLUSTER, "-o", "json"])?)
        .map_err(setup)?;
    assert_eq!(json["paused"], true);
    ok(&plugins, &ns, &["resume", CLUSTER])?;
    assert!(!clusters.get(CLUSTER).await?.spec.paused);

    // report: the cluster, the logs, no password, even one pasted into an
    // annotation of the cluster by mistake.
    let secret = ns
        .api::<Secret>()
        .get(&format!("{CLUSTER}-credentials"))
        .await?;
    let data = secret.data.unwrap_or_default();
    let app_password = data
        .get(OWNER_PASSWORD_KEY)
        .map(|v| String::from_utf8_lossy(&v.0).into_owned())
        .ok_or_else(|| setup("no app password"))?;
    clusters
        .patch(
            CLUSTER,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({ "metadata": { "annotations": {
                "example.com/note": format!("app password is {app_password}") } } })),
        )
        .await?;
    let bundle_dir = plugins.join("bundle");
    let archive = plugins.join("bundle.tar.gz");
    ok(
        &plugins,
        &ns,
        &["report", CLUSTER, "-f", &archive.to_string_lossy()],
    )?;
    std::fs::create_dir_all(&bundle_dir).map_err(setup)?;
    let untar = Command::new("tar")
        .arg("-xzf")
        .arg(&archive)
        .arg("-C")
        .arg(&bundle_dir)
        .status()
        .map_err(setup)?;
    assert!(untar.success(), "the bundle is a valid .tar.gz");
    let top = std::fs::read_dir(&bundle_dir)
        .map_err(setup)?
        .next()
        .ok_or_else(|| setup("empty bundle"))?
        .map_err(setup)?
        .path();
    let files = files_under(&top)?;
    let read = |rel: &str| std::fs::read_to_string(top.join(rel)).unwrap_or_default();
    assert!(
        read("cluster.yaml").contains("kind: DatabaseCluster"),
        "cluster.yaml"
    );
    assert!(
        read("README.md").contains("cluster.yaml"),
        "README lists the files"
    );
    assert!(
        read("secrets.yaml").contains(&format!("{CLUSTER}-credentials")),
        "secrets by name"
    );
    for pod in before.keys() {
        let log = read(&format!("logs/{pod}/postgres.log"));
        assert!(!log.is_empty(), "{pod}'s log is in the bundle: {files:?}");
    }
    assert!(
        files
            .iter()
            .any(|f| f.starts_with("controllers/") && f.ends_with(".log")),
        "the controllers' logs: {files:?}"
    );
    assert!(
        files.iter().any(|f| f.starts_with("objects/statefulsets/")),
        "{files:?}"
    );
    assert!(
        files.iter().any(|f| f.starts_with("objects/backups/")),
        "{files:?}"
    );
    assert!(
        read("cluster.yaml").contains("app password is <redacted>"),
        "the pasted password is redacted"
    );
    let mut checked = 0;
    for key in [OWNER_PASSWORD_KEY, SUPERUSER_PASSWORD_KEY] {
        let Some(value) = data.get(key) else { continue };
        let password = String::from_utf8_lossy(&value.0).into_owned();
        assert!(password.len() >= 6, "{key} is a real password");
        for file in &files {
            let content = std::fs::read(top.join(file)).map_err(setup)?;
            assert!(
                !String::from_utf8_lossy(&content).contains(&password),
                "{file} holds the {key}"
            );
        }
        checked += 1;
    }
    assert_eq!(checked, 2, "both passwords looked for");
    eprintln!("report: {} files, no password in any", files.len());
    let _ = std::fs::remove_dir_all(&plugins);
    Ok(())
}

/// Every file under `dir`, relative to it.
fn files_under(dir: &Path) -> Result<Vec<String>> {
    let mut files = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(folder) = stack.pop() {
        for entry in std::fs::read_dir(&folder).map_err(setup)? {
            let path = entry.map_err(setup)?.path();
            if path.is_dir() {
                stack.push(path);
            } else if let Ok(rel) = path.strip_prefix(dir) {
                files.push(rel.to_string_lossy().into_owned());
            }
        }
    }
    files.sort();
    Ok(files)
}
