//go:build !chaosplant

package pgstore

// plant is empty in every normal build, so each plant hook is a constant
// false condition that the compiler removes.
const plant = ""

// plantSQL returns sql unchanged in every normal build.
func plantSQL(sql string) string { return sql }
