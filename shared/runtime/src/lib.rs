//! Plumbing shared by the Cairn controller binaries.
//!
//! This crate grows into the leader-elected manager each controller runs in
//! (see the runtime issue). So far: the conventions every controller must
//! agree on (labels, conditions, how errors are retried), the standard
//! metrics, the admin server (`/livez`, `/readyz`, `/metrics`), the
//! configuration from flags and environment, telemetry (JSON or text logs,
//! OTLP traces when an endpoint is set), leader election on a Lease,
//! server-side apply that writes nothing when nothing changed, Events on
//! condition transitions, and the HTTPS webhook server (certificates from
//! mounted files, reloaded on change, or self-managed: a CA kept in a Secret
//! and injected into the CRDs). The manager loop and finalizer helpers are
//! still to come.

pub mod admin;
pub mod apply;
pub mod certs;
pub mod conditions;
pub mod config;
pub mod errors;
pub mod events;
pub mod labels;
pub mod leader;
pub mod manager;
pub mod metrics;
pub mod telemetry;
pub mod webhook;
