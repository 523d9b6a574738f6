{{/* Chart name, overridable. */}}
{{- define "neuron.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Release-scoped prefix of every object name; the release name alone when it already holds the chart name. */}}
{{- define "neuron.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "neuron.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* A component's object name: (dict "root" $ "component" "device-plugin"). Trimmed so the DaemonSet's pod names stay valid. */}}
{{- define "neuron.componentName" -}}
{{- printf "%s-%s" (include "neuron.fullname" .root | trunc 45 | trimSuffix "-") .component -}}
{{- end -}}

{{/* Labels on every object. */}}
{{- define "neuron.labels" -}}
helm.sh/chart: {{ include "neuron.chart" . }}
app.kubernetes.io/name: {{ include "neuron.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: neuron-helm-chart
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Labels of one component's objects: (dict "root" $ "component" "device-plugin"). */}}
{{- define "neuron.componentLabels" -}}
{{ include "neuron.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* Selector labels: stable across upgrades (name, instance, component only). */}}
{{- define "neuron.selectorLabels" -}}
app.kubernetes.io/name: {{ include "neuron.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* The same selector as a label-selector string (name=...,instance=...,component=...), for the helm tests. */}}
{{- define "neuron.selectorString" -}}
{{- include "neuron.selectorLabels" . | replace ": " "=" | replace "\n" "," -}}
{{- end -}}

{{/* ServiceAccount name of a component: (dict "root" $ "component" "device-plugin" "values" .Values.devicePlugin). */}}
{{- define "neuron.serviceAccountName" -}}
{{- if .values.serviceAccount.create -}}
{{- default (include "neuron.componentName" .) .values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* Image reference: (dict "root" $ "image" .Values.devicePlugin.image). global.imageRegistry wins over the
     image's registry; a digest wins over the tag; the tag defaults to the chart's appVersion. */}}
{{- define "neuron.image" -}}
{{- $registry := .image.registry -}}
{{- with .root.Values.global.imageRegistry }}{{ $registry = . }}{{ end -}}
{{- $repository := .image.repository -}}
{{- if $registry }}{{ $repository = printf "%s/%s" $registry .image.repository }}{{ end -}}
{{- if .image.digest -}}
{{- printf "%s@%s" $repository .image.digest -}}
{{- else -}}
{{- printf "%s:%s" $repository (default .root.Chart.AppVersion .image.tag) -}}
{{- end -}}
{{- end -}}

{{/* imagePullSecrets of a pod: the global ones, then the component's. (dict "root" $ "values" .Values.devicePlugin) */}}
{{- define "neuron.imagePullSecrets" -}}
{{- $secrets := concat .root.Values.global.imagePullSecrets (.values.imagePullSecrets | default list) | uniq -}}
{{- if $secrets }}
imagePullSecrets:
{{- range $secrets }}
  - name: {{ . }}
{{- end }}
{{- end -}}
{{- end -}}

{{/* The node affinity `placement` implies, unless the component sets its own affinity. (dict "root" $ "values" ...) */}}
{{- define "neuron.affinity" -}}
{{- if .values.affinity -}}
affinity:
  {{- toYaml .values.affinity | nindent 2 }}
{{- else -}}
{{- $p := .root.Values.placement -}}
{{- $exprs := list -}}
{{- if eq $p.mode "instanceType" -}}
{{- $exprs = append $exprs (dict "key" $p.instanceTypeLabel "operator" "In" "values" $p.instanceTypes) -}}
{{- else if eq $p.mode "nfd" -}}
{{- $exprs = append $exprs (dict "key" $p.nfdLabel "operator" "In" "values" (list "true")) -}}
{{- end -}}
{{- if $p.excludeComputeTypes -}}
{{- $exprs = append $exprs (dict "key" "eks.amazonaws.com/compute-type" "operator" "NotIn" "values" $p.excludeComputeTypes) -}}
{{- end -}}
{{- if $exprs -}}
affinity:
  nodeAffinity:
    requiredDuringSchedulingIgnoredDuringExecution:
      nodeSelectorTerms:
        - matchExpressions:
            {{- toYaml $exprs | nindent 12 }}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The scheduling block shared by the DaemonSets. (dict "root" $ "values" ...) */}}
{{- define "neuron.podScheduling" -}}
{{- with .values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{ include "neuron.affinity" . }}
{{- end -}}

{{/* Where the services find sys/, dev/, opt/aws/ and proc/: the simulated node's root, or /host. */}}
{{- define "neuron.hostRoot" -}}
{{- if .Values.simulation.enabled -}}{{ .Values.simulation.hostRoot }}{{- else -}}/host{{- end -}}
{{- end -}}

{{/* Volume mounts for the host's Neuron view (read-only). */}}
{{- define "neuron.hostVolumeMounts" -}}
{{- if .Values.simulation.enabled }}
- name: simulated-node
  mountPath: {{ .Values.simulation.hostRoot }}
  readOnly: true
{{- else }}
- name: host-sys
  mountPath: /host/sys
  readOnly: true
- name: host-dev
  mountPath: /host/dev
  readOnly: true
- name: host-opt-aws
  mountPath: /host/opt/aws
  readOnly: true
- name: host-boot-id
  mountPath: /host/proc/sys/kernel/random
  readOnly: true
{{- end }}
{{- end -}}

{{- define "neuron.hostVolumes" -}}
{{- if .Values.simulation.enabled }}
- name: simulated-node
  hostPath:
    path: {{ .Values.simulation.hostRoot }}
    type: Directory
{{- else }}
- name: host-sys
  hostPath:
    path: /sys
    type: Directory
- name: host-dev
  hostPath:
    path: /dev
    type: Directory
- name: host-opt-aws
  hostPath:
    path: /opt/aws
    type: DirectoryOrCreate
- name: host-boot-id
  hostPath:
    path: /proc/sys/kernel/random
    type: Directory
{{- end }}
{{- end -}}

{{/* Probes on the component's HTTP endpoint. */}}
{{- define "neuron.probes" -}}
startupProbe:
  httpGet: {path: /healthz, port: http}
  periodSeconds: 2
  failureThreshold: 30
livenessProbe:
  httpGet: {path: /healthz, port: http}
  periodSeconds: 10
  timeoutSeconds: 3
  failureThreshold: 3
readinessProbe:
  httpGet: {path: /readyz, port: http}
  periodSeconds: 5
  timeoutSeconds: 3
  failureThreshold: 2
{{- end -}}

{{/* Whether the Prometheus-operator objects are rendered. */}}
{{- define "neuron.monitoringApi" -}}
{{- if or .Values.nodeMetrics.monitoring.force (.Capabilities.APIVersions.Has "monitoring.coreos.com/v1") -}}true{{- end -}}
{{- end -}}

{{/* Contradictory values: fail with a message that says what to change. */}}
{{- define "neuron.validate" -}}
{{- if not (or .Values.devicePlugin.enabled .Values.nodeMetrics.enabled .Values.npd.enabled) -}}
{{- fail "devicePlugin.enabled, nodeMetrics.enabled and npd.enabled are all false: the release would install nothing; enable at least one component" -}}
{{- end -}}
{{- if and (eq .Values.placement.mode "instanceType") (empty .Values.placement.instanceTypes) -}}
{{- fail "placement.mode=instanceType needs at least one entry in placement.instanceTypes (or use placement.mode=nfd or none)" -}}
{{- end -}}
{{- if and .Values.placement.nodeFeatureRule.enabled (ne .Values.placement.mode "nfd") -}}
{{- fail (printf "placement.nodeFeatureRule.enabled labels nodes %s, but placement.mode=%s ignores that label: set placement.mode=nfd or disable the rule" .Values.placement.nfdLabel .Values.placement.mode) -}}
{{- end -}}
{{- if and .Values.nodeMetrics.enabled (eq .Values.nodeMetrics.monitoring.kind "ServiceMonitor") (not .Values.nodeMetrics.service.enabled) -}}
{{- fail "nodeMetrics.monitoring.kind=ServiceMonitor selects the exporter's Service, but nodeMetrics.service.enabled=false: enable the Service or use kind PodMonitor" -}}
{{- end -}}
{{- if and .Values.npd.enabled (or .Values.npd.remediation.taint .Values.npd.remediation.cordon) (not .Values.npd.serviceAccount.create) -}}
{{- if not .Values.npd.serviceAccount.name -}}
{{- fail "npd.remediation needs the detector's ServiceAccount to hold 'patch nodes': set npd.serviceAccount.create=true or name an existing ServiceAccount that has it" -}}
{{- end -}}
{{- end -}}
{{- if and .Values.simulation.enabled (not (hasPrefix "/" .Values.simulation.hostRoot)) -}}
{{- fail (printf "simulation.hostRoot must be an absolute host path, got %q" .Values.simulation.hostRoot) -}}
{{- end -}}
{{- end -}}
