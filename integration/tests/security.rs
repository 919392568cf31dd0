//! The controller's security through the real kube-apiserver, with one `vm-dhcp-controller`
//! process (TLS, token authentication, admission webhook, serving certificates renewed every
//! few seconds) shared by the tests:
//! - the admission webhook, registered by URL with no caBundle: the controller injects its CA,
//!   then every rule is exercised by creating, updating and deleting objects through the API;
//! - the config stream refuses plaintext, a foreign CA, no token, a token for another audience
//!   and another ServiceAccount's token, and serves the agent's token;
//! - the serving certificate is renewed in the Secret and the new one is what clients get, under
//!   the same CA;
//! - tens of thousands of distinct forged tokens on one connection cost at most the TokenReview
//!   budget, and neither the agent nor an allocation's latency suffers from them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use vmdhcp_agent::credentials::Credentials;
use vmdhcp_core::crd::{AddressClaim, IPPool, VirtualMachineNetworkConfig};
use vmdhcp_integration::control_plane::ControlPlane;
use vmdhcp_integration::ports::free_port;
use vmdhcp_integration::process::{Supervised, cpu_seconds, workspace_binary};
use vmdhcp_proto::agent::v1 as pb;
use vmdhcp_proto::agent::v1::config_service_client::ConfigServiceClient;

#[path = "support/agent_watch.rs"]
mod agent_watch;
use agent_watch::watch_request;

/// The controller's namespace (Secret, ConfigMap, ServiceAccounts).
const NS: &str = "vmdhcp-system";
const WEBHOOK: &str = "vmdhcp-test";
const SECRET: &str = "vmdhcp-tls";
const CA_CONFIGMAP: &str = "vmdhcp-ca";
const AUDIENCE: &str = "vm-dhcp-controller";
/// Namespaces carrying this label are under the webhook.
const WEBHOOK_LABEL: &str = "vmdhcp.io/webhook-test";
/// Serving certificates live this long, so the suite sees renewals.
const CERT_SECONDS: u64 = 9;
/// The controller's TokenReview budget: a sustained rate a second and a burst.
const REVIEW_RATE: u32 = 5;
const REVIEW_BURST: u32 = 20;

/// Held by every test of this suite, so they run one at a time: the flood test spends the
/// controller's whole review budget (a caller refused meanwhile, UNAVAILABLE, would fail another
/// test), and it compares an allocation's latency during the flood with an idle one, which
/// another test's load would skew.
static ALONE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

struct Shared {
    controller: Supervised,
    grpc: u16,
    http: u16,
    dir: PathBuf,
}

fn kubectl(args: &[&str]) -> String {
    vmdhcp_integration::control_plane::run(ControlPlane::shared().kubectl().args(args)).unwrap()
}

fn poll<T>(what: &str, limit: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Starts the controller once: webhook configurations registered by URL, then the process.
fn shared() -> &'static Shared {
    static SHARED: OnceLock<Shared> = OnceLock::new();
    SHARED.get_or_init(|| {
        let cp = ControlPlane::shared();
        let webhook_port = free_port();
        let grpc = free_port();
        let http = free_port();
        let manifest = json!({"apiVersion": "v1", "kind": "List", "items": [
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}},
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "agent", "namespace": NS}},
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "intruder", "namespace": NS}},
            webhook_config("MutatingWebhookConfiguration", "mutate", webhook_port, &["CREATE"], false),
            webhook_config("ValidatingWebhookConfiguration", "validate", webhook_port, &["CREATE", "UPDATE", "DELETE"], true),
        ]});
        cp.kubectl_stdin(&["apply", "-f", "-"], &manifest.to_string())
            .unwrap();
        let dir = cp.dir().join("security");
        std::fs::create_dir_all(&dir).unwrap();
        let args: Vec<String> = vec![
            "run".into(),
            format!("--kubeconfig={}", cp.kubeconfig().display()),
            "--identity=secure-0".into(),
            format!("--grpc-listen=127.0.0.1:{grpc}"),
            format!("--http-listen=127.0.0.1:{http}"),
            format!("--webhook-listen=127.0.0.1:{webhook_port}"),
            "--no-leader-election".into(),
            format!("--leader-election-namespace={NS}"),
            format!("--tls-secret={SECRET}"),
            "--service-name=vmdhcp-controller".into(),
            "--tls-san=127.0.0.1".into(),
            format!("--ca-configmap={CA_CONFIGMAP}"),
            format!("--webhook-name={WEBHOOK}"),
            format!("--cert-validity-seconds={CERT_SECONDS}"),
            format!("--token-audience={AUDIENCE}"),
            format!("--agent-service-account={NS}:agent"),
            format!("--token-review-rate-per-second={REVIEW_RATE}"),
            format!("--token-review-burst={REVIEW_BURST}"),
            "--service-cidr=10.53.0.0/16".into(),
        ];
        let bin = workspace_binary("vmdhcp-controller", "vm-dhcp-controller");
        let controller = Supervised::spawn(&bin, &args, &dir.join("controller.log"), None).unwrap();
        // The controller injects its CA into both configurations.
        for kind in ["mutatingwebhookconfiguration", "validatingwebhookconfiguration"] {
            poll(&format!("caBundle in {kind}"), Duration::from_secs(60), || {
                let out = kubectl(&["get", kind, WEBHOOK, "-o", "jsonpath={.webhooks[0].clientConfig.caBundle}"]);
                (!out.trim().is_empty()).then_some(())
            });
        }
        Shared {
            controller,
            grpc,
            http,
            dir,
        }
    })
}

fn webhook_config(kind: &str, path: &str, port: u16, ops: &[&str], validating: bool) -> Value {
    let mut rules = vec![json!({
        "apiGroups": ["network.harvesterhci.io"], "apiVersions": ["v1alpha1"],
        "resources": ["ippools"], "operations": ops, "scope": "Namespaced"})];
    if validating {
        rules.push(json!({
            "apiGroups": ["network.harvesterhci.io"], "apiVersions": ["v1alpha1"],
            "resources": ["virtualmachinenetworkconfigs"], "operations": ["CREATE", "UPDATE"],
            "scope": "Namespaced"}));
        rules.push(json!({
            "apiGroups": ["ipam.vmdhcp.io"], "apiVersions": ["v1alpha1"],
            "resources": ["addressclaims"], "operations": ["CREATE", "UPDATE"],
            "scope": "Namespaced"}));
    }
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": kind,
        "metadata": {"name": WEBHOOK},
        "webhooks": [{
            "name": format!("{path}.vmdhcp.network.harvesterhci.io"),
            "admissionReviewVersions": ["v1"], "sideEffects": "None", "failurePolicy": "Fail",
            "timeoutSeconds": 10,
            "clientConfig": {"url": format!("https://127.0.0.1:{port}/{path}")},
            "namespaceSelector": {"matchLabels": {WEBHOOK_LABEL: "on"}},
            "rules": rules,
        }]
    })
}

async fn test_namespace(client: &Client, prefix: &str, under_webhook: bool) -> String {
    let ns = ControlPlane::shared()
        .namespace(client, prefix)
        .await
        .unwrap();
    if under_webhook {
        kubectl(&["label", "namespace", &ns, &format!("{WEBHOOK_LABEL}=on")]);
    }
    ns
}

fn nad_api(client: &Client, ns: &str) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("k8s.cni.cncf.io", "v1", "NetworkAttachmentDefinition"),
        "network-attachment-definitions",
    );
    Api::namespaced_with(client.clone(), ns, &ar)
}

async fn create_nad(client: &Client, ns: &str, name: &str, pool: Option<&str>) {
    let mut labels = serde_json::Map::new();
    if let Some(pool) = pool {
        labels.insert("network.harvesterhci.io/ippool-namespace".into(), ns.into());
        labels.insert("network.harvesterhci.io/ippool-name".into(), pool.into());
    }
    let nad: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
        "metadata": {"name": name, "namespace": ns, "labels": labels},
        "spec": {"config": "{\"cniVersion\":\"0.3.1\",\"type\":\"bridge\"}"}
    }))
    .unwrap();
    nad_api(client, ns)
        .create(&PostParams::default(), &nad)
        .await
        .unwrap();
}

fn dynamic<K: kube::Resource<DynamicType = ()>>(client: &Client, ns: &str) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), ns, &ApiResource::erase::<K>(&()))
}

/// Creates an object from JSON; `Err` is the API server's message.
async fn create(api: &Api<DynamicObject>, obj: Value) -> Result<DynamicObject, String> {
    let obj: DynamicObject = serde_json::from_value(obj).unwrap();
    api.create(&PostParams::default(), &obj)
        .await
        .map_err(|e| e.to_string())
}

fn pool(ns: &str, name: &str, network: &str, ipv4: Value) -> Value {
    json!({
        "apiVersion": "network.harvesterhci.io/v1alpha1", "kind": "IPPool",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"networkName": format!("{ns}/{network}"), "ipv4Config": ipv4}
    })
}

fn config(ns: &str, name: &str, nics: Value) -> Value {
    json!({
        "apiVersion": "network.harvesterhci.io/v1alpha1", "kind": "VirtualMachineNetworkConfig",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"vmName": name, "networkConfigs": nics}
    })
}

fn base_ipv4() -> Value {
    json!({"cidr": "10.70.0.0/24", "serverIP": "10.70.0.2", "router": "10.70.0.1",
           "pool": {"start": "10.70.0.10", "end": "10.70.0.100", "exclude": ["10.70.0.50"]}})
}

fn with(mut base: Value, pointer: &str, value: Value) -> Value {
    let (parent, key) = pointer.rsplit_once('/').unwrap();
    base.pointer_mut(parent)
        .unwrap()
        .as_object_mut()
        .unwrap()
        .insert(key.to_owned(), value);
    base
}

/// Reads `name`, applies `change` and replaces it, again after a write conflict (the controller
/// writes the same objects); `Err` is the API server's message for any other refusal.
async fn update<K>(api: &Api<K>, name: &str, change: impl Fn(&mut K)) -> Result<K, String>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    for _ in 0..50 {
        let mut obj = api.get(name).await.map_err(|e| e.to_string())?;
        change(&mut obj);
        match api.replace(name, &PostParams::default(), &obj).await {
            Err(kube::Error::Api(status)) if status.code == 409 => continue,
            other => return other.map_err(|e| e.to_string()),
        }
    }
    Err(format!("{name}: conflicting writes never stopped"))
}

#[track_caller]
fn assert_denied(result: Result<DynamicObject, String>, needles: &[&str]) {
    let message = match result {
        Ok(o) => panic!(
            "accepted {}, expected a denial with {needles:?}",
            o.name_any()
        ),
        Err(m) => m,
    };
    assert!(
        message.contains("denied the request"),
        "not a webhook denial: {message}"
    );
    for needle in needles {
        assert!(message.contains(needle), "{needle:?} not in {message:?}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_webhook_defaults_and_enforces_every_ippool_rule() {
    let _alone = ALONE.lock().await;
    let _shared = tokio::task::spawn_blocking(shared).await.unwrap();
    let client = ControlPlane::shared().client().await.unwrap();
    let ns = test_namespace(&client, "webhook-pools", true).await;
    let pools = dynamic::<IPPool>(&client, &ns);
    create_nad(&client, &ns, "net-a", None).await;
    create_nad(&client, &ns, "net-b", None).await;
    create_nad(&client, &ns, "net-c", None).await;
    create_nad(&client, &ns, "net-d", None).await;
    create_nad(&client, &ns, "net-e", None).await;
    let reject = |name: &'static str, ipv4: Value| pool(&ns, name, "net-a", ipv4);
    // Dual-stack (experimental): a valid IPv6 side beside base_ipv4, and pools carrying one.
    let base_ipv6 = || {
        json!({"cidr": "fd00:70::/112", "serverIP": "fd00:70::2", "router": "fd00:70::1",
               "pool": {"start": "fd00:70::10", "end": "fd00:70::100", "exclude": ["fd00:70::50"]}})
    };
    let dual_on = |name: &str, network: &str, ipv6: Value| {
        let mut p = pool(&ns, name, network, base_ipv4());
        p["spec"]["ipv6Config"] = ipv6;
        p
    };
    let reject6 = |name: &str, ipv6: Value| dual_on(name, "net-a", ipv6);

    // Rejections (the accepted base pool below satisfies every one of these rules).
    let cases: Vec<(Value, Vec<&str>)> = vec![
        (
            pool(&ns, "no-nad", "missing", base_ipv4()),
            vec![
                "cannot create IPPool",
                "NetworkAttachmentDefinition",
                "not found",
            ],
        ),
        (
            reject(
                "svc",
                json!({"cidr": "10.53.7.0/24", "serverIP": "10.53.7.2", "pool": {"start": "10.53.7.10", "end": "10.53.7.20"}}),
            ),
            vec![
                "spec.ipv4Config.cidr",
                "overlaps cluster service cidr 10.53.0.0/16",
            ],
        ),
        (
            reject(
                "outside",
                with(base_ipv4(), "/pool/end", json!("10.70.1.5")),
            ),
            vec!["spec.ipv4Config.pool.end", "outside"],
        ),
        (
            reject(
                "network-addr",
                with(base_ipv4(), "/pool/start", json!("10.70.0.0")),
            ),
            vec!["spec.ipv4Config.pool.start", "network address"],
        ),
        (
            reject(
                "broadcast",
                with(base_ipv4(), "/pool/end", json!("10.70.0.255")),
            ),
            vec!["spec.ipv4Config.pool.end", "broadcast address"],
        ),
        (
            reject(
                "server-router",
                with(base_ipv4(), "/serverIP", json!("10.70.0.1")),
            ),
            vec!["spec.ipv4Config.serverIP", "router"],
        ),
        (
            reject(
                "reversed",
                with(
                    with(base_ipv4(), "/pool/start", json!("10.70.0.90")),
                    "/pool/end",
                    json!("10.70.0.20"),
                ),
            ),
            vec!["invalid pool range"],
        ),
        (
            reject(
                "exclude-out",
                with(base_ipv4(), "/pool/exclude", json!(["10.70.0.200"])),
            ),
            vec!["spec.ipv4Config.pool.exclude[0]", "outside pool range"],
        ),
        (
            reject(
                "router-excl",
                with(
                    with(base_ipv4(), "/router", json!("10.70.0.20")),
                    "/pool/exclude",
                    json!(["10.70.0.20"]),
                ),
            ),
            vec!["spec.ipv4Config.router", "excluded"],
        ),
        (
            reject(
                "server-excl",
                with(
                    with(base_ipv4(), "/serverIP", json!("10.70.0.50")),
                    "/pool/exclude",
                    json!(["10.70.0.50"]),
                ),
            ),
            vec!["spec.ipv4Config.serverIP", "excluded"],
        ),
        (
            reject(
                "ntp",
                with(base_ipv4(), "/ntp", json!(["pool.ntp.org", "bad_host!"])),
            ),
            vec!["spec.ipv4Config.ntp[1]"],
        ),
        (
            reject(
                "domain",
                with(base_ipv4(), "/domainName", json!("-bad-.example")),
            ),
            vec!["spec.ipv4Config.domainName"],
        ),
        (
            reject("lease", with(base_ipv4(), "/leaseTime", json!(-5))),
            vec!["spec.ipv4Config.leaseTime"],
        ),
    ];
    for (obj, needles) in cases {
        assert_denied(create(&pools, obj).await, &needles);
    }

    // Dual-stack rejections, each by the webhook (rules 1-6 of docs/dual-stack.md).
    let mut ipv6_only = reject6("v6-only", base_ipv6());
    ipv6_only["spec"]
        .as_object_mut()
        .unwrap()
        .remove("ipv4Config");
    let mut v4_v6cidr = dual_on("v4-v6cidr", "net-a", base_ipv6());
    v4_v6cidr["spec"]["ipv4Config"]["cidr"] = json!("fd00:70::/112");
    let cases: Vec<(Value, Vec<&str>)> = vec![
        // 1: at most 65 535 addresses.
        (
            reject6(
                "v6-range",
                with(
                    with(base_ipv6(), "/cidr", json!("fd00:70::/64")),
                    "/pool/end",
                    json!("fd00:70::1:10"),
                ),
            ),
            vec![
                "spec.ipv6Config.pool.end",
                "span 65537 addresses, at most 65535 are allowed",
            ],
        ),
        // 2: IPv4 first (refused by the mutator already).
        (
            ipv6_only,
            vec![
                "spec.ipv4Config",
                "is required with spec.ipv6Config",
                "IPv6-only pools are not supported",
            ],
        ),
        // 3: each family's fields hold its own addresses (the CRD's `format: cidr` takes both).
        (
            reject6(
                "v6-v4cidr",
                with(base_ipv6(), "/cidr", json!("10.70.0.0/24")),
            ),
            vec!["spec.ipv6Config.cidr", "is not an IPv6 CIDR"],
        ),
        (
            v4_v6cidr,
            vec!["spec.ipv4Config.cidr", "is not an IPv4 CIDR"],
        ),
        // 4: a /64 to /126 of unicast addresses.
        (
            reject6(
                "v6-prefix",
                with(base_ipv6(), "/cidr", json!("fd00:70::/48")),
            ),
            vec![
                "spec.ipv6Config.cidr",
                "has prefix length /48, it must be /64 to /126",
            ],
        ),
        (
            reject6(
                "v6-linklocal",
                json!({"cidr": "fe80::/64", "serverIP": "fe80::2", "pool": {"start": "fe80::10", "end": "fe80::20"}}),
            ),
            vec!["spec.ipv6Config.cidr", "is link-local"],
        ),
        // 5: inside the CIDR and the range, server apart from the router and not excluded.
        (
            reject6(
                "v6-server-out",
                with(base_ipv6(), "/serverIP", json!("fd00:71::2")),
            ),
            vec!["spec.ipv6Config.serverIP", "is outside cidr fd00:70::/112"],
        ),
        (
            reject6(
                "v6-excl-out",
                with(base_ipv6(), "/pool/exclude", json!(["fd00:70::200"])),
            ),
            vec!["spec.ipv6Config.pool.exclude[0]", "outside pool range"],
        ),
        (
            reject6(
                "v6-server-router",
                with(base_ipv6(), "/serverIP", json!("fd00:70::1")),
            ),
            vec![
                "spec.ipv6Config.serverIP",
                "must differ from spec.ipv6Config.router",
            ],
        ),
        (
            reject6(
                "v6-server-excl",
                with(
                    with(base_ipv6(), "/serverIP", json!("fd00:70::50")),
                    "/pool/exclude",
                    json!(["fd00:70::50"]),
                ),
            ),
            vec!["spec.ipv6Config.serverIP", "excluded"],
        ),
        (
            reject6(
                "v6-reversed",
                with(
                    with(base_ipv6(), "/pool/start", json!("fd00:70::90")),
                    "/pool/end",
                    json!("fd00:70::20"),
                ),
            ),
            vec!["spec.ipv6Config.pool.start", "invalid pool range"],
        ),
        // 6: not the subnet-router anycast address.
        (
            reject6(
                "v6-anycast",
                with(base_ipv6(), "/pool/start", json!("fd00:70::")),
            ),
            vec![
                "spec.ipv6Config.pool.start",
                "subnet-router anycast address",
            ],
        ),
    ];
    for (obj, needles) in cases {
        assert_denied(create(&pools, obj).await, &needles);
    }
    // IPv4 addresses in IPv6 address fields, and more than 3 DNS servers: the CRD's schema
    // (`format: ipv6`, `maxItems: 3`) refuses these before the webhook sees them (the webhook's
    // own refusals of them are unit-tested in vmdhcp-core's admission).
    for (obj, needle) in [
        (
            reject6(
                "v6-v4server",
                with(base_ipv6(), "/serverIP", json!("10.70.0.2")),
            ),
            "spec.ipv6Config.serverIP",
        ),
        (
            reject6(
                "v6-v4start",
                with(base_ipv6(), "/pool/start", json!("10.70.0.10")),
            ),
            "spec.ipv6Config.pool.start",
        ),
        (
            reject6(
                "v6-dns",
                with(
                    base_ipv6(),
                    "/dns",
                    json!(["fd00:70::53", "fd00:70::54", "fd00:70::55", "fd00:70::56"]),
                ),
            ),
            "spec.ipv6Config.dns",
        ),
    ] {
        let err = create(&pools, obj).await.unwrap_err();
        assert!(err.contains(needle), "{needle}: {err}");
    }

    // Harvester's example, as written, has its server at its router, which upstream's rule
    // refuses; ours (examples/ippool-dual-stack.yaml) moves the servers and is admitted.
    let mut hep = vmdhcp_core::fixtures::dual_stack_pool();
    hep.metadata.namespace = Some(ns.clone());
    hep.spec.network_name = format!("{ns}/net-e");
    hep.spec.ipv4_config.server_ip = "192.168.100.1".into();
    assert_denied(
        create(&pools, serde_json::to_value(&hep).unwrap()).await,
        &[
            "spec.ipv4Config.serverIP",
            "must differ from spec.ipv4Config.router",
        ],
    );
    hep.spec.ipv4_config.server_ip = "192.168.100.2".into();
    let admitted = create(&pools, serde_json::to_value(&hep).unwrap())
        .await
        .unwrap();
    assert_eq!(
        admitted.data["spec"]["ipv6Config"]["pool"]["end"],
        "fd00::fff0"
    );
    // A dual-stack pool to update below.
    create(&pools, dual_on("dual", "net-d", base_ipv6()))
        .await
        .unwrap();

    // Accepted: the base pool; then a second pool on the same network is refused.
    create(&pools, pool(&ns, "base", "net-a", base_ipv4()))
        .await
        .unwrap();
    assert_denied(
        create(
            &pools,
            pool(
                &ns,
                "second",
                "net-a",
                with(base_ipv4(), "/cidr", json!("10.70.0.0/24")),
            ),
        )
        .await,
        &["spec.networkName", "already served by IPPool", "/base"],
    );

    // Mutation: start, end and server IP default like upstream's.
    let defaulted = create(&pools, pool(&ns, "defaults", "net-b", json!({"cidr": "10.71.0.0/24", "router": "10.71.0.1", "serverIP": "", "pool": {"start": "", "end": ""}}))).await.unwrap();
    let ipv4 = &defaulted.data["spec"]["ipv4Config"];
    assert_eq!(ipv4["pool"]["start"], "10.71.0.1");
    assert_eq!(ipv4["pool"]["end"], "10.71.0.254");
    assert_eq!(
        ipv4["serverIP"], "10.71.0.2",
        "first address that is not the router"
    );
    // No server address left: refused at mutation.
    assert_denied(
        create(&pools, pool(&ns, "full", "net-c", json!({"cidr": "10.72.0.0/30", "router": "10.72.0.1", "serverIP": "", "pool": {"start": "10.72.0.1", "end": "10.72.0.2", "exclude": ["10.72.0.2"]}}))).await,
        &["fail to assign ip for dhcp server"],
    );

    // Updates: options are mutable, the rest is not (the 1.20 API server has no CEL).
    let typed: Api<IPPool> = Api::namespaced(client.clone(), &ns);
    update(&typed, "base", |p| {
        p.spec.ipv4_config.dns = vec!["10.70.0.53".into()];
        p.spec.ipv4_config.lease_time = Some(600);
    })
    .await
    .unwrap();
    for (field, change) in [
        (
            "spec.ipv4Config.cidr",
            Box::new(|p: &mut IPPool| p.spec.ipv4_config.cidr = "10.70.0.0/23".into())
                as Box<dyn Fn(&mut IPPool)>,
        ),
        (
            "spec.ipv4Config.serverIP",
            Box::new(|p: &mut IPPool| p.spec.ipv4_config.server_ip = "10.70.0.3".into()),
        ),
        (
            "spec.ipv4Config.pool.start",
            Box::new(|p: &mut IPPool| p.spec.ipv4_config.pool.start = "10.70.0.11".into()),
        ),
        (
            "spec.ipv4Config.pool.end",
            Box::new(|p: &mut IPPool| p.spec.ipv4_config.pool.end = "10.70.0.99".into()),
        ),
        (
            "spec.ipv4Config.pool.exclude",
            Box::new(|p: &mut IPPool| p.spec.ipv4_config.pool.exclude.clear()),
        ),
        (
            "spec.ipv4Config.router",
            Box::new(|p: &mut IPPool| p.spec.ipv4_config.router = None),
        ),
        (
            "spec.networkName",
            Box::new(|p: &mut IPPool| {
                p.spec.network_name = format!("{}/net-c", p.namespace().unwrap())
            }),
        ),
    ] {
        let err = update(&typed, "base", change).await.unwrap_err();
        assert!(
            err.contains("cannot update IPPool")
                && err.contains(field)
                && err.contains("immutable"),
            "{field}: {err}"
        );
    }
    // Excludes may be added where there were none.
    update(&typed, "defaults", |p| {
        p.spec.ipv4_config.pool.exclude = vec!["10.71.0.200".into()];
    })
    .await
    .unwrap();

    // Dual-stack updates (rule 7): the IPv6 options are mutable, its addressing is not, and an
    // ipv6Config may be added to a pool but never removed.
    update(&typed, "dual", |p| {
        let v6 = p.spec.ipv6_config.as_mut().unwrap();
        v6.dns = vec!["fd00:70::53".into()];
        v6.lease_time = Some(600);
    })
    .await
    .unwrap();
    type V6Change = Box<dyn Fn(&mut vmdhcp_core::crd::IPv6Config)>;
    for (field, change) in [
        (
            "spec.ipv6Config.cidr",
            Box::new(|v6: &mut vmdhcp_core::crd::IPv6Config| v6.cidr = "fd00:70::/111".into())
                as V6Change,
        ),
        (
            "spec.ipv6Config.serverIP",
            Box::new(|v6| v6.server_ip = "fd00:70::3".into()),
        ),
        (
            "spec.ipv6Config.pool.start",
            Box::new(|v6| v6.pool.start = "fd00:70::11".into()),
        ),
        (
            "spec.ipv6Config.pool.end",
            Box::new(|v6| v6.pool.end = "fd00:70::99".into()),
        ),
        (
            "spec.ipv6Config.pool.exclude",
            Box::new(|v6| v6.pool.exclude.clear()),
        ),
        ("spec.ipv6Config.router", Box::new(|v6| v6.router = None)),
    ] {
        let err = update(&typed, "dual", |p| {
            change(p.spec.ipv6_config.as_mut().unwrap())
        })
        .await
        .unwrap_err();
        assert!(
            err.contains("cannot update IPPool")
                && err.contains(field)
                && err.contains("immutable"),
            "{field}: {err}"
        );
    }
    let err = update(&typed, "dual", |p| p.spec.ipv6_config = None)
        .await
        .unwrap_err();
    assert!(
        err.contains("cannot update IPPool")
            && err.contains("spec.ipv6Config")
            && err.contains("cannot be removed once set"),
        "{err}"
    );
    // Added to an IPv4 pool: checked as on create.
    let err = update(&typed, "defaults", |p| {
        p.spec.ipv6_config = Some(
            serde_json::from_value(with(base_ipv6(), "/cidr", json!("fd00:70::/48"))).unwrap(),
        );
    })
    .await
    .unwrap_err();
    assert!(
        err.contains("spec.ipv6Config.cidr") && err.contains("/64 to /126"),
        "{err}"
    );
    update(&typed, "defaults", |p| {
        p.spec.ipv6_config = Some(serde_json::from_value(base_ipv6()).unwrap());
    })
    .await
    .unwrap();

    // Deletion: refused while a config uses the network (keyed by network, not by pool name).
    let configs = dynamic::<VirtualMachineNetworkConfig>(&client, &ns);
    kubectl(&[
        "label",
        "-n",
        &ns,
        "network-attachment-definitions.k8s.cni.cncf.io",
        "net-a",
        &format!("network.harvesterhci.io/ippool-namespace={ns}"),
        "network.harvesterhci.io/ippool-name=base",
        "--overwrite",
    ]);
    create(
        &configs,
        config(
            &ns,
            "user",
            json!([{"networkName": format!("{ns}/net-a"), "macAddress": "02:00:00:00:70:01"}]),
        ),
    )
    .await
    .unwrap();
    let err = typed
        .delete("base", &DeleteParams::default())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("cannot delete IPPool")
            && err.contains(&format!("{ns}/user"))
            && err.contains("must be removed at first"),
        "{err}"
    );
    configs
        .delete("user", &DeleteParams::default())
        .await
        .unwrap();
    poll_async("config gone", || {
        let configs = configs.clone();
        async move {
            configs
                .get_opt("user")
                .await
                .unwrap()
                .is_none()
                .then_some(())
        }
    })
    .await;
    typed
        .delete("base", &DeleteParams::default())
        .await
        .unwrap();
}

async fn poll_async<T, F, Fut>(what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_webhook_enforces_the_address_claim_rules() {
    let _alone = ALONE.lock().await;
    let _shared = tokio::task::spawn_blocking(shared).await.unwrap();
    let client = ControlPlane::shared().client().await.unwrap();
    let ns = test_namespace(&client, "webhook-claims", true).await;
    let stranger = test_namespace(&client, "webhook-claims-other", true).await;
    create_nad(&client, &ns, "net", Some("pool")).await;
    let mut open = pool(&ns, "pool", "net", base_ipv4());
    open["spec"]["claims"] = json!({"namespaces": [ns], "perNamespace": {"ipv4": 1}});
    create(&dynamic::<IPPool>(&client, &ns), open)
        .await
        .unwrap();
    let claim = |in_ns: &str, name: &str, spec: Value| {
        let mut spec = spec;
        spec["network"] = format!("{ns}/net").into();
        json!({"apiVersion": "ipam.vmdhcp.io/v1alpha1", "kind": "AddressClaim",
               "metadata": {"name": name, "namespace": in_ns}, "spec": spec})
    };
    let claims = |in_ns: &str| dynamic::<AddressClaim>(&client, in_ns);
    let refusals: Vec<(Value, &str, Vec<&str>)> = vec![
        (
            claim(&ns, "outside", json!({"ipAddress": "10.70.0.200"})),
            "outside",
            vec!["spec.ipAddress \"10.70.0.200\"", "is outside pool range"],
        ),
        (
            claim(&ns, "excluded", json!({"ipAddress": "10.70.0.50"})),
            "excluded",
            vec!["is excluded by IPPool"],
        ),
        (
            claim(&ns, "half", json!({"vm": "web"})),
            "half",
            vec!["spec.vm", "vm and nic are given together"],
        ),
        (
            claim(&stranger, "stranger", json!({})),
            "stranger",
            vec![
                "does not admit claims from namespace",
                "not in spec.claims.namespaces",
            ],
        ),
    ];
    for (obj, name, words) in refusals {
        let in_ns = obj["metadata"]["namespace"].as_str().unwrap().to_owned();
        let err = create(&claims(&in_ns), obj).await.unwrap_err();
        assert!(
            err.contains(&format!(
                "cannot create AddressClaim {in_ns}/{name} because"
            )),
            "{err}"
        );
        for w in words {
            assert!(err.contains(w), "{name}: {w:?} not in {err}");
        }
    }
    // Within the quota; then one past it.
    create(
        &claims(&ns),
        claim(&ns, "first", json!({"ipAddress": "10.70.0.20"})),
    )
    .await
    .unwrap();
    poll("the first claim held", Duration::from_secs(30), || {
        let out = kubectl(&[
            "get",
            "addressclaims.ipam.vmdhcp.io",
            "-n",
            &ns,
            "first",
            "-o",
            "jsonpath={.status.phase}",
        ]);
        (out.trim() == "Reserved").then_some(())
    });
    let err = create(&claims(&ns), claim(&ns, "second", json!({})))
        .await
        .unwrap_err();
    assert!(
        err.contains("its quota (spec.claims.perNamespace.ipv4) is 1"),
        "{err}"
    );
    // What a claim asks for is decided when it is made.
    let typed: Api<AddressClaim> = Api::namespaced(client.clone(), &ns);
    let err = update(&typed, "first", |c| {
        c.spec.ip_address = Some("10.70.0.21".into())
    })
    .await
    .unwrap_err();
    assert!(err.contains("spec.ipAddress"), "{err}");
    // A NIC asking statically for the claimed address is told whose it is.
    let err = create(
        &dynamic::<VirtualMachineNetworkConfig>(&client, &ns),
        config(&ns, "vm", json!([{"networkName": format!("{ns}/net"), "macAddress": "02:00:00:00:72:01", "ipAddress": "10.70.0.20"}])),
    )
    .await
    .unwrap_err();
    assert!(err.contains("is held by an AddressClaim"), "{err}");
    typed
        .delete("first", &DeleteParams::default())
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn the_webhook_enforces_every_vmnetcfg_rule() {
    let _alone = ALONE.lock().await;
    let _shared = tokio::task::spawn_blocking(shared).await.unwrap();
    let client = ControlPlane::shared().client().await.unwrap();
    let ns = test_namespace(&client, "webhook-configs", true).await;
    create_nad(&client, &ns, "net", Some("pool")).await;
    create_nad(&client, &ns, "unlabelled", None).await;
    create_nad(&client, &ns, "orphan", Some("no-such-pool")).await;
    // Dual-stack (experimental): pool6 on net6, its IPv6 server inside the range (reserved) and
    // no IPv6 router yet.
    create_nad(&client, &ns, "net6", Some("pool6")).await;
    let mut pool6 = pool(
        &ns,
        "pool6",
        "net6",
        with(base_ipv4(), "/serverIP", json!("10.70.0.30")),
    );
    pool6["spec"]["ipv6Config"] = json!({"cidr": "fd00:70::/112", "serverIP": "fd00:70::30",
        "pool": {"start": "fd00:70::10", "end": "fd00:70::100", "exclude": ["fd00:70::50"]}});
    create(&dynamic::<IPPool>(&client, &ns), pool6)
        .await
        .unwrap();
    create(
        &dynamic::<IPPool>(&client, &ns),
        pool(
            &ns,
            "pool",
            "net",
            with(base_ipv4(), "/serverIP", json!("10.70.0.30")),
        ),
    )
    .await
    .unwrap();
    let configs = dynamic::<VirtualMachineNetworkConfig>(&client, &ns);
    let net = format!("{ns}/net");
    let nic = |mac: &str, ip: Option<&str>| match ip {
        Some(ip) => json!({"networkName": net, "macAddress": mac, "ipAddress": ip}),
        None => json!({"networkName": net, "macAddress": mac}),
    };

    let cases: Vec<(Value, Vec<&str>)> = vec![
        (
            config(
                &ns,
                "no-nad",
                json!([{"networkName": format!("{ns}/missing"), "macAddress": "02:00:00:00:71:01"}]),
            ),
            vec![
                "cannot create VirtualMachineNetworkConfig",
                "spec.networkConfigs[0].networkName",
                "not found",
            ],
        ),
        (
            config(
                &ns,
                "no-labels",
                json!([{"networkName": format!("{ns}/unlabelled"), "macAddress": "02:00:00:00:71:01"}]),
            ),
            vec!["label network.harvesterhci.io/ippool-namespace not found"],
        ),
        (
            config(
                &ns,
                "no-pool",
                json!([{"networkName": format!("{ns}/orphan"), "macAddress": "02:00:00:00:71:01"}]),
            ),
            vec!["IPPool", "no-such-pool", "not found"],
        ),
        (
            config(&ns, "bad-mac", json!([nic("02:00:00:00:71", None)])),
            vec!["spec.networkConfigs[0].macAddress", "not a MAC address"],
        ),
        (
            config(
                &ns,
                "dup-mac",
                json!([nic("02:00:00:00:71:01", None), {"networkName": format!("{ns}/unlabelled"), "macAddress": "02:00:00:00:71:01"}]),
            ),
            vec!["spec.networkConfigs[1].macAddress", "duplicates"],
        ),
        (
            config(
                &ns,
                "ip-outside",
                json!([nic("02:00:00:00:71:01", Some("10.70.0.200"))]),
            ),
            vec!["spec.networkConfigs[0].ipAddress", "outside pool range"],
        ),
        (
            config(
                &ns,
                "ip-excluded",
                json!([nic("02:00:00:00:71:01", Some("10.70.0.50"))]),
            ),
            vec!["spec.networkConfigs[0].ipAddress", "excluded"],
        ),
        (
            config(
                &ns,
                "ip-server",
                json!([nic("02:00:00:00:71:01", Some("10.70.0.30"))]),
            ),
            vec!["spec.networkConfigs[0].ipAddress", "server ip"],
        ),
    ];
    for (obj, needles) in cases {
        assert_denied(create(&configs, obj).await, &needles);
    }

    // Dual-stack (rule 9): ipAddress stays IPv4 (the CRD no longer says so), ipv6Address is
    // IPv6, on a pool with an ipv6Config, in its range, neither its server nor excluded.
    let net6 = format!("{ns}/net6");
    let nic6 = |mac: &str, ip: Option<&str>, ipv6: &str| {
        let mut n = json!({"networkName": net6, "macAddress": mac, "ipv6Address": ipv6});
        if let Some(ip) = ip {
            n["ipAddress"] = json!(ip);
        }
        n
    };
    let cases: Vec<(Value, Vec<&str>)> = vec![
        (
            config(
                &ns,
                "ip-v6",
                json!([nic("02:00:00:00:71:01", Some("fd00:70::20"))]),
            ),
            vec!["spec.networkConfigs[0].ipAddress", "is not an IPv4 address"],
        ),
        (
            config(
                &ns,
                "ipv6-v4-pool",
                json!([{"networkName": net, "macAddress": "02:00:00:00:71:01", "ipv6Address": "fd00:70::20"}]),
            ),
            vec![
                "spec.networkConfigs[0].ipv6Address",
                "is not allowed",
                "has no spec.ipv6Config",
            ],
        ),
        (
            config(
                &ns,
                "ipv6-outside",
                json!([nic6("02:00:00:00:71:01", None, "fd00:70::200")]),
            ),
            vec!["spec.networkConfigs[0].ipv6Address", "outside pool range"],
        ),
        (
            config(
                &ns,
                "ipv6-excluded",
                json!([nic6("02:00:00:00:71:01", None, "fd00:70::50")]),
            ),
            vec!["spec.networkConfigs[0].ipv6Address", "excluded"],
        ),
        (
            config(
                &ns,
                "ipv6-server",
                json!([nic6("02:00:00:00:71:01", None, "fd00:70::30")]),
            ),
            vec!["spec.networkConfigs[0].ipv6Address", "server ip"],
        ),
        (
            config(
                &ns,
                "ipv6-anycast",
                json!([nic6("02:00:00:00:71:01", None, "fd00:70::")]),
            ),
            vec![
                "spec.networkConfigs[0].ipv6Address",
                "subnet-router anycast address",
            ],
        ),
        (
            config(
                &ns,
                "ipv6-dup",
                json!([
                    nic6("02:00:00:00:71:01", None, "fd00:70::20"),
                    {"networkName": net, "macAddress": "02:00:00:00:71:02", "ipv6Address": "fd00:70::20"}
                ]),
            ),
            vec!["spec.networkConfigs[1].ipv6Address", "duplicates"],
        ),
    ];
    for (obj, needles) in cases {
        assert_denied(create(&configs, obj).await, &needles);
    }
    // An IPv4 address in ipv6Address: the CRD's `format: ipv6` refuses it before the webhook
    // sees it (the webhook's own refusal is unit-tested in vmdhcp-core's admission).
    let err = create(
        &configs,
        config(
            &ns,
            "ipv6-v4",
            json!([nic6("02:00:00:00:71:01", None, "10.70.0.20")]),
        ),
    )
    .await
    .unwrap_err();
    assert!(err.contains("ipv6Address"), "{err}");

    // Accepted: both static addresses on the dual-stack pool; the controller allocates both.
    create(
        &configs,
        config(
            &ns,
            "vm6-a",
            json!([nic6("02:00:00:00:72:0a", Some("10.70.0.22"), "fd00:70::20")]),
        ),
    )
    .await
    .unwrap();
    let typed6: Api<IPPool> = Api::namespaced(client.clone(), &ns);
    poll_async("fd00:70::20 allocated", || {
        let typed6 = typed6.clone();
        async move {
            let p = typed6.get("pool6").await.ok()?;
            (p.status?.ipv6?.allocated.get("fd00:70::20")? == "02:00:00:00:72:0a").then_some(())
        }
    })
    .await;
    // The same IPv6 address for another MAC is refused.
    assert_denied(
        create(
            &configs,
            config(
                &ns,
                "vm6-b",
                json!([nic6("02:00:00:00:72:0b", None, "FD00:70::20")]),
            ),
        )
        .await,
        &["spec.networkConfigs[0].ipv6Address", "already"],
    );
    // Rule 8: a router added over an address a NIC holds is refused; elsewhere it is admitted
    // (and reserved).
    let err = update(&typed6, "pool6", |p| {
        p.spec.ipv6_config.as_mut().unwrap().router = Some("fd00:70::20".into());
    })
    .await
    .unwrap_err();
    assert!(
        err.contains("spec.ipv6Config.router")
            && err.contains("is already occupied by MAC 02:00:00:00:72:0a"),
        "{err}"
    );
    update(&typed6, "pool6", |p| {
        p.spec.ipv6_config.as_mut().unwrap().router = Some("fd00:70::21".into());
    })
    .await
    .unwrap();
    assert_denied(
        create(
            &configs,
            config(
                &ns,
                "vm6-c",
                json!([nic6("02:00:00:00:72:0c", None, "fd00:70::21")]),
            ),
        )
        .await,
        &["spec.networkConfigs[0].ipv6Address", "router"],
    );

    // Accepted: a static address in the pool; the controller allocates it.
    create(
        &configs,
        config(
            &ns,
            "vm-a",
            json!([nic("02:00:00:00:71:0a", Some("10.70.0.20"))]),
        ),
    )
    .await
    .unwrap();
    let typed: Api<IPPool> = Api::namespaced(client.clone(), &ns);
    poll_async("10.70.0.20 allocated", || {
        let typed = typed.clone();
        async move {
            let p = typed.get("pool").await.ok()?;
            (p.status?.ipv4?.allocated.get("10.70.0.20")? == "02:00:00:00:71:0a").then_some(())
        }
    })
    .await;
    // The same address for another MAC, and the same MAC in another config, are refused.
    assert_denied(
        create(
            &configs,
            config(
                &ns,
                "vm-b",
                json!([nic("02:00:00:00:71:0b", Some("10.70.0.20"))]),
            ),
        )
        .await,
        &["spec.networkConfigs[0].ipAddress", "already"],
    );
    assert_denied(
        create(
            &configs,
            config(&ns, "vm-c", json!([nic("02:00:00:00:71:0a", None)])),
        )
        .await,
        &[
            "spec.networkConfigs[0].macAddress",
            "already used on network",
            &format!("{ns}/vm-a"),
        ],
    );
    create(
        &configs,
        config(
            &ns,
            "vm-b",
            json!([nic("02:00:00:00:71:0b", Some("10.70.0.21"))]),
        ),
    )
    .await
    .unwrap();

    // Updates: vmName is immutable; NICs may change.
    let typed_cfg: Api<VirtualMachineNetworkConfig> = Api::namespaced(client.clone(), &ns);
    let err = update(&typed_cfg, "vm-a", |c| c.spec.vm_name = "renamed".into())
        .await
        .unwrap_err();
    assert!(
        err.contains("cannot update VirtualMachineNetworkConfig")
            && err.contains("spec.vmName")
            && err.contains("immutable"),
        "{err}"
    );
    update(&typed_cfg, "vm-a", |c| {
        c.spec.network_configs[0].mac_address = "02:00:00:00:71:0c".into();
        c.spec.network_configs[0].ip_address = None;
    })
    .await
    .unwrap();
}

/// A client of the config stream on the shared controller.
async fn stream_client(
    credentials: &Credentials,
    scheme: &str,
) -> Result<ConfigServiceClient<tonic::transport::Channel>, String> {
    let uri = format!("{scheme}://127.0.0.1:{}", shared().grpc);
    let channel = credentials
        .endpoint(&uri)
        .map_err(|e| e.to_string())?
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .map_err(|e| format!("connect: {e:?}"))?;
    Ok(ConfigServiceClient::new(channel))
}

/// What the controller answers while its TokenReview budget is spent (the flood test spends
/// it): a caller retries, as agents do.
const BUDGET_SPENT: &str = "too many new tokens to verify";

/// `call` again while it is refused for the review budget (at most 60 s), else its answer.
async fn past_the_budget<T, E: std::fmt::Debug>(
    mut call: impl AsyncFnMut() -> Result<T, E>,
) -> Result<T, E> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match call().await {
            Err(e) if format!("{e:?}").contains(BUDGET_SPENT) && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            other => return other,
        }
    }
}

/// The first message of a Watch, or the refusal (past the review budget).
async fn first_watch_message(
    credentials: &Credentials,
    scheme: &str,
) -> Result<pb::WatchResponse, String> {
    past_the_budget(async || first_watch_message_once(credentials, scheme).await).await
}

/// The first message of a Watch, or the refusal.
async fn first_watch_message_once(
    credentials: &Credentials,
    scheme: &str,
) -> Result<pb::WatchResponse, String> {
    let mut client = stream_client(credentials, scheme).await?;
    open_watch(&mut client, credentials, "probe")
        .await
        .map(|(first, _)| first)
}

/// A namespace outside the webhook's with a network `net` served by the IPPool `pool`.
async fn namespace_with_pool(client: &Client, prefix: &str) -> String {
    let ns = test_namespace(client, prefix, false).await;
    create_nad(client, &ns, "net", Some("pool")).await;
    create(
        &dynamic::<IPPool>(client, &ns),
        pool(&ns, "pool", "net", base_ipv4()),
    )
    .await
    .unwrap();
    ns
}

/// The controller's CA bundle once it is published, in a file for clients.
async fn ca_file(client: &Client) -> PathBuf {
    let ca_pem = poll_async("CA ConfigMap", || {
        let maps = Api::<ConfigMap>::namespaced(client.clone(), NS);
        async move {
            maps.get_opt(CA_CONFIGMAP)
                .await
                .ok()??
                .data?
                .get("ca.crt")
                .cloned()
        }
    })
    .await;
    let ca = shared().dir.join("ca.crt");
    std::fs::write(&ca, &ca_pem).unwrap();
    ca
}

fn token(account: &str, audience: Option<&str>) -> String {
    let mut args = vec!["create", "token", account, "-n", NS];
    if let Some(a) = audience {
        args.extend(["--audience", a]);
    }
    kubectl(&args).trim().to_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_config_stream_serves_only_the_agent_service_account_over_tls() {
    let shared = tokio::task::spawn_blocking(shared).await.unwrap();
    let _alone = ALONE.lock().await;
    let client = ControlPlane::shared().client().await.unwrap();
    // Inventory to protect: a pool with a lease, outside the webhook's namespaces.
    let ns = namespace_with_pool(&client, "stream-auth").await;
    create(
        &dynamic::<VirtualMachineNetworkConfig>(&client, &ns),
        config(
            &ns,
            "vm",
            json!([{"networkName": format!("{ns}/net"), "macAddress": "02:00:00:00:72:01"}]),
        ),
    )
    .await
    .unwrap();

    let ca = ca_file(&client).await;
    let write_token = |name: &str, value: &str| {
        let p = shared.dir.join(name);
        std::fs::write(&p, value).unwrap();
        Some(p)
    };
    let creds = |token_file: Option<PathBuf>| Credentials {
        ca_file: Some(ca.clone()),
        token_file,
    };

    // Plaintext to a TLS port: nothing.
    let plain = first_watch_message(&Credentials::default(), "http").await;
    assert!(plain.is_err(), "plaintext caller served: {plain:?}");
    // A foreign CA: the handshake fails.
    let foreign = vmdhcp_controller::security::certs::reconcile(
        None,
        &vmdhcp_controller::security::certs::Policy::default(),
        time::OffsetDateTime::now_utc(),
    )
    .unwrap();
    let foreign_ca = shared.dir.join("foreign-ca.crt");
    std::fs::write(&foreign_ca, foreign.material.ca_bundle).unwrap();
    let agent_token = write_token("agent.token", &token("agent", Some(AUDIENCE)));
    let result = first_watch_message(
        &Credentials {
            ca_file: Some(foreign_ca),
            token_file: agent_token.clone(),
        },
        "https",
    )
    .await;
    assert!(
        result.as_ref().is_err_and(|e| e.starts_with("connect")),
        "foreign CA: {result:?}"
    );
    // No token, a token for the API server's audience, another ServiceAccount's token.
    let result = first_watch_message(&creds(None), "https").await;
    assert!(
        result
            .as_ref()
            .is_err_and(|e| e.contains("Unauthenticated") && e.contains("missing bearer token")),
        "{result:?}"
    );
    let wrong_audience = write_token("apiserver.token", &token("agent", None));
    let result = first_watch_message(&creds(wrong_audience), "https").await;
    assert!(
        result
            .as_ref()
            .is_err_and(|e| e.contains("Unauthenticated") && e.contains(AUDIENCE)),
        "{result:?}"
    );
    let intruder = write_token("intruder.token", &token("intruder", Some(AUDIENCE)));
    let result = first_watch_message(&creds(intruder.clone()), "https").await;
    assert!(
        result
            .as_ref()
            .is_err_and(|e| e.contains("PermissionDenied")
                && e.contains(&format!("system:serviceaccount:{NS}:intruder"))),
        "{result:?}"
    );
    // Report is refused the same way.
    let mut c = stream_client(&creds(intruder.clone()), "https")
        .await
        .unwrap();
    let intruder = creds(intruder);
    let refused = past_the_budget(async || {
        let mut req = tonic::Request::new(pb::ReportRequest::default());
        intruder.authorize(&mut req).unwrap();
        c.report(req).await
    })
    .await
    .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::PermissionDenied);

    // The agent is served the inventory: the pool and its lease.
    let agent = creds(agent_token);
    let mac = poll_async("the lease streamed to the agent", || {
        let agent = agent.clone();
        async move {
            let m = first_watch_message(&agent, "https").await.unwrap();
            let Some(pb::watch_response::Event::Snapshot(s)) = m.event else {
                return None;
            };
            s.pools
                .iter()
                .flat_map(|p| &p.leases)
                .find(|l| l.mac_address == "02:00:00:00:72:01")
                .map(|l| l.mac_address.clone())
        }
    })
    .await;
    assert_eq!(mac, "02:00:00:00:72:01");

    // Reports need a token bound to the agent's pod: one bound to none could speak as any.
    let mut c = stream_client(&agent, "https").await.unwrap();
    let refused = past_the_budget(async || {
        let mut req = tonic::Request::new(serving_report("agent-0", "x/y"));
        agent.authorize(&mut req).unwrap();
        c.report(req).await
    })
    .await
    .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
    assert!(refused.message().contains("bound to none"), "{refused:?}");
    // A forgery of the agent's token is refused by its signature.
    let genuine = std::fs::read_to_string(agent.token_file.as_ref().unwrap()).unwrap();
    let (signed, signature) = genuine.rsplit_once('.').unwrap();
    let forged = write_token(
        "forged.token",
        &format!("{signed}.{}AAAA", &signature[..signature.len() - 4]),
    );
    let result = first_watch_message(&creds(forged), "https").await;
    assert!(
        result.as_ref().is_err_and(
            |e| e.contains("Unauthenticated") && e.contains("not a token of this cluster")
        ),
        "{result:?}"
    );

    // An agent reports only as its pod, in its ServiceAccount's namespace, never in another's
    // name.
    let agent = creds(write_token("agent-0.token", &pod_token("agent-0")));
    let mut c = stream_client(&agent, "https").await.unwrap();
    let refused = past_the_budget(async || {
        let mut req = tonic::Request::new(serving_report("agent-1", "x/y"));
        agent.authorize(&mut req).unwrap();
        c.report(req).await
    })
    .await
    .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
    assert!(refused.message().contains("\"agent-0\""), "{refused:?}");
    let refused = past_the_budget(async || {
        let mut req = tonic::Request::new(pb::ReportRequest {
            agent: Some(pb::AgentIdentity {
                pod_name: "agent-0".into(),
                namespace: "tenant".into(),
                node_name: String::new(),
            }),
            ..Default::default()
        });
        agent.authorize(&mut req).unwrap();
        c.report(req).await
    })
    .await
    .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
    assert!(refused.message().contains("\"tenant\""), "{refused:?}");

    // The chart NOTES' grpcurl recipe: the CA, the service name, the agent's token.
    let addr = format!("127.0.0.1:{}", shared.grpc);
    let refused = {
        let (ca, addr) = (ca.clone(), addr.clone());
        tokio::task::spawn_blocking(move || grpcurl_watch(&ca, &addr, None))
            .await
            .unwrap()
    };
    assert!(
        refused.contains("Unauthenticated") && !refused.contains("02:00:00:00:72:01"),
        "{refused}"
    );
    let agent_token = std::fs::read_to_string(agent.token_file.as_ref().unwrap()).unwrap();
    let served = tokio::task::spawn_blocking(move || grpcurl_watch(&ca, &addr, Some(&agent_token)))
        .await
        .unwrap();
    assert!(served.contains("02:00:00:00:72:01"), "{served}");
}

/// `grpcurl` on the Watch for 3 s, verifying the server by its Service name: stdout + stderr.
fn grpcurl_watch(ca: &std::path::Path, addr: &str, token: Option<&str>) -> String {
    let mut cmd =
        std::process::Command::new(vmdhcp_integration::control_plane::bin_dir().join("grpcurl"));
    cmd.arg("-cacert").arg(ca).args([
        "-servername",
        "vmdhcp-controller.vmdhcp-system.svc",
        "-max-time",
        "3",
    ]);
    if let Some(t) = token {
        cmd.args(["-H", &format!("authorization: Bearer {t}")]);
    }
    cmd.args([
        "-d",
        r#"{"agent":{"podName":"grpcurl","namespace":"vmdhcp-system"}}"#,
        addr,
        "vmdhcp.agent.v1.ConfigService/Watch",
    ]);
    let out = cmd.output().unwrap();
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The leaf certificate the gRPC port presents, DER.
async fn presented_certificate(port: u16, ca_pem: &str) -> Vec<u8> {
    let tls = vmdhcp_integration::tls::connect(port, ca_pem, "127.0.0.1").await;
    tls.get_ref().1.peer_certificates().unwrap()[0].to_vec()
}

fn secret_pem(secret: &Secret, key: &str) -> String {
    String::from_utf8(secret.data.as_ref().unwrap()[key].0.clone()).unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn serving_certificates_are_renewed_before_expiry_under_the_same_ca() {
    let _alone = ALONE.lock().await;
    use rustls::pki_types::{CertificateDer, pem::PemObject};
    let shared = tokio::task::spawn_blocking(shared).await.unwrap();
    let client = ControlPlane::shared().client().await.unwrap();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NS);
    let first = secrets.get(SECRET).await.unwrap();
    let first_cert =
        vmdhcp_controller::security::certs::inspect(&secret_pem(&first, "tls.crt")).unwrap();
    assert!(
        first_cert.names.contains("127.0.0.1")
            && first_cert
                .names
                .contains("vmdhcp-controller.vmdhcp-system.svc"),
        "{:?}",
        first_cert.names
    );
    // Renewed at two thirds of its life, before it expires, by the same CA.
    let renewed = poll_async("a renewed serving certificate", || {
        let secrets = secrets.clone();
        let serial = first_cert.serial.clone();
        async move {
            let s = secrets.get(SECRET).await.ok()?;
            let info =
                vmdhcp_controller::security::certs::inspect(&secret_pem(&s, "tls.crt")).ok()?;
            (info.serial != serial).then_some((s, info))
        }
    })
    .await;
    assert!(
        time::OffsetDateTime::now_utc() < first_cert.not_after,
        "renewed only after the first certificate expired"
    );
    let ca = secret_pem(&renewed.0, "ca.crt");
    assert_eq!(ca, secret_pem(&first, "ca.crt"), "the CA must not change");
    // What the server presents follows the Secret (a later renewal may have happened meanwhile:
    // the presented certificate is always one the Secret held, never an older one).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let presented = presented_certificate(shared.grpc, &ca).await;
        let current = secrets.get(SECRET).await.unwrap();
        let stored =
            CertificateDer::from_pem_slice(secret_pem(&current, "tls.crt").as_bytes()).unwrap();
        if presented == stored.to_vec() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the server never presented the stored certificate"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Creates a config with one NIC on the namespace's `net` and returns how long it took to be
/// `Allocated`, as a watch opened before the create sees it.
async fn allocation_latency(client: &Client, ns: &str, name: &str, mac: &str) -> Duration {
    use futures_util::StreamExt;
    use kube::runtime::watcher;
    let api: Api<VirtualMachineNetworkConfig> = Api::namespaced(client.clone(), ns);
    let by_name = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut events = std::pin::pin!(watcher(api, by_name));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let mut next = async || match tokio::time::timeout_at(deadline, events.next()).await {
        Ok(Some(Ok(event))) => event,
        other => panic!("watching {ns}/{name}: {other:?}"),
    };
    while !matches!(next().await, watcher::Event::InitDone) {}
    let started = Instant::now();
    let nic = json!([{"networkName": format!("{ns}/net"), "macAddress": mac}]);
    create(
        &dynamic::<VirtualMachineNetworkConfig>(client, ns),
        config(ns, name, nic),
    )
    .await
    .unwrap();
    loop {
        if let watcher::Event::Apply(cfg) = next().await
            && cfg.status.as_ref().is_some_and(|s| {
                vmdhcp_core::crd::find_condition(&s.conditions, "Allocated")
                    .is_some_and(|c| c.status == "True")
            })
        {
            return started.elapsed();
        }
    }
}

/// The middle one of `samples`.
fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

/// What the controller's `/metrics` says of `series` (summed over its labels).
fn controller_metric(series: &str) -> f64 {
    let text =
        vmdhcp_integration::http::get(&format!("127.0.0.1:{}", shared().http), "/metrics").unwrap();
    vmdhcp_integration::fleet::metric(&text, series).unwrap_or(0.0)
}

/// What a flood of refused calls was answered, by gRPC code.
#[derive(Debug, Default)]
struct FloodOutcome {
    sent: u64,
    codes: std::collections::BTreeMap<String, u64>,
}

/// Sends `Report`s at `rate` a second for `length`, spread over `clients` (one connection each,
/// at most `IN_FLIGHT` calls at a time on each), each with another token from `token(i)`.
async fn flood(
    clients: Vec<ConfigServiceClient<tonic::transport::Channel>>,
    token: impl Fn(u64) -> String,
    rate: u64,
    length: Duration,
) -> FloodOutcome {
    use futures_util::StreamExt;
    use futures_util::stream::FuturesUnordered;
    const IN_FLIGHT: usize = 16;
    let mut outcome = FloodOutcome::default();
    let mut calls = FuturesUnordered::new();
    let started = tokio::time::Instant::now();
    let mut tick = tokio::time::interval(Duration::from_millis(5));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        let elapsed = started.elapsed().min(length);
        let due = (elapsed.as_secs_f64() * rate as f64) as u64;
        while outcome.sent < due && calls.len() < IN_FLIGHT * clients.len() {
            let mut request = tonic::Request::new(pb::ReportRequest::default());
            let bearer = format!("Bearer {}", token(outcome.sent));
            request
                .metadata_mut()
                .insert("authorization", bearer.parse().unwrap());
            let mut client = clients[outcome.sent as usize % clients.len()].clone();
            calls.push(async move { client.report(request).await });
            outcome.sent += 1;
        }
        if elapsed >= length && calls.is_empty() {
            return outcome;
        }
        let answer = tokio::select! {
            answer = calls.next(), if !calls.is_empty() => answer,
            _ = tick.tick() => None,
        };
        let Some(answer) = answer else { continue };
        let code = match answer {
            Ok(_) => "Ok".to_owned(),
            Err(status) if status.message().contains("TokenReviews a second") => {
                format!("{:?} (rate-limited)", status.code())
            }
            Err(status) if status.code() == tonic::Code::Unauthenticated => {
                "Unauthenticated".to_owned()
            }
            Err(status) => format!("{:?}: {}", status.code(), status.message()),
        };
        *outcome.codes.entry(code).or_default() += 1;
    }
}

/// A pod of the agents' ServiceAccount (never scheduled: the API server only needs it to
/// exist) and a token for our audience bound to it, as the kubelet projects one.
fn pod_token(pod: &str) -> String {
    let manifest = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": pod, "namespace": NS},
        "spec": {"serviceAccountName": "agent", "automountServiceAccountToken": false,
                 "containers": [{"name": "agent", "image": "vm-dhcp-agent:test"}]}});
    ControlPlane::shared()
        .kubectl_stdin(&["apply", "-f", "-"], &manifest.to_string())
        .unwrap();
    let uid = kubectl(&[
        "get",
        "pod",
        pod,
        "-n",
        NS,
        "-o",
        "jsonpath={.metadata.uid}",
    ]);
    kubectl(&[
        "create",
        "token",
        "agent",
        "-n",
        NS,
        "--audience",
        AUDIENCE,
        "--bound-object-kind",
        "Pod",
        "--bound-object-name",
        pod,
        "--bound-object-uid",
        uid.trim(),
    ])
    .trim()
    .to_owned()
}

/// The report of a leading agent `pod` serving `pool_ref`.
fn serving_report(pod: &str, pool_ref: &str) -> pb::ReportRequest {
    pb::ReportRequest {
        agent: Some(pb::AgentIdentity {
            pod_name: pod.into(),
            namespace: NS.into(),
            node_name: String::new(),
        }),
        leader: true,
        interfaces: vec![pb::InterfaceReport {
            pool_ref: pool_ref.into(),
            interface_name: "net1".into(),
            state: pb::InterfaceState::Serving.into(),
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// The pool's `AgentReady` status, if it has one.
async fn agent_ready(client: &Client, ns: &str) -> Option<String> {
    let pool = Api::<IPPool>::namespaced(client.clone(), ns)
        .get("pool")
        .await
        .ok()?;
    let status = pool.status?;
    vmdhcp_core::crd::find_condition(&status.conditions, "AgentReady").map(|c| c.status.clone())
}

/// Opens a Watch as `pod` on `client`: its first message and the stream, or the refusal.
async fn open_watch(
    client: &mut ConfigServiceClient<tonic::transport::Channel>,
    credentials: &Credentials,
    pod: &str,
) -> Result<(pb::WatchResponse, tonic::Streaming<pb::WatchResponse>), String> {
    let request = watch_request(credentials, NS, pod).map_err(|e| e.to_string())?;
    let mut stream = client
        .watch(request)
        .await
        .map_err(|s| format!("{:?}: {}", s.code(), s.message()))?
        .into_inner();
    match tokio::time::timeout(Duration::from_secs(10), stream.message()).await {
        Ok(Ok(Some(first))) => Ok((first, stream)),
        other => Err(format!("no first message: {other:?}")),
    }
}

/// 1 000 forged tokens a second for three minutes: the forgeries are refused by their
/// signature without a TokenReview, an agent whose Watch was verified before keeps reporting
/// (its pool's `AgentReady` stays True throughout, well past the old one-minute verdict), and
/// a new agent connects at once in the middle of it.
#[tokio::test(flavor = "multi_thread")]
async fn a_flood_of_forged_tokens_costs_no_review_and_starves_no_agent() {
    const RATE: u64 = 1000;
    const LENGTH: Duration = Duration::from_secs(180);
    const REPORT_EVERY: Duration = Duration::from_secs(10);
    const CONNECTIONS: usize = 4;
    const SAMPLES: u8 = 5;
    let _shared = tokio::task::spawn_blocking(shared).await.unwrap();
    let _alone = ALONE.lock().await;
    let client = ControlPlane::shared().client().await.unwrap();
    let ns = namespace_with_pool(&client, "token-flood").await;
    let pool_ref = format!("{ns}/pool");
    let ca = ca_file(&client).await;
    let with_token = |name: &str, token: &str| {
        let path = shared().dir.join(name);
        std::fs::write(&path, token).unwrap();
        Credentials {
            ca_file: Some(ca.clone()),
            token_file: Some(path),
        }
    };
    assert!(
        controller_metric("vmdhcpcontroller_token_issuer_keys") >= 1.0,
        "the controller reads the cluster's signing keys"
    );

    // The agent: a token bound to its pod, a Watch, and Reports on the same connection.
    let agent = with_token("flood-agent-0.token", &pod_token("flood-agent-0"));
    let mut agent_client = stream_client(&agent, "https").await.unwrap();
    let (_, mut watch) = past_the_budget(async || {
        open_watch(&mut agent_client.clone(), &agent, "flood-agent-0").await
    })
    .await
    .unwrap();
    let watching = tokio::spawn(async move {
        loop {
            match watch.message().await {
                Ok(Some(_)) => {}
                other => return format!("{other:?}"),
            }
        }
    });
    let mut report = async || {
        let mut request = tonic::Request::new(serving_report("flood-agent-0", &pool_ref));
        agent.authorize(&mut request).unwrap();
        agent_client.report(request).await
    };
    report().await.unwrap();
    poll_async("AgentReady True from the agent's report", || {
        let client = client.clone();
        let ns = ns.clone();
        async move { (agent_ready(&client, &ns).await.as_deref() == Some("True")).then_some(()) }
    })
    .await;
    allocation_latency(&client, &ns, "warm-up", "02:00:00:00:7f:01").await;
    let mut idle = Vec::new();
    for i in 0..SAMPLES {
        let mac = format!("02:00:00:00:7a:{i:02x}");
        idle.push(allocation_latency(&client, &ns, &format!("idle-{i}"), &mac).await);
    }

    // Forgeries of the agent's own token: its header and claims (our audience, the cluster's
    // key id, a future expiry) with other signatures; one in ten is garbage, one in ten is for
    // another audience.
    let forge = |real: &str| {
        let (signed, signature) = real.rsplit_once('.').unwrap();
        let keep = signature.len() - 12;
        (signed.to_owned(), signature[..keep].to_owned())
    };
    let (ours, our_signature) = forge(&pod_token("flood-agent-0"));
    let (theirs, their_signature) = forge(&token("agent", None));
    let token_of = move |i: u64| match i % 10 {
        8 => format!("garbage-{i}"),
        9 => format!("{theirs}.{their_signature}{i:012}"),
        _ => format!("{ours}.{our_signature}{i:012}"),
    };

    let cp = ControlPlane::shared();
    let reviews = || cp.requests_of("POST", "tokenreviews").unwrap();
    let reviews_before = reviews();
    let refused_before = controller_metric("vmdhcpcontroller_token_checks_refused_total");
    let signature_before =
        controller_metric(r#"vmdhcpcontroller_token_checks_refused_total{reason="signature"}"#);
    let controller_pid = shared().controller.pid().unwrap();
    let cpu_before = [controller_pid, std::process::id()].map(cpu_seconds);
    let started = Instant::now();
    // The flood runs on a thread and runtime of its own, as a client elsewhere would.
    let flooding = {
        let anonymous = Credentials {
            ca_file: Some(ca.clone()),
            token_file: None,
        };
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let mut clients = Vec::new();
                for _ in 0..CONNECTIONS {
                    clients.push(stream_client(&anonymous, "https").await.unwrap());
                }
                flood(clients, token_of, RATE, LENGTH).await
            })
        })
    };

    // Throughout: the agent's reports are taken and its pool stays ready; a new agent, a
    // third of the way in, connects at once; allocations go on.
    let (mut during, mut new_agent) = (Vec::new(), None);
    let mut i = 0u8;
    while started.elapsed() < LENGTH {
        let next = Instant::now() + REPORT_EVERY;
        report()
            .await
            .unwrap_or_else(|e| panic!("the agent's report at {:?}: {e}", started.elapsed()));
        assert_eq!(
            agent_ready(&client, &ns).await.as_deref(),
            Some("True"),
            "AgentReady at {:?}",
            started.elapsed()
        );
        if new_agent.is_none() && started.elapsed() >= LENGTH / 3 {
            let fresh = with_token("flood-agent-1.token", &pod_token("flood-agent-1"));
            let connecting = Instant::now();
            let mut fresh_client = stream_client(&fresh, "https").await.unwrap();
            let opened = open_watch(&mut fresh_client, &fresh, "flood-agent-1").await;
            new_agent = Some(connecting.elapsed());
            assert!(opened.is_ok(), "the new agent's Watch: {opened:?}");
        }
        if i < SAMPLES {
            let mac = format!("02:00:00:00:7b:{i:02x}");
            during.push(allocation_latency(&client, &ns, &format!("flood-{i}"), &mac).await);
            i += 1;
        }
        tokio::time::sleep_until(next.into()).await;
    }
    let outcome = tokio::task::spawn_blocking(move || flooding.join().unwrap())
        .await
        .unwrap();
    let elapsed = started.elapsed();
    let cpu = [controller_pid, std::process::id()].map(cpu_seconds);
    let reviewed = reviews() - reviews_before;
    let refused = controller_metric("vmdhcpcontroller_token_checks_refused_total") - refused_before;
    let by_signature =
        controller_metric(r#"vmdhcpcontroller_token_checks_refused_total{reason="signature"}"#)
            - signature_before;
    assert!(!watching.is_finished(), "the agent's Watch ended");
    watching.abort();
    let new_agent = new_agent.unwrap();
    println!(
        "token flood: {} forged tokens over {CONNECTIONS} connections in {:.1} s ({:.0} a second), \
         answered {:?}",
        outcome.sent,
        elapsed.as_secs_f64(),
        outcome.sent as f64 / elapsed.as_secs_f64(),
        outcome.codes
    );
    println!(
        "  CPU: controller {:.2} s, this test process (the flooding client) {:.2} s",
        cpu[0] - cpu_before[0],
        cpu[1] - cpu_before[1]
    );
    println!(
        "  TokenReviews during the flood: {reviewed}; refused without one: {refused} \
         ({by_signature} by their signature); a new agent connected in {:.0} ms",
        new_agent.as_secs_f64() * 1e3
    );
    println!(
        "  allocation latency (median of {SAMPLES}): idle {:.1} ms, during the flood {:.1} ms",
        median(idle).as_secs_f64() * 1e3,
        median(during).as_secs_f64() * 1e3
    );
    assert!(
        outcome.sent >= RATE * LENGTH.as_secs() * 9 / 10,
        "the flood reached {} of {} tokens",
        outcome.sent,
        RATE * LENGTH.as_secs()
    );
    assert_eq!(outcome.codes.get("Ok"), None, "a forgery was served");
    assert_eq!(
        refused, outcome.sent as f64,
        "every forgery is refused before a review"
    );
    let well_formed = (0..outcome.sent).filter(|i| i % 10 < 8).count();
    assert_eq!(
        by_signature, well_formed as f64,
        "the well-formed forgeries fail their signature"
    );
    assert!(
        reviewed <= 2.0,
        "{reviewed} TokenReviews during the flood: only the new agent's token needs one"
    );
    assert!(
        new_agent < Duration::from_secs(30),
        "the new agent connected in {new_agent:?}"
    );
}

/// A VM's `static-ip.harvesterhci.io/<nic>` pin goes through the same admission as any static
/// request, through the real API server: a pin on an excluded address, or on one another MAC
/// holds, is refused; the refusal is a Warning event `StaticIPRefused` on the VM with the
/// webhook's words, and the NIC stays as it was. Once the annotation names a free address,
/// the NIC is pinned to it.
#[tokio::test(flavor = "multi_thread")]
async fn a_static_ip_annotation_the_webhook_refuses_is_said_on_the_vm_and_pins_once_free() {
    use k8s_openapi::api::events::v1::Event;
    use kube::api::{Patch, PatchParams};
    let _alone = ALONE.lock().await;
    let _shared = tokio::task::spawn_blocking(shared).await.unwrap();
    let client = ControlPlane::shared().client().await.unwrap();
    let ns = test_namespace(&client, "webhook-pins", true).await;
    create_nad(&client, &ns, "net", Some("pool")).await;
    create(
        &dynamic::<IPPool>(&client, &ns),
        pool(
            &ns,
            "pool",
            "net",
            with(base_ipv4(), "/serverIP", json!("10.70.0.30")),
        ),
    )
    .await
    .unwrap();
    let vms = Api::<DynamicObject>::namespaced_with(
        client.clone(),
        &ns,
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("kubevirt.io", "v1", "VirtualMachine"),
            "virtualmachines",
        ),
    );
    let vm = |name: &str, mac: &str, pin: &str| {
        json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
            "metadata": {"name": name, "namespace": ns,
                "annotations": {"static-ip.harvesterhci.io/nic-0": pin}},
            "spec": {"running": true, "template": {"spec": {
                "domain": {"devices": {"interfaces": [{"name": "nic-0", "macAddress": mac, "bridge": {}}]}},
                "networks": [{"name": "nic-0", "multus": {"networkName": format!("{ns}/net")}}]}}}
        })
    };
    let configs: Api<VirtualMachineNetworkConfig> = Api::namespaced(client.clone(), &ns);
    let allocated = |name: &'static str, ip: &'static str| {
        let configs = configs.clone();
        async move {
            poll_async(&format!("{name} allocated {ip}"), || {
                let configs = configs.clone();
                async move {
                    let c = configs.get_opt(name).await.unwrap()?;
                    let nic = c.status?.network_configs.into_iter().next()?;
                    (nic.allocated_ip_address.as_deref() == Some(ip)).then_some(())
                }
            })
            .await;
        }
    };
    let events: Api<Event> = Api::namespaced(client.clone(), &ns);
    let refusal = |vm: &'static str, needle: &'static str| {
        let events = events.clone();
        async move {
            poll_async(
                &format!("a StaticIPRefused event on {vm} with {needle:?}"),
                || {
                    let events = events.clone();
                    async move {
                        events
                            .list(&Default::default())
                            .await
                            .unwrap()
                            .items
                            .into_iter()
                            .find(|e| {
                                e.reason.as_deref() == Some("StaticIPRefused")
                                    && e.regarding.as_ref().and_then(|r| r.name.as_deref())
                                        == Some(vm)
                                    && e.note.as_deref().is_some_and(|n| n.contains(needle))
                            })
                    }
                },
            )
            .await
        }
    };

    // The holder: pinned to .60.
    create(&vms, vm("holder", "02:00:00:70:00:01", "10.70.0.60"))
        .await
        .unwrap();
    allocated("holder", "10.70.0.60").await;

    // An excluded address: refused, said on the VM; no config is created.
    create(&vms, vm("asks", "02:00:00:70:00:02", "10.70.0.50"))
        .await
        .unwrap();
    let event = refusal("asks", "10.70.0.50").await;
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    assert!(
        event
            .note
            .as_deref()
            .unwrap_or_default()
            .contains("denied the request"),
        "{event:?}"
    );
    assert!(configs.get_opt("asks").await.unwrap().is_none());

    let pin = |ip: &'static str| {
        let vms = vms.clone();
        async move {
            let annotations = json!({"static-ip.harvesterhci.io/nic-0": ip});
            vms.patch(
                "asks",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": annotations}})),
            )
            .await
            .unwrap();
        }
    };

    // The holder's address: refused too.
    pin("10.70.0.60").await;
    refusal("asks", "10.70.0.60").await;
    assert!(configs.get_opt("asks").await.unwrap().is_none());

    // A free one: pinned.
    pin("10.70.0.61").await;
    allocated("asks", "10.70.0.61").await;
    let asks = configs.get("asks").await.unwrap();
    assert_eq!(
        asks.spec.network_configs[0].ip_address.as_deref(),
        Some("10.70.0.61")
    );
}
