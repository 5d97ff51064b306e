//go:build chaosplant

package pgstore

import (
	"os"
	"strings"
)

// plant names a known bug that the chaos tool (go run ./chaos -plant)
// puts back to prove its checker catches it. Only builds tagged
// chaosplant read it; see plant_off.go.
var plant = os.Getenv("IDEMGATE_CHAOS_PLANT")

// plantSQL returns sql with the planted bug, if one applies to it.
func plantSQL(sql string) string {
	if plant == "rescue-unfenced" && sql == sqlRescue {
		// Take back live attempts too, and requeue them whatever the
		// kind's lost policy says: the attempt runs twice.
		sql = strings.ReplaceAll(sql, "lease_until < now()", "true")
		sql = strings.ReplaceAll(sql, "t.lost = 'uncertain'", "false")
	}
	return sql
}
