#!/usr/bin/env bash
# The test command: on a fresh Debian 12 machine (as root), installs every real component the tests
# use (scripts/install-deps.sh; cached, so reruns take seconds), builds, and runs every test of the
# workspace, including those against a real kube-apiserver + etcd and in network namespaces, and
# the Helm chart's tests.
# Extra arguments go to `cargo test` (e.g. `scripts/test.sh -p vmdhcp-core`).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" -ne 0 ]; then
  echo "scripts/test.sh: the network-namespace tests need root (unit tests alone: cargo test -p vmdhcp-core -p vmdhcp-controller)" >&2
  exit 1
fi
bin="$(scripts/install-deps.sh | tail -n1)"
export VMDHCP_BIN_DIR="$bin"
export PATH="$bin:$PATH"

cargo test --workspace --locked "$@"

# The Helm chart: lint, golden renders, invariants, refused values (chart/tests/check.sh), then an
# install on a throw-away kube-apiserver 1.20 (chart/tests/install-check.sh). Only on a full run.
if [ "$#" -eq 0 ]; then
  HELM="$bin/helm" chart/tests/check.sh
  HELM="$bin/helm" chart/tests/install-check.sh
fi
