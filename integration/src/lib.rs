//! Test harnesses for vmdhcp's end-to-end tests and benchmarks, built on real components only.
//!
//! - [`audit`]: the API server's audit log as the permissions each ServiceAccount used or was
//!   refused, compared with what its RBAC rules grant.
//! - [`containerd`]: a private containerd + runc that imports our images and runs them under a
//!   Kubernetes-like security context.
//! - [`control_plane`]: etcd + kube-apiserver as processes, with our CRDs installed.
//! - [`dhcp_client`]: real DHCP clients (dhclient, udhcpc) and their recorded events.
//! - [`dhcp6_client`]: real DHCPv6 clients (`dhclient -6`, dhcpcd) and their recorded events, and
//!   the reference servers they are checked against (`kea-dhcp6`, `radvd`).
//! - [`fleet`]: the whole system (controller, agents, VMs) on one machine.
//! - [`hostile`]: hostile hosts on a VM network (forged DECLINEs with ARP floods, a host
//!   answering every ARP request) and what an attack cost a real client.
//! - [`http`]: plain GETs of local endpoints.
//! - [`image_clients`]: the DHCP clients cloud images run (systemd-networkd), in VM namespaces.
//! - [`node`]: a real single-node Kubernetes cluster (kubelet, containerd, kube-proxy, …) that
//!   runs the Helm chart's pods, with a Multus stand-in (`src/bin/vmdhcp-multus-standin.rs`).
//! - [`netns`]: network namespaces, veth pairs and bridges, cleaned up on every exit path.
//! - [`otlp`]: a real OTLP/gRPC trace receiver, keeping the spans it is sent.
//! - [`pools`]: many NADs and IPPools at once, for the tests and benchmarks at size.
//! - [`ports`]: free loopback ports for the processes the tests start.
//! - [`prometheus`]: a real Prometheus scraping the processes a test started, evaluating the
//!   chart's alert rules, read back through its HTTP API.
//! - [`process`]: child processes that cannot outlive the test process, and the sockets one
//!   holds.
//! - [`secure_controller`]: the controller serving its config stream and admission webhook over
//!   TLS, the webhook registered with the API server.
//! - [`static_agent`]: the agent's `serve-static` in a network lab, with VM namespaces, other
//!   hosts on a shared bridge and hand-built DHCP messages.
//! - [`tls`]: TLS client handshakes verified against the controller's published CA.
//!
//! The tests themselves live in `tests/`; each test binary shares one control plane.
#![forbid(unsafe_code)]

pub mod audit;
pub mod containerd;
pub mod control_plane;
pub mod dhcp6_client;
pub mod dhcp_client;
pub mod fleet;
pub mod hostile;
pub mod hostile6;
pub mod http;
pub mod image_clients;
pub mod netns;
pub mod node;
pub mod otlp;
pub mod pools;
pub mod ports;
pub mod process;
pub mod prometheus;
pub mod secure_controller;
pub mod static_agent;
pub mod tls;
