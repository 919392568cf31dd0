//! The vmdhcp agent: it serves DHCPv4 (and DHCPv6 for dual-stack pools) for the pools the
//! controller assigns it.
//!
//! One Deployment of agents serves every pool; the replicas elect a leader through a Lease, and
//! only the leader configures interfaces and answers, while standbys keep the same state hot.
//!
//! - [`runtime`]: the `run` command: bootstrap, sources, election, serving, reports, shutdown.
//! - [`sources`]: which lease source wins, the controller's stream, IPPool status or a static
//!   file, and the IPPool watch behind the fallback.
//! - [`serving`]: the leader's interfaces and DHCP servers, and silencing them on step-down.
//! - [`report`]: what the agent applied and how its interfaces fare, back to the controller.
//! - [`lease_table`]: the pools and leases served, swapped atomically so lookups never wait.
//! - [`pools`]: the one vocabulary for pool state every source, the stream and the lease table
//!   share: a pool with its leases (`PoolLeases`) and a change to the pools (`PoolDelta`).
//! - [`findings`]: what ARP and Neighbor Solicitation probes found (conflicts, and recorded ones
//!   found free again), for the controller.
//! - [`suspects`]: hosts found acting where they should not on a pool's network (foreign DHCP
//!   servers of either family, proxy-ARP and proxy-NDP responders), kept while they keep
//!   showing, for the controller.
//! - [`dhcp`]: the DHCPv4 server, one socket per interface, replies built by pure functions
//!   (`dhcp::handler`: the datagram checked, the decision, the reply encoded).
//! - [`dhcp6`]: the DHCPv6 server of dual-stack pools (stateful IA_NA), its replies built by a
//!   pure function (`dhcp6::handler`).
//! - [`ra`]: Router Advertisements for the dual-stack pools that ask for them.
//! - [`http`]: `/healthz`, `/readyz`, `/leases` and `/metrics`.
//! - [`netlink`]: each served interface gets exactly its server address and is up.
//! - [`host6`]: each served interface is an IPv6 host that takes no routing from its tenants
//!   (no RAs, redirects or proxy NDP: set by the chart's init container through `settle-host6`,
//!   or by the agent where it may write `/proc/sys`; what the kernel learned anyway is swept).
//! - [`reconfigure`]: the reconfigure keys clients of either family hold, and which of them are
//!   owed a FORCERENEW or RECONFIGURE because their answer changed.
//! - [`arp`]: gratuitous ARP (RFC 5227 announcements) for the server addresses taken over, the
//!   probes of both families, and the one rule their answers are weighed by (`arp::weigh`).
//! - [`supervisor`]: one task per served interface, started and stopped on its own, retried
//!   with backoff; the DHCPv4 and DHCPv6 servers both run under it.
//! - [`pacing`]: the pace a server thread reads its socket at: at once after a quiet spell, in
//!   batches while datagrams keep coming, so a burst costs one wake-up per batch.
//! - [`capability`]: which Linux capability a refused operation lacked, named in its error.
//! - [`credentials`]: the controller's CA and our ServiceAccount token for the stream.
//! - [`stream`]: the config-stream client: snapshot then deltas from the controller, resumed by
//!   revision after any disconnect (`stream::client`), each message validated whole before
//!   anything is applied (`stream::applier`, pure).
//!
//! # Layers
//!
//! A module imports only modules of the layers below its own, never one above or beside it:
//! the DHCP server knows nothing of where leases come from, the lease table nothing of the
//! DHCP server, and the stream client nothing of the table it feeds. `tests/layering.rs` reads
//! this list and fails on any import against it, so a new module must be placed here.
//!
//! 1. `runtime`
//! 2. `report`
//! 3. `serving`, `sources`, `http`
//! 4. `dhcp`, `dhcp6`, `host6`, `ra`, `stream`
//! 5. `arp`, `netlink`, `lease_table`, `reconfigure`
//! 6. `capability`, `credentials`, `findings`, `pacing`, `pools`, `supervisor`, `suspects`
//!
//! `unsafe` is denied everywhere (workspace lint); the one exception, allowed on that function
//! alone, is [`arp`] writing a `sockaddr_ll`, for which socket2 has no safe constructor.
#![deny(unsafe_code)]

pub mod arp;
pub mod capability;
pub mod credentials;
pub mod dhcp;
pub mod dhcp6;
pub mod findings;
pub mod host6;
pub mod http;
pub mod lease_table;
pub mod netlink;
pub mod pacing;
pub mod pools;
pub mod ra;
pub mod reconfigure;
pub mod report;
pub mod runtime;
pub mod serving;
pub mod sources;
pub mod stream;
pub mod supervisor;
pub mod suspects;
