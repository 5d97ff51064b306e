package main

import (
	"bytes"
	"context"
	"flag"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/pgstore"
)

// TestAdminMetrics records events through the example's observer and reads
// them back from /metrics on the admin listener: the Prometheus names the
// README lists, all starting with idemgate_.
func TestAdminMetrics(t *testing.T) {
	ctx := context.Background()
	s := obsSettings{adminAddr: "127.0.0.1:0", adminExplicit: true}
	var stderr bytes.Buffer
	o, a, err := startObs(ctx, s, "serve", nil, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = a.close(ctx)
		_ = o.shutdown(ctx)
	})
	if a == nil {
		t.Fatalf("no admin listener: %s", stderr.String())
	}
	ev := idemgate.Event{Route: "POST /v1/images", Kind: "images", Tenant: "acme", Latency: time.Millisecond}
	for _, typ := range []idemgate.EventType{idemgate.EventClaimed, idemgate.EventReplayed, idemgate.EventReplayed} {
		ev.Type = typ
		o.onEvent(ctx, ev)
	}
	o.tasks.OnWorkerEvent(pgstore.WorkerEvent{Type: pgstore.WorkerClaimed, Kind: "images", TaskID: "t", Attempt: 1, Latency: time.Millisecond})
	o.tasks.OnWorkerEvent(pgstore.WorkerEvent{Type: pgstore.WorkerSucceeded, Kind: "images", TaskID: "t", Attempt: 1, Latency: time.Second})
	o.tasks.OnWorkerEvent(pgstore.WorkerEvent{Type: pgstore.WorkerRescued, Kind: "images", TaskID: "u", Attempt: 1})

	res, err := http.Get(a.url() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	page := string(body)
	for _, want := range []string{
		`idemgate_requests_total{http_request_method="POST",http_route="/v1/images",idemgate_kind="images",idemgate_outcome="replayed"} 2`,
		`idemgate_requests_total{http_request_method="POST",http_route="/v1/images",idemgate_kind="images",idemgate_outcome="claimed"} 1`,
		`idemgate_decision_duration_seconds_count{`,
		`idemgate_task_claim_duration_seconds_count{idemgate_task_kind="images"} 1`,
		`idemgate_task_attempts_total{idemgate_task_kind="images",idemgate_task_outcome="succeeded"} 1`,
		`idemgate_task_attempt_duration_seconds_bucket{`,
		`idemgate_task_rescues_total{idemgate_task_kind="images"} 1`,
	} {
		if !strings.Contains(page, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	for _, line := range strings.Split(page, "\n") {
		if line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, "target_info") {
			continue
		}
		if !strings.HasPrefix(line, "idemgate_") {
			t.Errorf("metric outside idemgate_: %s", line)
		}
		if strings.Contains(line, "acme") {
			t.Errorf("tenant in a metric without OTEL_METRICS_TENANT: %s", line)
		}
	}
}

// TestAdminAddr: a busy default port is a warning and no listener; a busy
// port asked for explicitly is an error; "off" serves nothing.
func TestAdminAddr(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	o, err := newObserver(context.Background(), obsSettings{}, "serve")
	if err != nil {
		t.Fatal(err)
	}
	defer o.shutdown(context.Background())

	var stderr bytes.Buffer
	a, err := startAdmin(obsSettings{adminAddr: busy.Addr().String()}, o, &stderr)
	if err != nil || a != nil || !strings.Contains(stderr.String(), "/metrics is off") {
		t.Errorf("busy default port: admin %v, err %v, stderr %q; want a warning and no listener", a, err, stderr.String())
	}
	if a, err := startAdmin(obsSettings{adminAddr: busy.Addr().String(), adminExplicit: true}, o, io.Discard); err == nil || a != nil {
		t.Errorf("busy explicit port: admin %v, err %v; want an error", a, err)
	}
	if a, err := startAdmin(obsSettings{adminAddr: "off", adminExplicit: true}, o, io.Discard); err != nil || a != nil {
		t.Errorf("off: admin %v, err %v; want nothing", a, err)
	}
}

// TestObsFlags checks how -admin-addr, ADMIN_ADDR and the OTel variables
// are read.
func TestObsFlags(t *testing.T) {
	tests := []struct {
		name         string
		env          map[string]string
		args         []string
		wantAddr     string
		wantExplicit bool
		wantTraces   string
	}{
		{name: "defaults", wantAddr: defaultAdminAddr},
		{name: "env", env: map[string]string{"ADMIN_ADDR": ":9999"}, wantAddr: ":9999", wantExplicit: true},
		{name: "flag wins", env: map[string]string{"ADMIN_ADDR": ":9999"}, args: []string{"-admin-addr", "off"}, wantAddr: "off", wantExplicit: true},
		{name: "otlp by endpoint", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, wantAddr: defaultAdminAddr, wantTraces: "otlp"},
		{name: "console", env: map[string]string{"OTEL_TRACES_EXPORTER": "Console"}, wantAddr: defaultAdminAddr, wantTraces: "console"},
		{name: "grpc noted", env: map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, wantAddr: defaultAdminAddr, wantTraces: "otlp+grpc"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var s obsSettings
			fs := flag.NewFlagSet("t", flag.ContinueOnError)
			s.addObsFlags(fs, func(k string) string { return tt.env[k] }, io.Discard)
			if err := fs.Parse(tt.args); err != nil {
				t.Fatal(err)
			}
			if s.adminAddr != tt.wantAddr || s.adminExplicit != tt.wantExplicit || s.traces != tt.wantTraces {
				t.Errorf("got addr %q explicit %v traces %q; want %q %v %q", s.adminAddr, s.adminExplicit, s.traces,
					tt.wantAddr, tt.wantExplicit, tt.wantTraces)
			}
		})
	}
	// gRPC is refused with a clear error rather than silently ignored.
	if _, err := newObserver(context.Background(), obsSettings{traces: "otlp+grpc"}, "serve"); err == nil || !strings.Contains(err.Error(), "http/protobuf") {
		t.Errorf("otlp over grpc: %v; want an error naming http/protobuf", err)
	}
}

// TestOTLPTraces points the OTLP exporter at a stand-in collector through
// the usual environment variable and checks that spans arrive there.
func TestOTLPTraces(t *testing.T) {
	got := make(chan *http.Request, 16)
	collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		got <- r
	}))
	defer collector.Close()
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.URL)

	var s obsSettings
	s.addObsFlags(flag.NewFlagSet("t", flag.ContinueOnError), os.Getenv, io.Discard)
	o, err := newObserver(context.Background(), s, "serve")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(o.traceOut, "OTLP") {
		t.Fatalf("traces %q, want OTLP", o.traceOut)
	}
	_, span := o.tp.Tracer("test").Start(context.Background(), "a span")
	span.End()
	if err := o.shutdown(context.Background()); err != nil { // flushes
		t.Fatal(err)
	}
	select {
	case r := <-got:
		if r.Method != http.MethodPost || r.URL.Path != "/v1/traces" || r.Header.Get("Content-Type") != "application/x-protobuf" {
			t.Errorf("collector got %s %s (%s), want POST /v1/traces protobuf", r.Method, r.URL.Path, r.Header.Get("Content-Type"))
		}
	default:
		t.Fatal("no spans reached the collector")
	}
}

// The default admin address must bind loopback only.
func TestAdminDefaultAddrIsLoopback(t *testing.T) {
	o, err := newObserver(context.Background(), obsSettings{}, "serve")
	if err != nil {
		t.Fatal(err)
	}
	defer o.shutdown(context.Background())
	host, _, err := net.SplitHostPort(defaultAdminAddr)
	if err != nil {
		t.Fatal(err)
	}
	a, err := startAdmin(obsSettings{adminAddr: net.JoinHostPort(host, "0"), adminExplicit: true}, o, io.Discard)
	if err != nil || a == nil {
		t.Fatalf("admin on %s: %v", host, err)
	}
	defer a.close(context.Background())
	if ip := a.ln.Addr().(*net.TCPAddr).IP; !ip.IsLoopback() {
		t.Errorf("default admin host %q listens on %v, want loopback", host, ip)
	}
}
