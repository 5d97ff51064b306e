package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"image/png"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/labstack/echo/v4"
)

func ptr[T any](v T) *T { return &v }

func TestImageRequestValidate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		given   imageRequest
		want    imageParams
		wantErr bool
	}{
		{name: "defaults", given: imageRequest{Prompt: "a cat"}, want: imageParams{Prompt: "a cat", AspectRatio: "1:1", N: 1}},
		{name: "all fields", given: imageRequest{Prompt: "a cat", AspectRatio: ptr("9:16"), N: ptr(4),
			ReferenceImage: "https://example.com/ref.png", ClientNote: "hi"},
			want: imageParams{Prompt: "a cat", AspectRatio: "9:16", N: 4, ReferenceImage: "https://example.com/ref.png"}},
		{name: "blank prompt", given: imageRequest{Prompt: "  "}, wantErr: true},
		{name: "explicit n 0", given: imageRequest{Prompt: "a cat", N: ptr(0)}, wantErr: true},
		{name: "n 5", given: imageRequest{Prompt: "a cat", N: ptr(5)}, wantErr: true},
		{name: "unknown aspect", given: imageRequest{Prompt: "a cat", AspectRatio: ptr("2:1")}, wantErr: true},
		{name: "reference not a URL", given: imageRequest{Prompt: "a cat", ReferenceImage: "/etc/passwd"}, wantErr: true},
		{name: "reference data URL", given: imageRequest{Prompt: "a cat", ReferenceImage: "data:image/png;base64,AA=="},
			want: imageParams{Prompt: "a cat", AspectRatio: "1:1", N: 1, ReferenceImage: "data:image/png;base64,AA=="}},
		{name: "invalid UTF-8", given: imageRequest{Prompt: "a \xff cat"}, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := tt.given.validate()
			if tt.wantErr {
				var p *problem
				if !errors.As(err, &p) || p.Status != http.StatusBadRequest {
					t.Fatalf("validate() error = %v, want a 400 problem", err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("validate() = %+v, %v; want %+v", got, err, tt.want)
			}
		})
	}
}

func TestGenerator(t *testing.T) {
	t.Parallel()
	g := generator{}
	tests := []struct {
		name      string
		given     imageParams
		whenFrom  int
		wantN     int
		wantErr   error
		wantParts int // images kept by a partial failure
	}{
		{name: "n images", given: imageParams{Prompt: "a cat", AspectRatio: "4:3", N: 3}, wantN: 3},
		{name: "fail", given: imageParams{Prompt: "a cat #fail", AspectRatio: "1:1", N: 1}, wantErr: errUpstreamRefused},
		{name: "timeout", given: imageParams{Prompt: "#timeout a cat", AspectRatio: "1:1", N: 1}, wantErr: errUpstreamTimeout},
		{name: "empty", given: imageParams{Prompt: "a cat #empty", AspectRatio: "1:1", N: 2}, wantN: 0},
		{name: "partial fails after one", given: imageParams{Prompt: "a cat #partial", AspectRatio: "1:1", N: 3}, wantParts: 1},
		{name: "partial resumed completes", given: imageParams{Prompt: "a cat #partial", AspectRatio: "1:1", N: 3}, whenFrom: 1, wantN: 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := g.generate(context.Background(), tt.given, tt.whenFrom)
			var partial *partialError
			switch {
			case tt.wantErr != nil:
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("err = %v, want %v", err, tt.wantErr)
				}
			case tt.wantParts > 0:
				if !errors.As(err, &partial) || len(partial.made) != tt.wantParts {
					t.Fatalf("err = %v, want a partial failure with %d images", err, tt.wantParts)
				}
			case err != nil || len(got) != tt.wantN:
				t.Fatalf("generate = %d images, %v; want %d", len(got), err, tt.wantN)
			}
			for i, b := range got {
				if _, err := png.Decode(bytes.NewReader(b)); err != nil {
					t.Errorf("image %d is not a PNG: %v", i, err)
				}
			}
		})
	}
}

func TestRenderPNGIsDeterministic(t *testing.T) {
	t.Parallel()
	p := imageParams{Prompt: "a lighthouse", AspectRatio: "16:9", N: 1}
	a, _ := renderPNG(p, 0)
	b, _ := renderPNG(p, 0)
	if !bytes.Equal(a, b) {
		t.Fatal("same parameters rendered different bytes")
	}
	for _, other := range []imageParams{
		{Prompt: "a lighthouse ", AspectRatio: "16:9"},
		{Prompt: "a lighthouse", AspectRatio: "16:9", ReferenceImage: "https://example.com/x.png"},
	} {
		c, _ := renderPNG(other, 0)
		if bytes.Equal(a, c) {
			t.Errorf("%+v rendered the same bytes as %+v", other, p)
		}
	}
	if second, _ := renderPNG(p, 1); bytes.Equal(a, second) {
		t.Error("image 1 equals image 0")
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

// The stand-in generator draws real PNGs, deterministic from the
// parameters: the same prompt always gives the same bytes.
func Example_renderPNG() {
	p := imageParams{Prompt: "a lighthouse at dawn", AspectRatio: "16:9", N: 1}
	a, _ := renderPNG(p, 0)
	b, _ := renderPNG(p, 0)
	img, _ := png.Decode(bytes.NewReader(a))
	fmt.Println(img.Bounds().Size(), bytes.Equal(a, b))
	// Output: (160,90) true
}
