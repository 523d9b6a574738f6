//go:build k8s134

package main

import "k8s.io/dynamic-resource-allocation/structured"

// schedulerFeatures is what kube-scheduler 1.34 hands its allocator with its default feature gates
// (`kube-scheduler -h`: DRAAdminAccess, DRAPrioritizedList and DRAResourceClaimDeviceStatus beta and
// on; DRAPartitionableDevices, DRADeviceTaints, DRAConsumableCapacity and DRADeviceBindingConditions
// alpha and off).
func schedulerFeatures() structured.Features {
	return structured.Features{AdminAccess: true, PrioritizedList: true, DeviceStatus: true}
}
