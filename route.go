package idemgate

import (
	"net/http"

	"github.com/idemgate/idemgate/fingerprint"
	"github.com/idemgate/idemgate/keyspace"
)

type routeKey struct{ method, path string }

// route is what the engine derives once per method and route template.
type route struct {
	routeKey
	name   string // "POST /v1/images"
	kind   string
	target fingerprint.Route
}

// route returns the route of the request and its template, or nil when
// the router matched it to no route of its method (Door.Matched): a 404
// or a 405 is the router's to answer, and with the engine on the whole app
// it must not claim a key for it, nor read its body. Only matched routes
// are cached: what a request is matched to is bounded by the routes, and
// a route registered after a 404 for its path is protected from its first
// request on.
func (m *Engine) route(r *http.Request, d Door, x any) (*route, string) {
	k := routeKey{r.Method, d.Route(r, x)}
	if rt := m.last.Load(); rt != nil && rt.routeKey == k && k.path != "" {
		return rt, k.path
	}
	m.mu.Lock()
	rt := m.routes[k]
	m.mu.Unlock()
	if rt == nil || k.path == "" {
		if !d.Matched(r, x, k.path) {
			return nil, k.path
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
	return rt, k.path
}
