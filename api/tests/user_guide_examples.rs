//! Every Cairn object in docs/user-guide.md is valid: each ```yaml block's
//! documents whose apiVersion is a cairn.dev group are checked against the
//! generated CRD's OpenAPI schema (types, required fields, unknown fields,
//! enums, bounds, lengths), deserialized into the Rust type, and given the
//! controllers' own semantic checks (`cairn_api::validate`). Patterns and CEL
//! rules need an API server: `e2e/tests/user_guide.rs` sends the same objects
//! to one.

use std::path::Path;

use serde_json::Value;

mod support {
    pub mod guide;
}

/// One YAML document of the guide: the line its block starts on, and its
/// content.
struct Example {
    line: usize,
    value: Value,
}
use support::guide::{GUIDE, yaml_documents};

/// The schema of `apiVersion`/`kind` in the CRDs the charts ship (every
/// served version), if it is a Cairn kind.
fn schema_of(api_version: &str, kind: &str) -> Option<Result<Value, String>> {
    let (group, version) = api_version.split_once('/')?;
    if !cairn_api::GROUPS.contains(&group) {
        return None;
    }
    let crds = cairn_api::crds::chart_files()
        .into_iter()
        .flat_map(|c| c.crds);
    let Some(crd) = crds
        .into_iter()
        .find(|c| c.spec.group == group && c.spec.names.kind == kind)
    else {
        return Some(Err(format!("no kind {kind} in group {group}")));
    };
    let Some(served) = crd
        .spec
        .versions
        .iter()
        .find(|v| v.name == version && v.served)
    else {
        return Some(Err(format!("{kind} does not serve {api_version}")));
    };
    let schema = serde_json::to_value(&served.schema).expect("a schema serializes");
    Some(Ok(schema["openAPIV3Schema"].clone()))
}

/// Structural validation of `value` against an OpenAPI v3 `schema`, as the
/// API server does it before CEL and patterns: every problem, with its path.
fn check(value: &Value, schema: &Value, path: &str, problems: &mut Vec<String>) {
    let mut problem = |what: String| problems.push(format!("{path}: {what}"));
    if value.is_null() {
        if !schema["nullable"].as_bool().unwrap_or(false) {
            problem("null is not allowed".into());
        }
        return;
    }
    if let Some(values) = schema["enum"].as_array()
        && !values.contains(value)
    {
        problem(format!("{value} is not one of {values:?}"));
    }
    let int_or_string = schema["x-kubernetes-int-or-string"].as_bool() == Some(true);
    let type_ = schema["type"].as_str();
    let type_ok = match type_ {
        _ if int_or_string => value.is_string() || value.is_i64() || value.is_u64(),
        Some("string") => value.is_string(),
        Some("integer") => value.is_i64() || value.is_u64(),
        Some("number") => value.is_number(),
        Some("boolean") => value.is_boolean(),
        Some("object") => value.is_object(),
        Some("array") => value.is_array(),
        _ => true,
    };
    if !type_ok {
        problem(format!("{value} is not of type {}", type_.unwrap_or("?")));
        return;
    }
    if let Some(n) = value.as_f64() {
        if let Some(min) = schema["minimum"].as_f64()
            && n < min
        {
            problem(format!("{n} is below the minimum {min}"));
        }
        if let Some(max) = schema["maximum"].as_f64()
            && n > max
        {
            problem(format!("{n} is above the maximum {max}"));
        }
        let range = match schema["format"].as_str() {
            Some("int32") => Some((i32::MIN as f64, i32::MAX as f64)),
            Some("int64") => Some((i64::MIN as f64, i64::MAX as f64)),
            _ => None,
        };
        if let Some((low, high)) = range
            && !(low..=high).contains(&n)
        {
            problem(format!("{n} does not fit {}", schema["format"]));
        }
    }
    if let Some(s) = value.as_str().filter(|_| !int_or_string) {
        let length = s.chars().count() as u64;
        if let Some(min) = schema["minLength"].as_u64()
            && length < min
        {
            problem(format!("{s:?} is shorter than {min}"));
        }
        if let Some(max) = schema["maxLength"].as_u64()
            && length > max
        {
            problem(format!("{s:?} is longer than {max}"));
        }
        if schema["format"].as_str() == Some("date-time")
            && chrono::DateTime::parse_from_rfc3339(s).is_err()
        {
            problem(format!("{s:?} is not an RFC 3339 date-time"));
        }
    }
    if let Some(items) = value.as_array() {
        let count = items.len() as u64;
        if let Some(min) = schema["minItems"].as_u64()
            && count < min
        {
            problem(format!("{count} items, fewer than {min}"));
        }
        if let Some(max) = schema["maxItems"].as_u64()
            && count > max
        {
            problem(format!("{count} items, more than {max}"));
        }
        for (i, item) in items.iter().enumerate() {
            check(item, &schema["items"], &format!("{path}[{i}]"), problems);
        }
        return;
    }
    let Some(object) = value.as_object() else {
        return;
    };
    let count = object.len() as u64;
    if let Some(min) = schema["minProperties"].as_u64()
        && count < min
    {
        problems.push(format!("{path}: {count} keys, fewer than {min}"));
    }
    if let Some(max) = schema["maxProperties"].as_u64()
        && count > max
    {
        problems.push(format!("{path}: {count} keys, more than {max}"));
    }
    for required in schema["required"].as_array().into_iter().flatten() {
        let required = required.as_str().unwrap_or_default();
        if !object.contains_key(required) {
            problems.push(format!("{path}: the required field {required} is missing"));
        }
    }
    let preserve = schema["x-kubernetes-preserve-unknown-fields"].as_bool() == Some(true);
    for (key, field) in object {
        let field_path = format!("{path}.{key}");
        if let Some(property) = schema["properties"].get(key) {
            check(field, property, &field_path, problems);
        } else if schema["additionalProperties"].is_object() {
            check(
                field,
                &schema["additionalProperties"],
                &field_path,
                problems,
            );
        } else if !preserve {
            problems.push(format!("{field_path}: no such field in the schema"));
        }
    }
}

/// Every problem of a Cairn object: its schema, its Rust type, and the
/// controllers' semantic checks.
fn problems_of(object: &Value, schema: &Value) -> Vec<String> {
    let mut problems = Vec::new();
    let Some(name) = object["metadata"]["name"].as_str() else {
        return vec!["metadata.name is missing".into()];
    };
    if name.is_empty() {
        problems.push("metadata.name is empty".into());
    }
    for part in ["spec", "status"] {
        if let Some(value) = object.get(part) {
            check(value, &schema["properties"][part], part, &mut problems);
        }
    }
    for key in object.as_object().into_iter().flat_map(|o| o.keys()) {
        if !["apiVersion", "kind", "metadata", "spec", "status"].contains(&key.as_str()) {
            problems.push(format!("{key}: no such field in the schema"));
        }
    }
    problems.extend(typed_problems(object));
    problems
}

/// Deserializes `object` into its Rust type and runs the semantic checks.
fn typed_problems(object: &Value) -> Vec<String> {
    use cairn_api::{backup, cloud, database, validate};

    fn typed<T: serde::de::DeserializeOwned>(object: &Value) -> Result<T, String> {
        serde_json::from_value(object.clone()).map_err(|e| format!("as the Rust type: {e}"))
    }
    fn messages(problems: Vec<validate::InvalidSpec>) -> Vec<String> {
        problems.into_iter().map(|p| p.to_string()).collect()
    }
    let api_version = object["apiVersion"].as_str().unwrap_or_default();
    let result = match (api_version, object["kind"].as_str().unwrap_or_default()) {
        ("database.cairn.dev/v1", "DatabaseCluster") => {
            typed::<database::v1::DatabaseCluster>(object)
                .map(|o| messages(validate::database_cluster(&o.spec)))
        }
        ("database.cairn.dev/v1alpha1", "DatabaseCluster") => {
            typed::<database::v1alpha1::DatabaseCluster>(object).map(|_| Vec::new())
        }
        ("backup.cairn.dev/v1", "Backup") => {
            typed::<backup::v1::Backup>(object).map(|_| Vec::new())
        }
        ("backup.cairn.dev/v1", "BackupSchedule") => typed::<backup::v1::BackupSchedule>(object)
            .map(|o| messages(validate::backup_schedule(&o.spec))),
        ("cloud.cairn.dev/v1alpha1", "ProviderConfig") => {
            typed::<cloud::v1alpha1::ProviderConfig>(object).map(|_| Vec::new())
        }
        ("cloud.cairn.dev/v1alpha1", "ObjectBucket") => {
            typed::<cloud::v1alpha1::ObjectBucket>(object)
                .map(|o| messages(validate::object_bucket(&o.spec)))
        }
        ("cloud.cairn.dev/v1alpha1", "DnsRecord") => typed::<cloud::v1alpha1::DnsRecord>(object)
            .map(|o| messages(validate::dns_record(&o.spec))),
        (api_version, kind) => Err(format!("no Rust type for {api_version} {kind}")),
    };
    result.unwrap_or_else(|e| vec![e])
}

#[test]
fn every_cairn_object_of_the_user_guide_is_valid() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let guide = std::fs::read_to_string(root.join(GUIDE)).expect("the user guide exists");
    let mut kinds = std::collections::BTreeSet::new();
    let mut failures = Vec::new();
    let mut checked = 0;
    for (line, value) in yaml_documents(&guide) {
        let example = Example { line, value };
        let api_version = example.value["apiVersion"].as_str().unwrap_or_default();
        let kind = example.value["kind"].as_str().unwrap_or_default();
        let Some(schema) = schema_of(api_version, kind) else {
            continue;
        };
        checked += 1;
        kinds.insert(kind.to_owned());
        let problems = match schema {
            Ok(schema) => problems_of(&example.value, &schema),
            Err(e) => vec![e],
        };
        for problem in problems {
            failures.push(format!("{GUIDE}:{}: {kind}: {problem}", example.line));
        }
    }
    assert!(
        failures.is_empty(),
        "invalid examples:\n{}",
        failures.join("\n")
    );
    for kind in [
        "ProviderConfig",
        "ObjectBucket",
        "DatabaseCluster",
        "Backup",
        "BackupSchedule",
    ] {
        assert!(kinds.contains(kind), "the guide shows no {kind}");
    }
    assert!(
        checked >= 7,
        "only {checked} Cairn objects found in {GUIDE}"
    );
}

/// The check finds what the API server would refuse: the test above would
/// fail on a wrong example.
#[test]
fn the_check_refuses_unknown_fields_wrong_types_missing_and_out_of_range() {
    let schema = schema_of("database.cairn.dev/v1", "DatabaseCluster")
        .expect("a Cairn kind")
        .expect("served");
    let object: Value = serde_yaml_ng::from_str(
        r#"
apiVersion: database.cairn.dev/v1
kind: DatabaseCluster
metadata: {name: bad}
spec:
  instances: 12
  postgres: {version: 17, parameter: {}}
  storage: {}
  failover: {delaySeconds: 10}
  scheduling:
    tolerations: [{key: a, operater: Exists}]
  bootstrap:
    fromBackup:
      name: b
      recoveryTarget: {time: yesterday}
"#,
    )
    .expect("YAML");
    let problems = problems_of(&object, &schema);
    for expected in [
        "spec.instances: 12 is above the maximum 9",
        "spec.postgres.version: 17 is not of type string",
        "spec.postgres.parameter: no such field in the schema",
        "spec.storage: the required field size is missing",
        "spec.scheduling.tolerations[0].operater: no such field in the schema",
        "spec.bootstrap.fromBackup.recoveryTarget.time: \"yesterday\" is not an RFC 3339 date-time",
    ] {
        assert!(
            problems.iter().any(|p| p == expected),
            "{expected:?} not among {problems:#?}"
        );
    }
    assert!(
        problems.iter().any(|p| p.starts_with("as the Rust type")),
        "{problems:#?}"
    );

    let guide =
        "text\n```yaml\napiVersion: v1\nkind: Pod\n---\na: 1\n```\n  ```yaml\n  b: 2\n  ```\n";
    let documents = yaml_documents(guide);
    assert_eq!(
        documents,
        vec![
            (3, serde_json::json!({"apiVersion": "v1", "kind": "Pod"})),
            (3, serde_json::json!({"a": 1})),
            (9, serde_json::json!({"b": 2})),
        ]
    );
}
