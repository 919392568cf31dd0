{{/*
Upstream's chart (harvester/vm-dhcp-controller, and Harvester's packaging of it, which adds
webhook.* and serviceCIDR) under this chart: its values read as this chart's, its names, and its
leftovers. chart/README.md ("Upstream's values") has the table; tests/values-upstream*.yaml and
their golden renders pin each mapping.
*/}}

{{/* Upstream's chart name: its full name is derived from it as ours is from "vmdhcp". */}}
{{- define "vmdhcp.upstream.chartName" -}}harvester-vm-dhcp-controller{{- end -}}

{{/*
The full name upstream's chart gives this release with the same values (nameOverride and
fullnameOverride are keys of both charts): what its objects, and those its processes created,
are named after.
*/}}
{{- define "vmdhcp.upstream.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default (include "vmdhcp.upstream.chartName" .) .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* True (non-empty) when an image repository names one of upstream's own images. */}}
{{- define "vmdhcp.upstream.isUpstreamImage" -}}
{{- if regexMatch "(^|/)harvester-vm-dhcp-(controller|agent|webhook)$" (toString .) -}}true{{- end -}}
{{- end -}}

{{/*
What this release runs once upstream's values are read, as YAML:
  controller, agent:   the components' values with upstream's keys applied;
  notes:               one line per upstream key given, saying what became of it.
This chart's own key wins where both are given; "given" means set to something other than the
chart's default (files/values-defaults.yaml is values.yaml: Helm does not tell templates which
values the user set). Usage: $u := include "vmdhcp.upstream" . | fromYaml
*/}}
{{- define "vmdhcp.upstream" -}}
{{- $v := .Values -}}
{{- $d := .Files.Get "files/values-defaults.yaml" | fromYaml -}}
{{- $c := deepCopy $v.controller -}}
{{- $a := deepCopy $v.agent -}}
{{- $notes := list -}}
{{- $ours := dict -}}
{{- /* which of our keys are given (differ from the default) */ -}}
{{- range $k := list "replicas" "podSecurityContext" "securityContext" "resources" "nodeSelector" "tolerations" "affinity" "extraVolumes" "extraVolumeMounts" "serviceCIDR" -}}
{{- $_ := set $ours (printf "controller.%s" $k) (ne (toJson (index $v.controller $k)) (toJson (index $d.controller $k))) -}}
{{- end -}}
{{- range $comp := list "controller" "agent" -}}
{{- range $k := list "repository" "tag" "pullPolicy" -}}
{{- $_ := set $ours (printf "%s.image.%s" $comp $k) (ne (toJson (index (index $v $comp).image $k)) (toJson (index (index $d $comp).image $k))) -}}
{{- end -}}
{{- range $k := list "create" "name" -}}
{{- $_ := set $ours (printf "%s.serviceAccount.%s" $comp $k) (ne (toJson (index (index $v $comp).serviceAccount $k)) (toJson (index (index $d $comp).serviceAccount $k))) -}}
{{- end -}}
{{- end -}}

{{- /* replicaCount -> controller.replicas, but never below 2: upstream's default is 1, which
here would leave no standby (nothing allocated, no webhook answer while that one restarts) */ -}}
{{- if hasKey $v "replicaCount" -}}
{{- if get $ours "controller.replicas" -}}
{{- $notes = append $notes (printf "replicaCount=%v: ignored, controller.replicas=%v is given (this chart's keys win)" $v.replicaCount $v.controller.replicas) -}}
{{- else if lt (int $v.replicaCount) 2 -}}
{{- $notes = append $notes (printf "replicaCount=%v: ignored, the controller keeps %v replicas: with fewer than 2 there is no standby, and while the one replica restarts nothing is allocated and the webhook does not answer (set controller.replicas to run fewer)" $v.replicaCount $c.replicas) -}}
{{- else -}}
{{- $_ := set $c "replicas" $v.replicaCount -}}
{{- $notes = append $notes (printf "replicaCount=%v -> controller.replicas (one elected leader writes; every replica serves the webhook and the config stream)" $v.replicaCount) -}}
{{- end -}}
{{- end -}}

{{- /* image.* then webhook.image.* -> controller.image: vmdhcp's webhook is served by its controller */ -}}
{{- $sources := list -}}
{{- if hasKey $v "image" -}}{{- $sources = append $sources (list "image" $v.image) -}}{{- end -}}
{{- if and (hasKey $v.webhook "image") $v.webhook.image -}}{{- $sources = append $sources (list "webhook.image" $v.webhook.image) -}}{{- end -}}
{{- $taken := dict -}}
{{- range $src := $sources -}}
{{- $key := index $src 0 -}}
{{- $img := index $src 1 -}}
{{- $foreign := include "vmdhcp.upstream.isUpstreamImage" ($img.repository | default "") -}}
{{- range $f := list "repository" "tag" "pullPolicy" -}}
{{- if hasKey $img $f -}}
{{- $val := index $img $f -}}
{{- if and $foreign (ne $f "pullPolicy") -}}
{{- $notes = append $notes (printf "%s.%s=%v: ignored, %s is upstream's own image (the Go %s), which this chart cannot run: controller.image.%s stays vmdhcp's" $key $f $val $img.repository (ternary "webhook server" "controller" (eq $key "webhook.image")) $f) -}}
{{- else if get $ours (printf "controller.image.%s" $f) -}}
{{- $notes = append $notes (printf "%s.%s=%v: ignored, controller.image.%s is given (this chart's keys win)" $key $f $val $f) -}}
{{- else if and (hasKey $taken $f) (eq (toString $val) (toString (index $c.image $f))) -}}
{{- $notes = append $notes (printf "%s.%s=%v: the same as %s.%s (vmdhcp's webhook is served by its controller: one image)" $key $f $val (get $taken $f) $f) -}}
{{- else if hasKey $taken $f -}}
{{- $notes = append $notes (printf "%s.%s=%v: ignored, %s.%s is given (vmdhcp's webhook is served by its controller: one image)" $key $f $val (get $taken $f) $f) -}}
{{- else if and (eq $f "tag") (eq (toString $val) "") -}}
{{- $notes = append $notes (printf "%s.tag=\"\" -> controller.image.tag (empty: the chart's appVersion, %s)" $key $.Chart.AppVersion) -}}
{{- $_ := set $taken $f $key -}}
{{- else -}}
{{- $_ := set $c.image $f $val -}}
{{- $_ := set $taken $f $key -}}
{{- $notes = append $notes (printf "%s.%s=%v -> controller.image.%s%s" $key $f $val $f (ternary " (vmdhcp's webhook is served by its controller)" "" (eq $key "webhook.image"))) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- /* agent.image: the same key in both charts; upstream's own agent image cannot run here */ -}}
{{- if include "vmdhcp.upstream.isUpstreamImage" $v.agent.image.repository -}}
{{- $notes = append $notes (printf "agent.image.repository=%s, agent.image.tag=%q: ignored, upstream's own agent image (the Go per-pool agent), which this chart cannot run: the agents run %s:%s" $v.agent.image.repository $v.agent.image.tag $d.agent.image.repository (default $.Chart.AppVersion $d.agent.image.tag)) -}}
{{- $_ := set $a.image "repository" $d.agent.image.repository -}}
{{- $_ := set $a.image "tag" $d.agent.image.tag -}}
{{- end -}}

{{- /* serviceAccount.* -> controller.serviceAccount and agent.serviceAccount */ -}}
{{- with $v.serviceAccount -}}
{{- if hasKey . "create" -}}
{{- range $comp := list "controller" "agent" -}}
{{- if get $ours (printf "%s.serviceAccount.create" $comp) -}}
{{- $notes = append $notes (printf "serviceAccount.create=%v: ignored for the %s, %s.serviceAccount.create is given (this chart's keys win)" $v.serviceAccount.create $comp $comp) -}}
{{- else -}}
{{- $_ := set (ternary $c $a (eq $comp "controller")).serviceAccount "create" $v.serviceAccount.create -}}
{{- end -}}
{{- end -}}
{{- $notes = append $notes (printf "serviceAccount.create=%v -> controller.serviceAccount.create and agent.serviceAccount.create" .create) -}}
{{- end -}}
{{- if .name -}}
{{- range $comp := list "controller" "agent" -}}
{{- $want := ternary $v.serviceAccount.name (printf "%s-agent" $v.serviceAccount.name) (eq $comp "controller") -}}
{{- if get $ours (printf "%s.serviceAccount.name" $comp) -}}
{{- $notes = append $notes (printf "serviceAccount.name=%s: ignored for the %s, %s.serviceAccount.name is given (this chart's keys win)" $v.serviceAccount.name $comp $comp) -}}
{{- else -}}
{{- $_ := set (ternary $c $a (eq $comp "controller")).serviceAccount "name" $want -}}
{{- $notes = append $notes (printf "serviceAccount.name=%s -> %s.serviceAccount.name=%s%s" $v.serviceAccount.name $comp $want (ternary "" " (upstream's <name>-agent)" (eq $comp "controller"))) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if hasKey . "annotations" -}}
{{- $_ := set $c.serviceAccount "annotations" (merge (deepCopy ($c.serviceAccount.annotations | default dict)) .annotations) -}}
{{- $_ := set $a.serviceAccount "annotations" (merge (deepCopy ($a.serviceAccount.annotations | default dict)) .annotations) -}}
{{- $notes = append $notes "serviceAccount.annotations -> controller.serviceAccount.annotations and agent.serviceAccount.annotations (their own keys win)" -}}
{{- end -}}
{{- if hasKey . "automount" -}}
{{- $notes = append $notes (printf "serviceAccount.automount=%v: ignored, both binaries call the API server with their ServiceAccount's token, which Kubernetes mounts" .automount) -}}
{{- end -}}
{{- end -}}

{{- /* pod metadata -> both Deployments, their own keys winning per key */ -}}
{{- range $k := list "podAnnotations" "podLabels" -}}
{{- if hasKey $v $k -}}
{{- $_ := set $c $k (merge (deepCopy (index $c $k | default dict)) (index $v $k)) -}}
{{- $_ := set $a $k (merge (deepCopy (index $a $k | default dict)) (index $v $k)) -}}
{{- $notes = append $notes (printf "%s -> controller.%s and agent.%s (their own keys win)" $k $k $k) -}}
{{- end -}}
{{- end -}}

{{- /* what upstream put on its controller (and webhook) pods -> the controller Deployment */ -}}
{{- range $k := list "podSecurityContext" "securityContext" "resources" "nodeSelector" -}}
{{- if hasKey $v $k -}}
{{- if get $ours (printf "controller.%s" $k) -}}
{{- $notes = append $notes (printf "%s: ignored, controller.%s is given (this chart's keys win)" $k $k) -}}
{{- else -}}
{{- $_ := set $c $k (mergeOverwrite (deepCopy (index $c $k | default dict)) (index $v $k)) -}}
{{- $notes = append $notes (printf "%s -> controller.%s (merged over its defaults; the agent keeps agent.%s)" $k $k $k) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- range $pair := list (list "tolerations" "tolerations") (list "affinity" "affinity") (list "volumes" "extraVolumes") (list "volumeMounts" "extraVolumeMounts") -}}
{{- $k := index $pair 0 -}}
{{- $ourKey := index $pair 1 -}}
{{- if hasKey $v $k -}}
{{- if get $ours (printf "controller.%s" $ourKey) -}}
{{- $notes = append $notes (printf "%s: ignored, controller.%s is given (this chart's keys win)" $k $ourKey) -}}
{{- else -}}
{{- $_ := set $c $ourKey (index $v $k) -}}
{{- $notes = append $notes (printf "%s -> controller.%s (upstream put it on its controller; the agent has agent.%s)" $k $ourKey $ourKey) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- /* serviceCIDR (Harvester's chart) -> controller.serviceCIDR */ -}}
{{- if hasKey $v "serviceCIDR" -}}
{{- if get $ours "controller.serviceCIDR" -}}
{{- $notes = append $notes (printf "serviceCIDR=%s: ignored, controller.serviceCIDR=%s is given (this chart's keys win)" $v.serviceCIDR $v.controller.serviceCIDR) -}}
{{- else -}}
{{- $_ := set $c "serviceCIDR" $v.serviceCIDR -}}
{{- $notes = append $notes (printf "serviceCIDR=%s -> controller.serviceCIDR (IPPools overlapping it are refused)" $v.serviceCIDR) -}}
{{- end -}}
{{- end -}}

{{- /* accepted, meaningless here */ -}}
{{- if hasKey $v "service" -}}
{{- $notes = append $notes "service: ignored, the metrics Services are headless (every replica scraped) on port 8080, and the controller's Service (grpc 9090, webhook 443) is ClusterIP: neither takes a type or port" -}}
{{- end -}}
{{- if hasKey $v "ingress" -}}
{{- $notes = append $notes "ingress: ignored, nothing of vmdhcp is served to outside the cluster (the config stream is for the agents, the webhook for the API server, metrics for Prometheus)" -}}
{{- end -}}
{{- if hasKey $v "autoscaling" -}}
{{- $notes = append $notes "autoscaling: ignored, one elected controller does all the writing, so more replicas add standbys, not throughput: set controller.replicas" -}}
{{- end -}}
{{- if hasKey $v.webhook "replicaCount" -}}
{{- $notes = append $notes (printf "webhook.replicaCount=%v: ignored, every controller replica serves the webhook (controller.replicas)" $v.webhook.replicaCount) -}}
{{- end -}}
{{- if hasKey $v.webhook "httpsPort" -}}
{{- $notes = append $notes (printf "webhook.httpsPort=%v: ignored, the controller serves the webhook on 8443 (Service port 443)" $v.webhook.httpsPort) -}}
{{- end -}}
{{- if hasKey $v.webhook "service" -}}
{{- $notes = append $notes "webhook.service: ignored, the webhook is on the controller's Service, port 443" -}}
{{- end -}}
{{- if hasKey $v.webhook "resources" -}}
{{- $notes = append $notes "webhook.resources: ignored, the webhook runs in the controller process (controller.resources)" -}}
{{- end -}}
{{- dict "controller" $c "agent" $a "notes" $notes | toYaml -}}
{{- end -}}

{{/*
Checks of upstream's values that the schema cannot express. Rendered (to nothing) from the
controller Deployment.
*/}}
{{- define "vmdhcp.upstream.validate" -}}
{{- with .Values.serviceAccount -}}
{{- if and (hasKey . "create") (not .create) (not .name) (not $.Values.controller.serviceAccount.name) -}}
{{- fail "serviceAccount.create=false (upstream's key) needs serviceAccount.name: upstream's chart fell back to the namespace's \"default\" ServiceAccount, vmdhcp binds its RBAC to named ones (the controller's <name>, the agents' <name>-agent)" -}}
{{- end -}}
{{- end -}}
{{- end -}}
