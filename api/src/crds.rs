//! The CustomResourceDefinitions generated from the types, and where each is
//! committed: in the chart of the controller that owns its group.

use std::path::{Path, PathBuf};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceConversion, CustomResourceDefinition, ServiceReference, WebhookClientConfig,
    WebhookConversion,
};
use kube::CustomResourceExt;

use crate::{backup, cloud, database};

/// A chart and the CRDs it ships.
pub struct ChartCrds {
    /// Folder name of the chart under `charts/`.
    pub chart: &'static str,
    pub crds: Vec<CustomResourceDefinition>,
}

/// Name of the conversion webhook Service in the database chart, as a Helm
/// template expression (the committed CRD is a chart template).
const CHART_WEBHOOK_SERVICE: &str = r#"{{ include "cairn.webhookService" . }}"#;
/// The same Service seen from the cairn umbrella chart, whose database
/// controller is its subchart `database` (charts/cairn/templates/_helpers.tpl).
const UMBRELLA_WEBHOOK_SERVICE: &str = r#"{{ include "cairn-umbrella.databaseWebhookService" . }}"#;
/// The umbrella chart: it installs every CRD itself (value `crds.install`),
/// its controller subcharts none.
pub const UMBRELLA_CHART: &str = "cairn";
const CHART_NAMESPACE: &str = "{{ .Release.Namespace }}";

/// Every CRD, grouped by the chart of its group, in a form that installs
/// without any webhook: DatabaseCluster serves v1 only. Tests and benchmarks
/// install these; [`chart_files`] is what the charts ship.
pub fn by_chart() -> Vec<ChartCrds> {
    vec![
        ChartCrds {
            chart: "cairn-database-controller",
            crds: vec![finish(database::v1::DatabaseCluster::crd())],
        },
        ChartCrds {
            chart: "cairn-backup-controller",
            crds: vec![
                finish(backup::v1::Backup::crd()),
                finish(backup::v1::BackupSchedule::crd()),
            ],
        },
        ChartCrds {
            chart: "cairn-cloud-controller",
            crds: vec![
                finish(cloud::v1alpha1::ProviderConfig::crd()),
                finish(cloud::v1alpha1::ObjectBucket::crd()),
                finish(cloud::v1alpha1::DnsRecord::crd()),
            ],
        },
    ]
}

/// The CRDs as the charts ship them (`templates/crds/`): like [`by_chart`],
/// except that DatabaseCluster also serves the deprecated v1alpha1, converted
/// by cairn-database-controller's webhook Service (its name and namespace are
/// Helm template expressions; the controller writes the caBundle). The
/// umbrella chart ships them all, its database CRD pointing at its
/// subchart's Service.
pub fn chart_files() -> Vec<ChartCrds> {
    let mut charts = by_chart();
    let mut umbrella = Vec::new();
    for chart in &mut charts {
        if chart.chart == "cairn-database-controller" {
            chart.crds = vec![database_cluster_served_by(CHART_WEBHOOK_SERVICE)];
            umbrella.push(database_cluster_served_by(UMBRELLA_WEBHOOK_SERVICE));
        } else {
            umbrella.extend(chart.crds.iter().cloned());
        }
    }
    charts.push(ChartCrds {
        chart: UMBRELLA_CHART,
        crds: umbrella,
    });
    charts
}

fn database_cluster_served_by(service: &str) -> CustomResourceDefinition {
    database_cluster_with_conversion(WebhookClientConfig {
        service: Some(ServiceReference {
            name: service.into(),
            namespace: CHART_NAMESPACE.into(),
            path: Some("/convert".into()),
            port: Some(443),
        }),
        ..WebhookClientConfig::default()
    })
}

/// The DatabaseCluster CRD serving both v1 (stored) and the deprecated
/// v1alpha1, converted by the webhook at `client_config`. Every v1alpha1
/// request fails while that webhook is unreachable; v1 requests never need it.
pub fn database_cluster_with_conversion(
    client_config: WebhookClientConfig,
) -> CustomResourceDefinition {
    let versions = vec![
        database::v1alpha1::DatabaseCluster::crd(),
        database::v1::DatabaseCluster::crd(),
    ];
    let mut crd =
        kube::core::crd::merge_crds(versions, "v1").expect("both versions describe one kind");
    crd.spec.conversion = Some(CustomResourceConversion {
        strategy: "Webhook".into(),
        webhook: Some(WebhookConversion {
            client_config: Some(client_config),
            conversion_review_versions: vec!["v1".into()],
        }),
    });
    finish(crd)
}

/// The installable CRDs of chart `chart` (see [`by_chart`]); none for an
/// unknown chart.
pub fn for_chart(chart: &str) -> Vec<CustomResourceDefinition> {
    by_chart()
        .into_iter()
        .find(|c| c.chart == chart)
        .map(|c| c.crds)
        .unwrap_or_default()
}

/// Every CRD.
pub fn all() -> Vec<CustomResourceDefinition> {
    by_chart().into_iter().flat_map(|c| c.crds).collect()
}

/// Helm must never delete a CRD on uninstall: that would delete every object
/// of its kind, and with them the clusters and backups they describe. And
/// every integer format one Kubernetes knows.
fn finish(mut crd: CustomResourceDefinition) -> CustomResourceDefinition {
    crd.metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert("helm.sh/resource-policy".into(), "keep".into());
    with_known_integer_formats(crd)
}

/// The schema generator names Rust's integer widths (`uint32` for a `u32`,
/// with `minimum: 0`); the API server knows only `int32` and `int64`, and
/// warns of any other on every apply (`unrecognized format "uint32"`).
/// Each becomes the narrowest known format that holds it; the minimum stays.
fn with_known_integer_formats(crd: CustomResourceDefinition) -> CustomResourceDefinition {
    fn walk(value: &mut serde_json::Value) {
        match value {
            serde_json::Value::Object(map) => {
                if let Some(serde_json::Value::String(format)) = map.get_mut("format") {
                    match format.as_str() {
                        "int8" | "int16" | "uint8" | "uint16" => *format = "int32".into(),
                        "uint32" | "uint64" | "uint" => *format = "int64".into(),
                        _ => {}
                    }
                }
                map.values_mut().for_each(walk);
            }
            serde_json::Value::Array(items) => items.iter_mut().for_each(walk),
            _ => {}
        }
    }
    let mut value = serde_json::to_value(&crd).expect("a CRD serializes");
    walk(&mut value);
    serde_json::from_value(value).expect("only formats changed")
}

/// Where `crd` is committed, relative to the repository root. CRDs live in
/// the chart's `templates/` (not `crds/`, which Helm installs once and never
/// upgrades), so `helm upgrade` rolls out schema changes.
pub fn chart_path(chart: &str, crd: &CustomResourceDefinition) -> PathBuf {
    let name = crd.metadata.name.as_deref().unwrap_or("unnamed");
    Path::new("charts")
        .join(chart)
        .join("templates/crds")
        .join(format!("{name}.yaml"))
}

/// The committed text of a CRD: a chart template, rendered only when the
/// release installs CRDs (`crds.install`; in the umbrella chart, also only
/// while the controller of the CRD's group is enabled: see the library
/// chart's `cairn.crds.install`).
pub fn to_yaml(crd: &CustomResourceDefinition) -> Result<String, serde_yaml_ng::Error> {
    Ok(format!(
        "{{{{- if include \"cairn.crds.install\" (list . {:?}) }}}}\n\
         # Generated from the Rust types in api/ by `cargo run -p cairn-api --bin crdgen`; do not edit.\n\
         {}{{{{- end }}}}\n",
        crd.spec.group,
        serde_yaml_ng::to_string(crd)?
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    /// kubectl shows a `date` column as an age, and a time still to come as
    /// `<invalid>`: only a creation or a `last…` time is one.
    #[test]
    fn date_columns_show_past_times_only() {
        let mut dates = Vec::new();
        for crd in all() {
            for version in &crd.spec.versions {
                for column in version.additional_printer_columns.iter().flatten() {
                    if column.type_ == "date" {
                        let field = column.json_path.rsplit('.').next().unwrap_or("");
                        dates.push((crd.spec.names.kind.clone(), field.to_owned()));
                    }
                }
            }
        }
        let future: Vec<_> = dates
            .iter()
            .filter(|(_, field)| !(field == "creationTimestamp" || field.starts_with("last")))
            .collect();
        assert!(!dates.is_empty(), "the walk finds the date columns");
        assert!(
            future.is_empty(),
            "date columns of times to come: {future:?}"
        );
    }

    /// Applying the CRDs prints no warning: every `format` is one the API
    /// server knows (k8s.io/kube-openapi's format registry and the
    /// OpenAPI integer and number formats).
    #[test]
    fn every_format_is_one_the_api_server_knows() {
        const KNOWN: &[&str] = &[
            "int32",
            "int64",
            "float",
            "double",
            "byte",
            "binary",
            "date",
            "date-time",
            "datetime",
            "duration",
            "password",
            "email",
            "hostname",
            "ipv4",
            "ipv6",
            "cidr",
            "mac",
            "uri",
            "uuid",
            "uuid3",
            "uuid4",
            "uuid5",
            "bsonobjectid",
            "creditcard",
            "isbn",
            "isbn10",
            "isbn13",
            "ssn",
            "hexcolor",
            "rgbcolor",
        ];
        fn formats(value: &Value, path: &str, found: &mut Vec<String>) {
            match value {
                Value::Object(map) => {
                    if let Some(Value::String(format)) = map.get("format") {
                        found.push(format!("{path}: {format}"));
                    }
                    for (key, inner) in map {
                        formats(inner, &format!("{path}.{key}"), found);
                    }
                }
                Value::Array(items) => items.iter().for_each(|i| formats(i, path, found)),
                _ => {}
            }
        }
        let mut found = Vec::new();
        for chart in chart_files() {
            for crd in chart.crds {
                let name = crd.metadata.name.clone().unwrap_or_default();
                formats(
                    &serde_json::to_value(&crd).expect("json"),
                    &name,
                    &mut found,
                );
            }
        }
        let unknown: Vec<&String> = found
            .iter()
            .filter(|f| !KNOWN.contains(&f.rsplit(": ").next().unwrap_or("")))
            .collect();
        assert!(!found.is_empty(), "the walk finds the formats");
        assert!(
            unknown.is_empty(),
            "formats the API server warns of: {unknown:?}"
        );
    }

    /// `kubectl explain` must read well: every field of every kind has a description.
    #[test]
    fn every_field_has_a_description() {
        let (mut missing, mut fields) = (Vec::new(), 0);
        for crd in all() {
            for version in &crd.spec.versions {
                let schema = serde_json::to_value(&version.schema).expect("schema serializes");
                let root = &schema["openAPIV3Schema"]["properties"];
                for part in ["spec", "status"] {
                    let path = format!("{}/{}.{part}", crd.spec.names.kind, version.name);
                    fields += walk(&root[part], &path, &mut missing);
                }
            }
        }
        assert!(
            missing.is_empty(),
            "fields without a description: {missing:#?}"
        );
        assert!(
            fields > 200,
            "only {fields} fields seen: is the walk broken?"
        );
    }

    /// Checks the fields under `schema`; returns how many it saw.
    fn walk(schema: &Value, path: &str, missing: &mut Vec<String>) -> usize {
        let mut seen = 0;
        if let Some(properties) = schema.get("properties").and_then(Value::as_object) {
            for (name, property) in properties {
                let field = format!("{path}.{name}");
                let described = property
                    .get("description")
                    .and_then(Value::as_str)
                    .is_some_and(|d| !d.trim().is_empty());
                if !described {
                    missing.push(field.clone());
                }
                seen += 1 + walk(property, &field, missing);
            }
        }
        for nested in ["items", "additionalProperties"] {
            if let Some(inner) = schema.get(nested).filter(|v| v.is_object()) {
                seen += walk(inner, &format!("{path}[]"), missing);
            }
        }
        seen
    }

    #[test]
    fn the_conversion_crd_serves_both_versions_and_stores_v1() {
        let crd = database_cluster_with_conversion(WebhookClientConfig::default());
        let versions: Vec<_> = crd
            .spec
            .versions
            .iter()
            .map(|v| (v.name.as_str(), v.storage, v.deprecated))
            .collect();
        assert_eq!(
            versions,
            vec![("v1", true, None), ("v1alpha1", false, Some(true))]
        );
        assert_eq!(
            crd.spec.conversion.map(|c| c.strategy).as_deref(),
            Some("Webhook")
        );
    }

    #[test]
    fn every_kind_is_in_the_cairn_category_with_a_short_name() {
        for crd in all() {
            let names = &crd.spec.names;
            assert_eq!(
                names.categories.as_deref(),
                Some(&["cairn".to_owned()][..]),
                "{}",
                names.kind
            );
            assert!(
                names.short_names.as_ref().is_some_and(|s| !s.is_empty()),
                "{}",
                names.kind
            );
            let status = crd.spec.versions[0]
                .subresources
                .as_ref()
                .and_then(|s| s.status.as_ref());
            assert!(status.is_some(), "{} has no status subresource", names.kind);
        }
    }
}
