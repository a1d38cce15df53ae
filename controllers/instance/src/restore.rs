//! Archived WAL fetched back for a restore. PostgreSQL's `restore_command`
//! is a thin client (`cairn-instance wal-restore <file> <path>`) that asks
//! this long-lived process over the archiver's socket; the fetcher writes
//! the file from the source cluster's archive and, for a segment, starts
//! fetching the next ones into a spool beside the data folder, so replay
//! does not wait for the bucket one segment at a time.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use cairn_storage::{WalArchive, WalName};
use futures::FutureExt;
use futures::future::{BoxFuture, Shared};

use crate::archive::{self, ClientError};
use crate::error::{Context, Error};

/// One fetch into the spool, shared with whoever asks for its file:
/// whether the file was archived and is spooled. A failure reads as not
/// spooled: the file is asked for again when it is wanted.
type Fetch = Shared<BoxFuture<'static, bool>>;

pub struct WalFetcher {
    source: WalArchive,
    data_dir: PathBuf,
    spool: PathBuf,
    /// Segments fetched ahead of the one asked for.
    ahead: usize,
    fetches: Mutex<HashMap<String, Fetch>>,
}

impl WalFetcher {
    /// A fetcher from `source`, spooling beside `data_dir` (same volume, so
    /// a spooled file is renamed into pg_wal, not copied).
    pub fn new(source: WalArchive, data_dir: &Path, ahead: usize) -> Self {
        let spool = data_dir
            .parent()
            .unwrap_or(data_dir)
            .join("cairn-wal-spool");
        // What a previous run spooled may be stale: start empty.
        let _ = std::fs::remove_dir_all(&spool);
        Self {
            source,
            data_dir: data_dir.to_path_buf(),
            spool,
            ahead,
            fetches: Mutex::default(),
        }
    }

    /// Writes archived `name` to `destination` (inside the data folder);
    /// `false` when it was never archived (the end of the archive).
    pub async fn fetch(self: &Arc<Self>, name: WalName, destination: &Path) -> Result<bool, Error> {
        if !destination.starts_with(&self.data_dir) {
            return Err(Error::Refused(format!(
                "{} is outside the data folder",
                destination.display()
            )));
        }
        std::fs::create_dir_all(&self.spool).context(|| self.spool.display().to_string())?;
        let spooled = self.spool.join(name.as_str());
        let ahead = self.lock().remove(name.as_str());
        let mut found = match ahead {
            Some(fetch) => fetch.await,
            None => false,
        };
        if !found {
            // Not fetched ahead, or not there when it was: ask now.
            found = self.source.get(&name, &spooled).await?;
        }
        if !found {
            return Ok(false);
        }
        std::fs::rename(&spooled, destination)
            .context(|| format!("moving {} to {}", spooled.display(), destination.display()))?;
        if name.is_segment() {
            self.fetch_ahead(&name);
        }
        Ok(true)
    }

    /// Starts fetching the segments after `name` that are not on their way.
    fn fetch_ahead(self: &Arc<Self>, name: &WalName) {
        let mut fetches = self.lock();
        let mut next = name.clone();
        for _ in 0..self.ahead {
            let Some(following) = next_segment(&next) else {
                return;
            };
            next = following;
            if fetches.contains_key(next.as_str()) {
                continue;
            }
            let (source, path, file) = (
                self.source.clone(),
                self.spool.join(next.as_str()),
                next.clone(),
            );
            let fetch = async move { source.get(&file, &path).await.unwrap_or(false) }
                .boxed()
                .shared();
            // Polled in the background; the shared result waits for its request.
            tokio::spawn(fetch.clone());
            fetches.insert(next.as_str().to_owned(), fetch);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Fetch>> {
        self.fetches.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The segment after `name` (16 MiB segments: 256 per log file).
fn next_segment(name: &WalName) -> Option<WalName> {
    if !name.is_segment() {
        return None;
    }
    let text = name.as_str();
    let part = |range: std::ops::Range<usize>| u32::from_str_radix(&text[range], 16).ok();
    let (timeline, mut log, mut segment) = (part(0..8)?, part(8..16)?, part(16..24)?);
    if segment >= 0xFF {
        log = log.checked_add(1)?;
        segment = 0;
    } else {
        segment += 1;
    }
    WalName::parse(&format!("{timeline:08X}{log:08X}{segment:08X}")).ok()
}

/// `restore_command`'s client: asks the instance on `socket` for archived
/// `name` at `path` (relative to the data folder, PostgreSQL's working
/// directory). `Ok(false)`: not archived.
pub fn request(socket: &Path, name: &str, path: &Path) -> Result<bool, ClientError> {
    let absolute = std::env::current_dir()
        .map_err(|source| ClientError::Unreachable {
            socket: socket.display().to_string(),
            source,
        })?
        .join(path);
    let request = format!("restore {name} {}", absolute.display());
    match archive::ask(socket, &request, name)?.as_str() {
        "ok" => Ok(true),
        "missing" => Ok(false),
        other => Err(archive::refused(name, other)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_next_segment_crosses_log_files() {
        let next = |n: &str| next_segment(&WalName::parse(n).expect("name")).map(|w| w.to_string());
        assert_eq!(
            next("000000010000000000000001").as_deref(),
            Some("000000010000000000000002")
        );
        assert_eq!(
            next("0000000200000003000000FF").as_deref(),
            Some("000000020000000400000000")
        );
        assert_eq!(next("00000002.history"), None);
    }
}
