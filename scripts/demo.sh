#!/usr/bin/env bash
# The whole vmdhcp system on this machine, no cluster: etcd + kube-apiserver, the controller,
# two agents and a VM whose dhclient gets its address; prints what happened, then cleans up.
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
cargo build --quiet --locked -p vmdhcp-controller -p vmdhcp-agent
exec cargo run --quiet --locked -p vmdhcp-integration --bin vmdhcp-demo
