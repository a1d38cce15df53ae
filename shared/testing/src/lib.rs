//! The Rust side of Cairn's test harness.
//!
//! Tests run against a real control plane started by `hack/local-cluster.sh`:
//! [`cluster()`] finds the one the test entry point exported (or starts the
//! local development cluster), [`LocalCluster::namespace`] gives each test a
//! fresh namespace, [`LocalCluster::client_as_service_account`] a client that
//! impersonates a ServiceAccount, [`crds::install`] installs CRDs, [`s3`] talks
//! to the moto server, [`faults`] puts a fault-injecting proxy in front of it,
//! [`wait`] polls for a condition with a readable failure message, and
//! [`audit`] counts write requests by user.
//!
//! ```no_run
//! # async fn example() -> Result<(), cairn_testing::Error> {
//! let ns = cairn_testing::cluster().namespace("example").await?;
//! let pods = ns.api::<k8s_openapi::api::core::v1::Pod>();
//! # Ok(()) }
//! ```

pub mod audit;
mod cluster;
pub mod crds;
mod error;
pub mod fake_api;
pub mod faults;
pub mod helm;
pub mod https;
pub mod json;
mod namespace;
pub mod process;
pub mod s3;
pub mod wait;

pub use cluster::{FrozenProcess, FrozenTask, KubectlOutput, LocalCluster, cluster};

/// The repository's root, found when the test runs, from the package under
/// test (cargo sets `CARGO_MANIFEST_DIR` for `cargo test`): a build cached
/// from another checkout of the same sources must read this checkout's
/// charts and scripts, not that one's.
pub fn repo_root() -> std::path::PathBuf {
    let start = std::env::var_os("CARGO_MANIFEST_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")));
    start
        .ancestors()
        .find(|dir| dir.join("hack/local-cluster.sh").exists())
        .map(std::path::Path::to_path_buf)
        .unwrap_or(start)
}
pub use error::Error;
pub use namespace::{Nodes, TestNamespace};

/// Kubernetes objects of the current API version, re-exported so tests name
/// one version consistently with the harness.
pub use k8s_openapi;
pub use kube;
