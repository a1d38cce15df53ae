//! Plumbing shared by the Cairn controller binaries.
//!
//! This crate grows into the leader-elected manager each controller runs in
//! (see the runtime issue); so far it holds the conventions every controller
//! must agree on: labels, conditions, and how errors are retried.

pub mod conditions;
pub mod errors;
pub mod labels;
pub mod metrics;
