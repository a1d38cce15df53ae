//! Reading the API server's audit log, which records the metadata of every
//! write request (see the audit policy in `hack/local-cluster.sh`). Tests and
//! benchmarks count a controller's writes with it: a controller at steady state
//! must make none.

use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Deserialize;

use crate::Error;

/// One write request, as the audit log records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteRequest {
    /// The user the request was authorized as: the impersonated user if the
    /// client impersonated one, otherwise the authenticated user.
    pub user: String,
    pub verb: String,
    pub resource: String,
    pub subresource: Option<String>,
    pub namespace: Option<String>,
    pub name: Option<String>,
    /// HTTP status code of the response.
    pub code: Option<u16>,
    /// When the request was received (RFC 3339, microseconds).
    pub received: String,
    /// The pod whose ServiceAccount token made the request (bound tokens
    /// name it): tells the replicas of one controller apart.
    pub pod: Option<String>,
    /// The client program, from its user agent (`kube-controller-manager`
    /// of `kube-controller-manager/v1.36.3 (linux/amd64) ...`).
    pub client: Option<String>,
}

/// Every write request recorded in `log` so far, its rotated files included:
/// the API server rotates `audit.log` at 100 MB (lumberjack's default, as no
/// `--audit-log-maxsize` is set) into `audit-<time>.log` beside it, which a
/// whole test run or a thousand clusters reach. The API server writes the
/// log in batches (at most a second late); poll with [`crate::wait::until`]
/// when a request has only just been made.
pub fn write_requests(log: &Path) -> Result<Vec<WriteRequest>, Error> {
    loop {
        let rotated = rotated_files(log)?;
        let mut text = String::new();
        for file in rotated.iter().chain(std::iter::once(&log.to_path_buf())) {
            text.push_str(&String::from_utf8_lossy(&read_from(file, 0)?));
            if !text.is_empty() && !text.ends_with('\n') {
                text.push('\n');
            }
        }
        // A rotation while reading would lose the file renamed meanwhile.
        if rotated_files(log)? == rotated {
            return Ok(parse(&text));
        }
    }
}

/// The files `log` was rotated into, oldest first (the rotation time in
/// their names sorts as text).
fn rotated_files(log: &Path) -> Result<Vec<PathBuf>, Error> {
    let folder = log.parent().unwrap_or(Path::new("."));
    let prefix = log
        .file_stem()
        .map(|stem| format!("{}-", stem.to_string_lossy()))
        .unwrap_or_default();
    let mut rotated: Vec<PathBuf> = std::fs::read_dir(folder)
        .map_err(|e| unreadable(folder, e))?
        .filter_map(|entry| Some(entry.ok()?.path()))
        .filter(|path| {
            path.file_name()
                .map(|name| name.to_string_lossy().into_owned())
                .is_some_and(|name| name.starts_with(&prefix) && name.ends_with(".log"))
        })
        .collect();
    rotated.sort();
    Ok(rotated)
}

fn unreadable(log: &Path, e: std::io::Error) -> Error {
    Error::Setup(format!("cannot read audit log {}: {e}", log.display()))
}

/// The bytes of `file` from `offset` on.
fn read_from(file: &Path, offset: u64) -> Result<Vec<u8>, Error> {
    let mut opened = std::fs::File::open(file).map_err(|e| unreadable(file, e))?;
    opened
        .seek(SeekFrom::Start(offset))
        .map_err(|e| unreadable(file, e))?;
    let mut bytes = Vec::new();
    opened
        .read_to_end(&mut bytes)
        .map_err(|e| unreadable(file, e))?;
    Ok(bytes)
}

/// The audit log from a point on, read as it grows: what a test uses to show
/// that nothing was written during a window, failing at the first write
/// instead of after the window. The API server rotates the log (at 100 MB,
/// lumberjack's default, as no `--audit-log-maxsize` is set) by renaming
/// it: the rest of the file being read is found again by its inode.
pub struct Tail {
    log: PathBuf,
    inode: u64,
    offset: u64,
}

impl Tail {
    /// Watches `log` from its current end.
    pub fn from_now(log: &Path) -> Result<Self, Error> {
        let metadata = std::fs::metadata(log).map_err(|e| unreadable(log, e))?;
        Ok(Self {
            log: log.to_owned(),
            inode: metadata.ino(),
            offset: metadata.len(),
        })
    }

    /// The write requests recorded since the last call (whole lines only).
    pub fn recorded(&mut self) -> Result<Vec<WriteRequest>, Error> {
        let mut text = Vec::new();
        let current = std::fs::metadata(&self.log).map_err(|e| unreadable(&self.log, e))?;
        if current.ino() != self.inode {
            // Rotated since: the rest of the old file, then the new one.
            if let Some(rotated) = self.renamed()? {
                text.extend(read_from(&rotated, self.offset)?);
                if text.last().is_some_and(|&b| b != b'\n') {
                    text.push(b'\n');
                }
            }
            self.inode = current.ino();
            self.offset = 0;
        }
        let mut fresh = read_from(&self.log, self.offset)?;
        let complete = fresh.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
        fresh.truncate(complete);
        self.offset += complete as u64;
        text.extend(fresh);
        Ok(parse(&String::from_utf8_lossy(&text)))
    }

    /// The file the log being read was renamed to, if it still exists.
    fn renamed(&self) -> Result<Option<PathBuf>, Error> {
        let folder = self.log.parent().unwrap_or(Path::new("."));
        let entries = std::fs::read_dir(folder).map_err(|e| unreadable(folder, e))?;
        Ok(entries
            .filter_map(Result::ok)
            .map(|entry| entry.path())
            .find(|path| std::fs::metadata(path).is_ok_and(|m| m.ino() == self.inode)))
    }

    /// Watches the log for `window` (and the API server's batch delay after
    /// it): the requests `unwanted` matches, as soon as one is recorded;
    /// empty if none was.
    pub async fn unwanted_within(
        &mut self,
        window: Duration,
        unwanted: impl Fn(&WriteRequest) -> bool,
    ) -> Result<Vec<WriteRequest>, Error> {
        let deadline = Instant::now() + window + BATCH_DELAY;
        loop {
            let found: Vec<_> = self.recorded()?.into_iter().filter(&unwanted).collect();
            if !found.is_empty() || Instant::now() >= deadline {
                return Ok(found);
            }
            tokio::time::sleep(POLL.min(deadline.saturating_duration_since(Instant::now()))).await;
        }
    }
}

/// How late the API server writes an audit event at most (its batch wait,
/// `--audit-log-batch-max-wait=1s`, and a margin).
const BATCH_DELAY: Duration = Duration::from_secs(2);
const POLL: Duration = Duration::from_millis(250);

/// Parses JSON-lines audit events, skipping lines that are not (for example a
/// line the API server is still writing).
fn parse(text: &str) -> Vec<WriteRequest> {
    text.lines()
        .filter_map(|line| serde_json::from_str::<Event>(line).ok())
        .filter(|event| event.stage == "ResponseComplete")
        .map(|event| WriteRequest {
            pod: event
                .user
                .extra
                .get(POD_NAME_EXTRA)
                .and_then(|names| names.first().cloned()),
            user: event
                .impersonated_user
                .map_or(event.user.username, |u| u.username),
            verb: event.verb,
            resource: event.object_ref.resource.unwrap_or_default(),
            subresource: event.object_ref.subresource,
            namespace: event.object_ref.namespace,
            name: event.object_ref.name,
            code: event.response_status.and_then(|s| s.code),
            received: event.request_received_timestamp,
            client: event
                .user_agent
                .and_then(|agent| agent.split(['/', ' ']).next().map(str::to_owned))
                .filter(|program| !program.is_empty()),
        })
        .collect()
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Event {
    stage: String,
    verb: String,
    user: User,
    impersonated_user: Option<User>,
    #[serde(default)]
    object_ref: ObjectRef,
    response_status: Option<ResponseStatus>,
    #[serde(default)]
    request_received_timestamp: String,
    user_agent: Option<String>,
}

#[derive(Deserialize)]
struct User {
    username: String,
    #[serde(default)]
    extra: std::collections::BTreeMap<String, Vec<String>>,
}

/// The user attribute a ServiceAccount token bound to a pod carries.
const POD_NAME_EXTRA: &str = "authentication.kubernetes.io/pod-name";

#[derive(Deserialize, Default)]
struct ObjectRef {
    resource: Option<String>,
    subresource: Option<String>,
    namespace: Option<String>,
    name: Option<String>,
}

#[derive(Deserialize)]
struct ResponseStatus {
    code: Option<u16>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_client_is_the_program_its_user_agent_names() {
        let line = |agent: &str| {
            format!(
                concat!(
                    r#"{{"stage":"ResponseComplete","verb":"create","user":{{"username":"u"}},"#,
                    r#""objectRef":{{"resource":"pods"}}{}}}"#
                ),
                agent
            )
        };
        let log = [
            line(r#","userAgent":"kube-scheduler/v1.36.3 (linux/amd64) kubernetes/abc""#),
            line(r#","userAgent":"kwok""#),
            line(r#","userAgent":"""#),
            line(""),
        ]
        .join("\n");
        let clients: Vec<_> = parse(&log).into_iter().map(|w| w.client).collect();
        assert_eq!(
            clients,
            [
                Some("kube-scheduler".to_owned()),
                Some("kwok".to_owned()),
                None,
                None
            ]
        );
    }

    #[test]
    fn the_log_is_read_on_across_rotations() -> Result<(), Box<dyn std::error::Error>> {
        let line = |name: &str| {
            format!(
                concat!(
                    r#"{{"kind":"Event","stage":"ResponseComplete","verb":"create","#,
                    r#""user":{{"username":"u"}},"objectRef":{{"resource":"configmaps","name":"{}"}},"#,
                    r#""responseStatus":{{"code":201}}}}"#,
                    "\n"
                ),
                name
            )
        };
        let folder = std::env::temp_dir().join(format!("cairn-audit-{}", std::process::id()));
        std::fs::create_dir_all(&folder)?;
        let log = folder.join("audit.log");
        std::fs::write(&log, line("before"))?;
        let mut tail = Tail::from_now(&log)?;
        let append = |path: &Path, text: String| -> std::io::Result<()> {
            use std::io::Write;
            std::fs::OpenOptions::new()
                .append(true)
                .create(true)
                .open(path)?
                .write_all(text.as_bytes())
        };
        append(&log, line("a"))?;
        assert_eq!(tail.recorded()?.len(), 1);
        append(&log, line("b"))?;
        // Rotated as lumberjack does: renamed, and a new file begun.
        std::fs::rename(&log, folder.join("audit-2026-11-26T19-00-00.000.log"))?;
        append(&log, line("c"))?;
        let names: Vec<_> = tail
            .recorded()?
            .into_iter()
            .filter_map(|w| w.name)
            .collect();
        assert_eq!(names, ["b", "c"]);
        append(&log, line("d"))?;
        assert_eq!(tail.recorded()?.len(), 1);
        // The whole log, from its oldest rotated file on.
        std::fs::rename(&log, folder.join("audit-2026-11-26T20-00-00.000.log"))?;
        append(&log, line("e"))?;
        let names: Vec<_> = write_requests(&log)?
            .into_iter()
            .filter_map(|w| w.name)
            .collect();
        assert_eq!(names, ["before", "a", "b", "c", "d", "e"]);
        std::fs::remove_dir_all(&folder)?;
        Ok(())
    }

    #[test]
    fn attributes_an_impersonated_request_to_the_impersonated_user() {
        let log = concat!(
            r#"{"kind":"Event","level":"Metadata","stage":"ResponseComplete","verb":"create","#,
            r#""user":{"username":"cairn-admin"},"impersonatedUser":{"username":"system:serviceaccount:a:b"},"#,
            r#""objectRef":{"resource":"configmaps","namespace":"a","name":"c"},"#,
            r#""responseStatus":{"code":201},"requestReceivedTimestamp":"2026-01-01T00:00:00.000000Z"}"#,
            "\n",
            r#"{"kind":"Event","stage":"ResponseComplete","verb":"patch","#,
            r#""user":{"username":"cairn-admin","extra":{"authentication.kubernetes.io/pod-name":["p-1"]}},"#,
            r#""objectRef":{"resource":"pods","subresource":"status"},"responseStatus":{"code":200}}"#,
            "\n{\"truncated\n"
        );
        let requests = parse(log);
        assert_eq!(requests.len(), 2);
        assert_eq!(requests[0].user, "system:serviceaccount:a:b");
        assert_eq!(requests[0].code, Some(201));
        assert_eq!(requests[1].user, "cairn-admin");
        assert_eq!(requests[1].subresource.as_deref(), Some("status"));
        assert_eq!(requests[0].pod, None);
        assert_eq!(
            requests[1].pod.as_deref(),
            Some("p-1"),
            "the bound token's pod"
        );
    }

    #[tokio::test]
    async fn a_tail_reads_only_whole_lines_written_after_it_started()
    -> Result<(), Box<dyn std::error::Error>> {
        use std::io::Write;
        let line = |verb: &str| {
            format!(
                "{{\"stage\":\"ResponseComplete\",\"verb\":\"{verb}\",\"user\":{{\"username\":\"u\"}}}}\n"
            )
        };
        let log = std::env::temp_dir().join(format!("cairn-audit-{}.log", std::process::id()));
        std::fs::write(&log, line("create"))?;
        let mut tail = Tail::from_now(&log)?;
        let append = |text: &str| -> std::io::Result<()> {
            std::fs::OpenOptions::new()
                .append(true)
                .open(&log)?
                .write_all(text.as_bytes())
        };
        let patch = line("patch");
        append(&patch[..10])?;
        assert_eq!(tail.recorded()?, vec![], "half a line waits");
        append(&patch[10..])?;
        let seen = tail.recorded()?;
        assert_eq!(seen.len(), 1);
        assert_eq!(seen[0].verb, "patch");

        append(&line("delete"))?;
        let started = Instant::now();
        let found = tail
            .unwanted_within(Duration::from_secs(30), |w| w.verb == "delete")
            .await?;
        assert_eq!(found.len(), 1);
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the first write ends the watch"
        );
        let none = tail
            .unwanted_within(Duration::from_millis(10), |_| true)
            .await?;
        assert_eq!(none, vec![]);
        std::fs::remove_file(&log)?;
        Ok(())
    }
}
