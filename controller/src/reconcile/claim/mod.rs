//! The AddressClaim reconciler (leader only): holds each claim's addresses in its pool's books,
//! on the MAC of the NIC it is bound to now, or on its placeholder while nothing is.
//!
//! A claim is checked against its pool's `spec.claims` (the namespace admitted, the quota, ranked
//! by creation so the newest are the ones past it), its holder decided (a MAC; the MAC of its
//! VM's NIC while the VM has it; else [`placeholder_mac`]), and its addresses put on the holder
//! in the pool's lock ([`hold_claim`]), recorded in the pool's status **before** the claim's
//! status says so, as every allocation. The config reconciler gives a claim-bound NIC the
//! claim's address and never frees it ([`claim_holding`]); when the VM goes, the claim's
//! reconcile (woken by the VM) moves the address back to the placeholder (`Retain`), or the
//! garbage collector deletes the claim with its VM (`Delete`: the VM owns it) and the finalizer
//! frees the address.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::finalizer::{Event as Finalizer, finalizer};
use kube::{Resource, ResourceExt};
use serde_json::json;
use tracing::{info, warn};
use vmdhcp_core::claims::{self, ClaimRequest, Target, placeholder_mac};
use vmdhcp_core::crd::{
    AddressClaim, CONDITION_BOUND, CONDITION_RESERVED, ClaimPhase, IPPool, ReclaimPolicy,
};
use vmdhcp_core::{MacAddr, NamespacedName};

use crate::ipam::{IpamError, hold_claim};
use crate::kinds::{VirtualMachine, object_ref, store_key};
use crate::reconcile::context::{CLAIM_FINALIZER, Context, NotLeader};
use crate::reconcile::status::{StatusError, Wanted};
use crate::reconcile::vm::multus_nics;

/// Why an AddressClaim reconcile failed (retried with per-object backoff).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An API call failed.
    #[error("{action}: {source}")]
    Kube {
        /// What was being done.
        action: String,
        /// The API error.
        source: kube::Error,
    },
    /// Recording the pool's status failed.
    #[error(transparent)]
    Status(#[from] StatusError),
    /// Leadership was lost.
    #[error(transparent)]
    NotLeader(#[from] NotLeader),
    /// Adding or removing the finalizer failed.
    #[error("finalizer: {0}")]
    Finalizer(#[source] Box<kube::runtime::finalizer::Error<Error>>),
    /// The object has no namespace.
    #[error("AddressClaim without namespace")]
    Unnamespaced,
    /// The pool's books are gone (paused or deleted meanwhile).
    #[error(transparent)]
    Ipam(#[from] IpamError),
    /// Another writer recorded the claim's address for another MAC first.
    #[error("{ip} on IPPool {pool} was recorded for another MAC first")]
    Withdrawn {
        /// The pool.
        pool: NamespacedName,
        /// The address.
        ip: IpAddr,
    },
}

/// How soon a claim whose pool's books are being built looks again, if the pool's change does
/// not wake it first.
const POOL_WAIT: Duration = Duration::from_secs(5);

/// Reconciles one AddressClaim.
pub async fn reconcile(claim: Arc<AddressClaim>, ctx: Arc<Context>) -> Result<Action, Error> {
    ctx.ensure_leader()?;
    let ns = claim.namespace().ok_or(Error::Unnamespaced)?;
    let api: Api<AddressClaim> = Api::namespaced(ctx.client.clone(), &ns);
    finalizer(&api, CLAIM_FINALIZER, claim, |event| async {
        match event {
            Finalizer::Apply(c) => apply(c, ctx.clone()).await,
            Finalizer::Cleanup(c) => cleanup(c, ctx.clone()).await,
        }
    })
    .await
    .map_err(|e| Error::Finalizer(Box::new(e)))
}

/// What a claim's status should say.
struct Outcome {
    pool: Option<NamespacedName>,
    ip: Option<Ipv4Addr>,
    ipv6: Option<Ipv6Addr>,
    holder: Option<MacAddr>,
    phase: ClaimPhase,
    conditions: Vec<Wanted>,
}

impl Outcome {
    /// Refused for `reason`: nothing held.
    fn refused(pool: Option<NamespacedName>, reason: &'static str, message: String) -> Self {
        Outcome {
            pool,
            ip: None,
            ipv6: None,
            holder: None,
            phase: ClaimPhase::Refused,
            conditions: vec![
                Wanted::new(CONDITION_RESERVED, false).because(reason, message),
                Wanted::new(CONDITION_BOUND, false),
            ],
        }
    }
}

async fn apply(claim: Arc<AddressClaim>, ctx: Arc<Context>) -> Result<Action, Error> {
    let ns = claim.namespace().ok_or(Error::Unnamespaced)?;
    let key = NamespacedName::new(&ns, &claim.name_any()).map_err(|_| Error::Unnamespaced)?;
    let request = match ClaimRequest::parse(&claim.spec, &ns) {
        Ok(r) => r,
        Err(e) => {
            let out = Outcome::refused(None, "Invalid", e.to_string());
            return finish(&ctx, &claim, &key, out).await;
        }
    };
    let Some(pool) = ctx.pool_for_network(&request.network) else {
        let message = format!("no IPPool serves network {}", request.network);
        // Woken by a pool naming the network.
        return finish(
            &ctx,
            &claim,
            &key,
            Outcome::refused(None, "NoPool", message),
        )
        .await;
    };
    let Some(pool_ref) = object_ref(pool.as_ref()) else {
        return Ok(Action::await_change());
    };
    if pool.spec.paused == Some(true) {
        // A paused pool keeps its record and has no books: the claim keeps what it says.
        return Ok(Action::await_change());
    }
    if !ctx.books.ipam.contains(&pool_ref) {
        return Ok(Action::requeue(POOL_WAIT));
    }
    if let Err(e) = admitted(&ctx, &claim, &request, &pool, &pool_ref).await? {
        ctx.books.claim_holders.forget(&key);
        let out = Outcome::refused(Some(pool_ref.clone()), e.0, e.1);
        let held = release_held(&ctx, &claim, &pool_ref)?;
        if held {
            persist(&ctx, &pool_ref).await?;
        }
        return finish(&ctx, &claim, &key, out).await;
    }
    let placeholder = placeholder_mac(claim.uid().as_deref().unwrap_or_default());
    let (holder, bound_vm) = match &request.target {
        Target::Mac(mac) => (*mac, None),
        Target::Nic { vm, nic } => match vm_nic(&ctx, &ns, vm, nic, &request.network) {
            Some((mac, vm)) => (mac, Some(vm)),
            None => (placeholder, None),
        },
        Target::Nothing => (placeholder, None),
    };
    if request.reclaim == ReclaimPolicy::Delete
        && let Some(vm) = &bound_vm
    {
        own_by(&ctx, &claim, vm).await?;
    }
    let status = claim.status.clone().unwrap_or_default();
    let mut previous = vec![placeholder];
    previous.extend(
        status
            .mac_address
            .as_deref()
            .and_then(|m| m.parse::<MacAddr>().ok())
            .filter(|m| *m != placeholder),
    );
    let recorded = (
        status.ip_address.as_deref().and_then(|s| s.parse().ok()),
        status.ipv6_address.as_deref().and_then(|s| s.parse().ok()),
    );
    // Addresses NICs ask for statically are not given to a claim asking for no address.
    let avoid = |ip: IpAddr| {
        ctx.stores
            .config_index
            .requested_by_another(&request.network, ip, &key, placeholder)
    };
    let held = ctx.books.ipam.with_books(&pool_ref, |b| {
        if let Err(e) = within_quota(&ctx, &key, &pool, &pool_ref) {
            return Err(("QuotaExceeded", e.to_string()));
        }
        let before = b.clone();
        let v4 = hold_claim(
            &mut b.v4,
            holder,
            &previous,
            (request.ip, recorded.0),
            &avoid,
        )
        .map_err(|e| ("AddressUnavailable", e.to_string()))?;
        // (An IPv6 address asked of a pool without IPv6 was refused by `admitted`.)
        let v6 =
            b.v6.as_mut()
                .map(|a| hold_claim(a, holder, &previous, (request.ipv6, recorded.1), &avoid));
        match v6.transpose() {
            Ok(v6) => {
                // Under the pool's lock, so the next claim's quota counts this one.
                ctx.books.claim_holders.set(&pool_ref, holder, &key);
                Ok((v4, v6))
            }
            Err(e) => {
                // Both families or neither.
                *b = before;
                Err(("AddressUnavailable", e.to_string()))
            }
        }
    })?;
    let (ip, ipv6) = match held {
        Ok(ips) => ips,
        Err((reason, message)) => {
            let out = Outcome::refused(Some(pool_ref.clone()), reason, message);
            return finish(&ctx, &claim, &key, out).await;
        }
    };
    persist(&ctx, &pool_ref).await?;
    still_held(&ctx, &pool_ref, holder, ip.into())?;
    if let Some(v6) = ipv6 {
        still_held(&ctx, &pool_ref, holder, v6.into())?;
    }
    let bound = holder != placeholder;
    let reserved = Wanted::new(CONDITION_RESERVED, true)
        .because("Reserved", format!("held in IPPool {pool_ref}'s status"));
    let binding = if bound {
        Wanted::new(CONDITION_BOUND, true).because("Bound", format!("served to {holder}"))
    } else {
        let why = match &request.target {
            Target::Nic { vm, nic } => format!(
                "VirtualMachine {vm} has no NIC {nic} on {} now",
                request.network
            ),
            _ => "bound to nothing (a VIP): served to nobody".to_owned(),
        };
        Wanted::new(CONDITION_BOUND, false).because("Unbound", why)
    };
    let out = Outcome {
        pool: Some(pool_ref),
        ip: Some(ip),
        ipv6,
        holder: Some(holder),
        phase: if bound {
            ClaimPhase::Bound
        } else {
            ClaimPhase::Reserved
        },
        conditions: vec![reserved, binding],
    };
    finish(&ctx, &claim, &key, out).await
}

/// Whether the pool admits the claim: its namespace, then its rank against the quota. The
/// refusal's reason and message.
async fn admitted(
    ctx: &Context,
    claim: &AddressClaim,
    request: &ClaimRequest,
    pool: &IPPool,
    pool_ref: &NamespacedName,
) -> Result<Result<(), (&'static str, String)>, Error> {
    let ns = claim.namespace().unwrap_or_default();
    let policy = pool.spec.claims.as_ref();
    let listed = policy.is_some_and(|p| p.namespaces.contains(&ns));
    let labels = match policy {
        Some(p) if !listed && p.namespace_selector.is_some() => namespace_labels(ctx, &ns).await?,
        _ => BTreeMap::new(),
    };
    if let Err(e) = claims::admits(pool_ref, policy, &ns, &labels) {
        return Ok(Err(("NotAdmitted", e.to_string())));
    }
    if let (Some(ip), None) = (request.ipv6, pool.spec.ipv6_config.as_ref()) {
        let e = claims::ClaimError::NoIpv6 {
            ip,
            pool: pool_ref.clone(),
        };
        return Ok(Err(("NoIPv6", e.to_string())));
    }
    Ok(Ok(()))
}

/// Whether claim `me` fits its namespace's quota on `pool`: a claim that holds its addresses
/// keeps them; another is admitted while fewer than the quota of the namespace's claims hold
/// some, counted from this term's books ([`ClaimHolders`], under the pool's lock, so two
/// claims reconciled at once cannot both take the last place) and from the claims' status (what
/// earlier terms recorded).
///
/// [`ClaimHolders`]: crate::ipam::ClaimHolders
fn within_quota(
    ctx: &Context,
    me: &NamespacedName,
    pool: &IPPool,
    pool_ref: &NamespacedName,
) -> Result<(), claims::ClaimError> {
    let quota = claims::quota_of(pool);
    if quota.ipv4.is_none() && quota.ipv6.is_none() {
        return Ok(());
    }
    let mut holding: BTreeSet<NamespacedName> = ctx
        .books
        .claim_holders
        .in_namespace(pool_ref, &me.namespace)
        .into_iter()
        .collect();
    let pool_text = pool_ref.to_string();
    holding.extend(
        ctx.stores
            .claims
            .state()
            .iter()
            .filter(|c| c.namespace().as_deref() == Some(me.namespace.as_str()))
            // A claim being deleted is giving its addresses back: the write that frees them is
            // what wakes the refused claims, before its finalizer lets it go.
            .filter(|c| c.metadata.deletion_timestamp.is_none())
            .filter(|c| {
                c.status.as_ref().is_some_and(|s| {
                    s.pool.as_deref() == Some(pool_text.as_str())
                        && s.ip_address.is_some()
                        && s.phase != Some(ClaimPhase::Refused)
                })
            })
            .filter_map(|c| NamespacedName::new(&me.namespace, &c.name_any()).ok()),
    );
    if holding.remove(me) {
        return Ok(());
    }
    claims::fits_quota(pool, pool_ref, &me.namespace, holding.len())
}

/// The labels of namespace `ns` (the selector of the pool's rule reads them).
async fn namespace_labels(ctx: &Context, ns: &str) -> Result<BTreeMap<String, String>, Error> {
    let api: Api<Namespace> = Api::all(ctx.client.clone());
    let namespace = api.get(ns).await.map_err(|source| Error::Kube {
        action: format!("reading namespace {ns}'s labels"),
        source,
    })?;
    Ok(namespace.metadata.labels.unwrap_or_default())
}

/// The MAC of NIC `nic` of VM `vm` in `ns`, when that NIC is on `network`, with the VM.
fn vm_nic(
    ctx: &Context,
    ns: &str,
    vm: &str,
    nic: &str,
    network: &NamespacedName,
) -> Option<(MacAddr, Arc<VirtualMachine>)> {
    let vm = ctx
        .stores
        .vms
        .get(&store_key(&NamespacedName::new(ns, vm).ok()?))?;
    if vm.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let mac = multus_nics(&vm)
        .into_iter()
        .find(|n| n.name == nic && n.network == *network)?
        .mac;
    Some((mac, vm))
}

/// Makes `vm` the claim's owner (`Delete`): the garbage collector deletes the claim with it.
async fn own_by(ctx: &Context, claim: &AddressClaim, vm: &VirtualMachine) -> Result<(), Error> {
    let Some(uid) = vm.uid() else {
        return Ok(());
    };
    let owned = claim.owner_references().iter().any(|o| o.uid == uid);
    if owned {
        return Ok(());
    }
    ctx.ensure_leader()?;
    let owner = OwnerReference {
        api_version: VirtualMachine::api_version(&()).into_owned(),
        kind: VirtualMachine::kind(&()).into_owned(),
        name: vm.name_any(),
        uid,
        block_owner_deletion: None,
        controller: None,
    };
    let mut owners = claim.owner_references().to_vec();
    owners.push(owner);
    let api: Api<AddressClaim> =
        Api::namespaced(ctx.client.clone(), &claim.namespace().unwrap_or_default());
    let patch = json!({"metadata": {"ownerReferences": owners, "resourceVersion": claim.resource_version()}});
    api.patch(
        &claim.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await
    .map_err(|source| Error::Kube {
        action: format!(
            "making VirtualMachine {} own claim {}",
            vm.name_any(),
            claim.name_any()
        ),
        source,
    })?;
    Ok(())
}

/// Gives back what the claim holds on `pool`, by its status and this term's books, except what a
/// NIC a config names holds; whether the books changed.
fn release_held(ctx: &Context, claim: &AddressClaim, pool: &NamespacedName) -> Result<bool, Error> {
    let placeholder = placeholder_mac(claim.uid().as_deref().unwrap_or_default());
    let status = claim.status.clone().unwrap_or_default();
    let holder = status
        .mac_address
        .as_deref()
        .and_then(|m| m.parse::<MacAddr>().ok());
    let v4: Option<Ipv4Addr> = status.ip_address.as_deref().and_then(|s| s.parse().ok());
    let v6: Option<Ipv6Addr> = status.ipv6_address.as_deref().and_then(|s| s.parse().ok());
    // A NIC a config names keeps the addresses it uses, as any NIC: taking them away would
    // leave a running VM to renew into a NAK (and a free address between its config's
    // release and its next allocation).
    let ns = claim.namespace().unwrap_or_default();
    let network = NamespacedName::parse_in(&claim.spec.network, &ns).ok();
    let nic_keeps = |m: MacAddr| {
        ctx.books.mac_owners.owner(pool, m).is_some()
            || network
                .as_ref()
                .is_some_and(|n| ctx.stores.config_index.claimed_by_any(n, m))
    };
    let holder = holder.filter(|h| *h == placeholder || !nic_keeps(*h));
    let ours = |m: Option<MacAddr>| m.is_some_and(|m| m == placeholder || Some(m) == holder);
    let changed = ctx.books.ipam.with_books(pool, |b| {
        let mut changed = b.v4.release_mac(&placeholder).is_some();
        if let Some(ip) = v4.filter(|ip| ours(b.v4.holder(*ip))) {
            changed |= b.v4.release(ip).ok().flatten().is_some();
        }
        if let Some(a) = b.v6.as_mut() {
            changed |= a.release_mac(&placeholder).is_some();
            if let Some(ip) = v6.filter(|ip| ours(a.holder(*ip))) {
                changed |= a.release(ip).ok().flatten().is_some();
            }
        }
        changed
    });
    match changed {
        Ok(c) => Ok(c),
        // No books: nothing held here (the pool is paused or gone).
        Err(IpamError::UnknownPool { .. }) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

async fn cleanup(claim: Arc<AddressClaim>, ctx: Arc<Context>) -> Result<Action, Error> {
    let ns = claim.namespace().ok_or(Error::Unnamespaced)?;
    let key = NamespacedName::new(&ns, &claim.name_any()).map_err(|_| Error::Unnamespaced)?;
    let pool = claim
        .status
        .as_ref()
        .and_then(|s| s.pool.as_deref())
        .and_then(|p| p.parse::<NamespacedName>().ok());
    if let Some(pool) = pool {
        if !ctx.books.ipam.contains(&pool)
            && ctx
                .stores
                .pools
                .get(&store_key::<IPPool>(&pool))
                .is_some_and(|p| p.spec.paused != Some(true))
        {
            // Its books are being built: the address cannot be given back yet.
            return Ok(Action::requeue(POOL_WAIT));
        }
        if release_held(&ctx, &claim, &pool)? {
            ctx.books.claim_holders.forget(&key);
            persist(&ctx, &pool).await?;
            let addresses = [
                claim.status.as_ref().and_then(|s| s.ip_address.clone()),
                claim.status.as_ref().and_then(|s| s.ipv6_address.clone()),
            ];
            let addresses: Vec<String> = addresses.into_iter().flatten().collect();
            info!(claim = %key, pool = %pool, addresses = %addresses.join(","), "claim deleted: addresses freed");
            ctx.event(
                claim.as_ref(),
                EventType::Normal,
                "Released",
                "Release",
                format!("{} freed in IPPool {pool}", addresses.join(", ")),
            );
        }
    }
    ctx.books.claim_holders.forget(&key);
    ctx.signals.metrics.forget_claim(&key);
    Ok(Action::await_change())
}

async fn persist(ctx: &Context, pool: &NamespacedName) -> Result<(), Error> {
    ctx.ensure_leader()?;
    let kept = ctx
        .books
        .writer
        .persist(&ctx.client, Some(&ctx.stores.pools), &ctx.books.ipam, pool)
        .await?;
    ctx.report_foreign(pool, &kept);
    Ok(())
}

/// Fails when the write found another writer had recorded the address first (and withdrew
/// ours): the claim is reconciled again.
fn still_held(ctx: &Context, pool: &NamespacedName, mac: MacAddr, ip: IpAddr) -> Result<(), Error> {
    let held = ctx.books.ipam.with_books(pool, |b| match ip {
        IpAddr::V4(v4) => b.v4.holder(v4),
        IpAddr::V6(v6) => b.v6.as_ref().and_then(|a| a.holder(v6)),
    })?;
    if held == Some(mac) {
        Ok(())
    } else {
        Err(Error::Withdrawn {
            pool: pool.clone(),
            ip,
        })
    }
}

/// Writes the claim's status when it changed, with an event for each change of phase.
async fn finish(
    ctx: &Context,
    claim: &AddressClaim,
    key: &NamespacedName,
    out: Outcome,
) -> Result<Action, Error> {
    ctx.ensure_leader()?;
    let before = claim.status.clone().unwrap_or_default();
    let mut conditions = before.conditions.clone();
    for wanted in &out.conditions {
        wanted.apply(&mut conditions);
    }
    let text = |v: Option<String>| v.map_or(serde_json::Value::Null, serde_json::Value::from);
    let status = json!({"status": {
        "pool": text(out.pool.as_ref().map(ToString::to_string)),
        "ipAddress": text(out.ip.map(|i| i.to_string())),
        "ipv6Address": text(out.ipv6.map(|i| i.to_string())),
        "macAddress": text(out.holder.map(|m| m.to_string())),
        "phase": out.phase,
        "conditions": conditions,
    }});
    let same = before.pool == out.pool.as_ref().map(ToString::to_string)
        && before.ip_address == out.ip.map(|i| i.to_string())
        && before.ipv6_address == out.ipv6.map(|i| i.to_string())
        && before.mac_address == out.holder.map(|m| m.to_string())
        && before.phase == Some(out.phase)
        && before.conditions == conditions;
    let quota = out
        .pool
        .as_ref()
        .and_then(|p| ctx.stores.pools.get(&store_key::<IPPool>(p)))
        .map(|p| claims::quota_of(&p))
        .unwrap_or_default();
    ctx.signals
        .metrics
        .set_claim(key, out.pool.as_ref(), &format!("{:?}", out.phase), quota);
    if same {
        return Ok(Action::await_change());
    }
    let api: Api<AddressClaim> = Api::namespaced(ctx.client.clone(), &key.namespace);
    api.patch_status(&key.name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .map_err(|source| Error::Kube {
            action: format!("writing status of claim {key}"),
            source,
        })?;
    let changed_phase =
        before.phase != Some(out.phase) || before.mac_address != out.holder.map(|m| m.to_string());
    if changed_phase {
        announce(ctx, claim, &out);
    }
    Ok(Action::await_change())
}

/// The event of a claim's new phase, on the claim (and on its VM when bound to one).
fn announce(ctx: &Context, claim: &AddressClaim, out: &Outcome) {
    let addresses: Vec<String> = out
        .ip
        .map(|i| i.to_string())
        .into_iter()
        .chain(out.ipv6.map(|i| i.to_string()))
        .collect();
    let addresses = addresses.join(", ");
    match out.phase {
        ClaimPhase::Bound => {
            let holder = out.holder.map(|m| m.to_string()).unwrap_or_default();
            let note = format!("{addresses} bound to {holder}");
            ctx.event(claim, EventType::Normal, "Bound", "Bind", note.clone());
            let ns = claim.namespace().unwrap_or_default();
            if let Some(vm) = claim
                .spec
                .vm
                .as_deref()
                .and_then(|vm| NamespacedName::new(&ns, vm).ok())
                .and_then(|vm| ctx.stores.vms.get(&store_key(&vm)))
            {
                let note = format!("{note} by AddressClaim {}", claim.name_any());
                ctx.event(vm.as_ref(), EventType::Normal, "Bound", "Bind", note);
            }
        }
        ClaimPhase::Reserved => {
            let note = format!(
                "{addresses} held for nobody in IPPool {}",
                out.pool
                    .as_ref()
                    .map(ToString::to_string)
                    .unwrap_or_default()
            );
            ctx.event(claim, EventType::Normal, "Reserved", "Reserve", note);
        }
        ClaimPhase::Refused => {
            let why = out
                .conditions
                .first()
                .map(|c| c.message.clone())
                .unwrap_or_default();
            warn!(claim = %claim.name_any(), reason = %why, "address claim refused");
            ctx.event(claim, EventType::Warning, "Refused", "Reserve", why);
        }
    }
}

/// The claim whose addresses `mac` holds on `pool`, if any: this term's books say so, or a
/// claim's status does (written by an earlier term). A config never frees such an address, and
/// the pool's sweep of unnamed entries passes it over.
pub fn claim_holding(ctx: &Context, pool: &NamespacedName, mac: MacAddr) -> Option<NamespacedName> {
    if let Some(claim) = ctx.books.claim_holders.claim_of(pool, mac) {
        return Some(claim);
    }
    let (pool_text, mac_text) = (pool.to_string(), mac.to_string());
    ctx.stores.claims.state().iter().find_map(|c| {
        let s = c.status.as_ref()?;
        (s.pool.as_deref() == Some(pool_text.as_str())
            && s.mac_address.as_deref() == Some(mac_text.as_str()))
        .then(|| NamespacedName::new(&c.namespace().unwrap_or_default(), &c.name_any()).ok())
        .flatten()
    })
}

/// A claim that binds the NIC `mac` of VM `vm` (in `ns`) on `network` but does not hold it for
/// that MAC yet: the NIC waits for it rather than take a dynamic address it would give back.
pub fn claim_waiting_for(
    ctx: &Context,
    ns: &str,
    vm: &str,
    network: &NamespacedName,
    mac: MacAddr,
) -> Option<NamespacedName> {
    let mac_text = mac.to_string();
    ctx.stores.claims.state().iter().find_map(|c| {
        if c.namespace().as_deref() != Some(ns) || c.metadata.deletion_timestamp.is_some() {
            return None;
        }
        let request = ClaimRequest::parse(&c.spec, ns).ok()?;
        if request.network != *network {
            return None;
        }
        let targets = match &request.target {
            Target::Mac(m) => *m == mac,
            Target::Nic { vm: v, nic } => {
                v == vm && vm_nic(ctx, ns, v, nic, network).is_some_and(|(m, _)| m == mac)
            }
            Target::Nothing => false,
        };
        let refused = c.status.as_ref().and_then(|s| s.phase) == Some(ClaimPhase::Refused);
        let holds =
            c.status.as_ref().and_then(|s| s.mac_address.as_deref()) == Some(mac_text.as_str());
        (targets && !refused && !holds)
            .then(|| NamespacedName::new(ns, &c.name_any()).ok())
            .flatten()
    })
}
