//! The wire contract between controller and agents: the generated types and service stubs of the
//! protobuf package `vmdhcp.agent.v1` (see `vmdhcp/agent/v1/*.proto` in this crate).
//!
//! This crate owns only generated code; conversions to and from the domain model live in
//! `vmdhcp-core`, so the contract can be read (and linted by `buf`) without any Rust.
#![forbid(unsafe_code)]

/// Package `vmdhcp.agent.v1`: what a controller tells agents about the pools they serve.
pub mod agent {
    /// Version 1 of the agent contract; breaking changes need a new version (buf breaking, FILE).
    pub mod v1 {
        #![allow(missing_docs, clippy::all, clippy::pedantic)]
        tonic::include_proto!("vmdhcp.agent.v1");
    }
}
