//go:build !k8s134 && !k8s135

package main

import "k8s.io/dynamic-resource-allocation/structured"

// schedulerFeatures is what kube-scheduler 1.36 and 1.37 hand its allocator with its default feature gates
// (`kube-scheduler -h`: DRAConsumableCapacity, DRADeviceBindingConditions, DRADeviceTaints,
// DRAPartitionableDevices beta and on, DRAAdminAccess and DRAPrioritizedList GA; the alpha ones off).
func schedulerFeatures() structured.Features {
	return structured.Features{
		AdminAccess: true, ConsumableCapacity: true, DeviceBindingAndStatus: true,
		DeviceTaints: true, PartitionableDevices: true, PrioritizedList: true,
	}
}
