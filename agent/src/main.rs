//! `vm-dhcp-agent`: the vmdhcp data plane binary.

use anyhow::Context;
use clap::{Parser, Subcommand};
use vmdhcp_agent::dhcp::foreign::{DetectorSettings, PROBE_INTERVAL};
use vmdhcp_agent::runtime::{ClusterSettings, LeaseSource, Settings};
use vmdhcp_agent::sources::file::FileSettings;
use vmdhcp_agent::suspects::{FORGET_AFTER, KnownServers};
use vmdhcp_core::bootstrap::{Bootstrap, ENV_AGENT_NETWORK_CONFIGS, ENV_IPPOOL_REFS_JSON};

/// The vmdhcp agent.
#[derive(Parser, Debug)]
#[command(name = "vm-dhcp-agent", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    #[command(flatten)]
    log: vmdhcp_telemetry::LogArgs,
}

/// jemalloc rather than the C library's allocator. The image links musl, whose allocator maps a
/// fresh page for a reply's short-lived blocks and unmaps it again when they are freed: an
/// `mmap` and a `munmap` (a TLB flush) for every packet served, which cost the image's agent a
/// third more CPU per DORA than a glibc build (docs/benchmarks.md). The same allocator on both
/// targets also means the host-built binaries the benchmarks run allocate as the image does.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[derive(Subcommand, Debug)]
enum Command {
    /// Validate the bootstrap env the controller wrote into the agent Deployment and print the
    /// pools it names, as JSON; exits non-zero with the offending field on invalid input.
    CheckBootstrap {
        /// JSON list of per-pool network configs.
        #[arg(long, env = ENV_AGENT_NETWORK_CONFIGS, default_value = "[]")]
        agent_network_configs: String,
        /// JSON list of `namespace/name` pool references.
        #[arg(long, env = ENV_IPPOOL_REFS_JSON, default_value = "[]")]
        ippool_refs_json: String,
    },
    /// Make each pool interface of this pod an IPv6 host that takes no routing from its link
    /// (`accept_ra`, `autoconf`, `accept_redirects`, `proxy_ndp` = 0), then exit: the chart's
    /// init container, which may write `/proc/sys` where the agent's container may not. An
    /// interface that cannot be settled is logged, and the agent, which reads the settings
    /// again, reports it (`vmdhcp_agent_ipv6_host_settings` 0) and removes whatever an RA
    /// teaches: the pod starts either way.
    SettleHost6 {
        /// The pod's Multus network selection (the chart passes its annotation through the
        /// Downward API): the interfaces to settle.
        #[arg(long, env = "MULTUS_NETWORKS", default_value = "")]
        networks: String,
        /// Where the kernel keeps the IPv6 device settings.
        #[arg(long, hide = true, default_value = vmdhcp_agent::host6::PROC_CONF)]
        proc_conf: std::path::PathBuf,
    },
    /// Run the agent: follow the controller's stream (IPPool status as fallback), elect a leader
    /// among replicas, and answer DHCP on every pool's interface while leading.
    Run(Box<RunArgs>),
    /// Serve DHCP for the pools and leases of a JSON file, without a controller (tests and
    /// benchmarks); SIGHUP re-reads the file.
    #[command(hide = true)]
    ServeStatic {
        /// The file: `{"pools":[{"config":PoolConfig,"leases":[{"mac","ip"}]}]}`.
        #[arg(long)]
        config: std::path::PathBuf,
        /// Where to write interface statuses, reload count and declined addresses, as JSON.
        #[arg(long)]
        status_file: Option<std::path::PathBuf>,
        /// Serve /healthz, /readyz, /leases and /metrics on this address.
        #[arg(long)]
        http_listen: Option<std::net::SocketAddr>,
        /// Give each pool's interface its server address and bring it up (undone on stop).
        #[arg(long)]
        configure_interfaces: bool,
        #[command(flatten)]
        detection: DetectionArgs,
    },
}

/// Looking for other DHCP servers on the pool networks (docs/operations.md, "Foreign DHCP
/// servers and proxy-ARP responders").
#[derive(clap::Args, Debug)]
struct DetectionArgs {
    /// Seconds between two probe DISCOVERs for foreign DHCP servers on each served interface;
    /// 0 sends none (replies heard on the network are still looked at).
    #[arg(long, env = "FOREIGN_DHCP_PROBE_INTERVAL_SECONDS", default_value_t = PROBE_INTERVAL.as_secs())]
    foreign_dhcp_probe_interval_seconds: u64,
    /// Look for no foreign DHCP servers at all.
    #[arg(long, env = "NO_FOREIGN_DHCP_DETECTION")]
    no_foreign_dhcp_detection: bool,
    /// Seconds a foreign DHCP server (or another suspect host) is still reported after it was
    /// last seen.
    #[arg(long, env = "SUSPECT_FORGET_AFTER_SECONDS", default_value_t = FORGET_AFTER.as_secs())]
    suspect_forget_after_seconds: u64,
    /// Other DHCP servers that share the pools' networks by design (another cluster's agent on
    /// the same VLAN, an external server with disjoint reservations), by the address they
    /// answer from or their MAC, separated by commas: peers, counted but never reported as
    /// foreign servers.
    #[arg(long, env = "KNOWN_DHCP_SERVERS", default_value = "")]
    known_dhcp_servers: KnownServers,
}

impl DetectionArgs {
    fn detector(&self) -> DetectorSettings {
        DetectorSettings {
            enabled: !self.no_foreign_dhcp_detection,
            probe_interval: Some(self.foreign_dhcp_probe_interval_seconds)
                .filter(|s| *s > 0)
                .map(std::time::Duration::from_secs),
        }
    }

    fn forget_after(&self) -> std::time::Duration {
        std::time::Duration::from_secs(self.suspect_forget_after_seconds.max(1))
    }
}

#[derive(clap::Args, Debug)]
struct RunArgs {
    /// The controller's config stream; unset, the agent serves from IPPool status only.
    #[arg(long, env = "CONTROLLER_ENDPOINT")]
    controller: Option<String>,
    /// The controller's CA bundle (PEM), to verify an `https://` endpoint; read at every connect.
    #[arg(long, env = "CONTROLLER_CA_FILE")]
    controller_ca_file: Option<std::path::PathBuf>,
    /// A ServiceAccount token for the controller's audience, sent on the stream; read at every
    /// connect (the kubelet rotates it).
    #[arg(long, env = "TOKEN_FILE")]
    token_file: Option<std::path::PathBuf>,
    /// Kubeconfig to use; in-cluster config (or $KUBECONFIG) when unset.
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: Option<std::path::PathBuf>,
    /// This replica's name (leader-election identity, reports).
    #[arg(long, env = "POD_NAME", default_value = "vm-dhcp-agent")]
    identity: String,
    /// This replica's namespace (where the leader-election Lease lives).
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    namespace: String,
    /// The node it runs on (reports).
    #[arg(long, env = "NODE_NAME", default_value = "")]
    node: String,
    /// JSON list of per-pool network configs (written by the controller).
    #[arg(long, env = ENV_AGENT_NETWORK_CONFIGS)]
    agent_network_configs: Option<String>,
    /// JSON list of `namespace/name` pool references (written by the controller).
    #[arg(long, env = ENV_IPPOOL_REFS_JSON)]
    ippool_refs_json: Option<String>,
    /// Serve every pool the controller streams, on the interfaces it names (local runs).
    #[arg(long)]
    all_pools: bool,
    /// Name of the leader-election Lease (in the replica's namespace).
    #[arg(long, default_value = "vm-dhcp-agents")]
    leader_election_name: String,
    #[command(flatten)]
    election: vmdhcp_leader::ElectionArgs,
    /// Leave interface addresses alone (something else configures them).
    #[arg(long)]
    no_configure_interfaces: bool,
    /// Address of /healthz, /readyz, /leases, /metrics.
    #[arg(long, env = "HTTP_LISTEN", default_value = "0.0.0.0:8080")]
    http_listen: std::net::SocketAddr,
    /// Longest time between two reports to the controller, in seconds.
    #[arg(long, default_value_t = 15)]
    report_interval_seconds: u64,
    #[command(flatten)]
    detection: DetectionArgs,
}

/// The API client: from `kubeconfig` if given, else in-cluster config (or `$KUBECONFIG`).
async fn kube_client(kubeconfig: Option<&std::path::Path>) -> anyhow::Result<kube::Client> {
    const USER_AGENT: &str = concat!("vm-dhcp-agent/", env!("CARGO_PKG_VERSION"));
    Ok(vmdhcp_leader::client::connect(kubeconfig, USER_AGENT).await?)
}

async fn run_agent(args: RunArgs) -> anyhow::Result<()> {
    let client = match kube_client(args.kubeconfig.as_deref()).await {
        Ok(c) => Some(c),
        Err(e) if args.election.no_leader_election => {
            tracing::warn!(error = %format!("{e:#}"), "no Kubernetes client; running without the IPPool fallback");
            None
        }
        Err(e) => return Err(e.context("leader election needs the API server")),
    };
    let secs = std::time::Duration::from_secs;
    let settings = Settings {
        source: LeaseSource::Cluster(Box::new(ClusterSettings {
            identity: vmdhcp_proto::agent::v1::AgentIdentity {
                pod_name: args.identity.clone(),
                namespace: args.namespace.clone(),
                node_name: args.node.clone(),
            },
            controller: args.controller,
            credentials: vmdhcp_agent::credentials::Credentials {
                ca_file: args.controller_ca_file,
                token_file: args.token_file,
            },
            network_configs: args.agent_network_configs,
            pool_refs: args.ippool_refs_json,
            all_pools: args.all_pools,
            report_interval: secs(args.report_interval_seconds.max(1)),
        })),
        election: args
            .election
            .config(&args.namespace, &args.leader_election_name, &args.identity),
        configure_interfaces: !args.no_configure_interfaces,
        http: Some(args.http_listen),
        foreign_dhcp: args.detection.detector(),
        suspect_forget_after: args.detection.forget_after(),
        known_dhcp_servers: args.detection.known_dhcp_servers,
    };
    vmdhcp_agent::runtime::run(settings, client)
        .await
        .context("agent failed")
}

/// `settle-host6`: each interface of the Multus selection settled, or logged as not.
fn settle_host6(networks: &str, root: &std::path::Path) {
    let interfaces = match vmdhcp_core::bootstrap::multus_interfaces(networks) {
        Ok(interfaces) => interfaces,
        Err(error) => {
            tracing::error!(%error, "cannot read the pod's network selection: no interface settled");
            return;
        }
    };
    for interface in interfaces {
        match vmdhcp_agent::host6::settle(root, &interface) {
            Ok(changed) => {
                tracing::info!(%interface, changed = ?changed, "IPv6 host settings hold");
            }
            Err(error) if error.missing() => {
                tracing::warn!(%interface, %error, "no IPv6 settings for this interface: skipped");
            }
            Err(error) => {
                tracing::error!(%interface, %error, "IPv6 host settings not set: the agent removes what RAs teach instead");
            }
        }
    }
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let runtime = tokio::runtime::Runtime::new().context("cannot start the async runtime")?;
    // Telemetry is set up inside the runtime (the OTLP exporter's gRPC client runs on it) and
    // dropped before it, flushing the spans not yet exported.
    let _telemetry = {
        let _in = runtime.enter();
        vmdhcp_telemetry::init(&cli.log, "vm-dhcp-agent").context("setting up telemetry")?
    };
    match cli.command {
        Command::CheckBootstrap {
            agent_network_configs,
            ippool_refs_json,
        } => {
            let bootstrap = Bootstrap::parse(Some(&agent_network_configs), Some(&ippool_refs_json))
                .context("invalid agent bootstrap")?;
            #[allow(clippy::print_stdout)]
            {
                println!("{}", bootstrap.render_network_configs());
            }
        }
        Command::SettleHost6 {
            networks,
            proc_conf,
        } => settle_host6(&networks, &proc_conf),
        Command::Run(args) => runtime.block_on(run_agent(*args))?,
        Command::ServeStatic {
            config,
            status_file,
            http_listen,
            configure_interfaces,
            detection,
        } => {
            // One thread is enough for the static file (the sockets have threads of their own),
            // and keeps the benchmark's server on the one core it is pinned to.
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .context("cannot start the async runtime")?;
            let settings = Settings {
                source: LeaseSource::File(FileSettings {
                    path: config,
                    status_file,
                }),
                election: None,
                configure_interfaces,
                http: http_listen,
                foreign_dhcp: detection.detector(),
                suspect_forget_after: detection.forget_after(),
                known_dhcp_servers: detection.known_dhcp_servers,
            };
            runtime
                .block_on(vmdhcp_agent::runtime::run(settings, None))
                .context("serve-static failed")?;
        }
    }
    Ok(())
}
