//! The CRD YAML committed in the charts is exactly what the types generate.

#[test]
fn committed_crds_match_the_types() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut stale = Vec::new();
    let mut checked = Vec::new();
    let charts = cairn_api::crds::chart_files();
    assert_eq!(
        charts.len(),
        4,
        "three controller charts and the umbrella chart"
    );
    for chart in charts {
        assert!(!chart.crds.is_empty(), "{}: no CRDs", chart.chart);
        for crd in &chart.crds {
            checked.push(crd.spec.names.kind.clone());
            let path = cairn_api::crds::chart_path(chart.chart, crd);
            let expected = cairn_api::crds::to_yaml(crd).expect("CRDs serialize");
            let committed = std::fs::read_to_string(root.join(&path)).unwrap_or_default();
            if committed != expected {
                stale.push(path.display().to_string());
            }
        }
    }
    // Every kind of the three groups: a list that came back short would
    // otherwise pass by checking nothing.
    checked.sort();
    checked.dedup();
    assert_eq!(
        checked,
        [
            "Backup",
            "BackupSchedule",
            "DatabaseCluster",
            "DnsRecord",
            "ObjectBucket",
            "ProviderConfig"
        ],
        "the CRDs the charts carry"
    );
    assert!(
        stale.is_empty(),
        "out of date: {stale:?}; run `cargo run -p cairn-api --bin crdgen` and commit the result"
    );
}
