// Package routertest holds the tested recipes of idemhttp on chi and
// gorilla/mux: each router's way to give idemhttp the route template and
// the path values (Config.Route), and each runs the doors' behaviour suite
// (internal/doortest), as echo and net/http's ServeMux do. It is a module
// of its own, so that the library's go.mod names neither router.
package routertest
