package main

import (
	"net/http"
	"strings"
	"testing"
)

// storedRecords counts the idempotency records miniredis keeps for tenant.
func storedRecords(keys []string, tenant string) int {
	n := 0
	for _, k := range keys {
		if strings.HasPrefix(k, "idem:"+tenant+":") {
			n++
		}
	}
	return n
}

// Every stored answer under a new key counts against the tenant's limit,
// whoever of its users sends it and whatever the answer: a 400 for a bad
// body or a 404 for another's task is stored for a day as a 202 is. So a
// tenant's users together, mixing routes and bad requests, never get more
// stored answers than the limit.
func TestTenantLimitCountsEveryStoredAnswer(t *testing.T) {
	t.Parallel()
	n, mr := newLimitedNode(t, tenantLimit{PerMinute: 0.1 / 60, Burst: 1}, tenantLimit{PerMinute: 0.1 / 60, Burst: 3})
	tests := []struct {
		name       string
		user, path string
		key, body  string
		want       int
	}{
		{name: "bad body", user: "alice", path: "/v1/images", key: "b:1", body: `{"prompt":""}`, want: http.StatusBadRequest},
		{name: "unknown field", user: "bob", path: "/v1/music", key: "b:2", body: `{"prompt":"x","tempo":3}`, want: http.StatusBadRequest},
		{name: "a real one", user: "carol", path: "/v1/images", key: "b:3", body: `{"prompt":"a cat"}`, want: http.StatusAccepted},
		{name: "another user, over", user: "dave", path: "/v1/music", key: "b:4", body: `{"prompt":"x"}`, want: http.StatusTooManyRequests},
		{name: "bad body, over", user: "erin", path: "/v1/images", key: "b:5", body: `{"prompt":""}`, want: http.StatusTooManyRequests},
		{name: "export of no task", user: "alice", path: "/v1/tasks/00000000-0000-0000-0000-000000000000/export", key: "e:1", want: http.StatusNotFound},
		{name: "export of no task, over", user: "bob", path: "/v1/tasks/00000000-0000-0000-0000-000000000001/export", key: "e:2", want: http.StatusTooManyRequests},
	}
	for _, tt := range tests {
		code, v := n.doAs(t, "acme", tt.user, http.MethodPost, tt.path, tt.key, tt.body)
		if code != tt.want {
			t.Errorf("%s: %d %v; want %d", tt.name, code, v, tt.want)
		}
	}
	if got, limit := storedRecords(mr.Keys(), "acme"), 3+1; got > limit {
		t.Errorf("tenant acme has %d stored records; its limits allow %d", got, limit)
	}
}
