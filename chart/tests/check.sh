#!/usr/bin/env bash
# Static tests of the Helm chart, no cluster needed:
#   1. `helm lint --strict` with the default values and each tests/values-*.yaml (and for
#      Kubernetes 1.20, the oldest version the chart supports);
#   2. `helm template` (release "vmdhcp", namespace "vmdhcp-system") of each value set,
#      normalised (documents sorted by kind/namespace/name, keys sorted) and compared with
#      tests/golden/<set>.yaml; a mismatch prints a unified diff and fails.
#      UPDATE_GOLDEN=1 rewrites the golden files instead;
#   3. invariants of the rendered objects (check_render.py): agent capabilities, the empty
#      bootstrap, least-privilege RBAC, names shared between the controller's flags and the
#      objects, the ServiceMonitor only when enabled, the NetworkPolicies' ports and peers (and
#      that they admit the Prometheus of the set's ServiceMonitors: a self-test shows the check
#      fails NetworkPolicies that would block it), PDB apiVersion per Kubernetes version;
#   4. invalid values (schema and template checks) make `helm template` fail;
#   5. upstream's values (harvester/vm-dhcp-controller's chart and Harvester's packaging of it):
#      tests/values-upstream*.yaml and the valuesContent of examples/harvester-addon.yaml (checked
#      to be an Addon of Harvester's add-on, for this chart's name and version, then rendered as
#      release harvester-vm-dhcp-controller in harvester-system, and again with its monitoring on:
#      harvester-monitoring) are value sets like the others;
#      the install notes of every set are compared with tests/golden/<set>.notes.txt (they name
#      the key each upstream value became), and check_render.py asserts each mapping;
#   6. the alerts: files/alerts.yaml is the PrometheusRule rendered with the default values
#      (UPDATE_GOLDEN=1 rewrites it), `promtool check rules` on it and on the full set's
#      render, `promtool test rules tests/alerts-test.yaml`, and check_render.py's coverage:
#      each alert has a severity, summary, description, a runbook anchor that is a heading of
#      docs/alerts.md (the runbooks; prometheusRule.runbookURL is its base, and empty drops it), tests where it fires and where it does not, keeps the
#      `namespace` label through every aggregation (and the tests expect it), and reads only
#      documented series, as does every dashboard query.
#
# helm: $HELM, else `helm` on PATH (scripts/install-helm.sh installs one).
# promtool: $PROMTOOL, else `promtool` on PATH (Debian's prometheus; scripts/install-deps.sh).
# python3 with PyYAML: the system's if it has PyYAML, else a venv under $VMDHCP_CACHE.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
chart="$(dirname "$here")"
golden="$here/golden"
root="$(dirname "$chart")"
version="$(sed -n 's/^version: //p' "$chart/Chart.yaml")"
release=vmdhcp
namespace=vmdhcp-system

HELM="${HELM:-$(command -v helm || true)}"
if [ -z "$HELM" ] || ! "$HELM" version >/dev/null 2>&1; then
  echo "check.sh: no helm: set HELM or put helm on PATH (scripts/install-helm.sh)" >&2
  exit 2
fi

PYTHON=python3
if ! "$PYTHON" -c 'import yaml' >/dev/null 2>&1; then
  venv="${VMDHCP_CACHE:-$HOME/.cache/vmdhcp}/venv-chart-tests"
  if ! "$venv/bin/python" -c 'import yaml' >/dev/null 2>&1; then
    echo "check.sh: installing PyYAML into $venv" >&2
    python3 -m venv "$venv" >&2
    "$venv/bin/pip" install -q --disable-pip-version-check PyYAML >&2
  fi
  PYTHON="$venv/bin/python"
fi

tmp="$(mktemp -d "${TMPDIR:-/tmp}/vmdhcp-chart.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT

passed=0
failed=0
ok() { passed=$((passed + 1)); printf 'ok    %s\n' "$*"; }
not_ok() { failed=$((failed + 1)); printf 'FAIL  %s\n' "$*"; }

echo "helm $("$HELM" version --short 2>/dev/null)"

# The add-on example: an Addon of Harvester's add-on, for this chart; its valuesContent is a set.
addon_example="$chart/../examples/harvester-addon.yaml"
rc=0
out="$("$PYTHON" "$here/check_render.py" addon "$addon_example" "$chart/Chart.yaml" "$tmp/harvester-addon.values.yaml" 2>&1)" || rc=$?
printf '%s\n' "$out"
passed=$((passed + $(printf '%s\n' "$out" | grep -c '^ok ' || true)))
failed=$((failed + $(printf '%s\n' "$out" | grep -c '^FAIL ' || true)))
if [ "$rc" -ne 0 ]; then not_ok "check_render.py addon exited $rc"; fi

# Value sets: name -> extra helm arguments, release and namespace.
# harvester-monitoring: the add-on example with its monitoring keys' `enabled` set true, as on a
# Harvester whose monitoring add-on is on.
sets=(default full plaintext upstream upstream-defaults upstream-precedence harvester-addon harvester-monitoring)
set_args() {
  case "$1" in
    default) ;;
    harvester-addon) printf '%s\n' -f "$tmp/harvester-addon.values.yaml" ;;
    harvester-monitoring) printf '%s\n' -f "$tmp/harvester-addon.values.yaml" --set serviceMonitor.enabled=true \
                            --set prometheusRule.enabled=true --set dashboard.enabled=true --set networkPolicy.enabled=true ;;
    *) printf '%s\n' -f "$here/values-$1.yaml" ;;
  esac
}
set_release() { case "$1" in harvester-*) echo harvester-vm-dhcp-controller ;; *) echo "$release" ;; esac; }
set_namespace() { case "$1" in harvester-*) echo harvester-system ;; *) echo "$namespace" ;; esac; }

# 1. lint
for set in "${sets[@]}"; do
  mapfile -t args < <(set_args "$set")
  for kube in "" 1.20.2; do
    what="lint --strict ($set${kube:+, kube $kube})"
    if out="$("$HELM" lint --strict "$chart" --namespace "$(set_namespace "$set")" ${kube:+--kube-version "$kube"} "${args[@]}" 2>&1)"; then
      ok "$what"
    else
      not_ok "$what"; printf '%s\n' "$out" | sed 's/^/      /'
    fi
  done
done

# 2. golden renders
mkdir -p "$golden"
for set in "${sets[@]}"; do
  mapfile -t args < <(set_args "$set")
  if ! "$HELM" template "$(set_release "$set")" "$chart" --namespace "$(set_namespace "$set")" "${args[@]}" >"$tmp/$set.yaml" 2>"$tmp/$set.err"; then
    not_ok "template ($set)"; sed 's/^/      /' "$tmp/$set.err"; continue
  fi
  if ! "$PYTHON" "$here/check_render.py" normalize "$tmp/$set.yaml" >"$tmp/$set.norm.yaml"; then
    not_ok "normalize ($set)"; continue
  fi
  if [ "${UPDATE_GOLDEN:-}" = 1 ]; then
    cp "$tmp/$set.norm.yaml" "$golden/$set.yaml"
    ok "golden $set.yaml rewritten"
  elif [ ! -f "$golden/$set.yaml" ]; then
    not_ok "golden $set.yaml missing (UPDATE_GOLDEN=1 writes it)"
  elif diff -u --label "golden/$set.yaml" --label "rendered ($set)" "$golden/$set.yaml" "$tmp/$set.norm.yaml" >"$tmp/$set.diff"; then
    ok "golden ($set)"
  else
    not_ok "golden ($set): rendered objects differ (UPDATE_GOLDEN=1 to accept)"; cat "$tmp/$set.diff"
  fi
done

# The chart as Harvester's add-on fetches it: packaged under upstream's name
# (scripts/package-chart.sh), it renders the harvester-addon set's objects, names and selectors
# included, but for the helm.sh/chart label.
if HELM="$HELM" "$root/scripts/package-chart.sh" "$tmp/repo" >"$tmp/package.out" 2>&1 \
   && "$HELM" template harvester-vm-dhcp-controller "$tmp/repo/harvester-vm-dhcp-controller-$version.tgz" \
        --namespace harvester-system -f "$tmp/harvester-addon.values.yaml" >"$tmp/renamed.yaml" 2>"$tmp/renamed.err" \
   && "$PYTHON" "$here/check_render.py" normalize "$tmp/renamed.yaml" >"$tmp/renamed.norm.yaml"; then
  if diff -u --label "rendered (harvester-addon)" --label "packaged as harvester-vm-dhcp-controller" \
       <(grep -v '^ *helm.sh/chart: ' "$tmp/harvester-addon.norm.yaml") \
       <(grep -v '^ *helm.sh/chart: ' "$tmp/renamed.norm.yaml") >"$tmp/renamed.diff"; then
    ok "packaged as harvester-vm-dhcp-controller $version, it renders the same objects (helm.sh/chart aside)"
  else
    not_ok "packaged as harvester-vm-dhcp-controller, it renders other objects"; cat "$tmp/renamed.diff"
  fi
  if grep -q "helm.sh/chart: harvester-vm-dhcp-controller-$version" "$tmp/renamed.norm.yaml"; then
    ok "the renamed package labels its objects helm.sh/chart: harvester-vm-dhcp-controller-$version"
  else
    not_ok "the renamed package's helm.sh/chart label"
  fi
else
  not_ok "package the chart under upstream's name and render it"; cat "$tmp/package.out" "$tmp/renamed.err" 2>/dev/null | sed 's/^/      /'
fi

# The install notes (helm install --dry-run=client: no cluster), which name the key each of
# upstream's values became.
for set in "${sets[@]}"; do
  mapfile -t args < <(set_args "$set")
  if ! "$HELM" install "$(set_release "$set")" "$chart" --namespace "$(set_namespace "$set")" --dry-run=client -o json \
       "${args[@]}" 2>"$tmp/$set.notes.err" | "$PYTHON" -c 'import json, sys; sys.stdout.write(json.load(sys.stdin)["info"]["notes"])' \
       >"$tmp/$set.notes.txt" 2>>"$tmp/$set.notes.err"; then
    not_ok "install notes ($set)"; sed 's/^/      /' "$tmp/$set.notes.err"; continue
  fi
  if [ "${UPDATE_GOLDEN:-}" = 1 ]; then
    cp "$tmp/$set.notes.txt" "$golden/$set.notes.txt"
    ok "golden $set.notes.txt rewritten"
  elif [ ! -f "$golden/$set.notes.txt" ]; then
    not_ok "golden $set.notes.txt missing (UPDATE_GOLDEN=1 writes it)"
  elif diff -u --label "golden/$set.notes.txt" --label "notes ($set)" "$golden/$set.notes.txt" "$tmp/$set.notes.txt" >"$tmp/$set.notes.diff"; then
    ok "golden notes ($set)"
  else
    not_ok "golden notes ($set): the install notes differ (UPDATE_GOLDEN=1 to accept)"; cat "$tmp/$set.notes.diff"
  fi
done

# The oldest supported Kubernetes (PodDisruptionBudget policy/v1beta1).
if "$HELM" template "$release" "$chart" --namespace "$namespace" --kube-version 1.20.2 >"$tmp/kube120.yaml" 2>"$tmp/kube120.err"; then
  ok "template (default, kube 1.20.2)"
else
  not_ok "template (default, kube 1.20.2)"; sed 's/^/      /' "$tmp/kube120.err"
fi

# 3. invariants
for set in "${sets[@]}" kube120; do
  [ -s "$tmp/$set.yaml" ] || continue
  rc=0
  out="$("$PYTHON" "$here/check_render.py" check "$set" "$tmp/$set.yaml" "$(set_release "$set")" "$(set_namespace "$set")" 2>&1)" || rc=$?
  printf '%s\n' "$out"
  p="$(printf '%s\n' "$out" | grep -c '^ok ' || true)"
  f="$(printf '%s\n' "$out" | grep -c '^FAIL ' || true)"
  passed=$((passed + p)); failed=$((failed + f))
  if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then not_ok "check_render.py $set exited $rc"; fi
done

# The NetworkPolicies never block a ServiceMonitor of the same release (check_render.py checks it
# on every set above); the check itself must fail on a NetworkPolicy that admits to the metrics
# port only a namespace other than the Prometheus's, and pass for that namespace.
cat >"$tmp/np-elsewhere.yaml" <<'EOF'
serviceMonitor: {enabled: true}
networkPolicy:
  enabled: true
  metrics:
    prometheusNamespace: ""
    from: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: elsewhere}}}]
EOF
if "$HELM" template "$release" "$chart" --namespace "$namespace" -f "$tmp/np-elsewhere.yaml" \
     >"$tmp/np-elsewhere.render.yaml" 2>"$tmp/np-elsewhere.err"; then
  rc=0; "$PYTHON" "$here/check_render.py" scrape "$tmp/np-elsewhere.render.yaml" cattle-monitoring-system \
    >"$tmp/np-elsewhere.out" 2>&1 || rc=$?
  if [ "$rc" -ne 0 ] && grep -q '^FAIL .*ServiceMonitor' "$tmp/np-elsewhere.out"; then
    ok "the scrape check fails NetworkPolicies that admit only another namespace than the Prometheus's"
  else
    not_ok "the scrape check passed NetworkPolicies that block the ServiceMonitors' Prometheus"; sed 's/^/      /' "$tmp/np-elsewhere.out"
  fi
  if "$PYTHON" "$here/check_render.py" scrape "$tmp/np-elsewhere.render.yaml" elsewhere >"$tmp/np-elsewhere.out" 2>&1; then
    ok "the scrape check passes the same NetworkPolicies for a Prometheus in the namespace they admit"
  else
    not_ok "the scrape check fails NetworkPolicies that admit the Prometheus's namespace"; sed 's/^/      /' "$tmp/np-elsewhere.out"
  fi
else
  not_ok "template (NetworkPolicies admitting namespace elsewhere)"; sed 's/^/      /' "$tmp/np-elsewhere.err"
fi

# 4. invalid values are refused: refuse WHAT TEXT-THE-ERROR-NAMES HELM-ARGS...
refuse() {
  local what="$1" expect="$2"; shift 2
  if "$HELM" template "$release" "$chart" --namespace "$namespace" "$@" >/dev/null 2>"$tmp/refuse.err"; then
    not_ok "refused: $what (helm template succeeded)"
  elif grep -qi -- "$expect" "$tmp/refuse.err"; then
    ok "refused: $what"
  else
    not_ok "refused: $what (error does not mention '$expect')"; sed 's/^/      /' "$tmp/refuse.err"
  fi
}
cat >"$tmp/typo.yaml" <<'EOF'
controler:
  replicas: 3
EOF
cat >"$tmp/nested-typo.yaml" <<'EOF'
agent:
  leaderElection:
    leaseDuration: 20
EOF
refuse "tls.mode: bogus" "mode" --set tls.mode=bogus
refuse "tls.mode=plaintext without tls.insecure=true" "tls.insecure=true" --set tls.mode=plaintext
refuse "tls.mode=plaintext with tls.insecure=false" "tls.insecure=true" --set tls.mode=plaintext --set tls.insecure=false
refuse "tls.insecure: \"yes\"" "insecure" --set tls.mode=plaintext --set-string tls.insecure=yes
refuse "networkPolicy.webhook.from not a list" "from" --set networkPolicy.enabled=true --set networkPolicy.webhook.from=10.0.0.0/8
refuse "serviceMonitor with networkPolicy admitting nobody to the metrics port" "prometheusNamespace" \
  --set serviceMonitor.enabled=true --set networkPolicy.enabled=true --set networkPolicy.metrics.prometheusNamespace=
refuse "networkPolicy.metrics.prometheusNamespace: not a namespace name" "prometheusNamespace" \
  --set networkPolicy.metrics.prometheusNamespace=Cattle_Monitoring
refuse "a typo'd networkPolicy key (networkPolicy.metrics.form)" "form" --set 'networkPolicy.metrics.form[0].podSelector.x=y'
refuse "controller.upstreamAgentNamespaces: not a namespace name" "upstreamAgentNamespaces" --set 'controller.upstreamAgentNamespaces={Harvester_System}'
refuse "a typo'd top-level key (controler)" "controler" -f "$tmp/typo.yaml"
refuse "a typo'd nested key (agent.leaderElection.leaseDuration)" "leaseDuration" -f "$tmp/nested-typo.yaml"
refuse "logging.format: xml" "format" --set logging.format=xml
refuse "webhook.failurePolicy: Never" "failurePolicy" --set webhook.failurePolicy=Never
refuse "webhook.timeoutSeconds: 31" "timeoutSeconds" --set webhook.timeoutSeconds=31
refuse "controller.replicas: \"two\"" "replicas" --set-string controller.replicas=two
refuse "agent.capabilities containing ALL" "capabilities" --set 'agent.capabilities={NET_ADMIN,ALL}'
refuse "agent.securityContext.capabilities (owned by agent.capabilities)" "securityContext" --set 'agent.securityContext.capabilities.add={SYS_ADMIN}'
refuse "the Multus annotation in agent.podAnnotations" "podAnnotations" --set-string 'agent.podAnnotations.k8s\.v1\.cni\.cncf\.io/networks=x'
refuse "tls.tokenExpirationSeconds below 600" "tokenExpirationSeconds" --set tls.tokenExpirationSeconds=60
refuse "serviceMonitor.interval: 30 (no unit)" "interval" --set-string serviceMonitor.interval=30
refuse "controller.serviceCIDR: not a CIDR" "serviceCIDR" --set controller.serviceCIDR=10.43.0.0
refuse "tracing.otlpEndpoint without scheme" "otlpEndpoint" --set tracing.otlpEndpoint=collector:4317
refuse "agent renewDeadlineSeconds >= leaseDurationSeconds" "renewDeadlineSeconds" --set agent.leaderElection.renewDeadlineSeconds=15
refuse "controller retryPeriodSeconds >= renewDeadlineSeconds" "retryPeriodSeconds" --set controller.leaderElection.retryPeriodSeconds=10
refuse "tracing.sampler without an endpoint" "otlpEndpoint" --set tracing.sampler=always_on
refuse "serviceAccount.create=false without a name" "serviceAccount.name" --set agent.serviceAccount.create=false
refuse "prometheusRule.thresholds.poolAvailablePercent: 120" "poolAvailablePercent" --set prometheusRule.thresholds.poolAvailablePercent=120
refuse "prometheusRule.thresholds: certificate critical days not below warning days" "certificateExpiryCriticalDays" \
  --set prometheusRule.thresholds.certificateExpiryCriticalDays=7
refuse "prometheusRule.thresholds.certificateExpiryWarningDays: 0" "certificateExpiryWarningDays" \
  --set prometheusRule.thresholds.certificateExpiryWarningDays=0
refuse "prometheusRule.runbookURL with its own anchor" "runbookURL" --set prometheusRule.runbookURL=docs/alerts.md#top
refuse "prometheusRule.for of an unknown alert" "VmdhcpNoSuchAlert" --set prometheusRule.for.VmdhcpNoSuchAlert=1m
refuse "prometheusRule.for.VmdhcpPoolExhausted: 5 (no unit)" "VmdhcpPoolExhausted" --set-string prometheusRule.for.VmdhcpPoolExhausted=5
refuse "dashboard.labelValue not a string" "labelValue" --set dashboard.labelValue=1
# Upstream's keys are read; anything else of that shape still is not.
refuse "a key neither chart has (replicaCounts)" "replicaCounts" --set replicaCounts=2
refuse "an image field upstream's chart does not have (image.digest)" "digest" --set image.digest=sha256:0
refuse "a typo'd upstream key (serviceAccount.automnt)" "automnt" --set serviceAccount.automnt=true
refuse "upstream's service with a field it does not have (service.nodePort)" "nodePort" --set service.nodePort=30080
refuse "webhook.image with a field upstream's does not have (webhook.image.registry)" "registry" --set webhook.image.registry=x
refuse "the Multus annotation in upstream's podAnnotations" "podAnnotations" --set-string 'podAnnotations.k8s\.v1\.cni\.cncf\.io/networks=x'
refuse "upstream's replicaCount: \"one\"" "replicaCount" --set-string replicaCount=one
refuse "upstream's serviceCIDR: not a CIDR" "serviceCIDR" --set serviceCIDR=10.53.0.0
refuse "upstream's serviceAccount.create=false without a name" "serviceAccount.name" --set serviceAccount.create=false

# 5. each of upstream's values became what the notes say
for set in upstream upstream-defaults upstream-precedence harvester-addon harvester-monitoring; do
  [ -s "$tmp/$set.yaml" ] || continue
  rc=0
  out="$("$PYTHON" "$here/check_render.py" upstream "$set" "$tmp/$set.yaml" "$(set_release "$set")" "$(set_namespace "$set")" 2>&1)" || rc=$?
  printf '%s\n' "$out"
  passed=$((passed + $(printf '%s\n' "$out" | grep -c '^ok ' || true)))
  failed=$((failed + $(printf '%s\n' "$out" | grep -c '^FAIL ' || true)))
  if [ "$rc" -ne 0 ] && ! printf '%s\n' "$out" | grep -q '^FAIL '; then not_ok "check_render.py upstream $set exited $rc"; fi
done

# upstream's replicaCount never takes the controller below 2 replicas; controller.replicas, given,
# still wins: controller_replicas WHAT WANT HELM-ARGS...
controller_replicas() {
  local what="$1" want="$2" got; shift 2
  got="$("$HELM" template "$release" "$chart" --namespace "$namespace" -s templates/controller-deployment.yaml "$@" 2>"$tmp/replicas.err" \
         | "$PYTHON" -c 'import sys, yaml; print(next(d for d in yaml.safe_load_all(sys.stdin) if d)["spec"]["replicas"])' 2>>"$tmp/replicas.err")" || true
  if [ "$got" = "$want" ]; then ok "$what"; else not_ok "$what: got '$got'"; sed 's/^/      /' "$tmp/replicas.err"; fi
}
controller_replicas "upstream's replicaCount=0 -> 2 controller replicas" 2 --set replicaCount=0
controller_replicas "upstream's replicaCount=1 -> 2 controller replicas" 2 --set replicaCount=1
controller_replicas "upstream's replicaCount=3 -> 3 controller replicas" 3 --set replicaCount=3
controller_replicas "controller.replicas=1 wins over replicaCount=1" 1 --set replicaCount=1 --set controller.replicas=1
controller_replicas "controller.replicas=1 wins over replicaCount=3" 1 --set replicaCount=3 --set controller.replicas=1

# 6. alerts
PROMTOOL="${PROMTOOL:-$(command -v promtool || true)}"
if [ -z "$PROMTOOL" ]; then
  not_ok "promtool: none on PATH and PROMTOOL unset (scripts/install-deps.sh installs Debian's prometheus)"
else
  alerts="$chart/files/alerts.yaml"
  if "$HELM" template "$release" "$chart" --namespace "$namespace" -s templates/prometheusrule.yaml \
       --set prometheusRule.enabled=true >"$tmp/rule.yaml" 2>"$tmp/rule.err" \
     && "$PYTHON" "$here/check_render.py" rules "$tmp/rule.yaml" >"$tmp/alerts.yaml" 2>>"$tmp/rule.err"; then
    if [ "${UPDATE_GOLDEN:-}" = 1 ]; then
      cp "$tmp/alerts.yaml" "$alerts"
      ok "files/alerts.yaml rewritten"
    elif diff -u --label files/alerts.yaml --label "rendered PrometheusRule" "$alerts" "$tmp/alerts.yaml" >"$tmp/alerts.diff"; then
      ok "files/alerts.yaml holds the PrometheusRule's rules (default values)"
    else
      not_ok "files/alerts.yaml differs from the PrometheusRule's rules (UPDATE_GOLDEN=1 to accept)"; cat "$tmp/alerts.diff"
    fi
  else
    not_ok "render the PrometheusRule"; sed 's/^/      /' "$tmp/rule.err"
  fi
  "$HELM" template "$release" "$chart" --namespace "$namespace" -s templates/prometheusrule.yaml \
    -f "$here/values-full.yaml" >"$tmp/rule-full.yaml" 2>/dev/null \
    && "$PYTHON" "$here/check_render.py" rules "$tmp/rule-full.yaml" >"$tmp/alerts-full.yaml" 2>/dev/null || true
  for rules in "$alerts" "$tmp/alerts-full.yaml"; do
    what="promtool check rules ($( [ "$rules" = "$alerts" ] && echo files/alerts.yaml || echo 'full values'))"
    if out="$("$PROMTOOL" check rules "$rules" 2>&1)"; then ok "$what: $(printf '%s\n' "$out" | grep -o '[0-9]* rules found')"
    else not_ok "$what"; printf '%s\n' "$out" | sed 's/^/      /'; fi
  done
  # runbook_url: prometheusRule.runbookURL + #<alert>, or none at all when it is empty.
  for base in "" docs/alerts.md https://git.example.org/network/vmdhcp/blob/v0.1.0/docs/alerts.md; do
    out=""
    if "$HELM" template "$release" "$chart" --namespace "$namespace" -s templates/prometheusrule.yaml \
         --set prometheusRule.enabled=true --set-string prometheusRule.runbookURL="$base" \
         >"$tmp/rule-runbook.yaml" 2>"$tmp/rule-runbook.err" \
       && out="$("$PYTHON" "$here/check_render.py" runbooks "$tmp/rule-runbook.yaml" "$base" 2>&1)"; then
      ok "${out#ok    }"
    else
      not_ok "runbookURL=\"$base\""; sed 's/^/      /' "$tmp/rule-runbook.err"; printf '%s\n' "$out" | sed 's/^/      /'
    fi
  done
  if out="$(cd "$here" && "$PROMTOOL" test rules alerts-test.yaml 2>&1)"; then ok "promtool test rules alerts-test.yaml"
  else not_ok "promtool test rules alerts-test.yaml"; printf '%s\n' "$out" | sed 's/^/      /'; fi
  rc=0
  out="$("$PYTHON" "$here/check_render.py" alerts "$alerts" "$here/alerts-test.yaml" "$chart/../docs/alerts.md" \
         "$chart/files/dashboard.json" "$chart/../docs/observability.md" 2>&1)" || rc=$?
  printf '%s\n' "$out"
  p="$(printf '%s\n' "$out" | grep -c '^ok ' || true)"
  f="$(printf '%s\n' "$out" | grep -c '^FAIL ' || true)"
  passed=$((passed + p)); failed=$((failed + f))
  if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then not_ok "check_render.py alerts exited $rc"; fi
fi

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
