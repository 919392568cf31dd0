#!/usr/bin/env bash
# The whole vmdhcp system on this machine, no cluster: etcd + kube-apiserver, the controller,
# two agents and a VM whose dhclient gets its address; prints what happened, then cleans up.
#
#   scripts/demo.sh            the quick demo (processes, about a minute)
#   scripts/demo.sh --cluster  what a user does: a real single-node Kubernetes on this machine,
#                              `helm install` of the chart (default values) running our images as
#                              pods, kubectl apply, a VM's dhclient, an agent failover, uninstall
#                              (builds the container images first: ~10 min the first time)
#
# Needs root (network namespaces). Installs what it needs (Debian 12) on first run.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" != 0 ]; then
  echo "demo.sh: run as root (it creates network namespaces): sudo $0" >&2
  exit 1
fi
BIN="$(scripts/install-deps.sh | tail -n1)"
export PATH="$BIN:$PATH"
if ! command -v cargo >/dev/null 2>&1; then
  [ -x "$HOME/.cargo/bin/cargo" ] || {
    echo "demo.sh: installing Rust with rustup (https://rustup.rs)" >&2
    command -v curl >/dev/null 2>&1 || apt-get install -y -qq curl >&2
    curl -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal >&2
  }
  export PATH="$HOME/.cargo/bin:$PATH"
fi
if [ "${1:-}" = --cluster ]; then
  export VMDHCP_BIN_DIR="$BIN" VMDHCP_IMAGES_DIR="${VMDHCP_IMAGES_DIR:-$PWD/target/images}"
  scripts/build-images.sh --out "$VMDHCP_IMAGES_DIR"
  cargo build --quiet --locked -p vmdhcp-integration --bin vmdhcp-multus-standin
  exec cargo run --quiet --locked -p vmdhcp-integration --bin vmdhcp-demo-cluster
fi
cargo build --quiet --locked -p vmdhcp-controller -p vmdhcp-agent
exec cargo run --quiet --locked -p vmdhcp-integration --bin vmdhcp-demo
