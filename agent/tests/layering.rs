//! The module layers listed in `src/lib.rs` hold: no module imports one of its own layer or
//! of a layer above (see `vmdhcp_core::layering`).

#[test]
fn modules_import_only_the_layers_below_their_own() {
    let crate_dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    if let Err(e) = vmdhcp_core::layering::check(crate_dir) {
        panic!("{e}");
    }
}
