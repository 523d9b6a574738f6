{{/* Contradictory values: fail with a message that says what to change (validate.yaml runs it
     before anything renders). */}}
{{- define "neuron.validate" -}}
{{- if and .Values.scheduler.enabled .Values.scheduler.extender.secureMetrics (not .Values.scheduler.extender.tls.enabled) -}}
{{- fail "scheduler.extender.secureMetrics needs scheduler.extender.tls.enabled: callers send bearer tokens, which must not cross the network in clear" -}}
{{- end -}}
{{- if not (or .Values.devicePlugin.enabled .Values.draDriver.enabled .Values.nodeMetrics.enabled .Values.npd.enabled) -}}
{{- fail "devicePlugin.enabled, draDriver.enabled, nodeMetrics.enabled and npd.enabled are all false: the release would install nothing; enable at least one component" -}}
{{- end -}}
{{- if and .Values.devicePlugin.enabled .Values.draDriver.enabled -}}
{{- /* Both would hand out the same devices, each unaware of the other: only disjoint node selectors are allowed. */ -}}
{{- $apart := false -}}
{{- range $key, $value := .Values.draDriver.nodeSelector -}}
{{- if and (hasKey $.Values.devicePlugin.nodeSelector $key) (ne (toString (index $.Values.devicePlugin.nodeSelector $key)) (toString $value)) -}}
{{- $apart = true -}}
{{- end -}}
{{- end -}}
{{- if not $apart -}}
{{- fail "devicePlugin.enabled and draDriver.enabled would both run on the same Neuron nodes, and each would hand out devices the other has already given away. Switch the release to DRA with --set devicePlugin.enabled=false,draDriver.enabled=true, or run each on its own nodes: give devicePlugin.nodeSelector and draDriver.nodeSelector the same label with different values (e.g. neuron.aws.com/allocator: device-plugin and dra)" -}}
{{- end -}}
{{- end -}}
{{- if and (eq .Values.placement.mode "instanceType") (empty (include "neuron.instanceTypes" . | fromJsonArray)) -}}
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
{{- if and .Values.scheduler.enabled (not .Values.devicePlugin.enabled) -}}
{{- fail "scheduler.enabled needs devicePlugin.enabled: the Neuron-aware scheduler places pods from the NeuronNode reports the device plugin publishes, and refuses every node without one" -}}
{{- end -}}
{{- $d := .Values.driver -}}
{{- if and $d.enabled (not (and $d.image.repository $d.image.tag)) -}}
{{- fail "driver.enabled needs driver.image.repository and driver.image.tag: KMM pulls <registry>/<repository>:<tag>-<kernel version>" -}}
{{- end -}}
{{- if and $d.enabled (not $d.nodeSelector) (ne .Values.placement.mode "nfd") -}}
{{- fail (printf "driver.enabled loads the module on nodes labelled %s=true, which placement.mode=%s does not use: set placement.mode=nfd, or driver.nodeSelector to the labels of your Neuron nodes" .Values.placement.nfdLabel .Values.placement.mode) -}}
{{- end -}}
{{- if and $d.devicePluginWaitsForModule (not $d.enabled) -}}
{{- fail "driver.devicePluginWaitsForModule waits for a kernel module the chart does not load: set driver.enabled=true, or turn it off" -}}
{{- end -}}
{{- if include "neuron.driverModuleRendered" . -}}
{{- $name := include "neuron.driverName" . -}}
{{- $combined := len (printf "%s%s" $name .Release.Namespace) -}}
{{- if gt $combined 40 -}}
{{- fail (printf "driver.enabled: KMM's admission webhook refuses a Module whose name and namespace together are longer than 40 characters; the Module %q in namespace %q has %d: shorten driver.moduleName or the namespace" $name .Release.Namespace $combined) -}}
{{- end -}}
{{- end -}}
{{- if and $d.enabled $d.devicePluginWaitsForModule -}}
{{- $labelName := include "neuron.driverReadyLabel" . | splitList "/" | last -}}
{{- if gt (len $labelName) 63 -}}
{{- fail (printf "driver.devicePluginWaitsForModule: KMM's ready label name %q is longer than 63 characters; shorten the release namespace or driver.moduleName" $labelName) -}}
{{- end -}}
{{- end -}}
{{- if .Values.scheduler.enabled -}}
{{- range $key, $v := dict "extender" .Values.scheduler.extender "kubeScheduler" .Values.scheduler.kubeScheduler -}}
{{- if and (dig "enabled" true $v) (gt (int $v.replicas) 1) (not $v.leaderElection.enabled) -}}
{{- fail (printf "scheduler.%s.replicas=%d needs scheduler.%s.leaderElection.enabled: replicas that do not elect a leader would each place pods on their own" $key (int $v.replicas) $key) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- with .Values.remediation -}}
{{- if and .enabled (gt (int .replicas) 1) (not .leaderElection.enabled) -}}
{{- fail (printf "remediation.replicas=%d needs remediation.leaderElection.enabled: replicas that do not elect a leader would each cordon and drain nodes, and each count only its own against the breaker" (int .replicas)) -}}
{{- end -}}
{{- if and .enabled $.Values.npd.enabled $.Values.npd.remediation.cordon -}}
{{- fail "remediation.enabled and npd.remediation.cordon both cordon nodes: an admin's uncordon cancels the controller's workflow, and the detector would cordon the node again. Set npd.remediation.cordon=false (the controller cordons, and uncordons only what it cordoned)" -}}
{{- end -}}
{{- if and .autoscaling.enabled (not .enabled) -}}
{{- fail "remediation.autoscaling.enabled=true needs remediation.enabled=true: the remediation controller makes the Auto Scaling request, after it has cordoned and drained the node" -}}
{{- end -}}
{{- end -}}
{{- if and (include "neuron.extenderNetworkPolicy" .) (not .Values.scheduler.kubeScheduler.enabled) (not .Values.scheduler.extender.networkPolicy.schedulerFrom) -}}
{{- fail "scheduler.extender.networkPolicy.enabled admits the extender's verbs only from neuron-scheduler, but scheduler.kubeScheduler.enabled=false: name the pods of your own kube-scheduler in scheduler.extender.networkPolicy.schedulerFrom (a podSelector with a namespaceSelector, or an ipBlock of your control-plane nodes), or set scheduler.extender.networkPolicy.enabled=false" -}}
{{- end -}}
{{- if and .Values.simulation.enabled (not (hasPrefix "/" .Values.simulation.hostRoot)) -}}
{{- fail (printf "simulation.hostRoot must be an absolute host path, got %q" .Values.simulation.hostRoot) -}}
{{- end -}}
{{- include "neuron.validateNames" . -}}
{{- end -}}

{{/* Object names and namespaces (objectNames, <component>.fullnameOverride and namespaceOverride; docs/installing.md,
     "Object names and namespaces"): contradictions, and another release already holding AWS's names. */}}
{{- define "neuron.validateNames" -}}
{{- $s := .Values.scheduler -}}
{{- /* the installed components with a name of their own, and their main workload: key -> (component, kind) */ -}}
{{- $named := dict -}}
{{- if .Values.devicePlugin.enabled }}{{ $_ := set $named "devicePlugin" (list "device-plugin" "DaemonSet") }}{{ end -}}
{{- if .Values.npd.enabled }}{{ $_ := set $named "npd" (list "problem-detector" "DaemonSet") }}{{ end -}}
{{- if $s.enabled }}{{ $_ := set $named "scheduler.extender" (list "scheduler-extender" "Deployment") }}{{ end -}}
{{- if and $s.enabled $s.kubeScheduler.enabled }}{{ $_ := set $named "scheduler.kubeScheduler" (list "kube-scheduler" "Deployment") }}{{ end -}}
{{- if and $s.enabled $s.kubeScheduler.enabled -}}
{{- $x := include "neuron.componentNamespace" (dict "root" . "component" "scheduler-extender") -}}
{{- $k := include "neuron.componentNamespace" (dict "root" . "component" "kube-scheduler") -}}
{{- if ne $x $k -}}
{{- fail (printf "scheduler.extender runs in namespace %q and scheduler.kubeScheduler in %q: they must share one, as neuron-scheduler mounts the extender's TLS Secret and is admitted by the extender's NetworkPolicy as a pod of its namespace; set scheduler.extender.namespaceOverride and scheduler.kubeScheduler.namespaceOverride to the same namespace" $x $k) -}}
{{- end -}}
{{- end -}}
{{- /* two components under one name would overwrite each other's cluster-scoped RBAC and admission policies */ -}}
{{- $all := deepCopy $named -}}
{{- if .Values.nodeMetrics.enabled }}{{ $_ := set $all "nodeMetrics" (list "node-metrics" "DaemonSet") }}{{ end -}}
{{- if .Values.draDriver.enabled }}{{ $_ := set $all "draDriver" (list "dra-driver" "DaemonSet") }}{{ end -}}
{{- $seen := dict -}}
{{- range $key, $c := $all -}}
{{- $name := include "neuron.componentName" (dict "root" $ "component" (index $c 0)) -}}
{{- with get $seen $name -}}
{{- $pair := sortAlpha (list . $key) -}}
{{- fail (printf "%s and %s are both named %q (fullnameOverride, or AWS's names with objectNames=aws): their ClusterRoles, bindings and admission policies would overwrite each other; give each its own fullnameOverride" (index $pair 0) (index $pair 1) $name) -}}
{{- end -}}
{{- $_ := set $seen $name $key -}}
{{- end -}}
{{- /* a second release under the same fixed names: Helm would refuse to adopt the objects with a bare ownership
       error; say which release holds them and what to change (lookup answers nothing in helm template) */ -}}
{{- range $key, $c := $named -}}
{{- $ctx := dict "root" $ "component" (index $c 0) -}}
{{- $name := include "neuron.componentName" $ctx -}}
{{- $ns := include "neuron.componentNamespace" $ctx -}}
{{- $existing := lookup "apps/v1" (index $c 1) $ns $name -}}
{{- if $existing -}}
{{- $annotations := dig "metadata" "annotations" dict $existing -}}
{{- $owner := get $annotations "meta.helm.sh/release-name" -}}
{{- $ownerNs := get $annotations "meta.helm.sh/release-namespace" -}}
{{- if not $owner -}}
{{- fail (printf "%s %s/%s already exists and belongs to no Helm release (applied by hand, e.g. from AWS's k8s-neuron-device-plugin.yml): this chart cannot take it over as it is. Delete it first (kubectl delete %s -n %s %s: its pods stop, so the node advertises no Neuron resources until this release's start), or install with --set objectNames=release, or give %s its own fullnameOverride or namespaceOverride" (index $c 1) $ns $name (lower (index $c 1)) $ns $name $key) -}}
{{- end -}}
{{- if and $owner (or (ne $owner $.Release.Name) (ne $ownerNs $.Release.Namespace)) -}}
{{- fail (printf "%s %s/%s already belongs to Helm release %q in namespace %q: only one release per cluster can use AWS's fixed names. Install this release with --set objectNames=release (every object <release>-<component> in the release namespace), or give %s its own fullnameOverride or namespaceOverride; to replace that release, uninstall it first" (index $c 1) $ns $name $owner $ownerNs $key) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
