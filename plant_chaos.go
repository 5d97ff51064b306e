//go:build chaosplant

package idemgate

import "os"

// plant names a known bug that the chaos tool (go run ./chaos -plant)
// puts back to prove its checker catches it. Only builds tagged
// chaosplant read it; see plant_off.go.
var plant = os.Getenv("IDEMGATE_CHAOS_PLANT")
