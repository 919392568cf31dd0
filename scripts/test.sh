#!/usr/bin/env bash
# The test command: on a fresh Debian 12 machine (as root), installs every real component the tests
# use (scripts/install-deps.sh; cached, so reruns take seconds), builds, and runs every test of the
# workspace, including those against a real kube-apiserver + etcd, in network namespaces and
# under containerd (the container images, built first, twice, for reproducibility), the Helm
# chart installed on a real single-node Kubernetes (the `cluster` suite), and the chart's tests.
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

# The container images, for the `images` suite: built (scripts/build-images.sh) whenever the
# integration tests may run, since that suite fails without them. On a full run, and when the
# arguments name the suite, built a second time into a fresh buildah storage, and both builds
# must give the same digests. With VMDHCP_IMAGES_REBUILD=1 (the default when the arguments name
# the suite) the second build also recompiles the workspace's crates (about 5 min on 2 cores),
# so the binaries are shown to come out the same too, not only the images.
images_wanted=0 images_twice=0 rebuild="${VMDHCP_IMAGES_REBUILD:-}"
[ "$#" -eq 0 ] && images_wanted=1 images_twice=1
for arg in "$@"; do
  case "$arg" in
    *images*) images_wanted=1 images_twice=1 rebuild="${rebuild:-1}" ;;
    cluster) images_wanted=1 ;;
    vmdhcp-integration|--workspace) images_wanted=1 ;;
  esac
done
if ((images_wanted)); then
  export VMDHCP_IMAGES_DIR="${VMDHCP_IMAGES_DIR:-${CARGO_TARGET_DIR:-$PWD/target}/images}"
  scripts/build-images.sh --out "$VMDHCP_IMAGES_DIR"
  if ((images_twice)); then
    again="$VMDHCP_IMAGES_DIR-again"
    if [ "${rebuild:-0}" = 1 ]; then
      scripts/build-images.sh --rebuild --out "$again"
    else
      scripts/build-images.sh --out "$again"
    fi
    # name, reference, manifest digest, binary sha256: all must match.
    if ! diff <(cut -f1-3,6 "$VMDHCP_IMAGES_DIR/images.tsv") <(cut -f1-3,6 "$again/images.tsv"); then
      echo "scripts/test.sh: two builds of the images from the same tree differ (above)" >&2
      exit 1
    fi
    echo "images reproducible (second build $([ "${rebuild:-0}" = 1 ] && echo "recompiled" || echo "from the same binaries")): same digests"
    cut -f2,3 "$VMDHCP_IMAGES_DIR/images.tsv"
    rm -rf "$again"
  fi
fi

cargo test --workspace --locked "$@"

# The Helm chart: lint, golden renders, invariants, refused values (chart/tests/check.sh), then an
# install on a throw-away kube-apiserver 1.20 (chart/tests/install-check.sh). Only on a full run.
if [ "$#" -eq 0 ]; then
  HELM="$bin/helm" chart/tests/check.sh
  HELM="$bin/helm" chart/tests/install-check.sh
  # Every benchmark once, at a smoke size, to its end (figures printed, not checked), so that
  # none stops building or running unseen.
  scripts/bench-smoke.sh
fi
