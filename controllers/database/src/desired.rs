//! Every child a `DatabaseCluster` needs, built in one pure call from the
//! cluster and what the reconcile read ([`Inputs`]), in the order they are
//! applied: what the instances read (their account, their configuration)
//! before the StatefulSet that starts them.

use cairn_api::database::v1::DatabaseCluster;
use cairn_runtime::certs::Authority;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Service, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};

use crate::build;
use crate::tls;

/// What the build needs beyond the cluster.
pub struct Inputs<'a> {
    /// The StatefulSet as last seen: its claim templates are immutable.
    pub stateful_set: Option<&'a StatefulSet>,
    /// The cluster's CA, published for clients.
    pub authority: &'a Authority,
}

/// The children, applied in order; the StatefulSet last.
pub struct Desired {
    pub children: Vec<Child>,
    pub stateful_set: Instances,
}

/// One child, by kind, so one loop applies them all.
#[derive(Debug)]
#[expect(
    clippy::large_enum_variant,
    reason = "a dozen per reconcile, built and applied at once: boxing saves nothing"
)]
pub enum Child {
    ServiceAccount(ServiceAccount),
    Role(Role),
    RoleBinding(RoleBinding),
    ConfigMap(ConfigMap),
    Service(Service),
    DisruptionBudget(PodDisruptionBudget),
    /// No disruption budget of this name: a single instance's would allow
    /// every eviction or none; the one there is (from more instances) goes.
    NoDisruptionBudget(String),
    Lease(Lease),
}

/// What becomes of the instances' StatefulSet.
#[derive(Debug)]
pub enum Instances {
    Apply(StatefulSet),
    /// Its immutable pod management policy must change: it is deleted, its
    /// pods orphaned for the next reconcile's StatefulSet to adopt.
    Replace(StatefulSet),
}

/// Every desired child of `cluster` (see the module).
pub fn children(cluster: &DatabaseCluster, inputs: &Inputs) -> Desired {
    let mut children = vec![
        Child::ServiceAccount(build::service_account(cluster)),
        Child::Role(build::instance_role(cluster)),
        Child::RoleBinding(build::instance_role_binding(cluster)),
        Child::ConfigMap(build::config_map(cluster)),
        Child::ConfigMap(tls::ca_config_map(cluster, inputs.authority)),
    ];
    children.extend(build::services(cluster).map(Child::Service));
    let mut budgets = build::disruption_budgets(cluster);
    for name in build::disruption_budget_names(cluster) {
        let budget = budgets
            .iter()
            .position(|b| b.metadata.name.as_deref() == Some(name.as_str()));
        children.push(match budget {
            Some(at) => Child::DisruptionBudget(budgets.remove(at)),
            None => Child::NoDisruptionBudget(name),
        });
    }
    children.extend(build::member_leases(cluster).into_iter().map(Child::Lease));
    let stateful_set = match inputs.stateful_set {
        Some(old) if build::needs_replacing(old) => Instances::Replace(old.clone()),
        existing => Instances::Apply(build::stateful_set(
            cluster,
            existing.and_then(build::claim_templates),
        )),
    };
    Desired {
        children,
        stateful_set,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures;
    use kube::ResourceExt;

    fn authority() -> Authority {
        cairn_runtime::certs::new_authority("shop/orders CA", tls::CA_VALIDITY).expect("a CA")
    }

    fn names(desired: &Desired) -> Vec<String> {
        desired
            .children
            .iter()
            .map(|child| match child {
                Child::ServiceAccount(o) => format!("ServiceAccount/{}", o.name_any()),
                Child::Role(o) => format!("Role/{}", o.name_any()),
                Child::RoleBinding(o) => format!("RoleBinding/{}", o.name_any()),
                Child::ConfigMap(o) => format!("ConfigMap/{}", o.name_any()),
                Child::Service(o) => format!("Service/{}", o.name_any()),
                Child::DisruptionBudget(o) => format!("PodDisruptionBudget/{}", o.name_any()),
                Child::NoDisruptionBudget(name) => format!("no PodDisruptionBudget/{name}"),
                Child::Lease(o) => format!("Lease/{}", o.name_any()),
            })
            .collect()
    }

    #[test]
    fn a_cluster_of_three_needs_its_account_config_services_budget_and_a_lease_each() {
        let cluster = fixtures::cluster(3, &[]);
        let authority = authority();
        let desired = children(
            &cluster,
            &Inputs {
                stateful_set: None,
                authority: &authority,
            },
        );
        assert_eq!(
            names(&desired),
            [
                "ServiceAccount/orders",
                "Role/orders",
                "RoleBinding/orders",
                "ConfigMap/orders-config",
                "ConfigMap/orders-ca",
                "Service/orders-rw",
                "Service/orders-ro",
                "Service/orders",
                "PodDisruptionBudget/orders",
                "PodDisruptionBudget/orders-primary",
                "Lease/orders-0",
                "Lease/orders-1",
                "Lease/orders-2",
            ]
        );
        assert!(matches!(desired.stateful_set, Instances::Apply(_)));
    }

    #[test]
    fn a_single_instance_has_its_budgets_removed() {
        let cluster = fixtures::cluster(1, &[]);
        let authority = authority();
        let inputs = Inputs {
            stateful_set: None,
            authority: &authority,
        };
        let names = names(&children(&cluster, &inputs));
        for name in ["orders", "orders-primary"] {
            assert!(
                names.contains(&format!("no PodDisruptionBudget/{name}")),
                "{names:?}"
            );
        }
    }

    #[test]
    fn a_stateful_set_with_the_old_pod_management_policy_is_replaced_and_one_with_the_new_keeps_its_claims()
     {
        let cluster = fixtures::cluster(3, &[]);
        let authority = authority();
        let mut old = build::stateful_set(&cluster, None);
        let spec = old.spec.as_mut().expect("a spec");
        spec.pod_management_policy = Some("OrderedReady".to_owned());
        let inputs = Inputs {
            stateful_set: Some(&old),
            authority: &authority,
        };
        assert!(matches!(
            children(&cluster, &inputs).stateful_set,
            Instances::Replace(_)
        ));

        let mut current = build::stateful_set(&cluster, None);
        let claims = current.spec.as_mut().expect("a spec");
        claims.volume_claim_templates = Some(vec![Default::default()]);
        let inputs = Inputs {
            stateful_set: Some(&current),
            authority: &authority,
        };
        let Instances::Apply(applied) = children(&cluster, &inputs).stateful_set else {
            panic!("applied, not replaced");
        };
        assert_eq!(
            applied.spec.and_then(|s| s.volume_claim_templates),
            Some(vec![Default::default()]),
            "the claim templates as they are"
        );
    }
}
