//! The manager against the fake API ([`cairn_testing::fake_api`]) when a
//! watch is answered 410 Gone, as a real API server answers a watch from a
//! resourceVersion etcd has compacted away (after a restart, say): the cache
//! lists again, holds what the relist found (a deletion missed in the gap
//! included), wakes the controller for what changed and for nothing else,
//! and the probes say what the code means them to.
//!
//! The clock is paused: time moves only when every task waits, so the
//! watcher's backoff takes no real time, and waiting a virtual second lets
//! everything due within it run (no real sleep stands as proof of anything).

use std::process::ExitCode;
use std::sync::Mutex;

use cairn_testing::fake_api::{Answer, FakeApi, Fault, Recorded};
use clap::Parser;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::runtime::reflector::{ObjectRef, Store};
use serde_json::json;

use super::*;

const MAPS: &str = "/api/v1/namespaces/shop/configmaps";
const SECRETS: &str = "/api/v1/namespaces/shop/secrets";

fn path(name: &str) -> String {
    format!("{MAPS}/{name}")
}

fn config_map(name: &str) -> serde_json::Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap",
           "metadata": {"name": name, "namespace": "shop", "uid": format!("uid-{name}")}})
}

/// Secret `name`, owned by ConfigMap `owner`.
fn secret(name: &str, owner: &str) -> serde_json::Value {
    json!({"apiVersion": "v1", "kind": "Secret",
           "metadata": {"name": name, "namespace": "shop", "uid": format!("uid-{name}"),
                        "ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": owner,
                                             "uid": format!("uid-{owner}"), "controller": true}]}})
}

#[derive(Debug, thiserror::Error)]
#[error("never")]
struct Never;

impl Classify for Never {
    fn class(&self) -> ErrorClass {
        ErrorClass::Transient
    }
}

/// An object reconciled, with the names the caches (ConfigMaps, Secrets)
/// held at that moment.
type Reconciled = (String, Vec<String>, Vec<String>);

/// What the reconciles saw.
#[derive(Default)]
struct Seen {
    store: OnceLock<Store<ConfigMap>>,
    children: OnceLock<Store<Secret>>,
    log: Mutex<Vec<Reconciled>>,
}

impl Seen {
    fn log(&self) -> Vec<Reconciled> {
        self.log.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn reconciled(&self, name: &str) -> bool {
        self.log().iter().any(|(n, ..)| n == name)
    }
}

fn reconcile(
    object: Arc<ConfigMap>,
    seen: Arc<Seen>,
) -> std::future::Ready<Result<Recheck, Never>> {
    let cached = seen.store.get().map(names).unwrap_or_default();
    let children = seen.children.get().map(names).unwrap_or_default();
    let name = object.metadata.name.clone().unwrap_or_default();
    seen.log
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push((name, cached, children));
    std::future::ready(Ok(Recheck::AfterResync))
}

fn names<K: Resource<DynamicType = ()> + Clone>(store: &Store<K>) -> Vec<String> {
    let mut names: Vec<String> = store
        .state()
        .iter()
        .filter_map(|o| o.meta().name.clone())
        .collect();
    names.sort();
    names
}

/// A manager of ConfigMaps in `shop` (and of the Secrets they own) over the
/// fake, leading (the fake answers the Lease), holding `objects` and
/// `children` (Secret, owner) when it starts.
struct Running {
    fake: FakeApi,
    health: Health,
    metrics: Metrics,
    store: Store<ConfigMap>,
    seen: Arc<Seen>,
    terminate: watch::Sender<bool>,
    exited: JoinHandle<ExitCode>,
}

impl Running {
    async fn start(
        objects: &[&str],
        children: &[(&str, &str)],
        watch_failure_limit: Duration,
    ) -> Self {
        let (fake, client) = FakeApi::new();
        for name in objects {
            fake.put(&path(name), config_map(name));
        }
        for (name, owner) in children {
            fake.put(&format!("{SECRETS}/{name}"), secret(name, owner));
        }
        let (terminate, terminated) = watch::channel(false);
        let (stop_admin, admin_stopped) = oneshot::channel::<()>();
        let config = Config::try_parse_from(["test"]).expect("the defaults parse");
        let mut manager = Manager {
            info: BuildInfo {
                controller: "test",
                version: "0",
                git_commit: "none",
            },
            config,
            client: client.clone(),
            unguarded: client.clone(),
            leading: Arc::new(OnceLock::new()),
            metrics: Metrics::new("test", "0", "none").expect("valid metrics"),
            health: Health::new(watch_failure_limit),
            identity: "replica-1".into(),
            namespace: "cairn-system".into(),
            telemetry: Telemetry::none(),
            admin: tokio::spawn(async move {
                let _ = admin_stopped.await;
            }),
            stop_admin,
            caches_synced: Vec::new(),
            housekeeping: Vec::new(),
            housekeeping_running: Vec::new(),
            terminate: terminated,
        };
        let cache = manager.cache(
            Api::<ConfigMap>::namespaced(client.clone(), "shop"),
            watcher::Config::default(),
        );
        let secrets = manager.cache(
            Api::<Secret>::namespaced(client, "shop"),
            watcher::Config::default(),
        );
        let store = cache.store();
        let seen = Arc::new(Seen::default());
        let _ = seen.store.set(store.clone());
        let _ = seen.children.set(secrets.store());
        let controller =
            Controller::for_shared_stream(cache.trigger_on_spec_change(), store.clone())
                .owns_shared_stream(secrets.trigger());
        let runnable = manager.runnable(controller, reconcile, seen.clone());
        let (health, metrics) = (manager.health.clone(), manager.metrics.clone());
        let exited = tokio::spawn(manager.run_all(vec![runnable]));
        let running = Self {
            fake,
            health,
            metrics,
            store,
            seen,
            terminate,
            exited,
        };
        for name in objects {
            running
                .until(&format!("{name} reconciled"), |r| r.seen.reconciled(name))
                .await;
        }
        running
            .until("both watches open", |r| {
                let requests = r.fake.requests();
                [MAPS, SECRETS]
                    .iter()
                    .all(|p| requests.iter().any(|q| q.is_watch() && q.path == *p))
            })
            .await;
        running
    }

    /// Lets the manager run until `done`, for at most a virtual minute.
    async fn until(&self, what: &str, done: impl Fn(&Self) -> bool) {
        for _ in 0..600 {
            if done(self) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!(
            "{what}: not within a minute; requests {:#?}",
            self.collection()
        );
    }

    /// Lets everything due within a virtual second run.
    async fn settle(&self) {
        tokio::time::sleep(Duration::from_secs(1)).await;
    }

    /// The lists and watches of the ConfigMaps, in order.
    fn collection(&self) -> Vec<Recorded> {
        self.fake
            .requests()
            .into_iter()
            .filter(|r| r.path == MAPS)
            .collect()
    }

    fn lists(&self) -> usize {
        self.collection().iter().filter(|r| r.is_list()).count()
    }

    /// An API server restart while `gap` happens: the watches end, `gap`
    /// changes objects, and etcd compacts past it, so the watcher's next
    /// watch is answered 410 Expired.
    fn restart_missing(&self, gap: impl FnOnce(&FakeApi)) {
        // No await in between: the watcher cannot watch again mid-gap.
        self.fake.disconnect_watches();
        gap(&self.fake);
        self.fake.compact();
    }

    fn cached_gauge(&self) -> String {
        let text = self.metrics.render();
        text.lines()
            .find(|l| l.starts_with("cairn_objects_in_cache{"))
            .unwrap_or_default()
            .to_owned()
    }

    /// SIGTERM, as it were: the manager stops and exits 0.
    async fn stop(self) {
        let _ = self.terminate.send(true);
        let code = self.exited.await.expect("the manager ran");
        assert_eq!(code, ExitCode::SUCCESS);
    }
}

/// The case a user relies on: what changed while the watch was down is
/// learnt from the relist, the controller reconciles the new objects from
/// the relisted cache, and the deleted one is neither cached nor reconciled.
#[tokio::test(start_paused = true)]
async fn after_a_410_the_cache_relists_and_the_controller_follows_it() {
    let running = Running::start(&["kept", "deleted"], &[], Duration::from_secs(60)).await;
    assert_eq!(running.lists(), 1);
    let reconciled_before = running.seen.log().len();
    running.restart_missing(|fake| {
        fake.remove(&path("deleted"));
        fake.put(&path("new"), config_map("new"));
        fake.put(&path("newer"), config_map("newer"));
    });

    running
        .until("the new objects reconciled", |r| {
            r.seen.reconciled("new") && r.seen.reconciled("newer")
        })
        .await;
    running.settle().await;

    let requests = running.collection();
    let expired = requests
        .iter()
        .rposition(|r| r.is_watch() && r.resource_version() == Some("2"))
        .expect("a watch from the version before the gap");
    assert!(
        requests[expired + 1].is_list(),
        "the watch answered 410 is followed by a list: {requests:#?}"
    );
    let last = requests.last().expect("requests");
    let newest = running
        .store
        .get(&ObjectRef::new("newer").within("shop"))
        .and_then(|o| o.metadata.resource_version.clone())
        .expect("newer cached");
    let watched_from = last.resource_version().and_then(|v| v.parse::<u64>().ok());
    assert!(
        last.is_watch() && watched_from >= newest.parse().ok(),
        "then a watch from the relist's version, past what it learnt: {requests:#?}"
    );
    assert_eq!(running.lists(), 2, "one relist: {requests:#?}");

    let relisted = vec!["kept".to_owned(), "new".into(), "newer".into()];
    assert_eq!(names(&running.store), relisted);
    assert!(
        running.cached_gauge().ends_with(" 3"),
        "{}",
        running.cached_gauge()
    );
    let after = running.seen.log().split_off(reconciled_before);
    let times = |name: &str| after.iter().filter(|(n, ..)| n == name).count();
    assert_eq!((times("new"), times("newer")), (1, 1), "{after:?}");
    assert_eq!(times("deleted"), 0, "a deleted object is not reconciled");
    // Unchanged during the gap: the relist does not announce it again.
    assert_eq!(times("kept"), 0, "{after:?}");
    for (name, cached, _) in &after {
        assert_eq!(
            cached, &relisted,
            "{name} reconciled from the relisted cache"
        );
    }
    assert!(running.health.ready(), "still ready");
    assert_eq!(running.health.live(), Ok(()), "a relist is a recovery");
    running.stop().await;
}

/// 410s after which nothing had changed: the relists wake no object again
/// and again (the spec-change filter drops each unchanged object a relist
/// re-announces, once it has seen it).
#[tokio::test(start_paused = true)]
async fn repeated_410s_with_nothing_missed_reconcile_nothing_again() {
    let running = Running::start(&["a", "b"], &[], Duration::from_secs(60)).await;
    let reconciled_before = running.seen.log().len();
    let mut reconciled_after = Vec::new();
    for round in 1..=3 {
        running.fake.inject(Fault {
            method: "WATCH",
            path: MAPS.into(),
            answer: Answer::WatchError(410, "Expired"),
            skip: 0,
            times: 1,
        });
        running.fake.disconnect_watches();
        running
            .until("relisted and watching", |r| {
                r.lists() == round + 1 && r.collection().last().is_some_and(Recorded::is_watch)
            })
            .await;
        running.settle().await;
        reconciled_after.push(running.seen.log().len() - reconciled_before);
    }
    let log = running.seen.log();
    assert!(reconciled_after[0] <= 2, "at most once each: {log:?}");
    assert_eq!(
        reconciled_after[1..],
        [reconciled_after[0]; 2],
        "nothing more: {log:?}"
    );
    assert_eq!(names(&running.store), ["a", "b"]);
    running.stop().await;
}

/// After a 410 the relist fails, again and again (the API server, back
/// from its restart, answers lists 500): the cache keeps what it had (never half a relist), the
/// replica stays ready, /livez fails once the failures outlast the limit,
/// and all recovers when the lists succeed. The watcher announces each new
/// list attempt with an `Init` event before sending any request; counted as
/// a success, it reset the failures each time and /livez never failed.
#[tokio::test(start_paused = true)]
async fn a_relist_failing_after_a_410_fails_liveness_until_it_succeeds() {
    // The health's clock is the real one: a short limit, let pass for real.
    let limit = Duration::from_millis(20);
    let running = Running::start(&["kept", "deleted"], &[], limit).await;
    // Every list in the namespace (both caches relist after the restart).
    running.fake.inject(Fault {
        method: "LIST",
        path: "/namespaces/shop/".into(),
        answer: Answer::Status(500, "InternalError"),
        skip: 0,
        times: usize::MAX,
    });
    running.restart_missing(|fake| fake.remove(&path("deleted")));
    running.until("a relist failed", |r| r.lists() >= 2).await;
    std::thread::sleep(limit * 2);
    running
        .until("two more relists failed", |r| r.lists() >= 4)
        .await;

    assert!(
        running.health.live().is_err(),
        "failing for longer than the limit"
    );
    assert!(
        running.health.ready(),
        "readiness gates the first sync only"
    );
    assert_eq!(
        names(&running.store),
        ["deleted", "kept"],
        "the cache as it was"
    );
    assert!(running.cached_gauge().ends_with(" 2"));

    running.fake.clear_faults();
    // Both caches recover, each at its own next retry: the ConfigMaps'
    // relist may land before the Secrets' (which keeps /livez failing).
    running
        .until("relisted, and both caches watching again", |r| {
            names(&r.store) == ["kept"] && r.health.live().is_ok()
        })
        .await;
    assert!(running.cached_gauge().ends_with(" 1"));
    running.stop().await;
}

/// An HTTP 410 on a watch (not what a real server sends; a proxy might):
/// kube's watcher retries the watch from the same version rather than
/// listing, and the server's 410 event then makes it relist.
#[tokio::test(start_paused = true)]
async fn an_http_410_on_a_watch_is_retried_and_the_410_event_relists() {
    let running = Running::start(&["kept", "deleted"], &[], Duration::from_secs(60)).await;
    running.fake.inject(Fault {
        method: "WATCH",
        path: MAPS.into(),
        answer: Answer::Status(410, "Gone"),
        skip: 0,
        times: 1,
    });
    running.restart_missing(|fake| {
        fake.remove(&path("deleted"));
        fake.put(&path("new"), config_map("new"));
    });
    running
        .until("the new object reconciled", |r| r.seen.reconciled("new"))
        .await;
    assert_eq!(names(&running.store), ["kept", "new"]);
    let requests = running.collection();
    let relist = requests.iter().rposition(Recorded::is_list).expect("lists");
    assert!(relist > 0 && running.lists() == 2, "{requests:#?}");
    let versions: Vec<_> = requests[..relist]
        .iter()
        .filter_map(Recorded::resource_version)
        .collect();
    assert_eq!(
        versions, [versions[0]; 3],
        "the first watch, the one refused with HTTP 410, the one answered 410 Expired"
    );
    running.stop().await;
}

/// A child deleted while the watch of its kind was down (its next watch
/// answered 410): the relist reveals the deletion, and the owner is
/// reconciled from a cache without the child, so it can make it again.
#[tokio::test(start_paused = true)]
async fn a_child_deleted_during_the_gap_wakes_its_owner_after_the_relist() {
    let running = Running::start(
        &["orders"],
        &[("orders-credentials", "orders")],
        Duration::from_secs(60),
    )
    .await;
    let reconciled_before = running.seen.log().len();
    // Only the Secrets' watch is answered 410; the ConfigMaps' resumes.
    running.fake.inject(Fault {
        method: "WATCH",
        path: SECRETS.into(),
        answer: Answer::WatchError(410, "Expired"),
        skip: 0,
        times: 1,
    });
    running.fake.disconnect_watches();
    running
        .fake
        .remove(&format!("{SECRETS}/orders-credentials"));
    running
        .until("the owner reconciled again", |r| {
            r.seen.log().len() > reconciled_before
        })
        .await;
    let log = running.seen.log();
    let (name, _, children) = &log[reconciled_before];
    assert_eq!(name, "orders");
    assert!(children.is_empty(), "from the relisted cache: {log:?}");
    assert_eq!(running.lists(), 1, "the ConfigMaps were not listed again");
    running.stop().await;
}
