//! Where a cluster's files live in a backup bucket: the contract between
//! cairn-instance, which writes them, and the controllers, which read and
//! report them. Built without I/O.
//!
//! ```text
//! <prefix>/<cluster>/wal/<timeline>/<file>.zst   every file PostgreSQL archives
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
}

impl std::fmt::Display for WalName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
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
