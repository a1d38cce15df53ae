//! The admin probes of a real controller process: `/readyz` only once its
//! caches have synced; `/livez` fails once the API server has been
//! unreachable past the limit, and recovers when it is back.
//! Alone in its test binary: it stops the shared API server.

mod support;

use std::time::{Duration, Instant};

use cairn_testing::{Error, cluster};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::PostParams;
use serde_json::json;

/// Starts the API server again even when the test fails half-way.
struct ApiServerBack;

impl Drop for ApiServerBack {
    fn drop(&mut self) {
        if let Err(e) = cluster().start_apiserver() {
            eprintln!("could not start the API server again: {e}");
        }
    }
}

#[tokio::test]
async fn readiness_waits_for_caches_and_liveness_follows_the_api_server() -> Result<(), Error> {
    let namespace = support::namespace("probes").await?;
    // Another replica holds the lease for an hour: this process stays a
    // standby, so losing the API server cannot make it lose a lease.
    let lease: Lease = serde_json::from_value(json!({
        "metadata": { "name": "cairn-database" },
        "spec": {
            "holderIdentity": "another-replica",
            "leaseDurationSeconds": 3600,
            "renewTime": k8s_openapi::jiff::Timestamp::now().to_string(),
        }
    }))
    .map_err(|e| Error::Setup(e.to_string()))?;
    namespace
        .api::<Lease>()
        .create(&PostParams::default(), &lease)
        .await?;

    // Without its RBAC the controller cannot list anything: not ready.
    let account = "probes-cairn-database-controller";
    let process = support::start(
        &namespace,
        "probe",
        account,
        &[("CAIRN_WATCH_FAILURE_LIMIT_SECONDS", "3")],
    )?;
    support::until_status(&process, "/livez", 200, Duration::from_secs(10)).await?;
    // Watched for 2 s: never ready.
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline {
        assert_eq!(
            process.get("/readyz").await?.0,
            503,
            "caches cannot have synced"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let installed = support::install_rbac(&namespace, "probes").await?;
    assert_eq!(installed, account);
    let granted = Instant::now();
    support::until_status(&process, "/readyz", 200, Duration::from_secs(60)).await?;
    println!(
        "ready {} ms after the RBAC was granted",
        granted.elapsed().as_millis()
    );
    support::until_status(&process, "/livez", 200, Duration::from_secs(30)).await?;

    let _restart = ApiServerBack;
    let stopped = Instant::now();
    cluster().stop_apiserver()?;
    support::until_status(&process, "/livez", 503, Duration::from_secs(30)).await?;
    let failed_after = stopped.elapsed();
    println!(
        "/livez failed {} ms after the API server stopped",
        failed_after.as_millis()
    );
    assert!(
        failed_after >= Duration::from_secs(3),
        "before the 3 s limit: {failed_after:?}"
    );

    cluster().start_apiserver()?;
    let restarted = Instant::now();
    support::until_status(&process, "/livez", 200, Duration::from_secs(60)).await?;
    println!(
        "/livez recovered {} ms after the API server came back",
        restarted.elapsed().as_millis()
    );
    Ok(())
}
