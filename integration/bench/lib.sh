# Shared by the DHCP load benchmarks perfdhcp.sh (DHCPv4) and perfdhcp6.sh (DHCPv6), which source
# it; not run on its own. It owns what the two do alike:
#   - setting up: installing the missing Debian packages, building our agent (sets AGENT: by
#     default the image's binary);
#   - sampling: a process's CPU ticks and RSS, a core's busy share (from /proc);
#   - the report: medians, ranges and ratios of the rounds' figures.
# What differs stays in each script: the servers and their configurations, perfdhcp's arguments
# and the parsing of its output, the UDP drop counters (IPv4 only, or IPv4 and IPv6), the CPU per
# exchange when none completed, the rate steps' wording and the report's tables.
# Bash; the scripts run with `set -euo pipefail`, from the repository's root.

# Installs the given Debian packages (none: nothing), quietly, on stderr.
install_missing() { # package...
  if (($#)); then
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >&2
  fi
}

# Builds vm-dhcp-agent and sets AGENT to its binary. With $1 = image (the scripts' default): the
# binary the agent's image holds (static, musl, cargo profile `image`), built by
# scripts/build-images.sh --binaries-only with the same flags as the images, so the figures are
# those of what users run. Any other $1 is a cargo profile of a host build (dev for a smoke run).
build_agent() { # image | profile
  if [ "$1" = image ]; then
    local dir
    dir="$(scripts/build-images.sh --binaries-only)"
    AGENT="$dir/vm-dhcp-agent"
    return
  fi
  cargo build --profile "$1" --locked -p vmdhcp-agent --bin vm-dhcp-agent >&2
  # cargo writes the dev profile's binaries under target/debug, every other profile's under its name.
  AGENT="${CARGO_TARGET_DIR:-$PWD/target}/$([ "$1" = dev ] && echo debug || echo "$1")/vm-dhcp-agent"
}

# CPU ticks (user + system) process $1 has used.
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
# Busy and total jiffies of one core (everything but idle and iowait), to tell whose core saturates.
core_ticks() { awk -v c="cpu$1" '$1 == c {print $2+$3+$4+$7+$8+$9, $2+$3+$4+$5+$6+$7+$8+$9}' /proc/stat; }
busy_pct() { # "busy0 total0" "busy1 total1"
  read -r b0 t0 <<<"$1"; read -r b1 t1 <<<"$2"
  echo $(( (t1 > t0) ? (b1 - b0) * 100 / (t1 - t0) : 0 ))
}
# A field of process $1's /proc status in kB: VmRSS (now) or VmHWM (peak).
rss_kb() { awk -v k="$2" '$1 == k":" {print $2}' "/proc/$1/status"; }
TICK_US=$((1000000 / $(getconf CLK_TCK)))

# Stops the server under test ($server_pid).
halt() { kill "$server_pid"; wait "$server_pid" 2>/dev/null || true; server_pid=""; }

# The report.
mb() { awk -v kb="$1" 'BEGIN {print kb / 1024}'; }
ratio() { python3 -c "a,b='$1','$2'; print('%.2f' % (float(a)/float(b)) if a not in ('-','0') and b not in ('-','0') else '-')"; }
# The ratio cells of server $1 against server $2 in a report's table, joined by " | ": sustained
# rate, CPU at the fixed rate (the rounds under key $3 of the script's R), CPU at the sustained
# rate, p99 at the fixed rate, peak RSS.
ratio_cells() { # server other cpu_key
  local a="$1" b="$2" k="$3"
  printf '%s | %s | %s | %s (p99) | %s (peak)' \
    "$(ratio "${R[$a.rate]}" "${R[$b.rate]}")" \
    "$(ratio "$(median "${R[$a.$k]}")" "$(median "${R[$b.$k]}")")" \
    "$(ratio "${R[$a.cpu_sustained]}" "${R[$b.cpu_sustained]}")" \
    "$(ratio "$(median "${R[$a.p99]}")" "$(median "${R[$b.p99]}")")" \
    "$(ratio "${R[$a.rss_peak]}" "${R[$b.rss_peak]}")"
}
# Median of the rounds' figures ("12 15 11 " -> 12; "-" when there are none).
median() { python3 -c "import statistics, sys; v = [float(x) for x in sys.argv[1:] if x != '-']; print(('%g' % statistics.median(v)) if v else '-')" $1; }
# "median (min–max)" of the rounds' figures.
spread() { python3 -c "import statistics, sys; v = [float(x) for x in sys.argv[1:] if x != '-']; print(('%g (%g–%g)' % (statistics.median(v), min(v), max(v))) if v else '-')" $1; }
# Each round's ratio of two servers' figures, in round order.
per_round() { python3 -c "import sys; a, b = sys.argv[1].split(), sys.argv[2].split(); print(' '.join('%.2f' % (float(x) / float(y)) if x != '-' and y not in ('-', '0') else '-' for x, y in zip(a, b)))" "$1" "$2"; }
