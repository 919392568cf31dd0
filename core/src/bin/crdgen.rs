//! Writes the CRD manifests generated from `vmdhcp_core::crd` into a directory (default
//! `chart/crds`), so the chart always ships exactly what the types define.

use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let dir = std::env::args_os()
        .nth(1)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../chart/crds"));
    let manifests = match vmdhcp_core::crd::crd_manifests() {
        Ok(m) => m,
        Err(e) => {
            #[allow(clippy::print_stderr)]
            {
                eprintln!("crdgen: {e}");
            }
            return ExitCode::FAILURE;
        }
    };
    for (file, yaml) in manifests {
        let path = dir.join(file);
        if let Err(e) = std::fs::write(&path, yaml) {
            #[allow(clippy::print_stderr)]
            {
                eprintln!("crdgen: cannot write {}: {e}", path.display());
            }
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}
