//! Lossless conversion of `DatabaseCluster` between v1alpha1 and v1, and the
//! `ConversionReview` handler a webhook server mounts.
//!
//! v1alpha1 has no place for most v1 fields, so converting v1 → v1alpha1
//! keeps them, as JSON, in the annotations [`SPEC_ANNOTATION`] and
//! [`STATUS_ANNOTATION`]; v1alpha1 → v1 reads them back and removes them. An
//! annotation is only written when there is something v1alpha1 cannot hold, so
//! an object that never had one round-trips unchanged both ways.

use kube::api::ObjectMeta;
use kube::core::Status;
use kube::core::conversion::{ConversionRequest, ConversionResponse, ConversionReview};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{v1, v1alpha1};

/// Holds the v1 spec fields v1alpha1 lacks.
pub const SPEC_ANNOTATION: &str = "database.cairn.dev/v1-spec";
/// Holds the v1 status fields v1alpha1 lacks.
pub const STATUS_ANNOTATION: &str = "database.cairn.dev/v1-status";

const V1: &str = "database.cairn.dev/v1";
const V1ALPHA1: &str = "database.cairn.dev/v1alpha1";

/// The v1 spec minus what v1alpha1 holds itself.
#[derive(Serialize, Deserialize, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
struct SpecExtras {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    image: Option<String>,
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    parameters: std::collections::BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    storage_class_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    resources: Option<k8s_openapi::api::core::v1::ResourceRequirements>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    scheduling: Option<v1::SchedulingSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    bootstrap: Option<v1::BootstrapSpec>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    paused: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    failover: Option<v1::FailoverSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    replication: Option<v1::ReplicationSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    backup: Option<v1::ClusterBackupSpec>,
}

/// The v1 status minus what v1alpha1 holds itself.
#[derive(Serialize, Deserialize, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
struct StatusExtras {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    observed_generation: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ready_instances: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    selector: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    current_primary: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    read_only_endpoint: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    credentials_secret: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    postgres_version: Option<String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    initialized: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    timeline: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    last_failover: Option<v1::FailoverRecord>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    last_switchover: Option<v1::SwitchoverRecord>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    restored_from: Option<v1::RestoredFrom>,
    /// v1 had a status with none of v1alpha1's fields set.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    empty_endpoints: bool,
}

/// Why an object could not be converted.
#[derive(Debug, thiserror::Error)]
pub enum ConversionError {
    #[error("cannot convert to {0}: only {V1} and {V1ALPHA1} are served")]
    UnknownVersion(String),
    #[error("object is not a valid DatabaseCluster: {0}")]
    Invalid(#[from] serde_json::Error),
    #[error("annotation {0} does not hold valid JSON of the v1 fields: {1}")]
    BadAnnotation(String, serde_json::Error),
    #[error("the v1 fields for annotation {0} cannot be serialised: {1}")]
    Unkeepable(String, serde_json::Error),
}

/// v1 → v1alpha1.
pub fn to_v1alpha1(
    cluster: v1::DatabaseCluster,
) -> Result<v1alpha1::DatabaseCluster, ConversionError> {
    let v1::DatabaseCluster {
        mut metadata,
        spec,
        status,
    } = cluster;
    // A stale copy (say, set by hand on the v1 object) must not come back.
    if let Some(annotations) = metadata.annotations.as_mut() {
        let removed = annotations.remove(SPEC_ANNOTATION).is_some()
            | annotations.remove(STATUS_ANNOTATION).is_some();
        if removed && annotations.is_empty() {
            metadata.annotations = None;
        }
    }
    let extras = SpecExtras {
        image: spec.postgres.image,
        parameters: spec.postgres.parameters,
        storage_class_name: spec.storage.storage_class_name,
        resources: spec.resources,
        scheduling: spec.scheduling,
        bootstrap: spec.bootstrap,
        paused: spec.paused,
        failover: spec.failover,
        replication: spec.replication,
        backup: spec.backup,
    };
    keep(&mut metadata, SPEC_ANNOTATION, &extras)?;
    let status = status
        .map(|status| -> Result<_, ConversionError> {
            let empty_endpoints = status.endpoints.as_ref() == Some(&v1::Endpoints::default());
            let endpoints = status.endpoints.unwrap_or_default();
            let extras = StatusExtras {
                observed_generation: status.observed_generation,
                ready_instances: status.ready_instances,
                selector: status.selector,
                current_primary: status.current_primary,
                read_only_endpoint: endpoints.read_only,
                credentials_secret: status.credentials_secret,
                postgres_version: status.postgres_version,
                initialized: status.initialized,
                timeline: status.timeline,
                last_failover: status.last_failover,
                last_switchover: status.last_switchover,
                restored_from: status.restored_from,
                empty_endpoints,
            };
            keep(&mut metadata, STATUS_ANNOTATION, &extras)?;
            Ok(v1alpha1::DatabaseClusterStatus {
                phase: status.phase,
                conditions: status.conditions,
                endpoint: endpoints.read_write,
                instances: status.instances,
            })
        })
        .transpose()?;
    let mut converted = v1alpha1::DatabaseCluster::new(
        "",
        v1alpha1::DatabaseClusterSpec {
            size: spec.instances,
            version: spec.postgres.version,
            storage_size: spec.storage.size,
        },
    );
    converted.metadata = metadata;
    converted.status = status;
    Ok(converted)
}

/// v1alpha1 → v1. Fields v1alpha1 has win over the annotation's copy: the
/// user may have changed them through v1alpha1. An annotation that does not
/// parse is an error: defaulting it would silently drop v1 fields.
pub fn to_v1(cluster: v1alpha1::DatabaseCluster) -> Result<v1::DatabaseCluster, ConversionError> {
    let v1alpha1::DatabaseCluster {
        mut metadata,
        spec,
        status,
    } = cluster;
    let extras: SpecExtras = take(&mut metadata, SPEC_ANNOTATION)?;
    let status_extras: StatusExtras = take(&mut metadata, STATUS_ANNOTATION)?;
    let status = status.map(|status| {
        let endpoints = v1::Endpoints {
            read_write: status.endpoint,
            read_only: status_extras.read_only_endpoint,
        };
        let keep_endpoints = endpoints != v1::Endpoints::default() || status_extras.empty_endpoints;
        v1::DatabaseClusterStatus {
            observed_generation: status_extras.observed_generation,
            phase: status.phase,
            conditions: status.conditions,
            instances: status.instances,
            ready_instances: status_extras.ready_instances,
            selector: status_extras.selector,
            current_primary: status_extras.current_primary,
            endpoints: keep_endpoints.then_some(endpoints),
            credentials_secret: status_extras.credentials_secret,
            postgres_version: status_extras.postgres_version,
            initialized: status_extras.initialized,
            timeline: status_extras.timeline,
            last_failover: status_extras.last_failover,
            last_switchover: status_extras.last_switchover,
            restored_from: status_extras.restored_from,
        }
    });
    let mut converted = v1::DatabaseCluster::new(
        "",
        v1::DatabaseClusterSpec {
            instances: spec.size,
            postgres: v1::PostgresSpec {
                version: spec.version,
                image: extras.image,
                parameters: extras.parameters,
            },
            storage: v1::StorageSpec {
                size: spec.storage_size,
                storage_class_name: extras.storage_class_name,
            },
            resources: extras.resources,
            scheduling: extras.scheduling,
            bootstrap: extras.bootstrap,
            paused: extras.paused,
            failover: extras.failover,
            replication: extras.replication,
            backup: extras.backup,
        },
    );
    converted.metadata = metadata;
    converted.status = status;
    Ok(converted)
}

/// Writes `extras` into annotation `key` unless it is empty.
fn keep<T: Serialize + Default + PartialEq>(
    metadata: &mut ObjectMeta,
    key: &str,
    extras: &T,
) -> Result<(), ConversionError> {
    if *extras == T::default() {
        return Ok(());
    }
    // A field that cannot be kept fails the conversion: dropping it would
    // lose it on the next write through the old version.
    let json = serde_json::to_string(extras)
        .map_err(|e| ConversionError::Unkeepable(key.to_owned(), e))?;
    metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(key.to_owned(), json);
    Ok(())
}

/// Removes annotation `key` and parses it (empty if absent).
fn take<T: for<'de> Deserialize<'de> + Default>(
    metadata: &mut ObjectMeta,
    key: &str,
) -> Result<T, ConversionError> {
    let Some(annotations) = metadata.annotations.as_mut() else {
        return Ok(T::default());
    };
    let Some(json) = annotations.remove(key) else {
        return Ok(T::default());
    };
    // `keep` created the map if this annotation was its only entry.
    if annotations.is_empty() {
        metadata.annotations = None;
    }
    serde_json::from_str(&json).map_err(|e| ConversionError::BadAnnotation(key.to_owned(), e))
}

/// Converts one object, in either version, to `desired_api_version`.
pub fn convert(object: Value, desired_api_version: &str) -> Result<Value, ConversionError> {
    let from = object
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    if from == desired_api_version {
        return Ok(object);
    }
    let converted = match (from.as_str(), desired_api_version) {
        (V1ALPHA1, V1) => serde_json::to_value(to_v1(serde_json::from_value(object)?)?)?,
        (V1, V1ALPHA1) => serde_json::to_value(to_v1alpha1(serde_json::from_value(object)?)?)?,
        (V1 | V1ALPHA1, other) => return Err(ConversionError::UnknownVersion(other.to_owned())),
        (other, _) => return Err(ConversionError::UnknownVersion(other.to_owned())),
    };
    Ok(converted)
}

/// Answers a `ConversionReview` from the API server: every object converted,
/// or a failure naming the first that could not be.
pub fn review(review: ConversionReview) -> ConversionReview {
    let request = match ConversionRequest::from_review(review) {
        Ok(request) => request,
        Err(e) => {
            return ConversionResponse::invalid(Status::failure(&e.to_string(), "BadRequest"))
                .into_review();
        }
    };
    let desired = request.desired_api_version.clone();
    let objects = request.objects.clone();
    let response = ConversionResponse::for_request(request);
    match objects
        .into_iter()
        .map(|o| convert(o, &desired))
        .collect::<Result<Vec<_>, _>>()
    {
        Ok(converted) => response.success(converted),
        Err(e) => response.failure(Status::failure(&e.to_string(), "ConversionFailed")),
    }
    .into_review()
}
