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
"""

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
SERVICE_MONITORS = {"default": 0, "kube120": 0, "plaintext": 0, "full": 2}
PDB_API = {"default": "policy/v1", "full": "policy/v1", "plaintext": None, "kube120": "policy/v1beta1"}
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

    # Namespaces.
    wrong = [key(d) for d in docs
             if d["kind"] not in CLUSTER_SCOPED and d["metadata"].get("namespace") != namespace]
    c.check(not wrong, f"{tag} every namespaced object is in {namespace}", wrong)
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
        out = []
        for bkind, rkind in (("RoleBinding", "Role"), ("ClusterRoleBinding", "ClusterRole")):
            for b in by_kind.get(bkind, []):
                if any(s.get("kind") == "ServiceAccount" and s.get("name") == sa
                       and s.get("namespace") == namespace for s in b.get("subjects", [])):
                    ref = b["roleRef"]
                    role = named(ref["kind"], ref["name"])
                    c.check(role is not None and ref["kind"] == rkind,
                            f"{tag} {bkind} {b['metadata']['name']} refers to a rendered {rkind}")
                    if role:
                        out += [(rkind, r) for r in role.get("rules", [])]
        return out

    all_rules = [r for k in ("Role", "ClusterRole") for d in by_kind.get(k, []) for r in d.get("rules", [])]
    wild = [r for r in all_rules if "*" in r.get("verbs", []) + r.get("resources", []) + r.get("apiGroups", [])]
    c.check(not wild, f"{tag} no wildcard in any rule", wild)

    agent_rules = rules_of(agent_sa)
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

    ctrl_rules = rules_of(ctrl_sa)
    dep_rules = [(k, r) for k, r in ctrl_rules if "deployments" in r.get("resources", [])]
    c.check(dep_rules and all(k == "Role" and r.get("resourceNames") == [agent_name] for k, r in dep_rules)
            and any("patch" in r.get("verbs", []) for _, r in dep_rules),
            f"{tag} controller may patch Deployments only by name, only {agent_name}", dep_rules)
    lease = flag(ctrl, "leader-election-name")
    # The agents' reports are shared between replicas in a ConfigMap named after the Lease.
    for res, names in (("secrets", [tls_secret]), ("configmaps", [ca_cm, f"{lease}-agent-reports"]),
                       ("leases", [lease])):
        rs = [(k, r) for k, r in ctrl_rules if res in r.get("resources", [])]
        bad = [r for k, r in rs if k != "Role" or r.get("resourceNames") != names
               or "create" in r.get("verbs", [])]
        c.check(rs and not bad, f"{tag} controller {res}: namespaced, restricted to {names}, no create", bad)
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

    # ServiceMonitors, PDBs.
    sms = by_kind.get("ServiceMonitor", [])
    c.check(len(sms) == SERVICE_MONITORS[set_name],
            f"{tag} {SERVICE_MONITORS[set_name]} ServiceMonitor(s)", len(sms))
    for sm in sms:
        sel = sm["spec"]["selector"]["matchLabels"]
        targets = [s for s in by_kind.get("Service", [])
                   if all(s["metadata"].get("labels", {}).get(k) == v for k, v in sel.items())]
        c.check(len(targets) == 1 and any(p["name"] == sm["spec"]["endpoints"][0]["port"]
                                          for p in targets[0]["spec"]["ports"]),
                f"{tag} ServiceMonitor {sm['metadata']['name']} selects one Service with its port",
                [t["metadata"]["name"] for t in targets])
    pdbs = by_kind.get("PodDisruptionBudget", [])
    if PDB_API[set_name] is None:
        c.check(not pdbs, f"{tag} no PodDisruptionBudget")
    else:
        c.check(len(pdbs) == 2 and all(p["apiVersion"] == PDB_API[set_name] for p in pdbs),
                f"{tag} two PodDisruptionBudgets, {PDB_API[set_name]}", [p["apiVersion"] for p in pdbs])
    return c.failed


def main(argv):
    if len(argv) == 3 and argv[1] == "normalize":
        normalize(argv[2])
        return 0
    if len(argv) == 6 and argv[1] == "check":
        return 1 if check(argv[2], argv[3], argv[4], argv[5]) else 0
    sys.stderr.write(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
