//! Traces across the two processes: the controller and an agent export to a real OTLP/gRPC
//! receiver, and one trace follows a VM from its creation to the agent applying its lease —
//! VM reconcile → config reconcile → allocation → index revision → stream send → agent apply —
//! while each DHCP exchange is a span naming its message type, pool, MAC and result.
//! See [`vmdhcp_integration::fleet`] for the topology.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use serde_json::Value;
use vmdhcp_integration::dhcp_client::{try_http_get, udhcpc, wait_for};
use vmdhcp_integration::fleet::{NS, Options, metric, setup_with};
use vmdhcp_integration::otlp::{Receiver, Span};

const VM3_MAC: &str = "02:12:34:00:00:03";
const CONTROLLER: &str = "vm-dhcp-controller";
const AGENT: &str = "vm-dhcp-agent";

/// The one span in `spans` matching `pred`, once it has arrived.
fn find<'a>(spans: &'a [Span], what: &str, pred: impl Fn(&Span) -> bool) -> Option<&'a Span> {
    let found: Vec<&Span> = spans.iter().filter(|s| pred(s)).collect();
    assert!(found.len() <= 1, "more than one {what}: {found:#?}");
    found.first().copied()
}

fn child_of(child: &Span, parent: &Span) -> bool {
    child.trace_id == parent.trace_id && child.parent_span_id == parent.span_id
}

#[test]
fn one_trace_follows_a_vm_from_creation_to_the_agent_and_each_dhcp_exchange_is_a_span() {
    let otlp = Receiver::start();
    let mut fleet = setup_with(Options {
        otlp: Some(otlp.addr.port()),
        ..Options::default()
    });
    let ns0 = fleet.agent_netns(0);
    let agent = fleet.start_agent(&ns0, "agent-0");
    fleet.leader(&[&agent]);
    // The agent follows the stream before the VM exists, so its lease arrives as a delta.
    wait_for("the agent on the stream", Duration::from_secs(30), || {
        let r = fleet.readyz(&agent)?;
        (r["agent"]["source"] == "stream").then_some(())
    });

    let counter = |fleet: &vmdhcp_integration::fleet::Fleet, series: &str| {
        metric(&fleet.controller_metrics(), series).unwrap_or(0.0)
    };
    let allocations = |fleet: &vmdhcp_integration::fleet::Fleet| {
        counter(
            fleet,
            "vmdhcpcontroller_allocations_total{ippool=\"fleet/pool-a\",result=\"allocated\"}",
        )
    };
    let published = |fleet: &vmdhcp_integration::fleet::Fleet| {
        counter(fleet, "vmdhcpcontroller_events_total{result=\"published\"}")
    };
    let allocated_before = allocations(&fleet);
    let published_before = published(&fleet);
    fleet.apply_vm("vm3", VM3_MAC, "net-a");
    let ip = wait_for("vm3 allocated", Duration::from_secs(30), || {
        fleet.allocated().get(VM3_MAC).cloned()
    });
    wait_for("vm3's lease on the agent", Duration::from_secs(30), || {
        let (_, body) = try_http_get(&fleet.lab, &agent.ns, "http://127.0.0.1:8080/leases")?;
        let leases: Value = serde_json::from_str(body.trim()).ok()?;
        (leases[format!("{NS}/pool-a")][VM3_MAC]["ip"] == ip.as_str()).then_some(())
    });
    assert_eq!(
        allocations(&fleet),
        allocated_before + 1.0,
        "the allocation counter moved"
    );
    // Its `Allocated` event is published in the background, and counted.
    wait_for(
        "the allocation's event counted as published",
        Duration::from_secs(30),
        || (published(&fleet) > published_before).then_some(()),
    );
    let vm3 = fleet.vm("vm3", VM3_MAC);
    let dir = fleet.dir.path().join("vm3");
    std::fs::create_dir_all(&dir).unwrap();
    let out = udhcpc(&vm3, &dir, &[]);
    assert!(
        out.status.success(),
        "udhcpc: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    // The whole chain, as the receiver got it from both processes (batches flush every few s).
    let object = format!("{NS}/vm3");
    let chain = wait_for(
        "the VM's trace at the receiver",
        Duration::from_secs(60),
        || {
            let spans = otlp.spans();
            let vm = find(&spans, "VM reconcile", |s| {
                s.service == CONTROLLER
                    && s.name == "reconcile"
                    && s.attr("kind") == "vm"
                    && s.attr("object") == object
                    && s.attr("outcome") == "ok"
                    && s.parent_span_id.is_empty()
            })?;
            let alloc = find(&spans, "allocation", |s| {
                s.name == "allocate" && s.attr("mac") == VM3_MAC && s.attr("result") == "allocated"
            })?;
            let cfg = spans.iter().find(|s| child_of(alloc, s))?;
            let publish = find(&spans, "index revision", |s| {
                s.name == "index.publish" && child_of(s, alloc)
            })?;
            let send = find(&spans, "stream send", |s| {
                s.name == "stream.send" && child_of(s, publish)
            })?;
            let apply = find(&spans, "agent apply", |s| {
                s.name == "apply" && child_of(s, send)
            })?;
            let dhcp: Vec<Span> = spans
                .iter()
                .filter(|s| s.name == "dhcp.transaction" && s.attr("mac") == VM3_MAC)
                .cloned()
                .collect();
            (dhcp.len() >= 2).then(|| {
                [vm, cfg, alloc, publish, send, apply]
                    .map(Clone::clone)
                    .into_iter()
                    .chain(dhcp)
                    .collect::<Vec<Span>>()
            })
        },
    );
    let [vm, cfg, alloc, publish, send, apply] = [0, 1, 2, 3, 4, 5].map(|i| &chain[i]);

    // VM created → config written and reconciled in the same trace.
    assert_eq!(cfg.service, CONTROLLER);
    assert_eq!(cfg.name, "reconcile", "{cfg:#?}");
    assert_eq!(cfg.attr("kind"), "vmnetcfg", "{cfg:#?}");
    assert_eq!(cfg.attr("object"), object, "{cfg:#?}");
    assert!(
        child_of(cfg, vm),
        "config reconcile continues the VM's: {cfg:#?} {vm:#?}"
    );
    // → allocated: pool, MAC and the address the pool's status records.
    assert_eq!(alloc.attr("pool"), format!("{NS}/pool-a"), "{alloc:#?}");
    assert_eq!(alloc.attr("ip"), ip, "{alloc:#?}");
    // → published in an index revision, streamed to the agent as a delta of that revision.
    assert!(
        publish.attr("leases").parse::<u64>().unwrap() >= 1,
        "{publish:#?}"
    );
    assert_eq!(send.service, CONTROLLER);
    assert_eq!(send.attr("kind"), "delta", "{send:#?}");
    assert_eq!(send.attr("revision"), publish.attr("revision"), "{send:#?}");
    // → applied by the agent, in the other process, as a child of the send.
    assert_eq!(apply.service, AGENT, "{apply:#?}");
    assert_eq!(apply.attr("kind"), "delta", "{apply:#?}");
    assert_eq!(apply.attr("revision"), send.attr("revision"), "{apply:#?}");
    assert_eq!(apply.attr("outcome"), "applied", "{apply:#?}");
    assert!(
        [cfg, alloc, publish, send, apply]
            .iter()
            .all(|s| s.trace_id == vm.trace_id),
        "one trace from VM to agent"
    );

    // Each DHCP exchange of the VM's client: message type, pool, MAC and result.
    let exchanges: Vec<(&str, &str)> = chain[6..]
        .iter()
        .map(|s| (s.attr("message_type"), s.attr("result")))
        .collect();
    assert!(exchanges.contains(&("Discover", "Offer")), "{exchanges:?}");
    assert!(exchanges.contains(&("Request", "Ack")), "{exchanges:?}");
    for s in &chain[6..] {
        assert_eq!(s.service, AGENT, "{s:#?}");
        assert_eq!(s.attr("pool"), format!("{NS}/pool-a"), "{s:#?}");
        assert_eq!(s.attr("interface"), fleet.interface, "{s:#?}");
        assert!(
            s.parent_span_id.is_empty(),
            "an exchange is a trace of its own: {s:#?}"
        );
    }
    // Library spans (kube-runtime's own per-reconcile span) are not exported.
    assert!(
        otlp.spans().iter().all(|s| s.name != "reconciling object"),
        "only vmdhcp's spans are exported"
    );
}
