// Package faults is idemgate's fault suite: it breaks real servers and
// processes under load and checks that no request runs twice, no task is
// created twice, no accepted task is lost, and every error meanwhile is a
// clear one.
//
// The tests are behind the build tag "faults" (they take minutes and kill
// processes):
//
//	go test -tags faults -race -count=1 ./tools/faults/
//
// Each test starts its own servers (internal/devserver, internal/testenv)
// and, for the multi-process cases, builds the example service once
// (internal/proctest, with -race when the suite runs with it) and runs it as
// API, worker and migrate processes.
package faults
