//! `status`: reads the cluster and what belongs to it, prints the view.

use std::process::ExitCode;

use anyhow::{Context, Result};
use cairn_api::backup::v1::{Backup, BackupSchedule};
use cairn_api::database::instance::{APP_NAME, CLUSTER_LABEL, MEMBERSHIP_COMPONENT};
use cairn_api::database::v1::DatabaseCluster;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;

use crate::args::Output;
use crate::client::{Target, explain};
use crate::view::{ClusterView, cluster_view, render_text};

/// The instance pods of `cluster`.
pub fn pod_selector(cluster: &str) -> String {
    format!("app.kubernetes.io/name={APP_NAME},{CLUSTER_LABEL}={cluster}")
}

/// Reads everything the view needs. Backups and schedules are optional
/// (the backup controller's CRDs may not be installed).
pub async fn gather(target: &Target, name: &str) -> Result<(DatabaseCluster, ClusterView)> {
    let cluster = target.cluster(name).await?;
    let pods = target
        .api::<Pod>()
        .list(&ListParams::default().labels(&pod_selector(name)))
        .await
        .map_err(explain)
        .context("cannot list the cluster's pods")?
        .items;
    let leases = target
        .api::<Lease>()
        .list(&ListParams::default().labels(&format!(
            "{},app.kubernetes.io/component={MEMBERSHIP_COMPONENT}",
            pod_selector(name)
        )))
        .await
        .map_err(explain)
        .context("cannot list the cluster's membership Leases")?
        .items;
    let backups = optional(target.api::<Backup>().list(&ListParams::default()).await)?;
    let schedules = optional(
        target
            .api::<BackupSchedule>()
            .list(&ListParams::default())
            .await,
    )?;
    let view = cluster_view(&cluster, &pods, &leases, &backups, &schedules);
    Ok((cluster, view))
}

/// A list that is empty when its kind is not installed (404) or the
/// account may not read it (403): the cluster's own facts still show.
fn optional<K>(result: kube::Result<kube::api::ObjectList<K>>) -> Result<Vec<K>>
where
    K: Clone,
{
    match result {
        Ok(list) => Ok(list.items),
        Err(kube::Error::Api(status)) if status.code == 404 || status.code == 403 => Ok(Vec::new()),
        Err(e) => Err(explain(e)),
    }
}

pub async fn run(target: &Target, name: &str, output: Output) -> Result<ExitCode> {
    let (_, view) = gather(target, name).await?;
    let text = match output {
        Output::Text => render_text(&view, crate::client::now()),
        Output::Json => serde_json::to_string_pretty(&view)? + "\n",
        Output::Yaml => serde_yaml_ng::to_string(&view)?,
    };
    print!("{text}");
    Ok(ExitCode::SUCCESS)
}
