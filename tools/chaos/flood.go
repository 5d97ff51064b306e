package main

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/idemgate/idemgate/example/imageclient"
)

// floodBurst is how many tasks the flooding tenant submits at once: far
// more than the workers run at once, so that without fair claiming every
// other tenant's task would wait behind the whole burst.
const floodBurst = 30

// flooder is the flood mode's client: one identity of floodTenant that
// submits a burst, waits until the burst has ended, and submits another.
type flooder struct {
	*player
}

func (w *workload) newFlooder() (*flooder, error) {
	p := &player{w: w, n: w.clients, tenant: floodTenant, user: "flooder", rng: newRand(w.seed, uint64(w.clients))}
	tok, err := mintToken(w.secret, p.tenant, p.user)
	if err != nil {
		return nil, fmt.Errorf("chaos: token for the flooder: %w", err)
	}
	p.token = tok
	p.http = &http.Client{Timeout: w.patience, Transport: &recording{rec: w.rec, base: w.transport, acks: w.acks, aims: w.aims}}
	for _, u := range w.nodes {
		p.cl = append(p.cl, imageclient.New(imageclient.Config{
			BaseURL: u, Token: tok, HTTPClient: p.http,
			MaxAttempts: 4, MinBackoff: 50 * time.Millisecond, MaxBackoff: time.Second,
		}))
	}
	return &flooder{p}, nil
}

// flood submits bursts until the workload stops starting actions. Each
// submit is an action that ends when it is accepted; the burst's tasks
// are then watched until none is waiting or running.
func (f *flooder) flood(ctx context.Context) {
	for burst := 1; time.Now().Before(f.w.stopNew) && ctx.Err() == nil; burst++ {
		sleep(ctx, time.Second+time.Duration(f.rng.IntN(3000))*time.Millisecond)
		var ids []string
		for i := range floodBurst {
			if !time.Now().Before(f.w.stopNew) {
				break
			}
			key := fmt.Sprintf("flood:%d:%d", burst, i)
			req := imageclient.ImageRequest{Prompt: fmt.Sprintf("flood %d/%d", burst, i), AspectRatio: "1:1", N: 1}
			actx, a := f.newAction(ctx, key, "flood")
			sub, outcome, detail := f.submit(actx, key, req)
			if outcome == "" {
				a.TaskID, outcome = sub.TaskID, "accepted"
				ids = append(ids, sub.TaskID)
			}
			f.end(a, outcome, detail)
		}
		// Wait for the burst to drain before the next: the flood is a
		// backlog, not an ever-growing queue the run could not finish.
		for _, id := range ids {
			for time.Now().Before(f.w.stopNew) && ctx.Err() == nil {
				t, err := f.cl[f.rng.IntN(len(f.cl))].Task(ctx, id)
				if err == nil && t.Status != "pending" && t.Status != "running" && t.Status != "retrying" {
					break
				}
				sleep(ctx, 500*time.Millisecond)
			}
		}
	}
}
