package main

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/idemgate/idemgate/internal/testenv"
	"github.com/labstack/echo/v4"
)

// A node with a real JWT_SECRET must not mint tokens at
// /dev/token (with the dev secret it may), and /metrics is never on the
// API listener.
func TestDevTokenRefusedWithRealSecret(t *testing.T) {
	for _, secret := range []string{"", "a-real-secret-of-enough-length-0123456789"} {
		s := settings{addr: "127.0.0.1:0", databaseURL: testenv.PostgresDSN(t), workers: 1, jwtSecret: secret, dev: secret == ""}
		n, err := startNode(context.Background(), s, slog.New(slog.DiscardHandler), io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.Post(n.url()+"/dev/token", "application/json", strings.NewReader(`{"tenant":"acme","user":"mallory"}`))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		want := http.StatusOK
		if secret != "" {
			want = http.StatusNotFound
		}
		if resp.StatusCode != want || (secret != "" && strings.Contains(string(body), "token")) {
			t.Errorf("JWT_SECRET %q: /dev/token answered %d %s, want %d", secret, resp.StatusCode, body, want)
		}
		resp, err = http.Get(n.url() + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		body, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		if strings.Contains(string(body), "idemgate_") {
			t.Errorf("the API listener serves metrics: %d %.200s", resp.StatusCode, body)
		}
		_ = n.shutdown()
	}
}

func TestAuth(t *testing.T) {
	t.Parallel()
	secret := []byte("s3cret")
	now := time.Now()
	good, _ := mintToken(secret, "acme", "alice", now, time.Hour)
	forged, _ := mintToken([]byte("other"), "acme", "alice", now, time.Hour)
	expired, _ := mintToken(secret, "acme", "alice", now.Add(-2*time.Hour), time.Hour)
	noTenant, _ := mintToken(secret, "", "alice", now, time.Hour)
	noExp, _ := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{"tenant": "acme", "sub": "alice"}).SignedString(secret)
	hs512, _ := jwt.NewWithClaims(jwt.SigningMethodHS512, claims{Tenant: "acme",
		RegisteredClaims: jwt.RegisteredClaims{Subject: "alice", ExpiresAt: jwt.NewNumericDate(now.Add(time.Hour))}}).SignedString(secret)
	tests := []struct {
		name       string
		given      string // Authorization header
		wantStatus int
	}{
		{name: "valid", given: "Bearer " + good, wantStatus: 200},
		{name: "missing", given: "", wantStatus: 401},
		{name: "not bearer", given: "Basic " + good, wantStatus: 401},
		{name: "forged", given: "Bearer " + forged, wantStatus: 401},
		{name: "expired", given: "Bearer " + expired, wantStatus: 401},
		{name: "no tenant", given: "Bearer " + noTenant, wantStatus: 401},
		{name: "no exp", given: "Bearer " + noExp, wantStatus: 401},
		{name: "other algorithm", given: "Bearer " + hs512, wantStatus: 401},
	}
	e := echo.New()
	e.HTTPErrorHandler = errorHandler(slog.New(slog.DiscardHandler))
	e.GET("/", func(c echo.Context) error {
		tenant, user, err := identity(c)
		if err != nil {
			return err
		}
		return c.String(http.StatusOK, tenant+"/"+user)
	}, authMiddleware(secret))
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			req := httptest.NewRequest(http.MethodGet, "/", nil)
			if tt.given != "" {
				req.Header.Set("Authorization", tt.given)
			}
			rec := httptest.NewRecorder()
			e.ServeHTTP(rec, req)
			if rec.Code != tt.wantStatus {
				t.Fatalf("status %d, want %d: %s", rec.Code, tt.wantStatus, rec.Body)
			}
			if tt.wantStatus == 200 && rec.Body.String() != "acme/alice" {
				t.Errorf("identity = %q, want acme/alice", rec.Body)
			}
			if tt.wantStatus == 401 && rec.Header().Get("Content-Type") != "application/problem+json" {
				t.Errorf("401 is %q, want a problem document", rec.Header().Get("Content-Type"))
			}
		})
	}
}

// The public dev secret (and with it /dev/token, which mints any tenant
// and user) is implied only when every backend is a throwaway one this
// process made: with DATABASE_URL or REDIS_URL naming real servers and
// no JWT_SECRET, serve refuses to start and says what to set.
func TestDevSecretRefusedWithRealBackends(t *testing.T) {
	t.Parallel()
	dsn := testenv.PostgresDSN(t)
	redisURL := "redis://" + testenv.Redis(t).Addr
	tests := []struct {
		name  string
		given settings
		want  string // in the refusal, beside JWT_SECRET and DEV_MODE
	}{
		{name: "DATABASE_URL and REDIS_URL", given: settings{databaseURL: dsn, redisURL: redisURL}, want: "DATABASE_URL and REDIS_URL"},
		{name: "DATABASE_URL, STORE=postgres", given: settings{databaseURL: dsn, store: "postgres", redisURL: redisURL}, want: "DATABASE_URL names"},
		{name: "DATABASE_URL, in-process miniredis", given: settings{databaseURL: dsn}, want: "DATABASE_URL names"},
		// Refused before a throwaway cluster is made: the listener comes first.
		{name: "throwaway backends on every interface", given: settings{addr: "0.0.0.0:0"}, want: "beyond this machine"},
		{name: "JWT_SECRET and DEV_MODE", given: settings{databaseURL: dsn, jwtSecret: "a-real-secret-of-enough-length-0123456789", dev: true},
			want: "both set"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := tt.given
			if s.addr == "" {
				s.addr = "127.0.0.1:0"
			}
			var stderr strings.Builder
			n, err := startNode(context.Background(), s, slog.New(slog.DiscardHandler), &stderr)
			if err == nil {
				_ = n.shutdown()
				t.Fatalf("started; want a refusal (stderr: %s)", stderr.String())
			}
			if msg := err.Error(); !strings.Contains(msg, "JWT_SECRET") || !strings.Contains(msg, "DEV_MODE") || !strings.Contains(msg, tt.want) {
				t.Errorf("refusal %q does not say what to set (JWT_SECRET, DEV_MODE) and why (%q)", msg, tt.want)
			}
		})
	}
}

// With ADDR unset, serve listens on loopback only: the dev secret must not
// be reachable from the network by default.
func TestServeListensOnLoopbackByDefault(t *testing.T) {
	t.Parallel()
	var stdout, stderr strings.Builder
	if code := run(context.Background(), []string{"serve", "-h"}, func(string) string { return "" }, &stdout, &stderr); code != 0 {
		t.Fatalf("serve -h: exit %d", code)
	}
	if !strings.Contains(stderr.String(), `listen address (env ADDR) (default "localhost:8080")`) {
		t.Errorf("serve -h does not show the loopback default:\n%s", stderr.String())
	}
}
