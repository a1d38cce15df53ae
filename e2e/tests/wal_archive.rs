//! Continuous WAL archiving on the real nodes, with the controller installed
//! by its chart: a DatabaseCluster with `spec.backup.destination` has its
//! primary, in its pod, store every completed WAL file in the bucket (moto,
//! reached from the pod network), with the credentials from a Secret volume,
//! and reports it in `ContinuousArchiving`.

use std::time::{Duration, Instant};

use cairn_api::database::v1::DatabaseCluster;
use cairn_e2e::real::{
    READY_TIMEOUT, as_superuser, backup_destination, cluster_spec, namespace_with_controller, psql,
    start_client,
};
use cairn_storage::{S3Settings, WalArchive};
use cairn_testing::{cluster, wait};
use kube::api::PostParams;

type Result<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

const CLUSTER: &str = "ledger";

#[tokio::test]
async fn the_primary_archives_every_completed_wal_file_from_its_pod() -> Result {
    let ns = namespace_with_controller("archive").await?;
    let bucket = format!("wal-{}", ns.name);
    let mut spec = cluster_spec(1);
    spec.backup = Some(backup_destination(&ns, &bucket, "e2e").await?);
    let clusters = ns.api::<DatabaseCluster>();
    clusters
        .create(&PostParams::default(), &DatabaseCluster::new(CLUSTER, spec))
        .await?;
    wait::for_object(&clusters, CLUSTER, "Ready", READY_TIMEOUT, |c| {
        wait::condition_status(c, "Ready").as_deref() == Some("True")
    })
    .await?;

    start_client(&ns, CLUSTER).await?;
    psql(
        &ns,
        "ledger-rw",
        "CREATE TABLE entries (id int PRIMARY KEY)",
    )
    .await?;
    psql(
        &ns,
        "ledger-rw",
        "INSERT INTO entries SELECT generate_series(1, 10000)",
    )
    .await?;
    let switched = Instant::now();
    let segment = as_superuser(&ns, "ledger-0", "SELECT pg_walfile_name(pg_switch_wal())").await?;

    let archive = WalArchive::new(
        &S3Settings {
            endpoint: Some(cluster().s3_endpoint().to_owned()),
            bucket: bucket.clone(),
            region: None,
            prefix: "e2e".into(),
            access_key_id: "testing".into(),
            secret_access_key: "testing".into(),
        },
        CLUSTER,
    );
    let stored = wait::until(
        "the switched segment in the bucket",
        Duration::from_secs(60),
        || async {
            let names = archive.list().await.map_err(|e| e.to_string())?;
            Ok(names.iter().any(|n| n.as_str() == segment).then_some(names))
        },
    )
    .await?;
    eprintln!(
        "{segment} in the bucket {:.1} s after pg_switch_wal; {} files archived",
        switched.elapsed().as_secs_f64(),
        stored.len()
    );
    // Every segment up to it: PostgreSQL archives in order, so no gap.
    let segments: Vec<&str> = stored
        .iter()
        .filter(|n| n.is_segment())
        .map(|n| n.as_str())
        .collect();
    let first = u64::from_str_radix(&segments[0][16..], 16).unwrap_or(u64::MAX);
    let last = u64::from_str_radix(&segment[16..], 16).unwrap_or(0);
    assert!(first <= 2, "the archive starts late: {segments:?}");
    assert_eq!(
        segments.len() as u64,
        last - first + 1,
        "a gap: {segments:?}"
    );

    let archiving = wait::for_object(
        &clusters,
        CLUSTER,
        "ContinuousArchiving=True",
        Duration::from_secs(30),
        |c| wait::condition_status(c, "ContinuousArchiving").as_deref() == Some("True"),
    )
    .await?;
    let message = archiving
        .status
        .iter()
        .flat_map(|s| &s.conditions)
        .find(|c| c.type_ == "ContinuousArchiving")
        .map(|c| c.message.clone())
        .unwrap_or_default();
    assert!(
        message.contains(&format!("s3://{bucket}/e2e/ledger/wal/")),
        "{message}"
    );
    Ok(())
}
