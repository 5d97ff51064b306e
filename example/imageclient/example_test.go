package imageclient_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"

	"github.com/idemgate/idemgate/example/imageclient"
)

// A stand-in for the example service: one task per request id, a 409
// key_reused when an id comes back with another body, and the task done on
// the second poll. (The real service is `go run ./example`.)
func fakeService() *httptest.Server {
	var mu sync.Mutex
	bodies := map[string]string{}
	polls := 0
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		switch r.Method + " " + r.URL.Path {
		case "POST /v1/images":
			var b [512]byte
			n, _ := r.Body.Read(b[:])
			key := r.Header.Get("Idempotency-Key")
			if prev, ok := bodies[key]; ok && prev != string(b[:n]) {
				w.Header().Set("Content-Type", "application/problem+json")
				w.WriteHeader(http.StatusConflict)
				fmt.Fprint(w, `{"status":409,"title":"Conflict","code":"key_reused"}`)
				return
			}
			bodies[key] = string(b[:n])
			w.Header().Set("Location", "/v1/tasks/t1")
			w.WriteHeader(http.StatusAccepted)
			fmt.Fprint(w, `{"task_id":"t1","status":"pending","poll_after_ms":10}`)
		case "GET /v1/tasks/t1":
			polls++
			if polls < 2 {
				fmt.Fprint(w, `{"task_id":"t1","status":"running","poll_after_ms":10}`)
				return
			}
			fmt.Fprint(w, `{"task_id":"t1","status":"succeeded","images":["data:image/png;base64,iVBORw0KGgo="]}`)
		default:
			http.NotFound(w, r)
		}
	}))
}

func Example() {
	srv := fakeService()
	defer srv.Close()
	ctx := context.Background()
	c := imageclient.New(imageclient.Config{BaseURL: srv.URL, Token: "dev-token"})

	// Rule 1: the id names the business action; retries reuse it.
	req := imageclient.ImageRequest{Prompt: "a lighthouse at dawn", AspectRatio: "16:9", N: 1}
	id := imageclient.RequestID("poster:launch", req)
	task, err := c.GenerateImages(ctx, id, req)
	if err != nil {
		fmt.Println("error:", err)
		return
	}
	fmt.Println(task.Status, len(task.Images), "image")

	// Rule 3: reusing the id for other parameters is refused, not retried.
	reworded := req
	reworded.Prompt = "a lighthouse at dusk"
	_, err = c.SubmitImages(ctx, id, reworded)
	fmt.Println("same id, reworded prompt:", errors.Is(err, imageclient.ErrKeyReused))

	// Rule 2: changed parameters get a new id.
	fmt.Println("new id:", imageclient.RequestID("poster:launch", reworded) != id)
	// Output:
	// succeeded 1 image
	// same id, reworded prompt: true
	// new id: true
}
