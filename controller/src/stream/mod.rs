//! The gRPC config stream agents read: [`config_service`] serves the [`crate::index`] as a
//! snapshot then deltas and takes agents' reports in; [`auth`] decides who may read it, from the
//! caller's token read by [`jwt`] and checked against [`keys`], the cluster's token signing keys.
//!
//! This is the only place that speaks `vmdhcp.agent.v1`: requests are translated into the
//! controller's own types ([`crate::reports::AgentReport`]) here, at the edge.

pub mod auth;
pub mod config_service;
pub mod jwt;
pub mod keys;
