//! Instance pods whose ServiceAccount token is void (pure).
//!
//! A pod's projected token is bound to its ServiceAccount's uid. When the
//! ServiceAccount is deleted and this controller creates it again, every
//! running instance gets 401 from the API server: no member heartbeat, so
//! the primary looks lost and no replica can take over, until the kubelet
//! refreshes the token (at 80 % of its hour, up to 48 minutes later; found
//! by the chaos run). A pod created before its ServiceAccount is restarted
//! instead, to get a valid token: the replicas first, the primary once no
//! replica is left with a void token.

use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use kube::ResourceExt;

/// The pods to restart now: those created before `service_account` (their
/// token names one deleted since), replicas before the primary `primary`.
pub fn void_token_pods<'a>(
    service_account: &ServiceAccount,
    pods: &[&'a Pod],
    primary: &str,
) -> Vec<&'a Pod> {
    let Some(account_created) = service_account.metadata.creation_timestamp.as_ref() else {
        return Vec::new();
    };
    // Timestamps have a second's resolution: a pod of the same second as
    // its account was admitted after it (admission needs the account).
    let void: Vec<&Pod> = pods
        .iter()
        .copied()
        .filter(|pod| pod.metadata.deletion_timestamp.is_none())
        .filter(|pod| {
            pod.metadata
                .creation_timestamp
                .as_ref()
                .is_some_and(|created| created.0 < account_created.0)
        })
        .collect();
    let (primaries, replicas): (Vec<&Pod>, Vec<&Pod>) =
        void.into_iter().partition(|pod| pod.name_any() == primary);
    if replicas.is_empty() {
        primaries
    } else {
        replicas
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::{SignedDuration, Timestamp};

    fn at(base: Timestamp, seconds: i64) -> Option<Time> {
        Some(Time(base + SignedDuration::from_secs(seconds)))
    }

    fn pod(name: &str, created: Option<Time>) -> Pod {
        let mut pod = Pod::default();
        pod.metadata.name = Some(name.into());
        pod.metadata.creation_timestamp = created;
        pod
    }

    fn names(pods: Vec<&Pod>) -> Vec<String> {
        pods.iter().map(|p| p.name_any()).collect()
    }

    #[test]
    fn pods_older_than_their_account_restart_replicas_first() {
        let base = Timestamp::now();
        let mut account = ServiceAccount::default();
        account.metadata.creation_timestamp = at(base, 100);
        let primary = pod("db-0", at(base, 0));
        let replica = pod("db-1", at(base, 10));
        let fresh = pod("db-2", at(base, 100));
        let mut going = pod("db-3", at(base, 20));
        going.metadata.deletion_timestamp = at(base, 101);

        let now = void_token_pods(&account, &[&primary, &replica, &fresh, &going], "db-0");
        assert_eq!(names(now), ["db-1"], "the replica with a void token first");
        let now = void_token_pods(&account, &[&primary, &fresh], "db-0");
        assert_eq!(names(now), ["db-0"], "then the primary");
        let restarted = pod("db-0", at(base, 130));
        assert!(void_token_pods(&account, &[&restarted, &fresh], "db-0").is_empty());
    }

    #[test]
    fn an_account_not_yet_created_voids_nothing() {
        let old = pod("db-0", at(Timestamp::now(), -3600));
        assert!(void_token_pods(&ServiceAccount::default(), &[&old], "db-0").is_empty());
    }
}
