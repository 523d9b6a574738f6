"""Read the AWS Neuron driver on a host: `layout` (every host path), `inventory.scan` (one
immutable `NodeInventory` from sysfs), `counters`, `kmsg` (kernel-log records), `lnc`,
`cdi` (the device nodes as Container Device Interface specs).

Bad input never aborts a scan or a read: it becomes an explicit unknown plus a typed
`errors.ScanIssue`."""
