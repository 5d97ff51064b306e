package main

import (
	"io"
	"net"
	"strings"
	"testing"
)

// Whether the public dev secret is implied depends on where the listener
// really is, not on how ADDR spells it: ":8080" and "[::]:8080" are every
// interface, "localhost:8080" is loopback.
func TestDevSecretFollowsTheListenersAddress(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		given   string // ADDR
		wantDev bool   // false: refused
	}{
		{name: "port only", given: ":0", wantDev: false},
		{name: "IPv6 unspecified", given: "[::]:0", wantDev: false},
		{name: "IPv4 unspecified", given: "0.0.0.0:0", wantDev: false},
		{name: "localhost", given: "localhost:0", wantDev: true},
		{name: "IPv4 loopback", given: "127.0.0.1:0", wantDev: true},
		{name: "IPv4 loopback, not .1", given: "127.0.0.2:0", wantDev: true},
		{name: "IPv6 loopback", given: "[::1]:0", wantDev: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", tt.given)
			if err != nil {
				t.Skipf("cannot listen on %s here: %v", tt.given, err)
			}
			defer ln.Close()
			_, dev, err := serveSecret(settings{addr: tt.given}, ln.Addr(), io.Discard)
			if dev != tt.wantDev {
				t.Fatalf("ADDR=%s (listening on %s): dev secret %v (%v); want %v", tt.given, ln.Addr(), dev, err, tt.wantDev)
			}
			if !tt.wantDev && (err == nil || !strings.Contains(err.Error(), "JWT_SECRET") || !strings.Contains(err.Error(), "DEV_MODE")) {
				t.Errorf("refusal %v does not say what to set", err)
			}
		})
	}
}

// The startup warning prints the public dev secret; an operator who
// copies it into JWT_SECRET serves real backends with a secret anyone can
// read. It counts as the dev secret: refused beside real backends or
// beyond loopback unless DEV_MODE says so.
func TestPublicDevSecretInJWTSecretIsDevMode(t *testing.T) {
	t.Parallel()
	loopback := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 8080}
	everywhere := &net.TCPAddr{IP: net.IPv6unspecified, Port: 8080}
	tests := []struct {
		name    string
		given   settings
		listen  net.Addr
		wantErr bool
		wantDev bool
	}{
		{name: "real database", given: settings{jwtSecret: devSecret, databaseURL: "postgres://db.example/app"}, listen: loopback, wantErr: true},
		{name: "real redis", given: settings{jwtSecret: devSecret, redisURL: "redis://cache.example:6379"}, listen: loopback, wantErr: true},
		{name: "every interface", given: settings{jwtSecret: devSecret}, listen: everywhere, wantErr: true},
		{name: "DEV_MODE too", given: settings{jwtSecret: devSecret, dev: true, databaseURL: "postgres://db.example/app"}, listen: everywhere, wantDev: true},
		{name: "throwaway backends on loopback", given: settings{jwtSecret: devSecret}, listen: loopback, wantDev: true},
		{name: "a secret of the operator's", given: settings{jwtSecret: "an-operators-own-secret-0123456789", databaseURL: "postgres://db.example/app"}, listen: everywhere},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, dev, err := serveSecret(tt.given, tt.listen, io.Discard)
			if (err != nil) != tt.wantErr || dev != tt.wantDev {
				t.Fatalf("dev %v, err %v; want dev %v, refused %v", dev, err, tt.wantDev, tt.wantErr)
			}
			if err != nil && (!strings.Contains(err.Error(), "JWT_SECRET") || !strings.Contains(err.Error(), "DEV_MODE")) {
				t.Errorf("refusal %v does not say what to set", err)
			}
		})
	}
}
