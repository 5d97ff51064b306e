package middleware

import (
	"github.com/labstack/echo/v4"

	"github.com/idemgate/idemgate/fingerprint"
	"github.com/idemgate/idemgate/keyspace"
)

type routeKey struct{ method, path string }

// route is what the middleware derives once per method and route template.
type route struct {
	routeKey
	name   string // "POST /v1/images"
	kind   string
	target fingerprint.Route
}

// route returns the route of the request, or nil when echo matched it to
// no route of its method: a 404 or a 405 is echo's to answer, and with the
// middleware on the whole app (e.Use) it must not claim a key for it, nor
// read its body. Only matched routes are cached: what a request is matched
// to is bounded by the routes, and a route registered after a 404 for its
// path is protected from its first request on.
func (m *idem) route(c echo.Context) *route {
	k := routeKey{c.Request().Method, c.Path()}
	if rt := m.last.Load(); rt != nil && rt.routeKey == k && k.path != "" {
		return rt
	}
	m.mu.Lock()
	rt := m.routes[k]
	m.mu.Unlock()
	if rt == nil || k.path == "" {
		if !matched(c, k) {
			return nil
		}
	}
	if rt == nil {
		m.mu.Lock()
		if rt = m.routes[k]; rt == nil {
			rt = &route{routeKey: k, name: k.method + " " + k.path, kind: m.cfg.Kind, target: fingerprint.NewRoute(k.method, k.path)}
			if rt.kind == "" {
				rt.kind = keyspace.KindFor(k.method, k.path)
			}
			m.routes[k] = rt
		}
		m.mu.Unlock()
	}
	m.last.Store(rt)
	return rt
}

// matched reports whether echo matched (or, before routing, will match)
// the request to a route of its method. It is not when echo found no path
// at all, answers 405 (or OPTIONS) for a path that other methods have, or
// runs a RouteNotFound handler — such as the catch-all that Group.Use
// registers so that a group's middleware sees the group's 404s.
func matched(c echo.Context, k routeKey) bool {
	e := c.Echo()
	if e == nil {
		return true // a context made without an Echo: nothing to ask
	}
	r := c.Request()
	router := e.Router()
	if hr, ok := e.Routers()[r.Host]; ok {
		router = hr // echo's own choice of router (Echo.Host)
	}
	if k.path == "" {
		// Either echo matched nothing, or it has not routed yet: the
		// middleware is registered with e.Pre. Route the request on a
		// context of echo's own pool to tell.
		rc := e.AcquireContext()
		defer e.ReleaseContext(rc)
		rc.Reset(r, nil)
		router.Find(k.method, echo.GetPath(r), rc)
		if rc.Path() == "" {
			return false
		}
		return matchedRoute(rc, router, k.method, rc.Path())
	}
	return matchedRoute(c, router, k.method, k.path)
}

// matchedRoute reports whether c, routed to path, runs a handler of
// method's rather than echo's 405 or a RouteNotFound handler.
func matchedRoute(c echo.Context, router *echo.Router, method, path string) bool {
	if c.Get(echo.ContextKeyHeaderAllow) != nil {
		return false // echo's 405, or its answer to OPTIONS: the path has no route of this method
	}
	notFound := false
	for _, r := range router.Routes() {
		if r.Path != path {
			continue
		}
		switch r.Method {
		case method:
			return true
		case echo.RouteNotFound:
			notFound = true
		}
	}
	// A route added with Router.Add is not listed: one that is not a
	// RouteNotFound path is taken to be matched.
	return !notFound
}
