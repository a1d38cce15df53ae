//! Types shared by the kinds of several groups.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// A reference to an object of a known kind in the same namespace.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
pub struct LocalObjectReference {
    /// Name of the referenced object, in the namespace of the referring one.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

impl LocalObjectReference {
    pub fn new(name: impl Into<String>) -> Self {
        Self { name: name.into() }
    }
}
