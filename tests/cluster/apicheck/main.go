// apicheck proves a pod reaches the API server in-cluster: it reads its service account token
// and CA and GETs /version through the `kubernetes` Service, by its address from the environment,
// or by the name given as the argument (kubernetes.default.svc: then cluster DNS answered too).
// Standard library only.
package main

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"
)

const sa = "/var/run/secrets/kubernetes.io/serviceaccount/"

func main() {
	host, port := os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT")
	if len(os.Args) > 1 {
		host = os.Args[1]
	}
	token, err := os.ReadFile(sa + "token")
	if err != nil {
		fail("no service account token: %v", err)
	}
	ca, err := os.ReadFile(sa + "ca.crt")
	if err != nil {
		fail("no service account CA: %v", err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	req, _ := http.NewRequest("GET", fmt.Sprintf("https://%s:%s/version", host, port), nil)
	req.Header.Set("Authorization", "Bearer "+string(token))
	resp, err := client.Do(req)
	if err != nil {
		fail("GET /version: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		fail("GET /version: HTTP %d: %s", resp.StatusCode, body)
	}
	fmt.Printf("reached the API server at %s:%s: %s\n", host, port, body)
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "apicheck: "+format+"\n", args...)
	os.Exit(1)
}
