//! A primary and two replicas, each a cairn-instance process running a real
//! PostgreSQL server on loopback.

mod support;

use std::time::{Duration, Instant};

use support::{Fixture, Result, last_error};

/// `spec.replication.synchronousReplicas: 1`: the first primary bootstraps
/// although no replica exists yet, and then a commit is acknowledged only
/// once a replica has it.
#[tokio::test]
async fn with_synchronous_replication_a_commit_waits_for_a_replica() -> Result {
    let mut cluster = support::cluster(&[])?;
    cluster.spec.replication = Some(cairn_api::database::v1::ReplicationSpec {
        synchronous_replicas: 1,
    });
    let mut fixture = Fixture::of("synchronous", cluster)?;
    let primary = fixture.start(&fixture.instance("orders-0", "primary")?)?;
    primary.wait_ready(Duration::from_secs(60)).await?;
    assert_eq!(
        primary.show("synchronous_standby_names").await?,
        r#"ANY 1 ("orders-0", "orders-1", "orders-2")"#
    );
    // It reports the quorum it runs, which the controller's failover keeps to.
    primary
        .wait_status("its running quorum", Duration::from_secs(10), |status| {
            status["synchronousStandbyNames"] == r#"ANY 1 ("orders-0", "orders-1", "orders-2")"#
        })
        .await?;
    let app = primary.app().await?;
    // Not confirmed by a replica: there is none yet. (One query string is one
    // transaction, committed after a RESET in it: hence three.)
    app.batch_execute("SET synchronous_commit = local").await?;
    app.batch_execute("CREATE TABLE t (x int)").await?;
    app.batch_execute("RESET synchronous_commit").await?;

    // No replica streams: the commit waits (and is not acknowledged).
    let blocked = tokio::time::timeout(
        Duration::from_secs(2),
        app.execute("INSERT INTO t VALUES (1)", &[]),
    )
    .await;
    assert!(
        blocked.is_err(),
        "a commit was acknowledged with no replica"
    );

    // A replica joins: the waiting commit completes, and the next one too.
    let replica = fixture.start(&fixture.instance("orders-1", "replica")?.following(&primary))?;
    replica.wait_ready(Duration::from_secs(60)).await?;
    let started = Instant::now();
    tokio::time::timeout(
        Duration::from_secs(10),
        app.execute("INSERT INTO t VALUES (2)", &[]),
    )
    .await
    .map_err(|_| "a commit still waits with a streaming replica")??;
    println!(
        "synchronous commit with one replica streaming: {:.1} ms",
        started.elapsed().as_secs_f64() * 1000.0
    );
    let state: String = primary
        .sql()
        .await?
        .query_one("SELECT sync_state FROM pg_stat_replication", &[])
        .await?
        .get(0);
    assert_eq!(state, "quorum");
    fixture.passed()
}

#[tokio::test]
async fn a_primary_and_two_replicas_stream_and_resume() -> Result {
    let mut fixture = Fixture::new("replication", &[])?;
    let primary = fixture.start(&fixture.instance("orders-0", "primary")?)?;
    let took = primary.wait_ready(Duration::from_secs(60)).await?;
    println!(
        "primary ready {:.1} s after start (initdb included)",
        took.as_secs_f64()
    );
    let status = primary.status().await?;
    assert_eq!(status["role"], "primary");
    assert_eq!(status["timeline"], 1);
    assert!(
        status["serverVersion"]
            .as_str()
            .unwrap_or_default()
            .starts_with("15")
    );

    // The application's database and owner exist, with the Secret's password.
    let app = primary.app().await?;
    app.batch_execute("CREATE TABLE orders (id int PRIMARY KEY, item text)")
        .await?;

    let specs = [
        fixture.instance("orders-1", "replica")?.following(&primary),
        fixture.instance("orders-2", "replica")?.following(&primary),
    ];
    let mut replicas = Vec::new();
    for spec in &specs {
        let replica = fixture.start(spec)?;
        let took = replica.wait_ready(Duration::from_secs(60)).await?;
        println!(
            "{} ready {:.1} s after start (base backup included)",
            spec.name,
            took.as_secs_f64()
        );
        replicas.push(replica);
    }

    // Each replica streams through its own slot on the primary.
    let slots = primary.sql().await?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let active: Vec<String> = slots
            .query(
                "SELECT slot_name::text FROM pg_replication_slots WHERE active ORDER BY 1",
                &[],
            )
            .await?
            .iter()
            .map(|r| r.get(0))
            .collect();
        if active == ["orders_1", "orders_2"] {
            break;
        }
        assert!(Instant::now() < deadline, "active slots: {active:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // A row written on the primary is readable on both replicas within 5 s.
    app.execute("INSERT INTO orders VALUES (1, 'tea')", &[])
        .await?;
    let written = Instant::now();
    for replica in &replicas {
        let session = replica.app().await?;
        loop {
            let rows = session
                .query("SELECT item FROM orders WHERE id = 1", &[])
                .await?;
            if rows.len() == 1 {
                println!(
                    "row visible on {} {:.0} ms after the commit",
                    replica.spec.name,
                    written.elapsed().as_secs_f64() * 1000.0
                );
                break;
            }
            // A wait's deadline, not a lag bound: the lag is printed above.
            assert!(
                written.elapsed() < Duration::from_secs(60),
                "row not on {} within 60 s",
                replica.spec.name
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let status = replica.status().await?;
        assert_eq!(status["role"], "replica", "{status}");
        assert_eq!(status["assignedRole"], "replica");
        assert_eq!(status["streaming"], true);
        assert_eq!(status["timeline"], 1);
        replica
            .wait_status("zero lag", Duration::from_secs(10), |s| {
                s["replicationLagBytes"] == 0 && s["replicationLagSeconds"] == 0.0
            })
            .await?;
    }
    let primary_position = primary.status().await?["walPosition"].clone();
    for replica in &replicas {
        replica
            .wait_status("the primary's WAL position", Duration::from_secs(10), |s| {
                s["walPosition"] == primary_position || primary_position.is_null()
            })
            .await
            .ok();
    }

    // A replica restarted on its data folder resumes streaming: no new base backup.
    let mut first = replicas.remove(0);
    let exit = first.terminate(Duration::from_secs(60)).await?;
    assert!(exit.success(), "{exit}");
    assert_eq!(first.cluster_state()?, "shut down in recovery");
    app.execute("INSERT INTO orders VALUES (2, 'coffee')", &[])
        .await?;
    let restarted = fixture.start(&specs[0])?;
    restarted.wait_ready(Duration::from_secs(30)).await?;
    let session = restarted.app().await?;
    let deadline = Instant::now() + Duration::from_secs(5);
    while session
        .query("SELECT 1 FROM orders WHERE id = 2", &[])
        .await?
        .is_empty()
    {
        assert!(
            Instant::now() < deadline,
            "the restarted replica did not catch up"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let log = restarted.log_text();
    assert!(
        log.contains("starting from the existing data folder"),
        "{log}"
    );
    assert!(
        !log.contains("pg_basebackup"),
        "a restart must not clone again:\n{log}"
    );

    // The primary goes away: its replicas stay ready until the silence limit
    // (3 s here), then are not. Silence counts from the replica's last poll
    // that saw it streaming, up to one poll (200 ms) before the disconnect,
    // which comes at the earliest when the primary is told to stop.
    let mut primary = primary;
    drop(app);
    let stopped = Instant::now();
    primary.terminate(Duration::from_secs(60)).await?;
    for replica in [&restarted, &replicas[0]] {
        let took = replica
            .wait_status(
                "not ready without its primary",
                Duration::from_secs(20),
                |s| s["ready"] == false,
            )
            .await?;
        let elapsed = stopped.elapsed();
        println!(
            "{} not ready {:.1} s after the primary stopped",
            replica.spec.name,
            elapsed.as_secs_f64()
        );
        assert!(
            elapsed >= Duration::from_millis(3000 - 200),
            "not ready before the limit: {elapsed:?} ({took:?} of waiting)"
        );
        let (code, body) = replica.get("/readyz").await?;
        assert_eq!(code, 503);
        assert!(body.contains("not streaming from the primary"), "{body}");
    }
    fixture.passed()
}

/// A replica stopped while the primary writes more WAL than its slot may
/// hold: the slot is invalidated, so the replica cannot stream again. It is
/// cloned again, into a fresh folder, and its old folder is removed only
/// once the new one streams.
#[tokio::test]
async fn a_replica_whose_wal_is_gone_is_cloned_again() -> Result {
    let mut fixture = Fixture::new(
        "reclone",
        &[("max_slot_wal_keep_size", "32MB"), ("wal_keep_size", "0")],
    )?;
    let primary = fixture.start(&fixture.instance("orders-0", "primary")?)?;
    primary.wait_ready(Duration::from_secs(60)).await?;
    let app = primary.app().await?;
    app.batch_execute("CREATE TABLE orders (id int PRIMARY KEY)")
        .await?;
    app.execute("INSERT INTO orders VALUES (1)", &[]).await?;
    let spec = fixture.instance("orders-1", "replica")?.following(&primary);
    let mut replica = fixture.start(&spec)?;
    replica.wait_ready(Duration::from_secs(60)).await?;
    replica.terminate(Duration::from_secs(60)).await?;

    // More WAL than the slot may keep, then a checkpoint: the slot is lost.
    let superuser = primary.sql().await?;
    for _ in 0..4 {
        app.batch_execute("INSERT INTO orders SELECT max(id) + 1 FROM orders")
            .await?;
        superuser.batch_execute("SELECT pg_switch_wal()").await?;
    }
    superuser.batch_execute("CHECKPOINT").await?;
    let status: String = superuser
        .query_one(
            "SELECT wal_status FROM pg_replication_slots WHERE slot_name = 'orders_1'",
            &[],
        )
        .await?
        .get(0);
    assert_eq!(status, "lost", "the test did not invalidate the slot");
    let last: i32 = app
        .query_one("SELECT max(id) FROM orders", &[])
        .await?
        .get(0);

    let started = Instant::now();
    let replica = fixture.start(&spec)?;
    replica
        .wait_status("streaming again", Duration::from_secs(90), |s| {
            s["ready"] == true && s["streaming"] == true
        })
        .await?;
    println!(
        "replica cloned again and streaming {:.1} s after its start",
        started.elapsed().as_secs_f64()
    );
    let rows: i64 = replica
        .app()
        .await?
        .query_one("SELECT count(*) FROM orders WHERE id <= $1", &[&last])
        .await?
        .get(0);
    assert_eq!(rows, i64::from(last));
    let log = replica.log_text();
    assert!(log.contains("cloning the replica again"), "{log}");
    assert!(log.contains("removed the folder it replaced"), "{log}");
    let previous = spec.data_dir().with_file_name("pgdata.previous");
    assert!(!previous.exists(), "{} is left", previous.display());
    assert_eq!(
        replica.metric("cairn_postgres_reclones_total").await?,
        Some(1.0)
    );
    let slot: String = superuser
        .query_one(
            "SELECT wal_status FROM pg_replication_slots WHERE slot_name = 'orders_1' AND active",
            &[],
        )
        .await?
        .get(0);
    assert_eq!(slot, "reserved");

    // A replica's folder that pg_rewind left half rewritten is never
    // started: it is cloned again the same way.
    let mut replica = replica;
    replica.terminate(Duration::from_secs(60)).await?;
    std::fs::write(spec.data_dir().with_extension("rewinding"), "")?;
    let replica = fixture.start(&spec)?;
    replica
        .wait_status("streaming again", Duration::from_secs(90), |s| {
            s["ready"] == true && s["streaming"] == true
        })
        .await?;
    let log = replica.log_text();
    assert!(log.contains("pg_rewind did not finish"), "{log}");
    assert!(!spec.data_dir().with_extension("rewinding").exists());
    assert!(!previous.exists(), "{} is left", previous.display());
    fixture.passed()
}

/// An asynchronous failover to a replica that was behind: a replica that
/// had received more from the old primary cannot follow the new timeline
/// (its history forked off it). It is detected and cloned again.
#[tokio::test]
async fn a_replica_ahead_of_the_promoted_one_is_cloned_again() -> Result {
    let mut fixture = Fixture::new("forked-replica", &[])?;
    let mut primary = fixture.start(&fixture.instance("orders-0", "primary")?)?;
    primary.wait_ready(Duration::from_secs(60)).await?;
    let app = primary.app().await?;
    app.batch_execute("CREATE TABLE orders (id int PRIMARY KEY)")
        .await?;
    app.execute("INSERT INTO orders VALUES (1)", &[]).await?;
    let behind_spec = fixture.instance("orders-1", "replica")?.following(&primary);
    let ahead_spec = fixture.instance("orders-2", "replica")?.following(&primary);
    let mut behind = fixture.start(&behind_spec)?;
    let mut ahead = fixture.start(&ahead_spec)?;
    behind.wait_ready(Duration::from_secs(60)).await?;
    ahead.wait_ready(Duration::from_secs(60)).await?;

    // orders-1 stops; orders-2 receives more; the primary is lost.
    behind.terminate(Duration::from_secs(60)).await?;
    app.execute("INSERT INTO orders VALUES (2)", &[]).await?;
    let ahead_app = ahead.app().await?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while ahead_app
        .query("SELECT 1 FROM orders WHERE id = 2", &[])
        .await?
        .is_empty()
    {
        assert!(Instant::now() < deadline, "row 2 did not reach orders-2");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(ahead_app);
    drop(app);
    primary.terminate(Duration::from_secs(60)).await?;
    ahead.terminate(Duration::from_secs(60)).await?;

    // orders-1, behind, is promoted; orders-2 must follow it.
    fixture.assign(&behind_spec, "primary")?;
    let promoted = fixture.start(&behind_spec)?;
    promoted
        .wait_status("promoted", Duration::from_secs(60), |s| {
            s["ready"] == true && s["role"] == "primary" && s["timeline"] == 2
        })
        .await?;
    let started = Instant::now();
    let ahead = fixture.start(&ahead_spec.following(&promoted))?;
    ahead
        .wait_status(
            "streaming from the new primary",
            Duration::from_secs(90),
            |s| s["ready"] == true && s["streaming"] == true && s["timeline"] == 2,
        )
        .await?;
    println!(
        "forked replica detected and cloned again, streaming {:.1} s after its start",
        started.elapsed().as_secs_f64()
    );
    let log = ahead.log_text();
    assert!(log.contains("forked off the primary's"), "{log}");
    let ids = order_ids(&ahead).await?;
    assert_eq!(ids, [1], "the replica holds the new primary's history only");
    fixture.passed()
}

/// A switchover: the primary stops cleanly, a replica assigned `primary` is
/// promoted onto a new timeline, and the old primary, assigned `replica`,
/// follows it without a new base backup, once it is promoted.
#[tokio::test]
async fn a_replica_assigned_primary_is_promoted_and_the_old_primary_follows_it() -> Result {
    let mut fixture = Fixture::new("switchover", &[])?;
    let old_spec = fixture.instance("orders-0", "primary")?;
    let mut old = fixture.start(&old_spec)?;
    old.wait_ready(Duration::from_secs(60)).await?;
    old.sql()
        .await?
        .batch_execute("CREATE TABLE kept AS SELECT 1 AS x")
        .await?;
    let new_spec = fixture.instance("orders-1", "replica")?.following(&old);
    let new = fixture.start(&new_spec)?;
    new.wait_ready(Duration::from_secs(60)).await?;
    new.wait_status("caught up", Duration::from_secs(10), |s| {
        s["replicationLagBytes"] == 0
    })
    .await?;

    let exit = old.terminate(Duration::from_secs(60)).await?;
    assert!(exit.success());
    // The old primary comes back as a replica before the new one is
    // promoted (each pod sees its role change on its own schedule): it
    // waits, rather than rewind from a server still in recovery.
    fixture.assign(&old_spec, "replica")?;
    let old_spec = old_spec.following(&new);
    let old = fixture.start(&old_spec)?;
    old.wait_status("waiting for the promotion", Duration::from_secs(30), |s| {
        last_error(s).contains("still in recovery")
    })
    .await?;
    assert!(!old.ready().await);
    fixture.assign(&new_spec, "primary")?;
    let took = new
        .wait_status("promoted", Duration::from_secs(30), |s| {
            s["ready"] == true && s["role"] == "primary"
        })
        .await?;
    println!(
        "promotion: ready as primary {:.0} ms after the role changed",
        took.as_secs_f64() * 1000.0
    );
    let status = new.status().await?;
    assert_eq!(status["timeline"], 2, "{status}");
    new.sql()
        .await?
        .batch_execute("INSERT INTO kept VALUES (2)")
        .await?;

    // Then it rewinds and follows the new primary.
    old.wait_ready(Duration::from_secs(60)).await?;
    let status = old.status().await?;
    assert_eq!(
        (status["role"].as_str(), status["timeline"].as_u64()),
        (Some("replica"), Some(2)),
        "{status}"
    );
    let rows = old
        .sql()
        .await?
        .query("SELECT x FROM kept ORDER BY x", &[])
        .await?;
    let values: Vec<i32> = rows.iter().map(|r| r.get(0)).collect();
    assert_eq!(values, [1, 2]);
    assert!(!old.log_text().contains("pg_basebackup"));
    // Its WAL checked, the rewind's marker is gone: a restart starts it.
    assert!(!old_spec.data_dir().with_extension("rewinding").exists());
    fixture.passed()
}

/// An old primary rewound while the new one takes writes must stream up to
/// the point its rewind ended before it accepts a connection, and it streams
/// only through its slot. When the slot cannot be made as it starts (here
/// every slot is taken; in a cluster, the new primary restarting), the
/// instance keeps trying although its own server does not answer yet.
#[tokio::test]
async fn a_rewound_replica_makes_its_slot_while_its_server_cannot_answer_yet() -> Result {
    let mut fixture = Fixture::new("rewound-slot", &[])?;
    let (old_spec, new) = promoted_over_a_diverged_primary(&fixture).await?;

    // Every slot of the new primary taken, and writes going on while the
    // old primary rewinds, so that it ends past the WAL it copied.
    let admin = new.sql().await?;
    admin
        .batch_execute(
            "SELECT pg_create_physical_replication_slot('held_' || n)
             FROM generate_series(1, current_setting('max_replication_slots')::int) AS n",
        )
        .await?;
    let writes = new.app().await?;
    let writer = tokio::spawn(async move {
        while writes
            .execute("INSERT INTO orders SELECT max(id) + 1 FROM orders", &[])
            .await
            .is_ok()
        {}
    });
    fixture.assign(&old_spec, "replica")?;
    let old = fixture.start(&old_spec.following(&new))?;
    old.wait_log("pg_rewind: Done!", Duration::from_secs(60))
        .await?;
    old.wait_log("all replication slots are in use", Duration::from_secs(30))
        .await?;
    writer.abort();
    old.wait_log(
        "Consistent recovery state has not been yet reached",
        Duration::from_secs(30),
    )
    .await?;
    let status = old.status().await?;
    assert!(
        status["reason"]
            .as_str()
            .is_some_and(|r| r.contains("not yet accepting connections")),
        "the rewound server must still refuse sessions here: {status}"
    );

    admin
        .batch_execute("SELECT pg_drop_replication_slot('held_1')")
        .await?;
    let took = old
        .wait_status("streaming", Duration::from_secs(60), |s| {
            s["ready"] == true && s["streaming"] == true && s["timeline"] == 2
        })
        .await?;
    println!(
        "rewound replica: streaming {:.1} s after a slot was free",
        took.as_secs_f64()
    );
    let count = |client: tokio_postgres::Client| async move {
        let row = client.query_one("SELECT count(*) FROM orders", &[]).await?;
        Result::Ok(row.get::<_, i64>(0))
    };
    let written = count(new.app().await?).await?;
    old.wait_status("caught up", Duration::from_secs(30), |s| {
        s["replicationLagBytes"] == 0
    })
    .await?;
    assert_eq!(count(old.app().await?).await?, written);
    fixture.passed()
}

/// An old primary that comes back after the new one has removed the WAL
/// since the promotion (more than `wal_keep_size` written while no slot
/// held it) cannot be rewound: pg_rewind would succeed, and the server
/// would then wait forever for WAL the primary no longer has. It is cloned
/// again instead, and its diverged write is gone.
#[tokio::test]
async fn an_old_primary_back_after_the_primary_removed_the_wal_since_the_switch_is_cloned() -> Result
{
    let mut fixture = Fixture::new("rewind-gone", &[])?;
    let (old_spec, new) = diverged_old_primary(&fixture).await?;
    // Only now: the old primary's folder keeps its own WAL (the default
    // `wal_keep_size`), the new primary recycles its own.
    fixture.set_parameters(&[("max_slot_wal_keep_size", "32MB"), ("wal_keep_size", "0")])?;
    // A wait, not a timing claim: the reload's time is not what this tests.
    tokio::time::timeout(Duration::from_secs(60), async {
        while new.show("wal_keep_size").await? != "0" {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Ok::<_, Box<dyn std::error::Error>>(())
    })
    .await
    .map_err(|_| "wal_keep_size = 0 not reloaded within 60 s")??;
    recycle_the_first_segments(&new).await?;

    let old = rejoin(&fixture, &old_spec, &new).await?;
    let log = old.log_text();
    assert!(log.contains("is gone from the"), "{log}");
    assert!(!log.contains("pg_rewind"), "{log}");
    fixture.passed()
}

/// The same, when the old primary's own folder no longer reaches back to
/// the last checkpoint both share (its WAL was recycled too): pg_rewind
/// refuses before it changes anything, and no retry could change that. It
/// is cloned again rather than retried forever.
#[tokio::test]
async fn an_old_primary_whose_own_wal_since_the_fork_is_gone_is_cloned() -> Result {
    let mut fixture = Fixture::new(
        "rewind-own-gone",
        &[("max_slot_wal_keep_size", "1GB"), ("wal_keep_size", "0")],
    )?;
    let (old_spec, new) = diverged_old_primary(&fixture).await?;
    // The primary keeps its WAL since the switch (a slot holds it); the old
    // primary's folder recycled its own when it stopped.
    new.sql().await?.batch_execute("CHECKPOINT").await?;
    assert!(
        switch_segment_kept(&new).await?,
        "the test did not keep the segment of the switch"
    );

    let old = rejoin(&fixture, &old_spec, &new).await?;
    let log = old.log_text();
    assert!(log.contains("cannot read this folder's WAL back"), "{log}");
    assert_eq!(old.status().await?["failedStarts"], 0);
    fixture.passed()
}

/// orders-0, a primary, stopped after orders-1 (its replica) was promoted
/// and after writing what orders-1 never received; orders-1 holds id 1.
async fn promoted_over_a_diverged_primary(
    fixture: &Fixture,
) -> Result<(support::InstanceSpec, support::Instance)> {
    let old_spec = fixture.instance("orders-0", "primary")?;
    let mut old = fixture.start(&old_spec)?;
    old.wait_ready(Duration::from_secs(60)).await?;
    old.app()
        .await?
        .batch_execute("CREATE TABLE orders (id int PRIMARY KEY); INSERT INTO orders VALUES (1)")
        .await?;
    let new_spec = fixture.instance("orders-1", "replica")?.following(&old);
    let new = fixture.start(&new_spec)?;
    new.wait_ready(Duration::from_secs(60)).await?;
    new.wait_status("caught up", Duration::from_secs(10), |s| {
        s["replicationLagBytes"] == 0
    })
    .await?;
    fixture.assign(&new_spec, "primary")?;
    new.wait_status("promoted", Duration::from_secs(30), |s| {
        s["ready"] == true && s["role"] == "primary" && s["timeline"] == 2
    })
    .await?;
    // These tests start from a new primary that holds no slot: the old
    // primary makes its own as it comes back.
    wait_for_member_slots(&new, &["orders_0", "orders_2"]).await?;
    new.sql()
        .await?
        .batch_execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots")
        .await?;
    // The old primary diverges before it stops, so it must be rewound.
    old.sql()
        .await?
        .batch_execute("CREATE TABLE lost (x int)")
        .await?;
    old.terminate(Duration::from_secs(60)).await?;
    Ok((old_spec, new))
}

/// `promoted_over_a_diverged_primary`, then orders-1 holds ids 1..=5, four
/// of them in WAL segments of their own, and a slot `held` that keeps its
/// WAL since the promotion.
async fn diverged_old_primary(
    fixture: &Fixture,
) -> Result<(support::InstanceSpec, support::Instance)> {
    let (old_spec, new) = promoted_over_a_diverged_primary(fixture).await?;
    new.sql()
        .await?
        .batch_execute("SELECT pg_create_physical_replication_slot('held', true)")
        .await?;
    let app = new.app().await?;
    for _ in 0..4 {
        app.batch_execute("INSERT INTO orders SELECT max(id) + 1 FROM orders")
            .await?;
        new.sql()
            .await?
            .batch_execute("SELECT pg_switch_wal()")
            .await?;
    }
    Ok((old_spec, new))
}

/// Waits until a promoted `primary` has the slots it made for the other
/// members, `slots`, and no other.
async fn wait_for_member_slots(primary: &support::Instance, slots: &[&str]) -> Result {
    let superuser = primary.sql().await?;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let made: Vec<String> = superuser
            .query(
                "SELECT slot_name::text FROM pg_replication_slots ORDER BY 1",
                &[],
            )
            .await?
            .iter()
            .map(|row| row.get(0))
            .collect();
        if made == slots {
            // Made while it was a standby, before its promotion.
            let log = primary.log_text();
            let made_at = log.rfind("made the other members' replication slots");
            let promoted_at = log.rfind("received promote request");
            assert!(made_at < promoted_at, "{log}");
            return Ok(());
        }
        assert!(
            Instant::now() < deadline,
            "slots {made:?}, not {slots:?}: {}",
            primary.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `held` dropped and a checkpoint on `primary`, with nothing else
/// holding its WAL: timeline 2's first segment is recycled.
async fn recycle_the_first_segments(primary: &support::Instance) -> Result {
    primary
        .sql()
        .await?
        .batch_execute("SELECT pg_drop_replication_slot('held'); CHECKPOINT")
        .await?;
    assert!(
        !switch_segment_kept(primary).await?,
        "the test did not recycle the segment of the switch"
    );
    Ok(())
}

/// Whether `primary` still has the segment where timeline 2 began.
async fn switch_segment_kept(primary: &support::Instance) -> Result<bool> {
    let kept = primary
        .sql()
        .await?
        .query_one(
            "SELECT EXISTS (SELECT FROM pg_ls_waldir() WHERE name = '00000002' || substr(
                 pg_walfile_name(split_part(pg_read_file('pg_wal/00000002.history'), E'\t', 2)::pg_lsn + 1),
                 9))",
            &[],
        )
        .await?
        .get(0);
    Ok(kept)
}

/// orders-0 back as a replica of `primary`: it streams on timeline 2 with
/// the primary's rows, and its own diverged table is gone.
async fn rejoin(
    fixture: &Fixture,
    old_spec: &support::InstanceSpec,
    primary: &support::Instance,
) -> Result<support::Instance> {
    fixture.assign(old_spec, "replica")?;
    let old = fixture.start(&old_spec.clone().following(primary))?;
    old.wait_status("streaming", Duration::from_secs(90), |s| {
        s["ready"] == true && s["streaming"] == true && s["timeline"] == 2
    })
    .await?;
    assert_eq!(order_ids(&old).await?, [1, 2, 3, 4, 5]);
    let lost: Option<String> = old
        .sql()
        .await?
        .query_one("SELECT to_regclass('lost')::text", &[])
        .await?
        .get(0);
    assert_eq!(lost, None, "the diverged write survived");
    Ok(old)
}

/// A running primary assigned `replica` (the controller moved the role while
/// it was up) stops taking writes at once: it restarts as a standby, rewinds
/// its diverged history with pg_rewind, and follows the promoted replica.
#[tokio::test]
async fn a_running_primary_assigned_replica_stops_taking_writes_and_follows() -> Result {
    let mut fixture = Fixture::new("demotion", &[])?;
    let old_spec = fixture.instance("orders-0", "primary")?;
    let old = fixture.start(&old_spec)?;
    old.wait_ready(Duration::from_secs(60)).await?;
    let new_spec = fixture.instance("orders-1", "replica")?.following(&old);
    let new = fixture.start(&new_spec)?;
    new.wait_ready(Duration::from_secs(60)).await?;

    fixture.assign(&new_spec, "primary")?;
    new.wait_status("promoted", Duration::from_secs(30), |s| {
        s["ready"] == true && s["role"] == "primary"
    })
    .await?;
    // Both are primaries now: the old one takes a write the new one never sees.
    old.sql()
        .await?
        .batch_execute("CREATE TABLE lost (x int)")
        .await?;
    new.sql()
        .await?
        .batch_execute("CREATE TABLE kept (x int)")
        .await?;

    // The old primary's process learns where the new primary is (in a pod,
    // the `-rw` Service follows the role label), then its role changes.
    let mut old = old;
    old.terminate(Duration::from_secs(60)).await?;
    let old_spec = old_spec.following(&new);
    let old = fixture.start(&old_spec)?;
    old.wait_ready(Duration::from_secs(30)).await?;
    fixture.assign(&old_spec, "replica")?;
    let changed = Instant::now();
    old.wait_status("in recovery", Duration::from_secs(30), |s| {
        s["role"] == "replica"
    })
    .await?;
    println!(
        "old primary read-only {:.1} s after its role changed (fast stop, pg_rewind, start)",
        changed.elapsed().as_secs_f64()
    );
    let write = old
        .sql()
        .await?
        .batch_execute("CREATE TABLE split_brain (x int)")
        .await;
    let error = write.err().map(|e| format!("{e:?}")).unwrap_or_default();
    assert!(
        error.contains("read-only transaction"),
        "the old primary took a write: {error}"
    );

    old.wait_ready(Duration::from_secs(60)).await?;
    println!(
        "old primary a ready replica {:.1} s after its role changed",
        changed.elapsed().as_secs_f64()
    );
    let status = old.status().await?;
    assert_eq!(status["timeline"], 2, "{status}");
    assert_eq!(
        status["postgresRestarts"], 0,
        "a demotion is not a crash: {status}"
    );
    let tables: Vec<String> = old
        .sql()
        .await?
        .query(
            "SELECT relname::text FROM pg_class WHERE relname IN ('kept', 'lost') ORDER BY 1",
            &[],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        tables,
        ["kept"],
        "the rewind keeps the new primary's history only"
    );
    assert!(
        old.log_text().contains("pg_rewind done"),
        "{}",
        old.log_text()
    );
    fixture.passed()
}

/// Two replicas of one primary both promoted (a split brain) are on timeline
/// 2 with different histories: pg_rewind would see one timeline and rewind
/// nothing. The one told to follow the other is cloned again instead, and
/// what only it had written is gone, as the cluster's history says.
#[tokio::test]
async fn a_replica_promoted_beside_another_is_cloned_again_to_follow_it() -> Result {
    let mut fixture = Fixture::new("forked", &[])?;
    let primary = fixture.start(&fixture.instance("orders-0", "primary")?)?;
    primary.wait_ready(Duration::from_secs(60)).await?;
    let left_spec = fixture.instance("orders-1", "replica")?.following(&primary);
    let right_spec = fixture.instance("orders-2", "replica")?.following(&primary);
    let left = fixture.start(&left_spec)?;
    let right = fixture.start(&right_spec)?;
    for (spec, instance) in [(&left_spec, &left), (&right_spec, &right)] {
        instance.wait_ready(Duration::from_secs(60)).await?;
        fixture.assign(spec, "primary")?;
    }
    for instance in [&left, &right] {
        instance
            .wait_status("promoted", Duration::from_secs(30), |s| {
                s["ready"] == true && s["role"] == "primary" && s["timeline"] == 2
            })
            .await?;
    }
    right
        .sql()
        .await?
        .batch_execute("CREATE TABLE forked (x int)")
        .await?;

    let mut right = right;
    right.terminate(Duration::from_secs(60)).await?;
    fixture.assign(&right_spec, "replica")?;
    let right = fixture.start(&right_spec.following(&left))?;
    right
        .wait_status("streaming from the other", Duration::from_secs(60), |s| {
            s["ready"] == true && s["streaming"] == true
        })
        .await?;
    let log = right.log_text();
    assert!(log.contains("refusing to rewind over it"), "{log}");
    assert!(log.contains("cloning the replica again"), "{log}");
    assert!(!log.contains("pg_rewind done"), "{log}");
    let forked: Option<String> = right
        .sql()
        .await?
        .query_one("SELECT to_regclass('forked')::text", &[])
        .await?
        .get(0);
    assert_eq!(forked, None, "the forked history survived");
    fixture.passed()
}

/// A replica that follows a promoted primary keeps its folder while that
/// primary restarts. With no WAL receiver it still reads its timeline as
/// the new one (its last restartpoint is on the old one), so its history
/// does not look forked, and it waits for its receiver to reconnect rather
/// than being cloned again.
#[tokio::test]
async fn a_replica_on_the_new_timeline_waits_out_its_primary_restarting() -> Result {
    let mut fixture = Fixture::new("primary-restart", &[])?;
    let mut first = fixture.start(&fixture.instance("orders-0", "primary")?)?;
    first.wait_ready(Duration::from_secs(60)).await?;
    first
        .app()
        .await?
        .batch_execute("CREATE TABLE orders (id int PRIMARY KEY); INSERT INTO orders VALUES (1)")
        .await?;
    let promoted_spec = fixture.instance("orders-1", "replica")?.following(&first);
    let follower_spec = fixture.instance("orders-2", "replica")?.following(&first);
    let promoted = fixture.start(&promoted_spec)?;
    let mut follower = fixture.start(&follower_spec)?;
    promoted.wait_ready(Duration::from_secs(60)).await?;
    follower.wait_ready(Duration::from_secs(60)).await?;

    // orders-0 is lost; orders-1 is promoted and orders-2 follows it onto
    // timeline 2, past the switch.
    first.terminate(Duration::from_secs(60)).await?;
    follower.terminate(Duration::from_secs(60)).await?;
    fixture.assign(&promoted_spec, "primary")?;
    promoted
        .wait_status("promoted", Duration::from_secs(30), |s| {
            s["ready"] == true && s["role"] == "primary" && s["timeline"] == 2
        })
        .await?;
    // Promoted, it made the other members' slots.
    wait_for_member_slots(&promoted, &["orders_0", "orders_2"]).await?;
    let follower_spec = follower_spec.following(&promoted);
    let follower = fixture.start(&follower_spec)?;
    promoted
        .app()
        .await?
        .execute("INSERT INTO orders VALUES (2)", &[])
        .await?;
    follower
        .wait_status("streaming timeline 2", Duration::from_secs(60), |s| {
            s["ready"] == true && s["streaming"] == true && s["timeline"] == 2
        })
        .await?;

    // The primary restarts, down for longer than a replica may be silent.
    let mut promoted = promoted;
    promoted.terminate(Duration::from_secs(60)).await?;
    follower
        .wait_status("not streaming", Duration::from_secs(30), |s| {
            s["streaming"] == false
        })
        .await?;
    assert_eq!(
        follower.status().await?["timeline"],
        2,
        "with no WAL receiver, the replica still reads its replay timeline"
    );
    tokio::time::sleep(STUCK_AFTER + Duration::from_secs(1)).await;
    let promoted = fixture.start(&promoted_spec)?;
    promoted.wait_ready(Duration::from_secs(60)).await?;
    follower
        .wait_status("streaming again", Duration::from_secs(60), |s| {
            s["ready"] == true && s["streaming"] == true && s["timeline"] == 2
        })
        .await?;
    // The slot of orders-0, which never came back, keeps no WAL; the
    // follower's reserves what it has not received.
    let reserved: Vec<bool> = promoted
        .sql()
        .await?
        .query(
            "SELECT restart_lsn IS NOT NULL FROM pg_replication_slots
             WHERE slot_name IN ('orders_0', 'orders_2') ORDER BY slot_name",
            &[],
        )
        .await?
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(reserved, [false, true]);
    let log = follower.log_text();
    assert!(!log.contains("forked off"), "{log}");
    assert!(!log.contains("cloning the replica again"), "{log}");
    // Nor restarted: its WAL receiver reconnected on its own.
    assert!(!log.contains("connects again"), "{log}");
    let ids = order_ids(&follower).await?;
    assert_eq!(ids, [1, 2]);
    fixture.passed()
}

/// A WAL receiver that began connecting to a primary that takes the
/// connection and never answers (its node stopped: the kernel still
/// accepts) would wait without limit; the instance ends it after 3 s, so
/// that it connects again, without restarting postgres.
#[tokio::test]
async fn a_wal_receiver_hung_connecting_is_ended_and_connects_again() -> Result {
    let mut fixture = Fixture::new("hung-receiver", &[])?;
    let primary_spec = fixture.instance("orders-0", "primary")?;
    let mut primary = fixture.start(&primary_spec)?;
    primary.wait_ready(Duration::from_secs(60)).await?;
    let replica = fixture.start(&fixture.instance("orders-1", "replica")?.following(&primary))?;
    replica.wait_ready(Duration::from_secs(60)).await?;
    primary.terminate(Duration::from_secs(60)).await?;
    // Its port now takes connections and never answers (never accepted).
    let silent = std::net::TcpListener::bind(("127.0.0.1", primary_spec.port))?;
    let took = replica
        .wait_log(
            "the WAL receiver has been connecting for",
            Duration::from_secs(30),
        )
        .await?;
    println!(
        "hung WAL receiver ended {:.1} s after the primary stopped",
        took.as_secs_f64()
    );
    drop(silent);
    let _primary = fixture.start(&primary_spec)?;
    replica
        .wait_status("streaming again", Duration::from_secs(60), |s| {
            s["ready"] == true && s["streaming"] == true
        })
        .await?;
    let log = replica.log_text();
    assert!(!log.contains("restarting postgres"), "{log}");
    assert!(
        log.contains("terminating walreceiver process due to administrator command"),
        "{log}"
    );
    fixture.passed()
}

/// The ids in `orders` on `instance`, in order.
async fn order_ids(instance: &support::Instance) -> Result<Vec<i32>> {
    let rows = instance
        .app()
        .await?
        .query("SELECT id FROM orders ORDER BY id", &[])
        .await?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
}

/// How long a replica may go without streaming before it is judged stuck
/// (the supervisor's `STUCK_AFTER`).
const STUCK_AFTER: Duration = Duration::from_secs(10);

/// A rotated Secret: the primary sets the new passwords on its roles (the
/// old application password stops working), and the replica, once its
/// connection drops, streams again with the new replication password.
#[tokio::test]
async fn rotated_passwords_take_effect_without_a_restart() -> Result {
    // Every DDL statement logged, but for the ones that carry a verifier.
    let mut fixture = Fixture::new("rotation", &[("log_statement", "ddl")])?;
    let primary = fixture.start(&fixture.instance("orders-0", "primary")?)?;
    primary.wait_ready(Duration::from_secs(60)).await?;
    let replica_spec = fixture.instance("orders-1", "replica")?.following(&primary);
    let replica = fixture.start(&replica_spec)?;
    replica.wait_ready(Duration::from_secs(60)).await?;

    let old = fixture.credentials.clone();
    let mut rotated = old.clone();
    rotated.insert("password".into(), "rotated-application-password".into());
    rotated.insert(
        "replication-password".into(),
        "rotated-replication-password".into(),
    );
    let changed = Instant::now();
    fixture.write_credentials(&fixture.credentials_dir, &rotated)?;
    let (user, database) = (&old["username"], &old["database"]);
    while primary
        .session(user, &rotated["password"], database)
        .await
        .is_err()
    {
        assert!(
            changed.elapsed() < Duration::from_secs(10),
            "the new password is not accepted"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!(
        "rotated password accepted {} ms after the Secret changed",
        changed.elapsed().as_millis()
    );
    let refused = primary.session(user, &old["password"], database).await;
    assert!(refused.is_err(), "the old password still works");

    // The replica's walreceiver reconnects with the new password.
    primary.cut_replication_until_it_resumes(&replica).await?;
    let superuser = primary.sql().await?;
    replica.wait_ready(Duration::from_secs(30)).await?;
    superuser
        .batch_execute("CREATE TABLE logged (x int)")
        .await?;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let log = primary.log_text();
    assert!(log.contains("CREATE TABLE logged"), "DDL is not logged");
    assert!(!log.contains("SCRAM-SHA-256$"), "a verifier in the log");
    fixture.passed()
}

/// Replication runs over TLS, the replica verifying the primary's
/// certificate against the cluster's CA; a certificate from a new CA (a
/// renewal as the kubelet delivers it) is served without a restart.
#[tokio::test]
async fn replication_is_encrypted_and_a_new_certificate_is_served_without_a_restart() -> Result {
    let mut fixture = Fixture::new("tls", &[])?;
    let primary = fixture.start(&fixture.instance("orders-0", "primary")?)?;
    primary.wait_ready(Duration::from_secs(60)).await?;
    let replica = fixture.start(&fixture.instance("orders-1", "replica")?.following(&primary))?;
    replica.wait_ready(Duration::from_secs(60)).await?;
    let encrypted: bool = primary
        .sql()
        .await?
        .query_one(
            "SELECT bool_and(s.ssl) FROM pg_stat_replication r JOIN pg_stat_ssl s USING (pid)",
            &[],
        )
        .await?
        .get(0);
    assert!(encrypted, "the replica streams without TLS");
    let conninfo = replica.show("primary_conninfo").await?;
    assert!(conninfo.contains("sslmode=verify-full"), "{conninfo}");

    let old_ca = fixture.ca.clone();
    primary.sql_verifying(&old_ca).await?;
    let started = primary.postmaster_start_time().await?;
    let changed = Instant::now();
    fixture.issue_certificate()?;
    while primary.sql_verifying(&fixture.ca).await.is_err() {
        assert!(
            changed.elapsed() < Duration::from_secs(10),
            "the new certificate is not served: {}",
            primary.log_text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!(
        "new certificate served {} ms after the Secret changed",
        changed.elapsed().as_millis()
    );
    assert!(
        primary.sql_verifying(&old_ca).await.is_err(),
        "the old certificate is still served"
    );
    assert_eq!(
        primary.postmaster_start_time().await?,
        started,
        "postgres restarted"
    );

    // The replica trusts the new CA too: a new replication connection works.
    primary.cut_replication_until_it_resumes(&replica).await?;
    fixture.passed()
}

/// After a scale-down, the primary drops the slot of a pod the cluster no
/// longer lists (once unused for the grace period), so it stops holding
/// WAL; the slots of members, in use or not, and other tools' slots stay.
#[tokio::test]
async fn the_primary_drops_the_slots_of_removed_pods_only() -> Result {
    let mut fixture = Fixture::new("slots", &[])?;
    let primary = fixture.start(
        &fixture
            .instance("orders-0", "primary")?
            .env("CAIRN_CLUSTER", "orders")
            .env("CAIRN_SLOT_GRACE_SECONDS", "1"),
    )?;
    primary.wait_ready(Duration::from_secs(60)).await?;
    let replica = fixture.start(&fixture.instance("orders-1", "replica")?.following(&primary))?;
    replica.wait_ready(Duration::from_secs(60)).await?;
    let superuser = primary.sql().await?;
    for slot in ["orders_2", "orders_5", "backup_tool"] {
        superuser
            .execute(
                "SELECT pg_create_physical_replication_slot($1, true)",
                &[&slot],
            )
            .await?;
    }
    let slots = || async {
        let rows = superuser
            .query(
                "SELECT slot_name::text FROM pg_replication_slots ORDER BY 1",
                &[],
            )
            .await?;
        Ok::<_, tokio_postgres::Error>(
            rows.iter()
                .map(|r| r.get::<_, String>(0))
                .collect::<Vec<_>>(),
        )
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while slots().await?.contains(&"orders_5".to_owned()) {
        assert!(
            Instant::now() < deadline,
            "orders_5 kept: {}",
            primary.log_text()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(slots().await?, ["backup_tool", "orders_1", "orders_2"]);
    fixture.passed()
}
