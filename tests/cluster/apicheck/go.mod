module neuron-helm-chart/apicheck

go 1.26
