//! `vm-dhcp-controller`: the vmdhcp control plane binary.

use anyhow::Context;
use clap::{Parser, Subcommand};

/// The vmdhcp controller.
#[derive(Parser, Debug)]
#[command(name = "vm-dhcp-controller", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Print the CustomResourceDefinitions this controller serves, as YAML
    /// (`vm-dhcp-controller crds | kubectl apply -f -`).
    Crds,
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
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
        }
    }
    Ok(())
}
