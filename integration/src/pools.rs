//! Many networks and pools at once, for the tests and benchmarks that measure the controller at
//! size: `count` NetworkAttachmentDefinitions `net-<p>` and IPPools `pool-<p>` on them, a /24
//! each (`10.<base + p / 256>.<p % 256>.0/24`, server `.1`, range `.2`–`.254`); dual-stack
//! pools ([`create_with`]) add `fd00:<base>:<p>::/112`, server `::1`, range `::2`–`::ffff`.

use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, PostParams};
use serde_json::json;
use vmdhcp_core::crd::{IPPool, find_condition};

/// How many objects are created at once.
const WAVE: usize = 50;

/// Creates the NADs and IPv4-only pools in namespace `ns`, in waves of 50 requests at once.
pub async fn create(client: &Client, ns: &str, count: usize, base: u8) -> Result<(), kube::Error> {
    create_with(client, ns, count, base, |_| false).await
}

/// [`create`], the pools for which `dual(p)` holds dual-stack.
pub async fn create_with(
    client: &Client,
    ns: &str,
    count: usize,
    base: u8,
    dual: impl Fn(usize) -> bool,
) -> Result<(), kube::Error> {
    let nad_ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("k8s.cni.cncf.io", "v1", "NetworkAttachmentDefinition"),
        "network-attachment-definitions",
    );
    let nads: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &nad_ar);
    let pools: Api<IPPool> = Api::namespaced(client.clone(), ns);
    let all: Vec<usize> = (0..count).collect();
    for wave in all.chunks(WAVE) {
        let creates = wave.iter().map(|p| {
            let (nads, pools) = (nads.clone(), pools.clone());
            let dual = dual(*p);
            async move {
                let nad = json!({"apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition", "metadata": {"name": format!("net-{p}")}, "spec": {"config": "{}"}});
                nads.create(&PostParams::default(), &serde_json::from_value(nad).map_err(kube::Error::SerdeError)?)
                    .await?;
                let (a, b) = (usize::from(base) + p / 256, p % 256);
                let mut pool = json!({
                    "apiVersion": "network.harvesterhci.io/v1alpha1", "kind": "IPPool", "metadata": {"name": format!("pool-{p}")},
                    "spec": {"networkName": format!("{ns}/net-{p}"), "ipv4Config": {"serverIP": format!("10.{a}.{b}.1"), "cidr": format!("10.{a}.{b}.0/24"), "pool": {"start": format!("10.{a}.{b}.2"), "end": format!("10.{a}.{b}.254")}}}
                });
                if dual {
                    pool["spec"]["ipv6Config"] = json!({"serverIP": format!("fd00:{base:x}:{p:x}::1"), "cidr": format!("fd00:{base:x}:{p:x}::/112"), "pool": {"start": format!("fd00:{base:x}:{p:x}::2"), "end": format!("fd00:{base:x}:{p:x}::ffff")}});
                }
                pools
                    .create(&PostParams::default(), &serde_json::from_value(pool).map_err(kube::Error::SerdeError)?)
                    .await?;
                Ok::<_, kube::Error>(())
            }
        });
        for result in futures_util::future::join_all(creates).await {
            result?;
        }
    }
    Ok(())
}

/// Whether every pool in `ns` says `CacheReady=True` (the controller rebuilt its IPAM and
/// allocates from it).
pub async fn all_ready(client: &Client, ns: &str) -> bool {
    let Ok(list) = Api::<IPPool>::namespaced(client.clone(), ns)
        .list(&Default::default())
        .await
    else {
        return false;
    };
    list.items.iter().all(|p| {
        p.status.as_ref().is_some_and(|s| {
            find_condition(&s.conditions, "CacheReady").is_some_and(|c| c.status == "True")
        })
    })
}
