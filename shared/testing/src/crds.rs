//! Installing CustomResourceDefinitions and waiting until they are served.

use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client, ResourceExt};

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
    if api.get_opt(&crd.name_any()).await?.is_none() {
        return Ok(());
    }
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

/// Applies `crds` (server-side apply, so reinstalling is an update) and waits
/// until each is `Established`, i.e. its kinds can be created.
pub async fn install(client: &Client, crds: &[CustomResourceDefinition]) -> Result<(), Error> {
    let api = Api::<CustomResourceDefinition>::all(client.clone());
    let params = PatchParams::apply(FIELD_MANAGER).force();
    for crd in crds {
        replace_webhook_client(&api, crd).await?;
        api.patch(&crd.name_any(), &params, &Patch::Apply(crd))
            .await?;
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
