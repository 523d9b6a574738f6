{{/* Protected /metrics (`<component>.secureMetrics`): the component serves TLS with the chart's certificate and
     answers /metrics only to a token the API server authenticates whose user may `get` the non-resource path
     /metrics (TokenReview and SubjectAccessReview, inside the service). */}}

{{/* Installed components with secureMetrics on that serve with the chart's metrics certificate, as a JSON object:
     values key -> component name. The node agents and the remediation controller; not the extender, which serves
     its own TLS. */}}
{{- define "neuron.secureMetricsComponents" -}}
{{- $on := dict -}}
{{- range $key, $component := include "neuron.nodeAgents" . | fromJson -}}
{{- $v := index $.Values $key -}}
{{- if and $v.enabled $v.secureMetrics -}}{{- $_ := set $on $key $component -}}{{- end -}}
{{- end -}}
{{- if and .Values.remediation.enabled .Values.remediation.secureMetrics -}}
{{- $_ := set $on "remediation" "remediation-controller" -}}
{{- end -}}
{{- $on | toJson -}}
{{- end -}}

{{/* Whether any component protects /metrics (the extender's over its own TLS). */}}
{{- define "neuron.anySecureMetrics" -}}
{{- if or (include "neuron.secureMetricsComponents" . | fromJson) (and .Values.scheduler.enabled .Values.scheduler.extender.secureMetrics) -}}true{{- end -}}
{{- end -}}

{{/* The Secret holding the /metrics certificate of the node agents and the remediation controller (tls.crt,
     tls.key, ca.crt). */}}
{{- define "neuron.metricsTlsSecret" -}}
{{- printf "%s-metrics-tls" (include "neuron.fullname" .) -}}
{{- end -}}

{{/* Where a node agent (or the remediation controller) mounts it. */}}
{{- define "neuron.metricsTlsDir" -}}/etc/neuron/metrics-tls{{- end -}}

{{/* The name the certificate is checked against: one name for every node agent and the remediation controller,
     as Prometheus reaches each pod by its IP, which no certificate can list. */}}
{{- define "neuron.metricsServerName" -}}
{{- printf "%s-metrics.%s.svc" (include "neuron.fullname" .) .Release.Namespace -}}
{{- end -}}

{{/* The ServiceAccount the chart's ServiceMonitors and PodMonitors scrape as, and its token Secret. */}}
{{- define "neuron.metricsScraper" -}}
{{- printf "%s-metrics-scraper" (include "neuron.fullname" .) -}}
{{- end -}}

{{/* A node agent's (or the remediation controller's) flags for protected /metrics: (dict "root" $ "values" $v). Empty when off. */}}
{{- define "neuron.secureMetricsArgs" -}}
{{- if .values.secureMetrics -}}
{{- $dir := include "neuron.metricsTlsDir" .root -}}
- --metrics-auth=kubernetes
- --tls-cert-file={{ $dir }}/tls.crt
- --tls-key-file={{ $dir }}/tls.key
{{- end -}}
{{- end -}}

{{/* The certificate's volume mount and volume (dict "root" $ "values" $v). Empty when off. */}}
{{- define "neuron.metricsTlsMount" -}}
{{- if .values.secureMetrics -}}
- name: metrics-tls
  mountPath: {{ include "neuron.metricsTlsDir" .root }}
  readOnly: true
{{- end -}}
{{- end -}}

{{- define "neuron.metricsTlsVolume" -}}
{{- if .values.secureMetrics -}}
- name: metrics-tls
  secret:
    secretName: {{ include "neuron.metricsTlsSecret" .root }}
    defaultMode: 0400
{{- end -}}
{{- end -}}

{{/* The probes' scheme: the kubelet probes HTTPS without checking the certificate, and needs no token. */}}
{{- define "neuron.probeScheme" -}}
{{- if .secureMetrics -}}HTTPS{{- end -}}
{{- end -}}

{{/* A monitor endpoint's TLS and credentials for a node agent (or the remediation controller) with secureMetrics: the chart's CA and the one
     server name, the scraper's token. (dict "root" $ "values" $v), empty when off; YAML at indentation 0. */}}
{{- define "neuron.secureScrape" -}}
{{- if .values.secureMetrics -}}
scheme: https
tlsConfig:
  serverName: {{ include "neuron.metricsServerName" .root }}
  ca:
    secret:
      name: {{ include "neuron.metricsTlsSecret" .root }}
      key: ca.crt
authorization:
  type: Bearer
  credentials:
    name: {{ include "neuron.metricsScraper" .root }}
    key: token
{{- end -}}
{{- end -}}

{{/* What a pod would get from automountServiceAccountToken, for one container and only when it is needed: a token
     bound to the pod (so it names the node, and the kubelet rotates it), the cluster's CA and the namespace. */}}
{{- define "neuron.apiTokenVolume" -}}
- name: api-token
  projected:
    defaultMode: 0400
    sources:
      - serviceAccountToken:
          path: token
          expirationSeconds: 3607
      - configMap:
          name: kube-root-ca.crt
          items:
            - key: ca.crt
              path: ca.crt
      - downwardAPI:
          items:
            - path: namespace
              fieldRef:
                fieldPath: metadata.namespace
{{- end -}}

{{- define "neuron.apiTokenMount" -}}
- name: api-token
  mountPath: /var/run/secrets/kubernetes.io/serviceaccount
  readOnly: true
{{- end -}}
