//! One `vm-dhcp-controller` process serving what the chart exposes, over TLS: the config stream
//! with agent-token authentication and the admission webhook, registered with the API server by
//! URL and no caBundle (the controller injects its CA), for the suites that attack those
//! listeners.
//!
//! These helpers fail the calling test on any error: they are test code, not product code.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::PathBuf;
use std::time::Duration;

use serde_json::json;

use crate::control_plane::{ControlPlane, run};
use crate::dhcp_client::wait_for;
use crate::ports::free_port;
use crate::process::{Supervised, workspace_binary};

/// The audience agent tokens are minted for.
pub const AUDIENCE: &str = "vm-dhcp-controller";
/// The controller's ServiceAccount for agents, in its namespace.
pub const AGENT_ACCOUNT: &str = "agent";

/// The running controller; stopped on drop.
pub struct SecureController {
    process: Supervised,
    /// The config stream's port on 127.0.0.1.
    pub grpc: u16,
    /// The webhook's port on 127.0.0.1.
    pub webhook: u16,
    /// Its files: log, CA bundle, tokens.
    pub dir: PathBuf,
    namespace: String,
    ca_configmap: String,
}

impl SecureController {
    /// Creates `namespace` with the agents' ServiceAccount, registers the validating webhook
    /// `name` for VirtualMachineNetworkConfig creates in namespaces labelled `label=on`
    /// (`failurePolicy: Fail`, as the chart does), starts the controller with `extra` flags and
    /// returns once it has injected its CA into the registration.
    pub fn start(
        cp: &ControlPlane,
        name: &str,
        namespace: &str,
        label: &str,
        extra: &[&str],
    ) -> Self {
        let grpc = free_port();
        let webhook = free_port();
        let manifest = json!({"apiVersion": "v1", "kind": "List", "items": [
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
            {"apiVersion": "v1", "kind": "ServiceAccount",
             "metadata": {"name": AGENT_ACCOUNT, "namespace": namespace}},
            {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
             "metadata": {"name": name},
             "webhooks": [{
                 "name": "validate.vmdhcp.network.harvesterhci.io",
                 "admissionReviewVersions": ["v1"], "sideEffects": "None", "failurePolicy": "Fail",
                 "timeoutSeconds": 10,
                 "clientConfig": {"url": format!("https://127.0.0.1:{webhook}/validate")},
                 "namespaceSelector": {"matchLabels": {label: "on"}},
                 "rules": [{"apiGroups": ["network.harvesterhci.io"], "apiVersions": ["v1alpha1"],
                            "resources": ["virtualmachinenetworkconfigs"], "operations": ["CREATE"],
                            "scope": "Namespaced"}],
             }]},
        ]});
        cp.kubectl_stdin(&["apply", "-f", "-"], &manifest.to_string())
            .unwrap();
        let dir = cp.dir().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        let ca_configmap = format!("{name}-ca");
        let mut args: Vec<String> = vec![
            "run".into(),
            format!("--kubeconfig={}", cp.kubeconfig().display()),
            format!("--identity={name}-0"),
            format!("--grpc-listen=127.0.0.1:{grpc}"),
            format!("--http-listen=127.0.0.1:{}", free_port()),
            format!("--webhook-listen=127.0.0.1:{webhook}"),
            "--no-leader-election".into(),
            format!("--leader-election-namespace={namespace}"),
            format!("--tls-secret={name}-tls"),
            "--service-name=vmdhcp-controller".into(),
            "--tls-san=127.0.0.1".into(),
            format!("--ca-configmap={ca_configmap}"),
            format!("--webhook-name={name}"),
            format!("--token-audience={AUDIENCE}"),
            format!("--agent-service-account={namespace}:{AGENT_ACCOUNT}"),
        ];
        args.extend(extra.iter().map(|a| (*a).to_owned()));
        let bin = workspace_binary("vmdhcp-controller", "vm-dhcp-controller");
        let process = Supervised::spawn(&bin, &args, &dir.join("controller.log"), None).unwrap();
        let controller = SecureController {
            process,
            grpc,
            webhook,
            dir,
            namespace: namespace.to_owned(),
            ca_configmap,
        };
        wait_for(
            "the CA injected into the webhook",
            Duration::from_secs(60),
            || {
                let out = controller.kubectl(&[
                    "get",
                    "validatingwebhookconfiguration",
                    name,
                    "-o",
                    "jsonpath={.webhooks[0].clientConfig.caBundle}",
                ]);
                (!out.trim().is_empty()).then_some(())
            },
        );
        controller
    }

    fn kubectl(&self, args: &[&str]) -> String {
        run(ControlPlane::shared().kubectl().args(args))
            .unwrap_or_else(|e| panic!("kubectl {args:?}: {e}\n{}", self.process.log_tail(30)))
    }

    /// The process id of the controller.
    pub fn pid(&self) -> u32 {
        self.process.pid().expect("the controller's pid")
    }

    /// The end of its log, for failure messages.
    pub fn log_tail(&self, lines: usize) -> String {
        self.process.log_tail(lines)
    }

    /// The CA bundle it publishes, as PEM, also written to `dir/ca.crt` (returned).
    pub fn ca(&self) -> (String, PathBuf) {
        let key = "jsonpath={.data.ca\\.crt}";
        let pem = wait_for("the CA ConfigMap", Duration::from_secs(60), || {
            let out = self.kubectl(&[
                "get",
                "configmap",
                "-n",
                &self.namespace,
                &self.ca_configmap,
                "-o",
                key,
            ]);
            out.contains("BEGIN CERTIFICATE").then_some(out)
        });
        let path = self.dir.join("ca.crt");
        std::fs::write(&path, &pem).unwrap();
        (pem, path)
    }

    /// A token of the agents' ServiceAccount for the stream's audience, in a file (returned).
    pub fn agent_token(&self) -> PathBuf {
        let token = self.kubectl(&[
            "create",
            "token",
            AGENT_ACCOUNT,
            "-n",
            &self.namespace,
            "--audience",
            AUDIENCE,
        ]);
        let path = self.dir.join("agent.token");
        std::fs::write(&path, token.trim()).unwrap();
        path
    }
}
