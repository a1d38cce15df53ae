//! The API server accepts every Cairn object of docs/user-guide.md as it is
//! written there: schema, patterns and CEL rules (a server-side dry run of
//! each create), and prunes none of its fields. The structural check without
//! an API server is `api/tests/user_guide_examples.rs`.

use cairn_testing::cluster;
use cairn_testing::json::contains;
use kube::Api;
use kube::api::{ApiResource, DynamicObject, PostParams};
use serde_json::Value;

type Result = std::result::Result<(), Box<dyn std::error::Error>>;

#[path = "../../api/tests/support/guide.rs"]
mod guide;
use guide::{GUIDE, yaml_documents};

/// The Cairn kind `apiVersion`/`kind` names, as the installable CRDs serve it.
fn resource(api_version: &str, kind: &str) -> Option<ApiResource> {
    let (group, version) = api_version.split_once('/')?;
    cairn_api::crds::all()
        .into_iter()
        .find(|crd| crd.spec.group == group && crd.spec.names.kind == kind)
        .filter(|crd| crd.spec.versions.iter().any(|v| v.name == version))
        .map(|crd| ApiResource {
            group: group.to_owned(),
            version: version.to_owned(),
            api_version: api_version.to_owned(),
            kind: kind.to_owned(),
            plural: crd.spec.names.plural,
        })
}

#[tokio::test]
async fn every_cairn_object_of_the_user_guide_is_accepted_as_written() -> Result {
    let ns = cluster().namespace("user-guide").await?;
    cairn_testing::crds::install(&ns.client, &cairn_api::crds::all()).await?;
    let guide = std::fs::read_to_string(cairn_testing::repo_root().join(GUIDE))?;
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let (mut checked, mut failures) = (0, Vec::new());
    for (line, mut example) in yaml_documents(&guide) {
        let api_version = example["apiVersion"].as_str().unwrap_or_default();
        let kind = example["kind"].as_str().unwrap_or_default().to_owned();
        if !api_version.contains(".cairn.dev/") {
            continue;
        }
        let Some(resource) = resource(api_version, &kind) else {
            failures.push(format!(
                "{GUIDE}:{line}: no CRD serves {api_version} {kind}"
            ));
            continue;
        };
        checked += 1;
        example["metadata"]["namespace"] = Value::String(ns.name.clone());
        let object: DynamicObject = serde_json::from_value(example.clone())?;
        let api: Api<DynamicObject> = Api::namespaced_with(ns.client.clone(), &ns.name, &resource);
        match api.create(&dry_run, &object).await {
            Ok(created) if !contains(&created.data["spec"], &example["spec"]) => {
                failures.push(format!(
                    "{GUIDE}:{line}: {kind}: fields were pruned: sent {}, stored {}",
                    example["spec"], created.data["spec"]
                ));
            }
            Ok(_) => {}
            Err(e) => failures.push(format!("{GUIDE}:{line}: {kind}: refused: {e}")),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(
        checked >= 7,
        "only {checked} Cairn objects found in {GUIDE}"
    );
    println!("{checked} objects of {GUIDE} accepted by the API server");
    Ok(())
}
