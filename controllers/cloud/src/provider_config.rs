//! ProviderConfig's own status: whether its credentials work (STS
//! GetCallerIdentity, which needs no permission), which objects use it, and
//! a finalizer that holds its deletion while any still does — an object
//! whose ProviderConfig is gone could not delete its external resource.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cairn_api::cloud::v1alpha1::{CloudStatus, DnsRecord, ObjectBucket, ProviderConfig};
use cairn_runtime::conditions::{self, Time};
use cairn_runtime::finalizers;
use cairn_runtime::manager::Recheck;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Resource, ResourceExt};

use crate::driver::{self, Context, Error, Managed};
use crate::external::{CloudError, fail};

/// Held while objects of the namespace use the ProviderConfig.
pub const IN_USE_FINALIZER: &str = "cloud.cairn.dev/in-use";
/// On the credentials Secret while a ProviderConfig names it: deleting the
/// namespace (or the Secret) must not take the credentials away before the
/// objects have deleted what they made with them.
pub const CREDENTIALS_FINALIZER: &str = "cloud.cairn.dev/credentials-in-use";
/// `status.atProvider` key: the Secret whose finalizer this ProviderConfig
/// placed (released when the reference changes or the ProviderConfig goes).
pub const HELD_SECRET: &str = "credentialsSecret";
/// How often working credentials are checked again.
const RECHECK: Duration = Duration::from_secs(300);
/// How often a deletion held by users, or a missing Secret, is looked at
/// again.
const WHILE_HELD: Duration = Duration::from_secs(10);
/// Users named in the `InUse` message; the rest are counted.
const NAMED_USERS: usize = 10;

/// What the users of ProviderConfigs are found in, and the last successful
/// credentials check of each.
pub struct Users {
    buckets: Store<ObjectBucket>,
    records: Store<DnsRecord>,
    checks: Mutex<HashMap<ObjectRef<ProviderConfig>, Check>>,
}

/// A successful identity call: for which version of the ProviderConfig and
/// its Secret, when, and the account.
struct Check {
    version: String,
    at: Instant,
    account: String,
}

impl Users {
    pub fn new(buckets: Store<ObjectBucket>, records: Store<DnsRecord>) -> Self {
        Self {
            buckets,
            records,
            checks: Mutex::new(HashMap::new()),
        }
    }

    /// The account of a check of this `version` less than [`RECHECK`] ago:
    /// a reconcile woken by a user's change makes no call.
    fn recent_check(&self, key: &ObjectRef<ProviderConfig>, version: &str) -> Option<String> {
        let checks = self.checks.lock().unwrap_or_else(|p| p.into_inner());
        checks
            .get(key)
            .filter(|c| c.version == version && c.at.elapsed() < RECHECK)
            .map(|c| c.account.clone())
    }

    fn checked(&self, key: ObjectRef<ProviderConfig>, version: String, account: String) {
        let mut checks = self.checks.lock().unwrap_or_else(|p| p.into_inner());
        checks.insert(
            key,
            Check {
                version,
                at: Instant::now(),
                account,
            },
        );
    }

    /// `Kind/name` of every object of `namespace` that uses `config`, sorted.
    fn of(&self, namespace: &str, config: &str) -> Vec<String> {
        let mut users = named_users(&self.buckets, namespace, config);
        users.extend(named_users(&self.records, namespace, config));
        users.sort();
        users
    }
}

fn named_users<M: Managed>(store: &Store<M>, namespace: &str, config: &str) -> Vec<String> {
    store
        .state()
        .iter()
        .filter(|o| o.namespace().as_deref() == Some(namespace) && o.provider_config() == config)
        .map(|o| format!("{}/{}", M::kind(&()), o.name_any()))
        .collect()
}

/// Reconciles one ProviderConfig.
pub async fn reconcile(
    config: Arc<ProviderConfig>,
    ctx: Arc<(Arc<Context>, Users)>,
) -> Result<Recheck, Error> {
    let (ctx, registry) = (&ctx.0, &ctx.1);
    let namespace = config.namespace().unwrap_or_default();
    let name = config.name_any();
    let key = ObjectRef::from_obj(&*config);
    let api = Api::<ProviderConfig>::namespaced(ctx.client.clone(), &namespace);
    let users = registry.of(&namespace, &name);
    let in_use = in_use(&users);
    let secrets = Api::<Secret>::namespaced(ctx.client.clone(), &namespace);
    let wanted = config.spec.credentials_secret_ref.name.clone();
    let held = config
        .status
        .as_ref()
        .and_then(|s| s.at_provider.get(HELD_SECRET))
        .cloned();
    let shared = |secret: &str| used_by_another(&ctx.provider_configs, &config, secret);
    if config.meta().deletion_timestamp.is_some() {
        if users.is_empty() {
            for secret in BTreeSet::from_iter([Some(wanted), held].into_iter().flatten()) {
                if !shared(&secret) {
                    release_credentials(&secrets, &secret).await?;
                }
            }
            finalizers::remove(&api, &*config, IN_USE_FINALIZER).await?;
            return Ok(Recheck::AfterResync);
        }
        let held = held.as_deref();
        write_status(ctx, &api, &config, None, in_use, users.len(), held).await?;
        return Ok(Recheck::Within(WHILE_HELD));
    }
    finalizers::add(&api, &*config, IN_USE_FINALIZER).await?;
    if let Some(old) = held.filter(|old| *old != wanted && !shared(old)) {
        release_credentials(&secrets, &old).await?;
    }
    let holding = hold_credentials(&secrets, &wanted).await?;
    let identity = match ctx.versioned_provider(&namespace, &name).await {
        Ok((version, provider)) => match registry.recent_check(&key, &version) {
            Some(account) => Ok(account),
            None => {
                let identity = caller_identity(&provider.sts()).await;
                if let Ok(account) = &identity {
                    registry.checked(key, version, account.clone());
                }
                identity
            }
        },
        Err(Error::Provider(unusable)) => Err(Unchecked::Unusable(unusable.0)),
        Err(e) => return Err(e),
    };
    let ready = match &identity {
        Ok(account) => (
            true,
            "CredentialsValid",
            format!("the credentials work (account {account})"),
        ),
        Err(Unchecked::Unusable(message)) => (false, "ProviderConfigUnusable", message.clone()),
        Err(Unchecked::Refused(e)) => (false, e.reason(), e.to_string()),
    };
    let held = holding.then_some(wanted.as_str());
    write_status(ctx, &api, &config, Some(ready), in_use, users.len(), held).await?;
    match identity {
        Err(Unchecked::Refused(e)) => Err(e.into()),
        // Secrets are not watched: a missing one is looked for again soon.
        Err(Unchecked::Unusable(_)) => Ok(Recheck::Within(WHILE_HELD)),
        Ok(_) => Ok(Recheck::Within(RECHECK)),
    }
}

/// Puts the finalizer on credentials Secret `name`; whether it holds it (a
/// Secret already being deleted takes no new finalizer).
async fn hold_credentials(secrets: &Api<Secret>, name: &str) -> Result<bool, kube::Error> {
    Ok(match secrets.get_opt(name).await? {
        Some(secret) if secret.metadata.deletion_timestamp.is_none() => {
            finalizers::add(secrets, &secret, CREDENTIALS_FINALIZER).await?;
            true
        }
        Some(secret) => secret
            .finalizers()
            .iter()
            .any(|f| f == CREDENTIALS_FINALIZER),
        None => false,
    })
}

async fn release_credentials(secrets: &Api<Secret>, name: &str) -> Result<(), kube::Error> {
    if let Some(secret) = secrets.get_opt(name).await? {
        finalizers::remove(secrets, &secret, CREDENTIALS_FINALIZER).await?;
    }
    Ok(())
}

/// Whether another ProviderConfig of the namespace, not being deleted,
/// names Secret `secret`.
fn used_by_another(configs: &Store<ProviderConfig>, config: &ProviderConfig, secret: &str) -> bool {
    configs.state().iter().any(|other| {
        other.namespace() == config.namespace()
            && other.name_any() != config.name_any()
            && other.metadata.deletion_timestamp.is_none()
            && other.spec.credentials_secret_ref.name == secret
    })
}

/// Why the credentials were not shown to work.
enum Unchecked {
    /// The ProviderConfig or its Secret cannot make a client.
    Unusable(String),
    /// The provider refused or failed the identity call.
    Refused(CloudError),
}

/// The account the credentials belong to.
async fn caller_identity(sts: &aws_sdk_sts::Client) -> Result<String, Unchecked> {
    let identity = sts
        .get_caller_identity()
        .send()
        .await
        .map_err(|e| Unchecked::Refused(fail("GetCallerIdentity", e)))?;
    Ok(identity.account().unwrap_or("unknown").to_owned())
}

/// The `InUse` condition: whether objects use it, naming the first ones.
fn in_use(users: &[String]) -> (bool, &'static str, String) {
    if users.is_empty() {
        return (false, "Unused", "no object uses it".to_owned());
    }
    let mut message = format!(
        "used by {} object(s): {}",
        users.len(),
        users[..users.len().min(NAMED_USERS)].join(", ")
    );
    if users.len() > NAMED_USERS {
        message.push_str(", …");
    }
    message.push_str("; deleting it waits until none does");
    (true, "InUse", message)
}

/// Writes `Ready` (unless `None`), `InUse` and the user count when they
/// change; nothing at steady state.
async fn write_status(
    ctx: &Context,
    api: &Api<ProviderConfig>,
    config: &ProviderConfig,
    ready: Option<(bool, &str, String)>,
    in_use: (bool, &str, String),
    users: usize,
    held: Option<&str>,
) -> Result<(), kube::Error> {
    let previous = config.status.clone().unwrap_or_default();
    let status = next_status(
        &previous,
        config.meta().generation,
        ready,
        in_use,
        users,
        held,
        Time(Timestamp::now()),
    );
    // No object using it is no problem.
    driver::write_status(ctx, api, config, &previous, &status, &["Unused"]).await
}

/// The status with these conditions set (pure: unit-tested).
fn next_status(
    previous: &CloudStatus,
    generation: Option<i64>,
    ready: Option<(bool, &str, String)>,
    in_use: (bool, &str, String),
    users: usize,
    held: Option<&str>,
    now: Time,
) -> CloudStatus {
    let mut status = previous.clone();
    let (used, reason, message) = in_use;
    let mut set = |type_: &str, value: bool, reason: &str, message: String| {
        let condition = conditions::new(type_, value, reason, message, generation, now.clone());
        conditions::set(&mut status.conditions, condition);
    };
    if let Some((value, reason, message)) = ready {
        set("Ready", value, reason, message);
    }
    set("InUse", used, reason, message);
    status
        .at_provider
        .insert("users".to_owned(), users.to_string());
    match held {
        Some(secret) => status
            .at_provider
            .insert(HELD_SECRET.to_owned(), secret.to_owned()),
        None => status.at_provider.remove(HELD_SECRET),
    };
    status.observed_generation = generation;
    status
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> Time {
        Time(Timestamp::UNIX_EPOCH)
    }

    #[test]
    fn in_use_names_the_first_users_and_counts_all() {
        assert_eq!(in_use(&[]).1, "Unused");
        let users: Vec<String> = (0..12).map(|i| format!("ObjectBucket/b{i:02}")).collect();
        let (used, reason, message) = in_use(&users);
        assert!(used);
        assert_eq!(reason, "InUse");
        assert!(message.starts_with("used by 12 object(s): ObjectBucket/b00,"));
        assert!(message.contains("ObjectBucket/b09, …"));
        assert!(!message.contains("b10"));
    }

    #[test]
    fn an_unchanged_status_is_equal_so_nothing_is_written() {
        let ready = || Some((true, "CredentialsValid", "ok".to_owned()));
        let first = next_status(
            &CloudStatus::default(),
            Some(1),
            ready(),
            in_use(&["ObjectBucket/a".to_owned()]),
            1,
            None,
            now(),
        );
        let later = Time(Timestamp::from_second(60).unwrap_or(Timestamp::UNIX_EPOCH));
        let again = next_status(
            &first,
            Some(1),
            ready(),
            in_use(&["ObjectBucket/a".to_owned()]),
            1,
            None,
            later,
        );
        assert_eq!(first, again);
        assert_eq!(
            first.at_provider.get("users").map(String::as_str),
            Some("1")
        );
    }

    #[test]
    fn a_held_deletion_keeps_the_last_ready_condition() {
        let first = next_status(
            &CloudStatus::default(),
            Some(1),
            Some((true, "CredentialsValid", "ok".to_owned())),
            in_use(&[]),
            0,
            None,
            now(),
        );
        let held = next_status(
            &first,
            Some(1),
            None,
            in_use(&["ObjectBucket/a".to_owned()]),
            1,
            None,
            now(),
        );
        let reasons: Vec<&str> = held.conditions.iter().map(|c| c.reason.as_str()).collect();
        assert!(reasons.contains(&"CredentialsValid") && reasons.contains(&"InUse"));
    }
}
