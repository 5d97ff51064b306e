// Package pgdsn edits PostgreSQL connection strings for the tools that
// make databases of their own beside the one they are given.
package pgdsn

import "strings"

// WithDatabase returns dsn (a postgres:// URL or a key=value string)
// naming database name instead of its own.
func WithDatabase(dsn, name string) string {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		head, query, _ := strings.Cut(dsn, "?")
		scheme, rest, _ := strings.Cut(head, "://")
		host, _, _ := strings.Cut(rest, "/")
		out := scheme + "://" + host + "/" + name
		if query != "" {
			out += "?" + query
		}
		return out
	}
	return dsn + " dbname=" + name
}
