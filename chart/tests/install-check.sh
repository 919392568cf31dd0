#!/usr/bin/env bash
# Installs the chart on a real, throw-away kube-apiserver v1.20.2 (+ etcd) and checks what
# `helm template` cannot:
#   - the API server of the oldest supported Kubernetes accepts every object (default, full,
#     plaintext and upstream's values, and the add-on example's as its release in harvester-system);
#   - RBAC means what it says: SubjectAccessReviews as each ServiceAccount, and the by-name
#     list/watch (metadata.name field selector) the controller does on the agent Deployment;
#   - the admission webhooks are wired to the controller Service (failurePolicy Fail refuses an
#     IPPool while no controller answers);
#   - `helm upgrade` keeps the bootstrap the controller wrote into the agent Deployment (env and
#     Multus annotation), with no field-manager conflict, and a no-op upgrade changes nothing.
# There is no scheduler or kubelet: no pod runs, only the API objects are checked.
#
# Needs kube-apiserver, etcd and kubectl from scripts/install-deps.sh (in $VMDHCP_CACHE/bin, or
# on PATH), openssl, python3, and helm ($HELM, else PATH).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
chart="$(dirname "$here")"
repo="$(dirname "$chart")"
BIN="${VMDHCP_CACHE:-$HOME/.cache/vmdhcp}/bin"
PATH="$PATH:$BIN"
HELM="${HELM:-$(command -v helm || true)}"
for tool in kube-apiserver etcd kubectl openssl python3; do
  command -v "$tool" >/dev/null 2>&1 || { echo "install-check.sh: $tool missing (scripts/install-deps.sh)" >&2; exit 2; }
done
[ -n "$HELM" ] || { echo "install-check.sh: no helm: set HELM or put helm on PATH (scripts/install-helm.sh)" >&2; exit 2; }

tmp="$(mktemp -d "${TMPDIR:-/tmp}/vmdhcp-install-check.XXXXXX")"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT

passed=0
failed=0
ok() { passed=$((passed + 1)); printf 'ok    %s\n' "$*"; }
not_ok() { failed=$((failed + 1)); printf 'FAIL  %s\n' "$*"; }
expect() { # expect DESCRIPTION COMMAND...: the command succeeds
  local what="$1"; shift
  if "$@" >"$tmp/out" 2>&1; then ok "$what"; else not_ok "$what"; sed 's/^/      /' "$tmp/out" | head -20; fi
}

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# --- control plane ---------------------------------------------------------------------------
pki="$tmp/pki"; mkdir -p "$pki"
openssl req -x509 -newkey rsa:2048 -nodes -keyout "$pki/ca.key" -out "$pki/ca.crt" -days 1 -subj /CN=vmdhcp-test-ca 2>/dev/null
openssl req -newkey rsa:2048 -nodes -keyout "$pki/server.key" -out "$pki/server.csr" -subj /CN=127.0.0.1 2>/dev/null
printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\n' >"$pki/ext"
openssl x509 -req -in "$pki/server.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
  -out "$pki/server.crt" -days 1 -extfile "$pki/ext" 2>/dev/null
openssl genrsa -out "$pki/sa.key" 2048 2>/dev/null
openssl rsa -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2>/dev/null
token="$(python3 -c 'import secrets; print(secrets.token_hex(16))')"
echo "$token,admin,admin,system:masters" >"$tmp/tokens.csv"

etcd_port="$(free_port)"; peer_port="$(free_port)"; api_port="$(free_port)"
etcd --data-dir "$tmp/etcd" --listen-client-urls "http://127.0.0.1:$etcd_port" \
  --advertise-client-urls "http://127.0.0.1:$etcd_port" --listen-peer-urls "http://127.0.0.1:$peer_port" \
  --initial-advertise-peer-urls "http://127.0.0.1:$peer_port" \
  --initial-cluster "default=http://127.0.0.1:$peer_port" >"$tmp/etcd.log" 2>&1 &
pids+=($!)
# --allow-privileged as kubeadm, RKE2 (Harvester) and k3s run it: the agent's init container is
# privileged (agent.ipv6HostSettings.initContainer; the full values turn it off).
kube-apiserver --etcd-servers "http://127.0.0.1:$etcd_port" --bind-address 127.0.0.1 \
  --secure-port "$api_port" --tls-cert-file "$pki/server.crt" --tls-private-key-file "$pki/server.key" \
  --token-auth-file "$tmp/tokens.csv" --authorization-mode RBAC \
  --service-account-key-file "$pki/sa.pub" --service-account-signing-key-file "$pki/sa.key" \
  --service-account-issuer https://kubernetes.default.svc --api-audiences https://kubernetes.default.svc \
  --service-cluster-ip-range 10.96.0.0/16 --disable-admission-plugins ServiceAccount \
  --allow-privileged=true >"$tmp/apiserver.log" 2>&1 &
pids+=($!)
export KUBECONFIG="$tmp/kubeconfig"
cat >"$KUBECONFIG" <<EOF
apiVersion: v1
kind: Config
clusters: [{name: test, cluster: {server: "https://127.0.0.1:$api_port", certificate-authority: "$pki/ca.crt"}}]
users: [{name: admin, user: {token: "$token"}}]
contexts: [{name: test, context: {cluster: test, user: admin}}]
current-context: test
EOF
for _ in $(seq 1 120); do
  kubectl get --raw /readyz >/dev/null 2>&1 && break
  sleep 0.5
done
if ! kubectl get --raw /readyz >/dev/null 2>&1; then
  echo "install-check.sh: kube-apiserver did not become ready" >&2; tail -20 "$tmp/apiserver.log" >&2; exit 1
fi
echo "helm $("$HELM" version --short 2>/dev/null), kube-apiserver $(kube-apiserver --version 2>&1 | awk '{print $2}')"

ns=vmdhcp-system
k() { kubectl "$@" 2>/dev/null; }
helm_() { "$HELM" "$@" --namespace "$ns"; }

# --- every value set is accepted ---------------------------------------------------------------
# (full without ServiceMonitors and the PrometheusRule: there is no Prometheus Operator CRD
# here; its controller.upstreamAgentNamespaces must exist.)
kubectl create namespace harvester-system >/dev/null
expect "install (full values) on Kubernetes 1.20" helm_ install vmdhcp "$chart" --create-namespace \
  -f "$here/values-full.yaml" --set serviceMonitor.enabled=false --set prometheusRule.enabled=false
expect "uninstall (full values)" helm_ uninstall vmdhcp --wait
expect "install (plaintext values)" helm_ install vmdhcp "$chart" -f "$here/values-plaintext.yaml"
expect "uninstall (plaintext values)" helm_ uninstall vmdhcp --wait
expect "install (upstream's values, every key)" helm_ install vmdhcp "$chart" -f "$here/values-upstream.yaml"
expect "uninstall (upstream's values)" helm_ uninstall vmdhcp --wait
# The add-on example's valuesContent, as the add-on's release in harvester-system.
python3 -c 'import sys, yaml; sys.stdout.write(yaml.safe_load(open(sys.argv[1]))["spec"]["valuesContent"])' \
  "$repo/examples/harvester-addon.yaml" >"$tmp/addon-values.yaml" 2>/dev/null \
  || sed -n '/valuesContent: |/,$p' "$repo/examples/harvester-addon.yaml" | tail -n +2 | sed 's/^    //' >"$tmp/addon-values.yaml"
expect "install (the add-on example's values, release harvester-vm-dhcp-controller)" \
  "$HELM" install harvester-vm-dhcp-controller "$chart" --namespace harvester-system -f "$tmp/addon-values.yaml"
expect "uninstall (the add-on example's values)" "$HELM" uninstall harvester-vm-dhcp-controller --namespace harvester-system --wait
expect "install (default values)" helm_ install vmdhcp "$chart"

# --- objects -----------------------------------------------------------------------------------
expect "PodDisruptionBudgets served as policy/v1beta1" \
  k get poddisruptionbudgets.v1beta1.policy -n "$ns" vmdhcp-controller vmdhcp-agent
expect "webhook configurations exist" \
  k get mutatingwebhookconfiguration/vmdhcp-webhook validatingwebhookconfiguration/vmdhcp-webhook
expect "CRDs installed from crds/" \
  k get crd ippools.network.harvesterhci.io virtualmachinenetworkconfigs.network.harvesterhci.io

# --- RBAC --------------------------------------------------------------------------------------
ctrl=system:serviceaccount:$ns:vmdhcp-controller
# can yes|no SERVICEACCOUNT VERB GROUP RESOURCE[/SUBRESOURCE] [NAMESPACE [NAME]]: a
# SubjectAccessReview, so that resources of CRDs absent here (KubeVirt, Multus) can be asked about.
can() {
  local want="$1" sa="$2" verb="$3" group="$4" resource="${5%%/*}" sub="" ns_="${6:-}" name="${7:-}"
  [[ "$5" == */* ]] && sub="${5#*/}"
  local got
  got="$(kubectl create -o jsonpath='{.status.allowed}' -f - 2>&1 <<EOF
apiVersion: authorization.k8s.io/v1
kind: SubjectAccessReview
spec:
  user: system:serviceaccount:$ns:$sa
  groups: [system:serviceaccounts, "system:serviceaccounts:$ns", system:authenticated]
  resourceAttributes: {verb: "$verb", group: "$group", resource: "$resource", subresource: "$sub", namespace: "$ns_", name: "$name"}
EOF
)" || true
  case "$got" in true) got=yes ;; false) got=no ;; esac
  local what="$sa may $verb ${group:+$group/}$5${name:+ $name}${ns_:+ in $ns_}"
  if [ "$got" = "$want" ]; then ok "$what: $want"; else not_ok "$what: want $want, got $got"; fi
}
C=vmdhcp-controller; A=vmdhcp-agent
can yes $C patch apps deployments "$ns" vmdhcp-agent
can no  $C patch apps deployments "$ns" vmdhcp-controller
can no  $C list apps deployments "$ns"
can no  $C patch apps deployments default vmdhcp-agent
can no  $C create coordination.k8s.io leases "$ns"
can yes $C update coordination.k8s.io leases "$ns" vm-dhcp-controllers
can no  $C update coordination.k8s.io leases "$ns" vm-dhcp-agents
can no  $C create "" secrets "$ns"
can yes $C update "" secrets "$ns" vmdhcp-controller-tls
can no  $C get "" secrets "$ns" other
can no  $C get "" secrets default vmdhcp-controller-tls
can yes $C update "" configmaps "$ns" vmdhcp-controller-ca
can yes $C patch "" configmaps "$ns" vm-dhcp-controllers-agent-reports
can no  $C get "" configmaps "$ns" other
can yes $C get coordination.k8s.io leases "$ns" vm-dhcp-agents
can yes $C watch coordination.k8s.io leases "$ns" vm-dhcp-agents
can no  $C patch coordination.k8s.io leases "$ns" vm-dhcp-controllers
# Upstream's agent pods: only in controller.upstreamAgentNamespaces (default: the release's).
can yes $C delete "" pods "$ns" default-net-48-agent
can yes $C get "" pods "$ns" default-net-48-agent
can no  $C delete "" pods harvester-system default-net-48-agent
can no  $C get "" pods default
can no  $C create "" pods "$ns"
can yes $C create authentication.k8s.io tokenreviews
can yes $C update admissionregistration.k8s.io validatingwebhookconfigurations "" vmdhcp-webhook
can yes $C update admissionregistration.k8s.io mutatingwebhookconfigurations "" vmdhcp-webhook
can no  $C patch admissionregistration.k8s.io validatingwebhookconfigurations "" vmdhcp-webhook
can no  $C update admissionregistration.k8s.io validatingwebhookconfigurations "" other
can no  $C list admissionregistration.k8s.io validatingwebhookconfigurations
can yes $C update network.harvesterhci.io ippools/status default
can no  $C patch network.harvesterhci.io ippools/status default
can no  $C create network.harvesterhci.io ippools default
can no  $C delete network.harvesterhci.io ippools default
can yes $C create network.harvesterhci.io virtualmachinenetworkconfigs default
can yes $C delete network.harvesterhci.io virtualmachinenetworkconfigs default
can no  $C update network.harvesterhci.io virtualmachinenetworkconfigs default
can yes $C watch kubevirt.io virtualmachines default
can no  $C update kubevirt.io virtualmachines default
can yes $C patch k8s.cni.cncf.io network-attachment-definitions default
can no  $C update k8s.cni.cncf.io network-attachment-definitions default
can no  $C delete k8s.cni.cncf.io network-attachment-definitions default
can no  $C create "" events default
can yes $C create events.k8s.io events default
can yes $C patch events.k8s.io events default
can no  $A patch apps deployments "$ns" vmdhcp-agent
can no  $A get apps deployments "$ns" vmdhcp-agent
can no  $A create coordination.k8s.io leases "$ns"
can yes $A update coordination.k8s.io leases "$ns" vm-dhcp-agents
can no  $A update coordination.k8s.io leases "$ns" vm-dhcp-controllers
can yes $A list network.harvesterhci.io ippools
can yes $A watch network.harvesterhci.io ippools
can no  $A get network.harvesterhci.io ippools default
can no  $A patch network.harvesterhci.io ippools default
can no  $A update network.harvesterhci.io ippools/status default
can no  $A get "" secrets "$ns" vmdhcp-controller-tls
can no  $A create authentication.k8s.io tokenreviews
# What the controller really does: list + watch with a metadata.name field selector.
expect "controller lists the agent Deployment by field selector" \
  kubectl --as "$ctrl" -n "$ns" get deployments --field-selector metadata.name=vmdhcp-agent -o name
if timeout 3 kubectl --as "$ctrl" -n "$ns" get deployments --field-selector metadata.name=vmdhcp-agent \
     --watch -o name >"$tmp/watch" 2>&1 || grep -q vmdhcp-agent "$tmp/watch"; then
  ok "controller watches the agent Deployment by field selector"
else
  not_ok "controller watches the agent Deployment by field selector"; sed 's/^/      /' "$tmp/watch"
fi

# --- webhook wiring ----------------------------------------------------------------------------
if kubectl apply -f "$repo/examples/ippool.yaml" >"$tmp/out" 2>&1; then
  not_ok "IPPool refused while no controller answers (failurePolicy Fail)"
elif grep -q 'failed calling webhook "mutate.vmdhcp.network.harvesterhci.io".*vmdhcp-controller.vmdhcp-system.svc:443/mutate' "$tmp/out"; then
  ok "IPPool refused while no controller answers: webhook calls vmdhcp-controller.$ns.svc:443/mutate"
else
  not_ok "IPPool refused, but not by the webhook"; sed 's/^/      /' "$tmp/out"
fi

# --- upgrades keep the controller's bootstrap ----------------------------------------------------
bootstrap='{"spec":{"template":{"metadata":{"annotations":{"k8s.v1.cni.cncf.io/networks":"default/net-48@vmd3a2b1c0d9e"}},"spec":{"containers":[{"name":"agent","env":[{"name":"AGENT_NETWORK_CONFIGS","value":"[{\"interfaceName\":\"vmd3a2b1c0d9e\",\"serverIP\":\"192.168.48.77\",\"cidr\":\"192.168.48.0/24\",\"ipPoolName\":\"default/net-48\",\"ipPoolRef\":\"default/net-48\",\"nadName\":\"default/net-48\"}]"},{"name":"IPPOOL_REFS_JSON","value":"[\"default/net-48\"]"}]}]}}}}'
state() { # the Multus annotation and the two bootstrap env values of the live agent Deployment
  k -n "$ns" get deployment vmdhcp-agent -o json | python3 -c '
import json, sys
t = json.load(sys.stdin)["spec"]["template"]
env = {e["name"]: e.get("value") for c in t["spec"]["containers"] if c["name"] == "agent" for e in c.get("env", [])}
print(json.dumps([(t["metadata"].get("annotations") or {}).get("k8s.v1.cni.cncf.io/networks"),
                  env.get("AGENT_NETWORK_CONFIGS"), env.get("IPPOOL_REFS_JSON")]))'
}
generation() { k -n "$ns" get deployment vmdhcp-agent -o jsonpath='{.metadata.generation}'; }
expect "fresh install ships the empty bootstrap" test "$(state)" = '[null, "[]", "[]"]'
# A bare PATCH, as the controller sends it (kubectl patch would GET first, which it may not).
patch_as_controller() {
  curl -sf -o /dev/null --cacert "$pki/ca.crt" -X PATCH \
    -H "Authorization: Bearer $(kubectl -n "$ns" create token vmdhcp-controller)" \
    -H 'Content-Type: application/strategic-merge-patch+json' --data "$bootstrap" \
    "https://127.0.0.1:$api_port/apis/apps/v1/namespaces/$ns/deployments/vmdhcp-agent"
}
expect "the controller's ServiceAccount writes the bootstrap" patch_as_controller
written="$(state)"
expect "helm upgrade with new values succeeds (no field-manager conflict)" \
  helm_ upgrade vmdhcp "$chart" --set agent.image.tag=0.1.1 --set logging.level=debug
expect "helm upgrade kept the bootstrap env and annotation" test "$(state)" = "$written"
expect "helm upgrade applied the new values" \
  test "$(k -n "$ns" get deployment vmdhcp-agent -o jsonpath='{.spec.template.spec.containers[0].image}')" = ghcr.io/vmdhcp/vm-dhcp-agent:0.1.1
before="$(generation)"
expect "a no-op helm upgrade succeeds" helm_ upgrade vmdhcp "$chart" --reuse-values
expect "a no-op helm upgrade does not roll the agents" test "$(generation)" = "$before"
# --- the binaries, as the chart configures them, under the chart's ServiceAccounts --------------
# Each runs with its Deployment's args and env (read back from the API), a kubeconfig holding a
# token of its ServiceAccount, and only the listen addresses moved to loopback ports: the
# controller must create its Secret and ConfigMap, inject the webhook CA, take its Lease and reset
# the agent bootstrap; the agent must take its Lease and be served the TLS stream with its
# projected-style token (TokenReview by the controller's identity).
target="${CARGO_TARGET_DIR:-$repo/target}/debug"
(cd "$repo" && cargo build --quiet --locked -p vmdhcp-controller -p vmdhcp-agent)
sa_kubeconfig() { # sa_kubeconfig NAME -> path of a kubeconfig with a token of that ServiceAccount
  local t; t="$(kubectl -n "$ns" create token "$1")"
  sed "s|token: \".*\"|token: \"$t\"|" "$KUBECONFIG" >"$tmp/$1.kubeconfig"
  echo "$tmp/$1.kubeconfig"
}
pod_env() { # pod_env DEPLOYMENT POD_NAME: the container's env as NAME=VALUE lines, then its args
  k -n "$ns" get deployment "$1" -o json | python3 -c '
import json, sys
c = json.load(sys.stdin)["spec"]["template"]["spec"]["containers"][0]
field = {"metadata.name": sys.argv[1], "metadata.namespace": sys.argv[2], "spec.nodeName": "node-0"}
for e in c.get("env", []):
    if "value" in e: print(e["name"] + "=" + e["value"])
    elif "fieldRef" in e.get("valueFrom", {}): print(e["name"] + "=" + field[e["valueFrom"]["fieldRef"]["fieldPath"]])
print("ARGS=" + " ".join(c.get("args", [])))' "$2" "$ns"
}
run_as() { # run_as DEPLOYMENT POD_NAME BINARY LOG [KEY=VALUE | --flag]...: start it in the background
  local deploy="$1" pod="$2" binary="$3" log="$4"; shift 4
  local -a envs=() args=() more=()
  while IFS= read -r line; do
    case "$line" in ARGS=*) read -r -a args <<<"${line#ARGS=}" ;; *) envs+=("$line") ;; esac
  done < <(pod_env "$deploy" "$pod")
  for a in "$@"; do case "$a" in --*) more+=("$a") ;; *) envs+=("$a") ;; esac; done
  env -i PATH="$PATH" "${envs[@]}" "$target/$binary" "${args[@]}" "${more[@]}" >"$log" 2>&1 &
  pids+=($!)
}
wait_for() { # wait_for DESCRIPTION COMMAND...: polls up to 60 s
  local what="$1"; shift
  for _ in $(seq 1 300); do "$@" >/dev/null 2>&1 && { ok "$what"; return; }; sleep 0.2; done
  not_ok "$what"
}
grpc="$(free_port)"; chttp="$(free_port)"; ahttp="$(free_port)"
run_as vmdhcp-controller vmdhcp-controller-0 vm-dhcp-controller "$tmp/controller.log" \
  KUBECONFIG="$(sa_kubeconfig vmdhcp-controller)" GRPC_LISTEN="127.0.0.1:$grpc" \
  HTTP_LISTEN="127.0.0.1:$chttp" WEBHOOK_LISTEN="127.0.0.1:$(free_port)" TLS_SANS=127.0.0.1
filled() { test -n "$(k -n "$ns" get "$1" -o jsonpath="$2")"; }
wait_for "controller (as its ServiceAccount) issues its CA and certificate into the chart's Secret" \
  filled secret/vmdhcp-controller-tls '{.data.tls\.crt}'
wait_for "controller publishes its CA in the chart's ConfigMap vmdhcp-controller-ca" \
  filled configmap/vmdhcp-controller-ca '{.data.ca\.crt}'
has_ca_bundle() { test -n "$(k get "$1" vmdhcp-webhook -o jsonpath='{.webhooks[0].clientConfig.caBundle}')"; }
wait_for "controller injects the CA into the MutatingWebhookConfiguration" has_ca_bundle mutatingwebhookconfiguration
wait_for "controller injects the CA into the ValidatingWebhookConfiguration" has_ca_bundle validatingwebhookconfiguration
holder() { test "$(k -n "$ns" get lease "$1" -o jsonpath='{.spec.holderIdentity}')" = "$2"; }
wait_for "controller holds its Lease" holder vm-dhcp-controllers vmdhcp-controller-0
bootstrap_empty() { case "$(state)" in '[null, "[]", "[]"]' | '["", "[]", "[]"]') ;; *) false ;; esac; }
wait_for "controller resets the agent bootstrap to its (empty) set of pools" bootstrap_empty
k -n "$ns" get configmap vmdhcp-controller-ca -o jsonpath='{.data.ca\.crt}' >"$tmp/ca.crt"
kubectl -n "$ns" create token vmdhcp-agent --audience vm-dhcp-controller >"$tmp/agent.token"
# One pool in its bootstrap (an agent with none idles); its interface is absent here, which only
# that pool's server reports.
run_as vmdhcp-agent vmdhcp-agent-0 vm-dhcp-agent "$tmp/agent.log" \
  KUBECONFIG="$(sa_kubeconfig vmdhcp-agent)" HTTP_LISTEN="127.0.0.1:$ahttp" \
  CONTROLLER_ENDPOINT="https://127.0.0.1:$grpc" CONTROLLER_CA_FILE="$tmp/ca.crt" TOKEN_FILE="$tmp/agent.token" \
  AGENT_NETWORK_CONFIGS='[{"interfaceName":"vmd3a2b1c0d9e","serverIP":"192.168.48.77","cidr":"192.168.48.0/24","ipPoolName":"default/net-48","ipPoolRef":"default/net-48","nadName":"default/net-48"}]' \
  IPPOOL_REFS_JSON='["default/net-48"]' --no-configure-interfaces
wait_for "agent (as its ServiceAccount) holds its Lease" holder vm-dhcp-agents vmdhcp-agent-0
stream_clients() { curl -sf "http://127.0.0.1:$chttp/metrics" | grep -q '^vmdhcpcontroller_stream_clients 1$'; }
wait_for "agent is served the TLS config stream with its token" stream_clients
if grep -qi 'forbidden' "$tmp/controller.log" "$tmp/agent.log"; then
  not_ok "no API call of either binary was forbidden"; grep -hi 'forbidden' "$tmp/controller.log" "$tmp/agent.log" | head -5 | sed 's/^/      /'
else
  ok "no API call of either binary was forbidden"
fi
if [ "$failed" -gt 0 ]; then
  echo "--- controller log"; tail -20 "$tmp/controller.log"; echo "--- agent log"; tail -20 "$tmp/agent.log"
fi

expect "helm uninstall" helm_ uninstall vmdhcp --wait
expect "uninstall leaves no Deployment, webhook, ClusterRole, Secret, ConfigMap or Lease behind" \
  test -z "$(k get deployments -n "$ns" -o name; k get mutatingwebhookconfigurations,validatingwebhookconfigurations,clusterroles -o name | grep vmdhcp
             k -n "$ns" get secrets,configmaps,leases -o name | grep -E 'vmdhcp|vm-dhcp')"

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
