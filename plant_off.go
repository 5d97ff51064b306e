//go:build !chaosplant

package idemgate

// plant is empty in every normal build, so each plant hook is a constant
// false condition that the compiler removes.
const plant = ""
