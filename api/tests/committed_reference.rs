//! The committed API reference is exactly what the CRDs of the types render.

#[test]
fn committed_api_reference_matches_the_types() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let expected = cairn_api::reference::document();
    let committed =
        std::fs::read_to_string(root.join(cairn_api::reference::PATH)).unwrap_or_default();
    assert!(
        committed == expected,
        "{} is out of date; run `{}` and commit the result",
        cairn_api::reference::PATH,
        cairn_api::reference::REGENERATE
    );
}
