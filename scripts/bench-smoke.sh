#!/usr/bin/env bash
# Every benchmark of the project, once, at a smoke size: each runs to its end and prints its
# figures, which nothing checks (at these sizes, and built without optimisation, they say nothing
# about performance). What it catches is a benchmark that no longer builds, panics or hangs, so
# none of them rots unseen between the runs that measure. Fails if any of them fails, after
# running the others; prints a header per benchmark and the wall time each took.
#
# As root (the fleet and perfdhcp benchmarks use network namespaces), with what
# scripts/install-deps.sh installs; perfdhcp also installs Kea, coredhcp and perfdhcp (apt).
# scripts/test.sh runs it at the end of a full run.
#
# The benchmarks are built with the dev profile by default, which the test build has mostly
# built already; BENCH_SMOKE_PROFILE=release builds them as `cargo bench` does (and our agent of
# the perfdhcp run as that script does by default), at the cost of a release build.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" -ne 0 ]; then
  echo "scripts/bench-smoke.sh: the fleet and perfdhcp benchmarks need root (network namespaces)" >&2
  exit 1
fi
bin="$(scripts/install-deps.sh | tail -n1)"
export VMDHCP_BIN_DIR="$bin"
export PATH="$bin:$PATH"

case "${BENCH_SMOKE_PROFILE:-dev}" in
  dev) bench_profile=(--profile dev) bin_profile=(--profile dev) agent_profile=dev ;;
  release) bench_profile=() bin_profile=(--release) agent_profile=release ;;
  *) echo "scripts/bench-smoke.sh: BENCH_SMOKE_PROFILE is dev or release" >&2; exit 1 ;;
esac
# One feature resolution for every build and run below (the test build's, `--workspace`), so
# running a benchmark never rebuilds what the build step built.
bench=(cargo bench --locked --workspace "${bench_profile[@]}")

now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }

# Built first, so that each benchmark's time is its run: the benchmarks, and the controller and
# agent binaries the integration benchmarks start (built as they would build them).
echo "== bench-smoke: build"
t0=$(now)
# The bench targets by name: `--benches` would also build every library as a bench harness.
"${bench[@]}" --no-run --bench spans --bench ipam --bench memory --bench data_plane \
  --bench config_stream --bench allocation --bench scale --bench fleet
cargo build --locked "${bin_profile[@]}" -p vmdhcp-controller --bin vm-dhcp-controller
cargo build --locked "${bin_profile[@]}" -p vmdhcp-agent --bin vm-dhcp-agent
echo "== bench-smoke: build took $(secs "$t0" "$(now)") s"

names=() times=() failed=()
started=$(now)
# run <name> <command...>: one benchmark, its header, its wall time; a failure is recorded and
# the next benchmark runs.
run() {
  local name="$1" t status=ok
  shift
  echo
  echo "== bench-smoke: $name"
  t=$(now)
  "$@" || status=FAILED
  names+=("$name")
  times+=("$(secs "$t" "$(now)")")
  [ "$status" = ok ] || failed+=("$name")
  echo "== bench-smoke: $name $status in ${times[-1]} s"
}

# The sizes: the smallest at which each benchmark still does every one of its phases.
run spans "${bench[@]}" --bench spans
run ipam "${bench[@]}" --bench ipam
run memory env VMDHCP_MEMORY_VMS=1000 "${bench[@]}" --bench memory
run data_plane env VMDHCP_DATA_PLANE_ROUNDS=1 VMDHCP_DATA_PLANE_LOOKUPS=500000 VMDHCP_DATA_PLANE_REPLIES=2000 \
  "${bench[@]}" --bench data_plane
run config_stream env VMDHCP_STREAM_POOLS=100 VMDHCP_STREAM_CHANGES=50 \
  "${bench[@]}" --bench config_stream
run allocation env VMDHCP_BENCH_VMS=100 "${bench[@]}" --bench allocation
# Five steps of build-up (2, 4, 10, 20 and 40 VMs on 2 pools), each with its timed VMs, the
# control, the failover and the restart.
run scale env VMDHCP_SCALE_POOLS=2 VMDHCP_SCALE_VMS=40 VMDHCP_SCALE_SAMPLES=20 VMDHCP_SCALE_AT_REST=1 \
  VMDHCP_SCALE_REFERENCE=2000 \
  "${bench[@]}" --bench scale
run fleet env VMDHCP_BENCH_RUNS=1 VMDHCP_BENCH_VMS=3 "${bench[@]}" --bench fleet
# One round, one rate: every server launched and measured once.
run perfdhcp env PROFILE="$agent_profile" ROUNDS=1 FIXED_SECONDS=1 STEP_SECONDS=1 RATES=2000 \
  integration/bench/perfdhcp.sh
run perfdhcp6 env PROFILE="$agent_profile" ROUNDS=1 FIXED_SECONDS=1 STEP_SECONDS=1 RATES=2000 CLIENTS=1000 \
  integration/bench/perfdhcp6.sh

echo
echo "== bench-smoke: wall time per benchmark"
for i in "${!names[@]}"; do printf '%-14s %7s s\n' "${names[$i]}" "${times[$i]}"; done
printf '%-14s %7s s\n' total "$(secs "$started" "$(now)")"
if ((${#failed[@]})); then
  echo "scripts/bench-smoke.sh: failed: ${failed[*]}" >&2
  exit 1
fi
