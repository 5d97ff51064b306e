package pgrecords_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/labstack/echo/v4"

	"github.com/idemgate/idemgate/internal/testenv"
	"github.com/idemgate/idemgate/middleware"
	"github.com/idemgate/idemgate/pgrecords"
	"github.com/idemgate/idemgate/pgstore"
)

// An Atomic route: the handler's own row, its task and the stored answer
// commit in one transaction, or none of them does. The retry replays the
// answer; nothing runs twice.
func ExampleTxFromContext() {
	databaseURL, drop := testenv.ExampleDatabase() // yours: os.Getenv("DATABASE_URL")
	defer drop()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, databaseURL)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close() // before drop
	records, err := pgrecords.New(ctx, pool)
	if err != nil {
		log.Fatal(err)
	}
	tasks, err := pgstore.New(ctx, pool)
	if err != nil {
		log.Fatal(err)
	}
	for _, migrate := range []func(context.Context) error{records.Migrate, tasks.Migrate} {
		if err := migrate(ctx); err != nil {
			log.Fatal(err)
		}
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE exports (id bigserial PRIMARY KEY, report text NOT NULL)`); err != nil {
		log.Fatal(err)
	}

	e := echo.New()
	e.POST("/v1/exports", func(c echo.Context) error {
		ctx := c.Request().Context()
		tx := pgrecords.TxFromContext(ctx) // the request's transaction
		var in struct {
			Report string `json:"report"`
		}
		if err := c.Bind(&in); err != nil {
			return err
		}
		var id int64
		if err := tx.QueryRow(ctx, `INSERT INTO exports (report) VALUES ($1) RETURNING id`, in.Report).Scan(&id); err != nil {
			return err
		}
		req, _ := middleware.FromContext(c)
		task, err := tasks.SubmitTx(ctx, tx, pgstore.NewTask{
			Tenant: req.Key.Tenant(), Owner: req.Key.Owner(), Kind: "export", Runtime: "cpu", Network: "main",
			IdempotencyKey: req.Key.Task(), Fingerprint: string(req.Fingerprint),
			Params: json.RawMessage(fmt.Sprintf(`{"export":%d}`, id)),
		})
		if err != nil {
			return err
		}
		return c.JSON(http.StatusAccepted, map[string]any{"export": id, "task": task.ID != ""})
	}, middleware.New(middleware.Config{
		Store:  records,
		Scope:  func(echo.Context) (string, string, error) { return "acme", "alice", nil }, // yours: from the auth layer
		Kind:   "export",
		Atomic: true,
	}))

	for range 2 {
		r := httptest.NewRequest(http.MethodPost, "/v1/exports", strings.NewReader(`{"report":"q3"}`))
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("Idempotency-Key", "export-q3")
		w := httptest.NewRecorder()
		e.ServeHTTP(w, r)
		fmt.Printf("%d replayed=%q %s", w.Code, w.Header().Get("Idempotent-Replayed"), w.Body)
	}
	var exports, queued int
	_ = pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM exports), (SELECT count(*) FROM idemgate_tasks)`).Scan(&exports, &queued)
	fmt.Println("exports:", exports, "tasks:", queued)
	// Output:
	// 202 replayed="" {"export":1,"task":true}
	// 202 replayed="true" {"export":1,"task":true}
	// exports: 1 tasks: 1
}
