//! `vm-dhcp-controller`: the vmdhcp control plane binary.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use std::sync::Arc;
use tokio::sync::watch;
use tracing::info;
use tracing::warn;
use vmdhcp_controller::reconcile::context::AgentDeployment;
use vmdhcp_controller::reports::ReportsObject;
use vmdhcp_controller::runtime::{Settings, run};
use vmdhcp_controller::security::tls::{ServingCerts, TlsSettings};
use vmdhcp_controller::stream::auth::TokenAuth;
use vmdhcp_controller::stream::config_service::{Security, StreamSettings};
use vmdhcp_core::NamespacedName;
use vmdhcp_leader::{ElectionArgs, LeaderElector};

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
    /// Name of the agent container in that Deployment.
    #[arg(long, env = "AGENT_CONTAINER_NAME", default_value = "agent")]
    agent_container: String,
    /// Serve /ipams/{ns}/{pool} and /caches/{ns}/{pool}.
    #[arg(long)]
    enable_cache_dump_api: bool,
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
    let config = match &args.kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &Default::default())
                .await
                .context("loading kubeconfig")?
        }
        None => kube::Config::infer()
            .await
            .context("inferring kube config")?,
    };
    let client = kube::Client::try_from(config).context("building kube client")?;
    let agent = match &args.agent_deployment {
        Some(d) => Some(AgentDeployment {
            deployment: d
                .parse::<NamespacedName>()
                .with_context(|| format!("--agent-deployment {d:?}"))?,
            container: args.agent_container.clone(),
        }),
        None => None,
    };
    let (shutdown_tx, shutdown) = watch::channel(false);
    // The Lease is released only after every writer stopped (see the end of this function).
    let (release_tx, release) = watch::channel(false);
    let (_always, leader) = watch::channel(true);
    let (leader, election) = match args.election.config(
        &args.leader_election_namespace,
        &args.leader_election_name,
        &args.identity,
    ) {
        None => (leader, None),
        Some(election) => {
            let elector =
                LeaderElector::new(client.clone(), election).context("leader election settings")?;
            let leading = elector.subscribe();
            (leading, Some(tokio::spawn(elector.run(release))))
        }
    };
    let tls = args.security.tls(&args.leader_election_namespace)?;
    let certs = Arc::new(ServingCerts::new());
    let security = if args.security.grpc_plaintext {
        warn!("config stream served in plaintext without authentication (--grpc-plaintext)");
        Security::Plaintext
    } else {
        let account = args.security.agent_service_account.as_deref().context(
            "the config stream authenticates agents: set --agent-service-account NAMESPACE:NAME \
             (or --grpc-plaintext for local use)",
        )?;
        anyhow::ensure!(
            account
                .split_once(':')
                .is_some_and(|(ns, n)| !ns.is_empty() && !n.is_empty()),
            "--agent-service-account {account:?}: expected NAMESPACE:NAME"
        );
        Security::Tls {
            config: certs.server_config(&[b"h2"]),
            auth: Arc::new(TokenAuth::new(
                client.clone(),
                args.security.token_audience.clone(),
                account,
            )),
        }
    };
    let tls_task = tls.map(|settings| {
        tokio::spawn(vmdhcp_controller::security::tls::run(
            client.clone(),
            settings,
            certs.clone(),
            leader.clone(),
            shutdown.clone(),
        ))
    });
    let webhook_task = match args.security.webhook_listen {
        Some(addr) => {
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("binding {addr}"))?;
            Some(tokio::spawn(vmdhcp_controller::security::webhook::serve(
                listener,
                certs.server_config(&[b"h2", b"http/1.1"]),
                client.clone(),
                args.security.service_cidr,
                shutdown.clone(),
            )))
        }
        None => None,
    };
    let grpc = tokio::net::TcpListener::bind(args.grpc_listen)
        .await
        .with_context(|| format!("binding {}", args.grpc_listen))?;
    let http = tokio::net::TcpListener::bind(args.http_listen)
        .await
        .with_context(|| format!("binding {}", args.http_listen))?;
    let settings = Settings {
        identity: args.identity.clone(),
        stream: StreamSettings {
            heartbeat: Duration::from_secs(args.heartbeat_seconds.max(1)),
            security,
            ..StreamSettings::default()
        },
        agent,
        dumps: args.enable_cache_dump_api,
        // Beside the controllers' Lease: the namespace and name RBAC already scopes.
        reports: Some(ReportsObject::beside_lease(
            &args.leader_election_namespace,
            &args.leader_election_name,
        )),
    };
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
    run(
        client,
        settings,
        grpc,
        http,
        leader,
        shutdown,
        |h| info!(grpc = %h.grpc, http = %h.http, "controller up"),
    )
    .await?;
    if let Some(task) = tls_task {
        let _ = task.await;
    }
    if let Some(task) = webhook_task
        && let Ok(Err(e)) = task.await
    {
        warn!(error = %e, "webhook server failed");
    }
    // Every writer has stopped (reconcilers drained, certificates written): only now may a
    // successor start, so only now is the Lease released.
    release_tx.send_replace(true);
    if let Some(election) = election {
        let _ = election.await;
    }
    Ok(())
}
