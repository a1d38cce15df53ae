//! The cluster the unit tests start from: `orders` in namespace `shop`,
//! PostgreSQL 17, 1Gi per instance, generation 2.

use cairn_api::database::v1::{
    DatabaseCluster, DatabaseClusterSpec, DatabaseClusterStatus, PostgresSpec, StorageSpec,
};

pub fn cluster(instances: i32, parameters: &[(&str, &str)]) -> DatabaseCluster {
    let mut cluster = DatabaseCluster::new(
        "orders",
        DatabaseClusterSpec {
            instances,
            postgres: PostgresSpec {
                version: "17".into(),
                image: None,
                parameters: parameters
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            },
            storage: StorageSpec {
                size: "1Gi".into(),
                storage_class_name: None,
            },
            resources: None,
            scheduling: None,
            bootstrap: None,
            paused: false,
            failover: None,
            replication: None,
            backup: None,
        },
    );
    cluster.metadata.namespace = Some("shop".into());
    cluster.metadata.uid = Some("uid-1".into());
    cluster.metadata.generation = Some(2);
    cluster
}

/// `cluster` archiving WAL to bucket `wal` at a local endpoint, under `shop/`.
pub fn archiving(mut cluster: DatabaseCluster) -> DatabaseCluster {
    cluster.spec.backup = Some(
        serde_json::from_value(serde_json::json!({ "destination": { "s3": {
            "endpoint": "http://s3.local:9000",
            "bucket": "wal",
            "prefix": "shop/",
            "credentialsSecret": { "name": "s3" },
        }}, "maxPendingWALSize": "1024Mi" }))
        .expect("a valid backup spec"),
    );
    cluster
}

/// A cluster of three whose status records `primary` as its primary.
pub fn with_primary(primary: &str) -> DatabaseCluster {
    let mut cluster = cluster(3, &[]);
    cluster.status = Some(DatabaseClusterStatus {
        current_primary: Some(primary.to_owned()),
        ..DatabaseClusterStatus::default()
    });
    cluster
}
