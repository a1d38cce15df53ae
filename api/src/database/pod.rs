//! The parts of a pod running `cairn-instance` that two controllers build:
//! the database controller (its clusters' StatefulSets) and the backup
//! controller (the throw-away instance that verifies a backup). One
//! definition, so a verification runs what the cluster runs.

use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMapVolumeSource, EnvVar, KeyToPath, PodSecurityContext, SeccompProfile,
    SecretVolumeSource, SecurityContext, Volume, VolumeMount,
};
use kube::ResourceExt;

use super::instance;
use super::v1::DatabaseCluster;
use crate::backup::v1::{ACCESS_KEY_ID, S3Destination, SECRET_ACCESS_KEY};

/// Default image repository; the tag is `spec.postgres.version`.
pub const DEFAULT_IMAGE_REPOSITORY: &str = "ghcr.io/cairn-dev/postgres";
/// UID and GID of the postgres user in the official images.
pub const POSTGRES_UID: i64 = 999;
/// The volume of a backup destination's credentials.
pub const BACKUP_CREDENTIALS: &str = "backup-credentials";

/// The names of a cluster's children.
pub struct Names {
    pub cluster: String,
    pub config: String,
    pub credentials: String,
    pub read_write: String,
    pub read_only: String,
    /// Secret (with the key) and ConfigMap (without) of the cluster's CA.
    pub ca: String,
    /// Secret of the server certificate every instance serves.
    pub server_tls: String,
}

impl Names {
    pub fn of(cluster: &DatabaseCluster) -> Self {
        let name = cluster.name_any();
        Self {
            config: format!("{name}-config"),
            credentials: format!("{name}-credentials"),
            read_write: format!("{name}-rw"),
            read_only: format!("{name}-ro"),
            ca: format!("{name}-ca"),
            server_tls: format!("{name}-server"),
            cluster: name,
        }
    }
}

/// The image of the cluster's instances.
pub fn image(cluster: &DatabaseCluster) -> String {
    let postgres = &cluster.spec.postgres;
    postgres
        .image
        .clone()
        .unwrap_or_else(|| format!("{DEFAULT_IMAGE_REPOSITORY}:{}", postgres.version))
}

/// Restricted pod security, as the postgres user.
pub fn pod_security_context() -> PodSecurityContext {
    PodSecurityContext {
        run_as_non_root: Some(true),
        run_as_user: Some(POSTGRES_UID),
        run_as_group: Some(POSTGRES_UID),
        fs_group: Some(POSTGRES_UID),
        seccomp_profile: Some(SeccompProfile {
            type_: "RuntimeDefault".to_owned(),
            ..SeccompProfile::default()
        }),
        ..PodSecurityContext::default()
    }
}

/// No privilege, no capability, a read-only root.
pub fn container_security_context() -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        read_only_root_filesystem: Some(true),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".to_owned()]),
            ..Capabilities::default()
        }),
        ..SecurityContext::default()
    }
}

/// The volumes an instance mounts besides its data: the cluster's
/// configuration, credentials and server certificate, scratch folders, and
/// the backup destination's credentials when there is one.
pub fn volumes(cluster: &DatabaseCluster, destination: Option<&S3Destination>) -> Vec<Volume> {
    let names = Names::of(cluster);
    let empty = |name: &str| Volume {
        name: name.to_owned(),
        empty_dir: Some(Default::default()),
        ..Volume::default()
    };
    let secret = |name: &str, secret: &str, keys: Option<&[&str]>| Volume {
        name: name.to_owned(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(secret.to_owned()),
            default_mode: Some(0o400),
            items: keys.map(|keys| {
                keys.iter()
                    .map(|key| KeyToPath {
                        key: (*key).to_owned(),
                        path: (*key).to_owned(),
                        mode: None,
                    })
                    .collect()
            }),
            ..SecretVolumeSource::default()
        }),
        ..Volume::default()
    };
    vec![
        Volume {
            name: "config".to_owned(),
            config_map: Some(ConfigMapVolumeSource {
                name: names.config.clone(),
                ..ConfigMapVolumeSource::default()
            }),
            ..Volume::default()
        },
        secret("credentials", &names.credentials, None),
        secret("tls", &names.server_tls, None),
        empty("run"),
        empty("tmp"),
    ]
    .into_iter()
    .chain(destination.map(|s3| {
        secret(
            BACKUP_CREDENTIALS,
            &s3.credentials_secret.name,
            Some(&[ACCESS_KEY_ID, SECRET_ACCESS_KEY]),
        )
    }))
    .collect()
}

/// Where the instance container mounts them, with `data` at the data mount.
pub fn mounts(with_destination: bool) -> Vec<VolumeMount> {
    let mount = |name: &str, path: &str, read_only: bool| VolumeMount {
        name: name.to_owned(),
        mount_path: path.to_owned(),
        // The API server drops `readOnly: false`; sending it would look
        // like a change on every reconcile.
        read_only: read_only.then_some(true),
        ..VolumeMount::default()
    };
    vec![
        mount("data", instance::DATA_MOUNT, false),
        mount("config", instance::CONFIG_DIR, true),
        mount("credentials", instance::CREDENTIALS_DIR, true),
        mount("tls", instance::TLS_DIR, true),
        mount("run", instance::RUN_DIR, false),
        mount("tmp", "/tmp", false),
    ]
    .into_iter()
    .chain(
        with_destination.then(|| mount(BACKUP_CREDENTIALS, instance::BACKUP_CREDENTIALS_DIR, true)),
    )
    .collect()
}

/// The bucket settings of a destination, as the instance reads them (the
/// credentials come from a volume, never an environment variable).
pub fn destination_env(s3: &S3Destination) -> Vec<EnvVar> {
    env([
        ("CAIRN_BACKUP_BUCKET", Some(s3.bucket.clone())),
        ("CAIRN_BACKUP_ENDPOINT", s3.endpoint.clone()),
        ("CAIRN_BACKUP_REGION", s3.region.clone()),
        ("CAIRN_BACKUP_PREFIX", s3.prefix.clone()),
    ])
}

/// Plain variables, the unset ones left out.
pub fn env<'a>(pairs: impl IntoIterator<Item = (&'a str, Option<String>)>) -> Vec<EnvVar> {
    pairs
        .into_iter()
        .filter_map(|(name, value)| {
            Some(EnvVar {
                name: name.to_owned(),
                value: Some(value?),
                ..EnvVar::default()
            })
        })
        .collect()
}
