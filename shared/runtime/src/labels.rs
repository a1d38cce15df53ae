//! Standard `app.kubernetes.io/*` labels on every object a controller creates.

use std::collections::BTreeMap;

/// Value of `app.kubernetes.io/managed-by` on objects Cairn creates.
pub const MANAGED_BY: &str = "cairn";
/// Value of `app.kubernetes.io/part-of` on objects Cairn creates.
pub const PART_OF: &str = "cairn";

/// The recommended labels of a child object: `name` is the kind of application
/// (e.g. `postgresql`), `instance` the owning object's name, `component` the
/// child's role (e.g. `database`, `backup`).
pub fn standard(name: &str, instance: &str, component: &str) -> BTreeMap<String, String> {
    [
        ("app.kubernetes.io/name", name),
        ("app.kubernetes.io/instance", instance),
        ("app.kubernetes.io/component", component),
        ("app.kubernetes.io/managed-by", MANAGED_BY),
        ("app.kubernetes.io/part-of", PART_OF),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn standard_labels_name_the_instance_and_the_manager() {
        let labels = standard("postgresql", "orders", "database");
        assert_eq!(labels["app.kubernetes.io/instance"], "orders");
        assert_eq!(labels["app.kubernetes.io/managed-by"], "cairn");
        assert_eq!(labels.len(), 5);
    }
}
