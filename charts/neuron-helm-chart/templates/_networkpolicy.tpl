{{/* NetworkPolicies (docs/security.md, "Network policies"): ingress only, egress stays open. */}}

{{/* A component's NetworkPolicy over its pods (its selector labels), admitting ingress only as `rules` say: a list
     of (dict "port" N "from" peers), TCP. A rule whose `from` is empty is left out, as Kubernetes reads an empty
     `from` as every source; with no rule left the pods admit no ingress at all.
     (dict "root" $ "component" "device-plugin" "rules" (list ...)) */}}
{{- define "neuron.networkPolicy" -}}
{{- $ingress := list -}}
{{- range .rules -}}
{{- if .from -}}
{{- $ingress = append $ingress (dict "ports" (list (dict "protocol" "TCP" "port" (int .port))) "from" .from) -}}
{{- end -}}
{{- end -}}
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: {{ include "neuron.componentName" . }}
  namespace: {{ include "neuron.componentNamespace" . }}
  labels:
    {{- include "neuron.componentLabels" . | nindent 4 }}
spec:
  podSelector:
    matchLabels:
      {{- include "neuron.selectorLabels" . | nindent 6 }}
  policyTypes: [Ingress]
  {{- if $ingress }}
  ingress:
    {{- toYaml $ingress | nindent 4 }}
  {{- else }}
  ingress: []
  {{- end }}
{{- end -}}

{{/* A NetworkPolicyPeer selecting one of the chart's components' pods in the release namespace, as a JSON object.
     (dict "root" $ "component" "kube-scheduler") */}}
{{- define "neuron.componentPeer" -}}
{{- dict "podSelector" (dict "matchLabels" (include "neuron.selectorLabels" . | fromYaml)) | toJson -}}
{{- end -}}

{{/* Whether the scheduler extender's NetworkPolicy is rendered. */}}
{{- define "neuron.extenderNetworkPolicy" -}}
{{- if and .Values.scheduler.enabled .Values.scheduler.extender.networkPolicy.enabled -}}true{{- end -}}
{{- end -}}
