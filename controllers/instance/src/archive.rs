//! Continuous WAL archiving. PostgreSQL's `archive_command` is a thin client
//! (`cairn-instance wal-archive <file>`) that hands the file to this
//! long-lived process over a local socket and succeeds only once the file is
//! stored in the bucket. While it waits, the archiver uploads the next files
//! PostgreSQL has marked ready, so the following requests are answered at
//! once: archiving keeps up with a busy primary without a process and a
//! connection per segment doing all the work.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use cairn_api::database::instance::WalArchiveState;
use cairn_storage::{Stored, WalArchive, WalName};
use futures::FutureExt;
use futures::future::{BoxFuture, Shared};
use k8s_openapi::jiff::Timestamp;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};

use crate::error::{Context, Error};
use crate::restore::WalFetcher;
use crate::state::State;

/// The outcome of one upload, shared by everyone waiting for it.
type Upload = Shared<BoxFuture<'static, Result<(), ArchiveError>>>;

/// Why a file was not archived (the instance's answer to the client).
#[derive(Clone, Debug, thiserror::Error)]
pub enum ArchiveError {
    /// The bucket refused or could not be reached: the storage error's
    /// summary, free of the object's key.
    #[error("{0}")]
    Storage(String),
    /// This instance archives nothing (it verifies a backup).
    #[error("this instance does not archive")]
    Off,
    /// The guard would drop the file, but the gap could not be recorded.
    #[error("cannot record the archive gap, so {file} is kept: {reason}")]
    GapNotRecorded { file: String, reason: String },
}

/// Why `archive_command`'s client failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("{0}: not a WAL file")]
    NotWal(String),
    #[error("{socket}: {source} (is the instance running?)")]
    Unreachable {
        socket: String,
        #[source]
        source: std::io::Error,
    },
    #[error("no answer for {file}: {source}")]
    NoAnswer {
        file: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{file}: {reason}")]
    Refused { file: String, reason: String },
}

/// How long the client waits for an answer before PostgreSQL retries.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(300);
/// A request is one short line, sent at once.
const REQUEST_LIMIT: u64 = 4096;
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// How often the backlog metric is refreshed without requests.
const BACKLOG_INTERVAL: Duration = Duration::from_secs(5);

pub struct Archiver {
    /// This cluster's archive; none on an instance that verifies a backup,
    /// which must never write to the bucket.
    archive: Option<WalArchive>,
    /// `pg_wal` of the data folder.
    wal_dir: PathBuf,
    parallel: usize,
    /// The guard: above this much waiting WAL, files are dropped unstored.
    max_pending_bytes: Option<u64>,
    /// Holds the first file the guard dropped, on the data volume: the gap
    /// outlives a restart of the instance.
    gap_file: PathBuf,
    state: Arc<State>,
    /// Uploads running or done but not yet asked for; at most `parallel`.
    uploads: Mutex<HashMap<String, Upload>>,
    /// During a restore: the source's archive, for `restore_command`.
    restore: Option<Arc<WalFetcher>>,
}

impl Archiver {
    pub fn new(
        archive: WalArchive,
        data_dir: &Path,
        parallel: usize,
        max_pending_bytes: Option<u64>,
        state: Arc<State>,
    ) -> Self {
        Self::build(Some(archive), data_dir, parallel, max_pending_bytes, state)
    }

    fn build(
        archive: Option<WalArchive>,
        data_dir: &Path,
        parallel: usize,
        max_pending_bytes: Option<u64>,
        state: Arc<State>,
    ) -> Self {
        Self {
            archive,
            wal_dir: data_dir.join("pg_wal"),
            parallel: parallel.max(1),
            max_pending_bytes,
            // Beside the data folder, on the same volume, outside what a
            // base backup copies.
            gap_file: data_dir
                .parent()
                .unwrap_or(data_dir)
                .join("cairn-wal-archive-gap"),
            state,
            uploads: Mutex::new(HashMap::new()),
            restore: None,
        }
    }

    /// Answers `restore_command` only, from `fetcher`: every request to
    /// archive is refused.
    pub fn restore_only(fetcher: WalFetcher, data_dir: &Path, state: Arc<State>) -> Self {
        Self::build(None, data_dir, 1, None, state).restoring_with(fetcher)
    }

    /// Also answers `restore_command`, from `fetcher`.
    pub fn restoring_with(mut self, fetcher: WalFetcher) -> Self {
        self.restore = Some(Arc::new(fetcher));
        self
    }

    /// Takes requests on `socket` until the process ends.
    pub async fn serve(self: Arc<Self>, socket: PathBuf) -> Result<(), Error> {
        // A socket left by a previous run of this pod.
        let _ = std::fs::remove_file(&socket);
        let listener =
            UnixListener::bind(&socket).context(|| format!("binding {}", socket.display()))?;
        std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o600))
            .context(|| format!("restricting {}", socket.display()))?;
        match &self.archive {
            Some(archive) => tracing::info!(destination = %archive.location(), "archiving WAL"),
            None => tracing::info!("restoring WAL only: archiving is off"),
        }
        let gap = std::fs::read_to_string(&self.gap_file)
            .ok()
            .map(|first| first.trim().to_owned());
        self.report(|archive| archive.gap = gap);
        let backlog = {
            let archiver = self.clone();
            async move {
                loop {
                    archiver.count_backlog();
                    tokio::time::sleep(BACKLOG_INTERVAL).await;
                }
            }
        };
        tokio::spawn(backlog);
        loop {
            match listener.accept().await {
                Ok((stream, _)) => {
                    tokio::spawn(self.clone().answer(stream));
                }
                // Out of file descriptors, say: PostgreSQL retries the
                // request; the database must not stop for it.
                Err(e) => {
                    tracing::warn!(socket = %socket.display(), "cannot accept a request: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }

    async fn answer(self: Arc<Self>, stream: UnixStream) {
        let (read, mut write) = stream.into_split();
        let mut line = String::new();
        // One short line, soon: a client that sends neither holds nothing.
        let mut reader = tokio::io::BufReader::new(read.take(REQUEST_LIMIT));
        let request = reader.read_line(&mut line);
        if !matches!(
            tokio::time::timeout(REQUEST_TIMEOUT, request).await,
            Ok(Ok(_))
        ) {
            return;
        }
        let line = line.trim_end();
        let reply = if let Some(file) = line.strip_prefix("archive ") {
            match WalName::parse(file) {
                Ok(name) => match self.archive(name).await {
                    Ok(()) => "ok\n".to_owned(),
                    Err(message) => format!("error {message}\n"),
                },
                Err(e) => format!("error {e}\n"),
            }
        } else if let Some(request) = line.strip_prefix("restore ") {
            self.restore(request).await
        } else {
            "error unknown request\n".to_owned()
        };
        let _ = write.write_all(reply.as_bytes()).await;
    }

    /// `restore NAME PATH`: the answer to `restore_command`.
    async fn restore(&self, request: &str) -> String {
        let Some(fetcher) = &self.restore else {
            return "error this instance is not restoring\n".to_owned();
        };
        let Some((file, path)) = request.split_once(' ') else {
            return "error expected a file and a path\n".to_owned();
        };
        let name = match WalName::parse(file) {
            Ok(name) => name,
            Err(e) => return format!("error {e}\n"),
        };
        match fetcher.fetch(name, Path::new(path)).await {
            Ok(true) => "ok\n".to_owned(),
            Ok(false) => "missing\n".to_owned(),
            Err(message) => {
                tracing::warn!(%file, %message, "cannot fetch archived WAL");
                format!("error {message}\n")
            }
        }
    }

    /// Stores `name`, and starts uploading the files ready after it.
    pub async fn archive(&self, name: WalName) -> Result<(), ArchiveError> {
        let Some(archive) = &self.archive else {
            return Err(ArchiveError::Off);
        };
        let ready = self.ready_files();
        self.pending(ready.len());
        // Only segments: history files and labels are small, and recovery
        // across a timeline switch needs them.
        if name.is_segment() && self.over_the_guard(&ready) {
            let stored = self
                .uploads
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(name.as_str())
                .is_some_and(|upload| matches!(upload.peek(), Some(Ok(()))));
            if !stored {
                self.drop_unstored(&name)?;
            }
            return Ok(());
        }
        let upload = {
            let mut uploads = self.uploads.lock().unwrap_or_else(PoisonError::into_inner);
            let upload = match uploads.get(name.as_str()) {
                // A failed upload ahead of the request is tried again now.
                Some(upload) if !matches!(upload.peek(), Some(Err(_))) => upload.clone(),
                _ => self.start(archive, &mut uploads, name.clone()),
            };
            self.look_ahead(archive, &mut uploads, ready);
            upload
        };
        let outcome = upload.await;
        self.uploads
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(name.as_str());
        // The condition follows the files PostgreSQL waits for, in order: a
        // look-ahead upload neither hides nor raises a failure.
        match &outcome {
            Ok(()) => self.report(|archive| {
                archive.last_stored = Some(format!("{:.0}", Timestamp::now()));
                archive.failing = None;
            }),
            Err(e) => self.report(|archive| archive.failing = Some(e.to_string())),
        }
        outcome
    }

    fn start(
        &self,
        archive: &WalArchive,
        uploads: &mut HashMap<String, Upload>,
        name: WalName,
    ) -> Upload {
        let archive = archive.clone();
        let path = self.wal_dir.join(name.as_str());
        let state = self.state.clone();
        let key = name.to_string();
        let upload = async move {
            let started = std::time::Instant::now();
            match archive.put(&name, &path).await {
                Ok(stored) => {
                    let metrics = &state.metrics;
                    metrics.archived.inc();
                    metrics.archive_last_success.set(now());
                    if let Stored::Uploaded { bytes, compressed } = stored {
                        tracing::debug!(file = %name, bytes, compressed, seconds = started.elapsed().as_secs_f64(), "WAL archived");
                    }
                    Ok(())
                }
                Err(e) => {
                    state.metrics.archive_failures.inc();
                    state.metrics.archive_last_failure.set(now());
                    tracing::warn!(file = %name, reason = e.reason(), "WAL archiving failed: {e}");
                    // Without the object's key: the same fault reads the
                    // same for every file, so the status does not churn.
                    Err(ArchiveError::Storage(e.summary()))
                }
            }
        }
        .boxed()
        .shared();
        uploads.insert(key, upload.clone());
        // Runs whether or not anyone waits for it.
        tokio::spawn(upload.clone());
        upload
    }

    /// Starts uploads of the oldest ready files, up to `parallel` in all.
    fn look_ahead(
        &self,
        archive: &WalArchive,
        uploads: &mut HashMap<String, Upload>,
        ready: Vec<WalName>,
    ) {
        // Failed ones hold no slot: they are tried again when asked for.
        uploads.retain(|_, upload| !matches!(upload.peek(), Some(Err(_))));
        for name in ready {
            if uploads.len() >= self.parallel {
                break;
            }
            if !uploads.contains_key(name.as_str()) {
                // Spawned: it runs without a waiter.
                drop(self.start(archive, uploads, name));
            }
        }
    }

    /// More WAL waits than the guard allows.
    fn over_the_guard(&self, ready: &[WalName]) -> bool {
        let Some(limit) = self.max_pending_bytes else {
            return false;
        };
        let waiting: u64 = ready
            .iter()
            .filter_map(|name| std::fs::metadata(self.wal_dir.join(name.as_str())).ok())
            .map(|m| m.len())
            .sum();
        waiting > limit
    }

    /// Acknowledges `name` without storing it, once the gap is recorded
    /// durably (if it cannot be, the file waits like any other).
    fn drop_unstored(&self, name: &WalName) -> Result<(), ArchiveError> {
        if !self.gap_file.exists() {
            crate::files::write_atomically(&self.gap_file, name.as_str(), 0o600).map_err(|e| {
                ArchiveError::GapNotRecorded {
                    file: name.to_string(),
                    reason: e.to_string(),
                }
            })?;
            let first = name.to_string();
            self.report(|archive| archive.gap = Some(first));
        }
        self.state.metrics.archive_dropped.inc();
        tracing::error!(file = %name, "more WAL waits to be archived than spec.backup.maxPendingWALSize allows: dropped without storing it; point-in-time recovery cannot cross this gap");
        Ok(())
    }

    fn count_backlog(&self) {
        self.pending(self.ready_files().len());
    }

    fn pending(&self, files: usize) {
        self.state.metrics.archive_pending.set(files as i64);
        self.report(|archive| archive.pending = files as u32);
    }

    /// Changes what `/status` and the membership Lease say of archiving.
    fn report(&self, change: impl FnOnce(&mut WalArchiveState)) {
        self.state
            .update(|status| change(status.wal_archive.get_or_insert_default()));
    }

    /// Files PostgreSQL has marked ready to archive, oldest first.
    fn ready_files(&self) -> Vec<WalName> {
        let Ok(entries) = std::fs::read_dir(self.wal_dir.join("archive_status")) else {
            return Vec::new();
        };
        let mut ready: Vec<WalName> = entries
            .filter_map(|e| {
                let file = e.ok()?.file_name();
                WalName::parse(file.to_str()?.strip_suffix(".ready")?).ok()
            })
            .collect();
        ready.sort_by(|a, b| a.as_str().cmp(b.as_str()));
        ready
    }
}

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// `archive_command`'s client: asks the instance listening on `socket` to
/// store `file` (PostgreSQL's `%p`) and returns once it is stored.
pub fn request(socket: &Path, file: &Path) -> Result<(), ClientError> {
    let name = file
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| ClientError::NotWal(file.display().to_string()))?;
    match ask(socket, &format!("archive {name}"), name)?.as_str() {
        "ok" => Ok(()),
        other => Err(refused(name, other)),
    }
}

/// Sends one request line to the instance on `socket` and returns its
/// answer (without the line end); an empty answer (the instance went away
/// mid-request, a restart) is an error.
pub fn ask(socket: &Path, request: &str, file: &str) -> Result<String, ClientError> {
    let unreachable = |source| ClientError::Unreachable {
        socket: socket.display().to_string(),
        source,
    };
    let mut stream = std::os::unix::net::UnixStream::connect(socket).map_err(unreachable)?;
    stream
        .set_read_timeout(Some(CLIENT_TIMEOUT))
        .map_err(unreachable)?;
    stream
        .write_all(format!("{request}\n").as_bytes())
        .map_err(unreachable)?;
    let mut reply = String::new();
    BufReader::new(stream)
        .read_line(&mut reply)
        .map_err(|source| ClientError::NoAnswer {
            file: file.to_owned(),
            source,
        })?;
    match reply.trim_end() {
        "" => Err(ClientError::NoAnswer {
            file: file.to_owned(),
            source: std::io::ErrorKind::UnexpectedEof.into(),
        }),
        answer => Ok(answer.to_owned()),
    }
}

/// The instance's refusal, as the client reports it.
pub fn refused(file: &str, answer: &str) -> ClientError {
    ClientError::Refused {
        file: file.to_owned(),
        reason: answer.strip_prefix("error ").unwrap_or(answer).to_owned(),
    }
}
