// grpc-ceiling measures what the v1beta1 Allocate round trip costs in Go's gRPC, the stack the
// kubelet and NVIDIA's device plugin use, on this machine: a do-nothing server, and a load
// generator built on the kubelet's own generated client. It gives the Python plugin's figures a
// floor to be read against; it is benchmark infrastructure, not part of the product.
//
//	grpc-ceiling serve SOCKET
//	grpc-ceiling load -socket SOCKET -callers N -calls M   (prints one JSON line)
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"sort"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	dp "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

type doNothing struct {
	dp.UnimplementedDevicePluginServer
}

// Allocate answers with the shape the Neuron plugin returns for one core, so both carry the
// same bytes.
func (doNothing) Allocate(_ context.Context, req *dp.AllocateRequest) (*dp.AllocateResponse, error) {
	resp := &dp.AllocateResponse{}
	for range req.ContainerRequests {
		resp.ContainerResponses = append(resp.ContainerResponses, &dp.ContainerAllocateResponse{
			Envs:    map[string]string{"NEURON_RT_VISIBLE_CORES": "3"},
			Devices: []*dp.DeviceSpec{{ContainerPath: "/dev/neuron1", HostPath: "/dev/neuron1", Permissions: "rw"}},
		})
	}
	return resp, nil
}

func serve(socket string) error {
	_ = os.Remove(socket)
	listener, err := net.Listen("unix", socket)
	if err != nil {
		return err
	}
	server := grpc.NewServer()
	dp.RegisterDevicePluginServer(server, doNothing{})
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	go func() { <-stop; server.Stop() }()
	return server.Serve(listener)
}

type result struct {
	Samples int     `json:"samples"`
	P50Ms   float64 `json:"p50_ms"`
	P99Ms   float64 `json:"p99_ms"`
	PerSec  float64 `json:"calls_per_second"`
}

func load(socket string, callers, calls int, id string) (result, error) {
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return result{}, err
	}
	defer conn.Close()
	client := dp.NewDevicePluginClient(conn)
	req := &dp.AllocateRequest{ContainerRequests: []*dp.ContainerAllocateRequest{{DevicesIds: []string{id}}}}
	for i := 0; i < 50; i++ { // warm the connection and both processes
		if _, err := client.Allocate(context.Background(), req); err != nil {
			return result{}, err
		}
	}
	samples := make([]time.Duration, 0, callers*calls)
	var mu sync.Mutex
	var wg sync.WaitGroup
	errs := make(chan error, callers)
	start := time.Now()
	for c := 0; c < callers; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < calls; j++ {
				t0 := time.Now()
				if _, err := client.Allocate(context.Background(), req); err != nil {
					errs <- err
					return
				}
				elapsed := time.Since(t0)
				mu.Lock()
				samples = append(samples, elapsed)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	wall := time.Since(start)
	close(errs)
	if err := <-errs; err != nil {
		return result{}, err
	}
	sort.Slice(samples, func(a, b int) bool { return samples[a] < samples[b] })
	at := func(q float64) float64 {
		return float64(samples[int(float64(len(samples)-1)*q)]) / float64(time.Millisecond)
	}
	return result{len(samples), at(0.50), at(0.99), float64(len(samples)) / wall.Seconds()}, nil
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: grpc-ceiling serve SOCKET | grpc-ceiling load -socket SOCKET -callers N -calls M")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "serve":
		if len(os.Args) != 3 {
			fmt.Fprintln(os.Stderr, "usage: grpc-ceiling serve SOCKET")
			os.Exit(2)
		}
		if err := serve(os.Args[2]); err != nil {
			fmt.Fprintln(os.Stderr, "serve:", err)
			os.Exit(1)
		}
	case "load":
		flags := flag.NewFlagSet("load", flag.ExitOnError)
		socket := flags.String("socket", "", "the device plugin's unix socket")
		callers := flags.Int("callers", 1, "concurrent callers, each calling back to back")
		calls := flags.Int("calls", 200, "calls per caller")
		id := flags.String("id", "neuroncore3", "the device ID every call asks for")
		_ = flags.Parse(os.Args[2:])
		if *socket == "" || *callers < 1 || *calls < 1 {
			fmt.Fprintln(os.Stderr, "load: -socket is required; -callers and -calls must be positive")
			os.Exit(2)
		}
		r, err := load(*socket, *callers, *calls, *id)
		if err != nil {
			fmt.Fprintln(os.Stderr, "load:", err)
			os.Exit(1)
		}
		_ = json.NewEncoder(os.Stdout).Encode(r)
	default:
		fmt.Fprintf(os.Stderr, "unknown command %q\n", os.Args[1])
		os.Exit(2)
	}
}
