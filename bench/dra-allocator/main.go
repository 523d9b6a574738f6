// dra-allocator times kube-scheduler's own DRA allocator (k8s.io/dynamic-resource-allocation's
// structured package, at the Kubernetes release this program is built for) on the slices, device
// classes, claims and allocations of a scenario that bench/bench_dra_levers.py writes. For every claim
// it builds one allocator over the whole fleet's slices, as kube-scheduler's DRA plugin does once per
// pod, then asks it to allocate the claim on each node in turn, as the plugin's Filter does per node.
// It prints one JSON object: per claim kind, the filter calls, their mean and percentiles, and how
// many found a fit. Nothing of the Neuron model is here: the scenario carries all of it.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"runtime/pprof"
	"slices"
	"sort"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
)

type claimCase struct {
	Kind  string                    `json:"kind"`
	Claim resourceapi.ResourceClaim `json:"claim"`
}

type scenario struct {
	Classes   []resourceapi.DeviceClass   `json:"classes"`
	Slices    []resourceapi.ResourceSlice `json:"slices"`
	Nodes     []string                    `json:"nodes"`
	Allocated [][3]string                 `json:"allocated"` // driver, pool, device
	// shares of devices that allow several allocations: driver, pool, device, share, capacity, quantity
	Shared [][6]string `json:"shared"`
	Claims []claimCase `json:"claims"`
}

type classes map[string]*resourceapi.DeviceClass

func (c classes) List() ([]*resourceapi.DeviceClass, error) {
	out := make([]*resourceapi.DeviceClass, 0, len(c))
	for _, class := range c {
		out = append(out, class)
	}
	return out, nil
}

func (c classes) Get(name string) (*resourceapi.DeviceClass, error) {
	if class, ok := c[name]; ok {
		return class, nil
	}
	return nil, fmt.Errorf("device class %q not found", name)
}

type kindFigures struct {
	Claims     int     `json:"claims"`
	Filters    int     `json:"filters"`
	Fits       int     `json:"fits"`
	MeanUs     float64 `json:"mean_us"`
	P50Us      float64 `json:"p50_us"`
	P99Us      float64 `json:"p99_us"`
	NewAllocUs float64 `json:"new_allocator_us"`
	Errors     int     `json:"errors"`
	FirstError string  `json:"first_error,omitempty"`
}

func percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(p * float64(len(sorted)-1))
	return sorted[i]
}

// defaultClaim applies the API server's defaults that the allocator relies on (a claim read from a
// file has none): an exact request without a mode asks for ExactCount, with a count of 1 if none.
func defaultClaim(claim *resourceapi.ResourceClaim) {
	for i := range claim.Spec.Devices.Requests {
		request := &claim.Spec.Devices.Requests[i]
		if exact := request.Exactly; exact != nil {
			defaultMode(&exact.AllocationMode, &exact.Count)
		}
		for j := range request.FirstAvailable {
			sub := &request.FirstAvailable[j]
			defaultMode(&sub.AllocationMode, &sub.Count)
		}
	}
}

func defaultMode(mode *resourceapi.DeviceAllocationMode, count *int64) {
	if *mode == "" {
		*mode = resourceapi.DeviceAllocationModeExactCount
	}
	if *mode == resourceapi.DeviceAllocationModeExactCount && *count == 0 {
		*count = 1
	}
}

func main() {
	path := flag.String("scenario", "", "the scenario's JSON file")
	profile := flag.String("cpuprofile", "", "write a CPU profile of the filters to this file")
	verbose := flag.Bool("v", false, "print each claim's total filter time to stderr")
	flag.Parse()
	if *path == "" {
		fmt.Fprintln(os.Stderr, "usage: dra-allocator --scenario FILE")
		os.Exit(2)
	}
	raw, err := os.ReadFile(*path)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	var sc scenario
	if err := json.Unmarshal(raw, &sc); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", *path, err)
		os.Exit(2)
	}
	ctx := context.Background()
	lister := classes{}
	for i := range sc.Classes {
		lister[sc.Classes[i].Name] = &sc.Classes[i]
	}
	allSlices := make([]*resourceapi.ResourceSlice, len(sc.Slices))
	for i := range sc.Slices {
		allSlices[i] = &sc.Slices[i]
	}
	state := structured.AllocatedState{
		AllocatedDevices:         sets.New[structured.DeviceID](),
		AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](),
		AggregatedCapacity:       structured.ConsumedCapacityCollection{},
	}
	for _, id := range sc.Allocated {
		state.AllocatedDevices.Insert(structured.MakeDeviceID(id[0], id[1], id[2]))
	}
	for _, share := range sc.Shared {
		device := structured.MakeDeviceID(share[0], share[1], share[2])
		shareID := types.UID(share[3])
		state.AllocatedSharedDeviceIDs.Insert(structured.MakeSharedDeviceID(device, &shareID))
		quantity, err := resource.ParseQuantity(share[5])
		if err != nil {
			fmt.Fprintf(os.Stderr, "%s: share %v: %v\n", *path, share, err)
			os.Exit(2)
		}
		consumed := state.AggregatedCapacity[device]
		if consumed == nil {
			consumed = structured.ConsumedCapacity{}
			state.AggregatedCapacity[device] = consumed
		}
		name := resourceapi.QualifiedName(share[4])
		if total, ok := consumed[name]; ok {
			total.Add(quantity)
		} else {
			consumed[name] = &quantity
		}
	}
	nodes := make([]*v1.Node, len(sc.Nodes))
	for i, name := range sc.Nodes {
		nodes[i] = &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	}
	features := schedulerFeatures()
	celCache := cel.NewCache(100, cel.Features{})
	if *profile != "" {
		out, err := os.Create(*profile)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		if err := pprof.StartCPUProfile(out); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		defer pprof.StopCPUProfile()
	}
	durations := map[string][]float64{}
	figures := map[string]*kindFigures{}
	for i := range sc.Claims {
		c := &sc.Claims[i]
		defaultClaim(&c.Claim)
		f := figures[c.Kind]
		if f == nil {
			f = &kindFigures{}
			figures[c.Kind] = f
		}
		f.Claims++
		start := time.Now()
		allocator, err := structured.NewAllocator(ctx, features, state, lister, allSlices, celCache)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		f.NewAllocUs += float64(time.Since(start).Microseconds())
		claims := []*resourceapi.ResourceClaim{&c.Claim}
		claimStart := time.Now()
		for _, node := range nodes {
			t := time.Now()
			// kube-scheduler gives a node's DRA filter 10 s at most (DRASchedulerFilterTimeout, on by default)
			filterCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
			results, err := allocator.Allocate(filterCtx, node, claims)
			cancel()
			durations[c.Kind] = append(durations[c.Kind], float64(time.Since(t).Nanoseconds())/1e3)
			f.Filters++
			if err != nil {
				f.Errors++
				if f.FirstError == "" {
					f.FirstError = err.Error()
				}
			} else if len(results) == 1 {
				f.Fits++
			}
		}
		if *verbose {
			fmt.Fprintf(os.Stderr, "%s %s: %v over %d nodes\n", c.Kind, c.Claim.Name, time.Since(claimStart), len(nodes))
		}
	}
	for kind, f := range figures {
		d := durations[kind]
		sort.Float64s(d)
		sum := 0.0
		for _, x := range d {
			sum += x
		}
		if len(d) > 0 {
			f.MeanUs = sum / float64(len(d))
		}
		f.P50Us, f.P99Us = percentile(d, 0.5), percentile(d, 0.99)
		f.NewAllocUs /= float64(f.Claims)
	}
	kinds := make([]string, 0, len(figures))
	for k := range figures {
		kinds = append(kinds, k)
	}
	slices.Sort(kinds)
	out := map[string]any{"kinds": figures, "order": kinds}
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
