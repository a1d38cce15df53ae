//! One trait per external kind (Crossplane's `ExternalClient`): observe,
//! create, claim, update and delete, each idempotent, each one call path to
//! the provider. The generic order in which they are used is `policy`'s.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use aws_sdk_s3::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};

use crate::policy::Observed;

/// The SDK's HTTP response, the same for every AWS service's client.
pub type Response = aws_sdk_s3::config::http::HttpResponse;

/// The tag on every external resource Cairn creates: its object's UID.
pub const OWNER_TAG: &str = "cairn.dev/owner-uid";

/// What one observation of the provider found.
#[derive(Clone, Debug, PartialEq)]
pub struct Observation {
    pub observed: Observed,
    /// What the provider reports, for `status.atProvider`.
    pub at_provider: BTreeMap<String, String>,
    /// What differs from the spec, one phrase each (empty when up to date).
    pub drift: Vec<String>,
}

impl Observation {
    pub fn absent() -> Self {
        Self {
            observed: Observed::Absent,
            at_provider: BTreeMap::new(),
            drift: Vec::new(),
        }
    }
}

/// An external kind. `name` is the object's external name (deterministic:
/// the same object always manages the same name), `owner` its UID.
pub trait External {
    /// The spec the resource should match.
    type Spec: Sync;

    fn observe(
        &self,
        spec: &Self::Spec,
        name: &str,
        owner: &str,
    ) -> impl Future<Output = Result<Observation, CloudError>> + Send;

    /// Creates it, tagged with `owner`, as the spec says.
    fn create(
        &self,
        spec: &Self::Spec,
        name: &str,
        owner: &str,
    ) -> impl Future<Output = Result<(), CloudError>> + Send;

    /// Makes it match the spec, owner tag included (also how an interrupted
    /// create or an adopted resource is claimed).
    fn update(
        &self,
        spec: &Self::Spec,
        name: &str,
        owner: &str,
    ) -> impl Future<Output = Result<(), CloudError>> + Send;

    /// Deletes it; done when it is already gone.
    fn delete(&self, name: &str) -> impl Future<Output = Result<(), CloudError>> + Send;
}

/// Why a call to the provider failed, by what to do about it.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CloudError {
    /// Throttled: retried after the provider's hint, or with backoff.
    #[error("{operation}: throttled by the provider ({code})")]
    Throttled {
        operation: &'static str,
        code: String,
        retry_after: Option<Duration>,
    },
    /// A fault of the provider or of the way there (5xx, timeout, no
    /// connection): retried with backoff.
    #[error("{operation}: {message}")]
    Unavailable {
        operation: &'static str,
        message: String,
    },
    /// Refused for lack of permission: reported, retried with backoff (a
    /// policy may be fixed meanwhile).
    #[error("{operation}: permission denied ({code}): {message}")]
    Denied {
        operation: &'static str,
        code: String,
        message: String,
    },
    /// Another resource must change first (a bucket that still holds
    /// objects): reported, retried with backoff.
    #[error("{operation}: {message}")]
    Dependency {
        operation: &'static str,
        message: String,
    },
    /// The request cannot succeed as the spec stands (a name taken by
    /// another account, a zone that does not exist): terminal until the spec
    /// changes.
    #[error("{operation}: {code}: {message}")]
    Invalid {
        operation: &'static str,
        code: String,
        message: String,
    },
}

impl CloudError {
    /// The searchable reason of the `Synced=False` condition.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Throttled { .. } => "Throttled",
            Self::Unavailable { .. } => "ProviderUnavailable",
            Self::Denied { .. } => "PermissionDenied",
            Self::Dependency { .. } => "DependencyNotReady",
            Self::Invalid { .. } => "InvalidRequest",
        }
    }

    /// Whether only a spec change can make the call succeed.
    pub fn is_terminal(&self) -> bool {
        matches!(self, Self::Invalid { .. })
    }

    /// Whether the provider answered a create with a refusal, so that
    /// nothing was made (unlike a timeout or a 5xx, after which it may have).
    pub fn created_nothing(&self) -> bool {
        matches!(
            self,
            Self::Invalid { .. } | Self::Denied { .. } | Self::Throttled { .. }
        )
    }

    /// Classifies an error response by its HTTP status and AWS error code.
    pub fn from_response(
        operation: &'static str,
        status: Option<u16>,
        code: Option<&str>,
        message: Option<&str>,
        retry_after: Option<Duration>,
    ) -> Self {
        let code = code.unwrap_or("Unknown").to_owned();
        let message = message.unwrap_or("no message").to_owned();
        match (status, code.as_str()) {
            (_, "Throttling" | "ThrottlingException" | "SlowDown" | "RequestLimitExceeded")
            | (Some(429), _) => Self::Throttled {
                operation,
                code,
                retry_after,
            },
            (
                _,
                "BucketNotEmpty"
                | "HostedZoneNotEmpty"
                | "OperationAborted"
                | "PriorRequestNotComplete",
            ) => Self::Dependency { operation, message },
            (
                _,
                "AccessDenied"
                | "AccessDeniedException"
                | "InvalidAccessKeyId"
                | "SignatureDoesNotMatch"
                | "ExpiredToken",
            )
            | (Some(401 | 403), _) => Self::Denied {
                operation,
                code,
                message,
            },
            // What no retry can fix as the spec stands.
            (
                _,
                "BucketAlreadyExists"
                | "InvalidBucketName"
                | "IllegalLocationConstraintException"
                | "InvalidLocationConstraint"
                | "InvalidTag"
                | "MalformedXML"
                | "InvalidArgument"
                | "NoSuchHostedZone"
                | "InvalidChangeBatch"
                | "InvalidInput"
                | "OwnedByAnother"
                | "BuildError",
            ) => Self::Invalid {
                operation,
                code,
                message,
            },
            // Anything else (5xx, timeouts, a resource that went away
            // meanwhile, an unknown code) is retried with backoff.
            (status, _) => Self::Unavailable {
                operation,
                message: match status {
                    Some(status) => format!("{status} {code}: {message}"),
                    None => message,
                },
            },
        }
    }
}

/// The HTTP status of a failed call, if a response came.
pub fn http_status<E>(error: &SdkError<E, Response>) -> Option<u16> {
    error.raw_response().map(|r| r.status().as_u16())
}

/// A failed call of any AWS service's client, classified.
pub fn fail<E: ProvideErrorMetadata + std::error::Error + 'static>(
    operation: &'static str,
    error: SdkError<E, Response>,
) -> CloudError {
    let retry_after = error
        .raw_response()
        .and_then(|r| r.headers().get("retry-after"))
        .and_then(|v| v.parse::<u64>().ok())
        .map(Duration::from_secs);
    let message = error
        .message()
        .map(str::to_owned)
        .unwrap_or_else(|| DisplayErrorContext(&error).to_string());
    CloudError::from_response(
        operation,
        http_status(&error),
        error.code(),
        Some(&message),
        retry_after,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn responses_are_classified_by_what_can_be_done() {
        let classify = |status, code| CloudError::from_response("op", status, code, None, None);
        assert_eq!(classify(Some(503), Some("SlowDown")).reason(), "Throttled");
        assert_eq!(
            classify(Some(400), Some("Throttling")).reason(),
            "Throttled"
        );
        assert_eq!(classify(Some(429), None).reason(), "Throttled");
        assert_eq!(
            classify(Some(500), Some("InternalError")).reason(),
            "ProviderUnavailable"
        );
        assert_eq!(classify(None, None).reason(), "ProviderUnavailable");
        assert_eq!(
            classify(Some(403), Some("AccessDenied")).reason(),
            "PermissionDenied"
        );
        assert_eq!(
            classify(Some(409), Some("BucketNotEmpty")).reason(),
            "DependencyNotReady"
        );
        let taken = classify(Some(409), Some("BucketAlreadyExists"));
        assert_eq!(taken.reason(), "InvalidRequest");
        assert!(taken.is_terminal());
        assert!(taken.created_nothing());
        assert!(!classify(Some(500), None).is_terminal());
        assert!(!classify(Some(500), None).created_nothing());
        // Unknown or passing troubles are retried, not terminal.
        assert!(!classify(Some(400), Some("RequestTimeout")).is_terminal());
        assert!(!classify(Some(404), Some("NoSuchBucket")).is_terminal());
        assert!(!classify(Some(301), Some("PermanentRedirect")).is_terminal());
    }
}
