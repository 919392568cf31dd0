//! Taking a pool over from upstream's Go controller without a gap: that controller ran one bare
//! agent pod per IPPool (named in `status.agentPodRef`, labelled
//! `network.harvesterhci.io/vm-dhcp-controller=agent`), which keeps answering DHCP after our
//! chart is installed. Once our agent reports the pool as served (`AgentReady=True`), and never
//! before, that pod is deleted and `agentPodRef` cleared, with an event. A pod that does not
//! carry upstream's agent labels for this very pool (or whose UID differs from the reference)
//! is never deleted: the stale reference is cleared and the pod left alone, with a warning.
//! Allocations in the status the Go controller wrote are untouched (IPAM replays them).

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Preconditions};
use kube::runtime::events::EventType;
use tracing::{info, warn};
use vmdhcp_core::NamespacedName;
use vmdhcp_core::crd::{IPPool, LABEL_IPPOOL_NAME, LABEL_IPPOOL_NAMESPACE, PodReference};

use crate::reconcile::context::{Context, NotLeader};
use crate::reconcile::status::{StatusError, update_pool_status};

/// The label upstream puts on its agent pods.
pub const LABEL_UPSTREAM_AGENT: &str = "network.harvesterhci.io/vm-dhcp-controller";

/// Why retiring an upstream agent failed (retried with the pool's reconcile).
#[derive(Debug, thiserror::Error)]
pub enum UpstreamAgentError {
    /// Reading or deleting the pod failed.
    #[error("{action}: {source}")]
    Kube {
        /// What was being done.
        action: String,
        /// The API error.
        source: kube::Error,
    },
    /// Clearing `agentPodRef` failed.
    #[error(transparent)]
    Status(#[from] StatusError),
    /// Leadership was lost.
    #[error(transparent)]
    NotLeader(#[from] NotLeader),
}

/// What to do with the pod `status.agentPodRef` names.
#[derive(Debug, PartialEq, Eq)]
pub enum Decision {
    /// Upstream's agent for this pool: delete it (only if its UID is still this one).
    Delete {
        /// The pod's UID, a precondition of the delete.
        uid: String,
    },
    /// No such pod any more: only the reference goes.
    Gone,
    /// Not upstream's agent for this pool: the reference goes, the pod stays.
    LeaveAlone(String),
}

/// Decides, without I/O, what the reference `reference` of `pool` allows doing to `pod`.
pub fn decide(pool: &NamespacedName, reference: &PodReference, pod: Option<&Pod>) -> Decision {
    let Some(pod) = pod else {
        return Decision::Gone;
    };
    let labels = pod.labels();
    let uid = pod.uid().unwrap_or_default();
    if labels.get(LABEL_UPSTREAM_AGENT).map(String::as_str) != Some("agent") {
        return Decision::LeaveAlone(format!("it has no label {LABEL_UPSTREAM_AGENT}=agent"));
    }
    if labels.get(LABEL_IPPOOL_NAMESPACE) != Some(&pool.namespace)
        || labels.get(LABEL_IPPOOL_NAME) != Some(&pool.name)
    {
        return Decision::LeaveAlone(format!("its ippool labels do not name {pool}"));
    }
    if let Some(want) = reference.uid.as_deref().filter(|u| !u.is_empty())
        && want != uid
    {
        return Decision::LeaveAlone(format!("its UID is {uid}, the reference says {want}"));
    }
    if pod.metadata.deletion_timestamp.is_some() {
        return Decision::Gone;
    }
    Decision::Delete { uid }
}

/// Retires upstream's agent of `pool`, which our agent now serves: deletes the pod the pool's
/// `agentPodRef` names (if it is upstream's agent for this pool), then clears the reference.
/// Does nothing when there is no reference.
pub async fn retire(
    ctx: &Context,
    pool: &IPPool,
    pool_ref: &NamespacedName,
) -> Result<(), UpstreamAgentError> {
    let Some(reference) = pool.status.as_ref().and_then(|s| s.agent_pod_ref.clone()) else {
        return Ok(());
    };
    let namespace = reference
        .namespace
        .clone()
        .unwrap_or_else(|| pool_ref.namespace.clone());
    let name = reference.name.clone().unwrap_or_default();
    let decision = if name.is_empty() {
        Decision::Gone
    } else {
        let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &namespace);
        let pod = pods
            .get_opt(&name)
            .await
            .map_err(|source| UpstreamAgentError::Kube {
                action: format!("reading upstream agent pod {namespace}/{name}"),
                source,
            })?;
        decide(pool_ref, &reference, pod.as_ref())
    };
    let (event_type, reason, note) = match decision {
        Decision::Delete { uid } => {
            ctx.ensure_leader()?;
            let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &namespace);
            let params = DeleteParams {
                preconditions: Some(Preconditions {
                    uid: Some(uid),
                    resource_version: None,
                }),
                ..DeleteParams::default()
            };
            match pods.delete(&name, &params).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.is_not_found() => {}
                Err(source) => {
                    return Err(UpstreamAgentError::Kube {
                        action: format!("deleting upstream agent pod {namespace}/{name}"),
                        source,
                    });
                }
            }
            info!(pool = %pool_ref, pod = %format!("{namespace}/{name}"), "upstream agent retired; our agent serves the pool");
            (
                EventType::Normal,
                "UpstreamAgentRetired",
                format!(
                    "deleted upstream's agent pod {namespace}/{name}: the pool is served by vm-dhcp-agent"
                ),
            )
        }
        Decision::Gone => (
            EventType::Normal,
            "UpstreamAgentRetired",
            format!("upstream's agent pod {namespace}/{name} is gone; reference cleared"),
        ),
        Decision::LeaveAlone(why) => {
            warn!(pool = %pool_ref, pod = %format!("{namespace}/{name}"), %why, "agentPodRef names a pod that is not upstream's agent; left alone");
            (
                EventType::Warning,
                "AgentPodRefNotUpstreamAgent",
                format!("agentPodRef {namespace}/{name} left alone ({why}); reference cleared"),
            )
        }
    };
    ctx.ensure_leader()?;
    update_pool_status(&ctx.client, Some(&ctx.stores.pools), pool_ref, |s| {
        s.agent_pod_ref = None;
        Ok(())
    })
    .await?;
    ctx.event(pool, event_type, reason, "Upgrade", note);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(labels: serde_json::Value, uid: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "default-net-48-agent", "namespace": "harvester-system", "uid": uid, "labels": labels}
        }))
        .unwrap()
    }

    fn reference(uid: Option<&str>) -> PodReference {
        PodReference {
            namespace: Some("harvester-system".into()),
            name: Some("default-net-48-agent".into()),
            image: Some("rancher/harvester-vm-dhcp-agent:v0.3.3".into()),
            uid: uid.map(Into::into),
        }
    }

    #[test]
    fn only_upstreams_agent_of_this_pool_is_deleted() {
        let pool = NamespacedName::new("default", "net-48").unwrap();
        let agent = json!({LABEL_UPSTREAM_AGENT: "agent", LABEL_IPPOOL_NAMESPACE: "default", LABEL_IPPOOL_NAME: "net-48"});
        let cases: Vec<(&str, Option<Pod>, Option<&str>, bool)> = vec![
            (
                "upstream agent, UID matches",
                Some(pod(agent.clone(), "u1")),
                Some("u1"),
                true,
            ),
            (
                "upstream agent, no UID in the reference",
                Some(pod(agent.clone(), "u1")),
                None,
                true,
            ),
            (
                "upstream agent, another UID",
                Some(pod(agent.clone(), "u2")),
                Some("u1"),
                false,
            ),
            (
                "no agent label",
                Some(pod(
                    json!({LABEL_IPPOOL_NAMESPACE: "default", LABEL_IPPOOL_NAME: "net-48"}),
                    "u1",
                )),
                Some("u1"),
                false,
            ),
            (
                "another pool's agent",
                Some(pod(
                    json!({LABEL_UPSTREAM_AGENT: "agent", LABEL_IPPOOL_NAMESPACE: "default", LABEL_IPPOOL_NAME: "net-49"}),
                    "u1",
                )),
                Some("u1"),
                false,
            ),
            (
                "label with another value",
                Some(pod(
                    json!({LABEL_UPSTREAM_AGENT: "controller", LABEL_IPPOOL_NAMESPACE: "default", LABEL_IPPOOL_NAME: "net-48"}),
                    "u1",
                )),
                Some("u1"),
                false,
            ),
        ];
        for (what, p, uid, deleted) in cases {
            let d = decide(&pool, &reference(uid), p.as_ref());
            assert_eq!(
                matches!(d, Decision::Delete { .. }),
                deleted,
                "{what}: {d:?}"
            );
        }
        assert_eq!(decide(&pool, &reference(Some("u1")), None), Decision::Gone);
    }
}
