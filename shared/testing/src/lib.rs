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
pub mod faults;
pub mod helm;
pub mod https;
mod namespace;
pub mod process;
pub mod s3;
pub mod wait;

pub use cluster::{KubectlOutput, LocalCluster, cluster};
pub use error::Error;
pub use namespace::{Nodes, TestNamespace};

/// Kubernetes objects of the current API version, re-exported so tests name
/// one version consistently with the harness.
pub use k8s_openapi;
pub use kube;
