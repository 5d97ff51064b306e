package middleware

import "github.com/labstack/echo/v4"

// matched reports whether echo matched (or, before routing, will match)
// the request to a route of its method. It is not when echo found no path
// at all, answers 405 (or OPTIONS) for a path that other methods have, or
// runs a RouteNotFound handler — such as the catch-all that Group.Use
// registers so that a group's middleware sees the group's 404s.
func matched(c echo.Context, path string) bool {
	e := c.Echo()
	if e == nil {
		return true // a context made without an Echo: nothing to ask
	}
	r := c.Request()
	router := e.Router()
	if hr, ok := e.Routers()[r.Host]; ok {
		router = hr // echo's own choice of router (Echo.Host)
	}
	if path == "" {
		// Either echo matched nothing, or it has not routed yet: the
		// middleware is registered with e.Pre. Route the request on a
		// context of echo's own pool to tell.
		rc := e.AcquireContext()
		defer e.ReleaseContext(rc)
		rc.Reset(r, nil)
		router.Find(r.Method, echo.GetPath(r), rc)
		if rc.Path() == "" {
			return false
		}
		return matchedRoute(rc, router, r.Method, rc.Path())
	}
	return matchedRoute(c, router, r.Method, path)
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
