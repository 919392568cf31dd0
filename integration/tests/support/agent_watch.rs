//! A config-stream Watch request as a test agent sends one: the suites that open Watches by
//! hand (a probe, a flood's agents) build it here, so they all speak as the same agent would.
//! Shared by path (`#[path = …] mod agent_watch;`).

use vmdhcp_agent::credentials::{Credentials, CredentialsError};
use vmdhcp_proto::agent::v1 as pb;

/// A Watch from the agent pod `pod` in `namespace`, from the start (no epoch), for every pool,
/// with `credentials`' token.
pub fn watch_request(
    credentials: &Credentials,
    namespace: &str,
    pod: &str,
) -> Result<tonic::Request<pb::WatchRequest>, CredentialsError> {
    let mut request = tonic::Request::new(pb::WatchRequest {
        agent: Some(pb::AgentIdentity {
            pod_name: pod.into(),
            namespace: namespace.into(),
            node_name: String::new(),
        }),
        ..Default::default()
    });
    credentials.authorize(&mut request)?;
    Ok(request)
}
