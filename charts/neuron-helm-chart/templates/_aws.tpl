{{/* Values written for AWS's neuron-helm-chart (aws-neuron/neuron-helm-charts, 1.0 to 1.10). A key with
     the same meaning here is read as this chart's (neuronInstances); every other one is refused by
     "neuron.awsValues" with this chart's equivalent, or why there is none, rather than a bare schema
     error. The schema admits these keys for that reason only (their descriptions say so). */}}

{{/* The instance types the agents run on: placement.instanceTypes, or AWS's neuronInstances when given. */}}
{{- define "neuron.instanceTypes" -}}
{{- toJson (.Values.neuronInstances | default .Values.placement.instanceTypes) -}}
{{- end -}}

{{/* AWS keys this chart does not read, each with what to write instead ("path" "what to do"). */}}
{{- define "neuron.awsRefusals" -}}
{{- $names := "none: the `app.kubernetes.io/name` label is the chart's, in every selector; the object name is `fullnameOverride` (the same key)" -}}
{{- $labels := "none: the selectors are the standard app.kubernetes.io labels, which a Deployment or DaemonSet cannot change after install" -}}
{{- $runtime := "none: the Neuron agents run in the node's default runtime (no runtime class is needed to reach /dev/neuronN)" -}}
{{- dict
  "devicePlugin.nameOverride" $names
  "devicePlugin.selectorLabelsOverride" $labels
  "devicePlugin.runtimeClassName" $runtime
  "scheduler.image" "scheduler.extender.image (the extender is this project's image, not public.ecr.aws/neuron/neuron-scheduler)"
  "scheduler.imagePullSecrets" "scheduler.extender.imagePullSecrets"
  "scheduler.nameOverride" $names
  "scheduler.namespaceOverride" "scheduler.extender.namespaceOverride (and scheduler.kubeScheduler.namespaceOverride: they share a namespace)"
  "scheduler.fullnameOverride" "scheduler.extender.fullnameOverride (AWS's k8s-neuron-scheduler is the default with objectNames=aws)"
  "scheduler.replicaCount" "scheduler.extender.replicas (two by default: they elect a leader)"
  "scheduler.strategy" "none: the extender's replicas roll one at a time and hand the lease over (RollingUpdate)"
  "scheduler.priorityClassName" "scheduler.extender.priorityClassName"
  "scheduler.serviceAccount" "scheduler.extender.serviceAccount"
  "scheduler.podAnnotations" "scheduler.extender.podAnnotations"
  "scheduler.podSecurityContext" "scheduler.extender.podSecurityContext"
  "scheduler.securityContext" "scheduler.extender.securityContext"
  "scheduler.nodeSelector" "scheduler.extender.nodeSelector (the extender needs no control-plane node)"
  "scheduler.tolerations" "scheduler.extender.tolerations"
  "scheduler.affinity" "scheduler.extender.affinity"
  "scheduler.customScheduler" "scheduler.kubeScheduler (enabled, image, replicas, resources, ...); the scheduler's name pods ask for is scheduler.schedulerName (AWS's my-scheduler answers too: scheduler.additionalSchedulerNames), its Deployment's name scheduler.kubeScheduler.fullnameOverride (my-scheduler with objectNames=aws), its namespace scheduler.kubeScheduler.namespaceOverride"
  "scheduler.defaultScheduler" "none: extending the default scheduler used the scheduler Policy API, removed in Kubernetes 1.23; use scheduler.kubeScheduler (a second scheduler)"
  "npd.config" "npd.rules (a rules file in this chart's format; the shipped rules cover AWS's NeuronHealth rules)"
  "npd.nameOverride" $names
  "npd.namespace" "npd.createNamespace (on by default: the chart creates the detector's namespace, npd.namespaceOverride, when it does not exist yet)"
  "npd.selectorLabelsOverride" $labels
  "npd.runtimeClassName" $runtime
  "npd.nodeProblemDetector" "npd.image, npd.resources, npd.securityContext (the detector is this project's, not registry.k8s.io's node-problem-detector; its ClusterRole is the chart's own, least privilege)"
  "npd.nodeRecovery.image" "remediation.image (the remediation controller makes the Auto Scaling request: npd.nodeRecovery.enabled=true; AWS's neuron-node-recovery image is not run)"
  "npd.nodeRecovery.resources" "remediation.resources (the remediation controller makes the Auto Scaling request; it is a Deployment, not a container in the detector's pods)"
  "npd.nodeRecovery.counters" "none: the faults that get a new instance are the fault table's replace rung (AWS's four counters are on it; remediation.autoscaling.reboot adds the reboot rung), docs/remediation.md"
  "npd.volumes" "none: the detector mounts exactly what it reads (/dev/kmsg, or the directory of kernelLog.syslogFile; /sys, its state directory)"
  "npd.volumeMounts" "none: the detector mounts exactly what it reads (/dev/kmsg, or the directory of kernelLog.syslogFile; /sys, its state directory)"
  "monitor" "nodeMetrics (this chart's exporter, with pod attribution; not neuron-monitor)"
  "ultraserverOperator" "none yet: UltraServer placement is not in this chart"
| toJson -}}
{{- end -}}

{{/* Fails, listing every AWS key given that this chart does not read, with what to write instead. */}}
{{- define "neuron.awsValues" -}}
{{- $found := list -}}
{{- range $path, $instead := include "neuron.awsRefusals" . | fromJson -}}
{{- $node := $.Values -}}
{{- $present := true -}}
{{- range $part := splitList "." $path -}}
{{- if and $present (kindIs "map" $node) (hasKey $node $part) -}}
{{- $node = index $node $part -}}
{{- else -}}
{{- $present = false -}}
{{- end -}}
{{- end -}}
{{- if $present -}}
{{- $found = append $found (printf "  %s -> %s" $path $instead) -}}
{{- end -}}
{{- end -}}
{{- range $component, $prefix := dict "devicePlugin" "public.ecr.aws/neuron/" "draDriver" "public.ecr.aws/neuron/" -}}
{{- $image := (index $.Values $component).image | default dict -}}
{{- if hasPrefix $prefix ($image.repository | default "") -}}
{{- $found = append $found (printf "  %s.image.repository -> leave it unset: %s runs AWS's own program, which does not take this chart's flags" $component $image.repository) -}}
{{- end -}}
{{- end -}}
{{- $recovery := .Values.npd.nodeRecovery | default dict -}}
{{- if and $recovery.enabled (not .Values.remediation.enabled) -}}
{{- $found = append $found "  npd.nodeRecovery.enabled=true -> also set remediation.enabled=true: AWS's recovery (the instance marked Unhealthy in its Auto Scaling group) is the remediation controller's Auto Scaling backend here, which cordons and drains the node first, within its breaker (docs/remediation.md)" -}}
{{- end -}}
{{- if $found -}}
{{- fail (printf "values written for AWS's neuron-helm-chart that this chart reads under another name, or not at all; change them:\n%s" (join "\n" (sortAlpha $found))) -}}
{{- end -}}
{{- end -}}
