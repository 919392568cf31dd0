//! `vm-dhcp-controller`: the vmdhcp control plane binary.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use tokio::sync::watch;
use tracing::info;
use vmdhcp_controller::reconcile::context::AgentDeployment;
use vmdhcp_controller::reports::ReportsObject;
use vmdhcp_controller::runtime::Settings;
use vmdhcp_controller::runtime::replica::{self, Replica, StreamAccess, WebhookSettings};
use vmdhcp_controller::security::tls::TlsSettings;
use vmdhcp_controller::stream::auth::ReviewRate;
use vmdhcp_controller::stream::config_service::StreamSettings;
use vmdhcp_core::NamespacedName;
use vmdhcp_leader::ElectionArgs;

/// jemalloc rather than the C library's allocator. The image links musl, whose allocator
/// serialises every thread on one lock; glibc's spends much of the leader's CPU and memory on
/// its many small blocks (docs/tuning.md). The same allocator on both targets also means the
/// host-built binaries the benchmarks run allocate as the image does.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// The vmdhcp controller.
#[derive(Parser, Debug)]
#[command(name = "vm-dhcp-controller", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    #[command(flatten)]
    log: vmdhcp_telemetry::LogArgs,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Print the CustomResourceDefinitions this controller serves, as YAML
    /// (`vm-dhcp-controller crds | kubectl apply -f -`).
    Crds,
    /// Run the controller: reconcilers (leader only), config stream and HTTP endpoints.
    Run(Box<RunArgs>),
}

#[derive(clap::Args, Debug)]
struct RunArgs {
    /// Kubeconfig to use; in-cluster config (or $KUBECONFIG) when unset.
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: Option<std::path::PathBuf>,
    /// This replica's name (leader-election identity, events).
    #[arg(long, env = "POD_NAME", default_value = "vm-dhcp-controller")]
    identity: String,
    /// Address of the gRPC config stream.
    #[arg(long, env = "GRPC_LISTEN", default_value = "0.0.0.0:9090")]
    grpc_listen: SocketAddr,
    /// Address of /healthz, /readyz, /metrics.
    #[arg(long, env = "HTTP_LISTEN", default_value = "0.0.0.0:8080")]
    http_listen: SocketAddr,
    /// Agent Deployment to bootstrap, `namespace/name` (none: no bootstrap writing).
    #[arg(long, env = "AGENT_DEPLOYMENT")]
    agent_deployment: Option<String>,
    /// The agents' election Lease, `namespace/name`: its holder is the leading agent, whatever
    /// reports claim (none: reports are believed; for a single agent without election).
    #[arg(long, env = "AGENT_LEASE")]
    agent_lease: Option<String>,
    /// Name of the agent container in that Deployment.
    #[arg(long, env = "AGENT_CONTAINER_NAME", default_value = "agent")]
    agent_container: String,
    /// Serve /ipams/{ns}/{pool} and /caches/{ns}/{pool}.
    #[arg(long)]
    enable_cache_dump_api: bool,
    /// Seconds a pool entry whose MAC no VirtualMachineNetworkConfig names is kept before its
    /// address is released (a config gone while its status write was failing).
    #[arg(long, default_value_t = vmdhcp_controller::reconcile::orphans::DEFAULT_GRACE.as_secs())]
    unnamed_entry_grace_seconds: u64,
    /// Write each VM's allocated addresses (IPv4 then IPv6 per NIC, comma separated) to its
    /// annotation `harvesterhci.io/custom-ip`, which Harvester's UI shows in the VM list; a
    /// value a person set there is never overwritten. Needs `patch` on virtualmachines.
    #[arg(long, env = "VM_ADDRESS_ANNOTATION")]
    vm_address_annotation: bool,
    /// Seconds between heartbeats on idle config streams.
    #[arg(long, default_value_t = 10)]
    heartbeat_seconds: u64,
    #[command(flatten)]
    election: ElectionArgs,
    /// Namespace of the leader-election Lease.
    #[arg(long, env = "POD_NAMESPACE", default_value = "kube-system")]
    leader_election_namespace: String,
    /// Name of the leader-election Lease.
    #[arg(long, default_value = "vm-dhcp-controllers")]
    leader_election_name: String,
    #[command(flatten)]
    security: SecurityArgs,
}

/// TLS, authentication and the admission webhook.
#[derive(clap::Args, Debug)]
struct SecurityArgs {
    /// Serve the config stream WITHOUT TLS OR AUTHENTICATION, for local use and
    /// `grpcurl -plaintext`: anyone who can connect reads every pool's MACs and addresses.
    #[arg(long, env = "GRPC_PLAINTEXT")]
    grpc_plaintext: bool,
    /// Secret (in the controller's namespace) holding its CA and serving certificate; the leader
    /// creates it and renews both before they expire.
    #[arg(long, env = "TLS_SECRET")]
    tls_secret: Option<String>,
    /// Service whose DNS names the serving certificate carries: NAME, NAME.NS, NAME.NS.svc and
    /// NAME.NS.svc.cluster.local.
    #[arg(long, env = "SERVICE_NAME")]
    service_name: Option<String>,
    /// More DNS names or IP addresses for the serving certificate (comma-separated).
    #[arg(long = "tls-san", env = "TLS_SANS", value_delimiter = ',')]
    tls_sans: Vec<String>,
    /// ConfigMap (in the controller's namespace) to publish the CA bundle in, as `ca.crt`.
    #[arg(long, env = "CA_CONFIGMAP")]
    ca_configmap: Option<String>,
    /// Lifetime of a serving certificate in seconds; it is renewed when a third is left.
    #[arg(long, default_value_t = 365 * 86_400)]
    cert_validity_seconds: u64,
    /// Lifetime of a CA in seconds; a new one is added to the bundle when a third is left.
    #[arg(long, default_value_t = 10 * 365 * 86_400)]
    ca_validity_seconds: u64,
    /// Audience the agents' ServiceAccount tokens must be issued for.
    #[arg(long, env = "TOKEN_AUDIENCE", default_value = "vm-dhcp-controller")]
    token_audience: String,
    /// The agents' ServiceAccount as `namespace:name`: only its tokens may read the stream.
    #[arg(long, env = "AGENT_SERVICE_ACCOUNT")]
    agent_service_account: Option<String>,
    /// TokenReviews a second, sustained, that checking new stream tokens may cost: a verified
    /// token is trusted for a minute, so N agent pods need N/60 a second; callers past the
    /// budget get UNAVAILABLE and retry.
    #[arg(long, default_value_t = ReviewRate::default().per_second, value_parser = clap::value_parser!(u32).range(1..))]
    token_review_rate_per_second: u32,
    /// TokenReviews that may be sent at once after a quiet spell (agents connecting together).
    #[arg(long, default_value_t = ReviewRate::default().burst, value_parser = clap::value_parser!(u32).range(1..))]
    token_review_burst: u32,
    /// Address of the admission webhook (HTTPS); unset, no webhook is served.
    #[arg(long, env = "WEBHOOK_LISTEN")]
    webhook_listen: Option<SocketAddr>,
    /// Mutating and Validating webhook configurations (one name) to inject the CA bundle into.
    #[arg(long, env = "WEBHOOK_NAME")]
    webhook_name: Option<String>,
    /// The cluster's Service CIDR: IPPools overlapping it are refused.
    #[arg(long, env = "SERVICE_CIDR")]
    service_cidr: Option<ipnet::Ipv4Net>,
}

impl SecurityArgs {
    /// Who may read the config stream.
    fn access(&self) -> anyhow::Result<StreamAccess> {
        if self.grpc_plaintext {
            return Ok(StreamAccess::Plaintext);
        }
        let account = self.agent_service_account.as_deref().context(
            "the config stream authenticates agents: set --agent-service-account NAMESPACE:NAME \
             (or --grpc-plaintext for local use)",
        )?;
        anyhow::ensure!(
            account
                .split_once(':')
                .is_some_and(|(ns, n)| !ns.is_empty() && !n.is_empty()),
            "--agent-service-account {account:?}: expected NAMESPACE:NAME"
        );
        Ok(StreamAccess::Agents {
            audience: self.token_audience.clone(),
            service_account: account.to_owned(),
            review_rate: ReviewRate {
                per_second: self.token_review_rate_per_second,
                burst: self.token_review_burst,
            },
        })
    }

    /// The certificate settings, when TLS is configured.
    fn tls(&self, namespace: &str) -> anyhow::Result<Option<TlsSettings>> {
        let Some(secret) = &self.tls_secret else {
            anyhow::ensure!(
                self.grpc_plaintext && self.webhook_listen.is_none(),
                "the config stream and the webhook are served over TLS: set --tls-secret (with \
                 --service-name or --tls-san), or --grpc-plaintext for local use without a webhook"
            );
            return Ok(None);
        };
        let mut names: Vec<String> = match &self.service_name {
            Some(svc) => vec![
                svc.clone(),
                format!("{svc}.{namespace}"),
                format!("{svc}.{namespace}.svc"),
                format!("{svc}.{namespace}.svc.cluster.local"),
            ],
            None => Vec::new(),
        };
        names.extend(self.tls_sans.iter().filter(|n| !n.is_empty()).cloned());
        anyhow::ensure!(
            !names.is_empty(),
            "--tls-secret needs names for the certificate: --service-name or --tls-san"
        );
        Ok(Some(TlsSettings {
            namespace: namespace.to_owned(),
            secret: secret.clone(),
            ca_configmap: self.ca_configmap.clone(),
            webhook: self.webhook_name.clone(),
            policy: vmdhcp_controller::security::certs::Policy {
                ca_validity: Duration::from_secs(self.ca_validity_seconds.max(3)),
                cert_validity: Duration::from_secs(self.cert_validity_seconds.max(3)),
                names,
            },
        }))
    }
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let runtime = tokio::runtime::Runtime::new().context("starting tokio")?;
    // Telemetry is set up inside the runtime (the OTLP exporter's gRPC client runs on it) and
    // dropped before it, flushing the spans not yet exported.
    let _telemetry = {
        let _in = runtime.enter();
        vmdhcp_telemetry::init(&cli.log, "vm-dhcp-controller").context("setting up telemetry")?
    };
    match cli.command {
        Command::Crds => {
            let manifests = vmdhcp_core::crd::crd_manifests().context("rendering CRDs")?;
            let out = manifests
                .into_iter()
                .map(|(_, yaml)| yaml)
                .collect::<Vec<_>>()
                .join("");
            #[allow(clippy::print_stdout)]
            {
                print!("{out}");
            }
            Ok(())
        }
        Command::Run(args) => runtime.block_on(run_controller(*args)),
    }
}

async fn run_controller(args: RunArgs) -> anyhow::Result<()> {
    let replica = args.replica()?;
    let client = kube_client(args.kubeconfig.as_deref()).await?;
    let (shutdown_tx, shutdown) = watch::channel(false);
    tokio::spawn(async move {
        let mut term =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending::<()>().await } } => {}
        }
        info!("shutting down");
        shutdown_tx.send_replace(true);
    });
    replica::run(client, replica, shutdown).await?;
    Ok(())
}

/// The API client: from `kubeconfig` if given, else in-cluster config (or `$KUBECONFIG`).
async fn kube_client(kubeconfig: Option<&std::path::Path>) -> anyhow::Result<kube::Client> {
    const USER_AGENT: &str = concat!("vm-dhcp-controller/", env!("CARGO_PKG_VERSION"));
    Ok(vmdhcp_leader::client::connect(kubeconfig, USER_AGENT).await?)
}

impl RunArgs {
    /// The process the flags describe; refuses inconsistent flags before anything starts.
    fn replica(&self) -> anyhow::Result<Replica> {
        let agent = match &self.agent_deployment {
            Some(d) => Some(AgentDeployment {
                deployment: d
                    .parse::<NamespacedName>()
                    .with_context(|| format!("--agent-deployment {d:?}"))?,
                container: self.agent_container.clone(),
            }),
            None => None,
        };
        let namespace = &self.leader_election_namespace;
        let settings = Settings {
            identity: self.identity.clone(),
            stream: StreamSettings {
                heartbeat: Duration::from_secs(self.heartbeat_seconds.max(1)),
                ..StreamSettings::default()
            },
            agent,
            dumps: self.enable_cache_dump_api,
            orphan_grace: Duration::from_secs(self.unnamed_entry_grace_seconds),
            vm_address_annotation: self.vm_address_annotation,
            // Beside the controllers' Lease: the namespace and name RBAC already scopes.
            reports: Some(ReportsObject::beside_lease(
                namespace,
                &self.leader_election_name,
            )),
            agent_lease: self
                .agent_lease
                .as_deref()
                .map(|l| {
                    l.parse::<NamespacedName>()
                        .with_context(|| format!("--agent-lease {l:?}"))
                })
                .transpose()?,
        };
        Ok(Replica {
            settings,
            grpc_listen: self.grpc_listen,
            http_listen: self.http_listen,
            election: self
                .election
                .config(namespace, &self.leader_election_name, &self.identity),
            tls: self.security.tls(namespace)?,
            access: self.security.access()?,
            webhook: self.security.webhook_listen.map(|listen| WebhookSettings {
                listen,
                service_cidr: self.security.service_cidr,
            }),
        })
    }
}
