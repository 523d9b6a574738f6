//go:build k8s135

package main

import "k8s.io/dynamic-resource-allocation/structured"

// schedulerFeatures is what kube-scheduler 1.35 hands its allocator with its default feature gates
// (`kube-scheduler -h`: DRAAdminAccess and DRAPrioritizedList beta and on; DRAPartitionableDevices,
// DRADeviceTaints, DRAConsumableCapacity and DRADeviceBindingConditions alpha and off).
func schedulerFeatures() structured.Features {
	return structured.Features{AdminAccess: true, PrioritizedList: true}
}
