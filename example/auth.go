package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"
	echojwt "github.com/labstack/echo-jwt/v4"
	"github.com/labstack/echo/v4"
)

// devSecret is the JWT secret when JWT_SECRET is unset. It is public (it is
// in this file), so anyone can mint tokens with it.
const devSecret = "idemgate-dev-secret-do-not-use-in-production"

// secretOrDev returns the configured secret, or the dev secret with a loud
// warning on w.
func secretOrDev(secret string, w io.Writer) []byte {
	if secret != "" {
		return []byte(secret)
	}
	fmt.Fprintf(w, "WARNING: JWT_SECRET is not set: using the public dev secret %q.\n"+
		"WARNING: anyone can mint tokens with it. Set JWT_SECRET anywhere but your laptop.\n", devSecret)
	return []byte(devSecret)
}

// serveSecret returns the secret a serving process verifies tokens with,
// and whether it is the public dev secret (then the page mints tokens at
// /dev/token). The dev secret lets anyone act as any tenant, so without
// JWT_SECRET it is used only when asked for (DEV_MODE) or when nothing
// of value can be reached: every backend a throwaway one this process
// made, and the API on loopback, where only this machine can call it.
// Otherwise serving is refused with what to set.
//
// JWT_SECRET set to the dev secret itself (the startup warning prints it,
// so it is easy to copy) is the dev secret under the same rule: it is
// public whichever variable carries it.
func serveSecret(s settings, listen net.Addr, w io.Writer) (secret []byte, dev bool, err error) {
	if s.jwtSecret == devSecret {
		s.jwtSecret = ""
	}
	switch {
	case s.jwtSecret != "" && s.dev:
		return nil, false, errors.New("JWT_SECRET and DEV_MODE (-dev) are both set: unset DEV_MODE to verify tokens with JWT_SECRET")
	case s.jwtSecret != "":
		return []byte(s.jwtSecret), false, nil
	case s.dev:
		return secretOrDev("", w), true, nil
	}
	var real []string
	if s.databaseURL != "" {
		real = append(real, "DATABASE_URL")
	}
	if s.redisURL != "" && s.store != "postgres" {
		real = append(real, "REDIS_URL")
	}
	if len(real) > 0 {
		return nil, false, fmt.Errorf("JWT_SECRET is not set and %s names a server of yours: with the public dev secret "+
			"anyone could mint tokens for any tenant. Set JWT_SECRET to a secret of your own, "+
			"or DEV_MODE=1 (-dev) to use the public dev secret anyway", strings.Join(real, " and "))
	}
	if tcp, ok := listen.(*net.TCPAddr); !ok || !tcp.IP.IsLoopback() {
		return nil, false, fmt.Errorf("JWT_SECRET is not set and the API listens on %s, beyond this machine: with the public "+
			"dev secret anyone who reaches it could mint tokens. Set JWT_SECRET to a secret of your own, listen on "+
			"loopback (ADDR=%s), or set DEV_MODE=1 (-dev) to use the public dev secret anyway", listen, defaultAddr)
	}
	return secretOrDev("", w), true, nil
}

// claims are the token claims the service reads: the tenant, the user (sub)
// and the expiry.
type claims struct {
	Tenant string `json:"tenant"`
	jwt.RegisteredClaims
}

// mintToken returns an HS256 token for tenant and user, valid for ttl.
func mintToken(secret []byte, tenant, user string, now time.Time, ttl time.Duration) (string, error) {
	c := claims{
		Tenant: tenant,
		RegisteredClaims: jwt.RegisteredClaims{
			Subject:   user,
			IssuedAt:  jwt.NewNumericDate(now),
			ExpiresAt: jwt.NewNumericDate(now.Add(ttl)),
		},
	}
	s, err := jwt.NewWithClaims(jwt.SigningMethodHS256, c).SignedString(secret)
	if err != nil {
		return "", fmt.Errorf("sign token: %w", err)
	}
	return s, nil
}

// errNoIdentity is a verified token without a tenant or a subject.
var errNoIdentity = errors.New("token has no tenant or sub claim")

// authMiddleware verifies bearer tokens with echo-jwt: HS256 only, exp
// required, tenant and sub non-empty. Failures are 401 problems.
func authMiddleware(secret []byte) echo.MiddlewareFunc {
	parser := jwt.NewParser(
		jwt.WithValidMethods([]string{jwt.SigningMethodHS256.Alg()}),
		jwt.WithExpirationRequired(),
	)
	return echojwt.WithConfig(echojwt.Config{
		ParseTokenFunc: func(c echo.Context, auth string) (any, error) {
			var cl claims
			tok, err := parser.ParseWithClaims(auth, &cl, func(*jwt.Token) (any, error) { return secret, nil })
			if err != nil {
				return nil, err
			}
			if cl.Tenant == "" || cl.Subject == "" {
				return nil, errNoIdentity
			}
			return tok, nil
		},
		ErrorHandler: func(c echo.Context, err error) error {
			c.Response().Header().Set("WWW-Authenticate", `Bearer realm="idemgate-example"`)
			detail := "missing bearer token"
			var perr *echojwt.TokenParsingError
			if errors.As(err, &perr) {
				detail = "invalid token: " + perr.Err.Error()
			}
			return &problem{Status: http.StatusUnauthorized, Code: "unauthorized", Detail: detail}
		},
	})
}

// identity returns the tenant and user of the verified token on c.
func identity(c echo.Context) (tenant, user string, err error) {
	tok, ok := c.Get("user").(*jwt.Token)
	if !ok {
		return "", "", &problem{Status: http.StatusUnauthorized, Code: "unauthorized", Detail: "no verified token"}
	}
	cl, ok := tok.Claims.(*claims)
	if !ok || cl.Tenant == "" || cl.Subject == "" {
		return "", "", &problem{Status: http.StatusUnauthorized, Code: "unauthorized", Detail: errNoIdentity.Error()}
	}
	return cl.Tenant, cl.Subject, nil
}

// cmdToken prints a dev token.
func cmdToken(args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := newFlagSet("token", "Prints an HS256 bearer token signed with JWT_SECRET (or the dev secret).\n"+
		"  TOKEN=$(go run ./example token -tenant acme -user alice)", stderr)
	tenant := fs.String("tenant", "acme", "tenant claim")
	user := fs.String("user", "alice", "sub claim: the user")
	ttl := fs.Duration("ttl", 24*time.Hour, "lifetime of the token")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *tenant == "" || *user == "" {
		return errors.New("-tenant and -user must not be empty")
	}
	tok, err := mintToken(secretOrDev(getenv("JWT_SECRET"), stderr), *tenant, *user, time.Now(), *ttl)
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, tok)
	return nil
}
