# The test command of the README. It needs no running services: the tests
# start throwaway PostgreSQL and Redis servers on free loopback ports
# (internal/testenv) and stop them at the end.
GO ?= go
export GOTOOLCHAIN ?= local

.PHONY: test vet unit faults run bench load chaos river river-quick river-test

test: vet unit faults river-test

vet:
	@test -z "$$(gofmt -l .)" || { echo "gofmt needed:"; gofmt -l .; exit 1; }
	$(GO) vet ./...
	$(GO) vet -tags faults ./faults/

# Allocation budgets run once more without -race: the race detector drops
# pooled buffers on purpose.
unit:
	$(GO) test -race -count=1 -timeout 20m ./...
	$(GO) test -count=1 -run 'Allocs' ./fingerprint/

# The fault suite: servers killed, flushed, restarted and slowed under load.
faults:
	$(GO) test -tags faults -race -count=1 -timeout 15m ./faults/

run:
	$(GO) run ./example

bench:
	$(GO) test -run '^$$' -bench . -benchmem ./fingerprint/ ./middleware/ ./pgstore/

load:
	$(GO) run ./loadtest

# The long randomized soak with its history checker (README "Reliability (chaos)").
chaos:
	$(GO) run ./chaos -seed $(or $(SEED),1) -duration $(or $(DURATION),30m)

# pgstore against River (riverbench/ is its own module; River stays out of go.mod).
river:
	cd riverbench && $(GO) run .

river-quick:
	cd riverbench && $(GO) run . -quick

# The root's go vet/test ./... skip the nested module.
river-test:
	cd riverbench && $(GO) vet ./... && $(GO) test -race -count=1 ./...
