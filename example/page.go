package main

import (
	"embed"
	"io/fs"
	"net/http"
	"strings"
	"time"

	"github.com/labstack/echo/v4"
)

// web holds the page at GET /: plain HTML, CSS and JavaScript, served as
// they are (no build step).
//
//go:embed web
var web embed.FS

// devTokenTTL is the lifetime of a token minted for the page.
const devTokenTTL = 2 * time.Hour

// registerPage serves the page at GET / and its assets under /web/. With
// devSecret (the public dev secret, used only when JWT_SECRET is unset) it
// also serves POST /dev/token, which mints a token for any tenant and user
// so that the page can sign in. That endpoint gives away nothing the dev
// secret does not already give; with a real JWT_SECRET it does not exist
// and the page asks for a token made with "example token".
func registerPage(e *echo.Echo, devSecret []byte) {
	assets, _ := fs.Sub(web, "web") // cannot fail: web is embedded above
	files := http.FileServer(http.FS(assets))
	index, _ := fs.ReadFile(assets, "index.html") // embedded: cannot fail
	e.GET("/", func(c echo.Context) error {
		c.Response().Header().Set("Cache-Control", "no-cache")
		return c.HTMLBlob(http.StatusOK, index)
	})
	e.GET("/web/*", echo.WrapHandler(http.StripPrefix("/web/", noCache(files))))
	if devSecret != nil {
		e.POST("/dev/token", devToken(devSecret))
	}
}

// noCache makes the browser revalidate the assets, so an edited page shows
// at once during development.
func noCache(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "no-cache")
		h.ServeHTTP(w, r)
	})
}

// devTokenRequest is the body of POST /dev/token.
type devTokenRequest struct {
	Tenant string `json:"tenant"`
	User   string `json:"user"`
}

// devToken mints a dev token for the page's sign-in.
func devToken(secret []byte) echo.HandlerFunc {
	return func(c echo.Context) error {
		var req devTokenRequest
		if err := decodeStrict(c, &req); err != nil {
			return err
		}
		req.Tenant, req.User = strings.TrimSpace(req.Tenant), strings.TrimSpace(req.User)
		if req.Tenant == "" || req.User == "" || len(req.Tenant) > 255 || len(req.User) > 255 {
			return invalid("tenant and user must be non-empty, at most 255 bytes")
		}
		now := time.Now()
		tok, err := mintToken(secret, req.Tenant, req.User, now, devTokenTTL)
		if err != nil {
			return err
		}
		c.Response().Header().Set("Cache-Control", "no-store")
		return c.JSON(http.StatusOK, map[string]string{
			"token":      tok,
			"expires_at": now.Add(devTokenTTL).UTC().Format(time.RFC3339),
		})
	}
}

// withPage adds the page, and the server spans of o, to the API's echo.
// dev says the secret is the public dev secret: only then may the page
// mint its own token.
func withPage(e *echo.Echo, o *observer, secret []byte, dev bool) *echo.Echo {
	o.instrument(e)
	if !dev {
		secret = nil
	}
	registerPage(e, secret)
	return e
}
