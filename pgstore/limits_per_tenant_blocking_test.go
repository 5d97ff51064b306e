//go:build review

package pgstore

import (
	"context"
	"fmt"
	"testing"
)

// MaxRunningPerTenant must hold a tenant back, not the kind: while tenant
// A's high-priority backlog waits on A's per-tenant limit, free slots go
// to tenant B's lower-priority tasks (B is within its own limit). The
// claim reads only @limit candidates in claim order, so A's backlog fills
// the window, every candidate but A's allowed ones is rejected, and B is
// never looked at.
func TestReviewPerTenantLimitDoesNotBlockOtherTenants(t *testing.T) {
	t.Parallel()
	for _, shape := range claimShapes[:2] {
		t.Run(shape.name, func(t *testing.T) {
			t.Parallel()
			s, _ := setup(t)
			ctx := context.Background()
			const perTenant = 2
			if err := s.SetKindLimits(ctx, "image", KindLimits{MaxRunningPerTenant: perTenant}); err != nil {
				t.Fatal(err)
			}
			var batch []NewTask
			for i := range 50 {
				nt := tenantTask("tenant-a", fmt.Sprintf("a-%d", i))
				nt.Priority = 5
				batch = append(batch, nt)
			}
			for i := range 5 {
				batch = append(batch, tenantTask("tenant-b", fmt.Sprintf("b-%d", i)))
			}
			if _, err := s.SubmitMany(ctx, batch); err != nil {
				t.Fatal(err)
			}
			got := claimNow(t, s, shape.kinds, 8)
			byTenant := map[string]int{}
			for _, task := range got {
				byTenant[task.Tenant]++
			}
			if byTenant["tenant-a"] > perTenant {
				t.Fatalf("tenant-a got %d attempts; limit %d", byTenant["tenant-a"], perTenant)
			}
			// Then again, with A at its limit: only B can start.
			more := claimNow(t, s, shape.kinds, 8)
			for _, task := range more {
				byTenant[task.Tenant]++
			}
			if byTenant["tenant-b"] != perTenant {
				t.Fatalf("8 free slots, twice: claimed %v; want tenant-b's %d tasks started too (it is within its limit)",
					byTenant, perTenant)
			}
		})
	}
}
