#!/usr/bin/env bash
# DHCPv6 load benchmark: our agent (vm-dhcp-agent serve-static, a dual-stack pool) against
# kea-dhcp6 (memfile, host reservations by hardware address), both with reservations for the same
# CLIENTS MACs, on the same veth pair between two network namespaces, in one run, interleaved.
# perfdhcp -6 (from kea-admin) drives four-message exchanges (SOLICIT/ADVERTISE/REQUEST/REPLY,
# "SARR") from the generator namespace.
#
# Whose address: perfdhcp -6 names its clients by DUID. With `-b mac=02:00:00:00:00:00 -R N` it
# makes client i's MAC by adding the counter i to the template's low octets
# (02:00:00:00:<i>>8>:<i&255>), and with `-b duid=00030001020000000000` (a DUID-LL template) it
# puts that MAC in the DUID's last six bytes: client i is DUID-LL 00:03:00:01:<MAC i>. Kea reads
# the MAC from the DUID (`"mac-sources": ["duid"]`) and matches its hw-address reservations; our
# agent's leases are keyed by the same MACs. Every request therefore has a reservation at both.
#
# MODE=relay (the default, `-A1`): perfdhcp sends RELAY-FORW from its link-local address, port
# 547, to ff02::1:2, and expects RELAY-REPL back; it adds no Client Link-Layer Address option
# (RFC 6939), so a server learns the MAC from the DUID-LL only, and the frame's link-layer
# source is the relay's (perfdhcp's interface), never a client's. MODE=direct: perfdhcp sends as
# the clients themselves (SOLICIT from its link-local address to ff02::1:2, port 546): every
# frame then carries the one MAC of the generator's interface, so a server that trusts the
# frame's source over the DUID sees a single, unreserved client.
#
# Until the agent serves DHCPv6 it does not answer: its rounds then report what they measure
# (0 exchanges, 100 % drops, "-" for CPU per exchange) and say so, and kea's rounds run in full.
#
# For each server: request->reply latency (p50/p99) and server CPU per exchange at a fixed RATE
# (2 000/s), in ROUNDS interleaved rounds, the order rotated each round (median and range
# reported); then the rate is stepped up through RATES until drops reach 0.1 %, giving the highest
# sustained rate, CPU per exchange there, and RSS (idle, after, peak). Each step prints how busy
# each core was and how many datagrams each namespace's kernel dropped for a full receive
# buffer. The server is pinned to core 0 and perfdhcp to core 1 (multi-thread mode). Ratios
# ours/kea close the report.
#
#   integration/bench/perfdhcp6.sh            # as root; installs what it needs (apt)
#   ROUNDS=5 FIXED_SECONDS=10 integration/bench/perfdhcp6.sh
#   STEP_SECONDS=5 RATES="2000 10000 20000" integration/bench/perfdhcp6.sh
#   MODE=direct integration/bench/perfdhcp6.sh   # clients' own messages instead of relayed ones
#   RAW_DIR=/tmp integration/bench/perfdhcp6.sh  # also keeps perfdhcp's reports (perfdhcp6-raw.txt)
#   PROFILE=dev ROUNDS=1 FIXED_SECONDS=1 STEP_SECONDS=1 RATES=2000 CLIENTS=1000 integration/bench/perfdhcp6.sh
#       # a smoke run: our agent from the test build; every phase runs to its end
set -euo pipefail
# What both load benchmarks share (setup, sampling, the report's arithmetic), next to this script.
# shellcheck source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$(dirname "$0")/../.."

STEP_SECONDS="${STEP_SECONDS:-5}"
FIXED_SECONDS="${FIXED_SECONDS:-10}"
ROUNDS="${ROUNDS:-3}"
RATE="${RATE:-2000}"
RATES="${RATES:-2000 5000 10000 15000 20000 25000 30000 40000}"
# Our agent: `image` is the binary of the agent's image (static, musl), what users run; any other
# value a host build with that cargo profile.
PROFILE="${PROFILE:-image}"
CLIENTS="${CLIENTS:-10000}"
MODE="${MODE:-relay}"
case "$MODE" in
  relay) RELAY=(-A1) ;;
  direct) RELAY=() ;;
  *) echo "MODE is relay or direct" >&2; exit 1 ;;
esac
if (( CLIENTS < 1 || CLIENTS > 65535 )); then echo "CLIENTS is 1..65535" >&2; exit 1; fi

if [ "$(id -u)" -ne 0 ]; then echo "needs root (network namespaces)" >&2; exit 1; fi
need=()
command -v perfdhcp >/dev/null || need+=(kea-admin)
command -v kea-dhcp6 >/dev/null || need+=(kea-dhcp6-server)
command -v coredhcp >/dev/null || need+=(coredhcp-server)
command -v taskset >/dev/null || need+=(util-linux)
install_missing "${need[@]}"
build_agent "$PROFILE"

work="$(mktemp -d)"
NS="vmdb6$$"
SRV="$NS-srv"; GEN="$NS-gen"
server_pid=""
cleanup() {
  [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null || true
  ip netns del "$SRV" 2>/dev/null || true
  ip netns del "$GEN" 2>/dev/null || true
  [ -n "${RAW_DIR:-}" ] && cp "$work/perfdhcp6-raw.txt" "$RAW_DIR/" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

# Two namespaces on a veth pair; no duplicate address detection, so link-local and the ULA
# server address are usable at once. Both families on srv0, as a dual-stack pool's interface.
ip netns add "$SRV"; ip netns add "$GEN"
for ns in "$SRV" "$GEN"; do
  ip netns exec "$ns" sysctl -qw net.ipv6.conf.all.accept_dad=0 net.ipv6.conf.default.accept_dad=0
  ip -n "$ns" link set lo up
done
ip -n "$SRV" link add srv0 type veth peer name gen0 netns "$GEN"
ip -n "$SRV" addr add 198.18.0.1/15 dev srv0
ip -n "$SRV" addr add fd76:6d64:6863::1/64 dev srv0 nodad
ip -n "$SRV" link set srv0 up; ip -n "$GEN" link set gen0 up
for _ in $(seq 1 100); do
  ip -n "$GEN" -6 addr show dev gen0 scope link | grep -q 'inet6' && break
  sleep 0.05
done

# The same CLIENTS reservations for every server: MAC i -> 198.18.(1 + i/256).(i%256) and
# fd76:6d64:6863::1:<i in hex>.
gen_mac="$(ip -n "$GEN" link show gen0 | awk '/link\/ether/ {print $2}')"
python3 - "$work" "$CLIENTS" "$gen_mac" <<'PY'
import json, sys
work, n, gen_mac = sys.argv[1], int(sys.argv[2]), sys.argv[3]
pairs = [("02:00:00:00:%02x:%02x" % (i >> 8, i & 255),
          "198.18.%d.%d" % (1 + (i >> 8), i & 255),
          "fd76:6d64:6863::1:%x" % i) for i in range(n)]
json.dump({"pools": [{"config": {
    "pool": "bench/pool", "network": "bench/net", "interface_name": "srv0",
    "server_ip": "198.18.0.1", "subnet": "198.18.0.0/15", "router": "198.18.0.1",
    "dns": ["198.18.0.53"], "domain_name": None, "domain_search": [], "ntp": [],
    "lease_seconds": 3600,
    "ipv6": {"server_ip": "fd76:6d64:6863::1", "subnet": "fd76:6d64:6863::/64",
             "dns": ["fd76:6d64:6863::53"], "lease_seconds": 3600}},
    "leases": [{"mac": m, "ip": ip, "ipv6": ip6} for m, ip, ip6 in pairs]}]},
    open(f"{work}/agent.json", "w"))
# coredhcp's file plugin takes a client's MAC from a relayed message's link-local peer address
# (EUI-64) before its DUID: relayed by perfdhcp, every client is the generator's MAC and gets one
# address (the same work per exchange: one lookup); sent directly, its DUID-LL's MAC.
with open(f"{work}/leases6.txt", "w") as f:
    f.writelines(f"{m} {ip6}\n" for m, _, ip6 in pairs)
    f.write(f"{gen_mac} fd76:6d64:6863::2:0\n")
open(f"{work}/coredhcp.yml", "w").write(f"""server6:
  listen:
    - "[ff02::1:2%srv0]:547"
    - "[fd76:6d64:6863::1]:547"
  plugins:
    - server_id: LL 02:76:6d:64:68:01
    - file: "{work}/leases6.txt"
    - dns: fd76:6d64:6863::53
""")
json.dump({"Dhcp6": {
    "interfaces-config": {"interfaces": ["srv0"]},
    "lease-database": {"type": "memfile", "persist": False},
    "server-id": {"type": "EN", "enterprise-id": 32473, "identifier": "766d646863700001", "persist": False},
    "renew-timer": 1800, "rebind-timer": 2880, "preferred-lifetime": 3000, "valid-lifetime": 3600,
    "host-reservation-identifiers": ["hw-address"],
    "mac-sources": ["duid"],
    "subnet6": [{"id": 1, "subnet": "fd76:6d64:6863::/64", "interface": "srv0",
                 "reservations": [{"hw-address": m, "ip-addresses": [ip6]} for m, _, ip6 in pairs],
                 "option-data": [{"name": "dns-servers", "data": "fd76:6d64:6863::53"}]}],
    "loggers": [{"name": "kea-dhcp6", "output_options": [{"output": f"{work}/kea.log"}], "severity": "WARN"}],
}}, open(f"{work}/kea.json", "w"))
PY
export KEA_PIDFILE_DIR="$work" KEA_LOCKFILE_DIR="$work"

perf() { # rate seconds [extra perfdhcp args]
  local rate="$1" secs="$2"; shift 2
  ip netns exec "$GEN" taskset -c 1 perfdhcp -6 -g multi -l gen0 "${RELAY[@]}" -r "$rate" -R "$CLIENTS" \
    -b mac=02:00:00:00:00:00 -b duid=00030001020000000000 -p "$secs" -W 500000 "$@" 2>&1 \
    | tee -a "$work/perfdhcp6-raw.txt" || true
}
# perfdhcp output -> "sa_sent sa_recv rr_sent rr_recv p50_ms p99_ms drops" (percentiles only
# with -x t); drops are perfdhcp's own count over both exchanges.
parse() {
  python3 -c '
import sys, re
text = sys.stdin.read()
def section(name):
    m = re.search(r"Statistics for: " + name + r"\*\*\*(.*?)(?=\*\*\*|\Z)", text, re.S)
    body = m.group(1) if m else ""
    get = lambda k: int(re.search(k + r": (\d+)", body).group(1)) if re.search(k + r": (\d+)", body) else 0
    return get("sent packets"), get("received packets"), get("drops")
sa, rr = section("SOLICIT-ADVERTISE"), section("REQUEST-REPLY")
lat = []
m = re.search(r"Timestamps for packets: REQUEST-REPLY\*\*\*(.*)", text, re.S)
if m:
    for a, b in re.findall(r"sent / received: ([\d.]+) / ([\d.]+)", m.group(1)):
        lat.append(float(b) - float(a))
lat.sort()
pct = lambda p: "%.3f" % (lat[min(len(lat) - 1, int(p * len(lat)))] * 1e3) if lat else "-"
print(sa[0], sa[1], rr[0], rr[1], pct(0.5), pct(0.99), sa[2] + rr[2])
'
}
# UDP datagrams a namespace's kernel dropped for a full receive buffer (IPv4 and IPv6).
udp_rcvbuf_errors() {
  ip netns exec "$1" sh -c "awk '\$1 == \"Udp:\" && \$2 ~ /^[0-9]/ {print \$6; exit}' /proc/net/snmp;
    awk '\$1 == \"Udp6RcvbufErrors\" {print \$2}' /proc/net/snmp6" | awk '{s += $1} END {print s + 0}'
}
# Server CPU microseconds per completed exchange ("-" when none completed).
us_per_exchange() { if (( $3 > 0 )); then echo $(( ($2 - $1) * TICK_US / $3 )); else echo -; fi; }

declare -A R
# Starts server $1 on core 0 and waits until it answers; ours may not (no DHCPv6 server yet):
# then its rounds go on and report what they measure.
launch() {
  local name="$1"
  case "$name" in
    ours) set -- "$AGENT" serve-static --config "$work/agent.json" ;;
    kea) set -- kea-dhcp6 -c "$work/kea.json" ;;
    coredhcp) set -- coredhcp -c "$work/coredhcp.yml" -L warning ;;
  esac
  ip netns exec "$SRV" taskset -c 0 "$@" >>"$work/$name.log" 2>&1 &
  server_pid=$!
  local tries=20
  [ "$name" = ours ] && tries=8
  for _ in $(seq 1 "$tries"); do
    if perf 20 1 | parse | awk '{exit !($4 >= 1)}'; then R[$name.answered]=yes; return; fi
    if ! kill -0 "$server_pid" 2>/dev/null; then break; fi
  done
  if [ "$name" = ours ] && kill -0 "$server_pid" 2>/dev/null; then
    echo "   ours does not answer DHCPv6 (not served yet?): its figures below are what it measures" >&2
    R[$name.answered]=no
    return
  fi
  echo "$name never answered; log:" >&2; tail -20 "$work/$name.log" >&2; exit 1
}

fixed() { # name round
  local name="$1" round="$2" c0 c1 out
  c0=$(cpu_ticks "$server_pid")
  out=$(perf "$RATE" "$FIXED_SECONDS" -x t | parse)
  c1=$(cpu_ticks "$server_pid")
  read -r sa_sent _ _ rr_recv p50 p99 drops <<<"$out"
  local cpu; cpu=$(us_per_exchange "$c0" "$c1" "$rr_recv")
  echo "   round $round, fixed $RATE/s: $(( rr_recv / FIXED_SECONDS )) exchanges/s, drops $drops of $sa_sent, $cpu us CPU/exchange, request->reply p50 $p50 ms, p99 $p99 ms" >&2
  R[$name.cpufixed]+="$cpu "; R[$name.p50]+="$p50 "; R[$name.p99]+="$p99 "
  R[$name.drops]+="$drops "
}

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
    local sa_sent rr_recv drops
    read -r sa_sent _ _ rr_recv _ _ drops <<<"$out"
    local achieved=$(( rr_recv / STEP_SECONDS )) cpu
    cpu=$(us_per_exchange "$c0" "$c1" "$rr_recv")
    local drop_permille=$(( sa_sent > 0 ? drops * 1000 / sa_sent : 1000 ))
    echo "   offered $rate/s (perfdhcp sent $(( sa_sent / STEP_SECONDS ))/s): $achieved SARR/s completed, $cpu us CPU/exchange, drops $drop_permille permille; server core ${core0}% busy, generator core ${core1}% busy; datagrams the receiver was too slow for: server $srv_drops, generator $gen_drops" >&2
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

SERVERS=(ours coredhcp kea)
for round in $(seq 1 "$ROUNDS"); do
  for i in "${!SERVERS[@]}"; do
    name="${SERVERS[$(( (i + round - 1) % ${#SERVERS[@]} ))]}"
    echo "== $name (round $round of $ROUNDS, $MODE)" >&2
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

printf '\nDHCPv6 (%s), %s clients: %s rounds of %s s at %s/s per server (median, range); rate steps of %s s in the last round.\n' \
  "$MODE" "$CLIENTS" "$ROUNDS" "$FIXED_SECONDS" "$RATE" "$STEP_SECONDS"
[ "${R[ours.answered]:-no}" = yes ] || printf 'ours did not answer DHCPv6 in this run: its row is what it measured, not a result.\n'
printf '\n| server | sustained SARR/s (<0.1%% drops) | drops @%s/s | CPU µs/exchange @%s/s | CPU µs/exchange @sustained | req→reply p50 / p99 ms @%s/s | RSS idle / after / peak MB |\n' "$RATE" "$RATE" "$RATE"
printf '|---|---|---|---|---|---|---|\n'
for s in "${SERVERS[@]}"; do
  printf '| %s | %s | %s | %s | %s | %s / %s | %.1f / %.1f / %.1f |\n' "$s" "${R[$s.rate]}" "$(spread "${R[$s.drops]}")" \
    "$(spread "${R[$s.cpufixed]}")" "${R[$s.cpu_sustained]}" "$(median "${R[$s.p50]}")" "$(spread "${R[$s.p99]}")" \
    "$(mb "${R[$s.rss_idle]}")" "$(mb "${R[$s.rss_after]}")" "$(mb "${R[$s.rss_peak]}")"
done
# Its table has a drops column after the sustained rate, where a ratio says nothing.
for other in kea coredhcp; do
  printf '| ours/%s | %s |\n' "$other" "$(ratio_cells ours "$other" cpufixed | sed 's/ | / | - | /')"
done
printf '\n'
for other in kea coredhcp; do
  printf 'Each round on its own, ours/%s at %s/s: CPU/exchange %s; p99 %s\n' "$other" "$RATE" \
    "$(per_round "${R[ours.cpufixed]}" "${R[$other.cpufixed]}")" "$(per_round "${R[ours.p99]}" "${R[$other.p99]}")"
done
printf '\nAt the first rate each server did not sustain (a core at ~100%% is saturated; receive-buffer drops name the side that could not keep up):\n'
for s in "${SERVERS[@]}"; do printf -- '- %s: %s\n' "$s" "${R[$s.limit]}"; done
