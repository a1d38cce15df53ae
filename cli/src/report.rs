//! `report`: a support bundle of one DatabaseCluster. Everything is read
//! first (a missing permission or kind is noted in the bundle, not fatal),
//! then scrubbed of Secret values, then written as a .tar.gz or a folder.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use cairn_api::backup::v1::{Backup, BackupSchedule};
use cairn_api::database::instance::{APP_NAME, CLUSTER_LABEL};
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{
    ConfigMap, Event, PersistentVolumeClaim, Pod, Secret, Service, ServiceAccount,
};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ListParams, LogParams};
use kube::{Api, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::args::ReportArgs;
use crate::client::{Target, explain, is_forbidden};
use crate::redact::{Redactor, summary};
use crate::view::render_text;

/// The controllers' pods: Cairn's, but not the database instances (which
/// carry `part-of=cairn` too).
pub const CONTROLLER_SELECTOR: &str =
    "app.kubernetes.io/part-of=cairn,app.kubernetes.io/name!=postgresql";

/// Whether an object belongs to the cluster: owned by it, or labelled as
/// one of its instances' objects (claims are not owned: they outlive it).
pub fn belongs(meta: &ObjectMeta, cluster: &str, uid: Option<&str>) -> bool {
    let owned = meta.owner_references.iter().flatten().any(|o| {
        o.kind == "DatabaseCluster"
            && (Some(o.uid.as_str()) == uid || uid.is_none() && o.name == cluster)
    });
    let labels = meta.labels.as_ref();
    let label = |key: &str| labels.and_then(|l| l.get(key)).map(String::as_str);
    owned
        || (label("app.kubernetes.io/name") == Some(APP_NAME)
            && label(CLUSTER_LABEL) == Some(cluster))
}

/// A bundle being assembled: files by path, and what could not be read.
#[derive(Default, Debug)]
pub struct Bundle {
    pub files: BTreeMap<String, Vec<u8>>,
    pub notes: Vec<String>,
}

impl Bundle {
    fn add(&mut self, path: impl Into<String>, content: impl Into<Vec<u8>>) {
        self.files.insert(path.into(), content.into());
    }

    fn yaml<T: Serialize>(&mut self, path: impl Into<String>, value: &T) {
        let path = path.into();
        match serde_yaml_ng::to_string(value) {
            Ok(text) => self.add(path, text),
            Err(e) => self.notes.push(format!("{path}: cannot write YAML: {e}")),
        }
    }
}

/// The README of a bundle: what it is and what is inside.
pub fn readme(
    cluster: &str,
    namespace: &str,
    generated: Timestamp,
    files: &BTreeMap<String, Vec<u8>>,
    notes: &[String],
    redacted_values: usize,
) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# Cairn support bundle: DatabaseCluster {namespace}/{cluster}\n"
    );
    let _ = writeln!(
        out,
        "Made by kubectl-cairn {} at {generated}.\n",
        env!("CARGO_PKG_VERSION")
    );
    out.push_str(
        "Secrets appear by name, type and keys only (secrets.yaml), never their values; \
         any of their values found in an object or a log was replaced by `<redacted>`",
    );
    let _ = writeln!(
        out,
        " ({redacted_values} values and encodings searched for; values shorter than {} \
         characters and names such as the user and database are left).\n",
        crate::redact::MIN_LENGTH
    );
    out.push_str("## Contents\n\n");
    out.push_str(
        "- `cluster.yaml`: the DatabaseCluster; `status.txt` and `status.json`: what \
         `kubectl cairn status` shows\n\
         - `objects/<kind>/<name>.yaml`: its child objects (owned by it or labelled as its \
         instances'), its Backups and BackupSchedules\n\
         - `secrets.yaml`: the Secrets of the cluster, names, types and keys\n\
         - `events.yaml`: the events of all those objects\n\
         - `logs/<pod>/<container>.log` (and `.previous.log` after a restart): the instances\n\
         - `controllers/<namespace>/<pod>/<container>.log`: the Cairn controllers' pods \
         (label app.kubernetes.io/part-of=cairn)\n\n",
    );
    out.push_str("## Files\n\n");
    for (path, content) in files {
        let _ = writeln!(out, "- `{path}` ({} bytes)", content.len());
    }
    out.push_str("\n## Not collected\n\n");
    if notes.is_empty() {
        out.push_str("Nothing: every read succeeded.\n");
    }
    for note in notes {
        let _ = writeln!(out, "- {note}");
    }
    out
}

/// The uids of `objects`: the events of these objects go into the bundle.
fn uids_of<K: Resource>(objects: &[K]) -> impl Iterator<Item = String> + '_ {
    objects.iter().filter_map(|o| o.meta().uid.clone())
}

/// Objects of kind K in the namespace that belong to the cluster, written
/// under `objects/<dir>/`; their uids.
async fn collect<K>(
    target: &Target,
    bundle: &mut Bundle,
    dir: &str,
    keep: impl Fn(&K) -> bool,
) -> Vec<K>
where
    K: Resource<Scope = NamespaceResourceScope> + Clone + DeserializeOwned + Serialize + Debug,
    <K as Resource>::DynamicType: Default,
{
    match target.api::<K>().list(&ListParams::default()).await {
        Ok(list) => {
            let mut kept = Vec::new();
            for mut object in list.items.into_iter().filter(|o| keep(o)) {
                object.meta_mut().managed_fields = None;
                bundle.yaml(format!("objects/{dir}/{}.yaml", object.name_any()), &object);
                kept.push(object);
            }
            kept
        }
        Err(e) => {
            bundle
                .notes
                .push(format!("{dir}: cannot list: {:#}", explain(e)));
            Vec::new()
        }
    }
}

/// The logs of every container of `pod` (the previous run's too after a restart).
async fn pod_logs(api: &Api<Pod>, pod: &Pod, prefix: &str, limit: i64, bundle: &mut Bundle) {
    let name = pod.name_any();
    let spec = pod.spec.clone().unwrap_or_default();
    let restarts: BTreeMap<String, i32> = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|c| (c.name, c.restart_count))
        .collect();
    let containers = spec
        .init_containers
        .unwrap_or_default()
        .into_iter()
        .chain(spec.containers);
    for container in containers {
        let mut runs = vec![false];
        if restarts.get(&container.name).copied().unwrap_or(0) > 0 {
            runs.push(true);
        }
        for previous in runs {
            let params = LogParams {
                container: Some(container.name.clone()),
                previous,
                limit_bytes: Some(limit),
                timestamps: true,
                ..LogParams::default()
            };
            let file = format!(
                "{prefix}/{name}/{}{}.log",
                container.name,
                if previous { ".previous" } else { "" }
            );
            match api.logs(&name, &params).await {
                Ok(text) => bundle.add(file, text),
                Err(e) => bundle.notes.push(format!("{file}: {:#}", explain(e))),
            }
        }
    }
}

/// Reads everything into a bundle (unscrubbed) and the Secrets to scrub.
async fn gather(target: &Target, args: &ReportArgs) -> Result<(Bundle, Vec<Secret>)> {
    let name = args.cluster.as_str();
    let (mut cluster, view) = crate::status::gather(target, name).await?;
    let uid = cluster.uid();
    let uid = uid.as_deref();
    let mut bundle = Bundle::default();
    cluster.metadata.managed_fields = None;
    bundle.yaml("cluster.yaml", &cluster);
    bundle.add("status.txt", render_text(&view, crate::client::now()));
    bundle.add("status.json", serde_json::to_string_pretty(&view)? + "\n");

    let mut uids: BTreeSet<String> = uid.into_iter().map(str::to_owned).collect();
    let mine = |meta: &ObjectMeta| belongs(meta, name, uid);
    macro_rules! children {
        ($($kind:ty => $dir:literal),* $(,)?) => {$(
            uids.extend(uids_of(&collect::<$kind>(target, &mut bundle, $dir, |o| mine(o.meta())).await));
        )*};
    }
    children!(StatefulSet => "statefulsets");
    let pods = collect::<Pod>(target, &mut bundle, "pods", |o| mine(o.meta())).await;
    uids.extend(uids_of(&pods));
    children!(
        PersistentVolumeClaim => "persistentvolumeclaims",
        Service => "services",
        ConfigMap => "configmaps",
        Lease => "leases",
        PodDisruptionBudget => "poddisruptionbudgets",
        ServiceAccount => "serviceaccounts",
        Role => "roles",
        RoleBinding => "rolebindings",
    );
    uids.extend(uids_of(
        &collect::<Backup>(target, &mut bundle, "backups", |b| {
            b.spec.cluster.name == name
        })
        .await,
    ));
    uids.extend(uids_of(
        &collect::<BackupSchedule>(target, &mut bundle, "backupschedules", |s| {
            s.spec.template.spec.cluster.name == name
        })
        .await,
    ));

    // Secrets: the cluster's own and the backup destination's credentials.
    let mut secret_names: BTreeSet<String> = BTreeSet::new();
    if let Some(secret) = cluster
        .status
        .as_ref()
        .and_then(|s| s.credentials_secret.clone())
    {
        secret_names.insert(secret);
    }
    if let Some(s3) = cluster
        .spec
        .backup
        .as_ref()
        .and_then(|b| b.destination.s3.as_ref())
    {
        secret_names.insert(s3.credentials_secret.name.clone());
    }
    let secrets = match target.api::<Secret>().list(&ListParams::default()).await {
        Ok(list) => list
            .items
            .into_iter()
            .filter(|s| mine(&s.metadata) || secret_names.contains(&s.name_any()))
            .collect(),
        Err(e) => {
            bundle.notes.push(format!(
                "secrets: cannot list ({:#}); no Secret value could be looked for in the logs, \
                 so read them before sharing the bundle",
                explain(e)
            ));
            Vec::new()
        }
    };
    let summaries: Vec<_> = secrets.iter().map(summary).collect();
    bundle.yaml("secrets.yaml", &summaries);
    for secret in &secrets {
        if let Some(uid) = &secret.metadata.uid {
            uids.insert(uid.clone());
        }
    }

    match target.api::<Event>().list(&ListParams::default()).await {
        Ok(list) => {
            let mut events: Vec<Event> = list
                .items
                .into_iter()
                .filter(|e| {
                    e.involved_object
                        .uid
                        .as_ref()
                        .is_some_and(|u| uids.contains(u))
                        || (e.involved_object.kind.as_deref() == Some("DatabaseCluster")
                            && e.involved_object.name.as_deref() == Some(name))
                })
                .map(|mut e| {
                    e.metadata.managed_fields = None;
                    e
                })
                .collect();
            events.sort_by_key(|e| {
                e.last_timestamp
                    .as_ref()
                    .or(e.first_timestamp.as_ref())
                    .map(|t| t.0)
                    .or_else(|| e.event_time.as_ref().map(|t| t.0))
            });
            bundle.yaml("events.yaml", &events);
        }
        Err(e) => bundle
            .notes
            .push(format!("events: cannot list: {:#}", explain(e))),
    }

    let pod_api = target.api::<Pod>();
    for pod in &pods {
        pod_logs(&pod_api, pod, "logs", args.log_limit_bytes, &mut bundle).await;
    }

    let all = Api::<Pod>::all(target.client.clone());
    let controllers = match all
        .list(&ListParams::default().labels(CONTROLLER_SELECTOR))
        .await
    {
        Ok(list) => Some(list.items),
        Err(e) if is_forbidden(&e) => {
            bundle.notes.push(format!(
                "controllers: cannot list pods in all namespaces ({:#}); only namespace {} was searched",
                explain(e),
                target.namespace
            ));
            pod_api
                .list(&ListParams::default().labels(CONTROLLER_SELECTOR))
                .await
                .map_err(|e| bundle.notes.push(format!("controllers: {:#}", explain(e))))
                .ok()
                .map(|l| l.items)
        }
        Err(e) => {
            bundle.notes.push(format!(
                "controllers: cannot list their pods: {:#}",
                explain(e)
            ));
            None
        }
    };
    let controllers = controllers.unwrap_or_default();
    if controllers.is_empty() {
        bundle.notes.push(format!(
            "controllers: no pod labelled {CONTROLLER_SELECTOR} found"
        ));
    }
    for pod in &controllers {
        let namespace = pod.namespace().unwrap_or_default();
        let api = Api::<Pod>::namespaced(target.client.clone(), &namespace);
        let mut listed = pod.clone();
        listed.metadata.managed_fields = None;
        bundle.yaml(
            format!("controllers/{namespace}/{}/pod.yaml", pod.name_any()),
            &listed,
        );
        pod_logs(
            &api,
            pod,
            &format!("controllers/{namespace}"),
            args.log_limit_bytes,
            &mut bundle,
        )
        .await;
    }
    Ok((bundle, secrets))
}

/// The bundle with every file scrubbed and the README added.
pub fn finish(
    bundle: Bundle,
    secrets: &[Secret],
    cluster: &str,
    namespace: &str,
    now: Timestamp,
) -> BTreeMap<String, Vec<u8>> {
    let redactor = Redactor::new(secrets);
    let mut files: BTreeMap<String, Vec<u8>> = bundle
        .files
        .into_iter()
        .map(|(path, content)| (path, redactor.scrub_bytes(&content)))
        .collect();
    let notes: Vec<String> = bundle.notes.iter().map(|n| redactor.scrub(n)).collect();
    let text = readme(cluster, namespace, now, &files, &notes, redactor.len());
    files.insert("README.md".to_owned(), text.into_bytes());
    files
}

fn write_dir(dir: &Path, files: &BTreeMap<String, Vec<u8>>) -> Result<()> {
    if dir.exists() && std::fs::read_dir(dir)?.next().is_some() {
        bail!(
            "{} exists and is not empty: give a new folder",
            dir.display()
        );
    }
    for (path, content) in files {
        let file = dir.join(path);
        if let Some(parent) = file.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("cannot create {}", parent.display()))?;
        }
        std::fs::write(&file, content)
            .with_context(|| format!("cannot write {}", file.display()))?;
    }
    Ok(())
}

fn write_archive(
    file: &Path,
    top: &str,
    files: &BTreeMap<String, Vec<u8>>,
    now: Timestamp,
) -> Result<()> {
    let out = std::fs::File::create_new(file)
        .with_context(|| format!("cannot create {} (it must not exist yet)", file.display()))?;
    let gzip = flate2::write::GzEncoder::new(out, flate2::Compression::default());
    let mut archive = tar::Builder::new(gzip);
    for (path, content) in files {
        let mut header = tar::Header::new_gnu();
        header.set_size(content.len() as u64);
        header.set_mode(0o600);
        header.set_mtime(u64::try_from(now.as_second()).unwrap_or(0));
        header.set_entry_type(tar::EntryType::Regular);
        archive
            .append_data(&mut header, format!("{top}/{path}"), content.as_slice())
            .with_context(|| format!("cannot add {path} to {}", file.display()))?;
    }
    archive
        .into_inner()
        .and_then(|gzip| gzip.finish())
        .and_then(|file| file.sync_all())
        .with_context(|| format!("cannot finish {}", file.display()))?;
    Ok(())
}

pub async fn run(target: &Target, args: &ReportArgs) -> Result<ExitCode> {
    let now = crate::client::now();
    let (bundle, secrets) = gather(target, args).await?;
    let notes = bundle.notes.len();
    let files = finish(bundle, &secrets, &args.cluster, &target.namespace, now);
    let top = format!(
        "cairn-report-{}-{}",
        args.cluster,
        now.strftime("%Y%m%dT%H%M%SZ")
    );
    let written = match &args.dir {
        Some(dir) => {
            write_dir(dir, &files)?;
            dir.clone()
        }
        None => {
            let file = args
                .file
                .clone()
                .unwrap_or_else(|| PathBuf::from(format!("{top}.tar.gz")));
            write_archive(&file, &top, &files, now)?;
            file
        }
    };
    println!("{}", written.display());
    eprintln!(
        "{} files written{}; Secret values are redacted, but read the bundle before you share it",
        files.len(),
        if notes > 0 {
            format!(", {notes} things not collected (see README.md)")
        } else {
            String::new()
        }
    );
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    #[test]
    fn an_object_belongs_by_owner_or_by_the_instance_labels() {
        let mut meta = ObjectMeta::default();
        assert!(!belongs(&meta, "web", Some("uid-1")));
        meta.owner_references = Some(vec![OwnerReference {
            kind: "DatabaseCluster".into(),
            name: "web".into(),
            uid: "uid-1".into(),
            ..OwnerReference::default()
        }]);
        assert!(belongs(&meta, "web", Some("uid-1")));
        assert!(
            !belongs(&meta, "web", Some("uid-2")),
            "a former cluster of that name"
        );
        let claim = ObjectMeta {
            labels: Some(BTreeMap::from([
                ("app.kubernetes.io/name".to_owned(), "postgresql".to_owned()),
                ("app.kubernetes.io/instance".to_owned(), "web".to_owned()),
            ])),
            ..ObjectMeta::default()
        };
        assert!(belongs(&claim, "web", Some("uid-1")));
        assert!(!belongs(&claim, "api", Some("uid-1")));
        // A Helm release called web is not the cluster.
        let mut release = claim.clone();
        release
            .labels
            .as_mut()
            .map(|l| l.insert("app.kubernetes.io/name".into(), "redis".into()));
        assert!(!belongs(&release, "web", Some("uid-1")));
    }

    #[test]
    fn the_finished_bundle_has_a_readme_listing_it_and_no_secret_value() {
        let mut bundle = Bundle::default();
        bundle.add("cluster.yaml", "kind: DatabaseCluster\n");
        bundle.add(
            "logs/web-0/postgres.log",
            "password=S3cr3tPassw0rd accepted\n",
        );
        bundle
            .notes
            .push("controllers: cannot list pods in all namespaces (forbidden)".into());
        let mut secret = Secret::default();
        secret.metadata.name = Some("web-credentials".into());
        secret.data = Some(BTreeMap::from([(
            "password".to_owned(),
            ByteString(b"S3cr3tPassw0rd".to_vec()),
        )]));
        let now: Timestamp = "2026-11-26T12:00:00Z".parse().expect("time");
        let files = finish(bundle, &[secret], "web", "shop", now);
        let readme = String::from_utf8(files["README.md"].clone()).expect("utf-8");
        assert!(readme.contains("DatabaseCluster shop/web"), "{readme}");
        assert!(readme.contains("`cluster.yaml`"), "{readme}");
        assert!(readme.contains("`logs/web-0/postgres.log`"), "{readme}");
        assert!(
            readme.contains("cannot list pods in all namespaces"),
            "{readme}"
        );
        for (path, content) in &files {
            let text = String::from_utf8_lossy(content);
            assert!(!text.contains("S3cr3tPassw0rd"), "{path}: {text}");
        }
        assert_eq!(
            files["logs/web-0/postgres.log"],
            b"password=<redacted> accepted\n"
        );
    }

    #[test]
    fn an_archive_holds_every_file_under_one_folder() {
        let dir = std::env::temp_dir().join(format!("kubectl-cairn-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let file = dir.join("bundle.tar.gz");
        let _ = std::fs::remove_file(&file);
        let files = BTreeMap::from([
            ("README.md".to_owned(), b"readme".to_vec()),
            ("logs/web-0/postgres.log".to_owned(), b"log".to_vec()),
        ]);
        let now: Timestamp = "2026-11-26T12:00:00Z".parse().expect("time");
        write_archive(&file, "top", &files, now).expect("written");
        assert!(
            write_archive(&file, "top", &files, now).is_err(),
            "never overwrites"
        );
        let reader = flate2::read::GzDecoder::new(std::fs::File::open(&file).expect("open"));
        let mut archive = tar::Archive::new(reader);
        let names: Vec<String> = archive
            .entries()
            .expect("entries")
            .map(|e| {
                e.expect("entry")
                    .path()
                    .expect("path")
                    .display()
                    .to_string()
            })
            .collect();
        assert_eq!(names, ["top/README.md", "top/logs/web-0/postgres.log"]);
        let target = dir.join("unpacked");
        let _ = std::fs::remove_dir_all(&target);
        write_dir(&target, &files).expect("dir written");
        assert!(
            write_dir(&target, &files).is_err(),
            "not into a full folder"
        );
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }
}
