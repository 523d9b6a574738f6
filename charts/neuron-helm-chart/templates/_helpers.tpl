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

{{/* The components AWS's neuron-helm-chart also deploys, with the name and namespace it gives them (its values'
     `<component>.fullnameOverride` and `namespaceOverride`): `objectNames: aws` names and places them so; a JSON
     object, component -> (dict "name" "namespace"). */}}
{{- define "neuron.awsObjectNames" -}}
{{- dict
  "device-plugin" (dict "name" "neuron-device-plugin" "namespace" "kube-system")
  "problem-detector" (dict "name" "node-problem-detector" "namespace" "neuron-healthcheck-system")
  "scheduler-extender" (dict "name" "k8s-neuron-scheduler" "namespace" "kube-system")
  "kube-scheduler" (dict "name" "my-scheduler" "namespace" "kube-system")
| toJson -}}
{{- end -}}

{{/* A named component's own `fullnameOverride` and `namespaceOverride` (a JSON object; empty for the components
     that have none). (dict "root" $ "component" "device-plugin") */}}
{{- define "neuron.nameValues" -}}
{{- $v := dict -}}
{{- $values := .root.Values -}}
{{- if eq .component "device-plugin" }}{{ $v = $values.devicePlugin }}
{{- else if eq .component "problem-detector" }}{{ $v = $values.npd }}
{{- else if eq .component "scheduler-extender" }}{{ $v = $values.scheduler.extender }}
{{- else if eq .component "kube-scheduler" }}{{ $v = $values.scheduler.kubeScheduler }}
{{- end -}}
{{- pick $v "fullnameOverride" "namespaceOverride" | toJson -}}
{{- end -}}

{{/* AWS's name and namespace of a component when `objectNames` is `aws` (a JSON object, empty otherwise). */}}
{{- define "neuron.awsObjectName" -}}
{{- $aws := dict -}}
{{- if eq .root.Values.objectNames "aws" -}}
{{- $aws = get (include "neuron.awsObjectNames" "" | fromJson) .component | default dict -}}
{{- end -}}
{{- toJson $aws -}}
{{- end -}}

{{/* A component's object name: (dict "root" $ "component" "device-plugin"). Its `fullnameOverride`, else AWS's name
     with `objectNames: aws`, else `<fullname>-<component>`, trimmed so the DaemonSet's pod names stay valid. */}}
{{- define "neuron.componentName" -}}
{{- $own := include "neuron.nameValues" . | fromJson -}}
{{- $aws := include "neuron.awsObjectName" . | fromJson -}}
{{- if $own.fullnameOverride -}}
{{- $own.fullnameOverride -}}
{{- else if $aws.name -}}
{{- $aws.name -}}
{{- else -}}
{{- printf "%s-%s" (include "neuron.fullname" .root | trunc 45 | trimSuffix "-") .component -}}
{{- end -}}
{{- end -}}

{{/* A component's namespace: (dict "root" $ "component" "device-plugin"). Its `namespaceOverride`, else AWS's
     namespace with `objectNames: aws`, else the release namespace. */}}
{{- define "neuron.componentNamespace" -}}
{{- $own := include "neuron.nameValues" . | fromJson -}}
{{- $aws := include "neuron.awsObjectName" . | fromJson -}}
{{- if $own.namespaceOverride -}}
{{- $own.namespaceOverride -}}
{{- else if $aws.namespace -}}
{{- $aws.namespace -}}
{{- else -}}
{{- .root.Release.Namespace -}}
{{- end -}}
{{- end -}}

{{/* `<namespace>/<name>` of a component, for NOTES. (dict "root" $ "component" ...) */}}
{{- define "neuron.notesWhere" -}}
{{ include "neuron.componentNamespace" . }}/{{ include "neuron.componentName" . }}
{{- end -}}

{{/* The ServiceAccount user of a component, as the API server names it in admission requests.
     (dict "root" $ "component" ... "values" ...) */}}
{{- define "neuron.serviceAccountUser" -}}
{{- printf "system:serviceaccount:%s:%s" (include "neuron.componentNamespace" .) (include "neuron.serviceAccountName" .) -}}
{{- end -}}

{{/* The chart's appVersion where a label value or an image tag holds it: build metadata's "+" is neither, and
     becomes "_", as Helm and `make release` write it in OCI tags (1.2.3+build.7: 1.2.3_build.7). */}}
{{- define "neuron.versionTag" -}}
{{- .Chart.AppVersion | replace "+" "_" -}}
{{- end -}}

{{/* Labels on every object; `commonLabels` values are templates (`{{ .Release.Name }}`). */}}
{{- define "neuron.labels" -}}
helm.sh/chart: {{ include "neuron.chart" . }}
app.kubernetes.io/name: {{ include "neuron.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ include "neuron.versionTag" . | trunc 63 | trimSuffix "-" | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: neuron-helm-chart
{{- range $key, $value := .Values.commonLabels }}
{{ $key }}: {{ tpl (toString $value) $ | quote }}
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

{{/* The node agents (DaemonSets on the Neuron nodes), as a JSON object: values key -> component name. */}}
{{- define "neuron.nodeAgents" -}}
{{- dict "devicePlugin" "device-plugin" "draDriver" "dra-driver" "nodeMetrics" "node-metrics" "npd" "problem-detector" | toJson -}}
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
     image's registry; the tag defaults to the chart's appVersion; a digest is appended (`repo:tag@digest`): the
     runtime pulls by the digest, and the tag stays for the people reading the pod. */}}
{{- define "neuron.image" -}}
{{- $registry := .image.registry -}}
{{- with .root.Values.global.imageRegistry }}{{ $registry = . }}{{ end -}}
{{- $repository := .image.repository -}}
{{- if $registry }}{{ $repository = printf "%s/%s" $registry .image.repository }}{{ end -}}
{{- $reference := printf "%s:%s" $repository (default (include "neuron.versionTag" .root) .image.tag) -}}
{{- if .image.digest -}}
{{- $reference = printf "%s@%s" $reference .image.digest -}}
{{- end -}}
{{- $reference -}}
{{- end -}}

{{/* A pod's imagePullSecrets (a YAML list, empty when none): the global ones, then the component's.
     (dict "root" $ "values" .Values.devicePlugin) */}}
{{- define "neuron.imagePullSecrets" -}}
{{- range $i, $name := concat .root.Values.global.imagePullSecrets (.values.imagePullSecrets | default list) | uniq -}}
{{- if $i }}{{ "\n" }}{{ end -}}
- name: {{ $name }}
{{- end -}}
{{- end -}}

{{/* The node selector expressions `placement` implies (a YAML list; empty with mode none and no exclusions). */}}
{{- define "neuron.placementExpressions" -}}
{{- $p := .Values.placement -}}
{{- $exprs := list -}}
{{- if eq $p.mode "instanceType" -}}
{{- $exprs = append $exprs (dict "key" $p.instanceTypeLabel "operator" "In" "values" (include "neuron.instanceTypes" . | fromJsonArray)) -}}
{{- else if eq $p.mode "nfd" -}}
{{- $exprs = append $exprs (dict "key" $p.nfdLabel "operator" "In" "values" (list "true")) -}}
{{- end -}}
{{- if $p.excludeComputeTypes -}}
{{- $exprs = append $exprs (dict "key" "eks.amazonaws.com/compute-type" "operator" "NotIn" "values" $p.excludeComputeTypes) -}}
{{- end -}}
{{- toYaml $exprs -}}
{{- end -}}

{{/* A component's affinity: its own, with `placement`'s expressions (and the component's `extraExpressions`, a
     list) ANDed into every required node selector term (a node must be a Neuron node whatever else the user asks);
     preferred terms and pod (anti-)affinity are kept. Kubernetes ORs the terms, so adding the expressions to only
     one would let the others place pods anywhere. The affinity's value, empty when there is none.
     (dict "root" $ "values" ... ["extraExpressions" (list ...)]) */}}
{{- define "neuron.affinity" -}}
{{- $exprs := concat (include "neuron.placementExpressions" .root | fromYamlArray) (.extraExpressions | default list) -}}
{{- $affinity := deepCopy (.values.affinity | default dict) -}}
{{- if $exprs -}}
{{- $nodeAffinity := get $affinity "nodeAffinity" | default dict -}}
{{- $required := get $nodeAffinity "requiredDuringSchedulingIgnoredDuringExecution" | default dict -}}
{{- $terms := list -}}
{{- range (get $required "nodeSelectorTerms" | default (list (dict))) -}}
{{- $terms = append $terms (set . "matchExpressions" (concat $exprs (get . "matchExpressions" | default list))) -}}
{{- end -}}
{{- $_ := set $required "nodeSelectorTerms" $terms -}}
{{- $_ = set $nodeAffinity "requiredDuringSchedulingIgnoredDuringExecution" $required -}}
{{- $_ = set $affinity "nodeAffinity" $nodeAffinity -}}
{{- end -}}
{{- with $affinity -}}
{{- toYaml . -}}
{{- end -}}
{{- end -}}

{{/* A pod template's labels: the component's labels, then its `podLabels`. (dict "root" $ "component" ... "values" ...) */}}
{{- define "neuron.podLabels" -}}
{{ include "neuron.componentLabels" . }}
{{- with .values.podLabels }}
{{ toYaml . }}
{{- end -}}
{{- end -}}

{{/* A pod template's annotations, empty when none: the component's `podAnnotations` and the chart's own (a
     checksum that rolls the pods), which win. (dict "root" $ "values" ... ["podAnnotations" (dict ...)]) */}}
{{- define "neuron.podAnnotations" -}}
{{- with merge (dict) (.podAnnotations | default dict) (.values.podAnnotations | default dict) -}}
{{- toYaml . -}}
{{- end -}}
{{- end -}}

{{/* A DaemonSet's updateStrategy from the component's `updateStrategy`: its rollingUpdate only with RollingUpdate,
     as Helm merges a user's `type: OnDelete` with the default rollingUpdate, which the API server refuses. */}}
{{- define "neuron.updateStrategy" -}}
type: {{ .type }}
{{- if and (eq .type "RollingUpdate") .rollingUpdate }}
rollingUpdate:
  {{- toYaml .rollingUpdate | nindent 2 }}
{{- end -}}
{{- end -}}

{{/* A container's securityContext, plus what reading the host's /dev/kmsg takes when `readsHostKmsg`: CAP_SYSLOG
     (kernel.dmesg_restrict=1) and, with `privileged`, privilege, as the container runtime's device cgroup admits
     /dev/kmsg (char 1:11) to no unprivileged container. The API server refuses a privileged container that forbids
     privilege escalation, so privilege allows it. With `readsSyslogFile` (kernelLog.syslogFile) the container reads an
     ordinary file instead: neither privilege nor CAP_SYSLOG.
     (dict "securityContext" ... "readsHostKmsg" bool "privileged" bool "readsSyslogFile" bool) */}}
{{- define "neuron.securityContext" -}}
{{- $sc := deepCopy .securityContext -}}
{{- if .readsSyslogFile -}}
{{- /* a syslog file is an ordinary file: no CAP_SYSLOG, whatever the defaults add */ -}}
{{- $capabilities := get $sc "capabilities" | default dict -}}
{{- if hasKey $capabilities "add" -}}
{{- $_ := set $capabilities "add" (without (get $capabilities "add" | default list) "SYSLOG" "CAP_SYSLOG") -}}
{{- if not (get $capabilities "add") -}}{{- $_ = unset $capabilities "add" -}}{{- end -}}
{{- end -}}
{{- else if .readsHostKmsg -}}
{{- $capabilities := get $sc "capabilities" | default dict -}}
{{- $_ := set $capabilities "add" (append (get $capabilities "add" | default list) "SYSLOG" | uniq) -}}
{{- $_ = set $sc "capabilities" $capabilities -}}
{{- if .privileged -}}
{{- $_ = set $sc "privileged" true -}}
{{- $_ = set $sc "allowPrivilegeEscalation" true -}}
{{- end -}}
{{- end -}}
{{- toYaml $sc -}}
{{- end -}}

{{/* Where the services find sys/, dev/, opt/aws/ and proc/: the simulated node's root, or /host. */}}
{{- define "neuron.hostRoot" -}}
{{- if .Values.simulation.enabled -}}{{ .Values.simulation.hostRoot }}{{- else -}}/host{{- end -}}
{{- end -}}

{{/* Volume mounts for the host's Neuron view (read-only), and their volumes: YAML list items. */}}
{{- define "neuron.hostVolumeMounts" -}}
{{- if .Values.simulation.enabled -}}
- name: simulated-node
  mountPath: {{ .Values.simulation.hostRoot }}
  readOnly: true
{{- else -}}
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
{{- if .Values.simulation.enabled -}}
- name: simulated-node
  hostPath:
    path: {{ .Values.simulation.hostRoot }}
    type: Directory
{{- else -}}
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

{{/* A probe on the component's HTTP port, from one of its `startupProbe`, `livenessProbe`, `readinessProbe` values
     (the path, and the probe's other fields as they are). (dict "probe" $v.startupProbe "scheme" "HTTPS" or "") */}}
{{- define "neuron.probe" -}}
httpGet:
  path: {{ .probe.path | quote }}
  port: http
  {{- with .scheme }}
  scheme: {{ . }}
  {{- end }}
{{- omit .probe "path" | toYaml | nindent 0 }}
{{- end -}}

{{/* Whether the device plugin publishes its node's NeuronNode: the Neuron-aware scheduler reads them. */}}
{{- define "neuron.nodeReport" -}}
{{- if and .Values.scheduler.enabled .Values.devicePlugin.enabled -}}true{{- end -}}
{{- end -}}

{{/* The ServiceAccounts that keep AWS's UltraServer labels on their node (ultraServer.nodeLabels): the
     device plugin's and the DRA driver's, those enabled; a JSON list of (dict "name" "namespace"). */}}
{{- define "neuron.ultraserverLabelWriters" -}}
{{- $writers := list -}}
{{- if .Values.ultraServer.nodeLabels -}}
{{- range $component, $values := dict "device-plugin" .Values.devicePlugin "dra-driver" .Values.draDriver -}}
{{- if $values.enabled -}}
{{- $ctx := dict "root" $ "component" $component "values" $values -}}
{{- $writers = append $writers (dict "name" (include "neuron.serviceAccountName" $ctx) "namespace" (include "neuron.componentNamespace" $ctx)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- toJson $writers -}}
{{- end -}}

{{/* "true" when the DRA driver publishes single NeuronCores: draDriver.publishCores, or for "auto" the
default measured for the cluster's Kubernetes version (docs/benchmarks.md, "The slice layout's levers"):
from 1.37 on, the best layout with cores measured reaches a third of AWS's devices-only layout's speed
in kube-scheduler's allocator at 1,000 nodes, devices only 0.90 of it, so cores are off; before 1.37
they are on (on 1.36 as consumable capacity, "neuron.dra.coresAsCapacity"; before 1.36 the API server
drops what cores need and the driver publishes whole devices only). */}}
{{- define "neuron.dra.publishCores" -}}
{{- $v := .Values.draDriver.publishCores -}}
{{- if eq (toString $v) "auto" -}}
{{- if semverCompare ">=1.37.0-0" .Capabilities.KubeVersion.Version -}}false{{- else -}}true{{- end -}}
{{- else -}}
{{- toString $v -}}
{{- end -}}
{{- end -}}

{{/* "true" when the DRA driver publishes cores as consumable capacity of their device (KEP-5075), not
as devices sharing a counter: draDriver.coresAsCapacity, or for "auto" on 1.36 only, where that layout
filtered a node at 0.52 of the speed of AWS's layout in kube-scheduler's allocator at 1,000 nodes and
the counters' at 0.002 (kubernetes/kubernetes#138917); from 1.37 on it is the slower one (0.03 against
0.14). Only with cores published: `true` without them is a contradiction. */}}
{{- define "neuron.dra.coresAsCapacity" -}}
{{- $v := .Values.draDriver.coresAsCapacity -}}
{{- $cores := eq (include "neuron.dra.publishCores" .) "true" -}}
{{- if eq (toString $v) "auto" -}}
{{- if and $cores (semverCompare ">=1.36.0-0, <1.37.0-0" .Capabilities.KubeVersion.Version) -}}true{{- else -}}false{{- end -}}
{{- else if and $v (not $cores) -}}
{{- fail "draDriver.coresAsCapacity=true publishes cores as a capacity of each device, but draDriver.publishCores resolves to false (no cores): set draDriver.publishCores=true, or coresAsCapacity to auto or false" -}}
{{- else -}}
{{- toString $v -}}
{{- end -}}
{{- end -}}

{{/* "true" when cores are published as devices sharing their device's counter: the core and ring-arc
DeviceClasses exist only then. */}}
{{- define "neuron.dra.coreDevices" -}}
{{- if and (eq (include "neuron.dra.publishCores" .) "true") (ne (include "neuron.dra.coresAsCapacity" .) "true") -}}true{{- end -}}
{{- end -}}

{{/* Whether the Prometheus-operator objects are rendered. */}}
{{- define "neuron.monitoringApi" -}}
{{- if or .Values.nodeMetrics.monitoring.force (.Capabilities.APIVersions.Has "monitoring.coreos.com/v1") -}}true{{- end -}}
{{- end -}}

{{/* "true" when the KMM Module renders: the driver is enabled and KMM's API is served, or forced. */}}
{{- define "neuron.driverModuleRendered" -}}
{{- $d := .Values.driver -}}
{{- if and $d.enabled (or $d.force (.Capabilities.APIVersions.Has "kmm.sigs.x-k8s.io/v1beta1")) -}}true{{- end -}}
{{- end -}}

{{/* The KMM Module's name: driver.moduleName, `neuron` as the OpenShift operator names it (one per namespace).
Not release-scoped: KMM refuses a Module whose name and namespace exceed 40 characters, and chart-testing's
release names alone are 28. */}}
{{- define "neuron.driverName" -}}
{{- .Values.driver.moduleName -}}
{{- end -}}

{{/* The node label KMM sets once it has loaded a Module's kernel module on the node. */}}
{{- define "neuron.driverReadyLabel" -}}
{{- printf "kmm.node.kubernetes.io/%s.%s.ready" .Release.Namespace (include "neuron.driverName" .) -}}
{{- end -}}

{{/* The nodes KMM loads the module on: driver.nodeSelector, else the label node-feature-discovery sets (a YAML map). */}}
{{- define "neuron.driverSelector" -}}
{{- if .Values.driver.nodeSelector -}}
{{- toYaml .Values.driver.nodeSelector -}}
{{- else -}}
{{- toYaml (dict .Values.placement.nfdLabel "true") -}}
{{- end -}}
{{- end -}}

{{/* The Secret KMM pulls driver images with: driver.imageRepoSecret, else the first global pull secret (may be empty). */}}
{{- define "neuron.driverImageRepoSecret" -}}
{{- default (first .Values.global.imagePullSecrets | default "") .Values.driver.imageRepoSecret -}}
{{- end -}}

{{/* Whether pods render for OpenShift's restricted-v2 SCC (no fixed UID): on OpenShift, or with openshift.force. */}}
{{- define "neuron.openshift" -}}
{{- if or .Values.openshift.force (.Capabilities.APIVersions.Has "security.openshift.io/v1") -}}true{{- end -}}
{{- end -}}

{{/* The problem detector's per-device verdicts: where its state directory is mounted in every
     container that writes or reads them, and that directory on the host. */}}
{{- define "neuron.verdictDir" -}}/var/lib/neuron-problem-detector/verdicts{{- end -}}
{{- define "neuron.verdictHostDir" -}}{{ .Values.npd.stateHostPath }}/verdicts{{- end -}}

{{/* The host syslog file a node agent reads the kernel log from instead of /dev/kmsg (kernelLog.syslogFile), or
     "" for /dev/kmsg; never in simulation mode, whose kernel log is the simulated node's dev/kmsg file. */}}
{{- define "neuron.kernelLogFile" -}}
{{- if not .Values.simulation.enabled -}}{{ .Values.kernelLog.syslogFile }}{{- end -}}
{{- end -}}

{{/* The flags, mounts and volumes of a node agent that reads kernelLog.syslogFile: the file's directory and the
     host's /etc/localtime (the zone of a stamp written without one), both read-only under /host. */}}
{{- define "neuron.kernelLogFileArgs" -}}
- --kernel-log-format=syslog
- --kmsg-path=/host{{ include "neuron.kernelLogFile" . }}
{{- end -}}

{{- define "neuron.kernelLogFileMounts" -}}
- name: host-kernel-log
  mountPath: /host{{ dir (include "neuron.kernelLogFile" .) }}
  readOnly: true
- name: host-localtime
  mountPath: /host/etc/localtime
  readOnly: true
{{- end -}}

{{- define "neuron.kernelLogFileVolumes" -}}
- name: host-kernel-log
  hostPath:
    path: {{ dir (include "neuron.kernelLogFile" .) }}
    type: Directory
- name: host-localtime
  hostPath:
    path: /etc/localtime
    type: File
{{- end -}}

{{/* The namespaces this chart's components run in (a JSON list, the release namespace first): a remediation drain
     never moves their pods. Every component's, enabled or not, so turning one on later needs no new list. */}}
{{- define "neuron.ownNamespaces" -}}
{{- $namespaces := list .Release.Namespace -}}
{{- range list "device-plugin" "dra-driver" "node-metrics" "problem-detector" "scheduler-extender" "kube-scheduler" "remediation-controller" -}}
{{- $namespaces = append $namespaces (include "neuron.componentNamespace" (dict "root" $ "component" .)) -}}
{{- end -}}
{{- $namespaces | uniq | toJson -}}
{{- end -}}

{{/* A map as `key=value,key=value` (sorted by key), the form of the services' map flags. */}}
{{- define "neuron.pairs" -}}
{{- $pairs := list -}}
{{- range $key, $value := . -}}
{{- $pairs = append $pairs (printf "%s=%s" $key $value) -}}
{{- end -}}
{{- join "," $pairs -}}
{{- end -}}
