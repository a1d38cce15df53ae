//! Installing CustomResourceDefinitions and waiting until they are served.

use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};

use crate::json::contains;
use crate::{Error, wait};

const FIELD_MANAGER: &str = "cairn-testing";

/// A conversion webhook's `url` and `service` exclude each other, but an
/// apply keeps the one another manager (Helm, a test) set: the installed
/// CRD's client is cleared first, so the desired one replaces it.
async fn replace_webhook_client(
    api: &Api<CustomResourceDefinition>,
    crd: &CustomResourceDefinition,
) -> Result<(), Error> {
    let Some(conversion) = crd.spec.conversion.as_ref() else {
        return Ok(());
    };
    let mut desired = serde_json::to_value(conversion)
        .map_err(|e| Error::Setup(format!("CRD conversion as JSON: {e}")))?;
    if let Some(client) = desired.pointer_mut("/webhook/clientConfig") {
        for field in ["url", "service"] {
            if client.get(field).is_none() {
                client[field] = serde_json::Value::Null;
            }
        }
    }
    let patch = serde_json::json!({ "spec": { "conversion": desired } });
    api.patch(
        &crd.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await?;
    Ok(())
}

/// Whether `installed` already serves everything `desired` describes: the
/// same names and scope, each desired version as desired, and no conversion
/// asked for. The charts install DatabaseCluster serving v1alpha1 too, through
/// their webhook; applying the tests' v1-only form over it would take
/// v1alpha1 away from every other test sharing the cluster.
fn already_served(
    installed: &CustomResourceDefinition,
    desired: &CustomResourceDefinition,
) -> bool {
    if desired.spec.conversion.is_some() {
        return false;
    }
    let (Ok(mut installed_spec), Ok(mut desired_spec)) = (
        serde_json::to_value(&installed.spec),
        serde_json::to_value(&desired.spec),
    ) else {
        return false;
    };
    let installed_versions = installed_spec["versions"].take();
    let desired_versions = desired_spec["versions"].take();
    installed_spec["conversion"].take();
    let Some(desired_versions) = desired_versions.as_array() else {
        return false;
    };
    contains(&installed_spec, &desired_spec)
        && desired_versions.iter().all(|version| {
            installed_versions
                .as_array()
                .into_iter()
                .flatten()
                .any(|served| served["name"] == version["name"] && contains(served, version))
        })
}

/// Leaves `crd` as it is when it already serves what is asked, applies it
/// over a different one, and creates it when there is none: an apply racing a
/// chart's create of the same CRD would replace the chart's versions.
async fn install_one(
    api: &Api<CustomResourceDefinition>,
    crd: &CustomResourceDefinition,
) -> Result<(), Error> {
    let name = crd.name_any();
    for _ in 0..3 {
        match api.get_opt(&name).await? {
            Some(installed) if already_served(&installed, crd) => return Ok(()),
            Some(_) => {
                replace_webhook_client(api, crd).await?;
                let params = PatchParams::apply(FIELD_MANAGER).force();
                api.patch(&name, &params, &Patch::Apply(crd)).await?;
                return Ok(());
            }
            None => match api.create(&PostParams::default(), crd).await {
                Err(kube::Error::Api(status)) if status.code == 409 => continue,
                created => return created.map(drop).map_err(Error::from),
            },
        }
    }
    Err(Error::Setup(format!(
        "CRD {name} was created and deleted by others three times over"
    )))
}

/// Installs `crds` (server-side apply over an installed one, so reinstalling
/// is an update) and waits until each is `Established`, i.e. its kinds can be
/// created. A CRD that already serves what is asked is left as it is (see
/// [`already_served`]).
pub async fn install(client: &Client, crds: &[CustomResourceDefinition]) -> Result<(), Error> {
    let api = Api::<CustomResourceDefinition>::all(client.clone());
    for crd in crds {
        install_one(&api, crd).await?;
    }
    for crd in crds {
        wait::for_object(
            &api,
            &crd.name_any(),
            "to be established",
            Duration::from_secs(30),
            |c| wait::condition_status(c, "Established").as_deref() == Some("True"),
        )
        .await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn database_cluster_as_tests_install() -> CustomResourceDefinition {
        cairn_api::crds::for_chart("cairn-database-controller").remove(0)
    }

    fn database_cluster_as_charts_install() -> CustomResourceDefinition {
        cairn_api::crds::database_cluster_with_conversion(Default::default())
    }

    #[test]
    fn a_crd_serving_more_versions_is_left_to_serve_them() {
        let charts = database_cluster_as_charts_install();
        assert!(already_served(
            &charts,
            &database_cluster_as_tests_install()
        ));
    }

    #[test]
    fn a_crd_lacking_a_version_or_a_field_is_applied() {
        let tests = database_cluster_as_tests_install();
        let mut older = tests.clone();
        older.spec.versions[0].schema = None;
        assert!(!already_served(&older, &tests));
        let mut renamed = tests.clone();
        renamed.spec.versions[0].name = "v2".into();
        assert!(!already_served(&renamed, &tests));
        assert!(
            !already_served(&tests, &database_cluster_as_charts_install()),
            "a conversion asked for is always applied"
        );
    }
}
