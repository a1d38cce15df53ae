//! One primary through its life: readiness, configuration reloads, a clean
//! stop, and the death of its postgres.

mod support;

use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use support::{Fixture, Instance, Result, last_error};

#[tokio::test]
async fn readiness_follows_the_server_accepting_connections() -> Result {
    let mut fixture = Fixture::new("readiness", &[])?;
    let spec = fixture.instance("orders-0", "primary")?;
    let primary = fixture.start(&spec)?;
    let start = Instant::now();
    let mut not_ready_seen = 0;
    loop {
        match primary.get("/readyz").await {
            Ok((200, _)) => break,
            Ok((503, _)) => {
                not_ready_seen += 1;
                // While not ready, the application cannot have a session yet
                // or the instance is still creating its roles.
            }
            Ok((code, body)) => return Err(format!("/readyz {code}: {body}").into()),
            Err(_) => {} // not listening yet
        }
        assert!(start.elapsed() < Duration::from_secs(60), "never ready");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        not_ready_seen > 0,
        "/readyz was never false during bootstrap"
    );
    // Ready means the application can connect and use its database.
    let app = primary.app().await?;
    app.batch_execute("CREATE TABLE t (x int)").await?;
    let (code, _) = primary.get("/livez").await?;
    assert_eq!(code, 200);
    let up = primary.metric("cairn_postgres_up").await?;
    assert_eq!(up, Some(1.0));
    let role = primary
        .metric("cairn_postgres_role{role=\"primary\"}")
        .await?;
    assert_eq!(role, Some(1.0));
    fixture.passed()
}

#[tokio::test]
async fn reloadable_settings_apply_in_place_and_restart_ones_are_reported() -> Result {
    let mut fixture = Fixture::new("reload", &[("work_mem", "4MB")])?;
    let primary = fixture.start(&fixture.instance("orders-0", "primary")?)?;
    primary.wait_ready(Duration::from_secs(60)).await?;
    assert_eq!(primary.show("work_mem").await?, "4MB");
    let postmaster = primary.postmaster_pid();

    fixture.set_parameters(&[("work_mem", "7MB")])?;
    let changed = Instant::now();
    while primary.show("work_mem").await? != "7MB" {
        assert!(
            changed.elapsed() < Duration::from_secs(10),
            "work_mem not reloaded"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!(
        "work_mem reloaded {:.0} ms after the file changed",
        changed.elapsed().as_secs_f64() * 1000.0
    );
    assert_eq!(
        primary.postmaster_pid(),
        postmaster,
        "a reload must not restart postgres"
    );
    assert_eq!(
        primary.status().await?["pendingRestart"],
        serde_json::json!([])
    );

    fixture.set_parameters(&[("work_mem", "7MB"), ("max_connections", "50")])?;
    primary
        .wait_status("max_connections pending", Duration::from_secs(10), |s| {
            s["pendingRestart"] == serde_json::json!(["max_connections"])
        })
        .await?;
    assert_eq!(primary.show("max_connections").await?, "100");
    assert_eq!(
        primary
            .metric("cairn_postgres_pending_restart_settings")
            .await?,
        Some(1.0)
    );
    assert_eq!(primary.postmaster_pid(), postmaster);
    assert!(
        primary.ready().await,
        "a pending restart does not make the instance unready"
    );
    fixture.passed()
}

#[tokio::test]
async fn sigterm_stops_cleanly_and_a_killed_postgres_or_container_is_started_again() -> Result {
    let mut fixture = Fixture::new("signals", &[])?;
    let spec = fixture.instance("orders-0", "primary")?;
    let mut primary = fixture.start(&spec)?;
    primary.wait_ready(Duration::from_secs(60)).await?;
    primary
        .sql()
        .await?
        .batch_execute("CREATE TABLE kept (x int); INSERT INTO kept VALUES (42)")
        .await?;

    // SIGTERM: postgres shuts down cleanly, the next start needs no recovery.
    let took = Instant::now();
    let exit = primary.terminate(Duration::from_secs(60)).await?;
    assert!(exit.success(), "{exit}");
    println!(
        "SIGTERM to exit: {:.0} ms",
        took.elapsed().as_secs_f64() * 1000.0
    );
    assert_eq!(primary.cluster_state()?, "shut down");
    let mut primary = fixture.start(&spec)?;
    primary.wait_ready(Duration::from_secs(30)).await?;
    let log = primary.log_text();
    assert!(!log.contains("not properly shut down"), "{log}");
    assert!(!log.contains("automatic recovery in progress"), "{log}");

    // SIGKILL of the postgres child: the instance starts it again (crash
    // recovery), counts it, and the data is there.
    let before = primary.postmaster_pid().ok_or("no postmaster.pid")?;
    kill(Pid::from_raw(before), Signal::SIGKILL)?;
    let killed = Instant::now();
    primary
        .wait_status("restart counted", Duration::from_secs(10), |s| {
            s["postgresRestarts"] == 1
        })
        .await?;
    let status = primary.status().await?;
    assert!(
        last_error(&status).contains("postgres exited unexpectedly"),
        "{status}"
    );
    primary.wait_ready(Duration::from_secs(60)).await?;
    println!(
        "ready again {:.1} s after postgres was killed",
        killed.elapsed().as_secs_f64()
    );
    assert_ne!(primary.postmaster_pid(), Some(before));
    assert_eq!(kept_value(&primary).await?, 42);
    assert_eq!(
        primary.metric("cairn_postgres_restarts_total").await?,
        Some(1.0)
    );
    assert!(
        primary
            .log_text()
            .contains("automatic recovery in progress")
    );
    assert_eq!(
        primary.status().await?["lastError"],
        serde_json::Value::Null
    );

    // The container killed with everything in it (an OOM kill, a node's
    // containerd restarting it): both lock files stay, the data folder's
    // and the socket's in the run folder (an emptyDir, which outlives the
    // container). In the new container their pid is often alive, as one of
    // cairn-instance's own threads (same user: postgres's `kill(pid, 0)`
    // succeeds); a process of that user stands in for it. The postmaster
    // must start anyway.
    let postmaster = primary.postmaster_pid().ok_or("no postmaster.pid")?;
    primary.signal(Signal::SIGKILL)?;
    primary.wait_exit(Duration::from_secs(10)).await?;
    // It may have gone with its parent already.
    let _ = kill(Pid::from_raw(postmaster), Signal::SIGKILL);
    let gone_by = Instant::now() + Duration::from_secs(10);
    while std::path::Path::new(&format!("/proc/{postmaster}")).exists() && Instant::now() < gone_by
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let socket_lock = spec
        .dir
        .join("run")
        .join(format!(".s.PGSQL.{}.lock", spec.port));
    let pid_file = spec.data_dir().join("postmaster.pid");
    let stand_in = fixture.process_of_the_instance_user(120)?;
    let alive_pid = stand_in.id().ok_or("the stand-in exited")?;
    for lock in [&socket_lock, &pid_file] {
        let text = std::fs::read_to_string(lock)?;
        let rest: Vec<&str> = text.lines().skip(1).collect();
        std::fs::write(lock, format!("{alive_pid}\n{}\n", rest.join("\n")))?;
    }
    let restarted = Instant::now();
    let primary = fixture.start(&spec)?;
    primary.wait_ready(Duration::from_secs(60)).await?;
    println!(
        "ready {:.1} s after a restart over stale lock files naming a live pid",
        restarted.elapsed().as_secs_f64()
    );
    assert!(
        !primary.log_text().contains("already exists"),
        "{}",
        primary.log_text()
    );
    assert_eq!(kept_value(&primary).await?, 42);
    fixture.passed()
}

/// The row the signals test wrote before stopping and killing the instance.
async fn kept_value(primary: &Instance) -> Result<i32> {
    let row = primary
        .sql()
        .await?
        .query_one("SELECT x FROM kept", &[])
        .await?;
    Ok(row.get(0))
}

/// The list the controller rolls pods for is PostgreSQL's own: every setting
/// a real server reads only at start is in it or managed by Cairn, and
/// everything in it is such a setting (or one of a later version).
#[tokio::test]
async fn the_restart_only_settings_are_the_servers_postmaster_settings() -> Result {
    use cairn_api::database::v1::{
        MANAGED_PARAMETERS, RESTART_PARAMETERS, RESTART_PARAMETERS_SINCE_16,
    };
    use std::collections::BTreeSet;
    let mut fixture = Fixture::new("settings", &[])?;
    let spec = fixture.instance("orders-0", "primary")?;
    let primary = fixture.start(&spec)?;
    primary.wait_ready(Duration::from_secs(60)).await?;
    let rows = primary
        .sql()
        .await?
        .query(
            "SELECT name, current_setting('server_version_num')::int \
             FROM pg_settings WHERE context = 'postmaster'",
            &[],
        )
        .await?;
    let version: i32 = rows.first().map_or(0, |r| r.get(1));
    let on_server: BTreeSet<String> = rows
        .iter()
        .map(|r| r.get::<_, String>(0))
        .filter(|name| !MANAGED_PARAMETERS.contains(&name.as_str()))
        .collect();
    let listed: BTreeSet<String> = RESTART_PARAMETERS
        .iter()
        .filter(|name| version >= 160_000 || !RESTART_PARAMETERS_SINCE_16.contains(name))
        .map(|name| (*name).to_owned())
        .collect();
    let unlisted: Vec<_> = on_server.difference(&listed).collect();
    let unknown: Vec<_> = listed.difference(&on_server).collect();
    assert!(
        unlisted.is_empty() && unknown.is_empty(),
        "PostgreSQL {version}: restart-only settings missing from RESTART_PARAMETERS: {unlisted:?}; \
         listed but not restart-only here: {unknown:?}"
    );
    fixture.passed()
}
