#!/usr/bin/env bash
# A real single-node Kubernetes v1.20 cluster on this machine, for the `cluster` suite and
# `scripts/demo.sh --cluster`: etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
# kube-proxy, containerd (CRI) and kubelet, all built or installed by scripts/install-deps.sh.
#
#   node.sh DIR API_PORT IMAGES_DIR STANDIN [IMAGE_ARCHIVE...]
#
# Everything of the node lives in one network namespace (`vmdnode-<pid>`: the node's address
# 172.30.0.1 on its loopback, the pod bridge cni0 10.244.0.0/24, kube-proxy's iptables rules, a
# DNS server) and one directory, DIR. The host sees only 127.0.0.1:API_PORT, a forwarder to the
# API server (for kubectl, helm and the test's client). Pods get their network from the Debian
# bridge plugin, then from STANDIN (vmdhcp-multus-standin, a test double for Multus) for the
# networks of their `k8s.v1.cni.cncf.io/networks` annotation. Service names resolve through a
# dnsmasq that stands in for CoreDNS (a hosts file of every Service, refreshed each second).
#
# Protocol with the caller (integration/src/node.rs), on stdout: `READY <netns>` once the node is
# Ready and the images are imported; `FAILED <component>`, the tail of its log, `END` when a
# component dies (or setup fails). With VMDHCP_NODE_LOGS set, the logs are copied there at exit. The script runs until its stdin closes (the caller dropped it, panicked or was
# killed) or it gets SIGTERM/SIGINT, then removes every process, pod, mount, network namespace,
# cgroup and file it made, and restores the kernel settings kubelet changes.
set -uo pipefail

dir="$1"; api_port="$2"; images="$3"; standin="$(realpath "$4")"; shift 4
BIN="${VMDHCP_BIN_DIR:-${VMDHCP_CACHE:-$HOME/.cache/vmdhcp}/bin}"
K8S_VERSION=v1.20.2
NODE=node1 NODE_IP=172.30.0.1 POD_CIDR=10.244.0.0/24 SVC_CIDR=10.96.0.0/16 SVC_KUBE=10.96.0.1
netns="vmdnode-$$"
cg="vmdhcp-node-$$"
mkdir -p "$dir"/{logs,pki,kubeconfig,cni/net.d,cni/bin,cni/ipam,cni/multus,dns,kubelet}
log() { printf '[node %s] %s\n' "$(date +%T)" "$*" >>"$dir/logs/node.log"; }
report() { # report NAME MESSAGE: a component failed; tells the caller on stdout
  printf 'FAILED %s\n%s\nEND\n' "$1" "$2"
  log "failed: $1: $2"
}
fail() { report "$@"; cleanup; exit 1; }
tail_of() { tail -n 25 "$dir/logs/$1.log" 2>/dev/null; }

# --- cleanup, also of an earlier run of this script that was killed -----------------------------
declare -A pids=()
netns_before="$(ls /var/run/netns 2>/dev/null | sort)"
podlogs_before="$(ls /var/log/pods 2>/dev/null | sort)"
sysctls=(vm/overcommit_memory vm/panic_on_oom kernel/panic kernel/panic_on_oops kernel/keys/root_maxkeys kernel/keys/root_maxbytes)
declare -A sysctl_saved=()
for s in "${sysctls[@]}"; do sysctl_saved[$s]="$(cat "/proc/sys/$s" 2>/dev/null)"; done
cgroup_roots() { awk '$3 == "cgroup" { print $2 }' /proc/mounts; }
cleaned=0
main_pid=$BASHPID
cleanup() {
  # Only the script itself cleans up (its background subshells inherit functions and traps), once,
  # and a second signal does not cut it short.
  [ "$BASHPID" = "$main_pid" ] || exit 0
  ((cleaned)) && return; cleaned=1
  trap '' TERM INT
  log "cleaning up"
  exec 2>>"$dir/logs/node.log" # bash's "Killed" notices of the components
  [ -n "${VMDHCP_NODE_TRACE:-}" ] && { exec 2>>"$dir/logs/cleanup.trace"; set -x; }
  [ -n "${pids[forwarder]:-}" ] && pkill -KILL -P "${pids[forwarder]}" 2>/dev/null
  for c in forwarder dns-refresh kubelet kube-proxy kube-scheduler kube-controller-manager; do
    [ -n "${pids[$c]:-}" ] && kill -KILL "${pids[$c]}" 2>/dev/null
  done
  # Every container and shim of the node: the pods' processes are in our cgroup tree.
  for _ in 1 2 3; do
    for root in $(cgroup_roots); do
      [ -d "$root/$cg" ] && find "$root/$cg" -name cgroup.procs -exec cat {} + 2>/dev/null | xargs -r kill -KILL 2>/dev/null
    done
    sleep 0.2
  done
  for p in /proc/[0-9]*; do
    if tr '\0' ' ' <"$p/cmdline" 2>/dev/null | grep -qF -- "-address $dir/containerd.sock "; then kill -KILL "${p#/proc/}" 2>/dev/null; fi
  done
  for c in containerd kube-apiserver etcd dnsmasq; do
    [ -n "${pids[$c]:-}" ] && kill -KILL "${pids[$c]}" 2>/dev/null
  done
  for ((i = 0; i < 100; i++)); do # up to 10 s for every component to be gone
    alive=0
    for c in "${!pids[@]}"; do kill -0 "${pids[$c]}" 2>/dev/null && alive=1; done
    ((alive)) || break
    sleep 0.1
  done
  grep -o " $dir/[^ ]*" /proc/self/mounts | sort -r | while read -r m; do umount -l "$m" 2>/dev/null; done
  # The pods' network namespaces (containerd's CRI makes them as /var/run/netns/cni-*).
  for n in $(comm -13 <(echo "$netns_before") <(ls /var/run/netns 2>/dev/null | sort)); do
    case "$n" in cni-*) umount -l "/var/run/netns/$n" 2>/dev/null; rm -f "/var/run/netns/$n" ;; esac
  done
  ip netns del "$netns" 2>/dev/null
  for root in $(cgroup_roots); do
    [ -d "$root/$cg" ] && find "$root/$cg" -depth -type d -exec rmdir {} + 2>/dev/null
  done
  for d in $(comm -13 <(echo "$podlogs_before") <(ls /var/log/pods 2>/dev/null | sort)); do rm -rf "/var/log/pods/$d"; done
  for s in "${sysctls[@]}"; do
    [ -n "${sysctl_saved[$s]}" ] && echo "${sysctl_saved[$s]}" >"/proc/sys/$s" 2>/dev/null
  done
  [ "${ours_run_dir:-0}" = 1 ] && rmdir /run/containerd/s /run/containerd 2>/dev/null
  if [ -n "${VMDHCP_NODE_LOGS:-}" ]; then mkdir -p "$VMDHCP_NODE_LOGS" && cp -r "$dir/logs/." "$VMDHCP_NODE_LOGS/"; fi
  rm -rf -- "$dir" 2>/dev/null || rm -rf -- "$dir"
}
# A signal only asks to stop: the setup's waits and the watch loop below act on it, so cleanup
# always runs at the top level, once.
stop=0
trap 'stop=1' TERM INT
stopping() { ((stop)) && { log "stopping on a signal"; cleanup; exit 0; }; return 0; }
# Namespaces and cgroups of runs that were SIGKILLed (their PID is gone).
for n in $(ls /var/run/netns 2>/dev/null | grep '^vmdnode-'); do
  kill -0 "${n#vmdnode-}" 2>/dev/null || ip netns del "$n" 2>/dev/null
done
for root in $(cgroup_roots); do
  for d in "$root"/vmdhcp-node-*; do
    [ -d "$d" ] && ! kill -0 "${d##*-}" 2>/dev/null && find "$d" -depth -type d -exec rmdir {} + 2>/dev/null
  done
done

for tool in etcd kube-apiserver kube-controller-manager kube-scheduler kube-proxy kubelet kubectl "pause-$K8S_VERSION"; do
  [ -x "$BIN/$tool" ] || fail setup "$BIN/$tool missing: run scripts/install-deps.sh"
done
for tool in containerd ctr runc openssl socat nsenter dnsmasq iptables buildah; do
  command -v "$tool" >/dev/null || fail setup "$tool missing: run scripts/install-deps.sh"
done
[ -x /usr/lib/cni/bridge ] || fail setup "/usr/lib/cni/bridge missing: apt-get install containernetworking-plugins"

# start NAME CMD...: runs CMD in the node's network namespace in the background, logged to NAME.log.
start() { local name="$1"; shift; nsenter --net="/var/run/netns/$netns" "$@" >"$dir/logs/$name.log" 2>&1 </dev/null & pids[$name]=$!; }

# --- the node's network namespace -----------------------------------------------------------------
ip netns add "$netns" || fail setup "cannot create network namespace $netns"
nsx() { nsenter --net="/var/run/netns/$netns" "$@"; }
nsx ip link set lo up
nsx ip addr add "$NODE_IP/32" dev lo
nsx sysctl -qw net.ipv4.ip_forward=1

# --- PKI and credentials --------------------------------------------------------------------------
pki="$dir/pki"
ssl() { openssl "$@" >>"$dir/logs/openssl.log" 2>&1 || fail setup "openssl $1 failed: $(tail -n 5 "$dir/logs/openssl.log")"; }
ssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout "$pki/ca.key" -out "$pki/ca.crt" -days 2 -subj /CN=vmdhcp-node-ca
ssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout "$pki/apiserver.key" -out "$pki/apiserver.csr" -subj /CN=kube-apiserver
printf 'subjectAltName=IP:127.0.0.1,IP:%s,IP:%s,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local\n' "$NODE_IP" "$SVC_KUBE" >"$pki/san.cnf"
ssl x509 -req -in "$pki/apiserver.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial -out "$pki/apiserver.crt" -days 2 -extfile "$pki/san.cnf"
ssl ecparam -name prime256v1 -genkey -noout -out "$pki/sa.key"
ssl ec -in "$pki/sa.key" -pubout -out "$pki/sa.pub"
: >"$dir/tokens.csv"
kubeconfig() { # kubeconfig NAME USER GROUPS SERVER: a token user and its kubeconfig
  local token; token="$(openssl rand -hex 16)"
  echo "$token,$2,$2,\"$3\"" >>"$dir/tokens.csv"
  cat >"$dir/kubeconfig/$1" <<EOF
apiVersion: v1
kind: Config
clusters: [{name: node, cluster: {server: "$4", certificate-authority: "$pki/ca.crt"}}]
users: [{name: $2, user: {token: "$token"}}]
contexts: [{name: node, context: {cluster: node, user: $2}}]
current-context: node
EOF
}
inner="https://$NODE_IP:6443"
kubeconfig admin admin system:masters "https://127.0.0.1:$api_port"
kubeconfig admin-inner admin-inner system:masters "$inner"
kubeconfig kubelet "system:node:$NODE" system:nodes "$inner"
kubeconfig controller-manager system:kube-controller-manager "" "$inner"
kubeconfig scheduler system:kube-scheduler "" "$inner"
kubeconfig proxy system:kube-proxy "" "$inner"
kc() { "$BIN/kubectl" --kubeconfig="$dir/kubeconfig/admin" --request-timeout=10s "$@"; }

# --- control plane --------------------------------------------------------------------------------
log "starting etcd and kube-apiserver"
# With VMDHCP_NODE_AUDIT_POLICY (an audit policy file), the API server logs the requests it selects
# to logs/audit.log as JSON lines: the `cluster` suite compares what our ServiceAccounts call with
# what the chart grants them.
audit=()
[ -n "${VMDHCP_NODE_AUDIT_POLICY:-}" ] && audit=(--audit-policy-file="$VMDHCP_NODE_AUDIT_POLICY"
  --audit-log-path="$dir/logs/audit.log" --audit-log-format=json --audit-log-mode=blocking)
start etcd "$BIN/etcd" --name=node --data-dir="$dir/etcd" --unsafe-no-fsync \
  --listen-client-urls=http://127.0.0.1:2379 --advertise-client-urls=http://127.0.0.1:2379 \
  --listen-peer-urls=http://127.0.0.1:2380 --initial-advertise-peer-urls=http://127.0.0.1:2380 \
  --initial-cluster=node=http://127.0.0.1:2380
start kube-apiserver "$BIN/kube-apiserver" --etcd-servers=http://127.0.0.1:2379 \
  --bind-address=0.0.0.0 --advertise-address="$NODE_IP" --secure-port=6443 --insecure-port=0 \
  --cert-dir="$pki/apiserver-generated" --tls-cert-file="$pki/apiserver.crt" --tls-private-key-file="$pki/apiserver.key" \
  --client-ca-file="$pki/ca.crt" --token-auth-file="$dir/tokens.csv" --authorization-mode=Node,RBAC \
  --service-account-key-file="$pki/sa.pub" --service-account-signing-key-file="$pki/sa.key" \
  --service-account-issuer=https://kubernetes.default.svc --api-audiences=https://kubernetes.default.svc \
  --service-cluster-ip-range="$SVC_CIDR" --allow-privileged=true --profiling=false \
  --enable-aggregator-routing=true --kubelet-preferred-address-types=InternalIP "${audit[@]}"
# The host's only way in: 127.0.0.1:API_PORT → the API server in the namespace.
socat "TCP-LISTEN:$api_port,bind=127.0.0.1,reuseaddr,fork" \
  "EXEC:nsenter --net=/var/run/netns/$netns socat STDIO TCP\\:$NODE_IP\\:6443" >"$dir/logs/forwarder.log" 2>&1 </dev/null &
pids[forwarder]=$!
for ((i = 0; ; i++)); do
  kc get --raw=/readyz >/dev/null 2>&1 && break
  ((i > 300)) && fail kube-apiserver "not ready within 60 s: $(tail_of kube-apiserver)"
  kill -0 "${pids[kube-apiserver]}" 2>/dev/null || fail kube-apiserver "exited: $(tail_of kube-apiserver)"
  stopping; sleep 0.2
done
log "API server ready"
start kube-controller-manager "$BIN/kube-controller-manager" --kubeconfig="$dir/kubeconfig/controller-manager" \
  --service-account-private-key-file="$pki/sa.key" --root-ca-file="$pki/ca.crt" --leader-elect=false \
  --port=0 --secure-port=0 --use-service-account-credentials=true --cluster-cidr=10.244.0.0/16
start kube-scheduler "$BIN/kube-scheduler" --kubeconfig="$dir/kubeconfig/scheduler" --leader-elect=false --port=0 --secure-port=0

# --- containerd (CRI) and the pods' network -------------------------------------------------------
for p in /usr/lib/cni/*; do ln -sf "$p" "$dir/cni/bin/"; done
ln -sf "$standin" "$dir/cni/bin/vmdhcp-multus-standin"
cat >"$dir/cni/net.d/10-node.conflist" <<EOF
{"cniVersion": "0.4.0", "name": "node", "plugins": [
  {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "$POD_CIDR"}]], "routes": [{"dst": "0.0.0.0/0"}], "dataDir": "$dir/cni/ipam"}},
  {"type": "vmdhcp-multus-standin", "kubeconfig": "$dir/kubeconfig/admin-inner", "kubectl": "$BIN/kubectl", "stateDir": "$dir/cni/multus"}
]}
EOF
[ -d /run/containerd/s ] && ours_run_dir=0 || ours_run_dir=1
cat >"$dir/containerd.toml" <<EOF
version = 2
root = "$dir/containerd/root"
state = "$dir/containerd/state"
[grpc]
  address = "$dir/containerd.sock"
[ttrpc]
  address = "$dir/containerd.sock.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "$dir/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "registry.k8s.io/pause:3.6"
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$dir/cni/bin"
    conf_dir = "$dir/cni/net.d"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "$dir/runc"
EOF
start containerd containerd --config "$dir/containerd.toml"
ctrk() { ctr --address "$dir/containerd.sock" --namespace k8s.io --timeout 60s "$@"; }
for ((i = 0; ; i++)); do
  ctrk version >/dev/null 2>&1 && break
  ((i > 150)) && fail containerd "not ready within 30 s: $(tail_of containerd)"
  stopping; sleep 0.2
done
log "containerd ready; importing images"
# The sandbox image, built from the pause binary of the same Kubernetes source.
pause_archive="$BIN/pause-$K8S_VERSION.oci.tar"
if [ ! -s "$pause_archive" ]; then
  b="$dir/pause-build"; mkdir -p "$b/ctx"
  cp "$BIN/pause-$K8S_VERSION" "$b/ctx/pause"
  printf 'FROM scratch\nCOPY pause /pause\nUSER 65535:65535\nENTRYPOINT ["/pause"]\n' >"$b/ctx/Containerfile"
  bah() { buildah --root "$b/root" --runroot "$b/run" --storage-driver vfs "$@" >>"$dir/logs/buildah.log" 2>&1; }
  bah build --isolation chroot --timestamp 0 -t localhost/pause:3.6 "$b/ctx" &&
    bah push localhost/pause:3.6 "oci-archive:$pause_archive.tmp:registry.k8s.io/pause:3.6" &&
    mv "$pause_archive.tmp" "$pause_archive" || fail buildah "building the pause image: $(tail_of buildah)"
  rm -rf "$b" 2>/dev/null || { grep -o " $b/[^ ]*" /proc/self/mounts | while read -r m; do umount -l "$m"; done; rm -rf "$b"; }
fi
for archive in "$pause_archive" "$@"; do
  ctrk images import "$archive" >>"$dir/logs/ctr.log" 2>&1 || fail containerd "importing $archive: $(tail -n 5 "$dir/logs/ctr.log")"
done

# --- kubelet, kube-proxy, DNS ---------------------------------------------------------------------
for root in $(cgroup_roots); do
  mkdir -p "$root/$cg"
  [ -f "$root/$cg/cpuset.cpus" ] && cat "$root/cpuset.cpus" >"$root/$cg/cpuset.cpus" && cat "$root/cpuset.mems" >"$root/$cg/cpuset.mems"
done
: >"$dir/resolv.conf"
# The node shares the machine's disk, whose free space this test does not own: eviction thresholds
# are absolute (a percentage of a large, busy disk taints the node with gigabytes still free).
start kubelet "$BIN/kubelet" --kubeconfig="$dir/kubeconfig/kubelet" --hostname-override="$NODE" --node-ip="$NODE_IP" \
  --container-runtime=remote --container-runtime-endpoint="unix://$dir/containerd.sock" --runtime-request-timeout=5m \
  --root-dir="$dir/kubelet" --cert-dir="$dir/kubelet/pki" --volume-plugin-dir="$dir/kubelet/volume-plugins" \
  --cgroup-driver=cgroupfs --cgroup-root="/$cg" --fail-swap-on=false \
  --cluster-dns="$NODE_IP" --cluster-domain=cluster.local --resolv-conf="$dir/resolv.conf" \
  --read-only-port=0 --image-gc-high-threshold=100 --image-gc-low-threshold=99 \
  --eviction-hard='memory.available<100Mi,nodefs.available<256Mi,imagefs.available<256Mi' \
  --serialize-image-pulls=false --max-pods=60
start kube-proxy "$BIN/kube-proxy" --kubeconfig="$dir/kubeconfig/proxy" --hostname-override="$NODE" \
  --proxy-mode=iptables --masquerade-all --cluster-cidr=10.244.0.0/16 --conntrack-max-per-core=0 \
  --conntrack-tcp-timeout-established=0 --conntrack-tcp-timeout-close-wait=0 \
  --metrics-bind-address=127.0.0.1:10249 --healthz-bind-address=127.0.0.1:10256 --oom-score-adj=0
: >"$dir/dns/hosts"
start dnsmasq dnsmasq --keep-in-foreground --no-resolv --no-hosts --addn-hosts="$dir/dns/hosts" \
  --listen-address="$NODE_IP" --bind-interfaces --local=/cluster.local/ --local=/svc/ \
  --pid-file="$dir/dnsmasq.pid" --log-facility=- --user=root
refresh_dns() { # every Service's names → its ClusterIP, as CoreDNS's kubernetes plugin answers
  trap - TERM INT
  while sleep 1; do
    kc get services -A -o jsonpath='{range .items[*]}{.spec.clusterIP} {.metadata.name}.{.metadata.namespace}{"\n"}{end}' 2>/dev/null |
      awk '$1 ~ /^[0-9.]+$/ { print $1, $2 ".svc.cluster.local", $2 ".svc", $2 }' >"$dir/dns/hosts.new" || continue
    cmp -s "$dir/dns/hosts.new" "$dir/dns/hosts" && continue
    mv "$dir/dns/hosts.new" "$dir/dns/hosts"
    kill -HUP "${pids[dnsmasq]}" 2>/dev/null
  done
}
refresh_dns >"$dir/logs/dns-refresh.log" 2>&1 </dev/null &
pids[dns-refresh]=$!

for ((i = 0; ; i++)); do
  [ "$(kc get node "$NODE" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ] &&
    kc get serviceaccount default >/dev/null 2>&1 && break
  ((i > 600)) && fail kubelet "node not Ready within 120 s: $(tail_of kubelet)"
  for c in "${!pids[@]}"; do kill -0 "${pids[$c]}" 2>/dev/null || fail "$c" "exited: $(tail_of "$c")"; done
  stopping; sleep 0.2
done
log "node Ready"
echo "READY $netns"

# --- watch the components until the caller lets go ------------------------------------------------
reported=""
while true; do
  read -r -t 1 _; rc=$?
  if ((rc > 0 && rc <= 128)) || ((stop)); then break; fi # EOF (a timeout is rc > 128), or a signal
  for c in "${!pids[@]}"; do
    if [[ " $reported " != *" $c "* ]] && ! kill -0 "${pids[$c]}" 2>/dev/null; then
      reported="$reported $c"
      report "$c" "exited: $(tail_of "$c")"
    fi
  done
done
cleanup
exit 0
