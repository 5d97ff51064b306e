package idemhttp_test

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/idemgate/idemgate/idemhttp"
	"github.com/idemgate/idemgate/redisstore"
)

// Protect a ServeMux route: wrap the route's handler, so that the
// middleware sees the pattern the mux chose and the path values. A retry
// replays; the same key for another order is refused.
func Example() {
	mr, _ := miniredis.Run() // use your Redis: redis.NewClient(&redis.Options{Addr: ...})
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()

	mw := idemhttp.New(idemhttp.Config{
		Store: redisstore.New(rdb),
		// Read the identity your auth middleware put in the context;
		// a header stands in for it here.
		Scope: func(r *http.Request) (tenant, user string, err error) {
			tenant, user, ok := strings.Cut(r.Header.Get("X-Demo-Caller"), "/")
			if !ok {
				return "", "", errors.New("unauthenticated")
			}
			return tenant, user, nil
		},
	})
	refunds := 0
	mux := http.NewServeMux()
	mux.Handle("POST /v1/orders/{id}/refund", mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		refunds++
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "refund %d of order %s\n", refunds, r.PathValue("id"))
	})))

	for _, order := range []string{"42", "42", "43"} {
		r := httptest.NewRequest(http.MethodPost, "/v1/orders/"+order+"/refund", strings.NewReader(`{"amount":100}`))
		r.Header.Set("X-Demo-Caller", "acme/alice")
		r.Header.Set("Idempotency-Key", "refund-1")
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, r)
		body, _ := io.ReadAll(w.Body)
		fmt.Printf("%d replayed=%q %s", w.Code, w.Header().Get("Idempotent-Replayed"), strings.SplitN(string(body), ",", 2)[0])
		if w.Code == http.StatusConflict {
			fmt.Println()
		}
	}
	// Output:
	// 201 replayed="" refund 1 of order 42
	// 201 replayed="true" refund 1 of order 42
	// 409 replayed="" {"type":"https://github.com/idemgate/idemgate#key_reused"
}
