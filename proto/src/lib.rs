//! The wire contract between controller and agents: the generated types and service stubs of the
//! protobuf package `vmdhcp.agent.v1` (`vmdhcp/agent/v1/agent.proto` in this crate), the encoded
//! descriptor set that gRPC reflection serves, and the checked conversions between the wire
//! messages and the domain model of `vmdhcp-core` ([`convert`]).
#![forbid(unsafe_code)]

pub mod convert;

/// Package `vmdhcp.agent.v1`: what a controller tells agents about the pools they serve.
pub mod agent {
    /// Version 1 of the agent contract; breaking changes need a new version (buf breaking, FILE).
    pub mod v1 {
        #![allow(missing_docs, clippy::all, clippy::pedantic)]
        tonic::include_proto!("vmdhcp.agent.v1");
    }
}

/// The encoded `FileDescriptorSet` of every .proto in this crate, for gRPC reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/vmdhcp_descriptor.bin"));
