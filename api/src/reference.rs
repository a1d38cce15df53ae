//! The API reference (`docs/api-reference.md`), rendered from the generated
//! CRDs: the same OpenAPI schemas, descriptions and CEL rules the API server
//! enforces and `kubectl explain` shows, so the document cannot say more or
//! less than the types.
//!
//! Every object level of a schema (spec, status, each nested object, the
//! items of an array of objects, the values of a map of objects) gets a table
//! with an anchor; a nested object whose schema repeats one already rendered
//! verbatim links to that table instead of repeating it. The few Kubernetes
//! types Cairn embeds whole (affinity, tolerations, resources) link to the
//! Kubernetes reference.

use std::collections::BTreeMap;
use std::fmt::Write;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde_json::{Map, Value};

/// Where the reference is committed, relative to the repository root.
pub const PATH: &str = "docs/api-reference.md";

/// The command that regenerates the reference (and the CRDs).
pub const REGENERATE: &str = "cargo run -p cairn-api --bin crdgen";

/// A Kubernetes type embedded whole, recognised by its property names and
/// linked instead of expanded.
struct KubernetesType {
    name: &'static str,
    properties: &'static [&'static str],
    url: &'static str,
}

const KUBERNETES_TYPES: &[KubernetesType] = &[
    KubernetesType {
        name: "Affinity",
        properties: &["nodeAffinity", "podAffinity", "podAntiAffinity"],
        url: "https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/pod-v1/#scheduling",
    },
    KubernetesType {
        name: "Toleration",
        properties: &["effect", "key", "operator", "tolerationSeconds", "value"],
        url: "https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/pod-v1/#scheduling",
    },
    KubernetesType {
        name: "ResourceRequirements",
        properties: &["claims", "limits", "requests"],
        url: "https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/pod-v1/#resources",
    },
];

/// The reference of every CRD the charts ship, each once (the umbrella
/// chart ships the same CRDs as the controller charts).
pub fn document() -> String {
    let mut crds: Vec<CustomResourceDefinition> = Vec::new();
    for crd in crate::crds::chart_files().into_iter().flat_map(|c| c.crds) {
        if !crds.iter().any(|c| c.metadata.name == crd.metadata.name) {
            crds.push(crd);
        }
    }
    render(&crds)
}

/// The reference of `crds`, grouped by API group in the order given.
pub fn render(crds: &[CustomResourceDefinition]) -> String {
    let mut renderer = Renderer::default();
    let mut kinds = Vec::new();
    for crd in crds {
        let crd = serde_json::to_value(crd).expect("a CRD serializes");
        let spec = &crd["spec"];
        for version in spec["versions"].as_array().into_iter().flatten() {
            kinds.push(renderer.kind(spec, version));
        }
    }

    let mut out = String::new();
    out.push_str("# API reference\n\n");
    let _ = writeln!(
        out,
        "<!-- Generated from the CRDs of the Rust types in api/ by `{REGENERATE}`; do not edit. -->\n"
    );
    out.push_str(
        "Every kind Cairn defines, per API group and served version, as the API server \
         validates it: the field descriptions are the ones `kubectl explain` shows, the \
         validations are the CRDs' OpenAPI schemas and CEL rules (a write that breaks one \
         is rejected with its message). Fields not marked required may be left out.\n\n",
    );
    let mut groups: Vec<&str> = Vec::new();
    for kind in &kinds {
        if !groups.contains(&kind.group.as_str()) {
            groups.push(&kind.group);
        }
    }
    for group in &groups {
        let _ = writeln!(out, "- `{group}`");
        for kind in kinds.iter().filter(|k| k.group == *group) {
            let _ = writeln!(
                out,
                "  - [{} `{}`](#{}){}",
                kind.kind,
                kind.version,
                kind.anchor,
                if kind.deprecated { " (deprecated)" } else { "" }
            );
        }
    }
    for group in &groups {
        let _ = write!(out, "\n## `{group}`\n");
        for kind in kinds.iter().filter(|k| k.group == *group) {
            out.push('\n');
            out.push_str(&kind.header);
            for &index in &kind.sections {
                out.push('\n');
                out.push_str(&renderer.sections[index].render());
            }
        }
    }
    out
}

/// One kind in one version.
struct Kind {
    group: String,
    kind: String,
    version: String,
    anchor: String,
    deprecated: bool,
    header: String,
    /// Indices into [`Renderer::sections`] of the tables rendered under it.
    sections: Vec<usize>,
}

/// One table: the fields of one object level.
struct Section {
    anchor: String,
    title: String,
    /// The description, for the top levels (spec, status) only: a nested
    /// object's is in the row of the field that holds it.
    description: Option<String>,
    rules: Vec<String>,
    rows: Vec<String>,
    /// Other places the same schema appears: (title, anchor of their table).
    also_at: Vec<(String, String)>,
}

impl Section {
    fn render(&self) -> String {
        let mut out = format!("<a id=\"{}\"></a>\n#### {}\n\n", self.anchor, self.title);
        if let Some(description) = &self.description {
            out.push_str(&paragraphs(description));
            out.push_str("\n\n");
        }
        if !self.also_at.is_empty() {
            let places: Vec<String> = self
                .also_at
                .iter()
                .map(|(title, anchor)| format!("[{}](#{anchor})", strip_heading(title)))
                .collect();
            let _ = writeln!(out, "Also used by {}.\n", places.join(", "));
        }
        if !self.rules.is_empty() {
            out.push_str("Rules on the whole object:\n\n");
            for rule in &self.rules {
                let _ = writeln!(out, "- {rule}");
            }
            out.push('\n');
        }
        if self.rows.is_empty() {
            out.push_str("No fields.\n");
        } else {
            out.push_str("| Field | Type | Required | Default | Validation | Description |\n");
            out.push_str("|---|---|---|---|---|---|\n");
            for row in &self.rows {
                out.push_str(row);
                out.push('\n');
            }
        }
        out
    }
}

/// Where an object schema sits: its kind and version, and its path from
/// the object's root, e.g. `spec.parts[]`.
struct Place {
    kind: String,
    version: String,
    path: String,
}

impl Place {
    fn title(&self) -> String {
        format!("{} {} `{}`", self.kind, self.version, self.path)
    }

    /// The text of the anchor (before [`Renderer::anchor`] makes it unique).
    fn anchor_path(&self) -> String {
        format!("{}-{}-{}", self.kind, self.version, self.path)
    }

    fn field(&self, field: &str) -> Self {
        self.with(format!("{}.{field}", self.path))
    }

    fn with(&self, path: String) -> Self {
        Self {
            kind: self.kind.clone(),
            version: self.version.clone(),
            path,
        }
    }
}

#[derive(Default)]
struct Renderer {
    sections: Vec<Section>,
    /// A rendered object schema (without its own description) → its section.
    seen: BTreeMap<String, usize>,
    anchors: BTreeMap<String, usize>,
}

impl Renderer {
    fn kind(&mut self, spec: &Value, version: &Value) -> Kind {
        let group = text(&spec["group"]);
        let kind = text(&spec["names"]["kind"]);
        let name = text(&version["name"]);
        let anchor = self.anchor(&format!("{kind}-{name}"));
        let deprecated = version["deprecated"].as_bool().unwrap_or(false);
        let root = &version["schema"]["openAPIV3Schema"];

        let mut header = format!(
            "<a id=\"{anchor}\"></a>\n### {kind} `{group}/{name}`{}\n\n",
            if deprecated { " (deprecated)" } else { "" }
        );
        let description = [&root["properties"]["spec"], root]
            .into_iter()
            .filter_map(|s| s["description"].as_str())
            .find(|d| !d.starts_with("Auto-generated"));
        if let Some(description) = description {
            header.push_str(&paragraphs(description));
            header.push_str("\n\n");
        }
        if let Some(warning) = version["deprecationWarning"].as_str() {
            let _ = writeln!(header, "> **Deprecated:** {}\n", escape(warning));
        }
        let names = &spec["names"];
        let _ = writeln!(header, "- apiVersion: `{group}/{name}`, kind: `{kind}`");
        let _ = writeln!(
            header,
            "- scope: {}; plural: `{}`",
            text(&spec["scope"]),
            text(&names["plural"])
        );
        let _ = writeln!(
            header,
            "- served: {}; storage version: {}",
            yes_no(&version["served"]),
            yes_no(&version["storage"])
        );
        for (label, key) in [("short names", "shortNames"), ("categories", "categories")] {
            let list = code_list(&names[key]);
            if !list.is_empty() {
                let _ = writeln!(header, "- {label}: {list}");
            }
        }
        let subresources = &version["subresources"];
        let mut subs = Vec::new();
        if subresources.get("status").is_some() {
            subs.push("`status`".to_owned());
        }
        if let Some(scale) = subresources.get("scale") {
            let mut paths = vec![format!(
                "replicas `{}` ↔ `{}`",
                text(&scale["specReplicasPath"]),
                text(&scale["statusReplicasPath"])
            )];
            if let Some(selector) = scale["labelSelectorPath"].as_str() {
                paths.push(format!("selector `{selector}`"));
            }
            subs.push(format!("`scale` ({})", paths.join(", ")));
        }
        if !subs.is_empty() {
            let _ = writeln!(header, "- subresources: {}", subs.join(", "));
        }
        let selectable: Vec<String> = version["selectableFields"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|f| format!("`{}`", text(&f["jsonPath"])))
            .collect();
        if !selectable.is_empty() {
            let _ = writeln!(
                header,
                "- field selectors (`kubectl get --field-selector`): {}",
                selectable.join(", ")
            );
        }
        let rules = rules(root);
        if !rules.is_empty() {
            header.push_str("\nRules on the whole object:\n\n");
            for rule in rules {
                let _ = writeln!(header, "- {rule}");
            }
        }
        if let Some(columns) = version["additionalPrinterColumns"]
            .as_array()
            .filter(|c| !c.is_empty())
        {
            header.push_str(
                "\nColumns of `kubectl get`:\n\n| Column | Type | JSON path |\n|---|---|---|\n",
            );
            for column in columns {
                let _ = writeln!(
                    header,
                    "| {} | {} | `{}` |",
                    escape(&text(&column["name"])),
                    text(&column["type"]),
                    code(&text(&column["jsonPath"]))
                );
            }
        }

        let mut sections = Vec::new();
        for part in ["spec", "status"] {
            let schema = &root["properties"][part];
            if schema.is_object() {
                let at = Place {
                    kind: kind.clone(),
                    version: name.clone(),
                    path: part.to_owned(),
                };
                let index = self.object(schema, &at, &anchor, &mut sections);
                self.sections[index].description = schema["description"]
                    .as_str()
                    .filter(|d| Some(*d) != description && !d.is_empty())
                    .map(str::to_owned);
            }
        }
        Kind {
            group,
            kind,
            version: name,
            anchor,
            deprecated,
            header,
            sections,
        }
    }

    /// Renders the object `schema` as a new section (and its nested objects
    /// after it), or finds the section already rendered for the same schema.
    /// Returns the section's index; new ones are appended to `order`.
    fn object(
        &mut self,
        schema: &Value,
        at: &Place,
        parent: &str,
        order: &mut Vec<usize>,
    ) -> usize {
        let (path, title) = (at.anchor_path(), at.title());
        let key = identity(schema);
        if let Some(&index) = self.seen.get(&key) {
            self.sections[index]
                .also_at
                .push((title, parent.to_owned()));
            return index;
        }
        let anchor = self.anchor(&path);
        let index = self.sections.len();
        self.sections.push(Section {
            anchor: anchor.clone(),
            title,
            description: None,
            rules: rules(schema),
            rows: Vec::new(),
            also_at: Vec::new(),
        });
        self.seen.insert(key, index);
        order.push(index);

        let required: Vec<&str> = schema["required"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        let empty = Map::new();
        let properties = schema["properties"].as_object().unwrap_or(&empty);
        let mut rows = Vec::new();
        for (field, property) in properties {
            let (type_, nested_rules) = self.type_of(property, &at.field(field), &anchor, order);
            // An object with a table of its own lists its rules there.
            let mut validation = if is_object_with_fields(property) {
                constraints(property)
            } else {
                validations(property)
            };
            validation.extend(nested_rules);
            rows.push(format!(
                "| `{field}` | {type_} | {} | {} | {} | {} |",
                if required.contains(&field.as_str()) {
                    "yes"
                } else {
                    ""
                },
                property
                    .get("default")
                    .map(|d| format!("`{}`", code(&d.to_string())))
                    .unwrap_or_default(),
                validation.join("<br>"),
                cell(property["description"].as_str().unwrap_or("")),
            ));
        }
        self.sections[index].rows = rows;
        index
    }

    /// The type of a field for its row, rendering nested objects as
    /// sections; and the CEL rules of the field's value when they are not in
    /// a section of their own (arrays and maps of scalars).
    fn type_of(
        &mut self,
        schema: &Value,
        at: &Place,
        parent: &str,
        order: &mut Vec<usize>,
    ) -> (String, Vec<String>) {
        if let Some(known) = kubernetes_type(schema) {
            return (
                format!("[{}]({}) (Kubernetes)", known.name, known.url),
                Vec::new(),
            );
        }
        if schema.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true)) {
            return ("integer or string".into(), Vec::new());
        }
        match schema["type"].as_str() {
            Some("array") => {
                let items = &schema["items"];
                let (inner, mut inner_rules) =
                    self.type_of(items, &at.with(format!("{}[]", at.path)), parent, order);
                let mut nested = prefix_rules("each item: ", &mut inner_rules);
                nested.extend(prefix_rules("each item: ", &mut validations(items)));
                if is_object_with_fields(items) {
                    nested.clear();
                }
                (format!("array of {inner}"), nested)
            }
            Some("object") if is_object_with_fields(schema) => {
                let index = self.object(schema, at, parent, order);
                (
                    format!("[object](#{})", self.sections[index].anchor),
                    Vec::new(),
                )
            }
            Some("object") => match schema.get("additionalProperties") {
                Some(values) if values.is_object() => {
                    let (inner, mut inner_rules) =
                        self.type_of(values, &at.with(format!("{}[key]", at.path)), parent, order);
                    let mut nested = prefix_rules("each value: ", &mut inner_rules);
                    if !is_object_with_fields(values) {
                        nested.extend(prefix_rules("each value: ", &mut validations(values)));
                    }
                    (format!("map of string to {inner}"), nested)
                }
                _ => ("object".into(), Vec::new()),
            },
            Some(scalar) => {
                let format = schema["format"].as_str();
                (
                    match format {
                        Some(format) => format!("{scalar} ({format})"),
                        None => scalar.to_owned(),
                    },
                    Vec::new(),
                )
            }
            None => ("any".into(), Vec::new()),
        }
    }

    /// A unique anchor for `path`.
    fn anchor(&mut self, path: &str) -> String {
        let lowered = path.to_ascii_lowercase();
        let base = lowered
            .split(|c: char| !c.is_ascii_alphanumeric())
            .filter(|word| !word.is_empty())
            .collect::<Vec<_>>()
            .join("-");
        let count = self.anchors.entry(base.clone()).or_insert(0);
        *count += 1;
        if *count == 1 {
            base
        } else {
            format!("{base}-{count}")
        }
    }
}

fn prefix_rules(prefix: &str, rules: &mut Vec<String>) -> Vec<String> {
    rules.drain(..).map(|r| format!("{prefix}{r}")).collect()
}

fn is_object_with_fields(schema: &Value) -> bool {
    schema["type"].as_str() == Some("object")
        && schema["properties"]
            .as_object()
            .is_some_and(|p| !p.is_empty())
        && kubernetes_type(schema).is_none()
}

fn kubernetes_type(schema: &Value) -> Option<&'static KubernetesType> {
    let properties = schema["properties"].as_object()?;
    KUBERNETES_TYPES.iter().find(|known| {
        properties.len() == known.properties.len()
            && known.properties.iter().all(|p| properties.contains_key(*p))
    })
}

/// What makes two object schemas the same type: everything but their own
/// description and nullability (which belong to the field holding them).
fn identity(schema: &Value) -> String {
    let mut schema = schema.clone();
    if let Some(object) = schema.as_object_mut() {
        object.remove("description");
        object.remove("nullable");
    }
    schema.to_string()
}

/// The validations of a field a user can run into, one per line.
fn validations(schema: &Value) -> Vec<String> {
    let mut out = constraints(schema);
    out.extend(rules(schema));
    out
}

/// The OpenAPI validations of a field (all but its CEL rules).
fn constraints(schema: &Value) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(values) = schema["enum"].as_array() {
        let values: Vec<String> = values
            .iter()
            // A nullable enum lists null: leaving the field out says the same.
            .filter(|v| !v.is_null())
            .map(|v| match v {
                Value::String(s) => format!("`{}`", code(s)),
                other => format!("`{}`", code(&other.to_string())),
            })
            .collect();
        out.push(format!("one of {}", values.join(", ")));
    }
    let bound = |key: &str| schema.get(key).map(number);
    let exclusive = |key: &str| schema[key].as_bool().unwrap_or(false);
    let (above, below) = (
        if exclusive("exclusiveMinimum") {
            "<"
        } else {
            "≤"
        },
        if exclusive("exclusiveMaximum") {
            "<"
        } else {
            "≤"
        },
    );
    match (bound("minimum"), bound("maximum")) {
        (Some(min), Some(max)) => out.push(format!("{min} {above} value {below} {max}")),
        (Some(min), None) => out.push(format!("{min} {above} value")),
        (None, Some(max)) => out.push(format!("value {below} {max}")),
        (None, None) => {}
    }
    for (min, max, what) in [
        ("minLength", "maxLength", "length"),
        ("minItems", "maxItems", "items"),
        ("minProperties", "maxProperties", "keys"),
    ] {
        match (bound(min), bound(max)) {
            (Some(min), Some(max)) => out.push(format!("{what} {min} to {max}")),
            (Some(min), None) => out.push(format!("{what} at least {min}")),
            (None, Some(max)) => out.push(format!("{what} at most {max}")),
            (None, None) => {}
        }
    }
    if let Some(pattern) = schema["pattern"].as_str() {
        out.push(format!("pattern `{}`", code(pattern)));
    }
    if let Some(list_type) = schema["x-kubernetes-list-type"].as_str() {
        out.push(format!("list type `{list_type}`"));
    }
    out
}

/// The CEL rules of `schema` (`x-kubernetes-validations`), each with its
/// message, immutability called out.
fn rules(schema: &Value) -> Vec<String> {
    schema["x-kubernetes-validations"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|validation| {
            let rule = text(&validation["rule"]);
            let message = validation["message"]
                .as_str()
                .or_else(|| validation["messageExpression"].as_str())
                .unwrap_or("");
            let immutable = rule.replace(' ', "") == "self==oldSelf"
                || message.to_ascii_lowercase().contains("immutable");
            let on_update = rule.contains("oldSelf");
            let mut out = String::new();
            if immutable {
                out.push_str("**immutable**: ");
            } else if on_update {
                out.push_str("on update: ");
            }
            let _ = write!(out, "rule `{}`", code(&rule));
            if !message.is_empty() {
                let _ = write!(out, " — “{}”", escape(message));
            }
            out
        })
        .collect()
}

fn number(value: &Value) -> String {
    match value.as_f64() {
        Some(f) if f.fract() == 0.0 && f.abs() < 1e15 => format!("{}", f as i64),
        Some(f) => f.to_string(),
        None => value.to_string(),
    }
}

fn text(value: &Value) -> String {
    value.as_str().unwrap_or_default().to_owned()
}

fn yes_no(value: &Value) -> &'static str {
    if value.as_bool().unwrap_or(false) {
        "yes"
    } else {
        "no"
    }
}

fn code_list(value: &Value) -> String {
    value
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(|s| format!("`{s}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A heading's text without Markdown code marks, for link texts.
fn strip_heading(title: &str) -> String {
    title.replace('`', "")
}

/// A description as Markdown paragraphs outside a table.
fn paragraphs(description: &str) -> String {
    description
        .split("\n\n")
        .map(|p| escape_html(&p.split('\n').map(str::trim).collect::<Vec<_>>().join(" ")))
        .collect::<Vec<_>>()
        .join("\n\n")
}

/// A description in one table cell: lines joined, paragraphs kept apart.
fn cell(description: &str) -> String {
    description
        .trim()
        .split("\n\n")
        .map(|p| escape(&p.split('\n').map(str::trim).collect::<Vec<_>>().join(" ")))
        .collect::<Vec<_>>()
        .join("<br><br>")
}

/// Code (a span's content) safe in a table cell.
fn code(text: &str) -> String {
    text.replace('|', "\\|")
}

/// Text safe in a table cell: `|` escaped (also inside code spans, as
/// GitHub's tables require) and HTML outside code spans.
fn escape(text: &str) -> String {
    escape_html(text).replace('|', "\\|")
}

/// `<` and `>` outside code spans, so `<name>` shows instead of vanishing.
fn escape_html(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut in_code = false;
    for c in text.chars() {
        match c {
            '`' => {
                in_code = !in_code;
                out.push(c);
            }
            '<' if !in_code => out.push_str("&lt;"),
            '>' if !in_code => out.push_str("&gt;"),
            _ => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A CRD of one kind whose spec is `spec` (YAML).
    fn crd(spec: &str) -> CustomResourceDefinition {
        let spec: Value = serde_yaml_ng::from_str(spec).expect("test schema is YAML");
        serde_json::from_value(serde_json::json!({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": "widgets.example.cairn.dev"},
            "spec": {
                "group": "example.cairn.dev",
                "names": {"kind": "Widget", "plural": "widgets", "shortNames": ["wd"]},
                "scope": "Namespaced",
                "versions": [{
                    "name": "v1",
                    "served": true,
                    "storage": true,
                    "additionalPrinterColumns": [
                        {"name": "Phase", "type": "string", "jsonPath": ".status.phase"}
                    ],
                    "subresources": {"status": {}},
                    "schema": {"openAPIV3Schema": {
                        "type": "object",
                        "description": "Auto-generated derived type",
                        "properties": {
                            "spec": spec,
                            "status": {
                                "type": "object",
                                "description": "Observed state.",
                                "properties": {"phase": {"type": "string", "description": "Phase."}}
                            }
                        }
                    }}
                }]
            }
        }))
        .expect("a CRD")
    }

    fn row<'a>(doc: &'a str, field: &str) -> &'a str {
        doc.lines()
            .find(|l| l.starts_with(&format!("| `{field}` |")))
            .unwrap_or_else(|| panic!("no row for {field} in:\n{doc}"))
    }

    #[test]
    fn a_kind_has_its_header_columns_and_tables() {
        let doc = render(&[crd(r#"
type: object
description: A widget.
required: [size]
properties:
  size:
    type: integer
    format: int32
    minimum: 1.0
    maximum: 9.0
    description: |-
      How many.

      Also set by kubectl scale.
"#)]);
        assert!(doc.contains("### Widget `example.cairn.dev/v1`"), "{doc}");
        assert!(doc.contains("\nA widget.\n"), "{doc}");
        assert!(doc.contains("- short names: `wd`"), "{doc}");
        assert!(doc.contains("- scope: Namespaced"), "{doc}");
        assert!(
            doc.contains("| Phase | string | `.status.phase` |"),
            "{doc}"
        );
        assert!(!doc.contains("Auto-generated"), "{doc}");
        assert_eq!(
            row(&doc, "size"),
            "| `size` | integer (int32) | yes |  | 1 ≤ value ≤ 9 | How many.<br><br>Also set by kubectl scale. |"
        );
        assert!(doc.contains("Observed state."), "{doc}");
        assert!(doc.contains("[Widget `v1`](#widget-v1)"), "{doc}");
    }

    #[test]
    fn nested_objects_arrays_and_maps_get_their_item_types_and_tables() {
        let doc = render(&[crd(r#"
type: object
description: A widget.
properties:
  parts:
    type: array
    description: The parts.
    items:
      type: object
      properties:
        name: {type: string, description: Its name., minLength: 1, maxLength: 63}
  labels:
    type: object
    description: Labels.
    additionalProperties: {type: string}
    maxProperties: 40
  tags:
    type: array
    description: Tags.
    items: {type: string, pattern: '^[a-z]+|x$'}
"#)]);
        let parts = row(&doc, "parts");
        assert!(
            parts.contains("array of [object](#widget-v1-spec-parts)"),
            "{parts}"
        );
        assert!(doc.contains("<a id=\"widget-v1-spec-parts\"></a>"), "{doc}");
        assert!(doc.contains("#### Widget v1 `spec.parts[]`"), "{doc}");
        assert!(row(&doc, "name").contains("length 1 to 63"));
        let labels = row(&doc, "labels");
        assert!(labels.contains("map of string to string"), "{labels}");
        assert!(labels.contains("keys at most 40"), "{labels}");
        let tags = row(&doc, "tags");
        assert!(tags.contains("array of string"), "{tags}");
        assert!(
            tags.contains(r"each item: pattern `^[a-z]+\|x$`"),
            "the pipe is escaped inside the table: {tags}"
        );
    }

    #[test]
    fn enums_defaults_and_rules_with_immutability() {
        let doc = render(&[crd(r#"
type: object
description: A widget.
x-kubernetes-validations:
  - rule: self.min <= self.max
    message: min must not exceed max
properties:
  policy:
    type: string
    description: What happens.
    default: Retain
    enum: [Retain, Delete]
  name:
    type: string
    description: The name.
    x-kubernetes-validations:
      - rule: self == oldSelf
        message: name is immutable
  size:
    type: string
    description: The size.
    x-kubernetes-validations:
      - rule: quantity(self) >= quantity(oldSelf)
        message: cannot shrink
"#)]);
        let policy = row(&doc, "policy");
        assert!(policy.contains("| `\"Retain\"` |"), "{policy}");
        assert!(policy.contains("one of `Retain`, `Delete`"), "{policy}");
        let name = row(&doc, "name");
        assert!(
            name.contains("**immutable**: rule `self == oldSelf` — “name is immutable”"),
            "{name}"
        );
        assert!(row(&doc, "size").contains("on update: rule"));
        assert!(
            doc.contains("- rule `self.min <= self.max` — “min must not exceed max”"),
            "object rules are listed above the table: {doc}"
        );
    }

    #[test]
    fn a_repeated_schema_is_rendered_once_and_linked() {
        let doc = render(&[crd(r#"
type: object
description: A widget.
properties:
  source:
    type: object
    description: Where from.
    properties:
      name: {type: string, description: The name.}
  target:
    type: object
    description: Where to.
    nullable: true
    properties:
      name: {type: string, description: The name.}
  other:
    type: object
    description: Something else.
    properties:
      name: {type: string, description: Another name.}
"#)]);
        assert!(row(&doc, "source").contains("[object](#widget-v1-spec-source)"));
        assert!(
            row(&doc, "target").contains("[object](#widget-v1-spec-source)"),
            "same schema but for its description: the same table: {doc}"
        );
        assert!(row(&doc, "other").contains("[object](#widget-v1-spec-other)"));
        assert_eq!(doc.matches("| `name` |").count(), 2, "{doc}");
        assert!(
            doc.contains("Also used by [Widget v1 spec.target](#widget-v1-spec)."),
            "{doc}"
        );
    }

    #[test]
    fn kubernetes_types_are_linked_not_expanded() {
        let doc = render(&[crd(r#"
type: object
description: A widget.
properties:
  resources:
    type: object
    description: CPU and memory.
    properties:
      claims: {type: array, items: {type: object, properties: {name: {type: string}}}}
      limits: {type: object, additionalProperties: {x-kubernetes-int-or-string: true}}
      requests: {type: object, additionalProperties: {x-kubernetes-int-or-string: true}}
"#)]);
        assert!(
            row(&doc, "resources").contains("[ResourceRequirements](https://kubernetes.io/"),
            "{doc}"
        );
        assert!(!doc.contains("| `claims` |"), "{doc}");
    }

    #[test]
    fn angle_brackets_show_outside_code_and_stay_inside() {
        assert_eq!(
            escape("`<name>-rw` for <name>"),
            "`<name>-rw` for &lt;name&gt;"
        );
    }

    #[test]
    fn the_reference_covers_every_kind_and_served_version() {
        let doc = document();
        for crd in crate::crds::chart_files().into_iter().flat_map(|c| c.crds) {
            for version in &crd.spec.versions {
                let heading = format!(
                    "### {} `{}/{}`",
                    crd.spec.names.kind, crd.spec.group, version.name
                );
                assert_eq!(doc.matches(&heading).count(), 1, "{heading}");
            }
        }
        // Every link into the document has its anchor.
        for (i, _) in doc.match_indices("](#") {
            let anchor: String = doc[i + 3..].chars().take_while(|c| *c != ')').collect();
            assert!(
                doc.contains(&format!("<a id=\"{anchor}\"></a>")),
                "no anchor {anchor}"
            );
        }
    }
}
