package client_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"

	"github.com/idemgate/idemgate/client"
)

// payments stands in for an idemgate-protected API: the first request
// with an id is accepted (202, a payment to poll), the same id with the same
// body replays, the same id with another body is a key_reused conflict.
func payments() *httptest.Server {
	var mu sync.Mutex
	bodies := map[string]string{}
	polls := 0
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		switch r.Method + " " + r.URL.Path {
		case "POST /v1/invoices/7/payments":
			b, _ := io.ReadAll(r.Body)
			key := r.Header.Get("Idempotency-Key")
			if prev, ok := bodies[key]; ok && prev != string(b) {
				w.Header().Set("Content-Type", "application/problem+json")
				w.Header().Set("X-Should-Retry", "false")
				w.WriteHeader(http.StatusConflict)
				fmt.Fprint(w, `{"status":409,"title":"Idempotency key reused","code":"key_reused","changed":["/amount"]}`)
				return
			}
			if _, ok := bodies[key]; ok {
				w.Header().Set("Idempotent-Replayed", "true")
			}
			bodies[key] = string(b)
			w.Header().Set("Location", "/v1/payments/p1")
			w.WriteHeader(http.StatusAccepted)
			fmt.Fprint(w, `{"id":"p1","status":"pending"}`)
		case "GET /v1/payments/p1":
			polls++
			if polls < 2 {
				fmt.Fprint(w, `{"id":"p1","status":"pending"}`)
				return
			}
			fmt.Fprint(w, `{"id":"p1","status":"settled"}`)
		default:
			http.NotFound(w, r)
		}
	}))
}

type payment struct {
	Amount   int    `json:"amount"`
	Currency string `json:"currency"`
}

func Example() {
	srv := payments()
	defer srv.Close()
	ctx := context.Background()
	c := client.New(client.Config{
		BaseURL: srv.URL,
		Header:  http.Header{"Authorization": {"Bearer dev-token"}},
	})

	// Rule 1: the id names the business action; every retry reuses it.
	pay := payment{Amount: 1200, Currency: "EUR"}
	id := client.RequestID("invoice:7:pay", pay)
	r, err := c.Send(ctx, http.MethodPost, "/v1/invoices/7/payments", id, pay)
	if err != nil {
		fmt.Println("error:", err)
		return
	}
	// A 202 is a promise: poll what it names, never send again under a new id.
	var p struct{ Status string }
	_, err = c.Poll(ctx, r.Location(), r.RetryAfter(), func(r *client.Response) (bool, error) {
		err := r.Decode(&p)
		return p.Status != "pending", err
	})
	fmt.Println(r.Status, p.Status, err)

	// Sending the same action again replays the first answer.
	r, _ = c.Send(ctx, http.MethodPost, "/v1/invoices/7/payments", id, pay)
	fmt.Println("again:", r.Status, "replayed:", r.Replayed)

	// Rule 3: the same id with other parameters is refused, not retried.
	more := payment{Amount: 1300, Currency: "EUR"}
	_, err = c.Send(ctx, http.MethodPost, "/v1/invoices/7/payments", id, more)
	fmt.Println("same id, other amount:", errors.Is(err, client.ErrKeyReused), err)

	// Rule 2: changed parameters get a new id.
	fmt.Println("new id:", client.RequestID("invoice:7:pay", more) != id)
	// Output:
	// 202 settled <nil>
	// again: 202 replayed: true
	// same id, other amount: true client: 409 key_reused: Idempotency key reused (changed: /amount)
	// new id: true
}
