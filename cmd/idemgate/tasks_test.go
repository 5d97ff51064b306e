package main_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/idemgate/idemgate/internal/testenv"
	"github.com/idemgate/idemgate/pgstore"
)

func TestTasks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := testenv.PostgresDSN(t)
	env := []string{"DATABASE_URL=" + dsn}
	must(t, 0, env, "migrate", "up", "-package", "pgstore")
	s, err := pgstore.New(ctx, pool(t, dsn))
	if err != nil {
		t.Fatal(err)
	}
	task, err := s.Submit(ctx, pgstore.NewTask{Tenant: "acme", Owner: "o", Kind: "images", Runtime: "r", Network: "n",
		IdempotencyKey: "k", Fingerprint: "v1:fp", Params: json.RawMessage(`{"prompt":"a cat"}`)})
	if err != nil {
		t.Fatal(err)
	}
	contains(t, must(t, 0, env, "tasks", "list"), "stdout", task.ID, "images", "pending")
	contains(t, must(t, 0, env, "tasks", "show", task.ID, "-json"), "stdout", `"task_id": "`+task.ID)
	contains(t, must(t, 1, env, "tasks", "show", "00000000-0000-0000-0000-000000000000"), "stderr", "not found")
	contains(t, must(t, 1, env, "tasks", "retry", task.ID), "stderr", "not failed")
	contains(t, must(t, 1, env, "tasks", "pause", "imgaes"), "stderr", `no task or limit has ever named kind "imgaes"`)
	contains(t, must(t, 0, env, "tasks", "pause", "images"), "stdout", "images", "true")
	contains(t, must(t, 0, env, "tasks", "limits", "images", "-max-running", "4", "-json"), "stdout", `"max_running": 4`, `"paused": true`)
	contains(t, must(t, 0, env, "tasks", "resume", "images"), "stdout", "false")
	contains(t, must(t, 2, env, "tasks", "limits", "images", "-max-running", "4x"), "stderr", "not a whole number")
	contains(t, must(t, 0, env, "tasks", "pause", "video", "-new-kind"), "stdout", "video")
	contains(t, must(t, 0, env, "tasks", "cancel", task.ID, "-yes"), "stdout", "cancelled")
}
