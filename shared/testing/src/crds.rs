//! Installing CustomResourceDefinitions and waiting until they are served.

use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client, ResourceExt};

use crate::{Error, wait};

const FIELD_MANAGER: &str = "cairn-testing";

/// Applies `crds` (server-side apply, so reinstalling is an update) and waits
/// until each is `Established`, i.e. its kinds can be created.
pub async fn install(client: &Client, crds: &[CustomResourceDefinition]) -> Result<(), Error> {
    let api = Api::<CustomResourceDefinition>::all(client.clone());
    let params = PatchParams::apply(FIELD_MANAGER).force();
    for crd in crds {
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
