//! The API server's audit log read as "who used which permission": the requests of one
//! ServiceAccount as (API group, resource, verb), each allowed or refused by the authorizer, and
//! the same triples expanded from the RBAC rules bound to it, so a test can name every granted
//! permission nobody used and every call that was refused.
//!
//! Owns only the parsing and the comparison (pure functions of the log's lines and of the RBAC
//! objects as `kubectl get -o json` prints them); starting an audited API server is
//! [`crate::node::Node::start_audited`]'s, and deciding what may be exempt is the test's.

use std::collections::BTreeSet;
use std::fmt;
use std::path::Path;

use serde::Deserialize;
use serde_json::Value;

/// Why the audit log could not be read.
#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    /// The file could not be read.
    #[error("reading the audit log {path}: {source}")]
    Read {
        /// The log's path.
        path: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// A line is not an audit event.
    #[error("audit log {path}, line {line}: {source}")]
    Parse {
        /// The log's path.
        path: String,
        /// The line number, from 1.
        line: usize,
        /// What serde said.
        source: serde_json::Error,
    },
}

/// An audit policy logging the metadata of every request made by the ServiceAccounts of
/// `namespace`, and nothing else: the node's own components make far more requests than ours, and
/// a log of them all would grow by megabytes a minute. `ResponseStarted` is kept so that a watch
/// is logged when it starts, not only when it ends (minutes later, or never within the test).
pub fn service_account_policy(namespace: &str) -> String {
    format!(
        "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n\
         - level: Metadata\n  userGroups: [\"system:serviceaccounts:{namespace}\"]\n\
         - level: None\n"
    )
}

/// One permission as RBAC grants it and a request uses it: `resource` carries the subresource
/// (`ippools/status`), `group` is empty for the core API.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Access {
    /// The verb (get, list, watch, create, update, patch, delete, …).
    pub verb: String,
    /// The API group, `""` for core.
    pub group: String,
    /// The resource, with `/subresource` when there is one.
    pub resource: String,
}

impl Access {
    /// The permission `verb` on `group`'s `resource`.
    pub fn new(verb: &str, group: &str, resource: &str) -> Self {
        Access {
            verb: verb.to_owned(),
            group: group.to_owned(),
            resource: resource.to_owned(),
        }
    }
}

impl fmt::Display for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.group.is_empty() {
            write!(f, "({}, {})", self.verb, self.resource)
        } else {
            write!(f, "({}, {}.{})", self.verb, self.resource, self.group)
        }
    }
}

/// The fields of an audit event (`audit.k8s.io/v1` `Event`) this module reads.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Event {
    /// Who asked.
    pub user: User,
    /// The RBAC verb of the request (`watch` for a list with `?watch=true`).
    pub verb: String,
    /// What it was about; absent for non-resource URLs (`/version`, `/api`).
    #[serde(default)]
    pub object_ref: Option<ObjectRef>,
    /// The response; its code is 403 when the authorizer refused.
    #[serde(default)]
    pub response_status: Option<ResponseStatus>,
    /// The authorizer's `authorization.k8s.io/decision` (`allow` or `forbid`) among others.
    #[serde(default)]
    pub annotations: std::collections::BTreeMap<String, String>,
    /// The request's URI, for messages.
    #[serde(default)]
    pub request_uri: String,
}

/// The requesting user of an [`Event`].
#[derive(Clone, Debug, Deserialize)]
pub struct User {
    /// `system:serviceaccount:<namespace>:<name>` for a ServiceAccount.
    #[serde(default)]
    pub username: String,
}

/// The object of an [`Event`].
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectRef {
    /// The resource (plural).
    #[serde(default)]
    pub resource: String,
    /// The subresource, if any.
    #[serde(default)]
    pub subresource: Option<String>,
    /// The API group; absent for core.
    #[serde(default)]
    pub api_group: Option<String>,
    /// The namespace; absent for cluster-scoped objects.
    #[serde(default)]
    pub namespace: Option<String>,
}

/// The response of an [`Event`].
#[derive(Clone, Debug, Deserialize)]
pub struct ResponseStatus {
    /// The HTTP status code.
    #[serde(default)]
    pub code: u16,
}

/// Reads every event of the log at `path` (JSON lines).
pub fn read_log(path: &Path) -> Result<Vec<Event>, AuditError> {
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| AuditError::Read {
        path: shown.clone(),
        source,
    })?;
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(n, l)| {
            serde_json::from_str(l).map_err(|source| AuditError::Parse {
                path: shown.clone(),
                line: n + 1,
                source,
            })
        })
        .collect()
}

/// The username the API server gives ServiceAccount `name` of `namespace`.
pub fn service_account_user(namespace: &str, name: &str) -> String {
    format!("system:serviceaccount:{namespace}:{name}")
}

/// What one user's requests came to.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Permissions the authorizer let a request use (whatever the request's outcome after that:
    /// a 404 or a 409 still used the permission).
    pub used: BTreeSet<Access>,
    /// Permissions a request was refused for, with one URI each that shows it.
    pub denied: BTreeSet<(Access, String)>,
}

/// What `user` used and was refused, from `events`.
///
/// A server-side apply that creates its object is logged as a `patch` answered 201, for which the
/// API server also authorized `create` (it logs no second decision): it counts as both, and a
/// refusal of it (403 after the `patch` was allowed) as a refused `create`.
pub fn usage(events: &[Event], user: &str) -> Usage {
    let mut usage = Usage::default();
    for e in events.iter().filter(|e| e.user.username == user) {
        let (used, denied) = permissions(e);
        usage.used.extend(used);
        usage
            .denied
            .extend(denied.into_iter().map(|a| (a, e.request_uri.clone())));
    }
    usage
}

/// How many of `user`'s requests in `events` used `access`: for a test that must see a
/// permission used again after some point, not only at some time.
pub fn uses(events: &[Event], user: &str, access: &Access) -> usize {
    events
        .iter()
        .filter(|e| e.user.username == user && permissions(e).0.contains(access))
        .count()
}

/// The permissions one event used and was refused (see [`usage`]).
fn permissions(e: &Event) -> (Vec<Access>, Vec<Access>) {
    let Some(object) = &e.object_ref else {
        // Non-resource URLs (`/version`, `/api`): the cluster's discovery roles, not the chart's.
        return (Vec::new(), Vec::new());
    };
    let resource = match object.subresource.as_deref() {
        Some(sub) if !sub.is_empty() => format!("{}/{sub}", object.resource),
        _ => object.resource.clone(),
    };
    let access = Access::new(
        &e.verb,
        object.api_group.as_deref().unwrap_or_default(),
        &resource,
    );
    let code = e.response_status.as_ref().map_or(0, |s| s.code);
    let allowed = match e
        .annotations
        .get("authorization.k8s.io/decision")
        .map(String::as_str)
    {
        Some("allow") => true,
        Some(_) => false,
        None => code != 403,
    };
    if !allowed {
        return (Vec::new(), vec![access]);
    }
    let create = Access {
        verb: "create".into(),
        ..access.clone()
    };
    match (e.verb.as_str(), code) {
        ("patch", 201) => (vec![access, create], Vec::new()),
        ("patch", 403) => (vec![access], vec![create]),
        _ => (vec![access], Vec::new()),
    }
}

/// Every permission the RBAC objects in `objects` (Roles, ClusterRoles and their bindings, as
/// `kubectl get … -o json` lists them) grant ServiceAccount `name` of `namespace` through a
/// binding naming it; bindings to groups (the cluster's discovery roles) are not the chart's and
/// are left out. `resourceNames` do not narrow a triple: a named rule still grants the verb on
/// the resource.
pub fn granted(objects: &[Value], namespace: &str, name: &str) -> BTreeSet<Access> {
    let mut out = BTreeSet::new();
    let names_us = |b: &Value| {
        b["subjects"].as_array().into_iter().flatten().any(|s| {
            s["kind"] == "ServiceAccount" && s["name"] == name && s["namespace"] == namespace
        })
    };
    for binding in objects.iter().filter(|o| {
        (o["kind"] == "RoleBinding" || o["kind"] == "ClusterRoleBinding") && names_us(o)
    }) {
        let role_ref = &binding["roleRef"];
        // A RoleBinding may refer to a Role of its namespace or to a ClusterRole.
        let role = objects.iter().find(|o| {
            o["kind"] == role_ref["kind"]
                && o["metadata"]["name"] == role_ref["name"]
                && (role_ref["kind"] == "ClusterRole"
                    || o["metadata"]["namespace"] == binding["metadata"]["namespace"])
        });
        for rule in role
            .and_then(|r| r["rules"].as_array())
            .into_iter()
            .flatten()
        {
            let strings = |key: &str| -> Vec<String> {
                rule[key]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|v| v.as_str().map(str::to_owned))
                    .collect()
            };
            for group in strings("apiGroups") {
                for resource in strings("resources") {
                    for verb in strings("verbs") {
                        out.insert(Access::new(&verb, &group, &resource));
                    }
                }
            }
        }
    }
    out
}

/// How what one ServiceAccount was granted compares with what it did.
#[derive(Debug, Default)]
pub struct Comparison {
    /// Granted, never used, not exempt.
    pub unused: Vec<Access>,
    /// Exempt permissions that were indeed unused (printed, not failed).
    pub exempt_unused: Vec<Access>,
    /// Refused by the authorizer, with a request URI that shows it.
    pub denied: Vec<(Access, String)>,
    /// Used, allowed, but not by the rules bound to the ServiceAccount (another binding, such
    /// as a group's, let it through).
    pub ungranted: Vec<Access>,
}

impl Comparison {
    /// Compares `granted` with `usage`; `exempt` lists granted permissions allowed to go unused.
    pub fn of(granted: &BTreeSet<Access>, usage: &Usage, exempt: &[Access]) -> Self {
        let (exempt_unused, unused) = granted
            .iter()
            .filter(|a| !usage.used.contains(a))
            .cloned()
            .partition(|a| exempt.contains(a));
        Comparison {
            unused,
            exempt_unused,
            denied: usage.denied.iter().cloned().collect(),
            ungranted: usage.used.difference(granted).cloned().collect(),
        }
    }

    /// Whether nothing is amiss.
    pub fn is_clean(&self) -> bool {
        self.unused.is_empty() && self.denied.is_empty() && self.ungranted.is_empty()
    }
}

impl fmt::Display for Comparison {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for a in &self.unused {
            writeln!(f, "  granted, never used: {a}")?;
        }
        for (a, uri) in &self.denied {
            writeln!(f, "  used, refused (403): {a} e.g. {uri}")?;
        }
        for a in &self.ungranted {
            writeln!(f, "  used, not granted by its own rules: {a}")?;
        }
        for a in &self.exempt_unused {
            writeln!(f, "  granted, unused, exempt: {a}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const SA: &str = "system:serviceaccount:ns:ctrl";

    fn event(
        verb: &str,
        group: &str,
        resource: &str,
        sub: &str,
        code: u16,
        decision: &str,
    ) -> Event {
        serde_json::from_value(json!({
            "kind": "Event", "stage": "ResponseComplete", "user": {"username": SA},
            "verb": verb, "requestURI": format!("/x/{resource}"),
            "objectRef": {"resource": resource, "subresource": sub, "apiGroup": group},
            "responseStatus": {"code": code},
            "annotations": {"authorization.k8s.io/decision": decision}
        }))
        .unwrap()
    }

    #[test]
    fn requests_count_as_used_unless_the_authorizer_refused_them() {
        let events = vec![
            event("get", "g", "ippools", "status", 404, "allow"),
            event("patch", "g", "configs", "", 201, "allow"),
            event("patch", "g", "configs", "", 200, "allow"),
            event("delete", "", "pods", "", 403, "forbid"),
            serde_json::from_value(json!({"user": {"username": "someone"}, "verb": "list",
                "objectRef": {"resource": "pods"}, "responseStatus": {"code": 200}}))
            .unwrap(),
        ];
        let u = usage(&events, SA);
        let used: Vec<String> = u.used.iter().map(ToString::to_string).collect();
        assert_eq!(
            used,
            [
                "(create, configs.g)",
                "(get, ippools/status.g)",
                "(patch, configs.g)"
            ]
        );
        assert_eq!(
            u.denied
                .iter()
                .map(|(a, _)| a.to_string())
                .collect::<Vec<_>>(),
            ["(delete, pods)"]
        );
    }

    #[test]
    fn only_bindings_naming_the_service_account_grant_it_anything() {
        let objects = vec![
            json!({"kind": "ClusterRole", "metadata": {"name": "c"},
                "rules": [{"apiGroups": ["g"], "resources": ["a", "a/status"], "verbs": ["get", "list"]}]}),
            json!({"kind": "ClusterRoleBinding", "metadata": {"name": "c"},
                "roleRef": {"kind": "ClusterRole", "name": "c"},
                "subjects": [{"kind": "ServiceAccount", "name": "ctrl", "namespace": "ns"}]}),
            json!({"kind": "Role", "metadata": {"name": "r", "namespace": "other"},
                "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["delete"]}]}),
            json!({"kind": "Role", "metadata": {"name": "r", "namespace": "ns"},
                "rules": [{"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["s"], "verbs": ["update"]}]}),
            json!({"kind": "RoleBinding", "metadata": {"name": "r", "namespace": "ns"},
                "roleRef": {"kind": "Role", "name": "r"},
                "subjects": [{"kind": "ServiceAccount", "name": "ctrl", "namespace": "ns"}]}),
            json!({"kind": "ClusterRoleBinding", "metadata": {"name": "groups"},
                "roleRef": {"kind": "ClusterRole", "name": "c"},
                "subjects": [{"kind": "Group", "name": "system:serviceaccounts"}]}),
        ];
        let g: Vec<String> = granted(&objects, "ns", "ctrl")
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            g,
            [
                "(get, a.g)",
                "(get, a/status.g)",
                "(list, a.g)",
                "(list, a/status.g)",
                "(update, secrets)"
            ]
        );
        assert!(granted(&objects, "ns", "agent").is_empty());
    }

    #[test]
    fn the_comparison_names_unused_refused_and_ungranted_permissions() {
        let granted: BTreeSet<Access> = [
            Access::new("get", "", "pods"),
            Access::new("list", "", "pods"),
            Access::new("watch", "", "pods"),
        ]
        .into();
        let usage = Usage {
            used: [
                Access::new("get", "", "pods"),
                Access::new("get", "", "nodes"),
            ]
            .into(),
            denied: [(Access::new("delete", "", "pods"), "/api/v1/…".to_owned())].into(),
        };
        let c = Comparison::of(&granted, &usage, &[Access::new("watch", "", "pods")]);
        assert_eq!(c.unused, [Access::new("list", "", "pods")]);
        assert_eq!(c.exempt_unused, [Access::new("watch", "", "pods")]);
        assert_eq!(c.ungranted, [Access::new("get", "", "nodes")]);
        assert_eq!(c.denied.len(), 1);
        assert!(!c.is_clean());
        let text = c.to_string();
        assert!(text.contains("granted, never used: (list, pods)"), "{text}");
        assert!(
            text.contains("used, refused (403): (delete, pods)"),
            "{text}"
        );
    }
}
