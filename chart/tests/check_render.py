#!/usr/bin/env python3
"""Helpers of check.sh for `helm template` output.

  check_render.py normalize RENDERED.yaml
      Prints the documents sorted by kind, namespace and name, keys sorted, each headed by
      `---` and a `# Kind namespace/name` comment: a stable form for the golden files, independent of
      template file order and of helm's formatting.

  check_render.py check SET RENDERED.yaml RELEASE NAMESPACE
      Checks the invariants of the rendered objects for value set SET (default, full,
      plaintext, kube120); prints one `ok ...` or `FAIL ...` line per check and exits 1 if
      any failed.

  check_render.py scrape RENDERED.yaml PROMETHEUS_NAMESPACE
      Checks that the NetworkPolicies in RENDERED.yaml admit a Prometheus in PROMETHEUS_NAMESPACE
      to every port its ServiceMonitors scrape (`check` runs the same on every set).

  check_render.py upstream SET RENDERED.yaml RELEASE NAMESPACE
      Checks that each of upstream's values in value set SET (upstream, upstream-defaults,
      upstream-precedence, harvester-addon) became this chart's key it maps to, or was ignored.

  check_render.py addon ADDON.yaml CHART.yaml VALUES_OUT.yaml
      Checks that ADDON.yaml is an Addon (harvesterhci.io/v1beta1) of Harvester's add-on
      harvester-vm-dhcp-controller in harvester-system, for this chart's name and version, with
      upstream-style valuesContent; writes that valuesContent to VALUES_OUT.yaml.

  check_render.py rules RENDERED.yaml
      Prints the rules of the one PrometheusRule in RENDERED.yaml as a plain Prometheus rules
      file: what chart/files/alerts.yaml must hold (the same rules, for a Prometheus without the
      Operator).

  check_render.py runbooks RENDERED.yaml BASE
      Checks that every alert of the rendered PrometheusRule has the runbook_url BASE#<its name,
      lowercased>, or none when BASE is empty.

  check_render.py alerts RULES.yaml TESTS.yaml RUNBOOKS.md DASHBOARD.json OBSERVABILITY.md
      Checks that every alert has a severity, a summary, a description and a runbook_url whose
      anchor is a heading of RUNBOOKS.md (docs/alerts.md, one runbook per alert) and whose base is
      an address or that file's path; that TESTS.yaml
      (promtool's unit tests) has for every alert a case where it fires and one where it stays
      silent; that every aggregation and match keeps the `namespace` label, and every firing case
      expects it with the alert's other labels; that every series the rules and the dashboard
      query is one the binaries export (named in OBSERVABILITY.md, docs/observability.md).
"""

import json
import os
import re
import sys

import yaml

# The agent's capabilities, exactly (everything else is dropped). Changing them is a decision:
# change values.yaml, this list and the README together.
EXPECTED_CAPS = {
    "default": ["NET_ADMIN", "NET_BIND_SERVICE", "NET_RAW"],
    "kube120": ["NET_ADMIN", "NET_BIND_SERVICE", "NET_RAW"],
    "plaintext": ["NET_ADMIN", "NET_BIND_SERVICE", "NET_RAW"],
    "full": ["NET_ADMIN", "NET_BIND_SERVICE", "NET_RAW"],
}
# The value sets in upstream's terms (tests/values-upstream*.yaml, the add-on example's
# valuesContent): the defaults' invariants hold for each.
UPSTREAM_SETS = ("upstream", "upstream-defaults", "upstream-precedence", "harvester-addon", "harvester-monitoring")
for _s in UPSTREAM_SETS:
    EXPECTED_CAPS[_s] = ["NET_ADMIN", "NET_BIND_SERVICE", "NET_RAW"]
SERVICE_MONITORS = {"default": 0, "kube120": 0, "plaintext": 0, "full": 2}
PROMETHEUS_RULES = {"default": 0, "kube120": 0, "plaintext": 0, "full": 1}
DASHBOARDS = {"default": 0, "kube120": 0, "plaintext": 0, "full": 1}
# The labels every chart object carries; the rest of a ServiceMonitor's labels are
# serviceMonitor.labels, which a Prometheus selects it by.
CHART_LABELS = {"helm.sh/chart", "app.kubernetes.io/name", "app.kubernetes.io/instance",
                "app.kubernetes.io/component", "app.kubernetes.io/version",
                "app.kubernetes.io/managed-by", "app.kubernetes.io/part-of"}
# Which component exports a metric, by prefix: its Service is what that ServiceMonitor selects.
METRIC_COMPONENT = (("vmdhcpcontroller_", "controller"), ("vmdhcp_agent_", "agent"))
NETWORK_POLICIES = {"default": 0, "kube120": 0, "plaintext": 0, "full": 2}
# controller.upstreamAgentNamespaces of each set (empty: the release namespace).
UPSTREAM_NAMESPACES = {"default": [], "kube120": [], "plaintext": [], "full": ["harvester-system"]}
PDB_API = {"default": "policy/v1", "full": "policy/v1", "plaintext": None, "kube120": "policy/v1beta1"}
for _s in UPSTREAM_SETS:
    for _table, _value in ((SERVICE_MONITORS, 0), (PROMETHEUS_RULES, 0), (DASHBOARDS, 0),
                           (NETWORK_POLICIES, 0), (UPSTREAM_NAMESPACES, []), (PDB_API, "policy/v1")):
        _table[_s] = _value
# The add-on example with Harvester's monitoring on (its `enabled` keys set true): everything of
# it rendered, the dashboard where Harvester's Grafana loads dashboards from.
for _table in (SERVICE_MONITORS, NETWORK_POLICIES):
    _table["harvester-monitoring"] = 2
for _table in (PROMETHEUS_RULES, DASHBOARDS):
    _table["harvester-monitoring"] = 1
# The dashboard ConfigMap's namespace, where not the release's (dashboard.namespace).
DASHBOARD_NAMESPACE = {"harvester-monitoring": "cattle-dashboards"}
# The Prometheus that scrapes through a set's ServiceMonitors: its namespace (default: Rancher's
# and Harvester's monitoring, networkPolicy.metrics.prometheusNamespace's default) and labels the
# Prometheus Operator puts on its pods. The NetworkPolicies must admit it (scrape_checks).
PROMETHEUS_NAMESPACE = {"full": "monitoring"}
PROMETHEUS_POD_LABELS = {"app.kubernetes.io/name": "prometheus", "app.kubernetes.io/managed-by": "prometheus-operator"}
WRITE_VERBS = {"create", "update", "patch", "delete", "deletecollection", "*"}
CLUSTER_SCOPED = {"ClusterRole", "ClusterRoleBinding", "MutatingWebhookConfiguration",
                  "ValidatingWebhookConfiguration", "CustomResourceDefinition"}


def load(path):
    with open(path, encoding="utf-8") as f:
        return [d for d in yaml.safe_load_all(f) if d]


def key(doc):
    md = doc.get("metadata", {})
    return (doc.get("kind", ""), md.get("namespace", ""), md.get("name", ""))


def normalize(path):
    out = []
    for doc in sorted(load(path), key=key):
        kind, ns, name = key(doc)
        out.append(f"---\n# {kind} {ns + '/' if ns else ''}{name}\n")
        out.append(yaml.safe_dump(doc, sort_keys=True, default_flow_style=False, width=1000))
    sys.stdout.write("".join(out))


class Checker:
    def __init__(self):
        self.failed = 0

    def check(self, cond, what, detail=""):
        if cond:
            print(f"ok    {what}")
        else:
            self.failed += 1
            print(f"FAIL  {what}{': ' + str(detail) if detail != '' else ''}")
        return cond


def env_map(container):
    return {e["name"]: e for e in container.get("env", [])}


def env_value(container, name):
    e = env_map(container).get(name)
    return None if e is None else e.get("value")


def field_ref(container, name):
    e = env_map(container).get(name) or {}
    return ((e.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath")


def container_named(deploy, name):
    for c in deploy["spec"]["template"]["spec"]["containers"]:
        if c["name"] == name:
            return c
    return None


def flag(container, name):
    """Value of --name=value in the container's args."""
    for a in container.get("args", []):
        if a.startswith(f"--{name}="):
            return a.split("=", 1)[1]
    return None


def selects(selector, labels):
    """Whether a LabelSelector selects an object with `labels` ({} selects everything)."""
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for e in selector.get("matchExpressions") or []:
        has, value = e["key"] in labels, labels.get(e["key"])
        op = e["operator"]
        if (op == "In" and value not in e.get("values", [])) or (op == "NotIn" and value in e.get("values", [])) \
                or (op == "Exists" and not has) or (op == "DoesNotExist" and has):
            return False
    return True


def scrape_checks(c, tag, docs, prom_namespace):
    """For each ServiceMonitor: the port it scrapes (through its Service's targetPort) on the
    pods behind that Service, and whether the NetworkPolicies selecting those pods admit a
    Prometheus pod (PROMETHEUS_POD_LABELS) of namespace `prom_namespace` there. A peer admits it
    by namespaceSelector and/or podSelector; an ipBlock proves nothing (pod addresses vary)."""
    prom_ns_labels = {"kubernetes.io/metadata.name": prom_namespace}
    for sm in [d for d in docs if d["kind"] == "ServiceMonitor"]:
        sm_name = sm["metadata"]["name"]
        in_ns = (sm["spec"].get("namespaceSelector") or {}).get("matchNames") or [sm["metadata"]["namespace"]]
        services = [d for d in docs if d["kind"] == "Service" and d["metadata"]["namespace"] in in_ns
                    and selects(sm["spec"]["selector"], d["metadata"].get("labels") or {})]
        for ep in sm["spec"]["endpoints"]:
            blocked = []
            for svc in services:
                ns = svc["metadata"]["namespace"]
                sport = next((p for p in svc["spec"]["ports"] if p.get("name") == ep.get("port")), None)
                if sport is None:
                    blocked.append(f"Service {svc['metadata']['name']} has no port {ep.get('port')}")
                    continue
                target = sport.get("targetPort", sport["port"])
                pods = [d for d in docs if d["kind"] == "Deployment" and d["metadata"]["namespace"] == ns
                        and selects({"matchLabels": svc["spec"].get("selector") or {"-": "-"}},
                                    d["spec"]["template"]["metadata"].get("labels") or {})]
                for deploy in pods:
                    labels = deploy["spec"]["template"]["metadata"].get("labels") or {}
                    cports = [p for ct in deploy["spec"]["template"]["spec"]["containers"]
                              for p in ct.get("ports", []) if target in (p.get("name"), p["containerPort"])]
                    port_ids = {x for p in cports for x in (p.get("name"), p["containerPort"]) if x is not None} or {target}
                    policies = [n for n in docs if n["kind"] == "NetworkPolicy" and n["metadata"]["namespace"] == ns
                                and "Ingress" in n["spec"].get("policyTypes", ["Ingress"])
                                and selects(n["spec"]["podSelector"], labels)]

                    def admits(peer, policy_ns=ns):
                        if "ipBlock" in peer:
                            return False
                        ns_ok = (selects(peer["namespaceSelector"], prom_ns_labels) if "namespaceSelector" in peer
                                 else prom_namespace == policy_ns)
                        return ns_ok and selects(peer.get("podSelector") or {}, PROMETHEUS_POD_LABELS)

                    open_ = not policies or any(
                        (not rule.get("ports") or any(p.get("port") in port_ids for p in rule["ports"]))
                        and (not rule.get("from") or any(admits(peer) for peer in rule["from"]))
                        for pol in policies for rule in pol["spec"].get("ingress") or [])
                    if not open_:
                        blocked.append(f"{ns}/{deploy['metadata']['name']} port {target}: "
                                       f"NetworkPolicies {[p['metadata']['name'] for p in policies]}")
            c.check(services and not blocked,
                    f"{tag} ServiceMonitor {sm_name} port {ep.get('port')}: the NetworkPolicies admit a Prometheus "
                    f"in namespace {prom_namespace} to the pods it scrapes", blocked or "no Service selected")


def scrape(path, prom_namespace):
    c = Checker()
    docs = load(path)
    c.check(any(d["kind"] == "ServiceMonitor" for d in docs), "the render has ServiceMonitors")
    scrape_checks(c, "[scrape]", docs, prom_namespace)
    return c.failed


def check(set_name, path, release, namespace):
    docs = load(path)
    c = Checker()
    tag = f"[{set_name}]"
    by_kind = {}
    for d in docs:
        by_kind.setdefault(d["kind"], []).append(d)

    def named(kind, name):
        return next((d for d in by_kind.get(kind, []) if d["metadata"]["name"] == name), None)

    # Deployments: found by their containers, not by name.
    deploys = by_kind.get("Deployment", [])
    agent_d = next((d for d in deploys if container_named(d, "agent")), None)
    ctrl_d = next((d for d in deploys if container_named(d, "controller")), None)
    if not c.check(agent_d and ctrl_d and len(deploys) == 2,
                   f"{tag} two Deployments: one with container 'agent', one with 'controller'",
                   [d["metadata"]["name"] for d in deploys]):
        return c.failed
    agent = container_named(agent_d, "agent")
    ctrl = container_named(ctrl_d, "controller")
    agent_name = agent_d["metadata"]["name"]

    # Namespaces: everything in the release's, but the Roles that let the controller retire
    # upstream's agent pods, which are where those pods are (UPSTREAM_NAMESPACES).
    upstream_ns = UPSTREAM_NAMESPACES[set_name] or [namespace]
    upstream_role = next((d["metadata"]["name"] for d in by_kind.get("Role", [])
                          if d["metadata"]["name"].endswith("-controller-upstream-agents")), None)
    dashboard_ns = DASHBOARD_NAMESPACE.get(set_name, namespace)
    wrong = [key(d) for d in docs
             if d["kind"] not in CLUSTER_SCOPED and d["metadata"].get("namespace") != namespace
             and not (d["kind"] in ("Role", "RoleBinding") and d["metadata"]["name"] == upstream_role
                      and d["metadata"].get("namespace") in upstream_ns)
             and not (d["kind"] == "ConfigMap" and "vmdhcp.json" in (d.get("data") or {})
                      and d["metadata"].get("namespace") == dashboard_ns)]
    c.check(not wrong, f"{tag} every namespaced object is in {namespace} (upstream agents' Roles: {upstream_ns}; "
            f"the dashboard: {dashboard_ns})", wrong)
    long_names = [key(d) for d in by_kind.get("Service", []) if len(d["metadata"]["name"]) > 63]
    c.check(not long_names, f"{tag} Service names are at most 63 characters", long_names)

    # Agent: capabilities, bootstrap, downward API.
    caps = (agent.get("securityContext") or {}).get("capabilities") or {}
    c.check(caps.get("drop") == ["ALL"], f"{tag} agent drops ALL capabilities", caps.get("drop"))
    c.check(caps.get("add") == EXPECTED_CAPS[set_name],
            f"{tag} agent adds exactly {EXPECTED_CAPS[set_name]}", caps.get("add"))
    c.check(env_value(agent, "AGENT_NETWORK_CONFIGS") == "[]"
            and env_value(agent, "IPPOOL_REFS_JSON") == "[]",
            f"{tag} agent bootstrap env ships as []",
            (env_value(agent, "AGENT_NETWORK_CONFIGS"), env_value(agent, "IPPOOL_REFS_JSON")))
    annotations = agent_d["spec"]["template"]["metadata"].get("annotations") or {}
    c.check("k8s.v1.cni.cncf.io/networks" not in annotations,
            f"{tag} agent pod template has no Multus annotation (the controller owns it)")
    c.check(field_ref(agent, "POD_NAME") == "metadata.name"
            and field_ref(agent, "POD_NAMESPACE") == "metadata.namespace"
            and field_ref(agent, "NODE_NAME") == "spec.nodeName",
            f"{tag} agent POD_NAME, POD_NAMESPACE, NODE_NAME from the downward API")
    c.check(field_ref(ctrl, "POD_NAME") == "metadata.name"
            and field_ref(ctrl, "POD_NAMESPACE") == "metadata.namespace",
            f"{tag} controller POD_NAME, POD_NAMESPACE from the downward API")

    # Leader election always on, with explicit timings.
    for who, cont in (("controller", ctrl), ("agent", agent)):
        args = cont.get("args", [])
        c.check(args[:1] == ["run"] and "--no-leader-election" not in args
                and all(flag(cont, f) for f in ("leader-election-name", "lease-duration-seconds",
                                                "renew-deadline-seconds", "retry-period-seconds")),
                f"{tag} {who} runs with leader election and explicit timings", args)

    # Controller -> agent Deployment.
    c.check(env_value(ctrl, "AGENT_DEPLOYMENT") == f"{namespace}/{agent_name}"
            and env_value(ctrl, "AGENT_CONTAINER_NAME") == "agent",
            f"{tag} controller targets {namespace}/{agent_name}, container agent",
            (env_value(ctrl, "AGENT_DEPLOYMENT"), env_value(ctrl, "AGENT_CONTAINER_NAME")))

    # Security contexts and probes.
    for who, d, cont in (("controller", ctrl_d, ctrl), ("agent", agent_d, agent)):
        pod_sc = d["spec"]["template"]["spec"].get("securityContext") or {}
        sc = cont.get("securityContext") or {}
        seccomp = (sc.get("seccompProfile") or pod_sc.get("seccompProfile") or {}).get("type")
        c.check(sc.get("readOnlyRootFilesystem") is True and sc.get("allowPrivilegeEscalation") is False
                and seccomp == "RuntimeDefault" and not sc.get("privileged"),
                f"{tag} {who}: read-only root, no privilege escalation, RuntimeDefault seccomp")
        live = ((cont.get("livenessProbe") or {}).get("httpGet") or {})
        ready = ((cont.get("readinessProbe") or {}).get("httpGet") or {})
        c.check(live.get("path") == "/healthz" and ready.get("path") == "/readyz"
                and live.get("port") == ready.get("port") == "http",
                f"{tag} {who} probes /healthz and /readyz on port http")
    # The one privileged container: the agent's init container that writes the pool interfaces'
    # IPv6 settings, running the agent image's settle-host6 over the pod's Multus selection.
    inits = agent_d["spec"]["template"]["spec"].get("initContainers") or []
    for init in inits:
        sc = init.get("securityContext") or {}
        c.check(init.get("name") == "ipv6-host-settings" and init.get("args") == ["settle-host6"]
                and init.get("image") == agent.get("image") and sc.get("privileged") is True
                and sc.get("readOnlyRootFilesystem") is True
                and field_ref(init, "MULTUS_NETWORKS")
                == "metadata.annotations['k8s.v1.cni.cncf.io/networks']"
                and (init.get("resources") or {}).get("limits", {}).get("memory"),
                f"{tag} agent init container {init.get('name')} only settles the pool interfaces' "
                "IPv6 settings from the pod's Multus selection", init)
    c.check(len(inits) <= 1, f"{tag} agent has at most the IPv6 settings init container",
            [i.get("name") for i in inits])
    ctrl_caps = ((ctrl.get("securityContext") or {}).get("capabilities") or {})
    c.check(ctrl_caps.get("drop") == ["ALL"] and not ctrl_caps.get("add"),
            f"{tag} controller has no capabilities")
    c.check((ctrl_d["spec"]["template"]["spec"].get("securityContext") or {}).get("runAsNonRoot") is True,
            f"{tag} controller runs as non-root")

    # Service, endpoint, TLS plumbing.
    svc_name = env_value(ctrl, "SERVICE_NAME")
    svc = named("Service", svc_name)
    ports = {p["name"]: p for p in (svc or {}).get("spec", {}).get("ports", [])}
    c.check(svc is not None and ports.get("grpc", {}).get("port") == 9090
            and ports.get("webhook", {}).get("port") == 443
            and ports.get("webhook", {}).get("targetPort") == "webhook",
            f"{tag} SERVICE_NAME={svc_name} is a Service with grpc 9090 and webhook 443->webhook")
    plaintext = env_value(ctrl, "GRPC_PLAINTEXT") == "true"
    scheme = "http" if plaintext else "https"
    c.check(env_value(agent, "CONTROLLER_ENDPOINT") == f"{scheme}://{svc_name}.{namespace}.svc:9090",
            f"{tag} agent dials {scheme}://{svc_name}.{namespace}.svc:9090",
            env_value(agent, "CONTROLLER_ENDPOINT"))
    c.check(plaintext == (set_name == "plaintext"), f"{tag} GRPC_PLAINTEXT only in plaintext mode")
    tls_secret = env_value(ctrl, "TLS_SECRET")
    ca_cm = env_value(ctrl, "CA_CONFIGMAP")
    c.check(bool(tls_secret) and bool(ca_cm), f"{tag} controller has TLS_SECRET and CA_CONFIGMAP",
            (tls_secret, ca_cm))
    agent_sa = agent_d["spec"]["template"]["spec"]["serviceAccountName"]
    ctrl_sa = ctrl_d["spec"]["template"]["spec"]["serviceAccountName"]
    volumes = agent_d["spec"]["template"]["spec"].get("volumes") or []
    if plaintext:
        c.check(not volumes and env_value(agent, "TOKEN_FILE") is None
                and env_value(agent, "CONTROLLER_CA_FILE") is None
                and env_value(ctrl, "AGENT_SERVICE_ACCOUNT") is None,
                f"{tag} plaintext: no token, no CA, no agent ServiceAccount check")
    else:
        sources = (volumes[0].get("projected") or {}).get("sources", []) if volumes else []
        token = next((s["serviceAccountToken"] for s in sources if "serviceAccountToken" in s), {})
        cm = next((s["configMap"] for s in sources if "configMap" in s), {})
        mount = next((m["mountPath"] for m in agent.get("volumeMounts", [])
                      if volumes and m["name"] == volumes[0]["name"]), None)
        c.check(token.get("audience") == env_value(ctrl, "TOKEN_AUDIENCE")
                and token.get("expirationSeconds", 0) >= 600
                and env_value(agent, "TOKEN_FILE") == f"{mount}/{token.get('path')}",
                f"{tag} agent token: audience = controller's TOKEN_AUDIENCE, file = TOKEN_FILE")
        c.check(cm.get("name") == ca_cm and cm.get("optional") is True
                and env_value(agent, "CONTROLLER_CA_FILE") == f"{mount}/ca.crt",
                f"{tag} agent CA: optional ConfigMap {ca_cm}, file = CONTROLLER_CA_FILE")
        c.check(env_value(ctrl, "AGENT_SERVICE_ACCOUNT") == f"{namespace}:{agent_sa}",
                f"{tag} controller serves only {namespace}:{agent_sa}",
                env_value(ctrl, "AGENT_SERVICE_ACCOUNT"))

    # RBAC: what each ServiceAccount is bound to.
    def rules_of(sa):
        """(kind, rule, namespace or None) of every rule bound to the ServiceAccount `sa`."""
        out = []
        for bkind, rkind in (("RoleBinding", "Role"), ("ClusterRoleBinding", "ClusterRole")):
            for b in by_kind.get(bkind, []):
                if any(s.get("kind") == "ServiceAccount" and s.get("name") == sa
                       and s.get("namespace") == namespace for s in b.get("subjects", [])):
                    ref = b["roleRef"]
                    where = b["metadata"].get("namespace")
                    role = next((d for d in by_kind.get(ref["kind"], [])
                                 if d["metadata"]["name"] == ref["name"]
                                 and d["metadata"].get("namespace") == where), None)
                    c.check(role is not None and ref["kind"] == rkind,
                            f"{tag} {bkind} {where + '/' if where else ''}{b['metadata']['name']} refers to a rendered {rkind}")
                    if role:
                        out += [(rkind, r, where) for r in role.get("rules", [])]
        return out

    all_rules = [r for k in ("Role", "ClusterRole") for d in by_kind.get(k, []) for r in d.get("rules", [])]
    wild = [r for r in all_rules if "*" in r.get("verbs", []) + r.get("resources", []) + r.get("apiGroups", [])]
    c.check(not wild, f"{tag} no wildcard in any rule", wild)

    agent_rules = [(k, r) for k, r, _ in rules_of(agent_sa)]
    c.check(not any("deployments" in r.get("resources", []) for _, r in agent_rules),
            f"{tag} agent has no rule on deployments")
    c.check({res for _, r in agent_rules for res in r.get("resources", [])} <= {"ippools", "leases"},
            f"{tag} agent rules touch only ippools and leases",
            [r.get("resources") for _, r in agent_rules])
    bad = [r for _, r in agent_rules if set(r.get("verbs", [])) & WRITE_VERBS
           and r.get("resources") != ["leases"]]
    c.check(not bad, f"{tag} agent writes nothing but Leases", bad)
    agent_lease = flag(agent, "leader-election-name")
    bad = [r for kind, r in agent_rules if set(r.get("verbs", [])) & {"update", "patch", "get"}
           and "leases" in r.get("resources", []) and r.get("resourceNames") != [agent_lease]]
    c.check(not bad, f"{tag} agent reads and updates only the Lease {agent_lease}", bad)
    c.check(all(kind == "Role" for kind, r in agent_rules if "leases" in r.get("resources", [])),
            f"{tag} agent Lease rules are namespaced (Role)")

    ctrl_bound = rules_of(ctrl_sa)
    ctrl_rules = [(k, r) for k, r, _ in ctrl_bound]
    dep_rules = [(k, r) for k, r in ctrl_rules if "deployments" in r.get("resources", [])]
    c.check(dep_rules and all(k == "Role" and r.get("resourceNames") == [agent_name] for k, r in dep_rules)
            and any("patch" in r.get("verbs", []) for _, r in dep_rules),
            f"{tag} controller may patch Deployments only by name, only {agent_name}", dep_rules)
    lease = flag(ctrl, "leader-election-name")
    # The agents' reports are shared between replicas in a ConfigMap named after the Lease; the
    # agents' Lease is read (which agent leads), never written.
    for res, names in (("secrets", [tls_secret]), ("configmaps", [ca_cm, f"{lease}-agent-reports"]),
                       ("leases", [lease, agent_lease])):
        rs = [(k, r) for k, r in ctrl_rules if res in r.get("resources", [])]
        bad = [r for k, r in rs if k != "Role" or not r.get("resourceNames")
               or not set(r["resourceNames"]) <= set(names) or "create" in r.get("verbs", [])]
        covered = sorted({n for _, r in rs for n in r.get("resourceNames", [])})
        c.check(rs and not bad and covered == sorted(names),
                f"{tag} controller {res}: namespaced, restricted to {names}, no create", bad or covered)
    bad = [r for _, r in ctrl_rules if "leases" in r.get("resources", [])
           and agent_lease in r.get("resourceNames", []) and set(r["verbs"]) & WRITE_VERBS]
    c.check(not bad, f"{tag} controller only reads the agents' Lease {agent_lease}", bad)
    # Narrowed to what the controller calls: no update of a NAD (a tenant's CNI config: its labels
    # are merge-patched), no create or delete of IPPools, no core/v1 events, and pods only in the
    # namespaces of upstream's agents.
    def grants(group, resource, verb):
        return [(k, ns) for k, r, ns in ctrl_bound if group in r.get("apiGroups", [])
                and resource in r.get("resources", []) and verb in r.get("verbs", [])]
    c.check(not grants("k8s.cni.cncf.io", "network-attachment-definitions", "update")
            and grants("k8s.cni.cncf.io", "network-attachment-definitions", "patch"),
            f"{tag} controller patches NADs, never updates them")
    c.check(not any(grants("network.harvesterhci.io", "ippools", v) for v in ("create", "delete", "update")),
            f"{tag} controller neither creates, updates nor deletes IPPools")
    c.check(not any(grants("", "events", v) for v in ("create", "patch")),
            f"{tag} controller writes events.k8s.io events only")
    pods = grants("", "pods", "delete") + grants("", "pods", "get")
    c.check(pods and all(k == "Role" for k, _ in pods)
            and sorted({ns for _, ns in pods}) == sorted(upstream_ns),
            f"{tag} controller gets and deletes pods only in {upstream_ns} (Roles)", pods)
    # Those objects and the agents' Lease are the chart's (empty; filled at run time), so that
    # `helm uninstall` removes them and nobody needs `create`.
    kind_of = {"secrets": "Secret", "configmaps": "ConfigMap", "leases": "Lease"}
    for res, names in (("secrets", [tls_secret]), ("configmaps", [ca_cm, f"{lease}-agent-reports"]),
                       ("leases", [lease, agent_lease])):
        objs = {o["metadata"]["name"]: o for o in by_kind.get(kind_of[res], [])
                if o["metadata"].get("namespace") == namespace}
        missing = [n for n in names if n not in objs]
        filled = [n for n in names if n in objs and (objs[n].get("data") or objs[n].get("spec"))]
        c.check(not missing and not filled, f"{tag} chart creates {names} empty", missing + filled)
    bad = [r for _, r in agent_rules if "create" in r.get("verbs", [])]
    c.check(not bad, f"{tag} agent has no create verb", bad)
    tokenreview = any("tokenreviews" in r.get("resources", []) for _, r in ctrl_rules)
    c.check(tokenreview == (not plaintext), f"{tag} tokenreviews granted only with TLS")

    # Webhooks.
    webhook_name = env_value(ctrl, "WEBHOOK_NAME")
    hooks = by_kind.get("MutatingWebhookConfiguration", []) + by_kind.get("ValidatingWebhookConfiguration", [])
    adm_rules = [r for _, r in ctrl_rules if "admissionregistration.k8s.io" in r.get("apiGroups", [])]
    if webhook_name:
        c.check(len(hooks) == 2 and all(h["metadata"]["name"] == webhook_name for h in hooks),
                f"{tag} Mutating and Validating webhook configurations named {webhook_name}")
        entries = [w for h in hooks for w in h["webhooks"]]
        c.check(all("caBundle" not in w["clientConfig"] for w in entries),
                f"{tag} webhooks carry no caBundle (the controller injects it)")
        c.check(all(w["clientConfig"]["service"]["name"] == svc_name
                    and w["clientConfig"]["service"]["namespace"] == namespace
                    and w["clientConfig"]["service"]["port"] == 443
                    and w["sideEffects"] == "None" and w["admissionReviewVersions"] == ["v1"]
                    for w in entries),
                f"{tag} webhooks call {svc_name}:443, sideEffects None, v1 reviews")
        paths = sorted((h["kind"], w["clientConfig"]["service"]["path"]) for h in hooks for w in h["webhooks"])
        c.check(paths == [("MutatingWebhookConfiguration", "/mutate"),
                          ("ValidatingWebhookConfiguration", "/validate")],
                f"{tag} paths /mutate and /validate", paths)
        writes = [r for r in adm_rules if set(r.get("verbs", [])) & WRITE_VERBS]
        c.check(writes and all(r.get("resourceNames") == [webhook_name] for r in writes),
                f"{tag} controller updates only the webhook configurations {webhook_name}", writes)
    else:
        c.check(not hooks and not adm_rules, f"{tag} webhook disabled: no configurations, no rules")

    # NetworkPolicies: the controller admits the stream only from the agents, the webhook from
    # networkPolicy.webhook.from, metrics from networkPolicy.metrics.from; the agents only metrics.
    nps = by_kind.get("NetworkPolicy", [])
    c.check(len(nps) == NETWORK_POLICIES[set_name],
            f"{tag} {NETWORK_POLICIES[set_name]} NetworkPolicies", len(nps))
    if nps:
        def policy(component):
            return next((p for p in nps if p["spec"]["podSelector"]["matchLabels"]
                         .get("app.kubernetes.io/component") == component), None)
        ctrl_np, agent_np = policy("controller"), policy("agent")
        def by_port(p):
            return {port["port"]: rule.get("from") for rule in p["spec"].get("ingress", [])
                    for port in rule.get("ports", [])}
        cp = by_port(ctrl_np) if ctrl_np else {}
        agent_sel = agent_d["spec"]["selector"]["matchLabels"]
        c.check(ctrl_np and ctrl_np["spec"]["policyTypes"] == ["Ingress"]
                and sorted(cp) == ["grpc", "http", "webhook"]
                and cp["grpc"] == [{"podSelector": {"matchLabels": agent_sel}}],
                f"{tag} controller NetworkPolicy: webhook, grpc from the agent pods only, http", cp)
        ap = by_port(agent_np) if agent_np else {}
        c.check(agent_np and agent_np["spec"]["policyTypes"] == ["Ingress"] and sorted(ap) == ["http"]
                and ap["http"] == cp.get("http"),
                f"{tag} agent NetworkPolicy: only http, from the metrics peers", ap)

    # ServiceMonitors, PDBs.
    sms = by_kind.get("ServiceMonitor", [])
    c.check(len(sms) == SERVICE_MONITORS[set_name],
            f"{tag} {SERVICE_MONITORS[set_name]} ServiceMonitor(s)", len(sms))
    # The NetworkPolicies never block what the ServiceMonitors of the same release ask for.
    scrape_checks(c, tag, docs, PROMETHEUS_NAMESPACE.get(set_name, "cattle-monitoring-system"))
    for sm in sms:
        sel = sm["spec"]["selector"]["matchLabels"]
        targets = [s for s in by_kind.get("Service", [])
                   if all(s["metadata"].get("labels", {}).get(k) == v for k, v in sel.items())]
        c.check(len(targets) == 1 and any(p["name"] == sm["spec"]["endpoints"][0]["port"]
                                          for p in targets[0]["spec"]["ports"]),
                f"{tag} ServiceMonitor {sm['metadata']['name']} selects one Service with its port",
                [t["metadata"]["name"] for t in targets])
    # PrometheusRule and dashboard: picked up by what picks up the ServiceMonitors, reading only
    # series of the Services those select.
    selected = {}
    for sm in sms:
        sel = sm["spec"]["selector"]["matchLabels"]
        selected[sm["metadata"]["labels"].get("app.kubernetes.io/component")] = [
            s for s in by_kind.get("Service", [])
            if all(s["metadata"].get("labels", {}).get(k) == v for k, v in sel.items())]

    def unscraped(exprs):
        return sorted({m for e in exprs for m in metric_names(e) if not selected.get(component_of(m))})

    rules = by_kind.get("PrometheusRule", [])
    c.check(len(rules) == PROMETHEUS_RULES[set_name],
            f"{tag} {PROMETHEUS_RULES[set_name]} PrometheusRule(s)", len(rules))
    for rule in rules:
        labels = rule["metadata"].get("labels", {})
        missing = {k: v for sm in sms for k, v in sm["metadata"].get("labels", {}).items()
                   if k not in CHART_LABELS and labels.get(k) != v}
        c.check(sms and not missing and labels.get("app.kubernetes.io/instance") == release,
                f"{tag} PrometheusRule {rule['metadata']['name']} carries the ServiceMonitors' selection labels",
                missing)
        exprs = [r["expr"] for g in rule["spec"]["groups"] for r in g["rules"]]
        c.check(exprs and not unscraped(exprs),
                f"{tag} every series the {len(exprs)} alerts read comes from a Service a ServiceMonitor selects",
                unscraped(exprs))
    dashboards = [d for d in by_kind.get("ConfigMap", []) if "vmdhcp.json" in (d.get("data") or {})]
    c.check(len(dashboards) == DASHBOARDS[set_name], f"{tag} {DASHBOARDS[set_name]} dashboard ConfigMap(s)",
            len(dashboards))
    for d in dashboards:
        c.check(d["metadata"].get("namespace") == dashboard_ns,
                f"{tag} dashboard ConfigMap {d['metadata']['name']} is in {dashboard_ns}", d["metadata"].get("namespace"))
        labels = d["metadata"].get("labels", {})
        c.check(labels.get("grafana_dashboard") == "1",
                f"{tag} dashboard ConfigMap {d['metadata']['name']} has the Grafana sidecar's label", labels)
        try:
            exprs = [t["expr"] for p in json.loads(d["data"]["vmdhcp.json"])["panels"]
                     for t in p.get("targets", [])]
        except (ValueError, KeyError) as e:
            exprs = []
            c.check(False, f"{tag} dashboard ConfigMap holds the dashboard JSON", e)
        c.check(exprs and not unscraped(exprs),
                f"{tag} every series the dashboard's {len(exprs)} queries read comes from a Service a "
                "ServiceMonitor selects", unscraped(exprs))

    pdbs = by_kind.get("PodDisruptionBudget", [])
    if PDB_API[set_name] is None:
        c.check(not pdbs, f"{tag} no PodDisruptionBudget")
    else:
        c.check(len(pdbs) == 2 and all(p["apiVersion"] == PDB_API[set_name] for p in pdbs),
                f"{tag} two PodDisruptionBudgets, {PDB_API[set_name]}", [p["apiVersion"] for p in pdbs])
    return c.failed


def upstream(set_name, path, release, namespace):
    """Each of upstream's values in SET became the key the notes name (see the values files)."""
    docs = load(path)
    c = Checker()
    tag = f"[{set_name}]"
    deploys = [d for d in docs if d["kind"] == "Deployment"]
    ctrl_d = next(d for d in deploys if container_named(d, "controller"))
    agent_d = next(d for d in deploys if container_named(d, "agent"))
    ctrl, agent = container_named(ctrl_d, "controller"), container_named(agent_d, "agent")
    cpod, apod = ctrl_d["spec"]["template"], agent_d["spec"]["template"]
    sas = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ServiceAccount"}
    kinds = {d["kind"] for d in docs}

    def eq(what, got, want):
        c.check(got == want, f"{tag} {what}", f"got {got!r}, want {want!r}")

    c.check(not kinds & {"Ingress", "HorizontalPodAutoscaler"},
            f"{tag} no Ingress, no HorizontalPodAutoscaler (upstream's ingress, autoscaling ignored)",
            sorted(kinds & {"Ingress", "HorizontalPodAutoscaler"}))
    metrics = [d for d in docs if d["kind"] == "Service" and d["metadata"]["name"].endswith("-metrics")]
    c.check(len(metrics) == 2 and all(m["spec"].get("clusterIP") == "None"
                                      and [p["port"] for p in m["spec"]["ports"]] == [8080] for m in metrics),
            f"{tag} metrics Services stay headless on 8080 (upstream's service.* ignored)")
    if set_name == "upstream":
        eq("replicaCount -> controller.replicas", ctrl_d["spec"]["replicas"], 3)
        eq("agent replicas untouched", agent_d["spec"]["replicas"], 2)
        eq("image.* -> controller image", ctrl["image"], "registry.example.org/vmdhcp/vm-dhcp-controller:0.1.0-rc.2")
        eq("image.pullPolicy -> controller.image.pullPolicy", ctrl["imagePullPolicy"], "Always")
        eq("agent.image.* (the same key)", (agent["image"], agent["imagePullPolicy"]),
           ("registry.example.org/vmdhcp/vm-dhcp-agent:0.1.0-rc.2", "Always"))
        eq("serviceAccount.name -> the controller's ServiceAccount", cpod["spec"]["serviceAccountName"], "dhcp")
        eq("serviceAccount.name -> the agents' <name>-agent", apod["spec"]["serviceAccountName"], "dhcp-agent")
        eq("serviceAccount.annotations -> both ServiceAccounts",
           sorted((n, (sa["metadata"].get("annotations") or {}).get("example.org/owner")) for n, sa in sas.items()),
           [("dhcp", "network-team"), ("dhcp-agent", "network-team")])
        for who, pod in (("controller", cpod), ("agent", apod)):
            eq(f"podAnnotations -> {who}.podAnnotations",
               (pod["metadata"].get("annotations") or {}).get("example.org/audit"), "true")
            eq(f"podLabels -> {who}.podLabels", pod["metadata"]["labels"].get("team"), "network")
        psc = cpod["spec"]["securityContext"]
        eq("podSecurityContext merged over controller.podSecurityContext",
           (psc.get("fsGroup"), psc.get("runAsUser"), psc.get("runAsNonRoot")), (2000, 65532, True))
        eq("the agent keeps its podSecurityContext", apod["spec"]["securityContext"].get("fsGroup"), None)
        sc = ctrl["securityContext"]
        eq("securityContext merged over controller.securityContext",
           (sc.get("runAsNonRoot"), sc.get("readOnlyRootFilesystem")), (True, True))
        eq("resources merged over controller.resources", ctrl["resources"],
           {"requests": {"cpu": "200m", "memory": "128Mi"}, "limits": {"memory": "512Mi"}})
        eq("nodeSelector merged over controller.nodeSelector", cpod["spec"]["nodeSelector"],
           {"kubernetes.io/os": "linux", "node-role.kubernetes.io/control-plane": "true"})
        eq("the agent keeps agent.nodeSelector", apod["spec"]["nodeSelector"], {"kubernetes.io/os": "linux"})
        eq("tolerations -> controller.tolerations", [t["key"] for t in cpod["spec"].get("tolerations", [])],
           ["node-role.kubernetes.io/control-plane"])
        eq("the agent has no tolerations", apod["spec"].get("tolerations"), None)
        eq("affinity -> controller.affinity", list(cpod["spec"]["affinity"]), ["nodeAffinity"])
        eq("volumes -> controller.extraVolumes", [v["name"] for v in cpod["spec"].get("volumes", [])], ["extra-ca"])
        eq("volumeMounts -> controller.extraVolumeMounts", [m["mountPath"] for m in ctrl.get("volumeMounts", [])],
           ["/etc/extra-ca"])
        eq("the agent's volumes: the stream's credentials only",
           [v["name"] for v in apod["spec"].get("volumes", [])], ["controller-auth"])
        eq("serviceCIDR -> controller.serviceCIDR", env_value(ctrl, "SERVICE_CIDR"), "10.53.0.0/16")
        eq("imagePullSecrets (the same key) on both", [p["name"] for pod in (cpod, apod)
                                                        for p in pod["spec"].get("imagePullSecrets", [])],
           ["registry-credentials", "registry-credentials"])
        eq("webhook on the controller's Service, port 443 (webhook.service, httpsPort ignored)",
           sorted({w["clientConfig"]["service"]["port"] for d in docs if d["kind"].endswith("WebhookConfiguration")
                   for w in d["webhooks"]}), [443])
    elif set_name == "upstream-defaults":
        eq("replicaCount=1 (below 2) not taken: 2 controller replicas", ctrl_d["spec"]["replicas"], 2)
        eq("upstream's controller and webhook images ignored: vmdhcp's controller runs", ctrl["image"],
           "ghcr.io/vmdhcp/vm-dhcp-controller:0.1.0")
        eq("upstream's agent image ignored: vmdhcp's agent runs", agent["image"], "ghcr.io/vmdhcp/vm-dhcp-agent:0.1.0")
        eq("ServiceAccounts: this chart's names", (cpod["spec"]["serviceAccountName"], apod["spec"]["serviceAccountName"]),
           (f"{release}-controller", f"{release}-agent"))
        eq("empty pod-level keys change nothing", (cpod["spec"]["nodeSelector"], cpod["spec"].get("tolerations"),
                                                   ctrl["resources"]["limits"], cpod["spec"].get("volumes")),
           ({"kubernetes.io/os": "linux"}, None, {"memory": "512Mi"}, None))
        eq("serviceCIDR -> controller.serviceCIDR", env_value(ctrl, "SERVICE_CIDR"), "10.53.0.0/16")
    elif set_name == "upstream-precedence":
        eq("controller.replicas wins over replicaCount", ctrl_d["spec"]["replicas"], 3)
        eq("controller.image wins over image and webhook.image (pullPolicy, not given, from image)",
           (ctrl["image"], ctrl["imagePullPolicy"]), ("registry.example.org/ours/vm-dhcp-controller:ours", "Always"))
        eq("controller.serviceAccount.name wins; the agent's from serviceAccount.name",
           (cpod["spec"]["serviceAccountName"], apod["spec"]["serviceAccountName"]), ("ours-controller", "upstream-agent"))
        eq("controller.nodeSelector wins (upstream's not added)", cpod["spec"]["nodeSelector"],
           {"example.org/ours": "true", "kubernetes.io/os": "linux"})
        eq("controller.tolerations win", [t["key"] for t in cpod["spec"]["tolerations"]], ["example.org/ours"])
        eq("controller.serviceCIDR wins", env_value(ctrl, "SERVICE_CIDR"), "10.96.0.0/12")
        eq("podLabels: agent.podLabels wins per key, upstream's adds the others",
           (apod["metadata"]["labels"].get("team"), apod["metadata"]["labels"].get("extra")), ("ours", "upstream"))
        eq("podLabels: the controller gets upstream's", (cpod["metadata"]["labels"].get("team"),
                                                        cpod["metadata"]["labels"].get("extra")), ("upstream", "upstream"))
    elif set_name in ("harvester-addon", "harvester-monitoring"):
        names = {(d["kind"], d["metadata"]["name"]) for d in docs}
        for kind, name in (("Deployment", "harvester-vm-dhcp-controller-controller"),
                           ("Deployment", "harvester-vm-dhcp-controller-agent"),
                           ("ServiceAccount", "harvester-vm-dhcp-controller-controller"),
                           ("ServiceAccount", "harvester-vm-dhcp-controller-agent"),
                           ("ClusterRole", "harvester-vm-dhcp-controller-agent"),
                           ("ClusterRoleBinding", "harvester-vm-dhcp-controller-agent"),
                           ("ValidatingWebhookConfiguration", "harvester-vm-dhcp-controller-admission"),
                           ("MutatingWebhookConfiguration", "harvester-vm-dhcp-controller-admission")):
            c.check((kind, name) in names, f"{tag} {kind} {name} (the add-on's release keeps its name)")
        # Upstream's runtime objects are named <release>-webhook: nothing of ours may be (Helm
        # refuses to create an object that exists outside the release).
        clash = sorted(n for n in names if n[1] == f"{release}-webhook")
        c.check(not clash, f"{tag} nothing named {release}-webhook (upstream's webhook server's objects)", clash)
        eq("the controller retires upstream's agents in harvester-system",
           sorted(d["metadata"]["namespace"] for d in docs if d["kind"] == "Role"
                  and d["metadata"]["name"].endswith("-upstream-agents")), [namespace])
        eq("image.*, webhook.image.* -> controller image", ctrl["image"], "ghcr.io/vmdhcp/vm-dhcp-controller:0.1.0")
        eq("agent.image.*", agent["image"], "ghcr.io/vmdhcp/vm-dhcp-agent:0.1.0")
        eq("serviceCIDR -> controller.serviceCIDR", env_value(ctrl, "SERVICE_CIDR"), "10.53.0.0/16")
        eq("2 controller and 2 agent replicas", (ctrl_d["spec"]["replicas"], agent_d["spec"]["replicas"]), (2, 2))
    return c.failed


ADDON_SPEC_FIELDS = {"enabled", "repo", "chart", "version", "valuesContent"}

# Upstream's add-on as Harvester v1.9 ships it (harvester#5052's test report, v1.9.0-rc4): the
# object a user edits to switch to this chart.
UPSTREAM_ADDON = {
    "apiVersion": "harvesterhci.io/v1beta1", "kind": "Addon",
    "metadata": {"name": "harvester-vm-dhcp-controller", "namespace": "harvester-system",
                 "labels": {"addon.harvesterhci.io/experimental": "true"}},
    "spec": {"enabled": False, "repo": "https://charts.harvesterhci.io",
             "chart": "harvester-vm-dhcp-controller", "version": "1.9.0",
             "valuesContent": "image:\n  tag: v1.9.0\nagent:\n  image:\n    tag: v1.9.0\n"
                              "webhook:\n  image:\n    tag: v1.9.0\n"},
}


def harvester_admits_update(old, new):
    """Harvester's Addon webhook on an update (harvester/harvester
    pkg/webhook/resources/addon/validator.go, validateUpdatedAddon): `spec.chart` may not change
    ("chart field cannot be changed."). The object is the same Addon (name, namespace), and of
    its spec only enabled, repo, version and valuesContent are the user's to change. Returns the
    refusal, or None."""
    om, nm = old.get("metadata") or {}, new.get("metadata") or {}
    if (om.get("name"), om.get("namespace")) != (nm.get("name"), nm.get("namespace")):
        return "not the same Addon"
    os_, ns_ = old.get("spec") or {}, new.get("spec") or {}
    if os_.get("chart") != ns_.get("chart"):
        return "chart field cannot be changed."
    changed = {k for k in ADDON_SPEC_FIELDS | set(os_) | set(ns_) if os_.get(k) != ns_.get(k)}
    if not changed <= {"enabled", "repo", "version", "valuesContent"}:
        return f"fields an edit does not change: {sorted(changed)}"
    return None


def addon(example, chart_yaml, values_out):
    """Harvester's Addon for the add-on harvester-vm-dhcp-controller, installing this chart."""
    c = Checker()
    with open(example, encoding="utf-8") as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    with open(chart_yaml, encoding="utf-8") as f:
        chart = yaml.safe_load(f)
    a = docs[0] if len(docs) == 1 else {}
    spec = a.get("spec") or {}
    md = a.get("metadata") or {}
    c.check(len(docs) == 1 and a.get("apiVersion") == "harvesterhci.io/v1beta1" and a.get("kind") == "Addon",
            "examples/harvester-addon.yaml: one Addon (harvesterhci.io/v1beta1)")
    c.check((md.get("name"), md.get("namespace")) == ("harvester-vm-dhcp-controller", "harvester-system"),
            "the Addon is Harvester's add-on harvester-vm-dhcp-controller in harvester-system (the Helm release)",
            (md.get("name"), md.get("namespace")))
    c.check(set(spec) <= ADDON_SPEC_FIELDS and isinstance(spec.get("enabled"), bool)
            and isinstance(spec.get("repo"), str) and spec.get("repo", "").startswith(("http://", "https://")),
            "spec has only the Addon's fields, enabled a boolean, repo a URL", sorted(spec))
    # This chart, published under upstream's name (scripts/package-chart.sh): spec.chart stays.
    c.check((spec.get("chart"), str(spec.get("version")))
            == ("harvester-vm-dhcp-controller", str(chart["version"])),
            f"spec.chart/version name this chart under upstream's name "
            f"(harvester-vm-dhcp-controller {chart['version']})",
            (spec.get("chart"), spec.get("version")))
    # Harvester admits the example as an edit of upstream's add-on (the rule refuses what it
    # must: a changed chart).
    c.check(harvester_admits_update(UPSTREAM_ADDON, a) is None,
            "Harvester's Addon webhook admits the example as an edit of upstream's add-on "
            "(only enabled, repo, version and valuesContent change)",
            harvester_admits_update(UPSTREAM_ADDON, a))
    renamed = {**a, "spec": {**spec, "chart": chart["name"]}}
    c.check(harvester_admits_update(UPSTREAM_ADDON, renamed) == "chart field cannot be changed.",
            f"...and refuses it with spec.chart: {chart['name']} (self-test of the rule)")
    content = spec.get("valuesContent")
    values = yaml.safe_load(content) if isinstance(content, str) else None
    c.check(isinstance(values, dict) and values, "spec.valuesContent is a YAML mapping (a values file)")
    upstream_keys = {"replicaCount", "image", "agent", "webhook", "serviceCIDR", "imagePullSecrets",
                     "nameOverride", "fullnameOverride", "serviceAccount", "podAnnotations", "podLabels",
                     "podSecurityContext", "securityContext", "service", "ingress", "resources",
                     "autoscaling", "volumes", "volumeMounts", "nodeSelector", "tolerations", "affinity"}
    # Upstream's chart has no monitoring and no UI address: those keys are this chart's, set for
    # Harvester's.
    monitoring_keys = {"serviceMonitor", "prometheusRule", "dashboard", "networkPolicy"}
    ours = monitoring_keys | {"controller"}
    c.check(isinstance(values, dict) and set(values) <= upstream_keys | ours,
            "valuesContent is in upstream's chart's terms, but this chart's monitoring and UI keys",
            sorted(set(values or {}) - upstream_keys - ours))
    c.check(isinstance(values, dict) and values.get("controller") == {"vmAddressAnnotation": True},
            "valuesContent shows VMs' addresses in Harvester's UI (controller.vmAddressAnnotation)",
            (values or {}).get("controller"))
    mon = values if isinstance(values, dict) else {}
    c.check((mon.get("dashboard") or {}).get("namespace") == "cattle-dashboards"
            and ((mon.get("networkPolicy") or {}).get("metrics") or {}).get("prometheusNamespace")
            == "cattle-monitoring-system",
            "valuesContent: the dashboard in cattle-dashboards (the only namespace Harvester's Grafana "
            "loads them from), cattle-monitoring-system's Prometheus admitted to the metrics port")
    with open(values_out, "w", encoding="utf-8") as f:
        f.write(content if isinstance(content, str) else "")
    return c.failed


# PromQL words that are not series names.
PROMQL_WORDS = {"sum", "max", "min", "avg", "count", "by", "on", "without", "and", "or", "unless",
                "rate", "increase", "max_over_time", "min_over_time", "label_replace", "vector",
                "time", "histogram_quantile", "scalar", "group_left", "group_right", "bool",
                "offset", "ignoring", "abs", "changes", "absent", "le"}


def metric_names(expr):
    """The series names an expression reads (identifiers outside label matchers and strings)."""
    bare = re.sub(r'"[^"]*"', '""', expr)
    bare = re.sub(r"\{[^}]*\}", "{}", bare)
    bare = re.sub(r"\[[^\]]*\]", "[]", bare)
    bare = re.sub(r"\b(by|on|without|ignoring|group_left|group_right)\s*\([^)]*\)", "", bare)
    names = set(re.findall(r"\b[a-zA-Z_:][a-zA-Z0-9_:]*\b", bare)) - PROMQL_WORDS
    return sorted(n for n in names if not re.fullmatch(r"[0-9.e]+", n))


def component_of(metric):
    return next((c for prefix, c in METRIC_COMPONENT if metric.startswith(prefix)), None)


def rules_file(path):
    """The spec of the rendered PrometheusRule, as a rules file with a header."""
    rules = [d for d in load(path) if d.get("kind") == "PrometheusRule"]
    if len(rules) != 1:
        sys.stderr.write(f"expected one PrometheusRule in {path}, found {len(rules)}\n")
        return 1
    sys.stdout.write(
        "# vmdhcp's alert rules for Prometheus without the Operator: chart/templates/prometheusrule.yaml\n"
        "# rendered with the chart's default values. Generated (UPDATE_GOLDEN=1 chart/tests/check.sh),\n"
        "# never edited by hand: chart/tests/check.sh fails while the two differ.\n"
        "# Load it with `rule_files:` in prometheus.yml; unit tests: chart/tests/alerts-test.yaml.\n"
        "# The alerts keep the `namespace` label of the scraped pods, which your scrape config must set\n"
        "# (kubernetes_sd_configs: relabel __meta_kubernetes_namespace to namespace); the no-leader\n"
        "# alerts' fallback, when nothing is scraped, names vmdhcp-system: for another namespace, render\n"
        "# your own (helm template -n NS -s templates/prometheusrule.yaml --set prometheusRule.enabled=true).\n")
    sys.stdout.write(yaml.safe_dump(rules[0]["spec"], sort_keys=False, default_flow_style=False,
                                    width=100, allow_unicode=True))
    return 0


def runbooks(path, base):
    """Every alert of the rendered PrometheusRule links BASE#<its name, lowercased>; none when BASE
    is empty (prometheusRule.runbookURL="")."""
    c = Checker()
    rules = [r for d in load(path) if d.get("kind") == "PrometheusRule"
             for g in d["spec"]["groups"] for r in g["rules"]]
    got = {r["alert"]: (r.get("annotations") or {}).get("runbook_url") for r in rules}
    want = {name: (f"{base}#{name.lower()}" if base else None) for name in got}
    c.check(rules and got == want,
            f"runbookURL={base!r}: " + (f"every alert's runbook_url is {base}#<alert>" if base
                                         else "no alert has a runbook_url"),
            {k: v for k, v in got.items() if v != want[k]})
    return c.failed


def exported_metrics(observability_md):
    """Metric names docs/observability.md lists (its tables' first column)."""
    with open(observability_md, encoding="utf-8") as f:
        return set(re.findall(r"^\| `([a-z_]+)`", f.read(), re.M))


def alerts(rules_path, tests_path, runbooks_path, dashboard_path, observability_md):
    c = Checker()
    with open(rules_path, encoding="utf-8") as f:
        groups = yaml.safe_load(f)["groups"]
    with open(tests_path, encoding="utf-8") as f:
        tests = yaml.safe_load(f)["tests"]
    with open(runbooks_path, encoding="utf-8") as f:
        headings = {re.sub(r"[^a-z0-9 -]", "", h.lower()).replace(" ", "-")
                    for h in re.findall(r"^#+ (.+)$", f.read(), re.M)}
    with open(dashboard_path, encoding="utf-8") as f:
        dashboard = json.load(f)
    documented = exported_metrics(observability_md)
    rules = [r for g in groups for r in g["rules"]]
    fired, silent = set(), set()
    expected_labels = {}  # alert -> the exp_labels of every alert its firing cases expect
    for t in tests:
        for case in t.get("alert_rule_test", []):
            (fired if case.get("exp_alerts") else silent).add(case["alertname"])
            expected_labels.setdefault(case["alertname"], []).extend(
                a.get("exp_labels") or {} for a in case.get("exp_alerts") or [])
    for r in rules:
        name = r["alert"]
        ann = r.get("annotations", {})
        c.check(r.get("labels", {}).get("severity") in ("warning", "critical")
                and ann.get("summary") and ann.get("description"),
                f"alert {name}: severity, summary, description", r.get("labels"))
        base, _, anchor = ann.get("runbook_url", "").rpartition("#")
        # A base without a scheme is a path in vmdhcp's source: it must be the runbooks' file.
        local = os.path.normpath(runbooks_path).endswith(os.path.normpath(base or "-"))
        c.check(anchor == name.lower() and anchor in headings and (base.startswith(("https://", "http://")) or local),
                f"alert {name}: runbook_url ends in #{name.lower()}, a heading of docs/alerts.md (the file itself, "
                "or an address)", ann.get("runbook_url"))
        c.check(name in fired and name in silent,
                f"alert {name}: promtool tests where it fires and where it stays silent",
                {"fires": name in fired, "silent": name in silent})
        # Alertmanager routes by namespace: every aggregation and every match keeps it, and the
        # tests expect it (with the pool, NIC, ... labels the alert is about) wherever it fires.
        groupings = [[l.strip() for l in g.split(",") if l.strip()]
                     for g in re.findall(r"\b(?:by|on)\s*\(([^)]*)\)", r["expr"])]
        bare = re.findall(r"\b(?:sum|max|min|avg|count)\s*\(", r["expr"])
        c.check(not bare and all("namespace" in g for g in groupings),
                f"alert {name}: every aggregation and match keeps the namespace label",
                {"aggregations without by": bare, "groupings": groupings})
        kept = groupings[0] if groupings else ["namespace"]
        missing = [sorted(set(kept) - set(l)) for l in expected_labels.get(name, []) if not set(kept) <= set(l)]
        c.check(expected_labels.get(name) and not missing,
                f"alert {name}: every promtool case where it fires expects its labels {kept}", missing)
    series = lambda e: {re.sub(r"_(bucket|count|sum)$", "", m) for m in metric_names(e)}
    used = {m for r in rules for m in series(r["expr"])}
    used |= {m for p in dashboard["panels"] for t in p.get("targets", []) for m in series(t["expr"])}
    unknown = sorted(m for m in used if m not in documented and re.sub(r"_total$", "", m) not in documented)
    c.check(not unknown, f"the alerts and the dashboard read {len(used)} series, each documented in "
            "docs/observability.md", unknown)
    return c.failed


def main(argv):
    if len(argv) == 3 and argv[1] == "normalize":
        normalize(argv[2])
        return 0
    if len(argv) == 3 and argv[1] == "rules":
        return rules_file(argv[2])
    if len(argv) == 4 and argv[1] == "scrape":
        return 1 if scrape(argv[2], argv[3]) else 0
    if len(argv) == 4 and argv[1] == "runbooks":
        return 1 if runbooks(argv[2], argv[3]) else 0
    if len(argv) == 7 and argv[1] == "alerts":
        return 1 if alerts(*argv[2:7]) else 0
    if len(argv) == 6 and argv[1] == "upstream":
        return 1 if upstream(argv[2], argv[3], argv[4], argv[5]) else 0
    if len(argv) == 5 and argv[1] == "addon":
        return 1 if addon(argv[2], argv[3], argv[4]) else 0
    if len(argv) == 6 and argv[1] == "check":
        return 1 if check(argv[2], argv[3], argv[4], argv[5]) else 0
    sys.stderr.write(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
