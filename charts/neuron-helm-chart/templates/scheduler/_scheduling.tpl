{{/* The second kube-scheduler's image: the cluster's own version unless a tag or digest is set, with any vendor
     suffix dropped (v1.30.4-eks-a737599 -> v1.30.4), so that it is a tag the upstream registry has. */}}
{{- define "neuron.kubeSchedulerImage" -}}
{{- $image := deepCopy .Values.scheduler.kubeScheduler.image -}}
{{- if not $image.tag -}}
{{- $v := semver .Capabilities.KubeVersion.Version -}}
{{- $_ := set $image "tag" (printf "v%d.%d.%d" $v.Major $v.Minor $v.Patch) -}}
{{- end -}}
{{- include "neuron.image" (dict "root" . "image" $image) -}}
{{- end -}}

{{/* Where the second scheduler reaches the extender: the Service's fixed ClusterIP when one is set (clusters
     without cluster DNS), else its DNS name. */}}
{{- define "neuron.extenderUrl" -}}
{{- $v := .Values.scheduler.extender -}}
{{- $host := include "neuron.extenderHost" . -}}
{{- with $v.service.clusterIP }}{{ $host = . }}{{ end -}}
{{- printf "%s://%s:%d" (ternary "https" "http" $v.tls.enabled) $host (int $v.port) -}}
{{- end -}}

{{/* The extender Service's DNS name: what its certificate is for, whatever address the scheduler dials. */}}
{{- define "neuron.extenderHost" -}}
{{- $ctx := dict "root" . "component" "scheduler-extender" -}}
{{- printf "%s.%s.svc" (include "neuron.componentName" $ctx) (include "neuron.componentNamespace" $ctx) -}}
{{- end -}}

{{/* The Secret with the extender's certificate (tls.crt, tls.key, ca.crt): the user's, or the chart's own. */}}
{{- define "neuron.extenderTlsSecret" -}}
{{- .Values.scheduler.extender.tls.secretName | default (printf "%s-tls" (include "neuron.componentName" (dict "root" . "component" "scheduler-extender"))) -}}
{{- end -}}

{{/* The port neuron-scheduler serves /healthz and /metrics on (kube-scheduler's --secure-port default). */}}
{{- define "neuron.kubeSchedulerPort" -}}10259{{- end -}}

{{/* Where both scheduling Deployments mount that Secret. */}}
{{- define "neuron.extenderTlsDir" -}}/etc/neuron-scheduling/tls{{- end -}}

{{/* The Neuron resources the second scheduler hands to the extender: both, and the deprecated alias when the
     device plugin advertises it. */}}
{{- define "neuron.managedResources" -}}
{{- $names := list "aws.amazon.com/neuron" "aws.amazon.com/neuroncore" -}}
{{- if .Values.devicePlugin.neurondeviceAlias }}{{ $names = append $names "aws.amazon.com/neurondevice" }}{{ end -}}
{{- range $names }}
- name: {{ . }}
  ignoredByScheduler: false
{{- end -}}
{{- end -}}

{{/* A scheduling Deployment's affinity: its own, else a preference for replicas on different nodes.
     (dict "root" $ "component" "scheduler-extender" "values" ...) */}}
{{- define "neuron.schedulingAffinity" -}}
{{- if .values.affinity -}}
{{- toYaml .values.affinity -}}
{{- else -}}
podAntiAffinity:
  preferredDuringSchedulingIgnoredDuringExecution:
    - weight: 100
      podAffinityTerm:
        topologyKey: kubernetes.io/hostname
        labelSelector:
          matchLabels:
            {{- include "neuron.selectorLabels" . | nindent 12 }}
{{- end -}}
{{- end -}}

{{/* A ServiceAccount of a scheduling component. (dict "root" $ "component" ... "values" ...) */}}
{{- define "neuron.schedulingServiceAccount" -}}
{{- if .values.serviceAccount.create }}
apiVersion: v1
kind: ServiceAccount
metadata:
  name: {{ include "neuron.serviceAccountName" . }}
  namespace: {{ include "neuron.componentNamespace" . }}
  labels:
    {{- include "neuron.componentLabels" . | nindent 4 }}
  {{- with .values.serviceAccount.annotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end }}
{{- end -}}

{{/* The second scheduler's KubeSchedulerConfiguration (kubescheduler.config.k8s.io/v1): a file in its ConfigMap,
     not an object the API server serves. */}}
{{- define "neuron.kubeSchedulerConfiguration" -}}
{{- $v := .Values.scheduler.kubeScheduler -}}
{{- $x := .Values.scheduler.extender -}}
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
leaderElection:
  leaderElect: {{ $v.leaderElection.enabled }}
  resourceLock: leases
  resourceName: {{ .Values.scheduler.schedulerName }}
  resourceNamespace: {{ include "neuron.componentNamespace" (dict "root" . "component" "kube-scheduler") }}
  leaseDuration: {{ $v.leaderElection.leaseDuration }}
  renewDeadline: {{ $v.leaderElection.renewDeadline }}
  retryPeriod: {{ $v.leaderElection.retryPeriod }}
profiles:
  {{- range (include "neuron.schedulerNames" . | fromJsonArray) }}
  - schedulerName: {{ . }}
  {{- end }}
extenders:
  - urlPrefix: {{ include "neuron.extenderUrl" . }}
    filterVerb: filter
    prioritizeVerb: prioritize
    weight: {{ $x.weight }}
    bindVerb: bind
    # kube-scheduler's preemption counts devices, not which: the extender picks victims that free a connected set
    preemptVerb: preempt
    enableHTTPS: {{ $x.tls.enabled }}
    {{- if $x.tls.enabled }}
    tlsConfig:
      serverName: {{ include "neuron.extenderHost" . }}
      certFile: {{ include "neuron.extenderTlsDir" . }}/tls.crt
      keyFile: {{ include "neuron.extenderTlsDir" . }}/tls.key
      caFile: {{ include "neuron.extenderTlsDir" . }}/ca.crt
    {{- end }}
    nodeCacheCapable: true
    httpTimeout: {{ $x.httpTimeout }}
    ignorable: false
    managedResources:
      {{- include "neuron.managedResources" . | trim | nindent 6 }}
{{- end -}}


{{/* Every schedulerName the second scheduler answers to: its own first, then the additional ones. */}}
{{- define "neuron.schedulerNames" -}}
{{- toJson (uniq (prepend .Values.scheduler.additionalSchedulerNames .Values.scheduler.schedulerName)) -}}
{{- end -}}
