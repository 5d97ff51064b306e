package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/fingerprint"
	"github.com/idemgate/idemgate/idemhttp"
	"github.com/idemgate/idemgate/pgstore"
	"github.com/idemgate/idemgate/redisstore"
)

// idemgateHTTPName is net/http + idemhttp on a RedisStore: a ServeMux
// route, the same handler work as the idemgate stack's, compared to the
// same floor, so that its ratios read against the echo middleware's.
const idemgateHTTPName = "idemgate-http"

// newIdemgateHTTP serves a ServeMux + idemhttp on a RedisStore + a handler
// that submits a pgstore task, as the idemgate stack's does on echo.
func newIdemgateHTTP(ctx context.Context, e *env, o options) (*stack, error) {
	tasks, err := e.taskStore(ctx, o)
	if err != nil {
		return nil, err
	}
	st := &stack{name: idemgateHTTPName, floor: floorName, table: tasksTable, keyCol: tasksKeyCol, rt: &roundTrips{}, execs: newExecutions()}
	mw, err := idemhttp.Config{
		Store:       redisstore.New(e.newRedis(2*o.concurrency, st.rt)),
		Scope:       httpHeaderScope,
		Kind:        "images",
		Fingerprint: fingerprint.Spec{Fields: []string{"/prompt", "/aspect_ratio", "/n", "/reference_image"}},
		Required:    true,
		Retention:   retention,
		Lease:       lease,
	}.ToMiddleware()
	if err != nil {
		return nil, err
	}
	h := &httpHandler{tasks: tasks, execs: st.execs}
	mux := http.NewServeMux()
	mux.Handle("POST /v1/images", mw(h))
	st.url, st.close, err = serve(mux)
	return st, err
}

func httpHeaderScope(r *http.Request) (tenant, user string, err error) {
	tenant, user = r.Header.Get("X-Tenant"), r.Header.Get("X-User")
	if tenant == "" || user == "" {
		return "", "", errors.New("no X-Tenant or X-User")
	}
	return tenant, user, nil
}

// httpHandler is idemHandler.submit on net/http.
type httpHandler struct {
	tasks *pgstore.Store
	execs *executions
}

func (h *httpHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	req, ok := idemgate.RequestFromContext(r.Context())
	if !ok {
		http.Error(w, "idempotency middleware missing", http.StatusInternalServerError)
		return
	}
	h.execs.ran(req.Key.String())
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBody))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var in imageRequest
	if err := json.Unmarshal(body, &in); err != nil {
		http.Error(w, "body: "+err.Error(), http.StatusBadRequest)
		return
	}
	if err := in.validate(); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	slowdown(r)
	task, err := h.tasks.Submit(r.Context(), pgstore.NewTask{
		Tenant:         req.Key.Tenant(),
		Owner:          req.Key.Owner(),
		Kind:           req.Key.Kind(),
		Runtime:        taskRuntime,
		Network:        taskNetwork,
		IdempotencyKey: req.Key.Task(),
		Fingerprint:    string(req.Fingerprint),
		Params:         body,
	})
	if errors.Is(err, pgstore.ErrConflict) {
		http.Error(w, "key reused with other parameters", http.StatusConflict)
		return
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	if !task.Duplicate {
		h.execs.created.Add(1)
	}
	out, _ := json.Marshal(accepted{TaskID: task.ID, Status: string(task.State), PollAfterMS: 1000})
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", "/v1/tasks/"+task.ID)
	w.Header().Set("Retry-After", "1")
	w.WriteHeader(http.StatusAccepted)
	w.Write(out)
}
