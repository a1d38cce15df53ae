//! cairn-instance: the entrypoint (PID 1) of every Cairn database pod. It
//! bootstraps the data folder, runs PostgreSQL as its child, serves health,
//! status and metrics, follows the role and configuration the controller
//! gives it (its role, from its pod), and renews its membership Lease with
//! what it observes.

pub mod archive;
pub mod backup;
pub mod children;
pub mod conf;
pub mod config;
pub mod error;
pub mod fence;
pub mod files;
pub mod membership;
pub mod metrics;
pub mod observe;
pub mod peers;
pub mod primacy;
pub mod restore;
pub mod scram;
pub mod server;
pub mod state;
pub mod supervisor;
pub mod tasks;
pub mod tls;
pub mod verify;
pub mod wal_clients;
