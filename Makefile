# The test command of the README. It needs no running services: the tests
# start throwaway PostgreSQL and Redis servers on free loopback ports
# (internal/testenv) and stop them at the end.
#
# Eight modules share this checkout (go.work joins them): the library at the
# root; otelidem/, client/ and cmd/idemgate/, released with it; example/ and
# tools/ with their own dependencies, so an importer of the library gets none
# of theirs; otelidem/internal/sdktest holds otelidem's tests that need the
# OpenTelemetry SDK, so an importer of otelidem gets the API only;
# idemhttp/internal/routertest holds idemhttp's chi and gorilla/mux recipes
# and their tests, so that the library's go.mod names neither router. "./..."
# names one module only; PKGS names all eight.
GO ?= go
export GOTOOLCHAIN ?= local
# -trimpath keeps the checkout's directory out of the build cache's keys:
# without it, a fresh clone (every CI run) compiles each of its own
# packages again for vet, staticcheck and every test binary, though an
# earlier clone of the same code compiled them already. go vet of pgstore,
# pgrecords and middleware in a second clone: 34 CPU-seconds without,
# 1.3 with (2026-12-08). The first run with it on a machine compiles
# every dependency once more (their builds were cached without it). It
# changes no test: only the file names that panics and the race detector
# print (module paths, not this machine's).
export GOFLAGS := $(strip $(GOFLAGS) -trimpath)
PKGS = ./... ./client/... ./cmd/idemgate/... ./example/... ./otelidem/... ./otelidem/internal/sdktest/... ./idemhttp/internal/routertest/... ./tools/...
MODULE = github.com/idemgate/idemgate
STATICCHECK ?= $(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2

# TESTFLAGS go to every go test of unit and faults (make test-times sets
# -json and -exec).
TESTFLAGS ?=

.PHONY: test checks vet-lint test-times vet lint publish-check unit faults run bench load plants chaos mutate river river-quick release

# The checks, then the tests: the publish check beside gofmt and vet
# then staticcheck (each one's output kept together), so that the cores
# its go commands leave idle are used; vet before staticcheck, so that
# on a cold build cache the packages both load are compiled once, not by
# both at the same time. The tests come after, so that no check's load
# lands on a test's patience.
test:
	@$(MAKE) --no-print-directory checks
	@$(MAKE) --no-print-directory unit

checks:
	@$(MAKE) --no-print-directory -j2 -O publish-check vet-lint

vet-lint:
	@$(MAKE) --no-print-directory vet
	@$(MAKE) --no-print-directory lint

# -tags faults in one run: only tools/faults has files with that tag, so
# every other package is the same with it, and its dependencies are
# loaded once, not twice.
vet:
	@test -z "$$(gofmt -l .)" || { echo "gofmt needed:"; gofmt -l .; exit 1; }
	$(GO) vet -tags faults $(PKGS)

lint:
	$(STATICCHECK) -tags faults $(PKGS)

# The public modules as a user gets them (docs/releasing.md): each tidy with
# GOWORK=off; packed into a file-based module proxy; fresh consumers built
# and vetted against it outside the workspace; the CLI go-installed from it.
publish-check:
	$(GO) run ./tools/publishcheck

# make release VERSION=v0.2.0: set the version in every module, check
# CHANGELOG.md, run the publish check, commit and tag (docs/releasing.md).
release:
	@test -n "$(VERSION)" || { echo "usage: make release VERSION=vX.Y.Z"; exit 1; }
	$(GO) run ./tools/release -version $(VERSION)

# Three race runs, one after another, each to its end (a failure in one
# does not hide the others' results; unit fails if any did):
#  - the chaos smoke alone (a minute or two): two systems of four
#    processes under faults;
#  - pgstore alone: its tests run worker processes side by side;
#  - the rest, two packages at a time, the slowest named first so that go
#    test starts them first, the fault suite among them (-tags faults
#    builds its tests; no other package has a file with that tag): its
#    waits are patience, not speed, and beside the other packages it no
#    longer adds its minute or more at the end.
# Beside each other, or beside the rest, these two took a 2-core machine to
# load 19: leases and connect timeouts ran out, and a CI run failed on five
# tests that pass alone (2026-12-05).
#
# Then the allocation budgets run once more without -race: the race
# detector drops pooled buffers on purpose, so the budget tests skip under
# it. Every one that docs/performance.md cites is named here (TestNumberCost
# too). So do the measurements of redis-server (bytes and CPU per record),
# which the detector would only slow down.
unit:
	failed=0; \
	$(GO) test $(TESTFLAGS) -race -count=1 -timeout 20m ./tools/chaos/ || failed=1; \
	$(GO) test $(TESTFLAGS) -race -count=1 -timeout 20m ./pgstore/ || failed=1; \
	all=$$($(GO) list $(PKGS)) || failed=1; \
	rest=$$(printf '%s\n' "$$all" | grep -v -x -e '$(MODULE)/tools/chaos' -e '$(MODULE)/pgstore'); \
	[ -n "$$rest" ] || { echo "unit: go list named no packages"; failed=1; }; \
	$(GO) test $(TESTFLAGS) -tags faults -race -count=1 -timeout 20m ./example/ ./pgrecords/ ./middleware/ ./tools/faults/ $$rest || failed=1; \
	$(GO) test $(TESTFLAGS) -count=1 -run 'Allocs|NumberCost|TestRedisRecordBytes|TestRedisReplayCPU|TestRedisCompleteCPU' ./fingerprint/ ./middleware/ ./redisstore/ ./pgrecords/ || failed=1; \
	exit $$failed

# Where make test's time goes: each step of test run under
# tools/testtimes (wall and CPU seconds), the tests with go test -json,
# each test binary under testtimes exec (its CPU-seconds), then a table of
# steps, packages and the slowest tests (docs/testing.md). The run's
# output is kept in $(TIMES)/run.log, the load before and after in
# $(TIMES)/load; a failing step is shown in the tables, and the target
# fails after printing them.
TIMES ?= $(CURDIR)/out/test-times
test-times:
	@mkdir -p $(TIMES)
	$(GO) build -o $(TIMES)/testtimes ./tools/testtimes
	@uptime > $(TIMES)/load; : > $(TIMES)/run.log
	@failed=0; for step in vet lint publish-check; do \
		$(TIMES)/testtimes step $$step $(MAKE) --no-print-directory $$step >> $(TIMES)/run.log 2>&1 || failed=1; \
	done; \
	$(TIMES)/testtimes step unit $(MAKE) --no-print-directory unit TESTFLAGS='-json -exec "$(TIMES)/testtimes exec"' >> $(TIMES)/run.log 2>&1 || failed=1; \
	uptime >> $(TIMES)/load; cat $(TIMES)/load; \
	$(TIMES)/testtimes -tests $(or $(TESTS),40) $(TIMES)/run.log; \
	exit $$failed

# The fault suite alone: servers killed, flushed, restarted and slowed
# under load (make test runs it within unit).
faults:
	$(GO) test $(TESTFLAGS) -tags faults -race -count=1 -timeout 15m ./tools/faults/

run:
	$(GO) run ./example

bench:
	$(GO) test -run '^$$' -bench . -benchmem ./fingerprint/ ./middleware/ ./pgstore/

load:
	$(GO) run ./tools/loadtest

# The planted-bug runs (docs/reliability.md): each known bug put back in
# the example and caught by a fixed-seed run of the soak, two at a time;
# a few minutes. make test feeds each plant's history to the checker
# instead (tools/chaos TestCheckCatchesEveryPlantsHistory).
plants:
	$(GO) test -race -count=1 -timeout 30m -run '^TestPlants$$' -v ./tools/chaos/ -args -plants

# The long randomized soak with its history checker (docs/reliability.md).
chaos:
	$(GO) run ./tools/chaos -seed $(or $(SEED),1) -duration $(or $(DURATION),30m)

# The soak's mutation score (docs/reliability.md): each mutation of
# tools/mutate written into a scratch copy, the soak run against it.
mutate:
	$(GO) run ./tools/mutate -seeds $(or $(SEEDS),1,2) -duration $(or $(DURATION),90s)

# pgstore against River (River is a dependency of tools/ only).
river:
	$(GO) run ./tools/riverbench

river-quick:
	$(GO) run ./tools/riverbench -quick

# The stores' cost as they grow (docs/performance.md, "Scale"): pgstore's
# claim and Submit at backlogs up to 1M, many tenants, capped tenants and a
# scheduled backlog; pgrecords and the Redis store at 10M records; each as
# a ratio of a small queue or table measured in the same run. Not part of
# test (its tiny run is): minutes (scale-quick: no 1M backlog, 1M records)
# to most of an hour.
scale:
	$(GO) run ./tools/scale

scale-quick:
	$(GO) run ./tools/scale -quick
