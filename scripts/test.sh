#!/usr/bin/env bash
# The test command: on a fresh Debian 12 machine (as root), installs every real component the tests
# use (scripts/install-deps.sh; cached, so reruns take seconds), builds, and runs every test of the
# workspace, including those against a real kube-apiserver + etcd, in network namespaces and
# under containerd (the container images, built twice, for reproducibility), the Helm chart
# installed on a real single-node Kubernetes (the `cluster` suite), the chart's tests, and every
# benchmark at a smoke size; prints each phase's wall time at the end. Extra arguments go to
# `cargo test` (e.g. `scripts/test.sh -p vmdhcp-core`), after building the images if they name
# a suite that needs them.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" -ne 0 ]; then
  echo "scripts/test.sh: the network-namespace tests need root (unit tests alone: cargo test -p vmdhcp-core -p vmdhcp-controller)" >&2
  exit 1
fi
bin="$(scripts/install-deps.sh | tail -n1)"
export VMDHCP_BIN_DIR="$bin"
export PATH="$bin:$PATH"

# Each phase's wall time, printed at the end of a full run.
phases=()
phase_started=$SECONDS
phase() { phases+=("$(printf '%-28s %5d s' "$1" $((SECONDS - phase_started)))"); phase_started=$SECONDS; }
phase "install-deps"

# The container images (scripts/build-images.sh), for the `images` and `cluster` suites, which
# fail without them. On a full run, and when the arguments name the `images` suite, built a
# second time into a fresh buildah storage, and both builds must give the same digests. With
# VMDHCP_IMAGES_REBUILD=1 (the default when the arguments name the suite) the second build also
# recompiles the workspace's crates (about 5 min on 2 cores), so the binaries are shown to come
# out the same too, not only the images.
images_wanted=0 images_twice=0 rebuild="${VMDHCP_IMAGES_REBUILD:-}"
[ "$#" -eq 0 ] && images_wanted=1 images_twice=1
for arg in "$@"; do
  case "$arg" in
    *images*) images_wanted=1 images_twice=1 rebuild="${rebuild:-1}" ;;
    cluster) images_wanted=1 ;;
    vmdhcp-integration|--workspace) images_wanted=1 ;;
  esac
done
export VMDHCP_IMAGES_DIR="${VMDHCP_IMAGES_DIR:-${CARGO_TARGET_DIR:-$PWD/target}/images}"
build_images() {
  scripts/build-images.sh --out "$VMDHCP_IMAGES_DIR"
  ((images_twice)) || return 0
  local again="$VMDHCP_IMAGES_DIR-again"
  if [ "${rebuild:-0}" = 1 ]; then
    scripts/build-images.sh --rebuild --out "$again"
  else
    scripts/build-images.sh --out "$again"
  fi
  # name, reference, manifest digest, binary sha256: all must match.
  if ! diff <(cut -f1-3,6 "$VMDHCP_IMAGES_DIR/images.tsv") <(cut -f1-3,6 "$again/images.tsv"); then
    echo "scripts/test.sh: two builds of the images from the same tree differ (above)" >&2
    return 1
  fi
  echo "images reproducible (second build $([ "${rebuild:-0}" = 1 ] && echo "recompiled" || echo "from the same binaries")): same digests"
  cut -f2,3 "$VMDHCP_IMAGES_DIR/images.tsv"
  rm -rf "$again"
}

if [ "$#" -ne 0 ]; then
  if ((images_wanted)); then build_images; fi
  exec cargo test --workspace --locked "$@"
fi

# A full run. The suites mostly wait (on DHCP clients, failovers, the API server), so the images'
# optimised build runs beside them, at the lowest CPU priority so that what the suites time is
# theirs; only the two suites that run the images wait for it.
cargo test --workspace --locked --no-run
phase "build the tests"
images_log="$(mktemp)" beside_log="$(mktemp)"
beside_pid=
# The side lane runs in a process group of its own (setsid), so that a run stopped early stops
# it and everything it started.
trap '[ -z "$beside_pid" ] || kill -- "-$beside_pid" 2>/dev/null || true; rm -f "$images_log" "$beside_log"' EXIT
(renice -n 19 -p "$BASHPID" >/dev/null && build_images) >"$images_log" 2>&1 &
images_pid=$!

# The alerts suite waits on Prometheus's rule windows (half a minute each) and uses little CPU:
# it runs in a lane of its own beside the other suites, its output shown after theirs.
beside=(alerts)
setsid cargo test --workspace --locked $(printf -- '--test %s ' "${beside[@]}") >"$beside_log" 2>&1 &
beside_pid=$!

# Every other test target of the workspace but the two that run the images; always
# `--workspace`, the test build's one feature resolution, so that no run rebuilds anything.
after_images=(images cluster)
targets=(--lib --bins)
for name in $(basename -s .rs */tests/*.rs | sort -u); do
  [[ " ${after_images[*]} ${beside[*]} " == *" $name "* ]] || targets+=(--test "$name")
done
cargo test --workspace --locked "${targets[@]}"
cargo test --workspace --locked --doc
if ! wait "$beside_pid"; then
  beside_pid=
  cat "$beside_log"
  echo "scripts/test.sh: the ${beside[*]} suite failed (above)" >&2
  exit 1
fi
beside_pid=
cat "$beside_log"
phase "unit tests and suites"

# The Helm chart: lint, golden renders, invariants, refused values (chart/tests/check.sh), then an
# install on a throw-away kube-apiserver 1.20 (chart/tests/install-check.sh).
HELM="$bin/helm" chart/tests/check.sh
HELM="$bin/helm" chart/tests/install-check.sh
phase "chart checks"

if ! wait "$images_pid"; then
  cat "$images_log" >&2
  echo "scripts/test.sh: building the images failed (above)" >&2
  exit 1
fi
cat "$images_log"
phase "the images (rest of)"
cargo test --workspace --locked $(printf -- '--test %s ' "${after_images[@]}")
phase "images and cluster suites"

# Every benchmark once, at a smoke size, to its end (figures printed, not checked), so that
# none stops building or running unseen.
scripts/bench-smoke.sh
phase "bench smoke"
echo "== scripts/test.sh phases"
printf '%s\n' "${phases[@]}"
