# The test command of the README. It needs no running services: the tests
# start throwaway PostgreSQL and Redis servers on free loopback ports
# (internal/testenv) and stop them at the end.
GO ?= go
export GOTOOLCHAIN ?= local

.PHONY: test vet unit run bench fmt

test: vet unit

vet:
	@test -z "$$(gofmt -l .)" || { echo "gofmt needed:"; gofmt -l .; exit 1; }
	$(GO) vet ./...

unit:
	$(GO) test -race -count=1 -timeout 20m ./...

run:
	$(GO) run ./example

bench:
	$(GO) test -run '^$$' -bench . -benchmem ./fingerprint/ ./middleware/ ./pgstore/
