{{/*
Names. Object names are DNS labels (Services need RFC 1035 labels), at most 63 characters.
*/}}

{{/*
The name, or nameOverride: "vmdhcp" whatever name the chart is published under (it is also
published as upstream's harvester-vm-dhcp-controller, so that Harvester's add-on can switch to it
without changing the Addon's immutable spec.chart), so that no selector of ours can match one of
upstream's pods (app.kubernetes.io/name harvester-vm-dhcp-*).
*/}}
{{- define "vmdhcp.name" -}}
{{- default "vmdhcp" .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
The full name: fullnameOverride, else the release name if it already contains the chart name
(or, without nameOverride, upstream's chart name: the add-on's release harvester-vm-dhcp-controller
keeps its name, as under upstream's chart), else "<release>-<chart>"; truncated to 63 characters.
*/}}
{{- define "vmdhcp.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "vmdhcp.name" . -}}
{{- if or (contains $name .Release.Name) (and (not .Values.nameOverride) (contains (include "vmdhcp.upstream.chartName" .) .Release.Name)) -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
"<fullname>-<suffix>" within 63 characters: the full name is shortened, never the suffix, so
that the names of the controller's and the agent's objects cannot collide after truncation.
Usage: include "vmdhcp.suffixed" (list . "controller")
*/}}
{{- define "vmdhcp.suffixed" -}}
{{- $ctx := index . 0 -}}
{{- $suffix := index . 1 -}}
{{- $base := include "vmdhcp.fullname" $ctx | trunc (int (sub 62 (len $suffix))) | trimSuffix "-" -}}
{{- printf "%s-%s" $base $suffix -}}
{{- end -}}

{{- define "vmdhcp.controller.fullname" -}}{{ include "vmdhcp.suffixed" (list . "controller") }}{{- end -}}
{{- define "vmdhcp.agent.fullname" -}}{{ include "vmdhcp.suffixed" (list . "agent") }}{{- end -}}
{{- define "vmdhcp.controller.metricsServiceName" -}}{{ include "vmdhcp.suffixed" (list . "controller-metrics") }}{{- end -}}
{{- define "vmdhcp.agent.metricsServiceName" -}}{{ include "vmdhcp.suffixed" (list . "agent-metrics") }}{{- end -}}
{{/* Secret holding the controller's CA and serving certificate (created and rotated by it). */}}
{{- define "vmdhcp.tlsSecretName" -}}{{ include "vmdhcp.suffixed" (list . "controller-tls") }}{{- end -}}
{{/* ConfigMap (key ca.crt) in which the controller publishes its CA for the agents. */}}
{{- define "vmdhcp.caConfigMapName" -}}{{ include "vmdhcp.suffixed" (list . "controller-ca") }}{{- end -}}
{{/* Role (and RoleBinding), in each namespace of controller.upstreamAgentNamespaces, that lets the
controller retire upstream's agent pods there. */}}
{{- define "vmdhcp.controller.upstreamRoleName" -}}{{ include "vmdhcp.suffixed" (list . "controller-upstream-agents") }}{{- end -}}
{{/*
Shared name of the Mutating- and ValidatingWebhookConfiguration: "<fullname>-webhook", or
"<fullname>-admission" where our full name is upstream's (the add-on's release, nameOverride,
fullnameOverride): upstream's webhook server named its own configurations "<fullname>-webhook",
outside its Helm release, and Helm refuses to create an object that exists and is not the
release's (templates/upstream-leftovers.yaml removes those).
*/}}
{{- define "vmdhcp.webhookName" -}}
{{- if eq (include "vmdhcp.fullname" .) (include "vmdhcp.upstream.fullname" .) -}}
{{- include "vmdhcp.suffixed" (list . "admission") -}}
{{- else -}}
{{- include "vmdhcp.suffixed" (list . "webhook") -}}
{{- end -}}
{{- end -}}

{{/* The ServiceAccounts' names, upstream's serviceAccount.* applied (templates/_upstream.tpl). */}}
{{- define "vmdhcp.controller.serviceAccountName" -}}
{{- $sa := (include "vmdhcp.upstream" . | fromYaml).controller.serviceAccount -}}
{{- if $sa.create -}}
{{- default (include "vmdhcp.controller.fullname" .) $sa.name -}}
{{- else -}}
{{- required "controller.serviceAccount.name is required when controller.serviceAccount.create is false" $sa.name -}}
{{- end -}}
{{- end -}}

{{- define "vmdhcp.agent.serviceAccountName" -}}
{{- $sa := (include "vmdhcp.upstream" . | fromYaml).agent.serviceAccount -}}
{{- if $sa.create -}}
{{- default (include "vmdhcp.agent.fullname" .) $sa.name -}}
{{- else -}}
{{- required "agent.serviceAccount.name is required when agent.serviceAccount.create is false" $sa.name -}}
{{- end -}}
{{- end -}}

{{/* The controller's in-cluster gRPC address, as the agents dial it. */}}
{{- define "vmdhcp.controllerEndpoint" -}}
{{- $scheme := ternary "http" "https" (eq .Values.tls.mode "plaintext") -}}
{{- printf "%s://%s.%s.svc:9090" $scheme (include "vmdhcp.controller.fullname" .) .Release.Namespace -}}
{{- end -}}

{{/*
The agent's bootstrap env. On install (and in `helm template`) it is empty, "[]". On upgrade it
is the value the controller last wrote into the live Deployment: rendering "[]" again would
make Helm 3's three-way merge reset it (the agents would roll twice and serve nothing in
between, until the controller rewrites it) and Helm 4's server-side apply refuse the upgrade
with a field-manager conflict against the controller.
*/}}
{{- define "vmdhcp.agent.bootstrapEnv" -}}
{{- $env := dict "AGENT_NETWORK_CONFIGS" "[]" "IPPOOL_REFS_JSON" "[]" -}}
{{- $live := lookup "apps/v1" "Deployment" .Release.Namespace (include "vmdhcp.agent.fullname" .) -}}
{{- range $c := dig "spec" "template" "spec" "containers" (list) ($live | default dict) -}}
{{- if eq (get $c "name") "agent" -}}
{{- range $e := (get $c "env" | default list) -}}
{{- if and (hasKey $env (get $e "name")) (kindIs "string" (get $e "value")) -}}
{{- $_ := set $env (get $e "name") (get $e "value") -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
- name: AGENT_NETWORK_CONFIGS
  value: {{ get $env "AGENT_NETWORK_CONFIGS" | toJson }}
- name: IPPOOL_REFS_JSON
  value: {{ get $env "IPPOOL_REFS_JSON" | toJson }}
{{- end -}}

{{/*
Labels.
*/}}
{{- define "vmdhcp.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels of every object. Usage: include "vmdhcp.labels" (list . "controller") */}}
{{- define "vmdhcp.labels" -}}
{{- $ctx := index . 0 -}}
helm.sh/chart: {{ include "vmdhcp.chart" $ctx }}
{{ include "vmdhcp.selectorLabels" . }}
app.kubernetes.io/version: {{ $ctx.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ $ctx.Release.Service }}
app.kubernetes.io/part-of: vmdhcp
{{- end -}}

{{/* Selector labels (immutable in a Deployment: never add to them). */}}
{{- define "vmdhcp.selectorLabels" -}}
{{- $ctx := index . 0 -}}
app.kubernetes.io/name: {{ include "vmdhcp.name" $ctx }}
app.kubernetes.io/instance: {{ $ctx.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{/*
The peers the NetworkPolicies admit to the metrics port (http, 8080), as YAML {peers: [...]}:
networkPolicy.metrics.from, then, when this release creates ServiceMonitors, every pod of
networkPolicy.metrics.prometheusNamespace, so that the NetworkPolicies never block the scrapes
those ServiceMonitors ask for. Usage: (include "vmdhcp.metricsPeers" . | fromYaml).peers
*/}}
{{- define "vmdhcp.metricsPeers" -}}
{{- $m := .Values.networkPolicy.metrics -}}
{{- $peers := concat (list) ($m.from | default list) -}}
{{- if and .Values.serviceMonitor.enabled $m.prometheusNamespace -}}
{{- $peers = append $peers (dict "namespaceSelector" (dict "matchLabels" (dict "kubernetes.io/metadata.name" $m.prometheusNamespace))) -}}
{{- end -}}
{{- toYaml (dict "peers" $peers) -}}
{{- end -}}

{{/* image reference of a component: include "vmdhcp.image" (list . .Values.controller.image) */}}
{{- define "vmdhcp.image" -}}
{{- $ctx := index . 0 -}}
{{- $image := index . 1 -}}
{{- printf "%s:%s" $image.repository (default $ctx.Chart.AppVersion $image.tag) -}}
{{- end -}}

{{/*
Default scheduling: replicas prefer distinct nodes, so that losing a node costs at most one
replica (the leader's standby takes over). Replaced entirely by <component>.affinity when set.
Usage: include "vmdhcp.affinity" (list . "controller" .Values.controller.affinity)
*/}}
{{- define "vmdhcp.affinity" -}}
{{- $affinity := index . 2 -}}
{{- if $affinity -}}
{{- toYaml $affinity -}}
{{- else -}}
podAntiAffinity:
  preferredDuringSchedulingIgnoredDuringExecution:
    - weight: 100
      podAffinityTerm:
        topologyKey: kubernetes.io/hostname
        labelSelector:
          matchLabels:
            {{- include "vmdhcp.selectorLabels" (list (index . 0) (index . 1)) | nindent 12 }}
{{- end -}}
{{- end -}}

{{/*
Environment shared by both binaries: logging and, when an OTLP endpoint is set, tracing.
POD_NAME and POD_NAMESPACE must be defined before (they are referenced as $(POD_NAME)).
Usage: include "vmdhcp.telemetryEnv" (list . "vm-dhcp-controller" .Values.controller.logLevel)
*/}}
{{- define "vmdhcp.telemetryEnv" -}}
{{- $ctx := index . 0 -}}
{{- $service := index . 1 -}}
{{- $level := default $ctx.Values.logging.level (index . 2) -}}
- name: LOG_FORMAT
  value: {{ $ctx.Values.logging.format | quote }}
- name: RUST_LOG
  value: {{ $level | quote }}
{{- with $ctx.Values.tracing }}
{{- if .otlpEndpoint }}
- name: OTEL_EXPORTER_OTLP_ENDPOINT
  value: {{ .otlpEndpoint | quote }}
- name: OTEL_SERVICE_NAME
  value: {{ $service | quote }}
{{- $attrs := list "k8s.namespace.name=$(POD_NAMESPACE)" "k8s.pod.name=$(POD_NAME)" }}
{{- range $k, $v := .resourceAttributes }}
{{- $attrs = append $attrs (printf "%s=%v" $k $v) }}
{{- end }}
- name: OTEL_RESOURCE_ATTRIBUTES
  value: {{ join "," $attrs | quote }}
{{- with .sampler }}
- name: OTEL_TRACES_SAMPLER
  value: {{ . | quote }}
{{- end }}
{{- with .samplerArg }}
- name: OTEL_TRACES_SAMPLER_ARG
  value: {{ . | quote }}
{{- end }}
{{- end }}
{{- end }}
{{- end -}}

{{/*
PodDisruptionBudget apiVersion: policy/v1 from Kubernetes 1.21 (v1beta1 is gone in 1.25).
Both conditions: `helm template` claims every built-in API whatever --kube-version says.
*/}}
{{- define "vmdhcp.pdb.apiVersion" -}}
{{- if and (.Capabilities.APIVersions.Has "policy/v1") (semverCompare ">=1.21-0" .Capabilities.KubeVersion.Version) -}}
policy/v1
{{- else -}}
policy/v1beta1
{{- end -}}
{{- end -}}

{{/*
Checks that the schema cannot express. Rendered (to nothing) once, from the controller Deployment.
*/}}
{{- define "vmdhcp.validate" -}}
{{- range $component := list "controller" "agent" -}}
{{- $le := (index $.Values $component).leaderElection -}}
{{- if not (gt (int $le.leaseDurationSeconds) (int $le.renewDeadlineSeconds)) -}}
{{- fail (printf "%s.leaderElection: leaseDurationSeconds (%v) must be greater than renewDeadlineSeconds (%v)" $component $le.leaseDurationSeconds $le.renewDeadlineSeconds) -}}
{{- end -}}
{{- if not (gt (int $le.renewDeadlineSeconds) (int $le.retryPeriodSeconds)) -}}
{{- fail (printf "%s.leaderElection: renewDeadlineSeconds (%v) must be greater than retryPeriodSeconds (%v)" $component $le.renewDeadlineSeconds $le.retryPeriodSeconds) -}}
{{- end -}}
{{- end -}}
{{- if and (eq .Values.tls.mode "plaintext") (not .Values.tls.insecure) -}}
{{- fail "tls.mode=plaintext serves the config stream without TLS or authentication: anyone who can reach the controller reads every pool's leases, MACs and addresses and can send agent reports. Set tls.insecure=true to accept that (local clusters only), or use tls.mode=controller" -}}
{{- end -}}
{{- $np := .Values.networkPolicy -}}
{{- if and $np.enabled .Values.serviceMonitor.enabled (not $np.metrics.prometheusNamespace) (not $np.metrics.from) -}}
{{- fail "networkPolicy.enabled with serviceMonitor.enabled: the NetworkPolicies would admit nobody to the metrics port, and no Prometheus could scrape through the ServiceMonitors. Set networkPolicy.metrics.prometheusNamespace to your Prometheus's namespace (default cattle-monitoring-system), or networkPolicy.metrics.from to peers that match it" -}}
{{- end -}}
{{- $t := .Values.prometheusRule.thresholds -}}
{{- if not (lt (float64 $t.certificateExpiryCriticalDays) (float64 $t.certificateExpiryWarningDays)) -}}
{{- fail (printf "prometheusRule.thresholds: certificateExpiryCriticalDays (%v) must be less than certificateExpiryWarningDays (%v): the warning comes first" $t.certificateExpiryCriticalDays $t.certificateExpiryWarningDays) -}}
{{- end -}}
{{- if and (or .Values.tracing.sampler .Values.tracing.samplerArg) (not .Values.tracing.otlpEndpoint) -}}
{{- fail "tracing.sampler/samplerArg are set but tracing.otlpEndpoint is empty: traces would go nowhere" -}}
{{- end -}}
{{- end -}}
