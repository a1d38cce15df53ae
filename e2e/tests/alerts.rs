//! The charts' alerts, read from their rule files (no cluster): every alert
//! has a unit test that fires it and one that keeps it silent (the tests
//! themselves run under `promtool test rules` in the test command's lint),
//! a severity, and a runbook section in docs/runbooks.md that its
//! `runbook_url` points to.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde_yaml_ng::Value;

type Result<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace")
        .to_owned()
}

fn yaml(path: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(serde_yaml_ng::from_str(&text)?)
}

/// Every chart's rule file and its tests.
fn rule_files() -> Result<Vec<(PathBuf, PathBuf)>> {
    let mut files = Vec::new();
    for chart in std::fs::read_dir(root().join("charts"))? {
        let rules = chart?.path().join("rules");
        if rules.join("alerts.yaml").exists() {
            files.push((rules.join("alerts.yaml"), rules.join("alerts.test.yaml")));
        }
    }
    files.sort();
    Ok(files)
}

#[test]
fn every_alert_is_tested_firing_and_silent_and_has_a_runbook() -> Result {
    let runbooks = std::fs::read_to_string(root().join("docs/runbooks.md"))?;
    let sections: BTreeSet<&str> = runbooks
        .lines()
        .filter_map(|line| line.strip_prefix("### "))
        .collect();
    let files = rule_files()?;
    assert!(
        files.len() >= 2,
        "the database and backup charts have alerts: {files:?}"
    );
    assert!(
        !sections.is_empty(),
        "docs/runbooks.md has no runbook section"
    );
    for (rules_path, tests) in files {
        let rules = yaml(&rules_path)?;
        let mut alerts = BTreeMap::new();
        for group in rules["groups"].as_sequence().into_iter().flatten() {
            for rule in group["rules"].as_sequence().into_iter().flatten() {
                if let Some(name) = rule["alert"].as_str() {
                    alerts.insert(name.to_owned(), rule.clone());
                }
            }
        }
        assert!(
            !alerts.is_empty(),
            "{}: no alert read",
            rules_path.display()
        );
        // (fires, stays silent) per alert.
        let mut seen: BTreeMap<String, (bool, bool)> = BTreeMap::new();
        for test in yaml(&tests)?["tests"].as_sequence().into_iter().flatten() {
            for case in test["alert_rule_test"].as_sequence().into_iter().flatten() {
                let name = case["alertname"].as_str().unwrap_or_default().to_owned();
                let fires = case["exp_alerts"]
                    .as_sequence()
                    .is_some_and(|a| !a.is_empty());
                let entry = seen.entry(name).or_default();
                if fires {
                    entry.0 = true;
                } else {
                    entry.1 = true;
                }
            }
        }
        assert!(!seen.is_empty(), "{}: no alert test read", tests.display());
        for (name, rule) in &alerts {
            assert_eq!(
                seen.get(name),
                Some(&(true, true)),
                "{name}: a test that fires it and one that keeps it silent"
            );
            let severity = rule["labels"]["severity"].as_str().unwrap_or_default();
            assert!(
                ["critical", "warning"].contains(&severity),
                "{name}: severity {severity:?}"
            );
            assert!(
                sections.contains(name.as_str()),
                "{name}: no runbook section"
            );
            let url = rule["annotations"]["runbook_url"]
                .as_str()
                .unwrap_or_default();
            assert!(
                url.ends_with(&format!("docs/runbooks.md#{}", name.to_lowercase())),
                "{name}: runbook_url {url}"
            );
        }
        let unknown: Vec<_> = seen.keys().filter(|n| !alerts.contains_key(*n)).collect();
        assert!(
            unknown.is_empty(),
            "tests of alerts that do not exist: {unknown:?}"
        );
    }
    Ok(())
}
