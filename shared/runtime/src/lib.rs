//! Plumbing shared by the Cairn controller binaries.
//!
//! This crate grows into the leader-elected manager each controller runs in;
//! for now it holds the conventions every controller must agree on.

pub mod labels;
