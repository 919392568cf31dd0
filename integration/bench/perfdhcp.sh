#!/usr/bin/env bash
# DHCPv4 load benchmark: our agent (vm-dhcp-agent serve-static) against coredhcp (Go, on
# insomniacslk/dhcp, the library upstream's agent uses) and kea-dhcp4 (memfile, host reservations),
# all with reservations for the same 10 000 MACs, on the same veth pair between two network
# namespaces, in one run. perfdhcp (from kea-admin) acts as a relay from the generator namespace.
# Our agent is the binary of the agent's image (static, musl; PROFILE=image, the default), the one
# users run. It runs twice: "ours" serves a pool as upstream's IPPool describes it (router, DNS);
# "ours+opts" serves the same pool with this project's options on — MTU (26), four classless
# routes (121) and a host name on every lease (12) — and perfdhcp asks for all three (its default
# parameter request list already has 12; `-o 55,…` appends 26 and 121), so every OFFER and ACK
# carries them. The ratio ours+opts/ours is what the options cost on the data plane.
#
# For each server: request->ack latency (p50/p99) and server CPU per DORA at a fixed 2 000/s, in
# ROUNDS interleaved rounds (median and range reported: a shared machine's speed drifts between
# runs, so one sequential pass can favour whichever server ran in a quiet moment);
# then the rate is stepped up until drops reach 0.1%, giving the highest sustained rate, CPU per
# DORA there, and RSS (idle, after the run, peak). Each step also prints how busy each core was
# and how many datagrams each side's kernel dropped because its receiver was too slow (UDP
# RcvbufErrors per namespace), which tells whether the server or the generator set the limit.
# The server is pinned to core 0 and perfdhcp to core 1 (in its multi-thread mode, so its receiver
# is not starved by its sender). Ratios ours/coredhcp and ours/kea close the report.
#
#   integration/bench/perfdhcp.sh            # as root; installs what it needs (apt)
#   STEP_SECONDS=5 RATES="2000 10000 20000 30000" integration/bench/perfdhcp.sh
#   ROUNDS=5 FIXED_SECONDS=10 integration/bench/perfdhcp.sh   # more rounds of the fixed-rate phase
#   RAW_DIR=/tmp integration/bench/perfdhcp.sh   # also keeps perfdhcp's own reports (perfdhcp-raw.txt)
#   HOST_PROFILE=release integration/bench/perfdhcp.sh   # also a host (glibc) build, side by side
#   PROFILE=dev ROUNDS=1 FIXED_SECONDS=1 STEP_SECONDS=1 RATES=2000 integration/bench/perfdhcp.sh
#       # a smoke run (scripts/bench-smoke.sh): our agent from the test build, which needs no
#       # release build of its own; every phase runs to its end, its figures not comparable
#
# perfdhcp's clients: with -b mac=02:00:00:00:00:00 -R 10000 it uses MACs 02:00:00:00:<i>>8>:<i&255>
# for i in 0..9999 (the counter is added to the low octets), so every request has a reservation.
set -euo pipefail
# What both load benchmarks share (setup, sampling, the report's arithmetic), next to this script.
# shellcheck source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$(dirname "$0")/../.."

STEP_SECONDS="${STEP_SECONDS:-5}"
FIXED_SECONDS="${FIXED_SECONDS:-10}"
ROUNDS="${ROUNDS:-3}"
RATES="${RATES:-2000 5000 10000 15000 20000 25000 30000 40000 60000}"
# Our agent: `image` is the binary of the agent's image (static, musl), what users run; any other
# value a host build with that cargo profile. HOST_PROFILE adds a host build as server "ours-host".
PROFILE="${PROFILE:-image}"
HOST_PROFILE="${HOST_PROFILE:-}"
CLIENTS=10000

if [ "$(id -u)" -ne 0 ]; then echo "needs root (network namespaces)" >&2; exit 1; fi
need=()
command -v perfdhcp >/dev/null || need+=(kea-admin)
command -v kea-dhcp4 >/dev/null || need+=(kea-dhcp4-server)
command -v coredhcp >/dev/null || need+=(coredhcp-server)
command -v taskset >/dev/null || need+=(util-linux)
install_missing "${need[@]}"
if [ -n "$HOST_PROFILE" ]; then build_agent "$HOST_PROFILE"; HOST_AGENT="$AGENT"; fi
build_agent "$PROFILE"

work="$(mktemp -d)"
NS="vmdb$$"
SRV="$NS-srv"; GEN="$NS-gen"
server_pid=""
cleanup() {
  [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null || true
  ip netns del "$SRV" 2>/dev/null || true
  ip netns del "$GEN" 2>/dev/null || true
  [ -n "${RAW_DIR:-}" ] && cp "$work/perfdhcp-raw.txt" "$RAW_DIR/" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

ip netns add "$SRV"; ip netns add "$GEN"
ip -n "$SRV" link add srv0 type veth peer name gen0 netns "$GEN"
ip -n "$SRV" addr add 198.18.0.1/15 dev srv0
ip -n "$GEN" addr add 198.18.0.2/15 dev gen0
for ns in "$SRV" "$GEN"; do ip -n "$ns" link set lo up; done
ip -n "$SRV" link set srv0 up; ip -n "$GEN" link set gen0 up

# The same 10 000 reservations for every server: MAC i -> 198.18.(1 + i/256).(i%256).
python3 - "$work" "$CLIENTS" <<'PY'
import json, sys
work, n = sys.argv[1], int(sys.argv[2])
pairs = [("02:00:00:00:%02x:%02x" % (i >> 8, i & 255), "198.18.%d.%d" % (1 + (i >> 8), i & 255)) for i in range(n)]
json.dump({"pools": [{"config": {
    "pool": "bench/pool", "network": "bench/net", "interface_name": "srv0",
    "server_ip": "198.18.0.1", "subnet": "198.18.0.0/15", "router": "198.18.0.1",
    "dns": ["198.18.0.53"], "domain_name": None, "domain_search": [], "ntp": [],
    "lease_seconds": 3600},
    "leases": [{"mac": m, "ip": ip} for m, ip in pairs]}]}, open(f"{work}/agent.json", "w"))
# The same pool with every option this project adds on top of upstream's IPPool.
json.dump({"pools": [{"config": {
    "pool": "bench/pool", "network": "bench/net", "interface_name": "srv0",
    "server_ip": "198.18.0.1", "subnet": "198.18.0.0/15", "router": "198.18.0.1",
    "dns": ["198.18.0.53"], "domain_name": None, "domain_search": [], "ntp": [],
    "lease_seconds": 3600, "mtu": 1450,
    "routes": [{"destination": d, "gateway": "198.18.0.1"}
               for d in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10")]},
    "leases": [{"mac": m, "ip": ip, "host_name": "vm-%d" % i} for i, (m, ip) in enumerate(pairs)]}]},
    open(f"{work}/agent-opts.json", "w"))
with open(f"{work}/leases.txt", "w") as f:
    f.writelines(f"{m} {ip}\n" for m, ip in pairs)
open(f"{work}/coredhcp.yml", "w").write(f"""server4:
  listen:
    - "0.0.0.0:67"
  plugins:
    - lease_time: 3600s
    - server_id: 198.18.0.1
    - dns: 198.18.0.53
    - router: 198.18.0.1
    - netmask: 255.254.0.0
    - file: "{work}/leases.txt"
""")
json.dump({"Dhcp4": {
    "interfaces-config": {"interfaces": ["srv0"], "dhcp-socket-type": "udp"},
    "lease-database": {"type": "memfile", "persist": False},
    "valid-lifetime": 3600, "renew-timer": 1800, "rebind-timer": 3150,
    "host-reservation-identifiers": ["hw-address"],
    "subnet4": [{"id": 1, "subnet": "198.18.0.0/15",
                 "reservations": [{"hw-address": m, "ip-address": ip} for m, ip in pairs],
                 "option-data": [{"name": "routers", "data": "198.18.0.1"},
                                 {"name": "domain-name-servers", "data": "198.18.0.53"}]}],
    "loggers": [{"name": "kea-dhcp4", "output_options": [{"output": f"{work}/kea.log"}], "severity": "WARN"}],
}}, open(f"{work}/kea.json", "w"))
PY
export KEA_PIDFILE_DIR="$work" KEA_LOCKFILE_DIR="$work"

# Extra perfdhcp arguments for the server under test (set by launch): ours+opts asks for MTU (26)
# and classless routes (121) on top of perfdhcp's default request list (1 28 2 3 15 6 12).
PERF_EXTRA=()
perf() { # rate seconds [extra perfdhcp args]
  local rate="$1" secs="$2"; shift 2
  ip netns exec "$GEN" taskset -c 1 perfdhcp -4 -g multi -l 198.18.0.2 -r "$rate" -R "$CLIENTS" \
    -b mac=02:00:00:00:00:00 -p "$secs" -W 500000 "${PERF_EXTRA[@]}" "$@" 198.18.0.1 2>&1 | tee -a "$work/perfdhcp-raw.txt" || true
}
# perfdhcp output -> "do_sent do_recv ra_sent ra_recv p50_ms p99_ms drops" (percentiles only with
# -x t). Drops are perfdhcp's own count over both exchanges; with -W it waits half a second after
# the period for outstanding replies, so exchanges still in flight at the cutoff are not drops.
parse() {
  python3 -c '
import sys, re
text = sys.stdin.read()
def section(name):
    m = re.search(r"Statistics for: " + name + r"\*\*\*(.*?)(?=\*\*\*|\Z)", text, re.S)
    body = m.group(1) if m else ""
    get = lambda k: int(re.search(k + r": (\d+)", body).group(1)) if re.search(k + r": (\d+)", body) else 0
    return get("sent packets"), get("received packets"), get("drops")
do, ra = section("DISCOVER-OFFER"), section("REQUEST-ACK")
lat = []
m = re.search(r"Timestamps for packets: REQUEST-ACK\*\*\*(.*)", text, re.S)
if m:
    for a, b in re.findall(r"sent / received: ([\d.]+) / ([\d.]+)", m.group(1)):
        lat.append(float(b) - float(a))
lat.sort()
pct = lambda p: "%.3f" % (lat[min(len(lat) - 1, int(p * len(lat)))] * 1e3) if lat else "-"
print(do[0], do[1], ra[0], ra[1], pct(0.5), pct(0.99), do[2] + ra[2])
'
}
# UDP datagrams a namespace's kernel dropped because its receiver did not read them in time.
udp_rcvbuf_errors() {
  ip netns exec "$1" awk '$1 == "Udp:" && $2 ~ /^[0-9]/ {print $6; exit}' /proc/net/snmp
}
# Server CPU microseconds per completed DORA: cpu_ticks before, after, and the ACKs received.
us_per_dora() { echo $(( ($2 - $1) * TICK_US / ($3 > 0 ? $3 : 1) )); }

declare -A R
# Starts server $1 on core 0 and waits until it answers.
launch() {
  local name="$1"
  PERF_EXTRA=()
  case "$name" in
    ours) set -- "$AGENT" serve-static --config "$work/agent.json" ;;
    ours-host) set -- "$HOST_AGENT" serve-static --config "$work/agent.json" ;;
    ours+opts) set -- "$AGENT" serve-static --config "$work/agent-opts.json"; PERF_EXTRA=(-o 55,1a79) ;;
    coredhcp) set -- coredhcp -c "$work/coredhcp.yml" -L warning ;;
    kea) set -- kea-dhcp4 -c "$work/kea.json" ;;
  esac
  ip netns exec "$SRV" taskset -c 0 "$@" >>"$work/$name.log" 2>&1 &
  server_pid=$!
  for _ in $(seq 1 40); do
    if perf 20 1 | parse | awk '{exit !($4 >= 1)}'; then return; fi
  done
  echo "$name never answered; log:" >&2; tail -20 "$work/$name.log" >&2; exit 1
}

# Fixed 2 000/s with per-exchange timestamps for latency percentiles; appends this round's figures.
fixed() { # name round
  local name="$1" round="$2" c0 c1 out
  c0=$(cpu_ticks "$server_pid")
  out=$(perf 2000 "$FIXED_SECONDS" -x t | parse)
  c1=$(cpu_ticks "$server_pid")
  read -r _ _ _ ra_recv p50 p99 _ <<<"$out"
  local cpu; cpu=$(us_per_dora "$c0" "$c1" "$ra_recv")
  echo "   round $round, fixed 2000/s: $cpu us CPU/DORA, request->ack p50 $p50 ms, p99 $p99 ms" >&2
  R[$name.cpu2000]+="$cpu "; R[$name.p50]+="$p50 "; R[$name.p99]+="$p99 "
}

# Steps the rate up until drops reach 0.1%.
steps() { # name
  local name="$1" c0 c1 out
  R[$name.rate]=0; R[$name.cpu_sustained]="-"; R[$name.limit]="sustained every step"
  for rate in $RATES; do
    local srv_drops0 gen_drops0 core0_0 core1_0
    srv_drops0=$(udp_rcvbuf_errors "$SRV"); gen_drops0=$(udp_rcvbuf_errors "$GEN")
    core0_0=$(core_ticks 0); core1_0=$(core_ticks 1)
    c0=$(cpu_ticks "$server_pid")
    out=$(perf "$rate" "$STEP_SECONDS" | parse)
    c1=$(cpu_ticks "$server_pid")
    local core0 core1 srv_drops gen_drops
    core0=$(busy_pct "$core0_0" "$(core_ticks 0)"); core1=$(busy_pct "$core1_0" "$(core_ticks 1)")
    srv_drops=$(( $(udp_rcvbuf_errors "$SRV") - srv_drops0 )); gen_drops=$(( $(udp_rcvbuf_errors "$GEN") - gen_drops0 ))
    local do_sent ra_recv drops
    read -r do_sent _ _ ra_recv _ _ drops <<<"$out"
    local achieved=$(( ra_recv / STEP_SECONDS )) cpu
    cpu=$(us_per_dora "$c0" "$c1" "$ra_recv")
    local drop_permille=$(( do_sent > 0 ? drops * 1000 / do_sent : 1000 ))
    echo "   offered $rate/s (perfdhcp sent $(( do_sent / STEP_SECONDS ))/s): $achieved DORA/s completed, $cpu us CPU/DORA, drops $drop_permille permille; server core ${core0}% busy, generator core ${core1}% busy; datagrams the receiver was too slow for: server $srv_drops, generator $gen_drops" >&2
    R[$name.last]="$rate/s: server core ${core0}%, generator core ${core1}%, receive-buffer drops server $srv_drops / generator $gen_drops"
    if (( drop_permille < 1 && achieved * 100 >= rate * 97 )); then
      R[$name.rate]=$achieved
      R[$name.cpu_sustained]=$cpu
    else
      R[$name.limit]="${R[$name.last]}"
      break
    fi
  done
}

# The fixed-rate phase runs in ROUNDS rounds, the servers interleaved and their order rotated each
# round, so a slow spell of a shared machine (CPU steal) falls on all of them rather than on
# whichever ran at that moment; the report gives each figure's median and range over the rounds,
# and the ratios of each round's adjacent measurements. The rate steps run once, in the last round.
SERVERS=(ours ours+opts coredhcp kea)
[ -n "$HOST_PROFILE" ] && SERVERS+=(ours-host)
for round in $(seq 1 "$ROUNDS"); do
  for i in "${!SERVERS[@]}"; do
    name="${SERVERS[$(( (i + round - 1) % ${#SERVERS[@]} ))]}"
    echo "== $name (round $round of $ROUNDS)" >&2
    launch "$name"
    [ "$round" -eq 1 ] && R[$name.rss_idle]=$(rss_kb "$server_pid" VmRSS)
    fixed "$name" "$round"
    if [ "$round" -eq "$ROUNDS" ]; then
      steps "$name"
      R[$name.rss_after]=$(rss_kb "$server_pid" VmRSS)
      R[$name.rss_peak]=$(rss_kb "$server_pid" VmHWM)
    fi
    halt
  done
done

printf '\n%s rounds of %s s at 2 000/s per server (median, range); rate steps of %s s in the last round.\n' "$ROUNDS" "$FIXED_SECONDS" "$STEP_SECONDS"
printf '\n| server | sustained DORA/s (<0.1%% drops) | CPU µs/DORA @2000/s | CPU µs/DORA @sustained | req→ack p50 / p99 ms @2000/s | RSS idle / after / peak MB |\n'
printf '|---|---|---|---|---|---|\n'
for s in "${SERVERS[@]}"; do
  printf '| %s | %s | %s | %s | %s / %s | %.1f / %.1f / %.1f |\n' "$s" "${R[$s.rate]}" "$(spread "${R[$s.cpu2000]}")" \
    "${R[$s.cpu_sustained]}" "$(median "${R[$s.p50]}")" "$(spread "${R[$s.p99]}")" \
    "$(mb "${R[$s.rss_idle]}")" "$(mb "${R[$s.rss_after]}")" "$(mb "${R[$s.rss_peak]}")"
done
printf '| ours+opts/ours | %s |\n' "$(ratio_cells ours+opts ours cpu2000)"
for other in coredhcp kea; do
  printf '| ours/%s | %s |\n' "$other" "$(ratio_cells ours "$other" cpu2000)"
done
printf '\nEach round on its own, ours/coredhcp at 2 000/s: CPU/DORA %s; p99 %s\n' \
  "$(per_round "${R[ours.cpu2000]}" "${R[coredhcp.cpu2000]}")" "$(per_round "${R[ours.p99]}" "${R[coredhcp.p99]}")"
printf 'Each round on its own, ours+opts/ours at 2 000/s: CPU/DORA %s; p99 %s\n' \
  "$(per_round "${R[ours+opts.cpu2000]}" "${R[ours.cpu2000]}")" "$(per_round "${R[ours+opts.p99]}" "${R[ours.p99]}")"
printf '\nAt the first rate each server did not sustain (who ran out: a core at ~100%% is saturated; receive-buffer drops name the side that could not keep up):\n'
for s in "${SERVERS[@]}"; do printf -- '- %s: %s\n' "$s" "${R[$s.limit]}"; done
