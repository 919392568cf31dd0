//! The vmdhcp agent: it serves DHCPv4 for the pools the controller assigns it.
//!
//! The agent's runtime (stream client, leader election, DHCP server) is built on the domain
//! model of `vmdhcp-core`; today this crate holds the binary's bootstrap validation.
//!
//! - [`lease_table`]: the pools and leases served, swapped atomically so lookups never wait.
//! - [`dhcp`]: the DHCPv4 server, one socket per interface, replies built by pure functions.
//! - [`http`]: `/healthz`, `/readyz`, `/leases` and `/metrics`.
//! - [`netlink`]: each served interface gets exactly its server address and is up.
//! - [`stream`]: the config-stream client: snapshot then deltas from the controller, resumed by
//!   revision after any disconnect, validated before anything is applied.
#![forbid(unsafe_code)]

pub mod dhcp;
pub mod http;
pub mod lease_table;
pub mod netlink;
pub mod stream;
