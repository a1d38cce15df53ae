//! The files written into the data folder, built without I/O.

use std::path::Path;

/// Per-instance settings, appended after the controller's configuration so
/// they win (PostgreSQL keeps the last value of a setting).
pub struct InstanceSettings<'a> {
    pub port: u16,
    pub listen_addresses: &'a str,
    pub socket_dir: &'a Path,
    pub hba_file: &'a Path,
    /// Where a replica streams from; `None` on a primary.
    pub primary_conninfo: Option<String>,
    /// The replica's replication slot on its primary; `None` on a primary.
    pub primary_slot_name: Option<String>,
    /// The certificate and key postgres serves (TLS is always on).
    pub ssl_cert_file: &'a Path,
    pub ssl_key_file: &'a Path,
    /// The command that hands WAL to the instance, when WAL is archived.
    pub archive_command: Option<String>,
    /// While a restore replays the source's WAL (recovery.signal is there).
    pub recovery: Option<Recovery>,
    /// A server that will never have a standby (one verifying a backup):
    /// commits never wait for a synchronous one.
    pub alone: bool,
    /// `wal_keep_size` in MB while a base backup runs (see `backup.rs`).
    pub wal_keep_for_backup_mb: Option<u64>,
}

/// How a restore recovers: where archived WAL comes from, where it stops.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recovery {
    pub restore_command: String,
    pub target: RecoveryTarget,
}

/// Where replay of the archived WAL stops, then the server is promoted (a
/// new timeline).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RecoveryTarget {
    /// All the WAL archived.
    EndOfWal,
    /// As soon as the backup is consistent.
    EndOfBackup,
    /// An RFC 3339 time: commits up to it, none after.
    Time(String),
    Lsn(String),
    /// A restore point made with `pg_create_restore_point`.
    Name(String),
}

/// `postgresql.conf` in the data folder: the controller's file, then the
/// instance's settings.
pub fn postgresql_conf(controller_conf: &str, settings: &InstanceSettings) -> String {
    let mut conf = String::from(
        "# Written by cairn-instance at every start and configuration change: edit the\n\
         # DatabaseCluster's spec.postgres.parameters, not this file.\n",
    );
    conf.push_str(controller_conf);
    if !conf.ends_with('\n') {
        conf.push('\n');
    }
    conf.push_str("\n# Instance settings\n");
    let mut set = |name: &str, value: &str| {
        conf.push_str(&format!("{name} = {}\n", quote(value)));
    };
    set("port", &settings.port.to_string());
    set("listen_addresses", settings.listen_addresses);
    set(
        "unix_socket_directories",
        &settings.socket_dir.display().to_string(),
    );
    set("hba_file", &settings.hba_file.display().to_string());
    set("ssl", "on");
    set(
        "ssl_cert_file",
        &settings.ssl_cert_file.display().to_string(),
    );
    set("ssl_key_file", &settings.ssl_key_file.display().to_string());
    set(
        "primary_conninfo",
        settings.primary_conninfo.as_deref().unwrap_or(""),
    );
    set(
        "primary_slot_name",
        settings.primary_slot_name.as_deref().unwrap_or(""),
    );
    if settings.alone {
        set("synchronous_standby_names", "");
    }
    if let Some(mb) = settings.wal_keep_for_backup_mb {
        set("wal_keep_size", &format!("{mb}MB"));
    }
    if let Some(command) = &settings.archive_command {
        set("archive_mode", "on");
        set("archive_command", command);
    }
    if let Some(recovery) = &settings.recovery {
        set("restore_command", &recovery.restore_command);
        set("recovery_target_timeline", "latest");
        let target = match &recovery.target {
            RecoveryTarget::EndOfWal => None,
            RecoveryTarget::EndOfBackup => Some(("recovery_target", "immediate")),
            RecoveryTarget::Time(time) => Some(("recovery_target_time", time.as_str())),
            RecoveryTarget::Lsn(lsn) => Some(("recovery_target_lsn", lsn.as_str())),
            RecoveryTarget::Name(name) => Some(("recovery_target_name", name.as_str())),
        };
        if let Some((name, value)) = target {
            set(name, value);
            set("recovery_target_action", "promote");
        }
    }
    conf
}

/// `archive_command`: this program as the client of the instance's
/// archiver on `socket`. Paths are quoted for the shell PostgreSQL runs it
/// with, and `%` doubled so PostgreSQL replaces only `%p`.
pub fn archive_command(program: &Path, socket: &Path) -> String {
    format!(
        "{} wal-archive --socket {} %p",
        shell(program),
        shell(socket)
    )
}

/// `restore_command`: this program as the client of the instance, which
/// fetches `%f` from the source's archive into `%p`.
pub fn restore_command(program: &Path, socket: &Path) -> String {
    format!(
        "{} wal-restore --socket {} %f %p",
        shell(program),
        shell(socket)
    )
}

fn shell(path: &Path) -> String {
    let text = path.display().to_string().replace('%', "%%");
    format!("'{}'", text.replace('\'', r"'\''"))
}

/// The physical replication slot an instance streams through: its pod name,
/// in the letters a slot name may have (a-z, 0-9, _; at most 63).
pub fn slot_name(pod: &str) -> String {
    pod.chars()
        .map(|c| match c.to_ascii_lowercase() {
            c @ ('a'..='z' | '0'..='9' | '_') => c,
            _ => '_',
        })
        .take(63)
        .collect()
}

/// A libpq connection string to the primary; the password comes from a
/// password file, so it is in no configuration file and no process list.
/// `tls`: how the primary's certificate is verified.
pub fn primary_conninfo(
    host: &str,
    port: u16,
    user: &str,
    passfile: &Path,
    application_name: &str,
    tls: &[(&str, String)],
) -> String {
    let port = port.to_string();
    let passfile = passfile.display().to_string();
    let mut pairs = vec![
        ("host", host),
        ("port", &port),
        ("user", user),
        ("passfile", &passfile),
        ("application_name", application_name),
    ];
    pairs.extend(tls.iter().map(|(key, value)| (*key, value.as_str())));
    conninfo(&pairs)
}

/// A libpq connection string from keys and values.
pub fn conninfo(pairs: &[(&str, &str)]) -> String {
    pairs
        .iter()
        .map(|(key, value)| format!("{key}={}", conninfo_value(value)))
        .collect::<Vec<_>>()
        .join(" ")
}

/// A `.pgpass` line for one host, port and user.
pub fn pgpass(host: &str, port: u16, user: &str, password: &str) -> String {
    let escape = |s: &str| s.replace('\\', "\\\\").replace(':', "\\:");
    format!(
        "{}:{port}:*:{}:{}\n",
        escape(host),
        escape(user),
        escape(password)
    )
}

/// A postgresql.conf string literal.
fn quote(value: &str) -> String {
    format!("'{}'", value.replace('\\', "\\\\").replace('\'', "''"))
}

/// A conninfo value: quoted when it needs to be.
fn conninfo_value(value: &str) -> String {
    if !value.is_empty() && !value.contains([' ', '\'', '\\']) {
        return value.to_owned();
    }
    format!("'{}'", value.replace('\\', "\\\\").replace('\'', "\\'"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn archive_command_survives_the_shell_and_percent_expansion() {
        let command = archive_command(
            Path::new("/opt/it's 100%/cairn-instance"),
            Path::new("/run/pg/wal-archive.sock"),
        );
        assert_eq!(
            command,
            r"'/opt/it'\''s 100%%/cairn-instance' wal-archive --socket '/run/pg/wal-archive.sock' %p"
        );
    }

    fn settings(primary_conninfo: Option<String>) -> InstanceSettings<'static> {
        InstanceSettings {
            port: 5433,
            listen_addresses: "127.0.0.1",
            socket_dir: Path::new("/run/pg"),
            hba_file: Path::new("/etc/cairn/config/pg_hba.conf"),
            primary_conninfo,
            primary_slot_name: None,
            ssl_cert_file: Path::new("/run/pg/tls/tls.crt"),
            ssl_key_file: Path::new("/run/pg/tls/tls.key"),
            archive_command: None,
            recovery: None,
            alone: false,
            wal_keep_for_backup_mb: None,
        }
    }

    #[test]
    fn a_base_backup_keeps_more_wal_while_it_runs() {
        let mut backing_up = settings(None);
        backing_up.wal_keep_for_backup_mb = Some(2560);
        let conf = postgresql_conf("wal_keep_size = '256MB'", &backing_up);
        assert!(conf.ends_with("wal_keep_size = '2560MB'\n"), "{conf}");
    }

    #[test]
    fn a_server_alone_waits_for_no_synchronous_standby() {
        let controllers = "synchronous_standby_names = 'ANY 1 (orders_1)'";
        let mut alone = settings(None);
        alone.alone = true;
        let conf = postgresql_conf(controllers, &alone);
        assert!(conf.ends_with("synchronous_standby_names = ''\n"), "{conf}");
        assert!(
            !postgresql_conf(controllers, &settings(None))
                .contains("synchronous_standby_names = ''")
        );
    }

    #[test]
    fn instance_settings_follow_the_controllers() {
        let conf = postgresql_conf("port = 5432\nwork_mem = '4MB'", &settings(None));
        let port_lines: Vec<_> = conf.lines().filter(|l| l.starts_with("port")).collect();
        assert_eq!(port_lines, ["port = 5432", "port = '5433'"]);
        assert!(conf.contains("work_mem = '4MB'\n"));
        assert!(conf.contains("primary_conninfo = ''\n"));
        assert!(conf.contains("ssl = 'on'\nssl_cert_file = '/run/pg/tls/tls.crt'\n"));
    }

    #[test]
    fn a_replica_streams_with_a_password_file_and_verifies_its_primary() {
        let info = primary_conninfo(
            "orders-rw",
            5432,
            "streaming_replica",
            Path::new("/run/pg/pgpass"),
            "orders-1",
            &[
                ("sslmode", "verify-full".to_owned()),
                ("sslrootcert", "/run/pg/tls/ca.crt".to_owned()),
            ],
        );
        assert_eq!(
            info,
            "host=orders-rw port=5432 user=streaming_replica passfile=/run/pg/pgpass application_name=orders-1 sslmode=verify-full sslrootcert=/run/pg/tls/ca.crt"
        );
        let conf = postgresql_conf("", &settings(Some(info)));
        assert!(conf.contains("primary_conninfo = 'host=orders-rw port=5432"));
        assert!(!conf.contains("password="));
    }

    #[test]
    fn slot_names_are_pod_names_in_slot_letters() {
        assert_eq!(slot_name("orders-1"), "orders_1");
        assert_eq!(slot_name(&"a".repeat(70)).len(), 63);
    }

    #[test]
    fn values_are_escaped() {
        assert_eq!(quote("it's"), "'it''s'");
        assert_eq!(conninfo_value("a b'c"), "'a b\\'c'");
        assert_eq!(pgpass("h", 1, "u", "p:w\\d"), "h:1:*:u:p\\:w\\\\d\n");
    }
}
