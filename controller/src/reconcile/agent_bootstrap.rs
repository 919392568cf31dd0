//! Writes the agent Deployment's bootstrap (leader only): the Multus network-selection
//! annotation of its pod template and the `AGENT_NETWORK_CONFIGS` / `IPPOOL_REFS_JSON` env of the
//! agent container, from the pools the index serves.
//!
//! Interface names are stable per pool, so adding a pool appends to the annotation without
//! renaming the others. The Deployment is patched only when the rendered bootstrap differs from
//! what it already carries: an unchanged set of pools writes nothing (a write rolls the agents).
//! A missing Deployment is reported on every served pool: an event here, and `AgentReady=False`
//! by the pool's own reconcile, which this writer wakes whenever the Deployment goes or comes
//! back. One writer per condition: a second one racing the pool reconcile could have its
//! condition overwritten by a reconcile that read the flag just before it changed.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::events::EventType;
use kube::runtime::watcher::{self, watcher};
use serde_json::json;
use tokio::sync::watch;
use tracing::{info, warn};
use vmdhcp_core::NamespacedName;
use vmdhcp_core::bootstrap::{
    Bootstrap, ENV_AGENT_NETWORK_CONFIGS, ENV_IPPOOL_REFS_JSON, MULTUS_NETWORKS_ANNOTATION,
};

use crate::index::{Index, PoolFilter};
use crate::kinds::store_key;
use crate::reconcile::context::{AgentDeployment, Context};

/// What the Deployment carries now: (annotation, configs env, refs env).
fn current(
    deploy: &Deployment,
    container: &str,
) -> (Option<String>, Option<String>, Option<String>) {
    let template = deploy.spec.as_ref().map(|s| &s.template);
    // No annotation and an empty one both attach no network: a freshly installed Deployment
    // (none yet) is not patched, and its agents not rolled, while no pool is served.
    let annotation = Some(
        template
            .and_then(|t| t.metadata.as_ref())
            .and_then(|m| m.annotations.as_ref())
            .and_then(|a| a.get(MULTUS_NETWORKS_ANNOTATION).cloned())
            .unwrap_or_default(),
    );
    let env = template
        .and_then(|t| t.spec.as_ref())
        .and_then(|s| s.containers.iter().find(|c| c.name == container))
        .and_then(|c| c.env.clone())
        .unwrap_or_default();
    let var = |name: &str| {
        env.iter()
            .find(|e| e.name == name)
            .and_then(|e| e.value.clone())
    };
    (
        annotation,
        var(ENV_AGENT_NETWORK_CONFIGS),
        var(ENV_IPPOOL_REFS_JSON),
    )
}

/// The strategic-merge patch that sets the bootstrap (containers and env merge by name).
pub fn patch_for(bootstrap: &Bootstrap, container: &str) -> serde_json::Value {
    json!({"spec": {"template": {
        "metadata": {"annotations": {MULTUS_NETWORKS_ANNOTATION: bootstrap.render_multus_networks()}},
        "spec": {"containers": [{"name": container, "env": [
            {"name": ENV_AGENT_NETWORK_CONFIGS, "value": bootstrap.render_network_configs()},
            {"name": ENV_IPPOOL_REFS_JSON, "value": bootstrap.render_pool_refs()},
        ]}]}
    }}})
}

/// The agent Deployment as its watch last showed it: the loop compares against this instead of
/// reading the Deployment on every pool change.
#[derive(Debug, Default)]
enum Seen {
    /// The watch has not listed yet.
    #[default]
    Unknown,
    /// The list or a deletion said there is none.
    Missing,
    /// The latest version seen (or written by our own patch).
    Present(Box<Deployment>),
}

/// [`Seen`], kept from the watch's events; a relist replaces it only once complete.
#[derive(Debug, Default)]
struct Watched {
    seen: Seen,
    /// While a (re)list is under way: what it has shown so far.
    listing: Option<Option<Deployment>>,
}

impl Watched {
    fn apply(&mut self, event: watcher::Event<Deployment>) {
        match event {
            watcher::Event::Init => self.listing = Some(None),
            watcher::Event::InitApply(d) => self.listing = Some(Some(d)),
            watcher::Event::InitDone => {
                self.seen = match self.listing.take().flatten() {
                    Some(d) => Seen::Present(Box::new(d)),
                    None => Seen::Missing,
                }
            }
            watcher::Event::Apply(d) => self.seen = Seen::Present(Box::new(d)),
            watcher::Event::Delete(_) => self.seen = Seen::Missing,
        }
    }
}

/// Keeps the Deployment's bootstrap equal to the index's pools until `stop` turns true (it
/// returns between two writes, never in the middle of one) or the term is dropped.
///
/// It wakes on pool changes (not on lease changes: allocations never touch the bootstrap) and on
/// the Deployment's own changes (created at last, or its env reset by a `helm upgrade`), and
/// compares against the Deployment its watch last showed: the API is written only when they
/// differ, and never read per change.
pub async fn run(
    ctx: Arc<Context>,
    index: Arc<Index>,
    target: AgentDeployment,
    mut stop: watch::Receiver<bool>,
) {
    let api: Api<Deployment> = Api::namespaced(ctx.client.clone(), &target.deployment.namespace);
    let mut pool_changes = index.subscribe_pools();
    let mut deployment_changes = std::pin::pin!(
        watcher(
            api.clone(),
            watcher::Config::default().fields(&format!("metadata.name={}", target.deployment.name)),
        )
        .default_backoff()
    );
    let mut watched = Watched::default();
    // Pools told (condition + event) that the Deployment is missing, so each pool hears it once
    // per absence, including pools that start being served while it is still missing.
    let mut missing_reported: BTreeSet<NamespacedName> = BTreeSet::new();
    loop {
        let pools = index.pool_configs(&PoolFilter::all());
        let bootstrap = Bootstrap::from_pools(pools.iter());
        let desired = (
            Some(bootstrap.render_multus_networks()),
            Some(bootstrap.render_network_configs()),
            Some(bootstrap.render_pool_refs()),
        );
        let mut failed = false;
        match &watched.seen {
            Seen::Unknown => {}
            Seen::Present(deploy) => {
                missing_reported.clear();
                let was_missing = ctx
                    .agents
                    .deployment_missing
                    .swap(false, std::sync::atomic::Ordering::Relaxed);
                if was_missing {
                    ctx.agents
                        .reports
                        .recheck(pools.iter().map(|c| c.pool.clone()).collect());
                }
                if current(deploy, &target.container) == desired {
                    ctx.signals.metrics.bootstrap_checked("unchanged");
                } else if ctx.ensure_leader().is_ok() {
                    let patch = patch_for(&bootstrap, &target.container);
                    match api
                        .patch(
                            &target.deployment.name,
                            &PatchParams::default(),
                            &Patch::Strategic(&patch),
                        )
                        .await
                    {
                        Ok(written) => {
                            ctx.signals.metrics.bootstrap_checked("written");
                            info!(deployment = %target.deployment, pools = bootstrap.pool_refs.len(), "agent Deployment bootstrap updated");
                            // What the API now holds, until the watch shows a newer version.
                            watched.seen = Seen::Present(Box::new(written));
                        }
                        Err(e) => {
                            ctx.signals.metrics.bootstrap_checked("error");
                            warn!(deployment = %target.deployment, error = %e, "cannot update the agent Deployment; retrying");
                            failed = true;
                        }
                    }
                }
            }
            Seen::Missing => {
                ctx.signals.metrics.bootstrap_checked("missing");
                ctx.agents
                    .deployment_missing
                    .store(true, std::sync::atomic::Ordering::Relaxed);
                let unreported: Vec<NamespacedName> = pools
                    .iter()
                    .map(|c| c.pool.clone())
                    .filter(|p| !missing_reported.contains(p))
                    .collect();
                if !unreported.is_empty() {
                    report_missing(&ctx, &target, &unreported);
                    missing_reported.extend(unreported.iter().cloned());
                    // The flag is set: each reconcile from now on writes the condition.
                    ctx.agents.reports.recheck(unreported);
                }
            }
        }
        let retry = async {
            if failed {
                tokio::time::sleep(Duration::from_secs(5)).await
            } else {
                std::future::pending().await
            }
        };
        // On shutdown, stop here, between writes, never in the middle of one.
        tokio::select! {
            _ = pool_changes.changed() => {}
            event = deployment_changes.next() => match event {
                Some(Ok(event)) => watched.apply(event),
                // The watcher backs off and relists by itself; what it shows next is current.
                Some(Err(e)) => warn!(deployment = %target.deployment, error = %e, "watching the agent Deployment"),
                None => return,
            },
            () = retry => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

/// Tells each of `pools` (once per absence) that the agent Deployment is missing: a Warning
/// event. The condition is the pool reconcile's ([`Reports::recheck`] wakes it).
///
/// [`Reports::recheck`]: crate::reports::Reports::recheck
fn report_missing(ctx: &Context, target: &AgentDeployment, pools: &[NamespacedName]) {
    let message = format!(
        "agent Deployment {} not found; agents cannot be bootstrapped",
        target.deployment
    );
    warn!(deployment = %target.deployment, "agent Deployment not found");
    if ctx.ensure_leader().is_err() {
        return;
    }
    for pool in pools {
        if let Some(obj) = ctx.stores.pools.get(&store_key(pool)) {
            ctx.event(
                obj.as_ref(),
                EventType::Warning,
                "AgentDeploymentNotFound",
                "Bootstrap",
                message.clone(),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deployment(generation: i64) -> Deployment {
        let mut d = Deployment::default();
        d.metadata.generation = Some(generation);
        d
    }

    fn generation(w: &Watched) -> Option<i64> {
        match &w.seen {
            Seen::Present(d) => d.metadata.generation,
            _ => None,
        }
    }

    #[test]
    fn the_watched_deployment_follows_its_events_and_a_relist_only_once_complete() {
        let mut w = Watched::default();
        assert!(
            matches!(w.seen, Seen::Unknown),
            "nothing known before the first list"
        );
        w.apply(watcher::Event::Init);
        assert!(matches!(w.seen, Seen::Unknown));
        w.apply(watcher::Event::InitDone);
        assert!(matches!(w.seen, Seen::Missing), "listed and absent");
        w.apply(watcher::Event::Apply(deployment(1)));
        assert_eq!(generation(&w), Some(1));
        // A relist keeps showing the last version until it is complete.
        w.apply(watcher::Event::Init);
        w.apply(watcher::Event::InitApply(deployment(2)));
        assert_eq!(generation(&w), Some(1));
        w.apply(watcher::Event::InitDone);
        assert_eq!(generation(&w), Some(2));
        // A relist that no longer finds it: missing.
        w.apply(watcher::Event::Init);
        w.apply(watcher::Event::InitDone);
        assert!(matches!(w.seen, Seen::Missing));
        w.apply(watcher::Event::Apply(deployment(3)));
        w.apply(watcher::Event::Delete(deployment(3)));
        assert!(matches!(w.seen, Seen::Missing));
    }

    #[test]
    fn a_fresh_deployment_with_no_pools_needs_no_patch() {
        let fresh: Deployment =
            serde_json::from_value(json!({"spec": {"selector": {}, "template": {
                "spec": {"containers": [{"name": "agent", "env": [
                    {"name": ENV_AGENT_NETWORK_CONFIGS, "value": "[]"},
                    {"name": ENV_IPPOOL_REFS_JSON, "value": "[]"},
                ]}]}
            }}}))
            .unwrap();
        let none = Bootstrap::from_pools(std::iter::empty());
        assert_eq!(
            current(&fresh, "agent"),
            (
                Some(none.render_multus_networks()),
                Some(none.render_network_configs()),
                Some(none.render_pool_refs())
            )
        );
    }

    #[test]
    fn patch_sets_annotation_and_env_of_the_agent_container() {
        let b = Bootstrap::parse(
            Some(r#"[{"interfaceName":"vmd1","serverIP":"192.0.2.1","cidr":"192.0.2.0/24","ipPoolName":"ns/a","ipPoolRef":"ns/a","nadName":"ns/net-a"}]"#),
            Some(r#"["ns/a"]"#),
        )
        .unwrap();
        let p = patch_for(&b, "agent");
        assert_eq!(
            p["spec"]["template"]["metadata"]["annotations"][MULTUS_NETWORKS_ANNOTATION],
            "ns/net-a@vmd1"
        );
        let env = &p["spec"]["template"]["spec"]["containers"][0];
        assert_eq!(env["name"], "agent");
        assert_eq!(env["env"][1]["value"], r#"["ns/a"]"#);
        let deploy: Deployment = serde_json::from_value(
            json!({"spec": {"selector": {}, "template": p["spec"]["template"].clone()}}),
        )
        .unwrap();
        assert_eq!(
            current(&deploy, "agent"),
            (
                Some(b.render_multus_networks()),
                Some(b.render_network_configs()),
                Some(b.render_pool_refs())
            )
        );
    }
}
