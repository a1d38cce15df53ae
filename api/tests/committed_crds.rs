//! The CRD YAML committed in the charts is exactly what the types generate.

#[test]
fn committed_crds_match_the_types() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut stale = Vec::new();
    for chart in cairn_api::crds::chart_files() {
        for crd in &chart.crds {
            let path = cairn_api::crds::chart_path(chart.chart, crd);
            let expected = cairn_api::crds::to_yaml(crd).expect("CRDs serialize");
            let committed = std::fs::read_to_string(root.join(&path)).unwrap_or_default();
            if committed != expected {
                stale.push(path.display().to_string());
            }
        }
    }
    assert!(
        stale.is_empty(),
        "out of date: {stale:?}; run `cargo run -p cairn-api --bin crdgen` and commit the result"
    );
}
