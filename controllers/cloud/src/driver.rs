//! The one driver of every external kind (Crossplane's managed reconciler):
//! read what the object asks, observe the provider, take the one step
//! `policy` decides, and report it in the status. A kind plugs in through
//! [`Managed`]; what it manages is reached through its [`External`].

use std::collections::{BTreeMap, HashMap};
use std::fmt::Debug;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cairn_api::cloud::v1alpha1::{
    CloudStatus, DeletionPolicy, EXTERNAL_NAME_ANNOTATION, ManagementPolicy, ProviderConfig,
};
use cairn_runtime::conditions::{self, Time};
use cairn_runtime::errors::ErrorClass;
use cairn_runtime::manager::{Classify, Recheck};
use cairn_runtime::{apply, events, finalizers};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use k8s_openapi::{ByteString, NamespaceResourceScope};
use kube::api::{Patch, PatchParams};
use kube::runtime::events::Recorder;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Client, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;

use crate::external::{CloudError, External, Observation};
use crate::metrics::CloudMetrics;
use crate::policy::{
    self, ADOPT_ANNOTATION, CREATE_PENDING_ANNOTATION, Intent, Observed, PAUSED_ANNOTATION, Step,
};
use crate::provider::{Provider, Unusable};

/// Held while the external resource must be deleted with the object.
pub const FINALIZER: &str = "cloud.cairn.dev/external-resource";
/// The field manager of the controller's writes.
pub const MANAGER: &str = "cairn-cloud-controller";
/// Seconds between observations of an up-to-date resource, per object.
pub const POLL_ANNOTATION: &str = "cloud.cairn.dev/poll-seconds";
/// After a create, update or delete: observe again soon.
const SOON: Duration = Duration::from_secs(2);

/// A kind whose objects each manage one external resource.
pub trait Managed:
    Resource<DynamicType = (), Scope = NamespaceResourceScope>
    + Clone
    + Debug
    + Serialize
    + DeserializeOwned
    + Send
    + Sync
    + 'static
{
    type External: External<Spec: PolicySpec> + Send + Sync;

    fn desired(&self) -> &<Self::External as External>::Spec;
    fn provider_config(&self) -> &str {
        self.desired().provider_config()
    }
    fn deletion_policy(&self) -> DeletionPolicy {
        self.desired().deletion_policy()
    }
    fn management_policy(&self) -> ManagementPolicy {
        self.desired().management_policy()
    }
    /// The external name when none is recorded yet (deterministic).
    fn derived_name(&self) -> String;
    fn cloud_status(&self) -> Option<&CloudStatus>;
    /// The client of this kind through `provider`.
    fn external(&self, provider: &Provider) -> Self::External;
    /// The Secret to publish how to use the resource `name` in, and what.
    fn connection(
        &self,
        _provider: &Provider,
        _name: &str,
    ) -> Option<(String, BTreeMap<String, String>)> {
        None
    }
}

/// What the spec of every managed kind says beside its resource: the
/// ProviderConfig and the two policies.
pub trait PolicySpec {
    fn provider_config(&self) -> &str;
    fn deletion_policy(&self) -> DeletionPolicy;
    fn management_policy(&self) -> ManagementPolicy;
}

/// The managed kinds' specs share these fields by name.
macro_rules! policy_spec {
    ($($spec:ty),*) => {$(
        impl PolicySpec for $spec {
            fn provider_config(&self) -> &str {
                &self.provider_config_ref.name
            }
            fn deletion_policy(&self) -> DeletionPolicy {
                self.deletion_policy
            }
            fn management_policy(&self) -> ManagementPolicy {
                self.management_policy
            }
        }
    )*};
}
policy_spec!(
    cairn_api::cloud::v1alpha1::ObjectBucketSpec,
    cairn_api::cloud::v1alpha1::DnsRecordSpec
);

/// Why a reconcile failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error(transparent)]
    Cloud(#[from] CloudError),
    /// The ProviderConfig or its Secret is missing or incomplete.
    #[error("{0}")]
    Provider(#[from] Unusable),
    /// The resource is not this object's to manage.
    #[error("{0}")]
    Refused(String),
    /// The connection Secret named is not this object's to write.
    #[error("{0}")]
    ConnectionSecret(String),
}

impl Classify for Error {
    fn class(&self) -> ErrorClass {
        match self {
            Self::Kube(_) => ErrorClass::Transient,
            Self::Cloud(e) if e.is_terminal() => ErrorClass::InvalidSpec,
            Self::Cloud(CloudError::Dependency { .. }) | Self::Provider(_) => {
                ErrorClass::DependencyNotReady
            }
            Self::Cloud(_) => ErrorClass::Transient,
            Self::Refused(_) | Self::ConnectionSecret(_) => ErrorClass::InvalidSpec,
        }
    }
}

/// What every reconcile shares.
pub struct Context {
    pub client: Client,
    pub provider_configs: Store<ProviderConfig>,
    /// One client (and token bucket) per ProviderConfig and Secret version.
    providers: Mutex<HashMap<ObjectRef<ProviderConfig>, (String, Provider)>>,
    /// Seconds between observations of an up-to-date resource.
    pub poll: Duration,
    pub metrics: CloudMetrics,
    /// Every status write, remembered against a lagging cache.
    pub applier: apply::Applier,
    /// Announces each condition's transitions.
    pub recorder: Recorder,
}

impl Context {
    pub fn new(
        client: Client,
        provider_configs: Store<ProviderConfig>,
        poll: Duration,
        metrics: CloudMetrics,
    ) -> Self {
        Self {
            recorder: Recorder::new(client.clone(), MANAGER.into()),
            client,
            provider_configs,
            providers: Mutex::new(HashMap::new()),
            poll,
            metrics,
            applier: apply::Applier::default(),
        }
    }

    /// The provider of ProviderConfig `name` in `namespace`. Its Secret is
    /// read, not cached: the controller may not watch every Secret.
    pub(crate) async fn provider(&self, namespace: &str, name: &str) -> Result<Provider, Error> {
        Ok(self.versioned_provider(namespace, name).await?.1)
    }

    /// The provider and the version it was made from: the ProviderConfig's
    /// and its Secret's resource versions.
    pub(crate) async fn versioned_provider(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<(String, Provider), Error> {
        let key = ObjectRef::<ProviderConfig>::new(name).within(namespace);
        let config = self.provider_configs.get(&key).ok_or_else(|| {
            Unusable(format!(
                "ProviderConfig {name} (spec.providerConfigRef) does not exist in this namespace"
            ))
        })?;
        let secret = Api::<Secret>::namespaced(self.client.clone(), namespace)
            .get_opt(&config.spec.credentials_secret_ref.name)
            .await?;
        // What the client is made of: the spec and the Secret's data, not
        // their resource versions (the ProviderConfig's status and the
        // Secret's finalizer change those), so its token bucket lasts.
        let version = format!(
            "{}/{:x}",
            config.metadata.generation.unwrap_or_default(),
            hash_of(
                secret
                    .as_ref()
                    .and_then(|s| s.data.as_ref())
                    .map(|data| data.iter().map(|(k, v)| (k, &v.0)).collect::<Vec<_>>())
            )
        );
        let mut providers = self.providers.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((known, provider)) = providers.get(&key)
            && *known == version
        {
            return Ok((version, provider.clone()));
        }
        let provider =
            Provider::new(&config.spec, secret.as_ref())?.counting(self.metrics.calls.clone());
        providers.insert(key, (version.clone(), provider.clone()));
        Ok((version, provider))
    }
}

fn hash_of(value: impl std::hash::Hash) -> u64 {
    use std::hash::{BuildHasher, RandomState};
    static STATE: std::sync::OnceLock<RandomState> = std::sync::OnceLock::new();
    STATE.get_or_init(RandomState::new).hash_one(value)
}

/// What the object asks, for `policy`.
fn intent(object: &impl Managed) -> Intent {
    let flag = |annotation: &str| {
        object
            .annotations()
            .get(annotation)
            .is_some_and(|v| v == "true")
    };
    Intent {
        deleting: object.meta().deletion_timestamp.is_some(),
        paused: flag(PAUSED_ANNOTATION),
        deletion: object.deletion_policy(),
        management: object.management_policy(),
        adopt: flag(ADOPT_ANNOTATION),
        create_pending_since: object
            .annotations()
            .get(CREATE_PENDING_ANNOTATION)
            .and_then(|t| t.parse::<Timestamp>().ok()),
        uid: object.uid().unwrap_or_default(),
        now: Timestamp::now(),
    }
}

/// The external name recorded on the object, or the derived one.
fn external_name(object: &impl Managed) -> String {
    object
        .annotations()
        .get(EXTERNAL_NAME_ANNOTATION)
        .cloned()
        .unwrap_or_else(|| object.derived_name())
}

/// Reconciles one object of a managed kind.
pub async fn reconcile<M: Managed>(object: Arc<M>, ctx: Arc<Context>) -> Result<Recheck, Error> {
    let object = ctx.applier.with_written_status(object);
    let namespace = object.namespace().unwrap_or_default();
    let api = Api::<M>::namespaced(ctx.client.clone(), &namespace);
    let intent = intent(&*object);
    match policy::before_observing(&intent) {
        Some(Step::Skip) => {
            let report = Report::synced(
                false,
                "ReconcilePaused",
                "paused: remove the annotation to resume",
            );
            report.write(&ctx, &api, &*object).await?;
            return Ok(Recheck::AfterResync);
        }
        Some(_) => {
            finalizers::remove(&api, &*object, FINALIZER).await?;
            return Ok(Recheck::AfterResync);
        }
        None => {}
    }
    let provider = match ctx.provider(&namespace, object.provider_config()).await {
        Ok(provider) => provider,
        Err(Error::Provider(unusable)) => {
            Report::synced(false, "ProviderConfigUnusable", &unusable.0)
                .write(&ctx, &api, &*object)
                .await?;
            return Err(unusable.into());
        }
        Err(e) => return Err(e),
    };
    let external = object.external(&provider);
    let name = external_name(&*object);
    let outcome = observe_and_act(&ctx, &api, &*object, &external, &name, &intent).await;
    match outcome {
        Ok((report, recheck)) => {
            let published = match object.connection(&provider, &name) {
                Some((secret, data)) if report.is_available() => {
                    publish(&ctx.client, &*object, &secret, data).await
                }
                _ => Ok(()),
            };
            let report = match &published {
                Err(e @ Error::ConnectionSecret(_)) => {
                    report.synced_as(false, "ConnectionSecretConflict", &e.to_string())
                }
                _ => report,
            };
            report.write(&ctx, &api, &*object).await?;
            published?;
            Ok(recheck.unwrap_or_else(|| Recheck::Within(poll_interval(&*object, ctx.poll))))
        }
        Err(Error::Cloud(e)) => {
            Report::synced(false, e.reason(), &e.to_string())
                .write(&ctx, &api, &*object)
                .await?;
            Err(e.into())
        }
        Err(Error::Refused(message)) => {
            Report::synced(false, "NotOwned", &message)
                .ready(false, "NotOwned", &message)
                .write(&ctx, &api, &*object)
                .await?;
            Err(Error::Refused(message))
        }
        Err(e) => Err(e),
    }
}

/// Observes, takes the step, and says what to report; `None`: recheck at
/// the poll interval.
async fn observe_and_act<M: Managed>(
    ctx: &Context,
    api: &Api<M>,
    object: &M,
    external: &M::External,
    name: &str,
    intent: &Intent,
) -> Result<(Report, Option<Recheck>), Error> {
    let (applier, metrics) = (&ctx.applier, &ctx.metrics);
    let kind = M::kind(&());
    let observation = external
        .observe(object.desired(), name, &intent.uid)
        .await?;
    let step = policy::decide(intent, &observation.observed);
    // An update of what was already tagged as ours settles a pending create.
    let settled = step == Step::Update;
    tracing::debug!(name, ?step, drift = ?observation.drift, "decided");
    let soon = Some(Recheck::Within(SOON));
    let done = Report::synced(true, "ReconcileSuccess", "");
    Ok(match step {
        Step::Skip => (Report::default(), None),
        Step::Release => {
            finalizers::remove(api, object, FINALIZER).await?;
            (Report::default(), None)
        }
        Step::Delete => {
            external.delete(name).await?;
            (done.ready(false, "Deleting", name), soon)
        }
        Step::Create => {
            mark_create_pending(api, object).await?;
            if let Err(e) = external.create(object.desired(), name, &intent.uid).await {
                // Refused outright: nothing was made, so nothing may be
                // claimed later on the strength of this marker.
                if e.created_nothing() {
                    lift_marker(applier, api, object).await?;
                }
                return Err(e.into());
            }
            // The marker stays until an observation shows our owner tag.
            record_name(applier, api, object, name, false).await?;
            (done.ready(false, "Creating", name), soon)
        }
        Step::Claim | Step::Update => {
            hold(api, object).await?;
            external.update(object.desired(), name, &intent.uid).await?;
            record_name(applier, api, object, name, settled).await?;
            let drift = observation.drift.join(", ");
            if !drift.is_empty() {
                tracing::info!(name, drift, "corrected drift");
                metrics.drift_corrections.with_label_values(&[&kind]).inc();
            }
            (done.ready(false, "Updating", name), soon)
        }
        Step::UpToDate => {
            // Both write only what is missing: nothing at steady state. The
            // finalizer too, for a policy changed to Delete since.
            hold(api, object).await?;
            record_name(applier, api, object, name, true).await?;
            if let Some(seconds) = first_ready_after_create(object) {
                metrics
                    .time_to_ready
                    .with_label_values(&[&kind])
                    .observe(seconds);
            }
            (
                done.ready(true, "Available", name).observed(&observation),
                None,
            )
        }
        Step::Report => {
            let present = observation.observed != Observed::Absent;
            let (reason, message) = if present {
                ("Observed", format!("{name} exists (observe only)"))
            } else {
                (
                    "NotFound",
                    format!("{name} does not exist (observe only: never created)"),
                )
            };
            (
                done.ready(present, reason, &message).observed(&observation),
                None,
            )
        }
        Step::Refuse(refusal) => return Err(Error::Refused(refusal.message(name))),
    })
}

/// Seconds since the object's creation, when the resource this object
/// created is ready for the first time (its Ready condition still says
/// `Creating`).
fn first_ready_after_create(object: &impl Managed) -> Option<f64> {
    let creating = object
        .cloud_status()?
        .conditions
        .iter()
        .any(|c| c.type_ == "Ready" && c.reason == "Creating");
    let created = object.meta().creation_timestamp.as_ref()?.0;
    creating.then(|| Timestamp::now().duration_since(created).as_secs_f64())
}

/// The finalizer, before anything exists that it must clean up (only for
/// policy Delete: an orphaned resource needs no clean-up).
async fn hold<M: Managed>(api: &Api<M>, object: &M) -> Result<(), Error> {
    if object.deletion_policy() == DeletionPolicy::Delete {
        finalizers::add(api, object, FINALIZER).await?;
    }
    Ok(())
}

/// The create-pending marker and the finalizer (policy Delete), written
/// before the create call in one write, and only if the object is still the
/// version that observed the resource absent.
async fn mark_create_pending<M: Managed>(api: &Api<M>, object: &M) -> Result<(), Error> {
    let mut finalizers = object.finalizers().to_vec();
    if object.deletion_policy() == DeletionPolicy::Delete
        && !finalizers.iter().any(|f| f == FINALIZER)
    {
        finalizers.push(FINALIZER.to_owned());
    }
    if object.annotations().contains_key(CREATE_PENDING_ANNOTATION)
        && finalizers == object.finalizers()
    {
        return Ok(());
    }
    let since = object
        .annotations()
        .get(CREATE_PENDING_ANNOTATION)
        .cloned()
        .unwrap_or_else(|| Timestamp::now().to_string());
    let marker = json!({ "metadata": {
        "resourceVersion": object.resource_version(),
        "finalizers": finalizers,
        "annotations": { CREATE_PENDING_ANNOTATION: since },
    }});
    api.patch(
        &object.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&marker),
    )
    .await?;
    Ok(())
}

/// Records the external name, and lifts the create-pending marker once an
/// observation has shown the resource tagged as ours (`settled`). Through
/// the applier: a cache lagging the write does not get it again at every
/// recheck.
async fn record_name<M: Managed>(
    applier: &apply::Applier,
    api: &Api<M>,
    object: &M,
    name: &str,
    settled: bool,
) -> Result<(), Error> {
    let annotations = object.annotations();
    let pending = settled && annotations.contains_key(CREATE_PENDING_ANNOTATION);
    if annotations
        .get(EXTERNAL_NAME_ANNOTATION)
        .map(String::as_str)
        == Some(name)
        && !pending
    {
        return Ok(());
    }
    let mut recorded = json!({ "metadata": { "annotations": { EXTERNAL_NAME_ANNOTATION: name } } });
    if pending {
        recorded["metadata"]["annotations"][CREATE_PENDING_ANNOTATION] = serde_json::Value::Null;
    }
    applier.merge_patch(api, object, &recorded).await?;
    Ok(())
}

/// Lifts the create-pending marker.
async fn lift_marker<M: Managed>(
    applier: &apply::Applier,
    api: &Api<M>,
    object: &M,
) -> Result<(), Error> {
    let lifted = json!({ "metadata": { "annotations": { CREATE_PENDING_ANNOTATION: null } } });
    applier.merge_patch(api, object, &lifted).await?;
    Ok(())
}

/// Writes the connection Secret `name` (owned by `object`, so it goes with
/// it) unless it already holds `data`.
async fn publish<M: Managed>(
    client: &Client,
    object: &M,
    name: &str,
    data: BTreeMap<String, String>,
) -> Result<(), Error> {
    let secrets =
        Api::<Secret>::namespaced(client.clone(), &object.namespace().unwrap_or_default());
    let wanted: BTreeMap<String, ByteString> = data
        .into_iter()
        .map(|(k, v)| (k, ByteString(v.into_bytes())))
        .collect();
    let current = secrets.get_opt(name).await?;
    if let Some(current) = &current {
        // Never another's Secret (credentials, another object's connection):
        // overwriting it, and owning it, would let the garbage collector
        // delete it with this object.
        let ours = current
            .owner_references()
            .iter()
            .any(|o| o.controller == Some(true) && Some(&o.uid) == object.uid().as_ref());
        if !ours {
            return Err(Error::ConnectionSecret(format!(
                "Secret {name} (spec.writeConnectionSecretToRef) exists and belongs to something else: name another"
            )));
        }
        if current.data.as_ref() == Some(&wanted) {
            return Ok(());
        }
    }
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            owner_references: object.controller_owner_ref(&()).map(|o| vec![o]),
            labels: Some(BTreeMap::from([(
                "app.kubernetes.io/managed-by".to_owned(),
                cairn_runtime::labels::MANAGED_BY.to_owned(),
            )])),
            ..ObjectMeta::default()
        },
        data: Some(wanted),
        ..Secret::default()
    };
    apply::apply(&secrets, MANAGER, &secret, None).await?;
    Ok(())
}

/// The poll interval of `object` (its annotation, or the default), with
/// ±10 % jitter so that objects created together do not poll together.
fn poll_interval(object: &impl Managed, default: Duration) -> Duration {
    let base = object
        .annotations()
        .get(POLL_ANNOTATION)
        .and_then(|s| s.parse::<u64>().ok())
        .filter(|s| *s >= 10)
        .map_or(default, Duration::from_secs);
    base.mul_f64(rand::random_range(0.9..1.1))
}

/// The reasons of `Ready=False` that are work under way, not problems.
const IN_PROGRESS: &[&str] = &["Creating", "Updating", "Deleting"];

/// The conditions and observations one reconcile reports.
#[derive(Debug, Default)]
struct Report {
    synced: Option<(bool, String, String)>,
    ready: Option<(bool, String, String)>,
    at_provider: Option<BTreeMap<String, String>>,
}

impl Report {
    fn synced(status: bool, reason: &str, message: &str) -> Self {
        Self {
            synced: Some((status, reason.to_owned(), message.to_owned())),
            ..Self::default()
        }
    }

    fn synced_as(mut self, status: bool, reason: &str, message: &str) -> Self {
        self.synced = Some((status, reason.to_owned(), message.to_owned()));
        self
    }

    fn ready(mut self, status: bool, reason: &str, message: &str) -> Self {
        self.ready = Some((status, reason.to_owned(), message.to_owned()));
        self
    }

    /// Whether it reports the resource ready for use.
    fn is_available(&self) -> bool {
        self.ready.as_ref().is_some_and(|(ready, _, _)| *ready)
    }

    fn observed(mut self, observation: &Observation) -> Self {
        self.at_provider = Some(observation.at_provider.clone());
        self
    }

    /// Writes the status if it changes (server-side apply of the fields
    /// this controller owns); nothing at steady state.
    async fn write<M: Managed>(
        self,
        ctx: &Context,
        api: &Api<M>,
        object: &M,
    ) -> Result<(), kube::Error> {
        if self.synced.is_none() && self.ready.is_none() {
            return Ok(());
        }
        let previous = object.cloud_status().cloned().unwrap_or_default();
        let mut status = previous.clone();
        let generation = object.meta().generation;
        let now = Time(Timestamp::now());
        for (type_, condition) in [("Synced", &self.synced), ("Ready", &self.ready)] {
            if let Some((value, reason, message)) = condition {
                let condition = conditions::new(
                    type_,
                    *value,
                    reason,
                    message.clone(),
                    generation,
                    now.clone(),
                );
                conditions::set(&mut status.conditions, condition);
            }
        }
        if let Some(at_provider) = self.at_provider {
            status.at_provider = at_provider;
        }
        status.observed_generation = generation;
        write_status(ctx, api, object, &previous, &status, IN_PROGRESS).await
    }
}

/// Writes `status` over `previous` unless they are equal, then announces
/// each condition's transition (the reasons `in_progress` are work under
/// way, not problems: see `events::announce_transitions`).
pub(crate) async fn write_status<K>(
    ctx: &Context,
    api: &Api<K>,
    object: &K,
    previous: &CloudStatus,
    status: &CloudStatus,
    in_progress: &[&str],
) -> Result<(), kube::Error>
where
    K: Resource<DynamicType = ()> + Clone + Debug + Serialize + DeserializeOwned,
{
    if status == previous {
        return Ok(());
    }
    let written = ctx
        .applier
        .apply_status(api, MANAGER, object, status)
        .await?;
    if written.is_some() {
        let reference = object.object_ref(&());
        events::announce_transitions(
            &ctx.recorder,
            &reference,
            &previous.conditions,
            &status.conditions,
            in_progress,
        )
        .await;
    }
    Ok(())
}

#[cfg(test)]
#[path = "driver_error_paths.rs"]
mod error_paths;
