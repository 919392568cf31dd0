//! `vm-dhcp-controller`: the vmdhcp control plane binary.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use tokio::sync::watch;
use tracing::info;
use vmdhcp_controller::config_service::StreamSettings;
use vmdhcp_controller::context::AgentDeployment;
use vmdhcp_controller::runtime::{Settings, run};
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
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    vmdhcp_telemetry::init(&cli.log).context("setting up logging")?;
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
        Command::Run(args) => tokio::runtime::Runtime::new()
            .context("starting tokio")?
            .block_on(run_controller(*args)),
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
            (leading, Some(tokio::spawn(elector.run(shutdown.clone()))))
        }
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
            ..StreamSettings::default()
        },
        agent,
        dumps: args.enable_cache_dump_api,
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
    // Writes have stopped; the elector releases the Lease on the same shutdown.
    if let Some(election) = election {
        let _ = election.await;
    }
    Ok(())
}
