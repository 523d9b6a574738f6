"""Neuron device health: `faults` (the hardware fault table), `device_health` (findings and
per-device verdicts), `monitor` and `kernel_log` (the sources that produce findings),
`verdicts` (the problem detector's verdict files)."""
