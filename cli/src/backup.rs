//! `backup`: a Backup of the cluster, now.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use cairn_api::backup::v1::{Backup, BackupMethod, BackupPhase, BackupSpec};
use cairn_api::common::LocalObjectReference;
use cairn_api::database::v1::DatabaseCluster;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::PostParams;

use crate::args::{BackupArgs, Method};
use crate::client::{Target, explain};

/// The Backup to create. It names no destination: a Backup without one is
/// stored in the cluster's `spec.backup.destination` (the only destination
/// supported yet), so a cluster without one cannot be backed up.
pub fn backup_for(
    cluster: &DatabaseCluster,
    name: Option<&str>,
    method: Method,
    now: Timestamp,
) -> Result<Backup> {
    let cluster_name = cluster.name_any();
    if cluster.spec.backup.is_none() {
        bail!(
            "DatabaseCluster {cluster_name} has no spec.backup.destination: a Backup is stored \
             there, so set one first (see docs/backup-controller.md)"
        );
    }
    let name = match name {
        Some(name) => name.to_owned(),
        None => default_name(&cluster_name, now),
    };
    let method = match method {
        Method::Base => BackupMethod::Physical,
        Method::Logical => BackupMethod::Logical,
    };
    let mut backup = Backup::new(
        &name,
        BackupSpec {
            cluster: LocalObjectReference::new(cluster_name),
            method,
            destination: None,
            deadline_seconds: None,
            deletion_policy: Default::default(),
            verification: None,
        },
    );
    backup.metadata.namespace = cluster.namespace();
    Ok(backup)
}

/// `<cluster>-<UTC time as yyyymmddhhmmss>`, cut to a valid object name.
pub fn default_name(cluster: &str, now: Timestamp) -> String {
    let stamp = now.strftime("%Y%m%d%H%M%S").to_string();
    let keep = 253 - stamp.len() - 1;
    let prefix: String = cluster.chars().take(keep).collect();
    format!("{prefix}-{stamp}")
}

pub async fn run(target: &Target, args: &BackupArgs) -> Result<ExitCode> {
    let cluster = target.cluster(&args.cluster).await?;
    let backup = backup_for(
        &cluster,
        args.name.as_deref(),
        args.method,
        crate::client::now(),
    )?;
    let name = backup.name_any();
    let backups = target.api::<Backup>();
    match backups.create(&PostParams::default(), &backup).await {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.code == 409 => bail!(
            "a Backup named {name} already exists in namespace {}; pick another with --name",
            target.namespace
        ),
        Err(kube::Error::Api(status)) if status.code == 404 => bail!(
            "the Backup kind is not installed in this cluster: install the \
             cairn-backup-controller chart"
        ),
        Err(e) => return Err(explain(e)).context(format!("cannot create Backup {name}")),
    }
    println!("{name}");
    if !args.wait {
        return Ok(ExitCode::SUCCESS);
    }
    eprintln!("waiting for Backup {name} to complete…");
    let deadline = tokio::time::Instant::now() + args.timeout;
    loop {
        let current = backups.get(&name).await.map_err(explain)?;
        let status = current.status.unwrap_or_default();
        match status.phase {
            Some(BackupPhase::Completed) => {
                eprintln!(
                    "Backup {name} Completed{}",
                    status
                        .size_bytes
                        .map(|s| format!(": {s} bytes stored"))
                        .unwrap_or_default()
                );
                return Ok(ExitCode::SUCCESS);
            }
            Some(BackupPhase::Failed) => {
                eprintln!(
                    "Backup {name} Failed: {}",
                    status.error.as_deref().unwrap_or("no reason given")
                );
                return Ok(ExitCode::FAILURE);
            }
            _ => {}
        }
        if tokio::time::Instant::now() >= deadline {
            bail!(
                "Backup {name} is still {:?} after {:?}; follow it with kubectl get backup {name} -w \
                 (is the cairn-backup-controller installed?)",
                status.phase,
                args.timeout
            );
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::cluster;

    #[test]
    fn a_backup_names_its_cluster_and_method_and_inherits_the_destination() {
        let mut web = cluster("web", 2);
        let now: Timestamp = "2026-11-26T12:34:56Z".parse().expect("time");
        let error = backup_for(&web, None, Method::Base, now).expect_err("no destination");
        assert!(
            error.to_string().contains("spec.backup.destination"),
            "{error}"
        );

        web.spec.backup = Some(
            serde_json::from_value(serde_json::json!({ "destination": { "s3": {
                "bucket": "b", "credentialsSecret": { "name": "s" } } } }))
            .expect("backup spec"),
        );
        let backup = backup_for(&web, None, Method::Base, now).expect("backup");
        assert_eq!(backup.name_any(), "web-20261126123456");
        assert_eq!(backup.namespace().as_deref(), Some("shop"));
        assert_eq!(backup.spec.cluster.name, "web");
        assert_eq!(backup.spec.method, BackupMethod::Physical);
        assert_eq!(backup.spec.destination, None, "the cluster's destination");
        let value = serde_json::to_value(&backup).expect("json");
        assert_eq!(value["apiVersion"], "backup.cairn.dev/v1");
        assert_eq!(value["spec"]["method"], "physical");

        let logical = backup_for(&web, Some("nightly"), Method::Logical, now).expect("backup");
        assert_eq!(logical.name_any(), "nightly");
        assert_eq!(logical.spec.method, BackupMethod::Logical);
    }

    #[test]
    fn default_names_stay_valid() {
        let now: Timestamp = "2026-11-26T12:34:56Z".parse().expect("time");
        let long = "a".repeat(300);
        assert_eq!(default_name(&long, now).len(), 253);
    }
}
