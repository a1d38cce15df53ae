//! What goes wrong around an instance is reported, retried, and never costs data.

mod support;

use std::time::Duration;

use support::{Fixture, Result};

fn error_of(status: &serde_json::Value) -> String {
    status["lastError"].as_str().unwrap_or_default().to_owned()
}

#[tokio::test]
async fn a_replica_with_a_wrong_password_reports_it_and_recovers_when_fixed() -> Result {
    let fixture = Fixture::new("wrong-password", &[])?;
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
            error_of(s).contains("password authentication failed")
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
    Ok(())
}

#[tokio::test]
async fn an_unreachable_primary_is_reported_and_retried() -> Result {
    let fixture = Fixture::new("unreachable", &[])?;
    let mut spec = fixture.instance("orders-1", "replica")?;
    // A port nothing listens on.
    spec.primary_port = Some(cairn_testing::process::free_address()?.port());
    let replica = fixture.start(&spec)?;
    replica
        .wait_status("a connection error", Duration::from_secs(30), |s| {
            let error = error_of(s);
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
    Ok(())
}

#[tokio::test]
async fn missing_credentials_and_foreign_data_are_refused_without_touching_anything() -> Result {
    let fixture = Fixture::new("refusals", &[])?;
    let mut spec = fixture.instance("orders-0", "primary")?;
    spec.credentials_dir = fixture.root.join("no-credentials");
    fixture.write_credentials(&spec.credentials_dir, &Default::default())?;
    let primary = fixture.start(&spec)?;
    primary
        .wait_status("no superuser password", Duration::from_secs(20), |s| {
            error_of(s).contains("no superuser password")
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
            error_of(s).contains("refusing")
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
    Ok(())
}
