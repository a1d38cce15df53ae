//! What goes wrong around an instance is reported, retried, and never costs data.

mod support;

use std::time::Duration;

use support::{Fixture, Result, last_error};

#[tokio::test]
async fn a_replica_with_a_wrong_password_reports_it_and_recovers_when_fixed() -> Result {
    let mut fixture = Fixture::new("wrong-password", &[])?;
    let primary = fixture.start(&fixture.instance("orders-0", "primary")?)?;
    primary.wait_ready(Duration::from_secs(60)).await?;

    let mut wrong = fixture.credentials.clone();
    wrong.insert("replication-password".into(), "not-the-password".into());
    let mut spec = fixture.instance("orders-1", "replica")?.following(&primary);
    spec.credentials_dir = fixture.root.join("wrong-credentials");
    fixture.write_credentials(&spec.credentials_dir, &wrong)?;
    let replica = fixture.start(&spec)?;
    replica
        .wait_status("a password error", Duration::from_secs(30), |s| {
            last_error(s).contains("password authentication failed")
        })
        .await?;
    let status = replica.status().await?;
    assert_eq!(status["ready"], false);
    assert_eq!(status["phase"], "Retrying");
    assert!(
        !spec.data_dir().exists(),
        "a failed clone must leave no data folder"
    );
    assert!(
        replica
            .log_text()
            .contains("password authentication failed")
    );
    assert!(
        !replica.log_text().contains("not-the-password"),
        "a password reached the log"
    );

    // The Secret is fixed: the next attempt clones and streams.
    std::fs::remove_dir_all(&spec.credentials_dir)?;
    fixture.write_credentials(&spec.credentials_dir, &fixture.credentials)?;
    replica.wait_ready(Duration::from_secs(60)).await?;
    assert_eq!(
        replica.status().await?["lastError"],
        serde_json::Value::Null
    );
    fixture.passed()
}

#[tokio::test]
async fn an_unreachable_primary_is_reported_and_retried() -> Result {
    let mut fixture = Fixture::new("unreachable", &[])?;
    let mut spec = fixture.instance("orders-1", "replica")?;
    // A port nothing listens on.
    spec.primary_port = Some(cairn_testing::process::free_address()?.port());
    let replica = fixture.start(&spec)?;
    replica
        .wait_status("a connection error", Duration::from_secs(30), |s| {
            let error = last_error(s);
            error.contains("pg_basebackup failed") && error.contains("Connection refused")
        })
        .await?;
    // Retried with a backoff, not in a hot loop: a few attempts in 6 s.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let attempts = replica.log_text().matches("cloning the primary").count();
    assert!(
        (2..=5).contains(&attempts),
        "{attempts} attempts in about 7 s"
    );
    let (code, _) = replica.get("/livez").await?;
    assert_eq!(
        code, 200,
        "retrying is alive: a container restart would not help"
    );
    fixture.passed()
}

#[tokio::test]
async fn missing_credentials_foreign_data_and_a_cut_off_rewind_are_refused_without_touching_anything()
-> Result {
    let mut fixture = Fixture::new("refusals", &[])?;
    let mut spec = fixture.instance("orders-0", "primary")?;
    spec.credentials_dir = fixture.root.join("no-credentials");
    fixture.write_credentials(&spec.credentials_dir, &Default::default())?;
    let primary = fixture.start(&spec)?;
    primary
        .wait_status("no superuser password", Duration::from_secs(20), |s| {
            last_error(s).contains("no superuser password")
        })
        .await?;
    assert!(!spec.data_dir().exists());

    let spec = fixture.instance("orders-1", "primary")?;
    std::fs::create_dir_all(spec.data_dir())?;
    std::fs::write(spec.data_dir().join("precious.txt"), "not a database")?;
    fixture.own(&spec.dir)?;
    let instance = fixture.start(&spec)?;
    instance
        .wait_status("a refusal", Duration::from_secs(20), |s| {
            last_error(s).contains("refusing")
        })
        .await?;
    let entries: Vec<_> = std::fs::read_dir(spec.data_dir())?
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(entries, ["precious.txt"]);
    assert_eq!(
        std::fs::read_to_string(spec.data_dir().join("precious.txt"))?,
        "not a database"
    );

    // A folder whose pg_rewind was cut off midway is kept and not started.
    let spec = fixture.instance("orders-2", "primary")?;
    let mut instance = fixture.start(&spec)?;
    instance.wait_ready(Duration::from_secs(60)).await?;
    instance.terminate(Duration::from_secs(60)).await?;
    let marker = spec.data_dir().with_extension("rewinding");
    std::fs::write(&marker, "")?;
    let instance = fixture.start(&spec)?;
    instance
        .wait_status("a refusal", Duration::from_secs(20), |s| {
            last_error(s).contains("pg_rewind") && last_error(s).contains("did not finish")
        })
        .await?;
    assert!(!instance.ready().await);
    assert!(!spec.data_dir().join("postmaster.pid").exists());
    assert!(spec.data_dir().join("PG_VERSION").exists());
    fixture.passed()
}

/// The data folder on a 64 MiB filesystem (a tmpfs: mounting it needs root,
/// which the test command has; elsewhere this test fails saying so), filled
/// by the application until PostgreSQL cannot write its WAL.
#[tokio::test]
async fn a_full_disk_is_reported_and_the_data_survives() -> Result {
    let mut fixture = Fixture::new(
        "full-disk",
        &[("max_wal_size", "32MB"), ("min_wal_size", "32MB")],
    )?;
    let spec = fixture.instance("orders-0", "primary")?;
    let volume = spec.dir.join("data");
    let _mount = support::Tmpfs::mount(&volume, "64m")?;
    fixture.own(&volume)?;
    let primary = fixture.start(&spec)?;
    primary.wait_ready(Duration::from_secs(60)).await?;
    let session = primary.sql().await?;
    session
        .batch_execute("CREATE TABLE kept AS SELECT 42 AS x")
        .await?;

    // Fill the volume: the application gets PostgreSQL's own error, or, when
    // the WAL is what found the volume full, its connection ends (PostgreSQL
    // stops with a PANIC rather than lose a WAL record). Either way nothing
    // was acknowledged that is not kept.
    let filled = session
        .batch_execute(
            "CREATE TABLE filler AS SELECT repeat('x', 2000) AS pad FROM generate_series(1, 40000)",
        )
        .await;
    let error = filled.err().map(|e| format!("{e:?}")).unwrap_or_default();
    assert!(
        error.contains("No space left on device") || error.contains("kind: Closed"),
        "filling did not fail as expected: {error}"
    );
    primary
        .wait_status("a full-volume error", Duration::from_secs(30), |s| {
            last_error(s).contains("the data volume is nearly full")
        })
        .await?;
    println!("status when full: {}", primary.status().await?);
    assert!(
        primary
            .log_text()
            .contains("the data volume is nearly full")
    );

    // A PostgreSQL that ran out of WAL space cannot finish crash recovery
    // until the volume grows: the instance retries with a backoff, saying
    // why, and touches nothing.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let restarts = primary.status().await?["postgresRestarts"]
        .as_u64()
        .unwrap_or(0);
    println!("restarts in the first 10 s of a full volume: {restarts}");
    assert!(restarts <= 5, "{restarts} restarts in 10 s: a hot loop");

    // The volume grows (as a PVC expansion would): the server recovers with
    // the data written before.
    support::Tmpfs::resize(&volume, "128m")?;
    let took = primary.wait_ready(Duration::from_secs(60)).await?;
    println!("ready {:.1} s after the volume grew", took.as_secs_f64());
    let session = primary.sql().await?;
    let row = session.query_one("SELECT x FROM kept", &[]).await?;
    assert_eq!(row.get::<_, i32>(0), 42);
    assert_eq!(
        primary.status().await?["lastError"],
        serde_json::Value::Null
    );
    fixture.passed()
}
