// Command sluice-test-xds is an xDS server for sluice's tests, built as Envoy
// Gateway's rate limit xDS server is: go-control-plane's state-of-the-world snapshot
// cache behind ADS, over TLS 1.3 with client certificates required, one snapshot
// for one node id holding every RateLimitConfig, versions as increasing integers.
//
// The configs come from the files named on the command line: YAML (or JSON) in the
// form Envoy Gateway's translator writes them (ratelimit.config.ratelimit.v3
// RateLimitConfig with snake_case field names, several documents per file). Fields
// the proto does not know (share_threshold, value_to_metric) are dropped, as they
// are on Envoy Gateway's wire.
//
// It prints "listening xds=ADDR control=ADDR" once serving. The control address
// (loopback only) takes:
//
//	POST /snapshot   body: YAML documents; publishes them as the next version
//	POST /reload     reads the files again; publishes them as the next version
//	GET  /requests   every DiscoveryRequest received, as JSON lines
//	GET  /responses  every DiscoveryResponse sent, as JSON lines
//
// SIGHUP does what POST /reload does.
package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/encoding/protojson"
	"sigs.k8s.io/yaml"
)

type server struct {
	cache  cachev3.SnapshotCache
	nodeID string
	files  []string

	mu        sync.Mutex
	version   int64
	requests  []map[string]any
	responses []map[string]any
}

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "xDS (ADS) address")
	control := flag.String("control", "127.0.0.1:0", "control address (loopback only)")
	cert := flag.String("cert", "", "server certificate (PEM); with -key and -ca: TLS 1.3, client certificates required")
	key := flag.String("key", "", "server private key (PEM)")
	ca := flag.String("ca", "", "authority of the client certificates (PEM)")
	nodeID := flag.String("node-id", "envoy-ratelimit", "node id the snapshot is published for")
	first := flag.Int64("version", 1, "version of the first snapshot")
	flag.Parse()

	s := &server{
		cache:   cachev3.NewSnapshotCache(false, cachev3.IDHash{}, nil),
		nodeID:  *nodeID,
		files:   flag.Args(),
		version: *first - 1,
	}
	if _, err := s.reload(); err != nil {
		log.Fatal(err)
	}

	var opts []grpc.ServerOption
	if *cert != "" {
		creds, err := serverTLS(*cert, *key, *ca)
		if err != nil {
			log.Fatal(err)
		}
		opts = append(opts, grpc.Creds(creds))
	}
	g := grpc.NewServer(opts...)
	callbacks := serverv3.CallbackFuncs{StreamRequestFunc: s.record, StreamResponseFunc: s.recordResponse}
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(g, serverv3.NewServer(context.Background(), s.cache, callbacks))

	xl, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatal(err)
	}
	cl, err := loopback(*control)
	if err != nil {
		log.Fatal(err)
	}
	go func() { log.Fatal(http.Serve(cl, s.mux())) }()

	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	go func() {
		for range hup {
			if v, err := s.reload(); err != nil {
				log.Printf("reload: %v", err)
			} else {
				log.Printf("reload: version %s", v)
			}
		}
	}()

	fmt.Printf("listening xds=%s control=%s\n", xl.Addr(), cl.Addr())
	log.Fatal(g.Serve(xl))
}

// serverTLS is Envoy Gateway's: TLS 1.3 at least, client certificates required.
func serverTLS(certFile, keyFile, caFile string) (credentials.TransportCredentials, error) {
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, err
	}
	caPEM, err := os.ReadFile(caFile)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("%s: no certificate", caFile)
	}
	return credentials.NewTLS(&tls.Config{
		Certificates: []tls.Certificate{pair},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    pool,
		MinVersion:   tls.VersionTLS13,
	}), nil
}

func loopback(addr string) (net.Listener, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return nil, fmt.Errorf("-control %s: only a loopback address is allowed", addr)
	}
	return net.Listen("tcp", addr)
}

// Each entry names its stream and when it was received or sent (Unix nanoseconds).
func (s *server) record(stream int64, req *discoveryv3.DiscoveryRequest) error {
	entry := map[string]any{
		"stream":         stream,
		"unix_nanos":     time.Now().UnixNano(),
		"version_info":   req.GetVersionInfo(),
		"response_nonce": req.GetResponseNonce(),
		"type_url":       req.GetTypeUrl(),
		"node_id":        req.GetNode().GetId(),
		"resource_names": req.GetResourceNames(),
	}
	if d := req.GetErrorDetail(); d != nil {
		entry["error_code"] = d.GetCode()
		entry["error_message"] = d.GetMessage()
	}
	s.mu.Lock()
	s.requests = append(s.requests, entry)
	s.mu.Unlock()
	return nil
}

func (s *server) recordResponse(_ context.Context, stream int64, _ *discoveryv3.DiscoveryRequest, resp *discoveryv3.DiscoveryResponse) {
	entry := map[string]any{
		"stream":       stream,
		"unix_nanos":   time.Now().UnixNano(),
		"version_info": resp.GetVersionInfo(),
		"nonce":        resp.GetNonce(),
		"type_url":     resp.GetTypeUrl(),
	}
	s.mu.Lock()
	s.responses = append(s.responses, entry)
	s.mu.Unlock()
}

func (s *server) mux() *http.ServeMux {
	m := http.NewServeMux()
	m.HandleFunc("POST /snapshot", func(w http.ResponseWriter, r *http.Request) {
		var body bytes.Buffer
		if _, err := body.ReadFrom(r.Body); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		configs, err := parse("request body", body.Bytes())
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		s.reply(w, configs)
	})
	m.HandleFunc("POST /reload", func(w http.ResponseWriter, _ *http.Request) {
		configs, err := s.read()
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		s.reply(w, configs)
	})
	m.HandleFunc("GET /requests", func(w http.ResponseWriter, _ *http.Request) {
		s.mu.Lock()
		defer s.mu.Unlock()
		enc := json.NewEncoder(w)
		for _, r := range s.requests {
			_ = enc.Encode(r)
		}
	})
	m.HandleFunc("GET /responses", func(w http.ResponseWriter, _ *http.Request) {
		s.mu.Lock()
		defer s.mu.Unlock()
		enc := json.NewEncoder(w)
		for _, r := range s.responses {
			_ = enc.Encode(r)
		}
	})
	return m
}

func (s *server) reply(w http.ResponseWriter, configs []types.Resource) {
	v, err := s.publish(configs)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	fmt.Fprintln(w, v)
}

func (s *server) reload() (string, error) {
	configs, err := s.read()
	if err != nil {
		return "", err
	}
	return s.publish(configs)
}

func (s *server) read() ([]types.Resource, error) {
	var all []types.Resource
	for _, f := range s.files {
		text, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		configs, err := parse(f, text)
		if err != nil {
			return nil, err
		}
		all = append(all, configs...)
	}
	return all, nil
}

// publish sets the next version, as Envoy Gateway's runner does.
func (s *server) publish(configs []types.Resource) (string, error) {
	s.mu.Lock()
	s.version++
	v := strconv.FormatInt(s.version, 10)
	s.mu.Unlock()
	snap, err := cachev3.NewSnapshot(v, map[resourcev3.Type][]types.Resource{
		resourcev3.RateLimitConfigType: configs,
	})
	if err != nil {
		return "", err
	}
	if err := s.cache.SetSnapshot(context.Background(), s.nodeID, snap); err != nil {
		return "", err
	}
	return v, nil
}

// parse reads YAML (or JSON) documents, each a RateLimitConfig.
func parse(name string, text []byte) ([]types.Resource, error) {
	var out []types.Resource
	for i, doc := range strings.Split("\n"+string(text), "\n---") {
		if strings.TrimSpace(doc) == "" {
			continue
		}
		j, err := yaml.YAMLToJSON([]byte(doc))
		if err != nil {
			return nil, fmt.Errorf("%s: document %d: %w", name, i+1, err)
		}
		c := &rlsconfv3.RateLimitConfig{}
		if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(j, c); err != nil {
			return nil, fmt.Errorf("%s: document %d: %w", name, i+1, err)
		}
		out = append(out, c)
	}
	return out, nil
}
