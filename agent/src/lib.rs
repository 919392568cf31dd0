//! The vmdhcp agent: it serves DHCPv4 for the pools the controller assigns it.
//!
//! The agent's runtime (stream client, leader election, DHCP server) is built on the domain
//! model of `vmdhcp-core`; today this crate holds the binary's bootstrap validation.
#![forbid(unsafe_code)]
