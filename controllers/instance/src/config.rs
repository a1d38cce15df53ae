//! Flags and environment. The defaults are the pod contract
//! (`cairn_api::database::instance`); tests point them at local folders.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use cairn_api::database::instance as contract;
use cairn_runtime::config::LogFormat;
use clap::Parser;

use crate::error::{Context, Error};

#[derive(Clone, Debug, Parser)]
#[command(
    name = "cairn-instance",
    version,
    about = "Runs PostgreSQL in a Cairn database pod"
)]
pub struct Config {
    /// The data folder (created by initdb or pg_basebackup when absent).
    #[arg(long, env = "PGDATA", default_value = contract::PGDATA)]
    pub data_dir: PathBuf,
    /// The controller's ConfigMap: postgresql.conf and pg_hba.conf.
    #[arg(long, env = "CAIRN_CONFIG_DIR", default_value = contract::CONFIG_DIR)]
    pub config_dir: PathBuf,
    /// The credentials Secret, one file per key.
    #[arg(long, env = "CAIRN_CREDENTIALS_DIR", default_value = contract::CREDENTIALS_DIR)]
    pub credentials_dir: PathBuf,
    /// The server certificate Secret: `tls.crt`, `tls.key`, `ca.crt`.
    #[arg(long, env = "CAIRN_TLS_DIR", default_value = contract::TLS_DIR)]
    pub tls_dir: PathBuf,
    /// The assigned role (`primary` or `replica`) outside a pod.
    #[arg(long, env = "CAIRN_ROLE_FILE", default_value = contract::ROLE_FILE)]
    pub role_file: PathBuf,
    /// Unix sockets and the replication password file.
    #[arg(long, env = "CAIRN_RUN_DIR", default_value = contract::RUN_DIR)]
    pub run_dir: PathBuf,
    /// Folder of postgres, initdb and pg_basebackup; found on PATH or from
    /// `pg_config --bindir` when unset.
    #[arg(long, env = "CAIRN_POSTGRES_BINDIR")]
    pub bin_dir: Option<PathBuf>,
    #[arg(long, env = "CAIRN_POSTGRES_PORT", default_value_t = contract::POSTGRES_PORT)]
    pub port: u16,
    #[arg(long, env = "CAIRN_LISTEN_ADDRESSES", default_value = "*")]
    pub listen_addresses: String,
    /// `/livez`, `/readyz`, `/status`.
    #[arg(long, env = "CAIRN_HTTP_ADDRESS", default_value_t = SocketAddr::from(([0, 0, 0, 0], contract::INSTANCE_HTTP_PORT)))]
    pub http_address: SocketAddr,
    /// `/metrics` (`cairn_postgres_*`).
    #[arg(long, env = "CAIRN_METRICS_ADDRESS", default_value_t = SocketAddr::from(([0, 0, 0, 0], contract::INSTANCE_METRICS_PORT)))]
    pub metrics_address: SocketAddr,
    /// The DatabaseCluster; the primary is reached at `<cluster>-rw` unless
    /// `--primary-host` says otherwise.
    #[arg(long, env = "CAIRN_CLUSTER")]
    pub cluster: Option<String>,
    #[arg(long, env = "CAIRN_PRIMARY_HOST")]
    pub primary_host: Option<String>,
    #[arg(long, env = "CAIRN_PRIMARY_PORT", default_value_t = contract::POSTGRES_PORT)]
    pub primary_port: u16,
    /// This pod: its role label and its membership Lease (the Downward API sets both).
    #[arg(long, env = "POD_NAME")]
    pub pod_name: Option<String>,
    #[arg(long, env = "POD_NAMESPACE")]
    pub pod_namespace: Option<String>,
    /// In a pod (POD_NAME and POD_NAMESPACE set): learn the role from the
    /// pod and renew the membership Lease. Off: the role file, no heartbeat.
    #[arg(long, env = "CAIRN_MEMBERSHIP", default_value_t = true, action = clap::ArgAction::Set)]
    pub membership: bool,
    /// How often the membership Lease is renewed (the heartbeat).
    #[arg(long, env = "CAIRN_HEARTBEAT_MILLISECONDS", default_value_t = contract::HEARTBEAT_MILLISECONDS)]
    pub heartbeat_milliseconds: u64,
    /// The UDP port of the peers' claims and acknowledgements (`peers`).
    #[arg(long, env = "CAIRN_PEER_PORT", default_value_t = contract::INSTANCE_PEER_PORT)]
    pub peer_port: u16,
    /// A primary that renewed no heartbeat for this long stops taking writes.
    #[arg(long, env = contract::FENCE_SECONDS_ENV, default_value_t = 5)]
    pub fence_seconds: u64,
    /// A primary drops the replication slot of a pod no longer in the
    /// cluster's members once it has been unused this long (the kubelet may
    /// deliver a scale-up's new members list after the new pod's slot).
    #[arg(long, env = "CAIRN_SLOT_GRACE_SECONDS", default_value_t = 300)]
    pub slot_grace_seconds: u64,
    /// A replica further behind its primary than this is not ready.
    #[arg(long, env = "CAIRN_MAX_LAG_BYTES", default_value_t = 16 * 1024 * 1024)]
    pub max_lag_bytes: u64,
    /// A replica that has heard nothing from its primary for this long is not ready.
    #[arg(long, env = "CAIRN_MAX_LAG_SECONDS", default_value_t = 30)]
    pub max_lag_seconds: u64,
    /// After SIGTERM: smart shutdown (waits for sessions) this long, then fast.
    #[arg(long, env = "CAIRN_SMART_SHUTDOWN_SECONDS", default_value_t = 10)]
    pub smart_shutdown_seconds: u64,
    /// Then fast shutdown this long, then immediate (crash recovery at next start).
    #[arg(long, env = "CAIRN_FAST_SHUTDOWN_SECONDS", default_value_t = 30)]
    pub fast_shutdown_seconds: u64,
    /// How often the server, the role file and the configuration are read.
    #[arg(long, env = "CAIRN_POLL_MILLISECONDS", default_value_t = 1000)]
    pub poll_milliseconds: u64,
    /// The backup destination's bucket: WAL is archived there when set.
    #[arg(long, env = "CAIRN_BACKUP_BUCKET")]
    pub backup_bucket: Option<String>,
    /// The S3 API's URL; AWS's regional endpoint when unset.
    #[arg(long, env = "CAIRN_BACKUP_ENDPOINT")]
    pub backup_endpoint: Option<String>,
    #[arg(long, env = "CAIRN_BACKUP_REGION")]
    pub backup_region: Option<String>,
    /// Key prefix of the cluster's folder in the bucket.
    #[arg(long, env = "CAIRN_BACKUP_PREFIX", default_value = "")]
    pub backup_prefix: String,
    /// `AWS_ACCESS_KEY_ID` and `AWS_SECRET_ACCESS_KEY`, one file each (read
    /// at start, never logged).
    #[arg(long, env = "CAIRN_BACKUP_CREDENTIALS_DIR", default_value = contract::BACKUP_CREDENTIALS_DIR)]
    pub backup_credentials_dir: PathBuf,
    /// WAL files uploaded at once: the one PostgreSQL asks for and those
    /// ready after it.
    #[arg(long, env = "CAIRN_WAL_ARCHIVE_PARALLEL", default_value_t = 4)]
    pub wal_archive_parallel: usize,
    /// The guard: above this many bytes of WAL waiting to be archived, the
    /// oldest waiting file is acknowledged without being stored. Unset: WAL
    /// waits for the bucket however long.
    #[arg(long, env = "CAIRN_WAL_ARCHIVE_MAX_PENDING_BYTES")]
    pub wal_archive_max_pending_bytes: Option<u64>,
    /// pg_basebackup's `--max-rate` (e.g. `50M`, bytes per second with a
    /// `k` or `M` suffix): a base backup's read rate, unlimited if unset.
    #[arg(long, env = "CAIRN_BACKUP_MAX_RATE")]
    pub backup_max_rate: Option<String>,
    /// Restore: the cluster whose backup a new cluster's first primary
    /// restores (its folder in this cluster's bucket), the backup's id (the
    /// newest suitable one when unset), and at most one recovery target (all
    /// the archived WAL when none).
    #[arg(long, env = "CAIRN_RESTORE_CLUSTER")]
    pub restore_cluster: Option<String>,
    #[arg(long, env = "CAIRN_RESTORE_BACKUP_ID")]
    pub restore_backup_id: Option<String>,
    #[arg(long, env = "CAIRN_RESTORE_TARGET_TIME")]
    pub restore_target_time: Option<String>,
    #[arg(long, env = "CAIRN_RESTORE_TARGET_LSN")]
    pub restore_target_lsn: Option<String>,
    #[arg(long, env = "CAIRN_RESTORE_TARGET_NAME")]
    pub restore_target_name: Option<String>,
    /// Stop as soon as the backup is consistent.
    #[arg(long, env = "CAIRN_RESTORE_TARGET_END_OF_BACKUP", default_value_t = false, action = clap::ArgAction::Set)]
    pub restore_target_end_of_backup: bool,
    /// The backup restored is a logical one (pg_dump, in the source's
    /// `dumps/` folder; `CAIRN_RESTORE_BACKUP_ID` names it): the first
    /// primary runs initdb, then loads the dump into the application
    /// database before it is ever ready.
    #[arg(long, env = "CAIRN_RESTORE_LOGICAL", default_value_t = false, action = clap::ArgAction::Set)]
    pub restore_logical: bool,
    /// Verify the backup given by the restore settings, report and exit
    /// (see `verify.rs`).
    #[arg(long, env = contract::VERIFY_ENV, default_value_t = false, action = clap::ArgAction::Set)]
    pub verify: bool,
    #[arg(long, env = contract::VERIFY_SQL_ENV)]
    pub verify_sql: Option<String>,
    #[arg(long, env = contract::VERIFY_REPORT_ENV, default_value = contract::VERIFY_REPORT_PATH)]
    pub verify_report: PathBuf,
    #[arg(long, env = "CAIRN_LOG_FORMAT", value_enum, default_value = "json")]
    pub log_format: LogFormat,
    #[arg(long, env = "CAIRN_LOG_LEVEL", default_value = "info")]
    pub log_level: String,
}

impl Config {
    pub fn poll(&self) -> Duration {
        Duration::from_millis(self.poll_milliseconds.max(100))
    }

    /// The host replicas clone from and stream from.
    pub fn primary_host(&self) -> Option<String> {
        self.primary_host
            .clone()
            .or_else(|| self.cluster.as_ref().map(|c| format!("{c}-rw")))
    }

    pub fn credential(&self, key: &str) -> std::io::Result<String> {
        secret_file(&self.credentials_dir, key)
    }

    /// `program` (pg_dump, pg_restore) connected to this instance's server
    /// as the superuser over loopback, on the application database.
    pub fn superuser_tool(
        &self,
        program: &str,
        name: &str,
    ) -> Result<std::process::Command, Error> {
        let read = |key: &str| {
            self.credential(key)
                .context(|| format!("credentials ({key})"))
        };
        let database = read(contract::DATABASE_KEY)?;
        let password = read(contract::SUPERUSER_PASSWORD_KEY)?;
        let mut command = std::process::Command::new(self.program(program));
        command
            .args(["--no-password", "--host", "127.0.0.1", "--port"])
            .arg(self.port.to_string())
            .args(["--username", "postgres", "--dbname", &database])
            .env("PGPASSWORD", password)
            .env("PGSSLMODE", "prefer")
            .env("PGCONNECT_TIMEOUT", "10")
            .env("PGAPPNAME", name)
            .env("LC_ALL", "C");
        Ok(command)
    }

    /// Where WAL is archived, if the cluster has a backup destination.
    pub fn backup_destination(&self) -> std::io::Result<Option<cairn_storage::S3Settings>> {
        let Some(bucket) = &self.backup_bucket else {
            return Ok(None);
        };
        let read = |key: &str| secret_file(&self.backup_credentials_dir, key);
        Ok(Some(cairn_storage::S3Settings {
            endpoint: self.backup_endpoint.clone(),
            bucket: bucket.clone(),
            region: self.backup_region.clone(),
            prefix: self.backup_prefix.clone(),
            access_key_id: read(cairn_storage::s3::ACCESS_KEY_ID)?,
            secret_access_key: read(cairn_storage::s3::SECRET_ACCESS_KEY)?,
        }))
    }

    /// What a restore reads, when this instance is configured to restore:
    /// the source cluster and the backup's id (the newest suitable backup
    /// of the source when unset).
    pub fn restore_source(&self) -> Option<(&str, Option<&str>)> {
        Some((
            self.restore_cluster.as_deref()?,
            self.restore_backup_id.as_deref(),
        ))
    }

    /// Where a restore's replay stops. A time is RFC 3339 here, and is
    /// handed to PostgreSQL with a numeric offset (it takes `Z` for a time
    /// zone abbreviation and refuses it).
    pub fn restore_target(&self) -> Result<crate::conf::RecoveryTarget, Error> {
        use crate::conf::RecoveryTarget;
        Ok(if let Some(time) = &self.restore_target_time {
            let instant: k8s_openapi::jiff::Timestamp = time.parse().map_err(|e| {
                Error::Setup(format!(
                    "CAIRN_RESTORE_TARGET_TIME {time:?}: not an RFC 3339 time: {e}"
                ))
            })?;
            RecoveryTarget::Time(instant.strftime("%Y-%m-%d %H:%M:%S%.f+00:00").to_string())
        } else if let Some(lsn) = &self.restore_target_lsn {
            RecoveryTarget::Lsn(lsn.clone())
        } else if let Some(name) = &self.restore_target_name {
            RecoveryTarget::Name(name.clone())
        } else if self.restore_target_end_of_backup {
            RecoveryTarget::EndOfBackup
        } else {
            RecoveryTarget::EndOfWal
        })
    }

    /// The socket `archive_command` hands WAL files to.
    pub fn wal_archive_socket(&self) -> PathBuf {
        self.run_dir.join(contract::WAL_ARCHIVE_SOCKET)
    }

    /// The path of a PostgreSQL program.
    pub fn program(&self, name: &str) -> PathBuf {
        match &self.bin_dir {
            Some(dir) => dir.join(name),
            None => PathBuf::from(name),
        }
    }
}

/// One key of a mounted Secret, without the line end an editor may add.
fn secret_file(dir: &std::path::Path, key: &str) -> std::io::Result<String> {
    let path = dir.join(key);
    std::fs::read_to_string(&path)
        .map(|s| s.trim_end_matches(['\n', '\r']).to_owned())
        .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))
}
