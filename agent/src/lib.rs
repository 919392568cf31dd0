//! The vmdhcp agent: it serves DHCPv4 for the pools the controller assigns it.
//!
//! One Deployment of agents serves every pool; the replicas elect a leader through a Lease, and
//! only the leader configures interfaces and answers, while standbys keep the same state hot.
//!
//! - [`runtime`]: the `run` command: bootstrap, sources, election, serving, reports, shutdown.
//! - [`sources`]: which lease source wins, the controller's stream or IPPool status, and how
//!   the stream's state lands in the lease table.
//! - [`serving`]: the leader's interfaces and DHCP servers, and silencing them on step-down.
//! - [`report`]: what the agent applied and how its interfaces fare, back to the controller.
//! - [`lease_table`]: the pools and leases served, swapped atomically so lookups never wait.
//! - [`findings`]: what ARP probes found (conflicts, and recorded ones found free again), for
//!   the controller.
//! - [`dhcp`]: the DHCPv4 server, one socket per interface, replies built by pure functions
//!   (`dhcp::handler`: the datagram checked, the decision, the reply encoded).
//! - [`http`]: `/healthz`, `/readyz`, `/leases` and `/metrics`.
//! - [`netlink`]: each served interface gets exactly its server address and is up.
//! - [`arp`]: gratuitous ARP (RFC 5227 announcements) for the server addresses taken over.
//! - [`capability`]: which Linux capability a refused operation lacked, named in its error.
//! - [`credentials`]: the controller's CA and our ServiceAccount token for the stream.
//! - [`stream`]: the config-stream client: snapshot then deltas from the controller, resumed by
//!   revision after any disconnect, validated before anything is applied.
//!
//! `unsafe` is denied everywhere (workspace lint); the one exception, allowed on that function
//! alone, is [`arp`] writing a `sockaddr_ll`, for which socket2 has no safe constructor.
#![deny(unsafe_code)]

pub mod arp;
pub mod capability;
pub mod credentials;
pub mod dhcp;
pub mod findings;
pub mod http;
pub mod lease_table;
pub mod netlink;
pub mod report;
pub mod runtime;
pub mod serving;
pub mod sources;
pub mod stream;
