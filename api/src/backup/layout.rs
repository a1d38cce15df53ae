//! Where a cluster's files live in a backup bucket: the contract between
//! cairn-instance, which writes them, and the controllers, which read and
//! report them. Built without I/O.
//!
//! ```text
//! <prefix>/<cluster>/wal/<timeline>/<file>.zst   every file PostgreSQL archives
//! <prefix>/<cluster>/base/<id>/data.tar.zst       a base backup (tar of PGDATA)
//! <prefix>/<cluster>/base/<id>/manifest.json      written last: the backup is
//!                                                 complete once it exists
//! <prefix>/<cluster>/dumps/<id>/dump.pgcustom.zst a logical backup (pg_dump,
//!                                                 custom format, of the
//!                                                 application database)
//! <prefix>/<cluster>/dumps/<id>/manifest.json     written last, likewise
//! ```

/// A name that is not one PostgreSQL archives.
#[derive(Debug, thiserror::Error)]
#[error("{0:?} is not the name of a file PostgreSQL archives")]
pub struct InvalidWalName(pub String);

/// The name of a file PostgreSQL hands to `archive_command`: a WAL segment,
/// a partial segment (the last of a timeline a promotion ended), a timeline
/// history file or a backup label. Anything else is refused, so a name can
/// never reach outside the cluster's folder.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WalName(String);

impl WalName {
    pub fn parse(name: &str) -> Result<Self, InvalidWalName> {
        let hex = |s: &str, len: usize| {
            s.len() == len && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'A'..=b'F'))
        };
        let valid = match name.split_once('.') {
            None => hex(name, 24),
            Some((stem, "partial")) => hex(stem, 24),
            Some((stem, "history")) => hex(stem, 8),
            Some((stem, rest)) => match rest.split_once('.') {
                Some((offset, "backup")) => hex(stem, 24) && hex(offset, 8),
                _ => false,
            },
        };
        if valid {
            Ok(Self(name.to_owned()))
        } else {
            Err(InvalidWalName(name.to_owned()))
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The timeline, in the 8 hex digits every such name starts with.
    pub fn timeline(&self) -> &str {
        &self.0[..8]
    }

    /// A complete segment (not a history file, label or partial segment).
    pub fn is_segment(&self) -> bool {
        self.0.len() == 24
    }

    /// The 16 hex digits of the segment a segment, partial segment or
    /// backup label belongs to (whatever its timeline); `None` for a
    /// timeline history file, which belongs to no segment.
    pub fn segment_number(&self) -> Option<&str> {
        (self.0.len() >= 24 && !self.0.ends_with(".history")).then(|| &self.0[8..24])
    }
}

/// Bytes in a WAL segment: PostgreSQL's default, which Cairn never changes.
pub const WAL_SEGMENT_BYTES: u64 = 16 << 20;

/// The 16 hex digits of the segment holding WAL position `lsn`, as they
/// appear in [`WalName::segment_number`] (names sort as positions do).
pub fn segment_number_of(lsn: u64) -> String {
    let segment = lsn / WAL_SEGMENT_BYTES;
    let per_log = 0x1_0000_0000 / WAL_SEGMENT_BYTES;
    format!("{:08X}{:08X}", segment / per_log, segment % per_log)
}

impl std::fmt::Display for WalName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// A name that cannot be a backup's id.
#[derive(Debug, thiserror::Error)]
#[error("{0:?} is not a backup id (lowercase letters, digits, '-' and '.', at most 253)")]
pub struct InvalidBackupId(pub String);

/// The id of a base backup in its cluster's folder: the Backup object's
/// name and the start of its uid, so a Backup deleted and created again
/// under the same name never meets the first one's files.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct BackupId(String);

impl BackupId {
    pub fn parse(id: &str) -> Result<Self, InvalidBackupId> {
        let valid = !id.is_empty()
            && id.len() <= 253
            && id.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
            && id
                .bytes()
                .all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.'))
            && !id.contains("..");
        if valid {
            Ok(Self(id.to_owned()))
        } else {
            Err(InvalidBackupId(id.to_owned()))
        }
    }

    /// The id of the backup a Backup object asks for.
    pub fn of_backup(name: &str, uid: &str) -> Result<Self, InvalidBackupId> {
        let short: String = uid.chars().filter(|c| *c != '-').take(8).collect();
        Self::parse(&format!("{name}-{short}"))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for BackupId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The files of a base backup's folder.
pub const BASE_BACKUP_DATA: &str = "data.tar.zst";
pub const BASE_BACKUP_MANIFEST: &str = "manifest.json";
/// The data file of a logical backup's folder (beside its manifest).
pub const DUMP_DATA: &str = "dump.pgcustom.zst";

/// What a backup's folder holds, and so where it is: a base backup
/// (pg_basebackup's tar, `base/`) or a logical backup (pg_dump, `dumps/`).
/// Two folders, so a catalog of one never lists the other.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackupKind {
    Base,
    Dump,
}

/// Where one cluster's files live in a bucket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    root: String,
}

impl Layout {
    /// `prefix` as the user gave it (`orders/`, `orders` or empty) and the
    /// cluster's name.
    pub fn new(prefix: &str, cluster: &str) -> Self {
        let prefix = prefix.trim_matches('/');
        let root = if prefix.is_empty() {
            format!("{cluster}/")
        } else {
            format!("{prefix}/{cluster}/")
        };
        Self { root }
    }

    /// Everything archived for the cluster.
    pub fn wal_root(&self) -> String {
        format!("{}wal/", self.root)
    }

    pub fn wal(&self, name: &WalName) -> String {
        format!("{}{}/{}.zst", self.wal_root(), name.timeline(), name)
    }

    /// The cluster's folder, `<prefix>/<cluster>/`.
    pub fn root(&self) -> &str {
        &self.root
    }

    /// Every base backup of the cluster.
    pub fn base_root(&self) -> String {
        self.backups_root(BackupKind::Base)
    }

    /// The folder of one base backup.
    pub fn base_backup(&self, id: &BackupId) -> String {
        self.backup(BackupKind::Base, id)
    }

    /// Every backup of one kind.
    pub fn backups_root(&self, kind: BackupKind) -> String {
        let folder = match kind {
            BackupKind::Base => "base",
            BackupKind::Dump => "dumps",
        };
        format!("{}{folder}/", self.root)
    }

    /// The folder of one backup.
    pub fn backup(&self, kind: BackupKind, id: &BackupId) -> String {
        format!("{}{}/", self.backups_root(kind), id)
    }

    /// The backup of `kind` whose manifest a key is, if it is one.
    pub fn manifest_in(&self, kind: BackupKind, key: &str) -> Option<BackupId> {
        let rest = key.strip_prefix(&self.backups_root(kind))?;
        let id = rest.strip_suffix(&format!("/{BASE_BACKUP_MANIFEST}"))?;
        BackupId::parse(id).ok()
    }

    /// The archived file a key holds, if it is one.
    pub fn wal_name(&self, key: &str) -> Option<WalName> {
        let rest = key.strip_prefix(&self.wal_root())?;
        let (timeline, file) = rest.split_once('/')?;
        let name = WalName::parse(file.strip_suffix(".zst")?).ok()?;
        (name.timeline() == timeline).then_some(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_position_names_its_segment_as_postgres_does() {
        // pg_walfile_name('0/2000028') on timeline 1 is 000000010000000000000002.
        assert_eq!(segment_number_of(0x200_0028), "0000000000000002");
        assert_eq!(
            segment_number_of((3 << 32) | 0xFF00_0000),
            "00000003000000FF"
        );
        let label = WalName::parse("000000020000000300000004.00000028.backup").expect("name");
        assert_eq!(label.segment_number(), Some("0000000300000004"));
        let partial = WalName::parse("000000010000000000000007.partial").expect("name");
        assert_eq!(partial.segment_number(), Some("0000000000000007"));
        assert_eq!(
            WalName::parse("00000002.history")
                .expect("name")
                .segment_number(),
            None
        );
    }

    #[test]
    fn names_postgres_archives_are_accepted_and_nothing_else() {
        for name in [
            "000000010000000000000001",
            "00000002000000A10000003F.partial",
            "00000002.history",
            "000000010000000000000002.00000028.backup",
        ] {
            assert!(WalName::parse(name).is_ok(), "{name}");
        }
        for name in [
            "",
            "00000001000000000000001",
            "000000010000000000000001.zst",
            "../00000001000000000000001",
            "0000000100000000000000g1",
            "000000010000000000000001/x",
            "00000002.history.x",
            "archive_status",
        ] {
            assert!(WalName::parse(name).is_err(), "{name}");
        }
    }

    #[test]
    fn backup_ids_stay_inside_the_clusters_folder() {
        let id = BackupId::of_backup("nightly-20261126", "3f2a9c1e-77aa-4c1b-9d7e-0a1b2c3d4e5f")
            .expect("id");
        assert_eq!(id.as_str(), "nightly-20261126-3f2a9c1e");
        let layout = Layout::new("backups", "orders");
        assert_eq!(
            layout.base_backup(&id),
            "backups/orders/base/nightly-20261126-3f2a9c1e/"
        );
        let manifest = format!("{}{BASE_BACKUP_MANIFEST}", layout.base_backup(&id));
        assert_eq!(
            layout.manifest_in(BackupKind::Base, &manifest),
            Some(id.clone())
        );
        assert_eq!(
            layout.manifest_in(
                BackupKind::Base,
                &format!("{}{BASE_BACKUP_DATA}", layout.base_backup(&id))
            ),
            None
        );
        // A dump's manifest is not a base backup's, and the other way round.
        let dump = format!(
            "{}{BASE_BACKUP_MANIFEST}",
            layout.backup(BackupKind::Dump, &id)
        );
        assert_eq!(dump, format!("backups/orders/dumps/{id}/manifest.json"));
        assert_eq!(layout.manifest_in(BackupKind::Base, &dump), None);
        assert_eq!(
            layout.manifest_in(BackupKind::Dump, &dump),
            Some(id.clone())
        );
        assert_eq!(layout.manifest_in(BackupKind::Dump, &manifest), None);
        for bad in ["", "../x", "a/b", "A", "-a", "a..b"] {
            assert!(BackupId::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn keys_group_files_by_timeline_under_the_clusters_folder() {
        let layout = Layout::new("/backups/", "orders");
        let segment = WalName::parse("000000030000000000000001").expect("name");
        let history = WalName::parse("00000003.history").expect("name");
        assert_eq!(
            layout.wal(&segment),
            "backups/orders/wal/00000003/000000030000000000000001.zst"
        );
        assert_eq!(
            layout.wal(&history),
            "backups/orders/wal/00000003/00000003.history.zst"
        );
        assert_eq!(Layout::new("", "orders").wal_root(), "orders/wal/");
        assert_eq!(layout.wal_name(&layout.wal(&segment)), Some(segment));
        assert_eq!(
            layout.wal_name("backups/orders/wal/00000004/000000030000000000000001.zst"),
            None
        );
        assert_eq!(
            layout.wal_name("backups/other/wal/00000003/00000003.history.zst"),
            None
        );
    }
}
