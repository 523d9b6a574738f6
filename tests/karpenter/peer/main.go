// karpenter-repair-peer runs Karpenter's own node repair controller (sigs.k8s.io/karpenter's
// pkg/controllers/node/legacyrepair, the controller named "node.health" that --legacy-node-repair
// runs) against an API server, with a test cloud provider whose RepairPolicies() are AWS's (the
// list of aws/karpenter-provider-aws's pkg/cloudprovider/cloudprovider.go, in v1.15's fields).
// Only the AcceleratedHardwareReady toleration is a flag, so a test waits seconds, not 10 minutes.
// A test peer: never point it at a real cluster, it deletes NodeClaims.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"time"

	corev1 "k8s.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"k8s.io/utils/clock"
	v1 "sigs.k8s.io/karpenter/pkg/apis/v1"
	"sigs.k8s.io/karpenter/pkg/cloudprovider"
	"sigs.k8s.io/karpenter/pkg/cloudprovider/fake"
	"sigs.k8s.io/karpenter/pkg/controllers/node/health"
	"sigs.k8s.io/karpenter/pkg/controllers/node/legacyrepair"
	"sigs.k8s.io/karpenter/pkg/events"
	"sigs.k8s.io/karpenter/pkg/operator/options"
)

// AcceleratedHardwareReadyTolerationDefault is AWS's: a node whose AcceleratedHardwareReady has
// been False this long is replaced.
const AcceleratedHardwareReadyTolerationDefault = 10 * time.Minute

// awsRepairPolicies is AWS's provider's list. AWS writes it without ReasonRegex or Action (its
// provider was built against v1.14, where neither existed). In v1.15 a policy needs an Action, and
// AWS's policies can only mean ReplaceNode (the v1.14 controller only replaced); a set needs exactly
// one policy without ReasonRegex, so, as Karpenter's kwok provider does, NodeReady=False keeps that
// place and the others match every reason with ".*", which is what an absent regex meant.
func awsRepairPolicies(acceleratedHardwareToleration time.Duration) []cloudprovider.RepairPolicy {
	replace := func(t corev1.NodeConditionType, s corev1.ConditionStatus, regex string, d time.Duration) cloudprovider.RepairPolicy {
		return cloudprovider.RepairPolicy{ConditionType: t, ConditionStatus: s, ReasonRegex: regex, TolerationDuration: d, Action: cloudprovider.ReplaceNode}
	}
	return []cloudprovider.RepairPolicy{
		replace(corev1.NodeReady, corev1.ConditionFalse, "", 30*time.Minute),
		replace(corev1.NodeReady, corev1.ConditionUnknown, ".*", 30*time.Minute),
		replace("AcceleratedHardwareReady", corev1.ConditionFalse, ".*", acceleratedHardwareToleration),
		replace("StorageReady", corev1.ConditionFalse, ".*", 30*time.Minute),
		replace("NetworkingReady", corev1.ConditionFalse, ".*", 30*time.Minute),
		replace("KernelReady", corev1.ConditionFalse, ".*", 30*time.Minute),
		replace("ContainerRuntimeReady", corev1.ConditionFalse, ".*", 30*time.Minute),
	}
}

func main() {
	// --kubeconfig is controller-runtime's own flag (pkg/client/config), read by ctrl.GetConfig
	toleration := flag.Duration("accelerated-hardware-toleration", AcceleratedHardwareReadyTolerationDefault,
		"how long AcceleratedHardwareReady must be False before the node is repaired (AWS: 10m)")
	metricsAddr := flag.String("metrics-bind-address", "127.0.0.1:0", "where Karpenter's metrics are served")
	printPolicies := flag.Bool("print-policies", false, "print the cloud provider's repair policies as JSON and exit")
	flag.Parse()

	provider := fake.NewCloudProvider()
	provider.RepairPolicy = awsRepairPolicies(*toleration)
	if *printPolicies {
		out, _ := json.Marshal(provider.RepairPolicies())
		fmt.Println(string(out))
		return
	}
	log.SetLogger(zap.New(zap.UseDevMode(false)))
	logger := log.Log.WithName("karpenter-repair-peer")

	// The repair path v1.15 runs by default validates the policy set; a set it refuses would not be
	// AWS's policy in v1.15 terms, whichever controller then acts on it.
	validateCtx := options.ToContext(context.Background(), &options.Options{FeatureGates: options.FeatureGates{NodeRepair: true}})
	if _, err := health.NewRepairPolicyMatcher(validateCtx, provider); err != nil {
		fail("the repair policies are not a valid v1.15 policy set: %v", err)
	}

	cfg, err := ctrl.GetConfig()
	if err != nil {
		fail("kubeconfig: %v", err)
	}
	opts := &options.Options{FeatureGates: options.FeatureGates{NodeRepair: true}, LegacyNodeRepair: true, CPURequests: 1000}
	ctx := options.ToContext(log.IntoContext(ctrl.SetupSignalHandler(), logger), opts)
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Logger:                 logger,
		Metrics:                server.Options{BindAddress: *metricsAddr},
		HealthProbeBindAddress: "0",
		BaseContext:            func() context.Context { return ctx },
	})
	if err != nil {
		fail("manager: %v", err)
	}
	// The indexes Karpenter's operator registers (pkg/operator/operator.go setupIndexers) that this
	// controller's lookups read: a NodeClaim by its providerID, a Node's pods by node name.
	indexer := mgr.GetFieldIndexer()
	must(indexer.IndexField(ctx, &v1.NodeClaim{}, "status.providerID", func(o client.Object) []string {
		return []string{o.(*v1.NodeClaim).Status.ProviderID}
	}))
	must(indexer.IndexField(ctx, &corev1.Node{}, "spec.providerID", func(o client.Object) []string {
		return []string{o.(*corev1.Node).Spec.ProviderID}
	}))
	must(indexer.IndexField(ctx, &corev1.Pod{}, "spec.nodeName", func(o client.Object) []string {
		return []string{o.(*corev1.Pod).Spec.NodeName}
	}))
	recorder := events.NewRecorder(mgr.GetEventRecorderFor("karpenter")) //nolint:staticcheck // as Karpenter's operator does
	controller := legacyrepair.NewController(mgr.GetClient(), provider, clock.RealClock{}, recorder)
	must(controller.Register(ctx, mgr))
	logger.Info("running Karpenter's node repair controller", "controller", controller.Name(),
		"acceleratedHardwareToleration", toleration.String(), "policies", len(provider.RepairPolicies()))
	if err := mgr.Start(ctx); err != nil {
		fail("manager: %v", err)
	}
}

func must(err error) {
	if err != nil {
		fail("%v", err)
	}
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "karpenter-repair-peer: "+format+"\n", args...)
	os.Exit(1)
}
