//! Compiles the .proto files with protox (pure Rust, so building needs no system `protoc`), and
//! writes the encoded descriptor set that gRPC reflection serves.

use prost::Message;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = ["vmdhcp/agent/v1/agent.proto"];
    for file in files {
        println!("cargo:rerun-if-changed={file}");
    }
    let descriptors = protox::compile(files, ["."])?;
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out.join("vmdhcp_descriptor.bin"),
        descriptors.encode_to_vec(),
    )?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(descriptors)?;
    Ok(())
}
