//! Writes every CRD into the chart that ships it (see `cairn_api::crds`),
//! and the API reference rendered from them (`docs/api-reference.md`, see
//! `cairn_api::reference`).
//!
//! `crdgen` writes the files; `crdgen --check` only compares and exits 1 when
//! a committed file differs from what the types generate.

use std::path::Path;
use std::process::ExitCode;

fn main() -> ExitCode {
    let check = std::env::args().any(|a| a == "--check");
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = Vec::new();
    for chart in cairn_api::crds::chart_files() {
        for crd in &chart.crds {
            let path = root.join(cairn_api::crds::chart_path(chart.chart, crd));
            match cairn_api::crds::to_yaml(crd) {
                Ok(text) => files.push((path, text)),
                Err(e) => {
                    eprintln!("cannot serialize {}: {e}", path.display());
                    return ExitCode::FAILURE;
                }
            }
        }
    }
    files.push((
        root.join(cairn_api::reference::PATH),
        cairn_api::reference::document(),
    ));
    let mut stale = 0;
    for (path, text) in files {
        if std::fs::read_to_string(&path).ok().as_deref() == Some(text.as_str()) {
            continue;
        }
        stale += 1;
        if check {
            eprintln!("{} is out of date", path.display());
        } else if let Err(e) = path
            .parent()
            .map_or(Ok(()), std::fs::create_dir_all)
            .and_then(|()| std::fs::write(&path, text))
        {
            eprintln!("cannot write {}: {e}", path.display());
            return ExitCode::FAILURE;
        } else {
            eprintln!("wrote {}", path.display());
        }
    }
    if check && stale > 0 {
        eprintln!("run `cargo run -p cairn-api --bin crdgen` and commit the result");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
