//! Plumbing shared by the Cairn controller binaries.
//!
//! [`manager::Manager`] is what a controller's main runs in: configuration
//! from flags and environment ([`config`]), telemetry, the admin server
//! (`/livez`, `/readyz`, `/metrics`), caches every replica keeps warm, leader
//! election on a Lease ([`leader`]), and the controller run only while leading,
//! with its reconciles measured and retried by error class ([`errors`]).
//! Reconcile helpers: [`apply`] (server-side apply that writes nothing when
//! nothing changed), [`conditions`], [`events`] (Events on transitions only),
//! [`finalizers`], [`labels`]. The HTTPS webhook server ([`webhook`]) takes
//! mounted certificates, reloaded on change, or self-managed ones ([`certs`]).

pub mod admin;
pub mod apply;
pub mod certs;
pub mod conditions;
pub mod config;
pub mod errors;
pub mod events;
pub mod finalizers;
pub mod heartbeat;
pub mod labels;
pub mod leader;
pub mod manager;
pub mod metrics;
pub mod telemetry;
pub mod webhook;

/// The allocator of every controller binary (`#[global_allocator] static
/// ALLOCATOR: Allocator = Allocator;` in its main.rs): jemalloc purges freed
/// pages in the background, so memory freed after a burst of objects returns
/// to the system; glibc's per-thread arenas keep the burst's peak.
pub use tikv_jemallocator::Jemalloc as Allocator;
