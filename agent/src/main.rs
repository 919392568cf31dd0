//! `vm-dhcp-agent`: the vmdhcp data plane binary.

use anyhow::Context;
use clap::{Parser, Subcommand};
use vmdhcp_core::bootstrap::{Bootstrap, ENV_AGENT_NETWORK_CONFIGS, ENV_IPPOOL_REFS_JSON};

/// The vmdhcp agent.
#[derive(Parser, Debug)]
#[command(name = "vm-dhcp-agent", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

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
    },
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
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
        Command::ServeStatic {
            config,
            status_file,
            http_listen,
            configure_interfaces,
        } => {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .context("cannot start the async runtime")?;
            runtime
                .block_on(vmdhcp_agent::dhcp::static_config::serve_file(
                    &config,
                    vmdhcp_agent::dhcp::static_config::ServeOptions {
                        status_file,
                        http: http_listen,
                        configure_interfaces,
                    },
                ))
                .context("serve-static failed")?;
        }
    }
    Ok(())
}
